// MLA (DeepSeek-V2/V3 multi-head latent attention, absorbed form; DeepSeek-V2 report §2.1.2):
// the paged latent cache write and attention over it.
//
// Cache layout: [blocks, bs, W] with W = L + R; row `slot` holds one token's [c_kv (L) | k_pe (R)].
// Every query head reads the same row, so the kernels load a row once per block of heads.

#define MLA_NEG_INF (-__int_as_float(0x7f800000))

// cache[slots[i], col .. col + w] = x[i, 0 .. w]. grid.x = N tokens (grid-stride), block 128.
// Slots >= num_slots (padding) are skipped.
template <typename T>
__device__ __forceinline__ void write_cache_impl(const T* __restrict__ x, T* __restrict__ cache,
                                                 const u32* __restrict__ slots, u32 n, u32 w,
                                                 u32 width, u32 col, u32 num_slots) {
    grid_dep_wait();
    for (u32 i = blockIdx.x; i < n; i += gridDim.x) {
        const u32 slot = slots[i];
        if (slot >= num_slots) continue;
        T* dst = cache + (u64)slot * width + col;
        const T* src = x + (u64)i * w;
        for (u32 j = threadIdx.x; j < w; j += blockDim.x) dst[j] = src[j];
    }
}

// Generic latent attention (any dtype, any L ≤ 1024, any R): one block of 128 threads per
// (token, head) row, keys in tiles of 64 (a warp per key dot product), online softmax in f32.
// grid.x = N · H (grid-stride), dynamic smem = (L + R) floats (the query row).
// Dense (`sel` null): the row's keys are positions 0 ..= its position. Sparse (DSA): the keys
// are the positions listed in sel[token, 0 .. topk] (entries past the position or u32 max skip).
template <typename T>
__device__ __forceinline__ void mla_attn_simple_impl(
    const T* __restrict__ q_lat, const T* __restrict__ q_rope, const T* __restrict__ cache,
    const u32* __restrict__ token_seq, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, const u32* __restrict__ sel, u32 topk,
    T* __restrict__ out, u32 n, u32 h, u32 l, u32 r, u32 bs, u32 max_blocks, u32 num_blocks,
    float scale_log2) {
    extern __shared__ float sq[];
    __shared__ float ssc[64];
    __shared__ u32 srow[64];
    grid_dep_wait();
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 wdt = l + r;
    for (u64 row = blockIdx.x; row < (u64)n * h; row += gridDim.x) {
        const u32 tok = (u32)(row / h);
        __syncthreads();  // previous row done with sq
        for (u32 d = tid; d < l; d += blockDim.x) sq[d] = to_f(q_lat[row * l + d]);
        for (u32 d = tid; d < r; d += blockDim.x) sq[l + d] = to_f(q_rope[row * r + d]);
        const u32 s = token_seq[tok], pos = positions[tok];
        const u32 kv_end = sel ? topk : min(pos + 1, max_blocks * bs);
        const u32* bt = block_tables + (u64)s * max_blocks;
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = 0.f;
        float m = MLA_NEG_INF, lsum = 0.f;
        for (u32 kb = 0; kb < kv_end; kb += 64) {
            __syncthreads();  // sq written / previous tile consumed
            for (u32 j = warp; j < 64; j += 4) {
                u32 key = kb + j;
                float dot = MLA_NEG_INF;
                u32 slot = 0xffffffffu;
                bool ok = key < kv_end;
                if (ok && sel) {
                    key = sel[(u64)tok * topk + key];
                    ok = key <= pos && key < max_blocks * bs;
                }
                if (ok) {
                    const u32 blk = bt[key / bs];
                    if (blk < num_blocks) {
                        slot = blk * bs + key % bs;
                        const T* c = cache + (u64)slot * wdt;
                        float p = 0.f;
                        for (u32 d = lane; d < wdt; d += 32) p = fmaf(sq[d], to_f(c[d]), p);
                        dot = warp_sum(p) * scale_log2;
                    }
                }
                if (lane == 0) {
                    ssc[j] = dot;
                    srow[j] = slot;
                }
            }
            __syncthreads();
            float mx = m;
            for (u32 j = 0; j < 64; j++) mx = fmaxf(mx, ssc[j]);
            if (mx == MLA_NEG_INF) continue;
            const float corr = exp2f(m - mx);
            m = mx;
            lsum *= corr;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[i] *= corr;
            for (u32 j = 0; j < 64; j++) {
                if (srow[j] == 0xffffffffu) continue;
                const float p = exp2f(ssc[j] - m);
                lsum += p;
                const T* c = cache + (u64)srow[j] * wdt;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const u32 d = tid + i * 128;
                    if (d < l) acc[i] = fmaf(p, to_f(c[d]), acc[i]);
                }
            }
        }
        const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 d = tid + i * 128;
            if (d < l) out[row * l + d] = from_f<T>(acc[i] * inv);
        }
    }
}

