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
        add_bos_processor(&mut tok, tokens, bos)?;
    }
    Ok(tok)
}

/// SentencePiece-style vocabulary facts from GGUF metadata (`tokenizer.ggml.model = "llama"`).
pub(crate) struct SpmVocab<'a> {
    /// Token strings (`▁` for spaces, `<0x0A>` byte tokens).
    pub tokens: &'a [String],
    /// Merge scores; higher merges first.
    pub scores: &'a [f32],
    /// llama.cpp token types.
    pub token_types: &'a [i32],
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.bos_token_id` and whether raw prompts start with it.
    pub bos_id: Option<u32>,
    /// Prepend BOS in `encode(text, true)`.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_space_prefix` (default true): a space before each text fragment.
    pub add_space_prefix: bool,
}

const TYPE_NORMAL: i32 = 1;

/// Builds a SentencePiece BPE tokenizer (Llama/Mistral GGUF vocabularies): spaces become `▁`,
/// adjacent pieces merge by the score of the merged piece (highest first), characters outside
/// the vocabulary fall back to `<0xXX>` byte tokens.
pub(crate) fn build_spm(v: &SpmVocab) -> Result<tokenizers::Tokenizer> {
    use tokenizers::decoders::byte_fallback::ByteFallback;
    use tokenizers::decoders::fuse::Fuse;
    use tokenizers::decoders::sequence::Sequence as DecoderSequence;
    use tokenizers::decoders::strip::Strip;
    use tokenizers::normalizers::{Prepend, Replace, Sequence as NormSequence};
    use tokenizers::{DecoderWrapper, NormalizerWrapper};

    let n = v.tokens.len();
    if n == 0 {
        bail!("tokenizer.ggml.tokens is empty");
    }
    if v.token_types.len() != n || v.scores.len() != n {
        bail!(
            "tokenizer.ggml.tokens has {n} entries but token_type has {} and scores {}",
            v.token_types.len(),
            v.scores.len()
        );
    }
    let mut vocab: AHashMap<String, u32> = AHashMap::with_capacity(n);
    for (i, t) in v.tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(i as u32);
    }
    // Merges: every split of a normal or user-defined piece into two vocabulary pieces, ranked
    // by the piece's score (ties: lower id first, then the shorter left part).
    let mergeable = |i: usize| matches!(v.token_types[i], TYPE_NORMAL | TYPE_USER_DEFINED);
    let mut ranked: Vec<(f32, u32, usize, String, String)> = Vec::new();
    for (i, t) in v.tokens.iter().enumerate() {
        if !mergeable(i) || vocab.get(t) != Some(&(i as u32)) {
            continue;
        }
        for (k, _) in t.char_indices().skip(1) {
            let (a, b) = t.split_at(k);
            let ok = |s: &str| vocab.get(s).is_some_and(|&j| mergeable(j as usize));
            if ok(a) && ok(b) {
                ranked.push((v.scores[i], i as u32, k, a.to_string(), b.to_string()));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    let merges: Vec<(String, String)> = ranked.into_iter().map(|(_, _, _, a, b)| (a, b)).collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = v.unk_id {
        let text = v.tokens.get(unk as usize).ok_or_else(|| {
            anyhow!("unknown_token_id {unk} is outside the vocabulary ({n} tokens)")
        })?;
        builder = builder.unk_token(text.clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| anyhow!("invalid SentencePiece vocabulary: {e}"))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    let space = Replace::new(" ", "▁").map_err(|e| anyhow!("normalizer: {e}"))?;
    let norm: NormalizerWrapper = if v.add_space_prefix {
        NormSequence::new(vec![Prepend::new("▁".into()).into(), space.into()]).into()
    } else {
        space.into()
    };
    tok.with_normalizer(Some(norm))
        .map_err(|e| anyhow!("normalizer: {e}"))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ")
            .map_err(|e| anyhow!("decoder: {e}"))?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if v.add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    let pick = |ty: i32, special: bool| -> Vec<AddedToken> {
        v.tokens
            .iter()
            .zip(v.token_types)
            .filter(|(_, &t)| t == ty)
            .map(|(s, _)| AddedToken::from(s.clone(), special))
            .collect()
    };
    tok.add_special_tokens(pick(TYPE_CONTROL, true))
        .map_err(|e| anyhow!("adding control tokens: {e}"))?;
    tok.add_tokens(pick(TYPE_USER_DEFINED, false))
        .map_err(|e| anyhow!("adding user-defined tokens: {e}"))?;
    if v.add_bos {
        let bos = v
            .bos_id
            .ok_or_else(|| anyhow!("add_bos_token is set but there is no bos_token_id"))?;
        add_bos_processor(&mut tok, v.tokens, bos)?;
    }
    Ok(tok)
}

/// Makes `encode(text, true)` prepend BOS.
fn add_bos_processor(tok: &mut tokenizers::Tokenizer, tokens: &[String], bos: u32) -> Result<()> {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn split(pre: &str, text: &str) -> Vec<String> {
        let (pt, _) = pre_tokenizer(pre).unwrap();
        let mut s = PreTokenizedString::from(text);
        pt.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.to_string())
            .collect()
    }

    #[test]
    fn pre_tokenizers() {
        for name in SUPPORTED_PRE {
            assert!(pre_tokenizer(name).is_ok(), "{name}");
        }
        assert_eq!(split("gpt2", "ab 12345!"), ["ab", "Ġ12345", "!"]);
        assert_eq!(split("smollm", "ab 123"), ["ab", "Ġ", "1", "2", "3"]);
        assert_eq!(
            split("llama3", "ab 12345\n\n x"),
            ["ab", "Ġ", "123", "45", "ĊĊ", "Ġx"]
        );
        assert_eq!(split("qwen2", "Hi 42"), ["Hi", "Ġ", "4", "2"]);
        assert!(pre_tokenizer("nope").is_err());
    }
}
