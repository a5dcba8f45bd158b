//! The prompts a run sends: vLLM's `random` dataset (uniform token ids, optional shared prefix)
//! and its `sharegpt` dataset (the first human turn of each conversation, the reply's length as
//! the output length).

use anyhow::{bail, Context, Result};
use dayone_engine::tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Deserializer};
use std::path::Path;

/// What a request carries as its prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Token ids, sent as `prompt: [ids]` to `/v1/completions` (exact input lengths).
    Ids(Vec<u32>),
    /// Text: the completions `prompt` string or the chat user message.
    Text(String),
}

/// One request of the dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Prompt length in tokens (exact for ids, tokenizer-counted for text with `--tokenizer`,
    /// otherwise about chars/4; see [`SampleRequest::prompt_len_counted`]).
    pub prompt_len: usize,
    /// Whether `prompt_len` was counted (ids or a tokenizer) rather than estimated as chars/4;
    /// estimated lengths give way to the server's `usage.prompt_tokens` when it reports one.
    pub prompt_len_counted: bool,
    /// Tokens to ask for (`max_tokens`).
    pub output_len: usize,
}

/// The ids the random dataset draws from.
#[derive(Clone, Debug)]
pub enum Vocab {
    /// Every id in `0..n` (`--random-vocab-size`).
    Range(u32),
    /// These ids (a tokenizer's ordinary vocabulary, without added/special tokens).
    Ids(Vec<u32>),
}

impl Vocab {
    /// The tokenizer's ordinary ids: `0..vocab_size(without added tokens)` minus any id that is
    /// an added or special token.
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Vocab> {
        let base = tok.inner.get_vocab_size(false) as u32;
        let added = tok.inner.get_added_tokens_decoder();
        let ids: Vec<u32> = (0..base).filter(|id| !added.contains_key(id)).collect();
        if ids.is_empty() {
            bail!("the tokenizer has no ordinary (non-special) tokens to draw random prompts from");
        }
        Ok(Vocab::Ids(ids))
    }

    fn sample(&self, rng: &mut StdRng) -> u32 {
        match self {
            Vocab::Range(n) => rng.random_range(0..*n),
            Vocab::Ids(ids) => ids[rng.random_range(0..ids.len())],
        }
    }
}

/// The `random` dataset's knobs (vLLM's `--random-*` flags).
#[derive(Clone, Debug)]
pub struct RandomSpec {
    /// Requests to make.
    pub num_prompts: usize,
    /// Mean input length in tokens, not counting the prefix.
    pub input_len: usize,
    /// Mean output length in tokens.
    pub output_len: usize,
    /// Lengths are uniform integers in `[floor(len·(1−r)), ceil(len·(1+r))]` (at least 1).
    pub range_ratio: f64,
    /// Tokens of one random prefix shared by every prompt.
    pub prefix_len: usize,
    /// Seed of the draws.
    pub seed: u64,
}

/// The inclusive length range `[floor(len·(1−r)), ceil(len·(1+r))]`, low end at least 1.
pub fn length_range(len: usize, ratio: f64) -> (usize, usize) {
    let lo = ((len as f64) * (1.0 - ratio)).floor().max(1.0) as usize;
    let hi = ((len as f64) * (1.0 + ratio)).ceil().max(lo as f64) as usize;
    (lo, hi)
}

/// The random dataset. Prompts are ids drawn uniformly from `vocab`; with `as_text` (the chat
/// endpoint) they are decoded with `tok` and their length is the re-encoded text's, which is
/// approximate (decode→encode does not round-trip, and the server adds its chat template).
pub fn random_requests(
    spec: &RandomSpec,
    vocab: &Vocab,
    as_text: Option<&Tokenizer>,
) -> Result<Vec<SampleRequest>> {
    random_batch(spec, vocab, as_text, 0)
}