// Tensor-core latent attention (bf16/f16; L % 16 == 0, R % 16 == 0, L ≤ DV).
//
// Dense (`sel` null): rows of a sequence are (query token, head) pairs, row = tok_local · H +
// head; a block owns 64 consecutive rows of one sequence (grid.x), one split of the key range
// (grid.y: keys [split · chunk, (split + 1) · chunk)) and one sequence (grid.z).
// Sparse (DSA, `sel` [N, topk]): a block owns 64 heads of one query token (grid.z = token) and
// key j of its range is position sel[token, j] (u32 max and positions past the token's skip);
// every head of the token shares the selection, so latent rows are still loaded once per block. 8 warps: warp w owns rows
// 16·(w & 3) .. + 16 and output dims (w >> 2) · DV/2 .. + DV/2. Per tile of 32 keys (cp.async,
// double-buffered; a latent row is loaded once for all 64 rows):
//   S = Q·Kᵀ [64 × 32] (mma.sync m16n8k16; warp w computes keys 16·(w >> 2) .. + 16 of its rows),
//   S goes through shared memory so both dim-halves see all 32 keys; online softmax in f32
//   (exp2, scale folded into scale_log2); O += P·V with V = the first L columns of the same rows.
// nsplit == 1: out [N, H, L] normalised; else part_o [N·H, nsplit, L] (normalised per split) and
// part_ml [N·H, nsplit, 2] = (max in log2 units, sum) for `attn_combine_*` (attention_paged.cu).
// Dynamic smem: Q [64][W + 8] T, K [2][32][W + 8] T, S [64][36] f32, ok [2][32] u32.
#define MLA_ROWS 64
#define MLA_BK 32
#define MLA_SS 36
template <typename T, int DV>
__device__ __forceinline__ void mla_attn_mma_impl(
    const T* __restrict__ q_lat, const T* __restrict__ q_rope, const T* __restrict__ cache,
    const u32* __restrict__ query_start, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, const u32* __restrict__ token_seq,
    const u32* __restrict__ sel, u32 topk, T* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_ml, u32 h, u32 l, u32 r, u32 bs, u32 max_blocks, u32 num_blocks,
    u32 chunk, u32 nsplit, float scale_log2) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u32 wdt = l + r, ws = wdt + 8;
    T* sq = reinterpret_cast<T*>(smem_raw);
    T* sk = sq + MLA_ROWS * ws;
    float* ss = reinterpret_cast<float*>(sk + 2 * MLA_BK * ws);
    u32* sok = reinterpret_cast<u32*>(ss + MLA_ROWS * MLA_SS);

    const u32 split = blockIdx.y;
    u32 s, q0, nrows;
    if (sel) {
        q0 = blockIdx.z;
        s = token_seq[q0];
        nrows = h;
    } else {
        s = blockIdx.z;
        q0 = query_start[s];
        nrows = (query_start[s + 1] - q0) * h;
    }
    const u32 row0 = blockIdx.x * MLA_ROWS;
    if (row0 >= nrows) return;
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const u32 rg = w & 3, dh = w >> 2;
    const u32 g = lane >> 2, t4 = lane & 3;

    // Key range of this block: positions of its rows, capped by the table and the split.
    u32 kv_end = 0;
    if (sel) {
        kv_end = topk;
    } else {
        const u32 tfirst = row0 / h, tlast = min(row0 + MLA_ROWS, nrows) - 1;
        for (u32 t = tfirst; t <= tlast / h; t++) kv_end = max(kv_end, positions[q0 + t] + 1);
        kv_end = min(kv_end, max_blocks * bs);
    }
    const u32 k_begin = split * chunk;
    const u32 k_end = min(kv_end, k_begin + chunk);

    u32 rpos[2];
    bool rvalid[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const u32 rr = row0 + rg * 16 + g + 8 * i;
        rvalid[i] = rr < nrows;
        rpos[i] = rvalid[i] ? positions[q0 + rr / h] : 0;
    }
    const u32 dbase = dh * (DV / 2);
    constexpr int NT = DV / 16;  // n-tiles of 8 dims per warp
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {MLA_NEG_INF, MLA_NEG_INF}, lsum[2] = {0.f, 0.f};

    if (k_begin < k_end) {
        // Q rows (zeros past the sequence's rows).
        const u32 lv = l / 8, rv = r / 8;
        for (u32 e = tid; e < MLA_ROWS * (lv + rv); e += blockDim.x) {
            const u32 rr = e / (lv + rv), c = e % (lv + rv);
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            const u64 grow = (u64)q0 * h + row0 + rr;
            if (row0 + rr < nrows)
                val = c < lv ? *reinterpret_cast<const uint4*>(q_lat + grow * l + c * 8)
                             : *reinterpret_cast<const uint4*>(q_rope + grow * r + (c - lv) * 8);
            *reinterpret_cast<uint4*>(sq + rr * ws + c * 8) = val;
        }
        const u32* bt = block_tables + (u64)s * max_blocks;
        const u32 wv = wdt / 8;
        // Position of key `key` of this block's range, or u32 max when it has none.
        auto key_pos = [&](u32 key) -> u32 {
            if (key >= k_end) return 0xffffffffu;
            const u32 p = sel ? sel[(u64)q0 * topk + key] : key;
            return (p < max_blocks * bs && bt[p / bs] < num_blocks) ? p : 0xffffffffu;
        };
        auto load_tile = [&](u32 kb, u32 st) {
            T* dst = sk + st * MLA_BK * ws;
            for (u32 e = tid; e < MLA_BK * wv; e += blockDim.x) {
                const u32 j = e / wv, c = (e % wv) * 8, p = key_pos(kb + j);
                const T* src = cache;
                u32 bytes = 0;
                if (p != 0xffffffffu) {
                    src = cache + ((u64)bt[p / bs] * bs + p % bs) * wdt + c;
                    bytes = 16;
                }
                cp_async16(smem_addr(dst + j * ws + c), src, bytes);
            }
            // sok: the key's position (u32 max: none), for the causal test below.
            if (tid < MLA_BK) sok[st * MLA_BK + tid] = key_pos(kb + tid);
        };
        const u32 ntiles = (k_end - k_begin + MLA_BK - 1) / MLA_BK;
        load_tile(k_begin, 0);
        cp_async_commit();
        for (u32 t = 0; t < ntiles; t++) {
            const u32 kb = k_begin + t * MLA_BK, st = t & 1;
            if (t + 1 < ntiles) load_tile(kb + MLA_BK, st ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();
            const T* kt = sk + st * MLA_BK * ws;
            // S for rows rg·16.., keys dh·16 .. + 16.
            float sc[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
            for (u32 k0 = 0; k0 < wdt; k0 += 16) {
                u32 a[4], b0, b1, b2, b3;
                ldsm_x4(smem_addr(sq + (rg * 16 + (lane & 15)) * ws + k0 + (lane >> 4) * 8), a[0],
                        a[1], a[2], a[3]);
                const u32 key = dh * 16 + (lane & 7) + (lane >> 4) * 8;
                ldsm_x4(smem_addr(kt + key * ws + k0 + ((lane >> 3) & 1) * 8), b0, b1, b2, b3);
                Mma<T>::run(sc[0], a, b0, b1);
                Mma<T>::run(sc[1], a, b2, b3);
            }
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    ss[(rg * 16 + g + 8 * (e >> 1)) * MLA_SS + dh * 16 + j * 8 + t4 * 2 + (e & 1)] =
                        sc[j][e];
            __syncthreads();
            // All 32 keys of this warp's rows, in accumulator layout.
            float p4[4][4];
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    const u32 kj = j * 8 + t4 * 2 + (e & 1);
                    const bool ok = rvalid[i] && sok[st * MLA_BK + kj] <= rpos[i];
                    const float v = ss[(rg * 16 + g + 8 * i) * MLA_SS + kj];
                    p4[j][e] = ok ? v * scale_log2 : MLA_NEG_INF;
                    mx[i] = fmaxf(mx[i], p4[j][e]);
                }
            float corr[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                corr[i] = mx[i] == MLA_NEG_INF ? 1.f : exp2f(m[i] - mx[i]);
                m[i] = mx[i];
                lsum[i] *= corr[i];
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                o[j][0] *= corr[0];
                o[j][1] *= corr[0];
                o[j][2] *= corr[1];
                o[j][3] *= corr[1];
            }
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    const float p = p4[j][e] == MLA_NEG_INF ? 0.f : exp2f(p4[j][e] - m[i]);
                    p4[j][e] = p;
                    lsum[i] += p;
                }
            // O += P·V over this warp's dims.
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                u32 a[4];
                a[0] = Mma<T>::pack(p4[2 * kk][0], p4[2 * kk][1]);
                a[1] = Mma<T>::pack(p4[2 * kk][2], p4[2 * kk][3]);
                a[2] = Mma<T>::pack(p4[2 * kk + 1][0], p4[2 * kk + 1][1]);
                a[3] = Mma<T>::pack(p4[2 * kk + 1][2], p4[2 * kk + 1][3]);
                const u32 key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
                for (int jd = 0; jd < NT / 2; jd++) {
                    if (dbase + jd * 16 >= l) break;
                    u32 b0, b1, b2, b3;
                    ldsm_x4_t(smem_addr(kt + key * ws + dbase + jd * 16 + (lane >> 4) * 8), b0, b1,
                              b2, b3);
                    Mma<T>::run(o[2 * jd], a, b0, b1);
                    Mma<T>::run(o[2 * jd + 1], a, b2, b3);
                }
            }
            __syncthreads();  // stage st and ss consumed before they are overwritten
        }
        cp_async_wait<0>();
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 1);
        lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!rvalid[i]) continue;
        const u64 grow = (u64)q0 * h + row0 + rg * 16 + g + 8 * i;
        const float inv = lsum[i] > 0.f ? 1.f / lsum[i] : 0.f;
        if (nsplit == 1) {
            T* orow = out + grow * l;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const u32 d = dbase + j * 8 + t4 * 2;
                if (d < l) {
                    orow[d] = from_f<T>(o[j][2 * i] * inv);
                    orow[d + 1] = from_f<T>(o[j][2 * i + 1] * inv);
                }
            }
        } else {
            float* prow = part_o + (grow * nsplit + split) * l;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const u32 d = dbase + j * 8 + t4 * 2;
                if (d < l) *reinterpret_cast<float2*>(prow + d) = make_float2(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
            }
            if (dh == 0 && t4 == 0) {
                part_ml[(grow * nsplit + split) * 2] = m[i];
                part_ml[(grow * nsplit + split) * 2 + 1] = lsum[i];
            }
        }
    }
}

