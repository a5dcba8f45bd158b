//! Rows of device tensors kept in host memory (the host-memory tier of the KV cache): one
//! [`HostRow`] per row, in memory the backend copies to and from its device fastest — on CUDA
//! page-locked host memory mapped into the device's address space, which kernels read and write
//! directly (no staging copy); elsewhere an ordinary `Vec`.

use crate::DType;

/// Host bytes a backend allocated for [`crate::Backend::rows_to_host`]: the CUDA backend's
/// page-locked chunks implement it.
pub trait HostMem: Send + Sync + std::fmt::Debug {
    /// The bytes (valid once the copy that filled them has completed: `rows_to_host` returns
    /// after it has).
    fn bytes(&self) -> &[u8];
    /// The address the device uses for these bytes, if it can reach them directly.
    fn device_addr(&self) -> Option<u64>;
}

#[derive(Debug)]
enum Storage {
    Vec(Vec<u8>),
    Backend(Box<dyn HostMem>),
}

/// One row (along dimension 0) of a device tensor, bytes verbatim, in host memory; `dtype` and
/// `shape` (`[1, …]`) are those `read_rows` reports for the tensor.
#[derive(Debug)]
pub struct HostRow {
    /// The element type of the bytes.
    pub dtype: DType,
    /// `[1, …]`: the tensor's shape with one row.
    pub shape: Vec<usize>,
    storage: Storage,
}

impl HostRow {
    /// A row held in a `Vec` (the default path; tests).
    pub fn from_vec(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Self {
        Self {
            dtype,
            shape,
            storage: Storage::Vec(bytes),
        }
    }

    /// A row held in backend memory.
    pub fn from_backend(dtype: DType, shape: Vec<usize>, mem: Box<dyn HostMem>) -> Self {
        Self {
            dtype,
            shape,
            storage: Storage::Backend(mem),
        }
    }

    /// The row's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Vec(v) => v,
            Storage::Backend(m) => m.bytes(),
        }
    }

    /// Bytes in the row.
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// Whether the row holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device address of the bytes when the backend can reach them directly.
    pub fn device_addr(&self) -> Option<u64> {
        match &self.storage {
            Storage::Vec(_) => None,
            Storage::Backend(m) => m.device_addr(),
        }
    }
}

/// `[n, …]` rows as `n` [`HostRow`]s in `Vec`s (bytes verbatim).
pub fn split(t: crate::HostTensor) -> Vec<HostRow> {
    let n = t.shape.first().copied().unwrap_or(0);
    let rb = t.data.len() / n.max(1);
    let mut shape = t.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = 1;
    }
    (0..n)
        .map(|i| {
            HostRow::from_vec(
                t.dtype,
                shape.clone(),
                t.data[i * rb..(i + 1) * rb].to_vec(),
            )
        })
        .collect()
}

/// Rows stacked into one `[n, …]` tensor (bytes verbatim). Errors: no rows, or rows of
/// different dtypes or shapes.
pub fn stack(rows: &[&HostRow]) -> anyhow::Result<crate::HostTensor> {
    let Some(first) = rows.first() else {
        anyhow::bail!("stacking host rows: no rows");
    };
    let mut data = Vec::with_capacity(first.len() * rows.len());
    for r in rows {
        anyhow::ensure!(
            r.dtype == first.dtype && r.shape == first.shape,
            "stacking host rows: a {} {:?} row among {} {:?} rows",
            r.dtype,
            r.shape,
            first.dtype,
            first.shape
        );
        data.extend_from_slice(r.bytes());
    }
    let mut shape = first.shape.clone();
    shape[0] = rows.len();
    crate::HostTensor::new(shape, first.dtype, data)
}
