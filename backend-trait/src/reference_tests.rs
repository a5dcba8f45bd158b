//! Hand-computed cases for [`crate::reference::moe_route`].
//!
//! Every case uses `D = 1`, `x = [[1]]` and `gate_w[i] = ln(p_i / (1 − p_i))`, so that the sigmoid
//! scores are `s_i = p_i` (up to f32 rounding, ~1e-7) and every expected id and weight below can be
//! checked by hand from the listed `p`.

use crate::reference::moe_route;
use crate::{HostTensor, MoeRouting};
use anyhow::Result;

/// Routes one token whose sigmoid scores are `p`; returns (ids, weights).
fn route(p: &[f32], bias: Option<&[f32]>, r: MoeRouting) -> Result<(Vec<u32>, Vec<f32>)> {
    let e = p.len();
    let logits: Vec<f32> = p.iter().map(|&p| (p / (1.0 - p)).ln()).collect();
    let x = HostTensor::from_f32(vec![1, 1], &[1.0])?;
    let w = HostTensor::from_f32(vec![e, 1], &logits)?;
    let b = match bias {
        Some(b) => Some(HostTensor::from_f32(vec![e], b)?),
        None => None,
    };
    let (ids, wts) = moe_route(&x, &w, b.as_ref(), &r)?;
    assert_eq!(ids.shape, [1, r.top_k]);
    assert_eq!(wts.shape, [1, r.top_k]);
    Ok((ids.to_u32()?, wts.to_f32()))
}

fn routing(top_k: usize, n_group: usize, topk_group: usize, norm: bool, scale: f32) -> MoeRouting {
    MoeRouting {
        top_k,
        n_group,
        topk_group,
        norm_topk_prob: norm,
        routed_scaling_factor: scale,
    }
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "got {got:?}, want {want:?}");
    }
}

/// The bias changes which experts are chosen, but the weights are the unbiased scores.
#[test]
fn bias_chooses_but_does_not_weigh() -> Result<()> {
    let p = [0.9, 0.8, 0.7, 0.1];
    // No bias: the two largest are 0 (0.9) and 1 (0.8); normalised 0.9/1.7, 0.8/1.7.
    let (ids, w) = route(&p, None, routing(2, 1, 1, true, 1.0))?;
    assert_eq!(ids, [0, 1]);
    close(&w, &[0.9 / 1.7, 0.8 / 1.7]);
    // Bias 0.85 on expert 3: choice scores [0.9, 0.8, 0.7, 0.95] → 3 then 0.
    // Weights from s = [0.1, 0.9] (sum 1.0): 0.1, 0.9 — not 0.95.
    let bias = [0.0, 0.0, 0.0, 0.85];
    let (ids, w) = route(&p, Some(&bias), routing(2, 1, 1, true, 1.0))?;
    assert_eq!(ids, [3, 0]);
    close(&w, &[0.1, 0.9]);
    // Without normalisation: p = [0.7, 0.8, 0.6, 0.1], bias on 3 → choice [0.7, 0.8, 0.6, 0.95]
    // → 3, 1; weights are the raw s = 0.1, 0.8.
    let (ids, w) = route(
        &[0.7, 0.8, 0.6, 0.1],
        Some(&bias),
        routing(2, 1, 1, false, 1.0),
    )?;
    assert_eq!(ids, [3, 1]);
    close(&w, &[0.1, 0.8]);
    Ok(())
}