#define MLA_COMMON(S, T)                                                                      \
    extern "C" __global__ void write_cache_##S(const T* x, T* cache, const u32* slots, u32 n, \
                                               u32 w, u32 width, u32 col, u32 num_slots) {    \
        write_cache_impl<T>(x, cache, slots, n, w, width, col, num_slots);                    \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) mla_attn_simple_##S(                    \
        const T* q_lat, const T* q_rope, const T* cache, const u32* token_seq,                \
        const u32* positions, const u32* block_tables, const u32* sel, u32 topk, T* out,      \
        u32 n, u32 h, u32 l, u32 r, u32 bs, u32 max_blocks, u32 num_blocks,                   \
        float scale_log2) {                                                                   \
        mla_attn_simple_impl<T>(q_lat, q_rope, cache, token_seq, positions, block_tables, sel, \
                                topk, out, n, h, l, r, bs, max_blocks, num_blocks,            \
                                scale_log2);                                                  \
    }
DAYONE_FOR_FLOAT_TYPES(MLA_COMMON)

#define MLA_MMA(S, T, DV)                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 1) mla_attn_mma_##S##_d##DV(            \
        const T* q_lat, const T* q_rope, const T* cache, const u32* query_start,              \
        const u32* positions, const u32* block_tables, const u32* token_seq, const u32* sel,  \
        u32 topk, T* out, float* part_o, float* part_ml, u32 h, u32 l, u32 r, u32 bs,         \
        u32 max_blocks, u32 num_blocks, u32 chunk, u32 nsplit, float scale_log2) {            \
        grid_dep_wait();                                                                      \
        mla_attn_mma_impl<T, DV>(q_lat, q_rope, cache, query_start, positions, block_tables,  \
                                 token_seq, sel, topk, out, part_o, part_ml, h, l, r, bs,     \
                                 max_blocks, num_blocks, chunk, nsplit, scale_log2);          \
    }
#if defined(DAYONE_ONLY_BF16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_F16))
MLA_MMA(bf16, bf16, 128) MLA_MMA(bf16, bf16, 256) MLA_MMA(bf16, bf16, 512)
#endif
#if defined(DAYONE_ONLY_F16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_BF16))
MLA_MMA(f16, f16, 128) MLA_MMA(f16, f16, 256) MLA_MMA(f16, f16, 512)
#endif
