//! `dayone generate`.

use crate::backend_choice::{BackendArg, BackendKind};
use crate::load::{self, DTypeArg};
use crate::parse;
use crate::with_backend;
use anyhow::{Context, Result};
use clap::Args;
use dayone_backend::Backend;
use dayone_engine::loader::Checkpoint;
use dayone_engine::prompt;
use dayone_engine::sampling::SamplingParams;
use dayone_engine::scheduler::{FinishReason, SchedulerConfig};
use dayone_engine::EngineConfig;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

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
    /// Model directory (config.json + safetensors) or .gguf file; default: SmolLM2-135M-Instruct.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Token ids instead of text, comma-separated (bypasses the tokenizer).
    #[arg(long)]
    pub prompt_ids: Option<String>,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate (generation also stops at the context window).
    #[arg(long, default_value_t = 128, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0, value_parser = parse::non_negative, allow_negative_numbers = true)]
    pub top_k: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 0, value_parser = parse::seed, allow_negative_numbers = true)]
    pub seed: u64,
    /// Backend to run on.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Float dtype (default: bf16 on CUDA, f32 on WGSL and CPU).
    #[arg(long, value_enum)]
    pub dtype: Option<DTypeArg>,
    /// text (stream the answer) or json (one object at the end).
    #[arg(long, value_enum, default_value_t = OutputArg::Text)]
    pub output: OutputArg,
    /// Tokens the KV cache holds over all sequences (default: the engine derives it from the
    /// model's context window, capped for very long windows and lowered to what fits in the
    /// device's free memory). A request whose prompt plus --max-tokens (clipped to the context
    /// window) does not fit is refused before it starts.
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub kv_cache_tokens: Option<usize>,
    /// Keep generating after an end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
}

/// Runs `dayone generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    if a.prompt.is_none() && a.prompt_ids.is_none() {
        anyhow::bail!("give a prompt: --prompt TEXT or --prompt-ids 1,2,3");
    }
    // clap's `requires` counts --chat's default (false) as given, so this one is checked here.
    if a.system.is_some() && !a.chat {
        anyhow::bail!("--system is the system message of --chat: add --chat or drop --system");
    }
    // Parse the ids before loading anything, so a typo fails fast.
    let given_ids = a.prompt_ids.as_deref().map(prompt::parse_ids).transpose()?;
    let kind = a.backend.resolve();
    let dtype = match a.dtype {
        Some(d) => d.dtype(),
        None if kind == BackendKind::Cuda => dayone_backend::DType::BF16,
        None => dayone_backend::DType::F32,
    };
    let params = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        max_tokens: a.max_tokens,
        ignore_eos: a.ignore_eos,
    };
    params.validate()?;
    let path = load::model_path(a.model.clone())?;
    let ckpt = load::open(&path)?;
    let ids = match given_ids {
        Some(ids) => ids,
        None => prompt::prompt_ids(
            &ckpt.assets,
            a.prompt.as_deref().unwrap_or(""),
            a.chat,
            a.system.as_deref(),
        )?,
    };
    let cfg = EngineConfig {
        dtype,
        kv_cache_tokens: a.kv_cache_tokens,
        scheduler: SchedulerConfig::default(),
        ..Default::default()
    };
    with_backend!(kind, |b| generate(b, &ckpt, &cfg, ids, params, a.output))
}

fn generate<B: Backend>(
    b: B,
    ckpt: &Checkpoint,
    cfg: &EngineConfig,
    ids: Vec<u32>,
    params: SamplingParams,
    output: OutputArg,
) -> Result<()> {
    let mut engine = load::engine(b, ckpt, cfg, false)?;
    let tok = ckpt.assets.tokenizer.as_ref();
    let mut stream = tok.map(|t| t.stream_decoder(true));
    let max_tokens = params.max_tokens;
    let start = Instant::now();
    engine.add_request(ids.clone(), params)?;
    let mut generated = Vec::new();
    let mut finish = None;
    let mut first_token = None;
    let mut stdout = std::io::stdout().lock();
    while engine.has_unfinished() {
        for e in engine.step()? {
            first_token.get_or_insert_with(Instant::now);
            generated.push(e.token);
            finish = finish.or(e.finish);
            if output == OutputArg::Text {
                let piece = match stream.as_mut() {
                    Some(s) => s.push(e.token)?,
                    None => format!("{} ", e.token),
                };
                stdout
                    .write_all(piece.as_bytes())
                    .and_then(|()| stdout.flush())
                    .context("writing to stdout")?;
            }
        }
    }
    let end = Instant::now();
    let ttft = first_token.unwrap_or(end) - start;
    let decode = end - first_token.unwrap_or(end);
    let decode_tokens = generated.len().saturating_sub(1);
    let prompt_tps = ids.len() as f64 / ttft.as_secs_f64().max(1e-9);
    let decode_tps = decode_tokens as f64 / decode.as_secs_f64().max(1e-9);
    // `None` (JSON null) without a tokenizer: the ids are the output then.
    let text = match tok {
        Some(t) => Some(t.decode(&generated, true)?),
        None => None,
    };
    let finish_reason = finish.map(|f| f.as_str()).unwrap_or("unknown");
    if output == OutputArg::Text {
        if let Some(s) = stream.as_mut() {
            let rest = s.finish()?;
            stdout
                .write_all(rest.as_bytes())
                .context("writing to stdout")?;
        }
        writeln!(stdout)
            .and_then(|()| stdout.flush())
            .context("writing to stdout")?;
    } else {
        let j = serde_json::json!({
            "prompt_ids": ids,
            "generated_ids": generated,
            "text": text,
            "finish_reason": finish_reason,
            "backend": engine.backend.name(),
            "timings": {
                "ttft_s": ttft.as_secs_f64(),
                "decode_s": decode.as_secs_f64(),
                "prompt_tokens_per_s": prompt_tps,
                "decode_tokens_per_s": decode_tps,
            }
        });
        writeln!(stdout, "{j}")
            .and_then(|()| stdout.flush())
            .context("writing to stdout")?;
    }
    if finish == Some(FinishReason::ContextFull) {
        eprintln!(
            "note: stopped after {} of --max-tokens {max_tokens} tokens: prompt + output filled the context window ({} tokens)",
            generated.len(),
            engine.config.max_context()
        );
    }
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s (TTFT {:.3} s) | decode: {} tokens, {:.1} tok/s | finish: {finish_reason} | {}",
        ids.len(),
        prompt_tps,
        ttft.as_secs_f64(),
        decode_tokens,
        decode_tps,
        engine.backend.name()
    );
    Ok(())
}
