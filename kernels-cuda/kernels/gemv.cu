// Skinny matrix product for decode: y[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n]), M <= 8 rows of x.
// x [M, K], w [N, K] (row-major, the safetensors [out, in] layout), bias [N] or null, y [M, N];
// one dtype T; f32 accumulation. Memory-bound: every weight byte is read once with 16-byte loads
// that skip L1 (weights are streamed), while x stays in L1/L2.
//
// A block of 256 threads owns RPW consecutive rows of w and splits K among its threads: thread t
// reads elements [8t, 8t + 8) of every 2048-element step, U steps per loop iteration, so that
// RPW·U weight loads per thread are independent. The 8 warps' partial sums meet in shared memory.
// K must be a multiple of 8. grid.x = ceil(N / RPW).
//
// `w_const` != 0 (w uploaded as a weight: no kernel writes it) lets a block issue its first
// weight loads before `griddepcontrol.wait`, so under programmatic dependent launch the first
// wave's weights stream in while the previous kernel finishes: a decode step is a chain of
// GEMVs each too short to hide its own memory latency (an 8 MB k projection takes ≈ 7 µs).

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)

__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

template <typename T> struct WLoad;
template <> struct WLoad<float> {
    static __device__ __forceinline__ void load(Vec8<float>& v, const float* p) {
        const uint4 a = ld_stream16(p), b = ld_stream16(p + 4);
        v.a = make_float4(__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(a.z), __uint_as_float(a.w));
        v.b = make_float4(__uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w));
    }
};
template <typename H> struct WLoadHalf {
    static __device__ __forceinline__ void load(Vec8<H>& v, const H* p) { v.r = ld_stream16(p); }
};
template <> struct WLoad<bf16> : WLoadHalf<bf16> {};
template <> struct WLoad<f16> : WLoadHalf<f16> {};

// acc[r][i] += w[r][kk .. kk + 8) · x[i][kk .. kk + 8) with the weights already in `wv`.
template <typename T, int MT, int RPW, typename TX = T>
__device__ __forceinline__ void gemv_accum(const Vec8<T> (&wv)[RPW], const TX* const* xr, u32 kk,
                                           float (&acc)[RPW][MT]) {
    float xf[MT][8];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        Vec8<TX> v;
        v.load(xr[i] + kk);
        v.to_float(xf[i]);
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        float wf[8];
        wv[r].to_float(wf);
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][i] = fmaf(wf[e], xf[i][e], acc[r][i]);
    }
}

template <typename T, int RPW, int U>
__device__ __forceinline__ void gemv_wload(Vec8<T> (&wv)[U][RPW], const T* const* wr, u32 kb) {
    constexpr u32 STEP = GEMV_THREADS * 8;
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < RPW; r++) WLoad<T>::load(wv[u][r], wr[r] + kb + u * STEP);
}

// Pre-norm input computed inside the GEMV (`gemv_many_norm_*`, `gemv_glu_norm_*`: a
// pre-norm sublayer's first projections): x = rms_norm(a + r) with weight g (r null:
// rms_norm(a)), rounded to T, into shared memory `xs` [min(M, MT), K] before the main loop —
// one launch and one store and load of x fewer than `add_rms_norm` then the GEMV, and
// bit-equal to them. norm.cu's kernel runs `vt` threads (256, or 512 from D = 2048) of which
// thread v owns the 8-element chunks 8v + 8·vt·i; here thread t owns chunks 8t + 2048c, i.e.
// those of norm thread t + 256·(c mod 2) when vt = 512, so per-thread partial sums are kept
// per norm thread, reduced per norm warp (warps w and w + 8) and then as norm.cu's warp 0 does,
// lane 0's value being the one used. Each thread reads back only the chunks it wrote, so the
// main loop needs no barrier. Block 0 stores a + r to `sum` (r non-null) and the normed rows
// to `x_out` (non-null: the router's launch, whose x the experts read next).
struct GemvNorm {
    const void* r;  // [M, K] or null
    const void* g;  // [K]
    void* sum;      // [M, K], written by block 0 when r is non-null
    void* x_out;    // [M, K] or null, written by block 0
    float eps;
    u32 vt;         // threads of the norm kernel matched: 256 or 512
};

