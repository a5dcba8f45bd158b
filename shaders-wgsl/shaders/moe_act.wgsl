// Routed SwiGLU experts, step 1 (Shazeer 2020; DeepSeekMoE): for token t, slot j, e = ids[t, j]
// and i < F: h[t, j, i] = silu(g) * u with g = gate_up[e, i] . x[t], u = gate_up[e, F + i] . x[t].
// x [N, D] f32, ids [N, k] u32, gate_up [E, 2F, D] f32 or packed bf16 (two per u32, element 2i in
// the low half), h [N, k, F] f32. An out-of-range id gives h = 0.

struct Params {
    d: u32,
    f: u32,
    k: u32,
    e: u32,
    total: u32, // N * k * F
    bf16: u32,
    act: u32,      // 0: silu(g) * u, rows [gate; up]; 1: gpt-oss, rows interleaved (2i gate, 2i+1 up)
    has_bias: u32, // 1: add bias[e, row] to each projection
    alpha: f32,    // gpt-oss sigmoid slope
    limit: f32,    // gpt-oss clamp
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read_write> h: array<f32>;
@group(0) @binding(5) var<storage, read> bias: array<f32>;

const WG: u32 = 64u;
var<workgroup> rg: array<f32, WG>;
var<workgroup> ru: array<f32, WG>;

fn wat(i: u32) -> f32 {
    if (P.bf16 == 1u) {
        let v = w[i >> 1u];
        return bitcast<f32>(select(v << 16u, v & 0xffff0000u, (i & 1u) == 1u));
    }
    return bitcast<f32>(w[i]);
}

fn silu_mul(g: f32, u: f32) -> f32 {
    return g / (1.0 + exp(-clamp(g, -80.0, 80.0))) * u;
}

// Row of the gate (and up) weight of output i of expert ex.
fn gate_row(ex: u32, i: u32) -> u32 {
    return ex * 2u * P.f + select(i, 2u * i, P.act == 1u);
}

fn up_row(ex: u32, i: u32) -> u32 {
    return select(gate_row(ex, i) + P.f, gate_row(ex, i) + 1u, P.act == 1u);
}

// The activation of one output from its two projections (biases added here).
fn activate(ex: u32, i: u32, g0: f32, u0: f32) -> f32 {
    var g = g0;
    var u = u0;
    if (P.has_bias == 1u) {
        g += bias[gate_row(ex, i)];
        u += bias[up_row(ex, i)];
    }
    if (P.act == 1u) {
        g = min(g, P.limit);
        u = clamp(u, -P.limit, P.limit);
        return (u + 1.0) * g / (1.0 + exp(-clamp(P.alpha * g, -80.0, 80.0)));
    }
    if (P.act == 2u) {
        // glm5_next's swiglu_limit: rows [gate; up] as act 0, both clamped.
        g = min(g, P.limit);
        u = clamp(u, -P.limit, P.limit);
    }
    return silu_mul(g, u);
}

// One invocation per (t, j, i) (CPU adapters).
@compute @workgroup_size(64)
fn moe_act_lanes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * WG + lid;
    if (idx >= P.total) {
        return;
    }
    let tj = idx / P.f; // t * k + j
    let i = idx - tj * P.f;
    let t = tj / P.k;
    let ex = ids[tj];
    if (ex >= P.e) {
        h[idx] = 0.0;
        return;
    }
    let xb = t * P.d;
    let gb = gate_row(ex, i) * P.d;
    let ub = up_row(ex, i) * P.d;
    var g = 0.0;
    var u = 0.0;
    for (var c = 0u; c < P.d; c++) {
        let xv = x[xb + c];
        g = fma(xv, wat(gb + c), g);
        u = fma(xv, wat(ub + c), u);
    }
    h[idx] = activate(ex, i, g, u);
}

// One workgroup per (t, j, i): coalesced loads along D and tree reductions (GPUs).
@compute @workgroup_size(64)
fn moe_act_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let idx = wid.x + wid.y * nwg.x;
    if (idx >= P.total) {
        return;
    }
    let tj = idx / P.f;
    let i = idx - tj * P.f;
    let t = tj / P.k;
    let ex = ids[tj];
    var g = 0.0;
    var u = 0.0;
    if (ex < P.e) {
        let xb = t * P.d;
        let gb = gate_row(ex, i) * P.d;
        let ub = up_row(ex, i) * P.d;
        for (var c = lid; c < P.d; c += WG) {
            let xv = x[xb + c];
            g = fma(xv, wat(gb + c), g);
            u = fma(xv, wat(ub + c), u);
        }
    }
    rg[lid] = g;
    ru[lid] = u;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            rg[lid] += rg[lid + st];
            ru[lid] += ru[lid + st];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        h[idx] = select(0.0, activate(min(ex, P.e - 1u), i, rg[0], ru[0]), ex < P.e);
    }
}
