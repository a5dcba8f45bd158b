//! `dayone bench`: TTFT, TPOT, throughput and decode bandwidth against the memory roofline.
//!
//! Bytes that must move per decode step = weights read once (all but the embedding table, which
//! is only gathered, unless tied to the output head; routed experts only as far as a step of that
//! batch touches them) + every running sequence's KV cache (and recurrent state, read and written). The
//! roofline is the device's measured copy bandwidth (a device-to-device copy of up to 1 GiB, read + write;
//! [`EngineHandle::copy_bandwidth`]).
//!
//! The engine runs behind an [`EngineHandle`], as under `dayone serve`: each batch is submitted
//! at once, and TTFT, TPOT and the decode steps come from the token events' times (the tokens of
//! one engine step share theirs) and each request's [`RequestTiming`].
//!
//! With `--image FILE` every sequence is that image's placeholder followed by its random text
//! tokens: TTFT then covers preprocessing, the vision encoder and the prefill of image + text
//! tokens (each sequence gets its own copy of the image, see [`unique_copy`]).

use crate::backend_choice::BackendKind;
use crate::engine_args::{CommandDefaults, EngineArgs};
use crate::load;
use crate::{outln, parse};
use anyhow::Result;
use clap::Args;
use dayone_engine::config::ModelConfig;
use dayone_engine::loader::Checkpoint;
use dayone_engine::sampling::SamplingParams;
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::service::{EngineHandle, ModelInfo, Request, RequestTiming, StreamEvent};
use dayone_engine::vision::{ImageProcessorConfig, RgbImage};
use dayone_engine::EngineConfig;
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Flags of `dayone bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The engine flags (model, backend, dtype, cache, scheduler, --config FILE). Unless set,
    /// the KV cache holds every run's sequences at once, --max-num-seqs is the largest --batch
    /// and --chunked-prefill-size (alias --max-batched-tokens) is 8192.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Concurrent sequences; a comma-separated list runs each size in turn on one loaded model.
    #[arg(long, default_value = "1", value_delimiter = ',', value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub batch: Vec<usize>,
    /// Prompt tokens per sequence (random ids, fixed seed; `8K` = 8192, `1M` = 1048576); a
    /// comma-separated list runs each length with the one --batch size, or pairs each length
    /// with its own --batch entry.
    #[arg(long, default_value = "512", value_delimiter = ',', value_parser = parse::token_count, allow_negative_numbers = true)]
    pub prompt_len: Vec<usize>,
    /// Generated tokens per sequence (EOS ignored); prompt length + this must fit the context
    /// window.
    #[arg(long, default_value_t = 128, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub gen_len: usize,
    /// Print one JSON object per line (one per batch/prompt configuration) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write every run's TTFT, prefill tok/s, TPOT, throughput and device memory to this
    /// CSV file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<std::path::PathBuf>,
    /// Also draw TTFT, prefill tok/s, TPOT and device memory against the prompt length (the
    /// long-context curves) into this .svg or .png file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
    /// Load nothing and run nothing: read the reports of earlier `bench --json` runs (one JSON
    /// object per line; several files' lines may be concatenated) and write their --csv / --plot.
    #[arg(long, value_name = "FILE.jsonl")]
    pub from_json: Option<std::path::PathBuf>,
    /// Put this image (PNG, JPEG or WebP) before each sequence's --prompt-len text tokens
    /// (models with a vision tower): TTFT then includes preprocessing and the vision encoder.
    /// Each sequence (and the warm-up) gets its own copy with the top-left 28×28 pixels painted
    /// a colour of its own, so neither the encoder cache nor the prefix cache serves it.
    #[arg(long, value_name = "FILE")]
    pub image: Option<PathBuf>,
}

/// Runs `dayone bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    // An output the bench cannot write is refused before any run (not after minutes of them).
    if let Some(p) = &a.csv {
        crate::bench_plot::check_output_dir("--csv", p)?;
    }
    if let Some(p) = &a.plot {
        crate::bench_plot::check_plot_path(p)?;
    }
    if let Some(f) = &a.from_json {
        return replot(f, &a);
    }
    let (batches, prompts) = (a.batch.clone(), a.prompt_len.clone());
    let runs: Vec<(usize, usize)> = match (batches.len(), prompts.len()) {
        (_, 1) => batches.iter().map(|&b| (b, prompts[0])).collect(),
        (1, _) => prompts.iter().map(|&p| (batches[0], p)).collect(),
        (b, p) if b == p => batches.iter().copied().zip(prompts).collect(),
        _ => {
            return Err(crate::usage::usage(
                "--prompt-len must give one length, one per --batch entry, or several with one --batch size",
            ))
        }
    };
    // Decoded before the model loads, so that a bad file fails fast. Its token count under
    // Kimi-K2.5's processor defaults sizes the default cache (a model whose processor makes
    // more tokens of it needs --kv-cache-tokens).
    let image = match &a.image {
        Some(p) => Some(Arc::new(dayone_engine::vision::load_image_file(p)?)),
        None => None,
    };
    let image_tokens = image.as_ref().map_or(0, |im| {
        ImageProcessorConfig::default().num_tokens(im.height, im.width)
    });
    // Bench's defaults, below the config file and the flags: a cache for every run's sequences
    // at once, room for the largest batch, an 8192-token step budget.
    let max_batch = runs.iter().map(|r| r.0).max().unwrap_or(1);
    let kv_tokens = runs
        .iter()
        .map(|&(b, p)| b * (p + image_tokens + a.gen_len).next_multiple_of(16))
        .max()
        .unwrap_or(16)
        + 16;
    let defaults = CommandDefaults {
        engine: EngineConfig {
            kv_cache_tokens: Some(kv_tokens),
            scheduler: SchedulerConfig {
                max_batched_tokens: 8192,
                max_prefill_chunk: 8192,
                max_num_seqs: max_batch,
                ..Default::default()
            },
            ..Default::default()
        },
        dtype: None,
    };
    let mut resolved = a.engine.resolve(&defaults)?;
    let path = load::model_path(resolved.model.clone())?;
    let ckpt = load::open(&path)?;
    resolved.settle_dtype(&ckpt);
    let (kind, cfg) = (resolved.backend, resolved.engine);
    // Generation stops at the context window: a run past it would not produce --gen-len tokens.
    let origin = ckpt.path.join("config.json");
    let model = ModelConfig::from_json(&ckpt.config, &origin.display().to_string())?;
    let ctx = model.max_context();
    if let Some(&(_, p)) = runs
        .iter()
        .find(|&&(_, p)| p + image_tokens + a.gen_len > ctx)
    {
        let with_image = match image_tokens {
            0 => String::new(),
            n => format!(" + {n} image tokens"),
        };
        anyhow::bail!(
            "--prompt-len {p} + --gen-len {}{with_image} = {} tokens exceed the model's context window of {ctx}: lower one of them",
            a.gen_len,
            p + image_tokens + a.gen_len
        );
    }
    let image = match image {
        Some(im) => Some((im, image_placeholder(&model, &ckpt)?)),
        None => None,
    };
    bench(kind, ckpt, &model, cfg, &a, &runs, image)
}

