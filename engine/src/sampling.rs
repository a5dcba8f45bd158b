//! Choosing the next token from logits, in vLLM's order: penalties (repetition over prompt +
//! output, presence and frequency over the output), temperature, min-p, top-k, top-p (nucleus,
//! Holtzman et al. 2020), then a draw from a per-sequence seeded RNG so that runs repeat.
//! Also: log-probabilities of the chosen token and the top N ([`token_logprobs`]), and
//! [`StopMatcher`], which finds stop strings in detokenized text across token boundaries.

use rand::{rngs::StdRng, Rng, SeedableRng};

/// How a sequence picks tokens and when it stops.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Drop tokens whose probability (after temperature) is below `min_p` × the largest one
    /// (0 = off; vLLM's and llama.cpp's `min_p`).
    pub min_p: f32,
    /// Divides positive logits and multiplies negative ones of every token seen in the prompt or
    /// the output (1 = off; CTRL, Keskar et al. 2019, as vLLM applies it).
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token the output already contains (0 = off;
    /// OpenAI's `presence_penalty`, −2..=2).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the output contains it (0 = off; OpenAI's
    /// `frequency_penalty`, −2..=2).
    pub frequency_penalty: f32,
    /// RNG seed.
    pub seed: u64,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Keep generating past EOS (benchmarks).
    pub ignore_eos: bool,
    /// Token ids that also end generation (OpenAI/vLLM `stop_token_ids`; finish reason `stop`),
    /// honoured even with `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
    /// Report each generated token's log-probability and this many alternatives
    /// ([`token_logprobs`]) on its [`crate::TokenEvent`] (OpenAI `logprobs` / `top_logprobs`;
    /// at most [`MAX_LOGPROBS`]). `None`: none (and greedy rows may stay on the device).
    pub logprobs: Option<usize>,
}

/// Most alternatives [`SamplingParams::logprobs`] may ask for (vLLM's default `--max-logprobs`).
pub const MAX_LOGPROBS: usize = 20;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            max_tokens: 128,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            logprobs: None,
        }
    }
}

/// Changes one sequence's logits before each sample: constrained decoding (a grammar removes
/// the tokens that cannot continue a valid output). Set with [`crate::Engine::set_logits_processor`].
pub trait LogitsProcessor: Send {
    /// `generated`: the tokens generated so far (not the prompt); `logits` `[V]` f32, the
    /// model's raw logits, changed in place (`f32::NEG_INFINITY` removes a token). Penalties,
    /// temperature and the top-k/p filters apply after it. Log-probabilities are reported from
    /// the logits before it.
    fn apply(&mut self, generated: &[u32], logits: &mut [f32]);
}

/// OpenAI's `logit_bias`: a fixed amount added to some tokens' logits (−100 bans a token, +100
/// all but forces it).
#[derive(Clone, Debug, Default)]
pub struct LogitBias(pub Vec<(u32, f32)>);

impl LogitsProcessor for LogitBias {
    fn apply(&mut self, _generated: &[u32], logits: &mut [f32]) {
        for &(t, b) in &self.0 {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
    }
}

/// Several processors, applied in order.
pub struct Chain(pub Vec<Box<dyn LogitsProcessor>>);

impl LogitsProcessor for Chain {
    fn apply(&mut self, generated: &[u32], logits: &mut [f32]) {
        for p in &mut self.0 {
            p.apply(generated, logits);
        }
    }
}

/// Largest |presence_penalty| and |frequency_penalty| (OpenAI's and vLLM's range).
pub const MAX_PENALTY: f32 = 2.0;

impl SamplingParams {
    /// True when the choice is the plain argmax of the model's logits, so it can be taken on the
    /// device: temperature 0 (or top-k 1) and no penalty (penalties move the argmax).
    pub fn is_greedy(&self) -> bool {
        (self.temperature <= 0.0 || self.top_k == 1) && !self.has_penalties()
    }

