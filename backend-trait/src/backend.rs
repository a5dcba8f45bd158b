//! The [`Backend`] trait: the tensor ops a decoder needs, at the level of fused layer ops.

use crate::{
    DType, DeviceStepMeta, DeviceVarlenMeta, HostTensor, QuantFormat, QuantTensor, StepMeta,
    VarlenResult,
};
use anyhow::Result;

/// Shape and dtype of a device tensor.
pub trait TensorInfo {
    /// Row-major dimensions, outermost first.
    fn shape(&self) -> &[usize];
    /// Element type.
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn numel(&self) -> usize {
        self.shape().iter().product()
    }
}

/// How rotary embedding pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimension `i` pairs with `i + rot/2` (HF `rotate_half`; Llama, Qwen3, GPT-NeoX).
    HalfSplit,
    /// Dimension `2i` pairs with `2i + 1` (GPT-J / original DeepSeek `view_as_complex`).
    Interleaved,
}

/// What [`Backend::rms_norm_linear_many`] returns: the residual sum `a + r` (`None` when no
/// residual was added) and the projections `[M, N_i]`.
pub type NormedProjections<T> = (Option<T>, Vec<T>);

/// What [`Backend::rms_norm_moe_route`] returns.
pub struct NormedRoute<T> {
    /// The residual sum `a + r` `[N, D]` in `a`'s dtype (`None` when no residual was added).
    pub sum: Option<T>,
    /// The normed rows `[N, D]` in `a`'s dtype that were routed (the experts' input).
    pub x: T,
    /// `[N, k]` u32, as [`Backend::moe_route`].
    pub ids: T,
    /// `[N, k]` f32, as [`Backend::moe_route`].
    pub weights: T,
}

/// [`Backend::rope_write_kv`] as two calls: [`Backend::rope_pair`] then [`Backend::write_kv`]
/// of the rotated keys (the trait's default; a backend that fuses them can fall back to it).
#[allow(clippy::too_many_arguments)]
pub fn rope_then_write_kv<B: Backend>(
    b: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    rope: RopeArgs<'_, B::Tensor>,
    k_cache: &B::Tensor,
    v_cache: &B::Tensor,
    meta: &DeviceStepMeta<B::Tensor>,
) -> Result<B::Tensor> {
    let (q, k) = b.rope_pair(
        q,
        k,
        &meta.positions,
        rope.inv_freq,
        rope.rot_dim,
        rope.style,
        rope.mscale,
    )?;
    b.write_kv(&k, v, k_cache, v_cache, meta)?;
    Ok(q)
}

/// [`Backend::rms_norm_moe_route`] as separate ops: [`Backend::rms_norm_of`] then
/// [`Backend::moe_route`] (the trait's default; a backend that fuses them falls back to it).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_then_moe_route<B: Backend>(
    b: &B,
    a: &B::Tensor,
    r: Option<&B::Tensor>,
    norm_w: &B::Tensor,
    eps: f32,
    gate_w: &B::Tensor,
    bias: Option<&B::Tensor>,
    routing: &MoeRouting,
) -> Result<NormedRoute<B::Tensor>> {
    let (sum, x) = b.rms_norm_of(a, r, norm_w, eps)?;
    let (ids, weights) = b.moe_route(&x, gate_w, bias, routing)?;
    Ok(NormedRoute {
        sum,
        x,
        ids,
        weights,
    })
}

/// [`Backend::linear_add_rms_norm`] as separate ops: [`Backend::linear`] then
/// [`Backend::add_rms_norm`] of `h` and the projection (the trait's default; a backend that
/// fuses them falls back to it). Errors: as those calls.
pub fn linear_then_add_rms_norm<B: Backend>(
    b: &B,
    x: &B::Tensor,
    w: &B::Tensor,
    bias: Option<&B::Tensor>,
    h: &B::Tensor,
    norm_w: &B::Tensor,
    eps: f32,
) -> Result<(B::Tensor, B::Tensor)> {
    let y = b.linear(x, w, bias)?;
    b.add_rms_norm(h, &y, norm_w, eps)
}

/// [`Backend::gated_rms_norm_linear`] as separate ops: [`Backend::gated_rms_norm`] of the
/// `[N·H, head_dim]` rows then [`Backend::linear`] (the trait's default; a backend that fuses
/// them falls back to it). Errors: `head_dim` 0 or not dividing `x`'s elements, else as those
/// calls.
#[allow(clippy::too_many_arguments)]
pub fn gated_rms_norm_then_linear<B: Backend>(
    b: &B,
    x: &B::Tensor,
    gate: &B::Tensor,
    norm_w: &B::Tensor,
    eps: f32,
    head_dim: usize,
    w: &B::Tensor,
    bias: Option<&B::Tensor>,
) -> Result<B::Tensor> {
    let shape = x.shape().to_vec();
    let numel: usize = shape.iter().product();
    if head_dim == 0 || !numel.is_multiple_of(head_dim) {
        anyhow::bail!(
            "gated_rms_norm_linear: x {shape:?} is not made of heads of {head_dim} values"
        );
    }
    let heads = [numel / head_dim, head_dim];
    let y = b.gated_rms_norm(
        &b.reshape(x, &heads)?,
        &b.reshape(gate, &heads)?,
        norm_w,
        eps,
    )?;
    b.linear(&b.reshape(&y, &shape)?, w, bias)
}

/// [`Backend::moe_experts_shared`] as separate ops: `moe_experts`, the shared expert's
/// `linear_silu_mul` and `linear`, then `add` (the trait's default; a backend that fuses the
/// block falls back to it where its fused path does not apply).
#[allow(clippy::too_many_arguments)]
pub fn moe_experts_then_shared<B: Backend>(
    b: &B,
    x: &B::Tensor,
    ids: &B::Tensor,
    weights: &B::Tensor,
    gate_up: &B::Tensor,
    down: &B::Tensor,
    shared: [&B::Tensor; 3],
) -> Result<B::Tensor> {
    let routed = b.moe_experts(x, ids, weights, gate_up, down)?;
    let [gate_s, up_s, down_s] = shared;
    let act = b.linear_silu_mul(x, gate_s, up_s)?;
    b.add(&routed, &b.linear(&act, down_s, None)?)
}

/// [`Backend::short_conv_many`] as one [`Backend::short_conv`] per part (the trait's default;
/// a fusing backend falls back to it). Errors: part lists of different lengths.
pub fn short_conv_each<B: Backend>(
    b: &B,
    xs: &[&B::Tensor],
    ws: &[&B::Tensor],
    states: &[&B::Tensor],
    meta: &DeviceStepMeta<B::Tensor>,
) -> Result<Vec<B::Tensor>> {
    if ws.len() != xs.len() || states.len() != xs.len() {
        anyhow::bail!(
            "short_conv_many: {} inputs, {} weights and {} states (one of each per part)",
            xs.len(),
            ws.len(),
            states.len()
        );
    }
    (0..xs.len())
        .map(|i| b.short_conv(xs[i], ws[i], states[i], meta))
        .collect()
}

