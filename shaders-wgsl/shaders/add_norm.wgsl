// The residual add before a pre-norm sublayer and its RMSNorm in one dispatch:
// sum = a + r, y = w * sum / sqrt(mean(sum^2) + eps) over rows of width d; one workgroup per
// row. The same f32 arithmetic, loop order and reduction as `add` then norm.wgsl's `rms_norm`
// (each invocation re-reads the sums it wrote), so both outputs are bit-equal to the two
// dispatches.

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> r: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

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
        let v = a[base + i] + r[base + i];
        sum[base + i] = v;
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
        y[base + i] = sum[base + i] * inv * w[i];
    }
}
