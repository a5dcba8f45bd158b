// MoE helpers shared by the `moe` and `moe_fp8` kernel families (nvrtc_cache::KERNEL_SOURCES
// puts this file after common.cuh and before each family's own source): the tile map of the
// sorted (token, choice) pairs, the expert activations, per-expert biases, and the epilogue of
// the 64-row × 128-weight-row grouped GEMMs (moe_mma in moe.cu, moe_fp8_mma in moe_fp8.cu).

// Which rows a tile covers. `gather_k` > 0: A row of sorted position sp is token sorted[sp] / k
// (gate_up reads x); 0: A row is sp itself (down reads h).
struct MoeTile {
    u32 expert, first, rows;  // first sorted position, rows in the tile
};
__device__ __forceinline__ bool moe_tile_at(u32 ti, const u32* offsets, const u32* tiles,
                                            const u32* ntiles, u32 bt, MoeTile& t) {
    if (ti >= *ntiles) return false;
    t.expert = tiles[2 * ti];
    const u32 r0 = tiles[2 * ti + 1];
    const u32 o0 = offsets[t.expert], o1 = offsets[t.expert + 1];
    t.first = o0 + r0;
    t.rows = min(bt, o1 - o0 - r0);
    return true;
}
// Tile blockIdx.y.
__device__ __forceinline__ bool moe_tile(const u32* offsets, const u32* tiles, const u32* ntiles,
                                         u32 bt, MoeTile& t) {
    return moe_tile_at(blockIdx.y, offsets, tiles, ntiles, bt, t);
}
// Grouped rasterisation of a (column blocks, tiles) grid: blocks in launch order run every
// column block of RG consecutive tiles before the next RG tiles, the tiles of one column block
// next to each other. The tiles of an expert are adjacent in the tile list, so an expert's
// tiles read each weight slice within a few blocks of each other (an L2 hit after the first),
// and the group's activation rows stay in L2 across its column blocks — instead of every tile
// streaming all of its expert's weights again. Block → (column block, tile); the last group
// may have fewer tiles.
template <int RG>
__device__ __forceinline__ void moe_raster(u32& col, u32& tile) {
    const u32 nc = gridDim.x, l = blockIdx.y * nc + blockIdx.x;
    const u32 group = l / (RG * nc), in = l % (RG * nc);
    const u32 gt = min((u32)RG, gridDim.y - group * RG);
    col = in / gt;
    tile = group * RG + in % gt;
}
__device__ __forceinline__ u32 moe_src_row(const u32* sorted, u32 gather_k, u32 sp) {
    return gather_k ? sorted[sp] / gather_k : sp;
}

__device__ __forceinline__ float silu_f(float g) { return g / (1.f + expf(-g)); }

// The gate_up epilogue: silu(g) · u, or with limit > 0 (glm5_next's swiglu_limit)
// silu(min(g, limit)) · clamp(u, −limit, limit).
__device__ __forceinline__ float swiglu_f(float g, float u, float limit) {
    if (limit > 0.f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return silu_f(g) * u;
}

// The expert activations of dayone_backend::ExpertAct, as the kernels number them: act 0/2
// SwiGLU on rows [gate; up] (clamped when limit > 0); act 1 gpt-oss's GLU on interleaved rows
// (2i gate, 2i + 1 up): g = min(g, limit), u = clamp(u, −limit, limit), (u + 1) · g · σ(αg)
// (HF `GptOssExperts._apply_gate`).
__device__ __forceinline__ u32 moe_gu_row(u32 o, bool up, u32 nout, u32 act) {
    return act == 1 ? 2 * o + (up ? 1u : 0u) : (up ? nout + o : o);
}
__device__ __forceinline__ float moe_act_f(float g, float u, float limit, u32 act, float alpha) {
    if (act == 1) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return (u + 1.f) * g / (1.f + expf(-alpha * g));
    }
    return swiglu_f(g, u, limit);
}
// Weight row of smem B row `br` in a grouped-GEMM block whose outputs start at n0; ok: the
// output exists (o < nout). GU: smem rows 0 .. HALF are the gate rows of outputs n0 + br, rows
// HALF .. 2·HALF the up rows of outputs n0 + br − HALF; else output n0 + br's row.
template <bool GU, u32 HALF>
__device__ __forceinline__ u32 moe_weight_row(u32 n0, u32 br, u32 nout, u32 act, bool& ok) {
    if (GU) {
        const u32 o = n0 + br % HALF;
        ok = o < nout;
        return moe_gu_row(o, br >= HALF, nout, act);
    }
    ok = n0 + br < nout;
    return n0 + br;
}
// Per-expert bias of weight row `row` (`bias` [E, wrows] or null).
template <typename T>
__device__ __forceinline__ float moe_bias(const T* bias, u32 expert, u32 wrows, u32 row) {
    return bias ? to_f(bias[(u64)expert * wrows + row]) : 0.f;
}

