// Batch-invariant GEMM: y[M, N] = x[M, K] · w[N, K]ᵀ (optionally batched over grid.z with
// element strides), f32 accumulation, output in T or f32.
//
// Why: cuBLAS picks its algorithm (tile shape, split-K, stream-K) by M, and the decode GEMV
// reduces K in yet another order, so one row of x gives different last bits depending on how
// many rows share its call (a prefix-cache hit prefills only the suffix, a batch of 16 decodes
// sixteen rows at once). Here every output element is computed in one fixed order whatever M
// and whatever tile variant: serving.md §D4, He et al. 2025 "Defeating Nondeterminism in LLM
// Inference" (fixed reduction order per element; no split-K).
//
//  * gemm_inv_mma_*  (bf16/f16, K ∈ 8ℤ): K is cut into nseg segments fixed by K alone (at most
//    4 of at least 1024 keys: decode-sized M gets 4× the blocks without a split that depends
//    on M); per segment a_s = 0; for k0 ascending in 16-key steps of the segment:
//    a_s = mma.m16n8k16(x[m, k0:k0+16], w[n, k0:k0+16], a_s); then y = ((a_0 + a_1) + a_2) + a_3
//    (gemm_inv_combine). Rows past M and keys past K are zeros in shared memory. Tile variants differ only in how many rows
//    and columns a block owns and how many keys a stage prefetches, never in the per-element
//    order.
//  * gemm_inv_fma_*  (any dtype, any K): acc = 0; for k = 0 … K−1: acc = fma(x[m,k], w[n,k], acc)
//    in f32; variants s: 16 × 64, l: 64 × 64 outputs per block.
//
// Parameters: x, w, y, M, N, K, lda (x row stride), ldw (w row stride), ldy (y row stride),
// sx, sw, sy (element offsets between batches: grid.z). grid = (ceil(N / BN), ceil(M / BM), B).

// ---------------------------------------------------------------------------------------------
// Tensor-core variant. grid.z = batch · nseg; block z takes batch z / nseg and key segment
// z % nseg = [s · kseg, min((s + 1) · kseg, K)) (kseg ∈ 16ℤ, chosen from K alone). With one
// segment it writes y; otherwise it writes its f32 partial to part[z][M][N] and gemm_inv_combine
// adds the segments in order.
template <typename T, typename TO, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
__device__ __forceinline__ void gemm_inv_mma_impl(const T* __restrict__ x, const T* __restrict__ w,
                                                  TO* __restrict__ y, float* __restrict__ part,
                                                  u32 m, u32 n, u32 k, u32 lda, u32 ldw, u32 ldy,
                                                  u64 sx, u64 sw, u64 sy, u32 kseg, u32 nseg) {
    constexpr int PAD = 8, LDS = BK + PAD;
    constexpr int NT = 32 * WARPS_M * WARPS_N;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int FM = WTM / 16, FN = WTN / 8;
    static_assert(FN % 2 == 0, "two n8 tiles per ldmatrix.x4");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sa = reinterpret_cast<T*>(smem_raw);  // [STAGES][BM][LDS]
    T* sb = sa + STAGES * BM * LDS;          // [STAGES][BN][LDS]
    grid_dep_wait();

    const u32 z = blockIdx.z, b = z / nseg, seg = z % nseg;
    x += b * sx;
    w += b * sw;
    y += b * sy;
    const u32 kbeg = min(seg * kseg, k), kend = min(kbeg + kseg, k);
    const u32 n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 wm = warp / WARPS_N, wn = warp % WARPS_N;
    const u32 ktiles = (kend - kbeg + BK - 1) / BK;

    auto load_tile = [&](u32 stage, u32 kt) {
        const u32 k0 = kbeg + kt * BK;
        constexpr int CPR = BK / 8;  // 16-byte chunks per row
        for (u32 e = tid; e < (u32)(BM * CPR); e += NT) {
            const u32 r = e / CPR, c = (e % CPR) * 8;
            const u32 gm = m0 + r, gk = k0 + c;
            const bool ok = gm < m && gk < kend;
            const T* src = ok ? x + (u64)gm * lda + gk : x;
            cp_async16(smem_addr(sa + (stage * BM + r) * LDS + c), src, ok ? 16u : 0u);
        }
        for (u32 e = tid; e < (u32)(BN * CPR); e += NT) {
            const u32 r = e / CPR, c = (e % CPR) * 8;
            const u32 gn = n0 + r, gk = k0 + c;
            const bool ok = gn < n && gk < kend;
            const T* src = ok ? w + (u64)gn * ldw + gk : w;
            cp_async16(smem_addr(sb + (stage * BN + r) * LDS + c), src, ok ? 16u : 0u);
        }
    };

    float acc[FM][FN][4];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if ((u32)s < ktiles) load_tile(s, s);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile kt landed; tile kt − 1 fully consumed
        const u32 next = kt + STAGES - 1;
        if (next < ktiles) load_tile(next % STAGES, next);
        cp_async_commit();
        const T* ta = sa + (kt % STAGES) * BM * LDS;
        const T* tb = sb + (kt % STAGES) * BN * LDS;
        // The segment's 16-key steps only: a tile running past the segment end stops there,
        // so every variant (whatever BK) performs exactly the same mma chain.
        const u32 ksteps = min((u32)BK, kend - (kbeg + kt * BK));
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            if ((u32)kk >= ksteps) break;
            u32 af[FM][4];
#pragma unroll
            for (int i = 0; i < FM; i++) {
                const u32 r = wm * WTM + i * 16 + (lane & 15);
                ldsm_x4(smem_addr(ta + r * LDS + kk + (lane >> 4) * 8), af[i][0], af[i][1],
                        af[i][2], af[i][3]);
            }
#pragma unroll
            for (int j = 0; j < FN; j += 2) {
                u32 b0, b1, b2, b3;
                const u32 r = wn * WTN + j * 8 + (lane & 7) + (lane >> 4) * 8;
                ldsm_x4(smem_addr(tb + r * LDS + kk + ((lane >> 3) & 1) * 8), b0, b1, b2, b3);
#pragma unroll
                for (int i = 0; i < FM; i++) {
                    Mma<T>::run(acc[i][j], af[i], b0, b1);
                    Mma<T>::run(acc[i][j + 1], af[i], b2, b3);
                }
            }
        }
    }
    cp_async_wait<0>();

    const u32 g = lane >> 2, t4 = lane & 3;
    float* pz = part + (u64)z * m * n;
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const u32 r = m0 + wm * WTM + i * 16 + g + (e >> 1) * 8;
                const u32 c = n0 + wn * WTN + j * 8 + t4 * 2 + (e & 1);
                if (r < m && c < n) {
                    if (nseg == 1) y[(u64)r * ldy + c] = from_f<TO>(acc[i][j][e]);
                    else pz[(u64)r * n + c] = acc[i][j][e];
                }
            }
}

