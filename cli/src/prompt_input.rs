//! Where a prompt comes from: `--prompt TEXT`, `--prompt -` or `--prompt-file FILE|-` (stdin),
//! `--prompt-ids 1,2,3`, or text piped to stdin when none of them is given (as `llama-cli -f`
//! and `cat prompt.txt | llm` users expect).

use crate::usage::usage;
use anyhow::{Context, Result};
use dayone_engine::prompt;
use std::io::{IsTerminal, Read};
use std::path::Path;

/// A prompt as the user gave it.
#[derive(Debug)]
pub enum Prompt {
    /// Text for the tokenizer (or the chat template).
    Text(String),
    /// Token ids, bypassing the tokenizer.
    Ids(Vec<u32>),
}

/// The flags that may name a prompt (clap has made them mutually exclusive).
pub struct PromptFlags<'a> {
    /// `--prompt`; `-` reads stdin.
    pub text: Option<&'a str>,
    /// `--prompt-file`; `-` reads stdin.
    pub file: Option<&'a Path>,
    /// `--prompt-ids`.
    pub ids: Option<&'a str>,
}

const HOW: &str =
    "give --prompt TEXT, --prompt-file FILE, --prompt-ids 1,2,3 or pipe the text to stdin";

/// Resolves the prompt. Text read from a file or stdin loses one trailing newline (what `echo`
/// and editors add), as llama.cpp's `-f` does.
///
/// Errors: usage errors (exit 2) for no prompt at all and malformed `--prompt-ids`; an
/// unreadable file names the file.
pub fn resolve(f: &PromptFlags) -> Result<Prompt> {
    if let Some(ids) = f.ids {
        return prompt::parse_ids(ids)
            .map(Prompt::Ids)
            .map_err(|e| usage(format!("{e:#}")));
    }
    let text = match (f.text, f.file) {
        (Some("-"), _) => read_stdin()?,
        (Some(t), _) => return Ok(Prompt::Text(t.to_string())),
        (None, Some(p)) if p == Path::new("-") => read_stdin()?,
        (None, Some(p)) => std::fs::read_to_string(p)
            .with_context(|| format!("--prompt-file {}: cannot read it", p.display()))?,
        (None, None) if !std::io::stdin().is_terminal() => {
            let t = read_stdin()?;
            if t.is_empty() {
                return Err(usage(format!("no prompt (stdin was empty): {HOW}")));
            }
            t
        }
        (None, None) => return Err(usage(format!("no prompt: {HOW}"))),
    };
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    Ok(Prompt::Text(text.to_string()))
}

fn read_stdin() -> Result<String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .context("reading the prompt from stdin (expected UTF-8 text)")?;
    Ok(s)
}
