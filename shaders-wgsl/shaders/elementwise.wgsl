// Element-wise kernels: residual add and SwiGLU. Each invocation handles 4 consecutive elements.
// Grid: 2-D, linear workgroup id = wid.x + wid.y * nwg.x.

struct Params {
    n: u32, // number of elements
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
const PER: u32 = 4u;

fn first_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return ((wid.x + wid.y * nwg.x) * WG + lid) * PER;
}

// y = a + b
@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i0 = first_index(wid, nwg, lid);
    for (var i = i0; i < min(i0 + PER, P.n); i++) {
        y[i] = a[i] + b[i];
    }
}

// y = silu(a) * b, silu(g) = g / (1 + exp(-g))
@compute @workgroup_size(256)
fn silu_mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i0 = first_index(wid, nwg, lid);
    for (var i = i0; i < min(i0 + PER, P.n); i++) {
        let g = a[i];
        y[i] = g / (1.0 + exp(-g)) * b[i];
    }
}
