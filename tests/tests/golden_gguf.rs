//! GGUF goldens: `qwen2_tiny.gguf` / `qwen3_tiny.gguf` hold the weights of the `qwen2_tiny` /
//! `qwen3_tiny` HF fixtures in llama.cpp's layout (`fixtures/gen_qwen2.py`, written by the `gguf`
//! package the way `convert_hf_to_gguf.py` does: `qwen2.*`/`qwen3.*` metadata, `blk.N.*` names,
//! q/k rows not permuted). Loaded from the GGUF, the model must give the HF fixture's
//! transformers reference: every logits row of prefill + 8 decode steps within tolerance, greedy
//! tokens identical.
//!
//! `mistral_tiny.gguf` (`fixtures/gen_mistral_gguf.py`) holds the `mistral_tiny` HF fixture's
//! weights the way `convert_hf_to_gguf.py` writes a `MistralForCausalLM`: architecture `llama`,
//! q/k rows permuted, plus `llama.attention.sliding_window` = 8 (shorter than three of the five
//! prompts). It must give `mistral_tiny`'s transformers reference; so must the same file relabelled
//! `mistral3` (llama.cpp's architecture for Mistral Small 3.x text models); without the window key
//! it is a plain llama and must not.
//!
//! `llama_kquant/model.gguf` (`fixtures/gen_gguf_kquants.py`) is a llama whose matrices are
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q4_0, Q4_1 and Q8_0 blocks, kept low-bit on the
//! device; its reference is transformers' llama with the weights gguf-py decodes from those
//! blocks.

