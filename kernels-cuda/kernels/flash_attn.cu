// Varlen prefill attention over one contiguous key segment, FlashAttention-2 style (Dao 2023,
// Algorithm 1 with the §3.1 tweaks): a block owns BM = NW·WM·16 query rows of one head, NW warps
// of WM·16 rows (variants below; the host picks one per head dims);
// K/V tiles of 64 keys stream through shared memory with cp.async, double buffered (the next
// tile loads while this one is multiplied); S = Q·Kᵀ and O += P·V on mma.sync m16n8k16 with S,
// P and O in registers; online softmax in f32 (log2 domain). Only tiles that straddle the causal
// diagonal or the segment's end are masked. Late query tiles (most keys) are scheduled first.
//
// Layout (Backend::attention_varlen): q [N, H, DK], k [M, Hkv, DK], v [M, Hkv, DV]; sequence s
// owns query rows qstart[s]..qstart[s+1] and key rows kstart[s]..kstart[s+1]; key row
// kstart[s] + i is position kpos0[s] + i; a query at positions[n] sees keys at positions <= it
// (causal != 0). With prior_o/prior_lse (f32 [N, H, DV] normalised / [N, H] natural-log LSE) the
// segment's result is merged with that state; the result goes to `out` (T, normalised) or to
// out_o/out_lse (the state for the next segment).
// grid = (max query tiles of a sequence, H, S), block = 32·NW, dynamic shared memory
// (BM·(DK+8) + 2·64·(DK+8) + 2·64·(DV+8)) · sizeof(T) + 16.

#define FA_BN 64
#define FA_LN2 0.6931471805599453f
#define FA_NEG_INF (-__int_as_float(0x7f800000))

