// Mixture-of-Experts (DeepSeek-V3, Liu et al. 2024 §2.1.2; HF `DeepseekV3TopkRouter`):
// routing (sigmoid scores, group-limited top-k) and routed SwiGLU experts as grouped GEMMs over
// the (token, choice) pairs sorted by expert.
//
// Expert pipeline (one launch per step, never one per expert):
//   moe_sort     ids [P = N·k] → offsets [E + 1], pos [P] (sorted position of each pair),
//                sorted [P] (pair at each sorted position), tiles [T][2] = (expert, first row)
//                with T ≤ ceil(P / BT) + E tiles of at most BT rows, ntiles [1].
//   gate_up      h[sp, f] = silu(x[tok]·gate[e, f]) · (x[tok]·up[e, f])   (grouped GEMM/GEMV;
//                with `limit` > 0 both clamped first, glm5_next's swiglu_limit)
//   down         y2[sp, d] = h[sp]·down[e, d]                              (grouped GEMM/GEMV)
//   moe_combine  y[n, d] = Σ_j weights[n, j] · y2[pos[n·k + j], d] in f32, j in order
//                (deterministic: no atomics in the sums; a row's GEMM result does not depend on
//                the other rows of its tile, so the atomics-ordered sort changes nothing).
// Grouped GEMM kernels take grid.y = the maximal tile count and exit for tiles ≥ ntiles.


// ---------------------------------------------------------------------------------------------
// Routing: one block (256 threads) per token over f32 logits [N, E] (moe_topk_tokens,
// kernels/moe_topk.cuh; the router GEMV's last block runs the same body in gemv.cu).
extern "C" __global__ void moe_topk(const float* __restrict__ logits, const float* __restrict__ bias,
                                    u32* __restrict__ ids, float* __restrict__ weights, u32 n,
                                    u32 e, u32 k, u32 g, u32 topk_group, u32 norm, float scale) {
    grid_dep_wait();
    moe_topk_tokens(logits, bias, ids, weights, n, e, k, g, topk_group, norm, scale, blockIdx.x,
                    gridDim.x);
}

// ---------------------------------------------------------------------------------------------
// Counting sort of the P = N·k pairs by expert, and the tile map. One block (blockDim.x a
// multiple of 32, at most 1024; the host's launch::moe_sort_threads); dynamic smem 3·E words
// (2·E used). Pairs with an id >= E get pos = 0xffffffff (ignored downstream).
//   1. counts per expert (shared atomics); up to MOE_SORT_STABLE pairs (decode) each pair also
//      takes its rank among the earlier pairs of its expert, so the order inside an expert is
//      the pair order (else the atomics' order: no consumer depends on it);
//   2. offsets and tile offsets by one block-wide scan (each thread owns ceil(E / threads)
//      consecutive experts), which also writes `offsets`, the expert's tiles and `ntiles`;
//   3. pos and sorted.
// Every phase is parallel: a decode step (8 pairs, 256 experts) is a few µs of barriers.
#define MOE_SORT_STABLE 64u

// Exclusive block-wide scan of (a, b): returns the sums over the lower threads, tot = the
// block's totals. `ws` [64] shared words; one barrier before the caller may reuse it.
__device__ __forceinline__ void moe_block_scan2(u32 a, u32 b, u32* ws, u32& ea, u32& eb,
                                                u32& ta, u32& tb) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u32 ia = a, ib = b;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        const u32 xa = __shfl_up_sync(0xffffffffu, ia, o), xb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) {
            ia += xa;
            ib += xb;
        }
    }
    if (lane == 31) {
        ws[warp] = ia;
        ws[32 + warp] = ib;
    }
    __syncthreads();
    if (warp == 0) {
        u32 sa = lane < nw ? ws[lane] : 0u, sb = lane < nw ? ws[32 + lane] : 0u;
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 xa = __shfl_up_sync(0xffffffffu, sa, o), xb = __shfl_up_sync(0xffffffffu, sb, o);
            if (lane >= o) {
                sa += xa;
                sb += xb;
            }
        }
        ws[lane] = sa;  // inclusive over warps
        ws[32 + lane] = sb;
    }
    __syncthreads();
    ea = (warp ? ws[warp - 1] : 0u) + ia - a;
    eb = (warp ? ws[32 + warp - 1] : 0u) + ib - b;
    ta = ws[nw - 1];
    tb = ws[32 + nw - 1];
}

