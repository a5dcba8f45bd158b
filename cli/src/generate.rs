//! `dayone generate`.

use crate::backend_choice::BackendKind;
use crate::load;
use crate::with_backend;
use anyhow::Result;
use clap::Args;
use dayone_backend::Backend;
use dayone_engine::loader::Checkpoint;
use dayone_engine::prompt;
use dayone_engine::sampling::SamplingParams;
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::EngineConfig;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `dayone generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Model directory (config.json + safetensors) or .gguf file; default: SmolLM2-135M-Instruct.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Token ids instead of text, comma-separated (bypasses the tokenizer).
    #[arg(long)]
    pub prompt_ids: Option<String>,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// wgsl, cuda or auto.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// f32 or bf16 (default: bf16 on CUDA, f32 on WGSL).
    #[arg(long)]
    pub dtype: Option<String>,
    /// text (stream the answer) or json (one object at the end).
    #[arg(long, default_value = "text")]
    pub output: String,
    /// Tokens the KV cache holds (default: the context window).
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Keep generating after an end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
}

/// Runs `dayone generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    if a.output != "text" && a.output != "json" {
        anyhow::bail!("--output must be text or json, got '{}'", a.output);
    }
    if a.prompt.is_none() && a.prompt_ids.is_none() {
        anyhow::bail!("give a prompt: --prompt TEXT or --prompt-ids 1,2,3");
    }
    let kind = BackendKind::parse(&a.backend)?;
    let dtype = match &a.dtype {
        Some(d) => load::dtype(d)?,
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
    let ids = match &a.prompt_ids {
        Some(s) => prompt::parse_ids(s)?,
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
    };
    with_backend!(kind, |b| generate(b, &ckpt, &cfg, ids, params, &a.output))
}

fn generate<B: Backend>(
    b: B,
    ckpt: &Checkpoint,
    cfg: &EngineConfig,
    ids: Vec<u32>,
    params: SamplingParams,
    output: &str,
) -> Result<()> {
    let mut engine = load::engine(b, ckpt, cfg, false)?;
    let tok = ckpt.assets.tokenizer.as_ref();
    let mut stream = tok.map(|t| t.stream_decoder(true));
    let start = Instant::now();
    engine.add_request(ids.clone(), params)?;
    let mut generated = Vec::new();
    let mut first_token = None;
    let mut stdout = std::io::stdout().lock();
    while engine.has_unfinished() {
        for e in engine.step()? {
            first_token.get_or_insert_with(Instant::now);
            generated.push(e.token);
            if output == "text" {
                let piece = match stream.as_mut() {
                    Some(s) => s.push(e.token)?,
                    None => format!("{} ", e.token),
                };
                stdout.write_all(piece.as_bytes())?;
                stdout.flush()?;
            }
        }
    }
    let end = Instant::now();
    let ttft = first_token.unwrap_or(end) - start;
    let decode = end - first_token.unwrap_or(end);
    let decode_tokens = generated.len().saturating_sub(1);
    let prompt_tps = ids.len() as f64 / ttft.as_secs_f64().max(1e-9);
    let decode_tps = decode_tokens as f64 / decode.as_secs_f64().max(1e-9);
    let text = match tok {
        Some(t) => t.decode(&generated, true)?,
        None => String::new(),
    };
    if output == "text" {
        if let Some(s) = stream.as_mut() {
            stdout.write_all(s.finish()?.as_bytes())?;
        }
        writeln!(stdout)?;
        stdout.flush()?;
    } else {
        let j = serde_json::json!({
            "prompt_ids": ids,
            "generated_ids": generated,
            "text": text,
            "backend": engine.backend.name(),
            "timings": {
                "ttft_s": ttft.as_secs_f64(),
                "decode_s": decode.as_secs_f64(),
                "prompt_tokens_per_s": prompt_tps,
                "decode_tokens_per_s": decode_tps,
            }
        });
        writeln!(stdout, "{j}")?;
    }
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s (TTFT {:.3} s) | decode: {} tokens, {:.1} tok/s | {}",
        ids.len(),
        prompt_tps,
        ttft.as_secs_f64(),
        decode_tokens,
        decode_tps,
        engine.backend.name()
    );
    Ok(())
}
