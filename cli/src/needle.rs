//! `dayone needle`: needle-in-a-haystack retrieval accuracy per context length and depth.
//!
//! Builds every (length, depth, trial) prompt with [`dayone_engine::needle`], runs them all in
//! one engine ([`needle::run_cases`]: the deepest case of each length first, then the rest
//! together, which find the shared chat header and filler in the prefix cache), answers greedily
//! and scores "the answer contains the needle value".

use crate::engine_args::{CommandDefaults, EngineArgs};
use crate::load;
use crate::parse;
use crate::usage::usage;
use crate::with_backend;
use anyhow::{Context, Result};
use clap::Args;
use dayone_backend::Backend;
use dayone_engine::config::ModelConfig;
use dayone_engine::loader::Checkpoint;
use dayone_engine::needle::{self, Filler, NeedleCase};
use dayone_engine::sampling::SamplingParams;
use dayone_engine::scheduler::FinishReason;
use dayone_engine::EngineConfig;
use indicatif::{ProgressBar, ProgressStyle};
use std::time::Instant;

/// Flags of `dayone needle`.
#[derive(Args, Debug)]
pub struct NeedleArgs {
    /// The engine flags (--model, --backend, --dtype, --kv-cache-tokens, --no-prefix-caching, …).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt lengths in tokens (each prompt, chat template included, has at most this many)
    /// [default: 512,1024,2048, those that fit the context window with --max-tokens].
    #[arg(long, value_delimiter = ',', value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub lengths: Vec<usize>,
    /// Needle depths in percent of the haystack (0 = first sentence, 100 = last).
    #[arg(long, value_delimiter = ',', default_value = "0,25,50,75,100", value_parser = depth, allow_negative_numbers = true)]
    pub depths: Vec<u32>,
    /// Needles per (length, depth): each trial hides a different value in the same haystack.
    #[arg(long, default_value_t = 1, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub trials: usize,
    /// Most answer tokens (an answer also stops at an end-of-sequence token).
    #[arg(long, default_value_t = 32, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub max_tokens: usize,
    /// Seed of the filler text and the needle values.
    #[arg(long, default_value_t = 0, value_parser = parse::seed, allow_negative_numbers = true)]
    pub seed: u64,
    /// One JSON object (cases, answers, accuracy) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `--depths` entry: an integer percentage in 0..=100.
fn depth(s: &str) -> Result<u32, String> {
    let v = parse::non_negative(s)?;
    if v > 100 {
        return Err(format!("must be a percentage in 0..=100, got {v}"));
    }
    Ok(v as u32)
}

/// The first value listed twice, if any.
fn first_duplicate<T: PartialEq + Copy>(xs: &[T]) -> Option<T> {
    xs.iter()
        .enumerate()
        .find(|(i, x)| xs[..*i].contains(x))
        .map(|(_, x)| *x)
}

/// One case's outcome.
struct Outcome {
    case: NeedleCase,
    answer_ids: Vec<u32>,
    answer: String,
    finish: Option<FinishReason>,
    correct: bool,
}

/// `--lengths` when none is given (those that fit the window are kept).
const DEFAULT_LENGTHS: [usize; 3] = [512, 1024, 2048];

/// Runs `dayone needle`.
pub fn run(mut a: NeedleArgs) -> Result<()> {
    if let Some(l) = first_duplicate(&a.lengths) {
        return Err(usage(format!(
            "--lengths lists {l} twice: give each length once"
        )));
    }
    if let Some(d) = first_duplicate(&a.depths) {
        return Err(usage(format!(
            "--depths lists {d} twice: give each depth once"
        )));
    }
    let Some(trials) = u32::try_from(a.trials).ok().filter(|&t| t <= 1000) else {
        return Err(usage(format!("--trials {} is over 1000", a.trials)));
    };
    let mut r = a.engine.resolve(&CommandDefaults::default())?;
    let path = load::model_path(r.model.clone())?;
    let ckpt = load::open(&path)?;
    r.settle_dtype(&ckpt);
    if ckpt.assets.tokenizer.is_none() {
        anyhow::bail!(
            "{}: this checkpoint has no tokenizer (tokenizer.json or GGUF vocabulary); needle prompts are text",
            path.display()
        );
    }
    let origin = ckpt.path.join("config.json").display().to_string();
    let config_window = ModelConfig::from_json(&ckpt.config, &origin)?.max_context();
    let window = r
        .engine
        .max_model_len
        .map_or(config_window, |m| m.min(config_window));
    if a.lengths.is_empty() {
        // The defaults are for real models; a small window keeps those that fit.
        a.lengths = DEFAULT_LENGTHS
            .into_iter()
            .filter(|&l| l + a.max_tokens <= window)
            .collect();
        let shown = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        if a.lengths.is_empty() {
            return Err(usage(format!(
                "none of the default --lengths {} fits the context window of {window} tokens with --max-tokens {}: give --lengths",
                shown(&DEFAULT_LENGTHS),
                a.max_tokens
            )));
        }
        if a.lengths.len() < DEFAULT_LENGTHS.len() {
            eprintln!(
                "note: --lengths {} (the defaults that fit the {window}-token window)",
                shown(&a.lengths)
            );
        }
    }
    for &l in &a.lengths {
        if l + a.max_tokens > window {
            return Err(usage(format!(
                "--lengths {l} plus --max-tokens {} exceeds the context window of {window} tokens",
                a.max_tokens
            )));
        }
    }
    let cases = build_cases(&ckpt, &a, trials)?;
    let cfg = r.engine;
    with_backend!(r.backend, |b| run_cases(b, &ckpt, &cfg, cases, &a))
}

/// Every (length, depth, trial) case; a length too short for its prompt is a usage error.
fn build_cases(ckpt: &Checkpoint, a: &NeedleArgs, trials: u32) -> Result<Vec<NeedleCase>> {
    let mut filler = Filler::new(a.seed);
    let mut cases = Vec::new();
    for &length in &a.lengths {
        for &depth in &a.depths {
            for trial in 0..trials {
                match needle::build_case(&ckpt.assets, &mut filler, a.seed, length, depth, trial) {
                    Ok(c) => cases.push(c),
                    Err(e) if e.is::<needle::TooShort>() => {
                        return Err(usage(format!("--lengths: {e}")))
                    }
                    Err(e) => {
                        return Err(e.context(format!(
                            "building the needle prompt of length {length}, depth {depth} %"
                        )))
                    }
                }
            }
        }
    }
    Ok(cases)
}

fn run_cases<B: Backend>(
    b: B,
    ckpt: &Checkpoint,
    cfg: &EngineConfig,
    cases: Vec<NeedleCase>,
    a: &NeedleArgs,
) -> Result<()> {
    let mut engine = load::engine(b, ckpt, cfg, false)?;
    let tok = ckpt.assets.tokenizer.as_ref().context("no tokenizer")?;
    let params = SamplingParams {
        max_tokens: a.max_tokens,
        ..Default::default()
    };
    let start = Instant::now();
    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("needle [{bar:30}] {pos}/{len} answers {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let answers = needle::run_cases(&mut engine, &cases, &params, &mut || bar.inc(1))?;
    bar.finish_and_clear();
    let eos = engine.eos_ids().to_vec();
    let mut outcomes = Vec::with_capacity(cases.len());
    for (case, needle::Answer { ids, finish }) in cases.into_iter().zip(answers) {
        let text_ids: Vec<u32> = ids.iter().copied().filter(|t| !eos.contains(t)).collect();
        let answer = tok.decode(&text_ids, true)?;
        let correct = needle::is_correct(&answer, &case.needle);
        outcomes.push(Outcome {
            case,
            answer_ids: ids,
            answer,
            finish,
            correct,
        });
    }
    let m = engine.metrics();
    let run = RunInfo {
        prefix_caching: cfg.prefix_caching,
        hit_tokens: m.prefix_cache_hits,
        query_tokens: m.prefix_cache_queries,
        backend: engine.backend.name(),
        elapsed_s: start.elapsed().as_secs_f64(),
    };
    if a.json {
        print_json(&outcomes, a, &run)
    } else {
        print_table(&outcomes, a, &run)
    }
}

/// How a run went, beside its outcomes.
struct RunInfo {
    prefix_caching: bool,
    /// Prompt tokens found in the prefix cache (`vllm:prefix_cache_hits`).
    hit_tokens: u64,
    /// Prompt tokens looked up there (`vllm:prefix_cache_queries`).
    query_tokens: u64,
    backend: String,
    elapsed_s: f64,
}

/// `(correct, total)` of the outcomes that `keep` selects.
fn tally(outcomes: &[Outcome], keep: impl Fn(&NeedleCase) -> bool) -> (usize, usize) {
    let sel: Vec<&Outcome> = outcomes.iter().filter(|o| keep(&o.case)).collect();
    (sel.iter().filter(|o| o.correct).count(), sel.len())
}

fn fraction((k, n): (usize, usize)) -> f64 {
    k as f64 / n.max(1) as f64
}

fn print_json(outcomes: &[Outcome], a: &NeedleArgs, run: &RunInfo) -> Result<()> {
    let cases: Vec<_> = outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "length": o.case.length,
                "depth": o.case.depth,
                "trial": o.case.trial,
                "prompt_tokens": o.case.prompt_ids.len(),
                "filler_sentences": o.case.filler_sentences,
                "needle_index": o.case.needle_index,
                "needle": o.case.needle,
                "answer": o.answer,
                "answer_ids": o.answer_ids,
                "finish_reason": o.finish.map(|f| f.as_str()),
                "correct": o.correct,
            })
        })
        .collect();
    let per_length: serde_json::Map<_, _> = a
        .lengths
        .iter()
        .map(|&l| {
            (
                l.to_string(),
                fraction(tally(outcomes, |c| c.length == l)).into(),
            )
        })
        .collect();
    let per_depth: serde_json::Map<_, _> = a
        .depths
        .iter()
        .map(|&d| {
            (
                d.to_string(),
                fraction(tally(outcomes, |c| c.depth == d)).into(),
            )
        })
        .collect();
    let grid: Vec<Vec<f64>> = a
        .lengths
        .iter()
        .map(|&l| {
            a.depths
                .iter()
                .map(|&d| fraction(tally(outcomes, |c| c.length == l && c.depth == d)))
                .collect()
        })
        .collect();
    let j = serde_json::json!({
        "backend": run.backend,
        "seed": a.seed,
        "trials": a.trials,
        "max_tokens": a.max_tokens,
        "prefix_caching": run.prefix_caching,
        "prefix_cache_hit_tokens": run.hit_tokens,
        "prefix_cache_query_tokens": run.query_tokens,
        "lengths": a.lengths,
        "depths": a.depths,
        "accuracy": {
            "overall": fraction(tally(outcomes, |_| true)),
            "per_length": per_length,
            "per_depth": per_depth,
            "grid": grid,
        },
        "cases": cases,
        "elapsed_s": run.elapsed_s,
    });
    crate::outln!("{j}")
}