/// Batch `batch` of the random dataset (the soak's fresh prompts): batch 0 is
/// [`random_requests`]; later batches keep its shared prefix and draw new prompts from a
/// stream of their own (same seed and batch, same prompts).
pub fn random_batch(
    spec: &RandomSpec,
    vocab: &Vocab,
    as_text: Option<&Tokenizer>,
    batch: u64,
) -> Result<Vec<SampleRequest>> {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let prefix: Vec<u32> = (0..spec.prefix_len)
        .map(|_| vocab.sample(&mut rng))
        .collect();
    if batch > 0 {
        rng = StdRng::seed_from_u64(spec.seed ^ batch.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
    let (in_lo, in_hi) = length_range(spec.input_len, spec.range_ratio);
    let (out_lo, out_hi) = length_range(spec.output_len, spec.range_ratio);
    let mut out = Vec::with_capacity(spec.num_prompts);
    for _ in 0..spec.num_prompts {
        let in_len = rng.random_range(in_lo..=in_hi);
        let output_len = rng.random_range(out_lo..=out_hi);
        let mut ids = prefix.clone();
        ids.extend((0..in_len).map(|_| vocab.sample(&mut rng)));
        let (prompt, prompt_len) = match as_text {
            None => {
                let n = ids.len();
                (Prompt::Ids(ids), n)
            }
            Some(tok) => {
                let text = tok.decode(&ids, false)?;
                let n = tok.encode(&text, false)?.len();
                (Prompt::Text(text), n)
            }
        };
        out.push(SampleRequest {
            prompt,
            prompt_len,
            prompt_len_counted: true,
            output_len,
        });
    }
    Ok(out)
}

/// The shape `--dataset-path` must have, for error messages.
pub const SHAREGPT_SHAPE: &str =
    "a JSON list of {\"conversations\": [{\"from\": \"human\"|\"gpt\", \"value\": \"...\"}, ...]}";

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    conversations: Option<Vec<Turn>>,
}

#[derive(Deserialize)]
struct Turn {
    #[serde(default, deserialize_with = "lenient_string")]
    from: String,
    #[serde(default, deserialize_with = "lenient_string")]
    value: String,
}

/// A string, or "" for anything else (some ShareGPT dumps hold nulls).
fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        _ => String::new(),
    })
}

fn is_user(from: &str) -> bool {
    matches!(from, "human" | "user")
}

fn is_assistant(from: &str) -> bool {
    matches!(
        from,
        "gpt" | "assistant" | "chatgpt" | "bard" | "bing" | "model"
    )
}

/// (prompt, reply) pairs of a ShareGPT JSON text: per conversation, the first human turn and the
/// gpt turn right after it; conversations without such a pair are skipped. Errors say what
/// shape was expected (the caller adds the file name).
pub fn parse_sharegpt(text: &str) -> Result<Vec<(String, String)>, String> {
    let entries: Vec<Entry> = serde_json::from_str(text)
        .map_err(|e| format!("not a ShareGPT dataset (expected {SHAREGPT_SHAPE}): {e}"))?;
    let n = entries.len();
    let pairs: Vec<(String, String)> = entries
        .into_iter()
        .filter_map(|e| {
            let turns = e.conversations?;
            let i = turns.iter().position(|t| is_user(&t.from))?;
            let reply = turns.get(i + 1).filter(|t| is_assistant(&t.from))?;
            Some((turns[i].value.clone(), reply.value.clone()))
        })
        .collect();
    if pairs.is_empty() {
        return Err(format!(
            "no conversation with a human turn followed by a gpt turn among {n} entries \
             (expected {SHAREGPT_SHAPE})"
        ));
    }
    Ok(pairs)
}

/// Token count of `text`: the tokenizer's, or about chars/4 (at least 1) without one. The flag
/// says which.
fn count_tokens(text: &str, tok: Option<&Tokenizer>) -> Result<(usize, bool)> {
    Ok(match tok {
        Some(t) => (t.encode(text, false)?.len(), true),
        None => (text.chars().count().div_ceil(4).max(1), false),
    })
}

/// vLLM's ShareGPT filter: prompts of 4..=1024 tokens, replies of ≥ 4 (unless the output length
/// is fixed), prompt + output ≤ 2048.
fn sharegpt_valid(prompt_len: usize, output_len: usize, fixed_output: bool) -> bool {
    prompt_len >= 4
        && (fixed_output || output_len >= 4)
        && prompt_len <= 1024
        && prompt_len + output_len <= 2048
}

