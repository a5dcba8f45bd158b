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

// Decode and short steps on GPUs (M <= WG_MAX_M in linear.rs): a workgroup computes 4 outputs
// (n) for up to 4 tokens (m). Its 64 invocations stride along K with 16-byte loads (8 weights),
// each weight load serving every token of the tile, then a workgroup tree reduction. A token's
// sums are formed in the same order whatever the other tokens of its tile (M = 1 sums as M = 4).
// Grid: 2-D over ceil(n_chunk / 4) * ceil(M / 4) workgroups.
var<workgroup> red: array<array<vec4<f32>, 64>, 4>;

// The 4 outputs of one token for one 8-weight step of the 4 rows (unpacked as lo/hi pairs).
fn dot4x8(x: X8, l0: vec4<f32>, h0: vec4<f32>, l1: vec4<f32>, h1: vec4<f32>, l2: vec4<f32>,
          h2: vec4<f32>, l3: vec4<f32>, h3: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(dot(x.e, l0) + dot(x.o, h0), dot(x.e, l1) + dot(x.o, h1),
                     dot(x.e, l2) + dot(x.o, h2), dot(x.e, l3) + dot(x.o, h3));
}

@compute @workgroup_size(64)
fn matvec_wg_b16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let tiles = (P.n_chunk + 3u) / 4u;
    let id = wid.x + wid.y * nwg.x;
    let mt = id / tiles;
    let n0 = (id - mt * tiles) * 4u;
    let m0 = mt * 4u;
    if (m0 >= P.m) {
        return;
    }
    // Tokens of this tile (uniform in the workgroup).
    let mc = min(4u, P.m - m0);
    let k8 = P.k / 8u;
    let k4 = P.k / 4u;
    let last = P.n_chunk - 1u;
    let r0 = n0 * k8;
    let r1 = min(n0 + 1u, last) * k8;
    let r2 = min(n0 + 2u, last) * k8;
    let r3 = min(n0 + 3u, last) * k8;
    // One accumulator per token, named (not an indexed array, which a GPU compiler may put in
    // local memory); the branches on `mc` are uniform.
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var i = lid; i < k8; i += 64u) {
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
        a0 += dot4x8(x8(m0 * k4, i), l0, h0, l1, h1, l2, h2, l3, h3);
        if (mc > 1u) {
            a1 += dot4x8(x8((m0 + 1u) * k4, i), l0, h0, l1, h1, l2, h2, l3, h3);
        }
        if (mc > 2u) {
            a2 += dot4x8(x8((m0 + 2u) * k4, i), l0, h0, l1, h1, l2, h2, l3, h3);
        }
        if (mc > 3u) {
            a3 += dot4x8(x8((m0 + 3u) * k4, i), l0, h0, l1, h1, l2, h2, l3, h3);
        }
    }
    red[0][lid] = a0;
    red[1][lid] = a1;
    red[2][lid] = a2;
    red[3][lid] = a3;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (lid < st) {
            for (var j = 0u; j < mc; j++) {
                red[j][lid] += red[j][lid + st];
            }
        }
        workgroupBarrier();
    }
    if (lid < 16u) {
        let j = lid / 4u;
        if (j < mc) {
            store(m0 + j, n0 + lid % 4u, red[j][0][lid % 4u]);
        }
    }
}
