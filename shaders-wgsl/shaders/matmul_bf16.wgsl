// linear with bf16 weights packed two per u32 (element 2i in the low half): the same kernels as
// matmul.wgsl, reading 8 weights per vec4<u32> load. Needs K % 8 == 0. x, bias, y are f32.
// bf16 -> f32 is exact: the bf16 bits become the high half of the f32.

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
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w8: array<vec4<u32>>;
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

// Even-indexed (low halves) and odd-indexed (high halves) weights of one vec4<u32>.
fn lo(w: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(w << vec4<u32>(16u));
}
fn hi(w: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(w & vec4<u32>(0xffff0000u));
}

// x[8i .. 8i+8] split into even and odd elements, matching lo()/hi().
struct X8 {
    e: vec4<f32>,
    o: vec4<f32>,
}
fn x8(base: u32, i: u32) -> X8 {
    let a = x4[base + 2u * i];
    let b = x4[base + 2u * i + 1u];
    return X8(vec4<f32>(a.x, a.z, b.x, b.z), vec4<f32>(a.y, a.w, b.y, b.w));
}

fn dot8(x: X8, w: vec4<u32>) -> f32 {
    return dot(x.e, lo(w)) + dot(x.o, hi(w));
}

// Decode, lanes over n (CPU). Grid: x = ceil(ceil(n_chunk / 4) / 64), y = M.
@compute @workgroup_size(64)
fn matvec_b16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = (wid.x * WG + lid) * 4u;
    let m = wid.y;
    if (n0 >= P.n_chunk) {
        return;
    }
    let k8 = P.k / 8u;
    let last = P.n_chunk - 1u;
    let r0 = n0 * k8;
    let r1 = min(n0 + 1u, last) * k8;
    let r2 = min(n0 + 2u, last) * k8;
    let r3 = min(n0 + 3u, last) * k8;
    let xb = m * (P.k / 4u);
    // Summed in matmul_b16's order, so that a row's result does not depend on how many rows
    // the step has (prefix-cache hits == misses).
    var c = vec4<f32>(0.0);
    for (var i = 0u; i < k8; i++) {
        let a = x8(xb, i);
        let v0 = w8[r0 + i];
        let v1 = w8[r1 + i];
        let v2 = w8[r2 + i];
        let v3 = w8[r3 + i];
        c += vec4<f32>(dot(a.e, lo(v0)) + dot(a.o, hi(v0)), dot(a.e, lo(v1)) + dot(a.o, hi(v1)),
                       dot(a.e, lo(v2)) + dot(a.o, hi(v2)), dot(a.e, lo(v3)) + dot(a.o, hi(v3)));
    }
    for (var j = 0u; j < 4u; j++) {
        store(m, n0 + j, c[j]);
    }
}

// Prefill, 4(m) x 4(n) tile. Grid: x = ceil(ceil(n_chunk / 4) / 64), y = ceil(M / 4).
@compute @workgroup_size(64)
fn matmul_b16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = (wid.x * WG + lid) * 4u;
    let m0 = wid.y * 4u;
    if (n0 >= P.n_chunk) {
        return;
    }
    let k8 = P.k / 8u;
    let k4 = P.k / 4u;
    let lastn = P.n_chunk - 1u;
    let lastm = P.m - 1u;
    let r0 = n0 * k8;
    let r1 = min(n0 + 1u, lastn) * k8;
    let r2 = min(n0 + 2u, lastn) * k8;
    let r3 = min(n0 + 3u, lastn) * k8;
    let xr0 = m0 * k4;
    let xr1 = min(m0 + 1u, lastm) * k4;
    let xr2 = min(m0 + 2u, lastm) * k4;
    let xr3 = min(m0 + 3u, lastm) * k4;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    for (var i = 0u; i < k8; i++) {
        let v0 = w8[r0 + i];
        let v1 = w8[r1 + i];
        let v2 = w8[r2 + i];
        let v3 = w8[r3 + i];
        let l0 = lo(v0);
        let h0 = hi(v0);
        let l1 = lo(v1);
        let h1 = hi(v1);
        let l2 = lo(v2);
        let h2 = hi(v2);
        let l3 = lo(v3);
        let h3 = hi(v3);
        let a0 = x8(xr0, i);
        c0 += vec4<f32>(dot(a0.e, l0) + dot(a0.o, h0), dot(a0.e, l1) + dot(a0.o, h1),
                        dot(a0.e, l2) + dot(a0.o, h2), dot(a0.e, l3) + dot(a0.o, h3));
        let a1 = x8(xr1, i);
        c1 += vec4<f32>(dot(a1.e, l0) + dot(a1.o, h0), dot(a1.e, l1) + dot(a1.o, h1),
                        dot(a1.e, l2) + dot(a1.o, h2), dot(a1.e, l3) + dot(a1.o, h3));
        let a2 = x8(xr2, i);
        c2 += vec4<f32>(dot(a2.e, l0) + dot(a2.o, h0), dot(a2.e, l1) + dot(a2.o, h1),
                        dot(a2.e, l2) + dot(a2.o, h2), dot(a2.e, l3) + dot(a2.o, h3));
        let a3 = x8(xr3, i);
        c3 += vec4<f32>(dot(a3.e, l0) + dot(a3.o, h0), dot(a3.e, l1) + dot(a3.o, h1),
                        dot(a3.e, l2) + dot(a3.o, h2), dot(a3.e, l3) + dot(a3.o, h3));
    }
    for (var j = 0u; j < 4u; j++) {
        store(m0, n0 + j, c0[j]);
        store(m0 + 1u, n0 + j, c1[j]);
        store(m0 + 2u, n0 + j, c2[j]);
        store(m0 + 3u, n0 + j, c3[j]);
    }
}

// Decode, workgroup reduction along K (GPU). Grid: 2-D over ceil(n_chunk / 4) * M workgroups.
var<workgroup> red: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn matvec_wg_b16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let tiles = (P.n_chunk + 3u) / 4u;
    let id = wid.x + wid.y * nwg.x;
    let m = id / tiles;
    let n0 = (id - m * tiles) * 4u;
    if (m >= P.m) {
        return;
    }
    let k8 = P.k / 8u;
    let last = P.n_chunk - 1u;
    let r0 = n0 * k8;
    let r1 = min(n0 + 1u, last) * k8;
    let r2 = min(n0 + 2u, last) * k8;
    let r3 = min(n0 + 3u, last) * k8;
    let xb = m * (P.k / 4u);
    var acc = vec4<f32>(0.0);
    for (var i = lid; i < k8; i += 64u) {
        let xv = x8(xb, i);
        acc += vec4<f32>(dot8(xv, w8[r0 + i]), dot8(xv, w8[r1 + i]), dot8(xv, w8[r2 + i]), dot8(xv, w8[r3 + i]));
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
