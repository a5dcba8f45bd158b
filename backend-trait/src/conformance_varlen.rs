//! Conformance of [`Backend::attention_varlen`] against [`crate::varlen::attention_varlen`]:
//! several sequences (one without keys in the segment, one whose segment starts past position
//! 0), grouped-query heads, causal and not, tiles of queries and keys cut anywhere, and a
//! context split into two segments whose states merge (the expanded MLA prefill's pattern).

use crate::conformance::{compare, rand_tensor, tolerance, Rng};
use crate::varlen::{attention_varlen, upload_varlen, VarlenMeta};
use crate::{Backend, DType, HostTensor, VarlenResult};
use anyhow::{Context, Result};

/// One sequence of a case: query positions `q0 .. q0 + nq`, keys at positions `k0 .. k1`.
struct Seq {
    q0: u32,
    nq: u32,
    k0: u32,
    k1: u32,
}

const fn seq(q0: u32, nq: u32, k0: u32, k1: u32) -> Seq {
    Seq { q0, nq, k0, k1 }
}

/// Head dims to check: the ones the backend runs natively, else a small odd pair (host default).
fn dims<B: Backend>(b: &B, dt: DType) -> Vec<(usize, usize)> {
    let native: Vec<_> = [(64, 64), (128, 128), (192, 128), (256, 256)]
        .into_iter()
        .filter(|&(k, v)| b.attention_varlen_native(dt, k, v))
        .collect();
    if native.is_empty() {
        vec![(24, 16)]
    } else {
        native
    }
}

fn layout(seqs: &[Seq], causal: bool) -> VarlenMeta {
    let mut m = VarlenMeta {
        query_start: vec![0],
        key_start: vec![0],
        causal,
        ..Default::default()
    };
    for s in seqs {
        m.positions.extend(s.q0..s.q0 + s.nq);
        m.query_start.push(m.positions.len() as u32);
        m.key_start
            .push(m.key_start.last().unwrap() + (s.k1 - s.k0));
        m.key_pos0.push(s.k0);
    }
    m
}

/// `-∞` (a row that saw no key) as a large finite value, so that `compare` can judge it.
fn finite_lse(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| if x == f32::NEG_INFINITY { -1e30 } else { x })
        .collect()
}

/// Runs the varlen checks in every activation dtype of the backend.
pub fn check_attention_varlen<B: Backend>(b: &B) -> Result<()> {
    for dt in crate::conformance::activation_dtypes(b) {
        for (dk, dv) in dims(b, dt) {
            check_case(b, dt, dk, dv).with_context(|| format!("{dt} hd_k {dk} hd_v {dv}"))?;
        }
    }
    Ok(())
}

/// The same checks at the given `(Dk, Dv)` pairs, for a backend whose device kernel serves
/// head dims it does not report as native (e.g. WGSL's, used by the vision encoders).
pub fn check_attention_varlen_dims<B: Backend>(b: &B, dims: &[(usize, usize)]) -> Result<()> {
    for dt in crate::conformance::activation_dtypes(b) {
        for &(dk, dv) in dims {
            check_case(b, dt, dk, dv).with_context(|| format!("{dt} hd_k {dk} hd_v {dv}"))?;
        }
    }
    Ok(())
}

