// DeepSeek-V3 routing of tokens t0, t0 + stride, … < n over f32 logits [N, E] (Liu et al. 2024
// §2.1.2; HF `DeepseekV3TopkRouter`): sigmoid scores, the choice score + bias, the topk_group
// best groups by the sum of their two best choice scores, the k best choices among them; the
// weights are the sigmoid scores (normalised when `norm`) times `scale`. One block (256
// threads); dynamic smem 2·E + 2·G words + k. Ranks (count of better entries, ties by lower
// index) give exact, order-independent top-k and top-group choices. The logits are read through
// L2 (`__ldcg`): the router GEMV's last block reads what the other blocks just wrote.
// Shared by the `moe` family (moe_topk) and the `gemv` family (the router GEMV + top-k launch).
#define MOE_NEG_INF (-__int_as_float(0x7f800000))
// The rank of c[i] among c[0 .. e): entries greater, or equal at a lower index. A thread's
// e comparisons read shared memory four entries at a time (when e % 4 == 0, so c + e stays
// 16-byte aligned) with several loads in flight: one entry per loop trip left the top-k's
// single block waiting on shared-memory latency e times (≈ 4 µs at E = 256).
__device__ __forceinline__ u32 moe_rank(const float* c, u32 e, u32 i) {
    const float v = c[i];
    u32 rank = 0;
    if ((e & 3u) == 0 && (reinterpret_cast<size_t>(c) & 15u) == 0) {
        const float4* c4 = reinterpret_cast<const float4*>(c);
#pragma unroll 4
        for (u32 j4 = 0; j4 < e / 4; j4++) {
            const float4 q = c4[j4];
            const u32 j = 4 * j4;
            rank += (q.x > v || (q.x == v && j < i)) ? 1u : 0u;
            rank += (q.y > v || (q.y == v && j + 1 < i)) ? 1u : 0u;
            rank += (q.z > v || (q.z == v && j + 2 < i)) ? 1u : 0u;
            rank += (q.w > v || (q.w == v && j + 3 < i)) ? 1u : 0u;
        }
    } else {
#pragma unroll 8
        for (u32 j = 0; j < e; j++) rank += (c[j] > v || (c[j] == v && j < i)) ? 1u : 0u;
    }
    return rank;
}
__device__ __forceinline__ void moe_topk_tokens(const float* logits, const float* __restrict__ bias,
                                                u32* __restrict__ ids, float* __restrict__ weights,
                                                u32 n, u32 e, u32 k, u32 g, u32 topk_group,
                                                u32 norm, float scale, u32 t0, u32 stride) {
    extern __shared__ float moe_topk_sm[];
    float* s = moe_topk_sm;   // [E] sigmoid scores
    float* c = s + e;         // [E] choice scores
    float* gs = c + e;        // [G] group scores
    u32* keep = reinterpret_cast<u32*>(gs + g);  // [G]
    u32* sel = keep + g;                          // [k]
    const u32 tid = threadIdx.x;
    const u32 per = e / g;
    for (u32 t = t0; t < n; t += stride) {
        __syncthreads();
        for (u32 i = tid; i < e; i += blockDim.x) {
            const float l = __ldcg(logits + (u64)t * e + i);
            const float sv = 1.f / (1.f + expf(-l));
            s[i] = sv;
            c[i] = sv + (bias ? bias[i] : 0.f);
        }
        __syncthreads();
        if (g > 1) {
            for (u32 gi = tid; gi < g; gi += blockDim.x) {
                float m1 = MOE_NEG_INF, m2 = MOE_NEG_INF;
                for (u32 i = gi * per; i < (gi + 1) * per; i++) {
                    const float v = c[i];
                    if (v > m1) {
                        m2 = m1;
                        m1 = v;
                    } else if (v > m2) {
                        m2 = v;
                    }
                }
                gs[gi] = per >= 2 ? m1 + m2 : m1;
            }
            __syncthreads();
            for (u32 gi = tid; gi < g; gi += blockDim.x) {
                const float v = gs[gi];
                u32 rank = 0;
                for (u32 j = 0; j < g; j++) rank += (gs[j] > v || (gs[j] == v && j < gi)) ? 1u : 0u;
                keep[gi] = rank < topk_group ? 1u : 0u;
            }
            __syncthreads();
            for (u32 i = tid; i < e; i += blockDim.x)
                if (!keep[i / per]) c[i] = MOE_NEG_INF;
            __syncthreads();
        }
        for (u32 i = tid; i < e; i += blockDim.x) {
            const u32 rank = moe_rank(c, e, i);
            if (rank < k) sel[rank] = i;
        }
        __syncthreads();
        if (tid == 0) {
            float sum = 0.f;
            for (u32 j = 0; j < k; j++) sum += s[sel[j]];
            for (u32 j = 0; j < k; j++) {
                float wv = s[sel[j]];
                if (norm) wv /= sum + 1e-20f;
                ids[(u64)t * k + j] = sel[j];
                weights[(u64)t * k + j] = wv * scale;
            }
        }
    }
}