extern "C" __global__ void moe_sort(const u32* __restrict__ ids, u32 p, u32 e, u32 bt,
                                    u32* __restrict__ offsets, u32* __restrict__ pos,
                                    u32* __restrict__ sorted, u32* __restrict__ tiles,
                                    u32* __restrict__ ntiles) {
    extern __shared__ u32 su[];
    __shared__ u32 ws[64];
    u32* cnt = su;
    u32* off = su + e;
    grid_dep_wait();
    const u32 tid = threadIdx.x, nth = blockDim.x;
    for (u32 i = tid; i < e; i += nth) cnt[i] = 0;
    __syncthreads();
    if (p <= MOE_SORT_STABLE) {
        for (u32 i = tid; i < p; i += nth) {
            const u32 x = ids[i];
            u32 r = 0xffffffffu;
            if (x < e) {
                r = 0;
                for (u32 j = 0; j < i; j++) r += ids[j] == x ? 1u : 0u;
                atomicAdd(&cnt[x], 1u);
            }
            pos[i] = r;
        }
    } else {
        for (u32 i = tid; i < p; i += nth) {
            const u32 x = ids[i];
            pos[i] = x < e ? atomicAdd(&cnt[x], 1u) : 0xffffffffu;
        }
    }
    __syncthreads();
    const u32 per = (e + nth - 1) / nth;
    const u32 i0 = min(e, tid * per), i1 = min(e, i0 + per);
    u32 la = 0, lt = 0;
    for (u32 i = i0; i < i1; i++) {
        la += cnt[i];
        lt += (cnt[i] + bt - 1) / bt;
    }
    u32 a, tt, ta, tb;
    moe_block_scan2(la, lt, ws, a, tt, ta, tb);
    for (u32 i = i0; i < i1; i++) {
        const u32 c = cnt[i], nt = (c + bt - 1) / bt;
        off[i] = a;
        offsets[i] = a;
        for (u32 t = 0; t < nt; t++) {
            tiles[2 * (tt + t)] = i;
            tiles[2 * (tt + t) + 1] = t * bt;
        }
        a += c;
        tt += nt;
    }
    if (tid == 0) {
        offsets[e] = ta;
        *ntiles = tb;
    }
    __syncthreads();
    for (u32 i = tid; i < p; i += nth) {
        const u32 x = ids[i];
        if (x < e) {
            const u32 sp = off[x] + pos[i];
            pos[i] = sp;
            sorted[sp] = i;
        }
    }
}

// MoeTile, moe_tile, moe_src_row, the activations (moe_act_f) and moe_bias: moe_common.cuh.

// ---------------------------------------------------------------------------------------------
// Grouped GEMV (decode: at most MT rows per tile). A warp owns RPW outputs of one tile (GU: the
// gate and up weight rows of each, else one row each) and reads its rows whole: lane l takes the
// 8-element (16-byte for bf16/f16) chunks l, l + 32, ... of every row, U chunks per row per
// iteration, so that NW·U independent weight loads per lane are in flight (a 256-thread block
// per output, as before, left most threads one partial 2048-element step when K = 1024 or
// 2304). The lanes' partial sums meet by shuffles: no shared memory, no barrier. A block of
// MOE_GEMV_WARPS warps covers MOE_GEMV_WARPS·RPW outputs; K % 8 == 0.
// grid = (ceil(nout / (MOE_GEMV_WARPS·RPW)), max tiles) (the host's launch::moe_gemv_outputs).
// The expert is known only after the wait (the sort's output), so no weight prefetch before it.
#define MOE_GEMV_WARPS 8
// Outputs per warp (the host's launch::MOE_GEMV_{GU,DN}_RPW repeat these).
#define MOE_GEMV_GU_RPW 1
#define MOE_GEMV_DN_RPW 4
__device__ __forceinline__ uint4 moe_ld_stream16(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}
template <typename T> __device__ __forceinline__ void moe_wload(Vec8<T>& v, const T* p) {
    v.r = moe_ld_stream16(p);
}
template <> __device__ __forceinline__ void moe_wload<float>(Vec8<float>& v, const float* p) {
    const uint4 a = moe_ld_stream16(p), b = moe_ld_stream16(p + 4);
    v.a = make_float4(__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(a.z), __uint_as_float(a.w));
    v.b = make_float4(__uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w));
}

// Loads in flight per lane of the grouped GEMV: 16 loads of 16 bytes for 1–2 rows per tile;
// fewer registers for more rows (their x chunks) and for f32 (two loads per chunk).
template <typename T> __host__ __device__ constexpr int moe_gemv_unroll(int nw, int mt) {
    const int u = (16 / nw) / (sizeof(T) == 4 ? 2 : 1) / (mt >= 8 ? 4 : mt >= 4 ? 2 : 1);
    return u > 0 ? u : 1;
}

