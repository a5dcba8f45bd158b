// Causal attention over a paged KV cache (PagedAttention, Kwon et al. 2023), softmax in f32.
//
// Shapes (row-major): q [N, H, hdk]; k_cache [blocks, bs, Hkv, hdk]; v_cache [blocks, bs, Hkv, hdv];
// out [N, H, hdv]. Query token n of sequence s = token_seq[n] at position p = positions[n] attends
// to keys 0..=p of s, found through block_tables[s, j / bs]. GQA: query head hq reads KV head
// hq / (H / Hkv). Scores are kept in the log2 domain: q is pre-multiplied by scale * log2(e) and
// exp2 is used (the same softmax, one multiply fewer per key).
//
// Three kernels:
//  * attn_decode_*: one query token per block row, key range split over grid.x (flash-decoding):
//    each block handles (split, KV head, token) and GB query heads of that KV head, so keys and
//    values are read once for the whole GQA group. TPK threads share one key (8 elements each,
//    16-byte loads); a 128-thread block handles 128/TPK keys at once, UNR of them unrolled.
//    With nsplit == 1 the block writes the output; otherwise it writes a normalised partial
//    output and (max, sum) that attn_combine_* merges.
//  * attn_combine_*: merges the splits of each (token, head).
//  * attn_tiled_*: many query tokens per sequence (prefill, chunked prefill, mixed steps):
//    a block takes up to 32 (token, head) rows of one sequence sharing one KV head, walks the
//    keys in tiles of 32 staged in shared memory as f32, one warp per 8 rows, one lane per key
//    for the scores and 32·VPL value dims per row; online softmax per row.

#define LOG2E_F 1.4426950408889634f
#define NEG_INF_F (-__int_as_float(0x7f800000))

template <typename T, int TPK, int GB>
__device__ __forceinline__ void attn_decode_impl(
    const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
    const u32* __restrict__ token_seq, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, T* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_ml, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs, u32 max_blocks,
    u32 num_blocks, u32 chunk, u32 nsplit, float scale_log2) {
    constexpr int NT = 128;
    constexpr int NSUB = NT / TPK;
    constexpr int UNR = 4;
    __shared__ float sm_ml[NSUB][GB][2];
    __shared__ float sm_acc[NSUB][GB][TPK * 8];

    const u32 n = blockIdx.z;
    const u32 gq = h / hkv;
    const u32 gchunks = (gq + GB - 1) / GB;
    const u32 kvh = blockIdx.y / gchunks;
    const u32 gc = blockIdx.y % gchunks;
    const u32 h0 = kvh * gq + gc * GB;
    const u32 ng = min((u32)GB, gq - gc * GB);
    const u32 split = blockIdx.x;
    const u32 s = token_seq[n];
    const u32 kv_len = min(positions[n] + 1, max_blocks * bs);
    const u32 start = split * chunk;
    const u32 end = min(start + chunk, kv_len);
    const u32 tid = threadIdx.x, sub = tid / TPK, t = tid % TPK;
    const u32 d0 = t * 8;
    const bool kact = d0 < hdk, vact = d0 < hdv;

    float qf[GB][8];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        if (g < (int)ng && kact) {
            Vec8<T> v;
            v.load(q + ((u64)n * h + h0 + g) * hdk + d0);
            v.to_float(qf[g]);
#pragma unroll
            for (int i = 0; i < 8; i++) qf[g][i] *= scale_log2;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) qf[g][i] = 0.f;
        }
    }
    float m[GB], l[GB], acc[GB][8];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = NEG_INF_F;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[g][i] = 0.f;
    }

    const u32* bt = block_tables + (u64)s * max_blocks;
    for (u32 base = start; base < end; base += NSUB * UNR) {
        Vec8<T> kv[UNR], vv[UNR];
        bool valid[UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const u32 j = base + u * NSUB + sub;
            valid[u] = j < end;
            u32 blk = 0;
            if (valid[u]) {
                blk = bt[j / bs];
                valid[u] = blk < num_blocks;
            }
            if (valid[u]) {
                const u64 row = ((u64)blk * bs + j % bs) * hkv + kvh;
                if (kact) kv[u].load(kc + row * hdk + d0); else kv[u].zero();
                if (vact) vv[u].load(vc + row * hdv + d0); else vv[u].zero();
            } else {
                kv[u].zero();
                vv[u].zero();
            }
        }
        float sc[GB][UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            float kf[8];
            kv[u].to_float(kf);
#pragma unroll
            for (int g = 0; g < GB; g++) {
                float dot = 0.f;
#pragma unroll
                for (int i = 0; i < 8; i++) dot = fmaf(qf[g][i], kf[i], dot);
#pragma unroll
                for (int o = TPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                sc[g][u] = valid[u] ? dot : NEG_INF_F;
            }
        }
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < UNR; u++) mx = fmaxf(mx, sc[g][u]);
            if (mx == NEG_INF_F) continue;
            const float corr = exp2f(m[g] - mx);
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[g][i] *= corr;
            m[g] = mx;
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            float vf[8];
            vv[u].to_float(vf);
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float p = sc[g][u] == NEG_INF_F ? 0.f : exp2f(sc[g][u] - m[g]);
                l[g] += p;
#pragma unroll
                for (int i = 0; i < 8; i++) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
            }
        }
    }

    // Merge the NSUB sub-groups of the block.
