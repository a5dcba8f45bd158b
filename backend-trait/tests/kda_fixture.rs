//! `reference::kda` against fla-core 0.6.0's pure-PyTorch KDA (`naive_recurrent_kda` and
//! `naive_chunk_kda`, chunk 64), recorded in `tests/fixtures/kda_ops.json` by
//! `tests/fixtures/gen_kda_ops.py`: per case q, k (already L2-normalised), v, the gate inputs
//! a / A_log / dt_bias (softplus gate, or the lower-bounded one), beta = σ(b), an optional
//! initial state, and both functions' outputs o and final states (flat row-major lists).
//!
//! Our op L2-normalises q and k itself (`x / √(Σx² + 1e−6)`): normalising an already unit vector
//! again changes it by ~5e−7 relative, and b is recovered from the recorded β as `ln(β / (1 − β))`,
//! hence the 1e−4 tolerance (relative to the largest reference value).

use anyhow::{ensure, Context, Result};
use dayone_backend::{conformance::compare, reference, HostTensor, StepMeta};
use serde_json::Value;
use std::path::PathBuf;

const TOL: f32 = 1e-4;

fn floats(v: &Value) -> Result<Vec<f32>> {
    v.as_array()
        .context("expected an array")?
        .iter()
        .map(|x| x.as_f64().map(|f| f as f32).context("expected a number"))
        .collect()
}

#[test]
fn kda_matches_fla_naive() -> Result<()> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/kda_ops.json");
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let cases = j["cases"].as_array().context("cases")?;
    ensure!(!cases.is_empty(), "no cases in {}", path.display());
    let mut lower_bound_cases = 0;
    for case in cases {
        let name = case["name"].as_str().context("name")?;
        let u = |k: &str| case[k].as_u64().map(|x| x as usize).context(k.to_string());
        let (bsz, t, h, k, v) = (u("B")?, u("T")?, u("H")?, u("K")?, u("V")?);
        let n = bsz * t;
        let inp = &case["inputs"];
        let f = |key: &str| floats(&inp[key]).with_context(|| format!("{name}: inputs.{key}"));
        // [B, T, H, X] row-major is [B·T, H, X] with sequence b on rows b·T..(b+1)·T.
        let q = HostTensor::from_f32(vec![n, h, k], &f("q")?)?;
        let kk = HostTensor::from_f32(vec![n, h, k], &f("k")?)?;
        let vv = HostTensor::from_f32(vec![n, h, v], &f("v")?)?;
        let a = HostTensor::from_f32(vec![n, h, k], &f("a")?)?;
        let logit: Vec<f32> = f("beta")?
            .iter()
            .map(|&p| ((p as f64) / (1.0 - p as f64)).ln() as f32)
            .collect();
        let b = HostTensor::from_f32(vec![n, h], &logit)?;
        let a_log = HostTensor::from_f32(vec![h], &f("A_log")?)?;
        let dt_bias = HostTensor::from_f32(vec![h, k], &f("dt_bias")?)?;
        let lower_bound = match case["gate"].as_str().context("gate")? {
            "kda" => None,
            "kda_lowerbound" => {
                lower_bound_cases += 1;
                Some(case["lower_bound"].as_f64().context("lower_bound")? as f32)
            }
            other => anyhow::bail!("{name}: unknown gate {other}"),
        };
        // With an initial state the sequences continue (position 7, not 0), else they start
        // fresh from a zero state; the slot starts with junk that a fresh sequence must ignore.
        let init = &inp["initial_state"];
        let start = if init.is_null() { 0 } else { 7 };
        let state_init = if init.is_null() {
            vec![123.0; bsz * h * k * v]
        } else {
            f("initial_state")?
        };
        let mut state = HostTensor::from_f32(vec![bsz, h, k, v], &state_init)?;
        let mut meta = StepMeta {
            block_size: 1 << 20,
            max_blocks: 1,
            ..Default::default()
        };
        meta.query_start.push(0);
        for s in 0..bsz {
            for p in 0..t {
                meta.positions.push((start + p) as u32);
                meta.token_seq.push(s as u32);
                meta.slot_mapping.push(p as u32);
            }
            meta.block_tables.push(0);
            meta.seq_lens.push((start + t) as u32);
            meta.query_start.push(((s + 1) * t) as u32);
            meta.state_slots.push(s as u32);
        }
        let o = reference::kda(
            &q,
            &kk,
            &vv,
            &a,
            &b,
            &a_log,
            &dt_bias,
            lower_bound,
            &mut state,
            &meta,
        )?;
        for which in ["recurrent", "chunk"] {
            let r = &case[which];
            let want_o = HostTensor::from_f32(vec![n, h, v], &floats(&r["o"])?)?;
            let want_s = HostTensor::from_f32(vec![bsz, h, k, v], &floats(&r["final_state"])?)?;
            let c = format!("{name} vs fla naive_{which}_kda");
            compare("reference::kda o", &c, &o, &want_o, TOL)?;
            compare("reference::kda final state", &c, &state, &want_s, TOL)?;
        }
    }
    ensure!(
        lower_bound_cases > 0,
        "no lower-bound gate case in the fixture"
    );
    Ok(())
}
