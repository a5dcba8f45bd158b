//! Naive CPU implementations of every [`Backend`](crate::Backend) op on [`HostTensor`]s.
//!
//! These are the ground truth for the conformance suite ([`crate::conformance`]): plain loops,
//! no blocking, no fusion, written to be read. Inputs of any float dtype are widened to f32;
//! dot products and softmax sums accumulate in f64 so that the reference is more accurate than
//! any backend under test. Outputs are rounded to the dtype of the op's (first) float input.
//!
//! Every function checks shapes and returns an error naming the op and the expected shape.

#![allow(clippy::needless_range_loop)] // index loops mirror the formulas

use crate::{DType, ExpertAct, HostTensor, RopeStyle, StepMeta};
use anyhow::{bail, ensure, Result};

fn float_dtype(op: &str, name: &str, t: &HostTensor) -> Result<DType> {
    ensure!(
        t.dtype.is_float(),
        "{op}: {name} must be a float tensor, got {}",
        t.dtype
    );
    Ok(t.dtype)
}

fn rank(op: &str, name: &str, t: &HostTensor, want: usize, expect: &str) -> Result<()> {
    ensure!(
        t.shape.len() == want,
        "{op}: {name} must have shape {expect}, got {:?}",
        t.shape
    );
    Ok(())
}

/// Row gather: `out[i, :] = table[ids[i], :]`.
///
/// `table` `[V, D]` float, `ids` `[N]` u32 → `[N, D]` in `table`'s dtype (bit-exact copy).
pub fn embedding(table: &HostTensor, ids: &HostTensor) -> Result<HostTensor> {
    rank("embedding", "table", table, 2, "[V, D]")?;
    rank("embedding", "ids", ids, 1, "[N]")?;
    let dt = float_dtype("embedding", "table", table)?;
    let (v, d) = (table.shape[0], table.shape[1]);
    let ids = ids.to_u32()?;
    let es = dt.size();
    let mut data = Vec::with_capacity(ids.len() * d * es);
    for &id in &ids {
        let id = id as usize;
        ensure!(
            id < v,
            "embedding: id {id} out of range for table [{v}, {d}]"
        );
        data.extend_from_slice(&table.data[id * d * es..(id + 1) * d * es]);
    }
    HostTensor::new(vec![ids.len(), d], dt, data)
}

/// Linear layer `y[m, n] = Σ_k x[m, k] · w[n, k] + bias[n]` (PyTorch `nn.Linear`, `y = x Wᵀ + b`).
///
/// `x` `[M, K]`, `w` `[N, K]`, `bias` `[N]` → `[M, N]` in `x`'s dtype.
pub fn linear(x: &HostTensor, w: &HostTensor, bias: Option<&HostTensor>) -> Result<HostTensor> {
    rank("linear", "x", x, 2, "[M, K]")?;
    rank("linear", "w", w, 2, "[N, K]")?;
    let dt = float_dtype("linear", "x", x)?;
    float_dtype("linear", "w", w)?;
    let (m, k) = (x.shape[0], x.shape[1]);
    let n = w.shape[0];
    ensure!(
        w.shape[1] == k,
        "linear: w must have shape [N, {k}], got {:?}",
        w.shape
    );
    let b = match bias {
        Some(b) => {
            ensure!(
                b.shape == [n],
                "linear: bias must have shape [{n}], got {:?}",
                b.shape
            );
            b.to_f32()
        }
        None => vec![0.0; n],
    };
    let (xv, wv) = (x.to_f32(), w.to_f32());
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f64;
            for kk in 0..k {
                acc += xv[i * k + kk] as f64 * wv[j * k + kk] as f64;
            }
            y[i * n + j] = (acc + b[j] as f64) as f32;
        }
    }
    HostTensor::from_f32_as(vec![m, n], &y, dt)
}

/// RMSNorm (Zhang & Sennrich 2019): `y = w ⊙ x / sqrt(mean(x²) + eps)` over the last dimension.
///
/// `x` `[R, D]`, `w` `[D]` → `[R, D]` in `x`'s dtype.
pub fn rms_norm(x: &HostTensor, w: &HostTensor, eps: f32) -> Result<HostTensor> {
    rank("rms_norm", "x", x, 2, "[R, D]")?;
    let dt = float_dtype("rms_norm", "x", x)?;
    let (r, d) = (x.shape[0], x.shape[1]);
    ensure!(
        w.shape == [d],
        "rms_norm: w must have shape [{d}], got {:?}",
        w.shape
    );
    let (xv, wv) = (x.to_f32(), w.to_f32());
    let mut y = vec![0f32; r * d];
    for i in 0..r {
        let row = &xv[i * d..(i + 1) * d];
        let ms = row.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for j in 0..d {
            y[i * d + j] = (row[j] as f64 * inv * wv[j] as f64) as f32;
        }
    }
    HostTensor::from_f32_as(vec![r, d], &y, dt)
}

/// Rotary position embedding (RoFormer, Su et al. 2021; HF `apply_rotary_pos_emb`).
///
/// For each token `n`, head `h` and pair `i < rot_dim/2`, with
/// `θ = positions[n] · inv_freq[i]` (an f32 product), `c = mscale·cos θ`, `s = mscale·sin θ`
/// and the pair `(a, b)` = `(x[i], x[i + rot_dim/2])` ([`RopeStyle::HalfSplit`]) or
/// `(x[2i], x[2i+1])` ([`RopeStyle::Interleaved`]):
/// `a' = a·c − b·s`, `b' = b·c + a·s`. Dimensions `rot_dim..hd` pass through unchanged.
///
/// `x` `[N, H, hd]`, `positions` `[N]` u32, `inv_freq` `[rot_dim/2]` f32 → `[N, H, hd]`.
pub fn rope(
    x: &HostTensor,
    positions: &HostTensor,
    inv_freq: &HostTensor,
    rot_dim: usize,
    style: RopeStyle,
    mscale: f32,
) -> Result<HostTensor> {
    rank("rope", "x", x, 3, "[N, H, hd]")?;
    let dt = float_dtype("rope", "x", x)?;
    let (n, h, hd) = (x.shape[0], x.shape[1], x.shape[2]);
    ensure!(
        rot_dim.is_multiple_of(2) && rot_dim <= hd && rot_dim > 0,
        "rope: rot_dim {rot_dim} must be even, positive and <= hd {hd}"
    );
    ensure!(
        positions.shape == [n],
        "rope: positions must have shape [{n}], got {:?}",
        positions.shape
    );
    let half = rot_dim / 2;
    ensure!(
        inv_freq.shape == [half],
        "rope: inv_freq must have shape [{half}], got {:?}",
        inv_freq.shape
    );
    let pos = positions.to_u32()?;
    let f = inv_freq.to_f32();
    let mut y = x.to_f32();
    for t in 0..n {
        for hh in 0..h {
            let base = (t * h + hh) * hd;
            for i in 0..half {
                let theta = pos[t] as f32 * f[i];
                let (c, s) = (
                    (theta as f64).cos() * mscale as f64,
                    (theta as f64).sin() * mscale as f64,
                );
                let (ia, ib) = match style {
                    RopeStyle::HalfSplit => (base + i, base + i + half),
                    RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
                };
                let (a, b) = (y[ia] as f64, y[ib] as f64);
                y[ia] = (a * c - b * s) as f32;
                y[ib] = (b * c + a * s) as f32;
            }
        }
    }
    HostTensor::from_f32_as(vec![n, h, hd], &y, dt)
}

