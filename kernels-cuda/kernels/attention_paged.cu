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
//    output and (max, sum) that attn_combine_* merges — or, given `counters` (one zeroed u32
//    per (token, head group)), the last of the group's split blocks to finish merges them
//    itself, with attn_combine's arithmetic, and zeroes its counter again (one launch fewer
//    per layer and step; the same bits).
//  * attn_combine_*: merges the splits of each (token, head).
//  * attn_tiled_*: many query tokens per sequence (prefill, chunked prefill, mixed steps):
//    a block takes up to 32 (token, head) rows of one sequence sharing one KV head, walks the
//    keys in tiles of 32 staged in shared memory as f32, one warp per 8 rows, one lane per key
//    for the scores and 32·VPL value dims per row; online softmax per row.

#define LOG2E_F 1.4426950408889634f
#define NEG_INF_F (-__int_as_float(0x7f800000))

// Output dim d of row (token, head) `row` from its nsplit partials: weights l·2^(m − max)
// over the splits in order. L2 loads (__ldcg): in attn_decode the partials were written by
// other blocks of the same launch.
__device__ __forceinline__ float attn_combine_elem(const float* __restrict__ part_o,
                                                   const float* __restrict__ part_ml, u64 row,
                                                   u32 d, u32 hdv, u32 nsplit) {
    // Unrolled, with every load ahead of its use: a split's three L2 loads do not wait for the
    // previous split's arithmetic (one L2 round trip per split made the merge of a 512-key
    // decode, 9 splits, cost microseconds per layer). The same sums in the same order.
    const float* ml = part_ml + row * nsplit * 2;
    float mm = NEG_INF_F;
#pragma unroll 8
    for (u32 sp = 0; sp < nsplit; sp++) mm = fmaxf(mm, __ldcg(ml + 2 * sp));
    float ll = 0.f, aa = 0.f;
    if (mm != NEG_INF_F) {
#pragma unroll 4
        for (u32 sp = 0; sp < nsplit; sp++) {
            const float ms = __ldcg(ml + 2 * sp);
            const float ls = __ldcg(ml + 2 * sp + 1);
            const float os = __ldcg(part_o + (row * nsplit + sp) * hdv + d);
            if (ms == NEG_INF_F) continue;
            const float w = ls * exp2f(ms - mm);
            ll += w;
            aa += w * os;
        }
    }
    return ll > 0.f ? aa / ll : 0.f;
}

