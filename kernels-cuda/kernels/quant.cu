// Block-quantized weights (dayone_backend::quant): codes of 4 bits (two per byte, low nibble the
// even column) or 8 bits, one scale (E8M0 byte, f16 or bf16) and optionally one f16 min per
// `group` columns (a multiple of 8): w = value(code) * scale (+ min), the product and the sum
// each rounded once (__fmul_rn / __fadd_rn: no contraction into an FMA), as the host decode.
// fmt: codes 0 FP4 E2M1, 1 u4 - 8, 2 u4, 3 i8, 4 u5 - 16, 5 u5, 6 u6 - 32, 7 u2, 8 u3 - 4;
// scale 0 E8M0, 1 f16, 2 bf16, 3 K4, 4 K6, 5 K2, 6 K3 record.
// 5- and 6-bit codes: the low nibbles of all n values, then a plane of their high 1 or 2 bits
// (value e's at bit e * hb); 2- and 3-bit codes: a 2-bit low plane (4 per byte), then Q3_K's
// third bits. The GGUF K-quants keep ggml's super-block scale records: K4 (Q4_K, Q5_K) f16 d,
// f16 dmin, 12 bytes of 6-bit scales and mins per 256 values, scale d * sc and min -(dmin * m)
// (ggml get_scale_min_k4); K6 (Q6_K) 16 i8 scales then f16 d; K2 (Q2_K) 16 bytes of 4-bit
// scale | 4-bit min << 4, f16 d, f16 dmin; K3 (Q3_K) 12 bytes of 6-bit scales, f16 d, scale
// d * (sc - 32).

__device__ __forceinline__ float q_value(u32 codes, u32 c) {
    switch (codes) {
        case 0: {
            // FP4 E2M1 by bits (no table in local memory): exponent e, mantissa m; e = 0 is the
            // subnormal 0.5 m, else (1 + m/2) 2^(e-1); bit 3 the sign.
            const u32 e = (c >> 1) & 3u, m = c & 1u;
            const u32 mag = e == 0 ? (m ? 0x3f000000u : 0u) : (((e + 126u) << 23) | (m << 22));
            return __uint_as_float(mag | ((c & 8u) << 28));
        }
        case 1: return (float)(int)(c & 15u) - 8.f;
        case 2: return (float)(c & 15u);
        case 4: return (float)(int)(c & 31u) - 16.f;
        case 5: return (float)(c & 31u);
        case 6: return (float)(int)(c & 63u) - 32.f;
        case 7: return (float)(c & 3u);
        case 8: return (float)(int)(c & 7u) - 4.f;
        default: return (float)(signed char)(c & 255u);
    }
}

__device__ __forceinline__ float q_half(const unsigned char* p, u32 scale, u64 g) {
    const u16 h = reinterpret_cast<const u16*>(p)[g];
    if (scale == 2) return __uint_as_float(((u32)h) << 16);
    f16 v;
    v.x = h;
    return to_f(v);
}

__device__ __forceinline__ float q_f16_at(const unsigned char* p) {
    f16 v;
    v.x = *reinterpret_cast<const u16*>(p);
    return to_f(v);
}

// ggml get_scale_min_k4: the 6-bit scale (k = 0) or min (k = 4) of sub-block j of a K4 record.
__device__ __forceinline__ u32 q_k4_6bit(const unsigned char* r, u32 j, u32 k) {
    const unsigned char* s = r + 4;
    if (j < 4) return s[j + k] & 63u;
    const u32 packed = s[j + 4];
    return (k ? packed >> 4 : packed & 15u) | ((u32)(s[j - 4 + k] >> 6) << 4);
}

