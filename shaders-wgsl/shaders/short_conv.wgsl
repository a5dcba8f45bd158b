// Causal depthwise convolution + SiLU with per-sequence history (KDA's short convolution;
// Kimi-Linear, HF causal_conv1d_fn / causal_conv1d_update). All f32.
// x [N, C], w [C, W], state [slots, C, W-1] (the last W-1 inputs before this step, oldest first),
// seqs [S, 4] u32 = (slot, first row, rows, fresh) per sequence (fresh: start from zero history),
// token_seq [N] u32, y [N, C].
// short_conv: one invocation per (token, channel); reads the old history.
// short_conv_state: one invocation per (sequence, channel); run after short_conv, rolls the
// history forward in place: new[j] = stream[rows + j] with stream = history ++ this step's rows.

struct Params {
    n: u32,     // tokens
    c: u32,     // channels
    w: u32,     // taps W
    seqs: u32,  // sequences S
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read> seqs: array<u32>;
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn short_conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (idx >= P.n * P.c) {
        return;
    }
    let t = idx / P.c;
    let ch = idx % P.c;
    let s = token_seq[t];
    let slot = seqs[4u * s];
    let first = seqs[4u * s + 1u];
    let fresh = seqs[4u * s + 3u] != 0u;
    let h = P.w - 1u;
    let i = t - first; // row within the sequence
    var acc = 0.0;
    for (var j = 0u; j < P.w; j++) {
        // stream index (history occupies 0..h): i + j; rows start at h.
        let si = i + j;
        var u = 0.0;
        if (si >= h) {
            u = x[(first + si - h) * P.c + ch];
        } else if (!fresh) {
            u = state[(slot * P.c + ch) * h + si];
        }
        acc += w[ch * P.w + j] * u;
    }
    y[idx] = acc / (1.0 + exp(-clamp(acc, -80.0, 80.0)));
}

@compute @workgroup_size(64)
fn short_conv_state(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (idx >= P.seqs * P.c) {
        return;
    }
    let s = idx / P.c;
    let ch = idx % P.c;
    let slot = seqs[4u * s];
    let first = seqs[4u * s + 1u];
    let rows = seqs[4u * s + 2u];
    let fresh = seqs[4u * s + 3u] != 0u;
    let h = P.w - 1u;
    let base = (slot * P.c + ch) * h;
    // Increasing j reads stream index rows + j >= j: in place is safe.
    for (var j = 0u; j < h; j++) {
        let si = rows + j;
        var u = 0.0;
        if (si >= h) {
            u = x[(first + si - h) * P.c + ch];
        } else if (!fresh) {
            u = state[base + si];
        }
        state[base + j] = u;
    }
}
