//! Shared helpers for the cross-crate tests: fixture paths, reference files, comparisons, and
//! a macro that runs one test body on every backend (candle's `test_device!` idea).

use anyhow::{bail, Context, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::loader;
use dayone_engine::sampling::SamplingParams;
use dayone_engine::{Engine, EngineConfig};
use serde::Deserialize;
use std::path::PathBuf;

/// `tests/fixtures/<name>` (`$DAYONE_FIXTURES/<name>` when set, for test binaries run elsewhere).
pub fn fixture(name: &str) -> PathBuf {
    match std::env::var_os("DAYONE_FIXTURES") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name),
    }
}

/// The WGSL backend; CI installs lavapipe, so its absence is a failure, not a skip.
pub fn wgsl() -> dayone_wgsl::WgslBackend {
    dayone_wgsl::WgslBackend::new()
        .expect("WGSL backend unavailable (install mesa-vulkan-drivers for lavapipe)")
}

/// The CUDA backend on device 0 (only called when `dayone_cuda::is_available()`).
pub fn cuda() -> dayone_cuda::CudaBackend {
    dayone_cuda::CudaBackend::new(0).expect("CUDA backend")
}

/// Runs a generic test body once per backend (`cpu` reference, `wgsl`, `cuda`); the body gets a
/// factory `Fn() -> B` so it can make several engines.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident => $body:expr;)*) => {
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;
                #[test]
                fn cpu() {
                    ($body)(|| dayone_backend::cpu::CpuBackend).unwrap();
                }
                #[test]
                fn wgsl() {
                    ($body)(dayone_tests::wgsl).unwrap();
                }
                #[test]
                fn cuda() {
                    // Runs on the GPU machine; CI has no GPU and says so.
                    if !dayone_cuda::is_available() {
                        eprintln!("skipped: no CUDA driver or device");
                        return;
                    }
                    ($body)(dayone_tests::cuda).unwrap();
                }
            }
        )*
    };
}

/// One recorded reference case.
#[derive(Deserialize, Debug, Clone)]
pub struct Case {
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Outputs recorded in float32.
    pub float32: DtypeCase,
    /// Outputs recorded in bfloat16.
    pub bfloat16: DtypeCase,
}

/// What the reference produced in one dtype.
#[derive(Deserialize, Debug, Clone)]
pub struct DtypeCase {
    /// Greedy continuation (8 tokens).
    pub greedy_ids: Vec<u32>,
    /// Logits after the prefill, then after each decode step.
    pub logits: Vec<Vec<f32>>,
    /// Top-1 minus top-2 logit at each step (near-ties make greedy comparisons fragile).
    #[serde(default)]
    pub top2_margin: Vec<f32>,
    /// MoE fixtures, float32 only: per logits row (step 0 = the prompt, step i = decode step i)
    /// the smallest over layers and over that step's new tokens of the router's relative top-k
    /// gap `(l_(k) − l_(k+1)) / max_j |l_j|` (l = one token's router logits, k = experts per
    /// token), recorded by transformers itself. Empty where the fixture has none.
    #[serde(default)]
    pub router_margin: Vec<f32>,
}

/// A bf16 routing near-tie: a step whose recorded float32 router margin (see
/// [`DtypeCase::router_margin`]) is below 2⁻⁶ = 1/64. bf16 keeps 8 significant bits (unit
/// roundoff 2⁻⁹): rounding the two router logits of the pair alone moves their gap by up to
/// 2⁻⁸·max|l|, and the router input carries the rounding of every earlier bf16 op (transformers'
/// own bf16 run of gpt_oss_tiny deviates from its f32 router logits by 0.5–5 % of max|l|), so a
/// gap below a few times 2⁻⁸ can flip which expert is chosen — a legitimate divergence, not an
/// error. 1/64 is 2⁻⁷ · 2, the smallest "a few"; it is not fitted to any fixture.
pub const ROUTER_NEAR_TIE: f32 = 1.0 / 64.0;

/// A fixture's `reference.json`.
#[derive(Deserialize, Debug)]
pub struct Reference {
    /// Prompts and outputs.
    pub cases: Vec<Case>,
}

/// Reads `tests/fixtures/<name>/reference.json`.
pub fn reference(name: &str) -> Result<Reference> {
    let p = fixture(name).join("reference.json");
    let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&s).with_context(|| format!("parsing {}", p.display()))
}

/// Relative error of a vector: `‖a − b‖₂ / ‖b‖₂` (b is the reference).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n.max(1e-300)).sqrt()
}

/// The field's tolerance for a dtype: f32 1e-4, bf16 2e-2 (relative).
pub fn tolerance(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        1e-4
    } else {
        2e-2
    }
}

/// The reference's own bf16-vs-f32 logits error on a case (largest over the steps where its two
/// greedy paths still agree).
pub fn own_bf16_error(case: &Case) -> f64 {
    let (f, b) = (&case.float32, &case.bfloat16);
    let agree = f
        .greedy_ids
        .iter()
        .zip(&b.greedy_ids)
        .take_while(|(x, y)| x == y)
        .count();
    (0..=agree.min(f.logits.len() - 1))
        .map(|i| rel_err(&b.logits[i], &f.logits[i]))
        .fold(0.0, f64::max)
}

