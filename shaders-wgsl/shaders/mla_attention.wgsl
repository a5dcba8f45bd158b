// Causal attention over a paged latent cache (MLA in absorbed form, DeepSeek-V2 report §2.1.2)
// with an online softmax (Milakov & Gimelshein 2018; FlashAttention), f32. With
// c_s = cache[slot(s)] = [c_kv (L) | k_pe (R)]:
// score_s = scale * (q_lat . c_s[..L] + q_rope . c_s[L..]), out = sum_s softmax(score)_s c_s[..L].
// Dense (P.topk == 0): the keys of token t are its positions 0 ..= positions[t]. Sparse
// (DeepSeek-V3.2 DSA, P.topk > 0): the keys are the positions selected[t, 0 .. topk] (entries
// past the token's position, e.g. u32::MAX padding, are skipped; `selected` is unread when dense).
// One workgroup per (head h = wid.x, token t = wid.y). Keys are processed in tiles of WG: each
// invocation scores one key of the tile, the tile max/sum update the running (m, z), and each
// invocation accumulates the output dims d = lid + WG * i (i < 8, so L <= 512).
// Needs L + R <= 1024 and L <= 512; any widths otherwise (scalar loads).

struct Params {
    h: u32,
    l: u32,
    r: u32,
    bs: u32,
    max_blocks: u32,
    scale: f32,
    rows: u32, // N * H
    topk: u32, // 0: dense
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
fn mla_attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hh = wid.x;
    let t = wid.y;
    let s = token_seq[t];
    let npos = positions[t] + 1u;
    let dense = P.topk == 0u;
    let nkeys = select(P.topk, npos, dense);
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
        var pos = j;
        if (j < nkeys) {
            if (!dense) {
                pos = selected[t * P.topk + j];
            }
            valid = pos < npos;
        }
        rowb[lid] = 0u;
        if (valid) {
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
