//! `dayone generate`.

use crate::backend_choice::BackendKind;
use crate::engine_args::{CommandDefaults, EngineArgs};
use crate::load;
use crate::prompt_input::{self, Prompt, PromptFlags};
use crate::sampling_args::SamplingArgs;
use crate::usage::usage;
use crate::{interrupt, output, parse, progress};
use anyhow::{Context, Result};
use clap::Args;
use dayone_engine::loader::Checkpoint;
use dayone_engine::prompt;
use dayone_engine::sampling::{SamplingParams, StopMatcher, TokenLogprobs};
use dayone_engine::scheduler::FinishReason;
use dayone_engine::service::{ModelInfo, Request, StreamEvent};
use dayone_engine::EngineConfig;
use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `--output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputArg {
    /// Stream the answer to stdout.
    Text,
    /// One JSON object at the end.
    Json,
}

/// Flags of `dayone generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The engine flags (model, backend, dtype, cache, scheduler, --config FILE).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The sampling flags (max tokens, temperature, top-k/p, min-p, penalties, seed, stop,
    /// logprobs).
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Completions to generate for the prompt (seeds: --seed + the request's index).
    #[arg(long = "n", visible_alias = "num-completions", default_value_t = 1, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub num_completions: usize,
    /// Prompt text; `-` reads it from stdin (as does piping text with no prompt flag).
    #[arg(short = 'p', long, conflicts_with_all = ["prompt_ids", "prompt_file"])]
    pub prompt: Option<String>,
    /// Read the prompt from FILE (`-`: stdin); one trailing newline is dropped.
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt_ids")]
    pub prompt_file: Option<PathBuf>,
    /// Token ids instead of text, comma-separated (bypasses the tokenizer).
    #[arg(long)]
    pub prompt_ids: Option<String>,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// An image for the prompt (repeatable; PNG, JPEG or WebP). The prompt text carries the
    /// model's image markup once per image, in order (Kimi-K2.5:
    /// `<|media_begin|>image<|media_content|><|media_pad|><|media_end|>`); with --chat and no
    /// markup the images go before the user text. With --prompt-ids, one placeholder id
    /// (`<|media_pad|>`) per image.
    #[arg(long = "image", value_name = "FILE")]
    pub images: Vec<PathBuf>,
    /// text (stream the answer) or json (one object at the end).
    #[arg(long, value_enum, default_value_t = OutputArg::Text)]
    pub output: OutputArg,
}

/// Runs `dayone generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    // clap's `requires` counts --chat's default (false) as given, so this one is checked here.
    if a.system.is_some() && !a.chat {
        return Err(usage(
            "--system is the system message of --chat: add --chat or drop --system",
        ));
    }
    if a.sampling.logprobs.is_some() && a.output == OutputArg::Text {
        return Err(usage(
            "--logprobs is reported in JSON only: add --output json (text output shows no logprobs)",
        ));
    }
    // Read and parse the prompt before loading anything, so a typo fails fast.
    let given = prompt_input::resolve(&PromptFlags {
        text: a.prompt.as_deref(),
        file: a.prompt_file.as_deref(),
        ids: a.prompt_ids.as_deref(),
    })?;
    if a.chat && matches!(given, Prompt::Ids(_)) {
        return Err(usage("--chat needs a text prompt, not --prompt-ids"));
    }
    if matches!(&given, Prompt::Text(t) if t.is_empty()) && !a.chat {
        // A usage error like an empty --prompt-ids or empty stdin (exit 2).
        return Err(usage(
            "the prompt is empty: give some text (--prompt, --prompt-file or stdin)",
        ));
    }
    // Decode the images before loading the model, so a bad file fails fast.
    let images = a
        .images
        .iter()
        .map(|p| dayone_engine::vision::load_image_file(p).map(std::sync::Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let params = a.sampling.params()?;
    let mut resolved = a.engine.resolve(&CommandDefaults::default())?;
    let path = load::model_path(resolved.model.clone())?;
    let ckpt = load::open(&path)?;
    resolved.settle_dtype(&ckpt);
    let (kind, cfg) = (resolved.backend, resolved.engine);
    let given = with_image_markup(&ckpt, given, images.len(), a.chat)?;
    let ids = match given {
        Prompt::Ids(ids) => ids,
        Prompt::Text(text) => prompt::prompt_ids(&ckpt.assets, &text, a.chat, a.system.as_deref())?,
    };
    let g = GenOptions {
        params,
        output: a.output,
        n: a.num_completions,
        stops: a.sampling.stop.clone(),
        logprobs: a.sampling.logprobs,
        images,
    };
    generate(kind, ckpt, &cfg, ids, &g)
}

/// Checks a text prompt's image markup against the `--image` count: the model's markup once per
/// image, or (with --chat and no markup at all) the markups put before the user text.
fn with_image_markup(
    ckpt: &Checkpoint,
    given: Prompt,
    images: usize,
    chat: bool,
) -> Result<Prompt> {
    if images == 0 {
        return Ok(given);
    }
    let model_type = ckpt
        .config
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("?");
    let Some(markup) = dayone_engine::vision::image_markup(model_type) else {
        return Err(usage(format!(
            "--image: model_type {model_type} takes no images"
        )));
    };
    let Prompt::Text(text) = given else {
        return Ok(given);
    };
    match text.matches(markup).count() {
        0 if chat => Ok(Prompt::Text(format!("{}{text}", markup.repeat(images)))),
        n if n == images => Ok(Prompt::Text(text)),
        n => Err(usage(format!(
            "{images} --image file(s) but the prompt has the image markup {n} time(s): put `{markup}` once per image where it belongs (or use --chat to put the images before the text)"
        ))),
    }
}

/// What one completion produced.
struct Choice {
    generated: Vec<u32>,
    /// The text printed (or, in JSON mode, that would have been): complete characters only,
    /// cut before a stop string.
    text: Option<String>,
    finish: Option<FinishReason>,
    /// The stop string that ended it (`finish_reason` is then `stop`).
    stop: Option<String>,
    /// Per generated token, with `--logprobs`.
    logprobs: Vec<TokenLogprobs>,
}

impl Choice {
    /// vLLM's `finish_reason`: a stop string counts as `stop`.
    fn finish_reason(&self) -> &'static str {
        match (&self.stop, self.finish) {
            (Some(_), _) => "stop",
            (None, Some(f)) => f.as_str(),
            (None, None) => "unknown",
        }
    }

    /// The logprobs as JSON (`null` without `--logprobs`).
    fn logprobs_json(&self, want: bool) -> serde_json::Value {
        if !want {
            return serde_json::Value::Null;
        }
        self.logprobs
            .iter()
            .map(|l| {
                serde_json::json!({
                    "token": l.token,
                    "logprob": l.logprob,
                    "top": l.top.iter().map(|&(t, p)| serde_json::json!({"token": t, "logprob": p})).collect::<Vec<_>>(),
                })
            })
            .collect()
    }
}

/// What one generation produced.
struct Outcome {
    /// One per completion (`--n`); the first is the one streamed and reported at the top level.
    choices: Vec<Choice>,
    seed: u64,
    load: Duration,
    ttft: Duration,
    decode: Duration,
    /// Prompt tokens as the engine counted them (image placeholders expanded into the tokens
    /// they became), per completion.
    prompt_tokens: usize,
}

/// One completion in flight.
struct Live<'t> {
    id: u64,
    choice: Choice,
    decoder: Option<dayone_engine::tokenizer::StreamDecoder<'t>>,
    stops: StopMatcher,
    done: bool,
}