// The rows' pass: the sums a + r (rounded to T) go to `xs` (and `sum` when store_sum, if xs is
// not `sum` itself), then the normed rows to `dst` (and `x_out`). The prologue passes shared
// memory as both xs and dst; gemv_add_norm_impl passes the `sum` output as xs (global memory,
// each thread reading back only what it wrote) and the normed output as dst.
// Eight values through L2 only (ld.global.cg): values other blocks of this launch wrote.
__device__ __forceinline__ void vec8_load_cg(Vec8<float>& v, const float* p) {
    v.a = __ldcg(reinterpret_cast<const float4*>(p));
    v.b = __ldcg(reinterpret_cast<const float4*>(p + 4));
}
template <typename H> __device__ __forceinline__ void vec8_load_cg(Vec8<H>& v, const H* p) {
    v.r = __ldcg(reinterpret_cast<const uint4*>(p));
}

// CG: `r` was written by other blocks of this launch (gemv_add_norm_impl's y): read through L2.
template <typename T, int MT, bool CG = false>
__device__ __forceinline__ void gemv_norm_rows(const T* __restrict__ a, const GemvNorm& nm,
                                               u32 m, u32 k, T* xs, T* dst, bool store_sum) {
    __shared__ float nred[MT][16];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const T* r = static_cast<const T*>(nm.r);
    const T* g = static_cast<const T*>(nm.g);
    T* sum = static_cast<T*>(nm.sum);
    T* x_out = store_sum ? static_cast<T*>(nm.x_out) : nullptr;
    const bool two = nm.vt == 512;
    const u32 rows = min(m, (u32)MT);
    constexpr u32 STEP = GEMV_THREADS * 8;
    for (u32 i = 0; i < rows; i++) {
        const u64 base = (u64)i * k;
        float s0 = 0.f, s1 = 0.f;
        u32 c = 0;
        for (u32 j = tid * 8; j < k; j += STEP, c++) {
            Vec8<T> v;
            if (r) {
                Vec8<T> va, vb;
                va.load(a + base + j);
                if (CG) vec8_load_cg(vb, r + base + j);
                else vb.load(r + base + j);
                float fa[8], fb[8];
                va.to_float(fa);
                vb.to_float(fb);
#pragma unroll
                for (int e = 0; e < 8; e++) fa[e] = fa[e] + fb[e];
                v.from_float(fa);
                if (store_sum && sum != xs) v.store(sum + base + j);
            } else {
                v.load(a + base + j);
            }
            v.store(xs + base + j);
            float f[8];
            v.to_float(f);
            if (two && (c & 1)) {
#pragma unroll
                for (int e = 0; e < 8; e++) s1 += f[e] * f[e];
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) s0 += f[e] * f[e];
            }
        }
        s0 = warp_sum(s0);
        s1 = warp_sum(s1);
        if (lane == 0) {
            nred[i][warp] = s0;
            nred[i][warp + GEMV_WARPS] = s1;
        }
    }
    __syncthreads();
    const u32 nw = nm.vt / 32;
    for (u32 i = 0; i < rows; i++) {
        const u64 base = (u64)i * k;
        float t = lane < nw ? nred[i][lane] : 0.f;
        t = __shfl_sync(0xffffffffu, warp_sum(t), 0);
        const float inv = rsqrtf(t / (float)k + nm.eps);
        for (u32 j = tid * 8; j < k; j += STEP) {
            Vec8<T> v, wv;
            v.load(xs + base + j);
            wv.load(g + j);
            float f[8], gf[8];
            v.to_float(f);
            wv.to_float(gf);
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] = f[e] * inv * gf[e];
            Vec8<T> o;
            o.from_float(f);
            o.store(dst + base + j);
            if (x_out) o.store(x_out + base + j);
        }
    }
}

template <typename T, int MT>
__device__ __forceinline__ void gemv_norm_prologue(const T* __restrict__ a, const GemvNorm& nm,
                                                   u32 m, u32 k, T* xs, bool store_sum) {
    gemv_norm_rows<T, MT>(a, nm, m, k, xs, xs, store_sum);
}