#pragma unroll
    for (int g = 0; g < GB; g++) {
        if (t == 0) {
            sm_ml[sub][g][0] = m[g];
            sm_ml[sub][g][1] = l[g];
        }
#pragma unroll
        for (int i = 0; i < 8; i++) sm_acc[sub][g][d0 + i] = acc[g][i];
    }
    __syncthreads();
    for (u32 e = tid; e < ng * hdv; e += NT) {
        const u32 g = e / hdv, d = e % hdv;
        float mm = NEG_INF_F;
#pragma unroll
        for (int sb = 0; sb < NSUB; sb++) mm = fmaxf(mm, sm_ml[sb][g][0]);
        float ll = 0.f, aa = 0.f;
        if (mm != NEG_INF_F) {
#pragma unroll
            for (int sb = 0; sb < NSUB; sb++) {
                const float ms = sm_ml[sb][g][0];
                if (ms == NEG_INF_F) continue;
                const float w = exp2f(ms - mm);
                ll += sm_ml[sb][g][1] * w;
                aa += sm_acc[sb][g][d] * w;
            }
        }
        const float o = ll > 0.f ? aa / ll : 0.f;
        const u64 hh = (u64)n * h + h0 + g;
        if (nsplit == 1) {
            out[hh * hdv + d] = from_f<T>(o);
        } else {
            part_o[(hh * nsplit + split) * hdv + d] = o;
            if (d == 0) {
                part_ml[(hh * nsplit + split) * 2] = mm;
                part_ml[(hh * nsplit + split) * 2 + 1] = ll;
            }
        }
    }
}

// grid.x = N·H rows (token, head), block = 128 threads over the hdv dims.
template <typename T>
__device__ __forceinline__ void attn_combine_impl(const float* __restrict__ part_o,
                                                  const float* __restrict__ part_ml,
                                                  T* __restrict__ out, u32 hdv, u32 nsplit) {
    const u64 row = blockIdx.x;
    const float* ml = part_ml + row * nsplit * 2;
    float mm = NEG_INF_F;
    for (u32 sp = 0; sp < nsplit; sp++) mm = fmaxf(mm, ml[2 * sp]);
    for (u32 d = threadIdx.x; d < hdv; d += blockDim.x) {
        float ll = 0.f, aa = 0.f;
        if (mm != NEG_INF_F) {
            for (u32 sp = 0; sp < nsplit; sp++) {
                const float ms = ml[2 * sp];
                if (ms == NEG_INF_F) continue;
                const float w = ml[2 * sp + 1] * exp2f(ms - mm);
                ll += w;
                aa += w * part_o[(row * nsplit + sp) * hdv + d];
            }
        }
        out[row * hdv + d] = from_f<T>(ll > 0.f ? aa / ll : 0.f);
    }
}

