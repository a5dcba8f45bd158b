//! Launch-shape arithmetic (host side, unit-tested without a GPU).

/// Threads per block of the attention kernels (both decode and tiled).
pub const ATTN_THREADS: u32 = 128;
/// Keys each decode sub-group unrolls per loop step (`UNR` in `attention_paged.cu`).
pub const DECODE_UNROLL: u32 = 4;
/// Rows (token, head pairs) of one tiled-attention block, and keys per tile.
pub const TILED_ROWS: u32 = 32;
/// Keys per shared-memory tile of the tiled attention kernel.
pub const TILED_BK: u32 = 32;

/// Blocks for a grid-stride loop over `rows` rows: one block per row, at most `cap`.
pub fn row_grid(rows: usize, cap: u32) -> u32 {
    rows.clamp(1, cap as usize) as u32
}

/// Blocks for a grid-stride element-wise kernel over `n` elements, `per_thread` each,
/// `threads` per block, capped at `max_blocks`.
pub fn elementwise_grid(n: usize, per_thread: usize, threads: u32, max_blocks: u32) -> u32 {
    let per_block = per_thread * threads as usize;
    n.div_ceil(per_block).clamp(1, max_blocks as usize) as u32
}

/// Keys per chunk of the batch-invariant attention kernels (`attn_*_inv_*`): a multiple of
/// both tiled kernels' key tiles (32 and 64). Decode splits a query's keys at these positions.
pub const INV_ATTN_CHUNK: usize = 512;

/// Threads per block of the skinny-GEMV kernel (`GEMV_THREADS` in `gemv.cu`).
pub const GEMV_THREADS: u32 = 256;

/// A numeric tuning knob from the environment: `None` when `name` is unset; a value that does not
/// parse or fails `valid` is ignored with one warning line naming the variable, the value and
/// `expected` (a mistyped sweep value would otherwise time the default without a word).
pub(crate) fn env_knob<T: std::str::FromStr>(
    name: &str,
    valid: impl Fn(&T) -> bool,
    expected: &str,
) -> Option<T> {
    let v = std::env::var(name).ok()?;
    let parsed = v.trim().parse().ok().filter(|x| valid(x));
    if parsed.is_none() {
        eprintln!("warning: {name}={v:?} is not {expected}; ignored");
    }
    parsed
}

/// Largest M sent to the GEMV kernel (`DAYONE_CUDA_GEMV_MAX_M`, default 4). Measured on the
/// H200 with Llama-3.1-8B shapes: an 8-row GEMV step took 9.4 ms against 8.4 ms for a 64-row
/// cuBLAS step — at 8 rows the kernel's f32 FMAs, not memory, bound it.
pub fn gemv_max_m() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| env_knob("DAYONE_CUDA_GEMV_MAX_M", |_| true, "a row count").unwrap_or(4))
}

/// The GEMV variant for `m` rows of x: `MT` = 1, 2, 4 or 8 (rows past `m` are masked);
/// `None` when `m > gemv_max_m()` or `k` is not a multiple of 8 (cuBLAS handles those).
pub fn gemv_mt(m: usize, k: usize) -> Option<u32> {
    if k == 0 || !k.is_multiple_of(8) || m > gemv_max_m() {
        return None;
    }
    match m {
        1 => Some(1),
        2 => Some(2),
        3..=4 => Some(4),
        5..=8 => Some(8),
        _ => None,
    }
}

/// Whether `DAYONE_CUDA_GEMV_TC=1` asks for the tensor-core skinny product ([`gemv_tc_plan`]);
/// another value than `0` or `1` warns ([`env_knob`]) and leaves it off.
pub fn gemv_tc_from_env() -> bool {
    env_knob("DAYONE_CUDA_GEMV_TC", |&v: &u8| v <= 1, "0 or 1") == Some(1)
}

/// Largest M (rows of x) of the tensor-core skinny product (`gemv_tc_*`, kernels/gemv_tc.cu):
/// two MMA token tiles of 8.
pub const GEMV_TC_MAX_M: usize = 16;

/// The tensor-core skinny product's `(NT, RG)` for `m` rows of x, `n` weight rows, reduction
/// `k`, on a device of `sms` SMs: `NT` token tiles of 8 (`m ≤ 8` → 1, else 2) and `RG` 16-row
/// weight tiles per block (2, or 1 when N / 32 blocks would leave SMs idle, as for a k or v
/// projection). `None` outside `gemv_max_m() < m ≤ 16` or when `k % 8 != 0`; the caller checks
/// the dtype (16-bit only) and whether the kernel is enabled.
pub fn gemv_tc_plan(m: usize, n: usize, k: usize, sms: u32) -> Option<(u32, u32)> {
    if m <= gemv_max_m() || m > GEMV_TC_MAX_M || k == 0 || !k.is_multiple_of(8) {
        return None;
    }
    let nt = if m <= 8 { 1 } else { 2 };
    let rg = if n.div_ceil(32) >= sms as usize { 2 } else { 1 };
    Some((nt, rg))
}

/// Threads per block of the RMSNorm kernels (`rms_norm_*`, `add_rms_norm_*`) for width `d`:
/// 512 from 2048, else 256. The fused-norm GEMV reproduces these kernels' sums, so it reads the
/// same choice.
pub fn norm_threads(d: usize) -> u32 {
    if d >= 2048 {
        512
    } else {
        256
    }
}

/// Largest dynamic shared memory (bytes) of the fused-norm GEMV's normed rows
/// (`min(M, MT) · K` elements): the default per-block limit of 48 KB, which counts static
/// shared memory too, less [`GEMV_STATIC_SMEM_MAX`] — so no opt-in is needed (bf16 at K = 4096
/// fits up to 5 rows; larger steps take the norm kernel then the GEMV).
pub const GEMV_NORM_SMEM_MAX: usize = (48 << 10) - GEMV_STATIC_SMEM_MAX;

/// A bound on the decode GEMV's static shared memory (bytes): its per-warp sums (≤ 1 KB), the
/// fused norm's per-warp sums (512 B) and the router launch's flag, rounded up.
pub const GEMV_STATIC_SMEM_MAX: usize = 2 << 10;