// y[b][r, c] = ((part[b·nseg][r, c] + part[b·nseg + 1][r, c]) + …) in segment order, rounded
// once to TO. grid.x covers batch · M · N (grid-stride), block 256.
template <typename TO>
__device__ __forceinline__ void gemm_inv_combine_impl(const float* __restrict__ part,
                                                      TO* __restrict__ y, u32 m, u32 n, u32 ldy,
                                                      u64 sy, u32 batch, u32 nseg) {
    grid_dep_wait();
    const u64 mn = (u64)m * n, total = mn * batch;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 b = i / mn, rc = i % mn, r = rc / n, c = rc % n;
        const float* p = part + b * nseg * mn + rc;
        float t = p[0];
        for (u32 s = 1; s < nseg; s++) t += p[s * mn];
        y[b * sy + r * ldy + c] = from_f<TO>(t);
    }
}

// ---------------------------------------------------------------------------------------------
// FMA variant: 256 threads, each owning TM × TN outputs; tiles of BK = 16 keys staged as f32.
template <typename T, typename TO, int BM, int BN, int TM, int TN>
__device__ __forceinline__ void gemm_inv_fma_impl(const T* __restrict__ x, const T* __restrict__ w,
                                                  TO* __restrict__ y, u32 m, u32 n, u32 k,
                                                  u32 lda, u32 ldw, u32 ldy, u64 sx, u64 sw,
                                                  u64 sy) {
    constexpr int BK = 16, NT = 256;
    static_assert((BM / TM) * (BN / TN) == NT, "one thread per TM × TN outputs");
    __shared__ float sa[BK][BM + 1];
    __shared__ float sb[BK][BN + 1];
    grid_dep_wait();
    const u32 z = blockIdx.z;
    x += z * sx;
    w += z * sw;
    y += z * sy;
    const u32 n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const u32 tid = threadIdx.x;
    const u32 tr = tid / (BN / TN), tc = tid % (BN / TN);
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = 0.f;
    for (u32 k0 = 0; k0 < k; k0 += BK) {
        __syncthreads();
        for (u32 e = tid; e < (u32)(BM * BK); e += NT) {
            const u32 r = e / BK, c = e % BK, gm = m0 + r, gk = k0 + c;
            sa[c][r] = gm < m && gk < k ? to_f(x[(u64)gm * lda + gk]) : 0.f;
        }
        for (u32 e = tid; e < (u32)(BN * BK); e += NT) {
            const u32 r = e / BK, c = e % BK, gn = n0 + r, gk = k0 + c;
            sb[c][r] = gn < n && gk < k ? to_f(w[(u64)gn * ldw + gk]) : 0.f;
        }
        __syncthreads();
        // Keys past K are not multiplied at all (an fma with 0 · 0 would be exact too, but the
        // loop bound keeps the per-element chain identical to a plain sequential dot product).
        const u32 kend = min((u32)BK, k - k0);
        for (u32 kk = 0; kk < kend; kk++) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) a[i] = sa[kk][tr * TM + i];
#pragma unroll
            for (int j = 0; j < TN; j++) b[j] = sb[kk][tc * TN + j];
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) {
            const u32 r = m0 + tr * TM + i, c = n0 + tc * TN + j;
            if (r < m && c < n) y[(u64)r * ldy + c] = from_f<TO>(acc[i][j]);
        }
}

