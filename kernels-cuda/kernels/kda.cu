// Kimi-Linear KDA layer ops (Kimi Linear report §2; HF `KimiDeltaAttention`, fla `chunk_kda` /
// `naive_recurrent_kda`; dayone docs/architectures.md §1.2): short causal convolution + SiLU,
// sigmoid-gated RMSNorm, and Kimi Delta Attention in two forms:
//   token-recurrent  kda_recurrent_*: grid (ceil(V/32), H, sequences), 128 threads; each block
//                    owns 32 value columns of one head and keeps that [K, 32] slice of the f32
//                    state in registers (4 warps × K/4 rows); one token after the other.
//   chunked (64)     kda_chunk_prep_*: grid (chunks, H), 256 threads, everything that depends on
//                    one chunk only (Γ = cumsum g, A_kk, A_qk with pairwise exp(Γ_i − Γ_j) for
//                    j ≤ i, W = T(K ⊙ e^Γ) and U = T V by forward substitution, Q ⊙ e^Γ,
//                    K ⊙ e^(Γ_last − Γ), e^Γ_last) → an f32 record per (chunk, head);
//                    kda_chunk_scan_*: grid (ceil(V/32), H, sequences), 256 threads, the
//                    sequential pass over a sequence's chunks with the [K, 32] state slice in
//                    shared memory: V_new = U − W S, O = (Q ⊙ e^Γ) S + A_qk V_new,
//                    S ← diag(e^Γ_last) S + (K ⊙ e^(Γ_last − Γ))ᵀ V_new.
// All gate, norm and state math is f32; inputs/outputs are the activation dtype T.

#define KDA_CHUNK 64

// g = −exp(A_log)·softplus(a + dt_bias) (softplus(x) = x for x > 20), or with a lower bound
// lb·σ(exp(A_log)·(a + dt_bias)); `rate` = exp(A_log[h]).
__device__ __forceinline__ float kda_gate(float a, float dtb, float rate, float lb, u32 use_lb) {
    const float x = a + dtb;
    if (use_lb) return lb / (1.f + expf(-(rate * x)));
    const float sp = x > 20.f ? x : log1pf(expf(x));
    return -rate * sp;
}

// ---------------------------------------------------------------------------------------------
// short_conv: y[t, c] = silu(Σ_j w[c, j] · u[t − (W−1) + j, c]) over the sequence's stream u
// (state history, zero when the sequence starts at position 0, then this step's rows).
// x, y [N, C] T; w [C, W] f32; state [slots, C, W−1] f32. Grid-stride over N·C outputs; the
// state is only read here (short_conv_state_* rewrites it afterwards, in a second launch).
template <typename T>
__device__ void short_conv_impl(const T* __restrict__ x, const float* __restrict__ w,
                                const float* __restrict__ state, T* __restrict__ y,
                                const u32* __restrict__ token_seq, const u32* __restrict__ qstart,
                                const u32* __restrict__ positions, const u32* __restrict__ slots,
                                u32 n, u32 c, u32 width) {
    grid_dep_wait();
    const u32 h = width - 1;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)n * c;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 t = (u32)(i / c), ch = (u32)(i % c);
        const u32 s = token_seq[t];
        const u32 start = qstart[s];
        const bool fresh = positions[start] == 0;
        const u32 rel = t - start;  // index of this row in the sequence's step rows
        float acc = 0.f;
        for (u32 j = 0; j < width; j++) {
            // stream index rel + j − h; negative → history entry h + (rel + j − h)
            const int si = (int)rel + (int)j - (int)h;
            float u;
            if (si >= 0) {
                u = to_f(x[(u64)(start + si) * c + ch]);
            } else if (fresh) {
                u = 0.f;
            } else {
                u = state[((u64)slots[s] * c + ch) * h + (u32)(si + (int)h)];
            }
            acc += w[(u64)ch * width + j] * u;
        }
        y[i] = from_f<T>(acc / (1.f + expf(-acc)));
    }
}

// state[slot(s), c, :] = the last W−1 entries of the stream of sequence s (one thread per
// (sequence, channel)); reads its own old entries before writing them.
template <typename T>
__device__ void short_conv_state_impl(const T* __restrict__ x, float* __restrict__ state,
                                      const u32* __restrict__ qstart,
                                      const u32* __restrict__ positions,
                                      const u32* __restrict__ slots, u32 nseq, u32 c, u32 width) {
    grid_dep_wait();
    const u32 h = width - 1;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)nseq * c;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 s = (u32)(i / c), ch = (u32)(i % c);
        const u32 start = qstart[s], len = qstart[s + 1] - start;
        const bool fresh = len == 0 || positions[start] == 0;
        float* st = state + ((u64)slots[s] * c + ch) * h;
        float old[8];
        for (u32 j = 0; j < h && j < 8; j++) old[j] = fresh ? 0.f : st[j];
        float nw[8];
        for (u32 j = 0; j < h && j < 8; j++) {
            // stream = old[0..h] ++ rows; new entry j = stream[h + len − h + j] = stream[len + j]
            const u32 si = len + j;
            nw[j] = si < h ? old[si] : to_f(x[(u64)(start + si - h) * c + ch]);
        }
        for (u32 j = 0; j < h && j < 8; j++) st[j] = nw[j];
    }
}

// One (sequence, channel) element of a decode step's convolution and history update.
template <typename T>
__device__ __forceinline__ void short_conv_decode_elem(const T* __restrict__ x,
                                                       const float* __restrict__ w,
                                                       float* __restrict__ state,
                                                       T* __restrict__ y,
                                                       const u32* __restrict__ qstart,
                                                       const u32* __restrict__ positions,
                                                       const u32* __restrict__ slots, u32 c,
                                                       u32 width, u64 i) {
    const u32 h = width - 1;
    const u32 s = (u32)(i / c), ch = (u32)(i % c);
    const u32 start = qstart[s];
    const bool fresh = positions[start] == 0;
    float* st = state + ((u64)slots[s] * c + ch) * h;
    float old[8];
    for (u32 j = 0; j < h && j < 8; j++) old[j] = fresh ? 0.f : st[j];
    const float xv = to_f(x[(u64)start * c + ch]);
    float acc = 0.f;
    for (u32 j = 0; j < width; j++) acc += w[(u64)ch * width + j] * (j < h ? old[j] : xv);
    y[(u64)start * c + ch] = from_f<T>(acc / (1.f + expf(-acc)));
    for (u32 j = 0; j < h && j < 8; j++) st[j] = j + 1 < h ? old[j + 1] : xv;
}

// Decode steps (every sequence has exactly one row: token qstart[s]): short_conv and
// short_conv_state in one launch, one thread per (sequence, channel), with the same arithmetic
// in the same order as the two kernels (bit-equal): y from the history and the new row, then
// the history shifted by one.
template <typename T>
__device__ void short_conv_decode_impl(const T* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ state, T* __restrict__ y,
                                       const u32* __restrict__ qstart,
                                       const u32* __restrict__ positions,
                                       const u32* __restrict__ slots, u32 nseq, u32 c,
                                       u32 width) {
    grid_dep_wait();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)nseq * c;
         i += (u64)gridDim.x * blockDim.x)
        short_conv_decode_elem<T>(x, w, state, y, qstart, positions, slots, c, width, i);
}

// Three convolutions of one decode step (KDA's q, k, v: Backend::short_conv_many) in one launch:
// part p owns elements [nseq·(c0 + … + c_{p−1}), nseq·(c0 + … + c_p)), each as above.
struct ConvPart {
    const void* x;
    const float* w;
    float* state;
    void* y;
    u32 c;
};
template <typename T>
__device__ void short_conv_decode3_impl(const ConvPart& p0, const ConvPart& p1, const ConvPart& p2,
                                        const u32* __restrict__ qstart,
                                        const u32* __restrict__ positions,
                                        const u32* __restrict__ slots, u32 nseq, u32 width) {
    grid_dep_wait();
    const u64 e0 = (u64)nseq * p0.c, e1 = e0 + (u64)nseq * p1.c, e2 = e1 + (u64)nseq * p2.c;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < e2;
         i += (u64)gridDim.x * blockDim.x) {
        // Field-wise selects keep the parameters out of local memory.
        const bool a = i < e0, b = i < e1;
        const T* x = (const T*)(a ? p0.x : b ? p1.x : p2.x);
        const float* w = a ? p0.w : b ? p1.w : p2.w;
        float* st = a ? p0.state : b ? p1.state : p2.state;
        T* y = (T*)(a ? p0.y : b ? p1.y : p2.y);
        const u32 c = a ? p0.c : b ? p1.c : p2.c;
        short_conv_decode_elem<T>(x, w, st, y, qstart, positions, slots, c, width,
                                  i - (a ? 0 : b ? e0 : e1));
    }
}

#define SHORT_CONV(S, T)                                                                        \
    extern "C" __global__ void short_conv_decode3_##S(ConvPart p0, ConvPart p1, ConvPart p2,    \
                                                      const u32* qstart, const u32* positions,  \
                                                      const u32* slots, u32 nseq, u32 width) {  \
        short_conv_decode3_impl<T>(p0, p1, p2, qstart, positions, slots, nseq, width);          \
    }                                                                                           \
    extern "C" __global__ void short_conv_decode_##S(const T* x, const float* w, float* state,  \
                                                     T* y, const u32* qstart,                   \
                                                     const u32* positions, const u32* slots,    \
                                                     u32 nseq, u32 c, u32 width) {              \
        short_conv_decode_impl<T>(x, w, state, y, qstart, positions, slots, nseq, c, width);    \
    }                                                                                           \
    extern "C" __global__ void short_conv_##S(const T* x, const float* w, const float* state,   \
                                              T* y, const u32* token_seq, const u32* qstart,    \
                                              const u32* positions, const u32* slots, u32 n,    \
                                              u32 c, u32 width) {                               \
        short_conv_impl<T>(x, w, state, y, token_seq, qstart, positions, slots, n, c, width);   \
    }                                                                                           \
    extern "C" __global__ void short_conv_state_##S(const T* x, float* state, const u32* qstart, \
                                                    const u32* positions, const u32* slots,     \
                                                    u32 nseq, u32 c, u32 width) {               \
        short_conv_state_impl<T>(x, state, qstart, positions, slots, nseq, c, width);           \
    }
DAYONE_FOR_FLOAT_TYPES(SHORT_CONV)

