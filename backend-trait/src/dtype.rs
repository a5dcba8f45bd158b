//! Element types and host-side tensors.

use anyhow::{bail, Result};

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE-754 binary32.
    F32,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// IEEE-754 binary16.
    F16,
    /// Unsigned 32-bit integer (token ids, positions, slots, block ids).
    U32,
    /// Signed 32-bit integer.
    I32,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    /// Parses the names used on the command line and in safetensors headers
    /// (`f32`, `bf16`, `f16`, `u32`, `i32`; case-insensitive; `F32`, `BF16`, … also accepted).
    pub fn parse(s: &str) -> Result<DType> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => DType::F32,
            "bf16" | "bfloat16" => DType::BF16,
            "f16" | "float16" => DType::F16,
            "u32" | "uint32" => DType::U32,
            "i32" | "int32" => DType::I32,
            other => bail!("unknown dtype '{other}': expected one of f32, bf16, f16, u32, i32"),
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::U32 => "u32",
            DType::I32 => "i32",
        };
        f.write_str(s)
    }
}

/// A tensor in host memory: raw little-endian bytes, a row-major shape and a dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Row-major dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Element type of `data`.
    pub dtype: DType,
    /// `shape.iter().product() * dtype.size()` bytes.
    pub data: Vec<u8>,
}

impl HostTensor {
    /// Builds a tensor, checking that `data` holds exactly `shape` elements of `dtype`.
    pub fn new(shape: Vec<usize>, dtype: DType, data: Vec<u8>) -> Result<Self> {
        let want = shape.iter().product::<usize>() * dtype.size();
        if data.len() != want {
            bail!(
                "host tensor of shape {shape:?} {dtype} needs {want} bytes, got {}",
                data.len()
            );
        }
        Ok(Self { shape, dtype, data })
    }

    /// An f32 tensor from values.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Result<Self> {
        Self::new(shape, DType::F32, bytemuck::cast_slice(values).to_vec())
    }

    /// A u32 tensor from values.
    pub fn from_u32(shape: Vec<usize>, values: &[u32]) -> Result<Self> {
        Self::new(shape, DType::U32, bytemuck::cast_slice(values).to_vec())
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Converts f32 values to `dtype` (f32, bf16 or f16; round to nearest even).
    pub fn from_f32_as(shape: Vec<usize>, values: &[f32], dtype: DType) -> Result<Self> {
        let data: Vec<u8> = match dtype {
            DType::F32 => bytemuck::cast_slice(values).to_vec(),
            DType::BF16 => {
                let v: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
                bytemuck::cast_slice(&v).to_vec()
            }
            DType::F16 => {
                let v: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
                bytemuck::cast_slice(&v).to_vec()
            }
            other => bail!("cannot convert f32 values to {other}"),
        };
        Self::new(shape, dtype, data)
    }

    /// Values widened to f32 (float dtypes) or converted from integers.
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            DType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(&self.data),
            DType::BF16 => bytemuck::pod_collect_to_vec::<u8, half::bf16>(&self.data)
                .into_iter()
                .map(f32::from)
                .collect(),
            DType::F16 => bytemuck::pod_collect_to_vec::<u8, half::f16>(&self.data)
                .into_iter()
                .map(f32::from)
                .collect(),
            DType::U32 => bytemuck::pod_collect_to_vec::<u8, u32>(&self.data)
                .into_iter()
                .map(|x| x as f32)
                .collect(),
            DType::I32 => bytemuck::pod_collect_to_vec::<u8, i32>(&self.data)
                .into_iter()
                .map(|x| x as f32)
                .collect(),
        }
    }

    /// The values widened to f32 like [`HostTensor::to_f32`], borrowed without a copy when the
    /// tensor is f32 (and its bytes are 4-byte aligned, as the allocator gives them).
    pub fn f32_values(&self) -> std::borrow::Cow<'_, [f32]> {
        if self.dtype == DType::F32 {
            if let Ok(v) = bytemuck::try_cast_slice::<u8, f32>(&self.data) {
                return std::borrow::Cow::Borrowed(v);
            }
        }
        std::borrow::Cow::Owned(self.to_f32())
    }

    /// Updates the values in place through `f` (given all `numel` values as f32). An f32 tensor
    /// with aligned bytes is changed where it lies, without a copy; otherwise the values are
    /// decoded, updated and stored back as `out_dtype` (f32, bf16 or f16). `f` should check its
    /// input before writing: what it wrote before an error stays written.
    pub fn update_f32<R>(
        &mut self,
        out_dtype: DType,
        f: impl FnOnce(&mut [f32]) -> Result<R>,
    ) -> Result<R> {
        if self.dtype == DType::F32 {
            if let Ok(v) = bytemuck::try_cast_slice_mut::<u8, f32>(&mut self.data) {
                return f(v);
            }
        }
        let mut v = self.to_f32();
        let r = f(&mut v)?;
        *self = Self::from_f32_as(self.shape.clone(), &v, out_dtype)?;
        Ok(r)
    }

    /// Values as u32 (only for `U32`/`I32` tensors; i32 reinterpreted).
    pub fn to_u32(&self) -> Result<Vec<u32>> {
        match self.dtype {
            DType::U32 | DType::I32 => Ok(bytemuck::pod_collect_to_vec::<u8, u32>(&self.data)),
            other => bail!("expected a u32 tensor, got {other}"),
        }
    }
}