/// A fusion across op boundaries that only saves launches (each gives the same bits as the
/// ops it joins, except where said).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeFusion {
    /// The RMSNorm inside the first projections' GEMV (`rms_norm_linear_*`).
    Norm,
    /// The KV-cache write inside RoPE (`rope_write_kv`).
    RopeKv,
    /// The decode attention's split merge inside its own launch.
    AttnMerge,
    /// An MoE block with a dense shared expert in two launches (`moe_experts_shared`,
    /// kernels/moe_decode.cu) instead of nine: the routed experts' bits are the grouped
    /// GEMV's and the combine's, the shared expert's sums run in another order than the dense
    /// GEMV's (equal within the dtype's rounding).
    MoeBlock,
    /// KDA's three short convolutions of a decode step in one launch (`short_conv_many`).
    Conv3,
    /// The MoE router's top-k choice in the router GEMV's launch (its last block).
    RouterTopk,
    /// With `RouterTopk`: the FFN's pre-norm (residual add and RMSNorm) inside that launch too
    /// (`rms_norm_moe_route`); the router's few blocks re-normalise the rows, not thousands.
    RouterNorm,
    /// KDA's gated output norm inside `o_proj`'s GEMV (`gated_rms_norm_linear`,
    /// `gemv_gnorm_*`): every block normalises the heads itself.
    GatedNorm,
    /// A sublayer's last projection with the residual add and the next sublayer's norm in its
    /// launch (`linear_add_rms_norm`, `gemv_addnorm_*`): the GEMV's last block normalises once.
    AddNorm,
    /// A KDA decode step from its projections in one launch (`kda_from_projections`,
    /// `kda_step_*`): the convolutions, both gates' second factors and the recurrent update.
    KdaStep,
}

impl DecodeFusion {
    /// Its name in `DAYONE_DECODE_FUSION`.
    pub fn name(self) -> &'static str {
        match self {
            DecodeFusion::Norm => "norm",
            DecodeFusion::RopeKv => "rope_kv",
            DecodeFusion::AttnMerge => "attn_merge",
            DecodeFusion::MoeBlock => "moe_block",
            DecodeFusion::Conv3 => "conv3",
            DecodeFusion::RouterTopk => "router_topk",
            DecodeFusion::RouterNorm => "router_norm",
            DecodeFusion::GatedNorm => "gated_norm",
            DecodeFusion::AddNorm => "add_norm",
            DecodeFusion::KdaStep => "kda_step",
        }
    }

    /// Its bit in a [`decode_fusions_mask`].
    pub fn bit(self) -> u16 {
        match self {
            DecodeFusion::Norm => 1,
            DecodeFusion::RopeKv => 2,
            DecodeFusion::AttnMerge => 4,
            DecodeFusion::MoeBlock => 8,
            DecodeFusion::Conv3 => 16,
            DecodeFusion::RouterTopk => 32,
            DecodeFusion::RouterNorm => 64,
            DecodeFusion::GatedNorm => 128,
            DecodeFusion::AddNorm => 256,
            DecodeFusion::KdaStep => 512,
        }
    }
}

/// The fusions on when `DAYONE_DECODE_FUSION` is unset. Not the norm inside the GEMV: measured
/// on an H100 (2026-12-07, Llama-8B shape, batch 1, docs/perf.md) it made the step 1.3 % slower
/// — every block re-reads and re-normalises the rows (three 8 KB vectors per block of a
/// 4 096-wide GEMV), which costs more than the launch it saves. Not the attention's in-kernel
/// split merge: once it ran inside the graphs too, an H100 measured the Llama-8B batch-1 step
/// 3.9 % slower with it (5.83 against 5.60 ms, 2026-12-07) — every split block fences and counts,
/// and the last one's merge runs serially after the step's slowest split. Not KDA's gated norm
/// inside `o_proj`'s GEMV: 3.5 % slower on an H100 (Kimi-Linear-48B's first 14 layers, batch 1,
/// 2026-12-07), for the same reason as the norm. Not `add_norm`: 2.0 % slower on an H100
/// (Llama-8B shape, batch 1, 2026-12-07, fifth session) — each of the GEMV's blocks ends with a
/// fence and an atomic, and the last block's add + norm no longer overlaps the next launch. Not
/// `kda_step`: within the noise of a 14-layer Kimi step in the same call (483.8 vs 484.9 tok/s).
pub const DEFAULT_DECODE_FUSIONS: &[DecodeFusion] = &[
    DecodeFusion::RopeKv,
    DecodeFusion::MoeBlock,
    DecodeFusion::Conv3,
    DecodeFusion::RouterTopk,
    DecodeFusion::RouterNorm,
];

/// Every fusion, in `DAYONE_DECODE_FUSION`'s order.
pub const ALL_DECODE_FUSIONS: &[DecodeFusion] = &[
    DecodeFusion::Norm,
    DecodeFusion::RopeKv,
    DecodeFusion::AttnMerge,
    DecodeFusion::MoeBlock,
    DecodeFusion::Conv3,
    DecodeFusion::RouterTopk,
    DecodeFusion::RouterNorm,
    DecodeFusion::GatedNorm,
    DecodeFusion::AddNorm,
    DecodeFusion::KdaStep,
];

/// The bitmask of `fusions` ([`DecodeFusion::bit`]).
pub fn decode_fusions_mask(fusions: &[DecodeFusion]) -> u16 {
    fusions.iter().fold(0, |m, f| m | f.bit())
}

/// The fusions `DAYONE_DECODE_FUSION` lists (`norm,rope_kv,attn_merge,moe_block,conv3,
/// router_topk,router_norm,gated_norm,add_norm,kda_step`; `0` or `none`: none;
/// unset: [`DEFAULT_DECODE_FUSIONS`]) as a mask, so a benchmark can measure what each saves in
/// one run; an unknown name warns and is ignored.
pub fn decode_fusions_from_env() -> u16 {
    let all = ALL_DECODE_FUSIONS;
    match std::env::var("DAYONE_DECODE_FUSION") {
        Err(_) => decode_fusions_mask(DEFAULT_DECODE_FUSIONS),
        Ok(v) => {
            let mut mask = 0;
            for x in v.split(',').map(str::trim).filter(|x| !x.is_empty()) {
                match all.iter().find(|f| f.name() == x) {
                    Some(f) => mask |= f.bit(),
                    None if x == "0" || x == "none" => {}
                    None => eprintln!(
                        "warning: DAYONE_DECODE_FUSION lists {x:?}, not one of norm, rope_kv, \
                         attn_merge, moe_block, conv3, router_topk, router_norm, gated_norm, add_norm, \
                         kda_step (or 0 / \
                         none); ignored"
                    ),
                }
            }
            mask
        }
    }
}

/// Rows of w per GEMV block (`RPW`: 4, 2 or 1): as many as keep at least 8 blocks per SM.
/// `DAYONE_GEMV_RPW=1|2|4` forces the rows per block of every plain GEMV (a sweep's knob).
pub fn gemv_rpw(n: usize, sms: u32) -> u32 {
    static FORCED: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| {
        env_knob(
            "DAYONE_GEMV_RPW",
            |r: &u32| [1, 2, 4].contains(r),
            "1, 2 or 4",
        )
    });
    if let Some(r) = forced {
        return *r;
    }
    let per_sm = 8 * sms.max(1) as usize;
    if n >= 4 * per_sm {
        4
    } else if n >= 2 * per_sm {
        2
    } else {
        1
    }
}

