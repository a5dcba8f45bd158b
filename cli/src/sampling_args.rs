//! Sampling flags shared by `generate` and `chat`: temperature, top-k/p, min-p, penalties, seed,
//! stop strings, logprobs, n. With temperature > 0 and no `--seed`, a random seed is drawn and
//! reported (as vLLM and llama.cpp do) so that the run can be repeated.

use crate::parse;
use anyhow::Result;
use clap::Args;
use dayone_engine::sampling::SamplingParams;

/// Sampling flags.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate (generation also stops at the context window).
    #[arg(short = 'n', long, default_value_t = 128, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub max_tokens: usize,
    /// Sampling temperature, a finite number ≥ 0; 0 = greedy.
    #[arg(long, default_value_t = 0.0, value_parser = parse::non_negative_finite, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Nucleus sampling mass, in (0, 1].
    #[arg(long, default_value_t = 1.0, value_parser = parse::probability, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 or -1 = all, as in vLLM).
    #[arg(long, default_value_t = 0, value_parser = parse::top_k, allow_negative_numbers = true)]
    pub top_k: usize,
    /// Drop tokens less likely than min-p × the most likely one, in [0, 1] (0 = off).
    #[arg(long, default_value_t = 0.0, value_parser = unit_interval, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Penalise every token already in the prompt or output: positive logits divided by it,
    /// negative ones multiplied (> 0; 1 = off; vLLM's repetition_penalty).
    #[arg(long, default_value_t = 1.0, value_parser = positive, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of each token the output contains, in [-2, 2].
    #[arg(long, default_value_t = 0.0, value_parser = penalty, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per occurrence in the output, in [-2, 2].
    #[arg(long, default_value_t = 0.0, value_parser = penalty, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// RNG seed (default: 0 when greedy; with --temperature > 0, a random seed, reported).
    #[arg(long, value_parser = parse::seed, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Stop when the output contains this text (not included in the output); repeatable.
    #[arg(long, value_name = "TEXT", value_parser = non_empty_stop)]
    pub stop: Vec<String>,
    /// Report each generated token's log-probability and the N most likely alternatives (0:
    /// the chosen token only; at most 20, as vLLM).
    #[arg(long, value_name = "N", value_parser = logprobs_n, allow_negative_numbers = true)]
    pub logprobs: Option<usize>,
    /// Keep generating after an end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
}

/// Most alternatives `--logprobs` reports (vLLM's default `--max-logprobs`).
pub const MAX_LOGPROBS: usize = 20;

fn number(s: &str) -> Result<f32, String> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() {
        return Err(format!("must be a finite number, got {}", s.trim()));
    }
    Ok(v)
}

fn unit_interval(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("must be in [0, 1], got {}", s.trim()));
    }
    Ok(v)
}

fn positive(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if v <= 0.0 {
        return Err(format!("must be > 0, got {}", s.trim()));
    }
    Ok(v)
}

fn penalty(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if !(-2.0..=2.0).contains(&v) {
        return Err(format!("must be in [-2, 2], got {}", s.trim()));
    }
    Ok(v)
}

fn logprobs_n(s: &str) -> Result<usize, String> {
    let v = parse::non_negative(s)?;
    if v > MAX_LOGPROBS {
        return Err(format!("must be at most {MAX_LOGPROBS}, got {v}"));
    }
    Ok(v)
}

/// A seed from the OS-seeded hasher keys of the standard library (no RNG crate needed), below
/// 2^53 so that it prints exactly as a JSON number.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() >> 11
}

impl SamplingArgs {
    /// The engine's parameters; a seed is drawn when `--seed` is absent and the temperature is
    /// above 0 (read it back from `.seed`). Warns on stderr about flags greedy decoding ignores.
    pub fn params(&self) -> Result<SamplingParams> {
        let seed = match self.seed {
            Some(s) => s,
            None if self.temperature > 0.0 => random_seed(),
            None => 0,
        };
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
            max_tokens: self.max_tokens,
            ignore_eos: self.ignore_eos,
            ..SamplingParams::default()
        };
        p.validate()?;
        let ignored = p.ignored_when_greedy();
        if !ignored.is_empty() {
            eprintln!(
                "warning: {} {} no effect at --temperature 0 (greedy decoding): set a temperature > 0 to sample",
                ignored.join(", "),
                if ignored.len() == 1 { "has" } else { "have" }
            );
        }
        Ok(p)
    }

    /// Whether the seed was drawn at random (so it should be reported).
    pub fn seed_was_drawn(&self) -> bool {
        self.seed.is_none() && self.temperature > 0.0
    }
}

/// A stop string: an empty one would match before any output (vLLM ignores it; a typo here
/// should say so instead).
fn non_empty_stop(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("an empty stop string would stop before any output: give some text".into());
    }
    Ok(s.to_string())
}
