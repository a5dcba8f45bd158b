// Routed low-bit experts through FP8 tensor cores (sm_89+; issue [11]'s prefill speed path, off
// by default): the chosen experts' MXFP4 / INT4 codes become e4m3 bytes with one f32 scale per
// 32-value K block (exact: an E2M1 value or an int4 value -8..7 is an e4m3 value, the E8M0 or
// group scale becomes the block scale), the A rows (x for gate_up, h for down) are rounded to
// e4m3 with one f32 scale per 32-value block (scale = amax / 448, DeepSeek-V3's fine-grained
// activation quantisation with 1×32 tiles so they match the weight blocks), and a grouped GEMM
// over the (token, choice) pairs sorted by expert (`moe_sort` of kernels/moe.cu) computes each
// 32-wide block with one `mma.sync.m16n8k32.e4m3` into a fresh fragment and adds it times
// scale_a[row][kb] · scale_b[col][kb] into f32 accumulators. Tile map, epilogues (act 0/2
// SwiGLU on rows [gate; up], act 1 gpt-oss's GLU on interleaved rows, per-expert biases) and
// output layout are those of moe_mma in kernels/moe.cu (shared: kernels/moe_common.cuh, which
// nvrtc_cache puts before this file), so moe_combine finishes the step.
//
//   moe_fp8_weights  codes [E, R, K] (items[m] of them) → q [m, R, K] e4m3, s [m, R, K/32] f32
//   moe_fp8_act_S    x [rows, K] (T) → q [rows, K] e4m3, s [rows, K/32] f32
//   moe_fp8_mma_S_gu / _dn  grouped GEMM, tile 64 rows × 128 weight rows × 64 k, 3 stages.
// K % 32 == 0 everywhere; 16-byte aligned codes and A rows.

typedef unsigned char u8;

// ---- e4m3 encodings ------------------------------------------------------------------------
// E2M1 code (bit 3 sign, 2 exponent bits e, 1 mantissa bit m) → the e4m3 byte of the same value:
// e = 0: 0 or 0.5 (= 2^-1: exponent field 6); else (1 + m/2)·2^(e-1): exponent field e + 6.
__device__ __forceinline__ u32 f8_from_e2m1(u32 c) {
    const u32 e = (c >> 1) & 3u, m = c & 1u;
    const u32 mag = e == 0 ? (m ? 0x30u : 0u) : (((e + 6u) << 3) | (m << 2));
    return mag | ((c & 8u) << 4);
}
// INT4 code (u4 − 8: −8..7) → e4m3 byte: |v| = 2^p · (1 + mant/8), exponent field p + 7.
__device__ __forceinline__ u32 f8_from_int4(u32 c) {
    const int v = (int)(c & 15u) - 8;
    const u32 a = (u32)(v < 0 ? -v : v);
    if (a == 0) return 0u;
    const u32 p = 31u - __clz(a);
    return (((p + 7u) << 3) | ((a << (3u - p)) & 7u)) | (v < 0 ? 0x80u : 0u);
}
// Two f32 → two e4m3 (round to nearest even, saturating to ±448), `lo` in the low byte.
__device__ __forceinline__ u32 f8_pack2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    __trap();
    return 0u;
#endif
}

// The scale of group g: E8M0 (0 → 2^-127), f16 or bf16 (the direct kernels' q_scale32).
__device__ __forceinline__ float f8_group_scale(const u8* s, u32 scale, u64 g) {
    if (scale == 0) {
        const u32 b = s[g];
        return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(b << 23);
    }
    const u16 h = reinterpret_cast<const u16*>(s)[g];
    if (scale == 2) return __uint_as_float(((u32)h) << 16);
    f16 v;
    v.x = h;
    return to_f(v);
}

// One thread per 32-value block of the chosen items: 16 code bytes → 32 e4m3 bytes + 1 scale.
// kind 0 FP4 E2M1, 1 INT4 (u4 − 8); scale 0 E8M0, 1 f16, 2 bf16 per `group` values (a multiple
// of 32). per_item = R·K.
extern "C" __global__ void moe_fp8_weights(const u8* __restrict__ codes, const u8* __restrict__ scales,
                                           const u32* __restrict__ items, u8* __restrict__ q,
                                           float* __restrict__ s, u32 m, u64 per_item, u32 kind,
                                           u32 scale, u32 group) {
    grid_dep_wait();
    const u64 bpi = per_item / 32, total = bpi * m;
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < total; b += (u64)gridDim.x * blockDim.x) {
        const u64 it = b / bpi, within = b - it * bpi;
        const u64 e = (u64)items[it] * per_item + within * 32;
        const uint4 c = *reinterpret_cast<const uint4*>(codes + e / 2);
        const u32 words[4] = {c.x, c.y, c.z, c.w};
        u32 outw[8];
#pragma unroll
        for (int w = 0; w < 4; w++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                u32 o = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const u32 code = (words[w] >> (4 * (4 * h + j))) & 15u;
                    o |= (kind == 0 ? f8_from_e2m1(code) : f8_from_int4(code)) << (8 * j);
                }
                outw[2 * w + h] = o;
            }
        }
        uint4* dst = reinterpret_cast<uint4*>(q + it * per_item + within * 32);
        dst[0] = make_uint4(outw[0], outw[1], outw[2], outw[3]);
        dst[1] = make_uint4(outw[4], outw[5], outw[6], outw[7]);
        s[b] = f8_group_scale(scales, scale, e / group);
    }
}