// Gated-norm input computed inside the GEMV (`gemv_gnorm_*`, Backend::gated_rms_norm_linear:
// KDA's output norm and o_proj): x [M, K] holds K / hd heads of hd values; row i's head h is
// x̂ = w ⊙ x / sqrt(mean(x²) + eps) ⊙ σ(gate) over its hd values (kda.cu gated_rms_norm),
// rounded to T, into shared memory `xs` [min(M, MT), K]. Bit-equal to gated_rms_norm's one
// 256-thread block per head row (hd ≤ 256, so each of its threads holds one value): there a
// warp's butterfly (warp_sum) sums the squares of values 32w..32w+31 and warp 0's butterfly
// sums the eight warps' partials. Here thread t owns the 8-value chunks 8t + 2048c; the four
// threads of a 32-value group are lanes 4q..4q+3 of one warp, so the butterfly's offsets 16 and
// 8 are shuffles with lanes ^2 and ^1 and offsets 4, 2, 1 pair values inside a chunk — the same
// additions in the same order; then each thread gathers its head's partials (hd / 32 ≤ 8,
// lanes 4q of its head's hd / 8 lanes) and adds them as warp 0's butterfly does (the absent
// warps' zeros add exactly). The squares are rounded on their own (__fmul_rn: the norm kernel's
// `ss += f * f` starts from 0, so even contracted it rounds f² alone; here an FMA with the
// shuffled partner would not). hd ∈ {32, 64, 128, 256}.
struct GemvGatedNorm {
    const void* gate;  // [M, K], T
    const void* w;     // [hd], T (w_f32 = 0) or f32
    u32 w_f32;
    u32 hd;
    float eps;
    u32 pad;
};

template <typename T, int MT>
__device__ __forceinline__ void gemv_gated_norm_prologue(const T* __restrict__ a,
                                                         const GemvGatedNorm& gn, u32 m, u32 k,
                                                         T* xs) {
    const u32 tid = threadIdx.x, lane = tid & 31;
    const T* gate = static_cast<const T*>(gn.gate);
    const u32 rows = min(m, (u32)MT), hd = gn.hd, lanes = hd / 8, ng = hd / 32;
    const u32 base_lane = lane & ~(lanes - 1);
    constexpr u32 STEP = GEMV_THREADS * 8;
    for (u32 i = 0; i < rows; i++) {
        const u64 base = (u64)i * k;
        for (u32 j = tid * 8; j < k; j += STEP) {
            Vec8<T> v;
            v.load(a + base + j);
            float f[8], q[8];
            v.to_float(f);
#pragma unroll
            for (int e = 0; e < 8; e++) q[e] = __fmul_rn(f[e], f[e]);  // never fused into the add
#pragma unroll
            for (int e = 0; e < 8; e++) q[e] = q[e] + __shfl_xor_sync(0xffffffffu, q[e], 2);
#pragma unroll
            for (int e = 0; e < 8; e++) q[e] = q[e] + __shfl_xor_sync(0xffffffffu, q[e], 1);
            float r[8];
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) {
#pragma unroll
                for (int e = 0; e < 8; e++) r[e] = q[e] + q[e ^ o];
#pragma unroll
                for (int e = 0; e < 8; e++) q[e] = r[e];
            }
            // q[0]: this 32-value group's sum; the head's groups sit at lanes base + 4g.
            float pw[8];
#pragma unroll
            for (u32 g = 0; g < 8; g++) {
                const float pg = __shfl_sync(0xffffffffu, q[0], (base_lane + 4 * g) & 31);
                pw[g] = g < ng ? pg : 0.f;
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) {
                float t8[8];
#pragma unroll
                for (int g = 0; g < 8; g++) t8[g] = pw[g] + pw[g ^ o];
#pragma unroll
                for (int g = 0; g < 8; g++) pw[g] = t8[g];
            }
            const float inv = rsqrtf(pw[0] / (float)hd + gn.eps);
            const u32 c0 = j % hd;
            Vec8<T> gv;
            gv.load(gate + base + j);
            float gf[8];
            gv.to_float(gf);
            float y[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float wv = gn.w_f32 ? static_cast<const float*>(gn.w)[c0 + e]
                                          : to_f(static_cast<const T*>(gn.w)[c0 + e]);
                y[e] = f[e] * inv * wv / (1.f + expf(-gf[e]));
            }
            Vec8<T> o;
            o.from_float(y);
            o.store(xs + base + j);
        }
    }
}

