// Routed experts, step 2: y[t, o] = sum_j weights[t, j] * (down[e, o] . h[t, j] (+ bias[e, o])) with
// e = ids[t, j]. h [N, k, F] f32 (from moe_act.wgsl), ids [N, k] u32, weights [N, k] f32,
// down [E, D, F] f32 or packed bf16 (two per u32, element 2i in the low half), y [N, D] f32.
// Out-of-range ids contribute nothing.

struct Params {
    d: u32,
    f: u32,
    k: u32,
    e: u32,
    total: u32, // N * D
    bf16: u32,
    has_bias: u32, // 1: add bias[e, o] to each expert's output before weighting
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> h: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> w: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> bias: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

fn wat(i: u32) -> f32 {
    if (P.bf16 == 1u) {
        let v = w[i >> 1u];
        return bitcast<f32>(select(v << 16u, v & 0xffff0000u, (i & 1u) == 1u));
    }
    return bitcast<f32>(w[i]);
}

// One invocation per (t, o) (CPU adapters).
@compute @workgroup_size(64)
fn moe_down_lanes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * WG + lid;
    if (idx >= P.total) {
        return;
    }
    let t = idx / P.d;
    let o = idx - t * P.d;
    var acc = 0.0;
    for (var j = 0u; j < P.k; j++) {
        let ex = ids[t * P.k + j];
        if (ex >= P.e) {
            continue;
        }
        let hb = (t * P.k + j) * P.f;
        let wb = (ex * P.d + o) * P.f;
        var dot = 0.0;
        for (var i = 0u; i < P.f; i++) {
            dot = fma(h[hb + i], wat(wb + i), dot);
        }
        if (P.has_bias == 1u) {
            dot += bias[ex * P.d + o];
        }
        acc = fma(weights[t * P.k + j], dot, acc);
    }
    y[idx] = acc;
}

// One workgroup per (t, o): coalesced loads along F and one tree reduction (GPUs).
@compute @workgroup_size(64)
fn moe_down_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let idx = wid.x + wid.y * nwg.x;
    if (idx >= P.total) {
        return;
    }
    let t = idx / P.d;
    let o = idx - t * P.d;
    var acc = 0.0;
    for (var j = 0u; j < P.k; j++) {
        let ex = ids[t * P.k + j];
        if (ex >= P.e) {
            continue;
        }
        let hb = (t * P.k + j) * P.f;
        let wb = (ex * P.d + o) * P.f;
        var dot = 0.0;
        for (var i = lid; i < P.f; i += WG) {
            dot = fma(h[hb + i], wat(wb + i), dot);
        }
        if (P.has_bias == 1u && lid == 0u) {
            dot += bias[ex * P.d + o];
        }
        acc = fma(weights[t * P.k + j], dot, acc);
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        y[idx] = red[0];
    }
}