// grid = (ceil(max query tokens of a sequence / tq), Hkv · ceil(G / hc), S), block = 128 threads,
// dynamic shared memory = attn_tiled_smem_bytes (host side computes the same).
// Rows of a block: r = tok · hc + g for tok < tq, g < hc (tq · hc <= 32).
template <typename T, int VPL>
__device__ __forceinline__ void attn_tiled_impl(
    const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
    const u32* __restrict__ query_start, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, T* __restrict__ out, u32 h, u32 hkv, u32 hdk, u32 hdv,
    u32 bs, u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2) {
    constexpr int NW = 4, RPW = 8, ROWS = NW * RPW, BK = 32;
    extern __shared__ float smem[];
    const u32 hdk4 = (hdk + 3) & ~3u;
    const u32 kstride = hdk4 + 4;
    float* sq = smem;                       // [ROWS][hdk4]
    float* sk = sq + ROWS * hdk4;           // [BK][kstride]
    float* sv = sk + BK * kstride;          // [BK][hdv]
    float* skok = sv + BK * hdv;            // [BK] 1 = key present

    const u32 s = blockIdx.z;
    const u32 gq = h / hkv;
    const u32 gchunks = (gq + hc - 1) / hc;
    const u32 kvh = blockIdx.y / gchunks;
    const u32 gc = blockIdx.y % gchunks;
    const u32 hbase = kvh * gq + gc * hc;
    const u32 nh_blk = min(hc, gq - gc * hc);
    const u32 q0 = query_start[s], q1 = query_start[s + 1];
    const u32 t0 = q0 + blockIdx.x * tq;
    if (t0 >= q1) return;
    const u32 ntok = min(tq, q1 - t0);
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5;

    u32 kv_end = 0;
    for (u32 i = 0; i < ntok; i++) kv_end = max(kv_end, positions[t0 + i] + 1);
    kv_end = min(kv_end, max_blocks * bs);

    for (u32 e = tid; e < ROWS * hdk4; e += blockDim.x) {
        const u32 r = e / hdk4, d = e % hdk4, tok = r / hc, g = r % hc;
        float val = 0.f;
        if (tok < ntok && g < nh_blk && d < hdk)
            val = to_f(q[((u64)(t0 + tok) * h + hbase + g) * hdk + d]) * scale_log2;
        sq[e] = val;
    }
    bool rvalid[RPW];
    u32 rpos[RPW];
    float m[RPW], l[RPW], acc[RPW][VPL];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const u32 row = w * RPW + r, tok = row / hc, g = row % hc;
        rvalid[r] = tok < ntok && g < nh_blk;
        rpos[r] = rvalid[r] ? positions[t0 + tok] : 0;
        m[r] = NEG_INF_F;
        l[r] = 0.f;
#pragma unroll
        for (int i = 0; i < VPL; i++) acc[r][i] = 0.f;
    }
    const u32* bt = block_tables + (u64)s * max_blocks;

    for (u32 kb = 0; kb < kv_end; kb += BK) {
        __syncthreads();  // previous tile fully consumed (and sq written, first time)
        if (tid < BK) {
            const u32 key = kb + tid;
            skok[tid] = (key < kv_end && bt[key / bs] < num_blocks) ? 1.f : 0.f;
        }
        for (u32 e = tid; e < BK * hdk4; e += blockDim.x) {
            const u32 j = e / hdk4, d = e % hdk4, key = kb + j;
            float val = 0.f;
            if (key < kv_end && d < hdk) {
                const u32 blk = bt[key / bs];
                if (blk < num_blocks)
                    val = to_f(kc[(((u64)blk * bs + key % bs) * hkv + kvh) * hdk + d]);
            }
            sk[j * kstride + d] = val;
        }
        for (u32 e = tid; e < BK * hdv; e += blockDim.x) {
            const u32 j = e / hdv, d = e % hdv, key = kb + j;
            float val = 0.f;
            if (key < kv_end) {
                const u32 blk = bt[key / bs];
                if (blk < num_blocks)
                    val = to_f(vc[(((u64)blk * bs + key % bs) * hkv + kvh) * hdv + d]);
            }
            sv[j * hdv + d] = val;
        }
        __syncthreads();

        float sc[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) sc[r] = 0.f;
        const float* krow = sk + lane * kstride;
        const float* qrow = sq + (w * RPW) * hdk4;
        for (u32 d = 0; d < hdk4; d += 4) {
            const float4 kk = *reinterpret_cast<const float4*>(krow + d);
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const float4 qq = *reinterpret_cast<const float4*>(qrow + r * hdk4 + d);
                sc[r] = fmaf(qq.x, kk.x, sc[r]);
                sc[r] = fmaf(qq.y, kk.y, sc[r]);
                sc[r] = fmaf(qq.z, kk.z, sc[r]);
                sc[r] = fmaf(qq.w, kk.w, sc[r]);
            }
        }
        const u32 key = kb + lane;
        const bool kok = skok[lane] != 0.f;
        float p[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const bool ok = rvalid[r] && kok && key <= rpos[r];
            const float sv_ = ok ? sc[r] : NEG_INF_F;
            const float mx = fmaxf(m[r], warp_max(sv_));
            if (mx == NEG_INF_F) {
                p[r] = 0.f;
                continue;
            }
            const float corr = exp2f(m[r] - mx);
            p[r] = ok ? exp2f(sv_ - mx) : 0.f;
            l[r] = l[r] * corr + p[r];  // per-lane partial sum, summed over the warp at the end
#pragma unroll
            for (int i = 0; i < VPL; i++) acc[r][i] *= corr;
            m[r] = mx;
        }