template <typename T, int TPK, int GB>
__device__ __forceinline__ void attn_decode_impl(
    const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
    const u32* __restrict__ token_seq, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, T* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_ml, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs, u32 max_blocks,
    u32 num_blocks, u32 chunk, u32 nsplit, float scale_log2, u32* __restrict__ counters) {
    grid_dep_wait();
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

    // Branch-free loads: key indices past `end` are clamped to a valid key and masked later;
    // threads past hd_k / hd_v re-read their neighbours' dims (never used), so all 2·UNR
    // 16-byte loads of a step can be in flight together. The block ids of the next step are
    // fetched one step ahead.
    const u32* bt = block_tables + (u64)s * max_blocks;
    const u32 dk = kact ? d0 : hdk - 8;
    const u32 dv = vact ? d0 : hdv - 8;
    u32 nblk[UNR];
    if (start < end) {
#pragma unroll
        for (int u = 0; u < UNR; u++) nblk[u] = bt[min(start + u * NSUB + sub, end - 1) / bs];
    }
    for (u32 base = start; base < end; base += NSUB * UNR) {
        Vec8<T> kv[UNR], vv[UNR];
        bool valid[UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const u32 j = base + u * NSUB + sub;
            const u32 jc = min(j, end - 1);
            valid[u] = j < end && nblk[u] < num_blocks;
            const u32 blk = nblk[u] < num_blocks ? nblk[u] : 0;
            const u64 row = ((u64)blk * bs + jc % bs) * hkv + kvh;
            kv[u].load(kc + row * hdk + dk);
            vv[u].load(vc + row * hdv + dv);
        }
        const u32 nbase = base + NSUB * UNR;
        if (nbase < end) {
#pragma unroll
            for (int u = 0; u < UNR; u++) nblk[u] = bt[min(nbase + u * NSUB + sub, end - 1) / bs];
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
    if (nsplit == 1 || !counters) return;
    // Publish this split's partials, then count it; the last split of the group merges.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    u32* counter = counters + (u64)n * gridDim.y + blockIdx.y;
    if (tid == 0) last = atomicAdd(counter, 1u) == nsplit - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (u32 e = tid; e < ng * hdv; e += NT) {
        const u32 g = e / hdv, d = e % hdv;
        const u64 row = (u64)n * h + h0 + g;
        out[row * hdv + d] = from_f<T>(attn_combine_elem(part_o, part_ml, row, d, hdv, nsplit));
    }
    if (tid == 0) *counter = 0;
}

// grid.x = N·H rows (token, head), block = 128 threads over the hdv dims.
template <typename T>
__device__ __forceinline__ void attn_combine_impl(const float* __restrict__ part_o,
                                                  const float* __restrict__ part_ml,
                                                  T* __restrict__ out, u32 hdv, u32 nsplit) {
    grid_dep_wait();
    const u64 row = blockIdx.x;
    for (u32 d = threadIdx.x; d < hdv; d += blockDim.x)
        out[row * hdv + d] = from_f<T>(attn_combine_elem(part_o, part_ml, row, d, hdv, nsplit));
}

// grid = (ceil(max query tokens of a sequence / tq), Hkv · ceil(G / hc), S), block = 128 threads,
// dynamic shared memory = attn_tiled_smem_bytes (host side computes the same).
// Rows of a block: r = tok · hc + g for tok < tq, g < hc (tq · hc <= 32).
// Batch-invariant mode (kernels-cuda/src/invariant.rs): the keys of a query are cut into chunks
// of ICHUNK positions from 0 (a length fixed per build, never by the step); each chunk's softmax
// state (m, l, unnormalised o) is computed from fresh, then the chunks are folded in ascending
// order with the explicit-rounding arithmetic below. A prefill block folds its chunks in
// registers; a decode step splits the chunks over blocks (attn_*_inv with nsplit > 1 write each
// chunk's state) and attn_fold_* folds them: the same chunk states, the same fold, the same bits
// for a query whatever step computes it.
__device__ __forceinline__ void inv_fold_weights(float& M, float mc, float& a, float& b) {
    const float mn = fmaxf(M, mc);
    a = M == NEG_INF_F ? 0.f : exp2f(__fsub_rn(M, mn));
    b = mc == NEG_INF_F ? 0.f : exp2f(__fsub_rn(mc, mn));
    M = mn;
}
__device__ __forceinline__ float inv_fold(float acc, float a, float v, float b) {
    return __fadd_rn(__fmul_rn(acc, a), __fmul_rn(v, b));
}
__device__ __forceinline__ float inv_normalise(float o, float l) {
    return __fmul_rn(o, l > 0.f ? __frcp_rn(l) : 0.f);
}

// grid.x = N·H rows, block 128 threads over hd_v: folds the nsplit chunk states of each row.
template <typename T>
__device__ __forceinline__ void attn_fold_impl(const float* __restrict__ part_o,
                                               const float* __restrict__ part_ml,
                                               T* __restrict__ out, u32 hdv, u32 nsplit) {
    grid_dep_wait();
    const u64 row = blockIdx.x;
    const float* ml = part_ml + row * nsplit * 2;
    for (u32 d = threadIdx.x; d < hdv; d += blockDim.x) {
        float M = NEG_INF_F, L = 0.f, O = 0.f;
        for (u32 sp = 0; sp < nsplit; sp++) {
            // A chunk with no key of the row (past its position) is skipped: folding it would
            // be a no-op except for turning a −0 into +0.
            if (ml[2 * sp] == NEG_INF_F) continue;
            float a, b;
            inv_fold_weights(M, ml[2 * sp], a, b);
            L = inv_fold(L, a, ml[2 * sp + 1], b);
            O = inv_fold(O, a, part_o[(row * nsplit + sp) * hdv + d], b);
        }
        out[row * hdv + d] = from_f<T>(inv_normalise(O, L));
    }
}

template <typename T, int VPL, bool INV>
__device__ __forceinline__ void attn_tiled_impl(
    const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
    const u32* __restrict__ query_start, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, T* __restrict__ out, u32 h, u32 hkv, u32 hdk, u32 hdv,
    u32 bs, u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2, u32 ichunk,
    u32 nsplit, u32 qtiles, float* __restrict__ part_o, float* __restrict__ part_ml) {
    grid_dep_wait();
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
    const u32 qtile = INV ? blockIdx.x % qtiles : blockIdx.x, split = INV ? blockIdx.x / qtiles : 0;
    const u32 t0 = q0 + qtile * tq;
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
    // INV: fold state per row (see inv_fold_weights); chunks c_first .. c_last of ICHUNK keys.
    float fm[RPW], fl[RPW], fo[RPW][VPL];
    u32 c_first = 0, c_last = 1;
    if (INV) {
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            fm[r] = NEG_INF_F;
            fl[r] = 0.f;
#pragma unroll
            for (int i = 0; i < VPL; i++) fo[r][i] = 0.f;
        }
        c_first = nsplit > 1 ? split : 0;
        c_last = nsplit > 1 ? split + 1 : (kv_end + ichunk - 1) / ichunk;
    }
    for (u32 c = c_first; c < c_last; c++) {
    const u32 kbeg = INV ? c * ichunk : 0;
    const u32 kfin = INV ? min(kbeg + ichunk, kv_end) : kv_end;
    for (u32 kb = kbeg; kb < kfin; kb += BK) {
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

    if (INV) {
        // End of chunk c: its state is (m, warp-summed l, acc); fold it, or write it out.
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const float lt = warp_sum(l[r]);
            const u32 row = w * RPW + r, tok = row / hc, g = row % hc;
            if (nsplit > 1) {
                if (rvalid[r]) {
                    const u64 pi = ((u64)(t0 + tok) * h + hbase + g) * nsplit + split;
                    if (lane == 0) {
                        part_ml[2 * pi] = m[r];
                        part_ml[2 * pi + 1] = lt;
                    }
#pragma unroll
                    for (int i = 0; i < VPL; i++) {
                        const u32 d = lane + 32 * i;
                        if (d < hdv) part_o[pi * hdv + d] = acc[r][i];
                    }
                }
            } else if (m[r] != NEG_INF_F) {
                float a, b;
                inv_fold_weights(fm[r], m[r], a, b);
                fl[r] = inv_fold(fl[r], a, lt, b);
#pragma unroll
                for (int i = 0; i < VPL; i++) fo[r][i] = inv_fold(fo[r][i], a, acc[r][i], b);
            }
            m[r] = NEG_INF_F;
            l[r] = 0.f;
#pragma unroll
            for (int i = 0; i < VPL; i++) acc[r][i] = 0.f;
        }
    }
    }  // chunks
    if (INV) {
        if (nsplit > 1) return;
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            if (!rvalid[r]) continue;
            const u32 row = w * RPW + r, tok = row / hc, g = row % hc;
            T* o = out + ((u64)(t0 + tok) * h + hbase + g) * hdv;
#pragma unroll
            for (int i = 0; i < VPL; i++) {
                const u32 d = lane + 32 * i;
                if (d < hdv) o[d] = from_f<T>(inv_normalise(fo[r][i], fl[r]));
            }
        }
        return;
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
    extern "C" __global__ void __launch_bounds__(128, GB <= 1 ? 4 : 2)                    \
        attn_decode_##S##_t##TPK##_g##GB(                                                    \
            const T* q, const T* kc, const T* vc, const u32* token_seq, const u32* positions, \
            const u32* block_tables, T* out, float* part_o, float* part_ml, u32 h, u32 hkv,   \
            u32 hdk, u32 hdv, u32 bs, u32 max_blocks, u32 num_blocks, u32 chunk, u32 nsplit,  \
            float scale_log2, u32* counters) {                                                \
        attn_decode_impl<T, TPK, GB>(q, kc, vc, token_seq, positions, block_tables, out,      \
                                     part_o, part_ml, h, hkv, hdk, hdv, bs, max_blocks,       \
                                     num_blocks, chunk, nsplit, scale_log2, counters);        \
    }
#define ATTN_DECODE_G(S, T, TPK) ATTN_DECODE(S, T, TPK, 1) ATTN_DECODE(S, T, TPK, 4) ATTN_DECODE(S, T, TPK, 8)
#define ATTN_TILED(S, T, VPL)                                                                 \
    extern "C" __global__ void __launch_bounds__(128) attn_tiled_##S##_v##VPL(                \
        const T* q, const T* kc, const T* vc, const u32* query_start, const u32* positions,   \
        const u32* block_tables, T* out, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs,            \
        u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2) {                   \
        attn_tiled_impl<T, VPL, false>(q, kc, vc, query_start, positions, block_tables, out,  \
                                       h, hkv, hdk, hdv, bs, max_blocks, num_blocks, hc, tq,  \
                                       scale_log2, 0, 1, 1, nullptr, nullptr);                \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) attn_tiled_inv_##S##_v##VPL(            \
        const T* q, const T* kc, const T* vc, const u32* query_start, const u32* positions,   \
        const u32* block_tables, T* out, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs,            \
        u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2, u32 ichunk,         \
        u32 nsplit, u32 qtiles, float* part_o, float* part_ml) {                              \
        attn_tiled_impl<T, VPL, true>(q, kc, vc, query_start, positions, block_tables, out,   \
                                      h, hkv, hdk, hdv, bs, max_blocks, num_blocks, hc, tq,   \
                                      scale_log2, ichunk, nsplit, qtiles, part_o, part_ml);   \
    }
