// Conversions between storage dtypes: bf16 (two per u32, element 2i in the low half) -> f32.

struct Params {
    n: u32, // elements
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn bf16_to_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= P.n) {
        return;
    }
    let w = src[i / 2u];
    dst[i] = bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));
}
