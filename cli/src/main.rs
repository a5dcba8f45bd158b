//! `dayone`: run new large language models from their `config.json`, safetensors and tokenizer
//! (or a GGUF file) on the WGSL or CUDA backend.

mod backend_choice;
mod bench;
mod bench_plot;
mod bench_serve;
mod chat;
mod check;
mod config_cmd;
mod distributed;
mod engine_args;
mod generate;
mod info;
mod interrupt;
mod load;
mod needle;
mod output;
mod perplexity;
mod progress;
mod prompt_input;
mod sampling_args;
mod serve;
mod tokenize;
mod usage;

use clap::{CommandFactory, Parser, Subcommand};
use std::io::IsTerminal;

/// Writes one line to stdout like `println!`, but returns an error with the context "writing to
/// stdout" (e.g. a full disk) instead of panicking.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        anyhow::Context::context(
            writeln!(std::io::stdout(), $($t)*),
            "writing to stdout",
        )
    }};
}

/// Value parsers shared by the subcommands' numeric flags (clap prefixes their errors with the
/// flag's name).
pub mod parse {
    use std::num::IntErrorKind;

    /// An integer, or why not (negative numbers reach the range check, so the error is about
    /// the value rather than an unexpected argument). Digits past the range of `i128` saturate
    /// to `i128::MIN`/`MAX`, so a 44-digit number is "too large" like a 26-digit one, not "not
    /// an integer".
    fn integer(s: &str) -> Result<i128, String> {
        match s.trim().parse::<i128>() {
            Ok(v) => Ok(v),
            Err(e) if *e.kind() == IntErrorKind::PosOverflow => Ok(i128::MAX),
            Err(e) if *e.kind() == IntErrorKind::NegOverflow => Ok(i128::MIN),
            Err(_) => Err(format!("'{s}' is not an integer")),
        }
    }

    /// `v` (already in range of `i128` checks) as a `T`, or "too large", naming the input as given.
    fn fit<T: TryFrom<i128>>(v: i128, s: &str, max: impl std::fmt::Display) -> Result<T, String> {
        T::try_from(v).map_err(|_| format!("{} is too large (at most {max})", s.trim()))
    }

    /// An integer ≥ 1.
    pub fn at_least_one(s: &str) -> Result<usize, String> {
        let v = integer(s)?;
        if v < 1 {
            return Err(format!("must be at least 1, got {}", s.trim()));
        }
        fit(v, s, usize::MAX)
    }

    /// A token count ≥ 1, plain or with a binary suffix: `8K` = 8192, `1M` = 1 048 576.
    pub fn token_count(s: &str) -> Result<usize, String> {
        let t = s.trim();
        let (digits, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
            Some('K') => (&t[..t.len() - 1], 1usize << 10),
            Some('M') => (&t[..t.len() - 1], 1usize << 20),
            _ => (t, 1),
        };
        let n = at_least_one(digits)?;
        n.checked_mul(mult)
            .ok_or_else(|| format!("{t} is too large (at most {})", usize::MAX))
    }

    /// An integer ≥ 0.
    pub fn non_negative(s: &str) -> Result<usize, String> {
        let v = integer(s)?;
        if v < 0 {
            return Err(format!("must be 0 or more, got {}", s.trim()));
        }
        fit(v, s, usize::MAX)
    }

    /// A top-k: 0 or more, or -1 for all tokens as vLLM spells it (read as 0, which also
    /// means all).
    pub fn top_k(s: &str) -> Result<usize, String> {
        if integer(s)? == -1 {
            return Ok(0);
        }
        non_negative(s).map_err(|e| format!("{e} (or -1: all tokens)"))
    }

    /// An integer in `0..=u64::MAX` (a seed).
    pub fn seed(s: &str) -> Result<u64, String> {
        let v = integer(s)?;
        if v < 0 {
            return Err(format!("must be 0 or more, got {}", s.trim()));
        }
        fit(v, s, u64::MAX)
    }

    /// A finite number ≥ 0 (a temperature).
    pub fn non_negative_finite(s: &str) -> Result<f32, String> {
        let v: f32 = s
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not a number"))?;
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("must be a finite number ≥ 0, got {}", s.trim()));
        }
        Ok(v)
    }

    /// A number in (0, 1] (a probability mass such as top-p).
    pub fn probability(s: &str) -> Result<f32, String> {
        let v: f32 = s
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not a number"))?;
        if !(v > 0.0 && v <= 1.0) {
            return Err(format!("must be in (0, 1], got {}", s.trim()));
        }
        Ok(v)
    }

    /// A finite number > 0 (a relative tolerance).
    pub fn positive_finite(s: &str) -> Result<f64, String> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not a number"))?;
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("must be a finite number > 0, got {s}"));
        }
        Ok(v)
    }
}