/// The prompt id one image stands for (expanded by the engine to the image's tokens).
///
/// Errors: `--image` with a model that takes no images.
fn image_placeholder(model: &ModelConfig, ckpt: &Checkpoint) -> Result<u32> {
    let vision = match model {
        ModelConfig::KimiK25(k) => Some(k.media_placeholder_token_id),
        ModelConfig::Glm5Next(_) => {
            let origin = ckpt.path.join("config.json").display().to_string();
            dayone_engine::config::Glm5NextVision::from_json(&ckpt.config, &origin)?
                .map(|g| g.image_token_id)
        }
        _ => None,
    };
    vision.ok_or_else(|| {
        crate::usage::usage(format!(
            "--image: model_type {} takes no images",
            model.model_type()
        ))
    })
}

/// A copy of `img` whose top-left 28×28 pixels (fewer in a smaller image) are the colour
/// `(k, k >> 8, 0x5a ^ k >> 16)`: copies of different `k` differ in 784 pixels, enough to survive
/// any resize, so their content hashes differ (the encoder cache and the prefix cache key on it).
fn unique_copy(img: &RgbImage, k: u32) -> RgbImage {
    let mut out = img.clone();
    let colour = [k as u8, (k >> 8) as u8, 0x5a ^ (k >> 16) as u8];
    for y in 0..img.height.min(28) {
        for x in 0..img.width.min(28) {
            let at = (y * img.width + x) * 3;
            out.data[at..at + 3].copy_from_slice(&colour);
        }
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Weight bytes a decode step must read.
struct WeightBytes {
    /// Everything but routed experts (read every step).
    dense: f64,
    /// All routed experts.
    experts: f64,
    /// (experts per MoE layer `E`, experts per token `k`); (0, 0) for dense models.
    experts_per_layer: (usize, usize),
}

impl WeightBytes {
    /// Dense weights plus the routed experts a step of `batch` tokens touches: with each token
    /// choosing `k` of `E` experts, the expected distinct share is `1 − (1 − k/E)^batch` (uniform
    /// routing; an estimate — real routers are skewed, which lowers it).
    fn per_step(&self, batch: usize) -> f64 {
        let (e, k) = self.experts_per_layer;
        if e == 0 {
            return self.dense + self.experts;
        }
        let share = 1.0 - (1.0 - k as f64 / e as f64).powi(batch as i32);
        self.dense + self.experts * share
    }
}

/// Loads the model behind an engine handle, measures the roofline, warms up, then runs each
/// (batch, prompt length) configuration through the handle.
fn bench(
    kind: BackendKind,
    ckpt: Checkpoint,
    model: &ModelConfig,
    cfg: EngineConfig,
    a: &BenchArgs,
    runs: &[(usize, usize)],
    image: Option<(Arc<RgbImage>, u32)>,
) -> Result<()> {
    let names = ckpt.tensors.names();
    let tied = !names.iter().any(|n| n == "lm_head.weight");
    // (float elements, low-bit bytes): float weights are resident in the weight dtype, packed
    // codes and scales kept low-bit on the device in their stored bytes. Under
    // `--dequantize-at-load` a packed tensor becomes its values (two per MXFP4 byte, eight per
    // INT4 word) in the weight dtype and its scales fold into them.
    let keep_low_bit = !cfg.dequantize_at_load;
    let low_bit = crate::info::low_bit(&ckpt)?;
    let elems = |keep: &dyn Fn(&str) -> bool| -> (usize, usize) {
        names
            .iter()
            .filter(|n| tied || n.as_str() != "model.embed_tokens.weight")
            // INT4's `weight_shape` only checks the shape at load.
            .filter(|n| !n.ends_with("_scale_inv") && !n.ends_with(".weight_shape") && keep(n))
            .filter_map(|n| {
                let numel = ckpt.tensors.shape(n)?.iter().product::<usize>();
                Some(match low_bit.get(n.as_str()) {
                    Some(&(_, bytes)) if keep_low_bit => (0, bytes as usize),
                    Some(&(values_per_element, _)) => (numel * values_per_element as usize, 0),
                    None => (numel, 0),
                })
            })
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    // Routed experts are read only when chosen: count them separately (see `WeightBytes`).
    // A vision tower and its projector run once per image, not per decode step.
    let is_expert = |n: &str| n.contains(".mlp.experts.");
    let is_vision = |n: &str| {
        [
            "vision_tower.",
            "mm_projector.",
            "multi_modal_projector.",
            "visual.",
        ]
        .iter()
        .any(|p| n.starts_with(p) || n.strip_prefix("model.").is_some_and(|r| r.starts_with(p)))
    };
    let (dense_elems, expert_elems) = (
        elems(&|n| !is_expert(n) && !is_vision(n)),
        elems(&is_expert),
    );
    let model_path = ckpt.path.display().to_string();
    let split = (
        cfg.tensor_parallel_size,
        cfg.expert_parallel_size,
        cfg.context_parallel_size,
    );
    let enforce_eager = cfg.enforce_eager;
    let moe_fp8 = cfg.moe_fp8;
    // The engine runs on its own thread behind the service handle, as under `dayone serve`.
    let handle = load::service(kind, ckpt, cfg, a.json)?;
    let info = handle.model_info().clone();
    // Float weights are read in the dtype they are stored in (bf16 on WGSL for a 16-bit
    // checkpoint, although it computes in f32).
    let wsize = info.weight_dtype.size();
    let weights = WeightBytes {
        dense: (dense_elems.0 * wsize + dense_elems.1) as f64,
        experts: (expert_elems.0 * wsize + expert_elems.1) as f64,
        experts_per_layer: match model {
            ModelConfig::DeepseekV3(c) => (c.n_routed_experts, c.num_experts_per_tok),
            ModelConfig::KimiLinear(c) => (c.num_local_experts, c.num_experts_per_tok),
            ModelConfig::KimiK25(c) => (c.text.n_routed_experts, c.text.num_experts_per_tok),
            ModelConfig::Glm5Next(c) => (c.n_routed_experts, c.num_experts_per_tok),
            ModelConfig::GptOss(c) => (c.num_local_experts, c.top_k()),
            _ => (0, 0),
        },
    };
    let roofline = handle.copy_bandwidth()?;

    // Warm-up: one short request compiles kernels and fills allocator pools.
    let vocab = info.vocab_size as u32;
    let mut warm: Vec<u32> = (0..8).map(|i| (i * 7 + 3) % vocab).collect();
    if let Some((_, placeholder)) = &image {
        warm.retain(|t| t != placeholder);
        warm.insert(0, *placeholder);
    }
    let mut warm = Request::new(
        warm,
        SamplingParams {
            max_tokens: 2,
            ignore_eos: true,
            ..Default::default()
        },
    );
    // With an image the warm-up also runs the vision encoder (on copy 0).
    if let Some((img, _)) = &image {
        warm.images = vec![Arc::new(unique_copy(img, 0))];
    }
    for event in handle.submit(warm)? {
        if let StreamEvent::Error(msg) = event {
            anyhow::bail!(msg);
        }
    }
    let run = Run {
        handle: &handle,
        info: &info,
        model: &model_path,
        weights: &weights,
        roofline,
        split,
        enforce_eager,
        moe_fp8,
        image: image.as_ref().map(|(img, p)| (img.as_ref(), *p)),
        copies: Cell::new(1),
    };
    let mut reports = Vec::with_capacity(runs.len());
    for &(batch, prompt_len) in runs {
        reports.push(run.one(a, batch, prompt_len)?);
    }
    if let Some(f) = &a.csv {
        crate::bench_plot::write_csv(f, &reports)?;
    }
    if let Some(f) = &a.plot {
        let title = format!(
            "{} on {}",
            crate::progress::short_path(std::path::Path::new(&model_path)),
            info.backend
        );
        crate::bench_plot::write_plot(f, &reports, &title)?;
    }
    handle.shutdown(Duration::from_secs(1));
    Ok(())
}

/// `--from-json`: the CSV and the plot of saved reports, ordered by prompt length.
fn replot(f: &std::path::Path, a: &BenchArgs) -> Result<()> {
    if a.csv.is_none() && a.plot.is_none() {
        return Err(crate::usage::usage(
            "--from-json needs --csv FILE or --plot FILE (it only redraws saved reports)",
        ));
    }
    let text = std::fs::read_to_string(f)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?;
    let mut reports = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            anyhow::anyhow!(
                "{} line {}: not a `bench --json` report: {e}",
                f.display(),
                i + 1
            )
        })?;
        if v.get("prompt_len")
            .and_then(serde_json::Value::as_u64)
            .is_none()
        {
            anyhow::bail!(
                "{} line {}: not a `bench --json` report (no prompt_len)",
                f.display(),
                i + 1
            );
        }
        reports.push(v);
    }
    if reports.is_empty() {
        anyhow::bail!("{} holds no reports", f.display());
    }
    reports.sort_by_key(|r| r["prompt_len"].as_u64());
    if let Some(out) = &a.csv {
        crate::bench_plot::write_csv(out, &reports)?;
    }
    if let Some(out) = &a.plot {
        let field = |k: &str| reports[0][k].as_str().unwrap_or("?").to_string();
        let model = crate::progress::short_path(std::path::Path::new(&field("model")));
        crate::bench_plot::write_plot(out, &reports, &format!("{model} on {}", field("backend")))?;
    }
    Ok(())
}

