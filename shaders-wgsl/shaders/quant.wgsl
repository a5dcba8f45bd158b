// Block-quantized weights (dayone_backend::quant): codes of 4 bits (two per byte, low nibble
// the even column) or 8 bits, one scale (E8M0 byte, f16 or bf16) and optionally one f16 min per
// `group` columns: w = value(code) * scale (+ min). Codes, scales and mins are byte arrays read
// as little-endian u32 words. 5- and 6-bit codes: the low nibbles of all n values as above, then
// a plane of the high 1 or 2 bits (value e's at bit e * hb); 2- and 3-bit codes likewise with a
// 2-bit low plane. The GGUF K-quants keep ggml's super-block scale records in the scale array
// (K4: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins per 256 values; K6: 16 i8 scales, f16
// d; K2: 16 bytes of 4-bit scale | 4-bit min, f16 d, f16 dmin; K3: 12 bytes of 6-bit scales,
// f16 d): scale d * sc (K3: d * (sc - 32)), min -(dmin * m).

struct Params {
    m: u32,        // dequant: items to decode; matvec: rows of x
    rows: u32,     // rows of one item (matvec: N)
    cols: u32,     // columns (K)
    items: u32,    // items in the weight (E); larger item ids decode to zeros
    codes: u32,    // 0 FP4 E2M1, 1 u4 - 8, 2 u4, 3 i8, 4 u5 - 16, 5 u5, 6 u6 - 32, 7 u2, 8 u3 - 4
    scale: u32,    // 0 E8M0, 1 f16, 2 bf16, 3 K4, 4 K6, 5 K2, 6 K3 record
    has_min: u32,  // 1: add the group's min (f16 array; K4, K2: from the record)
    group: u32,    // columns per scale (a multiple of 8)
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> codes: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> mins: array<u32>;
@group(0) @binding(4) var<storage, read> idx: array<u32>;   // dequant: items; matvec: x (f32 bits)
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

const FP4: array<f32, 8> = array<f32, 8>(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);

// Bits per code in the low plane: 8 for i8 codes, 2 for 2- and 3-bit codes, else 4.
fn low_bits() -> u32 {
    switch (P.codes) {
        case 3u: { return 8u; }
        case 7u, 8u: { return 2u; }
        default: { return 4u; }
    }
}

// Bits per code in the high plane: 1 for 5- and 3-bit codes, 2 for 6-bit, else 0.
fn high_bits() -> u32 {
    switch (P.codes) {
        case 4u, 5u, 8u: { return 1u; }
        case 6u: { return 2u; }
        default: { return 0u; }
    }
}

// Byte o of the code array.
fn code_byte(o: u32) -> u32 {
    return (codes[o >> 2u] >> ((o & 3u) * 8u)) & 255u;
}

// First byte of the high plane (after the low bits of all n values; n is a multiple of 8).
fn high_base() -> u32 {
    return P.items * P.rows * P.cols / 8u * low_bits();
}

// The high bits of the 32 / low_bits() values of the code word from element e, value j's at
// bit j * hb (8 or 16 bits; 0 without a high plane).
fn high_word(e: u32) -> u32 {
    let hb = high_bits();
    if (hb == 0u) {
        return 0u;
    }
    let o = high_base() + e * hb / 8u;
    if ((32u / low_bits()) * hb > 8u) {
        return code_byte(o) | (code_byte(o + 1u) << 8u);
    }
    return code_byte(o);
}

// The code of flat element e.
fn code_at(e: u32) -> u32 {
    let lb = low_bits();
    let per = 32u / lb;
    let lo = (codes[e / per] >> ((e % per) * lb)) & ((1u << lb) - 1u);
    let hb = high_bits();
    if (hb == 0u) {
        return lo;
    }
    let bit = e * hb;
    let hi = (code_byte(high_base() + bit / 8u) >> (bit % 8u)) & ((1u << hb) - 1u);
    return lo | (hi << lb);
}

// Code j of a code word (32 / low_bits() codes), with hi the word's high_word.
fn word_code(w: u32, hi: u32, j: u32) -> u32 {
    let lb = low_bits();
    let hb = high_bits();
    return ((w >> (j * lb)) & ((1u << lb) - 1u)) | (((hi >> (j * hb)) & ((1u << hb) - 1u)) << lb);
}

fn code_value(c: u32) -> f32 {
    switch (P.codes) {
        case 0u: {
            let m = FP4[c & 7u];
            return select(m, -m, (c & 8u) != 0u);
        }
        case 1u: { return f32(c) - 8.0; }
        case 2u, 5u: { return f32(c); }
        case 4u: { return f32(c) - 16.0; }
        case 6u: { return f32(c) - 32.0; }
        case 7u: { return f32(c); }
        case 8u: { return f32(c) - 4.0; }
        default: { return f32(bitcast<i32>(c << 24u) >> 24u); }
    }
}

// IEEE f16 bits to f32, exactly, subnormals included (a driver's unpack2x16float may flush
// them; ggml's Q6_K d is often subnormal): m * 2^-24 for exponent 0.
fn f16_exact(h: u32) -> f32 {
    let e = (h >> 10u) & 31u;
    let m = h & 1023u;
    var v: f32;
    if (e == 0u) {
        v = f32(m) * bitcast<f32>(0x33800000u);
    } else if (e == 31u) {
        v = bitcast<f32>(0x7f800000u | (m << 13u));
    } else {
        v = bitcast<f32>(((e + 112u) << 23u) | (m << 13u));
    }
    return select(v, -v, (h & 0x8000u) != 0u);
}

// A 16-bit float (f16 or bf16 by P.scale) at index g of a u32 array of halves.
fn half_at(w: u32, g: u32) -> f32 {
    let h = (w >> ((g & 1u) * 16u)) & 65535u;
    if (P.scale == 2u) {
        return bitcast<f32>(h << 16u);
    }
    return f16_exact(h);
}

// Byte o of the scale array; the f16 at even byte o.
fn scale_byte(o: u32) -> u32 {
    return (scales[o >> 2u] >> ((o & 3u) * 8u)) & 255u;
}

fn scale_f16(o: u32) -> f32 {
    return f16_exact((scales[o >> 2u] >> ((o & 2u) * 8u)) & 65535u);
}

// ggml get_scale_min_k4: the 6-bit scale (k = 0) or min (k = 4) of sub-block j of the K4
// record at byte r.
fn k4_6bit(r: u32, j: u32, k: u32) -> u32 {
    let s = r + 4u;
    if (j < 4u) {
        return scale_byte(s + j + k) & 63u;
    }
    let packed = scale_byte(s + j + 4u);
    let low = select(packed & 15u, packed >> 4u, k == 4u);
    return low | ((scale_byte(s + j - 4u + k) >> 6u) << 4u);
}

fn scale_at(g: u32) -> f32 {
    if (P.scale == 3u) {
        let r = (g / 8u) * 16u;
        return scale_f16(r) * f32(k4_6bit(r, g % 8u, 0u));
    }
    if (P.scale == 4u) {
        let r = (g / 16u) * 18u;
        let sc = bitcast<i32>(scale_byte(r + g % 16u) << 24u) >> 24u;
        return scale_f16(r + 16u) * f32(sc);
    }
    if (P.scale == 5u) {
        let r = (g / 16u) * 20u;
        return scale_f16(r + 16u) * f32(scale_byte(r + g % 16u) & 15u);
    }
    if (P.scale == 6u) {
        let r = (g / 16u) * 14u;
        let j = g % 16u;
        var low: u32;
        if (j < 8u) {
            low = scale_byte(r + j) & 15u;
        } else {
            low = scale_byte(r + j - 8u) >> 4u;
        }
        let high = (scale_byte(r + 8u + j % 4u) >> (2u * (j / 4u))) & 3u;
        return scale_f16(r + 12u) * f32(i32(low | (high << 4u)) - 32);
    }
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
    if (P.scale == 3u) {
        let r = (g / 8u) * 16u;
        return -(scale_f16(r + 2u) * f32(k4_6bit(r, g % 8u, 4u)));
    }
    if (P.scale == 5u) {
        let r = (g / 16u) * 20u;
        return -(scale_f16(r + 18u) * f32(scale_byte(r + g % 16u) >> 4u));
    }
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
    let per_word = 32u / low_bits();
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
        let hi = high_word(e0);
        for (var j = 0u; j < per_word; j++) {
            let xv = bitcast<f32>(idx[m * P.cols + c0 + j]);
            dot_c += code_value(word_code(cw, hi, j)) * xv;
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
    let per_word = 32u / low_bits();
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
            let hi = high_word(e0);
            for (var j = 0u; j < per_word; j++) {
                let xv = bitcast<f32>(idx[m * P.cols + c0 + j]);
                dot_c += code_value(word_code(cw, hi, j)) * xv;
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
