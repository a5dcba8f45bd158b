//! safetensors files, single or sharded, memory-mapped.
//!
//! A [`SafetensorsSource`] maps every file once, parses each header, and copies a tensor's
//! bytes out of the map only when [`TensorSource::load`] asks for it.

use super::{Split, TensorSource};
use anyhow::{bail, Context, Result};
use dayone_backend::{DType, HostTensor};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where one tensor lives inside one mapped file.
#[derive(Clone, Debug)]
struct Entry {
    /// Index into [`SafetensorsSource::files`].
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range inside the file.
    start: usize,
    end: usize,
}

/// One memory-mapped safetensors file.
struct MappedFile {
    path: PathBuf,
    map: Mmap,
}

/// Tensors from one or more safetensors files (a single `model.safetensors`, every
/// `*.safetensors` of a directory, or the shards of `model.safetensors.index.json`).
pub struct SafetensorsSource {
    origin: String,
    files: Vec<MappedFile>,
    entries: BTreeMap<String, Entry>,
    /// `quantization_config.weight_block_size` of FP8 block-scale checkpoints (`[rows, cols]`).
    fp8_block: Option<[usize; 2]>,
}

impl std::fmt::Debug for SafetensorsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsSource")
            .field("origin", &self.origin)
            .field(
                "files",
                &self.files.iter().map(|m| &m.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.entries.len())
            .finish()
    }
}

