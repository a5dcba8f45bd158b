//! `dayone bench-serve`: a load generator for any OpenAI-compatible server (dayone, vLLM,
//! SGLang, llama-server) whose printout and JSON match `vllm bench serve`.

use anyhow::Result;
use clap::Args;

/// `dayone bench-serve` flags.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
}

/// Runs the benchmark.
pub fn run(_a: BenchServeArgs) -> Result<()> {
    anyhow::bail!("bench-serve is not built yet")
}
