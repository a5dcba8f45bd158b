// Skinny product on the tensor cores for 5–16 rows of x (batched decode), 16-bit T:
// y[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n]), f32 accumulation in mma.sync m16n8k16 with the
// weight rows as the MMA's M and the tokens as its N (NT tiles of 8 tokens). The FMA GEMV spends
// 2·M flops of FMA issue per weight element, which at M = 8 left it FMA-bound (docs/perf.md,
// 11-30); here the tensor cores take the flops and the kernel only streams the weights.
// A block (256 threads) owns 16·RG weight rows and splits K over its 8 warps in 32-element
// steps (warp w takes steps w, w + 8, …, so a round of the block reads 512 contiguous bytes of
// each row). Lane (g = lane / 4, t = lane % 4) loads elements [8t, 8t + 8) of a step from
// weight rows g and g + 8 of each 16-row tile and from x rows g (and g + 8 for the second token
// tile): the MMA's k order is then a permutation of the step's 32 elements, the same for both
// operands, so each output sums the same products (in another order than the FMA GEMV, as
// cuBLAS also does). Rows past N and x rows past M re-read a valid row and are dropped;
// elements past K load as zeros. The warps' partial tiles meet in shared memory, summed in warp
// order. K % 8 == 0. grid.x = ceil(N / (16 · RG)).
template <typename T, int NT, int RG>
__device__ __forceinline__ void gemv_tc_impl(const T* __restrict__ x, const T* __restrict__ w,
                                             const T* __restrict__ bias, T* __restrict__ y,
                                             u32 m, u32 n, u32 k) {
    constexpr int U = 4;  // steps in flight per warp
    __shared__ __align__(16) float red[GEMV_WARPS][RG * NT * 32 * 4];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const u32 row0 = blockIdx.x * (16 * RG);
    const T* wr[RG][2];
#pragma unroll
    for (int rg = 0; rg < RG; rg++)
#pragma unroll
        for (int h = 0; h < 2; h++) wr[rg][h] = w + (u64)min(row0 + 16 * rg + g + 8 * h, n - 1) * k + 8 * t;
    const T* xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) xr[j] = x + (u64)min(8 * j + g, m - 1) * k + 8 * t;
    float acc[RG][NT][4];
#pragma unroll
    for (int rg = 0; rg < RG; rg++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[rg][j][0] = acc[rg][j][1] = acc[rg][j][2] = acc[rg][j][3] = 0.f;
    grid_dep_wait();
    const u32 steps = (k + 31) / 32;
    for (u32 s0 = warp; s0 < steps; s0 += GEMV_WARPS * U) {
        uint4 wa[U][RG][2], xa[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const u32 kk = (s0 + GEMV_WARPS * u) * 32;
            const bool ok = s0 + GEMV_WARPS * u < steps && kk + 8 * t < k;
#pragma unroll
            for (int rg = 0; rg < RG; rg++)
#pragma unroll
                for (int h = 0; h < 2; h++) wa[u][rg][h] = ok ? ld_stream16(wr[rg][h] + kk) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < NT; j++)
                xa[u][j] = ok ? *reinterpret_cast<const uint4*>(xr[j] + kk) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int rg = 0; rg < RG; rg++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    // A: rows g, g + 8 at k (2t, 2t + 1) then (2t + 8, 2t + 9) of the MMA's
                    // order = elements (8t, 8t + 1), (8t + 2, 8t + 3), then (8t + 4 …) of the step.
                    const uint4 &lo = wa[u][rg][0], &hi = wa[u][rg][1];
                    const u32 a1[4] = {lo.x, hi.x, lo.y, hi.y}, a2[4] = {lo.z, hi.z, lo.w, hi.w};
                    Mma<T>::run(acc[rg][j], a1, xa[u][j].x, xa[u][j].y);
                    Mma<T>::run(acc[rg][j], a2, xa[u][j].z, xa[u][j].w);
                }
    }
    // acc[rg][j][c]: weight row 16·rg + g + 8·(c / 2), token 8·j + 2t + c % 2.
    // One 16-byte store per tile (four scalar stores 16 bytes apart would conflict 4-way).
#pragma unroll
    for (int rg = 0; rg < RG; rg++)
#pragma unroll
        for (int j = 0; j < NT; j++)
            *reinterpret_cast<float4*>(&red[warp][((rg * NT + j) * 32 + lane) * 4]) =
                make_float4(acc[rg][j][0], acc[rg][j][1], acc[rg][j][2], acc[rg][j][3]);
    __syncthreads();
    for (u32 o = tid; o < RG * NT * 32 * 4; o += GEMV_THREADS) {
        float s = 0.f;
#pragma unroll
        for (int wi = 0; wi < GEMV_WARPS; wi++) s += red[wi][o];
        const u32 c = o & 3, ln = (o >> 2) & 31, tile = o >> 7;
        const u32 rg = tile / NT, j = tile % NT;
        const u32 row = row0 + 16 * rg + (ln >> 2) + 8 * (c >> 1);
        const u32 tok = 8 * j + 2 * (ln & 3) + (c & 1);
        if (row < n && tok < m) {
            if (bias) s += to_f(bias[row]);
            y[(u64)tok * n + row] = from_f<T>(s);
        }
    }
}
// mma.sync with 16-bit inputs needs sm_80 (the host launches these only there).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define GEMV_TC(S, T, NT, RG)                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_tc_##S##_n##NT##_g##RG(  \
        const T* x, const T* w, const T* bias, T* y, u32 m, u32 n, u32 k, u32 w_const) {      \
        gemv_tc_impl<T, NT, RG>(x, w, bias, y, m, n, k);                                      \
    }
#define GEMV_TC_ALL(S, T) GEMV_TC(S, T, 1, 1) GEMV_TC(S, T, 1, 2) GEMV_TC(S, T, 2, 1) GEMV_TC(S, T, 2, 2)
#if defined(DAYONE_ONLY_BF16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_F16))
GEMV_TC_ALL(bf16, bf16)
#endif
#if defined(DAYONE_ONLY_F16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_BF16))
GEMV_TC_ALL(f16, f16)
#endif
#endif