// A warp's NW × MT dot products of weight rows wr[r] with activation rows xr[i] (K = kdim,
// K % 8 == 0), every lane left holding the sums: lane l takes the 8-element chunks l, l + 32, …
// in increasing order (U chunks per row in flight), then the lanes meet by warp_sum. The sums do
// not depend on U or MT (each lane visits its chunks in the same order), so the grouped GEMV and
// the fused decode block below give the same value for the same row.
template <typename T, int NW, int MT, int U>
__device__ __forceinline__ void moe_warp_dots(const T* const* wr, const T* const* xr, u32 kdim,
                                              u32 lane, float (&acc)[NW][MT]) {
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = 0.f;
    const u32 nch = kdim / 8;
    for (u32 c0 = lane; c0 < nch; c0 += 32 * U) {
        Vec8<T> wv[U][NW];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const u32 c = c0 + u * 32;
#pragma unroll
            for (int r = 0; r < NW; r++) {
                if (c < nch) moe_wload<T>(wv[u][r], wr[r] + (u64)c * 8);
                else wv[u][r].zero();
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const u32 c = c0 + u * 32;
            if (c >= nch) break;
            float xf[MT][8];
#pragma unroll
            for (int i = 0; i < MT; i++) {
                Vec8<T> v;
                v.load(xr[i] + (u64)c * 8);
                v.to_float(xf[i]);
            }
#pragma unroll
            for (int r = 0; r < NW; r++) {
                float wf[8];
                wv[u][r].to_float(wf);
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int q = 0; q < 8; q++) acc[r][i] = fmaf(wf[q], xf[i][q], acc[r][i]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = warp_sum(acc[r][i]);
}

template <typename T, bool GU, int MT, int RPW>
__device__ __forceinline__ void moe_gemv_impl(const T* __restrict__ a, const T* __restrict__ w,
                                              T* __restrict__ out, const u32* __restrict__ offsets,
                                              const u32* __restrict__ sorted,
                                              const u32* __restrict__ tiles,
                                              const u32* __restrict__ ntiles, u32 bt, u32 gather_k,
                                              u32 nout, u32 kdim, u32 wrows, float limit,
                                              const T* __restrict__ bias, u32 act, float alpha) {
    constexpr int NW = GU ? 2 * RPW : RPW;
    constexpr int U = moe_gemv_unroll<T>(NW, MT);
    grid_dep_wait();
    MoeTile tl;
    if (!moe_tile(offsets, tiles, ntiles, min(bt, (u32)MT), tl)) return;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 o0 = (blockIdx.x * MOE_GEMV_WARPS + warp) * RPW;
    if (o0 >= nout) return;  // no barrier below
    const T* wexp = w + (u64)tl.expert * wrows * kdim;
    const T* wr[NW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const u32 o = min(o0 + r, nout - 1);
        wr[r] = wexp + (u64)(GU ? moe_gu_row(o, false, nout, act) : o) * kdim;
        if (GU) wr[RPW + r] = wexp + (u64)moe_gu_row(o, true, nout, act) * kdim;
    }
    const T* xr[MT];
#pragma unroll
    for (int i = 0; i < MT; i++)
        xr[i] = a + (u64)moe_src_row(sorted, gather_k, tl.first + min((u32)i, tl.rows - 1)) * kdim;
    float acc[NW][MT];
    moe_warp_dots<T, NW, MT, U>(wr, xr, kdim, lane, acc);
    // Lane r·MT + i writes output o0 + r of tile row i.
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const u32 o = o0 + r;
            if (lane != (u32)(r * MT + i) || o >= nout || (u32)i >= tl.rows) continue;
            float v;
            if (GU) {
                const float g = acc[r][i] + moe_bias(bias, tl.expert, wrows, moe_gu_row(o, false, nout, act));
                const float u = acc[RPW + r][i] + moe_bias(bias, tl.expert, wrows, moe_gu_row(o, true, nout, act));
                v = moe_act_f(g, u, limit, act, alpha);
            } else {
                v = acc[r][i] + moe_bias(bias, tl.expert, wrows, o);
            }
            out[(u64)(tl.first + i) * nout + o] = from_f<T>(v);
        }
}

// ---------------------------------------------------------------------------------------------
// Grouped tensor-core GEMM (bf16/f16, K % 8 == 0): tile 64 rows × 128 weight rows × 32 k,
// 3-stage cp.async pipeline, 8 warps as 2 (rows) × 4 (weight rows), mma.sync m16n8k16, f32
// accumulation. GU: the 128 weight rows are gate rows n0 .. n0 + 64 and the matching up rows,
// each warp holds 16 gate and the same 16 up columns, and the epilogue writes silu(g)·u for 64
// outputs; else 128 outputs. grid = (ceil(nout / (GU ? 64 : 128)), max tiles).
#define MOE_BM 64
#define MOE_BN 128
#define MOE_BK 32
#define MOE_LD (MOE_BK + 8)
#define MOE_STAGES 3
template <typename T, bool GU>
__device__ __forceinline__ void moe_mma_impl(const T* __restrict__ a, const T* __restrict__ w,
                                             T* __restrict__ out, const u32* __restrict__ offsets,
                                             const u32* __restrict__ sorted,
                                             const u32* __restrict__ tiles,
                                             const u32* __restrict__ ntiles, u32 bt, u32 gather_k,
                                             u32 nout, u32 kdim, u32 wrows, float limit,
                                             const T* __restrict__ bias, u32 act, float alpha) {
    __shared__ __align__(16) T sa[MOE_STAGES][MOE_BM * MOE_LD];
    __shared__ __align__(16) T sb[MOE_STAGES][MOE_BN * MOE_LD];
    grid_dep_wait();
    MoeTile tl;
    if (!moe_tile(offsets, tiles, ntiles, min(bt, (u32)MOE_BM), tl)) return;
    const u32 tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const u32 wm = wp & 1, wn = wp >> 1;
    const u32 g = lane >> 2, t4 = lane & 3;
    const u32 n0 = blockIdx.x * (GU ? MOE_BN / 2 : MOE_BN);
    const T* wexp = w + (u64)tl.expert * wrows * kdim;

    // This thread's copy jobs: one A chunk (row tid / 4, chunk tid % 4), two B chunks.
    const u32 ar = tid >> 2, ac = (tid & 3) * 8;
    const bool a_ok = ar < tl.rows;
    const T* asrc = a + (u64)moe_src_row(sorted, gather_k, tl.first + (a_ok ? ar : 0)) * kdim + ac;
    const T* bsrc[2];
    bool b_ok[2];
    u32 brow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const u32 br = (tid >> 2) + 128 * 0 + i * 64;
        brow[i] = br;
        const u32 wrow = moe_weight_row<GU, MOE_BN / 2>(n0, br, nout, act, b_ok[i]);
        bsrc[i] = wexp + (u64)(b_ok[i] ? wrow : 0) * kdim + ac;
    }
    auto load = [&](u32 kt, u32 st) {
        const u32 k0 = kt * MOE_BK;
        const bool kin = k0 + ac < kdim;
        cp_async16(smem_addr(&sa[st][ar * MOE_LD + ac]), asrc + k0, (a_ok && kin) ? 16u : 0u);
#pragma unroll
        for (int i = 0; i < 2; i++)
            cp_async16(smem_addr(&sb[st][brow[i] * MOE_LD + ac]), bsrc[i] + k0,
                       (b_ok[i] && kin) ? 16u : 0u);
    };

    float acc[2][4][4];
    u32 pb[2];  // smem row of the first of each pair of this warp's n-tiles
    moe_mma_start<GU>(acc, pb, wn);
    const u32 nk = (kdim + MOE_BK - 1) / MOE_BK;
    moe_kloop<MOE_STAGES>(nk, load, [&](u32 st) {
#pragma unroll
        for (u32 kk = 0; kk < MOE_BK; kk += 16) {
            u32 af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm_x4(smem_addr(&sa[st][(wm * 32 + mt * 16 + (lane & 15)) * MOE_LD + kk + (lane >> 4) * 8]),
                        af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                u32 b0, b1, b2, b3;
                ldsm_x4(smem_addr(&sb[st][(pb[jj] + (lane & 7) + (lane >> 4) * 8) * MOE_LD + kk + ((lane >> 3) & 1) * 8]),
                        b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    Mma<T>::run(acc[mt][2 * jj], af[mt], b0, b1);
                    Mma<T>::run(acc[mt][2 * jj + 1], af[mt], b2, b3);
                }
            }
        }
    });

    moe_mma_epilogue<T, GU>(acc, out, tl, wm, wn, g, t4, n0, nout, wrows, limit, bias, act, alpha);
}

// ---------------------------------------------------------------------------------------------
// Grouped tensor-core GEMM, tile-size variants (bf16/f16, K % 8 == 0) with moe_mma_impl's tile
// map, epilogues, act codes and biases. A block computes BM rows × BN weight rows with a
// STAGES-deep cp.async pipeline of BK-wide k slices in dynamic shared memory; WM × WN warps
// each own (BM / WM) rows × (BN / WN) weight rows; fragments by ldmatrix.x4, mma.sync
// m16n8k16, f32 accumulation. Shared layout: unpadded [rows][BK] stages whose 16-byte chunks
// are XOR-swizzled (BK 64: chunk c of row r at c ^ (r & 7); BK 32: c ^ ((r >> 1) & 3)), so the
// 8 row addresses of every ldmatrix phase and of every 8 consecutive cp.async chunks fall in 8
// distinct 16-byte bank groups (no conflicts). GU: the BN weight rows are the gate rows of BN/2
// outputs (smem rows 0 .. BN/2) and their up rows (BN/2 .. BN); a warp's first NT/2 n-tiles
// are gate columns, the others the same columns' up rows.
//   moe_mma16    BM 16, BN 128, BK 64, 4 stages, 1 × 8 warps: tiles of few rows (memory-bound);
//                every warp streams its own 16 weight rows. 72 KiB smem → 3 blocks per SM.
//   moe_mma32    BM 32, BN 128, BK 64, 4 stages, 2 × 4 warps (16 × 32 each). 80 KiB → 2 per SM.
//   moe_mma128   BM 128, BN 128, BK 32, 4 stages, 2 × 2 warps of 64 × 64 (128 threads;
//                compute-bound tiles). 64 KiB → 2 per SM (registers: 128 f32 accumulators).
//   moe_mma128w  BM 128, BN 256, BK 32, 4 stages, 2 × 4 warps of 64 × 64 (256 threads). 96 KiB,
//                1 block per SM; half the A traffic per flop of moe_mma128.
//   moe_mma128k64  moe_mma128 with BK 64 and 3 stages (half the barriers per flop). 96 KiB.
//   moe_mma128x8   128 × 128, BK 32, 4 stages, 2 × 4 warps of 64 × 32 (256 threads: twice the
//                  warps of moe_mma128 to hide latency). 64 KiB → 2 per SM.
//   moe_mma128r, moe_mma128xr  moe_mma128 and moe_mma128x8 with blocks rasterised in groups of
//                  8 tiles (moe_raster): each weight slice read once per expert from DRAM.
//   moe_mma64w     BM 64, BN 256, BK 32, 4 stages, 2 × 4 warps of 32 × 64: half the padding
//                  rows of a 128-row tile when an expert's rows just pass a multiple of 128.
//                  80 KiB → 2 per SM.
// Dynamic smem STAGES · (BM + BN) · BK · sizeof(T) bytes (launch::MoeTile::shape).
// grid = (ceil(nout / (GU ? BN / 2 : BN)), max tiles), block = 32 · WM · WN threads.
template <int BK> __device__ __forceinline__ u32 moe_sw(u32 row, u32 chunk) {
    if (BK == 64) return row * 64 + ((chunk ^ (row & 7)) << 3);
    return row * 32 + ((chunk ^ ((row >> 1) & 3)) << 3);
}

// Stores outputs col and col + 1 of a row (one 32-bit store when both exist and aligned).
template <typename T>
__device__ __forceinline__ void moe_store2(T* orow, u32 col, u32 nout, float v0, float v1) {
    if (col + 1 < nout && (nout & 1) == 0) {
        *reinterpret_cast<u32*>(orow + col) = Mma<T>::pack(v0, v1);
    } else {
        if (col < nout) orow[col] = from_f<T>(v0);
        if (col + 1 < nout) orow[col + 1] = from_f<T>(v1);
    }
}

// Outputs col and col + 1 of a row of the grouped GEMMs from their accumulators: GU
// act(g + bias, u + bias) of the gate values g and the up values u, else g + bias; outputs past
// nout are not stored (moe_store2).
template <typename T, bool GU>
__device__ __forceinline__ void moe_store_outputs(T* orow, u32 col, float g0, float g1, float u0,
                                                  float u1, u32 expert, u32 nout, u32 wrows,
                                                  float limit, const T* __restrict__ bias,
                                                  u32 act, float alpha) {
    const float gs[2] = {g0, g1}, us[2] = {u0, u1};
    float v[2] = {0.f, 0.f};
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const u32 c = col + e;
        if (c >= nout) continue;
        if (GU) {
            const float gv = gs[e] + moe_bias(bias, expert, wrows, moe_gu_row(c, false, nout, act));
            const float uv = us[e] + moe_bias(bias, expert, wrows, moe_gu_row(c, true, nout, act));
            v[e] = moe_act_f(gv, uv, limit, act, alpha);
        } else {
            v[e] = gs[e] + moe_bias(bias, expert, wrows, c);
        }
    }
    moe_store2(orow, col, nout, v[0], v[1]);
}

