//! One DeepSeek-V3-shaped MoE block (router + routed experts + shared expert) through the
//! `Backend` trait, at several token counts: milliseconds per block, TFLOP/s (2 FLOPs per
//! multiply-add over the experts each token uses) and weight GB/s (bytes of the distinct experts
//! touched, for the memory-bound small-batch case).
//!
//! Usage: `moe-bench [--backend cuda|wgsl|cpu] [--tokens 1,64,512,8192] [--hidden 7168]
//!         [--experts 256] [--expert-dim 2048] [--top-k 8] [--groups 8] [--topk-group 4]
//!         [--shared 1] [--experts-format bf16|mxfp4|int4] [--quant-path auto,direct,decode,fp8]
//!         [--shared-fused | --route-only] [--json]`
//!
//! With `--experts-format mxfp4|int4` the routed experts stay low-bit on the device (the
//! engine's `QuantExperts`) and run by each path of `--quant-path`, timed apart: `decode`
//! converts the experts a step routed to into a workspace before the expert GEMMs (the time
//! includes that conversion and the read-back of the routing), `direct` reads the codes in the
//! grouped low-bit GEMV (`Backend::moe_experts_quant`), `auto` is the engine's choice (direct up
//! to the backend's `moe_quant_direct_tokens`; CUDA: `DAYONE_MOE_QUANT_DIRECT_MAX` tokens, default 8 pairs per expert),
//! `fp8` the decode path through the FP8 expert GEMM at every token count (`--moe-fp8`'s
//! `Backend::moe_experts_fp8`: the chosen experts converted to e4m3 with per-32 block scales,
//! activations rounded to e4m3; CUDA sm_89+, an error elsewhere).

mod sigpipe;

use anyhow::{bail, Result};
use clap::{CommandFactory, Parser};
use dayone_backend::conformance::Rng;
use dayone_backend::quant::ScaleType;
use dayone_backend::{Backend, DType, HostTensor, MoeRouting, QuantFormat, QuantHost, QuantTensor};
use dayone_engine::layers::{ExpertWorkspace, QuantExperts, QuantPath};
use std::time::Instant;

/// Command-line flags.
#[derive(Parser)]
#[command(
    name = "moe-bench",
    about = "Time of one DeepSeek-V3-shaped MoE block at several token counts"
)]
struct Args {
    /// Backend: cuda, wgsl or cpu.
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "wgsl", "cpu"])]
    backend: String,
    /// Token counts, comma-separated, each at least 1.
    #[arg(long, value_delimiter = ',', default_value = "1,64,512,8192",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    tokens: Vec<usize>,
    /// Residual width D.
    #[arg(long, default_value_t = 7168)]
    hidden: usize,
    /// Routed experts E.
    #[arg(long, default_value_t = 256)]
    experts: usize,
    /// Expert intermediate width F.
    #[arg(long, default_value_t = 2048)]
    expert_dim: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 8)]
    top_k: usize,
    /// Expert groups.
    #[arg(long, default_value_t = 8)]
    groups: usize,
    /// Groups kept per token.
    #[arg(long, default_value_t = 4)]
    topk_group: usize,
    /// Shared experts.
    #[arg(long, default_value_t = 1)]
    shared: usize,
    /// Routed experts stored as bf16, or low-bit (mxfp4: E8M0 per 32; int4: bf16 scale per 32;
    /// --hidden and --expert-dim multiples of 32), run by each --quant-path.
    #[arg(long, default_value = "bf16", value_parser = ["bf16", "mxfp4", "int4"])]
    experts_format: String,
    /// Low-bit expert paths to time, comma-separated: auto, direct, decode, fp8 (ignored for
    /// bf16). On a backend without a direct kernel (CPU, WGSL) `direct` decodes the routed
    /// experts into temporaries; fp8 needs CUDA sm_89+.
    #[arg(long, value_delimiter = ',', default_value = "auto",
          value_parser = ["auto", "direct", "decode", "fp8"])]
    quant_path: Vec<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Time the block as the engine runs it at decode: the routed and shared experts in one
    /// `moe_experts_shared` call (bf16 experts, one shared expert; CUDA runs two launches at
    /// ≤ 32 token-choice pairs) instead of `moe_experts` beside the shared expert's own calls.
    #[arg(long)]
    shared_fused: bool,
    /// Time the router alone (GEMV and top-k: one launch at decode sizes on CUDA with the
    /// `router_topk` fusion); the GB/s column then counts the router's f32 weights.
    #[arg(long, conflicts_with = "shared_fused")]
    route_only: bool,
}

/// A `[shape]` bf16 host tensor of small random values: one random block repeated (random
/// values everywhere would take minutes to draw for 15 GB of experts; timings do not depend on it).
fn filled(shape: &[usize], rng: &mut Rng, scale: f32) -> Result<HostTensor> {
    let n: usize = shape.iter().product();
    let block = HostTensor::from_f32_as(vec![1 << 20], &rng.vec(1 << 20, scale), DType::BF16)?;
    let mut data = Vec::with_capacity(n * 2);
    while data.len() < n * 2 {
        let take = (n * 2 - data.len()).min(block.data.len());
        data.extend_from_slice(&block.data[..take]);
    }
    HostTensor::new(shape.to_vec(), DType::BF16, data)
}

