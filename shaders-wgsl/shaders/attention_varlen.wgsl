// Attention of query rows over one contiguous key segment, continuing a softmax state
// (Backend::attention_varlen; online softmax and the merge of two partial results by their
// log-sum-exp: FlashAttention-2, Dao 2023, §3.1). f32 throughout.
// One workgroup per (query row t, head hh), linearised over a 2-D grid. Keys are processed in
// tiles of WG: each invocation scores one key of the tile, the tile max/sum update the running
// (m, l), and each invocation accumulates the output dims d = lid + WG * e (e < 8: dv <= 512).
// Needs dk % 4 == 0 and dk <= 512.
//
// `lay` packs the call's layout (built on the host from VarlenMeta):
//   [0, S]            query_start      [S + 1, 2S + 1]  key_start
//   [2S + 2, 3S + 1]  key_pos0         [3S + 2, ...)    positions (N), then row -> sequence (N)

struct Params {
    n: u32,
    h: u32,
    hkv: u32,
    dk: u32,
    dv: u32,
    group: u32, // H / Hkv
    scale: f32,
    seqs: u32,
    has_prior: u32,
    causal: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> vv: array<f32>;
@group(0) @binding(4) var<storage, read> lay: array<u32>;
@group(0) @binding(5) var<storage, read> prior_o: array<f32>;
@group(0) @binding(6) var<storage, read> prior_lse: array<u32>; // f32 bits
@group(0) @binding(7) var<storage, read_write> out_o: array<f32>;
@group(0) @binding(8) var<storage, read_write> out_lse: array<u32>; // f32 bits

const WG: u32 = 64u;
const NEG: f32 = -3.0e38;
// −∞ as bits: shaders may not produce or compare infinities reliably, so the log-sum-exp
// buffers are read and written as u32 and "no key seen" is tested by its bit pattern.
const NEG_INF_BITS: u32 = 0xff800000u;
var<workgroup> qs: array<vec4<f32>, 128>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> pw: array<f32, WG>;

@compute @workgroup_size(64)
fn attention_varlen(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = wid.x + wid.y * nwg.x;
    if (idx >= P.n * P.h) {
        return;
    }
    let t = idx / P.h;
    let hh = idx % P.h;
    let S = P.seqs;
    let s = lay[3u * S + 2u + P.n + t];
    let k0 = lay[S + 1u + s];
    let k1 = lay[S + 2u + s];
    let kp0 = lay[2u * S + 2u + s];
    let pos = lay[3u * S + 2u + t];
    var nk = k1 - k0;
    if (P.causal == 1u) {
        nk = select(min(nk, pos - kp0 + 1u), 0u, pos < kp0);
    }
    let g = hh / P.group;
    let hk4 = P.dk / 4u;
    let qb = (t * P.h + hh) * hk4;
    for (var i = lid; i < hk4; i += WG) {
        qs[i] = q4[qb + i];
    }
    var m = NEG;
    var l = 0.0;
    var acc: array<f32, 8>;
    for (var e = 0u; e < 8u; e++) {
        acc[e] = 0.0;
    }
    workgroupBarrier();
    for (var j0 = 0u; j0 < nk; j0 += WG) {
        let j = j0 + lid;
        var score = NEG;
        if (j < nk) {
            let kb = ((k0 + j) * P.hkv + g) * hk4;
            var d = vec4<f32>(0.0);
            for (var i = 0u; i < hk4; i++) {
                d = fma(qs[i], k4[kb + i], d);
            }
            score = (d.x + d.y + d.z + d.w) * P.scale;
        }
        sc[lid] = score;
        workgroupBarrier();
        let cnt = min(WG, nk - j0);
        var tm = m;
        for (var i = 0u; i < cnt; i++) {
            tm = max(tm, sc[i]);
        }
        pw[lid] = select(0.0, exp(score - tm), j < nk);
        workgroupBarrier();
        let corr = exp(m - tm);
        l *= corr;
        for (var e = 0u; e < 8u; e++) {
            acc[e] *= corr;
        }
        for (var i = 0u; i < cnt; i++) {
            let p = pw[i];
            l += p;
            let vb = ((k0 + j0 + i) * P.hkv + g) * P.dv;
            for (var e = 0u; e < 8u; e++) {
                let d = lid + e * WG;
                if (d < P.dv) {
                    acc[e] = fma(p, vv[vb + d], acc[e]);
                }
            }
        }
        m = tm;
        workgroupBarrier();
    }
    // This segment's normalised output and log-sum-exp (none: 0 and −∞).
    let row = t * P.h + hh;
    let seen = l > 0.0;
    var lse = m + log(max(l, 1e-30));
    var wa = 0.0; // weight of the prior state
    var wb = 1.0; // weight of this segment
    if (P.has_prior == 1u) {
        let plb = prior_lse[row];
        let prior_seen = plb != NEG_INF_BITS;
        let pl = bitcast<f32>(plb);
        if (prior_seen && seen) {
            let mx = max(pl, lse);
            wa = exp(pl - mx);
            wb = exp(lse - mx);
            let tot = wa + wb;
            wa /= tot;
            wb /= tot;
            lse = mx + log(tot);
        } else if (prior_seen) {
            wa = 1.0;
            wb = 0.0;
            lse = pl;
        }
    }
    let has_out = seen || wa > 0.0;
    let ob = row * P.dv;
    for (var e = 0u; e < 8u; e++) {
        let d = lid + e * WG;
        if (d < P.dv) {
            var o = 0.0;
            if (seen) {
                o = wb * (acc[e] / l);
            }
            if (wa > 0.0) {
                o += wa * prior_o[ob + d];
            }
            out_o[ob + d] = o;
        }
    }
    if (lid == 0u) {
        out_lse[row] = select(NEG_INF_BITS, bitcast<u32>(lse), has_out);
    }
}
