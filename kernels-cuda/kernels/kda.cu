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

#define SHORT_CONV(S, T)                                                                        \
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

// ---------------------------------------------------------------------------------------------
// Token-recurrent KDA. desc[4·i..] = (first row, token count, state slot, fresh) of sequence i
// (blockIdx.z). q, k, a [N, H, K], v, o [N, H, V], b [N, H] T; a_log [H], dt_bias [H, K],
// state [slots, H, K, V] f32. Thread (warp w, lane) owns column e = 32·blockIdx.x + lane and
// rows d = w + 4i (i < KPT, K ≤ 4·KPT ≤ 256). Per token one cross-warp reduction gives
// Sᵀk, Sᵀq (after the decay) and k·q; then δ = β(v − Sᵀk), S += k δ, o = Sᵀq + δ (k·q).
template <typename T, int KPT>
__device__ void kda_recurrent_impl(const T* __restrict__ q, const T* __restrict__ k,
                                   const T* __restrict__ v, const T* __restrict__ a,
                                   const T* __restrict__ b, const float* __restrict__ a_log,
                                   const float* __restrict__ dt_bias, float* __restrict__ state,
                                   T* __restrict__ o, const u32* __restrict__ desc, u32 H, u32 K,
                                   u32 V, float lb, u32 use_lb, float scale) {
    grid_dep_wait();
    __shared__ float qs[4 * KPT], ks[4 * KPT], gs[4 * KPT];
    __shared__ float red[3][4][32];
    __shared__ float nrm[2][4];
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const u32 h = blockIdx.y, e = blockIdx.x * 32 + lane;
    const u32* dsc = desc + 4 * blockIdx.z;
    const u32 row0 = dsc[0], len = dsc[1], slot = dsc[2], fresh = dsc[3];
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
        const float beta = 1.f / (1.f + expf(-to_f(b[row * H + h])));
        const float ve = e < V ? to_f(v[(row * H + h) * V + e]) : 0.f;
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
        if (w == 0 && e < V) o[(row * H + h) * V + e] = from_f<T>(qo + delta * kq);
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
        float lb, u32 use_lb, float scale) {                                                   \
        kda_recurrent_impl<T, 32>(q, k, v, a, b, a_log, dt_bias, state, o, desc, H, K, V, lb,  \
                                  use_lb, scale);                                              \
    }                                                                                          \
    extern "C" __global__ void kda_recurrent_k256_##S(                                         \
        const T* q, const T* k, const T* v, const T* a, const T* b, const float* a_log,        \
        const float* dt_bias, float* state, T* o, const u32* desc, u32 H, u32 K, u32 V,        \
        float lb, u32 use_lb, float scale) {                                                   \
        kda_recurrent_impl<T, 64>(q, k, v, a, b, a_log, dt_bias, state, o, desc, H, K, V, lb,  \
                                  use_lb, scale);                                              \
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
