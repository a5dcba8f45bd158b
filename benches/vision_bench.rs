//! The vision encoder of a `kimi_k25` (or `kimi_vl`) checkpoint alone (MoonViT tower + patch-merger projector,
//! [`MoonVit::encode`]): images/s and TFLOP/s for one image, the encoder half of issue [12]'s
//! measurement (the other half, TTFT of image + text, is `dayone bench --image`).
//!
//! Each timed call preprocesses nothing: the image is resized/padded/normalised once
//! ([`preprocess`], timed separately as `preprocess_ms`), and every call uploads its pixels,
//! runs the tower and the projector, and waits for the device. The position table resampled to
//! the grid ([`resample_table`], timed alone as `pos_emb_host_ms`) is host work that the encoder
//! memoises per grid size, so after the warm-up the timed calls do not pay it. FLOPs per image: [`encoder_flops`],
//! the formula of benches/gpu/torch_kimi_k25.py, so both sides divide the same count.
//!
//! Usage: `vision-bench --model DIR --image FILE [--backend cuda|wgsl|cpu] [--dtype bf16|f32]
//!         [--images-per-call 1] [--warmup 3] [--iters 20] [--json]`

mod sigpipe;

use anyhow::{bail, Context, Result};
use clap::Parser;
use dayone_backend::{Backend, DType, TensorInfo};
use dayone_engine::config::MoonVitConfig;
use dayone_engine::layers::vision::pos_emb::resample_table;
use dayone_engine::layers::vision::MoonVit;
use dayone_engine::loader::SafetensorsSource;
use dayone_engine::vision::{load_image_file, preprocess, ImageProcessorConfig};
use dayone_engine::weights::WeightLoader;
use std::path::PathBuf;
use std::time::Instant;

