//! Moving checkpoint tensors onto a device: name lookup, shape checks, dtype conversion.

use crate::layers::Weight;
use crate::loader::{packed_weight, Split, TensorSource};
use crate::parallel::Parallel;
use anyhow::{bail, Result};
use dayone_backend::{Backend, DType, HostTensor, QuantHost, QuantTensor, TensorInfo};
use std::cell::Cell;

/// Loads named tensors from a [`TensorSource`] onto a backend in one float dtype.
pub struct WeightLoader<'a, B: Backend> {
    backend: &'a B,
    src: &'a dyn TensorSource,
    dtype: DType,
    loaded: Cell<usize>,
    progress: Option<&'a dyn Fn(usize, usize)>,
    parallel: Parallel<B>,
    mla_prefill: crate::layers::MlaPrefill,
    bytes: Cell<u64>,
    keep_quantized: bool,
    moe_fp8: bool,
    workspaces: std::cell::RefCell<Vec<crate::layers::ExpertWorkspace<B>>>,
    /// Host buffers of stacked weights, kept for the next layer's stacks.
    buffers: std::cell::RefCell<Vec<Vec<u8>>>,
}

impl<'a, B: Backend> WeightLoader<'a, B> {
    /// `dtype` is the storage dtype for float weights (F32 or BF16).
    pub fn new(backend: &'a B, src: &'a dyn TensorSource, dtype: DType) -> Self {
        Self {
            backend,
            src,
            dtype,
            loaded: Cell::new(0),
            progress: None,
            parallel: Parallel::single(),
            mla_prefill: crate::layers::MlaPrefill::Absorbed,
            bytes: Cell::new(0),
            keep_quantized: true,
            moe_fp8: false,
            workspaces: Default::default(),
            buffers: Default::default(),
        }
    }

    /// Whether block-quantized weights stay in their low-bit form on the device (the default)
    /// or are decoded to the storage dtype at load (`--dequantize-at-load`; also what ranks of
    /// a tensor-parallel group do, whose slices are cut from floats).
    pub fn with_keep_quantized(mut self, keep: bool) -> Self {
        self.keep_quantized = keep;
        self
    }

    /// Whether [`WeightLoader::get_weight`] keeps block-quantized weights quantized.
    pub fn keeps_quantized(&self) -> bool {
        self.keep_quantized && self.parallel.world() == 1
    }

    /// `{prefix}.weight` `[out, in]` as the checkpoint stores it when that is a block format
    /// ([`dayone_backend::quant`]): a GGUF Q4_0 / Q4_1 / Q8_0 tensor, or a compressed-tensors
    /// `{prefix}.weight_packed` + `weight_scale` pair (MXFP4 or INT4). `None` for float weights.
    /// Errors name the tensor and the shape expected.
    pub fn quant_host(&self, prefix: &str, out: usize, inp: usize) -> Result<Option<QuantHost>> {
        let name = format!("{prefix}.weight");
        let q = match self.src.quant(&name)? {
            Some(q) => Some(q),
            None => packed_weight(self.src, prefix, out, inp)?,
        };
        if let Some(q) = &q {
            if q.shape[0] * q.shape[1] != out || q.shape[2] != inp {
                bail!(
                    "{}: tensor `{name}` has shape [{}, {}], expected [{out}, {inp}]",
                    self.src.origin(),
                    q.shape[0] * q.shape[1],
                    q.shape[2]
                );
            }
        }
        Ok(q)
    }

    /// Whether `{prefix}` has a weight in any stored form (`.weight` or `.weight_packed`).
    pub fn has_weight(&self, prefix: &str) -> bool {
        self.has(&format!("{prefix}.weight")) || self.has(&format!("{prefix}.weight_packed"))
    }

    /// `{prefix}.weight` `[out, in]`: kept in its low-bit form when the checkpoint stores it in
    /// a block format and [`WeightLoader::keeps_quantized`], else floats in the storage dtype
    /// (a quantized weight decoded on the host).
    pub fn get_weight(&self, prefix: &str, out: usize, inp: usize) -> Result<Weight<B>> {
        match self.quant_host(prefix, out, inp)? {
            Some(q) if self.keeps_quantized() => {
                Ok(Weight::Quant(Box::new(self.upload_quant(&q)?)))
            }
            Some(q) => Ok(Weight::Dense(self.upload(q.to_host(self.dtype)?)?)),
            None => Ok(Weight::Dense(
                self.get(&format!("{prefix}.weight"), &[out, inp])?,
            )),
        }
    }

    /// The expert workspaces made so far ([`WeightLoader::expert_workspace`]).
    pub(crate) fn workspaces(&self) -> &std::cell::RefCell<Vec<crate::layers::ExpertWorkspace<B>>> {
        &self.workspaces
    }

    /// `{prefix}.weight` `[out, in]` to the host in the storage dtype, slice `split` of it, a
    /// block-quantized weight decoded (for layers that rearrange weights before upload).
    pub fn host_weight_split(
        &self,
        prefix: &str,
        out: usize,
        inp: usize,
        split: Split,
    ) -> Result<HostTensor> {
        match self.quant_host(prefix, out, inp)? {
            Some(q) => split.apply(&q.to_host(self.dtype)?),
            None => self.host_split(&format!("{prefix}.weight"), &[out, inp], split),
        }
    }