/// Group score = sum of the two largest choice scores per group; experts of dropped groups get −∞
/// (even the one with the largest raw score).
#[test]
fn group_limit_masks_dropped_groups() -> Result<()> {
    // 3 groups of 3:
    //   group 0: [0.95, 0.2, 0.1] → top-2 sum 1.15 (max 0.95, full sum 1.25)
    //   group 1: [0.7, 0.6, 0.1]  → top-2 sum 1.30 (max 0.70, full sum 1.40)
    //   group 2: [0.5, 0.5, 0.5]  → top-2 sum 1.00 (max 0.50, full sum 1.50)
    // topk_group 1 keeps group 1 only (by max it would be group 0, by full sum group 2).
    let p = [0.95, 0.2, 0.1, 0.7, 0.6, 0.1, 0.5, 0.5, 0.5];
    let (ids, w) = route(&p, None, routing(2, 3, 1, true, 1.0))?;
    // Expert 0 (0.95, the largest raw score) is in the dropped group 0.
    assert_eq!(ids, [3, 4]);
    close(&w, &[0.7 / 1.3, 0.6 / 1.3]);
    // topk_group 2 keeps groups 1 and 0 (1.30, 1.15): top-4 of [0.95, 0.2, 0.1, 0.7, 0.6, 0.1]
    // → 0, 3, 4, 1; group 2's 0.5s are masked although 0.5 > 0.2.
    let (ids, w) = route(&p, None, routing(4, 3, 2, false, 1.0))?;
    assert_eq!(ids, [0, 3, 4, 1]);
    close(&w, &[0.95, 0.7, 0.6, 0.2]);
    // A bias on expert 8 lifts group 2 to top-2 sum 0.5 + 0.9 = 1.4 > 1.3: group 2 is kept and
    // expert 8 (choice 0.9) comes first, then 6 (0.5, lower index than 7); weights unbiased:
    // s = 0.5, 0.5 → normalised 0.5, 0.5, times 2.5 → 1.25, 1.25.
    let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.4];
    let (ids, w) = route(&p, Some(&bias), routing(2, 3, 1, true, 2.5))?;
    assert_eq!(ids, [8, 6]);
    close(&w, &[1.25, 1.25]);
    Ok(())
}

/// `norm_topk_prob` divides by the sum of the chosen unbiased scores; the scaling factor applies
/// in both cases.
#[test]
fn renormalisation_and_scaling() -> Result<()> {
    let p = [0.2, 0.6, 0.4, 0.8];
    // Top 3: 3 (0.8), 1 (0.6), 2 (0.4).
    let (ids, w) = route(&p, None, routing(3, 1, 1, false, 2.5))?;
    assert_eq!(ids, [3, 1, 2]);
    close(&w, &[2.0, 1.5, 1.0]); // 2.5 · s
    let (ids, w) = route(&p, None, routing(3, 1, 1, true, 2.5))?;
    assert_eq!(ids, [3, 1, 2]);
    // 2.5 · s / 1.8
    close(&w, &[2.5 * 0.8 / 1.8, 2.5 * 0.6 / 1.8, 2.5 * 0.4 / 1.8]);
    // top_k = 1 with normalisation: the weight is exactly the scaling factor.
    let (ids, w) = route(&p, None, routing(1, 1, 1, true, 2.5))?;
    assert_eq!(ids, [3]);
    close(&w, &[2.5]);
    Ok(())
}

/// Equal choice scores: the lower expert index first; equal group scores: the lower group.
#[test]
fn ties_prefer_lower_index() -> Result<()> {
    // Identical logits give bit-identical scores.
    let p = [0.5, 0.75, 0.5, 0.75, 0.5];
    let (ids, w) = route(&p, None, routing(3, 1, 1, false, 1.0))?;
    assert_eq!(ids, [1, 3, 0]);
    close(&w, &[0.75, 0.75, 0.5]);
    // Groups of 2: [0.5, 0.75] [0.75, 0.5] [0.25, 0.25] → sums 1.25, 1.25, 0.5: tie between groups
    // 0 and 1, topk_group 1 keeps group 0 → 1, 0.
    let p = [0.5, 0.75, 0.75, 0.5, 0.25, 0.25];
    let (ids, _) = route(&p, None, routing(2, 3, 1, true, 1.0))?;
    assert_eq!(ids, [1, 0]);
    // All masked experts (−∞) tie too: top_k larger than the kept experts takes the dropped ones
    // in index order after the kept ones.
    let (ids, _) = route(&p, None, routing(3, 3, 1, true, 1.0))?;
    assert_eq!(ids, [1, 0, 2]);
    Ok(())
}
