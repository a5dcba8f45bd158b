// Element-wise kernels: residual add, SwiGLU and GELU (exact and tanh; `b` unused). Each invocation handles 4 consecutive elements.
// Grid: 2-D, linear workgroup id = wid.x + wid.y * nwg.x.

struct Params {
    n: u32, // number of elements
    limit: f32, // silu_mul_limit's clamp
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

// y = silu(min(a, l)) * clamp(b, -l, l) (glm5_next's swiglu_limit)
@compute @workgroup_size(256)
fn silu_mul_limit(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i0 = first_index(wid, nwg, lid);
    for (var i = i0; i < min(i0 + PER, P.n); i++) {
        let g = min(a[i], P.limit);
        y[i] = g / (1.0 + exp(-g)) * clamp(b[i], -P.limit, P.limit);
    }
}

// erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7): WGSL has no erf builtin.
fn erf_as(x: f32) -> f32 {
    let ax = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * ax);
    let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
        + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - p * exp(-ax * ax));
}

// y = ½a(1 + erf(a/√2))  (PyTorch nn.GELU())
@compute @workgroup_size(256)
fn gelu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i0 = first_index(wid, nwg, lid);
    for (var i = i0; i < min(i0 + PER, P.n); i++) {
        let g = a[i];
        y[i] = 0.5 * g * (1.0 + erf_as(g * 0.70710678118654752));
    }
}

// y = ½a(1 + tanh(√(2/π)(a + 0.044715a³)))  (gelu_pytorch_tanh); the argument is clamped where
// tanh is ±1 in f32 anyway, so no implementation overflows an exp inside tanh.
@compute @workgroup_size(256)
fn gelu_tanh(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i0 = first_index(wid, nwg, lid);
    for (var i = i0; i < min(i0 + PER, P.n); i++) {
        let g = a[i];
        let u = clamp(0.79788456080286536 * (g + 0.044715 * g * g * g), -15.0, 15.0);
        y[i] = 0.5 * g * (1.0 + tanh(u));
    }
}
