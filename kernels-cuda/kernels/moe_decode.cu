// An MoE block at decode sizes in two launches (Backend::moe_experts_shared; compiled into the
// `moe` family after moe.cu, whose moe_warp_dots it shares): the routed experts of the few
// (token, choice) pairs and the dense shared expert, without the sort, the combine, the shared
// expert's two GEMVs and the add that the general path launches.
//
// Slots: s < n·k is routed pair s (token s / k, expert ids[s]); s = n·k + t is token t's shared
// expert. Both kernels run one grid row per slot; a pair whose expert is ≥ E contributes nothing
// (as moe_sort drops it).
//   moe_dec_gu  h[s, o] = act(gate row o · x[t], up row o · x[t])   (h [slots, fmax]; one warp
//               per output o, the grouped GEMV's gate_up arithmetic: the same value per row)
//   moe_dec_dn  y2[s, d] = T(h[s] · down row d); the slot's block then counts itself done for its
//               token and column block (counters, left zeroed), and the last of the k + 1 merges:
//               y[t, d] = T(T(Σ_j w[t, j] · y2[t·k + j, d]) + y2[n·k + t, d])
//               — moe_combine's sum (f32, j in order) rounded, plus the shared expert rounded,
//               as the add of the separate ops.
// grid: gu (ceil(fmax / MOE_GEMV_WARPS), slots), dn (ceil(d / (MOE_GEMV_WARPS · DN_RPW)), slots);
// 256 threads (launch::moe_decode_grids).

// An element another block of this launch wrote, read through L2 (__ldcg; L1 is not coherent).
template <typename T> __device__ __forceinline__ float moe_ldcg_f(const T* p) {
    T r;
    r.x = __ldcg(reinterpret_cast<const unsigned short*>(p));
    return to_f(r);
}
template <> __device__ __forceinline__ float moe_ldcg_f<float>(const float* p) { return __ldcg(p); }

// The shared expert needs no routing: its slot's warps ask L2 for their weight rows
// (l2_prefetch) before griddepcontrol.wait, so those bytes stream in while the router finishes
// (the routed pairs' experts are known only after it).

// Variants (launch::MoeDecodeVariant, DAYONE_MOE_DEC): UG / UD weight chunks per row in flight
// per lane (0: moe_gemv_unroll's), RPW down rows per warp, each with its own launch bounds
// (LB: a minimum of resident blocks per SM is a register budget). The sums do not depend on them (moe_warp_dots), so every
// variant gives the same bits.
template <typename T, int UG = 0>
__device__ __forceinline__ void moe_dec_gu_impl(const T* __restrict__ x, const u32* __restrict__ ids,
                                                const T* __restrict__ gate_up,
                                                const T* __restrict__ gate_s,
                                                const T* __restrict__ up_s, T* __restrict__ h,
                                                u32 n, u32 k, u32 e, u32 d, u32 f, u32 fs,
                                                u32 fmax) {
    constexpr int U = UG > 0 ? UG : moe_gemv_unroll<T>(2, 1);
    const u32 s = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool shared = s >= n * k;
    const u32 o = blockIdx.x * MOE_GEMV_WARPS + warp, nout = shared ? fs : f;
    if (shared && o < fs) {
        l2_prefetch(gate_s + (u64)o * d, d * sizeof(T), lane, 32);
        l2_prefetch(up_s + (u64)o * d, d * sizeof(T), lane, 32);
    }
    grid_dep_wait();
    if (o >= nout) return;
    const u32 t = shared ? s - n * k : s / k;
    const T* wr[2];
    if (shared) {
        wr[0] = gate_s + (u64)o * d;
        wr[1] = up_s + (u64)o * d;
    } else {
        const u32 ex = ids[s];
        if (ex >= e) return;
        const T* we = gate_up + (u64)ex * 2 * f * d;
        wr[0] = we + (u64)moe_gu_row(o, false, f, 0) * d;
        wr[1] = we + (u64)moe_gu_row(o, true, f, 0) * d;
    }
    const T* xr[1] = {x + (u64)t * d};
    float acc[2][1];
    moe_warp_dots<T, 2, 1, U>(wr, xr, d, lane, acc);
    if (lane == 0) h[(u64)s * fmax + o] = from_f<T>(moe_act_f(acc[0][0], acc[1][0], 0.f, 0, 0.f));
}

