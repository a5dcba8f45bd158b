//! The engine flags every command shares (`generate`, `chat`, `bench`, `check`, `config`), named
//! as vLLM names them, and their layering over a serving config file (a flag beats
//! `--config FILE`, which beats the command's defaults). [`EngineArgs::resolve`] is the one place that turns them into a
//! backend, an [`EngineConfig`] and a model path.

use crate::backend_choice::{BackendArg, BackendKind};
use crate::parse;
use crate::usage::usage;
use anyhow::Result;
use clap::Args;
use dayone_backend::DType;
use dayone_engine::loader::Checkpoint;
use dayone_engine::serving_config::{
    auto_dtype, BackendName, DtypeName, Origin, Serving, ServingFile,
};
use dayone_engine::EngineConfig;
use std::ffi::OsString;
use std::path::PathBuf;

/// Engine flags, `#[command(flatten)]`-ed into each command. Every flag is optional: one not
/// given keeps the config file's value, else the command's default.
#[derive(Args, Debug, Clone, Default)]
pub struct EngineArgs {
    /// Serving config file (YAML; see docs/serving.example.yaml); flags override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Model directory (config.json + safetensors, or a single .gguf) or .gguf file; default:
    /// SmolLM2-135M-Instruct.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Backend to run on: wgsl, cuda, cpu or auto [default: auto].
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// Float dtype: bf16 (bfloat16), f32 (float32) or auto [default: auto = bf16 on CUDA; on
    /// WGSL bf16 weights (f32 activations) for a bf16/f16 checkpoint, else f32; f32 on CPU;
    /// f32 for check].
    #[arg(long, value_parser = parse_dtype)]
    pub dtype: Option<DtypeName>,
    /// Tokens the KV cache holds over all sequences (default: the engine derives it from the
    /// model's context window, capped for very long windows and lowered to what fits in the
    /// device's free memory). A request whose prompt plus --max-tokens (clipped to the context
    /// window) does not fit is refused before it starts.
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub kv_cache_tokens: Option<usize>,
    /// Most sequences running at once.
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub max_num_seqs: Option<usize>,
    /// Caps the model's context window (tokens).
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub max_model_len: Option<usize>,
    /// Token budget per step, also the largest prompt chunk of one sequence per step (chunked
    /// prefill; SGLang's name).
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub chunked_prefill_size: Option<usize>,
    /// The same as --chunked-prefill-size (vLLM's --max-num-batched-tokens; bench's old name).
    #[arg(long, alias = "max-num-batched-tokens", conflicts_with = "chunked_prefill_size",
          value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub max_batched_tokens: Option<usize>,
    /// Turn off prefix caching across requests (on by default).
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Host-memory tier for evicted KV blocks and swapped-out sequences, GiB (0: none).
    #[arg(long, value_parser = parse_gib, allow_negative_numbers = true)]
    pub host_cache_gb: Option<f64>,
    /// Prompts longer than this many tokens wait in the long-request queue (0: one queue).
    #[arg(long, value_parser = parse::non_negative, allow_negative_numbers = true)]
    pub long_prefill_threshold: Option<usize>,
    /// Most long prompts prefilling at once.
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub max_long_partial_prefills: Option<usize>,
    /// Most requests waiting; a full queue refuses new requests at once.
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub max_queued_requests: Option<usize>,
    /// Recurrent-state (KDA) checkpoint stride in prompt tokens, a multiple of the block size
    /// (0: only where the engine always keeps one).
    #[arg(long, value_parser = parse::non_negative, allow_negative_numbers = true)]
    pub state_checkpoint_interval: Option<usize>,
    /// Devices to split each layer over (-tp): one process per device; dayone starts this
    /// machine's processes itself unless a launcher (torchrun, srun, mpirun) did.
    #[arg(long, alias = "tp", value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub tensor_parallel_size: Option<usize>,
    /// Groups of the tensor-parallel devices to divide the routed experts among (-ep); it
    /// divides --tensor-parallel-size (inside a group each expert is split by width).
    #[arg(long, alias = "ep", value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub expert_parallel_size: Option<usize>,
    /// Devices to split a long prompt's tokens over (-cp), each holding the whole model and
    /// cache (context parallelism: keys all-gathered, KDA state passed from rank to rank);
    /// not with --tensor-parallel-size > 1. Launched as -tp is.
    #[arg(long, alias = "cp", value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub context_parallel_size: Option<usize>,
    /// Under --context-parallel-size, steps of fewer tokens run whole on every rank instead
    /// of being split (decode, short prompts) [default: 1024].
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub context_parallel_min_tokens: Option<usize>,
    /// Machines the tensor-parallel ranks span (each runs the same command with its
    /// --node-rank; --tensor-parallel-size / --nnodes ranks per machine).
    #[arg(long, value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub nnodes: Option<usize>,
    /// This machine's index, 0..--nnodes (node 0 runs the command; the others serve it).
    #[arg(long, value_parser = parse::non_negative, allow_negative_numbers = true)]
    pub node_rank: Option<usize>,
    /// Address of node 0, where the ranks meet (or MASTER_ADDR) [default: 127.0.0.1 on one
    /// machine; needed with --nnodes > 1].
    #[arg(long, alias = "dist-init-addr")]
    pub master_addr: Option<String>,
    /// Port of node 0 for the ranks' meeting (or MASTER_PORT) [default: 29500; a free port
    /// on one machine].
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Pipeline stages (-pp); only 1 (pipeline parallelism is not built; use -tp).
    #[arg(long, alias = "pp", value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub pipeline_parallel_size: Option<usize>,
    /// Decode low-bit weights (GGUF Q4_0/Q4_1/Q8_0, MXFP4, INT4) to the float dtype at load
    /// instead of keeping them quantized on the device (more memory; for comparisons).
    #[arg(long)]
    pub dequantize_at_load: bool,
    /// Run the low-bit (MXFP4, INT4) routed experts' prefill-sized steps through FP8 tensor
    /// cores: the chosen experts convert exactly to e4m3 with per-32 block scales, the
    /// activations round to e4m3 per 32 values (≈ 3 % per value; off by default). CUDA sm_89+
    /// only; elsewhere a warning and the usual float decode. Decode-sized steps keep the direct
    /// low-bit kernels.
    #[arg(long)]
    pub moe_fp8: bool,
    /// Batch-invariant kernels: a request's output is bit-exact whatever it is batched with and
    /// however its prompt was cut (prefix-cache hits, chunked prefill, preemption). The CPU
    /// backend always is; WGSL and CUDA switch to slower kernels (CUDA decode ≈ 2.5×). As
    /// vLLM's VLLM_BATCH_INVARIANT=1 (the backends also read DAYONE_BATCH_INVARIANT=1).
    #[arg(long, conflicts_with = "no_batch_invariant")]
    pub batch_invariant: bool,
    /// The shape-dependent (faster) kernels even if the config file asks for batch invariance.
    #[arg(long)]
    pub no_batch_invariant: bool,
    /// Run every decode step eagerly (kernel by kernel), never as a CUDA graph. By default
    /// CUDA captures pure-decode steps of attention-only models once per batch bucket and
    /// context-width bucket and replays them (vLLM's `--enforce-eager` turns the same off).
    #[arg(long, conflicts_with = "no_enforce_eager")]
    pub enforce_eager: bool,
    /// CUDA graphs for decode even if the config file sets `runtime.enforce_eager`.
    #[arg(long)]
    pub no_enforce_eager: bool,
}

