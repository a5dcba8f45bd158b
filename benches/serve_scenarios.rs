//! Serving scenarios of issue [6] ("Measure"), through the engine service
//! ([`dayone_engine::service::EngineHandle`]), on random prompts (no tokenizer needed):
//!
//! - **long-short**: one long prompt (`--long-len`) starts prefilling; once its first prefill step
//!   has run, `--shorts` short requests (`--short-len`) arrive at once (or `--short-interval-ms`
//!   apart). Time to first token of the shorts (p50, p99, max, mean; nearest rank) and of the
//!   long one, with the long-request queue off (`long_prefill_threshold` 0: one queue) and on
//!   (`--long-threshold`, at most `--max-long-partial-prefills` long prefills at once, at most
//!   `--long-cap` of their tokens per step). Each configuration is its own engine (the scheduler
//!   limits are fixed when an engine is built), so `--queue both` loads the model twice.
//! - **multiturn**: turn 1 (`--turn1-len` prompt, `--gen` tokens), then turn 2 = turn-1 prompt +
//!   turn-1 output + `--turn2-extra` new tokens; TTFT of turn 2 with the prefix cache on (same
//!   `cache_salt` as turn 1: its cached blocks and state checkpoints match) and off (turn 2 again
//!   under a fresh salt, so nothing can match: the work of `--no-prefix-caching`, without a second
//!   model load). It runs on the queue-off engine, so that turn 2 (above the threshold) is not
//!   held to the long-prompt cap. Rows carry the request's `cached_tokens` and the engine's
//!   prefix-cache hit tokens (metrics counters) over turn 2; host-tier hit tokens and load bytes
//!   are reported too, for `--host-cache-gb` (the host tier, when built).
//!
//! Every request uses `ignore_eos`, so lengths are fixed; greedy sampling. Before measuring, each
//! engine runs one warm-up request (`min(--chunk, --long-len)` tokens) so first-use kernel
//! compilation is not timed. TTFT is measured from the `submit` call (vLLM's definition).
//!
//! Usage: `serve-scenarios --model DIR [--backend cuda|wgsl|cpu] [--scenario long-short|multiturn|all]
//!         [--json] …` (`--help` lists every flag and its default). Prints the command line, then a
//! table (stdout; on stderr with `--json`, where stdout gets one JSON object per row).

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use dayone_backend::conformance::Rng;
use dayone_backend::DType;
use dayone_engine::sampling::SamplingParams;
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::service::{EngineHandle, EngineStats, Request, StreamEvent};
use dayone_engine::{loader, Engine, EngineConfig};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Which backend runs the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// cudarc + NVRTC kernels + cuBLAS (fails in one line without a driver or device).
    Cuda,
    /// wgpu + WGSL (lavapipe on CPU-only machines).
    Wgsl,
    /// The CPU reference backend.
    Cpu,
}

/// Which scenarios to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Shorts arriving while a long prompt prefills.
    LongShort,
    /// Second turn of a conversation, prefix cache on vs off.
    Multiturn,
    /// Both.
    All,
    /// Host-memory tier: a working set of prompts larger than the device cache, submitted
    /// twice; the second pass hits blocks paged back from the host (needs `--host-cache-gb`).
    HostTier,
}

/// Which long-request queue configurations long-short runs (one engine load each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Queue {
    /// One queue (`long_prefill_threshold` 0).
    Off,
    /// The long-request queue (`--long-threshold`, `--long-cap`).
    On,
    /// Off, then on.
    Both,
}

