//! Kimi-Linear KDA layer ops (`kernels/kda.cu`): `short_conv` (depthwise causal conv + SiLU with
//! per-sequence history), `gated_rms_norm`, and `kda` (Kimi Delta Attention; Kimi Linear report
//! §2, fla `chunk_kda` / `naive_recurrent_kda`, dayone docs/architectures.md §1.2).
//!
//! `kda` picks a path per sequence by its token count in the step ([`kda_plan`]):
//! - token-recurrent (`kda_recurrent_*`): one block per (sequence, head, 32 value columns), the
//!   `[K, 32]` f32 state slice in registers, tokens in order — decode and short chunks;
//! - chunked (chunk 64; `kda_chunk_prep_*` then `kda_chunk_scan_*`): every chunk's intra-chunk
//!   algebra in parallel (Γ, A_kk, A_qk, W = T(K ⊙ e^Γ), U = T V with T = (I + L)⁻¹ diag(β) by
//!   forward substitution) into an f32 scratch record per (chunk, head), then one sequential pass
//!   per (sequence, head, 32 value columns) over the chunks — prefill of ≥
//!   [`KDA_CHUNK_MIN_TOKENS`] tokens when K, V ≤ 128 and K ∈ 4ℤ.
//!
//! `DAYONE_KDA_PATH=recurrent|chunked|auto` (or [`CudaBackend::set_kda_path`]) forces a path
//! for every sequence the chunked kernels can take (tests compare both on the same inputs).

use crate::device::drv;
use crate::{check_dtype, dtype_suffix, launch, rows_last, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::{Backend, DType, DeviceStepMeta, HostTensor, StepMeta};
use std::ffi::c_void;
use std::sync::atomic::Ordering;

/// Tokens per chunk of the chunked KDA kernels.
pub const KDA_CHUNK: usize = 64;
/// A sequence with at least this many tokens in the step takes the chunked path (auto mode).
pub const KDA_CHUNK_MIN_TOKENS: usize = 16;

/// Which KDA path to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum KdaPath {
    /// By token count: ≥ [`KDA_CHUNK_MIN_TOKENS`] → chunked, else recurrent.
    Auto = 0,
    /// Every sequence token-recurrent.
    Recurrent = 1,
    /// Every sequence chunked (where the head sizes allow it).
    Chunked = 2,
}

impl KdaPath {
    /// `DAYONE_KDA_PATH` (`recurrent`, `chunked`, anything else → auto).
    pub fn from_env() -> Self {
        Self::parse(std::env::var("DAYONE_KDA_PATH").ok().as_deref())
    }

    /// Parses a `DAYONE_KDA_PATH` value.
    pub fn parse(v: Option<&str>) -> Self {
        match v.map(str::trim) {
            Some("recurrent") => KdaPath::Recurrent,
            Some("chunked") => KdaPath::Chunked,
            _ => KdaPath::Auto,
        }
    }

    pub(crate) fn from_u8(v: u8) -> Self {
        match v {
            1 => KdaPath::Recurrent,
            2 => KdaPath::Chunked,
            _ => KdaPath::Auto,
        }
    }
}

/// Launch descriptors of one `kda` call (all u32, uploaded as one tensor).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KdaPlan {
    /// Recurrent sequences: `(first row, tokens, slot, fresh)` each.
    pub recurrent: Vec<u32>,
    /// Chunked sequences: `(first row, tokens, slot, fresh, first chunk)` each.
    pub chunked: Vec<u32>,
    /// Chunks of the chunked sequences: `(first row, tokens ≤ 64)` each.
    pub chunks: Vec<u32>,
}

