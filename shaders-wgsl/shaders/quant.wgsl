// Block-quantized weights (dayone_backend::quant): codes of 4 bits (two per byte, low nibble
// the even column) or 8 bits, one scale (E8M0 byte, f16 or bf16) and optionally one f16 min per
// `group` columns: w = value(code) * scale (+ min). Codes, scales and mins are byte arrays read
// as little-endian u32 words.

struct Params {
    m: u32,        // dequant: items to decode; matvec: rows of x
    rows: u32,     // rows of one item (matvec: N)
    cols: u32,     // columns (K)
    items: u32,    // items in the weight (E); larger item ids decode to zeros
    codes: u32,    // 0 FP4 E2M1, 1 u4 - 8, 2 u4, 3 i8
    scale: u32,    // 0 E8M0, 1 f16, 2 bf16
    has_min: u32,  // 1: add the group's f16 min
    group: u32,    // columns per scale (a multiple of 8)
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> codes: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> mins: array<u32>;
@group(0) @binding(4) var<storage, read> idx: array<u32>;   // dequant: items; matvec: x (f32 bits)
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

const FP4: array<f32, 8> = array<f32, 8>(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);

// The code of flat element e.
fn code_at(e: u32) -> u32 {
    if (P.codes == 3u) {
        return (codes[e >> 2u] >> ((e & 3u) * 8u)) & 255u;
    }
    return (codes[e >> 3u] >> ((e & 7u) * 4u)) & 15u;
}

// Code j of a code word (8 nibbles, or 4 bytes for i8 codes).
fn word_code(w: u32, j: u32) -> u32 {
    if (P.codes == 3u) {
        return (w >> (j * 8u)) & 255u;
    }
    return (w >> (j * 4u)) & 15u;
}

fn code_value(c: u32) -> f32 {
    switch (P.codes) {
        case 0u: {
            let m = FP4[c & 7u];
            return select(m, -m, (c & 8u) != 0u);
        }
        case 1u: { return f32(c) - 8.0; }
        case 2u: { return f32(c); }
        default: { return f32(bitcast<i32>(c << 24u) >> 24u); }
    }
}

// A 16-bit float (f16 or bf16 by P.scale) at index g of a u32 array of halves.
fn half_at(w: u32, g: u32) -> f32 {
    let h = (w >> ((g & 1u) * 16u)) & 65535u;
    if (P.scale == 2u) {
        return bitcast<f32>(h << 16u);
    }
    return unpack2x16float(h).x;
}

fn scale_at(g: u32) -> f32 {
    if (P.scale == 0u) {
        let s = (scales[g >> 2u] >> ((g & 3u) * 8u)) & 255u;
        if (s == 0u) {
            return bitcast<f32>(0x00400000u);
        }
        return bitcast<f32>(s << 23u);
    }
    return half_at(scales[g >> 1u], g);
}

fn min_at(g: u32) -> f32 {
    return half_at(mins[g >> 1u], g);
}

// y[i, r, c] = w[items[i], r, c] for i < m: one invocation per output element.
@compute @workgroup_size(256)
fn dequant(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let o = (wid.x + wid.y * nwg.x) * 256u + lid;
    let per = P.rows * P.cols;
    if (o >= P.m * per) {
        return;
    }
    let i = o / per;
    let rc = o - i * per;
    let item = idx[i];
    if (item >= P.items) {
        y[o] = 0.0;
        return;
    }
    let e = item * per + rc;
    let g = e / P.group;
    var v = code_value(code_at(e)) * scale_at(g);
    if (P.has_min == 1u) {
        v = v + min_at(g);
    }
    y[o] = v;
}

// y[m, n] = sum_k x[m, k] * w[n, k] for one weight (items = 1): a workgroup of 64 per output,
// invocations striding over code words (8 or 4 columns of one group each); grid linear id =
// m * rows + n.
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn matvec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let id = wid.x + wid.y * nwg.x;
    let m = id / P.rows;
    let n = id - m * P.rows;
    if (m >= P.m) {
        return;
    }
    let per_word = select(8u, 4u, P.codes == 3u);
    let words = P.cols / per_word;
    let groups = P.cols / P.group;
    var acc = 0.0;
    for (var w = lid; w < words; w += 64u) {
        let c0 = w * per_word;
        let g = n * groups + c0 / P.group;
        let e0 = n * P.cols + c0;
        var dot_c = 0.0;
        var sum_x = 0.0;
        let cw = codes[e0 / per_word];
        for (var j = 0u; j < per_word; j++) {
            let xv = bitcast<f32>(idx[m * P.cols + c0 + j]);
            dot_c += code_value(word_code(cw, j)) * xv;
            sum_x += xv;
        }
        acc += dot_c * scale_at(g);
        if (P.has_min == 1u) {
            acc += sum_x * min_at(g);
        }
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        y[m * P.rows + n] = red[0];
    }
}

// The same product for CPU adapters (lavapipe), where workgroup barriers are costly: one
// invocation per output, walking the whole row; grid linear id * 64 + lid = m * rows + n.
@compute @workgroup_size(64)
fn matvec_seq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let id = (wid.x + wid.y * nwg.x) * 64u + lid;
    let m = id / P.rows;
    let n = id - m * P.rows;
    if (m >= P.m) {
        return;
    }
    let per_word = select(8u, 4u, P.codes == 3u);
    let groups = P.cols / P.group;
    let words_per_group = P.group / per_word;
    var acc = 0.0;
    for (var g = 0u; g < groups; g++) {
        var dot_c = 0.0;
        var sum_x = 0.0;
        let c_g = g * P.group;
        for (var w = 0u; w < words_per_group; w++) {
            let c0 = c_g + w * per_word;
            let e0 = n * P.cols + c0;
            let cw = codes[e0 / per_word];
            for (var j = 0u; j < per_word; j++) {
                let xv = bitcast<f32>(idx[m * P.cols + c0 + j]);
                dot_c += code_value(word_code(cw, j)) * xv;
                sum_x += xv;
            }
        }
        let gi = n * groups + g;
        acc += dot_c * scale_at(gi);
        if (P.has_min == 1u) {
            acc += sum_x * min_at(gi);
        }
    }
    y[m * P.rows + n] = acc;
}