__device__ __forceinline__ float q_scale(const unsigned char* s, u32 scale, u64 g) {
    if (scale == 3) {
        const unsigned char* r = s + (g / 8) * 16;
        return __fmul_rn(q_f16_at(r), (float)q_k4_6bit(r, (u32)(g % 8), 0));
    }
    if (scale == 4) {
        const unsigned char* r = s + (g / 16) * 18;
        return __fmul_rn(q_f16_at(r + 16), (float)(signed char)r[g % 16]);
    }
    if (scale == 5) {
        const unsigned char* r = s + (g / 16) * 20;
        return __fmul_rn(q_f16_at(r + 16), (float)(r[g % 16] & 15u));
    }
    if (scale == 6) {
        const unsigned char* r = s + (g / 16) * 14;
        const u32 j = (u32)(g % 16);
        const u32 low = j < 8 ? (r[j] & 15u) : (u32)(r[j - 8] >> 4);
        const u32 high = (r[8 + j % 4] >> (2 * (j / 4))) & 3u;
        return __fmul_rn(q_f16_at(r + 12), (float)((int)(low | (high << 4)) - 32));
    }
    if (scale == 0) {
        const u32 b = s[g];
        return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(b << 23);
    }
    return q_half(s, scale, g);
}

// The min of group g: the f16 min array, or -(dmin * m) from a K4 record.
__device__ __forceinline__ float q_min(const unsigned char* scales, const unsigned char* mins,
                                       u32 scale, u64 g) {
    if (scale == 3) {
        const unsigned char* r = scales + (g / 8) * 16;
        return -__fmul_rn(q_f16_at(r + 2), (float)q_k4_6bit(r, (u32)(g % 8), 4));
    }
    if (scale == 5) {
        const unsigned char* r = scales + (g / 16) * 20;
        return -__fmul_rn(q_f16_at(r + 18), (float)(r[g % 16] >> 4));
    }
    return q_half(mins, 1, g);
}

// Eight codes starting at flat element e (a multiple of 8) of n: one word of nibbles (plus one
// byte or u16 of high bits for 5- and 6-bit codes), one u16 of 2-bit codes (plus a byte of
// third bits for Q3_K) or two words of bytes.
__device__ __forceinline__ void q_codes8(const unsigned char* codes, u32 kind, u64 e, u64 n,
                                         u32* c) {
    if (kind == 3) {
        const uint2 w = *reinterpret_cast<const uint2*>(codes + e);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            c[j] = (w.x >> (8 * j)) & 255u;
            c[j + 4] = (w.y >> (8 * j)) & 255u;
        }
    } else if (kind == 7 || kind == 8) {
        const u32 w = *reinterpret_cast<const u16*>(codes + e / 4);
#pragma unroll
        for (int j = 0; j < 8; j++) c[j] = (w >> (2 * j)) & 3u;
        if (kind == 8) {
            const u32 hi = codes[n / 4 + e / 8];
#pragma unroll
            for (int j = 0; j < 8; j++) c[j] |= ((hi >> j) & 1u) << 2;
        }
    } else {
        const u32 w = *reinterpret_cast<const u32*>(codes + e / 2);
#pragma unroll
        for (int j = 0; j < 8; j++) c[j] = (w >> (4 * j)) & 15u;
        if (kind == 4 || kind == 5) {
            const u32 hi = codes[n / 2 + e / 8];
#pragma unroll
            for (int j = 0; j < 8; j++) c[j] |= ((hi >> j) & 1u) << 4;
        } else if (kind == 6) {
            const u32 hi = *reinterpret_cast<const u16*>(codes + n / 2 + e / 4);
#pragma unroll
            for (int j = 0; j < 8; j++) c[j] |= ((hi >> (2 * j)) & 3u) << 4;
        }
    }
}