#pragma unroll 4
        for (int j = 0; j < BK; j++) {
            float vj[VPL];
#pragma unroll
            for (int i = 0; i < VPL; i++) {
                const u32 d = lane + 32 * i;
                vj[i] = d < hdv ? sv[j * hdv + d] : 0.f;
            }
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const float pj = __shfl_sync(0xffffffffu, p[r], j);
#pragma unroll
                for (int i = 0; i < VPL; i++) acc[r][i] = fmaf(pj, vj[i], acc[r][i]);
            }
        }
    }

#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const float lt = warp_sum(l[r]);
        if (!rvalid[r]) continue;
        const u32 row = w * RPW + r, tok = row / hc, g = row % hc;
        T* o = out + ((u64)(t0 + tok) * h + hbase + g) * hdv;
#pragma unroll
        for (int i = 0; i < VPL; i++) {
            const u32 d = lane + 32 * i;
            if (d < hdv) o[d] = from_f<T>(lt > 0.f ? acc[r][i] / lt : 0.f);
        }
    }
}

#define ATTN_DECODE(S, T, TPK, GB)                                                            \
    extern "C" __global__ void __launch_bounds__(128)                                         \
        attn_decode_##S##_t##TPK##_g##GB(                                                    \
            const T* q, const T* kc, const T* vc, const u32* token_seq, const u32* positions, \
            const u32* block_tables, T* out, float* part_o, float* part_ml, u32 h, u32 hkv,   \
            u32 hdk, u32 hdv, u32 bs, u32 max_blocks, u32 num_blocks, u32 chunk, u32 nsplit,  \
            float scale_log2) {                                                               \
        attn_decode_impl<T, TPK, GB>(q, kc, vc, token_seq, positions, block_tables, out,      \
                                     part_o, part_ml, h, hkv, hdk, hdv, bs, max_blocks,       \
                                     num_blocks, chunk, nsplit, scale_log2);                  \
    }
#define ATTN_DECODE_G(S, T, TPK) ATTN_DECODE(S, T, TPK, 1) ATTN_DECODE(S, T, TPK, 4) ATTN_DECODE(S, T, TPK, 8)
#define ATTN_TILED(S, T, VPL)                                                                 \
    extern "C" __global__ void __launch_bounds__(128) attn_tiled_##S##_v##VPL(                \
        const T* q, const T* kc, const T* vc, const u32* query_start, const u32* positions,   \
        const u32* block_tables, T* out, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs,            \
        u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2) {                   \
        attn_tiled_impl<T, VPL>(q, kc, vc, query_start, positions, block_tables, out, h, hkv, \
                                hdk, hdv, bs, max_blocks, num_blocks, hc, tq, scale_log2);    \
    }
#define ATTN_ALL(S, T)                                                                        \
    ATTN_DECODE_G(S, T, 8) ATTN_DECODE_G(S, T, 16) ATTN_DECODE_G(S, T, 32)                    \
    extern "C" __global__ void attn_combine_##S(const float* part_o, const float* part_ml,   \
                                                T* out, u32 hdv, u32 nsplit) {                \
        attn_combine_impl<T>(part_o, part_ml, out, hdv, nsplit);                              \
    }                                                                                         \
    ATTN_TILED(S, T, 2) ATTN_TILED(S, T, 4) ATTN_TILED(S, T, 8) ATTN_TILED(S, T, 16)
DAYONE_FOR_FLOAT_TYPES(ATTN_ALL)
