// Paged attention with the gpt-oss extras (dayone_backend::AttentionOptions): a sliding window
// (a query at position p sees keys p + 1 - window ..= p; window 0: all) and per-head sink
// logits (one more logit per softmax row, taking mass, adding no value). A plain kernel: one
// block of 128 threads per (head, token); keys in tiles of 128, each thread scoring one key,
// online softmax (Milakov & Gimelshein 2018) over the tiles; each thread owns output dims
// tid + 128 e (hd_v <= 512). f32 arithmetic. Needs hd_k <= 512.

#define AX_THREADS 128

__device__ __forceinline__ float ax_block_max(float v, float* red) {
    v = warp_max(v);
    const u32 w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float r = red[0];
#pragma unroll
    for (int i = 1; i < AX_THREADS / 32; i++) r = fmaxf(r, red[i]);
    return r;
}

__device__ __forceinline__ float ax_block_sum(float v, float* red) {
    v = warp_sum(v);
    const u32 w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float r = 0.f;
#pragma unroll
    for (int i = 0; i < AX_THREADS / 32; i++) r += red[i];
    return r;
}

template <typename T>
__device__ void attn_ext_impl(const T* q, const T* kc, const T* vc, const u32* positions,
                              const u32* token_seq, const u32* block_tables, const float* sinks,
                              T* out, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs, u32 max_blocks,
                              float scale, u32 window) {
    grid_dep_wait();
    __shared__ float qs[512];
    __shared__ float ps[AX_THREADS];
    __shared__ u32 slots[AX_THREADS];
    __shared__ float red[AX_THREADS / 32];
    const u32 hh = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const u32 s = token_seq[t];
    const u32 nkeys = positions[t] + 1;
    const u32 g = hh / (h / hkv);
    for (u32 i = tid; i < hdk; i += AX_THREADS) qs[i] = to_f(q[((u64)t * h + hh) * hdk + i]);
    float m = -3.0e38f, l = 0.f;
    if (sinks) {
        m = sinks[hh];
        l = 1.f;
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const u32 first = (window > 0 && nkeys > window) ? nkeys - window : 0;
    __syncthreads();
    for (u32 j0 = first; j0 < nkeys; j0 += AX_THREADS) {
        const u32 j = j0 + tid;
        float sc = -3.0e38f;
        if (j < nkeys) {
            const u32 slot = block_tables[(u64)s * max_blocks + j / bs] * bs + j % bs;
            slots[tid] = slot;
            const T* kr = kc + ((u64)slot * hkv + g) * hdk;
            float d = 0.f;
            for (u32 i = 0; i < hdk; i++) d = fmaf(qs[i], to_f(kr[i]), d);
            sc = d * scale;
        }
        const float mn = fmaxf(m, ax_block_max(sc, red));
        const float p = j < nkeys ? expf(sc - mn) : 0.f;
        ps[tid] = p;
        const float corr = expf(m - mn);
        l = l * corr + ax_block_sum(p, red);
#pragma unroll
        for (int e = 0; e < 4; e++) acc[e] *= corr;
        const u32 cnt = min((u32)AX_THREADS, nkeys - j0);
        for (u32 i = 0; i < cnt; i++) {
            const float pi = ps[i];
            const T* vr = vc + ((u64)slots[i] * hkv + g) * hdv;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const u32 d = tid + AX_THREADS * e;
                if (d < hdv) acc[e] = fmaf(pi, to_f(vr[d]), acc[e]);
            }
        }
        m = mn;
        __syncthreads();
    }
    T* o = out + ((u64)t * h + hh) * hdv;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const u32 d = tid + AX_THREADS * e;
        if (d < hdv) o[d] = from_f<T>(acc[e] / l);
    }
}

#define ATTN_EXT(S, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(AX_THREADS) attn_ext_##S(                    \
        const T* q, const T* kc, const T* vc, const u32* positions, const u32* token_seq,     \
        const u32* block_tables, const float* sinks, T* out, u32 h, u32 hkv, u32 hdk, u32 hdv, \
        u32 bs, u32 max_blocks, float scale, u32 window) {                                    \
        attn_ext_impl<T>(q, kc, vc, positions, token_seq, block_tables, sinks, out, h, hkv,   \
                         hdk, hdv, bs, max_blocks, scale, window);                            \
    }
DAYONE_FOR_FLOAT_TYPES(ATTN_EXT)
