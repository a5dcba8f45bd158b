//! GGUF files (llama.cpp): metadata → HF config, tensors dequantized to f32 with HF names.
//!
//! Architectures: `llama`, `mistral3`, `qwen2` (q/k/v biases) and `qwen3` (per-head q/k norms,
//! explicit head width): `{arch}.*` metadata becomes the HF config of that `model_type`, `blk.N.*`
//! tensors get HF names.
//!
//! Mistral: llama.cpp has no `mistral` architecture. `convert_hf_to_gguf.py` writes a
//! `MistralForCausalLM` as `llama` (its `LlamaModel` is registered for that class) and the text
//! model of a `Mistral3ForConditionalGeneration` (Mistral Small 3.x) as `mistral3`; both keep the
//! llama layout. A `llama` file carrying `llama.attention.sliding_window` (gguf-py's
//! `Keys.Attention.SLIDING_WINDOW`; the converter itself drops HF's `sliding_window`) and every
//! `mistral3` file become the HF `mistral` model, with that window on every layer (HF
//! `MistralConfig.sliding_window`; none when the key is absent or 0). A `llama` file without the
//! key stays `llama` (full causal attention), which is what llama.cpp runs for it too.
//!
//! For the `llama` and `mistral3` architectures, llama.cpp's converter stores the rows of
//! `attn_q`/`attn_k` (weights and biases) permuted for its interleaved RoPE; [`unpermute_rows`]
//! puts them back in the Hugging Face (half-split RoPE) order. Qwen2/Qwen3 tensors are stored
//! unpermuted (llama.cpp runs them with its NeoX, i.e. half-split, RoPE).

use super::gguf_file::{GgmlType, GgufFile, GgufTensorInfo, MetaValue};
use super::gguf_quant::dequantize;
use super::{Checkpoint, TensorSource, TokenizerAssets};
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use dayone_backend::{DType, HostTensor, QuantHost};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Architectures whose metadata and tensor names are mapped to HF form.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "mistral3", "qwen2", "qwen3"];

/// Whether llama.cpp permuted this architecture's q/k rows (`llama` and `mistral3`: its
/// converter's `LlamaModel.permute`, `undo_permute = True`).
fn permutes_qk(arch: &str) -> bool {
    matches!(arch, "llama" | "mistral3")
}

/// Opens a `.gguf` file as a [`Checkpoint`].
pub fn open_gguf(path: &Path) -> Result<Checkpoint> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if matches!(ext, "safetensors" | "json" | "jinja") {
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        bail!(
            "{}: expected a .gguf file or a model directory; for a Hugging Face checkpoint pass its directory ({})",
            path.display(),
            dir.display()
        );
    }
    if !starts_with_gguf_magic(path)? {
        bail!(
            "{}: not a GGUF file (it does not start with the bytes `GGUF`); dayone accepts a \
             Hugging Face model directory (config.json + *.safetensors) or a .gguf file",
            path.display()
        );
    }
    let file = GgufFile::open(path)?;
    checkpoint_from_gguf(file)
}

/// Whether the file's first four bytes are `GGUF`. Errors name the file when it cannot be read.
fn starts_with_gguf_magic(path: &Path) -> Result<bool> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4);
    std::fs::File::open(path)
        .and_then(|f| f.take(4).read_to_end(&mut head))
        .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
    Ok(head == b"GGUF")
}