/// Threads per key of the decode kernel (each thread covers 8 head dims): the smallest of 8,
/// 16, 32 covering `max(hdk, hdv)`. `None` when a head dim is not a multiple of 8 or above 256
/// (the tiled kernel handles those).
pub fn decode_tpk(hdk: usize, hdv: usize) -> Option<u32> {
    if hdk == 0 || hdv == 0 || !hdk.is_multiple_of(8) || !hdv.is_multiple_of(8) {
        return None;
    }
    match hdk.max(hdv) {
        0..=64 => Some(8),
        65..=128 => Some(16),
        129..=256 => Some(32),
        _ => None,
    }
}

/// Query heads per decode block (`GB` template: 1, 4 or 8) for a GQA group of `g` heads.
pub fn decode_gb(g: usize) -> u32 {
    match g {
        0 | 1 => 1,
        2..=4 => 4,
        _ => 8,
    }
}

/// Blocks per token of the RoPE kernel (grid.y) for `n` tokens of `per_token` elements each:
/// enough 256-thread blocks for one element per thread when the step has few tokens (a decode
/// step's single block per token ran its 6 144 elements in 24 dependent rounds), one block per
/// token otherwise. Every element is computed alone, so the grid does not change the result.
pub fn rope_cols(n: usize, per_token: usize) -> u32 {
    if n >= 128 {
        1
    } else {
        per_token.div_ceil(256).clamp(1, 64) as u32
    }
}

/// Counters of the decode attention's in-kernel split merge (one per (token, KV-head group)
/// of a step; 256 KiB): steps needing more launch the separate merge kernel.
pub const DECODE_COUNTERS: usize = 1 << 16;

/// How the decode kernel splits each token's key range over blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodePlan {
    /// Blocks along the key axis (grid.x).
    pub nsplit: u32,
    /// Keys per split (a multiple of the keys one block step covers).
    pub chunk: u32,
}

/// Fewest keys per split of the decode attention for a block step of `step` keys: twice the step
/// and at least 64, or `DAYONE_DECODE_MIN_CHUNK` (read once; a tuning knob — more keys per split
/// means fewer split blocks and a shorter in-kernel merge, but a longer serial key loop).
pub fn decode_min_chunk(step: u32) -> u32 {
    static FORCED: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        env_knob(
            "DAYONE_DECODE_MIN_CHUNK",
            |&c: &u32| c > 0,
            "a positive key count",
        )
    });
    forced.unwrap_or((2 * step).max(64))
}

/// Splits `max_kv` keys so that `base_blocks` (tokens × KV heads × head chunks) times the
/// split count reaches about `target_blocks`, with at least `min_chunk` keys per split.
/// `step` = keys a block consumes per loop step (`128 / TPK · UNR`); chunks are multiples of it.
pub fn plan_decode(
    base_blocks: usize,
    max_kv: usize,
    target_blocks: usize,
    step: u32,
    min_chunk: u32,
) -> DecodePlan {
    let max_kv = max_kv.max(1);
    let step = step.max(1) as usize;
    let want = target_blocks.div_ceil(base_blocks.max(1)).max(1);
    let cap = max_kv.div_ceil(min_chunk.max(1) as usize).max(1);
    let nsplit = want.min(cap);
    let chunk = max_kv.div_ceil(nsplit).div_ceil(step) * step;
    let nsplit = max_kv.div_ceil(chunk);
    DecodePlan {
        nsplit: nsplit as u32,
        chunk: chunk as u32,
    }
}

/// Tiled attention rows of a block: `(hc, tq)` = query heads per block and tokens per block,
/// `hc · tq <= 32`.
pub fn tiled_rows(g: usize) -> (u32, u32) {
    let hc = g.clamp(1, TILED_ROWS as usize) as u32;
    (hc, TILED_ROWS / hc)
}

/// Value dims per lane (`VPL` template: 2, 4, 8, 16) for a value head dim, `None` above 512.
pub fn tiled_vpl(hdv: usize) -> Option<u32> {
    match hdv {
        0..=64 => Some(2),
        65..=128 => Some(4),
        129..=256 => Some(8),
        257..=512 => Some(16),
        _ => None,
    }
}

/// Dynamic shared memory of the tiled kernel: Q `[32][hdk4]`, K `[32][hdk4 + 4]`,
/// V `[32][hdv]` and a key mask `[32]`, all f32 (hdk4 = hdk rounded up to 4).
pub fn tiled_smem_bytes(hdk: usize, hdv: usize) -> usize {
    let hdk4 = hdk.div_ceil(4) * 4;
    let rows = TILED_ROWS as usize;
    let bk = TILED_BK as usize;
    (rows * hdk4 + bk * (hdk4 + 4) + bk * hdv + bk) * 4
}

/// Rows (token, head pairs) of one tensor-core attention block.
pub const MMA_ROWS: u32 = 64;

/// The tensor-core prefill variant (`DV` = 64, 128 or 256) when the head dims allow it:
/// both multiples of 16, `hd_k <= 256`, `hd_v <= 256`.
pub fn mma_dv(hdk: usize, hdv: usize) -> Option<u32> {
    if hdk == 0 || hdv == 0 || !hdk.is_multiple_of(16) || !hdv.is_multiple_of(16) || hdk > 256 {
        return None;
    }
    match hdv {
        0..=64 => Some(64),
        65..=128 => Some(128),
        129..=256 => Some(256),
        _ => None,
    }
}

/// `(hc, tq)` of the tensor-core kernel: query heads and tokens per block, `hc · tq <= 64`.
pub fn mma_rows(g: usize) -> (u32, u32) {
    let hc = g.clamp(1, MMA_ROWS as usize) as u32;
    (hc, MMA_ROWS / hc)
}

/// Dynamic shared memory of the tensor-core kernel for 2-byte elements: Q and K tiles
/// `[64][hd_k + 8]`, V `[64][hd_v + 8]`, and 64 u32 key flags.
pub fn mma_smem_bytes(hdk: usize, hdv: usize) -> usize {
    64 * (2 * (hdk + 8) + (hdv + 8)) * 2 + 64 * 4
}

/// Rows (token, head pairs) of one MLA tensor-core attention block (`MLA_ROWS` in `mla.cu`).
pub const MLA_ROWS: u32 = 64;
/// Keys per MLA attention tile (`MLA_BK` in `mla.cu`).
pub const MLA_BK: u32 = 32;

/// Output-width template (`DV`) of the MLA tensor-core attention kernel for latent width `l`
/// and rotary width `r`, or `None` when the kernel does not take them (both must be multiples
/// of 16, `l <= 512`).
pub fn mla_dv(l: usize, r: usize) -> Option<u32> {
    if l == 0 || !l.is_multiple_of(16) || !r.is_multiple_of(16) {
        return None;
    }
    match l {
        0..=128 => Some(128),
        129..=256 => Some(256),
        257..=512 => Some(512),
        _ => None,
    }
}

