//! Turning a user's text into prompt ids: raw (with BOS when the tokenizer wants it) or through
//! the checkpoint's chat template.

use crate::chat_template::{ChatMessage, ChatTemplate};
use crate::loader::TokenizerAssets;
use anyhow::{bail, Context, Result};

/// Prompt ids for `text`. With `chat`, the text becomes the user turn (after an optional system
/// turn) of the checkpoint's chat template, rendered with a generation prompt.
///
/// Errors: no tokenizer in the checkpoint (use `--prompt-ids`), no chat template with `chat`,
/// an empty prompt, or a template that fails to render.
pub fn prompt_ids(
    assets: &TokenizerAssets,
    text: &str,
    chat: bool,
    system: Option<&str>,
) -> Result<Vec<u32>> {
    if text.is_empty() {
        bail!("the prompt is empty: give --prompt TEXT or --prompt-ids");
    }
    // The chat template first: `--prompt-ids`, the way around a missing tokenizer, excludes --chat.
    let template = match (chat, assets.chat_template.as_deref()) {
        (false, _) => None,
        (true, Some(src)) => Some(src),
        (true, None) => bail!("this checkpoint has no chat template (tokenizer_config.json, chat_template.jinja or GGUF metadata): drop --chat"),
    };
    let Some(tok) = assets.tokenizer.as_ref() else {
        bail!("this checkpoint has no tokenizer (tokenizer.json or GGUF vocabulary): pass --prompt-ids");
    };
    if let Some(src) = template {
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(ChatMessage {
                role: "system".into(),
                content: s.into(),
            });
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: text.into(),
        });
        let rendered = ChatTemplate::new(src)?
            .render(
                &messages,
                true,
                assets.bos_token.as_deref().unwrap_or(""),
                assets.eos_token.as_deref().unwrap_or(""),
            )
            .context("rendering the chat template")?;
        // The template writes any BOS itself.
        return tok.encode(&rendered, false);
    }
    let mut ids = tok.encode(text, false)?;
    if assets.add_bos {
        ensure_bos(&mut ids, assets.bos_id);
    }
    Ok(ids)
}

/// Puts `bos` in front of a prompt's `ids` unless it is already there (`tokenizer_config.json`'s
/// `add_bos_token` for a tokenizer whose post-processor may or may not have added it). `None`:
/// no BOS id known, nothing added.
pub fn ensure_bos(ids: &mut Vec<u32>, bos: Option<u32>) {
    if let Some(b) = bos.filter(|b| ids.first() != Some(b)) {
        ids.insert(0, b);
    }
}

/// Parses `--prompt-ids 1,2,3`.
///
/// Errors: an empty list, an empty entry (`1,,2`) or an entry that is not a `u32`.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    if s.trim().is_empty() {
        bail!("--prompt-ids is empty: give comma-separated token ids");
    }
    s.split(',')
        .map(|x| x.trim())
        .enumerate()
        .map(|(i, x)| {
            if x.is_empty() {
                bail!(
                    "--prompt-ids: entry {} of '{s}' is empty (expected comma-separated integers)",
                    i + 1
                );
            }
            x.parse::<u32>().with_context(|| {
                format!("--prompt-ids: '{x}' is not a token id (expected comma-separated integers)")
            })
        })
        .collect()
}
