//! GGUF: a tiny llama file written here, read back through the loader; hand-computed
//! dequantized values; q/k un-permutation; metadata of every type; bad files.

mod common;

use common::{bf16_bytes, f16_bytes, f32_bytes, s, strs, write_gguf, Lcg};
use dayone_backend::DType;
use dayone_engine::loader::{
    self, checkpoint_from_gguf, permute_rows, GgmlType, GgufFile, MetaValue,
};
use std::path::Path;

const H: usize = 32; // hidden
const NH: usize = 4; // heads (head_dim 8)
const NKV: usize = 2;
const FF: usize = 64;
const TOKENS: &[&str] = &[
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "a",
    "b",
    "c",
    "Ġ",
    "ab",
    "abc",
    "Ġa",
    "Ġab",
    "1",
    "2",
    "12",
    "<user_tok>",
];
const TYPES: &[i32] = &[3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4];
const V: usize = 15;

fn hq(r: usize, c: usize) -> f32 {
    (r * 100 + c) as f32
}
fn hk(r: usize, c: usize) -> f32 {
    (r * 4 + c % 4) as f32
}

/// Q8_0 rows of one or more blocks: d = 0.5·(block+1), q_j = j − 16 + row.
fn q8_rows(rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let (mut b, mut v) = (Vec::new(), Vec::new());
    for r in 0..rows {
        for blk in 0..cols / 32 {
            let d = 0.5 * (blk + 1) as f32;
            b.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            for j in 0..32 {
                let q = (j - 16 + r as i32).clamp(-128, 127) as i8;
                b.push(q as u8);
                v.push(q as f32 * d);
            }
        }
    }
    (b, v)
}

/// Q4_0 rows, one block each: d = row + 1; byte j holds j (low nibble) and 15 − j (high).
fn q4_0_rows(rows: usize) -> (Vec<u8>, Vec<f32>) {
    let (mut b, mut v) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let d = (r + 1) as f32;
        b.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for j in 0..16u8 {
            b.push(j | ((15 - j) << 4));
        }
        // Elements 0..15 come from the low nibbles, 16..31 from the high ones.
        v.extend((0..16).map(|j| (j as f32 - 8.0) * d));
        v.extend((0..16).map(|j| ((15 - j) as f32 - 8.0) * d));
    }
    (b, v)
}

/// Q4_1 blocks: d = 0.25, m = −1 − block; byte j holds (j, 15 − j).
fn q4_1_rows(rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let (mut b, mut v) = (Vec::new(), Vec::new());
    for _ in 0..rows {
        for blk in 0..cols / 32 {
            let (d, m) = (0.25f32, -1.0 - blk as f32);
            b.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            b.extend_from_slice(&half::f16::from_f32(m).to_le_bytes());
            for j in 0..16u8 {
                b.push(j | ((15 - j) << 4));
            }
            v.extend((0..16).map(|j| j as f32 * d + m));
            v.extend((0..16).map(|j| (15 - j) as f32 * d + m));
        }
    }
    (b, v)
}

struct Tiny {
    bytes: Vec<u8>,
    embd: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    down: Vec<f32>,
}