use anyhow::{bail, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::loader::{self, checkpoint_from_gguf, Checkpoint, GgufFile, MetaValue};
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::{fixture, greedy, on_every_backend, reference, rel_err, tolerance};

/// [`dayone_tests::check_golden`] for a checkpoint file whose reference is another fixture's.
fn check_gguf<B: Backend>(b: B, file: &str, reference_of: &str, dtype: DType) -> Result<()> {
    check_checkpoint(b, &loader::open(&fixture(file))?, file, reference_of, dtype)
}

/// [`check_gguf`] for an opened checkpoint (`file` names it in errors).
fn check_checkpoint<B: Backend>(
    b: B,
    ckpt: &Checkpoint,
    file: &str,
    reference_of: &str,
    dtype: DType,
) -> Result<()> {
    let r = reference(reference_of)?;
    let cfg = EngineConfig {
        dtype,
        kv_cache_tokens: Some(2048),
        ..Default::default()
    };
    let mut e = Engine::new(b, ckpt, &cfg, None)?;
    e.capture_logits = true;
    let tol = if dtype == DType::F32 {
        tolerance(dtype)
    } else {
        // As check_golden: bf16 against the f32 reference, widened where the reference's own
        // bf16 run is further off.
        r.cases
            .iter()
            .map(|c| 1.5 * dayone_tests::own_bf16_error(c))
            .fold(tolerance(dtype), f64::max)
    };
    for (ci, case) in r.cases.iter().enumerate() {
        let want = &case.float32;
        e.add_request(case.prompt_ids.clone(), greedy(want.logits.len()))?;
        let (mut step, mut diverged) = (0, false);
        while e.has_unfinished() {
            let events = e.step()?;
            if events.is_empty() || diverged {
                continue;
            }
            let (_, logits) = &e.last_logits[0];
            let err = rel_err(logits, &want.logits[step]);
            if err > tol {
                bail!("{file} {dtype} case {ci} step {step}: logits relative error {err:.3e} > {tol:.0e}");
            }
            if let Some(&want_id) = want.greedy_ids.get(step) {
                if events[0].token != want_id {
                    if dtype == DType::F32 {
                        bail!(
                            "{file} {dtype} case {ci} step {step}: greedy token {} != reference {want_id}",
                            events[0].token
                        );
                    }
                    diverged = true;
                }
            }
            step += 1;
        }
    }
    Ok(())
}

/// `mistral_tiny.gguf` parsed, with `edit` applied to its metadata before it becomes a checkpoint.
fn edited_mistral(edit: impl FnOnce(&mut GgufFile)) -> Result<Checkpoint> {
    let mut f = GgufFile::open(&fixture("mistral_tiny.gguf"))?;
    edit(&mut f);
    checkpoint_from_gguf(f)
}

/// Relabels the file as llama.cpp's `mistral3` architecture (`mistral3.*` keys).
fn as_mistral3(f: &mut GgufFile) {
    let old = std::mem::take(&mut f.metadata);
    for (k, v) in old {
        let k = match k.strip_prefix("llama.") {
            Some(rest) => format!("mistral3.{rest}"),
            None => k,
        };
        f.metadata.insert(k, v);
    }
    f.metadata.insert(
        "general.architecture".into(),
        MetaValue::String("mistral3".into()),
    );
}

fn mistral3_gguf<B: Backend>(b: B) -> Result<()> {
    let ckpt = edited_mistral(as_mistral3)?;
    check_checkpoint(
        b,
        &ckpt,
        "mistral_tiny.gguf as mistral3",
        "mistral_tiny",
        DType::F32,
    )
}

on_every_backend! {
    mistral_gguf_f32 => |mk: fn() -> _| check_gguf(mk(), "mistral_tiny.gguf", "mistral_tiny", DType::F32);
    mistral_gguf_bf16 => |mk: fn() -> _| check_gguf(mk(), "mistral_tiny.gguf", "mistral_tiny", DType::BF16);
    mistral3_gguf_f32 => |mk: fn() -> _| mistral3_gguf(mk());
    qwen2_gguf_f32 => |mk: fn() -> _| check_gguf(mk(), "qwen2_tiny.gguf", "qwen2_tiny", DType::F32);
    qwen2_gguf_bf16 => |mk: fn() -> _| check_gguf(mk(), "qwen2_tiny.gguf", "qwen2_tiny", DType::BF16);
    qwen3_gguf_f32 => |mk: fn() -> _| check_gguf(mk(), "qwen3_tiny.gguf", "qwen3_tiny", DType::F32);
    llama_kquant_gguf_f32 => |mk: fn() -> _| check_gguf(mk(), "llama_kquant/model.gguf", "llama_kquant", DType::F32);
    llama_kquant_gguf_bf16 => |mk: fn() -> _| check_gguf(mk(), "llama_kquant/model.gguf", "llama_kquant", DType::BF16);
}

/// The GGUF's synthesised config matches the HF `config.json` on every field the model reads,
/// and every HF tensor comes back bit-identical from the GGUF (so no q/k permutation was undone
/// on a qwen file, and the biases and q/k norms are found).
#[test]
fn gguf_config_and_tensors_equal_the_hf_fixture() {
    for (file, dir) in [
        ("qwen2_tiny.gguf", "qwen2_tiny"),
        ("qwen3_tiny.gguf", "qwen3_tiny"),
        ("mistral_tiny.gguf", "mistral_tiny"),
    ] {
        let g = loader::open(&fixture(file)).unwrap();
        let h = loader::open(&fixture(dir)).unwrap();
        for key in [
            "model_type",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "rms_norm_eps",
            "max_position_embeddings",
            "tie_word_embeddings",
        ] {
            assert_eq!(g.config[key], h.config[key], "{file}: {key}");
        }
        assert_eq!(
            g.config["rope_theta"], h.config["rope_parameters"]["rope_theta"],
            "{file}"
        );
        if dir != "qwen2_tiny" {
            assert_eq!(g.config["head_dim"], h.config["head_dim"], "{file}");
        }
        if dir == "mistral_tiny" {
            assert_eq!(
                g.config["sliding_window"], h.config["sliding_window"],
                "{file}"
            );
            assert_eq!(
                g.config["architectures"], h.config["architectures"],
                "{file}"
            );
        }
        let mut gn = g.tensors.names();
        let mut hn = h.tensors.names();
        gn.sort();
        hn.sort();
        assert_eq!(gn, hn, "{file}: tensor names");
        for n in &hn {
            let (a, b) = (g.tensors.load(n).unwrap(), h.tensors.load(n).unwrap());
            assert_eq!(a.shape, b.shape, "{file}: {n}");
            assert_eq!(a.dtype, b.dtype, "{file}: {n}");
            assert!(a.data == b.data, "{file}: {n} differs");
        }
    }
}

/// Without `llama.attention.sliding_window` the Mistral file is a plain llama (what llama.cpp runs
/// for it): full attention, so the windowed reference is missed on the prompts longer than the
/// window. A window of 0 means none too.
#[test]
fn mistral_gguf_without_window_key_is_llama() {
    for window in [None, Some(0)] {
        let ckpt = edited_mistral(|f| match window {
            None => {
                f.metadata.remove("llama.attention.sliding_window");
            }
            Some(w) => {
                f.metadata
                    .insert("llama.attention.sliding_window".into(), MetaValue::U32(w));
            }
        })
        .unwrap();
        assert_eq!(ckpt.config["model_type"], "llama", "{window:?}");
        assert!(ckpt.config.get("sliding_window").is_none(), "{window:?}");
        let e = check_checkpoint(
            dayone_backend::cpu::CpuBackend,
            &ckpt,
            "mistral_tiny.gguf without window",
            "mistral_tiny",
            DType::F32,
        );
        assert!(e.is_err(), "full attention matched the windowed reference");
    }
    let m3 = edited_mistral(|f| {
        as_mistral3(f);
        f.metadata.remove("mistral3.attention.sliding_window");
    })
    .unwrap();
    assert_eq!(m3.config["model_type"], "mistral");
    assert!(m3.config["sliding_window"].is_null());
}

/// Attention the HF mistral model does not have is refused by key; an unknown architecture is
/// named with the supported list.
#[test]
fn mistral_gguf_unsupported_metadata_is_an_error() {
    type Edit = Box<dyn FnOnce(&mut GgufFile)>;
    let cases: [(&str, Edit); 3] = [
        (
            "mistral3.attention.temperature_scale",
            Box::new(|f: &mut GgufFile| {
                as_mistral3(f);
                f.metadata.insert(
                    "mistral3.attention.temperature_scale".into(),
                    MetaValue::F32(0.1),
                );
            }),
        ),
        (
            "llama.attention.sliding_window_pattern",
            Box::new(|f: &mut GgufFile| {
                f.metadata.insert(
                    "llama.attention.sliding_window_pattern".into(),
                    MetaValue::Array(vec![MetaValue::Bool(true), MetaValue::Bool(false)]),
                );
            }),
        ),
        (
            "general.architecture = \"mistral\"",
            Box::new(|f: &mut GgufFile| {
                f.metadata.insert(
                    "general.architecture".into(),
                    MetaValue::String("mistral".into()),
                );
            }),
        ),
    ];
    for (want, edit) in cases {
        let e = edited_mistral(edit).err().expect(want).to_string();
        assert!(
            e.contains("mistral_tiny.gguf") && e.contains(want),
            "{want}: {e}"
        );
        if want.starts_with("general") {
            assert!(e.contains("llama, mistral3, qwen2, qwen3"), "{e}");
        }
    }
}