// ---------------------------------------------------------------------------------------------
// gated_rms_norm: y = w ⊙ x / sqrt(mean(x²) + eps) ⊙ σ(gate), f32 math. x, gate, y [R, D] T;
// w [D] in T (w_f32 = 0) or f32 (w_f32 = 1). One block per row (grid-stride), 256 threads.
template <typename T>
__device__ void gated_rms_norm_impl(const T* __restrict__ x, const T* __restrict__ gate,
                                    const void* __restrict__ wp, u32 w_f32, T* __restrict__ y,
                                    u32 rows, u32 d, float eps) {
    grid_dep_wait();
    __shared__ float red[32];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (u64)r * d;
        const T* gr = gate + (u64)r * d;
        T* yr = y + (u64)r * d;
        float ss = 0.f;
        for (u32 j = tid; j < d; j += blockDim.x) {
            const float f = to_f(xr[j]);
            ss += f * f;
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
        __syncthreads();
        for (u32 j = tid; j < d; j += blockDim.x) {
            const float wv = w_f32 ? reinterpret_cast<const float*>(wp)[j]
                                   : to_f(reinterpret_cast<const T*>(wp)[j]);
            const float g = to_f(gr[j]);
            yr[j] = from_f<T>(to_f(xr[j]) * inv * wv / (1.f + expf(-g)));
        }
    }
}

#define GATED_RMS_NORM(S, T)                                                                   \
    extern "C" __global__ void gated_rms_norm_##S(const T* x, const T* gate, const void* w,    \
                                                  u32 w_f32, T* y, u32 rows, u32 d,            \
                                                  float eps) {                                 \
        gated_rms_norm_impl<T>(x, gate, w, w_f32, y, rows, d, eps);                            \
    }
DAYONE_FOR_FLOAT_TYPES(GATED_RMS_NORM)

// One token of the recurrent update on a thread's state slice S (value column `lane` of its
// 128-thread group, rows d = w + 4i): the decay, the group's cross-warp sums Sᵀk, Sᵀq, k·q
// through `red` [3][4][32] (one __syncthreads: every thread of the block calls it), then
// δ = β(v − Sᵀk) and S += k δ; returns o = Sᵀq + δ (k·q). q, k, e^g of the head in qs, ks, gs.
template <int KPT>
__device__ __forceinline__ float kda_token_update(float (&S)[KPT], const float* qs, const float* ks,
                                                  const float* gs, float (*red)[4][32], u32 w,
                                                  u32 lane, u32 K, float iq, float ik, float beta,
                                                  float ve) {
    float p1 = 0.f, p2 = 0.f, pk = 0.f;
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        const u32 d = w + 4 * i;
        if (d < K) {
            const float kd = ks[d] * ik, qd = qs[d] * iq;
            S[i] *= gs[d];
            p1 += S[i] * kd;
            p2 += S[i] * qd;
            pk += kd * qd;
        }
    }
    red[0][w][lane] = p1;
    red[1][w][lane] = p2;
    red[2][w][lane] = pk;
    __syncthreads();
    const float kv = red[0][0][lane] + red[0][1][lane] + red[0][2][lane] + red[0][3][lane];
    const float qo = red[1][0][lane] + red[1][1][lane] + red[1][2][lane] + red[1][3][lane];
    const float kq = red[2][0][lane] + red[2][1][lane] + red[2][2][lane] + red[2][3][lane];
    const float delta = (ve - kv) * beta;
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        const u32 d = w + 4 * i;
        if (d < K) S[i] += ks[d] * ik * delta;
    }
    return qo + delta * kq;
}

// ---------------------------------------------------------------------------------------------
// Token-recurrent KDA. desc[4·i..] = (first row, token count, state slot, fresh) of sequence i
// (blockIdx.z); with desc null they come from the step's metadata on the device instead
// (query_start, state_slots, positions: fresh = no tokens or first position 0), so a step of
// recurrent sequences only uploads nothing and can be replayed as a graph. q, k, a [N, H, K], v, o [N, H, V], b [N, H] T; a_log [H], dt_bias [H, K],
// state [slots, H, K, V] f32. Thread (warp w, lane) owns column e = 32·blockIdx.x + lane and
// rows d = w + 4i (i < KPT, K ≤ 4·KPT ≤ 256). Per token one cross-warp reduction gives
// Sᵀk, Sᵀq (after the decay) and k·q; then δ = β(v − Sᵀk), S += k δ, o = Sᵀq + δ (k·q).
template <typename T, int KPT>
__device__ void kda_recurrent_impl(const T* __restrict__ q, const T* __restrict__ k,
                                   const T* __restrict__ v, const T* __restrict__ a,
                                   const T* __restrict__ b, const float* __restrict__ a_log,
                                   const float* __restrict__ dt_bias, float* __restrict__ state,
                                   T* __restrict__ o, const u32* __restrict__ desc, u32 H, u32 K,
                                   u32 V, float lb, u32 use_lb, float scale,
                                   const u32* __restrict__ query_start,
                                   const u32* __restrict__ positions,
                                   const u32* __restrict__ state_slots) {
    grid_dep_wait();
    __shared__ float qs[4 * KPT], ks[4 * KPT], gs[4 * KPT];
    __shared__ float red[3][4][32];
    __shared__ float nrm[2][4];
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const u32 h = blockIdx.y, e = blockIdx.x * 32 + lane;
    u32 row0, len, slot, fresh;
    if (desc) {
        const u32* dsc = desc + 4 * blockIdx.z;
        row0 = dsc[0], len = dsc[1], slot = dsc[2], fresh = dsc[3];
    } else {
        row0 = query_start[blockIdx.z];
        len = query_start[blockIdx.z + 1] - row0;
        slot = state_slots[blockIdx.z];
        fresh = (len == 0 || positions[row0] == 0) ? 1u : 0u;
    }
    float* st = state + ((u64)slot * H + h) * K * V;
    float S[KPT];
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        const u32 d = w + 4 * i;
        S[i] = (!fresh && d < K && e < V) ? st[(u64)d * V + e] : 0.f;
    }
    const float rate = expf(a_log[h]);
    for (u32 t = 0; t < len; t++) {
        const u64 row = row0 + t;
        const u64 base = (row * H + h) * K;
        // β and this column's v are loaded with q, k and a, not after the barrier: one memory
        // round trip per token fewer.
        const float braw = to_f(b[row * H + h]);
        const float ve = e < V ? to_f(v[(row * H + h) * V + e]) : 0.f;
        float sq = 0.f, sk = 0.f;
        for (u32 d = tid; d < K; d += blockDim.x) {
            const float qf = to_f(q[base + d]), kf = to_f(k[base + d]);
            qs[d] = qf;
            ks[d] = kf;
            sq += qf * qf;
            sk += kf * kf;
            gs[d] = expf(kda_gate(to_f(a[base + d]), dt_bias[(u64)h * K + d], rate, lb, use_lb));
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        if (lane == 0) {
            nrm[0][w] = sq;
            nrm[1][w] = sk;
        }
        __syncthreads();
        const float iq = scale / sqrtf(nrm[0][0] + nrm[0][1] + nrm[0][2] + nrm[0][3] + 1e-6f);
        const float ik = 1.f / sqrtf(nrm[1][0] + nrm[1][1] + nrm[1][2] + nrm[1][3] + 1e-6f);
        const float beta = 1.f / (1.f + expf(-braw));
        const float ov = kda_token_update<KPT>(S, qs, ks, gs, red, w, lane, K, iq, ik, beta, ve);
        if (w == 0 && e < V) o[(row * H + h) * V + e] = from_f<T>(ov);
        __syncthreads();  // qs/ks/gs/red are rewritten by the next token
    }
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        const u32 d = w + 4 * i;
        if (d < K && e < V) st[(u64)d * V + e] = S[i];
    }
}

