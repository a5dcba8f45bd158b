// KDA per-(token, head) preparation shared by the recurrent and chunked paths (Kimi Linear
// report §2; fla naive_recurrent_kda, gate.py), all f32. One invocation per (token, head):
//   qn = q / sqrt(sum q^2 + 1e-6) * K^-1/2,  kn = k / sqrt(sum k^2 + 1e-6),
//   g  = -exp(a_log[h]) * softplus(a + dt_bias[h, :])            (lower_bound == 0 flag), or
//   g  = lb * sigmoid(exp(a_log[h]) * (a + dt_bias[h, :]))        (lower-bound gate).
// q, k, a [N, H, K]; a_log [H]; dt_bias [H, K]; outputs qn, kn, g [N, H, K] (g = log decay <= 0).

struct Params {
    rows: u32,   // N * H
    h: u32,
    k: u32,
    bounded: u32,
    lb: f32,
    scale: f32,  // K^-1/2
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> a: array<f32>;
@group(0) @binding(4) var<storage, read> a_log: array<f32>;
@group(0) @binding(5) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(6) var<storage, read_write> qn: array<f32>;
@group(0) @binding(7) var<storage, read_write> kn: array<f32>;
@group(0) @binding(8) var<storage, read_write> g: array<f32>;

// log(1 + e^x) without overflow and without losing small values (log1p via u = 1 + e).
fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    let e = exp(x);
    let u = 1.0 + e;
    if (u == 1.0) {
        return e;
    }
    return log(u) * (e / (u - 1.0));
}

@compute @workgroup_size(64)
fn kda_prep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let r = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (r >= P.rows) {
        return;
    }
    let hh = r % P.h;
    let base = r * P.k;
    var sq = 0.0;
    var sk = 0.0;
    for (var d = 0u; d < P.k; d++) {
        sq += q[base + d] * q[base + d];
        sk += k[base + d] * k[base + d];
    }
    let iq = P.scale / sqrt(sq + 1e-6);
    let ik = 1.0 / sqrt(sk + 1e-6);
    let rate = exp(a_log[hh]);
    for (var d = 0u; d < P.k; d++) {
        qn[base + d] = q[base + d] * iq;
        kn[base + d] = k[base + d] * ik;
        let x = a[base + d] + dt_bias[hh * P.k + d];
        var gg: f32;
        if (P.bounded != 0u) {
            gg = P.lb / (1.0 + exp(-clamp(rate * x, -80.0, 80.0)));
        } else {
            gg = -rate * softplus(x);
        }
        g[base + d] = gg;
    }
}