#define GEMM_INV_PARAMS(T, TO)                                                                  \
    const T *x, const T *w, TO *y, u32 m, u32 n, u32 k, u32 lda, u32 ldw, u32 ldy, u64 sx,       \
        u64 sw, u64 sy
#define GEMM_INV_ARGS x, w, y, m, n, k, lda, ldw, ldy, sx, sw, sy
#define GEMM_INV_MMA_PARAMS(T, TO)                                                              \
    const T *x, const T *w, TO *y, float *part, u32 m, u32 n, u32 k, u32 lda, u32 ldw, u32 ldy, \
        u64 sx, u64 sw, u64 sy, u32 kseg, u32 nseg
#define GEMM_INV_MMA_ARGS x, w, y, part, m, n, k, lda, ldw, ldy, sx, sw, sy, kseg, nseg

#define GEMM_INV_FMA(S, T, TO, OS)                                                              \
    extern "C" __global__ void __launch_bounds__(256) gemm_inv_fma_##S##_s##OS(                 \
        GEMM_INV_PARAMS(T, TO)) {                                                               \
        gemm_inv_fma_impl<T, TO, 16, 64, 1, 4>(GEMM_INV_ARGS);                                  \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) gemm_inv_fma_##S##_l##OS(                 \
        GEMM_INV_PARAMS(T, TO)) {                                                               \
        gemm_inv_fma_impl<T, TO, 64, 64, 4, 4>(GEMM_INV_ARGS);                                  \
    }
// Variants (the host picks by M; shared memory = STAGES · (BM + BN) · (BK + 8) · 2 bytes):
//   s  M ≤ 16:   16 × 32 outputs, 2 warps, keys in tiles of 128, 5 stages — decode: many
//                blocks, deep prefetch, so that the weight streams at the copy rate;
//   m  M ≤ 128:  64 × 64, 4 warps, tiles of 32, 4 stages;
//   l  larger:  128 × 128, 4 warps, tiles of 32, 3 stages.
#define GEMM_INV_MMA(S, T, TO, OS)                                                              \
    extern "C" __global__ void __launch_bounds__(64) gemm_inv_mma_##S##_s##OS(                  \
        GEMM_INV_MMA_PARAMS(T, TO)) {                                                           \
        gemm_inv_mma_impl<T, TO, 16, 32, 128, 1, 2, 5>(GEMM_INV_MMA_ARGS);                      \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(128) gemm_inv_mma_##S##_m##OS(                 \
        GEMM_INV_MMA_PARAMS(T, TO)) {                                                           \
        gemm_inv_mma_impl<T, TO, 64, 64, 32, 2, 2, 4>(GEMM_INV_MMA_ARGS);                       \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(128) gemm_inv_mma_##S##_l##OS(                 \
        GEMM_INV_MMA_PARAMS(T, TO)) {                                                           \
        gemm_inv_mma_impl<T, TO, 128, 128, 32, 2, 2, 3>(GEMM_INV_MMA_ARGS);                     \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) gemm_inv_combine_##S##OS(                 \
        const float* part, TO* y, u32 m, u32 n, u32 ldy, u64 sy, u32 batch, u32 nseg) {          \
        gemm_inv_combine_impl<TO>(part, y, m, n, ldy, sy, batch, nseg);                         \
    }

#define GEMM_INV_ALL(S, T)                                                                      \
    GEMM_INV_FMA(S, T, T, )                                                                     \
    GEMM_INV_FMA(S, T, float, _of32)                                                            \
    GEMM_INV_MMA_IF_HALF_##S(T)

#define GEMM_INV_MMA_IF_HALF_f32(T)
#define GEMM_INV_MMA_IF_HALF_bf16(T) GEMM_INV_MMA(bf16, T, T, ) GEMM_INV_MMA(bf16, T, float, _of32)
#define GEMM_INV_MMA_IF_HALF_f16(T) GEMM_INV_MMA(f16, T, T, ) GEMM_INV_MMA(f16, T, float, _of32)

DAYONE_FOR_FLOAT_TYPES(GEMM_INV_ALL)
