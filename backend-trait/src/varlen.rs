//! Attention over a contiguous key segment with a softmax state that can be continued
//! ([`crate::Backend::attention_varlen`]): the building block of MLA prefill in the expanded
//! form (keys rebuilt from the latent cache one segment at a time) and of context-parallel
//! ring attention. FlashAttention-2 (Dao 2023) §3.1 gives the online softmax and the rule that
//! merges two partial results by their log-sum-exp; vLLM's `merge_attn_states` uses it for the
//! same chunked MLA prefill.

use crate::{DType, HostTensor};
use anyhow::{ensure, Result};

/// Per-sequence layout of one varlen call (host side).
///
/// Sequence `s` owns query rows `query_start[s] .. query_start[s + 1]` of `q` and key rows
/// `key_start[s] .. key_start[s + 1]` of the segment's `k` / `v`; its first key sits at absolute
/// position `key_pos0[s]`, so key row `key_start[s] + i` is position `key_pos0[s] + i`. With
/// `causal`, query row `n` (absolute position `positions[n]`) sees the keys at positions
/// `≤ positions[n]`; without it, every key of its sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VarlenMeta {
    /// `[S + 1]` query row offsets (non-decreasing, last = N).
    pub query_start: Vec<u32>,
    /// `[S + 1]` key row offsets into the segment (non-decreasing, last = M).
    pub key_start: Vec<u32>,
    /// `[S]` absolute position of each sequence's first key in the segment.
    pub key_pos0: Vec<u32>,
    /// `[N]` absolute position of each query row.
    pub positions: Vec<u32>,
    /// Causal mask by absolute positions (else every key of the sequence).
    pub causal: bool,
}

impl VarlenMeta {
    /// Number of sequences.
    pub fn num_seqs(&self) -> usize {
        self.key_pos0.len()
    }

    /// Checks the offsets against `n` query rows and `m` key rows; errors name `op` and the field.
    pub fn check(&self, op: &str, n: usize, m: usize) -> Result<()> {
        let s = self.key_pos0.len();
        ensure!(
            self.query_start.len() == s + 1 && self.key_start.len() == s + 1,
            "{op}: query_start and key_start must have S + 1 = {} entries, got {} and {}",
            s + 1,
            self.query_start.len(),
            self.key_start.len()
        );
        for (name, v, last) in [
            ("query_start", &self.query_start, n),
            ("key_start", &self.key_start, m),
        ] {
            ensure!(
                v[0] == 0 && v.windows(2).all(|w| w[0] <= w[1]) && v[s] as usize == last,
                "{op}: {name} must rise from 0 to {last}, got {v:?}"
            );
        }
        ensure!(
            self.positions.len() == n,
            "{op}: positions must have N = {n} entries, got {}",
            self.positions.len()
        );
        Ok(())
    }
}

/// [`VarlenMeta`] uploaded: the four arrays as `[len]` u32 device tensors, plus the host copy.
pub struct DeviceVarlenMeta<T> {
    /// See [`VarlenMeta::query_start`].
    pub query_start: T,
    /// See [`VarlenMeta::key_start`].
    pub key_start: T,
    /// See [`VarlenMeta::key_pos0`].
    pub key_pos0: T,
    /// See [`VarlenMeta::positions`].
    pub positions: T,
    /// The host-side values.
    pub host: VarlenMeta,
}

/// The result of [`crate::Backend::attention_varlen`]: the attention output in the activation
/// dtype (`Final`), or the softmax state to continue with another key segment (`State`).
pub enum VarlenResult<T> {
    /// `[N, H, Dv]` in `q`'s dtype.
    Final(T),
    /// `o` `[N, H, Dv]` f32 (normalised), `lse` `[N, H]` f32: natural-log log-sum-exp of the
    /// scaled scores seen so far (`−∞` for a row that has seen no key; its `o` is 0).
    State {
        /// Normalised output so far.
        o: T,
        /// Log-sum-exp so far.
        lse: T,
    },
}

