// stream_mix: out[t, m, d] = Σ_s w[t, s, m] · x[t, s, d], f32 (hyper-connections' collapse,
// stream mixing and expansion). x [N, S, D], w [N, S, M], out [N, M, D]. One invocation per
// output element, so reads of x and writes of out are contiguous along d.
// Grid: 2-D, linear workgroup id = wid.x + wid.y * nwg.x.

struct Params {
    total: u32, // N · M · D
    s: u32,
    d: u32,
    m: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn stream_mix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= P.total) {
        return;
    }
    let d = i % P.d;
    let tm = i / P.d;
    let m = tm % P.m;
    let t = tm / P.m;
    var acc = 0.0;
    for (var s = 0u; s < P.s; s++) {
        let row = t * P.s + s;
        acc += w[row * P.m + m] * x[row * P.d + d];
    }
    y[i] = acc;
}
