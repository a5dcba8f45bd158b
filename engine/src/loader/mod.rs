//! Checkpoint loading: safetensors directories (single file or sharded) and GGUF files,
//! both presented as HF-named tensors plus an HF-style `config.json` value.

mod compressed_tensors;
mod gguf;
mod gguf_blocks;
mod gguf_file;
mod gguf_quant;
pub(crate) mod gguf_tokenizer;
mod hf_dir;
mod safetensors;
mod split;
mod text_view;

use crate::tokenizer::Tokenizer;
use anyhow::Result;
use dayone_backend::{DType, HostTensor, QuantHost};
use std::path::{Path, PathBuf};

pub use self::compressed_tensors::packed_weight;
pub use self::gguf::{
    checkpoint_from_gguf, hf_tensor_name, open_gguf, permute_rows, unpermute_rows, GgufSource,
    SUPPORTED_ARCHITECTURES,
};
pub use self::gguf_blocks::{kept_format, repack};
pub use self::gguf_file::{GgmlType, GgufFile, GgufTensorInfo, MetaValue};
pub use self::gguf_quant::dequantize;
pub use self::hf_dir::{open_hf_dir, read_assets};
pub use self::safetensors::SafetensorsSource;
pub use self::split::Split;
pub use self::text_view::TextModelView;

/// Where a checkpoint's tensors come from. Names are Hugging Face names
/// (`model.layers.0.self_attn.q_proj.weight`), whatever the file format.
pub trait TensorSource: Send + Sync {
    /// Every tensor name available.
    fn names(&self) -> Vec<String>;
    /// Shape of a tensor, `None` when absent.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// Reads one tensor as F32, BF16 or F16 (quantized formats are dequantized to F32).
    /// Errors name the file and the tensor.
    fn load(&self, name: &str) -> Result<HostTensor>;
    /// Reads one rank's slice of a tensor ([`Split`]), as [`TensorSource::load`] would give it
    /// after slicing. Sources that can read only the slice (memory-mapped safetensors) do; the
    /// default reads the whole tensor and slices it.
    fn load_split(&self, name: &str, split: &Split) -> Result<HostTensor> {
        split.apply(&self.load(name)?)
    }
    /// The file or directory the tensors come from, for error messages.
    fn origin(&self) -> String;
    /// `name` in a block-quantized format kept on the device ([`QuantHost`], one item), or
    /// `None` when the source stores it otherwise (then [`TensorSource::load`] gives floats).
    /// GGUF answers for its Q4_0, Q4_1 and Q8_0 tensors (q/k rows already unpermuted).
    fn quant(&self, _name: &str) -> Result<Option<QuantHost>> {
        Ok(None)
    }
    /// The stored bytes of a tensor whatever its dtype (integer tensors holding packed codes,
    /// byte scales). Sources without integer tensors answer an error.
    fn load_raw(&self, name: &str) -> Result<RawTensor> {
        anyhow::bail!("{}: tensor {name} has no raw form", self.origin())
    }
    /// The float dtype `name` is stored in (`F32`, `BF16` or `F16`); `None` when absent or
    /// stored otherwise (block-quantized, FP8, integer codes). Sources that cannot tell answer
    /// `None`. Read by [`stored_float_dtype`].
    fn stored_dtype(&self, _name: &str) -> Option<DType> {
        None
    }
}

/// The float dtype a checkpoint's weights are stored in: of the tensors stored as `F32`,
/// `BF16` or `F16` ([`TensorSource::stored_dtype`]), the dtype holding the most elements, with
/// `BF16` and `F16` counted together against `F32` (a bf16 checkpoint with f32 norms or FP8
/// scales is a 16-bit checkpoint). `None` when no tensor is stored as a float (an all-quantized
/// file, or a source that cannot tell). This is what `--dtype auto` reads on WGSL.
pub fn stored_float_dtype(src: &dyn TensorSource) -> Option<DType> {
    let (mut f32s, mut bf16s, mut f16s) = (0u64, 0u64, 0u64);
    for n in src.names() {
        let Some(dt) = src.stored_dtype(&n) else {
            continue;
        };
        let numel = src
            .shape(&n)
            .map_or(0, |s| s.iter().product::<usize>() as u64);
        match dt {
            DType::F32 => f32s += numel,
            DType::BF16 => bf16s += numel,
            DType::F16 => f16s += numel,
            _ => {}
        }
    }
    if f32s + bf16s + f16s == 0 {
        None
    } else if bf16s + f16s <= f32s {
        Some(DType::F32)
    } else if f16s > bf16s {
        Some(DType::F16)
    } else {
        Some(DType::BF16)
    }
}

/// A tensor's stored bytes, for dtypes that [`HostTensor`] does not model.
#[derive(Clone, Debug)]
pub struct RawTensor {
    /// The stored dtype's name as the file spells it (`U8`, `I32`, `BF16`, …).
    pub dtype: String,
    /// Row-major dimensions.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub data: Vec<u8>,
}

/// Special-token and template facts a checkpoint carries beside its weights.
#[derive(Clone, Debug, Default)]
pub struct TokenizerAssets {
    /// The tokenizer, when the checkpoint has one (`tokenizer.json` or GGUF vocabulary).
    pub tokenizer: Option<Tokenizer>,
    /// Jinja chat template (`tokenizer_config.json`, `chat_template.jinja` or GGUF metadata).
    pub chat_template: Option<String>,
    /// Text of the BOS token, for templates that print it.
    pub bos_token: Option<String>,
    /// Text of the EOS token, for templates that print it.
    pub eos_token: Option<String>,
    /// BOS id; prepended to raw prompts when `add_bos` is set.
    pub bos_id: Option<u32>,
    /// Whether raw prompts start with BOS (GGUF `tokenizer.ggml.add_bos_token`, tokenizer post-processor).
    pub add_bos: bool,
    /// Token ids that end generation (`generation_config.json`, `config.json` or GGUF metadata).
    pub eos_ids: Vec<u32>,
}