// One thread per 32-value block of x (contiguous: K % 32 == 0): amax, scale = amax / 448,
// q = e4m3(x · (448 / amax)) (0 for an all-zero block), each product rounded once.
template <typename T>
__device__ __forceinline__ void moe_fp8_act_impl(const T* __restrict__ x, u8* __restrict__ q,
                                                 float* __restrict__ s, u64 nblocks) {
    grid_dep_wait();
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += (u64)gridDim.x * blockDim.x) {
        float v[32];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            Vec8<T> t;
            t.load(x + b * 32 + 8 * i);
            t.to_float(v + 8 * i);
        }
        float amax = 0.f;
#pragma unroll
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
        const float inv = amax > 0.f ? __fdiv_rn(448.f, amax) : 0.f;
        u32 w[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i] = f8_pack2(__fmul_rn(v[4 * i], inv), __fmul_rn(v[4 * i + 1], inv)) |
                   (f8_pack2(__fmul_rn(v[4 * i + 2], inv), __fmul_rn(v[4 * i + 3], inv)) << 16);
        uint4* dst = reinterpret_cast<uint4*>(q + b * 32);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        s[b] = __fdiv_rn(amax, 448.f);
    }
}

// ---- grouped FP8 GEMM ----------------------------------------------------------------------
#define F8_BM 64
#define F8_BN 128
#define F8_BK 64
#define F8_STAGES 3

