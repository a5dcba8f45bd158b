//! Kimi-Linear KDA ops with per-sequence recurrent state: `short_conv`, `kda`, `gated_rms_norm`.

use crate::{f32_param, pipelines, WTensor, WgslBackend, KDA_CHUNK};
use anyhow::{ensure, Result};
use dayone_backend::{DType, DeviceStepMeta, TensorInfo};

impl WgslBackend {
    /// Per-sequence state-slot rows for the recurrent ops (`short_conv`, `kda`):
    /// `(slot, first row, rows, fresh)` per sequence, after checking the metadata (a
    /// `query_start` covering all `N` rows, one distinct slot `< slots` per sequence).
    /// `fresh`: the sequence starts at position 0 in this step (or has no rows), as in
    /// `reference::short_conv`/`kda`.
    fn state_seqs(op: &str, hm: &dayone_backend::StepMeta, slots: usize) -> Result<Vec<[u32; 4]>> {
        let (n, s) = (hm.num_tokens(), hm.num_seqs());
        ensure!(
            hm.state_slots.len() == s,
            "{op}: state_slots must have one entry per sequence ({s}), got {}",
            hm.state_slots.len()
        );
        ensure!(
            hm.query_start.len() == s + 1
                && hm.query_start.first() == Some(&0)
                && hm.query_start[s] as usize == n
                && hm.query_start.windows(2).all(|w| w[0] <= w[1]),
            "{op}: query_start must be [S + 1 = {}] non-decreasing prefix sums from 0 to N = {n}",
            s + 1
        );
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(s);
        for i in 0..s {
            let slot = hm.state_slots[i];
            ensure!(
                (slot as usize) < slots,
                "{op}: state slot {slot} of sequence {i} out of range ({slots} slots)"
            );
            ensure!(
                seen.insert(slot),
                "{op}: state slot {slot} is used by more than one sequence of the step"
            );
            let (a, b) = (hm.query_start[i], hm.query_start[i + 1]);
            let fresh = a == b || hm.positions[a as usize] == 0;
            out.push([slot, a, b - a, fresh as u32]);
        }
        Ok(out)
    }