// The cp.async copy jobs of a BM × BN × BK grouped-GEMM block of NTH threads (moe_mmat_impl,
// moe_wgmma_impl): thread tid copies the 16-byte chunks tid + i · NTH of the A and B slices
// (row idx / CH, chunk idx % CH) into moe_sw<BK>'s swizzled layout. A rows past the tile's rows,
// weight rows past the outputs (moe_weight_row) and chunks past K load zeros.
template <typename T, bool GU, int BM, int BN, int BK, int NTH>
struct MoeCopies {
    static constexpr int CH = BK / 8;  // 16-byte chunks per smem row
    static constexpr int A_CH = BM * CH, B_CH = BN * CH;
    static constexpr int A_IT = (A_CH + NTH - 1) / NTH, B_IT = B_CH / NTH;
    static_assert(B_CH % NTH == 0 && NTH % CH == 0, "copy jobs");
    u32 tid, kc;
    const T* asrc[A_IT];
    u32 adst[A_IT];  // byte offsets in a stage
    bool aok[A_IT];
    const T* bsrc[B_IT];
    u32 bdst[B_IT];
    bool bok[B_IT];

    __device__ __forceinline__ MoeCopies(u32 tid_, const T* a, const T* wexp,
                                         const u32* sorted, u32 gather_k, const MoeTile& tl,
                                         u32 n0, u32 nout, u32 act, u32 kdim)
        : tid(tid_), kc((tid_ % CH) * 8) {
#pragma unroll
        for (int i = 0; i < A_IT; i++) {
            const u32 idx = tid + i * NTH, r = idx / CH;
            aok[i] = idx < A_CH && r < tl.rows;
            adst[i] = moe_sw<BK>(idx < A_CH ? r : 0, idx % CH) * (u32)sizeof(T);
            asrc[i] = a + (u64)moe_src_row(sorted, gather_k, tl.first + (aok[i] ? r : 0)) * kdim + kc;
        }
#pragma unroll
        for (int i = 0; i < B_IT; i++) {
            const u32 idx = tid + i * NTH, br = idx / CH;
            const u32 wrow = moe_weight_row<GU, BN / 2>(n0, br, nout, act, bok[i]);
            bdst[i] = moe_sw<BK>(br, idx % CH) * (u32)sizeof(T);
            bsrc[i] = wexp + (u64)(bok[i] ? wrow : 0) * kdim + kc;
        }
    }

