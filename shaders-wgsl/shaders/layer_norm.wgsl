// LayerNorm (Ba et al. 2016), f32: y = (x - mean) / sqrt(var + eps) * w + b over rows of width d
// (biased variance, computed in a second pass over (x - mean) for accuracy); one workgroup per row.
// x, y [R, D]; w, b [D].

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

fn reduce(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= P.rows) {
        return;
    }
    let base = row * P.d;
    var s = 0.0;
    for (var i = lid; i < P.d; i += WG) {
        s += x[base + i];
    }
    let mean = reduce(lid, s) / f32(P.d);
    var v = 0.0;
    for (var i = lid; i < P.d; i += WG) {
        let c = x[base + i] - mean;
        v = fma(c, c, v);
    }
    let inv = 1.0 / sqrt(reduce(lid, v) / f32(P.d) + P.eps);
    for (var i = lid; i < P.d; i += WG) {
        y[base + i] = (x[base + i] - mean) * inv * w[i] + b[i];
    }
}