// ---------------------------------------------------------------------------------------------
// Chunked KDA, part 1 (per chunk and head). cdesc[2·c..] = (first row, token count ≤ 64).
// Record (f32) per (chunk c, head h) at rec + (c·H + h)·R, R = 64(3K + V + 64) + K:
//   W [64, K] | U [64, V] | Qg = q̂ ⊙ e^Γ [64, K] | Kd = k̂ ⊙ e^(Γ_last − Γ) [64, K] |
//   Aqk [64, 64] (j ≤ i, else 0) | gl = e^Γ_last [K].
// Rows past the chunk's tokens are padding (g = 0, β = 0, q = k = v = 0).
// Shared memory (floats): Qs, Ks, Gs [64, SP] (SP = max(K, V) + 1), Lm, Aq [64, 65], beta [64].
template <typename T>
__device__ void kda_chunk_prep_impl(const T* __restrict__ q, const T* __restrict__ k,
                                    const T* __restrict__ v, const T* __restrict__ a,
                                    const T* __restrict__ b, const float* __restrict__ a_log,
                                    const float* __restrict__ dt_bias, float* __restrict__ rec,
                                    const u32* __restrict__ cdesc, u32 H, u32 K, u32 V, float lb,
                                    u32 use_lb, float scale) {
    grid_dep_wait();
    extern __shared__ float sm[];
    const u32 SP = (K > V ? K : V) + 1;
    float* Qs = sm;
    float* Ks = Qs + KDA_CHUNK * SP;
    float* Gs = Ks + KDA_CHUNK * SP;
    float* Lm = Gs + KDA_CHUNK * SP;
    float* Aq = Lm + KDA_CHUNK * 65;
    float* bt = Aq + KDA_CHUNK * 65;
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
    const u32 c = blockIdx.x, h = blockIdx.y;
    const u32 row0 = cdesc[2 * c], len = cdesc[2 * c + 1];
    const float rate = expf(a_log[h]);
    // 1. normalised q (with the K^−½ scale), k, the gate, β
    for (u32 t = w; t < KDA_CHUNK; t += nw) {
        if (t < len) {
            const u64 base = ((u64)(row0 + t) * H + h) * K;
            float sq = 0.f, sk = 0.f;
            for (u32 d = lane; d < K; d += 32) {
                const float qf = to_f(q[base + d]), kf = to_f(k[base + d]);
                Qs[t * SP + d] = qf;
                Ks[t * SP + d] = kf;
                sq += qf * qf;
                sk += kf * kf;
                Gs[t * SP + d] =
                    kda_gate(to_f(a[base + d]), dt_bias[(u64)h * K + d], rate, lb, use_lb);
            }
            sq = warp_sum(sq);
            sk = warp_sum(sk);
            const float iq = scale / sqrtf(sq + 1e-6f), ik = 1.f / sqrtf(sk + 1e-6f);
            for (u32 d = lane; d < K; d += 32) {
                Qs[t * SP + d] *= iq;
                Ks[t * SP + d] *= ik;
            }
            if (lane == 0) bt[t] = 1.f / (1.f + expf(-to_f(b[(u64)(row0 + t) * H + h])));
        } else {
            for (u32 d = lane; d < K; d += 32) {
                Qs[t * SP + d] = 0.f;
                Ks[t * SP + d] = 0.f;
                Gs[t * SP + d] = 0.f;
            }
            if (lane == 0) bt[t] = 0.f;
        }
    }
    __syncthreads();
    // 2. Γ = cumulative sum of g over the chunk's rows (f32)
    for (u32 d = tid; d < K; d += blockDim.x) {
        float run = 0.f;
        for (u32 t = 0; t < KDA_CHUNK; t++) {
            run += Gs[t * SP + d];
            Gs[t * SP + d] = run;
        }
    }
    __syncthreads();
    // 3. pairs j ≤ i: e = exp(Γ_i − Γ_j) (never exp(−Γ) alone);
    //    Lm[i][j] = β_i Σ_d k_i k_j e (j < i), Aq[i][j] = Σ_d q_i k_j e (j ≤ i)
    for (u32 i = w; i < KDA_CHUNK; i += nw) {
        for (u32 j0 = 0; j0 <= i; j0 += 32) {
            const u32 j = j0 + lane;
            float kk = 0.f, qk = 0.f;
            if (j <= i) {
                const float* ki = Ks + i * SP;
                const float* qi = Qs + i * SP;
                const float* gi = Gs + i * SP;
                const float* kj = Ks + j * SP;
                const float* gj = Gs + j * SP;
                for (u32 d = 0; d < K; d++) {
                    const float ex = expf(gi[d] - gj[d]);
                    const float kje = kj[d] * ex;
                    kk += ki[d] * kje;
                    qk += qi[d] * kje;
                }
            }
            if (j < KDA_CHUNK) {
                Lm[i * 65 + j] = j < i ? bt[i] * kk : 0.f;
                Aq[i * 65 + j] = j <= i ? qk : 0.f;
            }
        }
        for (u32 j = ((i >> 5) + 1) * 32 + lane; j < KDA_CHUNK; j += 32) {
            Lm[i * 65 + j] = 0.f;
            Aq[i * 65 + j] = 0.f;
        }
    }
    __syncthreads();
    // 4. chunk-only outputs; then Ks ← k̂ ⊙ e^Γ (W's right-hand side), Qs ← v (U's)
    const u64 R = (u64)KDA_CHUNK * (3 * K + V + 64) + K;
    float* r = rec + ((u64)c * H + h) * R;
    float* rW = r;
    float* rU = rW + KDA_CHUNK * K;
    float* rQg = rU + KDA_CHUNK * V;
    float* rKd = rQg + KDA_CHUNK * K;
    float* rAq = rKd + KDA_CHUNK * K;
    float* rgl = rAq + KDA_CHUNK * 64;
    const float* Gl = Gs + (KDA_CHUNK - 1) * SP;
    for (u32 idx = tid; idx < KDA_CHUNK * K; idx += blockDim.x) {
        const u32 t = idx / K, d = idx % K;
        const float g = Gs[t * SP + d];
        rQg[idx] = Qs[t * SP + d] * expf(g);
        rKd[idx] = Ks[t * SP + d] * expf(Gl[d] - g);
    }
    for (u32 idx = tid; idx < KDA_CHUNK * 64; idx += blockDim.x) rAq[idx] = Aq[(idx >> 6) * 65 + (idx & 63)];
    for (u32 d = tid; d < K; d += blockDim.x) rgl[d] = expf(Gl[d]);
    __syncthreads();
    for (u32 idx = tid; idx < KDA_CHUNK * K; idx += blockDim.x) {
        const u32 t = idx / K, d = idx % K;
        Ks[t * SP + d] *= expf(Gs[t * SP + d]);
    }
    for (u32 idx = tid; idx < KDA_CHUNK * V; idx += blockDim.x) {
        const u32 t = idx / V, e = idx % V;
        Qs[t * SP + e] = t < len ? to_f(v[((u64)(row0 + t) * H + h) * V + e]) : 0.f;
    }
    __syncthreads();
    // 5. (I + L) X = diag(β) B by forward substitution, one column per thread (in place)
    for (u32 col = tid; col < K + V; col += blockDim.x) {
        float* X = col < K ? Ks + col : Qs + (col - K);
        for (u32 t = 0; t < KDA_CHUNK; t++) {
            float x = bt[t] * X[t * SP];
            const float* lrow = Lm + t * 65;
            for (u32 j = 0; j < t; j++) x -= lrow[j] * X[j * SP];
            X[t * SP] = x;
        }
    }
    __syncthreads();
    for (u32 idx = tid; idx < KDA_CHUNK * K; idx += blockDim.x) rW[idx] = Ks[(idx / K) * SP + idx % K];
    for (u32 idx = tid; idx < KDA_CHUNK * V; idx += blockDim.x) rU[idx] = Qs[(idx / V) * SP + idx % V];
}

// Chunked KDA, part 2: the sequential pass. sdesc[5·i..] = (first row, tokens, slot, fresh,
// first chunk) of sequence i (blockIdx.z). Thread (warp w of 8, lane) owns column
// e = 32·blockIdx.x + lane: rows r = 8w..8w+7 of each chunk product and state rows d = w + 8i.
// K ≤ 128, K % 4 == 0. Shared memory (floats): Ss [K, 33], Ws, Qg, Kd [64, K], Aq [64, 64],
// Un [64, 33], gl [K].
template <typename T>
__device__ void kda_chunk_scan_impl(const float* __restrict__ rec, float* __restrict__ state,
                                    T* __restrict__ o, const u32* __restrict__ sdesc, u32 H, u32 K,
                                    u32 V) {
    grid_dep_wait();
    extern __shared__ float sm[];
    float* Ss = sm;
    float* Ws = Ss + K * 33;
    float* Qg = Ws + KDA_CHUNK * K;
    float* Kd = Qg + KDA_CHUNK * K;
    float* Aq = Kd + KDA_CHUNK * K;
    float* Un = Aq + KDA_CHUNK * 64;
    float* gl = Un + KDA_CHUNK * 33;
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const u32 h = blockIdx.y, e = blockIdx.x * 32 + lane;
    const u32* dsc = sdesc + 5 * blockIdx.z;
    const u32 row0 = dsc[0], len = dsc[1], slot = dsc[2], fresh = dsc[3], chunk0 = dsc[4];
    float* st = state + ((u64)slot * H + h) * K * V;
    for (u32 d = w; d < K; d += 8) Ss[d * 33 + lane] = (!fresh && e < V) ? st[(u64)d * V + e] : 0.f;
    const u64 R = (u64)KDA_CHUNK * (3 * K + V + 64) + K;
    const u32 nch = (len + KDA_CHUNK - 1) / KDA_CHUNK;
    for (u32 ci = 0; ci < nch; ci++) {
        const float* r = rec + ((u64)(chunk0 + ci) * H + h) * R;
        const float* rW = r;
        const float* rU = rW + KDA_CHUNK * K;
        const float* rQg = rU + KDA_CHUNK * V;
        const float* rKd = rQg + KDA_CHUNK * K;
        const float* rAq = rKd + KDA_CHUNK * K;
        const float* rgl = rAq + KDA_CHUNK * 64;
        __syncthreads();
        for (u32 idx = tid * 4; idx < KDA_CHUNK * K; idx += blockDim.x * 4) {
            *reinterpret_cast<float4*>(Ws + idx) = *reinterpret_cast<const float4*>(rW + idx);
            *reinterpret_cast<float4*>(Qg + idx) = *reinterpret_cast<const float4*>(rQg + idx);
            *reinterpret_cast<float4*>(Kd + idx) = *reinterpret_cast<const float4*>(rKd + idx);
        }
        for (u32 idx = tid * 4; idx < KDA_CHUNK * 64; idx += blockDim.x * 4)
            *reinterpret_cast<float4*>(Aq + idx) = *reinterpret_cast<const float4*>(rAq + idx);
        for (u32 t = w; t < KDA_CHUNK; t += 8) Un[t * 33 + lane] = e < V ? rU[(u64)t * V + e] : 0.f;
        for (u32 d = tid; d < K; d += blockDim.x) gl[d] = rgl[d];
        __syncthreads();
        // A: V_new = U − W S, O_inter = Qg S for rows 8w..8w+7
        float av[8], ao[8];
#pragma unroll
        for (int rr = 0; rr < 8; rr++) av[rr] = ao[rr] = 0.f;
        for (u32 d = 0; d < K; d += 4) {
            const float s0 = Ss[(d + 0) * 33 + lane], s1 = Ss[(d + 1) * 33 + lane];
            const float s2 = Ss[(d + 2) * 33 + lane], s3 = Ss[(d + 3) * 33 + lane];
#pragma unroll
            for (int rr = 0; rr < 8; rr++) {
                const u32 rw = 8 * w + rr;
                const float4 wv = *reinterpret_cast<const float4*>(Ws + rw * K + d);
                const float4 qv = *reinterpret_cast<const float4*>(Qg + rw * K + d);
                av[rr] += wv.x * s0 + wv.y * s1 + wv.z * s2 + wv.w * s3;
                ao[rr] += qv.x * s0 + qv.y * s1 + qv.z * s2 + qv.w * s3;
            }
        }
#pragma unroll
        for (int rr = 0; rr < 8; rr++) {
            const u32 rw = 8 * w + rr;
            Un[rw * 33 + lane] -= av[rr];
        }
        __syncthreads();
        // B: O = O_inter + Aqk V_new (Aqk is zero above the diagonal)
        const u32 clen = min(len - ci * KDA_CHUNK, (u32)KDA_CHUNK);
#pragma unroll
        for (int rr = 0; rr < 8; rr++) {
            const u32 rw = 8 * w + rr;
            float acc = ao[rr];
            for (u32 j = 0; j <= rw; j++) acc += Aq[rw * 64 + j] * Un[j * 33 + lane];
            if (rw < clen && e < V)
                o[((u64)(row0 + ci * KDA_CHUNK + rw) * H + h) * V + e] = from_f<T>(acc);
        }
        // C: S ← diag(gl) S + Kdᵀ V_new (each thread its own rows d = w + 8i)
        for (u32 d = w; d < K; d += 8) {
            float acc = gl[d] * Ss[d * 33 + lane];
            for (u32 j = 0; j < KDA_CHUNK; j++) acc += Kd[j * K + d] * Un[j * 33 + lane];
            Ss[d * 33 + lane] = acc;
        }
    }
    __syncthreads();
    if (e < V)
        for (u32 d = w; d < K; d += 8) st[(u64)d * V + e] = Ss[d * 33 + lane];
}

