// Causal paged attention, one invocation per (token, head) (for CPU adapters such as llvmpipe,
// where SIMD lanes are invocations and barriers are costly). Each invocation walks its keys
// 0..=position with an online softmax (Milakov & Gimelshein 2018): the running max m, sum l and
// output acc are rescaled by exp(m_old - m_new) only when the max grows. f32 throughout.
// Needs hd_k % 4 == 0, hd_v % 4 == 0, hd_k <= 256 and hd_v <= 256 (larger heads use
// attention_paged.wgsl). The private arrays' size drives llvmpipe's compile time (0.7 s at 64
// vec4s, 1 s at 128); specialising the head dims as constants made it 3-16 s per pipeline.

struct Params {
    h: u32,
    hkv: u32,
    hd_k: u32,
    hd_v: u32,
    bs: u32,
    max_blocks: u32,
    group: u32, // H / Hkv
    scale: f32,
    rows: u32,  // N * H
    window: u32,    // sliding window (0: none): keys positions[t] + 1 - window ..= positions[t]
    has_sinks: u32, // 1: sinks[h] is one more logit of each row, with no value (gpt-oss)
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;
@group(0) @binding(7) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> sinks: array<f32>;

@compute @workgroup_size(8)
fn paged_attention_lanes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let row = (wid.x + wid.y * nwg.x) * 8u + lid;
    if (row >= P.rows) {
        return;
    }
    let t = row / P.h;
    let hh = row - t * P.h;
    let s = token_seq[t];
    let nkeys = positions[t] + 1u;
    let g = hh / P.group;
    let hk4 = P.hd_k / 4u;
    let hv4 = P.hd_v / 4u;
    var q: array<vec4<f32>, 64>;
    var acc: array<vec4<f32>, 64>;
    for (var i = 0u; i < hk4; i++) {
        q[i] = q4[row * hk4 + i];
    }
    for (var i = 0u; i < hv4; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    var m = -3.0e38;
    var l = 0.0;
    if (P.has_sinks == 1u) {
        // The sink as the first logit: max z, weight exp(z - z) = 1, no value.
        m = sinks[hh];
        l = 1.0;
    }
    var first = 0u;
    if (P.window > 0u && nkeys > P.window) {
        first = nkeys - P.window;
    }
    // Walk the block table incrementally (no integer division per key).
    var bt = s * P.max_blocks + first / P.bs;
    var off = first % P.bs;
    var base = block_tables[bt] * P.bs;
    for (var j = first; j < nkeys; j++) {
        if (off == P.bs) {
            off = 0u;
            bt += 1u;
            base = block_tables[bt] * P.bs;
        }
        let slot = base + off;
        off += 1u;
        let kb = (slot * P.hkv + g) * hk4;
        var d = vec4<f32>(0.0);
        for (var i = 0u; i < hk4; i++) {
            d = fma(q[i], k4[kb + i], d);
        }
        let sc = (d.x + d.y + d.z + d.w) * P.scale;
        if (sc > m) {
            let c = exp(m - sc);
            l *= c;
            for (var i = 0u; i < hv4; i++) {
                acc[i] *= c;
            }
            m = sc;
        }
        let p = exp(sc - m);
        l += p;
        let vb = (slot * P.hkv + g) * hv4;
        for (var i = 0u; i < hv4; i++) {
            acc[i] = fma(vec4<f32>(p), v4[vb + i], acc[i]);
        }
    }
    let inv = 1.0 / l;
    for (var i = 0u; i < hv4; i++) {
        out4[row * hv4 + i] = acc[i] * inv;
    }
}
