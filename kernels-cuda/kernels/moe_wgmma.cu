// ---------------------------------------------------------------------------------------------
// Hopper grouped GEMM (sm_90a `wgmma`; the host compiles the `moe` family for sm_90a on sm_90
// devices and launches these only there). Tile 128 rows × BN weight rows × 64 k, 256 threads:
// two warpgroups, each owning 64 of the rows, run `wgmma.mma_async m64nBNk16` straight from
// shared memory. The operands sit in moe_sw<64>'s layout, which is the hardware's 128-byte
// swizzled K-major layout (row r's 16-byte chunk c at c ^ (r % 8), 8-row atoms of 1 024 bytes),
// filled by the same cp.async copies as moe_mmat_impl (MoeCopies); a k step of 16 advances the descriptor's
// start by 32 bytes inside the swizzled rows (PTX ISA, "Matrix Descriptor Format").
// Pipeline: STAGES slices in shared memory, STAGES − 2 copies in flight ahead of the slice being
// multiplied. The copy issued at slice kt refills slice kt − 2's stage: every warpgroup has
// waited for its own wgmma of kt − 2 (wait_group 1 after committing kt − 1) before the barrier
// of kt. A warpgroup whose 64 rows all lie past the tile's rows (an expert's short last tile)
// issues no wgmma. Blocks are rasterised as moe_mma128r (moe_raster<8>).
// Dynamic smem STAGES · (128 + BN) · 64 · 2 + 1 024 bytes (the swizzle needs 1 024-byte-aligned
// operands; the extra KiB lets the kernel align its base). grid = (ceil(nout / (GU ? BN / 2 :
// BN)), max tiles), block = 256.

template <int N, typename T> struct Wgmma;
#define MOE_WGMMA_N256(T, TS)                                                                                                     \
    template <> struct Wgmma<256, T> {                                                                                            \
        static __device__ __forceinline__ void run(float (&d)[128], u64 da, u64 db) {                                             \
            asm volatile(                                                                                                         \
                "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                                     \
                "wgmma.mma_async.sync.aligned.m64n256k16.f32." TS "." TS " {"                                                     \
                "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
                "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                \
                "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                \
                "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                                \
                "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                                \
                "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                \
                "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                    \
                "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},"                \
                " %128, %129, p, 1, 1, 0, 0;\n}\n"                                                                                \
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                 \
                  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),           \
                  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),         \
                  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),         \
                  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),         \
                  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),         \
                  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),         \
                  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),         \
                  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),         \
                  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),         \
                  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),         \
                  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),         \
                  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),     \
                  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
                  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
                  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])  \
                : "l"(da), "l"(db), "r"(1));                                                                                      \
        }                                                                                                                         \
    };
