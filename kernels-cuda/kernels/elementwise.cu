// Element-wise ops, f32 arithmetic, 8 elements per thread step when the length allows.
//   silu_mul: out = silu(gate) * up     (SwiGLU; silu(g) = g / (1 + exp(-g)))
//   silu_mul_limit: out = silu(min(gate, l)) * clamp(up, -l, l)   (glm5_next's swiglu_limit)
//   add:      out = a + b               (residual add)
//   gelu:     out = ½a(1 + erf(a/√2))   (nn.GELU(); second input unread)
//   gelu_tanh: out = ½a(1 + tanh(√(2/π)(a + 0.044715a³)))  (gelu_pytorch_tanh)
//   bias_add: y[m, :] += bias           (in place; y [M, N], bias [N])
//   stream_mix: out[t, m, :] = Σ_s w[t, s, m] · x[t, s, :]   (x [N, S, D], w [N, S, M] f32,
//             out [N, M, D]; hyper-connections' collapse / mixing / expansion)
// Grid-stride loops; any grid size works.

template <typename T, typename F>
__device__ __forceinline__ void binary_impl(const T* __restrict__ a, const T* __restrict__ b,
                                            T* __restrict__ out, u64 n, F f) {
    grid_dep_wait();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 n8 = n / 8;
    for (u64 i = tid; i < n8; i += stride) {
        Vec8<T> va, vb; va.load(a + i * 8); vb.load(b + i * 8);
        float fa[8], fb[8]; va.to_float(fa); vb.to_float(fb);
#pragma unroll
        for (int j = 0; j < 8; j++) fa[j] = f(fa[j], fb[j]);
        Vec8<T> o; o.from_float(fa); o.store(out + i * 8);
    }
    for (u64 i = n8 * 8 + tid; i < n; i += stride) out[i] = from_f<T>(f(to_f(a[i]), to_f(b[i])));
}

struct SiluMul {
    __device__ __forceinline__ float operator()(float g, float u) const {
        return g / (1.f + expf(-g)) * u;
    }
};
struct SiluMulLimit {
    float l;
    __device__ __forceinline__ float operator()(float g, float u) const {
        g = fminf(g, l);
        u = fminf(fmaxf(u, -l), l);
        return g / (1.f + expf(-g)) * u;
    }
};
struct Gelu {
    __device__ __forceinline__ float operator()(float x, float) const {
        return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    }
};
struct GeluTanh {
    __device__ __forceinline__ float operator()(float x, float) const {
        return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    }
};
struct Add {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

template <typename T>
__device__ void bias_add_impl(T* __restrict__ y, const T* __restrict__ bias, u32 m, u32 n) {
    grid_dep_wait();
    const u64 total = (u64)m * n;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        y[i] = from_f<T>(to_f(y[i]) + to_f(bias[i % n]));
    }
}

// One block per output row (t, m) (grid-stride over the N·M rows), its threads striding over d,
// so loads of x and stores of out are coalesced and no division runs per element; the S rows of
// x a token reads are shared by its M output rows through L1/L2.
template <typename T>
__device__ void stream_mix_impl(const T* __restrict__ x, const float* __restrict__ w,
                                T* __restrict__ out, u32 n, u32 s, u32 d, u32 m) {
    grid_dep_wait();
    const u64 rows = (u64)n * m;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u64 t = r / m, mm = r % m;
        const float* wr = w + t * s * m + mm;  // w[t, j, mm] = wr[j * m]
        const T* xr = x + t * s * d;           // x[t, j, :] = xr + j * d
        T* o = out + r * d;
        for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
            float acc = 0.f;
            for (u32 j = 0; j < s; j++) acc += wr[(u64)j * m] * to_f(xr[(u64)j * d + i]);
            o[i] = from_f<T>(acc);
        }
    }
}

#define ELEMENTWISE(S, T)                                                                   \
    extern "C" __global__ void silu_mul_##S(const T* g, const T* u, T* out, u64 n) {       \
        binary_impl<T>(g, u, out, n, SiluMul());                                            \
    }                                                                                       \
    extern "C" __global__ void silu_mul_limit_##S(const T* g, const T* u, T* out, u64 n,     \
                                                  float l) {                                \
        binary_impl<T>(g, u, out, n, SiluMulLimit{l});                                      \
    }                                                                                       \
    extern "C" __global__ void add_##S(const T* a, const T* b, T* out, u64 n) {            \
        binary_impl<T>(a, b, out, n, Add());                                                \
    }                                                                                       \
    extern "C" __global__ void gelu_##S(const T* a, const T* b, T* out, u64 n) {           \
        binary_impl<T>(a, b, out, n, Gelu());                                               \
    }                                                                                       \
    extern "C" __global__ void gelu_tanh_##S(const T* a, const T* b, T* out, u64 n) {      \
        binary_impl<T>(a, b, out, n, GeluTanh());                                           \
    }                                                                                       \
    extern "C" __global__ void bias_add_##S(T* y, const T* bias, u32 m, u32 n) {           \
        bias_add_impl<T>(y, bias, m, n);                                                    \
    }                                                                                       \
    extern "C" __global__ void stream_mix_##S(const T* x, const float* w, T* out, u32 n,    \
                                              u32 s, u32 d, u32 m) {                        \
        stream_mix_impl<T>(x, w, out, n, s, d, m);                                          \
    }
DAYONE_FOR_FLOAT_TYPES(ELEMENTWISE)