// The k loop of the grouped GEMMs: a STAGES-deep cp.async pipeline over nk k slices.
// load(kt, st) issues slice kt's copies into stage st; compute(st) consumes stage st. Every
// warp is done with stage (kt − 1) % STAGES, which the load after compute overwrites, only after
// the barrier at the top of iteration kt. Returns once every copy has landed.
template <int STAGES, typename Load, typename Compute>
__device__ __forceinline__ void moe_kloop(u32 nk, Load&& load, Compute&& compute) {
#pragma unroll
    for (u32 s = 0; s < STAGES - 1; s++) {
        if (s < nk) load(s, s);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < nk; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        compute(kt % STAGES);
        if (kt + STAGES - 1 < nk) load(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        cp_async_commit();
    }
    cp_async_wait<0>();
}

// Start of the 64 × 128 grouped GEMMs (8 warps as 2 × 4, warp column wn): zeroed accumulators
// and pb, the smem row of the first of each pair of this warp's n-tiles (GU: gate rows 0 .. 64,
// up rows 64 .. 128).
template <bool GU>
__device__ __forceinline__ void moe_mma_start(float (&acc)[2][4][4], u32 (&pb)[2], u32 wn) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    if (GU) {
        pb[0] = wn * 16;
        pb[1] = 64 + wn * 16;
    } else {
        pb[0] = wn * 32;
        pb[1] = wn * 32 + 16;
    }
}

// Epilogue of the 64 × 128 grouped GEMMs: 8 warps as 2 (rows, wm) × 4 (weight rows, wn), each
// with acc[mt][j]: rows wm·32 + mt·16 + g (+8), columns (n-tile j) t4·2 + {0, 1}. GU: n-tiles
// 0, 1 are gate columns n0 + wn·16 + j·8 .., 2, 3 the same columns' up rows; out[sp, o] =
// act(g + bias, u + bias) for 64 outputs; else out[sp, o] = acc + bias for 128 outputs.
template <typename T, bool GU>
__device__ __forceinline__ void moe_mma_epilogue(const float (&acc)[2][4][4], T* __restrict__ out,
                                                 const MoeTile& tl, u32 wm, u32 wn, u32 g, u32 t4,
                                                 u32 n0, u32 nout, u32 wrows, float limit,
                                                 const T* __restrict__ bias, u32 act, float alpha) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const u32 row = wm * 32 + mt * 16 + g + 8 * (e >> 1);
            if (row >= tl.rows) continue;
            T* orow = out + (u64)(tl.first + row) * nout;
            if (GU) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const u32 col = n0 + wn * 16 + j * 8 + t4 * 2 + (e & 1);
                    if (col < nout) {
                        const float gv = acc[mt][j][e] + moe_bias(bias, tl.expert, wrows, moe_gu_row(col, false, nout, act));
                        const float uv = acc[mt][j + 2][e] + moe_bias(bias, tl.expert, wrows, moe_gu_row(col, true, nout, act));
                        orow[col] = from_f<T>(moe_act_f(gv, uv, limit, act, alpha));
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const u32 col = n0 + wn * 32 + j * 8 + t4 * 2 + (e & 1);
                    if (col < nout) orow[col] = from_f<T>(acc[mt][j][e] + moe_bias(bias, tl.expert, wrows, col));
                }
            }
        }
}
