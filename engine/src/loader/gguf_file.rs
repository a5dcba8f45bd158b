//! The GGUF container (versions 2 and 3): header, metadata key/values, tensor infos and the
//! aligned data section. Parsing checks every length and offset against the buffer, so a
//! truncated or corrupt file gives an error, never a panic or a huge allocation.

use anyhow::{anyhow, bail, Context, Result};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `GGUF` read as a little-endian u32.
const MAGIC: u32 = 0x4655_4747;
/// Nesting limit for array-of-array metadata values.
const MAX_DEPTH: usize = 4;
/// ggml's limit on tensor dimensions.
const MAX_DIMS: usize = 4;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8 (UTF-8; invalid sequences are replaced).
    String(String),
    /// GGUF type 9: values of one type.
    Array(Vec<MetaValue>),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 12.
    F64(f64),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (floats and integers).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }
}

/// ggml tensor element types (the numbering of `ggml.h`; variant names follow ggml's).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// Blocks of 32: f16 scale + 16 bytes of 4-bit values, `(q - 8) * d`.
    Q4_0,
    /// Blocks of 32: f16 scale, f16 min + 16 bytes of 4-bit values, `q * d + m`.
    Q4_1,
    /// Blocks of 32: f16 scale + 32 signed bytes.
    Q8_0,
    /// bfloat16.
    BF16,
    /// Blocks of 32: f16 scale, 32 high bits + 16 bytes of low nibbles, `(q - 16) * d`.
    Q5_0,
    /// Blocks of 32: f16 scale, f16 min, 32 high bits + 16 bytes of low nibbles, `q * d + m`.
    Q5_1,
    /// K-quant, super-blocks of 256 with 2-bit values.
    Q2_K,
    /// K-quant, super-blocks of 256 with 3-bit values.
    Q3_K,
    /// K-quant, super-blocks of 256 with 4-bit values and 6-bit scales/mins.
    Q4_K,
    /// K-quant, super-blocks of 256 with 5-bit values and 6-bit scales/mins.
    Q5_K,
    /// K-quant, super-blocks of 256 with 6-bit values and 8-bit scales.
    Q6_K,
    /// Any other ggml type, by number (not loadable yet).
    Other(u32),
}

impl GgmlType {
    /// From the numeric type id of a tensor info.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            30 => GgmlType::BF16,
            other => GgmlType::Other(other),
        }
    }

    /// The numeric type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::BF16 => 30,
            GgmlType::Other(i) => i,
        }
    }

    /// ggml's name of the type (`q4_1`, …).
    pub fn name(self) -> String {
        let known = [
            "f32",
            "f16",
            "q4_0",
            "q4_1",
            "q4_2",
            "q4_3",
            "q5_0",
            "q5_1",
            "q8_0",
            "q8_1",
            "q2_K",
            "q3_K",
            "q4_K",
            "q5_K",
            "q6_K",
            "q8_K",
            "iq2_xxs",
            "iq2_xs",
            "iq3_xxs",
            "iq1_s",
            "iq4_nl",
            "iq3_s",
            "iq2_s",
            "iq4_xs",
            "i8",
            "i16",
            "i32",
            "i64",
            "f64",
            "iq1_m",
            "bf16",
            "q4_0_4_4",
            "q4_0_4_8",
            "q4_0_8_8",
            "tq1_0",
            "tq2_0",
            "iq4_nl_4_4",
            "iq4_nl_4_8",
            "iq4_nl_8_8",
            "mxfp4",
        ];
        match known.get(self.id() as usize) {
            Some(n) => n.to_string(),
            None => format!("type {}", self.id()),
        }
    }

    /// (elements per block, bytes per block) for the loadable types.
    pub fn block(self) -> Option<(usize, usize)> {
        match self {
            GgmlType::Other(_) => None,
            known => known.storage_block(),
        }
    }

    /// (elements per block, bytes per block) of every ggml type whose layout is known, loadable
    /// or not, so that the data of any tensor can be bounds-checked.
    pub fn storage_block(self) -> Option<(usize, usize)> {
        Some(match self.id() {
            0 => (1, 4),
            1 | 30 => (1, 2),
            2 => (32, 18),
            3 => (32, 20),
            6 => (32, 22),
            7 => (32, 24),
            8 => (32, 34),
            9 => (32, 36),
            10 => (256, 84),
            11 => (256, 110),
            12 => (256, 144),
            13 => (256, 176),
            14 => (256, 210),
            15 => (256, 292),
            16 => (256, 66),
            17 => (256, 74),
            18 => (256, 98),
            19 => (256, 50),
            20 => (32, 18),
            21 => (256, 110),
            22 => (256, 82),
            23 => (256, 136),
            24 => (1, 1),
            25 => (1, 2),
            26 => (1, 4),
            27 | 28 => (1, 8),
            29 => (256, 56),
            34 => (256, 54),
            35 => (256, 66),
            39 => (32, 17),
            _ => return None,
        })
    }
}

/// One tensor's entry in the GGUF header.
#[derive(Clone, Debug)]
pub struct GgufTensorInfo {
    /// The GGUF (llama.cpp) name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions as stored: innermost (contiguous) first.
    pub dims: Vec<usize>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: usize,
    /// Byte length of the data (0 for the few types whose layout is unknown here).
    pub nbytes: usize,
}