fn tiny(arch: &str, pre: &str, add_bos: bool, version: u32, alignment: usize) -> Tiny {
    let q: Vec<f32> = (0..H).flat_map(|r| (0..H).map(move |c| hq(r, c))).collect();
    let q_perm = permute_rows(&f32_bytes(&q), H, NH, H * 4).unwrap();
    let kd = NKV * H / NH;
    let k: Vec<f32> = (0..kd)
        .flat_map(|r| (0..H).map(move |c| hk(r, c)))
        .collect();
    let k_perm = permute_rows(&f16_bytes(&k), kd, NKV, H * 2).unwrap();
    let vv: Vec<f32> = (0..kd * H).map(|i| i as f32 * 0.5).collect();
    let (embd_b, embd) = q8_rows(V, H);
    let (o_b, o) = q4_0_rows(H);
    let (gate_b, gate) = q4_1_rows(FF, H);
    let (down_b, down) = q8_rows(H, FF);
    let (up_b, _) = q4_1_rows(FF, H);
    let mut meta = vec![
        ("general.architecture", s(arch)),
        ("llama.context_length", MetaValue::U32(256)),
        ("llama.embedding_length", MetaValue::U32(H as u32)),
        ("llama.block_count", MetaValue::U32(1)),
        ("llama.feed_forward_length", MetaValue::U64(FF as u64)),
        ("llama.attention.head_count", MetaValue::U32(NH as u32)),
        ("llama.attention.head_count_kv", MetaValue::U32(NKV as u32)),
        ("llama.attention.layer_norm_rms_epsilon", MetaValue::F32(1e-6)),
        ("llama.rope.freq_base", MetaValue::F32(500000.0)),
        ("llama.rope.scaling.type", s("linear")),
        ("llama.rope.scaling.factor", MetaValue::F32(2.0)),
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.pre", s(pre)),
        ("tokenizer.ggml.tokens", strs(TOKENS)),
        ("tokenizer.ggml.token_type", MetaValue::Array(TYPES.iter().map(|&t| MetaValue::I32(t)).collect())),
        ("tokenizer.ggml.merges", strs(&["a b", "ab c", "Ġ a", "Ġ ab", "1 2"])),
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(1)),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(2)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(add_bos)),
        ("tokenizer.chat_template", s("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")),
        ("test.u8", MetaValue::U8(200)),
        ("test.i8", MetaValue::I8(-5)),
        ("test.u16", MetaValue::U16(60000)),
        ("test.i16", MetaValue::I16(-300)),
        ("test.i64", MetaValue::I64(-1 << 40)),
        ("test.f64", MetaValue::F64(0.125)),
        ("test.nested", MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]), MetaValue::Array(vec![])])),
        ("test.empty", MetaValue::Array(vec![])),
    ];
    if alignment != 32 {
        meta.push(("general.alignment", MetaValue::U32(alignment as u32)));
    }
    let norm = f32_bytes(&(0..H).map(|i| 1.0 + i as f32).collect::<Vec<_>>());
    let tensors = vec![
        ("token_embd.weight", vec![H as u64, V as u64], 8, embd_b),
        ("blk.0.attn_norm.weight", vec![H as u64], 0, norm.clone()),
        ("blk.0.attn_q.weight", vec![H as u64, H as u64], 0, q_perm),
        ("blk.0.attn_k.weight", vec![H as u64, kd as u64], 1, k_perm),
        (
            "blk.0.attn_v.weight",
            vec![H as u64, kd as u64],
            30,
            bf16_bytes(&vv),
        ),
        ("blk.0.attn_output.weight", vec![H as u64, H as u64], 2, o_b),
        (
            "blk.0.ffn_gate.weight",
            vec![H as u64, FF as u64],
            3,
            gate_b,
        ),
        ("blk.0.ffn_up.weight", vec![H as u64, FF as u64], 3, up_b),
        (
            "blk.0.ffn_down.weight",
            vec![FF as u64, H as u64],
            8,
            down_b,
        ),
        ("blk.0.ffn_norm.weight", vec![H as u64], 0, norm.clone()),
        ("output_norm.weight", vec![H as u64], 0, norm),
        (
            "rope_freqs.weight",
            vec![4],
            0,
            f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
        ),
        ("unsupported.weight", vec![256], 16, vec![0; 66]),
    ];
    Tiny {
        bytes: write_gguf(version, alignment, &meta, &tensors),
        embd,
        o,
        gate,
        down,
    }
}

fn open_bytes(b: &[u8]) -> anyhow::Result<loader::Checkpoint> {
    checkpoint_from_gguf(GgufFile::from_bytes(Path::new("tiny.gguf"), b.to_vec())?)
}

