//! Tokenizers built from GGUF vocabularies (`tokenizer.ggml.*` metadata).
//!
//! `tokenizer.ggml.model = "gpt2"` is byte-level BPE. How text is split before BPE depends on
//! llama.cpp's pre-tokenizer name (`tokenizer.ggml.pre`):
//! - `default`, `gpt2`, `gpt-2`, `phi-2`: the GPT-2 regex (the `ByteLevel` pre-tokenizer);
//! - `smollm`, `starcoder`, `refact`: every digit on its own, then the GPT-2 regex;
//! - `llama3`, `llama-bpe`, `smaug-bpe`, `dbrx`: Llama 3's regex (numbers in runs of up to
//!   three digits), whole words looked up before merging;
//! - `qwen2`, `deepseek-r1-qwen`: Llama 3's regex with single digits.

use ahash::AHashMap;
use anyhow::{anyhow, bail, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

/// llama.cpp token types.
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_CONTROL: i32 = 3;

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Pre-tokenizer names understood, for error messages.
pub(crate) const SUPPORTED_PRE: &[&str] = &[
    "default",
    "gpt2",
    "gpt-2",
    "phi-2",
    "smollm",
    "starcoder",
    "refact",
    "llama3",
    "llama-bpe",
    "smaug-bpe",
    "dbrx",
    "qwen2",
    "deepseek-r1-qwen",
];

/// The pre-tokenizer for a llama.cpp `pre` name, and whether whole words skip merging.
fn pre_tokenizer(pre: &str) -> Result<(PreTokenizerWrapper, bool)> {
    let gpt2 = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    let regex = |re: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| anyhow!("pre-tokenizer regex: {e}"))?;
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
        ])))
    };
    Ok(match pre {
        "default" | "gpt2" | "gpt-2" | "phi-2" => (gpt2(), false),
        "smollm" | "starcoder" | "refact" => (
            PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                gpt2(),
            ])),
            false,
        ),
        "llama3" | "llama-bpe" | "smaug-bpe" | "dbrx" => (regex(LLAMA3_REGEX)?, true),
        "qwen2" | "deepseek-r1-qwen" => (regex(QWEN2_REGEX)?, false),
        other => bail!(
            "tokenizer.ggml.pre = \"{other}\" is not supported (supported: {})",
            SUPPORTED_PRE.join(", ")
        ),
    })
}

/// Builds a byte-level BPE tokenizer from a GGUF `gpt2` vocabulary; see
/// [`crate::tokenizer::Tokenizer::from_gpt2_vocab`].
pub(crate) fn build_gpt2(
    tokens: &[String],
    merges: &[String],
    token_types: &[i32],
    pre: &str,
    bos_id: Option<u32>,
    add_bos: bool,
) -> Result<tokenizers::Tokenizer> {
    if tokens.is_empty() {
        bail!("tokenizer.ggml.tokens is empty");
    }
    if token_types.len() != tokens.len() {
        bail!(
            "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
            token_types.len(),
            tokens.len()
        );
    }
    let (pre_tok, ignore_merges) = pre_tokenizer(pre)?;
    let mut vocab: AHashMap<String, u32> = AHashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        // On duplicates the first id wins, as in llama.cpp's text → id map.
        vocab.entry(t.clone()).or_insert(i as u32);
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let (a, b) = m.split_once(' ').ok_or_else(|| {
            anyhow!("tokenizer.ggml.merges[{i}] = {m:?} is not two tokens separated by a space")
        })?;
        pairs.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| anyhow!("invalid BPE vocabulary: {e}"))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(pre_tok));
    tok.with_decoder(Some(ByteLevelDecoder::new(true, true, true)));
    let specials: Vec<AddedToken> = tokens
        .iter()
        .zip(token_types)
        .filter(|(_, &ty)| ty == TYPE_CONTROL)
        .map(|(t, _)| AddedToken::from(t.clone(), true))
        .collect();
    let user: Vec<AddedToken> = tokens
        .iter()
        .zip(token_types)
        .filter(|(_, &ty)| ty == TYPE_USER_DEFINED)
        .map(|(t, _)| AddedToken::from(t.clone(), false))
        .collect();
    tok.add_special_tokens(specials)
        .map_err(|e| anyhow!("adding control tokens: {e}"))?;
    tok.add_tokens(user)
        .map_err(|e| anyhow!("adding user-defined tokens: {e}"))?;
    if add_bos {
        let bos =
            bos_id.ok_or_else(|| anyhow!("add_bos_token is set but there is no bos_token_id"))?;
        let text = tokens.get(bos as usize).ok_or_else(|| {
            anyhow!(
                "bos_token_id {bos} is outside the vocabulary ({} tokens)",
                tokens.len()
            )
        })?;
        let tp = TemplateProcessing::builder()
            .try_single(format!("{text} $A"))
            .map_err(|e| anyhow!("BOS template: {e}"))?
            .try_pair(format!("{text} $A {text} $B:1"))
            .map_err(|e| anyhow!("BOS template: {e}"))?
            .special_tokens(vec![(text.clone(), bos)])
            .build()
            .map_err(|e| anyhow!("BOS template: {e}"))?;
        tok.with_post_processor(Some(tp));
    }
    Ok(tok)
}
