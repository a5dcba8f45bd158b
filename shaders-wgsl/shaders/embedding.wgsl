// Row gather out[i, c] = table[ids[i], c] for one row-chunk of a (possibly split) table.
// The chunk holds rows [row_start, row_end); ids outside every chunk (>= vocab) give zeros,
// written by the dispatch that has zero_oob = 1.

struct Params {
    n: u32,         // number of ids
    d: u32,         // row width
    row_start: u32, // first table row held by this chunk
    row_end: u32,   // one past the last row held by this chunk
    vocab: u32,     // rows in the whole table
    zero_oob: u32,  // 1: write zeros for ids >= vocab
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> table: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn embedding(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (idx >= P.n * P.d) {
        return;
    }
    let i = idx / P.d;
    let c = idx - i * P.d;
    let id = ids[i];
    if (id >= P.row_start && id < P.row_end) {
        y[idx] = table[(id - P.row_start) * P.d + c];
    } else if (P.zero_oob == 1u && id >= P.vocab) {
        y[idx] = 0.0;
    }
}
