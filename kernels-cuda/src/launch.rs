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

/// Threads per block of the skinny-GEMV kernel (`GEMV_THREADS` in `gemv.cu`).
pub const GEMV_THREADS: u32 = 256;

/// The GEMV variant for `m` rows of x: `MT` = 1, 2, 4 or 8 (rows past `m` are masked);
/// `None` when `m > 8` or `k` is not a multiple of 8 (cuBLAS handles those).
pub fn gemv_mt(m: usize, k: usize) -> Option<u32> {
    if k == 0 || !k.is_multiple_of(8) {
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

/// Rows of w per GEMV block (`RPW`: 4, 2 or 1): as many as keep at least 8 blocks per SM.
pub fn gemv_rpw(n: usize, sms: u32) -> u32 {
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

/// How the decode kernel splits each token's key range over blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodePlan {
    /// Blocks along the key axis (grid.x).
    pub nsplit: u32,
    /// Keys per split (a multiple of the keys one block step covers).
    pub chunk: u32,
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn gemv_variants() {
        assert_eq!(gemv_mt(1, 4096), Some(1));
        assert_eq!(gemv_mt(3, 4096), Some(4));
        assert_eq!(gemv_mt(8, 4096), Some(8));
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
}