/// Splits the step's sequences between the two paths. `chunk_ok`: the head sizes allow the
/// chunked kernels. A sequence is fresh (zero state) when it has no tokens or its first token is
/// at position 0 (as `reference::kda`); empty sequences go to the recurrent kernel, which then
/// just zeroes their state.
pub fn kda_plan(meta: &StepMeta, path: KdaPath, chunk_ok: bool) -> KdaPlan {
    let mut p = KdaPlan::default();
    for s in 0..meta.query_start.len().saturating_sub(1) {
        let (start, end) = (meta.query_start[s], meta.query_start[s + 1]);
        let len = end - start;
        let fresh = len == 0 || meta.positions[start as usize] == 0;
        let slot = meta.state_slots[s];
        let chunked = len > 0
            && chunk_ok
            && match path {
                KdaPath::Recurrent => false,
                KdaPath::Chunked => true,
                KdaPath::Auto => len as usize >= KDA_CHUNK_MIN_TOKENS,
            };
        if chunked {
            let first = (p.chunks.len() / 2) as u32;
            p.chunked
                .extend_from_slice(&[start, len, slot, fresh as u32, first]);
            let mut r = start;
            while r < end {
                let n = (end - r).min(KDA_CHUNK as u32);
                p.chunks.extend_from_slice(&[r, n]);
                r += n;
            }
        } else {
            p.recurrent
                .extend_from_slice(&[start, len, slot, fresh as u32]);
        }
    }
    p
}

/// f32 words of one (chunk, head) record of the chunked kernels:
/// W, Qg, Kd `[64, K]`, U `[64, V]`, A_qk `[64, 64]`, e^Γ_last `[K]`.
pub fn kda_record_words(k: usize, v: usize) -> usize {
    KDA_CHUNK * (3 * k + v + 64) + k
}

/// Bytes of one (chunk, head) record of the tensor-core chunked kernels:
/// W, Qg, Kd `[64, K]`, U `[64, V]`, A_qk `[64, 64]` bf16, e^Γ_last `[K]` f32.
pub fn kda_mma_record_bytes(k: usize, v: usize) -> usize {
    384 * k + 128 * v + 8192 + 4 * k
}

/// Dynamic shared memory of `kda_chunk_mma_prep_*` and `kda_chunk_mma_scan_*`, bytes.
pub fn kda_mma_smem(k: usize, v: usize) -> (usize, usize) {
    let kp = k + 8;
    // Γ f32 | q̂, k̂, operands (416 rows) bf16 | L/T f32 | Aqk/T bf16 | next q, k, a | β, sums
    let prep = 256 * k
        + 2 * (64 + 64 + 128 + 160) * kp
        + 4 * 64 * 65
        + 2 * 64 * 72
        + 6 * 64 * k
        + 4 * 64
        + 16 * k
        + 16;
    let bp = kda_mma_bv(v) + 8;
    let buf = (3 * 64 * kp + 64 * 72 + 64 * bp) * 2 + 4 * k;
    let scan = 2 * buf + 2 * (k + 64) * bp;
    debug_assert!(64 * (kp + v + 8) <= 288 * kp);
    (prep, scan)
}

/// Tuning switches of the tensor-core chunked path, read once from the environment:
/// `DAYONE_KDA_MMA=0` (FMA chunked kernels instead), `DAYONE_KDA_SCAN_BV=64`,
/// `DAYONE_KDA_DIAG_LIM` (see `kda_impl`), `DAYONE_KDA_PREP_STOP` (profiling only, with
/// [`CudaBackend::set_kda_profile`]: the prep kernel stops after that step, results are wrong).
struct KdaTuning {
    mma: bool,
    scan_bv64: bool,
    diag_lim: f32,
    prep_stop: u32,
}

fn kda_tuning() -> &'static KdaTuning {
    static T: std::sync::OnceLock<KdaTuning> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let var = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_string());
        KdaTuning {
            mma: var("DAYONE_KDA_MMA").is_none_or(|v| v != "0"),
            scan_bv64: var("DAYONE_KDA_SCAN_BV").is_some_and(|v| v == "64"),
            diag_lim: var("DAYONE_KDA_DIAG_LIM")
                .and_then(|v| v.parse().ok())
                .unwrap_or(60.0),
            prep_stop: var("DAYONE_KDA_PREP_STOP")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    })
}

/// Value columns per block of `kda_chunk_mma_scan_*` (8·BV threads): 32 (more blocks: the scan
/// is latency-bound at B 1 — BV 64 measured 0.49 ms against 0.33 ms at T 8192, H 32);
/// `DAYONE_KDA_SCAN_BV=64` takes 64 where V allows it (half the record traffic).
pub fn kda_mma_bv(v: usize) -> usize {
    if v.is_multiple_of(64) && kda_tuning().scan_bv64 {
        64
    } else {
        32
    }
}

