// KDA chunked form, intra-chunk part (fla naive_chunk_kda; architectures.md §1.2), all f32.
// One workgroup of 64 per (chunk, head); chunk size C = 64, a short tail chunk behaves as padded
// with g = 0, beta = 0, q = k = v = 0. With Gam_i = sum_{j<=i} g_j (per key channel):
//   L[i,j]   = beta_i sum_d kn_i kn_j exp(Gam_i - Gam_j)   (j < i)
//   Aqk[i,j] = sum_d qn_i kn_j exp(Gam_i - Gam_j)           (j <= i)
//   W = (I + L)^-1 diag(beta) (exp(Gam) . Kn),  U = (I + L)^-1 diag(beta) V  (forward substitution)
//   Qg = qn_i exp(Gam_i),  Kd = exp(Gam_last - Gam_j) kn_j,  GL = exp(Gam_last).
// Only masked pairwise differences Gam_i - Gam_j (j <= i) and Gam itself (<= 0) are exponentiated;
// exp(-Gam) never is. Inputs qn, kn, g [N, H, K] (kda_prep.wgsl), v [N, H, V], b [N, H];
// tab: chunk r -> (first row, rows) at 2r. Output scratch [chunks, H, PER] with, per (chunk, head):
// Gam, Qg, Kd, W [C, K] | U [C, V] | L, Aqk [C, C] | GL [K].

struct Params {
    groups: u32,  // chunks * H
    h: u32,
    k: u32,
    v: u32,
    per: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

const C: u32 = 64u;

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> qn: array<f32>;
@group(0) @binding(2) var<storage, read> kn: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read> b: array<f32>;
@group(0) @binding(6) var<storage, read> tab: array<u32>;
@group(0) @binding(7) var<storage, read_write> scr: array<f32>;

var<workgroup> beta: array<f32, C>;

@compute @workgroup_size(64)
fn kda_chunk_prep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let grp = wid.x + wid.y * nwg.x;
    if (grp >= P.groups) {
        return;
    }
    let K = P.k;
    let V = P.v;
    let r = grp / P.h;
    let hh = grp % P.h;
    let row0 = tab[2u * r];
    let rows = tab[2u * r + 1u];
    let base = grp * P.per;
    let o_gam = base;
    let o_qg = base + C * K;
    let o_kd = base + 2u * C * K;
    let o_w = base + 3u * C * K;
    let o_u = base + 4u * C * K;
    let o_l = o_u + C * V;
    let o_aq = o_l + C * C;
    let o_gl = o_aq + C * C;

    // beta per row (0 for padding).
    var bt = 0.0;
    if (lid < rows) {
        bt = 1.0 / (1.0 + exp(-clamp(b[(row0 + lid) * P.h + hh], -80.0, 80.0)));
    }
    beta[lid] = bt;

    // Phase 1: one key channel per invocation: cumulative Gam, Qg, then Kd and GL.
    for (var d = lid; d < K; d += 64u) {
        var cum = 0.0;
        for (var i = 0u; i < C; i++) {
            var qv = 0.0;
            if (i < rows) {
                let x = ((row0 + i) * P.h + hh) * K + d;
                cum += g[x];
                qv = qn[x];
            }
            scr[o_gam + i * K + d] = cum;
            scr[o_qg + i * K + d] = qv * exp(cum);
        }
        scr[o_gl + d] = exp(cum);
        for (var j = 0u; j < C; j++) {
            var kd = 0.0;
            if (j < rows) {
                kd = exp(cum - scr[o_gam + j * K + d]) * kn[((row0 + j) * P.h + hh) * K + d];
            }
            scr[o_kd + j * K + d] = kd;
        }
    }
    storageBarrier();
    workgroupBarrier();

    // Phase 2: one row i per invocation: L[i, j < i] and Aqk[i, j <= i] (zero elsewhere).
    let i = lid;
    let xi = ((row0 + i) * P.h + hh) * K;
    for (var j = 0u; j < C; j++) {
        var kk = 0.0;
        var qk = 0.0;
        if (i < rows && j <= i) {
            let xj = ((row0 + j) * P.h + hh) * K;
            for (var d = 0u; d < K; d++) {
                let kj = kn[xj + d] * exp(scr[o_gam + i * K + d] - scr[o_gam + j * K + d]);
                kk += kn[xi + d] * kj;
                qk += qn[xi + d] * kj;
            }
        }
        scr[o_l + i * C + j] = select(0.0, beta[i] * kk, j < i);
        scr[o_aq + i * C + j] = qk;
    }
    storageBarrier();
    workgroupBarrier();

    // Phase 3: forward substitution, one column of [W | U] per invocation:
    // X[i] = beta_i rhs_i - sum_{j<i} L[i, j] X[j].
    for (var col = lid; col < K + V; col += 64u) {
        for (var i2 = 0u; i2 < C; i2++) {
            var x = 0.0;
            if (i2 < rows) {
                let r2 = (row0 + i2) * P.h + hh;
                var rhs: f32;
                if (col < K) {
                    rhs = exp(scr[o_gam + i2 * K + col]) * kn[r2 * K + col];
                } else {
                    rhs = v[r2 * V + col - K];
                }
                x = beta[i2] * rhs;
                for (var j = 0u; j < i2; j++) {
                    var xj: f32;
                    if (col < K) {
                        xj = scr[o_w + j * K + col];
                    } else {
                        xj = scr[o_u + j * V + col - K];
                    }
                    x -= scr[o_l + i2 * C + j] * xj;
                }
            }
            if (col < K) {
                scr[o_w + i2 * K + col] = x;
            } else {
                scr[o_u + i2 * V + col - K] = x;
            }
        }
    }
}
