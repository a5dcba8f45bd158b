//! Needle-in-a-haystack prompts: a fact ("The secret passphrase is amber-4821.") hidden at a
//! depth of 0–100 % of a filler text whose whole prompt is at most `length` tokens, then a
//! question asking for it (Kamradt's "needle in a haystack" test, 2023).
//!
//! Everything is deterministic and specified here so that another implementation can build the
//! same prompt ids: `tests/fixtures/gen_needle.py` mirrors this file line by line and records
//! transformers' greedy answers on the ids it builds; the tests check that this file builds the
//! same ids.
//!
//! Protocol for one case `(seed, length, depth, trial)`:
//! 1. Filler: sentence `i` of an endless stream drawn from [`Lcg`] seeded with `seed`: `6 +
//!    below(7)` words from [`FILLER_WORDS`] (each `FILLER_WORDS[below(64)]`; [`Lcg::below`]), the first one
//!    capitalised, joined by spaces, ending in `.`. The stream does not depend on the length,
//!    depth or trial, so all cases of one seed share their text up to the needle.
//! 2. Needle: an [`Lcg`] seeded with `seed ^ NEEDLE_SALT ^ (length·1000 + depth + trial·1000000007)`
//!    (wrapping u64) draws `NEEDLE_WORDS[below(16)]` and `1000 + below(9000)`: the value
//!    `word-number`, the sentence `The secret passphrase is word-number.`
//! 3. With `n` filler sentences the needle goes before sentence `k = (depth·n + 50) / 100`
//!    (integer division; depth 0: first, 100: last); sentences are joined by one space.
//! 4. The user turn is `INTRO + "\n\n" + haystack + "\n\n" + QUESTION`, wrapped in the
//!    checkpoint's chat template with a generation prompt (raw, with BOS when the tokenizer wants
//!    it, when there is no template): see [`crate::prompt::prompt_ids`].
//! 5. `n` is the largest count whose prompt has at most `length` tokens: double `hi` from 1 until
//!    the prompt of `hi` sentences is longer than `length`, then bisect between the last fitting
//!    count `lo` and `hi` (`mid = (lo + hi) / 2`) until `hi = lo + 1`.

use crate::loader::TokenizerAssets;
use crate::prompt;
use crate::sampling::SamplingParams;
use crate::scheduler::FinishReason;
use crate::Engine;
use anyhow::{bail, Result};
use dayone_backend::Backend;
use std::collections::HashMap;

/// Words of the filler sentences (64, so `below(64)` picks one uniformly).
pub const FILLER_WORDS: [&str; 64] = [
    "the",
    "a",
    "river",
    "stone",
    "garden",
    "morning",
    "quiet",
    "old",
    "city",
    "road",
    "light",
    "window",
    "bread",
    "market",
    "song",
    "winter",
    "child",
    "teacher",
    "book",
    "table",
    "green",
    "small",
    "house",
    "field",
    "cloud",
    "letter",
    "train",
    "summer",
    "evening",
    "friend",
    "story",
    "bridge",
    "forest",
    "lamp",
    "door",
    "music",
    "paper",
    "warm",
    "long",
    "street",
    "boat",
    "harbor",
    "hill",
    "village",
    "candle",
    "clock",
    "rain",
    "wind",
    "carries",
    "finds",
    "keeps",
    "opens",
    "walks",
    "remembers",
    "sees",
    "builds",
    "near",
    "under",
    "over",
    "beside",
    "slowly",
    "often",
    "every",
    "after",
];

/// Words of needle values (none is a filler word).
pub const NEEDLE_WORDS: [&str; 16] = [
    "amber", "cobalt", "falcon", "granite", "juniper", "lantern", "meadow", "nimbus", "orchid",
    "pepper", "quartz", "saffron", "tundra", "velvet", "willow", "zephyr",
];

/// Mixed into the needle seed so that needles and filler come from different streams.
pub const NEEDLE_SALT: u64 = 0x9E37_79B9_7F4A_7C15;

/// First paragraph of the user turn.
pub const INTRO: &str = "Read the text below and answer the question after it.";

/// Last paragraph of the user turn.
pub const QUESTION: &str =
    "What is the secret passphrase mentioned in the text? Answer with the passphrase only.";

/// Knuth's MMIX linear congruential generator (`state · 6364136223846793005 +
/// 1442695040888963407` mod 2^64), chosen because it is three lines in any language.
#[derive(Clone, Debug)]
pub struct Lcg {
    state: u64,
}

impl Lcg {
    /// A generator whose first step starts from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// Steps once; the high 32 bits of the new state.
    pub fn next_u32(&mut self) -> u32 {
        self.state = self
            .state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.state >> 32) as u32
    }

    /// A value in `0..n` from the top bits of `next_u32()`: `(next_u32() · n) >> 32` (Lemire's
    /// multiply-shift; an LCG's low bits have short periods, so `% n` would repeat), `n ≥ 1`.
    pub fn below(&mut self, n: u32) -> u32 {
        ((self.next_u32() as u64 * n as u64) >> 32) as u32
    }
}

