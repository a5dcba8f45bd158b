// Row-wise argmax (first index on ties); one workgroup per row.

struct Params {
    rows: u32,
    v: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;

const WG: u32 = 64u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

@compute @workgroup_size(64)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= P.rows) {
        return;
    }
    let base = row * P.v;
    // Each invocation scans increasing indices, so a strict > keeps its first maximum.
    var bv = -3.4028235e38;
    var bi = 0xffffffffu;
    for (var i = lid; i < P.v; i += WG) {
        let v = x[base + i];
        if (v > bv || bi == 0xffffffffu) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            let ov = best_v[lid + st];
            let oi = best_i[lid + st];
            let mv = best_v[lid];
            let mi = best_i[lid];
            if (oi != 0xffffffffu && (mi == 0xffffffffu || ov > mv || (ov == mv && oi < mi))) {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        y[row] = best_i[0];
    }
}