/// Dynamic shared memory of the MLA tensor-core kernel: Q `[64][W+8]` and two K stages
/// `[32][W+8]` of 16-bit elements, S `[64][36]` f32, two `[32]` u32 flags (`W = l + r`).
pub fn mla_smem_bytes(l: usize, r: usize) -> usize {
    let ws = l + r + 8;
    (MLA_ROWS as usize + 2 * MLA_BK as usize) * ws * 2
        + MLA_ROWS as usize * 36 * 4
        + 2 * MLA_BK as usize * 4
}

/// Which grouped-GEMM kernel one MoE projection uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeKernel {
    /// Streaming grouped GEMV, at most `MT` rows per tile (`moe_gemv_*_m{MT}`).
    Gemv(u32),
    /// Tensor-core grouped GEMM (bf16/f16) of this tile shape ([`MoeTile::shape`]; never
    /// [`MoeTile::Auto`]).
    Mma(MoeTile),
    /// FMA grouped GEMM, 32-row tiles (`moe_fma_*`, any dtype and K).
    Fma,
}

impl MoeKernel {
    /// Rows one tile of this kernel covers at most.
    pub fn tile_rows(self) -> u32 {
        match self {
            MoeKernel::Gemv(mt) => mt,
            MoeKernel::Mma(t) => t.shape(2).rows,
            MoeKernel::Fma => 32,
        }
    }
}

/// Tile of the tensor-core MoE kernel: by the step's shape, or forced
/// (`DAYONE_MOE_TILE=auto|16|32|64|128|128w|128k64|128x8|64w|128r|128xr|wg|wg128`,
/// [`crate::CudaBackend::set_moe_tile`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MoeTile {
    /// [`moe_auto_tile`] of the average rows per expert.
    Auto = 0,
    /// 16 rows × 128 weight rows (`moe_mma16_*`: memory-bound steps, few rows per expert).
    Rows16 = 1,
    /// 32 × 128 (`moe_mma32_*`).
    Rows32 = 2,
    /// 64 × 128 (`moe_mma_*`, the original kernel, static shared memory).
    Rows64 = 3,
    /// 128 × 128 (`moe_mma128_*`, 4 warps of 64 × 64: compute-bound steps).
    Rows128 = 4,
    /// 128 × 256 (`moe_mma128w_*`, 8 warps of 64 × 64, one block per SM).
    Rows128Wide = 5,
    /// 128 × 128 with 64-wide k slices, 3 stages (`moe_mma128k64_*`).
    Rows128K64 = 6,
    /// 128 × 128, 8 warps of 64 × 32 (`moe_mma128x8_*`).
    Rows128Warps8 = 7,
    /// 64 × 256, 8 warps of 32 × 64 (`moe_mma64w_*`).
    Rows64Wide = 8,
    /// [`MoeTile::Rows128`] with its blocks rasterised in groups of 8 tiles
    /// (`moe_mma128r_*`, `moe_raster` in kernels/moe_common.cuh: an expert's tiles read each
    /// weight slice back to back, so it comes from DRAM once).
    Rows128Raster = 9,
    /// [`MoeTile::Rows128Warps8`] rasterised as [`MoeTile::Rows128Raster`] (`moe_mma128xr_*`).
    Rows128Warps8Raster = 10,
    /// 128 × 256 on Hopper's warpgroup MMA (`moe_wg256_*`, kernels/moe_wgmma.cu: two warpgroups
    /// of 64 × 256, 64-wide k slices, 4 stages, rasterised): sm_90 only, elsewhere
    /// [`MoeTile::Rows128Raster`] runs instead ([`MoeTile::or_without_wgmma`]).
    Wgmma256 = 11,
    /// [`MoeTile::Wgmma256`] with 128 weight rows per block (`moe_wg128_*`).
    Wgmma128 = 12,
}

/// Launch shape of one [`MoeTile`] ([`MoeTile::shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeTileShape {
    /// Kernel name prefix: `{kernel}_{dtype}_{gu|dn}`.
    pub kernel: &'static str,
    /// Rows (sorted (token, expert) pairs) per tile, BM.
    pub rows: u32,
    /// Weight rows per block, BN: GU blocks write BN / 2 outputs (gate and up rows), down BN.
    pub weight_rows: u32,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory per block in bytes (0: static).
    pub smem: usize,
}

impl MoeTile {
    /// `DAYONE_MOE_TILE` (`auto`, `16`, `32`, `64`, `128`, `128w`, `128k64`, `128x8`, `64w`,
    /// `128r`, `128xr`, `wg`, `wg128`);
    /// another value → auto, with
    /// one warning line on stderr (a mistyped tile in a sweep would otherwise time auto).
    pub fn from_env() -> Self {
        let v = std::env::var("DAYONE_MOE_TILE").ok();
        let tile = Self::parse(v.as_deref());
        if let Some(v) = v.filter(|v| !Self::known(v)) {
            eprintln!(
                "warning: DAYONE_MOE_TILE={v:?} is not auto, 16, 32, 64, 128, 128w, 128k64, \
                 128x8, 64w, 128r, 128xr, wg or wg128; using auto"
            );
        }
        tile
    }

    /// Parses a `DAYONE_MOE_TILE` value (unknown values and `None` → [`MoeTile::Auto`]).
    pub fn parse(v: Option<&str>) -> Self {
        match v.map(str::trim) {
            Some("16") => MoeTile::Rows16,
            Some("32") => MoeTile::Rows32,
            Some("64") => MoeTile::Rows64,
            Some("128") => MoeTile::Rows128,
            Some("128w") => MoeTile::Rows128Wide,
            Some("128k64") => MoeTile::Rows128K64,
            Some("128x8") => MoeTile::Rows128Warps8,
            Some("64w") => MoeTile::Rows64Wide,
            Some("128r") => MoeTile::Rows128Raster,
            Some("128xr") => MoeTile::Rows128Warps8Raster,
            Some("wg") => MoeTile::Wgmma256,
            Some("wg128") => MoeTile::Wgmma128,
            _ => MoeTile::Auto,
        }
    }

    /// Whether `v` is one of the `DAYONE_MOE_TILE` values (surrounding spaces ignored).
    pub fn known(v: &str) -> bool {
        v.trim() == "auto" || Self::parse(Some(v)) != MoeTile::Auto
    }

