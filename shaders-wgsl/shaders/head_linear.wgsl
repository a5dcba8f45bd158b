// Per-head linear map (MLA weight absorption, DeepSeek-V2 report §2.1.2):
// y[t, h, o] = sum_k w[h, o, k] * x[t, h, k]; x [N, H, K] f32, w [H, O, K] f32 or packed bf16
// (two per u32, element 2i in the low half), y [N, H, O] f32, f32 accumulation.

struct Params {
    h: u32,
    k: u32,
    o: u32,
    total: u32, // N * H * O
    bf16: u32,  // 1: w is packed bf16
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

// Element i of w (bf16 -> f32 is exact: the bf16 bits become the high half).
fn wat(i: u32) -> f32 {
    if (P.bf16 == 1u) {
        let v = w[i >> 1u];
        return bitcast<f32>(select(v << 16u, v & 0xffff0000u, (i & 1u) == 1u));
    }
    return bitcast<f32>(w[i]);
}

// One invocation per output element (CPU adapters; small K on GPUs).
@compute @workgroup_size(64)
fn head_linear_lanes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * WG + lid;
    if (idx >= P.total) {
        return;
    }
    let th = idx / P.o; // t * H + h
    let oo = idx - th * P.o;
    let hh = th % P.h;
    let xb = th * P.k;
    let wb = (hh * P.o + oo) * P.k;
    var acc = 0.0;
    for (var i = 0u; i < P.k; i++) {
        acc = fma(x[xb + i], wat(wb + i), acc);
    }
    y[idx] = acc;
}

// One workgroup per output element: coalesced loads along K and a tree reduction (GPUs).
@compute @workgroup_size(64)
fn head_linear_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let idx = wid.x + wid.y * nwg.x;
    if (idx >= P.total) {
        return;
    }
    let th = idx / P.o;
    let oo = idx - th * P.o;
    let hh = th % P.h;
    let xb = th * P.k;
    let wb = (hh * P.o + oo) * P.k;
    var acc = 0.0;
    for (var i = lid; i < P.k; i += WG) {
        acc = fma(x[xb + i], wat(wb + i), acc);
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
