// Causal paged attention with online softmax (Milakov & Gimelshein 2018; FlashAttention), f32.
// One workgroup per (head h = wid.x, token t = wid.y). Keys are processed in tiles of WG: each
// invocation scores one key of the tile, the tile max/sum update the running (m, l), and each
// invocation accumulates the output dims d = lid + WG * i (i < 8, so hd_v <= 512).
// Needs hd_k % 4 == 0 and hd_k <= 512.

struct Params {
    h: u32,
    hkv: u32,
    hd_k: u32,
    hd_v: u32,
    bs: u32,
    max_blocks: u32,
    group: u32, // H / Hkv
    scale: f32,
    rows: u32,      // N * H (unused here)
    window: u32,    // sliding window (0: none): keys positions[t] + 1 - window ..= positions[t]
    has_sinks: u32, // 1: sinks[h] is one more logit of each row, with no value (gpt-oss)
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> vc: array<f32>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read> sinks: array<f32>;

const WG: u32 = 64u;
const NEG: f32 = -3.0e38;
var<workgroup> qs: array<vec4<f32>, 128>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> pw: array<f32, WG>;

fn slot_of(s: u32, j: u32) -> u32 {
    let blk = block_tables[s * P.max_blocks + j / P.bs];
    return blk * P.bs + j % P.bs;
}

@compute @workgroup_size(64)
fn paged_attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hh = wid.x;
    let t = wid.y;
    let s = token_seq[t];
    let nkeys = positions[t] + 1u;
    let g = hh / P.group;
    let hk4 = P.hd_k / 4u;
    let qb = (t * P.h + hh) * hk4;
    for (var i = lid; i < hk4; i += WG) {
        qs[i] = q4[qb + i];
    }
    var m = NEG;
    var l = 0.0;
    if (P.has_sinks == 1u) {
        // The sink as the first logit: max z, weight exp(z - z) = 1, no value.
        m = sinks[hh];
        l = 1.0;
    }
    var first = 0u;
    if (P.window > 0u && nkeys > P.window) {
        first = nkeys - P.window;
    }
    var acc: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        acc[i] = 0.0;
    }
    workgroupBarrier();
    for (var j0 = first; j0 < nkeys; j0 += WG) {
        let j = j0 + lid;
        var score = NEG;
        if (j < nkeys) {
            let kb = (slot_of(s, j) * P.hkv + g) * hk4;
            var d = vec4<f32>(0.0);
            for (var i = 0u; i < hk4; i++) {
                d = fma(qs[i], k4[kb + i], d);
            }
            score = (d.x + d.y + d.z + d.w) * P.scale;
        }
        sc[lid] = score;
        workgroupBarrier();
        let cnt = min(WG, nkeys - j0);
        var tm = m;
        for (var i = 0u; i < cnt; i++) {
            tm = max(tm, sc[i]);
        }
        pw[lid] = select(0.0, exp(score - tm), j < nkeys);
        workgroupBarrier();
        let corr = exp(m - tm);
        l *= corr;
        for (var i = 0u; i < 8u; i++) {
            acc[i] *= corr;
        }
        for (var i = 0u; i < cnt; i++) {
            let p = pw[i];
            l += p;
            let vb = (slot_of(s, j0 + i) * P.hkv + g) * P.hd_v;
            for (var e = 0u; e < 8u; e++) {
                let d = lid + e * WG;
                if (d < P.hd_v) {
                    acc[e] = fma(p, vc[vb + d], acc[e]);
                }
            }
        }
        m = tm;
        workgroupBarrier();
    }
    let ob = (t * P.h + hh) * P.hd_v;
    for (var e = 0u; e < 8u; e++) {
        let d = lid + e * WG;
        if (d < P.hd_v) {
            out[ob + d] = acc[e] / l;
        }
    }
}