    /// The value stored by [`MoeTile`]'s `as u8` back as a tile choice.
    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => MoeTile::Rows16,
            2 => MoeTile::Rows32,
            3 => MoeTile::Rows64,
            4 => MoeTile::Rows128,
            5 => MoeTile::Rows128Wide,
            6 => MoeTile::Rows128K64,
            7 => MoeTile::Rows128Warps8,
            8 => MoeTile::Rows64Wide,
            9 => MoeTile::Rows128Raster,
            10 => MoeTile::Rows128Warps8Raster,
            11 => MoeTile::Wgmma256,
            12 => MoeTile::Wgmma128,
            _ => MoeTile::Auto,
        }
    }

    /// Whether this tile runs Hopper's `wgmma` (`kernels/moe_wgmma.cu`).
    pub fn is_wgmma(self) -> bool {
        matches!(self, MoeTile::Wgmma256 | MoeTile::Wgmma128)
    }

    /// This tile where the kernels have `wgmma` (`has_wgmma`: the `moe` family compiled for
    /// sm_90a, [`crate::nvrtc_cache::Target::has_wgmma`]); a `wgmma` tile elsewhere becomes
    /// [`MoeTile::Rows128Raster`], the mma.sync kernel of the same rows.
    pub fn or_without_wgmma(self, has_wgmma: bool) -> MoeTile {
        if self.is_wgmma() && !has_wgmma {
            MoeTile::Rows128Raster
        } else {
            self
        }
    }

    /// Launch shape for `elt`-byte elements: dynamic smem `STAGES · (BM + BN) · BK · elt` as in
    /// `moe_mmat_impl` (`kernels/moe.cu`, whose `MOE_MMAT` lines these repeat), plus 1 KiB
    /// for the `wgmma` tiles (`moe_wgmma_impl` aligns its operands to 1 024 bytes).
    /// [`MoeTile::Auto`] answers the 64-row kernel.
    pub fn shape(self, elt: usize) -> MoeTileShape {
        let (kernel, rows, weight_rows, threads, bk, stages) = match self {
            MoeTile::Rows16 => ("moe_mma16", 16, 128, 256, 64, 4),
            MoeTile::Rows32 => ("moe_mma32", 32, 128, 256, 64, 4),
            MoeTile::Rows128 => ("moe_mma128", 128, 128, 128, 32, 4),
            MoeTile::Rows128Wide => ("moe_mma128w", 128, 256, 256, 32, 4),
            MoeTile::Rows128K64 => ("moe_mma128k64", 128, 128, 128, 64, 3),
            MoeTile::Rows128Warps8 => ("moe_mma128x8", 128, 128, 256, 32, 4),
            MoeTile::Rows64Wide => ("moe_mma64w", 64, 256, 256, 32, 4),
            MoeTile::Rows128Raster => ("moe_mma128r", 128, 128, 128, 32, 4),
            MoeTile::Rows128Warps8Raster => ("moe_mma128xr", 128, 128, 256, 32, 4),
            MoeTile::Wgmma256 => ("moe_wg256", 128, 256, 256, 64, 4),
            MoeTile::Wgmma128 => ("moe_wg128", 128, 128, 256, 64, 4),
            MoeTile::Auto | MoeTile::Rows64 => ("moe_mma", 64, 128, 256, 0, 0),
        };
        MoeTileShape {
            kernel,
            rows,
            weight_rows,
            threads,
            smem: stages * (rows + weight_rows) as usize * bk * elt
                + if self.is_wgmma() { 1024 } else { 0 },
        }
    }
}

/// Average (token, expert) pairs per expert from which [`MoeTile::Auto`] takes 128 × 128 tiles;
/// below it, 32 × 128 tiles.
///
/// Measured on the H200 (2026-12-02, DeepSeek-V3 block: 256 experts × 2048, hidden 7168, top 8,
/// bf16; `DAYONE_MOE_TILE=16|32|64|128|128w moe-bench`), ms per block at 64 / 512 / 8192 tokens
/// (2 / 16 / 256 pairs per expert): 16 rows 4.74 / 6.55 / 60.2; **32 rows 4.71 / 5.61** / 35.8;
/// 64 rows 8.11 / 9.55 / 36.4; **128 × 128** 8.00 / 9.38 / **23.66**; 128 × 256 8.52 / 10.0 /
/// 24.07 (torch._grouped_mm in the same call: 6.46 / 8.03 / 22.75). The 32-row tiles stream the
/// weights at up to 4.2 TB/s while few rows share an expert; the square tiles win once the
/// experts are compute-bound.
pub const MOE_TILE128_MIN_AVG_ROWS: usize = 64;

/// The tile [`MoeTile::Auto`] picks for `p` (token, expert) pairs over `e` experts: 128 × 128,
/// rasterised ([`MoeTile::Rows128Raster`]), from an average of [`MOE_TILE128_MIN_AVG_ROWS`] rows
/// per expert, else 32 rows. The rasterised order was 2.4 % faster than the plain 128 × 128 one
/// at 8 192 tokens on an H100 (2026-12-07, 23.31 vs 23.89 ms per DeepSeek-V3 block,
/// docs/perf.md); it computes the same tiles, so the same outputs bit for bit.
pub fn moe_auto_tile(p: usize, e: usize) -> MoeTile {
    if p / e.max(1) >= MOE_TILE128_MIN_AVG_ROWS {
        MoeTile::Rows128Raster
    } else {
        MoeTile::Rows32
    }
}

/// Tokens up to which the MoE projections stream weights with the grouped GEMV (default of
/// [`moe_plan`]'s `gemv_max`; `DAYONE_MOE_GEMV_MAX` overrides it in the backend). Measured on
/// an H200 (DeepSeek-V3 block, bf16): GEMV 3.0/3.0/2.3/1.3 TB/s of expert weights at 1/2/4/8
/// tokens, the tensor-core kernel 1.9/2.2/2.3 TB/s at 2/4/8 tokens.
pub const MOE_GEMV_MAX_TOKENS: usize = 4;

/// Warps per block of the grouped MoE GEMV (`moe_gemv_*`, `MOE_GEMV_WARPS` in kernels/moe.cu).
pub const MOE_GEMV_WARPS: usize = 8;
/// Outputs per warp of the gate_up GEMV (`MOE_GEMV_GU_RPW`): each reads a gate and an up row.
pub const MOE_GEMV_GU_RPW: usize = 1;
/// Outputs (weight rows) per warp of the down GEMV (`MOE_GEMV_DN_RPW`).
pub const MOE_GEMV_DN_RPW: usize = 4;

/// Outputs one block of the grouped MoE GEMV covers (grid.x = `ceil(nout / this)`):
/// [`MOE_GEMV_WARPS`] warps of [`MOE_GEMV_GU_RPW`] (gate_up) or [`MOE_GEMV_DN_RPW`] outputs.
pub fn moe_gemv_outputs(gate_up: bool) -> usize {
    MOE_GEMV_WARPS
        * if gate_up {
            MOE_GEMV_GU_RPW
        } else {
            MOE_GEMV_DN_RPW
        }
}

/// (token, choice) pairs up to which `moe_experts_shared` runs the fused decode block
/// (`kernels/moe_decode.cu`): each pair reads its expert's rows itself (no sort, so no sharing
/// between pairs of one expert), which pays at decode sizes only. 32 = 4 tokens of top-8.
pub const MOE_DECODE_MAX_PAIRS: usize = 32;