// out[i, r, c] = w[items[i], r, c] for i < m (items null: w[i]); one thread per 8 consecutive
// columns.
template <typename T>
__device__ void dequant_impl(const unsigned char* codes, const unsigned char* scales,
                             const unsigned char* mins, const u32* items, T* out, u32 m, u32 rows,
                             u32 cols, u32 n_items, u32 kind, u32 scale, u32 has_min, u32 group) {
    grid_dep_wait();
    const u64 per = (u64)rows * cols;
    const u64 total = (u64)m * per / 8;
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (u64)gridDim.x * blockDim.x) {
        const u64 o = t * 8;
        const u64 i = o / per;
        const u64 rc = o - i * per;
        const u32 item = items ? items[i] : (u32)i;  // no list: items 0..m in order
        T* y = out + o;
        if (item >= n_items) {
#pragma unroll
            for (int j = 0; j < 8; j++) y[j] = from_f<T>(0.f);
            continue;
        }
        const u64 e = (u64)item * per + rc;
        const u64 g = e / group;
        const float s = q_scale(scales, scale, g);
        const float mn = has_min ? q_min(scales, mins, scale, g) : 0.f;
        u32 c[8];
        q_codes8(codes, kind, e, (u64)n_items * per, c);
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            v[j] = __fmul_rn(q_value(kind, c[j]), s);
            if (has_min) v[j] = __fadd_rn(v[j], mn);
        }
        // One 16-byte store for 16-bit outputs (two for f32): rows of 8 are 16-byte aligned.
        Vec8<T> out8;
        out8.from_float(v);
        out8.store(y);
    }
}

// y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) for m <= MT: one warp per output row, lanes
// striding over runs of 8 columns (coalesced code loads), f32 accumulation.
template <typename T, int MT>
__device__ void gemv_q_impl(const T* x, const unsigned char* codes, const unsigned char* scales,
                            const unsigned char* mins, const T* bias, T* y, u32 m, u32 n, u32 k,
                            u32 kind, u32 scale, u32 has_min, u32 group) {
    grid_dep_wait();
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= n) return;
    float acc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i] = 0.f;
    const u32 groups = k / group;
    for (u32 c0 = lane * 8; c0 < k; c0 += 256) {
        const u64 e = (u64)row * k + c0;
        const u64 g = (u64)row * groups + c0 / group;
        u32 c[8];
        q_codes8(codes, kind, e, (u64)n * k, c);
        float wv[8];
#pragma unroll
        for (int j = 0; j < 8; j++) wv[j] = q_value(kind, c[j]);
        const float s = q_scale(scales, scale, g);
        const float mn = has_min ? q_min(scales, mins, scale, g) : 0.f;
#pragma unroll
        for (int i = 0; i < MT; i++) {
            if (i < (int)m) {
                const T* xr = x + (u64)i * k + c0;
                float d = 0.f, sx = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float xv = to_f(xr[j]);
                    d = fmaf(wv[j], xv, d);
                    sx += xv;
                }
                acc[i] = fmaf(d, s, acc[i]);
                if (has_min) acc[i] = fmaf(sx, mn, acc[i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const float v = warp_sum(acc[i]);
        if (lane == 0 && i < (int)m) {
            const float b = bias ? to_f(bias[row]) : 0.f;
            y[(u64)i * n + row] = from_f<T>(v + b);
        }
    }
}

#define QUANT(S, T)                                                                           \
    extern "C" __global__ void dequant_##S(const unsigned char* codes,                        \
                                           const unsigned char* scales,                       \
                                           const unsigned char* mins, const u32* items, T* out, \
                                           u32 m, u32 rows, u32 cols, u32 n_items, u32 kind,  \
                                           u32 scale, u32 has_min, u32 group) {               \
        dequant_impl<T>(codes, scales, mins, items, out, m, rows, cols, n_items, kind, scale, \
                        has_min, group);                                                      \
    }                                                                                         \
    GEMV_Q(S, T, 1) GEMV_Q(S, T, 2) GEMV_Q(S, T, 4) GEMV_Q(S, T, 8) GEMV_Q(S, T, 16)        \
    GEMV_Q(S, T, 32)
#define GEMV_Q(S, T, MT)                                                                      \
    extern "C" __global__ void gemv_q_##S##_m##MT(                                           \
        const T* x, const unsigned char* codes, const unsigned char* scales,                  \
        const unsigned char* mins, const T* bias, T* y, u32 m, u32 n, u32 k, u32 kind,        \
        u32 scale, u32 has_min, u32 group) {                                                  \
        gemv_q_impl<T, MT>(x, codes, scales, mins, bias, y, m, n, k, kind, scale, has_min,    \
                           group);                                                            \
    }