#define KDA(S, T)                                                                              \
    extern "C" __global__ void kda_recurrent_k128_##S(                                         \
        const T* q, const T* k, const T* v, const T* a, const T* b, const float* a_log,        \
        const float* dt_bias, float* state, T* o, const u32* desc, u32 H, u32 K, u32 V,        \
        float lb, u32 use_lb, float scale, const u32* qs, const u32* pos, const u32* slots) {   \
        kda_recurrent_impl<T, 32>(q, k, v, a, b, a_log, dt_bias, state, o, desc, H, K, V, lb,  \
                                  use_lb, scale, qs, pos, slots);                              \
    }                                                                                          \
    extern "C" __global__ void kda_recurrent_k256_##S(                                         \
        const T* q, const T* k, const T* v, const T* a, const T* b, const float* a_log,        \
        const float* dt_bias, float* state, T* o, const u32* desc, u32 H, u32 K, u32 V,        \
        float lb, u32 use_lb, float scale, const u32* qs, const u32* pos, const u32* slots) {   \
        kda_recurrent_impl<T, 64>(q, k, v, a, b, a_log, dt_bias, state, o, desc, H, K, V, lb,  \
                                  use_lb, scale, qs, pos, slots);                              \
    }                                                                                          \
    extern "C" __global__ void kda_chunk_prep_##S(                                             \
        const T* q, const T* k, const T* v, const T* a, const T* b, const float* a_log,        \
        const float* dt_bias, float* rec, const u32* cdesc, u32 H, u32 K, u32 V, float lb,     \
        u32 use_lb, float scale) {                                                             \
        kda_chunk_prep_impl<T>(q, k, v, a, b, a_log, dt_bias, rec, cdesc, H, K, V, lb, use_lb, \
                               scale);                                                         \
    }                                                                                          \
    extern "C" __global__ void kda_chunk_scan_##S(const float* rec, float* state, T* o,        \
                                                  const u32* sdesc, u32 H, u32 K, u32 V) {     \
        kda_chunk_scan_impl<T>(rec, state, o, sdesc, H, K, V);                                 \
    }
DAYONE_FOR_FLOAT_TYPES(KDA)

// ---------------------------------------------------------------------------------------------
// A KDA decode step from its projections in one launch (Backend::kda_from_projections; every
// sequence has one token): the three short convolutions with their history update, the forget
// gate's and the output gate's second factors (W_fb · f, W_gb · g) and the token-recurrent
// update — bit-equal to short_conv_decode3, the decode GEMV (gemv_many) and kda_recurrent,
// whose arithmetic each part repeats in the same order. One block per (head, sequence) of
// G = ceil(V / 32) groups of 128 threads: group g does kda_recurrent's work for value columns
// 32g .. 32g + 31 (the same 4 warps × rows d = w + 4i split), so the q/k convolution of the head
// runs once per block and its history can be rewritten after a barrier (four blocks per head
// would race on it). Every thread of the block first asks L2 for its share of W_fb's rows of the
// head and W_gb's (constant weights: before griddepcontrol.wait).
// GEMV order of a factor row (K_r = R ≤ 256, as gemv.cu for one row of x): lane l < R/8 sums
// its 8 products with fmaf from 0, then warp_sum, then 0 + that sum (gemv's partials over 8
// warps of which only warp 0 is non-zero), rounded to T.
struct KdaStepArgs {
    const void* x[3];     // q, k, v projections before the convolution: [N, H·K], [N, H·K], [N, H·V]
    const float* cw[3];   // taps [C, W] f32
    float* cst[3];        // histories [slots, C, W − 1] f32
    const void* f;        // [N, R]  forget gate's first factor
    const void* wfb;      // [H·K, R]
    const void* g;        // [N, R]  output gate's first factor
    const void* wgb;      // [H·V, R]
    void* gate;           // [N, H·V] out: W_gb · g
    const void* b;        // [N, H]  β logits
    const float* a_log;   // [H]
    const float* dt_bias; // [H, K]
    float* state;         // [slots, H, K, V]
    void* o;              // [N, H, V] out
    const u32* qs;        // query_start [S + 1]
    const u32* pos;       // positions [N]
    const u32* slots;     // state_slots [S]
    u32 H, K, V, R, width, use_lb;
    float lb, scale;
};

// One factor row: Σ_j w[j] · x[j] over R ≤ 256 values in decode-GEMV order, rounded to T
// (all 32 lanes call it; lanes ≥ R / 8 add zero).
template <typename T>
__device__ __forceinline__ float kda_factor_row(const T* __restrict__ w, const T* __restrict__ x,
                                                u32 r, u32 lane) {
    float acc = 0.f;
    if (lane * 8 < r) {
        Vec8<T> wv, xv;
        wv.load(w + lane * 8);
        xv.load(x + lane * 8);
        float wf[8], xf[8];
        wv.to_float(wf);
        xv.to_float(xf);
#pragma unroll
        for (int e = 0; e < 8; e++) acc = fmaf(wf[e], xf[e], acc);
    }
    const float s = 0.f + warp_sum(acc);
    return to_f(from_f<T>(s));
}

// The history entries of channel ch and the new input (short_conv_decode_elem's reads).
struct KdaConvIn {
    float old[8];
    float xv;
};
template <typename T>
__device__ __forceinline__ void kda_conv_read(const T* __restrict__ x, const float* __restrict__ state,
                                              u32 row, u32 slot, bool fresh, u32 c, u32 ch,
                                              u32 width, KdaConvIn& in) {
    const u32 hh = width - 1;
    const float* st = state + ((u64)slot * c + ch) * hh;
#pragma unroll
    for (u32 j = 0; j < 8; j++) in.old[j] = (j < hh && !fresh) ? st[j] : 0.f;
    in.xv = to_f(x[(u64)row * c + ch]);
}
// y = T(silu(Σ_j w[ch, j] · u_j)) as f32 (short_conv_decode_elem's sum, in its order).
__device__ __forceinline__ float kda_conv_value(const float* __restrict__ w, u32 ch, u32 width,
                                                const KdaConvIn& in) {
    const u32 hh = width - 1;
    float acc = 0.f;
#pragma unroll
    for (u32 j = 0; j < 9; j++)
        if (j < width) acc += w[(u64)ch * width + j] * (j < hh ? in.old[j] : in.xv);
    return acc / (1.f + expf(-acc));
}
// The history shifted by one (short_conv_decode_elem's update).
__device__ __forceinline__ void kda_conv_write(float* __restrict__ state, u32 slot, u32 c, u32 ch,
                                               u32 width, const KdaConvIn& in) {
    const u32 hh = width - 1;
    float* st = state + ((u64)slot * c + ch) * hh;
#pragma unroll
    for (u32 j = 0; j < 8; j++)
        if (j < hh) st[j] = j + 1 < hh ? in.old[j + 1] : in.xv;
}

// KPT = 32 (K ≤ 128); G groups (V ≤ 32·G). Shared: q, k, e^g of the head, v of the block.
template <typename T, int G>
__device__ void kda_step_impl(const KdaStepArgs& p) {
    constexpr int KPT = 32;
    __shared__ float qs[4 * KPT], ks[4 * KPT], gs[4 * KPT], vs[32 * G];
    __shared__ float red[G][3][4][32];
    __shared__ float nrm[2][4];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 grp = tid >> 7, gt = tid & 127, w = gt >> 5;
    const u32 h = blockIdx.x, z = blockIdx.y, H = p.H, K = p.K, V = p.V, R = p.R;
    const T* wfb = static_cast<const T*>(p.wfb) + (u64)h * K * R;
    const T* wgb = static_cast<const T*>(p.wgb) + (u64)h * V * R;
    l2_prefetch(wfb, K * R * sizeof(T), tid, blockDim.x);  // the head's factor rows
    l2_prefetch(wgb, V * R * sizeof(T), tid, blockDim.x);
    grid_dep_wait();
    const u32 row = p.qs[z], slot = p.slots[z];
    const bool fresh = p.pos[row] == 0;
    const u32 ck = H * K, cv = H * V;
    // 1. q and k of the head (threads d < K), v of the block's columns (one per thread).
    KdaConvIn cq, ck_in, cvin;
    const bool qk = tid < K, vv = tid < V;
    if (qk) {
        kda_conv_read<T>(static_cast<const T*>(p.x[0]), p.cst[0], row, slot, fresh, ck, h * K + tid, p.width, cq);
        kda_conv_read<T>(static_cast<const T*>(p.x[1]), p.cst[1], row, slot, fresh, ck, h * K + tid, p.width, ck_in);
    }
    if (vv) kda_conv_read<T>(static_cast<const T*>(p.x[2]), p.cst[2], row, slot, fresh, cv, h * V + tid, p.width, cvin);
    const float braw = to_f(static_cast<const T*>(p.b)[(u64)row * H + h]);
    __syncthreads();  // every old history entry of the head is read before any is rewritten
    if (qk) {
        qs[tid] = to_f(from_f<T>(kda_conv_value(p.cw[0], h * K + tid, p.width, cq)));
        ks[tid] = to_f(from_f<T>(kda_conv_value(p.cw[1], h * K + tid, p.width, ck_in)));
        kda_conv_write(p.cst[0], slot, ck, h * K + tid, p.width, cq);
        kda_conv_write(p.cst[1], slot, ck, h * K + tid, p.width, ck_in);
    }
    if (vv) {
        vs[tid] = to_f(from_f<T>(kda_conv_value(p.cw[2], h * V + tid, p.width, cvin)));
        kda_conv_write(p.cst[2], slot, cv, h * V + tid, p.width, cvin);
    }
    // 2. The forget gate e^g for the head's K rows and the output gate for its V rows: one warp
    // per row, in decode-GEMV order.
    const T* fr = static_cast<const T*>(p.f) + (u64)row * R;
    const T* gr = static_cast<const T*>(p.g) + (u64)row * R;
    const float rate = expf(p.a_log[h]);
    const u32 nwarps = blockDim.x >> 5;
    for (u32 d = warp; d < K; d += nwarps) {
        const float a = kda_factor_row<T>(wfb + (u64)d * R, fr, R, lane);
        if (lane == 0) gs[d] = expf(kda_gate(a, p.dt_bias[(u64)h * K + d], rate, p.lb, p.use_lb));
    }
    T* gate = static_cast<T*>(p.gate) + (u64)row * cv + (u64)h * V;
    for (u32 d = warp; d < V; d += nwarps) {
        const float a = kda_factor_row<T>(wgb + (u64)d * R, gr, R, lane);
        if (lane == 0) gate[d] = from_f<T>(a);
    }
    // 3. kda_recurrent's token step, group grp owning columns e = 32·grp + lane: its state
    // slice, loaded now (its loads overlap the barrier's wait), then group 0's norm sums.
    const u32 e = grp * 32 + lane;
    float* st = p.state + ((u64)slot * H + h) * K * V;
    float S[KPT];
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        const u32 d = w + 4 * i;
        S[i] = (!fresh && d < K && e < V) ? st[(u64)d * V + e] : 0.f;
    }
    __syncthreads();  // qs, ks, vs, gs written
    if (grp == 0) {
        float sq = 0.f, sk = 0.f;
        for (u32 d = gt; d < K; d += 128) {
            const float qf = qs[d], kf = ks[d];
            sq += qf * qf;
            sk += kf * kf;
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        if (lane == 0) {
            nrm[0][w] = sq;
            nrm[1][w] = sk;
        }
    }
    __syncthreads();
    const float iq = p.scale / sqrtf(nrm[0][0] + nrm[0][1] + nrm[0][2] + nrm[0][3] + 1e-6f);
    const float ik = 1.f / sqrtf(nrm[1][0] + nrm[1][1] + nrm[1][2] + nrm[1][3] + 1e-6f);
    const float beta = 1.f / (1.f + expf(-braw));
    const float ve = e < V ? vs[e] : 0.f;
    const float ov = kda_token_update<KPT>(S, qs, ks, gs, red[grp], w, lane, K, iq, ik, beta, ve);
    if (w == 0 && e < V) static_cast<T*>(p.o)[((u64)row * H + h) * V + e] = from_f<T>(ov);
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        const u32 d = w + 4 * i;
        if (d < K && e < V) st[(u64)d * V + e] = S[i];
    }
}