/// A command's own defaults, below the config file and the flags.
#[derive(Clone, Debug, Default)]
pub struct CommandDefaults {
    /// The engine settings the command starts from (its dtype is replaced, see `dtype`).
    pub engine: EngineConfig,
    /// The dtype when neither file nor flag names one; `None`: `auto` ([`auto_dtype`]).
    pub dtype: Option<DType>,
}

/// What [`EngineArgs::resolve`] settled on.
#[derive(Clone, Debug)]
pub struct ResolvedEngine {
    /// The backend (`auto` resolved).
    pub backend: BackendKind,
    /// The engine settings.
    pub engine: EngineConfig,
    /// The model path from the flag or the file; `None`: the default model (see
    /// [`crate::load::model_path`]).
    pub model: Option<PathBuf>,
    /// Whether the dtype is `auto` (no flag, file key or command default named one): then
    /// `engine.dtype` is the backend's choice before the checkpoint is known, and
    /// [`ResolvedEngine::settle_dtype`] makes it the checkpoint's.
    pub dtype_auto: bool,
}

impl ResolvedEngine {
    /// The effective settings as a config file (what `dayone config` prints).
    pub fn effective(&self) -> ServingFile {
        let backend = backend_name_of(self.backend);
        let mut serving = Serving::effective(&self.engine, self.model.as_deref(), backend);
        if self.dtype_auto && backend == BackendName::Wgsl {
            // The checkpoint decides (16-bit weights for a 16-bit checkpoint): still `auto`.
            serving.model.dtype = Some(DtypeName::Auto);
        }
        ServingFile { serving }
    }