template <typename T, int RPW, int UD = 0>
__device__ __forceinline__ void moe_dec_dn_impl(const T* __restrict__ h, const u32* __restrict__ ids,
                                                const float* __restrict__ weights,
                                                const T* __restrict__ down,
                                                const T* __restrict__ down_s, T* __restrict__ y2,
                                                T* __restrict__ y, u32* __restrict__ counters,
                                                u32 n, u32 k, u32 e, u32 d, u32 f, u32 fs,
                                                u32 fmax) {
    constexpr int U = UD > 0 ? UD : moe_gemv_unroll<T>(RPW, 1);
    const u32 s = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool shared = s >= n * k;
    {
        const u32 p0 = (blockIdx.x * MOE_GEMV_WARPS + warp) * RPW;
        if (shared && p0 < d)
            l2_prefetch(down_s + (u64)p0 * fs, min((u32)RPW, d - p0) * fs * sizeof(T), lane, 32);
    }
    grid_dep_wait();
    const u32 t = shared ? s - n * k : s / k;
    const u32 ex = shared ? 0 : ids[s];
    const u32 o0 = (blockIdx.x * MOE_GEMV_WARPS + warp) * RPW;
    if (o0 < d && (shared || ex < e)) {
        const u32 kd = shared ? fs : f;
        const T* base = shared ? down_s : down + (u64)ex * d * f;
        const T* wr[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) wr[r] = base + (u64)min(o0 + r, d - 1) * kd;
        const T* xr[1] = {h + (u64)s * fmax};
        float acc[RPW][1];
        moe_warp_dots<T, RPW, 1, U>(wr, xr, kd, lane, acc);
#pragma unroll
        for (int r = 0; r < RPW; r++)
            if (lane == (u32)r && o0 + r < d) y2[(u64)s * d + o0 + r] = from_f<T>(acc[r][0]);
    }
    // Publish this slot's columns, count it; the token's last slot of this column block merges.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    u32* counter = counters + (u64)t * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == k;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const u32 cols = MOE_GEMV_WARPS * RPW;
    for (u32 c = blockIdx.x * cols + threadIdx.x; c < min(d, (blockIdx.x + 1) * cols); c += blockDim.x) {
        float acc = 0.f;
        for (u32 j = 0; j < k; j++) {
            const u64 p = (u64)t * k + j;
            if (ids[p] >= e) continue;
            acc = fmaf(weights[p], moe_ldcg_f(y2 + p * d + c), acc);
        }
        const float routed = to_f(from_f<T>(acc));
        y[(u64)t * d + c] = from_f<T>(routed + moe_ldcg_f(y2 + ((u64)n * k + t) * d + c));
    }
    if (threadIdx.x == 0) *counter = 0;
}

#define MOE_DEC_GU(S, T, V, UG, LB)                                                           \
    extern "C" __global__ void __launch_bounds__ LB                                           \
        moe_dec_gu##V##_##S(const T* x, const u32* ids, const T* gate_up, const T* gate_s,    \
                            const T* up_s, T* h, u32 n, u32 k, u32 e, u32 d, u32 f, u32 fs,   \
                            u32 fmax) {                                                       \
        moe_dec_gu_impl<T, UG>(x, ids, gate_up, gate_s, up_s, h, n, k, e, d, f, fs, fmax);    \
    }
#define MOE_DEC_DN(S, T, V, RPW, UD, LB)                                                      \
    extern "C" __global__ void __launch_bounds__ LB                                           \
        moe_dec_dn##V##_##S(const T* h, const u32* ids, const float* weights, const T* down,  \
                            const T* down_s, T* y2, T* y, u32* counters, u32 n, u32 k, u32 e, \
                            u32 d, u32 f, u32 fs, u32 fmax) {                                 \
        moe_dec_dn_impl<T, RPW, UD>(h, ids, weights, down, down_s, y2, y, counters, n, k, e,  \
                                    d, f, fs, fmax);                                          \
    }
// Names: moe_dec_gu{,_b3,_u3b4}_S, moe_dec_dn{,_b3,_r2b4,_r1b4}_S (launch::MoeDecodeVariant).
#define MOE_DECODE(S, T)                                                                      \
    MOE_DEC_GU(S, T, , 0, (256)) MOE_DEC_GU(S, T, _b3, 0, (256, 3))                           \
    MOE_DEC_GU(S, T, _u3b4, 3, (256, 4))                                                      \
    MOE_DEC_DN(S, T, , MOE_GEMV_DN_RPW, 0, (256))                                             \
    MOE_DEC_DN(S, T, _b3, MOE_GEMV_DN_RPW, 0, (256, 3))                                       \
    MOE_DEC_DN(S, T, _r2b4, 2, 4, (256, 4)) MOE_DEC_DN(S, T, _r1b4, 1, 4, (256, 4))
DAYONE_FOR_FLOAT_TYPES(MOE_DECODE)