/// Builds a [`Checkpoint`] from a parsed GGUF file (which may live in memory).
pub fn checkpoint_from_gguf(file: GgufFile) -> Result<Checkpoint> {
    let path = file.path.clone();
    let arch = match file.get("general.architecture") {
        Some(MetaValue::String(s)) => s.clone(),
        Some(v) => bail!(
            "{}: metadata general.architecture is a {}, expected a string",
            path.display(),
            v.type_name()
        ),
        None => bail!(
            "{}: metadata general.architecture is missing (supported: {})",
            path.display(),
            SUPPORTED_ARCHITECTURES.join(", ")
        ),
    };
    if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
        let hint = if arch.starts_with("mistral") {
            " (llama.cpp writes Mistral models as `llama` or `mistral3`)"
        } else {
            ""
        };
        bail!(
            "{}: general.architecture = \"{arch}\" is not supported (supported: {}){hint}",
            path.display(),
            SUPPORTED_ARCHITECTURES.join(", ")
        );
    }
    let meta = Meta {
        file: &file,
        arch: &arch,
    };
    let config = hf_config(&meta)?;
    let assets = tokenizer_assets(&file)?;
    let n_head = config["num_attention_heads"].as_u64().unwrap_or(1) as usize;
    let n_kv = config["num_key_value_heads"]
        .as_u64()
        .unwrap_or(n_head as u64) as usize;
    let qk = permutes_qk(&arch).then_some((n_head, n_kv));
    let source = GgufSource::build(Arc::new(file), qk)?;
    Ok(Checkpoint {
        path,
        config,
        tensors: Box::new(source),
        assets,
    })
}

/// Typed metadata lookups with errors that name the file and key.
struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn opt(&self, k: &str) -> Option<&MetaValue> {
        self.file.get(&self.key(k))
    }

    fn err(&self, k: &str, want: &str, got: Option<&MetaValue>) -> anyhow::Error {
        match got {
            None => anyhow!(
                "{}: metadata {} is missing ({want} expected)",
                self.file.path.display(),
                self.key(k)
            ),
            Some(v) => anyhow!(
                "{}: metadata {} is {v:?}; expected {want}",
                self.file.path.display(),
                self.key(k)
            ),
        }
    }

    /// A count; a per-layer array whose entries are all equal is accepted too.
    fn uint(&self, k: &str) -> Result<u64> {
        self.opt_uint(k)?
            .ok_or_else(|| self.err(k, "an unsigned integer", None))
    }

    fn opt_uint(&self, k: &str) -> Result<Option<u64>> {
        let Some(v) = self.opt(k) else {
            return Ok(None);
        };
        if let Some(x) = v.as_u64() {
            return Ok(Some(x));
        }
        if let Some(a) = v.as_array() {
            let xs: Option<Vec<u64>> = a.iter().map(|x| x.as_u64()).collect();
            if let Some(xs) = xs {
                if let Some(&first) = xs.first() {
                    if xs.iter().all(|&x| x == first) {
                        return Ok(Some(first));
                    }
                }
            }
        }
        Err(self.err(k, "an unsigned integer (the same for every layer)", Some(v)))
    }

    fn opt_float(&self, k: &str) -> Result<Option<f64>> {
        match self.opt(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(k, "a number", Some(v))),
        }
    }
}