    /// `kda`'s chunked path for the sequences `seqs` (`(slot, first row, rows, fresh)`):
    /// chunks of [`KDA_CHUNK`] rows; `kda_chunk_prep.wgsl` computes every chunk's intra-chunk
    /// matrices (one workgroup per (chunk, head), independent across chunks) into a scratch
    /// buffer, then `kda_chunk_state.wgsl` walks each sequence's chunks in order carrying the state
    /// (one invocation per (sequence, head, value column)). Chunks are processed in rounds small
    /// enough for the scratch to fit one storage binding; the state carries over between rounds.
    /// `dims` = `[H, K, V]`, `ins` = prepared `qn`, `kn`, `g` and `v`, `b`.
    fn kda_chunked(
        &self,
        seqs: &[[u32; 4]],
        dims: [usize; 3],
        ins: [&WTensor; 5],
        state: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<()> {
        const OP: &str = "kda";
        let [h, kd, vd] = dims;
        let c = KDA_CHUNK;
        // Per (chunk, head): Γ, Qg, Kd, W [C, K] | U [C, V] | L, Aqk [C, C] | exp(Γ_last) [K].
        let per = 4 * c * kd + c * vd + 2 * c * c + kd;
        let per_chunk_bytes = (h * per * 4) as u64;
        ensure!(
            per_chunk_bytes <= self.max_chunk,
            "{OP}: one chunk's scratch ({per_chunk_bytes} bytes) exceeds the largest device buffer"
        );
        let max_round = ((self.max_chunk / per_chunk_bytes) as usize).clamp(1, 4096);
        // All chunks in order: (sequence index, chunk index within it, first row, rows).
        let mut all = Vec::new();
        for (si, s) in seqs.iter().enumerate() {
            let (first, rows) = (s[1] as usize, s[2] as usize);
            for (ci, r0) in (0..rows).step_by(c).enumerate() {
                all.push((si, ci, first + r0, c.min(rows - r0)));
            }
        }
        let round = max_round.min(all.len());
        let scratch = self.alloc(&[round * h, per], DType::F32)?;
        let scr = scratch.single(OP, "scratch")?;
        let [qn, kn, g, v, b] = ins;
        for part in all.chunks(round) {
            let mut tab: Vec<u32> = part
                .iter()
                .flat_map(|&(_, _, r0, rows)| [r0 as u32, rows as u32])
                .collect();
            let seq_off = tab.len();
            let mut nseq = 0;
            for (i, &(si, ci, _, _)) in part.iter().enumerate() {
                if i == 0 || part[i - 1].0 != si {
                    let count = part[i..].iter().take_while(|x| x.0 == si).count();
                    let fresh = seqs[si][3] != 0 && ci == 0;
                    tab.extend([seqs[si][0], i as u32, count as u32, fresh as u32]);
                    nseq += 1;
                }
            }
            let tabt = self.upload_u32(&tab)?;
            let tb = tabt.single(OP, "table")?;
            let groups = part.len() * h;
            self.dispatch(
                &pipelines::KDA_CHUNK_PREP_K,
                &[
                    groups as u32,
                    h as u32,
                    kd as u32,
                    vd as u32,
                    per as u32,
                    0,
                    0,
                    0,
                ],
                &[
                    qn.single(OP, "q (normalised)")?,
                    kn.single(OP, "k (normalised)")?,
                    g.single(OP, "g")?,
                    v.single(OP, "v")?,
                    b.single(OP, "b")?,
                    tb,
                    scr,
                ],
                Self::grid(OP, groups as u64)?,
            )?;
            let total = nseq * h * vd;
            self.dispatch(
                &pipelines::KDA_CHUNK_STATE_K,
                &[
                    total as u32,
                    h as u32,
                    kd as u32,
                    vd as u32,
                    per as u32,
                    seq_off as u32,
                    0,
                    0,
                ],
                &[scr, tb, state, out],
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )?;
        }
        Ok(())
    }

    pub(crate) fn short_conv_impl(
        &self,
        x: &WTensor,
        w: &WTensor,
        state: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<WTensor> {
        const OP: &str = "short_conv";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            x.shape.len() == 2 && x.shape[0] == n,
            "{OP}: x must have shape [{n}, C], got {:?}",
            x.shape
        );
        let c = x.shape[1];
        ensure!(
            w.shape.len() == 2 && w.shape[0] == c && w.shape[1] >= 2,
            "{OP}: w must have shape [{c}, W] with W >= 2, got {:?}",
            w.shape
        );
        let width = w.shape[1];
        ensure!(
            state.shape.len() == 3 && state.shape[1..] == [c, width - 1],
            "{OP}: state must have shape [slots, {c}, {}], got {:?}",
            width - 1,
            state.shape
        );
        Self::float_in(OP, "state", state)?;
        ensure!(
            hm.token_seq.len() == n,
            "{OP}: token_seq must have {n} entries"
        );
        let seqs = Self::state_seqs(OP, hm, state.shape[0])?;
        let x = &self.f32_of(OP, "x", x)?;
        let w = &self.f32_of(OP, "w", w)?;
        let out = self.alloc(&[n, c], DType::F32)?;
        if seqs.is_empty() || c == 0 {
            return Ok(out);
        }
        ensure!(
            (n.max(seqs.len()) * c) < u32::MAX as usize && state.numel() < u32::MAX as usize,
            "{OP}: sizes exceed 32-bit indexing"
        );
        let tab = self.upload_u32(seqs.as_flattened())?;
        let p = [n as u32, c as u32, width as u32, seqs.len() as u32];
        let bufs = [
            x.single(OP, "x")?,
            w.single(OP, "w")?,
            state.single(OP, "state")?,
            tab.single(OP, "table")?,
            meta.token_seq.single(OP, "token_seq")?,
            out.single(OP, "output")?,
        ];
        // Outputs first (they read the old history), then the history update.
        self.dispatch(
            &pipelines::SHORT_CONV_K,
            &p,
            &bufs,
            Self::grid(OP, ((n * c) as u64).div_ceil(64))?,
        )?;
        self.dispatch(
            &pipelines::SHORT_CONV_STATE,
            &p,
            &bufs,
            Self::grid(OP, ((seqs.len() * c) as u64).div_ceil(64))?,
        )?;
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn kda_impl(
        &self,
        q: &WTensor,
        k: &WTensor,
        v: &WTensor,
        a: &WTensor,
        b: &WTensor,
        a_log: &WTensor,
        dt_bias: &WTensor,
        lower_bound: Option<f32>,
        state: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<WTensor> {
        const OP: &str = "kda";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q.shape.len() == 3 && q.shape[0] == n,
            "{OP}: q must have shape [{n}, H, K], got {:?}",
            q.shape
        );
        let (h, kd) = (q.shape[1], q.shape[2]);
        ensure!(
            k.shape == q.shape && a.shape == q.shape,
            "{OP}: k and a must have shape [{n}, {h}, {kd}] like q, got {:?} and {:?}",
            k.shape,
            a.shape
        );
        ensure!(
            v.shape.len() == 3 && v.shape[..2] == [n, h] && b.shape == [n, h],
            "{OP}: v must have shape [{n}, {h}, V] and b [{n}, {h}], got {:?} and {:?}",
            v.shape,
            b.shape
        );
        let vd = v.shape[2];
        ensure!(
            a_log.numel() == h && dt_bias.numel() == h * kd,
            "{OP}: a_log must have {h} values and dt_bias [{h}, {kd}], got {:?} and {:?}",
            a_log.shape,
            dt_bias.shape
        );
        ensure!(
            state.shape.len() == 4 && state.shape[1..] == [h, kd, vd],
            "{OP}: state must have shape [slots, {h}, {kd}, {vd}], got {:?}",
            state.shape
        );
        ensure!(
            (1..=128).contains(&kd) && vd >= 1,
            "{OP}: the WGSL kernels need 1 <= K <= 128 and V >= 1, got K {kd}, V {vd}"
        );
        Self::float_in(OP, "state", state)?;
        let seqs = Self::state_seqs(OP, hm, state.shape[0])?;
        ensure!(
            (n * h * kd.max(vd)) < u32::MAX as usize && state.numel() < u32::MAX as usize,
            "{OP}: sizes exceed 32-bit indexing"
        );
        let f = |name: &str, t: &WTensor| self.f32_of(OP, name, t);
        let (q, k, v, a, b) = (f("q", q)?, f("k", k)?, f("v", v)?, f("a", a)?, f("b", b)?);
        let (a_log, dt_bias) = (f("a_log", a_log)?, f("dt_bias", dt_bias)?);
        let out = self.alloc(&[n, h, vd], DType::F32)?;
        if seqs.is_empty() || h == 0 {
            return Ok(out);
        }
        // Normalised q (· K^-½), k and the log decay g, per (token, head).
        let qn = self.alloc(&[n, h, kd], DType::F32)?;
        let kn = self.alloc(&[n, h, kd], DType::F32)?;
        let g = self.alloc(&[n, h, kd], DType::F32)?;
        if n > 0 {
            let p = [
                (n * h) as u32,
                h as u32,
                kd as u32,
                lower_bound.is_some() as u32,
                f32_param(lower_bound.unwrap_or(0.0)),
                f32_param(1.0 / (kd as f32).sqrt()),
                0,
                0,
            ];
            self.dispatch(
                &pipelines::KDA_PREP_K,
                &p,
                &[
                    q.single(OP, "q")?,
                    k.single(OP, "k")?,
                    a.single(OP, "a")?,
                    a_log.single(OP, "a_log")?,
                    dt_bias.single(OP, "dt_bias")?,
                    qn.single(OP, "q (normalised)")?,
                    kn.single(OP, "k (normalised)")?,
                    g.single(OP, "g")?,
                ],
                Self::grid(OP, ((n * h) as u64).div_ceil(64))?,
            )?;
        }
        // Chunks are aligned to absolute positions: the rows up to the next multiple of
        // KDA_CHUNK run the token recurrence, whole chunks the chunked form, the rest the
        // recurrence again — so a prompt split at multiples of KDA_CHUNK (prefix-cache hits,
        // chunked prefill) gives the same bits as one pass.
        let (mut head, mut chunked, mut tail) = (Vec::new(), Vec::new(), Vec::new());
        for [slot, first, rows, fresh] in seqs {
            let pos = if rows > 0 {
                hm.positions[first as usize] as usize
            } else {
                0
            };
            let c = KDA_CHUNK;
            let lead = ((c - pos % c) % c).min(rows as usize) as u32;
            let whole = ((rows - lead) as usize / c * c) as u32;
            let (whole, rest) = if whole as usize >= self.kda_chunk_min.max(1) {
                (whole, rows - lead - whole)
            } else {
                (0, rows - lead)
            };
            let mut fresh = fresh;
            if lead > 0 {
                head.push([slot, first, lead, fresh]);
                fresh = 0;
            }
            if whole > 0 {
                chunked.push([slot, first + lead, whole, fresh]);
                fresh = 0;
            }
            if rest > 0 || (lead == 0 && whole == 0) {
                tail.push([slot, first + lead + whole, rest, fresh]);
            }
        }
        let sb = state.single(OP, "state")?;
        let ob = out.single(OP, "output")?;
        self.kda_recurrent_pass(&head, [h, kd, vd], [&qn, &kn, &g, &v, &b], sb, ob)?;
        if !chunked.is_empty() {
            self.kda_chunked(&chunked, [h, kd, vd], [&qn, &kn, &g, &v, &b], sb, ob)?;
        }
        self.kda_recurrent_pass(&tail, [h, kd, vd], [&qn, &kn, &g, &v, &b], sb, ob)?;
        Ok(out)
    }

    /// The token recurrence (`kda_recurrent.wgsl`) for the sequences `seqs`
    /// (`(slot, first row, rows, fresh)`), updating their states in place.
    fn kda_recurrent_pass(
        &self,
        recurrent: &[[u32; 4]],
        [h, kd, vd]: [usize; 3],
        [qn, kn, g, v, b]: [&WTensor; 5],
        sb: &wgpu::Buffer,
        ob: &wgpu::Buffer,
    ) -> Result<()> {
        const OP: &str = "kda";
        {
            if recurrent.is_empty() {
                return Ok(());
            }
            let tab = self.upload_u32(recurrent.as_flattened())?;
            let total = recurrent.len() * h * vd;
            self.dispatch(
                &pipelines::KDA_RECURRENT_K,
                &[total as u32, h as u32, kd as u32, vd as u32],
                &[
                    qn.single(OP, "q (normalised)")?,
                    kn.single(OP, "k (normalised)")?,
                    g.single(OP, "g")?,
                    v.single(OP, "v")?,
                    b.single(OP, "b")?,
                    sb,
                    tab.single(OP, "table")?,
                    ob,
                ],
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )?;
        }
        Ok(())
    }

    pub(crate) fn gated_rms_norm_impl(
        &self,
        x: &WTensor,
        gate: &WTensor,
        w: &WTensor,
        eps: f32,
    ) -> Result<WTensor> {
        const OP: &str = "gated_rms_norm";
        ensure!(
            x.shape.len() == 2,
            "{OP}: x must have shape [R, D], got {:?}",
            x.shape
        );
        let (r, d) = (x.shape[0], x.shape[1]);
        ensure!(
            gate.shape == x.shape && w.shape == [d],
            "{OP}: gate must have shape [{r}, {d}] and w [{d}], got {:?} and {:?}",
            gate.shape,
            w.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let gate = &self.f32_of(OP, "gate", gate)?;
        let w = &self.f32_of(OP, "w", w)?;
        let out = self.alloc(&[r, d], DType::F32)?;
        if r * d == 0 {
            return Ok(out);
        }
        self.dispatch(
            &pipelines::GATED_RMS_NORM,
            &[r as u32, d as u32, f32_param(eps), 0],
            &[
                x.single(OP, "x")?,
                gate.single(OP, "gate")?,
                w.single(OP, "w")?,
                out.single(OP, "output")?,
            ],
            Self::grid(OP, r as u64)?,
        )?;
        Ok(out)
    }
}