/// A KDA layer's step from its projections, as [`Backend::kda_from_projections`] takes it
/// (Kimi Linear report §2, HF `KimiDeltaAttention.forward`): `N` tokens, `H` heads of width `K`
/// (keys and values alike), gate factors of rank `R`.
#[derive(Clone, Copy, Debug)]
pub struct KdaProjections<'a, T> {
    /// q, k, v projections before their short convolutions, `[N, H·K]` each, activation dtype.
    pub qkv: [&'a T; 3],
    /// Their convolution taps, `[H·K, W]` f32 each.
    pub conv_w: [&'a T; 3],
    /// Their convolution histories, `[slots, H·K, W − 1]` f32 each (updated).
    pub conv_state: [&'a T; 3],
    /// The forget gate's first factor `W_fa · x` `[N, R]`.
    pub f: &'a T,
    /// The forget gate's second weight `W_fb` `[H·K, R]`.
    pub w_fb: &'a T,
    /// The output gate's first factor `W_ga · x` `[N, R]`.
    pub g: &'a T,
    /// The output gate's second weight `W_gb` `[H·K, R]`.
    pub w_gb: &'a T,
    /// β logits `[N, H]`.
    pub beta: &'a T,
    /// `A_log` `[H]` f32.
    pub a_log: &'a T,
    /// `dt_bias` `[H, K]` f32.
    pub dt_bias: &'a T,
    /// The forget gate's lower bound, if the model has one.
    pub lower_bound: Option<f32>,
    /// Recurrent state `[slots, H, K, K]` f32 (updated).
    pub state: &'a T,
    /// Heads `H`.
    pub heads: usize,
    /// Head width `K`.
    pub head_dim: usize,
}

/// [`Backend::kda_from_projections`] as separate ops (the trait's default; a backend that fuses
/// them falls back to it): [`Backend::short_conv_many`] of q, k, v, [`Backend::linear_each`] of
/// the two gates' second factors, then [`Backend::kda`]. Returns (`o` `[N, H, K]`, the output
/// gate `W_gb · g` `[N, H·K]`). Errors: as those calls.
pub fn kda_from_projections_each<B: Backend>(
    b: &B,
    p: &KdaProjections<'_, B::Tensor>,
    meta: &DeviceStepMeta<B::Tensor>,
) -> Result<(B::Tensor, B::Tensor)> {
    let n = meta.host.num_tokens();
    let heads = |t: &B::Tensor| b.reshape(t, &[n, p.heads, p.head_dim]);
    let c = b.short_conv_many(&p.qkv, &p.conv_w, &p.conv_state, meta)?;
    let [q, k, v] = <[B::Tensor; 3]>::try_from(c)
        .map_err(|c| anyhow::anyhow!("short_conv_many: {} outputs for 3 parts", c.len()))?;
    let f = b.linear_each(&[(p.f, p.w_fb), (p.g, p.w_gb)])?;
    let [a, gate] = <[B::Tensor; 2]>::try_from(f)
        .map_err(|f| anyhow::anyhow!("linear_each: {} outputs for 2 parts", f.len()))?;
    let o = b.kda(
        &heads(&q)?,
        &heads(&k)?,
        &heads(&v)?,
        &heads(&a)?,
        p.beta,
        p.a_log,
        p.dt_bias,
        p.lower_bound,
        p.state,
        meta,
    )?;
    Ok((o, gate))
}

/// The rotary-embedding settings of one call, as [`Backend::rope`] takes them.
#[derive(Clone, Copy, Debug)]
pub struct RopeArgs<'a, T> {
    /// `[rot_dim / 2]` f32 (frequency scaling such as `llama3` or YaRN folded in).
    pub inv_freq: &'a T,
    /// Rotated dims of each head (the rest pass through).
    pub rot_dim: usize,
    /// How the dims pair.
    pub style: RopeStyle,
    /// Factor on `cos` and `sin` (1.0 except YaRN).
    pub mscale: f32,
}

/// How a Mixture-of-Experts router turns gate logits into expert choices and weights
/// (DeepSeek-V3 "noaux_tc": Liu et al. 2024, DeepSeek-V3 report §2.1.2; HF `DeepseekV3TopkRouter`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouting {
    /// Experts per token.
    pub top_k: usize,
    /// Expert groups (1 = no group limit).
    pub n_group: usize,
    /// Groups kept per token.
    pub topk_group: usize,
    /// Divide the chosen weights by their sum (+1e-20).
    pub norm_topk_prob: bool,
    /// Multiplier on the final weights.
    pub routed_scaling_factor: f32,
}

/// The activation between a routed expert's two projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertAct {
    /// `silu(g) ⊙ u` with `gate_up` rows `[gate; up]` (DeepSeek, Kimi, Qwen MoE).
    Swiglu,
    /// gpt-oss (HF `GptOssExperts`): gate and up rows interleaved (row `2i` gate, `2i + 1`
    /// up); `g ← min(g, limit)`, `u ← clamp(u, −limit, limit)`, `(u + 1) ⊙ g ⊙ σ(alpha · g)`.
    GptOss {
        /// Sigmoid slope (1.702).
        alpha: f32,
        /// Clamp (`swiglu_limit`, 7.0).
        limit: f32,
    },
    /// `silu(min(g, limit)) ⊙ clamp(u, −limit, limit)` with rows `[gate; up]` (glm5_next's
    /// `swiglu_limit`, HF `Glm5NextTextMLP`).
    SwigluClamped {
        /// Clamp (`swiglu_limit`, 10.0 in glm5_next).
        limit: f32,
    },
}

/// Extras of [`Backend::moe_experts_ext`] beyond the plain SwiGLU experts.
#[derive(Clone, Copy, Debug)]
pub struct ExpertOptions<'a, T> {
    /// The activation.
    pub act: ExpertAct,
    /// Bias of the gate/up projection `[E, 2F]` (row order of `gate_up`).
    pub gate_up_bias: Option<&'a T>,
    /// Bias of the down projection `[E, D]`.
    pub down_bias: Option<&'a T>,
    /// Low-bit experts only: run steps that decode into the workspace through the backend's
    /// FP8 GEMM instead ([`Backend::moe_experts_fp8`]; the activations are rounded to e4m3 per
    /// 32 values, ≈ 3 % per value), where it has one. Off by default (`--moe-fp8`); float
    /// experts ignore it.
    pub fp8: bool,
}

/// Extras of [`Backend::paged_attention_ext`] beyond causal attention.
#[derive(Clone, Copy, Debug)]
pub struct AttentionOptions<'a, T> {
    /// Sliding window: a query at position `p` sees keys `p + 1 − window ..= p` (HF's mask
    /// `kv_idx > q_idx − sliding_window`).
    pub window: Option<usize>,
    /// Per-head sink logits `[H]` f32 (gpt-oss): one extra logit per softmax row that takes
    /// probability mass but adds no value, `p_s = exp(a_s) / (exp(z_h) + Σ_s' exp(a_s'))`.
    pub sinks: Option<&'a T>,
}

