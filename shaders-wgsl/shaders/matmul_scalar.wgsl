// Fallback linear for K % 4 != 0: one invocation per output, scalar loads.
// y[m, n_off + n] = sum_k x[m, k] * w[n, k] + bias[n_off + n]; grid: 2-D over M * n_chunk.

struct Params {
    m: u32,
    k: u32,
    n: u32,
    n_off: u32,
    n_chunk: u32,
    has_bias: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn matmul_s(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (idx >= P.m * P.n_chunk) {
        return;
    }
    let m = idx / P.n_chunk;
    let n = idx - m * P.n_chunk;
    var acc = 0.0;
    for (var k = 0u; k < P.k; k++) {
        acc = fma(x[m * P.k + k], w[n * P.k + k], acc);
    }
    if (P.has_bias == 1u) {
        acc += bias[P.n_off + n];
    }
    y[m * P.n + P.n_off + n] = acc;
}