DAYONE_FOR_FLOAT_TYPES(QUANT)

// ---------------------------------------------------------------------------------------------
// Routed experts on the codes (decode steps): the grouped GEMV of moe.cu's `moe_gemv` with the
// weights decoded in registers. The (token, choice) pairs are sorted by expert by the moe
// family's `moe_sort` (tiles of at most MT pairs of one expert, `bt` = MT: 1 for one token, else
// 8, rows past a tile's pairs skipped, so two variants serve every step); each warp owns RPW
// outputs of one tile (2 for gate_up, 4 for down; GU: their gate and up rows, [gate; up] or,
// for gpt-oss, interleaved) and streams those weight rows once for the tile's pairs, 32 codes
// (16 bytes) per lane and step; a block is 8 warps. m1: moe_q_impl; m8: moe_q8_impl, the
// tile's rows staged in shared memory.
//   moe_q_gu  h[sp, o] = act(gate[e, o]·x[tok] + b, up[e, o]·x[tok] + b)   f32 [P, F]
//   moe_q_dn  y2[sp, o] = down[e, o]·h[sp] + b_d[e, o]                     f32 [P, D]
//   moe_q_combine  y[t, o] = Σ_j weights[t, j] · y2[pos[t·k + j], o]       (f32, j in order)
// 4-bit codes only (KIND 0 FP4 E2M1, 1 u4 − 8), scales E8M0, f16 or bf16 without a min, groups
// of a multiple of 32 (one scale per lane and step); the reduction width is a multiple of 32 and
// the codes 16-byte aligned (checked by the host).
// act 0 silu(g)·u, 1 gpt-oss (interleaved rows, clamp, (u + 1)·g·σ(αg)), 2 silu(min(g, l))·
// clamp(u, ±l) — as moe_ext.cu.
__device__ __forceinline__ uint4 q_ld_stream16(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// The value of a 4-bit code in a few bit operations (the inner loop's cost): FP4 E2M1's
// exponent and mantissa bits placed as the lowest exponent bits and top mantissa bit of an f32
// give 2^(e − 127)·(1 + m/2) (e = 0: the subnormal m·2^−127), times 2^126 exactly (no flush to
// zero without --use_fast_math); u4 − 8 as (2^23 + c) − (2^23 + 8).
template <int KIND> __device__ __forceinline__ float q_value4(u32 c) {
    if (KIND == 0) return __uint_as_float(((c & 7u) << 22) | ((c & 8u) << 28)) * 0x1p126f;
    return __uint_as_float(0x4b000000u | (c & 15u)) - 8388616.f;
}

__device__ __forceinline__ float q_act(float g, float u, u32 act, float alpha, float limit) {
    if (act == 1) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return (u + 1.f) * g / (1.f + expf(-alpha * g));
    }
    if (act == 2) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return g / (1.f + expf(-g)) * u;
}

// The scale of group g for the direct kernels' scale types: E8M0, f16 or bf16.
__device__ __forceinline__ float q_scale32(const unsigned char* s, u32 scale, u64 g) {
    if (scale == 0) {
        const u32 b = s[g];
        return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(b << 23);
    }
    return q_half(s, scale, g);
}

// A: activation type of the reduction input (T for gate_up's x, float for down's h). A warp owns
// RPW consecutive outputs (GU: their gate and up rows): more rows in flight per warp, and the
// tile lookup paid once for them.
// Weight rows of a warp's RPW outputs from o0 (GU: the gate rows, then the up rows; act 1
// interleaves them as gpt-oss stores them) in expert `expert`'s [wrows, K] block; outputs past
// nout read row nout − 1 and store nothing. R: u64, or u32 where the host checked E · 2F < 2^32.
template <bool GU, int RPW, int NW, typename R>
__device__ __forceinline__ void moe_q_rows(R (&row)[NW], u32 expert, u32 wrows, u32 o0, u32 nout,
                                           u32 act) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const u32 o = min(o0 + r, nout - 1);
        const R base = (R)expert * wrows;
        if (GU) {
            row[r] = base + (act == 1 ? 2 * o : o);
            row[NW - RPW + r] = base + (act == 1 ? 2 * o + 1 : nout + o);
        } else {
            row[r] = base + o;
        }
    }
}

