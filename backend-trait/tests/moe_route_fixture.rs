//! `reference::moe_route` against the router decisions transformers recorded for the tiny
//! DeepSeek-V3 checkpoint (`tests/fixtures/deepseek_v3_tiny/reference.json`, `gate_cases`: the
//! router input rows of every MoE layer for one prompt, the sigmoid scores, the selected expert
//! ids in ascending order and the final weights aligned with them; 6 significant digits).
//! The gate weight and `e_score_correction_bias` come from the checkpoint, the routing settings
//! from its `config.json`.

use anyhow::{ensure, Context, Result};
use dayone_backend::{reference, DType, HostTensor, MoeRouting};
use serde_json::Value;
use std::path::PathBuf;

fn fixture(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/deepseek_v3_tiny")
        .join(file)
}

fn f32_tensor(st: &safetensors::SafeTensors, name: &str) -> Result<HostTensor> {
    let t = st.tensor(name).with_context(|| format!("tensor {name}"))?;
    ensure!(
        t.dtype() == safetensors::Dtype::F32,
        "{name}: expected f32, got {:?}",
        t.dtype()
    );
    HostTensor::new(t.shape().to_vec(), DType::F32, t.data().to_vec())
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

#[test]
fn moe_route_matches_transformers() -> Result<()> {
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(fixture("config.json"))?)?;
    let refj: Value = serde_json::from_str(&std::fs::read_to_string(fixture("reference.json"))?)?;
    let bytes = std::fs::read(fixture("model.safetensors"))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let u = |k: &str| cfg[k].as_u64().unwrap_or_else(|| panic!("config {k}")) as usize;
    let routing = MoeRouting {
        top_k: u("num_experts_per_tok"),
        n_group: u("n_group"),
        topk_group: u("topk_group"),
        norm_topk_prob: cfg["norm_topk_prob"].as_bool().expect("norm_topk_prob"),
        routed_scaling_factor: cfg["routed_scaling_factor"].as_f64().expect("scaling") as f32,
    };
    let k = routing.top_k;
    let cases = refj["gate_cases"].as_array().expect("gate_cases");
    ensure!(!cases.is_empty(), "no gate_cases in reference.json");
    let mut checked = 0;
    for case in cases {
        let layer = case["layer"].as_u64().expect("layer");
        let gate = f32_tensor(&st, &format!("model.layers.{layer}.mlp.gate.weight"))?;
        let bias = f32_tensor(
            &st,
            &format!("model.layers.{layer}.mlp.gate.e_score_correction_bias"),
        )?;
        let rows = case["input"].as_array().expect("input");
        let d = gate.shape[1];
        let x: Vec<f32> = rows.iter().flat_map(floats).collect();
        let n = rows.len();
        ensure!(
            x.len() == n * d,
            "layer {layer}: input rows must be [{n}, {d}]"
        );
        let x = HostTensor::from_f32(vec![n, d], &x)?;
        let (ids, w) = reference::moe_route(&x, &gate, Some(&bias), &routing)?;
        let (ids, w) = (ids.to_u32()?, w.to_f32());
        let (xv, gv) = (x.to_f32(), gate.to_f32());
        for t in 0..n {
            // transformers lists the chosen experts in ascending id order (torch.topk's order is
            // not part of its contract); ours are in descending choice-score order, so compare
            // the (id, weight) pairs sorted by id.
            let mut got: Vec<(u32, f32)> = (0..k).map(|j| (ids[t * k + j], w[t * k + j])).collect();
            got.sort_by_key(|p| p.0);
            let want_ids: Vec<u32> = case["expert_ids"][t]
                .as_array()
                .expect("expert_ids")
                .iter()
                .map(|v| v.as_u64().expect("id") as u32)
                .collect();
            let want_w = floats(&case["weights"][t]);
            let got_ids: Vec<u32> = got.iter().map(|p| p.0).collect();
            assert_eq!(got_ids, want_ids, "layer {layer} token {t}: expert ids");
            for (j, (&(_, g), &wv)) in got.iter().zip(&want_w).enumerate() {
                assert!(
                    (g - wv).abs() <= 2e-5 * wv.abs().max(1.0),
                    "layer {layer} token {t} slot {j}: weight {g}, transformers {wv}"
                );
            }
            // The recorded sigmoid scores agree with σ(x · gate_wᵀ) too.
            let scores = floats(&case["scores"][t]);
            let xr = &xv[t * d..(t + 1) * d];
            for (i, &sv) in scores.iter().enumerate() {
                let l: f64 = xr
                    .iter()
                    .zip(&gv[i * d..(i + 1) * d])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                let s = 1.0 / (1.0 + (-l).exp());
                assert!(
                    (s as f32 - sv).abs() <= 1e-5,
                    "layer {layer} token {t} expert {i}: sigmoid score {s}, transformers {sv}"
                );
            }
            checked += 1;
        }
    }
    eprintln!("checked {checked} tokens over {} MoE layers", cases.len());
    Ok(())
}