/// Reference [`crate::Backend::attention_varlen`] in f64: for query row `n` of sequence `s` and
/// head `h` (KV head `h / (H / Hkv)`), the scores `scale · q[n, h] · k[j]` over the keys it sees
/// give `o_seg` and `lse_seg`; with a `prior` state `(o_p, lse_p)` the two merge as
/// `lse = ln(e^lse_p + e^lse_seg)`, `o = e^(lse_p − lse) o_p + e^(lse_seg − lse) o_seg`.
/// `q` `[N, H, Dk]`, `k` `[M, Hkv, Dk]`, `v` `[M, Hkv, Dv]` (float, one dtype); `prior` f32.
/// Returns `(o [N, H, Dv] f32, lse [N, H] f32)`; the caller casts `o` for a final result.
pub fn attention_varlen(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    meta: &VarlenMeta,
    scale: f32,
    prior: Option<(&HostTensor, &HostTensor)>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    const OP: &str = "attention_varlen";
    let (n, h, dk, m, hkv, dv) = check_shapes(
        (&q.shape, q.dtype),
        (&k.shape, k.dtype),
        (&v.shape, v.dtype),
    )?;
    meta.check(OP, n, m)?;
    let (qv, kv, vv) = (q.to_f32(), k.to_f32(), v.to_f32());
    let mut out = vec![0f32; n * h * dv];
    let mut lse = vec![f32::NEG_INFINITY; n * h];
    let group = h / hkv;
    for s in 0..meta.num_seqs() {
        let (k0, k1) = (meta.key_start[s] as usize, meta.key_start[s + 1] as usize);
        for t in meta.query_start[s] as usize..meta.query_start[s + 1] as usize {
            let p = meta.positions[t] as u64;
            let seen = |j: usize| !meta.causal || meta.key_pos0[s] as u64 + (j - k0) as u64 <= p;
            for hh in 0..h {
                let g = hh / group;
                let qrow = &qv[(t * h + hh) * dk..(t * h + hh + 1) * dk];
                let keys: Vec<usize> = (k0..k1).filter(|&j| seen(j)).collect();
                let logits: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let krow = &kv[(j * hkv + g) * dk..(j * hkv + g + 1) * dk];
                        let dot: f64 = qrow
                            .iter()
                            .zip(krow)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum();
                        dot * scale as f64
                    })
                    .collect();
                let mx = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let o = &mut out[(t * h + hh) * dv..(t * h + hh + 1) * dv];
                if keys.is_empty() {
                    continue;
                }
                let w: Vec<f64> = logits.iter().map(|&l| (l - mx).exp()).collect();
                let sum: f64 = w.iter().sum();
                for (d, od) in o.iter_mut().enumerate() {
                    let acc: f64 = w
                        .iter()
                        .zip(&keys)
                        .map(|(wi, &j)| wi * vv[(j * hkv + g) * dv + d] as f64)
                        .sum();
                    *od = (acc / sum) as f32;
                }
                lse[t * h + hh] = (mx + sum.ln()) as f32;
            }
        }
    }
    if let Some((po, pl)) = prior {
        check_prior((&po.shape, po.dtype), (&pl.shape, pl.dtype), (n, h, dv))?;
        merge_states(&mut out, &mut lse, &po.to_f32(), &pl.to_f32(), dv);
    }
    Ok((out, lse))
}

/// Merges a prior softmax state `(po, pl)` into `(o, lse)` row by row (module doc), in f64.
pub fn merge_states(o: &mut [f32], lse: &mut [f32], po: &[f32], pl: &[f32], dv: usize) {
    for (r, l) in lse.iter_mut().enumerate() {
        let (a, b) = (pl[r] as f64, *l as f64);
        let mx = a.max(b);
        if mx == f64::NEG_INFINITY {
            continue;
        }
        let (wa, wb) = ((a - mx).exp(), (b - mx).exp());
        let tot = wa + wb;
        for d in 0..dv {
            let i = r * dv + d;
            o[i] = ((wa * po[i] as f64 + wb * o[i] as f64) / tot) as f32;
        }
        *l = (mx + tot.ln()) as f32;
    }
}