/// Whether `file` names something inside a directory: non-empty, relative, and made only of
/// plain components (no `..`, no root, no drive prefix).
fn is_plain_relative(file: &str) -> bool {
    let p = Path::new(file);
    !file.is_empty()
        && p.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        })
        && p.components()
            .any(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Maps a file read-only. Errors name the file.
pub(crate) fn map_file(path: &Path) -> Result<Mmap> {
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    // SAFETY: the map is read-only; checkpoints are not expected to change while loaded.
    // A file truncated by another process while mapped would fault, as with any mmap reader.
    let map = unsafe { Mmap::map(&file) }
        .with_context(|| format!("{}: cannot memory-map", path.display()))?;
    Ok(map)
}

impl SafetensorsSource {
    /// Opens the weights of a checkpoint directory: the shards listed in
    /// `model.safetensors.index.json` if present, else `model.safetensors`, else every
    /// `*.safetensors` file in the directory (sorted by name).
    ///
    /// Errors when the directory holds no safetensors file, or a file is missing or corrupt.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        if index.is_file() {
            return Self::open_index(&index);
        }
        let single = dir.join("model.safetensors");
        if single.is_file() {
            return Self::open_files(&[single], dir.display().to_string());
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("{}: cannot list directory", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            bail!(
                "{}: no weights (expected model.safetensors, model.safetensors.index.json or *.safetensors)",
                dir.display()
            );
        }
        Self::open_files(&files, dir.display().to_string())
    }

    /// Opens the shards listed in a `model.safetensors.index.json` (its `weight_map` maps
    /// tensor names to file names relative to the index's directory). Every tensor named in
    /// the map must be present in the file it points to.
    pub fn open_index(index: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(index)
            .with_context(|| format!("{}: cannot read", index.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: invalid JSON", index.display()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .with_context(|| {
                format!(
                    "{}: expected an object field `weight_map` (tensor name → file)",
                    index.display()
                )
            })?;
        let dir = index.parent().unwrap_or_else(|| Path::new("."));
        let mut shard_names: Vec<String> = Vec::new();
        let mut wanted: Vec<(String, String)> = Vec::new();
        for (name, file) in map {
            let file = file.as_str().with_context(|| {
                format!(
                    "{}: weight_map[\"{name}\"] should be a file name string",
                    index.display()
                )
            })?;
            if !is_plain_relative(file) {
                bail!(
                    "{}: weight_map[\"{name}\"] is \"{file}\"; expected a file inside the model directory \
                     (a relative path without `..`)",
                    index.display()
                );
            }
            if !shard_names.iter().any(|s| s == file) {
                shard_names.push(file.to_string());
            }
            wanted.push((name.clone(), file.to_string()));
        }
        shard_names.sort();
        let paths: Vec<PathBuf> = shard_names.iter().map(|s| dir.join(s)).collect();
        for p in &paths {
            if !p.is_file() {
                bail!(
                    "{}: shard {} listed in weight_map is missing",
                    index.display(),
                    p.display()
                );
            }
        }
        let src = Self::open_files(&paths, dir.display().to_string())?;
        for (name, file) in wanted {
            match src.entries.get(&name) {
                Some(e) if src.files[e.file].path == dir.join(&file) => {}
                Some(e) => bail!(
                    "{}: weight_map puts {name} in {file}, but it is in {}",
                    index.display(),
                    src.files[e.file].path.display()
                ),
                None => bail!(
                    "{}: weight_map lists {name} in {file}, but that file has no such tensor",
                    index.display()
                ),
            }
        }
        Ok(src)
    }

    /// Opens the given safetensors files as one source. `origin` names the source in errors.
    /// A tensor name present in two files is an error.
    pub fn open_files(paths: &[PathBuf], origin: String) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut entries = BTreeMap::new();
        for (fi, path) in paths.iter().enumerate() {
            let map = map_file(path)?;
            let (header_len, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
                match header_mismatch(&map) {
                    Some(which) => anyhow::anyhow!(
                        "{}: not a valid safetensors file ({e}): {which}",
                        path.display()
                    ),
                    None => anyhow::anyhow!(
                        "{}: not a valid safetensors file ({e}); the file may be truncated or corrupt",
                        path.display()
                    ),
                }
            })?;
            let data_start = 8 + header_len;
            for (name, info) in meta.tensors() {
                let (a, b) = info.data_offsets;
                let (start, end) = (data_start + a, data_start + b);
                if end > map.len() || start > end {
                    bail!("{}: tensor {name} lies outside the file", path.display());
                }
                let entry = Entry {
                    file: fi,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start,
                    end,
                };
                if let Some(prev) = entries.insert(name.clone(), entry) {
                    bail!(
                        "tensor {name} appears in both {} and {}",
                        paths[prev.file].display(),
                        path.display()
                    );
                }
            }
            files.push(MappedFile {
                path: path.clone(),
                map,
            });
        }
        Ok(Self {
            origin,
            files,
            entries,
            fp8_block: None,
        })
    }

    /// The safetensors dtype of a tensor (e.g. `F8_E4M3`), `None` when absent.
    pub fn raw_dtype(&self, name: &str) -> Option<Dtype> {
        self.entries.get(name).map(|e| e.dtype)
    }

    /// The raw little-endian bytes of a tensor, whatever its dtype, borrowed from the map.
    pub fn raw_bytes(&self, name: &str) -> Result<&[u8]> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("{}: no tensor named {name}", self.origin))?;
        Ok(&self.files[e.file].map[e.start..e.end])
    }

    /// The file holding a tensor, `None` when absent.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        self.entries
            .get(name)
            .map(|e| self.files[e.file].path.as_path())
    }

    /// Tensor count per file, for diagnostics.
    pub fn file_summary(&self) -> HashMap<PathBuf, usize> {
        let mut out = HashMap::new();
        for e in self.entries.values() {
            *out.entry(self.files[e.file].path.clone()).or_insert(0) += 1;
        }
        out
    }
}