/// An engine over a fixture checkpoint.
pub fn engine<B: Backend>(b: B, name: &str, cfg: EngineConfig) -> Result<Engine<B>> {
    let ckpt = loader::open(&fixture(name))?;
    Engine::new(b, &ckpt, &cfg, None)
}

/// Greedy params that ignore EOS.
pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

/// Runs each reference prompt alone through prefill + decode with logits captured, and checks
/// every logits row against the reference's float32 run within the dtype's tolerance, and the
/// greedy tokens.
///
/// The float32 run is the ground truth for both dtypes: transformers' own bf16 run is itself up
/// to 3e-2 away from it on these random-weight models (its activations are rounded at every op),
/// so comparing two bf16 computations with each other would measure two rounding patterns, not
/// correctness. The bf16 tolerance is the field's 2e-2, widened to 1.5× the reference's own
/// bf16-vs-f32 error on that prompt where the reference itself is further off. In bf16 a near-tie may flip the greedy token; the logits of that step must still
/// be within tolerance, and the comparison of that prompt stops there, since later steps continue
/// from a different token.
///
/// MoE routing near-ties (bf16 only): where the reference records `float32.router_margin`, a
/// step whose margin is below [`ROUTER_NEAR_TIE`] may legitimately route a token of that step
/// to another expert in bf16, which can change that step's logits by far more than the tolerance
/// (0.1–0.6 relative in gpt_oss_tiny, measured by forcing single flips in transformers' f32 model)
/// and later steps' through the KV cache. Such steps are still compared; a logits miss at or
/// after the first near-tie of a prompt ends that prompt's comparison (a line on stderr names
/// the case, step and error) instead of failing, and a bf16 run ends with a line saying how many
/// logits rows were compared. A miss before any near-tie fails; float32 runs compare every step;
/// fixtures without the field are compared as before.
pub fn check_golden<B: Backend>(b: B, name: &str, dtype: DType) -> Result<()> {
    check_golden_with(
        b,
        name,
        EngineConfig {
            dtype,
            kv_cache_tokens: Some(2048),
            ..Default::default()
        },
    )
}

/// [`check_golden`] with the engine settings `cfg` (its dtype is the run's).
pub fn check_golden_with<B: Backend>(b: B, name: &str, cfg: EngineConfig) -> Result<()> {
    check_golden_dir(b, name, &fixture(name), cfg)
}

/// [`check_golden_with`] on the checkpoint in `dir` (a rewritten copy of fixture `name`, e.g.
/// stored in another dtype) against `name`'s reference.
pub fn check_golden_dir<B: Backend>(
    b: B,
    name: &str,
    dir: &std::path::Path,
    cfg: EngineConfig,
) -> Result<()> {
    let dtype = cfg.dtype;
    let r = reference(name)?;
    let mut e = Engine::new(b, &loader::open(dir)?, &cfg, None)?;
    e.capture_logits = true;
    let tol = tolerance(dtype);
    let (mut compared, mut total) = (0usize, 0usize);
    for (ci, case) in r.cases.iter().enumerate() {
        let want = &case.float32;
        let tol = if dtype == DType::F32 {
            tol
        } else {
            tol.max(1.5 * own_bf16_error(case))
        };
        e.add_request(case.prompt_ids.clone(), greedy(want.logits.len()))?;
        total += want.logits.len();
        let mut step = 0;
        let (mut diverged, mut past_near_tie) = (false, false);
        while e.has_unfinished() {
            let events = e.step()?;
            if events.is_empty() || diverged {
                continue; // a prefill chunk without a sampled token, or past a bf16 near-tie (greedy or routing)
            }
            // A bf16 step at or after a routing near-tie of this prompt may have routed a token
            // to another expert: a miss there ends this prompt's comparison instead of failing.
            let near_tie = dtype != DType::F32
                && want
                    .router_margin
                    .get(step)
                    .is_some_and(|&m| m < ROUTER_NEAR_TIE);
            past_near_tie |= near_tie;
            let (_, logits) = &e.last_logits[0];
            let err = rel_err(logits, &want.logits[step]);
            if err > tol {
                if !past_near_tie {
                    bail!("{name} {dtype} case {ci} step {step}: logits relative error {err:.3e} > {tol:.0e}");
                }
                eprintln!(
                    "{name} {dtype} case {ci} step {step}: logits relative error {err:.3e} > {tol:.0e} \
                     at or after a router near-tie (f32 router margin below {ROUTER_NEAR_TIE:.2e}); \
                     comparison of this prompt stops here"
                );
                diverged = true;
                continue;
            }
            compared += 1;
            if let Some(&want_id) = want.greedy_ids.get(step) {
                if events[0].token != want_id {
                    if dtype == DType::F32 {
                        bail!("{name} {dtype} case {ci} step {step}: greedy token {} != reference {want_id}", events[0].token);
                    }
                    diverged = true;
                }
            }
            step += 1;
        }
    }
    if dtype != DType::F32 && r.cases.iter().any(|c| !c.float32.router_margin.is_empty()) {
        eprintln!(
            "{name} {dtype}: {compared} of {total} logits rows compared (the rest after a near-tie)"
        );
    }
    Ok(())
}