/// The ShareGPT dataset from `path`: pairs shuffled with `seed`, filtered as vLLM does, the
/// first `num_prompts` kept (repeated round-robin when fewer pass). Output lengths are the
/// reply's token count (tokenizer, else chars/4) unless `fixed_output_len` is given.
pub fn sharegpt_requests(
    path: &Path,
    num_prompts: usize,
    fixed_output_len: Option<usize>,
    tok: Option<&Tokenizer>,
    seed: u64,
) -> Result<Vec<SampleRequest>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read dataset {}", path.display()))?;
    let mut pairs =
        parse_sharegpt(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    drop(text);
    pairs.shuffle(&mut StdRng::seed_from_u64(seed));
    let mut out = Vec::with_capacity(num_prompts);
    for (prompt, reply) in pairs {
        if out.len() == num_prompts {
            break;
        }
        let (prompt_len, counted) = count_tokens(&prompt, tok)?;
        let output_len = match fixed_output_len {
            Some(n) => n,
            None => count_tokens(&reply, tok)?.0,
        };
        if !sharegpt_valid(prompt_len, output_len, fixed_output_len.is_some()) {
            continue;
        }
        out.push(SampleRequest {
            prompt: Prompt::Text(prompt),
            prompt_len,
            prompt_len_counted: counted,
            output_len,
        });
    }
    if out.is_empty() {
        bail!(
            "{}: no conversation passes vLLM's ShareGPT filter (prompt 4..=1024 tokens, reply ≥ 4, \
             prompt + reply ≤ 2048)",
            path.display()
        );
    }
    let kept = out.len();
    for i in 0..num_prompts.saturating_sub(kept) {
        out.push(out[i % kept].clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: usize, input: usize, output: usize, r: f64, prefix: usize) -> RandomSpec {
        RandomSpec {
            num_prompts: n,
            input_len: input,
            output_len: output,
            range_ratio: r,
            prefix_len: prefix,
            seed: 7,
        }
    }

    #[test]
    fn random_lengths_ids_and_prefix() {
        let reqs = random_requests(&spec(50, 16, 4, 0.0, 3), &Vocab::Range(100), None).unwrap();
        assert_eq!(reqs.len(), 50);
        let Prompt::Ids(first) = &reqs[0].prompt else {
            panic!("ids expected")
        };
        for r in &reqs {
            let Prompt::Ids(ids) = &r.prompt else {
                panic!("ids expected")
            };
            assert_eq!(ids.len(), 19);
            assert_eq!(r.prompt_len, 19);
            assert_eq!(r.output_len, 4);
            assert!(ids.iter().all(|&i| i < 100));
            assert_eq!(&ids[..3], &first[..3], "shared prefix");
        }
        // Same seed, same prompts.
        let again = random_requests(&spec(50, 16, 4, 0.0, 3), &Vocab::Range(100), None).unwrap();
        assert_eq!(reqs, again);
    }

    #[test]
    fn random_batches_keep_prefix_and_change_prompts() {
        let sp = spec(20, 16, 4, 0.0, 3);
        let b0 = random_batch(&sp, &Vocab::Range(1000), None, 0).unwrap();
        assert_eq!(b0, random_requests(&sp, &Vocab::Range(1000), None).unwrap());
        let b1 = random_batch(&sp, &Vocab::Range(1000), None, 1).unwrap();
        let b2 = random_batch(&sp, &Vocab::Range(1000), None, 2).unwrap();
        assert_eq!(b1, random_batch(&sp, &Vocab::Range(1000), None, 1).unwrap());
        let ids = |r: &SampleRequest| match &r.prompt {
            Prompt::Ids(v) => v.clone(),
            Prompt::Text(_) => panic!("ids expected"),
        };
        assert_eq!(ids(&b0[0])[..3], ids(&b1[0])[..3], "same shared prefix");
        assert_eq!(ids(&b0[0])[..3], ids(&b2[5])[..3]);
        assert_ne!(ids(&b0[0]), ids(&b1[0]), "fresh prompts");
        assert_ne!(ids(&b1[0]), ids(&b2[0]));
        assert!(b1.iter().all(|r| r.prompt_len == 19 && r.output_len == 4));
    }

    #[test]
    fn random_range_ratio_bounds() {
        assert_eq!(length_range(100, 0.5), (50, 150));
        assert_eq!(length_range(3, 0.5), (1, 5));
        assert_eq!(length_range(1, 0.9), (1, 2));
        let reqs = random_requests(&spec(400, 100, 10, 0.5, 0), &Vocab::Range(10), None).unwrap();
        let lens: Vec<usize> = reqs.iter().map(|r| r.prompt_len).collect();
        assert!(lens.iter().all(|&l| (50..=150).contains(&l)));
        assert!(lens.iter().any(|&l| l < 70) && lens.iter().any(|&l| l > 130));
        assert!(reqs.iter().all(|r| (5..=15).contains(&r.output_len)));
    }

    #[test]
    fn random_draws_only_listed_ids() {
        let vocab = Vocab::Ids(vec![5, 9]);
        let reqs = random_requests(&spec(5, 20, 2, 0.0, 0), &vocab, None).unwrap();
        for r in reqs {
            let Prompt::Ids(ids) = r.prompt else {
                panic!("ids expected")
            };
            assert!(ids.iter().all(|&i| i == 5 || i == 9));
        }
    }

    #[test]
    fn sharegpt_pairs() {
        let text = r#"[
          {"id": "a", "conversations": [{"from": "human", "value": "hello there"},
                                        {"from": "gpt", "value": "general kenobi"}]},
          {"id": "b", "conversations": [{"from": "system", "value": "be nice"},
                                        {"from": "human", "value": "q"},
                                        {"from": "gpt", "value": "r"},
                                        {"from": "human", "value": "q2"}]},
          {"id": "c", "conversations": [{"from": "human", "value": "only one"}]},
          {"id": "d", "conversations": []},
          {"id": "e", "conversations": [{"from": "human", "value": null}, {"from": "gpt", "value": "x"}]},
          {"id": "f"}
        ]"#;
        let pairs = parse_sharegpt(text).unwrap();
        assert_eq!(
            pairs,
            vec![
                ("hello there".to_string(), "general kenobi".to_string()),
                ("q".to_string(), "r".to_string()),
                (String::new(), "x".to_string()),
            ]
        );
    }

    #[test]
    fn sharegpt_wrong_shape_says_what_was_expected() {
        for bad in [
            "{\"conversations\": []}",
            "not json",
            "[1, 2]",
            "[{\"x\": 1}]",
            "[]",
        ] {
            let e = parse_sharegpt(bad).unwrap_err();
            assert!(e.contains("conversations"), "{bad}: {e}");
        }
    }

    #[test]
    fn sharegpt_file_filter_and_oversample() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sg.json");
        let long = "word ".repeat(40); // 200 chars ≈ 50 tokens
        let text = serde_json::json!([
            {"conversations": [{"from": "human", "value": long}, {"from": "gpt", "value": "abcdefghijklmnopqrstuvwx"}]},
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "abcdefghijklmnop"}]},
        ]);
        std::fs::write(&path, text.to_string()).unwrap();
        let reqs = sharegpt_requests(&path, 3, None, None, 0).unwrap();
        assert_eq!(reqs.len(), 3, "one valid pair, repeated");
        for r in &reqs {
            assert_eq!(r.prompt_len, 50);
            assert!(!r.prompt_len_counted);
            assert_eq!(r.output_len, 6);
        }
        let fixed = sharegpt_requests(&path, 1, Some(32), None, 0).unwrap();
        assert_eq!(fixed[0].output_len, 32);
        let missing = dir.path().join("nope.json");
        let e = format!(
            "{:#}",
            sharegpt_requests(&missing, 1, None, None, 0).unwrap_err()
        );
        assert!(e.contains("nope.json"), "{e}");
        std::fs::write(&path, "{\"a\": 1}").unwrap();
        let e = format!(
            "{:#}",
            sharegpt_requests(&path, 1, None, None, 0).unwrap_err()
        );
        assert!(e.contains("sg.json") && e.contains("conversations"), "{e}");
    }
}
