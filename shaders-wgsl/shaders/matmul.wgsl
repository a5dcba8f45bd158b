// y[m, n_off + n] = sum_k x[m, k] * w[n, k] + bias[n_off + n], for one row-chunk of w.
// x [M, K], w chunk [n_chunk, K], y [M, N] (row stride N), f32 accumulation.
// Register-blocked: each invocation computes a 4(m) x 4(n) tile (matmul_v4) or 1 x 4 (matvec_v4)
// with vec4 loads along K (needs K % 4 == 0); the *_s kernels handle any K, one output each.

struct Params {
    m: u32,
    k: u32,
    n: u32,        // columns of y (row stride)
    n_off: u32,    // first output column of this chunk
    n_chunk: u32,  // rows of w in this chunk
    has_bias: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;

fn bias_at(n: u32) -> f32 {
    if (P.has_bias == 1u) {
        return bias[P.n_off + n];
    }
    return 0.0;
}

fn store(m: u32, n: u32, v: f32) {
    if (n < P.n_chunk && m < P.m) {
        y[m * P.n + P.n_off + n] = v + bias_at(n);
    }
}

// Grid: x = ceil(ceil(n_chunk / 4) / 64), y = M.
@compute @workgroup_size(64)
fn matvec_v4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = (wid.x * WG + lid) * 4u;
    let m = wid.y;
    if (n0 >= P.n_chunk) {
        return;
    }
    let k4 = P.k / 4u;
    let last = P.n_chunk - 1u;
    let w0 = n0 * k4;
    let w1 = min(n0 + 1u, last) * k4;
    let w2 = min(n0 + 2u, last) * k4;
    let w3 = min(n0 + 3u, last) * k4;
    let xb = m * k4;
    // Summed in matmul_v4's order (one dot per vec4 of K, added in K order), so that a row's
    // result does not depend on how many rows the step has (prefix-cache hits == misses).
    var c = vec4<f32>(0.0);
    for (var i = 0u; i < k4; i++) {
        let xv = x4[xb + i];
        c += vec4<f32>(dot(xv, w4[w0 + i]), dot(xv, w4[w1 + i]), dot(xv, w4[w2 + i]), dot(xv, w4[w3 + i]));
    }
    for (var j = 0u; j < 4u; j++) {
        store(m, n0 + j, c[j]);
    }
}

// Grid: x = ceil(ceil(n_chunk / 4) / 64), y = ceil(M / 4).
@compute @workgroup_size(64)
fn matmul_v4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = (wid.x * WG + lid) * 4u;
    let m0 = wid.y * 4u;
    if (n0 >= P.n_chunk) {
        return;
    }
    let k4 = P.k / 4u;
    let lastn = P.n_chunk - 1u;
    let lastm = P.m - 1u;
    let w0 = n0 * k4;
    let w1 = min(n0 + 1u, lastn) * k4;
    let w2 = min(n0 + 2u, lastn) * k4;
    let w3 = min(n0 + 3u, lastn) * k4;
    let x0 = m0 * k4;
    let x1 = min(m0 + 1u, lastm) * k4;
    let x2 = min(m0 + 2u, lastm) * k4;
    let x3 = min(m0 + 3u, lastm) * k4;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    for (var i = 0u; i < k4; i++) {
        let b0 = w4[w0 + i];
        let b1 = w4[w1 + i];
        let b2 = w4[w2 + i];
        let b3 = w4[w3 + i];
        let a0 = x4[x0 + i];
        c0 += vec4<f32>(dot(a0, b0), dot(a0, b1), dot(a0, b2), dot(a0, b3));
        let a1 = x4[x1 + i];
        c1 += vec4<f32>(dot(a1, b0), dot(a1, b1), dot(a1, b2), dot(a1, b3));
        let a2 = x4[x2 + i];
        c2 += vec4<f32>(dot(a2, b0), dot(a2, b1), dot(a2, b2), dot(a2, b3));
        let a3 = x4[x3 + i];
        c3 += vec4<f32>(dot(a3, b0), dot(a3, b1), dot(a3, b2), dot(a3, b3));
    }
    for (var j = 0u; j < 4u; j++) {
        store(m0, n0 + j, c0[j]);
        store(m0 + 1u, n0 + j, c1[j]);
        store(m0 + 2u, n0 + j, c2[j]);
        store(m0 + 3u, n0 + j, c3[j]);
    }
}

// GPU-friendly decode kernel: a workgroup of 64 computes 4 outputs; invocations stride along K
// (coalesced loads) and the partial sums are reduced in workgroup memory.
// Grid: 2-D over ceil(n_chunk / 4) * M workgroups, linear id = m * ceil(n_chunk / 4) + tile.
var<workgroup> red: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn matvec_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let tiles = (P.n_chunk + 3u) / 4u;
    let id = wid.x + wid.y * nwg.x;
    let m = id / tiles;
    let n0 = (id - m * tiles) * 4u;
    if (m >= P.m) {
        return;
    }
    let k4 = P.k / 4u;
    let last = P.n_chunk - 1u;
    let r0 = n0 * k4;
    let r1 = min(n0 + 1u, last) * k4;
    let r2 = min(n0 + 2u, last) * k4;
    let r3 = min(n0 + 3u, last) * k4;
    let xb = m * k4;
    var acc = vec4<f32>(0.0);
    for (var i = lid; i < k4; i += 64u) {
        let a = x4[xb + i];
        acc += vec4<f32>(dot(a, w4[r0 + i]), dot(a, w4[r1 + i]), dot(a, w4[r2 + i]), dot(a, w4[r3 + i]));
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    if (lid < 4u) {
        store(m, n0 + lid, red[0][lid]);
    }
}
