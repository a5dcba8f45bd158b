//! `dayone serve`: loads the model, starts the engine service and serves the OpenAI API.

#[allow(dead_code)]
mod metrics;
#[allow(dead_code)]
mod parsers;

use anyhow::Result;
use clap::Args;

/// `dayone serve` flags.
#[derive(Args, Debug)]
pub struct ServeArgs {}

/// Runs the server until SIGINT/SIGTERM.
pub fn run(_a: ServeArgs) -> Result<()> {
    anyhow::bail!("serve is not built yet")
}
