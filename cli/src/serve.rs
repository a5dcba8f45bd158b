//! `dayone serve`: an OpenAI-compatible HTTP server over the engine service.
//!
//! It binds first (so `/health` answers 503 while the model loads, as llama-server does),
//! loads the model into an [`EngineHandle`] on its own thread, prints its URL once ready and
//! serves until SIGINT/SIGTERM, then drains: no new connections, in-flight requests get
//! `--shutdown-timeout` seconds to finish, the rest are aborted, exit 0. The server knows the
//! engine handle only — not the scheduler, the cache or the backend.

mod chat;
mod completions;
mod errors;
mod media;
mod metrics;
mod parsers;
mod protocol;
mod routes;
mod session;
mod sse;
mod state;

use crate::engine_args::{CommandDefaults, EngineArgs};
use crate::load;
use crate::usage::usage;
use anyhow::{Context, Result};
use clap::Args;
use dayone_engine::chat_template::ChatTemplate;
use dayone_engine::loader::Checkpoint;
use dayone_engine::service::EngineHandle;
use dayone_engine::tokenizer::Tokenizer;
use errors::ApiError;
use parsers::{ReasoningFormat, ToolFormat};
use state::{AppState, Loaded, Settings};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `dayone serve` flags: the engine flags every command takes, and the server's own.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The engine flags.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to bind (loopback by default; 0.0.0.0 or :: to serve other machines).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the URL printed says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* (also from env DAYONE_API_KEY); /health,
    /// /metrics, /tokenize and /detokenize stay open.
    #[arg(long, env = "DAYONE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The model name clients send and /v1/models lists [default: the --model path as given].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Tool-call format of the model's output [default: picked from config.json and the chat
    /// template]; `none` turns tool parsing off.
    #[arg(long, value_name = "NAME")]
    pub tool_call_parser: Option<String>,
    /// Reasoning format of the model's output [default: picked like --tool-call-parser];
    /// `none` sends reasoning as content.
    #[arg(long, value_name = "NAME")]
    pub reasoning_parser: Option<String>,
    /// Largest request body, MiB (a larger one gets 413).
    #[arg(long, default_value_t = 8, value_parser = crate::parse::at_least_one, allow_negative_numbers = true)]
    pub max_body_mb: usize,
    /// Most choices (`n`) per request.
    #[arg(long, default_value_t = 16, value_parser = crate::parse::at_least_one, allow_negative_numbers = true)]
    pub max_n: usize,
    /// Most alternatives per token for `top_logprobs` / `logprobs` (vLLM's --max-logprobs).
    #[arg(long, default_value_t = 20, value_parser = crate::parse::non_negative, allow_negative_numbers = true)]
    pub max_logprobs: usize,
    /// Directory under which chat `image_url` parts may name local files (`file:///…`); without
    /// it only `data:` URLs are accepted (remote http(s) URLs never are: nothing is fetched).
    #[arg(long, value_name = "DIR")]
    pub allowed_local_media_path: Option<std::path::PathBuf>,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM before they are aborted.
    #[arg(long, default_value_t = 30, value_parser = crate::parse::non_negative, allow_negative_numbers = true)]
    pub shutdown_timeout: usize,
}

/// A fresh id: `prefix-` and 32 hex digits (OpenAI's `chatcmpl-…`, `cmpl-…`).
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// Seconds since the Unix epoch.
pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The loaded model and its tokenizer, or 503 while it loads.
pub(crate) fn ready(
    state: &'static AppState,
) -> Result<(&'static Loaded, &'static Tokenizer), ApiError> {
    let loaded = state
        .loaded
        .get()
        .ok_or_else(|| ApiError::unavailable("the model is still loading"))?;
    let tok = loaded
        .tokenizer
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("this checkpoint has no tokenizer"))?;
    Ok((loaded, tok))
}

fn parser_formats(
    a: &ServeArgs,
    ckpt: &Checkpoint,
) -> Result<(Option<ToolFormat>, Option<ReasoningFormat>)> {
    let model_type = ckpt
        .config
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let (auto_tool, auto_reasoning) =
        parsers::auto_formats(model_type, ckpt.assets.chat_template.as_deref());
    let tool = match a.tool_call_parser.as_deref() {
        None => auto_tool,
        Some("none") => None,
        Some(name) => Some(ToolFormat::from_name(name).ok_or_else(|| {
            usage(format!(
                "--tool-call-parser: unknown parser '{name}': expected none or one of {}",
                ToolFormat::names().join(", ")
            ))
        })?),
    };
    let reasoning = match a.reasoning_parser.as_deref() {
        None => auto_reasoning,
        Some("none") => None,
        Some(name) => Some(ReasoningFormat::from_name(name).ok_or_else(|| {
            usage(format!(
                "--reasoning-parser: unknown parser '{name}': expected none or one of {}",
                ReasoningFormat::names().join(", ")
            ))
        })?),
    };
    Ok((tool, reasoning))
}