// The 8 values of word j (0–3) of each of the warp's NW 16-byte code loads, as floats.
template <int KIND, int NW>
__device__ __forceinline__ void moe_q_decode(float (&wv)[NW][8], const uint4 (&w)[NW], int j) {
#pragma unroll
    for (int r = 0; r < NW; r++) {
        const u32 word = j == 0 ? w[r].x : j == 1 ? w[r].y : j == 2 ? w[r].z : w[r].w;
#pragma unroll
        for (int q = 0; q < 8; q++) wv[r][q] = q_value4<KIND>((word >> (4 * q)) & 15u);
    }
}

// acc[r][i] += s[r] · Σ_q w[r][q] · x[q] for the NW weight rows of a warp and one row i of x
// (8-value partial sums, then one FMA with the group scale; both direct kernels).
template <int NW, int MT>
__device__ __forceinline__ void moe_q_dot(float (&acc)[NW][MT], int i, const float (&wv)[NW][8],
                                          const float (&xf)[8], const float (&s)[NW]) {
#pragma unroll
    for (int r = 0; r < NW; r++) {
        float dsum = 0.f;
#pragma unroll
        for (int q = 0; q < 8; q++) dsum = fmaf(wv[r][q], xf[q], dsum);
        acc[r][i] = fmaf(dsum, s[r], acc[r][i]);
    }
}

// The direct kernels' epilogue: warp sums of each of the tile's `rows` rows, biases, the
// activation (gate/up) and the f32 store of the warp's RPW outputs from o0 (o0 < nout).
template <typename T, bool GU, int MT, int RPW, int NW, typename R>
__device__ __forceinline__ void moe_q_store(float (&acc)[NW][MT], u32 rows, u32 lane, u32 o0,
                                            u32 nout, const R (&row)[NW],
                                            const T* __restrict__ bias, u32 act, float alpha,
                                            float limit, float* __restrict__ out, u32 first) {
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (i >= (int)rows) break;  // uniform over the block: every lane stops together
        float v[NW];
#pragma unroll
        for (int r = 0; r < NW; r++) v[r] = warp_sum(acc[r][i]);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                if (o0 + r >= nout) break;
                float y;
                if (GU) {
                    float g = v[r], u = v[NW - RPW + r];
                    if (bias) {
                        g += to_f(bias[row[r]]);
                        u += to_f(bias[row[NW - RPW + r]]);
                    }
                    y = q_act(g, u, act, alpha, limit);
                } else {
                    y = v[r] + (bias ? to_f(bias[row[r]]) : 0.f);
                }
                out[(u64)(first + i) * nout + o0 + r] = y;
            }
        }
    }
}

