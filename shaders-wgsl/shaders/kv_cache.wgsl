// Paged KV write: cache[slot_mapping[t] * row + e] = src[t * row + e], row = Hkv * hd.

struct Params {
    total: u32, // N * row
    row: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> cache: array<f32>;

@compute @workgroup_size(256)
fn write_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (idx >= P.total) {
        return;
    }
    let t = idx / P.row;
    let e = idx - t * P.row;
    cache[slots[t] * P.row + e] = src[idx];
}