/// Which tensor of a safetensors header (`map`: the whole file) has a shape that does not fill
/// its byte range (`shape` × the dtype's width ≠ `data_offsets[1] − data_offsets[0]`), for the
/// error when the safetensors crate refuses the header without naming the tensor. `None` when
/// the header cannot be read as JSON or no such tensor is found.
fn header_mismatch(map: &[u8]) -> Option<String> {
    let n = u64::from_le_bytes(map.get(..8)?.try_into().ok()?) as usize;
    let header: serde_json::Value =
        serde_json::from_slice(map.get(8..8usize.checked_add(n)?)?).ok()?;
    for (name, t) in header.as_object()? {
        if name == "__metadata__" {
            continue;
        }
        let dtype = t["dtype"].as_str()?;
        let bits: u128 = match dtype {
            "F4" => 4,
            "F6_E2M3" | "F6_E3M2" => 6,
            "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" | "F8_E4M3FNUZ"
            | "F8_E5M2FNUZ" => 8,
            "F16" | "BF16" | "I16" | "U16" => 16,
            "F32" | "I32" | "U32" => 32,
            "F64" | "I64" | "U64" | "C64" => 64,
            // Not a width this check knows: the crate's own message stands for it.
            _ => continue,
        };
        let shape: Option<Vec<u128>> = t["shape"]
            .as_array()?
            .iter()
            .map(|d| d.as_u64().map(u128::from))
            .collect();
        let offsets = t["data_offsets"].as_array()?;
        let (a, b) = (offsets.first()?.as_u64()?, offsets.get(1)?.as_u64()?);
        let Some(shape) = shape else {
            return Some(format!(
                "tensor {name}: shape {} is not a list of sizes",
                t["shape"]
            ));
        };
        let Some(need) = shape
            .iter()
            .try_fold(1u128, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(bits))
        else {
            return Some(format!(
                "tensor {name}: shape {shape:?} has too many elements"
            ));
        };
        let have = u128::from(b.saturating_sub(a)) * 8;
        if need % 8 != 0 {
            return Some(format!(
                "tensor {name}: shape {shape:?} of {dtype} is not a whole number of bytes"
            ));
        }
        if b < a || need != have {
            return Some(format!(
                "tensor {name}: shape {shape:?} of {dtype} needs {} bytes, but its data_offsets [{a}, {b}] hold {}",
                need.div_ceil(8),
                b.saturating_sub(a)
            ));
        }
    }
    None
}

impl SafetensorsSource {
    /// Declares the FP8 block size (`quantization_config.weight_block_size`, `[rows, cols]`), so
    /// that e4m3 weights with a `*_scale_inv` tensor load dequantized.
    pub fn with_fp8_block(mut self, block: Option<[usize; 2]>) -> Self {
        self.fp8_block = block;
        self
    }

    /// An e4m3 weight `[out, in]` with its `{name}_scale_inv` `[⌈out/b0⌉, ⌈in/b1⌉]` f32 scales,
    /// dequantized to f32: `W[i, j] = fp8(q[i, j]) · scale_inv[i / b0, j / b1]` (DeepSeek-V3 FP8
    /// checkpoints; DeepSeek-V3 report §3.3).
    fn load_fp8(&self, name: &str, e: &Entry) -> Result<HostTensor> {
        let path = &self.files[e.file].path;
        let scale_name = format!("{name}_scale_inv");
        let Some(block) = self.fp8_block else {
            bail!(
                "{}: tensor {name} is F8_E4M3 but config.json has no quantization_config.weight_block_size",
                path.display()
            );
        };
        let Some(se) = self.entries.get(&scale_name) else {
            bail!("{}: FP8 tensor {name} has no {scale_name}", path.display());
        };
        if e.shape.len() != 2 {
            bail!(
                "{}: FP8 tensor {name} must be 2-D, got {:?}",
                path.display(),
                e.shape
            );
        }
        let (rows, cols) = (e.shape[0], e.shape[1]);
        let want = [rows.div_ceil(block[0]), cols.div_ceil(block[1])];
        if se.shape != want || se.dtype != Dtype::F32 {
            bail!(
                "{}: {scale_name} must be F32 {want:?} for {name} {:?} with blocks {block:?}, got {:?} {:?}",
                path.display(),
                e.shape,
                se.dtype,
                se.shape
            );
        }
        let q = &self.files[e.file].map[e.start..e.end];
        let sb = &self.files[se.file].map[se.start..se.end];
        let scales: Vec<f32> = bytemuck::pod_collect_to_vec::<u8, f32>(sb);
        let mut out = vec![0f32; rows * cols];
        for i in 0..rows {
            for j in 0..cols {
                out[i * cols + j] =
                    e4m3_to_f32(q[i * cols + j]) * scales[(i / block[0]) * want[1] + j / block[1]];
            }
        }
        HostTensor::from_f32(e.shape.clone(), &out)
    }
}

/// OCP FP8 E4M3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities,
/// `S.1111.111` is NaN) to f32.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0x0f) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * mag
}

