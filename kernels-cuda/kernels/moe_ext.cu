// Routed experts with the gpt-oss extras (dayone_backend::ExpertOptions): projection biases and
// the interleaved clamped GLU. Two plain warp-per-output kernels, f32 accumulation:
//   moe_ext_act:  h[t, j, i] = act(gate_up[e] . x[t] + b_gu[e])   (one warp per (t, j, i))
//   moe_ext_down: y[t, o] = sum_j w[t, j] (down[e, o] . h[t, j] + b_d[e, o])   (one warp per (t, o))
// act 0: silu(g) * u with rows [gate; up]; act 1: gpt-oss, rows 2i gate / 2i + 1 up,
// g = min(g, limit), u = clamp(u, -limit, limit), (u + 1) * g * sigmoid(alpha g); act 2: rows
// [gate; up], silu(min(g, limit)) * clamp(u, -limit, limit) (glm5_next's swiglu_limit).

template <typename T>
__device__ void moe_ext_act_impl(const T* x, const u32* ids, const T* gate_up, const T* bias,
                                 float* hmid, u32 n, u32 k, u32 e, u32 d, u32 f, u32 act,
                                 float alpha, float limit) {
    grid_dep_wait();
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31;
    if (warp >= (u64)n * k * f) return;
    const u64 tj = warp / f;
    const u32 i = (u32)(warp - tj * f);
    const u64 t = tj / k;
    const u32 ex = ids[tj];
    if (ex >= e) {
        if (lane == 0) hmid[warp] = 0.f;
        return;
    }
    const u64 gr = (u64)ex * 2 * f + (act == 1 ? 2 * i : i);
    const u64 ur = act == 1 ? gr + 1 : gr + f;
    const T* xr = x + t * d;
    const T* gw = gate_up + gr * d;
    const T* uw = gate_up + ur * d;
    float g = 0.f, u = 0.f;
    for (u32 c = lane; c < d; c += 32) {
        const float xv = to_f(xr[c]);
        g = fmaf(xv, to_f(gw[c]), g);
        u = fmaf(xv, to_f(uw[c]), u);
    }
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane != 0) return;
    if (bias) {
        g += to_f(bias[gr]);
        u += to_f(bias[ur]);
    }
    float v;
    if (act == 1) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        v = (u + 1.f) * g / (1.f + expf(-alpha * g));
    } else {
        if (act == 2) {
            g = fminf(g, limit);
            u = fminf(fmaxf(u, -limit), limit);
        }
        v = g / (1.f + expf(-g)) * u;
    }
    hmid[warp] = v;
}

template <typename T>
__device__ void moe_ext_down_impl(const float* hmid, const u32* ids, const float* weights,
                                  const T* down, const T* bias, T* y, u32 n, u32 k, u32 e, u32 d,
                                  u32 f) {
    grid_dep_wait();
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31;
    if (warp >= (u64)n * d) return;
    const u64 t = warp / d;
    const u32 o = (u32)(warp - t * d);
    float acc = 0.f;
    for (u32 j = 0; j < k; j++) {
        const u32 ex = ids[t * k + j];
        if (ex >= e) continue;
        const float* hr = hmid + (t * k + j) * f;
        const T* wr = down + ((u64)ex * d + o) * f;
        float dot = 0.f;
        for (u32 i = lane; i < f; i += 32) dot = fmaf(hr[i], to_f(wr[i]), dot);
        dot = warp_sum(dot);
        if (bias) dot += to_f(bias[(u64)ex * d + o]);
        acc = fmaf(weights[t * k + j], dot, acc);
    }
    if (lane == 0) y[warp] = from_f<T>(acc);
}

#define MOE_EXT(S, T)                                                                         \
    extern "C" __global__ void moe_ext_act_##S(const T* x, const u32* ids, const T* gate_up,  \
                                               const T* bias, float* hmid, u32 n, u32 k,      \
                                               u32 e, u32 d, u32 f, u32 act, float alpha,     \
                                               float limit) {                                 \
        moe_ext_act_impl<T>(x, ids, gate_up, bias, hmid, n, k, e, d, f, act, alpha, limit);   \
    }                                                                                         \
    extern "C" __global__ void moe_ext_down_##S(const float* hmid, const u32* ids,            \
                                                const float* weights, const T* down,          \
                                                const T* bias, T* y, u32 n, u32 k, u32 e,     \
                                                u32 d, u32 f) {                               \
        moe_ext_down_impl<T>(hmid, ids, weights, down, bias, y, n, k, e, d, f);               \
    }
DAYONE_FOR_FLOAT_TYPES(MOE_EXT)