template <typename T, typename A, int KIND, bool GU, int MT, int RPW>
__device__ __forceinline__ void moe_q_impl(const A* __restrict__ a, const unsigned char* codes,
                                           const unsigned char* scales, const T* __restrict__ bias,
                                           float* __restrict__ out, const u32* __restrict__ offsets,
                                           const u32* __restrict__ sorted,
                                           const u32* __restrict__ tiles,
                                           const u32* __restrict__ ntiles, u32 gather_k, u32 nout,
                                           u32 kdim, u32 scale, u32 group, u32 act, float alpha,
                                           float limit) {
    constexpr int NW = GU ? 2 * RPW : RPW;  // weight rows per warp: gates then ups
    grid_dep_wait();
    const u32 ti = blockIdx.y;
    if (ti >= *ntiles) return;
    const u32 lane = threadIdx.x & 31;
    const u32 o0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * RPW;
    if (o0 >= nout) return;
    const u32 expert = tiles[2 * ti];
    const u32 r0 = tiles[2 * ti + 1];
    const u32 first = offsets[expert] + r0;
    const u32 rows = min((u32)MT, offsets[expert + 1] - first);
    const u32 wrows = GU ? 2 * nout : nout;
    u64 row[NW];
    moe_q_rows<GU, RPW>(row, expert, wrows, o0, nout, act);
    const A* xr[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const u32 sp = first + min((u32)i, rows - 1);
        xr[i] = a + (u64)(gather_k ? sorted[sp] / gather_k : sp) * kdim;
    }
    float acc[NW][MT];
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = 0.f;
    // Codes and scales of the next step are loaded before this step's arithmetic (two steps'
    // bytes in flight per lane).
    uint4 w[NW];
    float s[NW];
    auto load = [&](u32 c, uint4* wd, float* sd) {
#pragma unroll
        for (int r = 0; r < NW; r++) {
            const u64 e = row[r] * kdim + c;
            wd[r] = q_ld_stream16(codes + e / 2);
            sd[r] = q_scale32(scales, scale, e / group);
        }
    };
    if (lane * 32 < kdim) load(lane * 32, w, s);
    for (u32 c0 = lane * 32; c0 < kdim; c0 += 32 * 32) {
        uint4 wn[NW];
        float sn[NW];
        if (c0 + 32 * 32 < kdim) load(c0 + 32 * 32, wn, sn);
        // Not unrolled: four copies of the body cost NVRTC seconds at load, not speed (the
        // loads are issued above).
#pragma unroll 1
        for (int j = 0; j < 4; j++) {
            float wv[NW][8];
            moe_q_decode<KIND>(wv, w, j);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                if (i < (int)rows) {
                    Vec8<A> xv;
                    xv.load(xr[i] + c0 + 8 * j);
                    float xf[8];
                    xv.to_float(xf);
                    moe_q_dot<NW, MT>(acc, i, wv, xf, s);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < NW; r++) {
            w[r] = wn[r];
            s[r] = sn[r];
        }
    }
    moe_q_store<T, GU, MT, RPW, NW>(acc, rows, lane, o0, nout, row, bias, act, alpha, limit, out,
                                    first);
}

// Tiles of up to 8 pairs (m8): the tile's activation rows are staged once per block in shared
// memory as f32, 1024 columns (one warp step: 32 lanes x 32 codes) at a time (8 rows x 1024 x
// 4 B = 32 KB), so the block's eight warps read them from shared memory instead of each
// re-reading the rows from global memory with 128-byte lane strides. Layout per row: float4
// unit u of the chunk (columns 4u..4u+3; lane u / 8's sub-step u % 8) at (u % 8) * 32 + u / 8,
// so a lane-contiguous float4 read (one sub-step, all lanes) is free of bank conflicts, and so
// is the staging write (thread t writes unit position t). Each warp owns RPW outputs (GU: their
// gate and up rows), decodes each code once and applies it to the tile's rows, in the same
// order of operations as moe_q_impl (8-value partial sums, then one FMA with the group scale):
// bit-equal results. Every warp takes part in the staging: warps past nout compute row
// nout - 1 and store nothing. Blocks of 256 threads (one float4 unit of each row per thread and
// chunk), as the host launches them.
constexpr int MOE_Q_KC = 1024;

template <typename A> __device__ __forceinline__ float4 q_ld4f(const A* p) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    A v0, v1, v2, v3;
    v0.x = (u16)(r.x & 0xffffu);
    v1.x = (u16)(r.x >> 16);
    v2.x = (u16)(r.y & 0xffffu);
    v3.x = (u16)(r.y >> 16);
    return make_float4(to_f(v0), to_f(v1), to_f(v2), to_f(v3));
}
template <> __device__ __forceinline__ float4 q_ld4f<float>(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}