/// dayone: day-one inference for new LLM architectures, on WGSL (portable) or CUDA.
#[derive(Parser)]
#[command(name = "dayone", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streams to stdout).
    Generate(generate::GenerateArgs),
    /// Compare backends (and a recorded reference) layer by layer on the same prompts.
    Check(check::CheckArgs),
    /// Measure TTFT, TPOT, throughput and decode bandwidth against the memory roofline.
    Bench(bench::BenchArgs),
    /// Needle in a haystack: retrieval accuracy per context length and depth.
    Needle(needle::NeedleArgs),
    /// Describe a model without loading its weights: architecture, parameters, dtype or
    /// quantisation, context, layer types, cache bytes per token, memory needed.
    Info(info::InfoArgs),
    /// Turn text into token ids (and their pieces) with the model's tokenizer.
    Tokenize(tokenize::TokenizeArgs),
    /// Interactive multi-turn chat through the model's chat template (stdin lines are turns;
    /// /reset, /exit; Ctrl-C stops the answer, not the session).
    Chat(chat::ChatArgs),
    /// Print the effective engine settings (defaults < --config FILE < flags) as YAML, usable
    /// as a --config file.
    Config(config_cmd::ConfigArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions,
    /// /v1/completions, /v1/models, /tokenize, /detokenize, /health, /metrics).
    Serve(serve::ServeArgs),
    /// Load-test an OpenAI-compatible server; prints what `vllm bench serve` prints.
    BenchServe(bench_serve::BenchServeArgs),
    /// Perplexity over a text file in windows of --ctx tokens (llama-perplexity's protocol),
    /// and KL divergence against a saved run (--save-logprobs, --kl-base).
    Perplexity(perplexity::PerplexityArgs),
}

impl Command {
    /// The engine flags of a command that loads a model and may split it over ranks
    /// (`generate`, `check`, `bench`, `perplexity`, `serve`; `chat` and `needle` run on one
    /// device), with whether it can be split.
    fn engine_args(&self) -> Option<(&engine_args::EngineArgs, bool)> {
        match self {
            Command::Generate(a) => Some((&a.engine, true)),
            Command::Check(a) => Some((&a.engine, true)),
            Command::Bench(a) => Some((&a.engine, true)),
            Command::Perplexity(a) => Some((&a.engine, true)),
            Command::Serve(a) => Some((&a.engine, true)),
            Command::Chat(a) => Some((&a.engine, false)),
            Command::Needle(a) => Some((&a.engine, false)),
            _ => None,
        }
    }

    /// The subcommand's name on the command line (for usage errors).
    fn name(&self) -> &'static str {
        match self {
            Command::Generate(_) => "generate",
            Command::Check(_) => "check",
            Command::Bench(_) => "bench",
            Command::Needle(_) => "needle",
            Command::Info(_) => "info",
            Command::Tokenize(_) => "tokenize",
            Command::Chat(_) => "chat",
            Command::Config(_) => "config",
            Command::Serve(_) => "serve",
            Command::BenchServe(_) => "bench-serve",
            Command::Perplexity(_) => "perplexity",
        }
    }
}

fn main() {
    // One line, no backtrace, for anything that escapes as a panic.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal error: {msg}{at}");
    }));
    tracing_subscriber::fmt()
        // Engine notes (e.g. skipped MTP layers) show by default; DAYONE_LOG overrides.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DAYONE_LOG").unwrap_or_else(|_| {
                // The other ranks of a split model would repeat rank 0's notes.
                tracing_subscriber::EnvFilter::new(if distributed::launched_as_follower() {
                    "warn"
                } else {
                    "warn,dayone_engine=info"
                })
            }),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .init();
    let cli = Cli::parse_from(engine_args::vllm_spellings(std::env::args_os()));
    // After parsing: --help and usage errors exit before any handler exists.
    // Network commands keep SIGPIPE ignored (Rust's default): a peer that closes its socket
    // must fail one write, not kill the process. The others die quietly on a closed stdout
    // pipe, like `cat`.
    if !matches!(cli.command, Command::Serve(_) | Command::BenchServe(_)) {
        output::restore_sigpipe();
    }
    // The server drains on SIGINT/SIGTERM itself (tokio's signal handlers).
    if !matches!(cli.command, Command::Serve(_)) {
        interrupt::install();
    }
    let name = cli.command.name();
    // A rank other than 0 of a split model serves rank 0 and exits here, before the command
    // reads a prompt, binds a port or prints anything; rank 0 goes on to run the command.
    if let Some((engine, splittable)) = cli.command.engine_args() {
        if let Err(e) = distributed::follow_if_rank(engine, splittable) {
            report(&mut Cli::command(), name, e);
        }
    }
    let result = match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Check(a) => check::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Needle(a) => needle::run(a),
        Command::Info(a) => info::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Config(a) => config_cmd::run(a),
        Command::Serve(a) => serve::run(a),
        Command::BenchServe(a) => bench_serve::run(a),
        Command::Perplexity(a) => perplexity::run(a),
    };
    match result {
        // llama.cpp's convention: stats printed, then 128 + SIGINT.
        Ok(()) if interrupt::requested() => {
            distributed::reap_children(std::time::Duration::from_secs(30));
            std::process::exit(interrupt::EXIT_CODE)
        }
        // The other ranks this process started end with rank 0's engine; collect them.
        Ok(()) => distributed::reap_children(std::time::Duration::from_secs(30)),
        Err(e) => report(&mut Cli::command(), name, e),
    }
}

/// Prints a command's error (a usage error as clap prints its own, exit 2; anything else as
/// one `error:` line, exit 1), then ends the ranks this process started and exits.
fn report(cli: &mut clap::Command, name: &str, e: anyhow::Error) -> ! {
    if let Some(u) = e.downcast_ref::<usage::UsageError>() {
        distributed::reap_children(std::time::Duration::from_secs(5));
        usage::exit(cli, name, u)
    }
    let msg = format!("{e:#}").replace('\n', " ");
    eprintln!("error: {msg}");
    // After the message: the other ranks see this process leave and stop within seconds.
    distributed::reap_children(std::time::Duration::from_secs(5));
    std::process::exit(1);
}