#define ATTN_ALL(S, T)                                                                        \
    ATTN_DECODE_G(S, T, 8) ATTN_DECODE_G(S, T, 16) ATTN_DECODE_G(S, T, 32)                    \
    extern "C" __global__ void attn_combine_##S(const float* part_o, const float* part_ml,   \
                                                T* out, u32 hdv, u32 nsplit) {                \
        attn_combine_impl<T>(part_o, part_ml, out, hdv, nsplit);                              \
    }                                                                                         \
    extern "C" __global__ void attn_fold_##S(const float* part_o, const float* part_ml,      \
                                             T* out, u32 hdv, u32 nsplit) {                   \
        attn_fold_impl<T>(part_o, part_ml, out, hdv, nsplit);                                 \
    }                                                                                         \
    ATTN_TILED(S, T, 2) ATTN_TILED(S, T, 4) ATTN_TILED(S, T, 8) ATTN_TILED(S, T, 16)
DAYONE_FOR_FLOAT_TYPES(ATTN_ALL)

// ---------------------------------------------------------------------------------------------
// attn_mma_*: the tiled kernel on tensor cores (bf16/f16 only), FlashAttention-2 style
// (Dao 2023): a block of 4 warps takes 64 (token, head) rows of one sequence sharing one KV head
// (16 rows per warp), walks the keys in tiles of 64 staged in shared memory, computes S = Q·Kᵀ
// and O += P·V with mma.sync m16n8k16 (f32 accumulation) and keeps the softmax online in f32.
// Requirements (checked on the host): hd_k and hd_v multiples of 16, hd_k <= 256, hd_v <= DV.
// Dynamic shared memory: Q [64][hdk+8], K [64][hdk+8], V [64][hdv+8] in T, then [64] u32.
// grid = (ceil(max query tokens / tq), Hkv · ceil(G / hc), S), block = 128, tq · hc <= 64.
// attn_mma_ext_*: the same with gpt-oss's extras (dayone_backend::AttentionOptions): a sliding
// window (keys p + 1 − window ..= p; 0: all; tiles before the block's first visible key are
// skipped) and per-head sink logits `sinks` [H] f32 (or null) that start each row's softmax.