    /// Resolves `dtype: auto` for the checkpoint about to load ([`auto_dtype`] of the backend
    /// and the checkpoint's stored float dtype): on WGSL a bf16 or f16 checkpoint keeps 16-bit
    /// weights. A dtype that a flag, the config file or the command named stays as it is.
    pub fn settle_dtype(&mut self, ckpt: &Checkpoint) {
        if !self.dtype_auto {
            return;
        }
        let stored = dayone_engine::loader::stored_float_dtype(ckpt.tensors.as_ref());
        self.engine.dtype = auto_dtype(backend_name_of(self.backend), stored);
    }
}

fn backend_name_of(kind: BackendKind) -> BackendName {
    match kind {
        BackendKind::Wgsl => BackendName::Wgsl,
        BackendKind::Cuda => BackendName::Cuda,
        BackendKind::Cpu => BackendName::Cpu,
    }
}

/// `--dtype`: the config file's spellings (bf16/bfloat16, f32/float32/float, f16/float16/half,
/// auto).
fn parse_dtype(s: &str) -> Result<DtypeName, String> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "auto" => DtypeName::Auto,
        "bf16" | "bfloat16" => DtypeName::Bfloat16,
        "f16" | "float16" | "half" => DtypeName::Float16,
        "f32" | "float32" | "float" => DtypeName::Float32,
        _ => return Err(format!("'{s}' is not a dtype (expected bf16, f32 or auto)")),
    })
}

/// `--host-cache-gb`: a finite number ≥ 0.
fn parse_gib(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("must be a finite number ≥ 0, got {}", s.trim()));
    }
    Ok(v)
}

/// Rewrites vLLM's single-dash long flags (`-tp 2`, `-pp 2`, `-ep 2`, `-cp 2`), which clap cannot
/// declare, to their long forms; everything else passes through.
pub fn vllm_spellings(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter()
        .map(|a| match a.to_str() {
            Some("-tp") => "--tensor-parallel-size".into(),
            Some("-pp") => "--pipeline-parallel-size".into(),
            Some("-ep") => "--expert-parallel-size".into(),
            Some("-cp") => "--context-parallel-size".into(),
            _ => a,
        })
        .collect()
}

fn backend_arg(b: BackendName) -> BackendArg {
    match b {
        BackendName::Auto => BackendArg::Auto,
        BackendName::Wgsl => BackendArg::Wgsl,
        BackendName::Cuda => BackendArg::Cuda,
        BackendName::Cpu => BackendArg::Cpu,
    }
}

fn backend_name(b: BackendArg) -> BackendName {
    match b {
        BackendArg::Auto => BackendName::Auto,
        BackendArg::Wgsl => BackendName::Wgsl,
        BackendArg::Cuda => BackendName::Cuda,
        BackendArg::Cpu => BackendName::Cpu,
    }
}