template <typename T, typename A, int KIND, bool GU, int RPW>
__device__ __forceinline__ void moe_q8_impl(const A* __restrict__ a, const unsigned char* codes,
                                            const unsigned char* scales,
                                            const T* __restrict__ bias, float* __restrict__ out,
                                            const u32* __restrict__ offsets,
                                            const u32* __restrict__ sorted,
                                            const u32* __restrict__ tiles,
                                            const u32* __restrict__ ntiles, u32 gather_k,
                                            u32 nout, u32 kdim, u32 scale, u32 group, u32 act,
                                            float alpha, float limit) {
    constexpr int MT = 8;
    constexpr int NW = GU ? 2 * RPW : RPW;  // weight rows per warp: gates then ups
    __shared__ float4 xs[MT * MOE_Q_KC / 4];
    grid_dep_wait();
    const u32 ti = blockIdx.y;
    if (ti >= *ntiles) return;  // uniform over the block
    const u32 lane = threadIdx.x & 31;
    const u32 o0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * RPW;
    const u32 expert = tiles[2 * ti];
    const u32 r0 = tiles[2 * ti + 1];
    const u32 first = offsets[expert] + r0;
    const u32 rows = min((u32)MT, offsets[expert + 1] - first);
    const u32 wrows = GU ? 2 * nout : nout;
    u32 row[NW];  // the host checked E · 2F < 2^32
    moe_q_rows<GU, RPW>(row, expert, wrows, o0, nout, act);
    // Staging: thread t writes unit position t of each row (row k of iteration k): column
    // 4 * ((t % 32) * 8 + t / 32) of the chunk.
    const u32 scol = 4 * ((threadIdx.x & 31) * 8 + (threadIdx.x >> 5));
    float acc[NW][MT];
#pragma unroll
    for (int r = 0; r < NW; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = 0.f;
    uint4 w[NW];
    float s[NW];
    // The codes of a chunk are issued one chunk ahead (in flight across the previous chunk's
    // arithmetic and this chunk's staging), its scales before the staging.
    auto load = [&](u32 c, uint4* wd) {
#pragma unroll
        for (int r = 0; r < NW; r++) wd[r] = q_ld_stream16(codes + ((u64)row[r] * kdim + c) / 2);
    };
    if (lane * 32 < kdim) load(lane * 32, w);
    for (u32 k0 = 0; k0 < kdim; k0 += MOE_Q_KC) {
        const u32 c0 = k0 + lane * 32;
        uint4 wn[NW];
        if (c0 + MOE_Q_KC < kdim) load(c0 + MOE_Q_KC, wn);
        if (c0 < kdim) {
#pragma unroll
            for (int r = 0; r < NW; r++)
                s[r] = q_scale32(scales, scale, ((u64)row[r] * kdim + c0) / group);
        }
        if (k0 != 0) __syncthreads();  // the previous chunk's reads are done
        if (k0 + scol < kdim) {
#pragma unroll
            for (int i = 0; i < MT; i++) {
                if (i < (int)rows) {
                    const u32 sp = first + i;
                    const A* xr = a + (u64)(gather_k ? sorted[sp] / gather_k : sp) * kdim;
                    xs[i * (MOE_Q_KC / 4) + threadIdx.x] = q_ld4f<A>(xr + k0 + scol);
                }
            }
        }
        __syncthreads();
        if (c0 < kdim) {
#pragma unroll 1
            for (int j = 0; j < 4; j++) {
                float wv[NW][8];
                moe_q_decode<KIND>(wv, w, j);
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    if (i < (int)rows) {
                        const float4 xa = xs[i * (MOE_Q_KC / 4) + (2 * j) * 32 + lane];
                        const float4 xb = xs[i * (MOE_Q_KC / 4) + (2 * j + 1) * 32 + lane];
                        const float xf[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
                        moe_q_dot<NW, MT>(acc, i, wv, xf, s);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < NW; r++) w[r] = wn[r];
    }
    if (o0 >= nout) return;  // after the last __syncthreads
    moe_q_store<T, GU, MT, RPW, NW>(acc, rows, lane, o0, nout, row, bias, act, alpha, limit, out,
                                    first);
}

template <typename T>
__device__ __forceinline__ void moe_q_combine_impl(const float* __restrict__ y2,
                                                   const u32* __restrict__ pos,
                                                   const float* __restrict__ weights,
                                                   T* __restrict__ y, u32 n, u32 k, u32 d) {
    grid_dep_wait();
    // grid = (column blocks, tokens): a decode step's one token still spreads over the SMs.
    for (u32 t = blockIdx.y; t < n; t += gridDim.y) {
        for (u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < d; c += gridDim.x * blockDim.x) {
            float acc = 0.f;
            for (u32 j = 0; j < k; j++) {
                const u32 sp = pos[(u64)t * k + j];
                if (sp == 0xffffffffu) continue;
                acc = fmaf(weights[(u64)t * k + j], y2[(u64)sp * d + c], acc);
            }
            y[(u64)t * d + c] = from_f<T>(acc);
        }
    }
}

#define MOE_Q_ARGS(A, T)                                                                      \
    const A *a, const unsigned char *codes, const unsigned char *scales, const T *bias,       \
        float *out, const u32 *offsets, const u32 *sorted, const u32 *tiles, const u32 *ntiles, \
        u32 gather_k, u32 nout, u32 kdim, u32 scale, u32 group, u32 act, float alpha, float limit
#define MOE_Q_PASS                                                                            \
    a, codes, scales, bias, out, offsets, sorted, tiles, ntiles, gather_k, nout, kdim, scale, \
        group, act, alpha, limit
// Rows per warp: 2 gate/up outputs or 4 down outputs. Minimum blocks per SM as register caps
// (ptxas takes up to 145 registers unasked): m1 3 (≤ 80 registers, no spills); m8 2 (≤ 128
// registers, 32 KB shared memory per block; ptxas -v with NVRTC 13, sm_90, every dtype and
// kind: 126–128 registers, no spills).
#define MOE_Q_ONE(S, T, KN, KIND, MT, RPW_GU, RPW_DN, MINB_GU, MINB_DN)                       \
    extern "C" __global__ void __launch_bounds__(256, MINB_GU)                                \
        moe_q_##S##_##KN##_gu_m##MT(MOE_Q_ARGS(T, T)) {                                       \
        moe_q_impl<T, T, KIND, true, MT, RPW_GU>(MOE_Q_PASS);                                 \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256, MINB_DN)                                \
        moe_q_##S##_##KN##_dn_m##MT(MOE_Q_ARGS(float, T)) {                                   \
        moe_q_impl<T, float, KIND, false, MT, RPW_DN>(MOE_Q_PASS);                            \
    }
// m8: moe_q8_impl (activations staged in shared memory), 2 gate/up or 4 down outputs per warp.
#define MOE_Q_EIGHT(S, T, KN, KIND, RPW_GU, RPW_DN, MINB_GU, MINB_DN)                         \
    extern "C" __global__ void __launch_bounds__(256, MINB_GU)                                \
        moe_q_##S##_##KN##_gu_m8(MOE_Q_ARGS(T, T)) {                                          \
        moe_q8_impl<T, T, KIND, true, RPW_GU>(MOE_Q_PASS);                                    \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256, MINB_DN)                                \
        moe_q_##S##_##KN##_dn_m8(MOE_Q_ARGS(float, T)) {                                      \
        moe_q8_impl<T, float, KIND, false, RPW_DN>(MOE_Q_PASS);                               \
    }
#define MOE_Q_KIND(S, T, KN, KIND)                                                            \
    MOE_Q_ONE(S, T, KN, KIND, 1, 2, 4, 3, 3) MOE_Q_EIGHT(S, T, KN, KIND, 2, 4, 2, 2)
#define MOE_Q(S, T)                                                                           \
    MOE_Q_KIND(S, T, fp4, 0) MOE_Q_KIND(S, T, int4, 1)                                        \
    extern "C" __global__ void moe_q_combine_##S(const float* y2, const u32* pos,             \
                                                 const float* wts, T* y, u32 n, u32 k, u32 d) { \
        moe_q_combine_impl<T>(y2, pos, wts, y, n, k, d);                                      \
    }
DAYONE_FOR_FLOAT_TYPES(MOE_Q)