/// Runs the server until SIGINT/SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    let mut r = a.engine.resolve(&CommandDefaults::default())?;
    // A server runs many requests at once: by default the cache holds max_num_seqs prompts of
    // up to 8192 tokens (lowered, with a note, to what the device has free).
    let seqs = r.engine.scheduler.max_num_seqs;
    let window = r.engine.max_model_len.unwrap_or(usize::MAX).min(8192);
    r.engine.default_kv_cache_tokens = Some(seqs.saturating_mul(window).clamp(65536, 1 << 22));
    let path = load::model_path(r.model.clone())?;
    let ckpt = load::open(&path)?;
    r.settle_dtype(&ckpt);
    let (tool_format, reasoning_format) = parser_formats(&a, &ckpt)?;
    let assets = ckpt.assets.clone();
    if assets.tokenizer.is_none() {
        anyhow::bail!(
            "{}: serve needs a tokenizer (tokenizer.json or GGUF vocabulary)",
            path.display()
        );
    }
    let template = assets
        .chat_template
        .as_deref()
        .map(ChatTemplate::new)
        .transpose()
        .with_context(|| format!("{}: the chat template", path.display()))?;
    // vLLM's rule: the --model argument as given; the default model goes by its short name.
    let model_name = a
        .served_model_name
        .clone()
        .unwrap_or_else(|| match &r.model {
            Some(m) => m.display().to_string(),
            None => "SmolLM2-135M-Instruct".to_string(),
        });
    let settings = Settings {
        model_name,
        root: path.display().to_string(),
        api_key: match a.api_key.as_deref() {
            Some("") => return Err(usage("--api-key is empty (or DAYONE_API_KEY is set to an empty string): give a key, or leave both out to serve without one")),
            k => k.map(str::to_string),
        },
        max_n: a.max_n,
        max_logprobs: a.max_logprobs,
        created: now_unix(),
        max_body: a.max_body_mb << 20,
        image_markup: ckpt
            .config
            .get("model_type")
            .and_then(|v| v.as_str())
            .and_then(dayone_engine::vision::image_markup),
        allowed_local_media_path: match &a.allowed_local_media_path {
            Some(p) => Some(p.canonicalize().map_err(|e| {
                usage(format!(
                    "--allowed-local-media-path {}: {e}",
                    p.display()
                ))
            })?),
            None => None,
        },
    };
    // The state lives as long as the process: handlers and runs borrow it as `&'static`.
    let state: &'static AppState = Box::leak(Box::new(AppState::new(settings)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let addr = format!("{}:{}", bracket_v6(&a.host), a.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().context("the listening address")?;
    let app = routes::router(state);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = rt.spawn(async move {
        let mut stop = stop_rx;
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
    });
    eprintln!("dayone serve: loading {} …", path.display());
    let handle = match load::service(r.backend, ckpt, r.engine.clone(), false) {
        Ok(h) => h,
        Err(e) => {
            let _ = stop_tx.send(true);
            return Err(e);
        }
    };
    let stats = handle.stats().ok();
    let kv_cache_bytes = stats.as_ref().map_or(0, |s| {
        (s.total_blocks * r.engine.scheduler.block_size) as u64 * cache_bytes_per_token(&handle)
    });
    let loaded = Loaded {
        handle: handle.clone(),
        tokenizer: assets.tokenizer.clone(),
        template,
        bos_token: assets.bos_token.clone().unwrap_or_default(),
        eos_token: assets.eos_token.clone().unwrap_or_default(),
        add_bos: assets.add_bos,
        bos_id: assets.bos_id,
        tool_format,
        reasoning_format,
        gauges: metrics::ServerGauges {
            // As the backend holds them: 16-bit weights 2 bytes, low-bit blocks their bytes.
            weights_bytes: handle.model_info().weight_bytes,
            kv_cache_bytes,
            workspace_bytes: 0,
            requests_rejected: 0,
            resident_bytes: 0,
        },
        json_table: std::sync::OnceLock::new(),
    };
    let _ = state.loaded.set(loaded);
    {
        use std::io::Write;
        // A closed stdout (a supervisor that read the line and left) must not stop the server.
        let mut out = std::io::stdout();
        let _ = writeln!(
            out,
            "dayone serve: ready at http://{local} (model `{}`)",
            state.settings.model_name
        );
        let _ = out.flush();
    }
    // One listener for the whole run: a second one made after the first signal could see that
    // same signal again and quit without draining.
    let mut signals = rt.block_on(async { Signals::new() })?;
    rt.block_on(signals.next());
    eprintln!(
        "dayone serve: stopping: draining in-flight requests (up to {} s; a second SIGINT/SIGTERM quits at once)",
        a.shutdown_timeout
    );
    rt.spawn(async move {
        signals.next().await;
        eprintln!("dayone serve: second signal: quitting without draining");
        std::process::exit(130);
    });
    let _ = stop_tx.send(true);
    // Finishes what runs (aborting it after the grace), then the connections close.
    let grace = Duration::from_secs(a.shutdown_timeout as u64);
    handle.shutdown(grace);
    let drained =
        rt.block_on(async { tokio::time::timeout(grace + Duration::from_secs(5), server).await });
    if drained.is_err() {
        eprintln!("dayone serve: connections still open after the grace period: closing them");
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    eprintln!("dayone serve: stopped");
    Ok(())
}

/// `::1` → `[::1]` for `host:port`.
fn bracket_v6(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Bytes per cached token, from the engine (0 when it has stopped).
fn cache_bytes_per_token(handle: &EngineHandle) -> u64 {
    handle.model_info().cache_bytes_per_token as u64
}

/// SIGINT and SIGTERM, listened to from start to exit.
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (inside the runtime). Errors: the OS refused a handler.
    fn new() -> Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
                term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Waits for the next SIGINT or SIGTERM.
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