/// The endless filler stream of one seed, generated as far as asked.
#[derive(Clone, Debug)]
pub struct Filler {
    rng: Lcg,
    sentences: Vec<String>,
}

impl Filler {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Lcg::new(seed),
            sentences: Vec::new(),
        }
    }

    /// The first `n` sentences.
    pub fn first(&mut self, n: usize) -> &[String] {
        while self.sentences.len() < n {
            let words = 6 + self.rng.below(7);
            let mut s = String::new();
            for w in 0..words {
                let word = FILLER_WORDS[self.rng.below(64) as usize];
                if w == 0 {
                    let mut c = word.chars();
                    let first = c.next().map(|f| f.to_ascii_uppercase());
                    s.extend(first);
                    s.push_str(c.as_str());
                } else {
                    s.push(' ');
                    s.push_str(word);
                }
            }
            s.push('.');
            self.sentences.push(s);
        }
        &self.sentences[..n]
    }
}

/// The needle value `word-number` of a case (protocol step 2).
pub fn needle_value(seed: u64, length: usize, depth: u32, trial: u32) -> String {
    let key = (length as u64)
        .wrapping_mul(1000)
        .wrapping_add(depth as u64)
        .wrapping_add((trial as u64).wrapping_mul(1_000_000_007));
    let mut rng = Lcg::new(seed ^ NEEDLE_SALT ^ key);
    let word = NEEDLE_WORDS[rng.below(16) as usize];
    let number = 1000 + rng.below(9000);
    format!("{word}-{number}")
}

/// The sentence that carries `value`.
pub fn needle_sentence(value: &str) -> String {
    format!("The secret passphrase is {value}.")
}

/// Where the needle goes among `n` filler sentences at `depth` percent (protocol step 3).
pub fn needle_index(n: usize, depth: u32) -> usize {
    (depth as usize * n + 50) / 100
}

/// The user turn for `filler` with `needle` before sentence `index` (protocol step 4).
pub fn user_text(filler: &[String], needle: &str, index: usize) -> String {
    let mut parts: Vec<&str> = filler.iter().map(String::as_str).collect();
    parts.insert(index.min(filler.len()), needle);
    format!("{INTRO}\n\n{}\n\n{QUESTION}", parts.join(" "))
}

/// A length shorter than the prompt without any filler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooShort {
    /// The length asked for.
    pub length: usize,
    /// Tokens of the prompt with no filler sentence.
    pub needed: usize,
}

impl std::fmt::Display for TooShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "needle length {} is too short: the prompt without filler already has {} tokens",
            self.length, self.needed
        )
    }
}

impl std::error::Error for TooShort {}

/// One built case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeedleCase {
    /// Most prompt tokens asked for.
    pub length: usize,
    /// Depth of the needle in percent of the filler sentences (0 = first, 100 = last).
    pub depth: u32,
    /// Trial number (a different needle value on the same haystack).
    pub trial: u32,
    /// The hidden value `word-number`.
    pub needle: String,
    /// Filler sentences around the needle.
    pub filler_sentences: usize,
    /// The needle's sentence index among all `filler_sentences + 1` sentences.
    pub needle_index: usize,
    /// The prompt, chat-templated, `≤ length` tokens.
    pub prompt_ids: Vec<u32>,
}

/// Builds the case `(seed, length, depth, trial)` with the checkpoint's tokenizer (and chat
/// template when it has one), following the protocol in the module docs. `filler` must be the
/// stream of `seed` (pass one stream to all cases of a run: it is generated once).
///
/// Errors: no tokenizer, a depth over 100, or a length too short for the prompt without any
/// filler ([`TooShort`], which names the tokens that needs).
pub fn build_case(
    assets: &TokenizerAssets,
    filler: &mut Filler,
    seed: u64,
    length: usize,
    depth: u32,
    trial: u32,
) -> Result<NeedleCase> {
    if depth > 100 {
        bail!("needle depth {depth} is not a percentage in 0..=100");
    }
    let needle = needle_value(seed, length, depth, trial);
    let sentence = needle_sentence(&needle);
    let chat = assets.chat_template.is_some();
    let mut ids_for = |n: usize| -> Result<Vec<u32>> {
        let text = user_text(filler.first(n), &sentence, needle_index(n, depth));
        prompt::prompt_ids(assets, &text, chat, None)
    };
    let mut best = ids_for(0)?;
    if best.len() > length {
        return Err(TooShort {
            length,
            needed: best.len(),
        }
        .into());
    }
    let (mut lo, mut hi) = (0usize, 1usize);
    loop {
        let ids = ids_for(hi)?;
        if ids.len() > length {
            break;
        }
        (lo, best) = (hi, ids);
        hi *= 2;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let ids = ids_for(mid)?;
        if ids.len() <= length {
            (lo, best) = (mid, ids);
        } else {
            hi = mid;
        }
    }
    Ok(NeedleCase {
        length,
        depth,
        trial,
        needle,
        filler_sentences: lo,
        needle_index: needle_index(lo, depth),
        prompt_ids: best,
    })
}