#[test]
fn round_trip_values_and_config() {
    for (version, align) in [(3, 32), (2, 64), (3, 8)] {
        let t = tiny("llama", "smollm", false, version, align);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        std::fs::write(&path, &t.bytes).unwrap();
        let ck = loader::open(&path).unwrap();
        let c = &ck.config;
        assert_eq!(c["model_type"], "llama");
        assert_eq!(c["hidden_size"], H);
        assert_eq!(c["intermediate_size"], FF);
        assert_eq!(c["num_hidden_layers"], 1);
        assert_eq!(c["num_attention_heads"], NH);
        assert_eq!(c["num_key_value_heads"], NKV);
        assert_eq!(c["vocab_size"], V);
        assert_eq!(c["max_position_embeddings"], 256);
        assert_eq!(c["rms_norm_eps"].as_f64(), Some(1e-6));
        assert_eq!(c["rope_theta"].as_f64(), Some(500000.0));
        assert_eq!(c["tie_word_embeddings"], true);
        assert_eq!(c["rope_scaling"]["rope_type"], "linear");
        assert_eq!(c["rope_scaling"]["factor"].as_f64(), Some(2.0));
        assert!(c.get("head_dim").is_none());
        assert_eq!(
            (c["bos_token_id"].as_u64(), c["eos_token_id"].as_u64()),
            (Some(1), Some(2))
        );

        let src = &ck.tensors;
        let names = src.names();
        for n in [
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.0.post_attention_layernorm.weight",
            "model.norm.weight",
            "rope_freqs.weight",
        ] {
            assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
        }
        assert!(!names.iter().any(|n| n == "lm_head.weight"));
        assert_eq!(src.shape("model.embed_tokens.weight"), Some(vec![V, H]));
        assert_eq!(
            src.shape("model.layers.0.mlp.down_proj.weight"),
            Some(vec![H, FF])
        );

        let e = src.load("model.embed_tokens.weight").unwrap();
        assert_eq!((e.dtype, e.shape.clone()), (DType::F32, vec![V, H]));
        assert_eq!(e.to_f32(), t.embd);
        assert_eq!(e.to_f32()[0..3], [-8.0, -7.5, -7.0]); // row 0: q = −16, −15, −14; d = 0.5
        let o = src.load("model.layers.0.self_attn.o_proj.weight").unwrap();
        assert_eq!(o.to_f32(), t.o);
        assert_eq!(o.to_f32()[..2], [-8.0, -7.0]); // row 0, d = 1: (0 − 8), (1 − 8)
        assert_eq!(o.to_f32()[16..18], [7.0, 6.0]); // high nibbles 15, 14
        let g = src.load("model.layers.0.mlp.gate_proj.weight").unwrap();
        assert_eq!(g.to_f32(), t.gate);
        assert_eq!(g.to_f32()[..2], [-1.0, -0.75]);
        let d = src.load("model.layers.0.mlp.down_proj.weight").unwrap();
        assert_eq!(d.to_f32(), t.down);
        assert_eq!(d.to_f32()[32], -16.0); // second block of row 0: d = 1.0, q = −16

        let q = src.load("model.layers.0.self_attn.q_proj.weight").unwrap();
        assert_eq!((q.dtype, q.shape.clone()), (DType::F32, vec![H, H]));
        let want: Vec<f32> = (0..H).flat_map(|r| (0..H).map(move |c| hq(r, c))).collect();
        assert_eq!(q.to_f32(), want, "q rows not restored to HF order");
        let k = src.load("model.layers.0.self_attn.k_proj.weight").unwrap();
        assert_eq!((k.dtype, k.shape.clone()), (DType::F16, vec![16, H]));
        let want: Vec<f32> = (0..16)
            .flat_map(|r| (0..H).map(move |c| hk(r, c)))
            .collect();
        assert_eq!(k.to_f32(), want, "k rows not restored to HF order");
        let v = src.load("model.layers.0.self_attn.v_proj.weight").unwrap();
        assert_eq!(v.dtype, DType::BF16);
        assert_eq!(v.to_f32()[..3], [0.0, 0.5, 1.0]);

        let err = src.load("unsupported.weight").unwrap_err().to_string();
        assert!(
            err.contains("unsupported.weight") && err.contains("q4_K"),
            "{err}"
        );
        let err = src.load("nope").unwrap_err().to_string();
        assert!(err.contains("tiny.gguf") && err.contains("nope"), "{err}");

        assert_eq!(ck.assets.bos_id, Some(1));
        assert_eq!(ck.assets.eos_ids, vec![2]);
        assert_eq!(ck.assets.bos_token.as_deref(), Some("<|im_start|>"));
        assert_eq!(ck.assets.eos_token.as_deref(), Some("<|im_end|>"));
        assert!(ck.assets.chat_template.is_some());
        assert!(!ck.assets.add_bos);
    }
}

