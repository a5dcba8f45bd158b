// KDA, token-recurrent (decode and short chunks; Kimi Linear report §2, fla naive_recurrent_kda),
// all f32, on the prepared qn, kn, g of kda_prep.wgsl. The recurrence is independent per value
// column, so one invocation owns one column e of one (sequence, head) and keeps S[:, e] (K <= 128
// values) in registers; per token of the sequence, in order:
//   S[d] *= exp(g[d]);  delta = sigmoid(b) * (v[e] - sum_d S[d] kn[d]);  S[d] += kn[d] delta;
//   o[e] = sum_d S[d] qn[d].
// qn, kn, g [N, H, K]; v [N, H, V]; b [N, H]; state [slots, H, K, V] (updated in place);
// seqs [S, 4] u32 = (slot, first row, rows, fresh); o [N, H, V].

struct Params {
    total: u32,  // S * H * V
    h: u32,
    k: u32,
    v: u32,
}

const MAXK: u32 = 128u;

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> qn: array<f32>;
@group(0) @binding(2) var<storage, read> kn: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read> b: array<f32>;
@group(0) @binding(6) var<storage, read_write> state: array<f32>;
@group(0) @binding(7) var<storage, read> seqs: array<u32>;
@group(0) @binding(8) var<storage, read_write> o: array<f32>;

@compute @workgroup_size(64)
fn kda_recurrent(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (idx >= P.total) {
        return;
    }
    let e = idx % P.v;
    let hh = (idx / P.v) % P.h;
    let s = idx / (P.v * P.h);
    let slot = seqs[4u * s];
    let first = seqs[4u * s + 1u];
    let rows = seqs[4u * s + 2u];
    let fresh = seqs[4u * s + 3u] != 0u;
    let sbase = (slot * P.h + hh) * P.k * P.v + e;
    var st: array<f32, MAXK>;
    for (var d = 0u; d < P.k; d++) {
        st[d] = select(state[sbase + d * P.v], 0.0, fresh);
    }
    for (var i = 0u; i < rows; i++) {
        let r = (first + i) * P.h + hh;
        let kb = r * P.k;
        var kv = 0.0;
        for (var d = 0u; d < P.k; d++) {
            let x = st[d] * exp(g[kb + d]);
            st[d] = x;
            kv += x * kn[kb + d];
        }
        let beta = 1.0 / (1.0 + exp(-clamp(b[r], -80.0, 80.0)));
        let delta = beta * (v[r * P.v + e] - kv);
        var acc = 0.0;
        for (var d = 0u; d < P.k; d++) {
            let x = st[d] + kn[kb + d] * delta;
            st[d] = x;
            acc += x * qn[kb + d];
        }
        o[r * P.v + e] = acc;
    }
    for (var d = 0u; d < P.k; d++) {
        state[sbase + d * P.v] = st[d];
    }
}
