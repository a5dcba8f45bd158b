// KDA chunked form, inter-chunk part (fla naive_chunk_kda; architectures.md §1.2), all f32, on the
// per-(chunk, head) scratch of kda_chunk_prep.wgsl. The recurrence is independent per value
// column: one invocation owns column e of one (sequence, head), keeps S[:, e] (K <= 128) and the
// chunk's V_new[:, e] (C = 64) in registers, and walks the sequence's chunks in order:
//   V_new = U - W S;  O = Qg S + Aqk V_new;  S <- diag(GL) S + Kdᵀ V_new.
// tab: chunk r -> (first row, rows) at 2r; sequence s -> (slot, first chunk, chunks, fresh) at
// seq_off + 4s. state [slots, H, K, V] (updated in place); o [N, H, V].

struct Params {
    total: u32,  // sequences * H * V
    h: u32,
    k: u32,
    v: u32,
    per: u32,
    seq_off: u32,
    _p0: u32,
    _p1: u32,
}

const C: u32 = 64u;
const MAXK: u32 = 128u;

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> scr: array<f32>;
@group(0) @binding(2) var<storage, read> tab: array<u32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

@compute @workgroup_size(64)
fn kda_chunk_state(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (idx >= P.total) {
        return;
    }
    let K = P.k;
    let V = P.v;
    let e = idx % V;
    let hh = (idx / V) % P.h;
    let s = idx / (V * P.h);
    let t = P.seq_off + 4u * s;
    let slot = tab[t];
    let c0 = tab[t + 1u];
    let nc = tab[t + 2u];
    let fresh = tab[t + 3u] != 0u;
    let sbase = (slot * P.h + hh) * K * V + e;
    var st: array<f32, MAXK>;
    var vn: array<f32, C>;
    for (var d = 0u; d < K; d++) {
        st[d] = select(state[sbase + d * V], 0.0, fresh);
    }
    for (var r = c0; r < c0 + nc; r++) {
        let row0 = tab[2u * r];
        let rows = tab[2u * r + 1u];
        let base = (r * P.h + hh) * P.per;
        let o_qg = base + C * K;
        let o_kd = base + 2u * C * K;
        let o_w = base + 3u * C * K;
        let o_u = base + 4u * C * K;
        let o_aq = o_u + C * V + C * C;
        let o_gl = o_aq + C * C;
        for (var i = 0u; i < rows; i++) {
            var x = scr[o_u + i * V + e];
            for (var d = 0u; d < K; d++) {
                x -= scr[o_w + i * K + d] * st[d];
            }
            vn[i] = x;
        }
        for (var i = 0u; i < rows; i++) {
            var acc = 0.0;
            for (var d = 0u; d < K; d++) {
                acc += scr[o_qg + i * K + d] * st[d];
            }
            for (var j = 0u; j <= i; j++) {
                acc += scr[o_aq + i * C + j] * vn[j];
            }
            o[((row0 + i) * P.h + hh) * V + e] = acc;
        }
        for (var d = 0u; d < K; d++) {
            var x = scr[o_gl + d] * st[d];
            for (var j = 0u; j < rows; j++) {
                x += scr[o_kd + j * K + d] * vn[j];
            }
            st[d] = x;
        }
    }
    for (var d = 0u; d < K; d++) {
        state[sbase + d * V] = st[d];
    }
}