    /// Uploads a quantized weight as it is (codes and scales) and counts its bytes.
    pub fn upload_quant(&self, q: &QuantHost) -> Result<QuantTensor<B::Tensor>> {
        let t = QuantTensor::upload(self.backend, q)?;
        self.loaded.set(self.loaded.get() + 1);
        self.bytes.set(self.bytes.get() + q.bytes());
        if let Some(p) = self.progress {
            p(self.loaded.get(), self.src.names().len());
        }
        Ok(t)
    }

    /// Which form MLA layers compute prefill in; unless `Absorbed`, they also load their
    /// expanded-form weights.
    pub fn with_mla_prefill(mut self, mode: crate::layers::MlaPrefill) -> Self {
        self.mla_prefill = mode;
        self
    }

    /// Device bytes of the weights uploaded through [`WeightLoader::get`] and its kin so far
    /// (this rank's weights, in the dtype the backend keeps each tensor in).
    pub fn loaded_bytes(&self) -> u64 {
        self.bytes.get()
    }

    /// See [`WeightLoader::with_mla_prefill`].
    pub fn mla_prefill(&self) -> crate::layers::MlaPrefill {
        self.mla_prefill
    }

    /// Whether the low-bit MoE layers run their decoded (prefill-sized) steps through the
    /// backend's FP8 expert GEMM ([`dayone_backend::ExpertOptions::fp8`]; `--moe-fp8`, off by
    /// default). Where the backend has no such path the layers warn once and decode.
    pub fn with_moe_fp8(mut self, on: bool) -> Self {
        self.moe_fp8 = on;
        self
    }

    /// See [`WeightLoader::with_moe_fp8`].
    pub fn moe_fp8(&self) -> bool {
        self.moe_fp8
    }

    /// Loads this rank's slices of a model split by `parallel` (layers read it through
    /// [`WeightLoader::parallel`]).
    pub fn with_parallel(mut self, parallel: Parallel<B>) -> Self {
        self.parallel = parallel;
        self
    }

    /// The split the layers are loaded for (one rank unless [`WeightLoader::with_parallel`]).
    pub fn parallel(&self) -> &Parallel<B> {
        &self.parallel
    }

    /// Loads the slice `split` of `name`, whose whole shape must be `shape`, in the storage
    /// dtype; only the slice's bytes are read where the source allows.
    ///
    /// Errors: as [`WeightLoader::get`], and a shape that does not split as asked.
    pub fn get_split(&self, name: &str, shape: &[usize], split: Split) -> Result<B::Tensor> {
        let host = self.host_split_as(name, shape, split, self.dtype)?;
        self.upload_exact(host)
    }

    /// [`WeightLoader::get_split`] to the host (for weights rearranged before upload).
    pub fn host_split(&self, name: &str, shape: &[usize], split: Split) -> Result<HostTensor> {
        self.host_split_as(name, shape, split, self.dtype)
    }

    /// [`WeightLoader::host_split`] in f32.
    pub fn host_split_f32(&self, name: &str, shape: &[usize], split: Split) -> Result<HostTensor> {
        self.host_split_as(name, shape, split, DType::F32)
    }

    fn host_split_as(
        &self,
        name: &str,
        shape: &[usize],
        split: Split,
        dtype: DType,
    ) -> Result<HostTensor> {
        if split.is_whole() {
            return self.host_as(name, shape, dtype);
        }
        let origin = self.src.origin();
        let Some(found) = self.src.shape(name) else {
            bail!("{origin}: tensor `{name}` is missing (expected shape {shape:?})");
        };
        if found != shape {
            bail!("{origin}: tensor `{name}` has shape {found:?}, expected {shape:?}");
        }
        split
            .shape(shape)
            .map_err(|e| anyhow::anyhow!("{origin}: tensor `{name}`: {e:#}"))?;
        let host = self.src.load_split(name, &split)?;
        if !host.dtype.is_float() {
            bail!(
                "{origin}: tensor `{name}` has dtype {}, expected a float type",
                host.dtype
            );
        }
        convert(host, dtype)
    }

    /// Calls `f(loaded, total)` after each tensor (for a progress bar).
    pub fn with_progress(mut self, f: &'a dyn Fn(usize, usize)) -> Self {
        self.progress = Some(f);
        self
    }

    /// The tensors' source (for layers that read stored bytes, e.g. packed codes).
    pub fn source(&self) -> &dyn TensorSource {
        self.src
    }

    /// The checkpoint's file or directory, for error messages.
    pub fn origin(&self) -> String {
        self.src.origin()
    }

