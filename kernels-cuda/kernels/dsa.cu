// DeepSeek-V3.2 sparse attention (DSA; DeepSeek-V3.2 report, HF `DeepseekV32Indexer`):
// LayerNorm (the indexer's key norm), the lightning-indexer scores and the per-query top-k.
//
// The top-k runs in two kernels per group of query tokens so that no [queries × keys] score
// matrix of the whole step is ever held: `dsa_score_*` writes the group's scores
// [group, stride] f32 (stride = the step's longest causal key count rounded up to 4), and
// `dsa_select` picks each row's top-k with a radix select (four 8-bit passes over
// order-preserving u32 keys); the selection is left unsorted (attention does not need order).

// ---------------------------------------------------------------------------------------------
// LayerNorm (Ba et al. 2016; torch nn.LayerNorm), f32 math, biased variance, two passes over
// the row (mean, then centred sum of squares: exact for rows with a large mean).
// x, y [R, D] T; w, b [D] T or f32 (w_f32). grid.x = R (grid-stride), block 256.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // red is free (previous use finished)
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.f;
    return warp_sum(t);
}

template <typename T>
__device__ __forceinline__ void layer_norm_impl(const T* __restrict__ x, const void* __restrict__ w,
                                                const void* __restrict__ b, u32 w_f32,
                                                T* __restrict__ y, u32 rows, u32 d, float eps) {
    __shared__ float red[32];
    grid_dep_wait();
    const u32 tid = threadIdx.x;
    const float* wf = reinterpret_cast<const float*>(w);
    const float* bf = reinterpret_cast<const float*>(b);
    const T* wt = reinterpret_cast<const T*>(w);
    const T* bt = reinterpret_cast<const T*>(b);
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (u64)r * d;
        float s = 0.f;
        for (u32 j = tid; j < d; j += blockDim.x) s += to_f(xr[j]);
        const float mean = block_sum(s, red) / (float)d;
        float v = 0.f;
        for (u32 j = tid; j < d; j += blockDim.x) {
            const float c = to_f(xr[j]) - mean;
            v += c * c;
        }
        const float inv = rsqrtf(block_sum(v, red) / (float)d + eps);
        T* yr = y + (u64)r * d;
        for (u32 j = tid; j < d; j += blockDim.x) {
            const float wj = w_f32 ? wf[j] : to_f(wt[j]);
            const float bj = w_f32 ? bf[j] : to_f(bt[j]);
            yr[j] = from_f<T>((to_f(xr[j]) - mean) * inv * wj + bj);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Indexer scores: for token n = tok0 + blockIdx.y and each position t ≤ positions[n] of its
// sequence, scores[blockIdx.y, t] = Σ_h w[n, h] · hscale · max(0, scale · q[n, h] · k_t), where
// k_t is cache row bt[t / bs] · bs + t % bs. Positions past the token are not written.

// Any dtype and shape (H · d + H ≤ 12288 floats of shared memory): a block of 128 threads per
// (token, 128 positions), one position per thread, heads in groups of 16 in registers.
// grid = (ceil(stride / 128), group), dynamic smem (H · d + H) f32.
template <typename T>
__device__ __forceinline__ void dsa_score_simple_impl(
    const T* __restrict__ q, const T* __restrict__ w, const T* __restrict__ kc,
    const u32* __restrict__ token_seq, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, float* __restrict__ scores, u32 tok0, u32 h, u32 d,
    u32 bs, u32 max_blocks, u32 num_blocks, u32 stride, float scale, float hscale) {
    extern __shared__ float sm[];
    float* sq = sm;          // [H, d]
    float* sw = sm + h * d;  // [H]
    grid_dep_wait();
    const u32 n = tok0 + blockIdx.y, p = positions[n];
    const u32 t0 = blockIdx.x * 128;
    if (t0 > p) return;
    for (u32 i = threadIdx.x; i < h * d; i += blockDim.x) sq[i] = to_f(q[(u64)n * h * d + i]);
    for (u32 i = threadIdx.x; i < h; i += blockDim.x) sw[i] = to_f(w[(u64)n * h + i]) * hscale;
    __syncthreads();
    const u32 t = t0 + threadIdx.x;
    if (t > p) return;
    const u32* bt = block_tables + (u64)token_seq[n] * max_blocks;
    float score = 0.f;
    const u32 blk = t / bs < max_blocks ? bt[t / bs] : 0xffffffffu;
    if (blk < num_blocks) {
        const T* k = kc + ((u64)blk * bs + t % bs) * d;
        for (u32 h0 = 0; h0 < h; h0 += 16) {
            float acc[16];
#pragma unroll
            for (int j = 0; j < 16; j++) acc[j] = 0.f;
            for (u32 c = 0; c < d; c++) {
                const float kv = to_f(k[c]);
#pragma unroll
                for (int j = 0; j < 16; j++)
                    if (h0 + j < h) acc[j] = fmaf(sq[(h0 + j) * d + c], kv, acc[j]);
            }
#pragma unroll
            for (int j = 0; j < 16; j++)
                if (h0 + j < h) score += sw[h0 + j] * fmaxf(scale * acc[j], 0.f);
        }
    }
    scores[(u64)blockIdx.y * stride + t] = score + 0.f;  // + 0: −0 → +0 (one order for ties)
}

// Tensor cores (bf16/f16, H ≤ 64, d ∈ 16ℤ, d ≤ 256): a block of 4 warps per (token, 256
// positions) in tiles of 64 keys; warp w computes S = Q·Kᵀ for heads 16w .. 16w + 15 × 64 keys
// (mma.sync m16n8k16), applies w_h · relu(scale · s) and sums its 16 heads with shuffles; the
// four warps' partial sums meet in shared memory. Heads ≥ H are zero rows.
// grid = (ceil(stride / 256), group), dynamic smem: Q [64][d + 8] T, K [64][d + 8] T, then the
// warps' partial sums [4][64] f32 (no static shared memory: the dynamic limit is raised to the
// device's opt-in maximum).
#define DSA_KT 64
#define DSA_KEYS_PER_BLOCK 256
template <typename T>
__device__ __forceinline__ void dsa_score_mma_impl(
    const T* __restrict__ q, const T* __restrict__ w, const T* __restrict__ kc,
    const u32* __restrict__ token_seq, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, float* __restrict__ scores, u32 tok0, u32 h, u32 d,
    u32 bs, u32 max_blocks, u32 num_blocks, u32 stride, float scale, float hscale) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u32 ds = d + 8;
    T* sq = reinterpret_cast<T*>(smem_raw);
    T* sk = sq + 64 * ds;
    float(*part)[DSA_KT] = reinterpret_cast<float(*)[DSA_KT]>(sk + DSA_KT * ds);
    grid_dep_wait();
    const u32 n = tok0 + blockIdx.y, p = positions[n];
    const u32 tb = blockIdx.x * DSA_KEYS_PER_BLOCK;
    if (tb > p) return;
    const u32 tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const u32 g = lane >> 2, t4 = lane & 3;
    const u32 dv = d / 8;
    for (u32 e = tid; e < 64 * dv; e += blockDim.x) {
        const u32 row = e / dv, c = (e % dv) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row < h) val = *reinterpret_cast<const uint4*>(q + ((u64)n * h + row) * d + c);
        *reinterpret_cast<uint4*>(sq + row * ds + c) = val;
    }
    // This thread's two rows' head weights (zero past H).
    const u32 r0 = wp * 16 + g, r1 = r0 + 8;
    const float w0 = r0 < h ? to_f(w[(u64)n * h + r0]) * hscale : 0.f;
    const float w1 = r1 < h ? to_f(w[(u64)n * h + r1]) * hscale : 0.f;
    const u32* bt = block_tables + (u64)token_seq[n] * max_blocks;
    const u32 tend = min(p + 1, tb + DSA_KEYS_PER_BLOCK);
    for (u32 kb = tb; kb < tend; kb += DSA_KT) {
        __syncthreads();  // sq written / previous tile consumed
        for (u32 e = tid; e < DSA_KT * dv; e += blockDim.x) {
            const u32 j = e / dv, c = (e % dv) * 8, t = kb + j;
            const T* src = kc;
            u32 bytes = 0;
            if (t < tend && t / bs < max_blocks) {
                const u32 blk = bt[t / bs];
                if (blk < num_blocks) {
                    src = kc + ((u64)blk * bs + t % bs) * d + c;
                    bytes = 16;
                }
            }
            cp_async16(smem_addr(sk + j * ds + c), src, bytes);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        float acc[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        for (u32 k0 = 0; k0 < d; k0 += 16) {
            u32 a[4];
            ldsm_x4(smem_addr(sq + (wp * 16 + (lane & 15)) * ds + k0 + (lane >> 4) * 8), a[0], a[1],
                    a[2], a[3]);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                u32 b0, b1, b2, b3;
                const u32 key = j * 16 + (lane & 7) + (lane >> 4) * 8;
                ldsm_x4(smem_addr(sk + key * ds + k0 + ((lane >> 3) & 1) * 8), b0, b1, b2, b3);
                Mma<T>::run(acc[2 * j], a, b0, b1);
                Mma<T>::run(acc[2 * j + 1], a, b2, b3);
            }
        }
        // acc[j][e]: row g (e < 2) or g + 8, key j·8 + 2·t4 + (e & 1).
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = w0 * fmaxf(scale * acc[j][e], 0.f) + w1 * fmaxf(scale * acc[j][e + 2], 0.f);
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                if (g == 0) part[wp][j * 8 + 2 * t4 + e] = v;
            }
        __syncthreads();
        if (tid < DSA_KT && kb + tid < tend) {
            const float v = ((part[0][tid] + part[1][tid]) + part[2][tid]) + part[3][tid];
            scores[(u64)blockIdx.y * stride + kb + tid] = v + 0.f;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Top-k of each score row: out[tok0 + y, ..] = the positions of the `topk` largest scores among
// 0 ..= positions[tok0 + y] (ties to the lower position), the ones above the threshold first, u32 max
// padding after them. One block of 1024 threads per row (grid.x = group); rows are read as
// float4 (stride ∈ 4ℤ). Radix select over order-preserving u32 keys in four 8-bit passes, then
// the keys above the threshold and the keys equal to it are written in position order.
#define DSA_SEL_THREADS 1024

// Order-preserving map of an f32 to u32 (larger float → larger key; +0 and −0 are one value).
__device__ __forceinline__ u32 dsa_key(float f) {
    const u32 b = __float_as_uint(f + 0.f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

extern "C" __global__ void __launch_bounds__(DSA_SEL_THREADS)
    dsa_select(const float* __restrict__ scores, const u32* __restrict__ positions,
               u32* __restrict__ out, u32 tok0, u32 stride, u32 topk) {
    __shared__ u32 hist[256];
    __shared__ u32 sh[4];  // bin, still-needed count, keys above written, equal keys seen
    __shared__ u32 wcount[DSA_SEL_THREADS / 32];
    grid_dep_wait();
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 n = tok0 + blockIdx.x;
    const u32 len = positions[n] + 1;
    u32* orow = out + (u64)n * topk;
    if (len <= topk) {
        for (u32 i = tid; i < topk; i += blockDim.x) orow[i] = i < len ? i : 0xffffffffu;
        return;
    }
    const float4* row4 = reinterpret_cast<const float4*>(scores + (u64)blockIdx.x * stride);
    const u32 len4 = (len + 3) / 4;
    // Keys of four consecutive positions (0 past the row: below every real key).
    auto keys4 = [&](u32 i, u32* k) {
        const float4 v = row4[i];
        const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++) k[e] = 4 * i + e < len ? dsa_key(f[e]) : 0u;
    };
    // After pass `shift`, `prefix` holds the top bits of the topk-th largest key and `need` how
    // many keys with exactly that prefix belong to the top-k.
    u32 prefix = 0, mask = 0, need = topk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (u32 i = tid; i < 256; i += blockDim.x) hist[i] = 0u;
        __syncthreads();
        for (u32 i = tid; i < len4; i += blockDim.x) {
            u32 k[4];
            keys4(i, k);
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (k[e] != 0u && (k[e] & mask) == prefix) atomicAdd(&hist[(k[e] >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (warp == 0) {
            // Bins from the top: lane j sums bins 255 − 8j .. 248 − 8j, then a suffix scan.
            u32 c = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) c += hist[255 - 8 * lane - e];
            u32 above = c;  // inclusive prefix over lanes 0 ..= lane
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u32 t = __shfl_up_sync(0xffffffffu, above, o);
                if (lane >= (u32)o) above += t;
            }
            const u32 before = above - c;
            const bool here = before < need && above >= need;
            if (here) {
                u32 acc = before;
                for (int e = 0; e < 8; e++) {
                    const u32 bin = 255 - 8 * lane - e;
                    if (acc + hist[bin] >= need) {
                        sh[0] = bin;
                        sh[1] = need - acc;
                        break;
                    }
                    acc += hist[bin];
                }
            }
        }
        __syncthreads();
        prefix |= sh[0] << shift;
        mask |= 255u << shift;
        need = sh[1];
        __syncthreads();  // sh is rewritten by the next pass
    }
    if (tid == 0) {
        sh[2] = 0u;
        sh[3] = 0u;
    }
    __syncthreads();
    // Both parts in position order with block-wide running counts (four positions per thread
    // per round): the keys above the threshold fill out[0 ..), the `need` lowest-positioned keys
    // equal to it fill out[topk − need ..). A fixed order matters: the sparse attention sums
    // over the selection in the order it is listed, so an atomic append would change the
    // attention's last bits from run to run.
    for (u32 base = 0; base < len4; base += blockDim.x) {
        const u32 i = base + tid;
        u32 k[4] = {0u, 0u, 0u, 0u};
        if (i < len4) keys4(i, k);
        u32 gt = 0, eq = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            gt += k[e] > prefix ? 1u : 0u;
            eq += k[e] == prefix ? 1u : 0u;
        }
        // Exclusive prefixes of `gt` and `eq` over the block, in thread order (packed in one
        // word: each count is at most 4 · 1024 < 2^16).
        const u32 both = (gt << 16) | eq;
        u32 incl = both;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= (u32)o) incl += t;
        }
        if (lane == 31) wcount[warp] = incl;
        __syncthreads();
        u32 excl = incl - both;
        for (u32 w = 0; w < warp; w++) excl += wcount[w];
        u32 before_gt = sh[2] + (excl >> 16), before = sh[3] + (excl & 0xffffu);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (k[e] > prefix) orow[before_gt++] = 4 * i + e;
            if (k[e] == prefix) {
                if (before < need) orow[topk - need + before] = 4 * i + e;
                before++;
            }
        }
        __syncthreads();
        if (tid == 0) {
            u32 total = 0;
            for (u32 w = 0; w < blockDim.x / 32; w++) total += wcount[w];
            sh[2] += total >> 16;
            sh[3] += total & 0xffffu;
        }
        __syncthreads();
        // Done when both parts are complete (uniform: every thread reads the same values).
        if (sh[3] >= need && sh[2] + need >= topk) break;
    }
}

#define DSA_FLOAT(S, T)                                                                       \
    extern "C" __global__ void layer_norm_##S(const T* x, const void* w, const void* b,      \
                                              u32 w_f32, T* y, u32 rows, u32 d, float eps) { \
        layer_norm_impl<T>(x, w, b, w_f32, y, rows, d, eps);                                  \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) dsa_score_simple_##S(                   \
        const T* q, const T* w, const T* kc, const u32* token_seq, const u32* positions,      \
        const u32* block_tables, float* scores, u32 tok0, u32 h, u32 d, u32 bs,               \
        u32 max_blocks, u32 num_blocks, u32 stride, float scale, float hscale) {              \
        dsa_score_simple_impl<T>(q, w, kc, token_seq, positions, block_tables, scores, tok0,  \
                                 h, d, bs, max_blocks, num_blocks, stride, scale, hscale);    \
    }
DAYONE_FOR_FLOAT_TYPES(DSA_FLOAT)

#define DSA_MMA(S, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(128) dsa_score_mma_##S(                      \
        const T* q, const T* w, const T* kc, const u32* token_seq, const u32* positions,      \
        const u32* block_tables, float* scores, u32 tok0, u32 h, u32 d, u32 bs,               \
        u32 max_blocks, u32 num_blocks, u32 stride, float scale, float hscale) {              \
        dsa_score_mma_impl<T>(q, w, kc, token_seq, positions, block_tables, scores, tok0, h,  \
                              d, bs, max_blocks, num_blocks, stride, scale, hscale);          \
    }
#if defined(DAYONE_ONLY_BF16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_F16))
DSA_MMA(bf16, bf16)
#endif
#if defined(DAYONE_ONLY_F16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_BF16))
DSA_MMA(f16, f16)
#endif