    /// Whether any repetition / presence / frequency penalty is active.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Checks ranges; errors name the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            anyhow::bail!(
                "--temperature must be a finite number ≥ 0, got {}",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            anyhow::bail!("--top-p must be in (0, 1], got {}", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            anyhow::bail!("--min-p must be in [0, 1], got {}", self.min_p);
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            anyhow::bail!(
                "--repetition-penalty must be a finite number > 0 (1 = off), got {}",
                self.repetition_penalty
            );
        }
        for (flag, v) in [
            ("--presence-penalty", self.presence_penalty),
            ("--frequency-penalty", self.frequency_penalty),
        ] {
            if !(-MAX_PENALTY..=MAX_PENALTY).contains(&v) {
                anyhow::bail!("{flag} must be in [-2, 2], got {v}");
            }
        }
        if self.max_tokens == 0 {
            anyhow::bail!("--max-tokens must be at least 1");
        }
        if let Some(n) = self.logprobs.filter(|&n| n > MAX_LOGPROBS) {
            anyhow::bail!("--logprobs must be at most {MAX_LOGPROBS}, got {n}");
        }
        Ok(())
    }

    /// The flags that have no effect at temperature 0 (greedy) but were set: `--top-k`,
    /// `--top-p`, `--min-p` (for a warning, as vLLM and llama.cpp give none but users ask).
    pub fn ignored_when_greedy(&self) -> Vec<&'static str> {
        if self.temperature > 0.0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.top_k > 1 {
            out.push("--top-k");
        }
        if self.top_p < 1.0 {
            out.push("--top-p");
        }
        if self.min_p > 0.0 {
            out.push("--min-p");
        }
        out
    }
}

/// Applies the penalties to `logits` `[V]` in place, as vLLM's `apply_penalties`: a token seen
/// anywhere in `tokens` (prompt followed by output) has its logit divided by
/// `repetition_penalty` when positive, multiplied when negative; then every token of
/// `tokens[prompt_len..]` (the output) loses `frequency_penalty` × its count and
/// `presence_penalty` once. Token ids outside the vocabulary are ignored.
pub fn apply_penalties(logits: &mut [f32], p: &SamplingParams, tokens: &[u32], prompt_len: usize) {
    if !p.has_penalties() {
        return;
    }
    let v = logits.len();
    let prompt_len = prompt_len.min(tokens.len());
    let mut counts: ahash::AHashMap<u32, u32> = Default::default();
    for &t in &tokens[prompt_len..] {
        *counts.entry(t).or_default() += 1;
    }
    if p.repetition_penalty != 1.0 {
        let mut seen = vec![false; v];
        for &t in tokens {
            if let Some(s) = seen.get_mut(t as usize) {
                *s = true;
            }
        }
        for (x, _) in logits.iter_mut().zip(&seen).filter(|(_, &s)| s) {
            *x = if *x > 0.0 {
                *x / p.repetition_penalty
            } else {
                *x * p.repetition_penalty
            };
        }
    }
    for (&t, &n) in &counts {
        if let Some(x) = logits.get_mut(t as usize) {
            *x -= p.frequency_penalty * n as f32 + p.presence_penalty;
        }
    }
}

/// Candidate token ids after temperature, min-p, top-k and top-p, with their probabilities
/// (renormalised over the survivors), most likely first; ties by lower id. `logits` `[V]`.
pub fn candidates(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f32)> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let t = p.temperature.max(f32::MIN_POSITIVE);
    let max = logits[idx[0]];
    // Unnormalised; the largest is exactly 1, so min-p compares against `min_p` directly.
    let mut probs: Vec<f32> = idx.iter().map(|&i| ((logits[i] - max) / t).exp()).collect();
    if p.min_p > 0.0 {
        let keep = probs.iter().take_while(|&&q| q >= p.min_p).count().max(1);
        probs.truncate(keep);
    }
    if p.top_k > 0 {
        probs.truncate(p.top_k);
    }
    let total: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|x| *x /= total);
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        let mut keep = probs.len();
        for (i, &q) in probs.iter().enumerate() {
            cum += q;
            if cum >= p.top_p {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
    }
    idx.into_iter()
        .zip(probs)
        .map(|(i, q)| (i as u32, q))
        .collect()
}

