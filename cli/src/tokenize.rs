//! `dayone tokenize`: the ids a prompt becomes (exactly as `generate` would build them: BOS,
//! chat template) and the text piece of each id.

use crate::prompt_input::{self, Prompt, PromptFlags};
use crate::usage::usage;
use crate::{load, outln};
use anyhow::{bail, Result};
use clap::Args;
use dayone_engine::prompt;
use std::path::PathBuf;

/// Flags of `dayone tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Model directory or .gguf file; default: SmolLM2-135M-Instruct.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Text to tokenize; `-` reads stdin (as does piping text with no prompt flag).
    #[arg(short = 'p', long, conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the text from FILE (`-`: stdin); one trailing newline is dropped.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Wrap the text in the model's chat template as a user turn (as `generate --chat`).
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// One JSON object (`ids`, `pieces`, `count`) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `dayone tokenize`.
pub fn run(a: TokenizeArgs) -> Result<()> {
    if a.system.is_some() && !a.chat {
        return Err(usage(
            "--system is the system message of --chat: add --chat or drop --system",
        ));
    }
    let Prompt::Text(text) = prompt_input::resolve(&PromptFlags {
        text: a.prompt.as_deref(),
        file: a.prompt_file.as_deref(),
        ids: None,
    })?
    else {
        unreachable!("no --prompt-ids flag here")
    };
    let path = load::model_path(a.model.clone())?;
    let ckpt = load::open(&path)?;
    let Some(tok) = ckpt.assets.tokenizer.as_ref() else {
        bail!(
            "{}: no tokenizer (tokenizer.json or GGUF vocabulary) to tokenize with",
            ckpt.path.display()
        );
    };
    let ids = prompt::prompt_ids(&ckpt.assets, &text, a.chat, a.system.as_deref())?;
    // Each id's own text, special tokens included (`<|im_start|>`), as the model sees them.
    let pieces = ids
        .iter()
        .map(|&id| tok.decode(&[id], false))
        .collect::<Result<Vec<String>>>()?;
    if a.json {
        return outln!(
            "{}",
            serde_json::json!({ "ids": ids, "pieces": pieces, "count": ids.len() })
        );
    }
    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    outln!("{} tokens: {}", ids.len(), list.join(","))?;
    for (id, piece) in ids.iter().zip(&pieces) {
        outln!("{id:>8}  {piece:?}")?;
    }
    Ok(())
}
