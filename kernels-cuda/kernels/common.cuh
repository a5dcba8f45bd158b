// dayone CUDA kernels: helpers shared by every kernel family.
// Prepended (as text) to each family's source before NVRTC compiles it; no system headers are used,
// so the sources compile with a bare NVRTC (no CUDA toolkit headers needed).

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

// Storage types. bf16 and f16 are kept as raw 16-bit patterns; all arithmetic is done in f32.
struct bf16 { u16 x; };
struct f16 { u16 x; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __uint_as_float(((u32)v.x) << 16); }
__device__ __forceinline__ float to_f(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}

template <typename T> __device__ __forceinline__ T from_f(float f);
template <> __device__ __forceinline__ float from_f<float>(float f) { return f; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float f) {
    // Round to nearest even; NaN stays a (quiet) NaN.
    u32 u = __float_as_uint(f);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = (u16)((u >> 16) | 0x40u);
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        r.x = (u16)(u >> 16);
    }
    return r;
}
template <> __device__ __forceinline__ f16 from_f<f16>(float f) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
    return r;
}

// Eight consecutive elements loaded with 16-byte accesses (two for f32).
// The address must be 16-byte aligned (32 for f32 is not required: two float4 loads).
template <typename T> struct Vec8;
template <> struct Vec8<float> {
    float4 a, b;
    __device__ __forceinline__ void load(const float* p) {
        a = *reinterpret_cast<const float4*>(p);
        b = *reinterpret_cast<const float4*>(p + 4);
    }
    __device__ __forceinline__ void zero() { a = make_float4(0.f, 0.f, 0.f, 0.f); b = a; }
    __device__ __forceinline__ void to_float(float* o) const {
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
        o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    }
    __device__ __forceinline__ void from_float(const float* o) {
        a = make_float4(o[0], o[1], o[2], o[3]);
        b = make_float4(o[4], o[5], o[6], o[7]);
    }
    __device__ __forceinline__ void store(float* p) const {
        *reinterpret_cast<float4*>(p) = a;
        *reinterpret_cast<float4*>(p + 4) = b;
    }
};

template <typename H> struct Vec8Half {
    uint4 r;
    __device__ __forceinline__ void load(const H* p) { r = *reinterpret_cast<const uint4*>(p); }
    __device__ __forceinline__ void zero() { r = make_uint4(0u, 0u, 0u, 0u); }
    __device__ __forceinline__ void to_float(float* o) const {
        const u32 w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            H lo, hi;
            lo.x = (u16)(w[i] & 0xffffu);
            hi.x = (u16)(w[i] >> 16);
            o[2 * i] = to_f(lo);
            o[2 * i + 1] = to_f(hi);
        }
    }
    __device__ __forceinline__ void from_float(const float* o) {
        u32 w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            H lo = from_f<H>(o[2 * i]);
            H hi = from_f<H>(o[2 * i + 1]);
            w[i] = (u32)lo.x | ((u32)hi.x << 16);
        }
        r = make_uint4(w[0], w[1], w[2], w[3]);
    }
    __device__ __forceinline__ void store(H* p) const { *reinterpret_cast<uint4*>(p) = r; }
};
template <> struct Vec8<bf16> : Vec8Half<bf16> {};
template <> struct Vec8<f16> : Vec8Half<f16> {};

// Programmatic dependent launch (sm_90+): the host may launch a kernel before the previous one
// in the stream has finished; every kernel calls this first, before touching global memory.
// The wait returns once the previous grid has completed and its writes are visible. Right after
// it each block signals `launch_dependents`: once every block of this grid has passed its wait,
// the next kernel's blocks may be scheduled into the SMs this grid's tail leaves idle, where they
// sit in their own wait — so a step's kernel boundaries cost no launch latency or ramp-up (a
// decode step has hundreds of short kernels). Safe for any kernel order: no kernel reads or
// writes global memory before its wait. A no-op on older architectures and for launches
// without the attribute.
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Asks L2 for `bytes` from p (a hint: nothing is loaded into registers, nothing can fault the
// kernel), thread `i` of `n` taking every n-th 128-byte line — for weights a kernel may fetch
// before griddepcontrol.wait.
__device__ __forceinline__ void l2_prefetch(const void* p, u32 bytes, u32 i, u32 n) {
    const char* c = static_cast<const char*>(p);
    for (u32 o = i * 128; o < bytes; o += n * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(c + o));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Instantiates `extern "C"` entry points NAME_f32, NAME_bf16 and NAME_f16 from a macro that
// takes (suffix, type). The host compiles one dtype per module (-DDAYONE_ONLY_BF16, ...) so
// that first use compiles only what runs; without a define every dtype is instantiated.
#if defined(DAYONE_ONLY_F32)
#define DAYONE_FOR_FLOAT_TYPES(M) M(f32, float)
#elif defined(DAYONE_ONLY_BF16)
#define DAYONE_FOR_FLOAT_TYPES(M) M(bf16, bf16)
#elif defined(DAYONE_ONLY_F16)
#define DAYONE_FOR_FLOAT_TYPES(M) M(f16, f16)
#else
#define DAYONE_FOR_FLOAT_TYPES(M) M(f32, float) M(bf16, bf16) M(f16, f16)
#endif

// Tensor-core helpers (sm_80+; only emitted where a kernel uses them).
__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
template <typename T> struct Mma;
template <> struct Mma<bf16> {
    static __device__ __forceinline__ void run(float* d, const u32* a, u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        return (u32)from_f<bf16>(lo).x | ((u32)from_f<bf16>(hi).x << 16);
    }
};
template <> struct Mma<f16> {
    static __device__ __forceinline__ void run(float* d, const u32* a, u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        return (u32)from_f<f16>(lo).x | ((u32)from_f<f16>(hi).x << 16);
    }
};

// 16-byte asynchronous global→shared copy; `src_bytes` < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