fn check_case<B: Backend>(b: &B, dt: DType, dk: usize, dv: usize) -> Result<()> {
    const OP: &str = "attention_varlen";
    let mut rng = Rng::new(0x7a11 + dk as u64);
    let (h, hkv) = (4usize, 2usize);
    let scale = 1.0 / (dk as f32).sqrt();
    // Whole contexts: seq 0 has 200 queries at 100..300 over keys 0..300; seq 1 five queries at
    // 50..55 and no key in this call; seq 2 70 queries at 1000..1070 over keys 900..1070.
    let seqs = [
        seq(100, 200, 0, 300),
        seq(50, 5, 0, 0),
        seq(1000, 70, 900, 1070),
    ];
    let n: usize = seqs.iter().map(|s| s.nq as usize).sum();
    let m: usize = seqs.iter().map(|s| (s.k1 - s.k0) as usize).sum();
    let q = rand_tensor(&mut rng, &[n, h, dk], dt, 1.0)?;
    let k = rand_tensor(&mut rng, &[m, hkv, dk], dt, 1.0)?;
    let v = rand_tensor(&mut rng, &[m, hkv, dv], dt, 1.0)?;
    let (qd, kd, vd) = (b.upload(&q)?, b.upload(&k)?, b.upload(&v)?);
    let tol = tolerance(dt);
    for causal in [true, false] {
        let lay = layout(&seqs, causal);
        let (want_o, want_lse) = attention_varlen(&q, &k, &v, &lay, scale, None)?;
        let want = HostTensor::from_f32_as(vec![n, h, dv], &want_o, dt)?;
        let dm = upload_varlen(b, lay, n, m)?;
        let case = format!("one segment, causal {causal}");
        match b.attention_varlen(&qd, &kd, &vd, &dm, scale, None, true)? {
            VarlenResult::Final(o) => compare(OP, &case, &b.download(&o)?, &want, tol)?,
            VarlenResult::State { .. } => anyhow::bail!("{OP} [{case}]: asked for the output"),
        }
        let VarlenResult::State { o, lse } =
            b.attention_varlen(&qd, &kd, &vd, &dm, scale, None, false)?
        else {
            anyhow::bail!("{OP} [{case}]: asked for the state");
        };
        let want_o32 = HostTensor::from_f32(vec![n, h, dv], &want_o)?;
        compare(
            OP,
            &format!("{case}, state o"),
            &b.download(&o)?,
            &want_o32,
            tol,
        )?;
        let got_lse = b.download(&lse)?.to_f32();
        compare(
            OP,
            &format!("{case}, state lse"),
            &HostTensor::from_f32(vec![n, h], &finite_lse(&got_lse))?,
            &HostTensor::from_f32(vec![n, h], &finite_lse(&want_lse))?,
            tol,
        )?;
    }
    // Two segments (keys cut at 130 of seq 0 and 950 of seq 2; seq 1 keyless in both): the
    // first's state continued by the second equals the one-segment result.
    let halves = [
        [
            seq(100, 200, 0, 130),
            seq(50, 5, 0, 0),
            seq(1000, 70, 900, 950),
        ],
        [
            seq(100, 200, 130, 300),
            seq(50, 5, 0, 0),
            seq(1000, 70, 950, 1070),
        ],
    ];
    let rows = |s: &[Seq; 3]| -> Vec<usize> {
        // Key rows of the whole-context tensor that segment `s` holds, in segment order.
        let mut base = 0usize;
        let mut out = Vec::new();
        for (part, whole) in s.iter().zip(&seqs) {
            out.extend((part.k0..part.k1).map(|p| base + (p - whole.k0) as usize));
            base += (whole.k1 - whole.k0) as usize;
        }
        out
    };
    let pick = |t: &HostTensor, r: &[usize]| -> Result<HostTensor> {
        let w = t.shape[1] * t.shape[2];
        let f = t.to_f32();
        let vals: Vec<f32> = r
            .iter()
            .flat_map(|&i| f[i * w..(i + 1) * w].iter().copied())
            .collect();
        HostTensor::from_f32_as(vec![r.len(), t.shape[1], t.shape[2]], &vals, t.dtype)
    };
    let lay = layout(&seqs, true);
    let (want_o, _) = attention_varlen(&q, &k, &v, &lay, scale, None)?;
    let want = HostTensor::from_f32_as(vec![n, h, dv], &want_o, dt)?;
    let mut state = None;
    for (i, half) in halves.iter().enumerate() {
        let r = rows(half);
        let (kh, vh) = (pick(&k, &r)?, pick(&v, &r)?);
        let dm = upload_varlen(b, layout(half, true), n, r.len())?;
        let prior = state.as_ref().map(|(o, l)| (o, l));
        match b.attention_varlen(
            &qd,
            &b.upload(&kh)?,
            &b.upload(&vh)?,
            &dm,
            scale,
            prior,
            i == 1,
        )? {
            VarlenResult::State { o, lse } => state = Some((o, lse)),
            VarlenResult::Final(o) => {
                compare(OP, "two segments merged", &b.download(&o)?, &want, tol)?
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The host default passes (a check of the checks: layouts, segment rows, the merge).
    #[test]
    fn cpu_attention_varlen() {
        super::check_attention_varlen(&crate::cpu::CpuBackend).unwrap();
    }
}