/// Whether an answer finds the needle: it contains the value, ignoring ASCII case.
pub fn is_correct(answer: &str, needle: &str) -> bool {
    answer
        .to_ascii_lowercase()
        .contains(&needle.to_ascii_lowercase())
}

/// One case's answer: the generated ids (an EOS included) and why it stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// Generated token ids.
    pub ids: Vec<u32>,
    /// Why generation stopped.
    pub finish: Option<FinishReason>,
}

/// The cases that go first: per length, the deepest needle (its prompt holds the longest stretch
/// of filler that the other cases of that length share).
pub fn leaders(cases: &[NeedleCase]) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        match best.iter_mut().find(|j| cases[**j].length == c.length) {
            Some(j) if cases[*j].depth < c.depth => *j = i,
            Some(_) => {}
            None => best.push(i),
        }
    }
    best
}

/// Answers every case on `engine` with `params`, in two waves: the [`leaders`] first, the rest
/// once every leader has finished its prefill, so that with prefix caching on the rest find the
/// shared chat header and filler in the cache (requests admitted in the same step cannot hit
/// each other's blocks). `on_finish` runs once per finished case. Answers come in case order.
///
/// Errors: a request the engine refuses (too long for the cache), or a failed step.
pub fn run_cases<B: Backend>(
    engine: &mut Engine<B>,
    cases: &[NeedleCase],
    params: &SamplingParams,
    on_finish: &mut dyn FnMut(),
) -> Result<Vec<Answer>> {
    let first = leaders(cases);
    let mut answers = vec![Answer::default(); cases.len()];
    let mut by_id = HashMap::new();
    let add = |engine: &mut Engine<B>, i: usize| -> Result<u64> {
        let c = &cases[i];
        engine
            .add_request(c.prompt_ids.clone(), params.clone())
            .map_err(|e| {
                e.context(format!(
                    "needle case length {}, depth {} %",
                    c.length, c.depth
                ))
            })
    };
    for &i in &first {
        by_id.insert(add(engine, i)?, i);
    }
    let mut pending: Vec<usize> = (0..cases.len()).filter(|i| !first.contains(i)).collect();
    while engine.has_unfinished() || !pending.is_empty() {
        if !pending.is_empty() && first.iter().all(|&i| !answers[i].ids.is_empty()) {
            for i in std::mem::take(&mut pending) {
                by_id.insert(add(engine, i)?, i);
            }
        }
        for e in engine.step()? {
            let a = &mut answers[by_id[&e.seq_id]];
            a.ids.push(e.token);
            if e.finish.is_some() {
                a.finish = e.finish;
                on_finish();
            }
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lcg_matches_the_mmix_constants() {
        let mut r = Lcg::new(0);
        // state1 = 1442695040888963407 -> high bits 0x14057B7E
        assert_eq!(r.next_u32(), (1_442_695_040_888_963_407u64 >> 32) as u32);
    }

    #[test]
    fn filler_is_a_stable_stream() {
        let a = Filler::new(7).first(5).to_vec();
        let mut f = Filler::new(7);
        f.first(2);
        assert_eq!(f.first(5), &a[..]);
        assert!(a
            .iter()
            .all(|s| s.ends_with('.') && s.starts_with(char::is_uppercase)));
        assert_ne!(Filler::new(8).first(5), &a[..]);
    }

    #[test]
    fn needle_positions_span_the_text() {
        assert_eq!(needle_index(10, 0), 0);
        assert_eq!(needle_index(10, 50), 5);
        assert_eq!(needle_index(10, 100), 10);
        let t = user_text(&["A b.".into(), "C d.".into()], "N.", 2);
        assert!(t.ends_with(&format!("A b. C d. N.\n\n{QUESTION}")), "{t}");
    }

    fn case(length: usize, depth: u32) -> NeedleCase {
        NeedleCase {
            length,
            depth,
            trial: 0,
            needle: String::new(),
            filler_sentences: 0,
            needle_index: 0,
            prompt_ids: Vec::new(),
        }
    }

    #[test]
    fn leaders_are_the_deepest_case_of_each_length() {
        let cases = [
            case(256, 0),
            case(256, 100),
            case(512, 50),
            case(256, 50),
            case(512, 25),
        ];
        assert_eq!(leaders(&cases), vec![1, 2]);
    }

    #[test]
    fn needle_values_differ_by_case_and_score_case_insensitively() {
        let v = needle_value(0, 512, 50, 0);
        assert_ne!(v, needle_value(0, 512, 75, 0));
        assert_ne!(v, needle_value(0, 512, 50, 1));
        assert!(is_correct(
            &format!("The passphrase is {}.", v.to_uppercase()),
            &v
        ));
        assert!(!is_correct("amber", &v));
    }
}