/// Grids of the fused decode block for `slots` = pairs + tokens (one grid row each), shared
/// expert width `fs`: (`moe_dec_gu`: one warp per output of max(F, Fs), `moe_dec_dn`:
/// `dn_rpw` outputs per warp over D), both [`MOE_GEMV_WARPS`] warps per block.
pub fn moe_decode_grids(
    slots: usize,
    d: usize,
    f: usize,
    fs: usize,
    dn_rpw: usize,
) -> ((usize, usize), (usize, usize)) {
    (
        (f.max(fs).div_ceil(MOE_GEMV_WARPS), slots),
        (d.div_ceil(MOE_GEMV_WARPS * dn_rpw), slots),
    )
}

/// Kernel variants of the fused decode MoE block (kernels/moe_decode.cu; every variant gives
/// the same bits): the suffixes of `moe_dec_gu{gu}_*` and `moe_dec_dn{dn}_*` and the down
/// kernel's rows per warp.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeDecodeVariant {
    /// `""` (8 chunks per row in flight for 16-bit weights, 4 for f32), `"_b3"` (≥ 3 blocks per
    /// SM), `"_u3b4"` (3 chunks, ≥ 4 blocks per SM).
    pub gu: &'static str,
    /// `""` (4 rows per warp), `"_b3"` (4 rows, ≥ 3 blocks per SM), `"_r2b4"` (2 rows, 4
    /// chunks, ≥ 4 blocks), `"_r1b4"` (1 row, 4 chunks, ≥ 4 blocks).
    pub dn: &'static str,
    /// Rows per warp of the down kernel.
    pub dn_rpw: usize,
}

/// The variant `DAYONE_MOE_DEC` names (a sweep's knob; comma-separated `gu`, `gu_b3`,
/// `gu_u3b4`, `dn`, `dn_b3`, `dn_r2b4`, `dn_r1b4`; unset: `gu,dn`); an unknown name warns once
/// and is ignored.
pub fn moe_decode_variant() -> MoeDecodeVariant {
    static V: std::sync::OnceLock<MoeDecodeVariant> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        let mut v = MoeDecodeVariant {
            gu: "",
            dn: "",
            dn_rpw: MOE_GEMV_DN_RPW,
        };
        let names = std::env::var("DAYONE_MOE_DEC").unwrap_or_default();
        for x in names.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            match x {
                "gu" => v.gu = "",
                "gu_b3" => v.gu = "_b3",
                "gu_u3b4" => v.gu = "_u3b4",
                "dn" => (v.dn, v.dn_rpw) = ("", MOE_GEMV_DN_RPW),
                "dn_b3" => (v.dn, v.dn_rpw) = ("_b3", MOE_GEMV_DN_RPW),
                "dn_r2b4" => (v.dn, v.dn_rpw) = ("_r2b4", 2),
                "dn_r1b4" => (v.dn, v.dn_rpw) = ("_r1b4", 1),
                other => eprintln!(
                    "warning: DAYONE_MOE_DEC lists {other:?}, not one of gu, gu_b3, gu_u3b4, \
                     dn, dn_b3, dn_r2b4, dn_r1b4; ignored"
                ),
            }
        }
        v
    })
}