// kda_step_g{G}_S: G groups of 128 threads (V ≤ 32·G ≤ 128), K ≤ 128, R ≤ 256 with R % 8 == 0,
// conv width 2..9; grid (H, sequences).
#define KDA_STEP(S, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(128) kda_step_g1_##S(KdaStepArgs p) {          \
        kda_step_impl<T, 1>(p);                                                                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) kda_step_g2_##S(KdaStepArgs p) {          \
        kda_step_impl<T, 2>(p);                                                                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(512) kda_step_g4_##S(KdaStepArgs p) {          \
        kda_step_impl<T, 4>(p);                                                                \
    }
DAYONE_FOR_FLOAT_TYPES(KDA_STEP)

// ---------------------------------------------------------------------------------------------
// Tensor-core chunked KDA (bf16/f16 activations, sm_80+; every product on mma.sync m16n8k16
// bf16 → f32, whatever the activation half type). Record per (chunk c, head h), bytes, at
// rec + (c·H + h)·RB, RB = 384K + 128V + 8192 + 4K:
//   W [64, K] | Qg [64, K] | Kd [64, K] | U [64, V] | Aqk [64, 64] (bf16, row-major) | gl [K] f32.
// kda_chunk_mma_prep_k{64,128}_*: persistent, grid min(chunks·H, SMs), 512 threads (16 warps),
//   218 KB of shared memory at K = V = 128; items (chunk, head) in order, the next item's q, k, a
//   rows loaded with cp.async (and its scalars read) while this one is computed.
//   1. q̂ (·K^−½), k̂ (bf16), g·log2 e → Γ = cumsum (f32, 4 segments of 16 rows per channel), β.
//   2. A_kk, A_qk on mma by 16-row block rows I with the reference row r = 16I per channel:
//      (x_i ⊙ e^(Γ_i − Γ_r)) · (k_j ⊙ e^(Γ_r − Γ_j))ᵀ, j < 16(I + 1). Off-diagonal blocks have
//      both factors ≤ 1; the diagonal block's second factor is ≥ 1 and is used only when
//      max_c (Γ_r − Γ_{r+15}) ≤ diag_lim (else that block is recomputed pairwise with
//      e^(Γ_i − Γ_j), f32).
//   3. T = (I + L)⁻¹ (L = strictly lower β_i A_kk) blockwise by 16 in f32, in place of L:
//      diagonal blocks by forward substitution (warps 0–1, while warps 2–15 write Qg, Kd, gl, Aqk
//      and build β k̂ ⊙ e^Γ), then T_IJ = −T_II Σ_{J≤M<I} L_IM T_MJ block row by block row.
//   4. W = T (β k̂ ⊙ e^Γ), U = T (β v) on mma (T bf16, triangular k-steps only).
// kda_chunk_mma_scan_k{64,128}_v{32,64}_*: grid (V/BV, H, sequences), 8·BV threads (BV/4 warps);
//   the state slice [K, BV] lives in f32 mma accumulators (warp w: rows 16(w mod K/16)…, K/32
//   n-tiles of 8) with a bf16 copy in shared memory as the B operand; the next chunk's record is
//   loaded with cp.async while this one is computed. Per chunk: V_new = U − W S and O = Qg S
//   (phase A), O += Aqk V_new (phase B), S ← diag(gl) S + Kdᵀ V_new (phase C). BV = 32 by
//   default (more blocks; BV = 64 halves the record traffic but measured slower at B 1).
// `stop` (profiling only, 0 otherwise): the prep kernel skips the rest of each item after step
// marker `stop`, to time the steps.

#define KM_PREP_THREADS 512

#if defined(DAYONE_ONLY_F32)
#define KDA_FOR_HALF_TYPES(M)
#elif defined(DAYONE_ONLY_BF16)
#define KDA_FOR_HALF_TYPES(M) M(bf16, bf16)
#elif defined(DAYONE_ONLY_F16)
#define KDA_FOR_HALF_TYPES(M) M(f16, f16)
#else
#define KDA_FOR_HALF_TYPES(M) M(bf16, bf16) M(f16, f16)
#endif

__device__ __forceinline__ float km_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ u32 km_pack(float lo, float hi) { return Mma<bf16>::pack(lo, hi); }
__device__ __forceinline__ float km_bf(u16 x) {
    bf16 b;
    b.x = x;
    return to_f(b);
}
template <typename T> __device__ __forceinline__ float km_half(u32 bits) {
    T v;
    v.x = (u16)bits;
    return to_f(v);
}
template <typename T> __device__ __forceinline__ u32 km_pack_t(float lo, float hi) {
    return (u32)from_f<T>(lo).x | ((u32)from_f<T>(hi).x << 16);
}
// N (2 or 4) consecutive half values (4/8-byte aligned) as floats.
template <typename T, int N> __device__ __forceinline__ void km_load(const T* p, float* out) {
    if (N == 4) {
        const uint2 r = *reinterpret_cast<const uint2*>(p);
        out[0] = km_half<T>(r.x & 0xffffu);
        out[1] = km_half<T>(r.x >> 16);
        out[2] = km_half<T>(r.y & 0xffffu);
        out[3] = km_half<T>(r.y >> 16);
    } else {
        const u32 r = *reinterpret_cast<const u32*>(p);
        out[0] = km_half<T>(r & 0xffffu);
        out[1] = km_half<T>(r >> 16);
    }
}