/// How `generate` runs and reports.
struct GenOptions {
    params: SamplingParams,
    output: OutputArg,
    n: usize,
    stops: Vec<String>,
    logprobs: Option<usize>,
    /// `--image` files, decoded.
    images: Vec<std::sync::Arc<dayone_engine::vision::RgbImage>>,
}

fn generate(
    kind: BackendKind,
    ckpt: Checkpoint,
    cfg: &EngineConfig,
    ids: Vec<u32>,
    g: &GenOptions,
) -> Result<()> {
    let tok = ckpt.assets.tokenizer.clone();
    if !g.stops.is_empty() && tok.is_none() {
        return Err(usage("--stop needs a tokenizer (stop strings match the decoded text): this checkpoint has none"));
    }
    let load_start = Instant::now();
    // The engine runs on its own thread behind the service handle, as under `dayone serve`.
    let handle = load::service(kind, ckpt, cfg.clone(), false)?;
    let load = load_start.elapsed();
    let tok = tok.as_ref();
    let max_tokens = g.params.max_tokens;
    let start = Instant::now();
    let (tx, events) = mpsc::channel::<(usize, StreamEvent)>();
    let mut live = Vec::with_capacity(g.n);
    for i in 0..g.n {
        // Completion i samples with seed + i (the server's rule for `n`).
        let mut params = g.params.clone();
        params.seed = params.seed.wrapping_add(i as u64);
        params.logprobs = g.logprobs;
        let request = Request {
            report_prefill: true,
            images: g.images.clone(),
            ..Request::new(ids.clone(), params)
        };
        let tx = tx.clone();
        live.push(Live {
            id: handle.submit_with(request, move |e| tx.send((i, e)).is_ok())?,
            choice: Choice {
                generated: Vec::new(),
                text: tok.map(|_| String::new()),
                finish: None,
                stop: None,
                logprobs: Vec::new(),
            },
            decoder: tok.map(|t| t.stream_decoder(true)),
            stops: StopMatcher::new(&g.stops),
            done: false,
        });
    }
    drop(tx);
    let mut first_token = None;
    let mut stdout = std::io::stdout().lock();
    // Completion 0 streams in text mode; the others print when all are done.
    let text_mode = g.output == OutputArg::Text;
    let mut emit = |piece: &str, c: &mut Choice, stream: bool| -> Result<()> {
        if let Some(t) = c.text.as_mut() {
            t.push_str(piece);
        }
        if text_mode && stream {
            stdout
                .write_all(piece.as_bytes())
                .and_then(|()| stdout.flush())
                .context("writing to stdout")?;
        }
        Ok(())
    };
    let bar = progress::prefill_bar(ids.len() * g.n, false);
    let mut computed = vec![0usize; g.n];
    let mut interrupted = false;
    let mut prompt_tokens = ids.len();
    while live.iter().any(|l| !l.done) {
        if interrupt::requested() && !interrupted {
            interrupted = true;
            for l in live.iter().filter(|l| !l.done) {
                handle.abort(l.id)?;
            }
        }
        let (i, event) = match events.recv_timeout(Duration::from_millis(50)) {
            Ok(e) => e,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("the engine stopped without finishing the request")
            }
        };
        let l = &mut live[i];
        match event {
            StreamEvent::Prefill { computed: c, .. } => {
                computed[i] = c;
                if first_token.is_none() {
                    bar.set_position(computed.iter().sum::<usize>() as u64);
                }
            }
            StreamEvent::Token {
                token,
                time,
                logprobs,
                ..
            } => {
                if first_token.is_none() {
                    first_token = Some(time);
                    bar.finish_and_clear();
                }
                if l.choice.stop.is_some() {
                    continue; // produced in the step that matched the stop string
                }
                l.choice.generated.push(token);
                if let Some(lp) = logprobs {
                    l.choice.logprobs.push(lp);
                }
                let piece = match l.decoder.as_mut() {
                    Some(s) => s.push(token)?,
                    None => format!("{token} "),
                };
                let o = l.stops.push(&piece);
                emit(&o.text, &mut l.choice, i == 0)?;
                if o.stopped.is_some() {
                    l.choice.stop = o.stopped;
                    handle.abort(l.id)?;
                }
            }
            StreamEvent::Finished {
                reason,
                prompt_tokens: p,
                ..
            } => {
                prompt_tokens = prompt_tokens.max(p);
                l.done = true;
                if l.choice.stop.is_none() {
                    l.choice.finish = Some(reason);
                }
            }
            StreamEvent::Error(msg) => anyhow::bail!(msg),
        }
    }
    bar.finish_and_clear();
    for (i, l) in live.iter_mut().enumerate() {
        if l.choice.stop.is_some() {
            continue;
        }
        let mut rest = match l.decoder.as_mut() {
            Some(s) => s.finish()?,
            None => String::new(),
        };
        let o = l.stops.push(&rest);
        if o.stopped.is_some() {
            l.choice.stop = o.stopped;
            rest = o.text;
        } else {
            rest = o.text + &l.stops.finish();
        }
        // A character cut off by the end (or by Ctrl-C) would print as U+FFFD: held back.
        emit(
            output::without_incomplete_tail(&rest),
            &mut l.choice,
            i == 0,
        )?;
    }
    if text_mode {
        for (i, l) in live.iter().enumerate().skip(1) {
            let body =
                l.choice.text.clone().unwrap_or_else(|| {
                    l.choice.generated.iter().map(|t| format!("{t} ")).collect()
                });
            write!(stdout, "\n--- completion {i} ---\n{body}").context("writing to stdout")?;
        }
    }
    let end = Instant::now();
    let first = first_token.unwrap_or(end).max(start);
    let outcome = Outcome {
        ttft: first - start,
        decode: end - first,
        choices: live.into_iter().map(|l| l.choice).collect(),
        seed: g.params.seed,
        load,
        prompt_tokens,
    };
    let info = handle.model_info().clone();
    handle.shutdown(Duration::from_secs(1));
    report(&mut stdout, &info, &ids, &outcome, g, max_tokens)
}