/// What every configuration's run shares.
struct Run<'a> {
    handle: &'a EngineHandle,
    info: &'a ModelInfo,
    /// The checkpoint's path, as printed.
    model: &'a str,
    weights: &'a WeightBytes,
    /// Measured copy bandwidth, bytes/s.
    roofline: f64,
    /// `(tensor_parallel_size, expert_parallel_size, context_parallel_size)` of the run.
    split: (usize, usize, usize),
    /// `--enforce-eager`: decode steps never ran as CUDA graphs (other backends have none).
    enforce_eager: bool,
    /// `--moe-fp8` as given (a warning line at load says when it fell back or had no effect).
    moe_fp8: bool,
    /// `--image` and its placeholder id, put before every sequence's text.
    image: Option<(&'a RgbImage, u32)>,
    /// The next [`unique_copy`] number of the image.
    copies: Cell<u32>,
}

/// An engine step of the run, as its tokens show it (the tokens of one step share their time).
struct Step {
    /// When its tokens left the engine.
    time: Instant,
    /// Tokens it produced.
    tokens: usize,
    /// KV cache tokens it read: each sequence's context before its token.
    kv: usize,
}

/// The engine steps of a run from its token events `(time, context length before the token)`:
/// each distinct time is one step, in order.
fn steps(mut tokens: Vec<(Instant, usize)>) -> Vec<Step> {
    tokens.sort_by_key(|t| t.0);
    let mut out: Vec<Step> = Vec::new();
    for (time, ctx) in tokens {
        match out.last_mut() {
            Some(s) if s.time == time => {
                s.tokens += 1;
                s.kv += ctx;
            }
            _ => out.push(Step {
                time,
                tokens: 1,
                kv: ctx,
            }),
        }
    }
    out
}