impl EngineArgs {
    /// The flags given, as a layer of settings (absent flags are `None`).
    pub fn flags_layer(&self) -> Serving {
        let mut s = Serving::default();
        s.model.path = self.model.clone();
        s.model.dtype = self.dtype;
        s.runtime.backend = self.backend.map(backend_name);
        s.cache.kv_cache_tokens = self.kv_cache_tokens;
        s.runtime.max_num_seqs = self.max_num_seqs;
        s.context.max_model_len = self.max_model_len;
        s.context.chunked_prefill_size = self.chunked_prefill_size.or(self.max_batched_tokens);
        if self.no_prefix_caching {
            s.cache.prefix_caching = Some(false);
        }
        s.cache.host_cache_gb = self.host_cache_gb;
        s.runtime.long_prefill_threshold = self.long_prefill_threshold;
        s.runtime.max_long_partial_prefills = self.max_long_partial_prefills;
        s.runtime.max_queued_requests = self.max_queued_requests;
        s.cache.state_checkpoint_interval = self.state_checkpoint_interval;
        s.parallel.tensor_parallel_size = self.tensor_parallel_size.map(|v| v as u64);
        s.parallel.expert_parallel_size = self.expert_parallel_size.map(|v| v as u64);
        s.parallel.context_parallel_size = self.context_parallel_size.map(|v| v as u64);
        s.parallel.context_parallel_min_tokens = self.context_parallel_min_tokens;
        s.parallel.pipeline_parallel_size = self.pipeline_parallel_size.map(|v| v as u64);
        if self.batch_invariant {
            s.runtime.batch_invariant = Some(true);
        }
        if self.no_batch_invariant {
            s.runtime.batch_invariant = Some(false);
        }
        if self.enforce_eager {
            s.runtime.enforce_eager = Some(true);
        }
        if self.no_enforce_eager {
            s.runtime.enforce_eager = Some(false);
        }
        s
    }

    /// Layers the flags over `--config FILE` over `defaults` and picks the backend.
    ///
    /// Errors (usage errors, exit 2): an unreadable or invalid config file (naming the file and
    /// the key path), a flag value this build cannot serve (naming the flag: parallel sizes > 1,
    /// float16), a checkpoint interval that is not a multiple of the block size.
    pub fn resolve(&self, defaults: &CommandDefaults) -> Result<ResolvedEngine> {
        let file = match &self.config {
            Some(f) => {
                ServingFile::load(f)
                    .map_err(|e| usage(format!("--config: {e:#}")))?
                    .serving
            }
            None => Serving::default(),
        };
        let flags = self.flags_layer();
        flags
            .check(&Origin::Flags)
            .map_err(|e| usage(format!("{e:#}")))?;
        let merged = file.overlaid_by(&flags);
        let backend = backend_arg(merged.runtime.backend.unwrap_or(BackendName::Auto)).resolve();
        let mut engine = defaults.engine.clone();
        let named = merged
            .model
            .dtype
            .and_then(DtypeName::dtype)
            .or(defaults.dtype);
        // `auto` before the checkpoint is known; `settle_dtype` finishes it.
        engine.dtype = named.unwrap_or_else(|| auto_dtype(backend_name_of(backend), None));
        merged
            .apply(&mut engine)
            .map_err(|e| usage(format!("{e:#}")))?;
        if self.dequantize_at_load {
            engine.dequantize_at_load = true;
        }
        if self.moe_fp8 {
            engine.moe_fp8 = true;
        }
        crate::distributed::set_flags(crate::distributed::LaunchFlags {
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
        });
        Ok(ResolvedEngine {
            backend,
            engine,
            model: merged.model.path,
            dtype_auto: named.is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    fn args(list: &[&str]) -> EngineArgs {
        let argv = std::iter::once("dayone")
            .chain(list.iter().copied())
            .map(OsString::from);
        Cli::try_parse_from(vllm_spellings(argv)).unwrap().engine
    }

    fn cpu_defaults() -> CommandDefaults {
        CommandDefaults::default()
    }

    #[test]
    fn flags_beat_the_file_which_beats_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.yaml");
        std::fs::write(
            &f,
            "serving:\n  runtime: {max_num_seqs: 8, max_queued_requests: 5, backend: cpu}\n  model: {dtype: bfloat16}\n",
        )
        .unwrap();
        let a = args(&["--config", f.to_str().unwrap(), "--max-num-seqs", "3"]);
        let r = a.resolve(&cpu_defaults()).unwrap();
        assert_eq!(r.backend, BackendKind::Cpu);
        assert_eq!(r.engine.dtype, DType::BF16);
        assert_eq!(r.engine.scheduler.max_num_seqs, 3, "flag wins");
        assert_eq!(
            r.engine.scheduler.max_queued_requests, 5,
            "file wins over default"
        );
        assert_eq!(
            r.engine.scheduler.long_prefill_threshold,
            EngineConfig::default().scheduler.long_prefill_threshold
        );
    }

    #[test]
    fn bench_alias_sets_the_chunked_prefill_size() {
        let r = args(&["--backend", "cpu", "--max-batched-tokens", "96"])
            .resolve(&cpu_defaults())
            .unwrap();
        assert_eq!(r.engine.scheduler.max_batched_tokens, 96);
        assert_eq!(r.engine.scheduler.max_prefill_chunk, 96);
    }

    #[test]
    fn parallel_flags_set_the_split_and_bad_ones_name_the_flag() {
        let r = args(&["--backend", "cpu", "-tp", "4", "-ep", "2"])
            .resolve(&cpu_defaults())
            .unwrap();
        assert_eq!(
            (r.engine.tensor_parallel_size, r.engine.expert_parallel_size),
            (4, 2)
        );
        let e = args(&["--backend", "cpu", "-tp", "4", "-ep", "3"])
            .resolve(&cpu_defaults())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--expert-parallel-size") && e.contains("divide"),
            "{e}"
        );
        let r = args(&["--backend", "cpu", "-cp", "4"])
            .resolve(&cpu_defaults())
            .unwrap();
        assert_eq!((r.engine.context_parallel_size, r.engine.ranks()), (4, 4));
        let e = args(&[
            "--backend",
            "cpu",
            "-tp",
            "2",
            "--context-parallel-size",
            "2",
        ])
        .resolve(&cpu_defaults())
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--context-parallel-size") && e.contains("use one of them"),
            "{e}"
        );
        let e = args(&["--backend", "cpu", "-pp", "2"])
            .resolve(&cpu_defaults())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--pipeline-parallel-size"), "{e}");
        let e = args(&["--backend", "cpu", "--dtype", "float16"])
            .resolve(&cpu_defaults())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--dtype") && e.contains("float16"), "{e}");
    }

