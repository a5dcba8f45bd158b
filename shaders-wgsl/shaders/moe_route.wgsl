// MoE routing, DeepSeek-V3 "noaux_tc" (DeepSeek-V3 report §2.1.2; HF DeepseekV3TopkRouter), one
// invocation per token, all f32. Input: the router logits [N, E] (x . gate_w^T, computed by
// linear). s = sigmoid(logit), choice c = s + bias. With n_group > 1 each group's score is the sum
// of its two largest c (its only c when a group has one expert), and experts outside the
// topk_group best groups (ties: lower group first) are masked. The top_k largest c are chosen in
// descending order, ties by lower index; masked experts compare below every kept one and among
// themselves by index (as −∞ would). Weights are the unbiased s, divided by their sum (+1e-20)
// when norm == 1, times scale. Output ids [N, k] u32, weights [N, k] f32.
// Needs n_group <= 32. No per-expert private arrays: scores are recomputed from the logits.

struct Params {
    n: u32,
    e: u32,
    k: u32,
    n_group: u32,
    per: u32, // E / n_group
    topk_group: u32,
    norm: u32,
    has_bias: u32,
    scale: f32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

// Below every real choice score (sigmoid in [0, 1] plus a bias of moderate size).
const MASKED: f32 = -3.0e38;
const NONE: u32 = 0xffffffffu;

fn sigmoid(l: f32) -> f32 {
    // Clamped so that exp cannot overflow; σ(±80) is 0 / 1 to f32 precision anyway.
    return 1.0 / (1.0 + exp(-clamp(l, -80.0, 80.0)));
}

fn choice(base: u32, i: u32) -> f32 {
    var c = sigmoid(logits[base + i]);
    if (P.has_bias == 1u) {
        c += bias[i];
    }
    return c;
}

@compute @workgroup_size(64)
fn moe_route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let t = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (t >= P.n) {
        return;
    }
    let base = t * P.e;
    // Bit g set: group g kept.
    var keep = 0xffffffffu;
    if (P.n_group > 1u) {
        var gs: array<f32, 32>;
        for (var g = 0u; g < P.n_group; g++) {
            var top1 = MASKED;
            var top2 = MASKED;
            for (var i = g * P.per; i < (g + 1u) * P.per; i++) {
                let c = choice(base, i);
                if (c > top1) {
                    top2 = top1;
                    top1 = c;
                } else if (c > top2) {
                    top2 = c;
                }
            }
            gs[g] = select(top1 + top2, top1, P.per == 1u);
        }
        keep = 0u;
        for (var g = 0u; g < P.n_group; g++) {
            var rank = 0u;
            for (var o = 0u; o < P.n_group; o++) {
                if (gs[o] > gs[g] || (gs[o] == gs[g] && o < g)) {
                    rank += 1u;
                }
            }
            if (rank < P.topk_group) {
                keep |= 1u << g;
            }
        }
    }
    // Selection sort by (c descending, index ascending): pick j is the best entry strictly after
    // pick j - 1 in that order.
    var pc = 0.0;
    var pi = NONE;
    var sum = 0.0;
    let ob = t * P.k;
    for (var j = 0u; j < P.k; j++) {
        var bc = MASKED;
        var bi = NONE;
        for (var i = 0u; i < P.e; i++) {
            var c = MASKED;
            if (((keep >> (i / P.per)) & 1u) == 1u) {
                c = choice(base, i);
            }
            let after = pi == NONE || c < pc || (c == pc && i > pi);
            if (after && (bi == NONE || c > bc)) {
                bc = c;
                bi = i;
            }
        }
        pc = bc;
        pi = bi;
        let s = sigmoid(logits[base + bi]);
        ids[ob + j] = bi;
        weights[ob + j] = s;
        sum += s;
    }
    for (var j = 0u; j < P.k; j++) {
        var wv = weights[ob + j];
        if (P.norm == 1u) {
            wv = wv / (sum + 1e-20);
        }
        weights[ob + j] = wv * P.scale;
    }
}