/// Threads of the one-block `moe_sort` over `p` pairs and `e` experts: enough for one pair or
/// expert per thread, a multiple of 32 from 32 to 1024 (a decode step's 8 pairs over 256
/// experts take 256 threads, so its barriers span 8 warps, not 32).
pub fn moe_sort_threads(p: usize, e: usize) -> u32 {
    (p.max(e).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// Grid of `moe_combine_*` for `n` tokens of width `d` and 256-thread blocks: (tokens, column
/// blocks) with the column blocks so that at least ~16 blocks run when few tokens do (the
/// kernel is grid-stride in both; the sums do not depend on the grid).
pub fn moe_combine_grid(n: usize, d: usize) -> (u32, u32) {
    let x = row_grid(n, 65535);
    let y = if n >= 16 {
        1
    } else {
        d.div_ceil(256).clamp(1, 64) as u32
    };
    (x, y)
}

/// The MoE expert plan: kernels for gate_up (reduction over `d`) and down (over `f`), the tile
/// rows of the shared sort (the smaller of the two kernels' tiles) and the largest tile count
/// (`ceil(P / bt) + min(E, P)` for `P = n·k` pairs, every expert adding at most one partial tile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoePlan {
    /// gate_up kernel.
    pub gate_up: MoeKernel,
    /// down kernel.
    pub down: MoeKernel,
    /// Rows per tile in the tile map.
    pub bt: u32,
    /// Upper bound on tiles (grid.y of the GEMM launches).
    pub max_tiles: usize,
}

/// Plans `moe_experts` for `n` tokens, `k` choices, `e` experts, widths `d` and `f`;
/// `low` = bf16/f16 activations (tensor cores available); the grouped GEMV serves up to
/// `gemv_max` tokens (at most 8 rows per tile); `tile` picks the tensor-core kernel's tile rows
/// and `max_smem` (the device's opt-in shared memory per block, bytes) drops a variant that
/// does not fit back to the 64-row kernel.
#[allow(clippy::too_many_arguments)]
pub fn moe_plan(
    n: usize,
    k: usize,
    e: usize,
    d: usize,
    f: usize,
    low: bool,
    gemv_max: usize,
    tile: MoeTile,
    max_smem: usize,
) -> MoePlan {
    let p = n * k;
    let tile = match tile {
        MoeTile::Auto => moe_auto_tile(p, e),
        t => t,
    };
    // bf16/f16: 2-byte elements.
    let tile = if tile.shape(2).smem <= max_smem {
        tile
    } else {
        MoeTile::Rows64
    };
    let pick = |kdim: usize| {
        if !kdim.is_multiple_of(8) {
            MoeKernel::Fma
        } else if n <= gemv_max || (!low && n <= 64 && gemv_max > 0) {
            MoeKernel::Gemv(n.next_power_of_two().clamp(1, 8) as u32)
        } else if low {
            MoeKernel::Mma(tile)
        } else {
            MoeKernel::Fma
        }
    };
    let (gate_up, down) = (pick(d), pick(f));
    let bt = gate_up.tile_rows().min(down.tile_rows());
    MoePlan {
        gate_up,
        down,
        bt,
        max_tiles: p.div_ceil(bt as usize) + e.min(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_knobs() {
        // Variables only this test reads.
        std::env::set_var("DAYONE_TEST_KNOB_OK", " 8 ");
        std::env::set_var("DAYONE_TEST_KNOB_TYPO", "8x");
        std::env::set_var("DAYONE_TEST_KNOB_OUT", "3");
        let any = |_: &u32| true;
        assert_eq!(env_knob("DAYONE_TEST_KNOB_OK", any, "a count"), Some(8));
        assert_eq!(env_knob("DAYONE_TEST_KNOB_TYPO", any, "a count"), None);
        let rpw = |r: &u32| [1, 2, 4].contains(r);
        assert_eq!(env_knob("DAYONE_TEST_KNOB_OUT", rpw, "1, 2 or 4"), None);
        assert_eq!(env_knob("DAYONE_TEST_KNOB_UNSET", any, "a count"), None);
    }

    #[test]
    fn grids() {
        assert_eq!(row_grid(0, 100), 1);
        assert_eq!(row_grid(50, 100), 50);
        assert_eq!(row_grid(5000, 100), 100);
        assert_eq!(elementwise_grid(0, 8, 256, 1000), 1);
        assert_eq!(elementwise_grid(8 * 256 * 3, 8, 256, 1000), 3);
        assert_eq!(elementwise_grid(8 * 256 * 3 + 1, 8, 256, 1000), 4);
        assert_eq!(elementwise_grid(usize::MAX / 2, 8, 256, 1000), 1000);
    }

    #[test]
    fn gemv_tc_plans() {
        // Above the FMA GEMV's rows (4 by default), up to 16; K a multiple of 8.
        assert_eq!(gemv_tc_plan(4, 4096, 4096, 132), None);
        assert_eq!(gemv_tc_plan(8, 4096, 4096, 132), Some((1, 1)));
        assert_eq!(gemv_tc_plan(8, 14336, 4096, 132), Some((1, 2)));
        assert_eq!(gemv_tc_plan(9, 128256, 4096, 132), Some((2, 2)));
        assert_eq!(gemv_tc_plan(16, 1024, 4096, 132), Some((2, 1)));
        assert_eq!(gemv_tc_plan(17, 4096, 4096, 132), None);
        assert_eq!(gemv_tc_plan(8, 4096, 4100, 132), None);
    }

    #[test]
    fn gemv_variants() {
        assert_eq!(gemv_mt(1, 4096), Some(1));
        assert_eq!(gemv_mt(3, 4096), Some(4));
        assert_eq!(
            gemv_mt(8, 4096),
            if gemv_max_m() >= 8 { Some(8) } else { None }
        );
        assert_eq!(gemv_mt(9, 4096), None);
        assert_eq!(gemv_mt(1, 33), None);
        assert_eq!(gemv_mt(1, 0), None);
        assert_eq!(gemv_rpw(14336, 132), 4);
        assert_eq!(gemv_rpw(128256, 132), 4);
        assert_eq!(gemv_rpw(4096, 132), 2);
        assert_eq!(gemv_rpw(1024, 132), 1);
        assert_eq!(gemv_rpw(1, 132), 1);
    }

    #[test]
    fn decode_variants() {
        assert_eq!(decode_tpk(128, 128), Some(16));
        assert_eq!(decode_tpk(64, 64), Some(8));
        assert_eq!(decode_tpk(192, 128), Some(32));
        assert_eq!(decode_tpk(256, 256), Some(32));
        assert_eq!(decode_tpk(576, 512), None);
        assert_eq!(decode_tpk(6, 6), None);
        assert_eq!(decode_tpk(16, 8), Some(8));
        assert_eq!(decode_gb(1), 1);
        assert_eq!(decode_gb(4), 4);
        assert_eq!(decode_gb(3), 4);
        assert_eq!(decode_gb(7), 8);
        assert_eq!(decode_gb(16), 8);
    }

    #[test]
    fn decode_plans() {
        // Llama-3.1-8B batch 1: 8 KV heads, 1024 keys, 132 SMs.
        let p = plan_decode(8, 1024, 4 * 132, 32, 64);
        assert_eq!(p.nsplit, 16);
        assert_eq!(p.chunk, 64);
        // Short context: one split.
        let p = plan_decode(8, 10, 528, 32, 64);
        assert_eq!(
            p,
            DecodePlan {
                nsplit: 1,
                chunk: 32
            }
        );
        // Large batch: few splits.
        let p = plan_decode(64 * 8, 1000, 528, 32, 64);
        assert_eq!(p.nsplit, 2);
        // Every key is covered, no split is empty.
        for (base, kv) in [(1, 1), (8, 33), (8, 4097), (3, 100_000), (512, 7)] {
            let p = plan_decode(base, kv, 528, 32, 64);
            assert!(p.nsplit as usize * p.chunk as usize >= kv);
            assert!(((p.nsplit - 1) as usize * (p.chunk as usize)) < kv);
            assert_eq!(p.chunk % 32, 0);
        }
    }

    #[test]
    fn mma_shapes() {
        assert_eq!(mma_dv(128, 128), Some(128));
        assert_eq!(mma_dv(64, 64), Some(64));
        assert_eq!(mma_dv(192, 128), Some(128));
        assert_eq!(mma_dv(256, 256), Some(256));
        assert_eq!(mma_dv(576, 512), None);
        assert_eq!(mma_dv(40, 24), None);
        assert_eq!(mma_dv(6, 6), None);
        assert_eq!(mma_rows(4), (4, 16));
        assert_eq!(mma_rows(1), (1, 64));
        assert_eq!(mma_rows(3), (3, 21));
        assert_eq!(mma_rows(128), (64, 1));
        assert_eq!(mma_smem_bytes(128, 128), 64 * (2 * 136 + 136) * 2 + 256);
    }

    #[test]
    fn tiled_shapes() {
        assert_eq!(tiled_rows(1), (1, 32));
        assert_eq!(tiled_rows(4), (4, 8));
        assert_eq!(tiled_rows(3), (3, 10));
        assert_eq!(tiled_rows(64), (32, 1));
        assert_eq!(tiled_vpl(128), Some(4));
        assert_eq!(tiled_vpl(6), Some(2));
        assert_eq!(tiled_vpl(512), Some(16));
        assert_eq!(tiled_vpl(513), None);
        assert_eq!(
            tiled_smem_bytes(128, 128),
            (32 * 128 + 32 * 132 + 32 * 128 + 32) * 4
        );
        assert_eq!(tiled_smem_bytes(6, 6), (32 * 8 + 32 * 12 + 32 * 6 + 32) * 4);
    }
    #[test]
    fn mla_shapes() {
        assert_eq!(mla_dv(512, 64), Some(512));
        assert_eq!(mla_dv(128, 32), Some(128));
        assert_eq!(mla_dv(64, 16), Some(128));
        assert_eq!(mla_dv(32, 8), None);
        assert_eq!(mla_dv(1024, 64), None);
        // DeepSeek-V3: Q 64×584 and 2×32×584 bf16 + S + flags, under the 227 KiB opt-in.
        assert_eq!(mla_smem_bytes(512, 64), 128 * 584 * 2 + 64 * 36 * 4 + 256);
        assert!(mla_smem_bytes(512, 64) <= 227 * 1024);
    }

    #[test]
    fn moe_plans() {
        const SMEM: usize = 227 * 1024;
        let plan =
            |n, k, e, d, f, low, gmax| moe_plan(n, k, e, d, f, low, gmax, MoeTile::Rows64, SMEM);
        let p = plan(1, 8, 256, 7168, 2048, true, MOE_GEMV_MAX_TOKENS);
        assert_eq!(p.gate_up, MoeKernel::Gemv(1));
        assert_eq!(p.bt, 1);
        assert_eq!(p.max_tiles, 8 + 8);
        let p = plan(5, 8, 256, 7168, 2048, true, 8);
        assert_eq!(p.down, MoeKernel::Gemv(8));
        let p = plan(8192, 8, 256, 7168, 2048, true, MOE_GEMV_MAX_TOKENS);
        assert_eq!(
            (p.gate_up, p.down, p.bt),
            (
                MoeKernel::Mma(MoeTile::Rows64),
                MoeKernel::Mma(MoeTile::Rows64),
                64
            )
        );
        assert_eq!(p.max_tiles, 65536 / 64 + 256);
        let p = plan(100, 4, 16, 37, 64, true, MOE_GEMV_MAX_TOKENS);
        assert_eq!(
            (p.gate_up, p.down, p.bt),
            (MoeKernel::Fma, MoeKernel::Mma(MoeTile::Rows64), 32)
        );
        let p = plan(100, 4, 16, 64, 64, false, MOE_GEMV_MAX_TOKENS);
        assert_eq!((p.gate_up, p.bt), (MoeKernel::Fma, 32));
        let p = plan(64, 8, 256, 7168, 2048, true, MOE_GEMV_MAX_TOKENS);
        assert_eq!((p.gate_up, p.bt), (MoeKernel::Mma(MoeTile::Rows64), 64));
        let p = plan(64, 8, 256, 7168, 2048, true, 64);
        assert_eq!((p.gate_up, p.bt), (MoeKernel::Gemv(8), 8));
        let p = plan(3, 2, 16, 64, 13, false, 8);
        assert_eq!(
            (p.gate_up, p.down, p.bt),
            (MoeKernel::Gemv(4), MoeKernel::Fma, 4)
        );
    }

    #[test]
    fn moe_small_step_launches() {
        // Kimi-Linear decode: gate_up 1024 outputs → 128 blocks, down 2304 → 72.
        assert_eq!(1024usize.div_ceil(moe_gemv_outputs(true)), 128);
        assert_eq!(2304usize.div_ceil(moe_gemv_outputs(false)), 72);
        assert_eq!(moe_sort_threads(8, 256), 256);
        assert_eq!(moe_sort_threads(1, 4), 32);
        assert_eq!(moe_sort_threads(300, 256), 320);
        assert_eq!(moe_sort_threads(65536, 256), 1024);
        assert_eq!(moe_sort_threads(8, 4096), 1024);
        assert_eq!(moe_combine_grid(1, 2304), (1, 9));
        assert_eq!(moe_combine_grid(3, 100), (3, 1));
        assert_eq!(moe_combine_grid(4096, 7168), (4096, 1));
        assert_eq!(moe_combine_grid(1, 1 << 20), (1, 64));
    }

    #[test]
    fn moe_tiles() {
        const SMEM: usize = 227 * 1024;
        let auto = |n| moe_plan(n, 8, 256, 7168, 2048, true, 4, MoeTile::Auto, SMEM);
        let mma = MoeKernel::Mma;
        // DeepSeek-V3 layer: 2, 16, 64 and 256 pairs per expert.
        let p = auto(64);
        assert_eq!(
            (p.gate_up, p.down, p.bt),
            (mma(MoeTile::Rows32), mma(MoeTile::Rows32), 32)
        );
        assert_eq!(p.max_tiles, 512 / 32 + 256);
        assert_eq!(auto(512).bt, 32);
        assert_eq!(auto(2047).gate_up, mma(MoeTile::Rows32));
        assert_eq!(auto(2048).gate_up, mma(MoeTile::Rows128Raster));
        let p = auto(8192);
        assert_eq!((p.gate_up, p.bt), (mma(MoeTile::Rows128Raster), 128));
        assert_eq!(p.max_tiles, 65536 / 128 + 256);
        // Forced, and the smem fallback.
        for (t, v, rows) in [
            (MoeTile::Rows16, "16", 16),
            (MoeTile::Rows32, "32", 32),
            (MoeTile::Rows64, "64", 64),
            (MoeTile::Rows128, "128", 128),
            (MoeTile::Rows128Wide, "128w", 128),
            (MoeTile::Wgmma256, "wg", 128),
            (MoeTile::Wgmma128, "wg128", 128),
        ] {
            let p = moe_plan(70, 2, 6, 64, 40, true, 0, t, SMEM);
            assert_eq!((p.gate_up, p.down, p.bt), (mma(t), mma(t), rows));
            let p = moe_plan(70, 2, 6, 64, 40, true, 0, t, 48 * 1024);
            assert_eq!(p.bt, 64);
            assert_eq!(MoeTile::parse(Some(v)), t);
            assert_eq!(MoeTile::from_u8(t as u8), t);
        }
        assert_eq!(MoeTile::parse(Some("auto")), MoeTile::Auto);
        assert_eq!(MoeTile::parse(None), MoeTile::Auto);
        // from_env warns about any value that is not known (and runs auto).
        for v in ["auto", " 64 ", "128w"] {
            assert!(MoeTile::known(v), "{v}");
        }
        for v in ["128W", "17", "", "wide", "256"] {
            assert!(!MoeTile::known(v), "{v}");
            assert_eq!(MoeTile::parse(Some(v)), MoeTile::Auto);
        }
        // Shared memory of the dynamic variants (bf16), within sm_90's 227 KiB opt-in: 3, 2,
        // 2 and 1 blocks per SM of 228 KiB (1 KiB reserved per block).
        let smem = |t: MoeTile| t.shape(2).smem;
        assert_eq!(smem(MoeTile::Rows16), 73728);
        assert_eq!(smem(MoeTile::Rows32), 81920);
        assert_eq!(smem(MoeTile::Rows128), 65536);
        assert_eq!(smem(MoeTile::Rows128Wide), 98304);
        assert_eq!(smem(MoeTile::Rows64), 0);
        assert_eq!(smem(MoeTile::Wgmma256), 4 * 384 * 64 * 2 + 1024);
        // wgmma only where the kernels have it; the same rows' mma.sync kernel elsewhere.
        assert_eq!(MoeTile::Wgmma256.or_without_wgmma(true), MoeTile::Wgmma256);
        assert_eq!(
            MoeTile::Wgmma128.or_without_wgmma(false),
            MoeTile::Rows128Raster
        );
        assert_eq!(MoeTile::Rows32.or_without_wgmma(false), MoeTile::Rows32);
        let fits = |t, blocks| blocks * (smem(t) + 1024) <= 228 * 1024;
        assert!(fits(MoeTile::Wgmma256, 1) && !fits(MoeTile::Wgmma128, 2));
        assert!(fits(MoeTile::Rows16, 3) && !fits(MoeTile::Rows16, 4));
        assert!(fits(MoeTile::Rows32, 2) && fits(MoeTile::Rows128, 2));
        assert!(fits(MoeTile::Rows128Wide, 2));
    }
}