template <typename T, int KD>
__device__ void kda_mma_prep_impl(const T* __restrict__ q, const T* __restrict__ k,
                                  const T* __restrict__ v, const T* __restrict__ a,
                                  const T* __restrict__ b, const float* __restrict__ a_log,
                                  const float* __restrict__ dt_bias,
                                  unsigned char* __restrict__ rec,
                                  const u32* __restrict__ cdesc, u32 H, u32 V, float lb,
                                  u32 use_lb, float scale, float diag_lim, u32 nchunks,
                                  u32 stop) {
    grid_dep_wait();
    constexpr u32 KP = KD + 8;  // bf16 row stride of [64, K] tiles (conflict-free ldmatrix)
    constexpr u32 KT = KD / 16;
    constexpr int CPL = KD / 32;  // channels per lane when loading rows
    constexpr u32 NW = KM_PREP_THREADS / 32;
    const u32 VP = V + 8;
    extern __shared__ __align__(16) unsigned char smraw[];
    float* Gs = reinterpret_cast<float*>(smraw);         // [64][KD] g, then Γ
    u16* Qh = reinterpret_cast<u16*>(Gs + 64 * KD);      // [64][KP] q̂ (scaled)
    u16* Kh = Qh + 64 * KP;                              // [64][KP] k̂
    u16* Ab = Kh + 64 * KP;                              // [4 I][2 (k, q)][16][KP]
    u16* Bb = Ab + 128 * KP;                             // block row I at row 8I(I+1), 16(I+1) rows
    u16* Bk = Ab;                                        // later [64][KP]: β k̂ e^Γ
    u16* Bv = Ab + 64 * KP;                              // later [64][VP]: β v
    float* Lm = reinterpret_cast<float*>(Bb + 160 * KP);  // [64][65] strictly lower β A_kk
    float* Tm = Lm;                                       // (I + L)⁻¹, in place of L
    u16* Tb = reinterpret_cast<u16*>(Lm + 64 * 65);       // [64][72] Aqk staging, then T bf16
    u16* Sraw = Tb + 64 * 72;                             // [3][64][KD] next item's q, k, a
    float* bt = reinterpret_cast<float*>(Sraw + 3 * 64 * KD);  // [64] β
    float* seg = bt + 64;                                 // [4][KD] segment sums
    int* dflag = reinterpret_cast<int*>(seg + 4 * KD);    // [4] diagonal block on mma
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const u32 nitems = nchunks * H;
    const u64 RB = 384ull * KD + 128ull * V + 8192ull + 4ull * KD;
    // the q, k, a rows of item (chunk, head) with cp.async; rows past the chunk zero-filled
    auto prefetch = [&](u32 item) {
        constexpr u32 CPR = KD / 8;
        const u32 pc = item / H, ph = item % H;
        const u32 prow0 = cdesc[2 * pc], plen = cdesc[2 * pc + 1];
        for (u32 idx = tid; idx < 3 * 64 * CPR; idx += KM_PREP_THREADS) {
            const u32 m = idx / (64 * CPR), rem = idx % (64 * CPR), t = rem / CPR, cc = rem % CPR;
            const T* src = (m == 0 ? q : m == 1 ? k : a) +
                           ((u64)(prow0 + (t < plen ? t : 0)) * H + ph) * KD + cc * 8;
            cp_async16(smem_addr(Sraw + (m * 64 + t) * KD + cc * 8), src, t < plen ? 16 : 0);
        }
        cp_async_commit();
    };
    if (blockIdx.x < nitems) prefetch(blockIdx.x);
    // per-item scalars, read one item ahead: rate = e^A_log[h], this lane's dt_bias, β (tid < 64)
    auto scalars = [&](u32 item, float& rate, float* dtb, float& bv) {
        const u32 pc = item / H, ph = item % H;
        const u32 prow0 = cdesc[2 * pc], plen = cdesc[2 * pc + 1];
        rate = expf(a_log[ph]);
#pragma unroll
        for (int i = 0; i < CPL; i++) dtb[i] = dt_bias[(u64)ph * KD + lane * CPL + i];
        bv = tid < plen ? 1.f / (1.f + expf(-to_f(b[(u64)(prow0 + (tid < 64 ? tid : 0)) * H + ph])))
                        : 0.f;
    };
    float rate_n = 0.f, dtb_n[CPL], bval_n = 0.f;
    if (blockIdx.x < nitems) scalars(blockIdx.x, rate_n, dtb_n, bval_n);
    // persistent: items (chunk, head) blockIdx.x, + gridDim.x, …; the next item's rows load
    // while this one is computed
    for (u32 item = blockIdx.x; item < nitems; item += gridDim.x) {
    const u32 c = item / H, h = item % H;
    const u32 row0 = cdesc[2 * c], len = cdesc[2 * c + 1];
    const float rate = rate_n, bval = bval_n;
    float dtb[CPL];
#pragma unroll
    for (int i = 0; i < CPL; i++) dtb[i] = dtb_n[i];
    if (item + gridDim.x < nitems) scalars(item + gridDim.x, rate_n, dtb_n, bval_n);
    unsigned char* rbase = rec + ((u64)c * H + h) * RB;
    u16* rW = reinterpret_cast<u16*>(rbase);
    u16* rQg = rW + 64 * KD;
    u16* rKd = rQg + 64 * KD;
    u16* rU = rKd + 64 * KD;
    u16* rAq = rU + 64 * V;
    float* rgl = reinterpret_cast<float*>(rAq + 64 * 64);
    cp_async_wait<0>();
    __syncthreads();
    // 1. rows: normalised q (scaled), k (bf16); the gate in log2 units (g·log2 e).
#pragma unroll
    for (u32 tt = 0; tt < 64 / NW; tt++) {
        const u32 t = w + tt * NW;
        const u32 d0 = lane * CPL;
        float qf[CPL], kf[CPL], gf[CPL];
        km_load<T, CPL>(reinterpret_cast<const T*>(Sraw + t * KD + d0), qf);
        km_load<T, CPL>(reinterpret_cast<const T*>(Sraw + (64 + t) * KD + d0), kf);
        km_load<T, CPL>(reinterpret_cast<const T*>(Sraw + (128 + t) * KD + d0), gf);
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int i = 0; i < CPL; i++) {
            sq += qf[i] * qf[i];
            sk += kf[i] * kf[i];
            gf[i] = t < len ? kda_gate(gf[i], dtb[i], rate, lb, use_lb) *
                                  1.4426950408889634f
                            : 0.f;
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        const float iq = scale / sqrtf(sq + 1e-6f), ik = 1.f / sqrtf(sk + 1e-6f);
#pragma unroll
        for (int i = 0; i < CPL; i += 2) {
            Gs[t * KD + d0 + i] = gf[i];
            Gs[t * KD + d0 + i + 1] = gf[i + 1];
            *reinterpret_cast<u32*>(Qh + t * KP + d0 + i) = km_pack(qf[i] * iq, qf[i + 1] * iq);
            *reinterpret_cast<u32*>(Kh + t * KP + d0 + i) = km_pack(kf[i] * ik, kf[i + 1] * ik);
        }
    }
    if (tid < 64) bt[tid] = bval;
    __syncthreads();
    if (item + gridDim.x < nitems) prefetch(item + gridDim.x);
    if (stop == 1) continue;
    // 2. Γ (log2 units): thread (segment s of 16 rows, channel d) — local running sums, then
    //    the segment offsets
    {
        const bool on = tid < 4 * KD;
        const u32 cd = tid % KD, cs = tid / KD;
        float x[16];
        if (on) {
            float run = 0.f;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                run += Gs[(16 * cs + i) * KD + cd];
                x[i] = run;
            }
            seg[cs * KD + cd] = run;
        }
        __syncthreads();
        if (on) {
            float off = 0.f;
            for (u32 s = 0; s < cs; s++) off += seg[s * KD + cd];
#pragma unroll
            for (int i = 0; i < 16; i++) Gs[(16 * cs + i) * KD + cd] = x[i] + off;
        }
        __syncthreads();
    }
    if (stop == 2) continue;
    uint4 vpre[2];  // this item's v rows (used in step 5), loaded early
#pragma unroll
    for (u32 rr = 0; rr < 2; rr++) {
        const u32 idx = tid + rr * KM_PREP_THREADS, j = idx / (V / 8), e = 8 * (idx % (V / 8));
        vpre[rr] = make_uint4(0u, 0u, 0u, 0u);
        if (idx < 64 * (V / 8) && j < len)
            vpre[rr] = *reinterpret_cast<const uint4*>(v + ((u64)(row0 + j) * H + h) * V + e);
    }
    // 3a. mma operands per block row I (r = 16I): Ab[I][0] = k̂_i e^(Γ_i − Γ_r),
    //     Ab[I][1] = q̂_i e^(Γ_i − Γ_r) (i in block I), Bb_I[j] = k̂_j e^(min(Γ_r − Γ_j, 80)),
    //     j < 16(I + 1); dflag[I]: the diagonal block's factor stays ≤ e^diag_lim.
    if (w < 4) {
        float mx = 0.f;
        for (u32 d = lane; d < KD; d += 32)
            mx = fmaxf(mx, Gs[(16 * w) * KD + d] - Gs[(16 * w + 15) * KD + d]);
        mx = warp_max(mx);
        if (lane == 0) dflag[w] = mx <= diag_lim * 1.4426950408889634f ? 1 : 0;
    }
#pragma unroll 3
    for (u32 idx = tid; idx < 288 * (KD / 8); idx += KM_PREP_THREADS) {
        const u32 row = idx / (KD / 8), d = 8 * (idx % (KD / 8));
        u32 src, ref;
        bool isa;
        const u16* X;
        u16* dst;
        if (row < 128) {
            const u32 I = row >> 5;
            ref = 16 * I;
            src = ref + (row & 15);
            X = ((row >> 4) & 1) ? Qh : Kh;
            isa = true;
            dst = Ab + row * KP + d;
        } else {
            const u32 rb = row - 128;
            const u32 I = rb < 16 ? 0 : rb < 48 ? 1 : rb < 96 ? 2 : 3;
            ref = 16 * I;
            src = rb - 8 * I * (I + 1);
            X = Kh;
            isa = false;
            dst = Bb + rb * KP + d;
        }
        Vec8<bf16> xv;
        xv.load(reinterpret_cast<const bf16*>(X + src * KP + d));
        float x[8], gsv[8], grv[8];
        xv.to_float(x);
        Vec8<float> gv;
        gv.load(Gs + src * KD + d);
        gv.to_float(gsv);
        gv.load(Gs + ref * KD + d);
        gv.to_float(grv);
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] *= km_ex2(isa ? gsv[i] - grv[i] : fminf(grv[i] - gsv[i], 115.f));
        xv.from_float(x);
        xv.store(reinterpret_cast<bf16*>(dst));
    }
    __syncthreads();
    if (stop == 3) continue;
    // 3b. block row I, 16 columns (np), product p (0: k → Lm, 1: q → Aqk staging in Tb)
    for (u32 u = w; u < 20; u += NW) {
        const u32 pu = u >> 1, p = u & 1;
        const u32 I = pu < 1 ? 0 : pu < 3 ? 1 : pu < 6 ? 2 : 3;
        const u32 np = pu - I * (I + 1) / 2;
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        const u16* A = Ab + (I * 32 + p * 16 + (lane & 15)) * KP + (lane >> 4) * 8;
        const u16* B = Bb + (8 * I * (I + 1) + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * KP +
                       ((lane >> 3) & 1) * 8;
#pragma unroll
        for (u32 kt = 0; kt < KT; kt++) {
            u32 af[4], b0, b1, b2, b3;
            ldsm_x4(smem_addr(A + kt * 16), af[0], af[1], af[2], af[3]);
            ldsm_x4(smem_addr(B + kt * 16), b0, b1, b2, b3);
            Mma<bf16>::run(acc[0], af, b0, b1);
            Mma<bf16>::run(acc[1], af, b2, b3);
        }
#pragma unroll
        for (u32 nt = 0; nt < 2; nt++) {
#pragma unroll
            for (u32 hh = 0; hh < 2; hh++) {
                const u32 i = 16 * I + g + 8 * hh, j = 16 * np + 8 * nt + 2 * t4;
                const float v0 = acc[nt][2 * hh], v1 = acc[nt][2 * hh + 1];
                if (p == 0) {
                    Lm[i * 65 + j] = j < i ? bt[i] * v0 : 0.f;
                    Lm[i * 65 + j + 1] = j + 1 < i ? bt[i] * v1 : 0.f;
                } else {
                    *reinterpret_cast<u32*>(Tb + i * 72 + j) =
                        km_pack(j <= i ? v0 : 0.f, j + 1 <= i ? v1 : 0.f);
                }
            }
        }
    }
    __syncthreads();
    if (stop == 4) continue;
    // 3c. diagonal blocks with a steep gate (rare): pairwise e^(Γ_i − Γ_j), f32
    if (!(dflag[0] & dflag[1] & dflag[2] & dflag[3])) {
        for (u32 pidx = tid; pidx < 4 * 136; pidx += KM_PREP_THREADS) {
            const u32 I = pidx / 136, pq = pidx % 136;
            if (dflag[I]) continue;
            u32 ii = (u32)((sqrtf(8.f * (float)pq + 1.f) - 1.f) * 0.5f);
            while ((ii + 1) * (ii + 2) / 2 <= pq) ii++;
            while (ii * (ii + 1) / 2 > pq) ii--;
            const u32 i = 16 * I + ii, j = 16 * I + (pq - ii * (ii + 1) / 2);
            float kk = 0.f, qk = 0.f;
            for (u32 d = 0; d < KD; d++) {
                const float kj = km_bf(Kh[j * KP + d]) * km_ex2(Gs[i * KD + d] - Gs[j * KD + d]);
                kk += km_bf(Kh[i * KP + d]) * kj;
                qk += km_bf(Qh[i * KP + d]) * kj;
            }
            Lm[i * 65 + j] = j < i ? bt[i] * kk : 0.f;
            Tb[i * 72 + j] = from_f<bf16>(qk).x;
        }
        __syncthreads();
    }
#pragma unroll
    for (u32 rr = 0; rr < 2; rr++) {
        // Bv = β v (all threads: each converts the v rows it preloaded)
        const u32 idx = tid + rr * KM_PREP_THREADS;
        if (idx < 64 * (V / 8)) {
            const u32 j = idx / (V / 8), e = 8 * (idx % (V / 8));
            Vec8<T> vin;
            vin.r = vpre[rr];
            float x[8];
            vin.to_float(x);
            const float bj = bt[j];
#pragma unroll
            for (int i = 0; i < 8; i++) x[i] *= bj;
            Vec8<bf16> o8;
            o8.from_float(x);
            o8.store(reinterpret_cast<bf16*>(Bv + j * VP + e));
        }
    }
    {
        const u32 I = (tid >> 4) & 3, cc = tid & 15, r = 16 * I;
        float x[16];
        if (tid < 64) {
            // 4a. T_II = (I + L_II)⁻¹ by forward substitution, one column per thread (warps 0–1)
#pragma unroll
            for (int ii = 0; ii < 16; ii++) {
                float s = ii == (int)cc ? 1.f : 0.f;
                if (ii > (int)cc) {
                    const float* lr = Lm + (r + ii) * 65 + r;
#pragma unroll
                    for (int m = 0; m < ii; m++) s -= lr[m] * x[m];
                }
                x[ii] = s;
            }
        } else {
            // warps 2–15 meanwhile: step 5 and 3d
            // 5. Bk = β k̂ e^Γ into the operand area; Qg, Kd, gl records
            const float* Gl = Gs + 63 * KD;
#pragma unroll 2
            for (u32 idx = tid - 64; idx < 64 * (KD / 8); idx += KM_PREP_THREADS - 64) {
                const u32 j = idx / (KD / 8), d = 8 * (idx % (KD / 8));
                float gj[8], gl8[8], kx[8], qx[8], ob[8];
                Vec8<float> gv;
                gv.load(Gs + j * KD + d);
                gv.to_float(gj);
                gv.load(Gl + d);
                gv.to_float(gl8);
                Vec8<bf16> kv8, qv8;
                kv8.load(reinterpret_cast<const bf16*>(Kh + j * KP + d));
                kv8.to_float(kx);
                qv8.load(reinterpret_cast<const bf16*>(Qh + j * KP + d));
                qv8.to_float(qx);
                const float bj = bt[j];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float e = km_ex2(gj[i]);
                    ob[i] = bj * kx[i] * e;
                    qx[i] *= e;
                    kx[i] *= km_ex2(gl8[i] - gj[i]);
                }
                Vec8<bf16> o8;
                o8.from_float(ob);
                o8.store(reinterpret_cast<bf16*>(Bk + j * KP + d));
                o8.from_float(qx);
                o8.store(reinterpret_cast<bf16*>(rQg + j * KD + d));
                o8.from_float(kx);
                o8.store(reinterpret_cast<bf16*>(rKd + j * KD + d));
            }
            for (u32 d = tid - 64; d < KD; d += KM_PREP_THREADS - 64) rgl[d] = km_ex2(Gl[d]);
            // 3d. Aqk → record (blocks above the diagonal are zero); 4a. diagonal inverses
            for (u32 idx = tid - 64; idx < 512; idx += KM_PREP_THREADS - 64) {
                const u32 i = idx >> 3, cc = idx & 7;
                uint4 val = make_uint4(0u, 0u, 0u, 0u);
                if ((cc >> 1) <= (i >> 4))
                    val = *reinterpret_cast<const uint4*>(Tb + i * 72 + cc * 8);
                *reinterpret_cast<uint4*>(rAq + i * 64 + cc * 8) = val;
            }
        }
        __syncthreads();  // T_II overwrites L_II
        if (tid < 64) {
#pragma unroll
            for (int ii = 0; ii < 16; ii++) Tm[(r + ii) * 65 + r + cc] = x[ii];
        }
        __syncthreads();
    }
    if (stop == 5 || stop == 6) continue;
    // 4b. off-diagonal blocks, block row by block row: P = Σ_{J≤M<I} L_IM T_MJ, T_IJ = −T_II P
    for (u32 I = 1; I < 4; I++) {
        const u32 n = I * 256;
        float pv[2];
#pragma unroll
        for (u32 rr = 0; rr < 2; rr++) {
            const u32 idx = tid + rr * KM_PREP_THREADS;
            if (idx < n) {
                const u32 J = idx >> 8, i = 16 * I + ((idx >> 4) & 15), j = 16 * J + (idx & 15);
                float s0 = 0.f, s1 = 0.f;
                for (u32 M = J; M < I; M++) {
                    const float* lr = Lm + i * 65 + 16 * M;
                    const float* tc = Tm + 16 * M * 65 + j;
#pragma unroll
                    for (u32 m = 0; m < 16; m += 2) {
                        s0 += lr[m] * tc[m * 65];
                        s1 += lr[m + 1] * tc[(m + 1) * 65];
                    }
                }
                pv[rr] = s0 + s1;
            }
        }
        __syncthreads();  // P_IJ overwrites L_IJ
#pragma unroll
        for (u32 rr = 0; rr < 2; rr++) {
            const u32 idx = tid + rr * KM_PREP_THREADS;
            if (idx < n) {
                const u32 J = idx >> 8, i = 16 * I + ((idx >> 4) & 15), j = 16 * J + (idx & 15);
                Tm[i * 65 + j] = pv[rr];
            }
        }
        __syncthreads();
        float val[2];
#pragma unroll
        for (u32 rr = 0; rr < 2; rr++) {
            const u32 idx = tid + rr * KM_PREP_THREADS;
            if (idx < n) {
                const u32 J = idx >> 8, i = 16 * I + ((idx >> 4) & 15), j = 16 * J + (idx & 15);
                float s = 0.f;
#pragma unroll
                for (u32 m = 0; m < 16; m++)
                    s -= Tm[i * 65 + 16 * I + m] * Tm[(16 * I + m) * 65 + j];
                val[rr] = s;
            }
        }
        __syncthreads();
#pragma unroll
        for (u32 rr = 0; rr < 2; rr++) {
            const u32 idx = tid + rr * KM_PREP_THREADS;
            if (idx < n) {
                const u32 J = idx >> 8, i = 16 * I + ((idx >> 4) & 15), j = 16 * J + (idx & 15);
                Tm[i * 65 + j] = val[rr];
            }
        }
        __syncthreads();
    }
    for (u32 idx = tid; idx < 64 * 32; idx += KM_PREP_THREADS) {
        const u32 i = idx >> 5, j = 2 * (idx & 31);
        *reinterpret_cast<u32*>(Tb + i * 72 + j) =
            km_pack(j <= i ? Tm[i * 65 + j] : 0.f, j + 1 <= i ? Tm[i * 65 + j + 1] : 0.f);
    }
    __syncthreads();
    if (stop == 7) continue;
    // 6. W = T Bk, U = T Bv: unit u = 16 columns (np) × m-tile (rotating so warps balance)
    const u32 npairs = (KD + V) / 16;
    for (u32 u = w; u < 4 * npairs; u += NW) {
        const u32 np = u >> 2, mt = (u + (u >> 4)) & 3;
        const bool isw = np * 16 < KD;
        const u16* B = isw ? Bk + np * 16 : Bv + (np * 16 - KD);
        const u32 bs = isw ? KP : VP;
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        for (u32 kt = 0; kt <= mt; kt++) {
            u32 af[4], b0, b1, b2, b3;
            ldsm_x4(smem_addr(Tb + (16 * mt + (lane & 15)) * 72 + 16 * kt + (lane >> 4) * 8),
                    af[0], af[1], af[2], af[3]);
            ldsm_x4_t(smem_addr(B + (16 * kt + (lane & 7) + ((lane >> 3) & 1) * 8) * bs +
                                (lane >> 4) * 8),
                      b0, b1, b2, b3);
            Mma<bf16>::run(acc[0], af, b0, b1);
            Mma<bf16>::run(acc[1], af, b2, b3);
        }
#pragma unroll
        for (u32 nt = 0; nt < 2; nt++) {
#pragma unroll
            for (u32 hh = 0; hh < 2; hh++) {
                const u32 i = 16 * mt + g + 8 * hh, col = np * 16 + 8 * nt + 2 * t4;
                u16* dst = isw ? rW + i * KD + col : rU + i * V + (col - KD);
                *reinterpret_cast<u32*>(dst) = km_pack(acc[nt][2 * hh], acc[nt][2 * hh + 1]);
            }
        }
    }
    }  // item
}