    // Slice kt's copies into the stage whose A and B start at shared addresses sa and sb.
    __device__ __forceinline__ void load(u32 kt, u32 kdim, u32 sa, u32 sb) const {
        const u32 k0 = kt * BK;
        const bool kin = k0 + kc < kdim;
#pragma unroll
        for (int i = 0; i < A_IT; i++)
            if (A_CH % NTH == 0 || tid + i * NTH < A_CH)
                cp_async16(sa + adst[i], asrc[i] + k0, (aok[i] && kin) ? 16u : 0u);
#pragma unroll
        for (int i = 0; i < B_IT; i++)
            cp_async16(sb + bdst[i], bsrc[i] + k0, (bok[i] && kin) ? 16u : 0u);
    }
};

template <typename T, bool GU, int BM, int BN, int BK, int STAGES, int WM, int WN, int RG = 0>
__device__ __forceinline__ void moe_mmat_impl(const T* __restrict__ a, const T* __restrict__ w,
                                              T* __restrict__ out, const u32* __restrict__ offsets,
                                              const u32* __restrict__ sorted,
                                              const u32* __restrict__ tiles,
                                              const u32* __restrict__ ntiles, u32 bt, u32 gather_k,
                                              u32 nout, u32 kdim, u32 wrows, float limit,
                                              const T* __restrict__ bias, u32 act, float alpha) {
    constexpr int NTH = 32 * WM * WN;
    constexpr int WTM = BM / WM, WTN = BN / WN;
    constexpr int MT = WTM / 16, NT = WTN / 8;
    static_assert(BK == 32 || BK == 64, "BK is 32 or 64");
    static_assert(WTM % 16 == 0 && NT % 2 == 0, "tile shape");
    static_assert(!GU || WN * (NT / 2) * 8 == BN / 2, "GU: a warp's gate and up halves");
    extern __shared__ __align__(128) unsigned char moe_dsmem[];
    T* sa = reinterpret_cast<T*>(moe_dsmem);  // [STAGES][BM · BK]
    T* sb = sa + STAGES * BM * BK;            // [STAGES][BN · BK]
    grid_dep_wait();
    u32 colb = blockIdx.x, ti = blockIdx.y;
    if (RG > 0) moe_raster<RG>(colb, ti);
    MoeTile tl;
    if (!moe_tile_at(ti, offsets, tiles, ntiles, min(bt, (u32)BM), tl)) return;
    const u32 tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const u32 wm = wp % WM, wn = wp / WM;
    const u32 g = lane >> 2, t4 = lane & 3;
    const u32 n0 = colb * (GU ? BN / 2 : BN);
    const T* wexp = w + (u64)tl.expert * wrows * kdim;

    const MoeCopies<T, GU, BM, BN, BK, NTH> cp(tid, a, wexp, sorted, gather_k, tl, n0, nout, act, kdim);
    auto load = [&](u32 kt, u32 st) {
        cp.load(kt, kdim, smem_addr(sa + st * (BM * BK)), smem_addr(sb + st * (BN * BK)));
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    // ldmatrix rows of this lane: A row of each m-tile; B row of each pair of n-tiles (matrices
    // 0, 1: n-tile 2jj at k +0, +8; 2, 3: n-tile 2jj + 1).
    u32 arow[MT], brow[NT / 2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) arow[mt] = wm * WTM + mt * 16 + (lane & 15);
#pragma unroll
    for (int jj = 0; jj < NT / 2; jj++) {
        const u32 j = 2 * jj + (lane >> 4);
        u32 base;
        if (GU) base = j < NT / 2 ? wn * (NT / 2) * 8 + j * 8 : BN / 2 + wn * (NT / 2) * 8 + (j - NT / 2) * 8;
        else base = wn * WTN + j * 8;
        brow[jj] = base + (lane & 7);
    }
    const u32 asel = lane >> 4, bsel = (lane >> 3) & 1;
    const u32 nk = (kdim + BK - 1) / BK;
    moe_kloop<STAGES>(nk, load, [&](u32 st) {
        const T* sas = sa + st * (BM * BK);
        const T* sbs = sb + st * (BN * BK);
#pragma unroll
        for (u32 kk = 0; kk < BK / 8; kk += 2) {
            u32 af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldsm_x4(smem_addr(sas + moe_sw<BK>(arow[mt], kk + asel)), af[mt][0], af[mt][1],
                        af[mt][2], af[mt][3]);
#pragma unroll
            for (int jj = 0; jj < NT / 2; jj++) {
                u32 b0, b1, b2, b3;
                ldsm_x4(smem_addr(sbs + moe_sw<BK>(brow[jj], kk + bsel)), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    Mma<T>::run(acc[mt][2 * jj], af[mt], b0, b1);
                    Mma<T>::run(acc[mt][2 * jj + 1], af[mt], b2, b3);
                }
            }
        }
    });

    // Epilogue. acc[mt][j][h · 2 + e]: row wm·WTM + mt·16 + g + 8h, column t4·2 + e of n-tile j.
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const u32 row = wm * WTM + mt * 16 + g + 8 * hh;
            if (row >= tl.rows) continue;
            T* orow = out + (u64)(tl.first + row) * nout;
            if (GU) {
#pragma unroll
                for (int j = 0; j < NT / 2; j++)
                    moe_store_outputs<T, true>(orow, n0 + wn * (NT / 2) * 8 + j * 8 + t4 * 2,
                                               acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1],
                                               acc[mt][j + NT / 2][2 * hh],
                                               acc[mt][j + NT / 2][2 * hh + 1], tl.expert, nout,
                                               wrows, limit, bias, act, alpha);
            } else {
#pragma unroll
                for (int j = 0; j < NT; j++)
                    moe_store_outputs<T, false>(orow, n0 + wn * WTN + j * 8 + t4 * 2,
                                                acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1], 0.f,
                                                0.f, tl.expert, nout, wrows, limit, bias, act,
                                                alpha);
            }
        }
}