// TX: x's dtype (T but for the router's `gemv_x*_f32`, which widens 16-bit x as it loads it).
// GLU (`gemv_glu_*`, SwiGLU's gate and up in one launch): the block's RPW rows are RPW / 2 rows
// of w (gate) and the same rows of w_up; y[i, row] = silu(g) · u with g and u first rounded to T
// as the two projections' outputs are, and silu_mul's f32 formula — bit-equal to `linear` of
// each then `silu_mul`, without writing g and u.
// NORM: x is the pre-norm input `a` of `nm` (see gemv_norm_prologue; dynamic shared memory
// min(M, MT) · K elements).
// GNORM: x is the gated norm's input (gemv_gated_norm_prologue; dynamic shared memory as NORM).
template <typename T, int MT, int RPW, int U, typename TX = T, bool GLU = false, bool NORM = false,
          bool GNORM = false>
__device__ __forceinline__ void gemv_impl(const TX* __restrict__ x, const T* __restrict__ w,
                                          const T* __restrict__ bias, T* __restrict__ y, u32 m,
                                          u32 n, u32 k, u32 w_const, u32 row0,
                                          const T* __restrict__ w_up = nullptr,
                                          const GemvNorm* nm = nullptr,
                                          const GemvGatedNorm* gn = nullptr) {
    __shared__ float red[GEMV_WARPS][RPW * MT];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // Rows past N and x rows past M re-read a valid row and are dropped at the end, so the
    // main loop has no branches and all of its loads can be in flight together.
    constexpr int ROWS = GLU ? RPW / 2 : RPW;  // output rows of the block
    const T* wr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++)
        wr[r] = (GLU && r >= ROWS ? w_up : w) + (u64)min(row0 + r % ROWS, n - 1) * k;
    const TX* xr[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) xr[i] = x + (u64)min((u32)i, m - 1) * k;
    float acc[RPW][MT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) acc[r][i] = 0.f;

    constexpr u32 STEP = GEMV_THREADS * 8;
    const u32 kfull = k - k % (STEP * U);
    // The first iteration's weights (of the unrolled loop, else of the remainder loop): before
    // the wait when w is constant (see the top).
    Vec8<T> wv[U][RPW];
    const u32 k0 = tid * 8;
    const bool first_full = k0 < kfull, first_rest = kfull == 0 && k0 < k;
    auto load_first = [&]() {
        if (first_full) gemv_wload<T, RPW, U>(wv, wr, k0);
        if (first_rest)
#pragma unroll
            for (int r = 0; r < RPW; r++) WLoad<T>::load(wv[0][r], wr[r] + k0);
    };
    if (w_const) load_first();
    grid_dep_wait();
    if (!w_const) load_first();
    if constexpr (NORM) {
        extern __shared__ __align__(16) unsigned char gemv_dsmem[];
        TX* xs = reinterpret_cast<TX*>(gemv_dsmem);
        gemv_norm_prologue<TX, MT>(x, *nm, m, k, xs, blockIdx.x == 0);
#pragma unroll
        for (int i = 0; i < MT; i++) xr[i] = xs + (u64)min((u32)i, m - 1) * k;
    }
    if constexpr (GNORM) {
        extern __shared__ __align__(16) unsigned char gemv_dsmem[];
        TX* xs = reinterpret_cast<TX*>(gemv_dsmem);
        gemv_gated_norm_prologue<TX, MT>(x, *gn, m, k, xs);
#pragma unroll
        for (int i = 0; i < MT; i++) xr[i] = xs + (u64)min((u32)i, m - 1) * k;
    }
    for (u32 kb = k0; kb < kfull; kb += STEP * U) {
        if (kb != k0) gemv_wload<T, RPW, U>(wv, wr, kb);
#pragma unroll
        for (int u = 0; u < U; u++) {
            float xf[MT][8];
#pragma unroll
            for (int i = 0; i < MT; i++) {
                Vec8<TX> v;
                v.load(xr[i] + kb + u * STEP);
                v.to_float(xf[i]);
            }
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                float wf[8];
                wv[u][r].to_float(wf);
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[r][i] = fmaf(wf[e], xf[i][e], acc[r][i]);
            }
        }
    }
    for (u32 kk = kfull + k0; kk < k; kk += STEP) {
        if (!(first_rest && kk == k0))
#pragma unroll
            for (int r = 0; r < RPW; r++) WLoad<T>::load(wv[0][r], wr[r] + kk);
        gemv_accum<T, MT, RPW, TX>(wv[0], xr, kk, acc);
    }