impl GgufTensorInfo {
    /// Row-major shape, outermost first (the dims reversed).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file. The bytes are memory-mapped.
pub struct GgufFile {
    /// The file, for error messages.
    pub path: PathBuf,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata key/values.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensor infos in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// `general.alignment` (32 when absent).
    pub alignment: usize,
    /// Absolute offset of the data section.
    pub data_start: usize,
    bytes: Bytes,
}

/// The storage behind a [`GgufFile`].
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A bounds-checked little-endian reader.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                anyhow!(
                    "truncated: {what} needs {n} bytes at offset {}, file has {}",
                    self.pos,
                    self.buf.len()
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A length that must fit in the remaining bytes when each item takes `min_item` bytes.
    fn count(&mut self, what: &str, min_item: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|&n| {
            n.checked_mul(min_item.max(1))
                .is_some_and(|b| b <= self.remaining())
        });
        fits.ok_or_else(|| {
            anyhow!(
                "{what} at offset {at} is {n}, more than the {} bytes left in the file",
                self.remaining()
            )
        })
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let b = self.take(n, what)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    fn value(&mut self, ty: u32, what: &str, depth: usize) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.arr::<1>(what)?[0]),
            1 => MetaValue::I8(self.arr::<1>(what)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => MetaValue::U32(self.u32(what)?),
            5 => MetaValue::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => MetaValue::Bool(self.arr::<1>(what)?[0] != 0),
            8 => MetaValue::String(self.string(what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    bail!("{what}: arrays nested deeper than {MAX_DEPTH}");
                }
                let at = self.pos;
                let ety = self.u32(what)?;
                let min_item = match ety {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => bail!("{what}: unknown array element type {other} at offset {at}"),
                };
                let n = self.count(what, min_item)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(ety, what, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(self.u64(what)?),
            11 => MetaValue::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.arr(what)?)),
            other => bail!("{what}: unknown metadata value type {other}"),
        })
    }
}

impl GgufFile {
    /// Memory-maps and parses a GGUF file. Errors name the file.
    pub fn open(path: &Path) -> Result<Self> {
        let map = super::safetensors::map_file(path)?;
        Self::parse(path, Bytes::Mapped(map))
    }

    /// Parses GGUF bytes held in memory; `path` is only used in messages.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self> {
        Self::parse(path, Bytes::Owned(bytes))
    }

    fn parse(path: &Path, bytes: Bytes) -> Result<Self> {
        let parsed = parse_layout(bytes.as_slice()).with_context(|| {
            format!(
                "{}: not a valid GGUF file (truncated or corrupt)",
                path.display()
            )
        })?;
        let (version, metadata, tensors, alignment, data_start) = parsed;
        Ok(Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            alignment,
            data_start,
            bytes,
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// The info of a tensor by GGUF name.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor (bounds were checked when the file was opened).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        let start = self.data_start + info.offset;
        &self.bytes.as_slice()[start..start + info.nbytes]
    }
}

type Layout = (
    u32,
    BTreeMap<String, MetaValue>,
    Vec<GgufTensorInfo>,
    usize,
    usize,
);

fn parse_layout(buf: &[u8]) -> Result<Layout> {
    let mut r = Reader { buf, pos: 0 };
    let magic = r.u32("magic")?;
    if magic != MAGIC {
        bail!("bad magic {magic:#010x} (expected the bytes `GGUF`)");
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        bail!("GGUF version {version} is not supported (expected 2 or 3)");
    }
    // A tensor info takes at least 8 (name) + 4 + 4 + 8 bytes, a key/value at least 8 + 4 + 1.
    let n_tensors = r.count("tensor count", 24)?;
    let n_kv = r.count("metadata count", 13)?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.string(&format!("metadata key #{i}"))?;
        let what = format!("metadata `{key}`");
        let ty = r.u32(&what)?;
        let v = r.value(ty, &what, 0)?;
        metadata.insert(key, v);
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
            _ => bail!("general.alignment is {v:?}; expected a power of two"),
        },
    };
    let mut tensors = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = r.string(&format!("tensor #{i} name"))?;
        let what = format!("tensor `{name}` info");
        let n_dims = r.u32(&what)? as usize;
        if n_dims > MAX_DIMS {
            bail!("tensor `{name}` has {n_dims} dimensions (at most {MAX_DIMS})");
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = r.u64(&what)?;
            dims.push(
                usize::try_from(d)
                    .map_err(|_| anyhow!("tensor `{name}`: dimension {d} too large"))?,
            );
        }
        let ggml_type = GgmlType::from_id(r.u32(&what)?);
        let offset = r.u64(&what)?;
        let offset = usize::try_from(offset)
            .map_err(|_| anyhow!("tensor `{name}`: offset {offset} too large"))?;
        let numel = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| anyhow!("tensor `{name}`: element count overflows"))?;
        let nbytes = match ggml_type.storage_block() {
            Some((per, bytes)) => {
                let inner = dims.first().copied().unwrap_or(1);
                if !inner.is_multiple_of(per) {
                    bail!(
                        "tensor `{name}` ({}): inner dimension {inner} is not a multiple of the block size {per}",
                        ggml_type.name()
                    );
                }
                (numel / per)
                    .checked_mul(bytes)
                    .ok_or_else(|| anyhow!("tensor `{name}`: byte size overflows"))?
            }
            None => 0,
        };
        tensors.push(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            nbytes,
        });
    }
    let data_start = r.pos.div_ceil(alignment) * alignment;
    for t in &tensors {
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.nbytes));
        match end {
            Some(e) if e <= buf.len() => {}
            _ => bail!(
                "tensor `{}` data ({} bytes at data offset {}) runs past the end of the file ({} bytes; data starts at {data_start})",
                t.name,
                t.nbytes,
                t.offset,
                buf.len()
            ),
        }
    }
    Ok((version, metadata, tensors, alignment, data_start))
}