impl Run<'_> {
    fn one(&self, a: &BenchArgs, batch: usize, prompt_len: usize) -> Result<serde_json::Value> {
        let (info, weights, roofline) = (self.info, self.weights, self.roofline);
        let act = info.activation_dtype;
        let vocab = info.vocab_size as u64;

        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab) as u32
        };
        let params = SamplingParams {
            max_tokens: a.gen_len,
            ignore_eos: true,
            ..Default::default()
        };
        let start = Instant::now();
        // The whole batch is queued before the engine's next step, as one submission.
        let (tx, events) = mpsc::channel::<(usize, StreamEvent)>();
        let mut requests = Vec::with_capacity(batch);
        // A random id equal to the image placeholder would stand for a second image.
        let placeholder = self.image.map(|(_, id)| id);
        for i in 0..batch {
            let mut p: Vec<u32> = Vec::with_capacity(prompt_len + 1);
            let mut images = Vec::new();
            if let Some((img, id)) = self.image {
                p.push(id);
                let k = self.copies.get();
                self.copies.set(k + 1);
                images.push(Arc::new(unique_copy(img, k)));
            }
            p.extend((0..prompt_len).map(|_| match next() {
                t if Some(t) == placeholder => (t + 1) % vocab as u32,
                t => t,
            }));
            let tx = tx.clone();
            let sink = move |e: StreamEvent| tx.send((i, e)).is_ok();
            let mut request = Request::new(p, params.clone());
            request.images = images;
            requests.push((request, sink));
        }
        drop(tx);
        self.handle.submit_batch_with(requests)?;
        // (time, context length before the token) of every token; each request's timing.
        let mut tokens: Vec<(Instant, usize)> = Vec::with_capacity(batch * a.gen_len);
        let mut timing: Vec<Option<RequestTiming>> = vec![None; batch];
        // Each request's prompt tokens, image tokens included.
        let mut prompt_tokens = vec![0usize; batch];
        // Ends once every request's last event has been sent (its sender is dropped then).
        for (i, event) in events {
            match event {
                StreamEvent::Token { time, index, .. } => tokens.push((time, prompt_len + index)),
                StreamEvent::Finished {
                    timing: t,
                    prompt_tokens: n,
                    ..
                } => {
                    timing[i] = Some(t);
                    prompt_tokens[i] = n;
                }
                StreamEvent::Error(msg) => anyhow::bail!(msg),
                StreamEvent::Prefill { .. } => {}
            }
        }
        if let Some(i) = timing.iter().position(Option::is_none) {
            self.handle.stats()?; // the engine's error, when it stopped
            anyhow::bail!("bench request {i} ended without a final event");
        }
        let timing: Vec<RequestTiming> = timing.into_iter().flatten().collect();
        let generated = tokens.len();
        if generated != batch * a.gen_len {
            anyhow::bail!(
                "bench generated {generated} tokens instead of --batch {batch} × --gen-len {} = {}: the numbers would be wrong",
                a.gen_len,
                batch * a.gen_len
            );
        }
        let end = timing.iter().map(|t| t.finished).max().unwrap_or(start);
        let total = (end - start).as_secs_f64();
        // A step is pure decode when every sequence had its first token before it; it took
        // from the previous step's tokens to its own.
        let all_first = timing.iter().filter_map(|t| t.first_token).max();
        let steps = steps(tokens);
        let decode_steps: Vec<(f64, &Step)> = steps
            .windows(2)
            .filter(|w| all_first.is_some_and(|f| w[1].time > f))
            .map(|w| ((w[1].time - w[0].time).as_secs_f64(), &w[1]))
            .collect();
        let mut ttft: Vec<f64> = timing
            .iter()
            .map(|t| t.ttft().map_or(total, |d| d.as_secs_f64()))
            .collect();
        ttft.sort_by(f64::total_cmp);
        let mut tpot: Vec<f64> = decode_steps.iter().map(|s| s.0).collect();
        tpot.sort_by(f64::total_cmp);
        let decode_time: f64 = decode_steps.iter().map(|s| s.0).sum();
        let decode_tokens: usize = decode_steps.iter().map(|s| s.1.tokens).sum();
        // Paged cache read, plus each sequence's recurrent state read and written back.
        let kv_bytes: f64 = decode_steps
            .iter()
            .map(|(_, s)| {
                (s.kv * info.cache_bytes_per_token + 2 * s.tokens * info.state_bytes_per_seq) as f64
            })
            .sum();
        let weight_bytes = weights.per_step(batch);
        let moved = decode_steps.len() as f64 * weight_bytes + kv_bytes;
        let achieved = if decode_time > 0.0 {
            moved / decode_time
        } else {
            f64::NAN
        };
        let prefill_tokens: usize = prompt_tokens.iter().sum();
        // Tokens the image became (all sequences' images are the same size).
        let image_tokens = self
            .image
            .map(|_| prompt_tokens[0].saturating_sub(prompt_len));
        // A decode that moved bytes faster than the measured ceiling means the ceiling is wrong
        // (the copy kernel is slower than the model's, or the weights sit in a cache): the
        // fraction is capped at 100 % and flagged, never printed above it.
        let raw_fraction = achieved / roofline;
        let ceiling_unreliable = raw_fraction > 1.0;
        // No decode step (gen_len 1): no achieved rate, so no fraction (`min` would turn NaN into 1).
        let fraction = if raw_fraction.is_finite() {
            raw_fraction.min(1.0)
        } else {
            f64::NAN
        };
        // Held by the backend after the run: its peak where the allocator keeps what it took.
        let memory = self.handle.stats()?.memory_reserved;
        let report = serde_json::json!({
            "backend": info.backend,
            "model": self.model,
            "dtype": act.to_string(),
            "weight_dtype": info.weight_dtype.to_string(),
            "weight_resident_bytes": info.weight_bytes,
            "batch": batch,
            "prompt_len": prompt_len,
            "gen_len": a.gen_len,
            "image": a.image.as_ref().map(|p| p.display().to_string()),
            "image_tokens": image_tokens,
            "prompt_tokens": prompt_tokens[0],
            "tensor_parallel_size": self.split.0,
            "expert_parallel_size": self.split.1,
            "context_parallel_size": self.split.2,
            "batch_invariant": info.batch_invariant,
            "enforce_eager": self.enforce_eager,
            "moe_fp8": self.moe_fp8,
            "ttft_median_s": percentile(&ttft, 0.5),
            "ttft_max_s": ttft.last().copied().unwrap_or(f64::NAN),
            "prefill_tokens_per_s": prefill_tokens as f64 / ttft.last().copied().unwrap_or(f64::NAN),
            "tpot_median_s": percentile(&tpot, 0.5),
            "tpot_p99_s": percentile(&tpot, 0.99),
            "output_tokens_per_s": generated as f64 / total,
            "decode_tokens_per_s": decode_tokens as f64 / decode_time,
            "weight_bytes_per_step": weight_bytes,
            "weight_bytes_total": weights.dense + weights.experts,
            "decode_bytes_per_step_avg": moved / decode_steps.len().max(1) as f64,
            "achieved_decode_gbps": achieved / 1e9,
            "roofline_gbps": roofline / 1e9,
            "roofline_fraction": fraction,
            "roofline_unreliable": ceiling_unreliable,
            "roofline_method": "copy_rows of one row of a [2, n] tensor onto the other, n·4 = min(1 GiB, half the largest buffer, an eighth of free memory) bytes, read + write, 10 repetitions",
            "total_s": total,
            "device_memory_bytes": memory,
        });
        if a.json {
            outln!("{report}")?;
            return Ok(report);
        }
        outln!()?;
        let split = match self.split {
            (1, _, 1) => String::new(),
            (1, _, cp) => format!(" | cp {cp}"),
            (tp, 1, _) => format!(" | tp {tp}"),
            (tp, ep, _) => format!(" | tp {tp} ep {ep}"),
        };
        let split = if self.enforce_eager {
            format!("{split} | eager")
        } else {
            split
        };
        let split = if self.moe_fp8 {
            format!("{split} | moe-fp8")
        } else {
            split
        };
        outln!(
            "model {} | {} | {} | batch {} | prompt {} | gen {}{split}",
            self.model,
            info.backend,
            crate::generate::dtype_note(info),
            batch,
            prompt_len,
            a.gen_len
        )?;
        if let (Some(p), Some(n)) = (&a.image, image_tokens) {
            outln!("image {} → {n} tokens before the text", p.display())?;
        }
        outln!("{:<28}{:>14}", "metric", "value")?;
        // Undefined figures (no decode step with --gen-len 1, …) print as "-", not NaN.
        let row = |k: &str, v: String| {
            let v = if v.contains("NaN") || v.contains("inf") {
                "-".to_string()
            } else {
                v
            };
            outln!("{k:<28}{v:>14}")
        };
        row(
            "TTFT median (ms)",
            format!("{:.2}", percentile(&ttft, 0.5) * 1e3),
        )?;
        row(
            "TTFT max (ms)",
            format!("{:.2}", ttft.last().copied().unwrap_or(f64::NAN) * 1e3),
        )?;
        row(
            "prefill tok/s",
            format!(
                "{:.1}",
                report["prefill_tokens_per_s"].as_f64().unwrap_or(f64::NAN)
            ),
        )?;
        row(
            "TPOT median (ms)",
            format!("{:.3}", percentile(&tpot, 0.5) * 1e3),
        )?;
        row(
            "TPOT p99 (ms)",
            format!("{:.3}", percentile(&tpot, 0.99) * 1e3),
        )?;
        row("output tok/s", format!("{:.1}", generated as f64 / total))?;
        row(
            "decode tok/s",
            format!("{:.1}", decode_tokens as f64 / decode_time),
        )?;
        row(
            &format!("weights resident ({})", info.weight_dtype),
            dayone_engine::cache::human_bytes(info.weight_bytes),
        )?;
        // What the roofline counts: float weights in the weight dtype, low-bit ones (packed
        // codes and scales, GGUF blocks) in their stored bytes, experts by the routed share.
        row(
            "weights read per decode step",
            dayone_engine::cache::human_bytes(weight_bytes as u64),
        )?;
        row("decode GB/s achieved", format!("{:.1}", achieved / 1e9))?;
        row(
            "roofline GB/s (device copy ≤ 1 GiB, read + write)",
            format!("{:.1}", roofline / 1e9),
        )?;
        row(
            "roofline fraction",
            if ceiling_unreliable {
                "100% (capped)".to_string()
            } else if fraction.is_nan() {
                "- (no decode step)".to_string()
            } else {
                format!("{:.1}%", 100.0 * fraction)
            },
        )?;
        if ceiling_unreliable {
            outln!(
                "note: decode moved {:.1} GB/s, above the measured ceiling of {:.1} GB/s: that ceiling (a device-to-device copy) is unreliable on this device, so the fraction is capped at 100%",
                achieved / 1e9,
                roofline / 1e9
            )?;
        }
        if let Some(m) = memory {
            row(
                "device memory (GiB)",
                format!("{:.2}", m as f64 / (1u64 << 30) as f64),
            )?;
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::unique_copy;
    use dayone_engine::vision::encoder_cache::image_hash;
    use dayone_engine::vision::{preprocess, ImageProcessorConfig, RgbImage};

    /// Copies stay distinct after preprocessing, also when the processor downscales the image
    /// (4000×3000 → 2073×1554, vision.md §1.4): the encoder cache cannot serve one for another.
    #[test]
    fn unique_copies_hash_apart_after_a_downscale() {
        let (width, height) = (4000, 3000);
        let data = (0..width * height * 3).map(|i| (i % 251) as u8).collect();
        let img = RgbImage {
            width,
            height,
            data,
        };
        let cfg = ImageProcessorConfig::default();
        let hashes: Vec<[u8; 32]> = [0, 1, 256, 65536]
            .iter()
            .map(|&k| image_hash(&preprocess(&unique_copy(&img, k), &cfg)))
            .collect();
        for i in 0..hashes.len() {
            for j in i + 1..hashes.len() {
                assert_ne!(hashes[i], hashes[j], "copies {i} and {j} hash alike");
            }
        }
        // Only the corner changes.
        let copy = unique_copy(&img, 7);
        let changed = copy
            .data
            .iter()
            .zip(&img.data)
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            changed > 0 && changed <= 28 * 28 * 3,
            "{changed} bytes changed"
        );
    }
}
