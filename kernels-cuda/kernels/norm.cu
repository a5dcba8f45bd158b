// RMSNorm over the last dimension, f32 accumulation:
// y[r, :] = w ⊙ x[r, :] / sqrt(mean(x[r, :]²) + eps).  x, y [R, D], w [D], one dtype T.
// grid.x = R rows (grid-stride), block = 256 threads (a multiple of 32, at most 1024).
//
// ADD (add_rms_norm, the residual add before a pre-norm sublayer): x = a + r is first rounded to
// T and stored to `sum` ([R, D]), exactly as the `add` kernel computes it, and the norm reads
// those stored values (each thread its own elements), so both outputs are bit-equal to `add`
// then `rms_norm` — one launch and one read of the sum fewer.

template <typename T, bool ADD = false>
__device__ void rms_norm_impl(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                              u32 rows, u32 d, float eps, const T* __restrict__ radd = nullptr,
                              T* __restrict__ sum = nullptr) {
    grid_dep_wait();
    __shared__ float red[32];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const bool vec = (d & 7) == 0;
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = (ADD ? sum : x) + (u64)r * d;
        T* yr = y + (u64)r * d;
        float ss = 0.f;
        if (vec) {
            for (u32 j = tid * 8; j < d; j += blockDim.x * 8) {
                Vec8<T> v;
                if (ADD) {
                    Vec8<T> va, vb;
                    va.load(x + (u64)r * d + j);
                    vb.load(radd + (u64)r * d + j);
                    float fa[8], fb[8];
                    va.to_float(fa);
                    vb.to_float(fb);
#pragma unroll
                    for (int i = 0; i < 8; i++) fa[i] = fa[i] + fb[i];
                    v.from_float(fa);
                    v.store(sum + (u64)r * d + j);
                } else {
                    v.load(xr + j);
                }
                float f[8]; v.to_float(f);
#pragma unroll
                for (int i = 0; i < 8; i++) ss += f[i] * f[i];
            }
        } else {
            for (u32 j = tid; j < d; j += blockDim.x) {
                float f;
                if (ADD) {
                    const T t = from_f<T>(to_f(x[(u64)r * d + j]) + to_f(radd[(u64)r * d + j]));
                    sum[(u64)r * d + j] = t;
                    f = to_f(t);
                } else {
                    f = to_f(xr[j]);
                }
                ss += f * f;
            }
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
    }                                                                                       \
    extern "C" __global__ void add_rms_norm_##S(const T* a, const T* b, const T* w, T* sum,  \
                                                T* y, u32 rows, u32 d, float eps) {         \
        rms_norm_impl<T, true>(a, w, y, rows, d, eps, b, sum);                              \
    }
DAYONE_FOR_FLOAT_TYPES(RMS_NORM)