/// A compute device that runs dayone's tensor ops.
///
/// Conventions for every op:
/// - Tensors are row-major. Shapes in the docs below use `N` = tokens in the step, `H` = query
///   heads, `Hkv` = key/value heads, `D` = hidden width, `hd` = head width, `V` = vocabulary.
/// - Floating-point inputs of one op share one dtype (the *activation dtype*, see
///   [`Backend::activation_dtype`]) unless an op says otherwise; reductions (norms, softmax,
///   dot products) accumulate in f32.
/// - Ops return new tensors, except `write_kv`, which writes into the cache tensors it is given.
/// - Errors: a shape or dtype that does not fit the op, or a device failure, is returned as an
///   error naming the op and the expected shape; no op panics on bad input.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A handle to device memory; clones share the same memory.
    type Tensor: TensorInfo + Clone + Send + Sync;

    /// A one-line description of the device, e.g. `wgsl: Vulkan llvmpipe (CPU)`.
    fn name(&self) -> String;

    /// The dtype activations and the KV cache use when the user asks for `requested`
    /// (a backend without native bf16 arithmetic may answer `F32`).
    fn activation_dtype(&self, requested: DType) -> DType;

    /// Copies a host tensor to the device.
    fn upload(&self, host: &HostTensor) -> Result<Self::Tensor>;

    /// Copies a model weight to the device: as [`Backend::upload`], with the promise that no
    /// operation writes the tensor (or a view of it) afterwards. A backend may then read it
    /// ahead of the step's data dependencies (CUDA: the decode GEMV starts streaming its
    /// weights while the previous kernel finishes). Errors: as `upload`.
    fn upload_weight(&self, host: &HostTensor) -> Result<Self::Tensor> {
        self.upload(host)
    }

    /// Copies a device tensor to the host (waits for pending work).
    fn download(&self, t: &Self::Tensor) -> Result<HostTensor>;

    /// A new zero-filled tensor.
    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Self::Tensor>;

    /// The same memory seen with another shape of equal element count (no copy).
    fn reshape(&self, t: &Self::Tensor, shape: &[usize]) -> Result<Self::Tensor>;

    /// Waits until all submitted work has finished (for timing).
    fn synchronize(&self) -> Result<()>;

    /// Bytes of device memory still available for new tensors (e.g. the KV cache), or `None`
    /// when the backend cannot tell. CUDA answers the driver's free memory plus its allocator's
    /// cached buffers; a CPU device (the reference backend, WGSL on lavapipe) answers the host's
    /// `MemAvailable` ([`host_available_memory`]). The engine sizes the KV cache against it.
    fn free_memory(&self) -> Option<u64> {
        None
    }

    /// Bytes of device memory this backend holds now (live tensors plus what its allocator
    /// keeps for reuse), or `None` when it does not track them. An allocator that never returns
    /// memory holds its peak: after a run this is the memory the run needed.
    fn memory_reserved(&self) -> Option<u64> {
        None
    }

    /// The largest single cache tensor, in bytes, that every op reading or writing a cache
    /// (`write_kv`, `write_cache`, the paged attentions, `dsa_topk`, `short_conv`, `kda`) can
    /// take, or `None` when only the device memory limits it. WGSL answers its largest buffer
    /// chunk (the adapter's largest storage binding, 128 MiB on lavapipe): a larger tensor is
    /// split by rows, which only `linear` weights and embedding tables may be. The engine caps
    /// each per-layer cache tensor (`[blocks, block_size, …]`) at it.
    fn max_buffer_bytes(&self) -> Option<u64> {
        None
    }

    /// Row gather: `out[i] = table[ids[i]]`.
    /// `table` `[V, D]` float, `ids` `[N]` u32 → `[N, D]` in `table`'s dtype.
    /// Used for token embeddings and for picking the rows that need logits.
    fn embedding(&self, table: &Self::Tensor, ids: &Self::Tensor) -> Result<Self::Tensor>;

    /// `y = x · wᵀ (+ bias)`: `x` `[M, K]`, `w` `[N, K]` (the safetensors `[out, in]` layout),
    /// `bias` `[N]` → `[M, N]` in `x`'s dtype, f32 accumulation.
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        bias: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor>;

    /// Several projections of one input: `ys[i] = x · wᵢᵀ (+ biasᵢ)` for `parts[i] = (wᵢ, biasᵢ)`,
    /// each exactly as [`Backend::linear`] computes it (same shapes, dtypes, errors). The
    /// default calls `linear` per part; a backend may run them as one launch (CUDA: one decode
    /// GEMV over all the weights' rows, so a short projection — an 8 MB key projection — does not
    /// pay a kernel's start-up and memory latency on its own). Used for q/k/v and gate/up.
    fn linear_many(
        &self,
        x: &Self::Tensor,
        parts: &[(&Self::Tensor, Option<&Self::Tensor>)],
    ) -> Result<Vec<Self::Tensor>> {
        parts.iter().map(|(w, b)| self.linear(x, w, *b)).collect()
    }

    /// Projections of several inputs: `ys[i] = xᵢ · wᵢᵀ` for `parts[i] = (xᵢ, wᵢ)`, each exactly
    /// as [`Backend::linear`] computes it without a bias (same shapes, dtypes, errors). The
    /// default calls `linear` per part; a backend may run them as one launch (CUDA: one decode
    /// GEMV when the inputs share a shape — KDA's forget-gate and output-gate up-projections).
    fn linear_each(&self, parts: &[(&Self::Tensor, &Self::Tensor)]) -> Result<Vec<Self::Tensor>> {
        parts.iter().map(|(x, w)| self.linear(x, w, None)).collect()
    }

    /// `y = x · wᵀ` in f32 whatever the activation dtype (no rounding of the output to it):
    /// `x` `[M, K]`, `w` `[N, K]` of `x`'s dtype → `[M, N]` f32, f32 accumulation. For small
    /// outputs read back to the host where bf16 rounding would change a decision (router logits
    /// before a top-k). The default is [`Backend::linear`] for f32 activations and refuses others.
    fn linear_f32(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor> {
        if x.dtype() != DType::F32 {
            anyhow::bail!(
                "linear_f32 with {} activations is not implemented on the {} backend",
                x.dtype(),
                self.name()
            );
        }
        self.linear(x, w, None)
    }

    /// The same values in f32: `x` any shape, any float dtype → the same shape in f32 (exact:
    /// every bf16/f16 value is an f32). For the few places where upstream computes in f32 from
    /// 16-bit activations (HF `Glm5NextTextHyperConnection` norms and projects the streams
    /// `.float()`). The default reads `x` back and uploads it again; an f32 `x` is returned as is.
    ///
    /// Errors: `x` not a float tensor.
    fn to_f32(&self, x: &Self::Tensor) -> Result<Self::Tensor> {
        match x.dtype() {
            DType::F32 => Ok(x.clone()),
            DType::BF16 | DType::F16 => {
                let h = self.download(x)?;
                self.upload(&HostTensor::from_f32(h.shape.clone(), &h.to_f32())?)
            }
            d => anyhow::bail!("to_f32: x must be a float tensor, got {d}"),
        }
    }

    /// RMSNorm over the last dimension: `y = w ⊙ x / sqrt(mean(x²) + eps)`, computed in f32.
    /// `x` `[R, D]`, `w` `[D]` → `[R, D]`. Per-head norms pass `x` as `[N·H, hd]`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;

    /// The residual add before a pre-norm sublayer and that sublayer's norm: `s = a + r`, then
    /// `y = rms_norm(s, w, eps)`; returns `(s, y)`, each exactly as [`Backend::add`] then
    /// [`Backend::rms_norm`] compute them (the norm reads `s` as stored, in its dtype). `a`, `r`
    /// `[R, D]` of one dtype, `w` `[D]` → two `[R, D]`. The default makes the two calls; a backend
    /// may fuse them (CUDA: one launch). Errors: as `add` and `rms_norm`.
    fn add_rms_norm(
        &self,
        a: &Self::Tensor,
        r: &Self::Tensor,
        w: &Self::Tensor,
        eps: f32,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let s = self.add(a, r)?;
        let y = self.rms_norm(&s, w, eps)?;
        Ok((s, y))
    }

    /// Rotary position embedding on the first `rot_dim` dims of every head (the rest pass through).
    /// `x` `[N, H, hd]`, `positions` `[N]` u32, `inv_freq` `[rot_dim/2]` f32 (frequency scaling
    /// such as `llama3` or YaRN is folded into it by the caller) → `[N, H, hd]`.
    /// angle = `positions[n] · inv_freq[i]` in f32; `cos`/`sin` are multiplied by `mscale`
    /// (1.0 except YaRN). Source: RoFormer (Su et al. 2021), HF `apply_rotary_pos_emb`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &Self::Tensor,
        positions: &Self::Tensor,
        inv_freq: &Self::Tensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
    ) -> Result<Self::Tensor>;

    /// [`Backend::rope`] of queries `q` `[N, H, hd]` and keys `k` `[N, Hk, hd]` at the same
    /// positions, each exactly as `rope` computes it. The default makes the two calls; a backend
    /// may do both in one launch (CUDA). Errors: as `rope` for each.
    #[allow(clippy::too_many_arguments)]
    fn rope_pair(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        positions: &Self::Tensor,
        inv_freq: &Self::Tensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        Ok((
            self.rope(q, positions, inv_freq, rot_dim, style, mscale)?,
            self.rope(k, positions, inv_freq, rot_dim, style, mscale)?,
        ))
    }

    /// A pre-norm sublayer's first projections: `x = rms_norm(a + r)` (`r` `None`:
    /// `rms_norm(a)`) with weight `norm_w`, then [`Backend::linear_many`] of `x`. `a`, `r`
    /// `[M, K]`, `norm_w` `[K]`, weights `[N_i, K]` (biases `[N_i]`), all of one dtype →
    /// (`a + r` (`None` without `r`), outputs `[M, N_i]`). Bit-equal to
    /// [`Backend::add_rms_norm`] (or [`Backend::rms_norm`]) then `linear_many`, which the
    /// default calls; a backend may compute the norm inside the projections' launch (CUDA
    /// decode: every GEMV block normalises the rows itself, so `x` is never written).
    /// Errors: as those calls.
    fn rms_norm_linear_many(
        &self,
        a: &Self::Tensor,
        r: Option<&Self::Tensor>,
        norm_w: &Self::Tensor,
        eps: f32,
        parts: &[(&Self::Tensor, Option<&Self::Tensor>)],
    ) -> Result<NormedProjections<Self::Tensor>> {
        let (sum, x) = self.rms_norm_of(a, r, norm_w, eps)?;
        Ok((sum, self.linear_many(&x, parts)?))
    }

    /// A pre-norm input on its own: (`a + r` or `None`, `rms_norm(a + r)` or `rms_norm(a)`),
    /// through [`Backend::add_rms_norm`] or [`Backend::rms_norm`] — what the defaults of
    /// [`Backend::rms_norm_linear_many`] and [`Backend::rms_norm_linear_silu_mul`] project.
    fn rms_norm_of(
        &self,
        a: &Self::Tensor,
        r: Option<&Self::Tensor>,
        norm_w: &Self::Tensor,
        eps: f32,
    ) -> Result<(Option<Self::Tensor>, Self::Tensor)> {
        Ok(match r {
            Some(r) => {
                let (s, x) = self.add_rms_norm(a, r, norm_w, eps)?;
                (Some(s), x)
            }
            None => (None, self.rms_norm(a, norm_w, eps)?),
        })
    }

    /// Whether a model should hand a sublayer's last projection of these operands to
    /// [`Backend::linear_add_rms_norm`] (with the residual add and the next norm) rather than
    /// compute it first: `false` where the backend would fuse the next norm into the next
    /// sublayer's own call instead ([`Backend::rms_norm_linear_many`],
    /// [`Backend::rms_norm_moe_route`]) and `linear_add_rms_norm` would not be one launch.
    /// The default, `true`, suits a backend without those fusions: the default
    /// `linear_add_rms_norm` makes the same calls as computing the projection first.
    fn prefers_linear_add_rms_norm(
        &self,
        _x: &Self::Tensor,
        _w: &Self::Tensor,
        _bias: Option<&Self::Tensor>,
        _h: &Self::Tensor,
        _norm_w: &Self::Tensor,
    ) -> bool {
        true
    }

    /// A sublayer's last projection, the residual add after it and the next sublayer's norm:
    /// `y = x·wᵀ (+ bias)`, `s = h + y`, `n = rms_norm(s, norm_w, eps)`; returns `(s, n)`.
    /// `x` `[M, K]`, `w` `[N, K]`, `bias` `[N]`, `h` `[M, N]`, `norm_w` `[N]`, all of one
    /// dtype → two `[M, N]`, bit-equal to [`Backend::linear`] then [`Backend::add_rms_norm`]
    /// (`y` rounded to the dtype before the add), which [`linear_then_add_rms_norm`] (the
    /// default) calls; a backend may run the add and the norm inside the projection's launch
    /// (CUDA decode: the GEMV's last block). Errors: as those calls.
    #[allow(clippy::too_many_arguments)]
    fn linear_add_rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        h: &Self::Tensor,
        norm_w: &Self::Tensor,
        eps: f32,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        linear_then_add_rms_norm(self, x, w, bias, h, norm_w, eps)
    }

    /// [`Backend::linear_silu_mul`] of a pre-norm input, as [`Backend::rms_norm_linear_many`]
    /// does for `linear_many`: → (`a + r` or `None`, `[M, F]`). Bit-equal to the norm then
    /// `linear_silu_mul`, which the default calls. Errors: as those calls.
    fn rms_norm_linear_silu_mul(
        &self,
        a: &Self::Tensor,
        r: Option<&Self::Tensor>,
        norm_w: &Self::Tensor,
        eps: f32,
        w_gate: &Self::Tensor,
        w_up: &Self::Tensor,
    ) -> Result<(Option<Self::Tensor>, Self::Tensor)> {
        let (sum, x) = self.rms_norm_of(a, r, norm_w, eps)?;
        Ok((sum, self.linear_silu_mul(&x, w_gate, w_up)?))
    }

    /// [`Backend::rope_pair`] of queries `q` `[N, H, hd]` and keys `k` `[N, Hkv, hd]` at
    /// `meta.positions`, then [`Backend::write_kv`] of the rotated keys and `v` `[N, Hkv, hd_v]`
    /// into the paged caches; returns the rotated queries `[N, H, hd]`. Bit-equal to those two
    /// calls, which the default makes; a backend may do both in one launch (CUDA: the rotated
    /// keys go straight to their cache rows). Errors: as those calls.
    #[allow(clippy::too_many_arguments)]
    fn rope_write_kv(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        rope: RopeArgs<'_, Self::Tensor>,
        k_cache: &Self::Tensor,
        v_cache: &Self::Tensor,
        meta: &DeviceStepMeta<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        rope_then_write_kv(self, q, k, v, rope, k_cache, v_cache, meta)
    }

    /// SwiGLU activation: `silu(gate) ⊙ up`, `gate`, `up` `[M, F]` → `[M, F]`.
    fn silu_mul(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;

    /// A SwiGLU feed-forward's first half: `silu(x · w_gateᵀ) ⊙ (x · w_upᵀ)`, exactly as
    /// [`Backend::linear_many`] of the two weights then [`Backend::silu_mul`] compute it (the
    /// projections rounded to `x`'s dtype first). `x` `[M, K]`, `w_gate`, `w_up` `[F, K]` →
    /// `[M, F]`. The default makes those calls; a backend may fuse them (CUDA decode: one GEMV
    /// launch that never writes the projections). Errors: as `linear` and `silu_mul`.
    fn linear_silu_mul(
        &self,
        x: &Self::Tensor,
        w_gate: &Self::Tensor,
        w_up: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        let ys = self.linear_many(x, &[(w_gate, None), (w_up, None)])?;
        self.silu_mul(&ys[0], &ys[1])
    }

    /// Clamped SwiGLU (glm5_next's `swiglu_limit`, HF `Glm5NextTextMLP`):
    /// `silu(min(gate, limit)) ⊙ clamp(up, −limit, limit)`, `[M, F]` → `[M, F]` in `gate`'s
    /// dtype, f32 arithmetic. Default: the reference on the host (download, compute, upload).
    fn silu_mul_limit(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        limit: f32,
    ) -> Result<Self::Tensor> {
        let (g, u) = (self.download(gate)?, self.download(up)?);
        self.upload(&crate::reference::silu_mul_limit(&g, &u, limit)?)
    }

    /// Element-wise sum of two tensors of equal shape (residual add).
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;

    /// Stores this step's keys and values in the paged cache:
    /// `k_cache[slot / bs, slot % bs] = k[n]` with `slot = meta.slot_mapping[n]`.
    /// `k` `[N, Hkv, hd_k]`, `v` `[N, Hkv, hd_v]`; caches `[blocks, bs, Hkv, hd_k]` and
    /// `[blocks, bs, Hkv, hd_v]` in the activation dtype.
    fn write_kv(
        &self,
        k: &Self::Tensor,
        v: &Self::Tensor,
        k_cache: &Self::Tensor,
        v_cache: &Self::Tensor,
        meta: &DeviceStepMeta<Self::Tensor>,
    ) -> Result<()>;

    /// Causal attention over the paged cache (keys of this step already written).
    /// Query token `n` of sequence `s = meta.token_seq[n]` at position `p = meta.positions[n]`
    /// attends to that sequence's keys at positions `0..=p`, found through `meta.block_tables[s]`.
    /// GQA: query head `h` reads KV head `h / (H / Hkv)`.
    /// `q` `[N, H, hd_k]`, caches as in [`Backend::write_kv`] → `[N, H, hd_v]`;
    /// `softmax(scale · q·k)` in f32. Source: PagedAttention (Kwon et al. 2023).
    fn paged_attention(
        &self,
        q: &Self::Tensor,
        k_cache: &Self::Tensor,
        v_cache: &Self::Tensor,
        meta: &DeviceStepMeta<Self::Tensor>,
        scale: f32,
    ) -> Result<Self::Tensor>;

    /// [`Backend::paged_attention`] with a sliding window and per-head sinks
    /// ([`AttentionOptions`]; reference [`crate::reference::paged_attention_ext`]). The default
    /// answers plain causal attention and refuses the extras (naming the backend).
    fn paged_attention_ext(
        &self,
        q: &Self::Tensor,
        k_cache: &Self::Tensor,
        v_cache: &Self::Tensor,
        meta: &DeviceStepMeta<Self::Tensor>,
        scale: f32,
        opts: &AttentionOptions<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        if opts.window.is_some() || opts.sinks.is_some() {
            anyhow::bail!(
                "sliding-window / sink attention is not implemented on the {} backend",
                self.name()
            );
        }
        self.paged_attention(q, k_cache, v_cache, meta, scale)
    }

    /// Index of the largest value in each row (first on ties): `x` `[R, V]` → `[R]` u32.
    fn argmax(&self, x: &Self::Tensor) -> Result<Self::Tensor>;

    /// Log-probability of one token per row under the row's softmax (prompt scoring,
    /// perplexity): `out[r] = x[r, t_r] − ln Σ_j exp(x[r, j])`, the log-sum-exp taken about the
    /// row's maximum. `x` `[R, V]` float, `targets` `[R]` u32 (each `< V`) → `[R]` f32.
    /// The default reads `x` back and computes in f64 ([`crate::reference::token_logprob_rows`]);
    /// a device kernel saves copying `R × V` logits to the host.
    fn token_logprob_rows(&self, x: &Self::Tensor, targets: &Self::Tensor) -> Result<Self::Tensor> {
        let out =
            crate::reference::token_logprob_rows(&self.download(x)?, &self.download(targets)?)?;
        self.upload(&out)
    }

    /// Per-token mix of `S` input rows into `M` output rows: `out[t, m, :] = Σ_s w[t, s, m] ·
    /// x[t, s, :]`, f32 accumulation. `x` `[N, S, D]` float, `w` `[N, S, M]` f32 → `[N, M, D]`
    /// in `x`'s dtype. Hyper-connections (Xie et al. 2026, HF `Glm5NextTextHyperConnection`)
    /// collapse, mix and expand their residual streams with it; reference
    /// [`crate::reference::stream_mix`]. The default reads both back and computes on the host
    /// in f64: correct everywhere, fast nowhere.
    ///
    /// Errors: `x` not rank 3 or not float, `w` not f32 `[N, S, M]` matching `x`.
    fn stream_mix(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor> {
        let out = crate::reference::stream_mix(&self.download(x)?, &self.download(w)?)?;
        self.upload(&out)
    }

    /// Per-head linear map `y[n, h] = w[h] · x[n, h]`: `x` `[N, H, K]`, `w` `[H, O, K]` →
    /// `[N, H, O]` in `x`'s dtype, f32 accumulation. MLA uses it to absorb `W_UK` into the query
    /// and to apply `W_UV` to the latent output (DeepSeek-V2 report §2.1.2).
    fn head_linear(&self, _x: &Self::Tensor, _w: &Self::Tensor) -> Result<Self::Tensor> {
        anyhow::bail!(
            "head_linear is not implemented on the {} backend",
            self.name()
        )
    }

    /// Writes `x` `[N, w]` into columns `col..col + w` of the paged single-tensor cache
    /// `cache` `[blocks, bs, W]` at `meta.slot_mapping[n]` (MLA's latent cache keeps
    /// `[c_kv | k_pe]` per token).
    fn write_cache(
        &self,
        _x: &Self::Tensor,
        _cache: &Self::Tensor,
        _col: usize,
        _meta: &DeviceStepMeta<Self::Tensor>,
    ) -> Result<()> {
        anyhow::bail!(
            "write_cache is not implemented on the {} backend",
            self.name()
        )
    }

    /// Whether [`Backend::attention_varlen`] runs natively (not through the host default) for
    /// this activation dtype and head dims; the engine takes the expanded MLA prefill only then
    /// unless told otherwise.
    fn attention_varlen_native(&self, _dtype: DType, _dk: usize, _dv: usize) -> bool {
        false
    }

    /// Attention of `q` over one contiguous key segment (FlashAttention-2's varlen form; layout
    /// and masking in [`crate::VarlenMeta`], maths in [`crate::varlen::attention_varlen`]),
    /// continuing a `prior` softmax state when given (`o` `[N, H, Dv]` f32, `lse` `[N, H]` f32,
    /// as returned in [`VarlenResult::State`]). `q` `[N, H, Dk]`, `k` `[M, Hkv, Dk]`, `v`
    /// `[M, Hkv, Dv]` in one float dtype; `final_out` asks for [`VarlenResult::Final`] (`[N, H,
    /// Dv]` in `q`'s dtype, rows that saw no key are 0), else the state to pass to the next
    /// segment. The default computes on the host through the reference (download, f64, upload):
    /// correct everywhere, fast nowhere.
    #[allow(clippy::too_many_arguments)]
    fn attention_varlen(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        meta: &DeviceVarlenMeta<Self::Tensor>,
        scale: f32,
        prior: Option<(&Self::Tensor, &Self::Tensor)>,
        final_out: bool,
    ) -> Result<VarlenResult<Self::Tensor>> {
        crate::varlen::attention_varlen_on_host(self, q, k, v, meta, scale, prior, final_out)
    }

    /// Causal multi-head attention over a paged latent cache with one shared KV row per token
    /// (MLA in absorbed form, DeepSeek-V2 report §2.1.2). With `c_s = cache[slot(s)]` `[L + R]`:
    /// `score(n, h, s) = scale · (q_lat[n, h] · c_s[..L] + q_rope[n, h] · c_s[L..])` over the
    /// sequence's positions `s ≤ positions[n]`; `out[n, h] = Σ_s softmax(score) · c_s[..L]`.
    /// `q_lat` `[N, H, L]`, `q_rope` `[N, H, R]`, `cache` `[blocks, bs, L + R]` → `[N, H, L]`;
    /// softmax in f32.
    fn paged_latent_attention(
        &self,
        _q_lat: &Self::Tensor,
        _q_rope: &Self::Tensor,
        _cache: &Self::Tensor,
        _meta: &DeviceStepMeta<Self::Tensor>,
        _scale: f32,
    ) -> Result<Self::Tensor> {
        anyhow::bail!(
            "paged_latent_attention is not implemented on the {} backend",
            self.name()
        )
    }

    /// Mixture-of-Experts routing, all in f32: `ℓ = x · gate_wᵀ`, `s = σ(ℓ)`; choice scores
    /// `s' = s + bias` (bias for choosing only); with `n_group > 1`, each group's score is the sum
    /// of its two largest `s'`, and experts outside the `topk_group` best groups get `−∞`; the
    /// `top_k` largest `s'` are chosen (ties: lower index first); weights are the unbiased `s`,
    /// normalised to sum 1 when `norm_topk_prob`, times `routed_scaling_factor`.
    /// `x` `[N, D]`, `gate_w` `[E, D]` f32, `bias` `[E]` f32 → (`ids` `[N, k]` u32 in descending
    /// choice-score order, `weights` `[N, k]` f32). Source: HF `DeepseekV3TopkRouter`.
    fn moe_route(
        &self,
        _x: &Self::Tensor,
        _gate_w: &Self::Tensor,
        _bias: Option<&Self::Tensor>,
        _routing: &MoeRouting,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        anyhow::bail!(
            "moe_route is not implemented on the {} backend",
            self.name()
        )
    }

    /// [`Backend::moe_route`] of a pre-norm input `x = rms_norm(a + r)` (`r` `None`:
    /// `rms_norm(a)`), as [`Backend::rms_norm_linear_many`] is for projections: `a`, `r` `[N, D]`,
    /// `norm_w` `[D]` → the sum, `x` and the choice, each bit-equal to [`Backend::rms_norm_of`]
    /// then `moe_route`. The default makes those calls; a backend may normalise inside the
    /// router's launch (CUDA decode: one launch for the add, the norm, the router GEMV and the
    /// top-k). Errors: as those calls.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_moe_route(
        &self,
        a: &Self::Tensor,
        r: Option<&Self::Tensor>,
        norm_w: &Self::Tensor,
        eps: f32,
        gate_w: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        routing: &MoeRouting,
    ) -> Result<NormedRoute<Self::Tensor>> {
        rms_norm_then_moe_route(self, a, r, norm_w, eps, gate_w, bias, routing)
    }

    /// Causal depthwise convolution with SiLU over each sequence's tokens, carrying history in a
    /// per-sequence state (KDA's short convolution; Kimi-Linear, HF `causal_conv1d_fn`/`_update`):
    /// `y[t, c] = silu(Σ_{j<W} w[c, j] · u[t − (W−1) + j, c])`, where `u` is the sequence's input
    /// stream: `state[slot, c, ..]` (the last `W−1` inputs before this step, oldest first; zeros
    /// when the sequence starts at position 0 in this step) followed by this step's rows.
    /// Afterwards the state holds the last `W−1` inputs. `x` `[N, C]`, `w` `[C, W]` f32,
    /// `state` `[slots, C, W−1]` f32 (updated in place) → `[N, C]` in `x`'s dtype.
    fn short_conv(
        &self,
        _x: &Self::Tensor,
        _w: &Self::Tensor,
        _state: &Self::Tensor,
        _meta: &DeviceStepMeta<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        anyhow::bail!(
            "short_conv is not implemented on the {} backend",
            self.name()
        )
    }

    /// Several [`Backend::short_conv`]s of one step (KDA's q, k and v), part `i` being
    /// `short_conv(xs[i], ws[i], states[i], meta)`; the same values and updated states, in
    /// fewer launches where the backend fuses them (CUDA at decode: one). Errors: part lists of
    /// different lengths, or any part's own error.
    fn short_conv_many(
        &self,
        xs: &[&Self::Tensor],
        ws: &[&Self::Tensor],
        states: &[&Self::Tensor],
        meta: &DeviceStepMeta<Self::Tensor>,
    ) -> Result<Vec<Self::Tensor>> {
        short_conv_each(self, xs, ws, states, meta)
    }

    /// A KDA layer's step from its projections: the short convolutions of q, k, v, the two
    /// gates' second factors and [`Backend::kda`] ([`KdaProjections`] has the shapes). Returns
    /// (`o` `[N, H, K]`, the output gate `[N, H·K]`), bit-equal to those ops, which
    /// [`kda_from_projections_each`] (the default) calls; a backend may run the step in one
    /// launch (CUDA at decode). Errors: as those calls.
    fn kda_from_projections(
        &self,
        p: &KdaProjections<'_, Self::Tensor>,
        meta: &DeviceStepMeta<Self::Tensor>,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        kda_from_projections_each(self, p, meta)
    }

    /// Kimi Delta Attention over each sequence's tokens in order (Kimi Linear report §2; fla
    /// `naive_recurrent_kda`), all in f32, with the recurrent state `S` `[K, V]` per head kept in
    /// `state[slot]` (zero when the sequence starts at position 0 in this step):
    /// gate `g = −exp(a_log[h]) · softplus(a + dt_bias)` (or, with `lower_bound = Some(lb)`,
    /// `g = lb · σ(exp(a_log[h]) · (a + dt_bias))`), `β = σ(b)`;
    /// `q ← q/√(Σq² + 1e−6) · K^−½`, `k ← k/√(Σk² + 1e−6)`;
    /// per token: `S ← diag(exp(g)) S`; `S ← S + k ⊗ β(v − Sᵀk)`; `o = Sᵀq`.
    /// `q`, `k`, `a` `[N, H, K]`, `v` `[N, H, V]`, `b` `[N, H]`, `a_log` `[H]` f32, `dt_bias`
    /// `[H, K]` f32, `state` `[slots, H, K, V]` f32 (updated in place) → `o` `[N, H, V]` in `q`'s
    /// dtype. Backends may evaluate a prefill chunk in the chunked form (equal in exact arithmetic).
    #[allow(clippy::too_many_arguments)]
    fn kda(
        &self,
        _q: &Self::Tensor,
        _k: &Self::Tensor,
        _v: &Self::Tensor,
        _a: &Self::Tensor,
        _b: &Self::Tensor,
        _a_log: &Self::Tensor,
        _dt_bias: &Self::Tensor,
        _lower_bound: Option<f32>,
        _state: &Self::Tensor,
        _meta: &DeviceStepMeta<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        anyhow::bail!("kda is not implemented on the {} backend", self.name())
    }

    /// A projection of gated-RMSNormed heads (KDA's output norm then `o_proj`):
    /// `linear(gated_rms_norm(x, gate, norm_w, eps), w, bias)` with the norm over each
    /// `head_dim`-wide slice. `x`, `gate` `[N, H·head_dim]`, `norm_w` `[head_dim]`, `w` `[O,
    /// H·head_dim]`, `bias` `[O]` → `[N, O]`, bit-equal to [`Backend::gated_rms_norm`] of
    /// `[N·H, head_dim]` rows then [`Backend::linear`]; `x`, `gate`, `w`, `bias` of one dtype,
    /// `norm_w` in it or f32. The default makes those calls; a backend may normalise inside the
    /// projection's launch (CUDA decode: every GEMV block normalises the rows itself). Errors:
    /// `head_dim` 0 or not dividing `x`'s elements, else as those calls.
    #[allow(clippy::too_many_arguments)]
    fn gated_rms_norm_linear(
        &self,
        x: &Self::Tensor,
        gate: &Self::Tensor,
        norm_w: &Self::Tensor,
        eps: f32,
        head_dim: usize,
        w: &Self::Tensor,
        bias: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor> {
        gated_rms_norm_then_linear(self, x, gate, norm_w, eps, head_dim, w, bias)
    }

    /// Sigmoid-gated RMSNorm (HF `KimiLinearRMSNormGated`), in f32:
    /// `y = w ⊙ x / √(mean(x²) + eps) ⊙ σ(gate)`. `x`, `gate` `[R, D]`, `w` `[D]` → `[R, D]`.
    fn gated_rms_norm(
        &self,
        _x: &Self::Tensor,
        _gate: &Self::Tensor,
        _w: &Self::Tensor,
        _eps: f32,
    ) -> Result<Self::Tensor> {
        anyhow::bail!(
            "gated_rms_norm is not implemented on the {} backend",
            self.name()
        )
    }

    /// LayerNorm over the last dimension (Ba et al. 2016), in f32:
    /// `y = (x − mean(x)) / √(var(x) + eps) ⊙ w + b` (biased variance). `x` `[R, D]`, `w`, `b`
    /// `[D]` → `[R, D]`. The DSA indexer normalises its key with it.
    fn layer_norm(
        &self,
        _x: &Self::Tensor,
        _w: &Self::Tensor,
        _b: &Self::Tensor,
        _eps: f32,
    ) -> Result<Self::Tensor> {
        anyhow::bail!(
            "layer_norm is not implemented on the {} backend",
            self.name()
        )
    }

    /// GELU over every element (Hendrycks & Gimpel 2016; formulas in
    /// [`crate::reference::gelu`]): exact `½x(1 + erf(x/√2))` (PyTorch `nn.GELU()`, the
    /// Kimi-K2.5 projector) or, with `approximate`, the tanh form (`gelu_pytorch_tanh`, the
    /// MoonViT MLP). `x` any shape, float → same shape and dtype, computed in f32 or better.
    /// The default is a host fallback (download, f64 reference, upload): correct everywhere,
    /// fast nowhere.
    fn gelu(&self, x: &Self::Tensor, approximate: bool) -> Result<Self::Tensor> {
        let out = crate::reference::gelu(&self.download(x)?, approximate)?;
        self.upload(&out)
    }

    /// DeepSeek Sparse Attention's lightning indexer with top-k selection (DeepSeek-V3.2 report;
    /// HF `DeepseekV32Indexer`): for query token `n` (sequence `s`, position `p`) and each of the
    /// sequence's keys `t ≤ p` in `k_cache` (one row of width `d` per token, found through the
    /// block table), `I(n, t) = Σ_h w[n, h] · H^−½ · relu(scale · q[n, h] · k_t)`, all in f32;
    /// returns the positions `t` of the `topk` largest `I(n, t)` (ties: lower position first),
    /// in an order of the backend's choosing (attention does not depend on it; the reference
    /// sorts by descending score), then `u32::MAX` padding when the sequence has fewer than
    /// `topk` keys up to `p`. `q` `[N, H, d]`, `w` `[N, H]`, `k_cache` `[blocks, bs, d]` →
    /// `[N, topk]` u32. Backends may block the scoring so that no `[N × keys]` score matrix is
    /// materialised at once.
    fn dsa_topk(
        &self,
        _q: &Self::Tensor,
        _w: &Self::Tensor,
        _k_cache: &Self::Tensor,
        _meta: &DeviceStepMeta<Self::Tensor>,
        _scale: f32,
        _topk: usize,
    ) -> Result<Self::Tensor> {
        anyhow::bail!("dsa_topk is not implemented on the {} backend", self.name())
    }

    /// [`Backend::paged_latent_attention`] restricted to selected keys (sparse MLA): query `n`
    /// attends only to the positions listed in `selected[n]` (entries `u32::MAX` are skipped;
    /// every listed position is `≤ positions[n]`). `selected` `[N, topk]` u32.
    fn sparse_latent_attention(
        &self,
        _q_lat: &Self::Tensor,
        _q_rope: &Self::Tensor,
        _cache: &Self::Tensor,
        _meta: &DeviceStepMeta<Self::Tensor>,
        _scale: f32,
        _selected: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        anyhow::bail!(
            "sparse_latent_attention is not implemented on the {} backend",
            self.name()
        )
    }

    /// Routed SwiGLU experts: `y[n] = Σ_j weights[n, j] · down[e] · (silu(g) ⊙ u)` with
    /// `e = ids[n, j]` and `[g | u] = gate_up[e] · x[n]`.
    /// `x` `[N, D]`, `ids` `[N, k]` u32, `weights` `[N, k]` f32, `gate_up` `[E, 2F, D]` (gate rows
    /// first), `down` `[E, D, F]` → `[N, D]` in `x`'s dtype, f32 accumulation.
    fn moe_experts(
        &self,
        _x: &Self::Tensor,
        _ids: &Self::Tensor,
        _weights: &Self::Tensor,
        _gate_up: &Self::Tensor,
        _down: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        anyhow::bail!(
            "moe_experts is not implemented on the {} backend",
            self.name()
        )
    }

    /// [`Backend::moe_experts`] plus a dense SwiGLU shared expert (DeepSeek-V3 report §2.1.2,
    /// HF `DeepseekV3MoE.shared_experts`; Kimi's `shared_experts`):
    /// `moe_experts(x, ids, weights, gate_up, down) + down_s · (silu(gate_s · x) ⊙ (up_s · x))`,
    /// the routed sum and the shared expert's output each rounded to `x`'s dtype before the add,
    /// as the separate ops round them. `shared` = `[gate_s, up_s, down_s]` with `gate_s`, `up_s`
    /// `[Fs, D]` and `down_s` `[D, Fs]` in `x`'s dtype; other arguments as
    /// [`Backend::moe_experts`] → `[N, D]`. The default runs `moe_experts`, `linear_silu_mul`,
    /// `linear` and `add`; a backend may run the whole block in fewer launches at decode sizes
    /// (CUDA: two), equal to the default within the dtype's rounding.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts_shared(
        &self,
        x: &Self::Tensor,
        ids: &Self::Tensor,
        weights: &Self::Tensor,
        gate_up: &Self::Tensor,
        down: &Self::Tensor,
        shared: [&Self::Tensor; 3],
    ) -> Result<Self::Tensor> {
        moe_experts_then_shared(self, x, ids, weights, gate_up, down, shared)
    }

    /// Decodes whole items of a block-quantized weight into a float workspace
    /// ([`crate::quant`]): `out[i] = dequant(q[items[i]])` for `i < M`, each value
    /// `value(code) · scale (+ min)` computed in f32 (product and sum rounded once each) and
    /// rounded to `out`'s dtype. `q` `[E, R, C]`, `items` `[M]` u32 (an item `≥ E` writes
    /// zeros), `out` `[S, R, C]` float with `S ≥ M` (items `M..S` keep their values). The MoE
    /// layers decode only the experts a step routed to, into one workspace reused by every
    /// layer; embedding tables (`[V, 1, D]`) decode the looked-up rows.
    fn dequantize_into(
        &self,
        _q: &QuantTensor<Self::Tensor>,
        _items: &Self::Tensor,
        _out: &Self::Tensor,
    ) -> Result<()> {
        anyhow::bail!(
            "dequantize_into is not implemented on the {} backend",
            self.name()
        )
    }

    /// `y = x · dequant(q)ᵀ (+ bias)` for a quantized `q` `[1, N, K]`: `x` `[M, K]`, `bias`
    /// `[N]` → `[M, N]` in `x`'s dtype, f32 accumulation. The default decodes `q` into a
    /// temporary `[N, K]` of `x`'s dtype and calls [`Backend::linear`]; a backend may instead
    /// read the codes directly (a low-bit GEMV for few rows).
    fn linear_quant(
        &self,
        x: &Self::Tensor,
        q: &QuantTensor<Self::Tensor>,
        bias: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor> {
        let [items, n, k] = q.shape;
        anyhow::ensure!(
            items == 1,
            "linear_quant: expected one weight [1, N, K], got {:?}",
            q.shape
        );
        let w = self.zeros(&[1, n, k], x.dtype())?;
        let zero = self.upload(&HostTensor::from_u32(vec![1], &[0])?)?;
        self.dequantize_into(q, &zero, &w)?;
        self.linear(x, &self.reshape(&w, &[n, k])?, bias)
    }

    /// [`Backend::moe_experts`] with biases and another activation ([`ExpertOptions`];
    /// reference [`crate::reference::moe_experts_ext`]): `y[n] = Σ_j weights[n, j] ·
    /// (down[e] · act(gate_up[e] · x[n] + b_gu[e]) + b_d[e])`. The default answers the plain
    /// SwiGLU experts and refuses the extras (naming the backend).
    #[allow(clippy::too_many_arguments)]
    fn moe_experts_ext(
        &self,
        x: &Self::Tensor,
        ids: &Self::Tensor,
        weights: &Self::Tensor,
        gate_up: &Self::Tensor,
        down: &Self::Tensor,
        opts: &ExpertOptions<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        if opts.act != ExpertAct::Swiglu || opts.gate_up_bias.is_some() || opts.down_bias.is_some()
        {
            anyhow::bail!(
                "experts with biases or the gpt-oss activation are not implemented on the {} backend",
                self.name()
            );
        }
        self.moe_experts(x, ids, weights, gate_up, down)
    }

    /// Routed experts whose weights are block-quantized ([`crate::quant`]):
    /// [`Backend::moe_experts_ext`] with `gate_up` `[E, 2F, D]` and `down` `[E, D, F]` kept
    /// low-bit. `x` `[N, D]`, `ids` `[N, k]` u32, `weights` `[N, k]` f32, biases of `opts`
    /// `[E, 2F]` / `[E, D]` in `x`'s dtype → `[N, D]` in `x`'s dtype, f32 accumulation;
    /// reference: [`crate::reference::moe_experts_ext`] on the decoded weights. The default
    /// reads the ids back, decodes the step's distinct experts into temporaries and runs the
    /// float experts ([`crate::quant_moe::moe_experts_decoded_temp`]); a backend may instead
    /// read the codes directly (a grouped low-bit GEMV for decode, see
    /// [`Backend::moe_quant_direct_tokens`]).
    #[allow(clippy::too_many_arguments)]
    fn moe_experts_quant(
        &self,
        x: &Self::Tensor,
        ids: &Self::Tensor,
        weights: &Self::Tensor,
        gate_up: &QuantTensor<Self::Tensor>,
        down: &QuantTensor<Self::Tensor>,
        opts: &ExpertOptions<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        crate::quant_moe::moe_experts_decoded_temp(self, x, ids, weights, gate_up, down, opts)
    }

    /// The largest step, in tokens, for which [`Backend::moe_experts_quant`] reads the codes of
    /// `format` directly and is faster than decoding the experts into a workspace first, for a
    /// layer of `experts` routed experts with `top_k` per token (the crossing depends on the
    /// (token, expert) pairs per expert: each direct tile re-reads its expert's codes, a decode
    /// converts every touched expert once); 0 (the default): never, so the MoE layers decode into
    /// their shared workspace at every step size.
    fn moe_quant_direct_tokens(
        &self,
        _format: QuantFormat,
        _experts: usize,
        _top_k: usize,
    ) -> usize {
        0
    }

    /// Whether [`Backend::moe_experts_fp8`] can run experts of `format` on this device (CUDA:
    /// sm_89+, MXFP4 or INT4 with groups of a multiple of 32); false (the default): the
    /// `--moe-fp8` option falls back to the float decode, with a warning.
    fn moe_fp8_available(&self, _format: QuantFormat) -> bool {
        false
    }

    /// Routed low-bit experts through an FP8 GEMM (the opt-in prefill path of
    /// [`ExpertOptions::fp8`]): the experts `chosen` (`[M]` u32, in slot order) are converted
    /// into e4m3 codes with one scale per 32-value block inside `workspace` (the float decode
    /// workspace, `[S, 2F, D]` and `[S, D, F]`, `S ≥ M`), each A row is rounded to e4m3 per
    /// 32-value block (scale = amax / 448), and the grouped GEMMs accumulate the blocks in f32.
    /// `x` `[N, D]`, `slot_ids` `[N, k]` u32 (slots `< M`; `u32::MAX` skips a choice), `weights`
    /// `[N, k]` f32, biases of `opts` in slot order (`[S, 2F]`, `[S, D]`) → `[N, D]` as
    /// [`Backend::moe_experts_quant`]. `Ok(None)` (the default): no FP8 path for this device,
    /// format or shape; the caller decodes instead.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts_fp8(
        &self,
        _x: &Self::Tensor,
        _slot_ids: &Self::Tensor,
        _weights: &Self::Tensor,
        _gate_up: &QuantTensor<Self::Tensor>,
        _down: &QuantTensor<Self::Tensor>,
        _chosen: &Self::Tensor,
        _opts: &ExpertOptions<Self::Tensor>,
        _workspace: (&Self::Tensor, &Self::Tensor),
    ) -> Result<Option<Self::Tensor>> {
        Ok(None)
    }

    /// Records the device work `f` queues (a decode step's forward) as a graph that
    /// [`Backend::replay_graph`] re-runs on the same buffers: `f` runs once, capturing instead
    /// of executing, and its output tensor is the one every replay writes. The inputs `f` reads
    /// must be tensors that outlive the graph and are refreshed in place before each replay
    /// ([`Backend::write_rows`]); host-dependent choices made inside `f` (kernel variants,
    /// grids) are frozen. `Ok(None)`: the backend has no graphs (the default). Errors: `f`
    /// failed, or did something a graph cannot hold (a read-back, an upload, a synchronisation);
    /// nothing is kept then and the caller runs eagerly.
    #[allow(clippy::type_complexity)]
    fn capture_graph(
        &self,
        _f: &mut dyn FnMut() -> Result<Self::Tensor>,
    ) -> Result<Option<(u64, Self::Tensor)>> {
        Ok(None)
    }

    /// Re-runs graph `id` of [`Backend::capture_graph`] (queued like other work). Errors: an
    /// unknown id, or a backend without graphs.
    fn replay_graph(&self, id: u64) -> Result<()> {
        anyhow::bail!(
            "replay_graph({id}): the {} backend has no graphs",
            self.name()
        )
    }

    /// Frees graph `id` and the memory reserved for it (no-op for an unknown id).
    fn drop_graph(&self, _id: u64) {}

    /// Uploads one step's metadata (one host→device copy per field).
    fn upload_meta(&self, meta: StepMeta) -> Result<DeviceStepMeta<Self::Tensor>> {
        let u = |v: &[u32]| {
            // Empty tensors are awkward on some devices: keep at least one element.
            let v: Vec<u32> = if v.is_empty() { vec![0] } else { v.to_vec() };
            self.upload(&HostTensor::from_u32(vec![v.len()], &v)?)
        };
        Ok(DeviceStepMeta {
            positions: u(&meta.positions)?,
            token_seq: u(&meta.token_seq)?,
            slot_mapping: u(&meta.slot_mapping)?,
            block_tables: u(&meta.block_tables)?,
            seq_lens: u(&meta.seq_lens)?,
            query_start: u(&meta.query_start)?,
            logit_rows: u(&meta.logit_rows)?,
            state_slots: u(&meta.state_slots)?,
            host: meta,
        })
    }

    /// Copies whole rows of dimension 0 in place: for each `(src, dst)` of `pairs`,
    /// `t[dst, ...] = t[src, ...]`, bytes verbatim in any dtype. `t` `[R, ...]`; e.g. a recurrent
    /// state `[slots, H, K, V]` into a checkpoint slot and back, or cache blocks
    /// `[blocks, bs, ...]`.
    ///
    /// Semantics: every source row is read before any row is written, so `t'[dst] = t[src]`
    /// with `t` the tensor before the call — pairs may chain or swap (`[(0, 1), (1, 0)]` swaps
    /// rows 0 and 1); rows not named as a `dst` keep their bytes; `src == dst` is a no-op.
    /// Queued like other ops (ordered after earlier work on `t`). Contiguous runs are copied
    /// in one device copy each; the tensor is never downloaded.
    ///
    /// Errors, before anything is copied: an index `≥ R` (naming the index and `R`), a `dst`
    /// that appears twice. Checks and run planning: [`crate::rows::plan_copy`].
    fn copy_rows(&self, _t: &Self::Tensor, _pairs: &[(u32, u32)]) -> Result<()> {
        anyhow::bail!(
            "copy_rows is not implemented on the {} backend",
            self.name()
        )
    }

    /// Gathers rows of dimension 0 to the host: `t` `[R, ...]` → `[rows.len(), ...]` with
    /// `out[i] = t[rows[i]]`, in `t`'s stored dtype ([`TensorInfo::dtype`]), bytes verbatim
    /// (so [`Backend::write_rows`] of the result restores exactly these device bytes). Rows may
    /// repeat. Waits for pending work on `t`; reads only the named rows (one copy per
    /// contiguous run). Errors: an index `≥ R` (naming the index and `R`).
    fn read_rows(&self, _t: &Self::Tensor, _rows: &[u32]) -> Result<HostTensor> {
        anyhow::bail!(
            "read_rows is not implemented on the {} backend",
            self.name()
        )
    }

    /// The inverse of [`Backend::read_rows`], in place: `t[rows[i]] = src[i]` for `t`
    /// `[R, ...]` and `src` `[rows.len(), ...]` of `t`'s dtype, bytes verbatim; one copy per
    /// contiguous run, ordered after earlier work on `t` and before later work. `src` may be
    /// dropped when the call returns. Errors, before anything is written: `src` of another
    /// shape or dtype (naming both shapes), an index `≥ R` (naming it and `R`), a row twice.
    fn write_rows(&self, _t: &Self::Tensor, _rows: &[u32], _src: &HostTensor) -> Result<()> {
        anyhow::bail!(
            "write_rows is not implemented on the {} backend",
            self.name()
        )
    }

    /// Copies rows `rows` of `t` (dimension 0, bytes verbatim) into host memory, one
    /// [`crate::HostRow`] per index, in the memory this backend moves to and from its device
    /// fastest (CUDA: page-locked and device-mapped, written by one kernel); returns once the
    /// bytes are there. The host-memory tier keeps its blocks this way.
    /// Default: [`Backend::read_rows`], split into rows.
    ///
    /// Errors: as `read_rows` (an index out of range).
    fn rows_to_host(&self, t: &Self::Tensor, rows: &[u32]) -> Result<Vec<crate::HostRow>> {
        Ok(crate::host_rows::split(self.read_rows(t, rows)?))
    }

    /// Writes `src[i]` (one row of `t`, as [`Backend::rows_to_host`] made it) into row
    /// `rows[i]` of `t`. Default: the rows stacked for [`Backend::write_rows`].
    ///
    /// Errors: `rows` and `src` of different lengths, a repeated or out-of-range index, a row
    /// of another size than `t`'s.
    fn rows_from_host(
        &self,
        t: &Self::Tensor,
        rows: &[u32],
        src: &[&crate::HostRow],
    ) -> Result<()> {
        anyhow::ensure!(
            rows.len() == src.len(),
            "rows_from_host: {} rows to write from {} host rows",
            rows.len(),
            src.len()
        );
        if rows.is_empty() {
            return Ok(());
        }
        self.write_rows(t, rows, &crate::host_rows::stack(src)?)
    }

    /// Positions (a multiple of this many tokens) at which the recurrent ops (`short_conv`,
    /// `kda`) are split-invariant: a sequence whose steps start at such positions gets the same
    /// outputs and state, bit for bit, however its prompt was cut between them. 1 for a
    /// token-by-token recurrence; the chunk length for chunked kernels that align their chunks
    /// to absolute positions. Prefix caching places recurrent-state checkpoints only there.
    fn recurrent_split_alignment(&self) -> usize {
        1
    }

    /// Batch-invariant kernels on or off. With them on, every op gives a row (a token) the
    /// same bits however many rows share the call and however a prompt was cut into steps, so
    /// a prefix-cache hit, any chunk size, a preempted run and a batch of requests all equal
    /// the request computed alone (serving.md §D4; vLLM's `VLLM_BATCH_INVARIANT`). Backends
    /// that pick kernels by shape (CUDA: cuBLAS algorithms by M, split-K decode attention)
    /// trade speed for it; the default does nothing, for backends whose kernels reduce in one
    /// fixed order whatever the shape (the CPU reference). Call it before the first step of an
    /// engine.
    fn set_batch_invariant(&self, on: bool) -> Result<()> {
        let _ = on;
        Ok(())
    }

    /// Whether the results are batch-invariant now (the default: always).
    fn batch_invariant(&self) -> bool {
        true
    }

    /// Compiles (or loads from a disk cache) every kernel this backend may launch for
    /// activations of `dtype`, so that no step pays a compile (a kernel compiled at first use
    /// stalls the requests of that step for seconds). The engine calls it once at load;
    /// backends without run-time compilation do nothing.
    fn prepare_kernels(&self, dtype: DType) -> Result<()> {
        let _ = dtype;
        Ok(())
    }
}