impl TensorSource for SafetensorsSource {
    fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.entries.get(name).map(|e| e.shape.clone())
    }

    fn load(&self, name: &str) -> Result<HostTensor> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("{}: no tensor named {name}", self.origin))?;
        let path = &self.files[e.file].path;
        let dtype = match e.dtype {
            Dtype::F32 => DType::F32,
            Dtype::BF16 => DType::BF16,
            Dtype::F16 => DType::F16,
            Dtype::F8_E4M3 => return self.load_fp8(name, e),
            other => bail!(
                "{}: tensor {name} has dtype {other:?}; expected F32, BF16 or F16",
                path.display()
            ),
        };
        let bytes = &self.files[e.file].map[e.start..e.end];
        HostTensor::new(
            e.shape.clone(),
            dtype,
            dayone_backend::host_copy::parallel_to_vec(bytes),
        )
        .with_context(|| format!("{}: tensor {name}", path.display()))
    }

    fn load_split(&self, name: &str, split: &Split) -> Result<HostTensor> {
        let Some(e) = self.entries.get(name) else {
            bail!("{}: no tensor named {name}", self.origin);
        };
        let dtype = match e.dtype {
            Dtype::F32 => DType::F32,
            Dtype::BF16 => DType::BF16,
            Dtype::F16 => DType::F16,
            // Block-scaled FP8 is dequantised whole, then sliced.
            _ => return split.apply(&self.load(name)?),
        };
        // Only the slice's bytes are read from the map (each rank touches its own pages).
        let path = &self.files[e.file].path;
        let bytes = &self.files[e.file].map[e.start..e.end];
        let ranges = split
            .byte_ranges(&e.shape, dtype.size())
            .with_context(|| format!("{}: tensor {name}", path.display()))?;
        let mut data = Vec::with_capacity(ranges.iter().map(|r| r.1).sum());
        for (s, n) in ranges {
            data.extend_from_slice(&bytes[s..s + n]);
        }
        HostTensor::new(split.shape(&e.shape)?, dtype, data)
            .with_context(|| format!("{}: tensor {name}", path.display()))
    }

    fn origin(&self) -> String {
        self.origin.clone()
    }

    fn stored_dtype(&self, name: &str) -> Option<DType> {
        match self.entries.get(name)?.dtype {
            Dtype::F32 => Some(DType::F32),
            Dtype::BF16 => Some(DType::BF16),
            Dtype::F16 => Some(DType::F16),
            _ => None,
        }
    }

    fn load_raw(&self, name: &str) -> Result<super::RawTensor> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("{}: no tensor named {name}", self.origin))?;
        Ok(super::RawTensor {
            dtype: format!("{:?}", e.dtype),
            shape: e.shape.clone(),
            data: self.files[e.file].map[e.start..e.end].to_vec(),
        })
    }
}

#[cfg(test)]
mod fp8_tests {
    use super::e4m3_to_f32;

    #[test]
    fn e4m3_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exponent 7, mantissa 0
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // largest normal: 1.75 · 2^8
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert!(e4m3_to_f32(0x7f).is_nan());
    }
}

#[cfg(test)]
mod index_tests {
    use super::*;

    #[test]
    fn shard_names_must_stay_inside_the_directory() {
        for bad in [
            "../../etc/passwd",
            "/etc/passwd",
            "a/../../b.safetensors",
            "",
            ".",
            "..",
        ] {
            assert!(!is_plain_relative(bad), "{bad}");
        }
        for good in [
            "model-00001-of-00002.safetensors",
            "shards/a.safetensors",
            "./a.safetensors",
        ] {
            assert!(is_plain_relative(good), "{good}");
        }
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("model.safetensors.index.json");
        std::fs::write(
            &index,
            r#"{"weight_map": {"model.embed_tokens.weight": "../../etc/passwd"}}"#,
        )
        .unwrap();
        let e = SafetensorsSource::open_index(&index)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("weight_map[\"model.embed_tokens.weight\"] is \"../../etc/passwd\""),
            "{e}"
        );
        assert!(
            e.contains("expected a file inside the model directory"),
            "{e}"
        );
    }
}