#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const float s = warp_sum(acc[r][i]);
            if (lane == 0) red[warp][r * MT + i] = s;
        }
    __syncthreads();
    if (GLU) {
        if (tid < ROWS * MT) {
            const u32 r = tid / MT, i = tid % MT;
            float g = 0.f, u = 0.f;
#pragma unroll
            for (int wi = 0; wi < GEMV_WARPS; wi++) g += red[wi][tid];
#pragma unroll
            for (int wi = 0; wi < GEMV_WARPS; wi++) u += red[wi][tid + ROWS * MT];
            if (row0 + r < n && i < m) {
                g = to_f(from_f<T>(g));
                u = to_f(from_f<T>(u));
                y[(u64)i * n + row0 + r] = from_f<T>(g / (1.f + expf(-g)) * u);
            }
        }
    } else if (tid < RPW * MT) {
        const u32 r = tid / MT, i = tid % MT;
        float s = 0.f;
#pragma unroll
        for (int wi = 0; wi < GEMV_WARPS; wi++) s += red[wi][tid];
        if (row0 + r < n && i < m) {
            if (bias) s += to_f(bias[row0 + r]);
            y[(u64)i * n + row0 + r] = from_f<T>(s);
        }
    }
}

// Up to GEMV_SEGS projections of one x in one launch (`linear_many`): segment i has its own
// w [n_i, K], bias and y [M, n_i]; blocks [first[i], first[i + 1]) cover its rows. A segment
// with x[i] set reads that input [M, K] instead of the launch's x (`linear_each`: projections
// of several inputs of one shape; not with the fused norm).
#define GEMV_SEGS 8
struct GemvSegs {
    const void* x[GEMV_SEGS];
    const void* w[GEMV_SEGS];
    const void* bias[GEMV_SEGS];
    void* y[GEMV_SEGS];
    u32 n[GEMV_SEGS];
    u32 first[GEMV_SEGS + 1];
};

template <typename T, int MT, int RPW, int U, bool NORM = false>
__device__ __forceinline__ void gemv_many_impl(const T* x, const GemvSegs& sg, u32 m, u32 k,
                                               u32 w_const, const GemvNorm* nm = nullptr) {
    u32 i = 0;
#pragma unroll
    for (int j = 1; j < GEMV_SEGS; j++)
        if (blockIdx.x >= sg.first[j] && sg.first[j] < sg.first[j + 1]) i = j;
    const T* xi = !NORM && sg.x[i] ? (const T*)sg.x[i] : x;
    gemv_impl<T, MT, RPW, U, T, false, NORM>(xi, (const T*)sg.w[i], (const T*)sg.bias[i],
                                             (T*)sg.y[i], m, sg.n[i], k, w_const,
                                             (blockIdx.x - sg.first[i]) * RPW, nullptr, nm);
}

// Whether this block is the last of the grid to finish (the launch's `counter`, zero before
// it): every block publishes its writes (fence), counts itself, and the last one fences again
// before reading the others' — the entry to a last-block epilogue, which zeroes the counter.
__device__ __forceinline__ bool gemv_last_block(u32* counter) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// A sublayer's last projection with the residual add and the next sublayer's norm
// (`gemv_addnorm_*`, Backend::linear_add_rms_norm): the GEMV's blocks write y [M, N], count
// themselves done, and the last block computes sum = h + y and rms_norm(sum) ⊙ g over the M
// rows of N values with gemv_norm_rows — bit-equal to add_rms_norm of h and y (the arithmetic of
// norm.cu's `vt`-thread kernel, see gemv_norm_prologue), one launch fewer. `sum` doubles as the
// rows' scratch, so no dynamic shared memory; then the counter is zeroed for the next launch.
struct GemvAddNorm {
    GemvNorm nm;  // r = y (the GEMV's output), sum = the sum output, x_out = 0
    const void* h;  // [M, N], the residual
    void* xn;       // [M, N], the normed rows
    u32* counter;
};
template <typename T, int MT, int RPW, int U>
__device__ __forceinline__ void gemv_add_norm_impl(const T* x, const T* w, const T* bias, T* y,
                                                   u32 m, u32 n, u32 k, u32 w_const,
                                                   const GemvAddNorm& an) {
    gemv_impl<T, MT, RPW, U>(x, w, bias, y, m, n, k, w_const, blockIdx.x * RPW);
    if (!gemv_last_block(an.counter)) return;
    gemv_norm_rows<T, MT, true>(static_cast<const T*>(an.h), an.nm, m, n, static_cast<T*>(an.nm.sum),
                          static_cast<T*>(an.xn), true);
    if (threadIdx.x == 0) *an.counter = 0;
}