// ---------------------------------------------------------------------------------------------
// Grouped FMA GEMM for any dtype and K (f32 and shapes the other kernels do not take): tile
// 32 rows × 32 outputs × 16 k, 256 threads each computing 2 × 2 outputs (and the matching up
// outputs for GU). grid = (ceil(nout / 32), max tiles).
template <typename T, bool GU>
__device__ __forceinline__ void moe_fma_impl(const T* __restrict__ a, const T* __restrict__ w,
                                             T* __restrict__ out, const u32* __restrict__ offsets,
                                             const u32* __restrict__ sorted,
                                             const u32* __restrict__ tiles,
                                             const u32* __restrict__ ntiles, u32 bt, u32 gather_k,
                                             u32 nout, u32 kdim, u32 wrows, float limit,
                                             const T* __restrict__ bias, u32 act, float alpha) {
    __shared__ float sa[32][17];
    __shared__ float sw[64][17];
    grid_dep_wait();
    MoeTile tl;
    if (!moe_tile(offsets, tiles, ntiles, min(bt, 32u), tl)) return;
    const u32 tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const u32 n0 = blockIdx.x * 32;
    const T* wexp = w + (u64)tl.expert * wrows * kdim;
    float acc[2][2][2] = {};  // [gate/up][row][out]
    for (u32 k0 = 0; k0 < kdim; k0 += 16) {
        __syncthreads();
        for (u32 e = tid; e < 32 * 16; e += 256) {
            const u32 r = e / 16, c = e % 16, kk = k0 + c;
            float v = 0.f;
            if (r < tl.rows && kk < kdim)
                v = to_f(a[(u64)moe_src_row(sorted, gather_k, tl.first + r) * kdim + kk]);
            sa[r][c] = v;
        }
        for (u32 e = tid; e < (GU ? 64 : 32) * 16; e += 256) {
            const u32 r = e / 16, c = e % 16, kk = k0 + c;
            const u32 o = n0 + (r & 31);
            float v = 0.f;
            if (o < nout && kk < kdim) {
                const u32 wrow = GU ? moe_gu_row(o, r >= 32, nout, act) : o;
                v = to_f(wexp[(u64)wrow * kdim + kk]);
            }
            sw[r][c] = v;
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < 16; c++) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const float av = sa[ty * 2 + i][c];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    acc[0][i][j] = fmaf(av, sw[tx * 2 + j][c], acc[0][i][j]);
                    if (GU) acc[1][i][j] = fmaf(av, sw[32 + tx * 2 + j][c], acc[1][i][j]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const u32 row = ty * 2 + i, col = n0 + tx * 2 + j;
            if (row < tl.rows && col < nout) {
                float v;
                if (GU) {
                    const float gv = acc[0][i][j] + moe_bias(bias, tl.expert, wrows, moe_gu_row(col, false, nout, act));
                    const float uv = acc[1][i][j] + moe_bias(bias, tl.expert, wrows, moe_gu_row(col, true, nout, act));
                    v = moe_act_f(gv, uv, limit, act, alpha);
                } else {
                    v = acc[0][i][j] + moe_bias(bias, tl.expert, wrows, col);
                }
                out[(u64)(tl.first + row) * nout + col] = from_f<T>(v);
            }
        }
}

// y[n, d] = Σ_j weights[n, j] · y2[pos[n·k + j], d] (f32, j in order). grid.x = N, grid.y =
// column blocks (both grid-stride; any grid gives the same sums: a decode step spreads its one
// token's columns over several SMs, launch::moe_combine_grid).
template <typename T>
__device__ __forceinline__ void moe_combine_impl(const T* __restrict__ y2, const u32* __restrict__ pos,
                                                 const float* __restrict__ weights, T* __restrict__ y,
                                                 u32 n, u32 k, u32 d) {
    grid_dep_wait();
    for (u32 t = blockIdx.x; t < n; t += gridDim.x) {
        for (u32 c = blockIdx.y * blockDim.x + threadIdx.x; c < d; c += gridDim.y * blockDim.x) {
            float acc = 0.f;
            for (u32 j = 0; j < k; j++) {
                const u32 sp = pos[(u64)t * k + j];
                if (sp == 0xffffffffu) continue;
                acc = fmaf(weights[(u64)t * k + j], to_f(y2[(u64)sp * d + c]), acc);
            }
            y[(u64)t * d + c] = from_f<T>(acc);
        }
    }
}

template <typename T>
__device__ __forceinline__ void moe_cast_impl(const T* __restrict__ x, float* __restrict__ y, u64 n) {
    grid_dep_wait();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        y[i] = to_f(x[i]);
}

#define MOE_ARGS(T)                                                                            \
    const T *a, const T *w, T *out, const u32 *offsets, const u32 *sorted, const u32 *tiles,  \
        const u32 *ntiles, u32 bt, u32 gather_k, u32 nout, u32 kdim, u32 wrows, float limit,  \
        const T *bias, u32 act, float alpha
#define MOE_PASS                                                                              \
    a, w, out, offsets, sorted, tiles, ntiles, bt, gather_k, nout, kdim, wrows, limit, bias, act, alpha
#define MOE_GEMV(S, T, MT)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) moe_gemv_##S##_gu_m##MT(MOE_ARGS(T)) {     \
        moe_gemv_impl<T, true, MT, MOE_GEMV_GU_RPW>(MOE_PASS);                                              \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) moe_gemv_##S##_dn_m##MT(MOE_ARGS(T)) {     \
        moe_gemv_impl<T, false, MT, MOE_GEMV_DN_RPW>(MOE_PASS);                                             \
    }
