// Row gather from a bf16 table (two per u32) into f32 rows; see embedding.wgsl for the chunking.

struct Params {
    n: u32,
    d: u32,
    row_start: u32,
    row_end: u32,
    vocab: u32,
    zero_oob: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn embedding_b16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (idx >= P.n * P.d) {
        return;
    }
    let i = idx / P.d;
    let c = idx - i * P.d;
    let id = ids[i];
    if (id >= P.row_start && id < P.row_end) {
        let e = (id - P.row_start) * P.d + c;
        let w = table[e / 2u];
        y[idx] = bitcast<f32>(select(w << 16u, w & 0xffff0000u, (e & 1u) == 1u));
    } else if (P.zero_oob == 1u && id >= P.vocab) {
        y[idx] = 0.0;
    }
}