/// A low-bit weight of `shape` with one random 1 MiB block of codes repeated and scales near
/// 2^-6 (E8M0 byte 121, or bf16 0.015625): the timing does not depend on the values.
fn low_bit(format: QuantFormat, shape: [usize; 3], rng: &mut Rng) -> Result<QuantHost> {
    let n: usize = shape.iter().product();
    let block: Vec<u8> = (0..1 << 20).map(|_| rng.next_u64() as u8).collect();
    let codes: Vec<u8> = block
        .iter()
        .copied()
        .cycle()
        .take(n * format.code_bits() / 8)
        .collect();
    let groups = n / format.group;
    let scales = match format.scale {
        ScaleType::E8M0 => vec![121u8; groups],
        _ => [0x80u8, 0x3c].repeat(groups), // bf16 0.015625 = 0x3c80, little-endian
    };
    QuantHost::new("bench experts", format, shape, codes, scales, vec![])
}

/// The shape flags' constraints (those of `Backend::moe_route`, of the low-bit groups and of
/// `--shared-fused`), as a message naming the flags; `None` when they hold.
fn shape_error(a: &Args) -> Option<String> {
    let (e, k, g, tg) = (a.experts, a.top_k, a.groups, a.topk_group);
    if e == 0 || k == 0 || k > e {
        return Some(format!("--top-k {k} must be in 1..=--experts ({e})"));
    }
    if g == 0 || !e.is_multiple_of(g) {
        return Some(format!("--groups {g} must divide --experts ({e})"));
    }
    if tg == 0 || tg > g {
        return Some(format!("--topk-group {tg} must be in 1..=--groups ({g})"));
    }
    if a.experts_format != "bf16"
        && (!a.hidden.is_multiple_of(32) || !a.expert_dim.is_multiple_of(32))
    {
        return Some(format!(
            "--hidden {} and --expert-dim {} must be multiples of 32 (the group of --experts-format {})",
            a.hidden, a.expert_dim, a.experts_format
        ));
    }
    if a.shared_fused && (a.shared != 1 || a.experts_format != "bf16") {
        return Some(format!(
            "--shared-fused needs --shared 1 and bf16 experts, got --shared {} and {}",
            a.shared, a.experts_format
        ));
    }
    None
}