// mma.sync without `volatile`: a pure register op the compiler may schedule freely.
template <typename T> struct FaMma;
template <> struct FaMma<bf16> {
    static __device__ __forceinline__ void run(float* d, const u32* a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct FaMma<f16> {
    static __device__ __forceinline__ void run(float* d, const u32* a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// One tile of 64 key rows of width D (a head's K or V rows) into shared memory (row stride D + 8);
// rows past `kend` are zero-filled.
template <typename T, int D, int THREADS>
__device__ __forceinline__ void fa_load_rows(T* dst, const T* __restrict__ src, u32 krow0, u32 kb,
                                             u32 kend, u32 hkv, u32 kvh, u32 tid) {
    constexpr int C = D / 8;
#pragma unroll 4
    for (u32 e = tid; e < FA_BN * C; e += THREADS) {
        const u32 j = e / C, c = (e % C) * 8, key = kb + j;
        const bool ok = key < kend;
        const T* p = src + ((u64)(krow0 + (ok ? key : 0u)) * hkv + kvh) * D + c;
        cp_async16(smem_addr(dst + j * (D + 8) + c), p, ok ? 16u : 0u);
    }
}

template <typename T, int DK, int DV, int WM, int NW, int STAGES>
__device__ __forceinline__ void fa_impl(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const u32* __restrict__ qstart, const u32* __restrict__ kstart, const u32* __restrict__ kpos0,
    const u32* __restrict__ positions, const float* __restrict__ prior_o,
    const float* __restrict__ prior_lse, T* __restrict__ out, float* __restrict__ out_o,
    float* __restrict__ out_lse, u32 h, u32 hkv, float scale_log2, u32 causal) {
    constexpr int QS = DK + 8, VS = DV + 8, NT = DV / 8, BM = 16 * WM * NW, THREADS = 32 * NW;
    constexpr int FA_BM = BM;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sq = reinterpret_cast<T*>(smem_raw);  // [BM][QS]
    T* sk = sq + FA_BM * QS;                 // [STAGES][BN][QS]
    T* sv = sk + STAGES * FA_BN * QS;        // [STAGES][BN][VS]
    // The block's smallest and largest query position (dynamic memory: a static __shared__
    // would lower the dynamic limit the host raises to the device's maximum).
    u32* s_pm = reinterpret_cast<u32*>(sv + STAGES * FA_BN * VS);

    const u32 s = blockIdx.z, head = blockIdx.y;
    const u32 qtile = gridDim.x - 1 - blockIdx.x;
    const u32 q0 = qstart[s], q1 = qstart[s + 1];
    const u32 t0 = q0 + qtile * FA_BM;
    if (t0 >= q1) return;
    const u32 ntok = min((u32)FA_BM, q1 - t0);
    const u32 krow0 = kstart[s], nkeys = kstart[s + 1] - krow0, kp0 = kpos0[s];
    const u32 kvh = head / (h / hkv);
    const u32 tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;

    // Q tile (rows past the sequence's queries are zero and never written back).
#pragma unroll 4
    for (u32 e = tid; e < FA_BM * (DK / 8); e += THREADS) {
        const u32 r = e / (DK / 8), c = (e % (DK / 8)) * 8;
        const bool ok = r < ntok;
        const T* src = q + ((u64)(t0 + (ok ? r : 0u)) * h + head) * DK + c;
        cp_async16(smem_addr(sq + r * QS + c), src, ok ? 16u : 0u);
    }
    cp_async_commit();

    // The block's query positions: keys past the largest are never read, keys up to the
    // smallest need no causal mask.
    if (tid == 0) {
        s_pm[0] = 0xffffffffu;
        s_pm[1] = 0u;
    }
    __syncthreads();
    for (u32 i = tid; i < ntok; i += THREADS) {
        const u32 p = positions[t0 + i];
        atomicMin(&s_pm[0], p);
        atomicMax(&s_pm[1], p);
    }
    __syncthreads();
    const u32 pmin = s_pm[0], pmax = s_pm[1];
    u32 kend = nkeys, kfree = nkeys;
    if (causal) {
        kend = pmax < kp0 ? 0u : min(nkeys, pmax - kp0 + 1u);
        kfree = pmin < kp0 ? 0u : min(nkeys, pmin - kp0 + 1u);
    }
    const u32 ntiles = (kend + FA_BN - 1) / FA_BN;
    if (ntiles > 0) {
        fa_load_rows<T, DK, THREADS>(sk, k, krow0, 0u, kend, hkv, kvh, tid);
        if (STAGES == 2) fa_load_rows<T, DV, THREADS>(sv, v, krow0, 0u, kend, hkv, kvh, tid);
    }
    cp_async_commit();

    // This thread's rows: m-tile mt, half i → row w·16·WM + mt·16 + g + 8·i.
    u32 rpos[WM][2];
    float m[WM][2], l[WM][2];
    float o[WM][NT][4];
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const u32 r = w * 16 * WM + mt * 16 + g + 8 * i;
            rpos[mt][i] = r < ntok ? positions[t0 + r] : 0u;
            m[mt][i] = FA_NEG_INF;
            l[mt][i] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < NT; j++) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
    }

    float sc[WM][8][4];
    // S = Q·Kᵀ for this warp's rows × the tile's 64 keys.
    auto scores = [&](const T* skb) {
#pragma unroll
        for (int mt = 0; mt < WM; mt++)
#pragma unroll
            for (int j = 0; j < 8; j++) sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0.f;
#pragma unroll
        for (int k0 = 0; k0 < DK; k0 += 16) {
            u32 a[WM][4];
#pragma unroll
            for (int mt = 0; mt < WM; mt++)
                ldsm_x4(smem_addr(sq + (w * 16 * WM + mt * 16 + (lane & 15)) * QS + k0 + (lane >> 4) * 8),
                        a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                u32 b0, b1, b2, b3;
                const u32 key = jj * 16 + (lane & 7) + (lane >> 4) * 8;
                ldsm_x4(smem_addr(skb + key * QS + k0 + ((lane >> 3) & 1) * 8), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    FaMma<T>::run(sc[mt][2 * jj], a[mt], b0, b1);
                    FaMma<T>::run(sc[mt][2 * jj + 1], a[mt], b2, b3);
                }
            }
        }
    };
    // Scale, mask (diagonal and tail tiles only), online softmax; P left in `sc`.
    auto softmax = [&](u32 it) {
        const u32 kb = it * FA_BN;
        const bool masked = kb + FA_BN > kfree;
#pragma unroll
        for (int mt = 0; mt < WM; mt++) {
            float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    float x = sc[mt][j][e] * scale_log2;
                    if (masked) {
                        const u32 kk = kb + j * 8 + t4 * 2 + (e & 1);
                        if (kk >= kend || (causal && kp0 + kk > rpos[mt][i])) x = FA_NEG_INF;
                    }
                    sc[mt][j][e] = x;
                    mx[i] = fmaxf(mx[i], x);
                }
            float corr[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                corr[i] = mx[i] == FA_NEG_INF ? 1.f : exp2f(m[mt][i] - mx[i]);
                m[mt][i] = mx[i];
                l[mt][i] *= corr[i];
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                o[mt][j][0] *= corr[0];
                o[mt][j][1] *= corr[0];
                o[mt][j][2] *= corr[1];
                o[mt][j][3] *= corr[1];
            }
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    const float p = m[mt][i] == FA_NEG_INF ? 0.f : exp2f(sc[mt][j][e] - m[mt][i]);
                    sc[mt][j][e] = p;
                    l[mt][i] += p;
                }
        }
    };
    auto pv = [&](const T* svb) {
        // O += P·V, P re-packed from the S accumulators as A fragments (16 keys per step).
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            u32 a[WM][4];
#pragma unroll
            for (int mt = 0; mt < WM; mt++) {
                a[mt][0] = Mma<T>::pack(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
                a[mt][1] = Mma<T>::pack(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
                a[mt][2] = Mma<T>::pack(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
                a[mt][3] = Mma<T>::pack(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
            }
            const u32 key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int jd = 0; jd < NT / 2; jd++) {
                u32 b0, b1, b2, b3;
                ldsm_x4_t(smem_addr(svb + key * VS + jd * 16 + (lane >> 4) * 8), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    FaMma<T>::run(o[mt][2 * jd], a[mt], b0, b1);
                    FaMma<T>::run(o[mt][2 * jd + 1], a[mt], b2, b3);
                }
            }
        }
    };

    if (STAGES == 2) {
        // K and V of tile it + 1 load while tile it is computed.
        for (u32 it = 0; it < ntiles; it++) {
            cp_async_wait<0>();
            __syncthreads();  // tile it visible to all; every warp is done with tile it − 1
            if (it + 1 < ntiles) {
                const u32 nb = (it + 1) & 1;
                fa_load_rows<T, DK, THREADS>(sk + nb * FA_BN * QS, k, krow0, (it + 1) * FA_BN, kend,
                                             hkv, kvh, tid);
                fa_load_rows<T, DV, THREADS>(sv + nb * FA_BN * VS, v, krow0, (it + 1) * FA_BN, kend,
                                             hkv, kvh, tid);
                cp_async_commit();
            }
            scores(sk + (it & 1) * FA_BN * QS);
            softmax(it);
            pv(sv + (it & 1) * FA_BN * VS);
        }
    } else {
        // One K and one V buffer (FlashAttention-2's schedule): V of tile it loads during
        // Q·Kᵀ, K of tile it + 1 during the softmax and P·V.
        for (u32 it = 0; it < ntiles; it++) {
            cp_async_wait<0>();
            __syncthreads();  // K of tile it visible; every warp is done with V of tile it − 1
            fa_load_rows<T, DV, THREADS>(sv, v, krow0, it * FA_BN, kend, hkv, kvh, tid);
            cp_async_commit();
            scores(sk);
            __syncthreads();  // every warp is done with K of tile it
            const bool more = it + 1 < ntiles;
            if (more) {
                fa_load_rows<T, DK, THREADS>(sk, k, krow0, (it + 1) * FA_BN, kend, hkv, kvh, tid);
                cp_async_commit();
            }
            softmax(it);
            if (more) cp_async_wait<1>();
            else cp_async_wait<0>();
            __syncthreads();  // V of tile it visible
            pv(sv);
        }
    }

    // Finish: row sums over the quad, the segment's LSE, merge with the prior state, write.
#pragma unroll
    for (int mt = 0; mt < WM; mt++)
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float li = l[mt][i];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        const u32 r = w * 16 * WM + mt * 16 + g + 8 * i;
        if (r >= ntok) continue;
        const u64 row = (u64)(t0 + r) * h + head;
        float lse = li > 0.f ? (m[mt][i] + __log2f(li)) * FA_LN2 : FA_NEG_INF;
        float ws = li > 0.f ? 1.f / li : 0.f, wp = 0.f;
        if (prior_lse != nullptr) {
            const float lp = prior_lse[row];
            const float mm = fmaxf(lp, lse);
            if (mm != FA_NEG_INF) {
                const float a = __expf(lp - mm), b = __expf(lse - mm), tot = a + b;
                wp = a / tot;
                ws *= b / tot;
                lse = mm + __logf(tot);
            }
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const u32 d = j * 8 + t4 * 2;
            float x0 = o[mt][j][2 * i] * ws, x1 = o[mt][j][2 * i + 1] * ws;
            if (wp != 0.f) {
                const float2 p = *reinterpret_cast<const float2*>(prior_o + row * DV + d);
                x0 += wp * p.x;
                x1 += wp * p.y;
            }
            if (out != nullptr) {
                const u32 packed = (u32)from_f<T>(x0).x | ((u32)from_f<T>(x1).x << 16);
                *reinterpret_cast<u32*>(out + row * DV + d) = packed;
            } else {
                *reinterpret_cast<float2*>(out_o + row * DV + d) = make_float2(x0, x1);
            }
        }
        if (out_lse != nullptr && t4 == 0) out_lse[row] = lse;
    }
}

// Entry points flash_attn_{dtype}_k{DK}_v{DV}_m{WM}w{NW}[s1]: WM m-tiles per warp, NW warps,
// double-buffered K/V (or single-buffered: "s1"), at least MINB blocks per multiprocessor.
#define FLASH_ATTN_K(S, T, DK, DV, WM, NW, STAGES, MINB, SFX)                                     \
    extern "C" __global__ void __launch_bounds__(32 * NW, MINB)                                   \
        flash_attn_##S##_k##DK##_v##DV##_m##WM##w##NW##SFX(                                       \
            const T* q, const T* k, const T* v, const u32* qstart, const u32* kstart,             \
            const u32* kpos0, const u32* positions, const float* prior_o, const float* prior_lse, \
            T* out, float* out_o, float* out_lse, u32 h, u32 hkv, float scale_log2, u32 causal) { \
        grid_dep_wait();                                                                          \
        fa_impl<T, DK, DV, WM, NW, STAGES>(q, k, v, qstart, kstart, kpos0, positions, prior_o,    \
                                           prior_lse, out, out_o, out_lse, h, hkv, scale_log2,    \
                                           causal);                                               \
    }
// Two variants (flash.rs): 8 warps × 16 rows, double-buffered, one block per multiprocessor (the
// only one for 256/256, whose O would not fit twice in registers); 4 warps × 32 rows,
// single-buffered, two blocks per multiprocessor (the default: fastest on the H200, docs/perf.md,
// which also records four variants measured slower and removed).
#define FLASH_ATTN_DIMS(S, T, DK, DV)                                                             \
    FLASH_ATTN_K(S, T, DK, DV, 1, 8, 2, 1, ) FLASH_ATTN_K(S, T, DK, DV, 2, 4, 1, 2, s1)
#define FLASH_ATTN_ALL(S, T)                                                                      \
    FLASH_ATTN_DIMS(S, T, 64, 64) FLASH_ATTN_DIMS(S, T, 128, 128)                                  \
    FLASH_ATTN_DIMS(S, T, 192, 128) FLASH_ATTN_K(S, T, 256, 256, 1, 8, 2, 1, )
#if defined(DAYONE_ONLY_BF16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_F16))
FLASH_ATTN_ALL(bf16, bf16)
#endif
#if defined(DAYONE_ONLY_F16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_BF16))
FLASH_ATTN_ALL(f16, f16)
#endif
