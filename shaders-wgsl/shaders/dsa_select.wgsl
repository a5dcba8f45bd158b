// Top-k selection of the DSA indexer scores; see dsa_topk.wgsl for the scheme.

struct Params {
    h: u32,
    d: u32,
    bs: u32,
    max_blocks: u32,
    scale: f32,
    hscale: f32,
    topk: u32,
    stride: u32,
    tok0: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

const WG: u32 = 256u;
const CAP: u32 = 2048u;
const NONE: u32 = 0xffffffffu;

var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> buf: array<u32, CAP>;
var<workgroup> cnt: atomic<u32>;
// Radix-select state: threshold prefix (hi, lo) and keys still to take inside the prefix.
var<workgroup> pre_hi: u32;
var<workgroup> pre_lo: u32;
var<workgroup> remain: u32;

// f32 -> u32 whose unsigned order is the float order (+0 and -0 identified).
fn ord(x: f32) -> u32 {
    let v = select(x, 0.0, x == 0.0);
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Mask of the top `bits` bits (0..=32).
fn top_mask(bits: u32) -> u32 {
    return select(~((1u << (32u - bits)) - 1u), 0u, bits == 0u) | select(0u, NONE, bits == 32u);
}

// a before b in (score desc, position asc); NONE sorts last.
fn before(row: u32, a: u32, b: u32) -> bool {
    if (a == NONE) {
        return false;
    }
    if (b == NONE) {
        return true;
    }
    let sa = ord(scores[row + a]);
    let sb = ord(scores[row + b]);
    return sa > sb || (sa == sb && a < b);
}

@compute @workgroup_size(256)
fn dsa_select(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = P.tok0 + wid.x;
    let row = wid.x * P.stride;
    let nkeys = positions[n] + 1u;
    let k = min(P.topk, nkeys);
    if (lid == 0u) {
        pre_hi = 0u;
        pre_lo = 0u;
        remain = k;
        atomicStore(&cnt, 0u);
    }
    for (var rp = 0u; rp < 8u; rp++) {
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        let ph = workgroupUniformLoad(&pre_hi);
        let pl = pre_lo;
        let hi_bits = min(rp * 8u, 32u);
        let lo_bits = select(0u, rp * 8u - 32u, rp >= 4u);
        let mh = top_mask(hi_bits);
        let ml = top_mask(lo_bits);
        for (var t = lid; t < nkeys; t += WG) {
            let kh = ord(scores[row + t]);
            let kl = ~t;
            if ((kh & mh) == ph && (kl & ml) == pl) {
                var dg: u32;
                if (rp < 4u) {
                    dg = (kh >> (24u - rp * 8u)) & 255u;
                } else {
                    dg = (kl >> (56u - rp * 8u)) & 255u;
                }
                atomicAdd(&hist[dg], 1u);
            }
        }
        workgroupBarrier();
        if (lid == 0u) {
            var need = remain;
            var bin = 255u;
            loop {
                let c = atomicLoad(&hist[bin]);
                if (c >= need || bin == 0u) {
                    break;
                }
                need -= c;
                bin -= 1u;
            }
            remain = need;
            if (rp < 4u) {
                pre_hi = pre_hi | (bin << (24u - rp * 8u));
            } else {
                pre_lo = pre_lo | (bin << (56u - rp * 8u));
            }
        }
        workgroupBarrier();
    }
    // Threshold composite (th, tl): exactly k keys are >= it.
    let th = workgroupUniformLoad(&pre_hi);
    let tl = pre_lo;
    for (var i = lid; i < CAP; i += WG) {
        buf[i] = NONE;
    }
    workgroupBarrier();
    if (k > 0u) {
        for (var t = lid; t < nkeys; t += WG) {
            let kh = ord(scores[row + t]);
            if (kh > th || (kh == th && ~t >= tl)) {
                let slot = atomicAdd(&cnt, 1u);
                if (slot < CAP) {
                    buf[slot] = t;
                }
            }
        }
    }
    workgroupBarrier();
    // Bitonic sort of buf[0..m) (m = next power of two >= k), descending in `before` order.
    var m = 1u;
    while (m < k) {
        m <<= 1u;
    }
    for (var size = 2u; size <= m; size <<= 1u) {
        for (var st = size >> 1u; st > 0u; st >>= 1u) {
            for (var i = lid; i < m; i += WG) {
                let j = i ^ st;
                if (j > i) {
                    let a = buf[i];
                    let b = buf[j];
                    let first = (i & size) == 0u;
                    // first half: keep a before b; second half: reversed.
                    let swap = select(before(row, a, b), before(row, b, a), first);
                    if (swap) {
                        buf[i] = b;
                        buf[j] = a;
                    }
                }
            }
            workgroupBarrier();
        }
    }
    let ob = n * P.topk;
    for (var i = lid; i < P.topk; i += WG) {
        out[ob + i] = select(NONE, buf[min(i, CAP - 1u)], i < k);
    }
}
