//! The KDA-layer ops (`short_conv`, `kda`, `gated_rms_norm`) of the shared conformance suite on
//! the WGSL backend, with `kda` forced onto each of its paths (token recurrence, chunked form)
//! and with the default switch (chunked from [`dayone_wgsl::KDA_CHUNK_MIN`] tokens), on both
//! kernel families; plus a direct comparison of the two paths on the same inputs.

use dayone_backend::{conformance, Backend, DType, HostTensor};
use dayone_wgsl::{KernelChoice, Options, WgslBackend};

fn backend(kernels: KernelChoice, kda_chunk_min: Option<usize>) -> WgslBackend {
    WgslBackend::with_options(Options {
        kernels,
        kda_chunk_min,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("WGSL backend unavailable: {e:#}"))
}

fn ok(r: anyhow::Result<()>) {
    if let Err(e) = r {
        panic!("{e:#}");
    }
}

#[test]
fn kda_ops_default_switch() {
    ok(conformance::check_kda_ops(&backend(
        KernelChoice::Auto,
        None,
    )));
}

#[test]
fn kda_forced_recurrent() {
    let b = backend(KernelChoice::Auto, Some(usize::MAX));
    ok(conformance::check_kda(&b, DType::F32));
}

#[test]
fn kda_forced_chunked() {
    let b = backend(KernelChoice::Auto, Some(1));
    ok(conformance::check_kda(&b, DType::F32));
}

/// The chunked and recurrent paths agree on a 200-token prefill that continues from a state
/// (4 chunks, the last one short), with unbounded gates of realistic magnitude; also with the
/// chunks split over several scratch rounds.
#[test]
fn kda_paths_agree() -> anyhow::Result<()> {
    let (h, k, v, slots) = (2usize, 64usize, 32usize, 2usize);
    let mut rng = conformance::Rng::new(43);
    let meta = conformance::state_meta(&mut rng, &[(11, 200), (0, 3)], slots);
    let n = meta.num_tokens();
    let t = |rng: &mut conformance::Rng, shape: &[usize], a| {
        conformance::rand_tensor(rng, shape, DType::F32, a)
    };
    let q = t(&mut rng, &[n, h, k], 1.0)?;
    let kk = t(&mut rng, &[n, h, k], 1.0)?;
    let vv = t(&mut rng, &[n, h, v], 1.0)?;
    let a = t(&mut rng, &[n, h, k], 2.0)?;
    let beta = t(&mut rng, &[n, h], 3.0)?;
    let a_log = HostTensor::from_f32(vec![h], &[0.5f32.ln(), 2.5f32.ln()])?;
    let dtb = t(&mut rng, &[h, k], 1.0)?;
    let st0 = t(&mut rng, &[slots, h, k, v], 0.5)?;
    let mut res = Vec::new();
    // Recurrent; chunked; chunked with 300 kB buffers, so that the scratch holds one chunk and
    // the 4 chunks run in 4 rounds carrying the state through the slot.
    for (min, max_chunk_bytes) in [(usize::MAX, None), (1, None), (1, Some(300_000))] {
        let b = WgslBackend::with_options(Options {
            kda_chunk_min: Some(min),
            max_chunk_bytes,
            ..Default::default()
        })?;
        let sd = b.upload(&st0)?;
        let dmeta = b.upload_meta(meta.clone())?;
        let o = b.kda(
            &b.upload(&q)?,
            &b.upload(&kk)?,
            &b.upload(&vv)?,
            &b.upload(&a)?,
            &b.upload(&beta)?,
            &b.upload(&a_log)?,
            &b.upload(&dtb)?,
            None,
            &sd,
            &dmeta,
        )?;
        res.push((b.download(&o)?, b.download(&sd)?));
    }
    conformance::compare("kda chunked vs recurrent", "o", &res[1].0, &res[0].0, 1e-5)?;
    conformance::compare(
        "kda chunked vs recurrent",
        "state",
        &res[1].1,
        &res[0].1,
        1e-5,
    )?;
    Ok(())
}

#[test]
fn kda_ops_cpu_and_gpu_kernel_families() {
    for kernels in [KernelChoice::Cpu, KernelChoice::Gpu] {
        ok(conformance::check_kda_ops(&backend(kernels, None)));
    }
}

/// fla-core 0.6.0's naive KDA outputs (`tests/fixtures/kda_ops.json`, see
/// `backend-trait/tests/kda_fixture.rs`) through the WGSL `kda` on both paths: o and the final
/// state, tolerance 1e-4 (q and k arrive normalised and are normalised again; b = logit(β)).
#[test]
fn kda_matches_fla_fixture_on_both_paths() -> anyhow::Result<()> {
    use anyhow::Context;
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/kda_ops.json");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let floats = |v: &serde_json::Value| -> anyhow::Result<Vec<f32>> {
        v.as_array()
            .context("array")?
            .iter()
            .map(|x| x.as_f64().map(|f| f as f32).context("number"))
            .collect()
    };
    for min in [usize::MAX, 1] {
        let b = backend(KernelChoice::Auto, Some(min));
        for case in j["cases"].as_array().context("cases")? {
            let u = |k: &str| case[k].as_u64().unwrap_or(0) as usize;
            let (bsz, t, h, k, v) = (u("B"), u("T"), u("H"), u("K"), u("V"));
            let n = bsz * t;
            let inp = &case["inputs"];
            let ht = |key: &str, shape: Vec<usize>| -> anyhow::Result<HostTensor> {
                HostTensor::from_f32(shape, &floats(&inp[key])?)
            };
            let logit: Vec<f32> = floats(&inp["beta"])?
                .iter()
                .map(|&p| ((p as f64) / (1.0 - p as f64)).ln() as f32)
                .collect();
            let lb = case["lower_bound"].as_f64().map(|x| x as f32);
            let init = !inp["initial_state"].is_null();
            let st = if init {
                ht("initial_state", vec![bsz, h, k, v])?
            } else {
                HostTensor::from_f32(vec![bsz, h, k, v], &vec![9.0; bsz * h * k * v])?
            };
            let start = if init { 7 } else { 0 };
            let mut meta = dayone_backend::StepMeta {
                block_size: 1 << 20,
                max_blocks: 1,
                ..Default::default()
            };
            meta.query_start.push(0);
            for s in 0..bsz {
                for p in 0..t {
                    meta.positions.push((start + p) as u32);
                    meta.token_seq.push(s as u32);
                    meta.slot_mapping.push(p as u32);
                }
                meta.block_tables.push(0);
                meta.seq_lens.push((start + t) as u32);
                meta.query_start.push(((s + 1) * t) as u32);
                meta.state_slots.push(s as u32);
            }
            let sd = b.upload(&st)?;
            let o = b.kda(
                &b.upload(&ht("q", vec![n, h, k])?)?,
                &b.upload(&ht("k", vec![n, h, k])?)?,
                &b.upload(&ht("v", vec![n, h, v])?)?,
                &b.upload(&ht("a", vec![n, h, k])?)?,
                &b.upload(&HostTensor::from_f32(vec![n, h], &logit)?)?,
                &b.upload(&ht("A_log", vec![h])?)?,
                &b.upload(&ht("dt_bias", vec![h, k])?)?,
                lb,
                &sd,
                &b.upload_meta(meta)?,
            )?;
            let r = &case["recurrent"];
            let c = format!("{} (kda_chunk_min {min})", case["name"]);
            let want_o = HostTensor::from_f32(vec![n, h, v], &floats(&r["o"])?)?;
            let want_s = HostTensor::from_f32(vec![bsz, h, k, v], &floats(&r["final_state"])?)?;
            conformance::compare("wgsl kda vs fla o", &c, &b.download(&o)?, &want_o, 1e-4)?;
            conformance::compare(
                "wgsl kda vs fla state",
                &c,
                &b.download(&sd)?,
                &want_s,
                1e-4,
            )?;
        }
    }
    Ok(())
}