#[test]
fn metadata_of_every_type() {
    let t = tiny("llama", "smollm", false, 3, 32);
    let f = GgufFile::from_bytes(Path::new("tiny.gguf"), t.bytes).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.get("test.u8"), Some(&MetaValue::U8(200)));
    assert_eq!(f.get("test.i8"), Some(&MetaValue::I8(-5)));
    assert_eq!(f.get("test.u16"), Some(&MetaValue::U16(60000)));
    assert_eq!(f.get("test.i16"), Some(&MetaValue::I16(-300)));
    assert_eq!(f.get("test.i64").unwrap().as_i64(), Some(-1 << 40));
    assert_eq!(f.get("test.f64").unwrap().as_f64(), Some(0.125));
    assert_eq!(f.get("test.empty"), Some(&MetaValue::Array(vec![])));
    let nested = f.get("test.nested").unwrap().as_array().unwrap();
    assert_eq!(
        nested[0],
        MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)])
    );
    assert_eq!(
        f.get("llama.feed_forward_length").unwrap().as_u64(),
        Some(FF as u64)
    );
    let ti = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(
        (ti.dims.clone(), ti.shape(), ti.ggml_type),
        (vec![FF, H], vec![H, FF], GgmlType::Q8_0)
    );
    assert_eq!(f.data_start % 32, 0);
}

#[test]
fn tokenizer_from_vocab() {
    let ck = open_bytes(&tiny("llama", "smollm", false, 3, 32).bytes).unwrap();
    let tok = ck.assets.tokenizer.as_ref().unwrap();
    assert_eq!(tok.vocab_size(), V);
    let text = "abc ab<|im_end|>12<user_tok>";
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(ids, vec![8, 10, 2, 11, 12, 14]); // digits split one by one for `smollm`
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(tok.decode(&ids, true).unwrap(), "abc ab12<user_tok>");
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert!(tok.decode(&[99], false).is_err());

    // The GPT-2 split keeps digit runs together, so the `1 2` merge applies.
    let ck = open_bytes(&tiny("llama", "gpt2", true, 3, 32).bytes).unwrap();
    let tok = ck.assets.tokenizer.as_ref().unwrap();
    assert_eq!(tok.encode("ab12", false).unwrap(), vec![7, 13]);
    // add_bos_token: encode(…, true) prepends BOS; encode(…, false) does not.
    assert!(ck.assets.add_bos);
    assert_eq!(tok.encode("ab", true).unwrap(), vec![1, 7]);
    assert_eq!(tok.encode("ab", false).unwrap(), vec![7]);

    let e = open_bytes(&tiny("llama", "no-such-pre", false, 3, 32).bytes)
        .err()
        .unwrap();
    let e = format!("{e:#}");
    assert!(
        e.contains("tokenizer.ggml.pre") && e.contains("no-such-pre") && e.contains("smollm"),
        "{e}"
    );
}

#[test]
fn unknown_architecture() {
    let e = open_bytes(&tiny("mamba", "smollm", false, 3, 32).bytes)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("tiny.gguf")
            && e.contains("general.architecture")
            && e.contains("mamba")
            && e.contains("llama"),
        "{e}"
    );
}

#[test]
fn not_a_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.bin");
    std::fs::write(&p, b"hello world, this is not a gguf file").unwrap();
    let e = format!("{:#}", loader::open(&p).err().unwrap());
    assert!(e.contains("model.bin") && e.contains("GGUF"), "{e}");
    let mut b = tiny("llama", "smollm", false, 3, 32).bytes;
    b[4] = 1; // version 1
    let e = format!("{:#}", open_bytes(&b).err().unwrap());
    assert!(e.contains("version 1"), "{e}");
}

#[test]
fn truncated_files_are_errors() {
    let b = tiny("llama", "smollm", false, 3, 32).bytes;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.gguf");
    std::fs::write(&p, &b[..b.len() - 1]).unwrap();
    let e = format!("{:#}", loader::open(&p).err().unwrap());
    assert!(e.contains("cut.gguf") && e.contains("past the end"), "{e}");
    for cut in 0..b.len() {
        let r = open_bytes(&b[..cut]);
        assert!(
            r.is_err(),
            "a file cut at {cut} of {} bytes opened",
            b.len()
        );
    }
}