#define GEMV(S, T, MT, RPW, U)                                                                \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_##S##_m##MT##_r##RPW(     \
        const T* x, const T* w, const T* bias, T* y, u32 m, u32 n, u32 k, u32 w_const) {      \
        gemv_impl<T, MT, RPW, U>(x, w, bias, y, m, n, k, w_const, blockIdx.x * RPW);          \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2)                             \
        gemv_many_##S##_m##MT##_r##RPW(const T* x, GemvSegs segs, u32 m, u32 k, u32 w_const) { \
        gemv_many_impl<T, MT, RPW, U>(x, segs, m, k, w_const);                                \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_addnorm_##S##_m##MT##_r##RPW( \
        const T* x, const T* w, const T* bias, T* y, u32 m, u32 n, u32 k, u32 w_const,        \
        GemvAddNorm an) {                                                                     \
        gemv_add_norm_impl<T, MT, RPW, U>(x, w, bias, y, m, n, k, w_const, an);               \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2)                             \
        gemv_many_norm_##S##_m##MT##_r##RPW(const T* x, GemvSegs segs, u32 m, u32 k,          \
                                            u32 w_const, GemvNorm nm) {                       \
        gemv_many_impl<T, MT, RPW, U, true>(x, segs, m, k, w_const, &nm);                     \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_gnorm_##S##_m##MT##_r##RPW( \
        const T* x, const T* w, const T* bias, T* y, u32 m, u32 n, u32 k, u32 w_const,        \
        GemvGatedNorm gn) {                                                                   \
        gemv_impl<T, MT, RPW, U, T, false, false, true>(x, w, bias, y, m, n, k, w_const,      \
                                                         blockIdx.x * RPW, nullptr, nullptr,  \
                                                         &gn);                                \
    }
// gemv_glu_*_m{MT}_r{R}: R output rows per block (2R weight rows: gate and up).
#define GEMV_GLU(S, T, MT, R, U)                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_glu_##S##_m##MT##_r##R(  \
        const T* x, const T* wg, const T* wu, T* y, u32 m, u32 n, u32 k, u32 w_const) {       \
        gemv_impl<T, MT, 2 * R, U, T, true>(x, wg, nullptr, y, m, n, k, w_const,              \
                                             blockIdx.x * R, wu);                             \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2)                             \
        gemv_glu_norm_##S##_m##MT##_r##R(const T* x, const T* wg, const T* wu, T* y, u32 m,   \
                                         u32 n, u32 k, u32 w_const, GemvNorm nm) {            \
        gemv_impl<T, MT, 2 * R, U, T, true, true>(x, wg, nullptr, y, m, n, k, w_const,        \
                                                   blockIdx.x * R, wu, &nm);                  \
    }
#define GEMV_ALL(S, T)                                                                        \
    GEMV_GLU(S, T, 1, 1, 2) GEMV_GLU(S, T, 1, 2, 2) GEMV_GLU(S, T, 2, 1, 2)                   \
    GEMV_GLU(S, T, 2, 2, 2) GEMV_GLU(S, T, 4, 1, 2) GEMV_GLU(S, T, 4, 2, 1)                   \
    GEMV_GLU(S, T, 8, 1, 2) GEMV_GLU(S, T, 8, 2, 1)                                           \
    GEMV(S, T, 1, 1, 2) GEMV(S, T, 1, 2, 2) GEMV(S, T, 1, 4, 2)                               \
    GEMV(S, T, 2, 1, 2) GEMV(S, T, 2, 2, 2) GEMV(S, T, 2, 4, 2)                               \
    GEMV(S, T, 4, 1, 2) GEMV(S, T, 4, 2, 2) GEMV(S, T, 4, 4, 1)                               \
    GEMV(S, T, 8, 1, 2) GEMV(S, T, 8, 2, 1) GEMV(S, T, 8, 4, 1)
