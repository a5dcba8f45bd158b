//! safetensors files, single or sharded, memory-mapped.
//!
//! A [`SafetensorsSource`] maps every file once, parses each header, and copies a tensor's
//! bytes out of the map only when [`TensorSource::load`] asks for it.

use super::TensorSource;
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
                anyhow::anyhow!(
                    "{}: not a valid safetensors file ({e}); the file may be truncated or corrupt",
                    path.display()
                )
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
            Dtype::F8_E4M3 => bail!(
                "{}: tensor {name} is F8_E4M3 (FP8); FP8 checkpoints are not supported yet",
                path.display()
            ),
            other => bail!(
                "{}: tensor {name} has dtype {other:?}; expected F32, BF16 or F16",
                path.display()
            ),
        };
        let bytes = &self.files[e.file].map[e.start..e.end];
        HostTensor::new(e.shape.clone(), dtype, bytes.to_vec())
            .with_context(|| format!("{}: tensor {name}", path.display()))
    }

    fn origin(&self) -> String {
        self.origin.clone()
    }
}
