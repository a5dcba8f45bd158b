//! `dayone`: run new large language models from their `config.json`, safetensors and tokenizer
//! (or a GGUF file) on the WGSL or CUDA backend.

mod backend_choice;
mod bench;
mod check;
mod generate;
mod load;

use clap::{Parser, Subcommand};

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
