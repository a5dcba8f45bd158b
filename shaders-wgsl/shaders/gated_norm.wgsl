// Sigmoid-gated RMSNorm (HF KimiLinearRMSNormGated), f32:
// y = w * x / sqrt(mean(x^2) + eps) * sigmoid(gate) over rows of width d; one workgroup per row.
// x, gate, y [R, D]; w [D].

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(64)
fn gated_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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
    red[lid] = s;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(P.d) + P.eps);
    for (var i = lid; i < P.d; i += WG) {
        let g = 1.0 / (1.0 + exp(-clamp(gate[base + i], -80.0, 80.0)));
        y[base + i] = x[base + i] * inv * w[i] * g;
    }
}