/// SwiGLU (Shazeer 2020): `silu(g) · u` with `silu(g) = g / (1 + e^(−g))`.
///
/// `gate`, `up` `[M, F]` → `[M, F]` in `gate`'s dtype.
pub fn silu_mul(gate: &HostTensor, up: &HostTensor) -> Result<HostTensor> {
    let dt = float_dtype("silu_mul", "gate", gate)?;
    ensure!(
        gate.shape == up.shape,
        "silu_mul: up must have gate's shape {:?}, got {:?}",
        gate.shape,
        up.shape
    );
    let (g, u) = (gate.to_f32(), up.to_f32());
    let y: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| {
            let g = g as f64;
            (g / (1.0 + (-g).exp()) * u as f64) as f32
        })
        .collect();
    HostTensor::from_f32_as(gate.shape.clone(), &y, dt)
}

/// Clamped SwiGLU `silu(min(g, l)) ⊙ clamp(u, −l, l)` (glm5_next's `swiglu_limit`, HF
/// `Glm5NextTextMLP`), in f64, result in `gate`'s dtype. Errors: unequal shapes.
pub fn silu_mul_limit(gate: &HostTensor, up: &HostTensor, limit: f32) -> Result<HostTensor> {
    let dt = float_dtype("silu_mul_limit", "gate", gate)?;
    ensure!(
        gate.shape == up.shape,
        "silu_mul_limit: inputs must have equal shapes, got {:?} and {:?}",
        gate.shape,
        up.shape
    );
    let l = limit as f64;
    let y: Vec<f32> = gate
        .to_f32()
        .iter()
        .zip(up.to_f32())
        .map(|(&g, u)| {
            let (g, u) = ((g as f64).min(l), (u as f64).clamp(-l, l));
            (g / (1.0 + (-g).exp()) * u) as f32
        })
        .collect();
    HostTensor::from_f32_as(gate.shape.clone(), &y, dt)
}

/// Element-wise sum `a + b` of two tensors of equal shape, in `a`'s dtype.
pub fn add(a: &HostTensor, b: &HostTensor) -> Result<HostTensor> {
    let dt = float_dtype("add", "a", a)?;
    ensure!(
        a.shape == b.shape,
        "add: b must have a's shape {:?}, got {:?}",
        a.shape,
        b.shape
    );
    let y: Vec<f32> = a
        .to_f32()
        .iter()
        .zip(b.to_f32())
        .map(|(x, y)| x + y)
        .collect();
    HostTensor::from_f32_as(a.shape.clone(), &y, dt)
}

