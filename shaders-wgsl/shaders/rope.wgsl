// Rotary position embedding on the first rot dims of each head; one invocation per output element.
// theta = f32(pos) * inv_freq[i]; (a, b) -> (a c - b s, b c + a s), c = mscale cos, s = mscale sin.

struct Params {
    total: u32,       // N * H * hd
    h: u32,
    hd: u32,
    rot: u32,
    interleaved: u32, // 1: pairs (2i, 2i+1); 0: pairs (i, i + rot/2)
    mscale: f32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;
@group(0) @binding(3) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Cody-Waite reduction of theta to [-pi, pi] (2*pi split into an exact head and a tail), so that
// the built-in sin/cos see small arguments.
fn reduce(theta: f32) -> f32 {
    let k = round(theta * 0.15915494309189535);
    return (theta - k * 6.28125) - k * 0.0019353071795864769;
}

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (idx >= P.total) {
        return;
    }
    let row = idx / P.hd;
    let j = idx - row * P.hd;
    if (j >= P.rot) {
        y[idx] = x[idx];
        return;
    }
    let t = row / P.h;
    let half = P.rot / 2u;
    var i: u32;
    var first: bool;
    var partner: u32;
    if (P.interleaved == 1u) {
        i = j / 2u;
        first = (j & 1u) == 0u;
        partner = select(j - 1u, j + 1u, first);
    } else {
        first = j < half;
        i = select(j - half, j, first);
        partner = select(j - half, j + half, first);
    }
    let theta = f32(pos[t]) * inv_freq[i];
    let r = reduce(theta);
    let c = cos(r) * P.mscale;
    let s = sin(r) * P.mscale;
    let self_v = x[idx];
    let other = x[row * P.hd + partner];
    if (first) {
        y[idx] = self_v * c - other * s;
    } else {
        y[idx] = self_v * c + other * s;
    }
}