/// Rounds an f32 read from metadata to the shortest decimal that round-trips, so
/// `1e-5f32` shows up as `1e-5`, not `9.999999747378752e-6`.
fn clean_f32(x: f64) -> Value {
    let s = format!("{}", x as f32);
    s.parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// The HF `model_type` of a file of architecture `m.arch`, and its Mistral sliding window: `mistral`
/// for `mistral3` and for a `llama` file with `llama.attention.sliding_window` (see the module
/// docs); otherwise the architecture itself. Errors name the key when the file asks for attention
/// the HF `mistral` model does not have (a per-layer window pattern, llama-4 temperature scaling).
fn model_type_and_window(m: &Meta) -> Result<(&'static str, Option<u64>)> {
    let path = m.file.path.display();
    match m.arch {
        "llama" | "mistral3" => {
            // A per-layer window pattern or a (nonzero) llama-4 attention temperature (Ministral 3)
            // would change the attention; refuse rather than run something else.
            for key in [
                "attention.sliding_window_pattern",
                "attention.temperature_scale",
            ] {
                if m.opt(key).is_some_and(|v| v.as_f64() != Some(0.0)) {
                    bail!(
                        "{path}: metadata {} is not supported for the {} architecture \
                         (dayone maps it onto Hugging Face's llama/mistral, which has no such attention)",
                        m.key(key),
                        m.arch
                    );
                }
            }
            let window = m.opt_uint("attention.sliding_window")?.filter(|&w| w > 0);
            Ok(match (m.arch, window) {
                ("llama", None) => ("llama", None),
                (_, w) => ("mistral", w),
            })
        }
        "qwen2" => Ok(("qwen2", None)),
        "qwen3" => Ok(("qwen3", None)),
        other => bail!("{path}: no Hugging Face model_type for the GGUF architecture \"{other}\""),
    }
}

/// The HF `config.json` equivalent of a llama, mistral3, qwen2 or qwen3 GGUF's metadata
/// (`model_type`: see [`model_type_and_window`]).
fn hf_config(m: &Meta) -> Result<Value> {
    let f = m.file;
    let (model_type, window) = model_type_and_window(m)?;
    let hidden = m.uint("embedding_length")?;
    let n_head = m.uint("attention.head_count")?;
    if n_head == 0 || !hidden.is_multiple_of(n_head) {
        bail!(
            "{}: {} = {hidden} is not a multiple of {} = {n_head}",
            f.path.display(),
            m.key("embedding_length"),
            m.key("attention.head_count")
        );
    }
    let n_kv = m.opt_uint("attention.head_count_kv")?.unwrap_or(n_head);
    if n_kv == 0 || !n_head.is_multiple_of(n_kv) {
        bail!(
            "{}: {} = {n_kv} does not divide the head count {n_head}",
            f.path.display(),
            m.key("attention.head_count_kv")
        );
    }
    let vocab = match m.opt_uint("vocab_size")? {
        Some(v) => v,
        None => match f.get("tokenizer.ggml.tokens").and_then(|t| t.as_array()) {
            Some(t) => t.len() as u64,
            None => f
                .tensor("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .ok_or_else(|| {
                    anyhow!(
                        "{}: cannot tell the vocabulary size (no {}, tokenizer.ggml.tokens or token_embd.weight)",
                        f.path.display(),
                        m.key("vocab_size")
                    )
                })? as u64,
        },
    };
    let mut c = Map::new();
    let class = match model_type {
        "qwen2" => "Qwen2ForCausalLM",
        "qwen3" => "Qwen3ForCausalLM",
        "mistral" => "MistralForCausalLM",
        _ => "LlamaForCausalLM",
    };
    c.insert("model_type".into(), json!(model_type));
    c.insert("architectures".into(), json!([class]));
    if model_type == "mistral" {
        c.insert("sliding_window".into(), json!(window));
    }
    c.insert("hidden_size".into(), json!(hidden));
    c.insert(
        "intermediate_size".into(),
        json!(m.uint("feed_forward_length")?),
    );
    c.insert("num_hidden_layers".into(), json!(m.uint("block_count")?));
    c.insert("num_attention_heads".into(), json!(n_head));
    c.insert("num_key_value_heads".into(), json!(n_kv));
    c.insert("vocab_size".into(), json!(vocab));
    let eps = m
        .opt_float("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-5);
    c.insert("rms_norm_eps".into(), clean_f32(eps));
    let theta = m.opt_float("rope.freq_base")?.unwrap_or(10000.0);
    c.insert("rope_theta".into(), clean_f32(theta));
    if let Some(ctx) = m.opt_uint("context_length")? {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    if let Some(kl) = m.opt_uint("attention.key_length")? {
        if let Some(vl) = m.opt_uint("attention.value_length")? {
            if vl != kl {
                bail!(
                    "{}: {} = {vl} differs from {} = {kl} (a key and value head width that differ are not supported)",
                    f.path.display(),
                    m.key("attention.value_length"),
                    m.key("attention.key_length")
                );
            }
        }
        c.insert("head_dim".into(), json!(kl));
    }
    c.insert("hidden_act".into(), json!("silu"));
    // Qwen2's biases are implied by its model_type; others have them when the file holds them.
    c.insert(
        "attention_bias".into(),
        json!(f.tensor("blk.0.attn_q.bias").is_some()),
    );
    c.insert("mlp_bias".into(), json!(false));
    c.insert(
        "tie_word_embeddings".into(),
        json!(f.tensor("output.weight").is_none()),
    );
    if let Some(kind) = m.opt("rope.scaling.type").and_then(|v| v.as_str()) {
        if kind != "none" {
            let mut rs = Map::new();
            rs.insert("rope_type".into(), json!(kind));
            rs.insert("type".into(), json!(kind));
            if let Some(x) = m.opt_float("rope.scaling.factor")? {
                rs.insert("factor".into(), clean_f32(x));
            }
            if let Some(x) = m.opt_uint("rope.scaling.original_context_length")? {
                rs.insert("original_max_position_embeddings".into(), json!(x));
            }
            c.insert("rope_scaling".into(), Value::Object(rs));
        }
    }
    for (field, key) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
    ] {
        if let Some(v) = f.get(key).and_then(|v| v.as_u64()) {
            c.insert(field.into(), json!(v));
        }
    }
    if let Some(v) = f
        .get("tokenizer.ggml.padding_token_id")
        .and_then(|v| v.as_u64())
    {
        c.insert("pad_token_id".into(), json!(v));
    }
    c.insert("torch_dtype".into(), json!("float32"));
    Ok(Value::Object(c))
}

/// HF name of a llama.cpp tensor name, `None` when there is no mapping.
pub fn hf_tensor_name(gguf: &str) -> Option<String> {
    let (stem, suffix) = gguf.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let base = match stem {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        _ => {
            let rest = stem.strip_prefix("blk.")?;
            let (n, part) = rest.split_once('.')?;
            let n: usize = n.parse().ok()?;
            let hf = match part {
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                _ => return None,
            };
            format!("model.layers.{n}.{hf}")
        }
    };
    Some(format!("{base}.{suffix}"))
}

/// Applies llama.cpp's q/k row permutation (what its converter does to HF weights):
/// rows are viewed as `[n_head, 2, d/2]` and the last two axes swapped, so within each head
/// GGUF row `2i + s` holds HF row `s·d/2 + i`. `rows` is a row-major `[n_rows, row_len]`
/// matrix of `elem` bytes per value. Used by tests and writers; loaders use [`unpermute_rows`].
pub fn permute_rows(
    data: &[u8],
    n_rows: usize,
    n_head: usize,
    row_bytes: usize,
) -> Result<Vec<u8>> {
    reorder_rows(data, n_rows, n_head, row_bytes, true)
}

/// Undoes llama.cpp's q/k row permutation: HF row `s·d/2 + i` of each head (d rows per
/// head, s ∈ {0, 1}) is GGUF row `2i + s`. Errors when the rows do not split into heads of an
/// even size.
pub fn unpermute_rows(
    data: &[u8],
    n_rows: usize,
    n_head: usize,
    row_bytes: usize,
) -> Result<Vec<u8>> {
    reorder_rows(data, n_rows, n_head, row_bytes, false)
}

fn reorder_rows(
    data: &[u8],
    n_rows: usize,
    n_head: usize,
    row_bytes: usize,
    forward: bool,
) -> Result<Vec<u8>> {
    if n_head == 0 || !n_rows.is_multiple_of(n_head) || !(n_rows / n_head).is_multiple_of(2) {
        bail!("cannot split {n_rows} rows into {n_head} heads of an even size");
    }
    if data.len() != n_rows * row_bytes {
        bail!(
            "row data has {} bytes, expected {n_rows} rows of {row_bytes}",
            data.len()
        );
    }
    let d = n_rows / n_head;
    let half = d / 2;
    let mut out = vec![0u8; data.len()];
    for h in 0..n_head {
        for s in 0..2 {
            for i in 0..half {
                let hf = h * d + s * half + i;
                let gg = h * d + 2 * i + s;
                let (src, dst) = if forward { (hf, gg) } else { (gg, hf) };
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    Ok(out)
}

/// Which q/k permutation a tensor needs undone.
#[derive(Clone, Copy, Debug)]
enum Unpermute {
    None,
    Heads(usize),
}

/// The tensors of a GGUF file under HF names.
pub struct GgufSource {
    file: Arc<GgufFile>,
    /// HF name → (index into `file.tensors`, permutation to undo).
    names: BTreeMap<String, (usize, Unpermute)>,
}

impl GgufSource {
    /// Maps a llama-architecture file's tensors to HF names; `n_head`/`n_kv_head` size the q/k
    /// un-permutation. Tensors without an HF mapping keep their GGUF names.
    pub fn new(file: Arc<GgufFile>, n_head: usize, n_kv_head: usize) -> Result<Self> {
        Self::build(file, Some((n_head, n_kv_head)))
    }

    /// Maps a file's tensors to HF names, undoing llama.cpp's q/k row permutation (weights and
    /// biases) with these `(n_head, n_kv_head)` when `qk` is given.
    pub fn build(file: Arc<GgufFile>, qk: Option<(usize, usize)>) -> Result<Self> {
        let mut names = BTreeMap::new();
        for (i, t) in file.tensors.iter().enumerate() {
            let hf = hf_tensor_name(&t.name).unwrap_or_else(|| t.name.clone());
            let un = match qk {
                Some((n_head, _))
                    if hf.ends_with("self_attn.q_proj.weight")
                        || hf.ends_with("self_attn.q_proj.bias") =>
                {
                    Unpermute::Heads(n_head)
                }
                Some((_, n_kv_head))
                    if hf.ends_with("self_attn.k_proj.weight")
                        || hf.ends_with("self_attn.k_proj.bias") =>
                {
                    Unpermute::Heads(n_kv_head)
                }
                _ => Unpermute::None,
            };
            if names.insert(hf.clone(), (i, un)).is_some() {
                bail!("{}: two tensors map to {hf}", file.path.display());
            }
        }
        Ok(Self { file, names })
    }

    /// The parsed file (metadata, raw tensor infos and bytes).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The GGUF tensor info behind an HF name.
    pub fn info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.names.get(name).map(|&(i, _)| &self.file.tensors[i])
    }
}

impl TensorSource for GgufSource {
    fn names(&self) -> Vec<String> {
        self.names.keys().cloned().collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.info(name).map(|t| t.shape())
    }

    fn load(&self, name: &str) -> Result<HostTensor> {
        let path = self.file.path.display();
        let &(i, un) = self
            .names
            .get(name)
            .ok_or_else(|| anyhow!("{path}: no tensor named {name}"))?;
        let t = &self.file.tensors[i];
        let shape = t.shape();
        let bytes = self.file.tensor_bytes(t);
        let (dtype, data) = match t.ggml_type {
            GgmlType::F16 => (DType::F16, bytes.to_vec()),
            GgmlType::BF16 => (DType::BF16, bytes.to_vec()),
            GgmlType::F32 => (DType::F32, bytes.to_vec()),
            GgmlType::Other(_) => bail!(
                "{path}: tensor {} ({name}) has ggml type {}; supported: {}",
                t.name,
                t.ggml_type.name(),
                super::gguf_quant::SUPPORTED_TYPES
            ),
            _ => {
                let v = dequantize(t.ggml_type, bytes, t.numel())
                    .with_context(|| format!("{path}: tensor {} ({name})", t.name))?;
                (DType::F32, bytemuck::cast_slice::<f32, u8>(&v).to_vec())
            }
        };
        let data = match un {
            Unpermute::Heads(h) if shape.len() <= 2 => {
                // A bias `[rows]` is a matrix of one-value rows.
                let row_bytes = shape.get(1).copied().unwrap_or(1) * dtype.size();
                unpermute_rows(&data, shape[0], h, row_bytes).with_context(|| {
                    format!(
                        "{path}: tensor {} ({name}): undoing the q/k row permutation",
                        t.name
                    )
                })?
            }
            _ => data,
        };
        HostTensor::new(shape, dtype, data)
            .with_context(|| format!("{path}: tensor {} ({name})", t.name))
    }

    fn origin(&self) -> String {
        self.file.path.display().to_string()
    }

    fn stored_dtype(&self, name: &str) -> Option<DType> {
        match self.info(name)?.ggml_type {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::BF16 => Some(DType::BF16),
            GgmlType::F16 => Some(DType::F16),
            _ => None,
        }
    }

    fn quant(&self, name: &str) -> Result<Option<QuantHost>> {
        let Some(&(i, un)) = self.names.get(name) else {
            return Ok(None);
        };
        let t = &self.file.tensors[i];
        let shape = t.shape();
        if super::gguf_blocks::kept_format(t.ggml_type).is_none() || shape.len() != 2 {
            return Ok(None);
        }
        let path = self.file.path.display();
        let what = format!("{path}: tensor {} ({name})", t.name);
        let (rows, cols) = (shape[0], shape[1]);
        let bytes = self.file.tensor_bytes(t);
        let bytes = match un {
            Unpermute::Heads(h) => {
                let row_bytes = bytes.len() / rows.max(1);
                unpermute_rows(bytes, rows, h, row_bytes)
                    .with_context(|| format!("{what}: undoing the q/k row permutation"))?
            }
            Unpermute::None => bytes.to_vec(),
        };
        super::gguf_blocks::repack(&what, t.ggml_type, &bytes, rows, cols).map(Some)
    }
}

/// Tokenizer, chat template and special ids from `tokenizer.*` metadata.
fn tokenizer_assets(f: &GgufFile) -> Result<TokenizerAssets> {
    let path = f.path.display();
    let id = |k: &str| {
        f.get(k)
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
    };
    let bos_id = id("tokenizer.ggml.bos_token_id");
    let eos_id = id("tokenizer.ggml.eos_token_id");
    let eot_id = id("tokenizer.ggml.eot_token_id");
    let add_bos_meta = f
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool());
    let chat_template = match f.get("tokenizer.chat_template") {
        None => None,
        Some(MetaValue::String(s)) => Some(s.clone()),
        Some(v) => bail!(
            "{path}: metadata tokenizer.chat_template is a {}, expected a string",
            v.type_name()
        ),
    };
    let model = f
        .get("tokenizer.ggml.model")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let strings = |k: &str| -> Result<Option<Vec<String>>> {
        match f.get(k) {
            None => Ok(None),
            Some(MetaValue::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| anyhow!("{path}: metadata {k} should be an array of strings")),
            Some(v) => bail!(
                "{path}: metadata {k} is a {}, expected an array of strings",
                v.type_name()
            ),
        }
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let types = |n: usize| -> Result<Vec<i32>> {
        match f.get("tokenizer.ggml.token_type") {
            None => Ok(vec![1; n]),
            Some(MetaValue::Array(a)) => a
                .iter()
                .map(|v| v.as_i64().and_then(|x| i32::try_from(x).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    anyhow!(
                        "{path}: metadata tokenizer.ggml.token_type should be an array of integers"
                    )
                }),
            Some(v) => bail!(
                "{path}: metadata tokenizer.ggml.token_type is a {}, expected an array",
                v.type_name()
            ),
        }
    };
    let (tokenizer, add_bos) = match (model.as_deref(), &tokens) {
        (None, _) | (_, None) => (None, add_bos_meta.unwrap_or(false)),
        (Some("gpt2"), Some(tokens)) => {
            let merges = strings("tokenizer.ggml.merges")?
                .ok_or_else(|| anyhow!("{path}: gpt2 tokenizer without tokenizer.ggml.merges"))?;
            let types = types(tokens.len())?;
            let pre = f
                .get("tokenizer.ggml.pre")
                .and_then(|v| v.as_str())
                .unwrap_or("default");
            // llama.cpp's default for BPE vocabularies is not to add BOS.
            let add_bos = add_bos_meta.unwrap_or(false) && bos_id.is_some();
            let tok = Tokenizer::from_gpt2_vocab(tokens, &merges, &types, pre, bos_id, add_bos)
                .with_context(|| format!("{path}: building the tokenizer from tokenizer.ggml.*"))?;
            (Some(tok), add_bos)
        }
        (Some("llama"), Some(tokens)) => {
            let types = types(tokens.len())?;
            let scores: Vec<f32> = match f.get("tokenizer.ggml.scores") {
                None => (0..tokens.len()).map(|i| -(i as f32)).collect(),
                Some(MetaValue::Array(a)) => a
                    .iter()
                    .map(|v| v.as_f64().map(|x| x as f32))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        anyhow!(
                            "{path}: metadata tokenizer.ggml.scores should be an array of numbers"
                        )
                    })?,
                Some(v) => bail!(
                    "{path}: metadata tokenizer.ggml.scores is a {}, expected an array",
                    v.type_name()
                ),
            };
            // llama.cpp's default for SentencePiece vocabularies is to add BOS.
            let add_bos = add_bos_meta.unwrap_or(true) && bos_id.is_some();
            let add_space_prefix = f
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(|v| v.as_bool())
                .unwrap_or(true);
            let vocab = super::gguf_tokenizer::SpmVocab {
                tokens,
                scores: &scores,
                token_types: &types,
                unk_id: id("tokenizer.ggml.unknown_token_id"),
                bos_id,
                add_bos,
                add_space_prefix,
            };
            let tok = super::gguf_tokenizer::build_spm(&vocab)
                .map(Tokenizer::from_inner)
                .with_context(|| format!("{path}: building the tokenizer from tokenizer.ggml.*"))?;
            (Some(tok), add_bos)
        }
        (Some(other), Some(_)) => bail!(
            "{path}: tokenizer.ggml.model = \"{other}\" is not supported (supported: gpt2, llama)"
        ),
    };
    let text =
        |i: Option<u32>| i.and_then(|i| tokens.as_ref().and_then(|t| t.get(i as usize).cloned()));
    if let Some(t) = &tokens {
        for (key, v) in [
            ("tokenizer.ggml.bos_token_id", bos_id),
            ("tokenizer.ggml.eos_token_id", eos_id),
            ("tokenizer.ggml.eot_token_id", eot_id),
            (
                "tokenizer.ggml.padding_token_id",
                id("tokenizer.ggml.padding_token_id"),
            ),
        ] {
            if let Some(i) = v.filter(|&i| i as usize >= t.len()) {
                bail!(
                    "{path}: metadata {key} is {i}, outside the vocabulary (expected an id below {}, the length of tokenizer.ggml.tokens)",
                    t.len()
                );
            }
        }
    }
    let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
    if let Some(e) = eot_id {
        if !eos_ids.contains(&e) {
            eos_ids.push(e);
        }
    }
    Ok(TokenizerAssets {
        tokenizer,
        chat_template,
        bos_token: text(bos_id),
        eos_token: text(eos_id),
        bos_id,
        add_bos,
        eos_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_gguf_says_what_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [("README.md", &b"# dayone\n"[..]), ("empty.gguf", &b""[..])] {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            let e = format!("{:#}", crate::loader::open(&p).err().unwrap());
            assert!(e.contains("not a GGUF file"), "{e}");
            assert!(
                e.contains(
                    "a Hugging Face model directory (config.json + *.safetensors) or a .gguf file"
                ),
                "{e}"
            );
            assert!(!e.contains("magic"), "{e}");
        }
    }

    #[test]
    fn hand_case_permutation() {
        // One head of 4 rows (d/2 = 2), rows of one byte: HF rows [a0, a1, b0, b1]
        // (first half, second half) are stored interleaved as [a0, b0, a1, b1].
        let hf = [10u8, 11, 20, 21];
        let gg = permute_rows(&hf, 4, 1, 1).unwrap();
        assert_eq!(gg, vec![10, 20, 11, 21]);
        assert_eq!(unpermute_rows(&gg, 4, 1, 1).unwrap(), hf.to_vec());
        // Two heads of 6 rows each, rows of 2 bytes.
        let hf: Vec<u8> = (0..24).collect();
        let gg = permute_rows(&hf, 12, 2, 2).unwrap();
        // Head 0: HF rows 0..6 → GGUF order [0, 3, 1, 4, 2, 5]; head 1 likewise offset by 6.
        let order = [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11];
        let want: Vec<u8> = order
            .iter()
            .flat_map(|&r| [2 * r as u8, 2 * r as u8 + 1])
            .collect();
        assert_eq!(gg, want);
        assert_eq!(unpermute_rows(&gg, 12, 2, 2).unwrap(), hf);
    }

    #[test]
    fn permutation_inverse_and_matches_reshape_swapaxes() {
        for (rows, heads, rb) in [(8, 1, 3), (8, 2, 4), (64, 4, 2), (48, 3, 1), (96, 3, 8)] {
            let data: Vec<u8> = (0..rows * rb).map(|i| (i * 7 % 251) as u8).collect();
            let p = permute_rows(&data, rows, heads, rb).unwrap();
            assert_eq!(unpermute_rows(&p, rows, heads, rb).unwrap(), data);
            assert_eq!(
                permute_rows(
                    &unpermute_rows(&data, rows, heads, rb).unwrap(),
                    rows,
                    heads,
                    rb
                )
                .unwrap(),
                data
            );
            // reshape(n_head, 2, d/2, in).swapaxes(1, 2): output index (h, i, s) reads input (h, s, i).
            let d = rows / heads;
            for h in 0..heads {
                for i in 0..d / 2 {
                    for s in 0..2 {
                        let out_row = h * d + i * 2 + s;
                        let in_row = h * d + s * (d / 2) + i;
                        assert_eq!(
                            p[out_row * rb..(out_row + 1) * rb],
                            data[in_row * rb..(in_row + 1) * rb]
                        );
                    }
                }
            }
        }
        assert!(unpermute_rows(&[0; 6], 6, 2, 1).is_err());
        assert!(unpermute_rows(&[0; 4], 4, 0, 1).is_err());
        assert!(unpermute_rows(&[0; 3], 4, 1, 1).is_err());
    }

    #[test]
    fn names() {
        assert_eq!(
            hf_tensor_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert_eq!(
            hf_tensor_name("blk.12.attn_k.weight").unwrap(),
            "model.layers.12.self_attn.k_proj.weight"
        );
        assert_eq!(
            hf_tensor_name("blk.0.ffn_down.weight").unwrap(),
            "model.layers.0.mlp.down_proj.weight"
        );
        assert_eq!(
            hf_tensor_name("blk.3.ffn_norm.weight").unwrap(),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(hf_tensor_name("output.weight").unwrap(), "lm_head.weight");
        assert_eq!(
            hf_tensor_name("output_norm.weight").unwrap(),
            "model.norm.weight"
        );
        assert_eq!(
            hf_tensor_name("blk.1.attn_q.bias").unwrap(),
            "model.layers.1.self_attn.q_proj.bias"
        );
        assert_eq!(
            hf_tensor_name("blk.0.attn_k_norm.weight").unwrap(),
            "model.layers.0.self_attn.k_norm.weight"
        );
        assert!(hf_tensor_name("rope_freqs.weight").is_none());
        assert!(hf_tensor_name("blk.x.attn_q.weight").is_none());
    }
}
