// RMSNorm over the last dimension, f32 accumulation:
// y[r, :] = w ⊙ x[r, :] / sqrt(mean(x[r, :]²) + eps).  x, y [R, D], w [D], one dtype T.
// grid.x = R rows (grid-stride), block = 256 threads (a multiple of 32, at most 1024).

template <typename T>
__device__ void rms_norm_impl(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                              u32 rows, u32 d, float eps) {
    grid_dep_wait();
    __shared__ float red[32];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const bool vec = (d & 7) == 0;
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (u64)r * d;
        T* yr = y + (u64)r * d;
        float ss = 0.f;
        if (vec) {
            for (u32 j = tid * 8; j < d; j += blockDim.x * 8) {
                Vec8<T> v; v.load(xr + j);
                float f[8]; v.to_float(f);
#pragma unroll
                for (int i = 0; i < 8; i++) ss += f[i] * f[i];
            }
        } else {
            for (u32 j = tid; j < d; j += blockDim.x) { float f = to_f(xr[j]); ss += f * f; }
        }
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        if (warp == 0) {
            float t = lane < nwarps ? red[lane] : 0.f;
            t = warp_sum(t);
            if (lane == 0) red[0] = t;
        }
        __syncthreads();
        const float inv = rsqrtf(red[0] / (float)d + eps);
        __syncthreads();  // red[0] is rewritten by the next row
        if (vec) {
            for (u32 j = tid * 8; j < d; j += blockDim.x * 8) {
                Vec8<T> v, wv; v.load(xr + j); wv.load(w + j);
                float f[8], g[8]; v.to_float(f); wv.to_float(g);
#pragma unroll
                for (int i = 0; i < 8; i++) f[i] = f[i] * inv * g[i];
                Vec8<T> o; o.from_float(f); o.store(yr + j);
            }
        } else {
            for (u32 j = tid; j < d; j += blockDim.x) yr[j] = from_f<T>(to_f(xr[j]) * inv * to_f(w[j]));
        }
    }
}

#define RMS_NORM(S, T)                                                                      \
    extern "C" __global__ void rms_norm_##S(const T* x, const T* w, T* y, u32 rows, u32 d,   \
                                            float eps) {                                    \
        rms_norm_impl<T>(x, w, y, rows, d, eps);                                            \
    }
DAYONE_FOR_FLOAT_TYPES(RMS_NORM)