/// The dtypes of a run for the stats line: `bf16`, or `bf16 weights, f32 compute` where the
/// backend computes in f32 from 16-bit weights (WGSL).
pub fn dtype_note(info: &ModelInfo) -> String {
    if info.weight_dtype == info.activation_dtype {
        info.activation_dtype.to_string()
    } else {
        format!(
            "{} weights, {} compute",
            info.weight_dtype, info.activation_dtype
        )
    }
}

/// Prints the JSON object (JSON mode) or ends the streamed line (text mode), then the notes and
/// the stats line on stderr.
fn report(
    stdout: &mut std::io::StdoutLock,
    info: &ModelInfo,
    ids: &[u32],
    o: &Outcome,
    g: &GenOptions,
    max_tokens: usize,
) -> Result<()> {
    let first = &o.choices[0];
    let generated: usize = o.choices.iter().map(|c| c.generated.len()).sum();
    let decode_tokens = generated.saturating_sub(o.choices.len());
    let prompt_tps = o.prompt_tokens as f64 / o.ttft.as_secs_f64().max(1e-9);
    let decode_tps = decode_tokens as f64 / o.decode.as_secs_f64().max(1e-9);
    let finish_reason = first.finish_reason();
    if g.output == OutputArg::Text {
        writeln!(stdout)
            .and_then(|()| stdout.flush())
            .context("writing to stdout")?;
    } else {
        let want_lp = g.logprobs.is_some();
        // `text` is null without a tokenizer: the ids are the output then. The top level is
        // the first completion; `choices` lists all of them when --n asks for several.
        let mut j = serde_json::json!({
            "prompt_ids": ids,
            "prompt_tokens": o.prompt_tokens,
            "generated_ids": first.generated,
            "text": first.text,
            "finish_reason": finish_reason,
            "stop": first.stop,
            "seed": o.seed,
            "logprobs": first.logprobs_json(want_lp),
            "backend": info.backend,
            "weight_dtype": info.weight_dtype.to_string(),
            "activation_dtype": info.activation_dtype.to_string(),
            "batch_invariant": info.batch_invariant,
            "timings": {
                "load_s": o.load.as_secs_f64(),
                "ttft_s": o.ttft.as_secs_f64(),
                "decode_s": o.decode.as_secs_f64(),
                "prompt_tokens_per_s": prompt_tps,
                "decode_tokens_per_s": decode_tps,
            }
        });
        if o.choices.len() > 1 {
            j["choices"] = o
                .choices
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    serde_json::json!({
                        "index": i,
                        "generated_ids": c.generated,
                        "text": c.text,
                        "finish_reason": c.finish_reason(),
                        "stop": c.stop,
                        "logprobs": c.logprobs_json(want_lp),
                    })
                })
                .collect();
        }
        writeln!(stdout, "{j}")
            .and_then(|()| stdout.flush())
            .context("writing to stdout")?;
    }
    if g.output == OutputArg::Text && g.params.temperature > 0.0 {
        // Text mode has no JSON `seed` field: the seed goes to stderr so the run can be repeated.
        eprintln!("seed: {}", o.seed);
    }
    match first.finish {
        Some(FinishReason::ContextFull) => eprintln!(
            "note: stopped after {} of --max-tokens {max_tokens} tokens: prompt + output filled the context window ({} tokens)",
            first.generated.len(),
            info.max_context
        ),
        Some(FinishReason::Abort) => eprintln!(
            "note: interrupted (Ctrl-C) after {} generated tokens",
            generated
        ),
        _ => {}
    }
    eprintln!(
        "load: {:.2} s | prompt: {} tokens, {:.1} tok/s (TTFT {:.3} s) | decode: {} tokens, {:.1} tok/s | finish: {finish_reason} | {} | {}",
        o.load.as_secs_f64(),
        o.prompt_tokens,
        prompt_tps,
        o.ttft.as_secs_f64(),
        decode_tokens,
        decode_tps,
        dtype_note(info),
        info.backend
    );
    Ok(())
}