template <typename T, int KD, int BV>
__device__ void kda_mma_scan_impl(const unsigned char* __restrict__ rec, float* __restrict__ state,
                                  T* __restrict__ o, const u32* __restrict__ sdesc, u32 H, u32 V) {
    grid_dep_wait();
    constexpr u32 KP = KD + 8, KT = KD / 16, BP = BV + 8, NT = BV * 8;
    constexpr u32 SN = KT / 2;  // state n-tiles (of 8 columns) per warp (NT / 32 = BV / 4 warps)
    constexpr u32 BUF = (3 * 64 * KP + 64 * 72 + 64 * BP) * 2 + KD * 4;
    extern __shared__ __align__(16) unsigned char smraw[];
    u16* Sb = reinterpret_cast<u16*>(smraw + 2 * BUF);  // [KD][BP] bf16 state
    u16* Vn = Sb + KD * BP;                              // [64][BP] bf16 V_new
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const u32 vb = blockIdx.x, h = blockIdx.y;
    const u32* dsc = sdesc + 5 * blockIdx.z;
    const u32 row0 = dsc[0], len = dsc[1], slot = dsc[2], fresh = dsc[3], chunk0 = dsc[4];
    const u64 RB = 384ull * KD + 128ull * V + 8192ull + 4ull * KD;
    float* st = state + ((u64)slot * H + h) * KD * V;
    const u32 smt = w % KT, sn0 = (w / KT) * SN;
    const u32 d0 = 16 * smt + g, d1 = d0 + 8;
    float s[SN][4];
#pragma unroll
    for (u32 n = 0; n < SN; n++) {
        const u32 cl = 8 * (sn0 + n) + 2 * t4, col = vb * BV + cl;
        float2 x0 = make_float2(0.f, 0.f), x1 = x0;
        if (!fresh) {
            x0 = *reinterpret_cast<const float2*>(st + (u64)d0 * V + col);
            x1 = *reinterpret_cast<const float2*>(st + (u64)d1 * V + col);
        }
        s[n][0] = x0.x;
        s[n][1] = x0.y;
        s[n][2] = x1.x;
        s[n][3] = x1.y;
        *reinterpret_cast<u32*>(Sb + d0 * BP + cl) = km_pack(x0.x, x0.y);
        *reinterpret_cast<u32*>(Sb + d1 * BP + cl) = km_pack(x1.x, x1.y);
    }
    const u32 nch = (len + 63) / 64;
    auto prefetch = [&](u32 ci, u32 buf) {
        const unsigned char* r = rec + ((u64)(chunk0 + ci) * H + h) * RB;
        unsigned char* sb = smraw + buf * BUF;
        constexpr u32 CPR = KD / 8;
        for (u32 idx = tid; idx < 3 * 64 * CPR; idx += NT) {
            const u32 row = idx / CPR, cc = idx % CPR;  // row over the 3 stacked [64, K] tiles
            cp_async16(smem_addr(sb + (row * KP + cc * 8) * 2), r + ((u64)row * KD + cc * 8) * 2,
                       16);
        }
        const unsigned char* ra = r + 384ull * KD + 128ull * V;
        for (u32 idx = tid; idx < 512; idx += NT) {
            const u32 row = idx >> 3, cc = idx & 7;
            cp_async16(smem_addr(sb + (3 * 64 * KP + row * 72 + cc * 8) * 2),
                       ra + (row * 64 + cc * 8) * 2, 16);
        }
        for (u32 idx = tid; idx < 64 * (BV / 8); idx += NT) {
            const u32 row = idx / (BV / 8), cc = idx % (BV / 8);
            cp_async16(smem_addr(sb + (3 * 64 * KP + 64 * 72 + row * BP + cc * 8) * 2),
                       r + 384ull * KD + ((u64)row * V + vb * BV + cc * 8) * 2, 16);
        }
        for (u32 idx = tid; idx < KD / 4; idx += NT)
            cp_async16(smem_addr(sb + (3 * 64 * KP + 64 * 72 + 64 * BP) * 2 + idx * 16),
                       ra + 8192 + idx * 16, 16);
        cp_async_commit();
    };
    prefetch(0, 0);
    const u32 mt = w & 3, np = w >> 2;
    for (u32 ci = 0; ci < nch; ci++) {
        cp_async_wait<0>();
        __syncthreads();
        // the buffer of chunk ci − 1 is free: every warp is past it
        if (ci + 1 < nch) prefetch(ci + 1, (ci + 1) & 1);
        const unsigned char* sb = smraw + (ci & 1) * BUF;
        const u16* sW = reinterpret_cast<const u16*>(sb);
        const u16* sQ = sW + 64 * KP;
        const u16* sK = sQ + 64 * KP;
        const u16* sA = sK + 64 * KP;
        const u16* sU = sA + 64 * 72;
        const float* sg = reinterpret_cast<const float*>(sU + 64 * BP);
        // phase A: rows 16mt.., columns 16np.. of W S and Qg S
        // two accumulator sets (even / odd k-steps) halve the dependent mma chains
        float aw[4][4], ao[4][4];
#pragma unroll
        for (u32 x = 0; x < 4; x++)
#pragma unroll
            for (u32 y = 0; y < 4; y++) aw[x][y] = ao[x][y] = 0.f;
#pragma unroll
        for (u32 kt = 0; kt < KT; kt++) {
            const u32 par = 2 * (kt & 1);
            u32 af[4], b0, b1, b2, b3;
            ldsm_x4_t(smem_addr(Sb + (16 * kt + (lane & 7) + ((lane >> 3) & 1) * 8) * BP + 16 * np +
                                (lane >> 4) * 8),
                      b0, b1, b2, b3);
            ldsm_x4(smem_addr(sW + (16 * mt + (lane & 15)) * KP + 16 * kt + (lane >> 4) * 8), af[0],
                    af[1], af[2], af[3]);
            Mma<bf16>::run(aw[par], af, b0, b1);
            Mma<bf16>::run(aw[par + 1], af, b2, b3);
            ldsm_x4(smem_addr(sQ + (16 * mt + (lane & 15)) * KP + 16 * kt + (lane >> 4) * 8), af[0],
                    af[1], af[2], af[3]);
            Mma<bf16>::run(ao[par], af, b0, b1);
            Mma<bf16>::run(ao[par + 1], af, b2, b3);
        }
#pragma unroll
        for (u32 y = 0; y < 4; y++) {
            aw[0][y] += aw[2][y];
            aw[1][y] += aw[3][y];
            ao[0][y] += ao[2][y];
            ao[1][y] += ao[3][y];
        }
#pragma unroll
        for (u32 nt = 0; nt < 2; nt++) {
#pragma unroll
            for (u32 hh = 0; hh < 2; hh++) {
                const u32 row = 16 * mt + g + 8 * hh, col = 16 * np + 8 * nt + 2 * t4;
                const u32 uu = *reinterpret_cast<const u32*>(sU + row * BP + col);
                *reinterpret_cast<u32*>(Vn + row * BP + col) =
                    km_pack(km_bf((u16)(uu & 0xffffu)) - aw[nt][2 * hh],
                            km_bf((u16)(uu >> 16)) - aw[nt][2 * hh + 1]);
            }
        }
        __syncthreads();
        // phase B: O += Aqk V_new (Aqk is zero above the diagonal: k-tiles ≤ mt)
        for (u32 kt = 0; kt <= mt; kt++) {
            u32 af[4], b0, b1, b2, b3;
            ldsm_x4(smem_addr(sA + (16 * mt + (lane & 15)) * 72 + 16 * kt + (lane >> 4) * 8), af[0],
                    af[1], af[2], af[3]);
            ldsm_x4_t(smem_addr(Vn + (16 * kt + (lane & 7) + ((lane >> 3) & 1) * 8) * BP + 16 * np +
                                (lane >> 4) * 8),
                      b0, b1, b2, b3);
            Mma<bf16>::run(ao[0], af, b0, b1);
            Mma<bf16>::run(ao[1], af, b2, b3);
        }
        const u32 clen = min(len - ci * 64, 64u);
#pragma unroll
        for (u32 nt = 0; nt < 2; nt++) {
#pragma unroll
            for (u32 hh = 0; hh < 2; hh++) {
                const u32 row = 16 * mt + g + 8 * hh;
                const u32 col = vb * BV + 16 * np + 8 * nt + 2 * t4;
                if (row < clen)
                    *reinterpret_cast<u32*>(o + ((u64)(row0 + ci * 64 + row) * H + h) * V + col) =
                        km_pack_t<T>(ao[nt][2 * hh], ao[nt][2 * hh + 1]);
            }
        }
        // phase C: S ← diag(gl) S + Kdᵀ V_new on the warp's state tile
        {
            const float gl0 = sg[d0], gl1 = sg[d1];
#pragma unroll
            for (u32 n = 0; n < SN; n++) {
                s[n][0] *= gl0;
                s[n][1] *= gl0;
                s[n][2] *= gl1;
                s[n][3] *= gl1;
            }
        }
        float s2[SN][4];  // odd k-steps (shorter chains), added at the end
#pragma unroll
        for (u32 n = 0; n < SN; n++) s2[n][0] = s2[n][1] = s2[n][2] = s2[n][3] = 0.f;
#pragma unroll
        for (u32 kt = 0; kt < 4; kt++) {
            u32 af[4];
            ldsm_x4_t(smem_addr(sK + (16 * kt + ((lane >> 4) << 3) + (lane & 7)) * KP + 16 * smt +
                                ((lane >> 3) & 1) * 8),
                      af[0], af[1], af[2], af[3]);
#pragma unroll
            for (u32 p = 0; p < SN / 2; p++) {
                u32 b0, b1, b2, b3;
                ldsm_x4_t(smem_addr(Vn + (16 * kt + (lane & 7) + ((lane >> 3) & 1) * 8) * BP +
                                    8 * sn0 + 16 * p + (lane >> 4) * 8),
                          b0, b1, b2, b3);
                Mma<bf16>::run((kt & 1) ? s2[2 * p] : s[2 * p], af, b0, b1);
                Mma<bf16>::run((kt & 1) ? s2[2 * p + 1] : s[2 * p + 1], af, b2, b3);
            }
        }
#pragma unroll
        for (u32 n = 0; n < SN; n++)
#pragma unroll
            for (u32 y = 0; y < 4; y++) s[n][y] += s2[n][y];
#pragma unroll
        for (u32 n = 0; n < SN; n++) {
            const u32 cl = 8 * (sn0 + n) + 2 * t4;
            *reinterpret_cast<u32*>(Sb + d0 * BP + cl) = km_pack(s[n][0], s[n][1]);
            *reinterpret_cast<u32*>(Sb + d1 * BP + cl) = km_pack(s[n][2], s[n][3]);
        }
    }
#pragma unroll
    for (u32 n = 0; n < SN; n++) {
        const u32 col = vb * BV + 8 * (sn0 + n) + 2 * t4;
        *reinterpret_cast<float2*>(st + (u64)d0 * V + col) = make_float2(s[n][0], s[n][1]);
        *reinterpret_cast<float2*>(st + (u64)d1 * V + col) = make_float2(s[n][2], s[n][3]);
    }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define KDA_MMA_K(S, T, KD)                                                                    \
    extern "C" __global__ void __launch_bounds__(KM_PREP_THREADS)                              \
        kda_chunk_mma_prep_k##KD##_##S(const T* q, const T* k, const T* v, const T* a,         \
                                       const T* b, const float* a_log, const float* dt_bias,   \
                                       unsigned char* rec, const u32* cdesc, u32 H, u32 V,     \
                                       float lb, u32 use_lb, float scale, float diag_lim,      \
                                       u32 nchunks, u32 stop) {                                \
        kda_mma_prep_impl<T, KD>(q, k, v, a, b, a_log, dt_bias, rec, cdesc, H, V, lb, use_lb,  \
                                 scale, diag_lim, nchunks, stop);                              \
    }                                                                                          \
    KDA_MMA_SCAN(S, T, KD, 32) KDA_MMA_SCAN(S, T, KD, 64)
#define KDA_MMA_SCAN(S, T, KD, BV)                                                             \
    extern "C" __global__ void __launch_bounds__(BV * 8)                                       \
        kda_chunk_mma_scan_k##KD##_v##BV##_##S(const unsigned char* rec, float* state, T* o,   \
                                               const u32* sdesc, u32 H, u32 V) {               \
        kda_mma_scan_impl<T, KD, BV>(rec, state, o, sdesc, H, V);                              \
    }
#define KDA_MMA(S, T) KDA_MMA_K(S, T, 64) KDA_MMA_K(S, T, 128)
KDA_FOR_HALF_TYPES(KDA_MMA)
#endif