/// Whether `DAYONE_BATCH_INVARIANT` asks for batch-invariant kernels (`1`, `true`, `on`,
/// `yes`): the backends start in that mode ([`Backend::set_batch_invariant`]), as vLLM reads
/// `VLLM_BATCH_INVARIANT`.
pub fn batch_invariant_from_env() -> bool {
    matches!(
        std::env::var("DAYONE_BATCH_INVARIANT")
            .ok()
            .as_deref()
            .map(str::trim),
        Some("1" | "true" | "on" | "yes")
    )
}

/// The host's available memory in bytes (`MemAvailable` of `/proc/meminfo`), `None` where that
/// file does not exist or cannot be parsed (non-Linux hosts).
pub fn host_available_memory() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// The `MemAvailable:  N kB` line of a `/proc/meminfo` text, in bytes.
fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut parts = line.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    let unit = match parts.next() {
        Some("kB") => 1024,
        None => 1,
        Some(_) => return None,
    };
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::parse_mem_available;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text =
            "MemTotal:       16318000 kB\nMemFree:         1000 kB\nMemAvailable:   11744000 kB\n";
        assert_eq!(parse_mem_available(text), Some(11_744_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
    }

    #[test]
    fn host_memory_is_known_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(super::host_available_memory().is_some_and(|b| b > 0));
        }
    }
}