/// Paged KV write (PagedAttention, Kwon et al. 2023): for each token `n` with
/// `slot = meta.slot_mapping[n]`, `k_cache[slot / bs, slot % bs] = k[n]` and the same for `v`.
///
/// `k` `[N, Hkv, hd_k]`, `v` `[N, Hkv, hd_v]`, caches `[blocks, bs, Hkv, hd_k]` /
/// `[blocks, bs, Hkv, hd_v]`, modified in place (values rounded to the caches' dtype).
pub fn write_kv(
    k: &HostTensor,
    v: &HostTensor,
    k_cache: &mut HostTensor,
    v_cache: &mut HostTensor,
    meta: &StepMeta,
) -> Result<()> {
    for (name, src, cache) in [("k", k, &mut *k_cache), ("v", v, &mut *v_cache)] {
        rank("write_kv", name, src, 3, "[N, Hkv, hd]")?;
        rank("write_kv", "cache", cache, 4, "[blocks, bs, Hkv, hd]")?;
        let (n, hkv, hd) = (src.shape[0], src.shape[1], src.shape[2]);
        let (blocks, bs) = (cache.shape[0], cache.shape[1]);
        ensure!(
            cache.shape[2..] == [hkv, hd],
            "write_kv: {name}_cache must have shape [blocks, bs, {hkv}, {hd}], got {:?}",
            cache.shape
        );
        ensure!(
            meta.slot_mapping.len() == n,
            "write_kv: slot_mapping must have {n} entries, got {}",
            meta.slot_mapping.len()
        );
        for &slot in &meta.slot_mapping {
            ensure!(
                (slot as usize) < blocks * bs,
                "write_kv: slot {slot} outside the cache ({blocks}×{bs})"
            );
        }
        let sv = src.f32_values();
        let row = hkv * hd;
        // Only the written rows are touched (the cache is not copied).
        let dtype = cache.dtype;
        cache.update_f32(dtype, |cv| {
            for (t, &slot) in meta.slot_mapping.iter().enumerate() {
                let slot = slot as usize;
                cv[slot * row..(slot + 1) * row].copy_from_slice(&sv[t * row..(t + 1) * row]);
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Causal paged attention (PagedAttention, Kwon et al. 2023; softmax attention of Vaswani et al.
/// 2017): query token `n` of sequence `s = token_seq[n]` at position `p = positions[n]` computes
/// `out[n, h] = Σ_{j ≤ p} softmax_j(scale · q[n, h] · K_j) · V_j`, where key/value `j` is stored at
/// `block_tables[s, j / bs] · bs + j % bs` for KV head `h / (H / Hkv)` (grouped-query attention).
///
/// `q` `[N, H, hd_k]`, caches `[blocks, bs, Hkv, hd_k]` / `[blocks, bs, Hkv, hd_v]` → `[N, H, hd_v]`
/// in `q`'s dtype. Softmax is computed with the row maximum subtracted, in f64.
pub fn paged_attention(
    q: &HostTensor,
    k_cache: &HostTensor,
    v_cache: &HostTensor,
    meta: &StepMeta,
    scale: f32,
) -> Result<HostTensor> {
    paged_attention_ext(q, k_cache, v_cache, meta, scale, None, None)
}

/// [`paged_attention`] with a sliding window (a query at position `p` sees keys
/// `p + 1 − window ..= p`) and per-head sinks (`sinks` `[H]`: one extra logit per softmax row
/// that takes probability mass and adds no value; gpt-oss, HF `GptOssAttention`), in f64.
pub fn paged_attention_ext(
    q: &HostTensor,
    k_cache: &HostTensor,
    v_cache: &HostTensor,
    meta: &StepMeta,
    scale: f32,
    window: Option<usize>,
    sinks: Option<&HostTensor>,
) -> Result<HostTensor> {
    rank("paged_attention", "q", q, 3, "[N, H, hd_k]")?;
    rank(
        "paged_attention",
        "k_cache",
        k_cache,
        4,
        "[blocks, bs, Hkv, hd_k]",
    )?;
    rank(
        "paged_attention",
        "v_cache",
        v_cache,
        4,
        "[blocks, bs, Hkv, hd_v]",
    )?;
    let dt = float_dtype("paged_attention", "q", q)?;
    let (n, h, hdk) = (q.shape[0], q.shape[1], q.shape[2]);
    let (blocks, bs, hkv) = (k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]);
    let hdv = v_cache.shape[3];
    ensure!(
        k_cache.shape[3] == hdk && v_cache.shape[..3] == [blocks, bs, hkv],
        "paged_attention: caches must be [blocks, bs, Hkv, {hdk}] and [blocks, bs, Hkv, hd_v], got {:?} and {:?}",
        k_cache.shape,
        v_cache.shape
    );
    ensure!(
        hkv > 0 && h % hkv == 0,
        "paged_attention: H {h} must be a multiple of Hkv {hkv}"
    );
    ensure!(
        bs == meta.block_size,
        "paged_attention: cache block size {bs} != meta.block_size {}",
        meta.block_size
    );
    ensure!(
        meta.positions.len() == n && meta.token_seq.len() == n,
        "paged_attention: positions and token_seq must have {n} entries"
    );
    let group = h / hkv;
    let sinks = match sinks {
        Some(t) => {
            ensure!(
                t.shape == [h],
                "paged_attention: sinks must be [{h}], got {:?}",
                t.shape
            );
            Some(t.to_f32())
        }
        None => None,
    };
    ensure!(
        window != Some(0),
        "paged_attention: a sliding window must be >= 1"
    );
    // The caches are read where they lie (f32), not copied.
    let (qv, kv, vv) = (q.to_f32(), k_cache.f32_values(), v_cache.f32_values());
    let mut out = vec![0f32; n * h * hdv];
    for t in 0..n {
        let s = meta.token_seq[t] as usize;
        let p = meta.positions[t] as usize;
        ensure!(
            s < meta.num_seqs(),
            "paged_attention: token_seq[{t}] = {s} out of range"
        );
        for hh in 0..h {
            let g = hh / group;
            let qrow = &qv[(t * h + hh) * hdk..(t * h + hh + 1) * hdk];
            let mut logits = Vec::with_capacity(p + 1);
            let mut slots = Vec::with_capacity(p + 1);
            let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
            for j in first..=p {
                let blk_idx = j / bs;
                if blk_idx >= meta.max_blocks {
                    bail!(
                        "paged_attention: position {j} needs block {blk_idx} >= max_blocks {}",
                        meta.max_blocks
                    );
                }
                let blk = meta.block_tables[s * meta.max_blocks + blk_idx] as usize;
                ensure!(
                    blk < blocks,
                    "paged_attention: block id {blk} out of range ({blocks})"
                );
                let slot = blk * bs + j % bs;
                let krow = &kv[(slot * hkv + g) * hdk..(slot * hkv + g + 1) * hdk];
                let dot: f64 = qrow
                    .iter()
                    .zip(krow)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                logits.push(dot * scale as f64);
                slots.push(slot);
            }
            let sink = sinks.as_ref().map(|z| z[hh] as f64);
            let mx = logits
                .iter()
                .cloned()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = logits.iter().map(|&l| (l - mx).exp()).collect();
            let sum: f64 = w.iter().sum::<f64>() + sink.map_or(0.0, |z| (z - mx).exp());
            let o = &mut out[(t * h + hh) * hdv..(t * h + hh + 1) * hdv];
            for d in 0..hdv {
                let mut acc = 0f64;
                for (wi, &slot) in w.iter().zip(&slots) {
                    acc += wi * vv[(slot * hkv + g) * hdv + d] as f64;
                }
                o[d] = (acc / sum) as f32;
            }
        }
    }
    HostTensor::from_f32_as(vec![n, h, hdv], &out, dt)
}

/// Log-probability of one token per row: `out[r] = x[r, t_r] − lse(x[r])`, the log-sum-exp in
/// f64 about the row's maximum. `x` `[R, V]` float, `targets` `[R]` u32 → `[R]` f32.
pub fn token_logprob_rows(x: &HostTensor, targets: &HostTensor) -> Result<HostTensor> {
    rank("token_logprob_rows", "x", x, 2, "[R, V]")?;
    float_dtype("token_logprob_rows", "x", x)?;
    let (r, v) = (x.shape[0], x.shape[1]);
    let t = targets.to_u32()?;
    ensure!(
        t.len() == r,
        "token_logprob_rows: targets must be [{r}] u32, got {:?} {}",
        targets.shape,
        targets.dtype
    );
    let xv = x.to_f32();
    let mut out = Vec::with_capacity(r);
    for (i, &tok) in t.iter().enumerate() {
        ensure!(
            (tok as usize) < v,
            "token_logprob_rows: target {tok} of row {i} is outside the {v} columns"
        );
        let row = &xv[i * v..(i + 1) * v];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&y| (y as f64 - max).exp())
                .sum::<f64>()
                .ln();
        out.push((row[tok as usize] as f64 - lse) as f32);
    }
    HostTensor::from_f32(vec![r], &out)
}

/// Row-wise argmax: `out[r] = min { j : x[r, j] = max_k x[r, k] }` (first index on ties).
///
/// `x` `[R, V]` float → `[R]` u32.
pub fn argmax(x: &HostTensor) -> Result<HostTensor> {
    rank("argmax", "x", x, 2, "[R, V]")?;
    float_dtype("argmax", "x", x)?;
    let (r, v) = (x.shape[0], x.shape[1]);
    ensure!(v > 0, "argmax: V must be > 0");
    let xv = x.to_f32();
    let mut out = vec![0u32; r];
    for i in 0..r {
        let row = &xv[i * v..(i + 1) * v];
        let mut best = 0;
        for j in 1..v {
            if row[j] > row[best] {
                best = j;
            }
        }
        out[i] = best as u32;
    }
    HostTensor::from_u32(vec![r], &out)
}

/// Per-head linear map (MLA weight absorption, DeepSeek-V2 report §2.1.2):
/// `y[n, h, o] = Σ_k w[h, o, k] · x[n, h, k]`.
///
/// `x` `[N, H, K]`, `w` `[H, O, K]` → `[N, H, O]` in `x`'s dtype.
pub fn head_linear(x: &HostTensor, w: &HostTensor) -> Result<HostTensor> {
    rank("head_linear", "x", x, 3, "[N, H, K]")?;
    rank("head_linear", "w", w, 3, "[H, O, K]")?;
    let dt = float_dtype("head_linear", "x", x)?;
    let (n, h, k) = (x.shape[0], x.shape[1], x.shape[2]);
    let o = w.shape[1];
    ensure!(
        w.shape[0] == h && w.shape[2] == k,
        "head_linear: w must have shape [{h}, O, {k}], got {:?}",
        w.shape
    );
    let (xv, wv) = (x.to_f32(), w.to_f32());
    let mut y = vec![0f32; n * h * o];
    for t in 0..n {
        for hh in 0..h {
            let xr = &xv[(t * h + hh) * k..(t * h + hh + 1) * k];
            for oo in 0..o {
                let wr = &wv[(hh * o + oo) * k..(hh * o + oo + 1) * k];
                y[(t * h + hh) * o + oo] = xr
                    .iter()
                    .zip(wr)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>() as f32;
            }
        }
    }
    HostTensor::from_f32_as(vec![n, h, o], &y, dt)
}

/// Per-token mix of `S` input rows into `M` output rows (hyper-connections' collapse, stream
/// mixing and expansion; Xie et al. 2026, HF `Glm5NextTextHyperConnection`):
/// `out[t, m, :] = Σ_s w[t, s, m] · x[t, s, :]`, accumulated in f64.
///
/// `x` `[N, S, D]` float, `w` `[N, S, M]` f32 → `[N, M, D]` in `x`'s dtype.
pub fn stream_mix(x: &HostTensor, w: &HostTensor) -> Result<HostTensor> {
    const OP: &str = "stream_mix";
    rank(OP, "x", x, 3, "[N, S, D]")?;
    rank(OP, "w", w, 3, "[N, S, M]")?;
    let dt = float_dtype(OP, "x", x)?;
    ensure!(
        w.dtype == DType::F32,
        "{OP}: w must be an f32 tensor, got {}",
        w.dtype
    );
    let (n, s, d) = (x.shape[0], x.shape[1], x.shape[2]);
    ensure!(
        w.shape[0] == n && w.shape[1] == s,
        "{OP}: w must have shape [{n}, {s}, M] to match x {:?}, got {:?}",
        x.shape,
        w.shape
    );
    let m = w.shape[2];
    let (xv, wv) = (x.to_f32(), w.to_f32());
    let mut y = vec![0f32; n * m * d];
    for t in 0..n {
        for mm in 0..m {
            for dd in 0..d {
                let mut acc = 0f64;
                for ss in 0..s {
                    acc += wv[(t * s + ss) * m + mm] as f64 * xv[(t * s + ss) * d + dd] as f64;
                }
                y[(t * m + mm) * d + dd] = acc as f32;
            }
        }
    }
    HostTensor::from_f32_as(vec![n, m, d], &y, dt)
}

/// Paged single-tensor cache write: `cache[slot_mapping[n], col..col + w] = x[n]`.
///
/// `x` `[N, w]`, `cache` `[blocks, bs, W]` (modified in place, values rounded to its dtype).
pub fn write_cache(
    x: &HostTensor,
    cache: &mut HostTensor,
    col: usize,
    meta: &StepMeta,
) -> Result<()> {
    rank("write_cache", "x", x, 2, "[N, w]")?;
    rank("write_cache", "cache", cache, 3, "[blocks, bs, W]")?;
    let (n, w) = (x.shape[0], x.shape[1]);
    let (blocks, bs, width) = (cache.shape[0], cache.shape[1], cache.shape[2]);
    ensure!(
        col + w <= width,
        "write_cache: columns {col}..{} exceed the cache width {width}",
        col + w
    );
    ensure!(
        meta.slot_mapping.len() == n,
        "write_cache: slot_mapping must have {n} entries"
    );
    for &slot in &meta.slot_mapping {
        ensure!(
            (slot as usize) < blocks * bs,
            "write_cache: slot {slot} outside the cache ({blocks}×{bs})"
        );
    }
    let xv = x.f32_values();
    // Only the written columns of the written rows are touched (the cache is not copied).
    let dtype = cache.dtype;
    cache.update_f32(dtype, |cv| {
        for (t, &slot) in meta.slot_mapping.iter().enumerate() {
            let base = slot as usize * width + col;
            cv[base..base + w].copy_from_slice(&xv[t * w..(t + 1) * w]);
        }
        Ok(())
    })
}

/// One head of latent attention over `rows` (`[L + R]` each): softmax over
/// `scale · (q_lat · c[..L] + q_rope · c[L..])` in f64, weighted sum of `c[..L]` into `out` `[L]`.
fn latent_attend(ql: &[f32], qr: &[f32], rows: &[&[f32]], scale: f32, out: &mut [f32]) {
    let l = ql.len();
    let dot = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum::<f64>()
    };
    let scores: Vec<f64> = rows
        .iter()
        .map(|c| (dot(ql, &c[..l]) + dot(qr, &c[l..])) * scale as f64)
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    for (d, o) in out.iter_mut().enumerate() {
        let acc: f64 = rows.iter().zip(&e).map(|(c, p)| c[d] as f64 * p).sum();
        *o = (acc / z) as f32;
    }
}

/// Causal attention over a paged latent cache (MLA absorbed form, DeepSeek-V2 report §2.1.2):
/// `score(n, h, s) = scale · (q_lat[n, h] · c_s[..L] + q_rope[n, h] · c_s[L..])` for the
/// sequence's positions `s ≤ positions[n]`, `out[n, h] = Σ_s softmax_s(score) · c_s[..L]`.
///
/// `q_lat` `[N, H, L]`, `q_rope` `[N, H, R]`, `cache` `[blocks, bs, L + R]` → `[N, H, L]`.
pub fn paged_latent_attention(
    q_lat: &HostTensor,
    q_rope: &HostTensor,
    cache: &HostTensor,
    meta: &StepMeta,
    scale: f32,
) -> Result<HostTensor> {
    rank("paged_latent_attention", "q_lat", q_lat, 3, "[N, H, L]")?;
    rank("paged_latent_attention", "q_rope", q_rope, 3, "[N, H, R]")?;
    rank(
        "paged_latent_attention",
        "cache",
        cache,
        3,
        "[blocks, bs, L + R]",
    )?;
    let dt = float_dtype("paged_latent_attention", "q_lat", q_lat)?;
    let (n, h, l) = (q_lat.shape[0], q_lat.shape[1], q_lat.shape[2]);
    let r = q_rope.shape[2];
    ensure!(
        q_rope.shape[..2] == [n, h] && cache.shape[2] == l + r,
        "paged_latent_attention: q_rope must be [{n}, {h}, R] and cache [blocks, bs, {l} + R], got {:?} and {:?}",
        q_rope.shape,
        cache.shape
    );
    let bs = cache.shape[1];
    let w = l + r;
    let (qv, rv, cv) = (q_lat.to_f32(), q_rope.to_f32(), cache.f32_values());
    let mut out = vec![0f32; n * h * l];
    for t in 0..n {
        let rows: Vec<&[f32]> = causal_slots(meta, t, bs)
            .into_iter()
            .map(|slot| &cv[slot * w..(slot + 1) * w])
            .collect();
        for hh in 0..h {
            let ql = &qv[(t * h + hh) * l..(t * h + hh + 1) * l];
            let qr = &rv[(t * h + hh) * r..(t * h + hh + 1) * r];
            latent_attend(
                ql,
                qr,
                &rows,
                scale,
                &mut out[(t * h + hh) * l..(t * h + hh + 1) * l],
            );
        }
    }
    HostTensor::from_f32_as(vec![n, h, l], &out, dt)
}

/// MoE routing (DeepSeek-V3 "noaux_tc"; HF `DeepseekV3TopkRouter`); see
/// [`crate::Backend::moe_route`]. Returns (`ids` `[N, k]` u32, `weights` `[N, k]` f32).
pub fn moe_route(
    x: &HostTensor,
    gate_w: &HostTensor,
    bias: Option<&HostTensor>,
    routing: &crate::MoeRouting,
) -> Result<(HostTensor, HostTensor)> {
    rank("moe_route", "x", x, 2, "[N, D]")?;
    rank("moe_route", "gate_w", gate_w, 2, "[E, D]")?;
    let (n, d) = (x.shape[0], x.shape[1]);
    let e = gate_w.shape[0];
    let k = routing.top_k;
    let g = routing.n_group.max(1);
    ensure!(
        gate_w.shape[1] == d,
        "moe_route: gate_w must be [E, {d}], got {:?}",
        gate_w.shape
    );
    ensure!(k >= 1 && k <= e, "moe_route: top_k {k} must be in 1..={e}");
    ensure!(
        e.is_multiple_of(g) && routing.topk_group >= 1 && routing.topk_group <= g,
        "moe_route: {e} experts, {g} groups, topk_group {}",
        routing.topk_group
    );
    let bv = match bias {
        Some(b) => {
            ensure!(
                b.shape == [e],
                "moe_route: bias must be [{e}], got {:?}",
                b.shape
            );
            b.to_f32()
        }
        None => vec![0.0; e],
    };
    let (xv, wv) = (x.to_f32(), gate_w.to_f32());
    let mut ids = Vec::with_capacity(n * k);
    let mut weights = Vec::with_capacity(n * k);
    let per = e / g;
    for t in 0..n {
        let xr = &xv[t * d..(t + 1) * d];
        let s: Vec<f32> = (0..e)
            .map(|i| {
                let l: f32 = xr
                    .iter()
                    .zip(&wv[i * d..(i + 1) * d])
                    .map(|(a, b)| a * b)
                    .sum();
                1.0 / (1.0 + (-l).exp())
            })
            .collect();
        let mut choice: Vec<f32> = s.iter().zip(&bv).map(|(a, b)| a + b).collect();
        if g > 1 {
            let mut group_score: Vec<(usize, f32)> = (0..g)
                .map(|gi| {
                    let mut v: Vec<f32> = choice[gi * per..(gi + 1) * per].to_vec();
                    v.sort_by(|a, b| b.total_cmp(a));
                    (gi, v.iter().take(2).sum())
                })
                .collect();
            group_score.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let keep: Vec<usize> = group_score
                .iter()
                .take(routing.topk_group)
                .map(|x| x.0)
                .collect();
            for (i, c) in choice.iter_mut().enumerate() {
                if !keep.contains(&(i / per)) {
                    *c = f32::NEG_INFINITY;
                }
            }
        }
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
        let chosen = &order[..k];
        let sum: f32 = chosen.iter().map(|&i| s[i]).sum();
        for &i in chosen {
            let mut w = s[i];
            if routing.norm_topk_prob {
                w /= sum + 1e-20;
            }
            ids.push(i as u32);
            weights.push(w * routing.routed_scaling_factor);
        }
    }
    Ok((
        HostTensor::from_u32(vec![n, k], &ids)?,
        HostTensor::from_f32(vec![n, k], &weights)?,
    ))
}

/// Routed SwiGLU experts (see [`crate::Backend::moe_experts`]):
/// `y[n] = Σ_j weights[n, j] · down[e] · (silu(g) ⊙ u)`, `[g | u] = gate_up[e] · x[n]`, `e = ids[n, j]`.
///
/// `x` `[N, D]`, `ids` `[N, k]`, `weights` `[N, k]` f32, `gate_up` `[E, 2F, D]`, `down` `[E, D, F]`
/// → `[N, D]` in `x`'s dtype.
pub fn moe_experts(
    x: &HostTensor,
    ids: &HostTensor,
    weights: &HostTensor,
    gate_up: &HostTensor,
    down: &HostTensor,
) -> Result<HostTensor> {
    moe_experts_ext(
        x,
        ids,
        weights,
        gate_up,
        down,
        ExpertAct::Swiglu,
        None,
        None,
    )
}

/// [`moe_experts`] with another activation ([`ExpertAct`]) and biases on the two projections
/// (`gate_up_bias` `[E, 2F]` in `gate_up`'s row order, `down_bias` `[E, D]`), in f64:
/// `y[n] = Σ_j weights[n, j] · (down[e] · act(gate_up[e] · x[n] + b_gu[e]) + b_d[e])`.
#[allow(clippy::too_many_arguments)]
pub fn moe_experts_ext(
    x: &HostTensor,
    ids: &HostTensor,
    weights: &HostTensor,
    gate_up: &HostTensor,
    down: &HostTensor,
    act: ExpertAct,
    gate_up_bias: Option<&HostTensor>,
    down_bias: Option<&HostTensor>,
) -> Result<HostTensor> {
    rank("moe_experts", "x", x, 2, "[N, D]")?;
    rank("moe_experts", "gate_up", gate_up, 3, "[E, 2F, D]")?;
    rank("moe_experts", "down", down, 3, "[E, D, F]")?;
    let dt = float_dtype("moe_experts", "x", x)?;
    let (n, d) = (x.shape[0], x.shape[1]);
    let (e, f2) = (gate_up.shape[0], gate_up.shape[1]);
    let f = f2 / 2;
    ensure!(
        gate_up.shape[2] == d && f2 % 2 == 0,
        "moe_experts: gate_up must be [E, 2F, {d}], got {:?}",
        gate_up.shape
    );
    ensure!(
        down.shape == [e, d, f],
        "moe_experts: down must be [{e}, {d}, {f}], got {:?}",
        down.shape
    );
    ensure!(
        ids.shape.len() == 2 && ids.shape[0] == n && weights.shape == ids.shape,
        "moe_experts: ids and weights must be [{n}, k]"
    );
    let k = ids.shape[1];
    let (xv, iv, wv, gu, dn) = (
        x.to_f32(),
        ids.to_u32()?,
        weights.to_f32(),
        gate_up.to_f32(),
        down.to_f32(),
    );
    let bias = |t: Option<&HostTensor>, shape: [usize; 2], what: &str| -> Result<Vec<f32>> {
        match t {
            Some(t) => {
                ensure!(
                    t.shape == shape,
                    "moe_experts: {what} must be {shape:?}, got {:?}",
                    t.shape
                );
                Ok(t.to_f32())
            }
            None => Ok(vec![0.0; shape[0] * shape[1]]),
        }
    };
    let gub = bias(gate_up_bias, [e, f2], "gate_up_bias")?;
    let dnb = bias(down_bias, [e, d], "down_bias")?;
    let mut y = vec![0f32; n * d];
    for t in 0..n {
        let xr = &xv[t * d..(t + 1) * d];
        let mut acc = vec![0f64; d];
        for j in 0..k {
            let ex = iv[t * k + j] as usize;
            ensure!(
                ex < e,
                "moe_experts: expert id {ex} out of range ({e} experts)"
            );
            let dot = |row: usize| -> f64 {
                let w = &gu[(ex * f2 + row) * d..(ex * f2 + row + 1) * d];
                let s: f64 = xr.iter().zip(w).map(|(a, b)| *a as f64 * *b as f64).sum();
                s + gub[ex * f2 + row] as f64
            };
            let hmid: Vec<f64> = (0..f)
                .map(|i| match act {
                    ExpertAct::Swiglu => {
                        let (g, u) = (dot(i), dot(f + i));
                        g / (1.0 + (-g).exp()) * u
                    }
                    ExpertAct::SwigluClamped { limit } => {
                        let l = limit as f64;
                        let (g, u) = (dot(i).min(l), dot(f + i).clamp(-l, l));
                        g / (1.0 + (-g).exp()) * u
                    }
                    ExpertAct::GptOss { alpha, limit } => {
                        let (l, a) = (limit as f64, alpha as f64);
                        let g = dot(2 * i).min(l);
                        let u = dot(2 * i + 1).clamp(-l, l);
                        (u + 1.0) * g / (1.0 + (-a * g).exp())
                    }
                })
                .collect();
            for o in 0..d {
                let w = &dn[(ex * d + o) * f..(ex * d + o + 1) * f];
                let v: f64 = hmid.iter().zip(w).map(|(a, b)| a * *b as f64).sum::<f64>()
                    + dnb[ex * d + o] as f64;
                acc[o] += wv[t * k + j] as f64 * v;
            }
        }
        for o in 0..d {
            y[t * d + o] = acc[o] as f32;
        }
    }
    HostTensor::from_f32_as(vec![n, d], &y, dt)
}

/// For each sequence of the step, its token rows and whether it starts at position 0.
fn seq_rows(meta: &StepMeta) -> Vec<(std::ops::Range<usize>, bool)> {
    (0..meta.seq_lens.len())
        .map(|s| {
            let r = meta.query_start[s] as usize..meta.query_start[s + 1] as usize;
            let fresh = r.is_empty() || meta.positions[r.start] == 0;
            (r, fresh)
        })
        .collect()
}

/// Causal depthwise convolution + SiLU with per-sequence history (see
/// [`crate::Backend::short_conv`]; HF `causal_conv1d_fn` / `causal_conv1d_update`).
///
/// `x` `[N, C]`, `w` `[C, W]`, `state` `[slots, C, W−1]` f32 (updated) → `[N, C]` in `x`'s dtype.
pub fn short_conv(
    x: &HostTensor,
    w: &HostTensor,
    state: &mut HostTensor,
    meta: &StepMeta,
) -> Result<HostTensor> {
    rank("short_conv", "x", x, 2, "[N, C]")?;
    rank("short_conv", "w", w, 2, "[C, W]")?;
    rank("short_conv", "state", state, 3, "[slots, C, W-1]")?;
    let dt = float_dtype("short_conv", "x", x)?;
    let (n, c) = (x.shape[0], x.shape[1]);
    let width = w.shape[1];
    ensure!(
        w.shape[0] == c && width >= 1,
        "short_conv: w must be [{c}, W], got {:?}",
        w.shape
    );
    ensure!(
        state.shape[1..] == [c, width - 1],
        "short_conv: state must be [slots, {c}, {}], got {:?}",
        width - 1,
        state.shape
    );
    ensure!(
        meta.state_slots.len() == meta.seq_lens.len(),
        "short_conv: state_slots must have one entry per sequence"
    );
    for &slot in &meta.state_slots {
        ensure!(
            (slot as usize) < state.shape[0],
            "short_conv: state slot {slot} out of range"
        );
    }
    let (xv, wv) = (x.to_f32(), w.to_f32());
    let h = width - 1;
    let mut y = vec![0f32; n * c];
    // The state is updated where it lies (only the step's slots are touched).
    state.update_f32(DType::F32, |sv| {
        for (s, (rows, fresh)) in seq_rows(meta).into_iter().enumerate() {
            let slot = meta.state_slots[s] as usize;
            for ch in 0..c {
                let base = (slot * c + ch) * h;
                let mut stream: Vec<f32> = if fresh {
                    vec![0.0; h]
                } else {
                    sv[base..base + h].to_vec()
                };
                stream.extend(rows.clone().map(|t| xv[t * c + ch]));
                for (i, t) in rows.clone().enumerate() {
                    let acc: f64 = (0..width)
                        .map(|j| wv[ch * width + j] as f64 * stream[i + j] as f64)
                        .sum();
                    y[t * c + ch] = (acc / (1.0 + (-acc).exp())) as f32;
                }
                let tail = &stream[stream.len() - h..];
                sv[base..base + h].copy_from_slice(tail);
            }
        }
        Ok(())
    })?;
    HostTensor::from_f32_as(vec![n, c], &y, dt)
}

/// Kimi Delta Attention, token-recurrent (see [`crate::Backend::kda`]; fla `naive_recurrent_kda`,
/// HF `recurrent_kimi_delta_attention` with `use_qk_l2norm_in_kernel`).
///
/// `q`, `k`, `a` `[N, H, K]`, `v` `[N, H, V]`, `b` `[N, H]`, `a_log` `[H]`, `dt_bias` `[H, K]`,
/// `state` `[slots, H, K, V]` f32 (updated) → `[N, H, V]` in `q`'s dtype.
#[allow(clippy::too_many_arguments)]
pub fn kda(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    a: &HostTensor,
    b: &HostTensor,
    a_log: &HostTensor,
    dt_bias: &HostTensor,
    lower_bound: Option<f32>,
    state: &mut HostTensor,
    meta: &StepMeta,
) -> Result<HostTensor> {
    rank("kda", "q", q, 3, "[N, H, K]")?;
    rank("kda", "v", v, 3, "[N, H, V]")?;
    rank("kda", "state", state, 4, "[slots, H, K, V]")?;
    let dt = float_dtype("kda", "q", q)?;
    let (n, h, kd) = (q.shape[0], q.shape[1], q.shape[2]);
    let vd = v.shape[2];
    ensure!(
        k.shape == q.shape && a.shape == q.shape,
        "kda: k and a must be [{n}, {h}, {kd}] like q"
    );
    ensure!(
        v.shape[..2] == [n, h] && b.shape == [n, h],
        "kda: v must be [{n}, {h}, V] and b [{n}, {h}]"
    );
    ensure!(
        a_log.shape.iter().product::<usize>() == h
            && dt_bias.shape.iter().product::<usize>() == h * kd,
        "kda: a_log must have {h} and dt_bias {} values",
        h * kd
    );
    ensure!(
        state.shape[1..] == [h, kd, vd],
        "kda: state must be [slots, {h}, {kd}, {vd}], got {:?}",
        state.shape
    );
    ensure!(
        meta.state_slots.len() == meta.seq_lens.len(),
        "kda: state_slots must have one entry per sequence"
    );
    let (qv, kv, vv, av, bv, alog, dtb) = (
        q.to_f32(),
        k.to_f32(),
        v.to_f32(),
        a.to_f32(),
        b.to_f32(),
        a_log.to_f32(),
        dt_bias.to_f32(),
    );
    for &slot in &meta.state_slots {
        ensure!(
            (slot as usize) < state.shape[0],
            "kda: state slot {slot} out of range"
        );
    }
    let mut o = vec![0f32; n * h * vd];
    let scale = 1.0 / (kd as f64).sqrt();
    // The state is updated where it lies (only the step's slots are touched).
    state.update_f32(DType::F32, |sv| {
        for (s, (rows, fresh)) in seq_rows(meta).into_iter().enumerate() {
            let slot = meta.state_slots[s] as usize;
            for hh in 0..h {
                let base = (slot * h + hh) * kd * vd;
                let mut st: Vec<f64> = if fresh {
                    vec![0.0; kd * vd]
                } else {
                    sv[base..base + kd * vd].iter().map(|&x| x as f64).collect()
                };
                for t in rows.clone() {
                    let row = (t * h + hh) * kd;
                    let l2 = |x: &[f32]| -> Vec<f64> {
                        let norm =
                            (x.iter().map(|&e| e as f64 * e as f64).sum::<f64>() + 1e-6).sqrt();
                        x.iter().map(|&e| e as f64 / norm).collect()
                    };
                    let qn: Vec<f64> = l2(&qv[row..row + kd])
                        .into_iter()
                        .map(|e| e * scale)
                        .collect();
                    let kn = l2(&kv[row..row + kd]);
                    let decay: Vec<f64> = (0..kd)
                        .map(|d| {
                            let x = av[row + d] as f64 + dtb[hh * kd + d] as f64;
                            let rate = (alog[hh] as f64).exp();
                            let g = match lower_bound {
                                Some(lb) => lb as f64 / (1.0 + (-(rate * x)).exp()),
                                None => -rate * if x > 20.0 { x } else { x.exp().ln_1p() },
                            };
                            g.exp()
                        })
                        .collect();
                    let beta = 1.0 / (1.0 + (-(bv[t * h + hh] as f64)).exp());
                    for d in 0..kd {
                        for e in 0..vd {
                            st[d * vd + e] *= decay[d];
                        }
                    }
                    let vrow = (t * h + hh) * vd;
                    for e in 0..vd {
                        let kv_mem: f64 = (0..kd).map(|d| st[d * vd + e] * kn[d]).sum();
                        let delta = (vv[vrow + e] as f64 - kv_mem) * beta;
                        for d in 0..kd {
                            st[d * vd + e] += kn[d] * delta;
                        }
                    }
                    // The state lives in f32 between tokens (as in the slot), so that a prompt
                    // split into chunks at any point gives the same bits as one pass — what
                    // prefix caching's state checkpoints need.
                    for x in st.iter_mut() {
                        *x = *x as f32 as f64;
                    }
                    for e in 0..vd {
                        o[vrow + e] = (0..kd).map(|d| st[d * vd + e] * qn[d]).sum::<f64>() as f32;
                    }
                }
                for (dst, src) in sv[base..base + kd * vd].iter_mut().zip(&st) {
                    *dst = *src as f32;
                }
            }
        }
        Ok(())
    })?;
    HostTensor::from_f32_as(vec![n, h, vd], &o, dt)
}

/// Sigmoid-gated RMSNorm (HF `KimiLinearRMSNormGated`): `y = w ⊙ x/√(mean(x²)+eps) ⊙ σ(gate)`.
///
/// `x`, `gate` `[R, D]`, `w` `[D]` → `[R, D]` in `x`'s dtype.
pub fn gated_rms_norm(
    x: &HostTensor,
    gate: &HostTensor,
    w: &HostTensor,
    eps: f32,
) -> Result<HostTensor> {
    rank("gated_rms_norm", "x", x, 2, "[R, D]")?;
    let dt = float_dtype("gated_rms_norm", "x", x)?;
    let (r, d) = (x.shape[0], x.shape[1]);
    ensure!(
        gate.shape == x.shape && w.shape == [d],
        "gated_rms_norm: gate must be [{r}, {d}] and w [{d}]"
    );
    let (xv, gv, wv) = (x.to_f32(), gate.to_f32(), w.to_f32());
    let mut y = vec![0f32; r * d];
    for i in 0..r {
        let row = &xv[i * d..(i + 1) * d];
        let inv = 1.0
            / (row.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / d as f64 + eps as f64)
                .sqrt();
        for j in 0..d {
            let g = 1.0 / (1.0 + (-(gv[i * d + j] as f64)).exp());
            y[i * d + j] = (row[j] as f64 * inv * wv[j] as f64 * g) as f32;
        }
    }
    HostTensor::from_f32_as(vec![r, d], &y, dt)
}

/// LayerNorm (Ba et al. 2016; torch `nn.LayerNorm`): `y = (x − μ)/√(σ² + eps) ⊙ w + b`, biased σ².
///
/// `x` `[R, D]`, `w`, `b` `[D]` → `[R, D]` in `x`'s dtype.
pub fn layer_norm(x: &HostTensor, w: &HostTensor, b: &HostTensor, eps: f32) -> Result<HostTensor> {
    rank("layer_norm", "x", x, 2, "[R, D]")?;
    let dt = float_dtype("layer_norm", "x", x)?;
    let (r, d) = (x.shape[0], x.shape[1]);
    ensure!(
        w.shape == [d] && b.shape == [d],
        "layer_norm: w and b must be [{d}]"
    );
    let (xv, wv, bv) = (x.to_f32(), w.to_f32(), b.to_f32());
    let mut y = vec![0f32; r * d];
    for i in 0..r {
        let row = &xv[i * d..(i + 1) * d];
        let mean = row.iter().map(|&a| a as f64).sum::<f64>() / d as f64;
        let var = row.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for j in 0..d {
            y[i * d + j] = ((row[j] as f64 - mean) * inv * wv[j] as f64 + bv[j] as f64) as f32;
        }
    }
    HostTensor::from_f32_as(vec![r, d], &y, dt)
}

/// GELU per element (Hendrycks & Gimpel 2016), in f64: exact `½x(1 + erf(x/√2))` (PyTorch
/// `nn.GELU()`), or with `approximate` the tanh form `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`
/// (PyTorch `gelu(approximate="tanh")`, transformers `gelu_pytorch_tanh`). `x` any shape, float
/// → same shape and dtype.
pub fn gelu(x: &HostTensor, approximate: bool) -> Result<HostTensor> {
    let dt = float_dtype("gelu", "x", x)?;
    let y: Vec<f32> = x
        .to_f32()
        .iter()
        .map(|&v| gelu_scalar(v as f64, approximate) as f32)
        .collect();
    HostTensor::from_f32_as(x.shape.clone(), &y, dt)
}

/// One GELU value in f64 (see [`gelu`]).
pub fn gelu_scalar(x: f64, approximate: bool) -> f64 {
    if approximate {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    }
}

/// The sequence's cache rows for positions `0..=p` of token `n`: slot of each position.
fn causal_slots(meta: &StepMeta, n: usize, bs: usize) -> Vec<usize> {
    let s = meta.token_seq[n] as usize;
    let p = meta.positions[n] as usize;
    let table = &meta.block_tables[s * meta.max_blocks..(s + 1) * meta.max_blocks];
    (0..=p)
        .map(|j| table[j / bs] as usize * bs + j % bs)
        .collect()
}

/// DSA lightning indexer + top-k (see [`crate::Backend::dsa_topk`]; HF `DeepseekV32Indexer`).
///
/// `q` `[N, H, d]`, `w` `[N, H]`, `k_cache` `[blocks, bs, d]` → `[N, topk]` u32 positions
/// (descending score, ties to the lower position, `u32::MAX` padding).
pub fn dsa_topk(
    q: &HostTensor,
    w: &HostTensor,
    k_cache: &HostTensor,
    meta: &StepMeta,
    scale: f32,
    topk: usize,
) -> Result<HostTensor> {
    rank("dsa_topk", "q", q, 3, "[N, H, d]")?;
    rank("dsa_topk", "k_cache", k_cache, 3, "[blocks, bs, d]")?;
    let (n, h, d) = (q.shape[0], q.shape[1], q.shape[2]);
    ensure!(
        w.shape == [n, h],
        "dsa_topk: w must be [{n}, {h}], got {:?}",
        w.shape
    );
    ensure!(
        k_cache.shape[2] == d,
        "dsa_topk: k_cache must be [blocks, bs, {d}], got {:?}",
        k_cache.shape
    );
    ensure!(topk >= 1, "dsa_topk: topk must be at least 1");
    let bs = k_cache.shape[1];
    let (qv, wv, kv) = (q.to_f32(), w.to_f32(), k_cache.f32_values());
    let hscale = 1.0 / (h as f64).sqrt();
    let mut out = Vec::with_capacity(n * topk);
    for t in 0..n {
        let mut scored: Vec<(f64, u32)> = causal_slots(meta, t, bs)
            .into_iter()
            .enumerate()
            .map(|(pos, slot)| {
                let k = &kv[slot * d..(slot + 1) * d];
                let score: f64 = (0..h)
                    .map(|hh| {
                        let qr = &qv[(t * h + hh) * d..(t * h + hh + 1) * d];
                        let dot: f64 = qr.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                        wv[t * h + hh] as f64 * hscale * (dot * scale as f64).max(0.0)
                    })
                    .sum();
                (score, pos as u32)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for i in 0..topk {
            out.push(scored.get(i).map_or(u32::MAX, |x| x.1));
        }
    }
    HostTensor::from_u32(vec![n, topk], &out)
}

/// Sparse MLA over the latent cache (see [`crate::Backend::sparse_latent_attention`]).
///
/// Same shapes as [`paged_latent_attention`], plus `selected` `[N, topk]` u32.
pub fn sparse_latent_attention(
    q_lat: &HostTensor,
    q_rope: &HostTensor,
    cache: &HostTensor,
    meta: &StepMeta,
    scale: f32,
    selected: &HostTensor,
) -> Result<HostTensor> {
    rank("sparse_latent_attention", "q_lat", q_lat, 3, "[N, H, L]")?;
    rank(
        "sparse_latent_attention",
        "cache",
        cache,
        3,
        "[blocks, bs, L + R]",
    )?;
    let dt = float_dtype("sparse_latent_attention", "q_lat", q_lat)?;
    let (n, h, l) = (q_lat.shape[0], q_lat.shape[1], q_lat.shape[2]);
    let r = q_rope.shape[2];
    let (bs, width) = (cache.shape[1], cache.shape[2]);
    ensure!(
        width == l + r && q_rope.shape[..2] == [n, h],
        "sparse_latent_attention: shapes {:?} {:?} {:?}",
        q_lat.shape,
        q_rope.shape,
        cache.shape
    );
    ensure!(
        selected.shape.len() == 2 && selected.shape[0] == n,
        "sparse_latent_attention: selected must be [{n}, topk]"
    );
    let k = selected.shape[1];
    let (qv, rv, cv, sel) = (
        q_lat.to_f32(),
        q_rope.to_f32(),
        cache.f32_values(),
        selected.to_u32()?,
    );
    let mut out = vec![0f32; n * h * l];
    for t in 0..n {
        let slots = causal_slots(meta, t, bs);
        let rows: Vec<&[f32]> = sel[t * k..(t + 1) * k]
            .iter()
            .filter(|&&p| p != u32::MAX)
            .map(|&p| {
                let slot = slots[p as usize];
                &cv[slot * width..(slot + 1) * width]
            })
            .collect();
        for hh in 0..h {
            let ql = &qv[(t * h + hh) * l..(t * h + hh + 1) * l];
            let qr = &rv[(t * h + hh) * r..(t * h + hh + 1) * r];
            latent_attend(
                ql,
                qr,
                &rows,
                scale,
                &mut out[(t * h + hh) * l..(t * h + hh + 1) * l],
            );
        }
    }
    HostTensor::from_f32_as(vec![n, h, l], &out, dt)
}