#define MOE_ALL(S, T)                                                                         \
    MOE_GEMV(S, T, 1) MOE_GEMV(S, T, 2) MOE_GEMV(S, T, 4) MOE_GEMV(S, T, 8)                   \
    extern "C" __global__ void __launch_bounds__(256) moe_fma_##S##_gu(MOE_ARGS(T)) {            \
        moe_fma_impl<T, true>(MOE_PASS);                                                      \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) moe_fma_##S##_dn(MOE_ARGS(T)) {            \
        moe_fma_impl<T, false>(MOE_PASS);                                                     \
    }                                                                                         \
    extern "C" __global__ void moe_combine_##S(const T* y2, const u32* pos, const float* wts,  \
                                               T* y, u32 n, u32 k, u32 d) {                   \
        moe_combine_impl<T>(y2, pos, wts, y, n, k, d);                                        \
    }                                                                                         \
    extern "C" __global__ void moe_cast_f32_##S(const T* x, float* y, u64 n) {                \
        moe_cast_impl<T>(x, y, n);                                                            \
    }
DAYONE_FOR_FLOAT_TYPES(MOE_ALL)

// moe_mma{16,32,128,128w}: moe_mmat_impl<T, GU, BM, BN, BK, STAGES, WM, WN> (see there; the host's
// launch::MoeTile::shape repeats these shapes).
#define MOE_MMAT(S, T, NAME, NTH, MINB, BM, BN, BK, STAGES, WM, WN, RG)                          \
    extern "C" __global__ void __launch_bounds__(NTH, MINB) NAME##_##S##_gu(MOE_ARGS(T)) {      \
        moe_mmat_impl<T, true, BM, BN, BK, STAGES, WM, WN, RG>(MOE_PASS);                     \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(NTH, MINB) NAME##_##S##_dn(MOE_ARGS(T)) {      \
        moe_mmat_impl<T, false, BM, BN, BK, STAGES, WM, WN, RG>(MOE_PASS);                    \
    }