/// An opened checkpoint: HF-style config, tensors and tokenizer assets.
pub struct Checkpoint {
    /// The directory or file opened.
    pub path: PathBuf,
    /// Contents of `config.json` (for GGUF, a config synthesised from its metadata with HF field names).
    pub config: serde_json::Value,
    /// The weights.
    pub tensors: Box<dyn TensorSource>,
    /// Tokenizer, chat template and special ids.
    pub assets: TokenizerAssets,
}

/// The layer indices `i ≥ layers` of tensors named `model.layers.{i}.…`, ascending and
/// distinct: weights of layers the config does not count, which the model will not load.
pub fn layers_beyond(names: &[String], layers: usize) -> Vec<usize> {
    let mut out: Vec<usize> = names
        .iter()
        .filter_map(|n| {
            n.strip_prefix("model.layers.")?
                .split('.')
                .next()?
                .parse()
                .ok()
        })
        .filter(|&i| i >= layers)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Logs a warning when the checkpoint holds tensors of layers beyond the `layers` the config
/// declares (e.g. `num_hidden_layers` lowered by hand): they are ignored, not an error.
pub fn warn_layers_beyond(tensors: &dyn TensorSource, layers: usize) {
    let extra = layers_beyond(&tensors.names(), layers);
    let which = match extra.as_slice() {
        [] => return,
        [one] => format!("layer {one}"),
        [first, .., last] => format!("layers {first}..={last}"),
    };
    tracing::warn!(
        "{}: holds tensors of {which} but config.json declares {layers} layers; those tensors are ignored",
        tensors.origin()
    );
}

/// Opens a checkpoint: a directory with `config.json` and `*.safetensors`
/// (or `model.safetensors.index.json` shards), or a `.gguf` file.
///
/// Errors: a missing path, a directory without `config.json` or weights, a corrupt file; each
/// message names the file and what was expected.
pub fn open(path: &Path) -> Result<Checkpoint> {
    if !path.exists() {
        anyhow::bail!("model path {} does not exist", path.display());
    }
    if path.is_file() {
        return open_gguf(path);
    }
    hf_dir::open_hf_dir(path)
}

#[cfg(test)]
mod tests {
    use super::{layers_beyond, stored_float_dtype, TensorSource};
    use anyhow::Result;
    use dayone_backend::{DType, HostTensor};

    #[test]
    fn layers_beyond_the_config_are_found() {
        let names: Vec<String> = [
            "model.embed_tokens.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.1.mlp.up_proj.weight",
            "model.layers.3.mlp.up_proj.weight",
            "model.layers.3.self_attn.q_proj.weight",
            "model.layers.10.input_layernorm.weight",
            "model.layers.x.odd",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(layers_beyond(&names, 2), vec![3, 10]);
        assert!(layers_beyond(&names, 11).is_empty());
    }

    /// Tensors `(name, elements, stored float dtype or None for a quantized one)`.
    struct Stored(Vec<(&'static str, usize, Option<DType>)>);

    impl TensorSource for Stored {
        fn names(&self) -> Vec<String> {
            self.0.iter().map(|t| t.0.to_string()).collect()
        }
        fn shape(&self, name: &str) -> Option<Vec<usize>> {
            self.0.iter().find(|t| t.0 == name).map(|t| vec![t.1])
        }
        fn load(&self, name: &str) -> Result<HostTensor> {
            anyhow::bail!("{name}: not loadable")
        }
        fn origin(&self) -> String {
            "test".into()
        }
        fn stored_dtype(&self, name: &str) -> Option<DType> {
            self.0.iter().find(|t| t.0 == name).and_then(|t| t.2)
        }
    }

    #[test]
    fn stored_float_dtype_is_the_one_holding_most_float_elements() {
        use DType::*;
        let of = |t: Vec<(&'static str, usize, Option<DType>)>| stored_float_dtype(&Stored(t));
        // bf16 weights with f32 norms: a bf16 checkpoint.
        assert_eq!(
            of(vec![("w", 64, Some(BF16)), ("n", 8, Some(F32))]),
            Some(BF16)
        );
        assert_eq!(
            of(vec![("w", 64, Some(F16)), ("n", 8, Some(F32))]),
            Some(F16)
        );
        // f32 weights with a few bf16 tensors; a tie stays f32.
        assert_eq!(
            of(vec![("w", 64, Some(F32)), ("b", 8, Some(BF16))]),
            Some(F32)
        );
        assert_eq!(
            of(vec![("w", 8, Some(F32)), ("b", 8, Some(BF16))]),
            Some(F32)
        );
        // bf16 and f16 together outweigh f32; the larger of the two names it.
        assert_eq!(
            of(vec![
                ("a", 5, Some(BF16)),
                ("b", 6, Some(F16)),
                ("c", 8, Some(F32))
            ]),
            Some(F16)
        );
        // Quantized tensors do not count: a Q4 file with f32 norms is an f32 checkpoint.
        assert_eq!(of(vec![("q", 4096, None), ("n", 8, Some(F32))]), Some(F32));
        assert_eq!(of(vec![("q", 4096, None)]), None);
    }
}