    #[test]
    fn command_dtype_default_applies_only_when_nothing_names_one() {
        let d = CommandDefaults {
            dtype: Some(DType::F32),
            ..Default::default()
        };
        let r = args(&["--backend", "cpu"]).resolve(&d).unwrap();
        assert_eq!(r.engine.dtype, DType::F32);
        let r = args(&["--backend", "cpu", "--dtype", "bf16"])
            .resolve(&d)
            .unwrap();
        assert_eq!(r.engine.dtype, DType::BF16);
    }

    #[test]
    fn auto_dtype_follows_the_checkpoint_on_wgsl_only() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        // gpt_oss_tiny is stored in bf16 (and MXFP4), llama_tiny in f32.
        let bf16 = dayone_engine::loader::open(&fixtures.join("gpt_oss_tiny")).unwrap();
        let f32 = dayone_engine::loader::open(&fixtures.join("llama_tiny")).unwrap();
        let settled = |flags: &[&str], ckpt: &Checkpoint| {
            let mut r = args(flags).resolve(&cpu_defaults()).unwrap();
            r.settle_dtype(ckpt);
            r.engine.dtype
        };
        assert_eq!(settled(&["--backend", "wgsl"], &bf16), DType::BF16);
        assert_eq!(settled(&["--backend", "wgsl"], &f32), DType::F32);
        assert_eq!(settled(&["--backend", "cpu"], &bf16), DType::F32);
        assert_eq!(settled(&["--backend", "cuda"], &f32), DType::BF16);
        // A named dtype stays whatever the checkpoint.
        assert_eq!(
            settled(&["--backend", "wgsl", "--dtype", "f32"], &bf16),
            DType::F32
        );
        assert_eq!(
            settled(&["--backend", "wgsl", "--dtype", "bf16"], &f32),
            DType::BF16
        );
        let d = CommandDefaults {
            dtype: Some(DType::F32),
            ..Default::default()
        };
        let mut r = args(&["--backend", "wgsl"]).resolve(&d).unwrap();
        r.settle_dtype(&bf16);
        assert_eq!(r.engine.dtype, DType::F32, "the command's default is named");
        // `dayone config` cannot know the checkpoint: WGSL's dtype stays `auto`.
        let r = args(&["--backend", "wgsl"])
            .resolve(&cpu_defaults())
            .unwrap();
        assert_eq!(r.effective().serving.model.dtype, Some(DtypeName::Auto));
        let r = args(&["--backend", "cpu"])
            .resolve(&cpu_defaults())
            .unwrap();
        assert_eq!(r.effective().serving.model.dtype, Some(DtypeName::Float32));
    }
}