/// Shapes `(N, H, Dk, M, Hkv, Dv)` of a varlen call from `q`, `k`, `v` (shape, dtype), checked:
/// `[N, H, Dk]`, `[M, Hkv, Dk]`, `[M, Hkv, Dv]` in one float dtype, `Hkv` dividing `H`.
pub fn check_shapes(
    q: (&[usize], DType),
    k: (&[usize], DType),
    v: (&[usize], DType),
) -> Result<(usize, usize, usize, usize, usize, usize)> {
    const OP: &str = "attention_varlen";
    let ((qs, qd), (ks, kd), (vs, vd)) = (q, k, v);
    ensure!(
        qs.len() == 3 && ks.len() == 3 && vs.len() == 3,
        "{OP}: q must be [N, H, Dk], k [M, Hkv, Dk], v [M, Hkv, Dv]; got {qs:?}, {ks:?}, {vs:?}"
    );
    let (n, h, dk) = (qs[0], qs[1], qs[2]);
    let (m, hkv) = (ks[0], ks[1]);
    ensure!(
        ks[2] == dk && vs[..2] == [m, hkv],
        "{OP}: k must be [M, Hkv, {dk}] and v [M, Hkv, Dv], got {ks:?} and {vs:?}"
    );
    ensure!(
        hkv > 0 && h % hkv == 0,
        "{OP}: query heads H = {h} must be a multiple of key heads Hkv = {hkv}"
    );
    ensure!(
        qd.is_float() && kd == qd && vd == qd,
        "{OP}: q, k and v must share one float dtype, got {qd:?}, {kd:?}, {vd:?}"
    );
    Ok((n, h, dk, m, hkv, vs[2]))
}

/// Checks a prior state `(o, lse)` (shape, dtype each) against `[N, H, Dv]` f32 and `[N, H]` f32.
pub fn check_prior(
    (os, od): (&[usize], DType),
    (ls, ld): (&[usize], DType),
    (n, h, dv): (usize, usize, usize),
) -> Result<()> {
    ensure!(
        od == DType::F32 && os == [n, h, dv] && ld == DType::F32 && ls == [n, h],
        "attention_varlen: the prior state must be o [{n}, {h}, {dv}] f32 and lse [{n}, {h}] f32, \
         got {os:?} {od:?} and {ls:?} {ld:?}"
    );
    Ok(())
}

/// Uploads a [`VarlenMeta`] (checked against `n` query and `m` key rows) for `b`.
pub fn upload_varlen<B: crate::Backend>(
    b: &B,
    meta: VarlenMeta,
    n: usize,
    m: usize,
) -> Result<DeviceVarlenMeta<B::Tensor>> {
    let up = |v: &[u32]| b.upload(&HostTensor::from_u32(vec![v.len()], v)?);
    let queries = (up(&meta.query_start)?, up(&meta.positions)?);
    upload_varlen_keys(b, meta, queries, n, m)
}

/// [`upload_varlen`] for queries whose `query_start` and `positions` are already on the device
/// (the step's [`crate::DeviceStepMeta`]; they must hold `meta`'s values): only the key ranges
/// travel.
pub fn upload_varlen_keys<B: crate::Backend>(
    b: &B,
    meta: VarlenMeta,
    (query_start, positions): (B::Tensor, B::Tensor),
    n: usize,
    m: usize,
) -> Result<DeviceVarlenMeta<B::Tensor>> {
    meta.check("attention_varlen", n, m)?;
    let up = |v: &[u32]| b.upload(&HostTensor::from_u32(vec![v.len()], v)?);
    Ok(DeviceVarlenMeta {
        query_start,
        key_start: up(&meta.key_start)?,
        key_pos0: up(&meta.key_pos0)?,
        positions,
        host: meta,
    })
}

/// [`crate::Backend::attention_varlen`] computed on the host through [`attention_varlen`]
/// (download, f64, upload): the trait's default, and the fallback of backends for the shapes
/// their kernels do not cover.
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen_on_host<B: crate::Backend>(
    b: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    meta: &DeviceVarlenMeta<B::Tensor>,
    scale: f32,
    prior: Option<(&B::Tensor, &B::Tensor)>,
    final_out: bool,
) -> Result<VarlenResult<B::Tensor>> {
    let (qh, kh, vh) = (b.download(q)?, b.download(k)?, b.download(v)?);
    let prior = match prior {
        Some((o, l)) => Some((b.download(o)?, b.download(l)?)),
        None => None,
    };
    let (n, h, _, _, _, dv) = check_shapes(
        (&qh.shape, qh.dtype),
        (&kh.shape, kh.dtype),
        (&vh.shape, vh.dtype),
    )?;
    let (o, lse) = attention_varlen(
        &qh,
        &kh,
        &vh,
        &meta.host,
        scale,
        prior.as_ref().map(|(o, l)| (o, l)),
    )?;
    Ok(if final_out {
        VarlenResult::Final(b.upload(&HostTensor::from_f32_as(vec![n, h, dv], &o, qh.dtype)?)?)
    } else {
        VarlenResult::State {
            o: b.upload(&HostTensor::from_f32(vec![n, h, dv], &o)?)?,
            lse: b.upload(&HostTensor::from_f32(vec![n, h], &lse)?)?,
        }
    })
}