// Byte offset of (row, col) in a stage tile of 64-byte rows; the four 16-byte chunks of a row
// are permuted by (row / 2) % 4 so the 8 rows an ldmatrix reads hit 8 distinct bank groups.
__device__ __forceinline__ u32 f8_sw(u32 row, u32 col) {
    return row * F8_BK + ((((col >> 4) ^ (row >> 1)) & 3u) << 4) + (col & 15u);
}
__device__ __forceinline__ void f8_cp_async4(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
// d = a·b over one 32-wide k block (fresh fragment). A 16×32 row-major: a0/a2 row g, a1/a3
// row g + 8, bytes t4·4.. (a0, a1) and 16 + t4·4.. (a2, a3); B 32×8 column-major: b0 k t4·4..,
// b1 k 16 + t4·4.., column g; D as the f32 m16n8 layout.
__device__ __forceinline__ void f8_mma(float* d, const u32* a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
#else
    __trap();
#endif
}

// a [rows, K] e4m3 + as [rows, K/32]; w [E, wrows, K] e4m3 + ws [E, wrows, K/32]; out [P, nout]
// (T). 8 warps as 2 (rows) × 4 (weight rows); GU: the 128 weight rows are 64 gate rows and the
// matching up rows, epilogue act(g, u) for 64 outputs; else 128 outputs.
// grid = (ceil(nout / (GU ? 64 : 128)), max tiles); tiles of at most 64 rows.
template <typename T, bool GU>
__device__ __forceinline__ void moe_fp8_mma_impl(
    const u8* __restrict__ a, const float* __restrict__ as, const u8* __restrict__ w,
    const float* __restrict__ ws, T* __restrict__ out, const u32* __restrict__ offsets,
    const u32* __restrict__ sorted, const u32* __restrict__ tiles, const u32* __restrict__ ntiles,
    u32 gather_k, u32 nout, u32 kdim, u32 wrows, float limit, const T* __restrict__ bias, u32 act,
    float alpha) {
    __shared__ __align__(16) u8 sa[F8_STAGES][F8_BM * F8_BK];
    __shared__ __align__(16) u8 sb[F8_STAGES][F8_BN * F8_BK];
    __shared__ float ssa[F8_STAGES][F8_BM][2];
    __shared__ float ssb[F8_STAGES][F8_BN][2];
    grid_dep_wait();
    MoeTile tl;
    if (!moe_tile(offsets, tiles, ntiles, F8_BM, tl)) return;
    const u32 tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const u32 wm = wp & 1, wn = wp >> 1;
    const u32 g = lane >> 2, t4 = lane & 3;
    const u32 n0 = blockIdx.x * (GU ? F8_BN / 2 : F8_BN);
    const u32 nkb = kdim / 32;
    const u8* wexp = w + (u64)tl.expert * wrows * kdim;
    const float* wsexp = ws + (u64)tl.expert * wrows * nkb;
    auto src_row = [&](u32 r) { return moe_src_row(sorted, gather_k, tl.first + r); };
    auto weight_row = [&](u32 br, bool& ok) {
        if (GU) {
            const u32 o = n0 + (br & 63);
            ok = o < nout;
            return moe_gu_row(ok ? o : 0, br >= 64, nout, act);
        }
        ok = n0 + br < nout;
        return ok ? n0 + br : 0u;
    };

    // Copy jobs: one 16-byte A chunk (row tid / 4, chunk tid % 4), two B chunks (rows tid / 4
    // and 64 + tid / 4); scales: A (row tid / 2, block tid % 2) for tid < 128, B (row tid / 2).
    const u32 ar = tid >> 2, ac = (tid & 3) * 16;
    const bool a_ok = ar < tl.rows;
    const u8* asrc = a + (u64)src_row(a_ok ? ar : 0) * kdim + ac;
    const u8* bsrc[2];
    bool b_ok[2];
#pragma unroll
    for (int i = 0; i < 2; i++) bsrc[i] = wexp + (u64)weight_row(ar + 64 * i, b_ok[i]) * kdim + ac;
    const u32 sr = tid >> 1, skb = tid & 1;
    const bool sa_ok = sr < tl.rows && tid < 128;
    const float* sasrc = as + (u64)src_row(sa_ok ? sr : 0) * nkb + skb;
    bool sb_ok;
    const float* sbsrc = wsexp + (u64)weight_row(sr, sb_ok) * nkb + skb;
    auto load = [&](u32 kt, u32 st) {
        const u32 k0 = kt * F8_BK;
        const bool kin = k0 + ac < kdim;
        cp_async16(smem_addr(&sa[st][f8_sw(ar, ac)]), asrc + k0, (a_ok && kin) ? 16u : 0u);
#pragma unroll
        for (int i = 0; i < 2; i++)
            cp_async16(smem_addr(&sb[st][f8_sw(ar + 64 * i, ac)]), bsrc[i] + k0,
                       (b_ok[i] && kin) ? 16u : 0u);
        const u32 kb = kt * 2 + skb;
        const bool kbin = kb < nkb;
        if (tid < 128)
            f8_cp_async4(smem_addr(&ssa[st][sr][skb]), sasrc + kt * 2, (sa_ok && kbin) ? 4u : 0u);
        f8_cp_async4(smem_addr(&ssb[st][sr][skb]), sbsrc + kt * 2, (sb_ok && kbin) ? 4u : 0u);
    };

    float acc[2][4][4];
    u32 pb[2];  // smem row of the first of each pair of this warp's n-tiles
    moe_mma_start<GU>(acc, pb, wn);
    const u32 nk = (kdim + F8_BK - 1) / F8_BK;
    moe_kloop<F8_STAGES>(nk, load, [&](u32 st) {
#pragma unroll
        for (u32 h = 0; h < 2; h++) {
            const u32 kk = h * 32;
            u32 af[2][4];
            float ra[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const u32 r0 = wm * 32 + mt * 16;
                ldsm_x4(smem_addr(&sa[st][f8_sw(r0 + (lane & 15), kk + (lane >> 4) * 16)]),
                        af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
                ra[mt][0] = ssa[st][r0 + g][h];
                ra[mt][1] = ssa[st][r0 + g + 8][h];
            }
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                u32 b[4];
                ldsm_x4(smem_addr(&sb[st][f8_sw(pb[jj] + (lane & 7) + (lane >> 4) * 8,
                                                 kk + ((lane >> 3) & 1) * 16)]),
                        b[0], b[1], b[2], b[3]);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const u32 c0 = pb[jj] + nt * 8 + t4 * 2;
                    const float cb[2] = {ssb[st][c0][h], ssb[st][c0 + 1][h]};
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        float d[4];
                        f8_mma(d, af[mt], b[2 * nt], b[2 * nt + 1]);
                        float* c = acc[mt][2 * jj + nt];
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            c[e] = fmaf(d[e], ra[mt][e >> 1] * cb[e & 1], c[e]);
                    }
                }
            }
        }
    });

    moe_mma_epilogue<T, GU>(acc, out, tl, wm, wn, g, t4, n0, nout, wrows, limit, bias, act, alpha);
}

#define MOE_FP8_ARGS(T)                                                                        \
    const u8 *a, const float *as, const u8 *w, const float *ws, T *out, const u32 *offsets,   \
        const u32 *sorted, const u32 *tiles, const u32 *ntiles, u32 gather_k, u32 nout,       \
        u32 kdim, u32 wrows, float limit, const T *bias, u32 act, float alpha
#define MOE_FP8_PASS                                                                           \
    a, as, w, ws, out, offsets, sorted, tiles, ntiles, gather_k, nout, kdim, wrows, limit, bias, act, alpha
#define MOE_FP8_ALL(S, T)                                                                      \
    extern "C" __global__ void moe_fp8_act_##S(const T* x, u8* q, float* s, u64 nblocks) {     \
        moe_fp8_act_impl<T>(x, q, s, nblocks);                                                 \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) moe_fp8_mma_##S##_gu(MOE_FP8_ARGS(T)) {  \
        moe_fp8_mma_impl<T, true>(MOE_FP8_PASS);                                               \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) moe_fp8_mma_##S##_dn(MOE_FP8_ARGS(T)) {  \
        moe_fp8_mma_impl<T, false>(MOE_FP8_PASS);                                              \
    }
DAYONE_FOR_FLOAT_TYPES(MOE_FP8_ALL)