/// A sampler bound to one sequence's RNG.
pub struct Sampler {
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Picks a token id from `logits` `[V]` (f32) without penalties (they need the history:
    /// see [`Sampler::sample_with_history`]).
    pub fn sample(&mut self, logits: &[f32], p: &SamplingParams) -> u32 {
        self.sample_with_history(logits, p, &[], 0)
    }

    /// Picks a token id from `logits` `[V]` (f32) for a sequence whose tokens so far are
    /// `tokens` (prompt followed by output; the prompt is the first `prompt_len`), with the
    /// penalties applied first. Greedy (temperature 0 or top-k 1) takes the argmax of the
    /// penalised logits and draws nothing from the RNG.
    pub fn sample_with_history(
        &mut self,
        logits: &[f32],
        p: &SamplingParams,
        tokens: &[u32],
        prompt_len: usize,
    ) -> u32 {
        let penalised;
        let logits = if p.has_penalties() {
            let mut l = logits.to_vec();
            apply_penalties(&mut l, p, tokens, prompt_len);
            penalised = l;
            &penalised[..]
        } else {
            logits
        };
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        let cands = candidates(logits, p);
        let mut r = self.rng.random::<f32>();
        for &(id, q) in &cands {
            if r < q {
                return id;
            }
            r -= q;
        }
        cands[cands.len() - 1].0
    }
}

/// Index of the largest value (the first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Log-probability of the chosen token and of the `top_n` most likely ones.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token.
    pub token: u32,
    /// Its natural-log probability.
    pub logprob: f32,
    /// The `top_n` most likely tokens with their log-probabilities, most likely first (ties:
    /// lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of the model's raw `logits` `[V]` (before penalties and temperature, as vLLM's
/// default `raw_logprobs` and OpenAI's `logprobs` report them) at `token`, plus the `top_n`
/// best. Computed in f64 (stable: max subtracted).
pub fn token_logprobs(logits: &[f32], token: u32, top_n: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = |i: usize| (logits[i] as f64 - lse) as f32;
    let mut top: Vec<usize> = (0..logits.len()).collect();
    let n = top_n.min(top.len());
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    if n > 0 && n < top.len() {
        top.select_nth_unstable_by(n - 1, by_logit);
    }
    top.truncate(n);
    top.sort_unstable_by(by_logit);
    TokenLogprobs {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |_| lp(token as usize)),
        top: top.into_iter().map(|i| (i as u32, lp(i))).collect(),
    }
}

/// What [`StopMatcher::push`] lets through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to show now: it cannot be part of a stop string.
    pub text: String,
    /// The stop string found (the text before it is in `text`; it and anything after it is
    /// dropped, vLLM's default `include_stop_str_in_output: false`).
    pub stopped: Option<String>,
}