fn print_table(outcomes: &[Outcome], a: &NeedleArgs, run: &RunInfo) -> Result<()> {
    for o in outcomes {
        crate::outln!(
            "length {:>6} depth {:>3} % trial {}: {} needle {} answer {:?}",
            o.case.length,
            o.case.depth,
            o.case.trial,
            if o.correct { "ok  " } else { "MISS" },
            o.case.needle,
            o.answer
        )?;
    }
    crate::outln!()?;
    let cell = |(k, n): (usize, usize)| format!("{k}/{n}");
    let mut head = format!("{:>8}", "length");
    for d in &a.depths {
        head.push_str(&format!("{:>8}", format!("{d}%")));
    }
    head.push_str(&format!("{:>8}", "all"));
    crate::outln!("{head}")?;
    for &l in &a.lengths {
        let mut row = format!("{l:>8}");
        for &d in &a.depths {
            row.push_str(&format!(
                "{:>8}",
                cell(tally(outcomes, |c| c.length == l && c.depth == d))
            ));
        }
        row.push_str(&format!("{:>8}", cell(tally(outcomes, |c| c.length == l))));
        crate::outln!("{row}")?;
    }
    let mut row = format!("{:>8}", "all");
    for &d in &a.depths {
        row.push_str(&format!("{:>8}", cell(tally(outcomes, |c| c.depth == d))));
    }
    let all = tally(outcomes, |_| true);
    row.push_str(&format!("{:>8}", cell(all)));
    crate::outln!("{row}")?;
    crate::outln!(
        "accuracy {:.1} % ({}/{}) | seed {} | prefix caching {} ({} of {} prompt tokens hit) | {} | {:.1} s",
        100.0 * fraction(all),
        all.0,
        all.1,
        a.seed,
        if run.prefix_caching { "on" } else { "off" },
        run.hit_tokens,
        run.query_tokens,
        run.backend,
        run.elapsed_s
    )
}