/// The tensor-core chunked kernels take K ∈ {64, 128}, V ∈ 32ℤ ≤ 128, half-precision inputs.
pub fn kda_mma_shape_ok(dtype: DType, k: usize, v: usize) -> bool {
    dtype != DType::F32 && (k == 64 || k == 128) && v > 0 && v.is_multiple_of(32) && v <= 128
}

/// Per-kernel timing of the chunked path (`set_kda_profile`): (prep ms, scan ms) of the last call.
static KDA_PROFILE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static KDA_LAST_SPLIT: std::sync::Mutex<(f32, f32)> = std::sync::Mutex::new((0.0, 0.0));

/// Dynamic shared memory of `kda_chunk_prep_*` and `kda_chunk_scan_*`, bytes.
pub fn kda_chunk_smem(k: usize, v: usize) -> (usize, usize) {
    let sp = k.max(v) + 1;
    let prep = (3 * KDA_CHUNK * sp + 2 * KDA_CHUNK * 65 + KDA_CHUNK) * 4;
    let scan = (k * 33 + 3 * KDA_CHUNK * k + KDA_CHUNK * 64 + KDA_CHUNK * 33 + k) * 4;
    (prep, scan)
}

/// One part of `short_conv_decode3` (kernels/kda.cu `ConvPart`: four device pointers, the
/// channel count, padded to the struct's 8-byte alignment).
#[repr(C)]
#[derive(Clone, Copy)]
struct ConvPart {
    x: u64,
    w: u64,
    state: u64,
    y: u64,
    c: u32,
    _pad: u32,
}

/// The shapes and dtypes of one short convolution: `x` `[N, C]`, `w` `[C, W]` f32 with
/// 1 ≤ W ≤ 9, `state` `[slots, C, W−1]` f32, `meta` for N tokens → `(N, C, W, sequences)`.
fn check_conv(
    op: &str,
    x: &CudaTensor,
    w: &CudaTensor,
    state: &CudaTensor,
    meta: &StepMeta,
) -> Result<(usize, usize, usize, usize)> {
    let (n, c) = match x.shape[..] {
        [n, c] => (n, c),
        _ => bail!("{op}: x must be [N, C], got {:?}", x.shape),
    };
    let width = match w.shape[..] {
        [wc, wd] if wc == c && (1..=9).contains(&wd) => wd,
        _ => bail!("{op}: w must be [{c}, W] with 1 ≤ W ≤ 9, got {:?}", w.shape),
    };
    check_dtype(op, "w", w, DType::F32)?;
    check_dtype(op, "state", state, DType::F32)?;
    let slots = match state.shape[..] {
        [s, sc, sh] if sc == c && sh == width - 1 => s,
        _ => bail!(
            "{op}: state must be [slots, {c}, {}], got {:?}",
            width - 1,
            state.shape
        ),
    };
    let nseq = check_meta(op, meta, n, slots)?;
    Ok((n, c, width, nseq))
}

/// Whether every sequence of the step has exactly one token (a decode step).
pub(crate) fn one_row_each(meta: &StepMeta) -> bool {
    meta.num_tokens() == meta.query_start.len().saturating_sub(1)
        && meta.query_start.windows(2).all(|q| q[1] == q[0] + 1)
}

fn shape_is(t: &CudaTensor, n: usize) -> bool {
    t.shape.iter().product::<usize>() == n
}

/// Checks the meta fields the KDA ops read and returns the number of sequences.
pub(crate) fn check_meta(op: &str, meta: &StepMeta, n: usize, slots: usize) -> Result<usize> {
    let s = meta.query_start.len().saturating_sub(1);
    if meta.query_start.len() != s + 1 || meta.state_slots.len() != s {
        bail!(
            "{op}: meta needs query_start [S + 1] and state_slots [S], got {} and {}",
            meta.query_start.len(),
            meta.state_slots.len()
        );
    }
    if meta.positions.len() != n || meta.token_seq.len() != n {
        bail!(
            "{op}: meta has {} positions and {} token_seq entries for N = {n} tokens",
            meta.positions.len(),
            meta.token_seq.len()
        );
    }
    if meta.query_start.first().copied().unwrap_or(0) != 0
        || meta.query_start.last().copied().unwrap_or(0) as usize != n
        || meta.query_start.windows(2).any(|w| w[1] < w[0])
    {
        bail!("{op}: query_start must rise from 0 to N = {n}");
    }
    if let Some(&sl) = meta.state_slots.iter().find(|&&x| x as usize >= slots) {
        bail!("{op}: state slot {sl} out of range ({slots} slots)");
    }
    Ok(s)
}