#[test]
fn random_corruption_never_panics() {
    let good = tiny("llama", "smollm", false, 3, 32).bytes;
    let mut rng = Lcg(7);
    let mut opened = 0;
    for round in 0..3000 {
        let mut b = good.clone();
        let flips = 1 + (rng.next() % 4) as usize;
        for _ in 0..flips {
            // Mostly the header (where the structure is), sometimes anywhere.
            let span = if round % 3 == 0 {
                b.len()
            } else {
                2400.min(b.len())
            };
            let i = (rng.next() as usize) % span;
            b[i] = rng.next() as u8;
        }
        if let Ok(ck) = open_bytes(&b) {
            opened += 1;
            for n in ck.tensors.names() {
                let _ = ck.tensors.load(&n);
            }
            if let Some(t) = &ck.assets.tokenizer {
                let _ = t.encode("abc ab<|im_end|>12", true);
                let _ = t.decode(&[0, 1, 2, 3, 8], false);
            }
        }
    }
    assert!(opened > 0);
}

/// Every quantized type against values dequantized by llama.cpp's gguf-py
/// (`tests/data/gen_quant_reference.py` wrote the file).
#[test]
fn dequantize_matches_gguf_py() {
    let data = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/quant_reference.bin"
    ))
    .unwrap();
    let mut pos = 0;
    let mut seen = Vec::new();
    let u32_at = |p: usize| u32::from_le_bytes(data[p..p + 4].try_into().unwrap()) as usize;
    while pos < data.len() {
        let (ty, nblocks, bsize) = (u32_at(pos), u32_at(pos + 4), u32_at(pos + 8));
        pos += 12;
        let ty = GgmlType::from_id(ty as u32);
        let (per, bs) = ty.block().unwrap_or_else(|| panic!("{ty:?} not loadable"));
        assert_eq!(bs, bsize, "{ty:?} block size");
        let raw = &data[pos..pos + nblocks * bsize];
        pos += nblocks * bsize;
        let n = nblocks * per;
        let want: Vec<f32> = data[pos..pos + 4 * n]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        pos += 4 * n;
        let got = loader::dequantize(ty, raw, n).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-6 * w.abs().max(1e-3);
            assert!(
                (g - w).abs() <= tol,
                "{ty:?} value {i}: got {g}, gguf-py {w}"
            );
        }
        assert!(loader::dequantize(ty, &raw[1..], n).is_err());
        seen.push(ty.name());
    }
    assert_eq!(
        seen,
        ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]
    );
}