/// Command-line flags.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "serve-scenarios",
    args_override_self = true,
    about = "TTFT of serving scenarios: shorts behind a long prefill (long-request queue off/on), second turn with the prefix cache on/off"
)]
struct Args {
    /// Model directory (config.json + *.safetensors) or GGUF file; no tokenizer needed.
    #[arg(long)]
    model: PathBuf,
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Cuda)]
    backend: BackendArg,
    /// Weights and activations dtype: f32 or bf16.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    dtype: DType,
    /// KV cache size in tokens; default: what the chosen scenarios need (printed).
    #[arg(long)]
    kv_cache_tokens: Option<usize>,
    /// Scenarios to run.
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    scenario: Scenario,
    /// long-short: queue configurations to run (each loads the model once).
    #[arg(long, value_enum, default_value_t = Queue::Both)]
    queue: Queue,
    /// long-short: long prompt length (tokens).
    #[arg(long, default_value_t = 131072, value_parser = positive)]
    long_len: usize,
    /// long-short: short prompt length (tokens).
    #[arg(long, default_value_t = 512, value_parser = positive)]
    short_len: usize,
    /// long-short: number of short requests.
    #[arg(long, default_value_t = 64, value_parser = positive)]
    shorts: usize,
    /// long-short: tokens generated by each request (the long one too).
    #[arg(long, default_value_t = 16, value_parser = positive)]
    short_gen: usize,
    /// long-short: gap between consecutive short arrivals (ms; 0: all at once).
    #[arg(long, default_value_t = 0)]
    short_interval_ms: u64,
    /// long-short: extra wait after the long prompt's first prefill step before the shorts (ms).
    #[arg(long, default_value_t = 0)]
    short_delay_ms: u64,
    /// long-short, queue on: prompts above this many tokens go to the long-request queue.
    #[arg(long, default_value_t = 32768, value_parser = positive)]
    long_threshold: usize,
    /// long-short, queue on: most long-prompt tokens per step (`long_prefill_token_cap`).
    #[arg(long, default_value_t = 2048, value_parser = positive)]
    long_cap: usize,
    /// long-short, queue on: most long prompts prefilling at once.
    #[arg(long, default_value_t = 1, value_parser = positive)]
    max_long_partial_prefills: usize,
    /// multiturn: turn-1 prompt length (tokens).
    #[arg(long, default_value_t = 32768, value_parser = positive)]
    turn1_len: usize,
    /// multiturn: new tokens appended for turn 2.
    #[arg(long, default_value_t = 64, value_parser = positive)]
    turn2_extra: usize,
    /// multiturn: tokens generated per turn.
    #[arg(long, default_value_t = 32, value_parser = positive)]
    gen: usize,
    /// Prefill chunk and step token budget (`max_prefill_chunk` = `max_batched_tokens`).
    #[arg(long, default_value_t = 8192, value_parser = positive)]
    chunk: usize,
    /// Most sequences running at once; default: `--shorts` + 2.
    #[arg(long, value_parser = positive)]
    max_num_seqs: Option<usize>,
    /// Host-memory tier for evicted blocks (GB; 0: none). The hook for the host-tier
    /// measurement: its hits and load bytes are reported in the multiturn rows.
    #[arg(long, default_value_t = 0.0)]
    host_cache_gb: f64,
    /// host-tier: distinct prompts in the working set.
    #[arg(long, default_value_t = 24, value_parser = positive)]
    host_prompts: usize,
    /// host-tier: tokens per prompt (the device cache defaults to a third of the working set).
    #[arg(long, default_value_t = 4096, value_parser = positive)]
    host_prompt_len: usize,
    /// Seed of the random prompts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Skip the warm-up request.
    #[arg(long)]
    no_warmup: bool,
    /// One JSON object per row on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    match DType::parse(s) {
        Ok(d @ (DType::F32 | DType::BF16)) => Ok(d),
        Ok(d) => Err(format!("expected f32 or bf16, got {d}")),
        Err(e) => Err(format!("{e}")),
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("expected a positive integer: {e}")),
    }
}

/// One result row: the scenario, the configuration, and its fields (figures in ms).
#[derive(Clone, Debug)]
struct Row {
    scenario: &'static str,
    config: String,
    fields: Map<String, Value>,
}

impl Row {
    fn to_json(&self, ctx: &Context_) -> Value {
        let mut m = Map::new();
        m.insert("scenario".into(), json!(self.scenario));
        m.insert("config".into(), json!(self.config));
        m.extend(self.fields.clone());
        m.insert("model".into(), json!(ctx.model));
        m.insert("backend".into(), json!(ctx.backend));
        m.insert("dtype".into(), json!(ctx.dtype));
        m.insert("date".into(), json!(ctx.date));
        Value::Object(m)
    }

    fn ms(&self, key: &str) -> String {
        match self.fields.get(key).and_then(Value::as_f64) {
            Some(v) => format!("{v:.1}"),
            None => "-".into(),
        }
    }

    fn int(&self, key: &str) -> String {
        match self.fields.get(key).and_then(Value::as_u64) {
            Some(v) => v.to_string(),
            None => "-".into(),
        }
    }
}

