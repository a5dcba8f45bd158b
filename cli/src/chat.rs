//! `dayone chat`: an interactive multi-turn conversation through the model's chat template.
//!
//! Each line read from stdin is a user turn (piped input works the same, one turn per line);
//! the whole conversation is rendered through the template with the assistant's turn opened and
//! the answer streams to stdout. `/reset` forgets the conversation (the system message stays),
//! `/exit` (or end of input) ends the session. Ctrl-C stops the current answer, not the session;
//! the part already shown stays in the conversation. Once the engine caches prefixes, each turn
//! reuses the previous turns' cache by itself: the rendered conversation only grows at its end.

use crate::engine_args::{CommandDefaults, EngineArgs};
use crate::sampling_args::SamplingArgs;
use crate::{interrupt, load, output, with_backend};
use anyhow::{bail, Context, Result};
use clap::Args;
use dayone_backend::Backend;
use dayone_engine::chat_template::{ChatMessage, ChatTemplate};
use dayone_engine::loader::Checkpoint;
use dayone_engine::sampling::{SamplingParams, StopMatcher};
use dayone_engine::EngineConfig;
use std::io::{BufRead, IsTerminal, Write};

/// Flags of `dayone chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The engine flags.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The sampling flags (per answer).
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message opening the conversation (kept by /reset).
    #[arg(long)]
    pub system: Option<String>,
}

/// Runs `dayone chat`.
pub fn run(a: ChatArgs) -> Result<()> {
    if a.sampling.logprobs.is_some() {
        return Err(crate::usage::usage(
            "--logprobs is not shown by chat: use generate --output json",
        ));
    }
    let params = a.sampling.params()?;
    if a.sampling.seed_was_drawn() {
        eprintln!("seed: {}", params.seed);
    }
    let mut r = a.engine.resolve(&CommandDefaults::default())?;
    let path = load::model_path(r.model.clone())?;
    let ckpt = load::open(&path)?;
    r.settle_dtype(&ckpt);
    if ckpt.assets.tokenizer.is_none() {
        bail!(
            "{}: chat needs a tokenizer (tokenizer.json or GGUF vocabulary)",
            path.display()
        );
    }
    let Some(src) = ckpt.assets.chat_template.clone() else {
        bail!(
            "{}: this checkpoint has no chat template (tokenizer_config.json, chat_template.jinja or GGUF metadata): use generate",
            path.display()
        );
    };
    let template = ChatTemplate::new(&src)?;
    let session = Session {
        template,
        system: a.system.clone(),
        params,
        stops: a.sampling.stop.clone(),
    };
    with_backend!(r.backend, |b| chat(b, &ckpt, &r.engine, &session))
}

/// What stays the same for every turn.
struct Session {
    template: ChatTemplate,
    system: Option<String>,
    params: SamplingParams,
    stops: Vec<String>,
}

impl Session {
    fn fresh(&self) -> Vec<ChatMessage> {
        self.system
            .iter()
            .map(|s| ChatMessage {
                role: "system".into(),
                content: s.clone(),
            })
            .collect()
    }
}

/// How one answer ended.
enum Ended {
    /// EOS, length, context, or a stop string.
    Done,
    /// Ctrl-C.
    Interrupted,
}

fn chat<B: Backend>(b: B, ckpt: &Checkpoint, cfg: &EngineConfig, s: &Session) -> Result<()> {
    let mut engine = load::engine(b, ckpt, cfg, false)?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("chat with {} — /reset forgets the conversation, /exit (or Ctrl-D) ends it, Ctrl-C stops an answer", ckpt.path.display());
    }
    let mut messages = s.fresh();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().split(b'\n');
    let mut lineno = 0usize;
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        lineno += 1;
        let line = match String::from_utf8(line.context("reading stdin")?) {
            Ok(l) => l,
            // A typed line in another encoding costs that turn, not the conversation.
            Err(_) if interactive => {
                eprintln!("error: that line is not UTF-8 text; type it again");
                continue;
            }
            Err(_) => bail!("stdin line {lineno} is not UTF-8 text"),
        };
        let text = line.trim_end_matches(['\r', '\n']);
        match text.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = s.fresh();
                if interactive {
                    eprintln!("(conversation reset)");
                }
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: text.to_string(),
        });
        let assets = &ckpt.assets;
        let rendered = s.template.render(
            &messages,
            true,
            assets.bos_token.as_deref().unwrap_or(""),
            assets.eos_token.as_deref().unwrap_or(""),
        )?;
        let tok = assets.tokenizer.as_ref().expect("checked in run");
        let ids = tok.encode(&rendered, false)?;
        let (answer, ended) = match answer(&mut engine, tok, ids, s) {
            Ok(x) => x,
            Err(e) => {
                // The session survives a turn that cannot run (e.g. the conversation outgrew
                // the context window): say why and drop the turn.
                messages.pop();
                if !interactive {
                    // Piped input is a script: stop with the error (printed once, by main).
                    return Err(e);
                }
                eprintln!("error: {e:#} (/reset starts a new conversation)");
                continue;
            }
        };
        if matches!(ended, Ended::Interrupted) {
            eprintln!("(answer stopped)");
        }
        messages.push(ChatMessage {
            role: "assistant".into(),
            content: answer,
        });
    }
    Ok(())
}

/// Streams one answer to stdout; returns its text (what was shown) and how it ended.
fn answer<B: Backend>(
    engine: &mut dayone_engine::Engine<B>,
    tok: &dayone_engine::tokenizer::Tokenizer,
    ids: Vec<u32>,
    s: &Session,
) -> Result<(String, Ended)> {
    interrupt::clear();
    let id = engine.add_request(ids, s.params.clone())?;
    let mut decoder = tok.stream_decoder(true);
    let mut stops = StopMatcher::new(&s.stops);
    let mut shown = String::new();
    let mut out = std::io::stdout().lock();
    let mut write = |text: &str, shown: &mut String| -> Result<()> {
        shown.push_str(text);
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("writing to stdout")
    };
    let mut ended = Ended::Done;
    'steps: while engine.has_unfinished() {
        if interrupt::requested() {
            engine.abort(id)?;
            ended = Ended::Interrupted;
            break;
        }
        for e in engine.step()? {
            if e.seq_id != id {
                continue;
            }
            let piece = decoder.push(e.token)?;
            let o = stops.push(&piece);
            write(&o.text, &mut shown)?;
            if o.stopped.is_some() {
                engine.abort(id)?;
                break 'steps;
            }
            if e.finish.is_some() {
                let tail = decoder.finish()?;
                let o = stops.push(&tail);
                write(&o.text, &mut shown)?;
                if o.stopped.is_none() {
                    write(&stops.finish(), &mut shown)?;
                }
                break 'steps;
            }
        }
    }
    if matches!(ended, Ended::Interrupted) {
        // Show what was held back, except an incomplete character.
        let rest = stops.finish();
        write(output::without_incomplete_tail(&rest), &mut shown)?;
    }
    write("\n", &mut shown)?;
    shown.pop();
    interrupt::clear();
    Ok((shown, ended))
}