impl CudaBackend {
    /// Forces the KDA path for later `kda` calls (tests, benchmarks).
    pub fn set_kda_path(&self, path: KdaPath) {
        self.kda_path.store(path as u8, Ordering::Relaxed);
    }

    /// Times the chunked kernels of later `kda` calls with CUDA events (synchronising); read
    /// the split with [`CudaBackend::kda_last_split_ms`]. Benchmarks only.
    pub fn set_kda_profile(&self, on: bool) {
        KDA_PROFILE.store(on, Ordering::Relaxed);
    }

    /// (prep ms, scan ms) of the last profiled chunked `kda` call.
    pub fn kda_last_split_ms(&self) -> (f32, f32) {
        *KDA_LAST_SPLIT.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// See [`Backend::short_conv`]: `x` `[N, C]`, `w` `[C, W]` f32 (W ≤ 9), `state`
    /// `[slots, C, W−1]` f32. Two launches: outputs (reading the old history), then the history.
    pub(crate) fn short_conv_impl(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        state: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "short_conv";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (n, c, width, nseq) = check_conv(OP, x, w, state, &meta.host)?;
        self.bind()?;
        let y = self.alloc(vec![n, c], x.dtype)?;
        if c == 0 || nseq == 0 {
            return Ok(y);
        }
        let (cu, wu) = (to_u32(OP, "C", c)?, width as u32);
        let one_row_each = one_row_each(&meta.host);
        // Each kernel is a grid-stride loop of 256-thread blocks over `elems` outputs.
        let run = |kernel: &str, elems: usize, params: &mut [*mut c_void]| -> Result<()> {
            let f = self.func("kda", sfx, &format!("{kernel}_{sfx}"))?;
            let grid = launch::elementwise_grid(elems, 1, 256, 65535);
            self.launch(OP, &f, (grid, 1, 1), (256, 1, 1), 0, params)
        };
        let (xp, wp, sp, yp) = (
            x.device_ptr(),
            w.device_ptr(),
            state.device_ptr(),
            y.device_ptr(),
        );
        let (qs, pos, slot) = (
            meta.query_start.device_ptr(),
            meta.positions.device_ptr(),
            meta.state_slots.device_ptr(),
        );
        let ns = nseq as u32;
        if width > 1 && one_row_each {
            // Decode: the convolution and the history update in one launch (bit-equal).
            run(
                "short_conv_decode",
                nseq * c,
                kparams![xp, wp, sp, yp, qs, pos, slot, ns, cu, wu],
            )?;
            return Ok(y);
        }
        if n > 0 {
            let (ts, nu) = (meta.token_seq.device_ptr(), to_u32(OP, "N", n)?);
            run(
                "short_conv",
                n * c,
                kparams![xp, wp, sp, yp, ts, qs, pos, slot, nu, cu, wu],
            )?;
        }
        if width > 1 {
            run(
                "short_conv_state",
                nseq * c,
                kparams![xp, sp, qs, pos, slot, ns, cu, wu],
            )?;
        }
        Ok(y)
    }

    /// See [`Backend::short_conv_many`]: three parts of a decode step (one row per sequence,
    /// one width, one dtype) in one `short_conv_decode3` launch, each part's arithmetic that of
    /// `short_conv_decode` (bit-equal); anything else one [`Backend::short_conv`] per part.
    pub(crate) fn short_conv_many_impl(
        &self,
        xs: &[&CudaTensor],
        ws: &[&CudaTensor],
        states: &[&CudaTensor],
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<Vec<CudaTensor>> {
        const OP: &str = "short_conv_many";
        let nseq = meta.host.query_start.len().saturating_sub(1);
        let decode = meta.host.num_tokens() > 0 && one_row_each(&meta.host);
        let width = ws
            .first()
            .and_then(|w| w.shape.get(1).copied())
            .unwrap_or(0);
        let fusable = xs.len() == 3
            && ws.len() == 3
            && states.len() == 3
            && decode
            && width > 1
            && self.fusion(launch::DecodeFusion::Conv3)
            && xs
                .iter()
                .all(|x| x.dtype == xs[0].dtype && x.shape.len() == 2)
            && ws.iter().all(|w| w.shape.get(1) == Some(&width));
        if !fusable {
            return dayone_backend::short_conv_each(self, xs, ws, states, meta);
        }
        // Every part checked as `short_conv` checks it (its rows against the step's tokens too),
        // before the one launch.
        let mut parts = Vec::with_capacity(3);
        let mut outs = Vec::with_capacity(3);
        for i in 0..3 {
            let (x, w, st) = (xs[i], ws[i], states[i]);
            let (n, c, _, _) = check_conv(OP, x, w, st, &meta.host)?;
            self.bind()?;
            let y = self.alloc(vec![n, c], x.dtype)?;
            parts.push(ConvPart {
                x: x.device_ptr(),
                w: w.device_ptr(),
                state: st.device_ptr(),
                y: y.device_ptr(),
                c: to_u32(OP, "C", c)?,
                _pad: 0,
            });
            outs.push(y);
        }
        let sfx = dtype_suffix(OP, xs[0].dtype)?;
        let f = self.func("kda", sfx, &format!("short_conv_decode3_{sfx}"))?;
        let elems: usize = outs.iter().map(|y| y.shape[1] * nseq).sum();
        let grid = launch::elementwise_grid(elems, 1, 256, 65535);
        let (qs, pos, slot) = (
            meta.query_start.device_ptr(),
            meta.positions.device_ptr(),
            meta.state_slots.device_ptr(),
        );
        self.launch(
            OP,
            &f,
            (grid, 1, 1),
            (256, 1, 1),
            0,
            kparams![
                parts[0],
                parts[1],
                parts[2],
                qs,
                pos,
                slot,
                nseq as u32,
                width as u32
            ],
        )?;
        Ok(outs)
    }

    /// See [`Backend::gated_rms_norm`]: `x`, `gate` `[R, D]`, `w` `[D]` in x's dtype or f32.
    pub(crate) fn gated_rms_norm_impl(
        &self,
        x: &CudaTensor,
        gate: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "gated_rms_norm";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (r, d) = rows_last(OP, "x [R, D]", x)?;
        if gate.shape != x.shape || w.shape != [d] {
            bail!(
                "{OP}: gate must be {:?} like x and w [{d}], got {:?} and {:?}",
                x.shape,
                gate.shape,
                w.shape
            );
        }
        check_dtype(OP, "gate", gate, x.dtype)?;
        if w.dtype != x.dtype && w.dtype != DType::F32 {
            bail!("{OP}: w must be {} or f32, got {}", x.dtype, w.dtype);
        }
        self.bind()?;
        let out = self.alloc(x.shape.clone(), x.dtype)?;
        if r == 0 || d == 0 {
            return Ok(out);
        }
        let f = self.func("kda", sfx, &format!("gated_rms_norm_{sfx}"))?;
        self.launch(
            OP,
            &f,
            (launch::row_grid(r, 65535), 1, 1),
            (256, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                gate.device_ptr(),
                w.device_ptr(),
                (w.dtype == DType::F32) as u32,
                out.device_ptr(),
                to_u32(OP, "R", r)?,
                to_u32(OP, "D", d)?,
                eps
            ],
        )?;
        Ok(out)
    }

    /// See [`Backend::kda`] and the module doc for the two paths.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn kda_impl(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        a: &CudaTensor,
        b: &CudaTensor,
        a_log: &CudaTensor,
        dt_bias: &CudaTensor,
        lower_bound: Option<f32>,
        state: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "kda";
        let sfx = dtype_suffix(OP, q.dtype)?;
        let (n, h, kd) = match q.shape[..] {
            [n, h, kd] => (n, h, kd),
            _ => bail!("{OP}: q must be [N, H, K], got {:?}", q.shape),
        };
        let vd = match v.shape[..] {
            [vn, vh, vd] if vn == n && vh == h => vd,
            _ => bail!("{OP}: v must be [{n}, {h}, V], got {:?}", v.shape),
        };
        if k.shape != q.shape || a.shape != q.shape || b.shape != [n, h] {
            bail!(
                "{OP}: k and a must be [{n}, {h}, {kd}] like q and b [{n}, {h}], got {:?}, {:?}, {:?}",
                k.shape,
                a.shape,
                b.shape
            );
        }
        for (what, t) in [("k", k), ("v", v), ("a", a), ("b", b)] {
            check_dtype(OP, what, t, q.dtype)?;
        }
        check_dtype(OP, "a_log", a_log, DType::F32)?;
        check_dtype(OP, "dt_bias", dt_bias, DType::F32)?;
        check_dtype(OP, "state", state, DType::F32)?;
        if !shape_is(a_log, h) || !shape_is(dt_bias, h * kd) {
            bail!("{OP}: a_log must have {h} and dt_bias {} values", h * kd);
        }
        if kd == 0 || kd > 256 {
            bail!("{OP}: head size K = {kd} must be in 1..=256");
        }
        let slots = match state.shape[..] {
            [s, sh, sk, sv] if sh == h && sk == kd && sv == vd => s,
            _ => bail!(
                "{OP}: state must be [slots, {h}, {kd}, {vd}], got {:?}",
                state.shape
            ),
        };
        check_meta(OP, &meta.host, n, slots)?;
        self.bind()?;
        let out = self.alloc(vec![n, h, vd], q.dtype)?;
        if h == 0 || vd == 0 || meta.host.state_slots.is_empty() {
            return Ok(out);
        }
        let (prep_smem, scan_smem) = kda_chunk_smem(kd, vd);
        let (mprep_smem, mscan_smem) = kda_mma_smem(kd, vd);
        let optin = self.kernels.max_smem_optin as usize;
        let mma = kda_mma_shape_ok(q.dtype, kd, vd)
            && self.info.arch >= 80
            && mprep_smem.max(mscan_smem) <= optin
            && kda_tuning().mma;
        let chunk_ok =
            mma || (kd <= 128 && vd <= 128 && kd % 4 == 0 && prep_smem.max(scan_smem) <= optin);
        let path = if self.invariant() {
            // Token-recurrent state in f32: the same whatever the step boundaries.
            KdaPath::Recurrent
        } else {
            KdaPath::from_u8(self.kda_path.load(Ordering::Relaxed))
        };
        let plan = kda_plan(&meta.host, path, chunk_ok);
        let mut words = plan.recurrent.clone();
        words.extend_from_slice(&plan.chunked);
        words.extend_from_slice(&plan.chunks);
        // Only recurrent sequences (decode): the kernel reads them from the step's metadata on
        // the device, in the same order, so nothing is uploaded (and a graph can hold the step).
        let from_meta = plan.chunked.is_empty();
        let desc = if from_meta {
            None
        } else {
            Some(self.upload(&HostTensor::from_u32(vec![words.len()], &words)?)?)
        };
        let desc_at = |i: usize| desc.as_ref().map_or(0, |d| d.device_ptr() + (i * 4) as u64);
        let (hu, ku, vu) = (h as u32, kd as u32, vd as u32);
        let (lb, use_lb) = (lower_bound.unwrap_or(0.0), lower_bound.is_some() as u32);
        let scale = 1.0 / (kd as f32).sqrt();
        let vblocks = vd.div_ceil(32) as u32;
        let nrec = plan.recurrent.len() / 4;
        if nrec > 0 {
            let name = if kd <= 128 {
                format!("kda_recurrent_k128_{sfx}")
            } else {
                format!("kda_recurrent_k256_{sfx}")
            };
            let f = self.func("kda", sfx, &name)?;
            self.launch(
                OP,
                &f,
                (vblocks, hu, to_u32(OP, "sequences", nrec)?),
                (128, 1, 1),
                0,
                kparams![
                    q.device_ptr(),
                    k.device_ptr(),
                    v.device_ptr(),
                    a.device_ptr(),
                    b.device_ptr(),
                    a_log.device_ptr(),
                    dt_bias.device_ptr(),
                    state.device_ptr(),
                    out.device_ptr(),
                    desc_at(0),
                    hu,
                    ku,
                    vu,
                    lb,
                    use_lb,
                    scale,
                    meta.query_start.device_ptr(),
                    meta.positions.device_ptr(),
                    meta.state_slots.device_ptr()
                ],
            )?;
        }
        let nchunked = plan.chunked.len() / 5;
        if nchunked > 0 && mma {
            let nchunks = plan.chunks.len() / 2;
            let rb = kda_mma_record_bytes(kd, vd);
            let rec = self.alloc(vec![nchunks * h * rb / 4], DType::F32)?;
            // Diagonal 16×16 blocks of A_kk/A_qk go on the tensor cores while the gate's decay
            // over the block stays ≤ e^60 (`DAYONE_KDA_DIAG_LIM`; negative: always pairwise).
            let diag_lim = kda_tuning().diag_lim;
            let profile = KDA_PROFILE.load(Ordering::Relaxed);
            // Profiling only: the prep kernel returns after step `DAYONE_KDA_PREP_STOP` (1–7).
            let prep_stop = if profile { kda_tuning().prep_stop } else { 0 };
            let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let events = if profile {
                let ev = || self.ctx.new_event(flags).map_err(drv("event creation"));
                Some((ev()?, ev()?, ev()?))
            } else {
                None
            };
            if let Some((e0, _, _)) = &events {
                e0.record(&self.stream).map_err(drv("event record"))?;
            }
            let f = self.func("kda", sfx, &format!("kda_chunk_mma_prep_k{kd}_{sfx}"))?;
            // persistent: one block per SM loops over the (chunk, head) items
            let items = nchunks * h;
            self.launch(
                OP,
                &f,
                (items.min(self.info.sms.max(1) as usize) as u32, 1, 1),
                (512, 1, 1),
                mprep_smem as u32,
                kparams![
                    q.device_ptr(),
                    k.device_ptr(),
                    v.device_ptr(),
                    a.device_ptr(),
                    b.device_ptr(),
                    a_log.device_ptr(),
                    dt_bias.device_ptr(),
                    rec.device_ptr(),
                    desc_at(plan.recurrent.len() + plan.chunked.len()),
                    hu,
                    vu,
                    lb,
                    use_lb,
                    scale,
                    diag_lim,
                    to_u32(OP, "chunks", nchunks)?,
                    prep_stop
                ],
            )?;
            if let Some((_, e1, _)) = &events {
                e1.record(&self.stream).map_err(drv("event record"))?;
            }
            let bv = kda_mma_bv(vd);
            let f = self.func("kda", sfx, &format!("kda_chunk_mma_scan_k{kd}_v{bv}_{sfx}"))?;
            self.launch(
                OP,
                &f,
                ((vd / bv) as u32, hu, nchunked as u32),
                (8 * bv as u32, 1, 1),
                mscan_smem as u32,
                kparams![
                    rec.device_ptr(),
                    state.device_ptr(),
                    out.device_ptr(),
                    desc_at(plan.recurrent.len()),
                    hu,
                    vu
                ],
            )?;
            if let Some((e0, e1, e2)) = &events {
                e2.record(&self.stream).map_err(drv("event record"))?;
                e2.synchronize().map_err(drv("event synchronize"))?;
                let prep = e0.elapsed_ms(e1).map_err(drv("event elapsed"))?;
                let scan = e1.elapsed_ms(e2).map_err(drv("event elapsed"))?;
                *KDA_LAST_SPLIT.lock().unwrap_or_else(|p| p.into_inner()) = (prep, scan);
            }
        } else if nchunked > 0 {
            let nchunks = plan.chunks.len() / 2;
            let rec = self.alloc(vec![nchunks * h * kda_record_words(kd, vd)], DType::F32)?;
            let f = self.func("kda", sfx, &format!("kda_chunk_prep_{sfx}"))?;
            self.launch(
                OP,
                &f,
                (to_u32(OP, "chunks", nchunks)?, hu, 1),
                (256, 1, 1),
                prep_smem as u32,
                kparams![
                    q.device_ptr(),
                    k.device_ptr(),
                    v.device_ptr(),
                    a.device_ptr(),
                    b.device_ptr(),
                    a_log.device_ptr(),
                    dt_bias.device_ptr(),
                    rec.device_ptr(),
                    desc_at(plan.recurrent.len() + plan.chunked.len()),
                    hu,
                    ku,
                    vu,
                    lb,
                    use_lb,
                    scale
                ],
            )?;
            let f = self.func("kda", sfx, &format!("kda_chunk_scan_{sfx}"))?;
            self.launch(
                OP,
                &f,
                (vblocks, hu, nchunked as u32),
                (256, 1, 1),
                scan_smem as u32,
                kparams![
                    rec.device_ptr(),
                    state.device_ptr(),
                    out.device_ptr(),
                    desc_at(plan.recurrent.len()),
                    hu,
                    ku,
                    vu
                ],
            )?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(seqs: &[(u32, u32)], slots: &[u32]) -> StepMeta {
        // (start position, tokens) per sequence
        let mut m = StepMeta {
            query_start: vec![0],
            state_slots: slots.to_vec(),
            ..Default::default()
        };
        for (s, &(p0, len)) in seqs.iter().enumerate() {
            for i in 0..len {
                m.positions.push(p0 + i);
                m.token_seq.push(s as u32);
            }
            let last = *m.query_start.last().unwrap();
            m.query_start.push(last + len);
        }
        m
    }

    #[test]
    fn plan_splits_by_length_and_chunks() {
        let m = meta(
            &[(5, 1), (0, 150), (3, 0), (10, 15), (0, 16)],
            &[7, 2, 4, 0, 9],
        );
        let p = kda_plan(&m, KdaPath::Auto, true);
        assert_eq!(p.recurrent, vec![0, 1, 7, 0, 151, 0, 4, 1, 151, 15, 0, 0]);
        assert_eq!(p.chunked, vec![1, 150, 2, 1, 0, 166, 16, 9, 1, 3]);
        assert_eq!(p.chunks, vec![1, 64, 65, 64, 129, 22, 166, 16]);
    }

    #[test]
    fn plan_forced_paths() {
        let m = meta(&[(5, 1), (0, 3), (0, 0)], &[0, 1, 2]);
        let p = kda_plan(&m, KdaPath::Chunked, true);
        assert_eq!(p.chunked, vec![0, 1, 0, 0, 0, 1, 3, 1, 1, 1]);
        assert_eq!(p.chunks, vec![0, 1, 1, 3]);
        assert_eq!(p.recurrent, vec![4, 0, 2, 1]);
        let p = kda_plan(&m, KdaPath::Chunked, false);
        assert!(p.chunked.is_empty() && p.recurrent.len() == 12);
        let p = kda_plan(&m, KdaPath::Recurrent, true);
        assert!(p.chunked.is_empty() && p.chunks.is_empty());
        assert_eq!(KdaPath::parse(Some("chunked")), KdaPath::Chunked);
        assert_eq!(KdaPath::parse(Some("recurrent")), KdaPath::Recurrent);
        assert_eq!(KdaPath::parse(None), KdaPath::Auto);
    }

    #[test]
    fn mma_sizes_fit_hopper() {
        assert_eq!(kda_mma_record_bytes(128, 128), 74240);
        assert_eq!(kda_mma_record_bytes(128, 128) % 16, 0);
        assert_eq!(kda_mma_record_bytes(64, 64) % 16, 0);
        for (k, v) in [(128, 128), (64, 64), (64, 128), (128, 32), (128, 96)] {
            let (p, s) = kda_mma_smem(k, v);
            assert!(p <= 227 * 1024 && s <= 227 * 1024, "{k} {v}: {p} {s}");
        }
        assert_eq!(kda_mma_smem(128, 128), (223248, 149504));
        assert!(kda_mma_shape_ok(DType::BF16, 128, 128));
        assert!(!kda_mma_shape_ok(DType::F32, 128, 128));
        assert!(!kda_mma_shape_ok(DType::BF16, 32, 24));
    }

    #[test]
    fn chunk_sizes_fit_hopper() {
        assert_eq!(kda_record_words(128, 128), 64 * 576 + 128);
        let (p, s) = kda_chunk_smem(128, 128);
        assert!(p <= 227 * 1024 && s <= 227 * 1024, "{p} {s}");
    }
}
