//! `dayone check`: the same prompts on several backends (and against recorded reference
//! activations), per-layer max abs / relative differences, logits, greedy-token agreement.
//!
//! The judging rule is the golden tests' (`tests/lib.rs`, `check_golden`): the reference's
//! float32 run is the ground truth for both dtypes; f32 must be within 1e-4 (relative), bf16
//! within max(2e-2, 1.5 × the reference's own bf16-vs-f32 error on that prompt), since
//! transformers' own bf16 run is itself that far from its float32 run. In bf16 a near-tie may flip
//! a greedy token: that step's logits must still be within tolerance, and the comparison of that
//! prompt stops there, since later steps continue from a different token.

use crate::backend_choice::{self, BackendArg, BackendKind};
use crate::engine_args::{CommandDefaults, EngineArgs};
use crate::load;
use crate::usage::usage;
use crate::{outln, parse, with_backend};
use anyhow::{bail, Context, Result};
use clap::Args;
use dayone_backend::{Backend, DType};
use dayone_engine::loader::Checkpoint;
use dayone_engine::sampling::SamplingParams;
use dayone_engine::service::{Request, StreamEvent};
use dayone_engine::{prompt, EngineConfig};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Flags of `dayone check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The engine flags (model, dtype [default: f32 here], cache, --config FILE); the backends
    /// are --backends.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Comma-separated backends to run, each once (wgsl, cuda, cpu, auto); default: the config
    /// file's `runtime.backend`, else auto. One backend and no --reference: it is compared with
    /// the CPU reference backend.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub backends: Vec<BackendArg>,
    /// Reference outputs whose prompts are used: a `reference.json` of `tests/fixtures/gen_*.py`
    /// (`cases[]`: `prompt_ids` and `float32`/`bfloat16` hidden states, logits, greedy ids) or
    /// `smollm2_reference.json` (`prompts[].raw`/`.chat`: `prompt_ids`, `greedy_ids`).
    #[arg(long, conflicts_with_all = ["prompt", "prompt_ids"])]
    pub reference: Option<PathBuf>,
    /// Prompt text (when no reference is given).
    #[arg(
        long,
        default_value = "The capital of France is",
        conflicts_with = "prompt_ids"
    )]
    pub prompt: String,
    /// Prompt token ids instead of text, comma-separated.
    #[arg(long)]
    pub prompt_ids: Option<String>,
    /// Greedy tokens generated per prompt for the agreement check.
    #[arg(long, default_value_t = 16, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub tokens: usize,
    /// Relative tolerance, a finite number > 0 (default: 1e-4 for f32; for bf16 max(2e-2, 1.5 ×
    /// the reference's own bf16-vs-f32 error), the golden tests' rule).
    #[arg(long, value_parser = parse::positive_finite, allow_negative_numbers = true)]
    pub tolerance: Option<f64>,
}

/// What a reference recorded in one dtype.
#[derive(Default)]
struct RefRun {
    /// Last-token hidden state per layer (HF `hidden_states` order).
    hidden: Option<Vec<Vec<f32>>>,
    /// Logits after the prefill, then after each decode step.
    logits: Vec<Vec<f32>>,
    /// Greedy continuation.
    greedy: Option<Vec<u32>>,
}

/// One reference prompt.
struct RefCase {
    /// Where it came from in the file (`cases[0]`, `prompts[2].chat`).
    label: String,
    prompt_ids: Vec<u32>,
    float32: RefRun,
    bfloat16: Option<RefRun>,
}

/// Reads `key` of `v` as a `T`; `Ok(None)` when absent, an error naming file and field when it
/// has the wrong shape.
fn field<T: DeserializeOwned>(v: &Value, key: &str, at: &str, file: &Path) -> Result<Option<T>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => serde_json::from_value(x.clone())
            .map(Some)
            .with_context(|| {
                format!(
                    "{}: {at}.{key} has the wrong type (expected numbers or lists of numbers)",
                    file.display()
                )
            }),
    }
}

fn ref_run(v: &Value, at: &str, file: &Path) -> Result<RefRun> {
    Ok(RefRun {
        hidden: field(v, "hidden_states", at, file)?,
        logits: field(v, "logits", at, file)?.unwrap_or_default(),
        greedy: field(v, "greedy_ids", at, file)?,
    })
}

/// Reads a reference file in either layout; refuses one it cannot use. Returns the cases and
/// the whole file (for [`reference_mismatch`]).
fn load_reference(file: &Path) -> Result<(Vec<RefCase>, Value)> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let r: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", file.display()))?;
    let expected = "expected `cases[]` with `prompt_ids` and `float32` outputs (tests/fixtures/*/reference.json) or `prompts[]` with `raw`/`chat` `prompt_ids` + `greedy_ids` (smollm2_reference.json)";
    let mut out = Vec::new();
    if let Some(cases) = r.get("cases") {
        let Some(cases) = cases.as_array() else {
            bail!("{}: `cases` is not a list: {expected}", file.display());
        };
        for (i, c) in cases.iter().enumerate() {
            let at = format!("cases[{i}]");
            let Some(prompt_ids) = field::<Vec<u32>>(c, "prompt_ids", &at, file)? else {
                bail!("{}: {at} has no `prompt_ids`: {expected}", file.display());
            };
            let Some(f) = c.get("float32") else {
                bail!(
                    "{}: {at} has no `float32` outputs (the ground truth for both dtypes): {expected}",
                    file.display()
                );
            };
            let float32 = ref_run(f, &format!("{at}.float32"), file)?;
            let bfloat16 = c
                .get("bfloat16")
                .map(|b| ref_run(b, &format!("{at}.bfloat16"), file))
                .transpose()?;
            out.push(RefCase {
                label: at,
                prompt_ids,
                float32,
                bfloat16,
            });
        }
    } else if let Some(prompts) = r.get("prompts") {
        let Some(prompts) = prompts.as_array() else {
            bail!("{}: `prompts` is not a list: {expected}", file.display());
        };
        for (i, p) in prompts.iter().enumerate() {
            for kind in ["raw", "chat"] {
                let Some(v) = p.get(kind) else { continue };
                let at = format!("prompts[{i}].{kind}");
                let ids = field::<Vec<u32>>(v, "prompt_ids", &at, file)?;
                let greedy = field::<Vec<u32>>(v, "greedy_ids", &at, file)?;
                let (Some(prompt_ids), Some(greedy)) = (ids, greedy) else {
                    bail!(
                        "{}: {at} needs both `prompt_ids` and `greedy_ids`",
                        file.display()
                    );
                };
                out.push(RefCase {
                    label: at,
                    prompt_ids,
                    float32: RefRun {
                        greedy: Some(greedy),
                        ..Default::default()
                    },
                    bfloat16: None,
                });
            }
        }
    } else {
        bail!(
            "{}: no `cases` or `prompts` key: {expected}",
            file.display()
        );
    }
    if out.is_empty() {
        bail!("{}: no prompts in it: {expected}", file.display());
    }
    Ok((out, r))
}

/// Why a reference was not recorded from this model, if it visibly was not: its recorded config
/// (`config` of `gen_*.py`, `model_config` of `gen_smollm2.py`) names another architecture or
/// shape, or its prompts, hidden states or logits have shapes this model cannot produce.
fn reference_mismatch(raw: &Value, cases: &[RefCase], model: &Value) -> Vec<String> {
    let mut why = Vec::new();
    let recorded = raw.get("config").or_else(|| raw.get("model_config"));
    for key in [
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "vocab_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "kv_lora_rank",
    ] {
        let (Some(r), Some(m)) = (recorded.and_then(|c| c.get(key)), model.get(key)) else {
            continue;
        };
        if !r.is_null() && !m.is_null() && r != m {
            why.push(format!("{key} {r} in the reference, {m} in the model"));
        }
    }
    let num = |k: &str| model.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let (vocab, hidden, layers) = (
        num("vocab_size"),
        num("hidden_size"),
        num("num_hidden_layers"),
    );
    for c in cases {
        if let Some(v) = vocab {
            if let Some(&bad) = c.prompt_ids.iter().find(|&&t| t as usize >= v) {
                why.push(format!(
                    "{}: prompt id {bad} is outside the model's vocabulary of {v}",
                    c.label
                ));
            }
            if let Some(l) = c.float32.logits.first().filter(|l| l.len() != v) {
                why.push(format!(
                    "{}: {} logits per step, the model has {v}",
                    c.label,
                    l.len()
                ));
            }
        }
        if let Some(h) = &c.float32.hidden {
            if let Some(n) = layers.filter(|&n| h.len() != n + 1) {
                why.push(format!(
                    "{}: hidden states of {} layers (+ embedding), the model has {n}",
                    c.label,
                    h.len().saturating_sub(1)
                ));
            }
            if let Some(d) = hidden.filter(|&d| h.first().is_some_and(|x| x.len() != d)) {
                why.push(format!(
                    "{}: hidden states {} wide, the model's hidden_size is {d}",
                    c.label,
                    h[0].len()
                ));
            }
        }
        if why.len() >= 4 {
            break;
        }
    }
    why
}

/// The reference's own bf16-vs-f32 logits error on a case (largest over the steps where its two
/// greedy paths still agree): `own_bf16_error` of `tests/lib.rs`. 0 without bf16 outputs.
fn own_bf16_error(case: &RefCase) -> f64 {
    let (f, Some(b)) = (&case.float32, &case.bfloat16) else {
        return 0.0;
    };
    let (Some(fg), Some(bg)) = (&f.greedy, &b.greedy) else {
        return 0.0;
    };
    let agree = fg.iter().zip(bg).take_while(|(x, y)| x == y).count();
    let steps = f.logits.len().min(b.logits.len());
    (0..steps.min(agree + 1))
        .map(|i| diff(&b.logits[i], &f.logits[i]).1)
        .fold(0.0, f64::max)
}

/// What one backend produced for one prompt.
struct Run {
    name: String,
    /// Per layer (HF `hidden_states` order), `[N, D]` f32.
    hidden: Vec<Vec<f32>>,
    /// Logits after the prefill, then after each decode step.
    logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

/// Runs every prompt on backend `kind`, behind an engine handle as under `dayone serve`: a
/// traced prefill (hidden states per layer), then greedy decoding with each step's logits
/// ([`Request::return_logits`]).
fn run_backend(
    kind: BackendKind,
    ckpt: &Checkpoint,
    cfg: &EngineConfig,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> Result<Vec<Run>> {
    // The engine thread owns its checkpoint: the same file, opened again (the weights are
    // read from it as they load).
    let own = dayone_engine::loader::open(&ckpt.path)?;
    let handle = load::service(kind, own, cfg.clone(), true)?;
    let name = kind.name().to_string();
    let mut runs = Vec::new();
    for p in prompts {
        let (hidden, _) = handle.trace_prefill(p.clone())?;
        let request = Request {
            return_logits: true,
            ..Request::new(
                p.clone(),
                SamplingParams {
                    max_tokens: tokens,
                    ignore_eos: true,
                    ..Default::default()
                },
            )
        };
        let mut logits = Vec::new();
        let mut greedy = Vec::new();
        for event in handle.submit(request)? {
            match event {
                StreamEvent::Token {
                    token,
                    logits: Some(row),
                    ..
                } => {
                    greedy.push(token);
                    logits.push(Arc::unwrap_or_clone(row));
                }
                StreamEvent::Error(msg) => bail!(msg),
                _ => {}
            }
        }
        runs.push(Run {
            name: name.clone(),
            hidden: hidden.iter().map(|h| h.to_f32()).collect(),
            logits,
            greedy,
        });
    }
    handle.shutdown(Duration::from_secs(1));
    Ok(runs)
}

/// Max |a − b| and the relative error `‖a − b‖₂ / ‖b‖₂` (b is the reference side).
fn diff(a: &[f32], b: &[f32]) -> (f64, f64) {
    let max_abs = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max);
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (max_abs, (d / n.max(1e-300)).sqrt())
}

/// Largest error-to-tolerance ratio seen, and what failed.
#[derive(Default)]
struct Verdict {
    worst: f64,
    worst_tol: f64,
    worst_ratio: f64,
    failures: Vec<String>,
}

impl Verdict {
    /// Records a relative error against its tolerance; returns whether it passed.
    fn judge(&mut self, err: f64, tol: f64, what: impl FnOnce() -> String) -> bool {
        let ratio = err / tol;
        if ratio > self.worst_ratio || self.worst_tol == 0.0 {
            (self.worst, self.worst_tol, self.worst_ratio) = (err, tol, ratio);
        }
        if err > tol || err.is_nan() {
            self.failures
                .push(format!("{} {err:.3e} > {tol:.2e}", what()));
            return false;
        }
        true
    }
}

fn fmt(x: Option<(f64, f64)>) -> String {
    x.map(|(a, r)| format!("{a:.3e} / {r:.3e}"))
        .unwrap_or_else(|| "-".into())
}

/// Runs `dayone check`.
pub fn run(a: CheckArgs) -> Result<()> {
    if a.engine.backend.is_some() {
        return Err(usage(
            "check runs the backends of --backends (e.g. --backends wgsl,cpu): drop --backend",
        ));
    }
    // f32 unless a flag or the config file names a dtype; without --backends the file's
    // `runtime.backend` (else auto) is the backend to check.
    let resolved = a.engine.resolve(&CommandDefaults {
        dtype: Some(DType::F32),
        ..Default::default()
    })?;
    let cfg = resolved.engine;
    let dtype = cfg.dtype;
    let mut kinds = if a.backends.is_empty() {
        vec![resolved.backend]
    } else {
        backend_choice::resolve_list(&a.backends).map_err(|e| usage(format!("{e:#}")))?
    };
    if kinds.len() == 1 && a.reference.is_none() {
        if kinds[0] == BackendKind::Cpu {
            return Err(usage(
                "nothing to compare: the only backend to check is the CPU reference (from --backends or the config's runtime.backend) and no --reference is given: add a second backend (e.g. --backends wgsl,cpu) or --reference FILE",
            ));
        }
        // One backend alone proves nothing: the CPU reference implementation is the comparison.
        kinds.push(BackendKind::Cpu);
    }
    let reference = a.reference.as_deref().map(load_reference).transpose()?;
    let given_ids = a
        .prompt_ids
        .as_deref()
        .map(prompt::parse_ids)
        .transpose()
        .map_err(|e| usage(format!("{e:#}")))?;
    let path = load::model_path(resolved.model.clone())?;
    let ckpt = load::open(&path)?;
    if let (Some((cases, raw)), Some(file)) = (&reference, &a.reference) {
        let why = reference_mismatch(raw, cases, &ckpt.config);
        if !why.is_empty() {
            bail!(
                "{}: this reference does not match the model {} ({}): record one from this model (tests/fixtures/gen_*.py) or pass the model it was recorded from",
                file.display(),
                ckpt.path.display(),
                why.join("; ")
            );
        }
    }
    let reference = reference.map(|(cases, _)| cases);
    // Every backend opens before any runs: a missing one fails now, not after the others ran.
    let mut names = Vec::new();
    for k in &kinds {
        names.push(with_backend!(*k, |b| b.name()));
    }
    let prompts: Vec<Vec<u32>> = match (&reference, given_ids) {
        (Some(cases), _) => cases.iter().map(|c| c.prompt_ids.clone()).collect(),
        (None, Some(ids)) => vec![ids],
        (None, None) => vec![prompt::prompt_ids(&ckpt.assets, &a.prompt, false, None)?],
    };
    let dname = if dtype == DType::BF16 { "bf16" } else { "f32" };
    let base_tol: f64 = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
    match (&a.reference, a.tolerance) {
        (_, Some(t)) => outln!("tolerance {t:.2e} (--tolerance)")?,
        (Some(f), None) if dtype == DType::BF16 => outln!(
            "reference {}: bf16 judged against its float32 run; tolerance max(2e-2, 1.5 × the reference's own bf16-vs-f32 error), per prompt (logits) and per layer (hidden states)",
            f.display()
        )?,
        (Some(f), None) => outln!(
            "reference {}: f32 judged against its float32 run; tolerance {base_tol:.0e}",
            f.display()
        )?,
        (None, None) => outln!("tolerance {base_tol:.0e} between backends ({dname})")?,
    }
    // Rows name backends by their short kind; the adapters' full names are printed once here.
    let legend: Vec<String> = kinds
        .iter()
        .zip(&names)
        .map(|(k, n)| format!("{} = {n}", k.name()))
        .collect();
    outln!("backends: {}", legend.join("; "))?;
    let mut all: Vec<Vec<Run>> = Vec::new();
    for k in &kinds {
        all.push(run_backend(*k, &ckpt, &cfg, &prompts, a.tokens)?);
    }
    let bf16_rule = dtype == DType::BF16 && a.tolerance.is_none();
    let mut v = Verdict::default();
    let mut tokens_ok = true;
    for (pi, p) in prompts.iter().enumerate() {
        let case = reference.as_ref().map(|r| &r[pi]);
        let own = case.map(own_bf16_error).unwrap_or(0.0);
        let tol = match a.tolerance {
            Some(t) => t,
            None if bf16_rule => base_tol.max(1.5 * own),
            None => base_tol,
        };
        let label = case.map(|c| format!(" ({})", c.label)).unwrap_or_default();
        let how = if bf16_rule && case.is_some_and(|c| c.bfloat16.is_some()) {
            format!(" (max(2e-2, 1.5 × reference bf16-vs-f32 error {own:.2e}))")
        } else {
            String::new()
        };
        outln!(
            "prompt {pi}{label}: {} tokens, dtype {dname}, tolerance {tol:.2e}{how}",
            p.len()
        )?;
        let first = &all[0][pi];
        let d = first.hidden.first().map(|h| h.len() / p.len()).unwrap_or(0);
        let ref_f32 = case.map(|c| &c.float32);
        let ref_bf16 = case.and_then(|c| c.bfloat16.as_ref());
        outln!(
            "  {:<10} {:>28} {:>28}",
            "layer",
            "max|Δ| / rel (vs reference)",
            "max|Δ| / rel (vs first)"
        )?;
        for l in 0..first.hidden.len() {
            let ref_h = ref_f32
                .and_then(|r| r.hidden.as_ref())
                .and_then(|h| h.get(l));
            // bf16: this layer's tolerance widens with the reference's own error there.
            let tol_l = match (bf16_rule, ref_h, ref_bf16.and_then(|r| r.hidden.as_ref())) {
                (true, Some(f), Some(b)) => b.get(l).map_or(tol, |b| tol.max(1.5 * diff(b, f).1)),
                _ => tol,
            };
            let name = if l == 0 {
                "embed".to_string()
            } else {
                format!("layer {l}")
            };
            for run in all.iter().map(|r| &r[pi]) {
                let last = &run.hidden[l][(p.len() - 1) * d..];
                let vs_ref = ref_h.map(|h| diff(last, h));
                let vs_first = diff(&run.hidden[l], &first.hidden[l]);
                let mut ok = true;
                if let Some((_, r)) = vs_ref {
                    ok &= v.judge(r, tol_l, || {
                        format!("prompt {pi} {name} {} vs reference", run.name)
                    });
                }
                ok &= v.judge(vs_first.1, tol, || {
                    format!("prompt {pi} {name} {} vs {}", run.name, first.name)
                });
                outln!(
                    "  {:<10} {:>28} {:>28}  {}{}",
                    name,
                    fmt(vs_ref),
                    fmt(Some(vs_first)),
                    run.name,
                    if ok { "" } else { "  FAIL" }
                )?;
            }
        }
        for run in all.iter().map(|r| &r[pi]) {
            // Logits at each step up to and including the first greedy divergence from the
            // reference (later steps continue from a different token).
            let ref_greedy = ref_f32.and_then(|r| r.greedy.as_ref());
            let agree_ref =
                ref_greedy.map(|g| run.greedy.iter().zip(g).take_while(|(x, y)| x == y).count());
            let ref_logits = ref_f32.map(|r| r.logits.as_slice()).unwrap_or(&[]);
            let steps = run
                .logits
                .len()
                .min(ref_logits.len())
                .min(agree_ref.map_or(usize::MAX, |n| n + 1));
            let mut ok = true;
            let mut worst_step: Option<(f64, f64)> = None;
            for (s, (got, want)) in run.logits.iter().zip(ref_logits).take(steps).enumerate() {
                let e = diff(got, want);
                ok &= v.judge(e.1, tol, || {
                    format!("prompt {pi} logits step {s} {} vs reference", run.name)
                });
                if worst_step.is_none_or(|w| e.1 > w.1) {
                    worst_step = Some(e);
                }
            }
            let vs_first = diff(&run.logits[0], &first.logits[0]);
            ok &= v.judge(vs_first.1, tol, || {
                format!("prompt {pi} logits {} vs {}", run.name, first.name)
            });
            outln!(
                "  {:<10} {:>28} {:>28}  {}{}{}",
                "logits",
                fmt(worst_step),
                fmt(Some(vs_first)),
                run.name,
                if steps > 1 {
                    format!(" (vs reference: worst of {steps} steps)")
                } else {
                    String::new()
                },
                if ok { "" } else { "  FAIL" }
            )?;
        }
        for run in all.iter().map(|r| &r[pi]) {
            let agree_first = run
                .greedy
                .iter()
                .zip(&first.greedy)
                .take_while(|(x, y)| x == y)
                .count();
            let ref_greedy = ref_f32.and_then(|r| r.greedy.as_ref());
            let agree_ref = ref_greedy.map(|g| {
                (
                    run.greedy.iter().zip(g).take_while(|(x, y)| x == y).count(),
                    g.len().min(run.greedy.len()),
                )
            });
            let differs =
                agree_first < first.greedy.len() || agree_ref.is_some_and(|(n, of)| n < of);
            // In bf16 a near-tie may flip a token; the logits above judge that step.
            let note = if differs && dtype == DType::BF16 && a.tolerance.is_none() {
                "  (bf16 near-tie: not a failure, the logits up to it are judged)"
            } else if differs {
                tokens_ok = false;
                "  DIFFER"
            } else {
                ""
            };
            outln!(
                "  greedy: {}/{} agree with {}, {} with reference  {}{note}",
                agree_first,
                first.greedy.len(),
                first.name,
                agree_ref
                    .map(|(n, of)| format!("{n}/{of}"))
                    .unwrap_or_else(|| "-".into()),
                run.name
            )?;
        }
    }
    outln!(
        "worst relative difference {:.3e} (its tolerance {:.2e}); greedy tokens {}",
        v.worst,
        v.worst_tol,
        if tokens_ok { "agree" } else { "DIFFER" }
    )?;
    if !v.failures.is_empty() || !tokens_ok {
        let first_failure = v
            .failures
            .first()
            .cloned()
            .unwrap_or_else(|| "greedy tokens differ".into());
        // An embedding output that already differs from the reference: not a numerical
        // drift but other weights (the config matched, the checkpoint did not).
        let hint = if v
            .failures
            .iter()
            .any(|f| f.contains(" embed ") && f.contains("vs reference"))
        {
            " (the embedding output already differs from the reference: it was probably recorded from other weights)"
        } else {
            ""
        };
        bail!(
            "check failed: {} comparison(s) past tolerance (first: {first_failure}), greedy tokens {}{hint}",
            v.failures.len(),
            if tokens_ok { "agree" } else { "differ" }
        );
    }
    Ok(())
}
