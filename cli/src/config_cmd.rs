//! `dayone config`: the effective engine settings (defaults < `--config FILE` < flags) printed as
//! YAML, in the config file's own layout, so the output can be saved and passed to `--config`.
//! Loads nothing: the model and the device are not opened (the backend `auto` is still
//! resolved, which probes for a CUDA driver).

use crate::engine_args::{CommandDefaults, EngineArgs};
use anyhow::Result;
use clap::Args;
use std::io::Write;

/// Flags of `dayone config`.
#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// The engine flags (as on generate, chat, bench and check).
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Runs `dayone config`.
pub fn run(a: ConfigArgs) -> Result<()> {
    // generate's and chat's defaults: the settings a plain `dayone generate` would run with.
    let resolved = a.engine.resolve(&CommandDefaults::default())?;
    let yaml = resolved.effective().to_yaml()?;
    let mut out = std::io::stdout().lock();
    let header = "# dayone effective serving settings (defaults < --config file < flags).\n\
         # Absent keys (kv_cache_tokens, max_model_len, state_checkpoints) are sized by the engine; no model.path: the default model.\n";
    out.write_all(header.as_bytes())
        .and_then(|()| out.write_all(yaml.as_bytes()))
        .and_then(|()| out.flush())
        .map_err(|e| anyhow::anyhow!("writing to stdout: {e}"))
}