/// Finds stop strings in streamed text. Text that could still become a stop string (a suffix
/// that is a prefix of one) is held back until the next piece decides it, so a stop string
/// split over several tokens is found and never shown. Used on detokenized text by the CLI and
/// the server.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    done: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            done: false,
        }
    }

    /// Whether there is nothing to match.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Feeds the next piece of text; returns what may be shown and whether a stop string ended
    /// the output. After a stop everything is dropped.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.done {
            return StopOutput::default();
        }
        self.pending.push_str(piece);
        // The earliest match wins; on equal starts, the longest stop string.
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|i| (i, s)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())));
        if let Some((i, s)) = found {
            let stopped = Some(s.clone());
            let text = self.pending[..i].to_string();
            self.pending.clear();
            self.done = true;
            return StopOutput { text, stopped };
        }
        let hold = self.held_suffix_len();
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopOutput {
            text,
            stopped: None,
        }
    }

    /// The text held back at the end of the stream (no stop string followed).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Bytes at the end of `pending` that are a proper prefix of some stop string (the longest
    /// such suffix, on a character boundary).
    fn held_suffix_len(&self) -> usize {
        let p = &self.pending;
        let longest = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        (1..longest.min(p.len() + 1))
            .rev()
            .find(|&k| {
                p.is_char_boundary(p.len() - k)
                    && self
                        .stops
                        .iter()
                        .any(|s| s.len() > k && s.starts_with(&p[p.len() - k..]))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_limits_choice() {
        let logits = [0.0, 5.0, 4.9, -3.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        assert_eq!(Sampler::new(1).sample(&logits, &p), 1);
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            ..Default::default()
        };
        let mut s = Sampler::new(7);
        for _ in 0..50 {
            assert_eq!(
                s.sample(&logits, &p),
                1,
                "top-p 0.5 keeps only the most likely token here"
            );
        }
        let p = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        let mut s = Sampler::new(3);
        let seen: std::collections::HashSet<u32> =
            (0..200).map(|_| s.sample(&logits, &p)).collect();
        assert!(
            seen.contains(&1) && seen.contains(&2),
            "temperature sampling explores: {seen:?}"
        );
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            top_k: 20,
            min_p: 0.05,
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        let history = [3u32, 7, 7, 9, 40];
        let run = |seed| {
            let mut s = Sampler::new(seed);
            (0..20)
                .map(|_| s.sample_with_history(&logits, &p, &history, 2))
                .collect::<Vec<u32>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43), "another seed draws another sequence");
    }

    #[test]
    fn penalties_follow_vllm_hand_computed() {
        // Prompt [0, 1], output [2, 2, 3]; vocab 5.
        let tokens = [0u32, 1, 2, 2, 3];
        let logits = [2.0f32, -1.0, 3.0, 0.5, 1.0];
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        let mut l = logits;
        apply_penalties(&mut l, &p, &tokens, 2);
        // repetition on every seen token (prompt and output): 2/2, -1*2, 3/2, 0.5/2; token 4 unseen.
        // then output counts {2: 2, 3: 1}: token 2 − 0.25·2 − 0.5, token 3 − 0.25 − 0.5.
        let want = [1.0, -2.0, 1.5 - 0.5 - 0.5, 0.25 - 0.25 - 0.5, 1.0];
        for (g, w) in l.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{l:?} vs {want:?}");
        }
        // Presence/frequency look at the output only: a prompt-only token keeps its logit.
        let p = SamplingParams {
            presence_penalty: 1.0,
            ..Default::default()
        };
        let mut l = logits;
        apply_penalties(&mut l, &p, &tokens, 2);
        assert_eq!(l[0], 2.0);
        assert_eq!(l[1], -1.0);
        assert_eq!(l[2], 2.0);
    }

    #[test]
    fn penalties_move_the_greedy_choice_and_leave_the_device_path() {
        let logits = [1.0f32, 3.0, 2.5];
        let p = SamplingParams {
            frequency_penalty: 1.0,
            ..Default::default()
        };
        assert!(!p.is_greedy(), "penalised argmax must run on the host");
        assert!(SamplingParams::default().is_greedy());
        let mut s = Sampler::new(0);
        assert_eq!(
            s.sample_with_history(&logits, &p, &[0, 1], 1),
            2,
            "3 − 1 < 2.5"
        );
        assert_eq!(
            s.sample_with_history(&logits, &p, &[0, 1], 2),
            1,
            "token 1 only in the prompt"
        );
    }

    #[test]
    fn min_p_cuts_below_the_scaled_maximum() {
        // Probabilities ∝ e^0, e^-1, e^-2, e^-4 = 1, 0.368, 0.135, 0.018 (relative to the max).
        let logits = [0.0f32, -1.0, -2.0, -4.0];
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 0.1,
            ..Default::default()
        };
        let c = candidates(&logits, &p);
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        let total = 1.0 + (-1.0f32).exp() + (-2.0f32).exp();
        assert!((c[0].1 - 1.0 / total).abs() < 1e-6, "{c:?}");
        // Temperature first: at T = 0.5 the second is e^-2 = 0.135 of the max, the third e^-4.
        let p = SamplingParams {
            temperature: 0.5,
            min_p: 0.1,
            ..Default::default()
        };
        assert_eq!(candidates(&logits, &p).len(), 2);
        // The most likely token always survives.
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 1.0,
            ..Default::default()
        };
        assert_eq!(candidates(&logits, &p), vec![(0, 1.0)]);
    }

    #[test]
    fn logprobs_are_log_softmax_of_raw_logits() {
        let logits = [0.0f32, (2.0f32).ln(), (5.0f32).ln()]; // softmax: 1/8, 2/8, 5/8
        let l = token_logprobs(&logits, 1, 2);
        assert!((l.logprob - (0.25f32).ln()).abs() < 1e-6, "{l:?}");
        assert_eq!(l.top.len(), 2);
        assert_eq!((l.top[0].0, l.top[1].0), (2, 1));
        assert!((l.top[0].1 - (0.625f32).ln()).abs() < 1e-6);
        assert!(token_logprobs(&logits, 0, 0).top.is_empty());
        assert_eq!(token_logprobs(&logits, 0, 10).top.len(), 3);
    }

    #[test]
    fn validate_names_the_flag() {
        for (p, flag) in [
            (
                SamplingParams {
                    min_p: 1.5,
                    ..Default::default()
                },
                "--min-p",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..Default::default()
                },
                "--repetition-penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: 2.5,
                    ..Default::default()
                },
                "--presence-penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: -3.0,
                    ..Default::default()
                },
                "--frequency-penalty",
            ),
        ] {
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
        let p = SamplingParams {
            top_k: 5,
            min_p: 0.1,
            ..Default::default()
        };
        assert_eq!(p.ignored_when_greedy(), vec!["--top-k", "--min-p"]);
        let p = SamplingParams {
            temperature: 0.7,
            top_k: 5,
            ..Default::default()
        };
        assert!(p.ignored_when_greedy().is_empty());
    }

    fn feed(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut shown = String::new();
        for piece in pieces {
            let o = m.push(piece);
            shown += &o.text;
            if o.stopped.is_some() {
                return (shown, o.stopped);
            }
        }
        shown += &m.finish();
        (shown, None)
    }

    #[test]
    fn stop_string_split_across_tokens_is_found_and_hidden() {
        assert_eq!(
            feed(&["</end>"], &["Hello </", "en", "d> more"]),
            ("Hello ".into(), Some("</end>".into()))
        );
        // A partial prefix that does not complete is released, nothing lost.
        assert_eq!(
            feed(&["</end>"], &["a </e", "x b"]),
            ("a </ex b".into(), None)
        );
        assert_eq!(
            feed(&["</end>"], &["tail </en"]),
            ("tail </en".into(), None)
        );
    }

    #[test]
    fn held_back_text_is_only_a_possible_prefix() {
        let mut m = StopMatcher::new(&["ab".to_string()]);
        assert_eq!(m.push("xxa").text, "xx", "'a' could start 'ab'");
        assert_eq!(m.push("c").text, "ac");
        // Multi-byte characters are never split.
        let mut m = StopMatcher::new(&["éx".to_string()]);
        assert_eq!(m.push("día é").text, "día ");
        assert_eq!(m.finish(), "é");
    }

    #[test]
    fn earliest_stop_wins_and_nothing_follows() {
        let stops = ["world".to_string(), "lo w".to_string()];
        let mut m = StopMatcher::new(&stops);
        let o = m.push("hello world");
        assert_eq!(
            o,
            StopOutput {
                text: "hel".into(),
                stopped: Some("lo w".into())
            }
        );
        assert_eq!(m.push("more"), StopOutput::default());
        assert!(StopMatcher::new(&[String::new()]).is_empty());
    }
}
