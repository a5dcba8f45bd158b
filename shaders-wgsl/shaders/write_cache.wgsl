// Paged single-tensor cache write (MLA latent cache [c_kv | k_pe]):
// cache[slots[t] * width + col + e] = src[t * w + e] for e < w.

struct Params {
    total: u32, // N * w
    w: u32,
    width: u32, // W, the cache row width
    col: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> cache: array<f32>;

@compute @workgroup_size(256)
fn write_cache(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (idx >= P.total) {
        return;
    }
    let t = idx / P.w;
    let e = idx - t * P.w;
    cache[slots[t] * P.width + P.col + e] = src[idx];
}