/// A GGUF with a SentencePiece (`llama`) vocabulary and a single tensor.
fn spm_gguf(extra: Vec<(&str, MetaValue)>) -> Vec<u8> {
    let pieces: &[(&str, f32, i32)] = &[
        ("<unk>", 0.0, 2),
        ("<s>", 0.0, 3),
        ("</s>", 0.0, 3),
        ("<0x0A>", 0.0, 6),
        ("<0xC3>", 0.0, 6),
        ("<0xA9>", 0.0, 6),
        ("▁", -100.0, 1),
        ("h", -100.0, 1),
        ("e", -100.0, 1),
        ("l", -100.0, 1),
        ("o", -100.0, 1),
        ("w", -100.0, 1),
        ("r", -100.0, 1),
        ("d", -100.0, 1),
        ("ll", -1.0, 1),
        ("▁h", -2.0, 1),
        ("he", -3.0, 1),
        ("▁he", -4.0, 1),
        ("llo", -5.0, 1),
        ("▁hello", -6.0, 1),
        ("or", -7.0, 1),
        ("▁w", -8.0, 1),
        ("▁wor", -9.0, 1),
        ("ld", -10.0, 1),
    ];
    let v = pieces.len();
    let mut meta = vec![
        ("general.architecture", s("llama")),
        ("llama.embedding_length", MetaValue::U32(32)),
        ("llama.block_count", MetaValue::U32(0)),
        ("llama.feed_forward_length", MetaValue::U32(64)),
        ("llama.attention.head_count", MetaValue::U32(4)),
        ("tokenizer.ggml.model", s("llama")),
        (
            "tokenizer.ggml.tokens",
            MetaValue::Array(pieces.iter().map(|p| s(p.0)).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            MetaValue::Array(pieces.iter().map(|p| MetaValue::F32(p.1)).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(pieces.iter().map(|p| MetaValue::I32(p.2)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(1)),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(2)),
        ("tokenizer.ggml.unknown_token_id", MetaValue::U32(0)),
    ];
    meta.extend(extra);
    let embd = f32_bytes(&vec![0.0; 32 * v]);
    write_gguf(
        3,
        32,
        &meta,
        &[("token_embd.weight", vec![32, v as u64], 0, embd)],
    )
}

#[test]
fn sentencepiece_vocabulary() {
    let ck = open_bytes(&spm_gguf(vec![])).unwrap();
    assert_eq!(ck.config["num_key_value_heads"], 4);
    assert_eq!(ck.config["vocab_size"], 24);
    // llama.cpp adds BOS by default for SentencePiece vocabularies.
    assert!(ck.assets.add_bos);
    let tok = ck.assets.tokenizer.as_ref().unwrap();
    // Merges by score: ll, ▁h, ▁he, llo, ▁hello, or, ▁w, ▁wor, ld.
    assert_eq!(tok.encode("hello world", false).unwrap(), vec![19, 22, 23]);
    assert_eq!(
        tok.encode("hello world", true).unwrap(),
        vec![1, 19, 22, 23]
    );
    // A space prefix after special tokens too; bytes for characters outside the vocabulary;
    // the unknown id when even the byte is missing.
    assert_eq!(tok.encode("<s>hello", false).unwrap(), vec![1, 19]);
    assert_eq!(tok.encode("é\n", false).unwrap(), vec![6, 4, 5, 3]);
    assert_eq!(tok.encode("z", false).unwrap(), vec![6, 0]);
    assert_eq!(tok.decode(&[1, 19, 22, 23], true).unwrap(), "hello world");
    assert_eq!(tok.decode(&[6, 4, 5, 3], false).unwrap(), "é\n");
    let mut sd = tok.stream_decoder(true);
    let mut out = sd.push_all(&[1, 19, 22, 23, 6, 4, 5, 3]).unwrap();
    out.push_str(&sd.finish().unwrap());
    assert_eq!(out, tok.decode(&[1, 19, 22, 23, 6, 4, 5, 3], true).unwrap());

    let ck = open_bytes(&spm_gguf(vec![
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
        ("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false)),
    ]))
    .unwrap();
    assert!(!ck.assets.add_bos);
    let tok = ck.assets.tokenizer.as_ref().unwrap();
    assert_eq!(tok.encode("hello", true).unwrap(), vec![16, 18]); // he llo
    let e = format!(
        "{:#}",
        open_bytes(&spm_gguf(vec![("tokenizer.ggml.model", s("bert"))]))
            .err()
            .unwrap()
    );
    assert!(
        e.contains("tokenizer.ggml.model") && e.contains("bert"),
        "{e}"
    );
}

/// A tokenizer saved as `tokenizer.json` loads back in an HF directory, and a post-processor
/// that adds BOS is detected when `tokenizer_config.json` does not say.
#[test]
fn hf_dir_tokenizer_json() {
    let ck = open_bytes(&tiny("llama", "smollm", true, 3, 32).bytes).unwrap();
    let tok = ck.assets.tokenizer.as_ref().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    tok.inner.save(d.join("tokenizer.json"), false).unwrap();
    std::fs::write(d.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let data: Vec<u8> = 1.0f32.to_le_bytes().to_vec();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &data).unwrap();
    safetensors::serialize_to_file([("w", view)], None, &d.join("model.safetensors")).unwrap();
    let hf = loader::open(d).unwrap();
    let t2 = hf.assets.tokenizer.as_ref().unwrap();
    let text = "abc ab<|im_end|>12";
    assert_eq!(
        t2.encode(text, true).unwrap(),
        tok.encode(text, true).unwrap()
    );
    assert_eq!(t2.encode(text, false).unwrap(), vec![8, 10, 2, 11, 12]);
    // No ids in config.json: BOS/EOS come from the tokenizer_config texts.
    assert_eq!(hf.assets.bos_id, None);
    assert!(!hf.assets.add_bos);
    std::fs::write(
        d.join("tokenizer_config.json"),
        r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}}"#,
    )
    .unwrap();
    let hf = loader::open(d).unwrap();
    assert_eq!(hf.assets.bos_id, Some(1));
    assert_eq!(hf.assets.eos_ids, vec![2]);
    assert!(hf.assets.add_bos, "the post-processor adds BOS");
    std::fs::write(d.join("tokenizer.json"), "{broken").unwrap();
    let e = format!("{:#}", loader::open(d).err().unwrap());
    assert!(e.contains("tokenizer.json"), "{e}");
}