#define MOE_MMA(S, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(256) moe_mma_##S##_gu(MOE_ARGS(T)) {            \
        moe_mma_impl<T, true>(MOE_PASS);                                                      \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) moe_mma_##S##_dn(MOE_ARGS(T)) {            \
        moe_mma_impl<T, false>(MOE_PASS);                                                     \
    }                                                                                         \
    MOE_MMAT(S, T, moe_mma16, 256, 3, 16, 128, 64, 4, 1, 8, 0)                                \
    MOE_MMAT(S, T, moe_mma32, 256, 2, 32, 128, 64, 4, 2, 4, 0)                                \
    MOE_MMAT(S, T, moe_mma128, 128, 2, 128, 128, 32, 4, 2, 2, 0)                              \
    MOE_MMAT(S, T, moe_mma128r, 128, 2, 128, 128, 32, 4, 2, 2, 8)                             \
    MOE_MMAT(S, T, moe_mma128w, 256, 1, 128, 256, 32, 4, 2, 4, 0)                             \
    MOE_MMAT(S, T, moe_mma128k64, 128, 2, 128, 128, 64, 3, 2, 2, 0)                           \
    MOE_MMAT(S, T, moe_mma128x8, 256, 2, 128, 128, 32, 4, 2, 4, 0)                            \
    MOE_MMAT(S, T, moe_mma128xr, 256, 2, 128, 128, 32, 4, 2, 4, 8)                            \
    MOE_MMAT(S, T, moe_mma64w, 256, 2, 64, 256, 32, 4, 2, 4, 0)
#if defined(DAYONE_ONLY_BF16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_F16))
MOE_MMA(bf16, bf16)
#endif
#if defined(DAYONE_ONLY_F16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_BF16))
MOE_MMA(f16, f16)
#endif
