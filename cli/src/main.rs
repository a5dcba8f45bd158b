//! `dayone`: run new large language models from their `config.json`, safetensors and tokenizer
//! (or a GGUF file) on the WGSL or CUDA backend.

mod backend_choice;
mod bench;
mod check;
mod generate;
mod load;

use clap::{Parser, Subcommand};
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
    /// An integer, or why not (negative numbers reach the range check, so the error is about
    /// the value rather than an unexpected argument).
    fn integer(s: &str) -> Result<i128, String> {
        s.trim()
            .parse::<i128>()
            .map_err(|_| format!("'{s}' is not an integer"))
    }

    /// An integer ≥ 1.
    pub fn at_least_one(s: &str) -> Result<usize, String> {
        let v = integer(s)?;
        if v < 1 {
            return Err(format!("must be at least 1, got {v}"));
        }
        usize::try_from(v).map_err(|_| format!("{v} is too large"))
    }

    /// An integer ≥ 0.
    pub fn non_negative(s: &str) -> Result<usize, String> {
        let v = integer(s)?;
        if v < 0 {
            return Err(format!("must be 0 or more, got {v}"));
        }
        usize::try_from(v).map_err(|_| format!("{v} is too large"))
    }

    /// An integer in `0..=u64::MAX` (a seed).
    pub fn seed(s: &str) -> Result<u64, String> {
        let v = integer(s)?;
        if v < 0 {
            return Err(format!("must be 0 or more, got {v}"));
        }
        u64::try_from(v).map_err(|_| format!("{v} is too large (at most {})", u64::MAX))
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
            tracing_subscriber::EnvFilter::try_from_env("DAYONE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,dayone_engine=info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Check(a) => check::run(a),
        Command::Bench(a) => bench::run(a),
    };
    if let Err(e) = result {
        let msg = format!("{e:#}").replace('\n', " ");
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
