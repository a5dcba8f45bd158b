//! Opening a model for a command: default model, checkpoint, progress bar, engine.

use anyhow::{Context, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::loader::{self, Checkpoint};
use dayone_engine::{Engine, EngineConfig};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

/// The model path given, or the default model (fetched on first use).
pub fn model_path(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p),
        None => {
            dayone_engine::default_model::default_model_path().context("fetching the default model")
        }
    }
}

/// Opens the checkpoint at `path`.
pub fn open(path: &std::path::Path) -> Result<Checkpoint> {
    loader::open(path)
}

/// Loads `ckpt` onto `backend` with a progress bar on stderr.
pub fn engine<B: Backend>(
    backend: B,
    ckpt: &Checkpoint,
    cfg: &EngineConfig,
    quiet: bool,
) -> Result<Engine<B>> {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(ckpt.tensors.names().len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("{} on {}", ckpt.path.display(), backend.name()));
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let engine = Engine::new(backend, ckpt, cfg, Some(&progress));
    bar.finish_and_clear();
    engine
}

/// Parses `--dtype`.
pub fn dtype(s: &str) -> Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        other => anyhow::bail!("--dtype must be f32 or bf16, got '{other}'"),
    }
}
