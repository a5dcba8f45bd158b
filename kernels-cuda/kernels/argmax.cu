// Row argmax (first index on ties; NaNs are never chosen unless the row is all NaN, then 0).
// x [R, V] in T → out [R] u32. grid.x = R rows (grid-stride), block = 1024 threads.

template <typename T>
__device__ void argmax_impl(const T* __restrict__ x, u32* __restrict__ out, u32 rows, u32 v) {
    grid_dep_wait();
    __shared__ float sv[32];
    __shared__ u32 si[32];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (u64)r * v;
        float best = -__int_as_float(0x7f800000);  // -inf
        u32 bi = 0xffffffffu;
        // 16-byte loads of 8 elements where the row allows (a vocabulary row is one decode
        // step's last launch: scalar loads made it 125 dependent rounds at V = 128 256). Each
        // thread still scans its elements in increasing order, so it keeps its first maximum.
        const bool vec = (v & 7) == 0 && ((reinterpret_cast<u64>(xr) & 15) == 0);
        const u32 vend = vec ? v : 0;
        for (u32 j = tid * 8; j < vend; j += blockDim.x * 8) {
            Vec8<T> w;
            w.load(xr + j);
            float f[8];
            w.to_float(f);
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (f[e] > best || (bi == 0xffffffffu && f[e] == best)) { best = f[e]; bi = j + e; }
        }
        for (u32 j = vec ? v : tid; j < v; j += blockDim.x) {
            const float f = to_f(xr[j]);
            if (f > best || (bi == 0xffffffffu && f == best)) { best = f; bi = j; }
        }
        // Reduce (best, bi): larger value wins, equal values keep the smaller index.
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != 0xffffffffu && (bi == 0xffffffffu || ov > best || (ov == best && oi < bi))) {
                best = ov; bi = oi;
            }
        }
        if (lane == 0) { sv[warp] = best; si[warp] = bi; }
        __syncthreads();
        if (warp == 0) {
            best = lane < nwarps ? sv[lane] : 0.f;
            bi = lane < nwarps ? si[lane] : 0xffffffffu;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, best, o);
                const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (oi != 0xffffffffu && (bi == 0xffffffffu || ov > best || (ov == best && oi < bi))) {
                    best = ov; bi = oi;
                }
            }
            if (lane == 0) out[r] = bi == 0xffffffffu ? 0u : bi;
        }
        __syncthreads();
    }
}

#define ARGMAX(S, T)                                                                        \
    extern "C" __global__ void argmax_##S(const T* x, u32* out, u32 rows, u32 v) {         \
        argmax_impl<T>(x, out, rows, v);                                                    \
    }
DAYONE_FOR_FLOAT_TYPES(ARGMAX)

// Log-probability of one token per row: out[r] = x[r, t_r] - (m + log sum_j exp(x[r, j] - m)),
// m the row's maximum (f32 throughout). x [R, V] in T, targets [R] u32 (< V) → out [R] f32.
// grid.x = R rows (grid-stride), block = 1024 threads.
template <typename T>
__device__ void logprob_rows_impl(const T* __restrict__ x, const u32* __restrict__ targets,
                                  float* __restrict__ out, u32 rows, u32 v) {
    grid_dep_wait();
    __shared__ float red[32];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (u64)r * v;
        float m = -__int_as_float(0x7f800000);
        for (u32 j = tid; j < v; j += blockDim.x) m = fmaxf(m, to_f(xr[j]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) red[warp] = m;
        __syncthreads();
        m = red[0];
        for (u32 w = 1; w < nwarps; ++w) m = fmaxf(m, red[w]);
        __syncthreads();
        float s = 0.f;
        for (u32 j = tid; j < v; j += blockDim.x) s += __expf(to_f(xr[j]) - m);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) red[warp] = s;
        __syncthreads();
        if (tid == 0) {
            float total = 0.f;
            for (u32 w = 0; w < nwarps; ++w) total += red[w];
            const u32 t = targets[r] < v ? targets[r] : 0u;
            out[r] = to_f(xr[t]) - (m + logf(total));
        }
        __syncthreads();
    }
}

#define LOGPROB_ROWS(S, T)                                                                  \
    extern "C" __global__ void logprob_rows_##S(const T* x, const u32* targets, float* out, \
                                                u32 rows, u32 v) {                          \
        logprob_rows_impl<T>(x, targets, out, rows, v);                                     \
    }
DAYONE_FOR_FLOAT_TYPES(LOGPROB_ROWS)
