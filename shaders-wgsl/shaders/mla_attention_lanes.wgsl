// Causal attention over a paged latent cache (MLA in absorbed form, DeepSeek-V2 report §2.1.2),
// one invocation per (token, head), for CPU adapters (llvmpipe: invocations are SIMD lanes,
// barriers are costly). With c_s = cache[slot(s)] = [c_kv (L) | k_pe (R)]:
// score_s = scale * (q_lat . c_s[..L] + q_rope . c_s[L..]), out = sum_s softmax(score)_s c_s[..L],
// over s = 0..=position, with an online softmax (Milakov & Gimelshein 2018). f32 throughout.
// Needs L % 4 == 0, R % 4 == 0, L <= 256, R <= 64 (else mla_attention.wgsl).

struct Params {
    h: u32,
    l: u32,
    r: u32,
    bs: u32,
    max_blocks: u32,
    scale: f32,
    rows: u32, // N * H
    _p0: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> ql4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qr4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> c4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;
@group(0) @binding(7) var<storage, read_write> out4: array<vec4<f32>>;

@compute @workgroup_size(8)
fn mla_attention_lanes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let row = (wid.x + wid.y * nwg.x) * 8u + lid;
    if (row >= P.rows) {
        return;
    }
    let t = row / P.h;
    let s = token_seq[t];
    let nkeys = positions[t] + 1u;
    let l4 = P.l / 4u;
    let r4 = P.r / 4u;
    let w4 = l4 + r4;
    var ql: array<vec4<f32>, 64>;
    var qr: array<vec4<f32>, 16>;
    var acc: array<vec4<f32>, 64>;
    for (var i = 0u; i < l4; i++) {
        ql[i] = ql4[row * l4 + i];
        acc[i] = vec4<f32>(0.0);
    }
    for (var i = 0u; i < r4; i++) {
        qr[i] = qr4[row * r4 + i];
    }
    var m = -3.0e38;
    var z = 0.0;
    // Walk the block table incrementally (no integer division per key).
    var bt = s * P.max_blocks;
    var off = 0u;
    var base = block_tables[bt] * P.bs;
    for (var j = 0u; j < nkeys; j++) {
        if (off == P.bs) {
            off = 0u;
            bt += 1u;
            base = block_tables[bt] * P.bs;
        }
        let cb = (base + off) * w4;
        off += 1u;
        var d = vec4<f32>(0.0);
        for (var i = 0u; i < l4; i++) {
            d = fma(ql[i], c4[cb + i], d);
        }
        for (var i = 0u; i < r4; i++) {
            d = fma(qr[i], c4[cb + l4 + i], d);
        }
        let sc = (d.x + d.y + d.z + d.w) * P.scale;
        if (sc > m) {
            let c = exp(m - sc);
            z *= c;
            for (var i = 0u; i < l4; i++) {
                acc[i] *= c;
            }
            m = sc;
        }
        let p = exp(sc - m);
        z += p;
        for (var i = 0u; i < l4; i++) {
            acc[i] = fma(vec4<f32>(p), c4[cb + i], acc[i]);
        }
    }
    let inv = 1.0 / z;
    for (var i = 0u; i < l4; i++) {
        out4[row * l4 + i] = acc[i] * inv;
    }
}
