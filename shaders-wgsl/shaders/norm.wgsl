// RMSNorm: y = w * x / sqrt(mean(x^2) + eps) over rows of width d; one workgroup per row.
// add_rms_norm: the residual add before a pre-norm sublayer in the same dispatch — sum = x + r
// is stored, then normed exactly as rms_norm norms a stored x (same f32 arithmetic, loop order
// and reduction), so both outputs are bit-equal to `add` then `rms_norm`.

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// add_rms_norm only: the residual added to x, and the stored sum.
@group(0) @binding(4) var<storage, read> r: array<f32>;
@group(0) @binding(5) var<storage, read_write> sum: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

// 1 / sqrt(mean + eps) of a row from each invocation's partial sum of squares `s`.
fn inv_rms(lid: u32, s: f32) -> f32 {
    red[lid] = s;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    return 1.0 / sqrt(red[0] / f32(P.d) + P.eps);
}

@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= P.rows) {
        return;
    }
    let base = row * P.d;
    var s = 0.0;
    for (var i = lid; i < P.d; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    let inv = inv_rms(lid, s);
    for (var i = lid; i < P.d; i += WG) {
        y[base + i] = x[base + i] * inv * w[i];
    }
}

@compute @workgroup_size(64)
fn add_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= P.rows) {
        return;
    }
    let base = row * P.d;
    var s = 0.0;
    for (var i = lid; i < P.d; i += WG) {
        let v = x[base + i] + r[base + i];
        sum[base + i] = v;
        s += v * v;
    }
    let inv = inv_rms(lid, s);
    for (var i = lid; i < P.d; i += WG) {
        y[base + i] = sum[base + i] * inv * w[i];
    }
}
