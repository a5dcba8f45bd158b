//! Opening a model for a command: default model, checkpoint, progress bar, engine.

use crate::backend_choice::BackendKind;
use crate::distributed::{Leader, RankComm};
use crate::progress;
use anyhow::{Context, Result};
use dayone_backend::Backend;
use dayone_engine::loader::{self, Checkpoint};
use dayone_engine::service::EngineHandle;
use dayone_engine::{Engine, EngineConfig};
use std::path::{Path, PathBuf};

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

/// Opens the checkpoint at `path`: a Hugging Face directory, a `.gguf` file, or a directory
/// without `config.json` that holds exactly one `.gguf` file (taken, with a note; several are
/// named in the error).
pub fn open(path: &Path) -> Result<Checkpoint> {
    if path.is_dir() && !path.join("config.json").exists() {
        let ggufs = gguf_files(path)?;
        match ggufs.as_slice() {
            [] => {}
            [one] => {
                eprintln!(
                    "note: {} has no config.json: using {}",
                    path.display(),
                    one.display()
                );
                return loader::open(one);
            }
            many => {
                let names: Vec<String> = many.iter().map(|p| progress::short_path(p)).collect();
                anyhow::bail!(
                    "{}: no config.json and {} .gguf files ({}): pass one of them as --model",
                    path.display(),
                    many.len(),
                    names.join(", ")
                );
            }
        }
    }
    loader::open(path)
}

/// The `*.gguf` files directly in `dir`, sorted.
fn gguf_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("{}: cannot list the directory", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Starts the engine service for `kind` with `ckpt` loaded (a progress bar on stderr unless
/// `quiet`): the backend is created on the engine thread, so it need not be `Send`. With
/// `tensor_parallel_size > 1` this process is rank 0: it first meets the other ranks
/// (starting this machine's, [`crate::distributed`]). Errors: the backend's, the launch's or
/// the load's, unchanged.
pub fn service(
    kind: BackendKind,
    ckpt: Checkpoint,
    cfg: EngineConfig,
    quiet: bool,
) -> Result<EngineHandle> {
    fn on<B: RankComm>(
        make: impl FnOnce() -> Result<B> + Send + 'static,
        ckpt: Checkpoint,
        cfg: EngineConfig,
        quiet: bool,
        leader: Option<Leader>,
    ) -> Result<EngineHandle> {
        EngineHandle::start(move || load(make()?, &ckpt, &cfg, quiet, leader.as_ref()))
    }
    let leader = crate::distributed::lead(kind, &ckpt, &cfg)?;
    match kind {
        BackendKind::Cpu => on(
            || Ok(dayone_backend::cpu::CpuBackend),
            ckpt,
            cfg,
            quiet,
            leader,
        ),
        BackendKind::Cuda => on(
            || dayone_cuda::CudaBackend::new(0),
            ckpt,
            cfg,
            quiet,
            leader,
        ),
        BackendKind::Wgsl => match crate::backend_choice::wgsl_or_cpu_fallback()? {
            Ok(_) => on(dayone_wgsl::WgslBackend::new, ckpt, cfg, quiet, leader),
            Err(cpu) => on(move || Ok(cpu), ckpt, cfg, quiet, leader),
        },
    }
}

/// Loads `ckpt` onto `backend` with a progress bar on stderr (one device: the interactive
/// commands that drive the engine directly). Errors: the load's, and a split model
/// (`--tensor-parallel-size` > 1), which runs through [`service`].
pub fn engine<B: Backend>(
    backend: B,
    ckpt: &Checkpoint,
    cfg: &EngineConfig,
    quiet: bool,
) -> Result<Engine<B>> {
    if cfg.ranks() > 1 {
        anyhow::bail!(crate::usage::usage(
            "--tensor-parallel-size or --context-parallel-size > 1 works with generate, bench, check, perplexity and serve; this command runs on one device"
        ));
    }
    load_bar(backend, ckpt, quiet, |b, p| {
        Engine::new(b, ckpt, cfg, Some(p))
    })
}

/// [`engine`], as rank 0 of `leader`'s group when given.
fn load<B: RankComm>(
    backend: B,
    ckpt: &Checkpoint,
    cfg: &EngineConfig,
    quiet: bool,
    leader: Option<&Leader>,
) -> Result<Engine<B>> {
    match leader {
        Some(l) => load_bar(backend, ckpt, quiet, |b, p| l.engine(b, ckpt, cfg, Some(p))),
        None => engine(backend, ckpt, cfg, quiet),
    }
}

/// Runs `f` under a progress bar naming the model and backend.
fn load_bar<B: Backend>(
    backend: B,
    ckpt: &Checkpoint,
    quiet: bool,
    f: impl FnOnce(B, &dyn Fn(usize, usize)) -> Result<Engine<B>>,
) -> Result<Engine<B>> {
    // The file name, not the full path, and the backend's short name: one 80-column line.
    let what = format!(
        "{} on {}",
        progress::short_path(&ckpt.path),
        short_backend_name(&backend.name())
    );
    let bar = progress::load_bar(ckpt.tensors.names().len(), what, quiet);
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let engine = f(backend, &progress);
    bar.finish_and_clear();
    engine
}

/// A backend's kind from its name: `wgsl` for `wgsl: Vulkan llvmpipe (LLVM 19.1.7, 256 bits)
/// (Cpu)`, `cuda` for `cuda: NVIDIA H200 (sm_90)`; the full name is in the stats line.
pub fn short_backend_name(full: &str) -> String {
    full.split([':', ' ']).next().unwrap_or(full).to_string()
}