#define MOE_WGMMA_N128(T, TS)                                                                                             \
    template <> struct Wgmma<128, T> {                                                                                    \
        static __device__ __forceinline__ void run(float (&d)[64], u64 da, u64 db) {                                      \
            asm volatile(                                                                                                 \
                "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                              \
                "wgmma.mma_async.sync.aligned.m64n128k16.f32." TS "." TS " {"                                             \
                "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
                "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                        \
                "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                        \
                "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"                        \
                " %64, %65, p, 1, 1, 0, 0;\n}\n"                                                                          \
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
                  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
                  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
                  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
                  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
                : "l"(da), "l"(db), "r"(1));                                                                              \
        }                                                                                                                 \
    };

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
MOE_WGMMA_N256(bf16, "bf16")
MOE_WGMMA_N256(f16, "f16")
MOE_WGMMA_N128(bf16, "bf16")
MOE_WGMMA_N128(f16, "f16")
#define MOE_HAS_WGMMA 1
#endif

// Shared-memory matrix descriptor of a 128-byte-swizzled K-major operand starting at `saddr`:
// start address >> 4 (bits 0–13), leading byte offset 16 (unused by swizzled K-major
// layouts), stride byte offset 1 024 (8-row atoms, bits 32–45), swizzle mode 128 B (bit 62).
__device__ __forceinline__ u64 wg_desc_sw128(u32 saddr) {
    return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}
// Keeps the compiler from moving accumulator reads or writes across a wgmma fence or wait (the
// asynchronous MMA owns those registers in between).
template <int R> __device__ __forceinline__ void wg_fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

template <typename T, bool GU, int BN, int STAGES>
__device__ __forceinline__ void moe_wgmma_impl(const T* __restrict__ a, const T* __restrict__ w,
                                               T* __restrict__ out, const u32* __restrict__ offsets,
                                               const u32* __restrict__ sorted,
                                               const u32* __restrict__ tiles,
                                               const u32* __restrict__ ntiles, u32 bt, u32 gather_k,
                                               u32 nout, u32 kdim, u32 wrows, float limit,
                                               const T* __restrict__ bias, u32 act, float alpha) {
#if defined(MOE_HAS_WGMMA)
    constexpr int BM = 128, BK = 64, NTH = 256;
    constexpr u32 A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
    constexpr int NR = BN / 2;  // accumulators per thread: 64 rows × BN / 128 threads
    static_assert(STAGES >= 3, "two copies in flight beside the slice being multiplied");
    extern __shared__ __align__(1024) unsigned char moe_dsmem[];
    const u32 sa = (smem_addr(moe_dsmem) + 1023u) & ~1023u;  // [STAGES][BM · BK]
    const u32 sb = sa + STAGES * A_BYTES;                      // [STAGES][BN · BK]
    grid_dep_wait();
    u32 colb = blockIdx.x, ti = blockIdx.y;
    moe_raster<8>(colb, ti);
    MoeTile tl;
    if (!moe_tile_at(ti, offsets, tiles, ntiles, min(bt, (u32)BM), tl)) return;
    const u32 tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
    const u32 n0 = colb * (GU ? BN / 2 : BN);
    const T* wexp = w + (u64)tl.expert * wrows * kdim;

    const MoeCopies<T, GU, BM, BN, BK, NTH> cp(tid, a, wexp, sorted, gather_k, tl, n0, nout, act, kdim);
    const u32 nk = (kdim + BK - 1) / BK;
#pragma unroll
    for (u32 s = 0; s < STAGES - 2; s++) {
        if (s < nk) cp.load(s, kdim, sa + s * A_BYTES, sb + s * B_BYTES);
        cp_async_commit();
    }

    float d[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) d[i] = 0.f;
    wg_fence_regs(d);
    const bool active = wg * 64 < tl.rows;  // warpgroup-uniform
    for (u32 kt = 0; kt < nk; kt++) {
        cp_async_wait<STAGES - 3>();
        // cp.async wrote through the generic proxy; wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        const u32 kn = kt + STAGES - 2;
        if (kn < nk) cp.load(kn, kdim, sa + (kn % STAGES) * A_BYTES, sb + (kn % STAGES) * B_BYTES);
        cp_async_commit();
        if (active) {
            const u32 st = kt % STAGES;
            const u32 a0 = sa + st * A_BYTES + wg * (64 * BK * 2), b0 = sb + st * B_BYTES;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (u32 kk = 0; kk < BK / 16; kk++)
                Wgmma<BN, T>::run(d, wg_desc_sw128(a0 + kk * 32), wg_desc_sw128(b0 + kk * 32));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            wg_fence_regs(d);
        }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_fence_regs(d);
    cp_async_wait<0>();
    if (!active) return;

    // Epilogue. d[4j + 2h + e]: row wg·64 + wq·16 + lane / 4 + 8h, column 8j + 2·(lane % 4) + e
    // (the wgmma D fragment; GU: columns BN / 2 .. BN are the up rows of columns 0 .. BN / 2).
    const u32 g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const u32 row = wg * 64 + wq * 16 + g + 8 * hh;
        if (row >= tl.rows) continue;
        T* orow = out + (u64)(tl.first + row) * nout;
        if (GU) {
#pragma unroll
            for (int j = 0; j < BN / 16; j++)
                moe_store_outputs<T, true>(orow, n0 + j * 8 + t4 * 2, d[4 * j + 2 * hh],
                                           d[4 * j + 2 * hh + 1], d[4 * (j + BN / 16) + 2 * hh],
                                           d[4 * (j + BN / 16) + 2 * hh + 1], tl.expert, nout,
                                           wrows, limit, bias, act, alpha);
        } else {
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
                moe_store_outputs<T, false>(orow, n0 + j * 8 + t4 * 2, d[4 * j + 2 * hh],
                                            d[4 * j + 2 * hh + 1], 0.f, 0.f, tl.expert, nout,
                                            wrows, limit, bias, act, alpha);
        }
    }
#else
    // Compiled without sm_90a: the host never launches these (MoeTile::or_without_wgmma); a
    // launch by mistake fails loudly instead of leaving the output unwritten.
    __trap();
#endif
}

#define MOE_WG(S, T, NAME, BN, STAGES)                                                        \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME##_##S##_gu(MOE_ARGS(T)) {         \
        moe_wgmma_impl<T, true, BN, STAGES>(MOE_PASS);                                        \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME##_##S##_dn(MOE_ARGS(T)) {         \
        moe_wgmma_impl<T, false, BN, STAGES>(MOE_PASS);                                       \
    }
#define MOE_WG_ALL(S, T) MOE_WG(S, T, moe_wg256, 256, 4) MOE_WG(S, T, moe_wg128, 128, 4)
#if defined(DAYONE_ONLY_BF16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_F16))
MOE_WG_ALL(bf16, bf16)
#endif
#if defined(DAYONE_ONLY_F16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_BF16))
MOE_WG_ALL(f16, f16)
#endif