/// Command-line flags.
#[derive(Parser)]
#[command(about = "Images/s and TFLOP/s of a kimi_k25 checkpoint's vision encoder")]
struct Args {
    /// Checkpoint directory (config.json with `vision_config`, safetensors weights).
    #[arg(long)]
    model: PathBuf,
    /// Image file (PNG, JPEG or WebP), preprocessed as the engine does.
    #[arg(long)]
    image: PathBuf,
    /// Backend: cuda, wgsl or cpu.
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Weight and activation dtype: bf16 or f32 (backends without bf16 run f32).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Copies of the image encoded per call (one encoder call; each image attends to itself).
    #[arg(long, default_value_t = 1)]
    images_per_call: usize,
    /// Untimed calls first (kernel compilation, allocator pools).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed calls.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// FLOPs of the tower and projector for images with patch grids `grids` `(h, w)`: 2 per
/// multiply-add, matmuls only (LayerNorm, GELU, softmax, RoPE and the position add are
/// elementwise, < 1 %). Per image, with `N = h·w` patches, `C` hidden, `F` MLP width,
/// `P = 3·patch²`, `M = N / (mh·mw)` merged tokens and `D` the text hidden size:
/// patch embed `2·N·P·C`; per layer q/k/v `2·N·C·3C`, scores `QKᵀ` and `PV` `2·N·N·C` each
/// (all heads together; attention within the image only), output projection `2·N·C·C`, MLP
/// `2·2·N·C·F`; merger 0 (a reshape for single images); projector `2·M·4C·4C + 2·M·4C·D`.
/// Same formula as `encoder_flops` in benches/gpu/torch_kimi_k25.py.
fn encoder_flops(cfg: &MoonVitConfig, grids: &[(usize, usize)]) -> f64 {
    let (c, f, p) = (
        cfg.hidden_size as f64,
        cfg.intermediate_size as f64,
        cfg.patch_size as f64,
    );
    let (mh, mw) = cfg.merge_kernel;
    let merged = c * (mh * mw) as f64;
    let d = cfg.text_hidden_size as f64;
    grids
        .iter()
        .map(|&(h, w)| {
            let n = (h * w) as f64;
            let m = (h * w / (mh * mw)) as f64;
            let layer =
                2.0 * n * c * 3.0 * c + 2.0 * 2.0 * n * n * c + 2.0 * n * c * c + 4.0 * n * c * f;
            2.0 * n * 3.0 * p * p * c
                + cfg.num_layers as f64 * layer
                + 2.0 * m * merged * merged
                + 2.0 * m * merged * d
        })
        .sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run<B: Backend>(b: B, a: &Args) -> Result<()> {
    if a.iters == 0 || a.images_per_call == 0 {
        bail!("--iters and --images-per-call must be at least 1");
    }
    let dtype = b.activation_dtype(DType::parse(&a.dtype).context("--dtype")?);
    let cfg_path = a.model.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .with_context(|| format!("reading {}", cfg_path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", cfg_path.display()))?;
    let model_type = json["model_type"].as_str().unwrap_or("kimi_k25");
    if !matches!(model_type, "kimi_k25" | "kimi_vl") {
        bail!(
            "{}: model_type '{model_type}': vision-bench times MoonViT encoders (kimi_k25, kimi_vl) only; time other vision models with `dayone bench --image`",
            cfg_path.display()
        );
    }
    let cfg = MoonVitConfig::from_json(&json, &cfg_path.display().to_string())?;
    // The engine's processor settings: preprocessor_config.json when present, else the
    // defaults of the model's processor (Kimi-K2.5's, Kimi-VL's).
    let pre = a.model.join("preprocessor_config.json");
    let pre_json = if pre.is_file() {
        serde_json::from_str(&std::fs::read_to_string(&pre)?)
            .with_context(|| format!("parsing {}", pre.display()))?
    } else {
        serde_json::Value::Null
    };
    let processor = ImageProcessorConfig::for_model(
        model_type,
        &pre_json,
        Some(cfg.patch_size),
        Some(cfg.merge_kernel.0),
    )
    .with_context(|| pre.display().to_string())?;
    let image = load_image_file(&a.image)?;

    let src = SafetensorsSource::open_dir(&a.model)?;
    let t = Instant::now();
    let vit = MoonVit::load(&WeightLoader::new(&b, &src, dtype), &cfg)?;
    b.synchronize()?;
    let load_s = t.elapsed().as_secs_f64();

    let pre_times: Vec<f64> = (0..a.iters.min(5))
        .map(|_| {
            let t = Instant::now();
            let p = preprocess(&image, &processor);
            std::hint::black_box(p);
            t.elapsed().as_secs_f64()
        })
        .collect();
    let one = preprocess(&image, &processor);
    // The host resample of a first image of this grid size (values do not change its time).
    let (th, tw, c) = (cfg.pos_emb_height, cfg.pos_emb_width, cfg.hidden_size);
    let table = vec![0.5f32; th * tw * c];
    let pos_times: Vec<f64> = (0..a.iters.min(5))
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(resample_table(&table, th, tw, c, one.grid_h, one.grid_w));
            t.elapsed().as_secs_f64()
        })
        .collect();
    let images = vec![one.clone(); a.images_per_call];
    let grids = vec![(one.grid_h, one.grid_w); a.images_per_call];
    let flops = encoder_flops(&cfg, &grids);
    let mut times = Vec::with_capacity(a.iters);
    let mut rows = 0;
    for i in 0..a.warmup + a.iters {
        b.synchronize()?;
        let t = Instant::now();
        let out = vit.encode(&b, &images)?;
        b.synchronize()?;
        if i >= a.warmup {
            times.push(t.elapsed().as_secs_f64());
        }
        rows = out.shape()[0];
    }
    let total: f64 = times.iter().sum();
    let report = serde_json::json!({
        "impl": "dayone",
        "backend": b.name(),
        "dtype": dtype.to_string(),
        "model": a.model.display().to_string(),
        "image": format!("{}x{}", image.width, image.height),
        "grid": format!("{}x{}", one.grid_h, one.grid_w),
        "patches": one.num_patches(),
        "image_tokens": rows / a.images_per_call,
        "images_per_call": a.images_per_call,
        "iters": a.iters,
        "load_s": load_s,
        "preprocess_ms": median(pre_times) * 1e3,
        "pos_emb_host_ms": median(pos_times) * 1e3 * a.images_per_call as f64,
        "ms_per_call_median": median(times) * 1e3,
        "images_per_s": (a.iters * a.images_per_call) as f64 / total,
        "gflop_per_image": flops / a.images_per_call as f64 / 1e9,
        "tflops": flops * a.iters as f64 / total / 1e12,
    });
    if a.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "vision encoder of {} on {} ({}): image {} → grid {} ({} patches, {} tokens), {} per call",
        report["model"].as_str().unwrap_or("?"),
        b.name(),
        dtype,
        report["image"].as_str().unwrap_or("?"),
        report["grid"].as_str().unwrap_or("?"),
        one.num_patches(),
        rows / a.images_per_call,
        a.images_per_call
    );
    for key in [
        "preprocess_ms",
        "pos_emb_host_ms",
        "ms_per_call_median",
        "images_per_s",
        "gflop_per_image",
        "tflops",
    ] {
        println!(
            "{key:<22}{:>12.3}",
            report[key].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    sigpipe::restore();
    let a = Args::parse();
    match a.backend.as_str() {
        "cuda" => run(dayone_cuda::CudaBackend::new(0)?, &a),
        "wgsl" => run(dayone_wgsl::WgslBackend::new()?, &a),
        "cpu" => run(dayone_backend::cpu::CpuBackend, &a),
        other => bail!("--backend must be cuda, wgsl or cpu, got {other}"),
    }
}