// smem_addr, ldsm_x4, ldsm_x4_t and Mma<T> live in common.cuh.

template <typename T, int DV, bool INV>
__device__ __forceinline__ void attn_mma_impl(
    const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
    const u32* __restrict__ query_start, const u32* __restrict__ positions,
    const u32* __restrict__ block_tables, T* __restrict__ out, u32 h, u32 hkv, u32 hdk, u32 hdv,
    u32 bs, u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2, u32 ichunk,
    u32 nsplit, u32 qtiles, float* __restrict__ part_o, float* __restrict__ part_ml,
    const float* __restrict__ sinks, u32 window) {
    constexpr int ROWS = 64, BK = 64, NT = DV / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sq = reinterpret_cast<T*>(smem_raw);
    const u32 qs = hdk + 8, ks = hdk + 8, vs = hdv + 8;  // row strides (elements)
    T* sk = sq + ROWS * qs;
    T* sv = sk + BK * ks;
    u32* sok = reinterpret_cast<u32*>(sv + BK * vs);  // [BK] 1 = key present

    const u32 s = blockIdx.z;
    const u32 gq = h / hkv;
    const u32 gchunks = (gq + hc - 1) / hc;
    const u32 kvh = blockIdx.y / gchunks;
    const u32 gc = blockIdx.y % gchunks;
    const u32 hbase = kvh * gq + gc * hc;
    const u32 nh_blk = min(hc, gq - gc * hc);
    const u32 q0 = query_start[s], q1 = query_start[s + 1];
    const u32 qtile = INV ? blockIdx.x % qtiles : blockIdx.x, split = INV ? blockIdx.x / qtiles : 0;
    const u32 t0 = q0 + qtile * tq;
    if (t0 >= q1) return;
    const u32 ntok = min(tq, q1 - t0);
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const u32 g = lane >> 2, t4 = lane & 3;

    u32 kv_end = 0, kv_begin = 0xffffffffu;
    for (u32 i = 0; i < ntok; i++) {
        const u32 p = positions[t0 + i];
        kv_end = max(kv_end, p + 1);
        // Sliding window (gpt-oss): row p sees keys p + 1 - window ..= p; the first tile that
        // any row of the block sees.
        kv_begin = min(kv_begin, (window > 0 && p + 1 > window) ? p + 1 - window : 0u);
    }
    kv_end = min(kv_end, max_blocks * bs);
    kv_begin = (kv_begin / BK) * BK;

    // Q rows into shared memory (zeros for rows past the block's tokens/heads).
    const u32 qvec = hdk / 8;
    for (u32 e = tid; e < ROWS * qvec; e += blockDim.x) {
        const u32 r = e / qvec, c = (e % qvec) * 8, tok = r / hc, gg = r % hc;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (tok < ntok && gg < nh_blk)
            val = *reinterpret_cast<const uint4*>(q + ((u64)(t0 + tok) * h + hbase + gg) * hdk + c);
        *reinterpret_cast<uint4*>(sq + r * qs + c) = val;
    }
    // This thread's two rows (g and g + 8 of the warp's 16).
    u32 rpos[2];
    bool rvalid[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const u32 r = w * 16 + g + 8 * i, tok = r / hc, gg = r % hc;
        rvalid[i] = tok < ntok && gg < nh_blk;
        rpos[i] = rvalid[i] ? positions[t0 + tok] : 0;
    }
    float m[2] = {NEG_INF_F, NEG_INF_F}, l[2] = {0.f, 0.f};
    if (sinks) {
        // Attention sinks (gpt-oss): one more logit per row, taking mass and adding no value;
        // the online softmax starts from it (l counted once per quad of lanes sharing a row).
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const u32 r = w * 16 + g + 8 * i;
            if (rvalid[i]) {
                m[i] = sinks[hbase + r % hc] * 1.4426950408889634f;
                l[i] = t4 == 0 ? 1.f : 0.f;
            }
        }
    }
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    const u32* bt = block_tables + (u64)s * max_blocks;
    const u32 kvec = hdk / 8, vvec = hdv / 8;
    // INV: fold state of this thread's two rows; chunks c_first .. c_last of ICHUNK keys.
    float fm[2], fl[2], fo[NT][4];
    u32 c_first = 0, c_last = 1;
    if (INV) {
        fm[0] = fm[1] = NEG_INF_F;
        fl[0] = fl[1] = 0.f;
#pragma unroll
        for (int j = 0; j < NT; j++) fo[j][0] = fo[j][1] = fo[j][2] = fo[j][3] = 0.f;
        c_first = nsplit > 1 ? split : 0;
        c_last = nsplit > 1 ? split + 1 : (kv_end + ichunk - 1) / ichunk;
    }
    for (u32 c = c_first; c < c_last; c++) {
    const u32 kbeg = INV ? c * ichunk : kv_begin;
    const u32 kfin = INV ? min(kbeg + ichunk, kv_end) : kv_end;
    for (u32 kb = kbeg; kb < kfin; kb += BK) {
        __syncthreads();  // previous tile consumed (and Q written, the first time)
        if (tid < BK) {
            const u32 key = kb + tid;
            sok[tid] = (key < kv_end && bt[key / bs] < num_blocks) ? 1u : 0u;
        }
        for (u32 e = tid; e < BK * (kvec + vvec); e += blockDim.x) {
            const bool isk = e < BK * kvec;
            const u32 e2 = isk ? e : e - BK * kvec;
            const u32 nv = isk ? kvec : vvec;
            const u32 j = e2 / nv, c = (e2 % nv) * 8, key = kb + j;
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (key < kv_end) {
                const u32 blk = bt[key / bs];
                if (blk < num_blocks) {
                    const u64 row = ((u64)blk * bs + key % bs) * hkv + kvh;
                    val = isk ? *reinterpret_cast<const uint4*>(kc + row * hdk + c)
                              : *reinterpret_cast<const uint4*>(vc + row * hdv + c);
                }
            }
            if (isk) *reinterpret_cast<uint4*>(sk + j * ks + c) = val;
            else *reinterpret_cast<uint4*>(sv + j * vs + c) = val;
        }
        __syncthreads();

        // S = Q·Kᵀ for this warp's 16 rows × 64 keys.
        float sc[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
        for (u32 k0 = 0; k0 < hdk; k0 += 16) {
            u32 a[4];
            ldsm_x4(smem_addr(sq + (w * 16 + (lane & 15)) * qs + k0 + (lane >> 4) * 8), a[0], a[1], a[2], a[3]);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                u32 b0, b1, b2, b3;
                const u32 key = jj * 16 + (lane & 7) + (lane >> 4) * 8;
                ldsm_x4(smem_addr(sk + key * ks + k0 + ((lane >> 3) & 1) * 8), b0, b1, b2, b3);
                Mma<T>::run(sc[2 * jj], a, b0, b1);
                Mma<T>::run(sc[2 * jj + 1], a, b2, b3);
            }
        }
        // Mask, scale, online softmax (rows g and g + 8; a quad of lanes shares a row).
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1;
                const u32 kj = j * 8 + t4 * 2 + (e & 1);
                const bool ok = rvalid[i] && kb + kj <= rpos[i] && sok[kj] != 0u &&
                                (window == 0 || kb + kj + window > rpos[i]);
                sc[j][e] = ok ? sc[j][e] * scale_log2 : NEG_INF_F;
                mx[i] = fmaxf(mx[i], sc[j][e]);
            }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            corr[i] = mx[i] == NEG_INF_F ? 1.f : exp2f(m[i] - mx[i]);
            m[i] = mx[i];
            l[i] *= corr[i];
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
            o[j][0] *= corr[0]; o[j][1] *= corr[0];
            o[j][2] *= corr[1]; o[j][3] *= corr[1];
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1;
                const float p = sc[j][e] == NEG_INF_F ? 0.f : exp2f(sc[j][e] - m[i]);
                sc[j][e] = p;
                l[i] += p;
            }
        // O += P·V: P re-packed from the S accumulators as A fragments (16 keys per step).
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            u32 a[4];
            a[0] = Mma<T>::pack(sc[2 * kk][0], sc[2 * kk][1]);
            a[1] = Mma<T>::pack(sc[2 * kk][2], sc[2 * kk][3]);
            a[2] = Mma<T>::pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            a[3] = Mma<T>::pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            const u32 key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int jd = 0; jd < NT / 2; jd++) {
                if ((u32)jd * 16 >= hdv) break;
                u32 b0, b1, b2, b3;
                ldsm_x4_t(smem_addr(sv + key * vs + jd * 16 + (lane >> 4) * 8), b0, b1, b2, b3);
                Mma<T>::run(o[2 * jd], a, b0, b1);
                Mma<T>::run(o[2 * jd + 1], a, b2, b3);
            }
        }
    }

    if (INV) {
        // End of chunk c: reduce l over the quad, then fold the chunk's state or write it out.
        float lt[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            lt[i] = l[i] + __shfl_xor_sync(0xffffffffu, l[i], 1);
            lt[i] += __shfl_xor_sync(0xffffffffu, lt[i], 2);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const u32 r = w * 16 + g + 8 * i, tok = r / hc, gg = r % hc;
            if (nsplit > 1) {
                if (rvalid[i]) {
                    const u64 pi = ((u64)(t0 + tok) * h + hbase + gg) * nsplit + split;
                    if (t4 == 0) {
                        part_ml[2 * pi] = m[i];
                        part_ml[2 * pi + 1] = lt[i];
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        const u32 d = j * 8 + t4 * 2;
                        if (d < hdv) {
                            part_o[pi * hdv + d] = o[j][2 * i];
                            part_o[pi * hdv + d + 1] = o[j][2 * i + 1];
                        }
                    }
                }
            } else if (m[i] != NEG_INF_F) {
                float a, b;
                inv_fold_weights(fm[i], m[i], a, b);
                fl[i] = inv_fold(fl[i], a, lt[i], b);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    fo[j][2 * i] = inv_fold(fo[j][2 * i], a, o[j][2 * i], b);
                    fo[j][2 * i + 1] = inv_fold(fo[j][2 * i + 1], a, o[j][2 * i + 1], b);
                }
            }
            m[i] = NEG_INF_F;
            l[i] = 0.f;
#pragma unroll
            for (int j = 0; j < NT; j++) o[j][2 * i] = o[j][2 * i + 1] = 0.f;
        }
    }
    }  // chunks
    if (INV) {
        if (nsplit > 1) return;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (!rvalid[i]) continue;
            const u32 r = w * 16 + g + 8 * i, tok = r / hc, gg = r % hc;
            T* orow = out + ((u64)(t0 + tok) * h + hbase + gg) * hdv;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const u32 d = j * 8 + t4 * 2;
                if (d < hdv) {
                    orow[d] = from_f<T>(inv_normalise(fo[j][2 * i], fl[i]));
                    orow[d + 1] = from_f<T>(inv_normalise(fo[j][2 * i + 1], fl[i]));
                }
            }
        }
        return;
    }
    // Normalise and write this thread's rows.
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!rvalid[i]) continue;
        const u32 r = w * 16 + g + 8 * i, tok = r / hc, gg = r % hc;
        T* orow = out + ((u64)(t0 + tok) * h + hbase + gg) * hdv;
        const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const u32 d = j * 8 + t4 * 2;
            if (d < hdv) {
                orow[d] = from_f<T>(o[j][2 * i] * inv);
                orow[d + 1] = from_f<T>(o[j][2 * i + 1] * inv);
            }
        }
    }
}