DAYONE_FOR_FLOAT_TYPES(GEMV_ALL)

// MoE router logits (moe_route): y f32 [M, N] = x [M, K] of this module's 16-bit dtype · w f32
// [N, K]ᵀ; the f32 GEMV with x widened as it is loaded, so the same sums, bit for bit, as
// `moe_cast_f32` then `gemv_f32_m*_r*` with one launch less. No bias.
// The router GEMV and the top-k choice in one launch (moe_route at decode sizes): the GEMV's
// blocks write the logits, count themselves done, and the last block runs moe_topk's body
// (kernels/moe_topk.cuh) over the M tokens, then zeroes the counter. The same logits and
// choices, bit for bit, as gemv_x*_f32 then moe_topk. Dynamic smem: moe_topk's.
struct MoeTopkArgs {
    const float* bias;
    u32* ids;
    float* weights;
    u32* counter;
    u32 k, g, topk_group, norm;
    float scale;
};
// NORM (`gemv_x*_f32_topk_norm_*`, Backend::rms_norm_moe_route): x is the pre-norm input of
// `nm` (gemv_norm_prologue); block 0 also writes the normed rows for the experts. The top-k's
// dynamic shared memory reuses the normed rows' (the GEMV is done with them by then).
template <typename T, int MT, int RPW, int U, bool NORM = false>
__device__ __forceinline__ void gemv_x_topk_impl(const T* x, const float* w, float* y, u32 m,
                                                 u32 n, u32 k, u32 w_const,
                                                 const MoeTopkArgs& a,
                                                 const GemvNorm* nm = nullptr) {
    gemv_impl<float, MT, RPW, U, T, false, NORM>(x, w, nullptr, y, m, n, k, w_const,
                                                  blockIdx.x * RPW, nullptr, nm);
    if (!gemv_last_block(a.counter)) return;
    moe_topk_tokens(y, a.bias, a.ids, a.weights, m, n, a.k, a.g, a.topk_group, a.norm, a.scale,
                    0, 1);
    if (threadIdx.x == 0) *a.counter = 0;
}
#define GEMV_X(S, T, MT, RPW, U)                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_x##S##_f32_m##MT##_r##RPW( \
        const T* x, const float* w, const float* bias, float* y, u32 m, u32 n, u32 k,         \
        u32 w_const) {                                                                        \
        gemv_impl<float, MT, RPW, U, T>(x, w, bias, y, m, n, k, w_const, blockIdx.x * RPW);   \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2)                             \
        gemv_x##S##_f32_topk_m##MT##_r##RPW(const T* x, const float* w, float* y, u32 m,      \
                                            u32 n, u32 k, u32 w_const, MoeTopkArgs a) {       \
        gemv_x_topk_impl<T, MT, RPW, U>(x, w, y, m, n, k, w_const, a);                        \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2)                             \
        gemv_x##S##_f32_topk_norm_m##MT##_r##RPW(const T* x, const float* w, float* y, u32 m, \
                                                 u32 n, u32 k, u32 w_const, MoeTopkArgs a,    \
                                                 GemvNorm nm) {                               \
        gemv_x_topk_impl<T, MT, RPW, U, true>(x, w, y, m, n, k, w_const, a, &nm);             \
    }
#define GEMV_X_ALL(S, T)                                                                      \
    GEMV_X(S, T, 1, 1, 2) GEMV_X(S, T, 1, 2, 2) GEMV_X(S, T, 1, 4, 2)                         \
    GEMV_X(S, T, 2, 1, 2) GEMV_X(S, T, 2, 2, 2) GEMV_X(S, T, 2, 4, 2)                         \
    GEMV_X(S, T, 4, 1, 2) GEMV_X(S, T, 4, 2, 2) GEMV_X(S, T, 4, 4, 1)                         \
    GEMV_X(S, T, 8, 1, 2) GEMV_X(S, T, 8, 2, 1) GEMV_X(S, T, 8, 4, 1)
#if defined(DAYONE_ONLY_BF16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_F16))
GEMV_X_ALL(bf16, bf16)
#endif
#if defined(DAYONE_ONLY_F16) || !(defined(DAYONE_ONLY_F32) || defined(DAYONE_ONLY_BF16))
GEMV_X_ALL(f16, f16)
#endif
