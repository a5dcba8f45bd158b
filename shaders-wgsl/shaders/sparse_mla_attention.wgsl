// Sparse MLA (DeepSeek-V3.2 DSA): mla_attention.wgsl restricted to the selected positions
// selected[t, j] (u32::MAX entries are skipped), with the same online softmax, f32.
// One workgroup per (head h = wid.x, token t = wid.y); the key loop runs over the topk entries.
// Needs L + R <= 1024 and L <= 512.

struct Params {
    h: u32,
    l: u32,
    r: u32,
    bs: u32,
    max_blocks: u32,
    scale: f32,
    rows: u32, // N * H
    topk: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q_lat: array<f32>;
@group(0) @binding(2) var<storage, read> q_rope: array<f32>;
@group(0) @binding(3) var<storage, read> cache: array<f32>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;
@group(0) @binding(7) var<storage, read> selected: array<u32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
const NEG: f32 = -3.0e38;
var<workgroup> qs: array<f32, 1024>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> pw: array<f32, WG>;
var<workgroup> rowb: array<u32, WG>;

@compute @workgroup_size(64)
fn sparse_mla_attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hh = wid.x;
    let t = wid.y;
    let s = token_seq[t];
    let nkeys = P.topk;
    let npos = positions[t] + 1u;
    let w = P.l + P.r;
    let row = t * P.h + hh;
    for (var i = lid; i < P.l; i += WG) {
        qs[i] = q_lat[row * P.l + i];
    }
    for (var i = lid; i < P.r; i += WG) {
        qs[P.l + i] = q_rope[row * P.r + i];
    }
    var m = NEG;
    var z = 0.0;
    var acc: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        acc[i] = 0.0;
    }
    workgroupBarrier();
    for (var j0 = 0u; j0 < nkeys; j0 += WG) {
        let j = j0 + lid;
        var score = NEG;
        var valid = false;
        if (j < nkeys) {
            let pos = selected[t * P.topk + j];
            valid = pos < npos;
        }
        rowb[lid] = 0u;
        if (valid) {
            let pos = selected[t * P.topk + j];
            let blk = block_tables[s * P.max_blocks + pos / P.bs];
            let cb = (blk * P.bs + pos % P.bs) * w;
            rowb[lid] = cb;
            var d = 0.0;
            for (var i = 0u; i < w; i++) {
                d = fma(qs[i], cache[cb + i], d);
            }
            score = d * P.scale;
        }
        sc[lid] = score;
        workgroupBarrier();
        let cnt = min(WG, nkeys - j0);
        var tm = m;
        for (var i = 0u; i < cnt; i++) {
            tm = max(tm, sc[i]);
        }
        pw[lid] = select(0.0, exp(score - tm), valid);
        workgroupBarrier();
        let corr = exp(m - tm);
        z *= corr;
        for (var i = 0u; i < 8u; i++) {
            acc[i] *= corr;
        }
        for (var i = 0u; i < cnt; i++) {
            let p = pw[i];
            z += p;
            let cb = rowb[i];
            for (var e = 0u; e < 8u; e++) {
                let d = lid + e * WG;
                if (d < P.l) {
                    acc[e] = fma(p, cache[cb + d], acc[e]);
                }
            }
        }
        m = tm;
        workgroupBarrier();
    }
    let ob = row * P.l;
    for (var e = 0u; e < 8u; e++) {
        let d = lid + e * WG;
        if (d < P.l) {
            out[ob + d] = acc[e] / z;
        }
    }
}