/// What every row carries besides its figures.
struct Context_ {
    model: String,
    backend: &'static str,
    dtype: String,
    date: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cmdline = command_line();
    match run(&args, &cmdline) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve-scenarios: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The command line as typed (arguments with spaces quoted).
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if a.contains(|c: char| c.is_whitespace() || c == '\'') || a.is_empty() {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs the chosen scenarios, prints the table (and JSON rows), returns the rows.
fn run(a: &Args, cmdline: &str) -> Result<Vec<Row>> {
    check_args(a)?;
    if a.backend == BackendArg::Cuda && !dayone_cuda::is_available() {
        // The constructor's error names what is missing (driver, library or device).
        let why = dayone_cuda::CudaBackend::new(0)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_else(|| "no CUDA device".into());
        bail!("--backend cuda: {why}");
    }
    let ctx = Context_ {
        model: a.model.display().to_string(),
        backend: backend_name(a.backend),
        dtype: a.dtype.to_string(),
        date: utc_now(),
    };
    let say = |line: &str| {
        if a.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    say(&format!("command: {cmdline}"));
    let kv = a.kv_cache_tokens.unwrap_or_else(|| kv_tokens_needed(a));
    say(&format!(
        "model {} | backend {} | dtype {} | kv cache {kv} tokens | chunk {} | {}",
        ctx.model, ctx.backend, ctx.dtype, a.chunk, ctx.date
    ));
    if a.scenario == Scenario::HostTier {
        let handle = start(a, engine_config(a, kv, false))?;
        warm_up(&handle, a)?;
        let row = host_tier_run(&handle, a, kv)?;
        if a.json {
            println!("{}", row.to_json(&ctx));
        }
        say(&format!(
            "host-tier: {} prompts x {} tokens, device cache {kv} tokens: {}",
            a.host_prompts,
            a.host_prompt_len,
            serde_json::to_string(&row.fields)?
        ));
        handle.shutdown(Duration::from_secs(5));
        return Ok(vec![row]);
    }
    let long_short = matches!(a.scenario, Scenario::LongShort | Scenario::All);
    let multiturn = matches!(a.scenario, Scenario::Multiturn | Scenario::All);
    let queue_off = !long_short || matches!(a.queue, Queue::Off | Queue::Both);
    let queue_on = long_short && matches!(a.queue, Queue::On | Queue::Both);
    let mut rows = Vec::new();
    let emit = |rows: &mut Vec<Row>, row: Row| {
        if a.json {
            println!("{}", row.to_json(&ctx));
        }
        rows.push(row);
    };
    if queue_off {
        let handle = start(a, engine_config(a, kv, false))?;
        warm_up(&handle, a)?;
        if long_short {
            let row = long_short_run(&handle, a, "queue-off")?;
            emit(&mut rows, row);
        }
        if multiturn {
            for row in multiturn_run(&handle, a)? {
                emit(&mut rows, row);
            }
        }
        handle.shutdown(Duration::from_secs(5));
    }
    if queue_on {
        let handle = start(a, engine_config(a, kv, true))?;
        warm_up(&handle, a)?;
        let mut row = long_short_run(&handle, a, "queue-on")?;
        if let Some(off) = rows.iter().find(|r| r.config == "queue-off") {
            for key in [
                "short_ttft_p50_ms",
                "short_ttft_p99_ms",
                "short_ttft_mean_ms",
            ] {
                let (o, n) = (field(off, key), field(&row, key));
                if n > 0.0 {
                    let name = key.replace("_ms", "_off_over_on");
                    row.fields.insert(name, json!(o / n));
                }
            }
        }
        emit(&mut rows, row);
        handle.shutdown(Duration::from_secs(5));
    }
    print_tables(&rows, say);
    Ok(rows)
}

fn check_args(a: &Args) -> Result<()> {
    if !a.model.exists() {
        bail!("--model {}: no such file or directory", a.model.display());
    }
    if a.scenario == Scenario::HostTier && a.host_cache_gb <= 0.0 {
        bail!("--scenario host-tier needs a host tier: give --host-cache-gb");
    }
    let long_short = matches!(a.scenario, Scenario::LongShort | Scenario::All);
    if long_short && matches!(a.queue, Queue::On | Queue::Both) {
        if a.long_len <= a.long_threshold {
            bail!(
                "--long-len ({}) must be above --long-threshold ({}) for the long-request queue to take it",
                a.long_len,
                a.long_threshold
            );
        }
        if a.short_len > a.long_threshold {
            bail!(
                "--short-len ({}) must not be above --long-threshold ({}): the shorts would queue as long requests",
                a.short_len,
                a.long_threshold
            );
        }
    }
    if !(a.host_cache_gb >= 0.0 && a.host_cache_gb.is_finite()) {
        bail!(
            "--host-cache-gb must be a non-negative number, got {}",
            a.host_cache_gb
        );
    }
    Ok(())
}

fn backend_name(b: BackendArg) -> &'static str {
    match b {
        BackendArg::Cuda => "cuda",
        BackendArg::Wgsl => "wgsl",
        BackendArg::Cpu => "cpu",
    }
}

fn field(row: &Row, key: &str) -> f64 {
    row.fields.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// KV cache tokens the chosen scenarios hold at once, plus a block per sequence of slack:
/// long-short: the long request and every short; multiturn: turn 1's cached blocks, turn 2 with
/// the cache on and turn 2 again under a fresh salt (the warm-up's blocks are evictable).
fn kv_tokens_needed(a: &Args) -> usize {
    let bs = SchedulerConfig::default().block_size;
    if a.scenario == Scenario::HostTier {
        // A third of the working set (but room for one prompt and its chunk).
        let third = a.host_prompts * a.host_prompt_len / 3;
        return third.max(a.host_prompt_len + a.chunk + 2 * bs).div_ceil(bs) * bs;
    }
    let mut need = 0;
    if matches!(a.scenario, Scenario::LongShort | Scenario::All) {
        let seqs = a.shorts + 1;
        need =
            need.max(a.long_len + a.short_gen + a.shorts * (a.short_len + a.short_gen) + seqs * bs);
    }
    if matches!(a.scenario, Scenario::Multiturn | Scenario::All) {
        let turn2 = a.turn1_len + 2 * a.gen + a.turn2_extra;
        need = need.max(2 * turn2 + 3 * bs);
    }
    need.max(a.chunk.min(a.long_len) + 2).div_ceil(bs) * bs
}

/// The engine settings of one configuration: `queue` turns the long-request queue on.
fn engine_config(a: &Args, kv: usize, queue: bool) -> EngineConfig {
    let base = SchedulerConfig::default();
    let max_num_seqs = a.max_num_seqs.unwrap_or(a.shorts + 2);
    let scheduler = SchedulerConfig {
        max_batched_tokens: a.chunk,
        max_prefill_chunk: a.chunk,
        max_num_seqs,
        long_prefill_threshold: if queue { a.long_threshold } else { 0 },
        max_long_partial_prefills: a.max_long_partial_prefills,
        long_prefill_token_cap: if queue { a.long_cap } else { 0 },
        max_queued_requests: base.max_queued_requests.max(a.shorts + 8),
        ..base
    };
    EngineConfig {
        dtype: a.dtype,
        kv_cache_tokens: Some(kv),
        scheduler,
        prefix_caching: true,
        host_cache_bytes: (a.host_cache_gb * 1e9) as u64,
        ..Default::default()
    }
}

/// Loads the model on the chosen backend in a new engine thread.
fn start(a: &Args, cfg: EngineConfig) -> Result<EngineHandle> {
    let path = a.model.clone();
    let t0 = Instant::now();
    let handle = match a.backend {
        BackendArg::Cuda => EngineHandle::start(move || {
            let ckpt = loader::open(&path)?;
            Engine::new(dayone_cuda::CudaBackend::new(0)?, &ckpt, &cfg, None)
        }),
        BackendArg::Wgsl => EngineHandle::start(move || {
            let ckpt = loader::open(&path)?;
            Engine::new(dayone_wgsl::WgslBackend::new()?, &ckpt, &cfg, None)
        }),
        BackendArg::Cpu => EngineHandle::start(move || {
            let ckpt = loader::open(&path)?;
            Engine::new(dayone_backend::cpu::CpuBackend, &ckpt, &cfg, None)
        }),
    }
    .with_context(|| format!("loading {}", a.model.display()))?;
    eprintln!(
        "loaded {} in {:.1} s",
        a.model.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(handle)
}

/// `len` random token ids below the vocabulary size, from stream `stream` of `--seed`.
fn random_prompt(a: &Args, handle: &EngineHandle, stream: u64, len: usize) -> Vec<u32> {
    let vocab = handle.model_info().vocab_size;
    let mut rng = Rng::new(a.seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (0..len).map(|_| rng.below(vocab) as u32).collect()
}

fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize, salt: &str) -> Request {
    Request {
        cache_salt: Some(salt.to_string()),
        ..Request::new(prompt, params(max_tokens))
    }
}

/// What one finished request reports.
#[derive(Clone, Debug)]
struct Outcome {
    tokens: Vec<u32>,
    arrival: Instant,
    ttft: Duration,
    e2e: Duration,
    cached_tokens: usize,
}

/// Submits `req` and waits for its last event.
fn submit_and_wait(handle: &EngineHandle, req: Request) -> Result<Outcome> {
    let stream = handle.submit(req)?;
    collect(stream)
}

fn collect(stream: dayone_engine::service::RequestStream) -> Result<Outcome> {
    let id = stream.id();
    let mut tokens = Vec::new();
    for event in stream {
        match event {
            StreamEvent::Token { token, .. } => tokens.push(token),
            StreamEvent::Finished {
                reason,
                cached_tokens,
                timing,
                ..
            } => {
                let ttft = timing
                    .ttft()
                    .with_context(|| format!("request {id} ended ({reason:?}) without a token"))?;
                return Ok(Outcome {
                    tokens,
                    arrival: timing.arrival,
                    ttft,
                    e2e: timing.e2e(),
                    cached_tokens,
                });
            }
            StreamEvent::Error(msg) => bail!("request {id}: {msg}"),
            StreamEvent::Prefill { .. } => {}
        }
    }
    bail!("request {id}: its stream ended without a final event")
}

/// One request of `min(--chunk, --long-len)` tokens, so that first-use kernel compilation (CUDA
/// NVRTC, WGSL pipelines) and allocations are not timed. Under its own salt: nothing reuses it.
fn warm_up(handle: &EngineHandle, a: &Args) -> Result<()> {
    if a.no_warmup {
        return Ok(());
    }
    let len = a
        .chunk
        .min(a.long_len)
        .min(handle.model_info().max_context - 2);
    let prompt = random_prompt(a, handle, u64::MAX, len);
    let out = submit_and_wait(handle, request(prompt, 2, "warm-up")).context("warm-up request")?;
    eprintln!("warm-up: {len} tokens, TTFT {:.1} ms", ms(out.ttft));
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The long prompt, then the shorts once its first prefill step has run; their TTFTs.
fn long_short_run(handle: &EngineHandle, a: &Args, config: &str) -> Result<Row> {
    let stream_base = if config == "queue-on" { 1 << 32 } else { 0 };
    let long_prompt = random_prompt(a, handle, stream_base, a.long_len);
    let shorts: Vec<Vec<u32>> = (0..a.shorts)
        .map(|i| random_prompt(a, handle, stream_base + 1 + i as u64, a.short_len))
        .collect();
    let long_arrival = Instant::now();
    let long = handle.submit(request(long_prompt, a.short_gen, config))?;
    wait_for_prefill_start(handle)?;
    std::thread::sleep(Duration::from_millis(a.short_delay_ms));
    let shorts_after = long_arrival.elapsed();
    let interval = Duration::from_millis(a.short_interval_ms);
    let (long_out, short_outs) = std::thread::scope(|s| {
        let workers: Vec<_> = shorts
            .into_iter()
            .enumerate()
            .map(|(i, prompt)| {
                let req = request(prompt, a.short_gen, config);
                s.spawn(move || {
                    std::thread::sleep(interval * i as u32);
                    submit_and_wait(handle, req)
                })
            })
            .collect();
        let long_out = collect(long);
        let short_outs: Vec<Result<Outcome>> = workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| bail!("a submitting thread panicked"))
            })
            .collect();
        (long_out, short_outs)
    });
    let long_out = long_out.context("the long request")?;
    let short_outs = short_outs
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .context("a short request")?;
    // The measurement means something only if the shorts arrived before the long prompt's
    // first token (its prefill over); say so in the row, and loudly when they did not.
    let long_first = long_out.arrival + long_out.ttft;
    let during = short_outs.iter().all(|o| o.arrival < long_first);
    if !during {
        eprintln!(
            "warning: {config}: some shorts arrived after the long prompt's prefill had ended (raise --long-len or lower --short-delay-ms/--short-interval-ms)"
        );
    }
    let mut ttfts: Vec<f64> = short_outs.iter().map(|o| ms(o.ttft)).collect();
    ttfts.sort_by(f64::total_cmp);
    let e2e: Vec<f64> = short_outs.iter().map(|o| ms(o.e2e)).collect();
    let mut fields = Map::new();
    fields.insert("short_ttft_p50_ms".into(), json!(percentile(&ttfts, 50.0)));
    fields.insert("short_ttft_p99_ms".into(), json!(percentile(&ttfts, 99.0)));
    fields.insert(
        "short_ttft_max_ms".into(),
        json!(ttfts.last().copied().unwrap_or(0.0)),
    );
    fields.insert("short_ttft_mean_ms".into(), json!(mean(&ttfts)));
    fields.insert("short_e2e_mean_ms".into(), json!(mean(&e2e)));
    fields.insert("long_ttft_ms".into(), json!(ms(long_out.ttft)));
    fields.insert("long_e2e_ms".into(), json!(ms(long_out.e2e)));
    fields.insert("shorts_submitted_after_ms".into(), json!(ms(shorts_after)));
    fields.insert("shorts_during_long_prefill".into(), json!(during));
    fields.insert("long_len".into(), json!(a.long_len));
    fields.insert("short_len".into(), json!(a.short_len));
    fields.insert("shorts".into(), json!(a.shorts));
    fields.insert("gen".into(), json!(a.short_gen));
    fields.insert("short_interval_ms".into(), json!(a.short_interval_ms));
    fields.insert("chunk".into(), json!(a.chunk));
    let on = config == "queue-on";
    fields.insert(
        "long_prefill_threshold".into(),
        json!(if on { a.long_threshold } else { 0 }),
    );
    fields.insert(
        "long_prefill_token_cap".into(),
        json!(if on { a.long_cap } else { 0 }),
    );
    fields.insert(
        "max_long_partial_prefills".into(),
        json!(a.max_long_partial_prefills),
    );
    Ok(Row {
        scenario: "long-short",
        config: config.to_string(),
        fields,
    })
}

/// Waits until the engine has run a step that holds cache blocks (the long prompt's first
/// prefill chunk): `stats` is answered between steps, so a snapshot with blocks in use comes
/// after that step. Ends early when nothing is in flight any more.
fn wait_for_prefill_start(handle: &EngineHandle) -> Result<()> {
    loop {
        let s: EngineStats = handle.stats()?;
        if s.free_blocks < s.total_blocks || s.requests == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Prefix-cache and host-tier counters (tokens, bytes) from the engine's metrics.
#[derive(Clone, Copy, Default)]
struct CacheCounters {
    prefix_query: u64,
    prefix_hit: u64,
    host_hit: u64,
    host_load_bytes: u64,
    host_load_seconds: f64,
    host_store_bytes: u64,
}

fn cache_counters(handle: &EngineHandle) -> Result<CacheCounters> {
    let m = handle
        .stats()?
        .metrics
        .context("the engine reports no metrics")?;
    Ok(CacheCounters {
        prefix_query: m.prefix_cache_queries,
        prefix_hit: m.prefix_cache_hits,
        host_hit: m.host_cache_hits,
        host_load_bytes: m.host_load.bytes,
        host_load_seconds: m.host_load.seconds,
        host_store_bytes: m.host_store.bytes,
    })
}

/// The working set twice: pass 1 fills the device cache and spills to the host tier, pass 2
/// hits — mostly blocks paged back from the host. One request at a time, one generated token.
fn host_tier_run(handle: &EngineHandle, a: &Args, kv: usize) -> Result<Row> {
    let prompts: Vec<Vec<u32>> = (0..a.host_prompts)
        .map(|i| random_prompt(a, handle, (3 << 32) + i as u64, a.host_prompt_len))
        .collect();
    let mut pass_ttft = Vec::new();
    let mut fields = Map::new();
    for pass in 0..2 {
        let before = cache_counters(handle)?;
        let mut ttft = Vec::new();
        for p in &prompts {
            ttft.push(ms(
                submit_and_wait(handle, request(p.clone(), 1, "host"))?.ttft
            ));
        }
        let after = cache_counters(handle)?;
        ttft.sort_by(f64::total_cmp);
        pass_ttft.push(mean(&ttft));
        if pass == 1 {
            let query = after.prefix_query - before.prefix_query;
            let hit = after.prefix_hit - before.prefix_hit;
            let host = after.host_hit - before.host_hit;
            let bytes = after.host_load_bytes - before.host_load_bytes;
            let secs = after.host_load_seconds - before.host_load_seconds;
            fields.insert("query_tokens".into(), json!(query));
            fields.insert("hit_tokens".into(), json!(hit));
            fields.insert("host_hit_tokens".into(), json!(host));
            fields.insert("device_hit_tokens".into(), json!(hit - host.min(hit)));
            fields.insert("hit_rate".into(), json!(hit as f64 / query.max(1) as f64));
            fields.insert("host_load_bytes".into(), json!(bytes));
            fields.insert("host_load_s".into(), json!(secs));
            fields.insert(
                "host_load_gb_per_s".into(),
                json!(if secs > 0.0 {
                    bytes as f64 / secs / 1e9
                } else {
                    0.0
                }),
            );
            fields.insert("host_store_bytes".into(), json!(after.host_store_bytes));
        }
    }
    fields.insert("pass1_ttft_mean_ms".into(), json!(pass_ttft[0]));
    fields.insert("pass2_ttft_mean_ms".into(), json!(pass_ttft[1]));
    fields.insert("prompts".into(), json!(a.host_prompts));
    fields.insert("prompt_len".into(), json!(a.host_prompt_len));
    fields.insert("device_cache_tokens".into(), json!(kv));
    fields.insert("host_cache_gb".into(), json!(a.host_cache_gb));
    Ok(Row {
        scenario: "host-tier",
        config: "host".into(),
        fields,
    })
}

/// Turn 1, then turn 2 with the cache on (same salt) and off (a fresh salt).
fn multiturn_run(handle: &EngineHandle, a: &Args) -> Result<Vec<Row>> {
    let turn1 = random_prompt(a, handle, 2 << 32, a.turn1_len);
    let salt = "conversation";
    let t1 = submit_and_wait(handle, request(turn1.clone(), a.gen, salt)).context("turn 1")?;
    let mut turn2 = turn1;
    turn2.extend_from_slice(&t1.tokens);
    turn2.extend(random_prompt(a, handle, (2 << 32) + 1, a.turn2_extra));
    let mut rows = Vec::new();
    for (config, salt) in [("cache-on", salt), ("cache-off", "conversation-fresh-salt")] {
        let before = cache_counters(handle)?;
        let out = submit_and_wait(handle, request(turn2.clone(), a.gen, salt))
            .with_context(|| format!("turn 2 ({config})"))?;
        let after = cache_counters(handle)?;
        let mut fields = Map::new();
        fields.insert("turn2_ttft_ms".into(), json!(ms(out.ttft)));
        fields.insert("turn2_e2e_ms".into(), json!(ms(out.e2e)));
        fields.insert("turn1_ttft_ms".into(), json!(ms(t1.ttft)));
        fields.insert("turn2_prompt_tokens".into(), json!(turn2.len()));
        fields.insert("cached_tokens".into(), json!(out.cached_tokens));
        fields.insert(
            "prefix_query_tokens".into(),
            json!(after.prefix_query - before.prefix_query),
        );
        fields.insert(
            "prefix_hit_tokens".into(),
            json!(after.prefix_hit - before.prefix_hit),
        );
        fields.insert(
            "host_hit_tokens".into(),
            json!(after.host_hit - before.host_hit),
        );
        fields.insert(
            "host_load_bytes".into(),
            json!(after.host_load_bytes - before.host_load_bytes),
        );
        fields.insert("turn1_len".into(), json!(a.turn1_len));
        fields.insert("turn2_extra".into(), json!(a.turn2_extra));
        fields.insert("gen".into(), json!(a.gen));
        fields.insert("chunk".into(), json!(a.chunk));
        rows.push(Row {
            scenario: "multiturn",
            config: config.to_string(),
            fields,
        });
    }
    if let [on, off] = rows.as_mut_slice() {
        let (t_on, t_off) = (field(on, "turn2_ttft_ms"), field(off, "turn2_ttft_ms"));
        if t_on > 0.0 {
            on.fields
                .insert("turn2_ttft_off_over_on".into(), json!(t_off / t_on));
        }
    }
    Ok(rows)
}

fn print_tables(rows: &[Row], say: impl Fn(&str)) {
    let ls: Vec<&Row> = rows.iter().filter(|r| r.scenario == "long-short").collect();
    if !ls.is_empty() {
        say("");
        say("long-short | config    | short TTFT p50 ms | p99 ms   | max ms   | mean ms  | long TTFT ms");
        for r in &ls {
            say(&format!(
                "long-short | {:<9} | {:>17} | {:>8} | {:>8} | {:>8} | {:>12}",
                r.config,
                r.ms("short_ttft_p50_ms"),
                r.ms("short_ttft_p99_ms"),
                r.ms("short_ttft_max_ms"),
                r.ms("short_ttft_mean_ms"),
                r.ms("long_ttft_ms"),
            ));
        }
        if let Some(on) = ls
            .iter()
            .find(|r| r.fields.contains_key("short_ttft_p50_off_over_on"))
        {
            say(&format!(
                "short TTFT, queue off / queue on: p50 {:.2}x, p99 {:.2}x, mean {:.2}x",
                field(on, "short_ttft_p50_off_over_on"),
                field(on, "short_ttft_p99_off_over_on"),
                field(on, "short_ttft_mean_off_over_on"),
            ));
        }
    }
    let mt: Vec<&Row> = rows.iter().filter(|r| r.scenario == "multiturn").collect();
    if !mt.is_empty() {
        say("");
        say("multiturn | config    | turn-2 TTFT ms | cached tokens | prefix hit tokens | host hit tokens");
        for r in &mt {
            say(&format!(
                "multiturn | {:<9} | {:>14} | {:>13} | {:>17} | {:>15}",
                r.config,
                r.ms("turn2_ttft_ms"),
                r.int("cached_tokens"),
                r.int("prefix_hit_tokens"),
                r.int("host_hit_tokens"),
            ));
        }
        if let Some(on) = mt
            .iter()
            .find(|r| r.fields.contains_key("turn2_ttft_off_over_on"))
        {
            say(&format!(
                "turn-2 TTFT, cache off / cache on: {:.2}x",
                field(on, "turn2_ttft_off_over_on")
            ));
        }
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ` (UTC), from the system clock.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant,
/// "chrono-Compatible Low-Level Date Algorithms", `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    /// Both scenarios, tiny, on the CPU backend: rows come out as JSON that parses back with
    /// every figure; the cached turn 2 hits the prefix cache, the fresh-salt one does not.
    fn run_tiny(model: &str) {
        let path = fixture(model);
        let argv = [
            "serve-scenarios",
            "--model",
            &path,
            "--backend",
            "cpu",
            "--dtype",
            "f32",
            "--long-len",
            "200",
            "--short-len",
            "20",
            "--shorts",
            "4",
            "--short-gen",
            "2",
            "--long-threshold",
            "100",
            "--long-cap",
            "16",
            "--chunk",
            "64",
            "--turn1-len",
            "200",
            "--turn2-extra",
            "8",
            "--gen",
            "4",
            "--json",
        ];
        let args = Args::try_parse_from(argv).expect("flags parse");
        let rows = run(&args, &argv.join(" ")).expect("scenarios run");
        let ctx = Context_ {
            model: path.clone(),
            backend: "cpu",
            dtype: "f32".into(),
            date: utc_now(),
        };
        let parsed: Vec<Value> = rows
            .iter()
            .map(|r| serde_json::from_str(&r.to_json(&ctx).to_string()).expect("row is JSON"))
            .collect();
        let configs: Vec<(&str, &str)> = parsed
            .iter()
            .map(|v| {
                (
                    v["scenario"].as_str().unwrap(),
                    v["config"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            configs,
            [
                ("long-short", "queue-off"),
                ("multiturn", "cache-on"),
                ("multiturn", "cache-off"),
                ("long-short", "queue-on"),
            ]
        );
        for v in parsed.iter().filter(|v| v["scenario"] == "long-short") {
            let p50 = v["short_ttft_p50_ms"].as_f64().unwrap();
            let p99 = v["short_ttft_p99_ms"].as_f64().unwrap();
            let max = v["short_ttft_max_ms"].as_f64().unwrap();
            assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{v}");
            assert!(v["long_ttft_ms"].as_f64().unwrap() > 0.0, "{v}");
            assert_eq!(v["backend"], "cpu");
            assert!(v["shorts_during_long_prefill"].is_boolean(), "{v}");
        }
        let on = &parsed[1];
        let off = &parsed[2];
        assert!(on["prefix_hit_tokens"].as_u64().unwrap() > 0, "{on}");
        assert_eq!(on["cached_tokens"], on["prefix_hit_tokens"], "{on}");
        assert_eq!(off["prefix_hit_tokens"].as_u64(), Some(0), "{off}");
        assert_eq!(off["cached_tokens"].as_u64(), Some(0), "{off}");
        assert_eq!(on["turn2_prompt_tokens"].as_u64(), Some(200 + 4 + 8));
        assert!(on["turn2_ttft_off_over_on"].as_f64().unwrap() > 0.0);
        assert!(parsed[3]["short_ttft_p50_off_over_on"].as_f64().is_some());
    }

    #[test]
    fn tiny_llama_both_scenarios() {
        run_tiny("llama_tiny");
    }

    #[test]
    fn tiny_kimi_linear_both_scenarios() {
        run_tiny("kimi_linear_tiny");
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for argv in [
            vec!["serve-scenarios"],
            vec!["serve-scenarios", "--model", "x", "--backend", "tpu"],
            vec!["serve-scenarios", "--model", "x", "--dtype", "u32"],
            vec!["serve-scenarios", "--model", "x", "--shorts", "0"],
        ] {
            let e = Args::try_parse_from(&argv).expect_err("refused");
            assert_eq!(e.exit_code(), 2, "{argv:?}: {e}");
        }
    }

    #[test]
    fn queue_needs_a_long_prompt_above_the_threshold() {
        let model = fixture("llama_tiny");
        let args = Args::try_parse_from([
            "serve-scenarios",
            "--model",
            &model,
            "--long-len",
            "1000",
            "--long-threshold",
            "2000",
        ])
        .unwrap();
        let e = check_args(&args).unwrap_err().to_string();
        assert!(
            e.contains("--long-len (1000)") && e.contains("--long-threshold (2000)"),
            "{e}"
        );
        let args = Args::try_parse_from(["serve-scenarios", "--model", "/nonexistent/m"]).unwrap();
        let e = check_args(&args).unwrap_err().to_string();
        assert!(e.contains("--model /nonexistent/m"), "{e}");
    }

    #[test]
    fn a_later_flag_overrides_an_earlier_one() {
        // run_serving.sh appends $EXTRA after its own flags.
        let args = Args::try_parse_from([
            "serve-scenarios",
            "--model",
            "m",
            "--shorts",
            "8",
            "--shorts",
            "3",
        ])
        .unwrap();
        assert_eq!(args.shorts, 3);
    }

    #[test]
    fn percentiles_and_dates() {
        let v: Vec<f64> = (1..=64).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 32.0);
        assert_eq!(percentile(&v, 99.0), 64.0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_423), (2025, 12, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
