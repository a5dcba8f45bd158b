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
            // The engine's errors say what failed; this says why it was tried at all.
            dayone_engine::default_model::default_model_path()
                .context("no --model given and SmolLM2-135M-Instruct is not cached yet")
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

/// `--dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DTypeArg {
    /// 32-bit float.
    F32,
    /// bfloat16 (backends may compute it in f32).
    Bf16,
}

impl DTypeArg {
    /// The backend dtype.
    pub fn dtype(self) -> DType {
        match self {
            DTypeArg::F32 => DType::F32,
            DTypeArg::Bf16 => DType::BF16,
        }
    }
}
