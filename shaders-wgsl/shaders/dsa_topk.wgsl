// DeepSeek Sparse Attention lightning indexer + top-k (DeepSeek-V3.2; HF DeepseekV32Indexer), f32.
//
// dsa_score: I(n, t) = sum_h w[n, h] * H^-1/2 * relu(scale * q[n, h] . k_t) for the token's causal
// keys t <= positions[n] (k_t found through the block table), one invocation per (token, key):
// workgroups (key tile of 64 = wid.x, token = tok0 + wid.y); written to scores[(n - tok0) * stride + t].
//
// dsa_select: one workgroup per token (tok0 + wid.x). k = min(topk, keys). The selected keys are the
// k largest under the total order (score desc, position asc): as 64-bit composites
// (orderable(score), ~position), found by an 8-pass radix select (8-bit digits, workgroup
// histogram), compacted into workgroup memory (exactly k <= 2048 of them), bitonic-sorted
// descending and written to out[n, ..k]; out[n, k..topk] = u32::MAX.

struct Params {
    h: u32,
    d: u32,
    bs: u32,
    max_blocks: u32,
    scale: f32,
    hscale: f32, // H^-1/2
    topk: u32,
    stride: u32, // score row stride (keys)
    tok0: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> kc: array<f32>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;
@group(0) @binding(7) var<storage, read_write> scores: array<f32>;

@compute @workgroup_size(64)
fn dsa_score(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = P.tok0 + wid.y;
    let t = wid.x * 64u + lid;
    let nkeys = positions[n] + 1u;
    if (t >= nkeys) {
        return;
    }
    let s = token_seq[n];
    let blk = block_tables[s * P.max_blocks + t / P.bs];
    let kb = (blk * P.bs + t % P.bs) * P.d;
    var total = 0.0;
    for (var hh = 0u; hh < P.h; hh++) {
        let qb = (n * P.h + hh) * P.d;
        var dot = 0.0;
        for (var i = 0u; i < P.d; i++) {
            dot = fma(q[qb + i], kc[kb + i], dot);
        }
        total = fma(w[n * P.h + hh] * P.hscale, max(dot * P.scale, 0.0), total);
    }
    scores[wid.y * P.stride + t] = total;
}