#define ATTN_MMA(S, T, DV)                                                                    \
    extern "C" __global__ void __launch_bounds__(128) attn_mma_##S##_d##DV(                   \
        const T* q, const T* kc, const T* vc, const u32* query_start, const u32* positions,   \
        const u32* block_tables, T* out, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs,            \
        u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2) {                   \
        grid_dep_wait();                                                                      \
        attn_mma_impl<T, DV, false>(q, kc, vc, query_start, positions, block_tables, out, h,  \
                                    hkv, hdk, hdv, bs, max_blocks, num_blocks, hc, tq,        \
                                    scale_log2, 0, 1, 1, nullptr, nullptr, nullptr, 0);       \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) attn_mma_ext_##S##_d##DV(               \
        const T* q, const T* kc, const T* vc, const u32* query_start, const u32* positions,   \
        const u32* block_tables, T* out, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs,            \
        u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2, const float* sinks, \
        u32 window) {                                                                         \
        grid_dep_wait();                                                                      \
        attn_mma_impl<T, DV, false>(q, kc, vc, query_start, positions, block_tables, out, h,  \
                                    hkv, hdk, hdv, bs, max_blocks, num_blocks, hc, tq,        \
                                    scale_log2, 0, 1, 1, nullptr, nullptr, sinks, window);    \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) attn_mma_inv_##S##_d##DV(               \
        const T* q, const T* kc, const T* vc, const u32* query_start, const u32* positions,   \
        const u32* block_tables, T* out, u32 h, u32 hkv, u32 hdk, u32 hdv, u32 bs,            \
        u32 max_blocks, u32 num_blocks, u32 hc, u32 tq, float scale_log2, u32 ichunk,         \
        u32 nsplit, u32 qtiles, float* part_o, float* part_ml) {                              \
        grid_dep_wait();                                                                      \
        attn_mma_impl<T, DV, true>(q, kc, vc, query_start, positions, block_tables, out, h,   \
                                   hkv, hdk, hdv, bs, max_blocks, num_blocks, hc, tq,         \
                                   scale_log2, ichunk, nsplit, qtiles, part_o, part_ml,       \
                                   nullptr, 0);                                               \
    }
#if defined(DAYONE_ONLY_BF16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_F16))
ATTN_MMA(bf16, bf16, 64) ATTN_MMA(bf16, bf16, 128) ATTN_MMA(bf16, bf16, 256)
#endif
#if defined(DAYONE_ONLY_F16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_BF16))
ATTN_MMA(f16, f16, 64) ATTN_MMA(f16, f16, 128) ATTN_MMA(f16, f16, 256)
#endif