    /// The backend tensors go to.
    pub fn backend(&self) -> &'a B {
        self.backend
    }

    /// The first of `names` the checkpoint has (checkpoints of one family name tensors
    /// differently: published files vs transformers' `save_pretrained`); errors listing all.
    pub fn first_of(&self, names: &[String]) -> Result<String> {
        match names.iter().find(|n| self.has(n)) {
            Some(n) => Ok(n.clone()),
            None => bail!(
                "{}: none of the tensors {names:?} is present",
                self.src.origin()
            ),
        }
    }

    /// The stored shape of a tensor, `None` when absent.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.src.shape(name)
    }

    /// Whether the checkpoint has a tensor of this name.
    pub fn has(&self, name: &str) -> bool {
        self.src.shape(name).is_some()
    }

    /// Loads `name`, checks that its shape is `shape`, converts it to the storage dtype, uploads it.
    ///
    /// Errors name the file and the tensor: missing, wrong shape, unsupported dtype.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<B::Tensor> {
        self.get_as(name, shape, self.dtype)
    }

    /// Like [`WeightLoader::get`] but in f32 whatever the storage dtype (for small tensors such as
    /// gate biases that the reference keeps in f32).
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<B::Tensor> {
        self.get_as(name, shape, DType::F32)
    }

    /// Like [`WeightLoader::get`], `None` when the tensor is absent.
    pub fn get_opt(&self, name: &str, shape: &[usize]) -> Result<Option<B::Tensor>> {
        if self.has(name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Loads `name` to the host, checked against `shape`, in the storage dtype (for weights that
    /// are rearranged or stacked before upload).
    pub fn host(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        self.host_as(name, shape, self.dtype)
    }

    /// Like [`WeightLoader::host`] but in f32.
    pub fn host_f32(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        self.host_as(name, shape, DType::F32)
    }

    /// The storage dtype of float weights.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Uploads a host tensor assembled by the caller, converted to the storage dtype.
    pub fn upload(&self, host: HostTensor) -> Result<B::Tensor> {
        let host = convert(host, self.dtype)?;
        self.upload_exact(host)
    }

    /// Uploads a host tensor assembled by the caller in f32 (small tensors the ops read in f32).
    pub fn upload_f32(&self, host: HostTensor) -> Result<B::Tensor> {
        self.upload_exact(convert(host, DType::F32)?)
    }

    /// An empty host buffer with room for `bytes`, reused from an earlier
    /// [`WeightLoader::upload_stacked`] where one is large enough (each layer's expert stacks are
    /// gigabytes; a fresh allocation would page-fault all of them in again).
    pub fn stack_buffer(&self, bytes: usize) -> Vec<u8> {
        let mut pool = self.buffers.borrow_mut();
        match pool.iter().position(|b| b.capacity() >= bytes) {
            Some(i) => {
                let mut b = pool.swap_remove(i);
                b.clear();
                b
            }
            None => Vec::with_capacity(bytes),
        }
    }

    /// Uploads a stack assembled in a [`WeightLoader::stack_buffer`] (`data` in the storage
    /// dtype, `shape` its dimensions) and keeps the buffer for the next stack.
    ///
    /// Errors: `data` not holding `shape` elements of the storage dtype; a failed upload.
    pub fn upload_stacked(&self, shape: Vec<usize>, data: Vec<u8>) -> Result<B::Tensor> {
        let host = HostTensor::new(shape, self.dtype, data)?;
        let t = self.upload_ref(&host)?;
        self.buffers.borrow_mut().push(host.data);
        Ok(t)
    }

    /// Uploads a host tensor as it is (its dtype kept) and advances the progress count.
    fn upload_exact(&self, host: HostTensor) -> Result<B::Tensor> {
        self.upload_ref(&host)
    }

    fn upload_ref(&self, host: &HostTensor) -> Result<B::Tensor> {
        let t = self.backend.upload_weight(host)?;
        self.loaded.set(self.loaded.get() + 1);
        // What the device holds, which may differ from the host's bytes (WGSL widens bf16 rows
        // it cannot pack, the CPU backend widens every 16-bit tensor to f32).
        let resident = (t.numel() * t.dtype().size()) as u64;
        self.bytes.set(self.bytes.get() + resident);
        if let Some(p) = self.progress {
            p(self.loaded.get(), self.src.names().len());
        }
        Ok(t)
    }

    fn host_as(&self, name: &str, shape: &[usize], dtype: DType) -> Result<HostTensor> {
        let origin = self.src.origin();
        let Some(found) = self.src.shape(name) else {
            bail!("{origin}: tensor `{name}` is missing (expected shape {shape:?})");
        };
        if found != shape {
            bail!("{origin}: tensor `{name}` has shape {found:?}, expected {shape:?}");
        }
        let host = self.src.load(name)?;
        if !host.dtype.is_float() {
            bail!(
                "{origin}: tensor `{name}` has dtype {}, expected a float type",
                host.dtype
            );
        }
        convert(host, dtype)
    }

    fn get_as(&self, name: &str, shape: &[usize], dtype: DType) -> Result<B::Tensor> {
        let host = self.host_as(name, shape, dtype)?;
        self.upload_exact(host)
    }
}

/// Converts a float host tensor to `dtype` (round to nearest even).
pub fn convert(host: HostTensor, dtype: DType) -> Result<HostTensor> {
    if host.dtype == dtype {
        return Ok(host);
    }
    HostTensor::from_f32_as(host.shape.clone(), &host.to_f32(), dtype)
}