fn run<B: Backend>(b: B, a: &Args) -> Result<()> {
    let (d, e, f) = (a.hidden, a.experts, a.expert_dim);
    let act = b.activation_dtype(DType::BF16);
    let mut rng = Rng::new(7);
    let gate = b.upload_weight(&HostTensor::from_f32(vec![e, d], &rng.vec(e * d, 0.05))?)?;
    let bias = b.upload_weight(&HostTensor::from_f32(vec![e], &rng.vec(e, 0.01))?)?;
    let format = match a.experts_format.as_str() {
        "bf16" => None,
        "mxfp4" => Some(QuantFormat::MXFP4),
        "int4" => Some(QuantFormat::int4(32, ScaleType::BF16)),
        other => bail!("--experts-format must be bf16, mxfp4 or int4, got {other}"),
    };
    let mut paths = Vec::new();
    for p in &a.quant_path {
        paths.push(match (p.as_str(), format) {
            (_, None) => break,
            ("auto", _) => (QuantPath::Auto, false),
            ("direct", _) => (QuantPath::Direct, false),
            ("decode", _) => (QuantPath::Decode, false),
            ("fp8", Some(fmt)) => {
                if !b.moe_fp8_available(fmt) {
                    bail!(
                        "--quant-path fp8: {} has no FP8 expert GEMM for {} (needs CUDA sm_89+)",
                        b.name(),
                        fmt.name()
                    );
                }
                (QuantPath::Decode, true)
            }
            (other, _) => bail!("--quant-path must be auto, direct, decode or fp8, got {other}"),
        });
    }
    let (gate_up, down, mut quant) = match format {
        None => (
            b.upload_weight(&filled(&[e, 2 * f, d], &mut rng, 0.02)?)?,
            b.upload_weight(&filled(&[e, d, f], &mut rng, 0.02)?)?,
            None,
        ),
        Some(fmt) => {
            let one = b.zeros(&[1, 1, 1], act)?;
            let q = QuantExperts {
                gate_up: QuantTensor::upload(&b, &low_bit(fmt, [e, 2 * f, d], &mut rng)?)?,
                down: QuantTensor::upload(&b, &low_bit(fmt, [e, d, f], &mut rng)?)?,
                workspace: ExpertWorkspace::new(&b, e, f, d, act)?,
                path: QuantPath::Auto,
                fp8: false,
            };
            (one.clone(), one, Some(q))
        }
    };
    let sf = f * a.shared;
    let sh_gate = b.upload_weight(&filled(&[sf, d], &mut rng, 0.02)?)?;
    let sh_up = b.upload_weight(&filled(&[sf, d], &mut rng, 0.02)?)?;
    let sh_down = b.upload_weight(&filled(&[d, sf], &mut rng, 0.02)?)?;
    let routing = MoeRouting {
        top_k: a.top_k,
        n_group: a.groups,
        topk_group: a.topk_group,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
    };
    let block =
        |x: &B::Tensor, quant: &Option<QuantExperts<B>>| -> Result<(B::Tensor, B::Tensor)> {
            let (ids, w) = b.moe_route(x, &gate, Some(&bias), &routing)?;
            if a.route_only {
                return Ok((w, ids));
            }
            if a.shared_fused && quant.is_none() {
                let shared = [&sh_gate, &sh_up, &sh_down];
                return Ok((
                    b.moe_experts_shared(x, &ids, &w, &gate_up, &down, shared)?,
                    ids,
                ));
            }
            let y = match quant {
                Some(q) => q.forward(&b, x, &ids, &w)?,
                None => b.moe_experts(x, &ids, &w, &gate_up, &down)?,
            };
            // The shared expert as the engine runs it: gate and up in one `linear_many`.
            let gu = b.linear_many(x, &[(&sh_gate, None), (&sh_up, None)])?;
            let s = b.linear(&b.silu_mul(&gu[0], &gu[1])?, &sh_down, None)?;
            Ok((b.add(&y, &s)?, ids))
        };
    if !a.json {
        println!(
            "MoE block on {}: D {d}, {e} experts × F {f} ({}), top-{}, groups {}/{}, {} shared; {act}",
            b.name(),
            a.experts_format,
            a.top_k,
            a.topk_group,
            a.groups,
            a.shared
        );
        println!(
            "{:>7} {:>7} {:>10} {:>10} {:>12} {:>9}",
            "path", "tokens", "ms", "TFLOP/s", "weight GB/s", "experts"
        );
    }
    let runs: Vec<Option<(QuantPath, bool)>> = if paths.is_empty() {
        vec![None]
    } else {
        paths.into_iter().map(Some).collect()
    };
    for run in runs {
        if let (Some(q), Some((p, fp8))) = (quant.as_mut(), run) {
            q.path = p;
            q.fp8 = fp8;
        }
        let label = match run {
            None => "-".to_string(),
            Some((_, true)) => "fp8".to_string(),
            Some((p, false)) => format!("{p:?}").to_lowercase(),
        };
        for &t in &a.tokens {
            // The same input (so the same routing) for every path at this token count.
            let x = b.upload(&HostTensor::from_f32_as(
                vec![t, d],
                &Rng::new(1000 + t as u64).vec(t * d, 1.0),
                act,
            )?)?;
            let (_, ids) = block(&x, &quant)?;
            let ids = b.download(&ids)?.to_u32()?;
            let mut used: Vec<u32> = ids.clone();
            used.sort_unstable();
            used.dedup();
            b.synchronize()?;
            let iters = if t >= 4096 { 5 } else { 20 };
            let t0 = Instant::now();
            for _ in 0..iters {
                block(&x, &quant)?;
            }
            b.synchronize()?;
            let s = t0.elapsed().as_secs_f64() / iters as f64;
            let flops = if a.route_only {
                2.0 * (e * d * t) as f64
            } else {
                2.0 * 3.0 * (d * f) as f64 * (t * (a.top_k + a.shared)) as f64
            };
            let expert_bytes = match format {
                None => 2.0,
                Some(f) => f.code_bits() as f64 / 8.0 + f.scale.size() as f64 / f.group as f64,
            };
            let bytes = if a.route_only {
                4.0 * (e * d) as f64
            } else {
                3.0 * (d * f) as f64 * (expert_bytes * used.len() as f64 + 2.0 * a.shared as f64)
            };
            if a.json {
                println!(
                "{{\"format\":\"{}\",\"path\":\"{label}\",\"tokens\":{t},\"ms\":{:.4},\"tflops\":{:.2},\"weight_gbps\":{:.1},\"experts_used\":{},\"backend\":\"{}\"}}",
                a.experts_format,
                s * 1e3,
                flops / s / 1e12,
                bytes / s / 1e9,
                used.len(),
                b.name()
            );
            } else {
                println!(
                    "{label:>7} {t:>7} {:>10.3} {:>10.2} {:>12.1} {:>9}",
                    s * 1e3,
                    flops / s / 1e12,
                    bytes / s / 1e9,
                    used.len()
                );
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    sigpipe::restore();
    let a = Args::parse();
    if let Some(msg) = shape_error(&a) {
        Args::command()
            .error(clap::error::ErrorKind::ValueValidation, msg)
            .exit();
    }
    match a.backend.as_str() {
        "cuda" => run(dayone_cuda::CudaBackend::new(0)?, &a),
        "wgsl" => run(dayone_wgsl::WgslBackend::new()?, &a),
        "cpu" => run(dayone_backend::cpu::CpuBackend, &a),
        other => bail!("--backend must be cuda, wgsl or cpu, got {other}"),
    }
}
