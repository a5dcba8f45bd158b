//! Batch invariance (serving.md §D4): with [`Backend::batch_invariant`] true, a row's result
//! must not depend on the other rows of its call — the property that makes a prefix-cache hit
//! (which computes only the suffix), every chunk size and a batch of requests bit-exact with the
//! request computed alone. Each check computes the same rows inside calls of different sizes and
//! compositions and demands equal bytes; a backend that picks kernels or reduction splits by M
//! or by the step's batch fails them. Backends whose `batch_invariant()` is false are skipped.

use crate::conformance::{activation_dtypes, rand_tensor, Rng};
use crate::{Backend, DType, HostTensor, StepMeta};
use anyhow::Result;

/// Every check of this module, for each activation dtype of `b`.
pub fn check_batch_invariance<B: Backend>(b: &B) -> Result<()> {
    if !b.batch_invariant() {
        return Ok(());
    }
    for dt in activation_dtypes(b) {
        check_linear_rows(b, dt)?;
        check_head_linear_rows(b, dt)?;
        check_linear_quant_rows(b, dt)?;
        check_attention_queries(b, dt)?;
        check_latent_attention_queries(b, dt)?;
    }
    Ok(())
}

/// Rows `start .. start + len` of `t` (dim 0).
fn rows(t: &HostTensor, start: usize, len: usize) -> Result<HostTensor> {
    let rb = t.data.len() / t.shape[0].max(1);
    let mut shape = t.shape.clone();
    shape[0] = len;
    HostTensor::new(
        shape,
        t.dtype,
        t.data[start * rb..(start + len) * rb].to_vec(),
    )
}

/// Fails unless `got` equals rows `start ..` of `full`, byte for byte.
fn same_rows(
    op: &str,
    case: &str,
    got: &HostTensor,
    full: &HostTensor,
    start: usize,
) -> Result<()> {
    let want = rows(full, start, got.shape[0])?;
    let case = format!(
        "{case}; row 0 here is row {start} of the same call over {} rows",
        full.shape[0]
    );
    crate::conformance::same_bytes(op, &case, got, &want)
}

/// Row slices `(start, len)` of a 70-row input: single rows, decode-sized, odd and large calls.
const SLICES: [(usize, usize); 8] = [
    (0, 1),
    (5, 1),
    (3, 7),
    (10, 17),
    (0, 33),
    (21, 49),
    (64, 6),
    (1, 69),
];

/// `linear` (with and without bias) and `linear_f32`: every slice of x equals those rows of
/// the whole product.
pub fn check_linear_rows<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(41);
    for &(k, n) in &[(96usize, 48usize), (37, 20), (256, 136)] {
        let x = rand_tensor(&mut rng, &[70, k], dt, 1.0)?;
        let w = rand_tensor(&mut rng, &[n, k], dt, 1.0)?;
        let bias = rand_tensor(&mut rng, &[n], dt, 1.0)?;
        let (wd, bd) = (b.upload(&w)?, b.upload(&bias)?);
        let full = b.download(&b.linear(&b.upload(&x)?, &wd, None)?)?;
        let full_b = b.download(&b.linear(&b.upload(&x)?, &wd, Some(&bd))?)?;
        let full_f = b.download(&b.linear_f32(&b.upload(&x)?, &wd)?)?;
        for &(s, len) in &SLICES {
            let xs = b.upload(&rows(&x, s, len)?)?;
            let case = format!("{dt} K {k} N {n} rows {s}..{}", s + len);
            same_rows(
                "linear",
                &case,
                &b.download(&b.linear(&xs, &wd, None)?)?,
                &full,
                s,
            )?;
            let got = b.download(&b.linear(&xs, &wd, Some(&bd))?)?;
            same_rows("linear + bias", &case, &got, &full_b, s)?;
            let got = b.download(&b.linear_f32(&xs, &wd)?)?;
            same_rows("linear_f32", &case, &got, &full_f, s)?;
        }
    }
    Ok(())
}

/// `linear_quant` for every block format (decode GEMVs on the codes vs decode-then-GEMM).
pub fn check_linear_quant_rows<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(45);
    for f in crate::conformance_quant::formats() {
        // Columns: a multiple of the K-quants' 256-value super-blocks.
        let k = if f.scale.is_super_block() { 256 } else { 192 };
        let w = crate::conformance_quant::rand_quant(&mut rng, f, [1, 40, k])?;
        let wd = crate::QuantTensor::upload(b, &w)?;
        let x = rand_tensor(&mut rng, &[70, k], dt, 1.0)?;
        let full = b.download(&b.linear_quant(&b.upload(&x)?, &wd, None)?)?;
        for &(s, len) in &SLICES {
            let got = b.download(&b.linear_quant(&b.upload(&rows(&x, s, len)?)?, &wd, None)?)?;
            let case = format!("{} {dt} rows {s}..{}", f.name(), s + len);
            same_rows("linear_quant", &case, &got, &full, s)?;
        }
    }
    Ok(())
}

/// `head_linear` (per-head products of MLA's absorbed form): token slices equal those rows.
pub fn check_head_linear_rows<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(42);
    let (h, k, o) = (3, 64, 40);
    let x = rand_tensor(&mut rng, &[70, h, k], dt, 1.0)?;
    let w = b.upload(&rand_tensor(&mut rng, &[h, o, k], dt, 1.0)?)?;
    let full = b.download(&b.head_linear(&b.upload(&x)?, &w)?)?;
    for &(s, len) in &SLICES {
        let got = b.download(&b.head_linear(&b.upload(&rows(&x, s, len)?)?, &w)?)?;
        same_rows(
            "head_linear",
            &format!("{dt} rows {s}..{}", s + len),
            &got,
            &full,
            s,
        )?;
    }
    Ok(())
}

/// Step metadata for sequences that all read one block table (as prefix-shared sequences do):
/// sequence `i` has `seqs[i].0` tokens cached and `seqs[i].1` new ones.
fn shared_meta(bs: usize, table: &[u32], seqs: &[(usize, usize)]) -> StepMeta {
    let mut m = StepMeta {
        max_blocks: table.len(),
        block_size: bs,
        ..Default::default()
    };
    m.query_start.push(0);
    for (s, &(ctx, new)) in seqs.iter().enumerate() {
        m.block_tables.extend_from_slice(table);
        for p in ctx..ctx + new {
            m.positions.push(p as u32);
            m.token_seq.push(s as u32);
            m.slot_mapping
                .push(table[p / bs] * bs as u32 + (p % bs) as u32);
        }
        m.seq_lens.push((ctx + new) as u32);
        m.query_start.push(m.positions.len() as u32);
        m.logit_rows.push(m.positions.len() as u32 - 1);
        m.max_seq_len = m.max_seq_len.max(ctx + new);
    }
    m
}

/// Steps over one 1 100-token sequence (past two of CUDA's 512-key invariant chunks): the whole
/// prompt at once (the reference), a decode step alone, a chunk, decode batches of 12 (a
/// split-K decode kernel splits these differently), queries at the chunk edges and mixed steps.
const STEPS: [&[(usize, usize)]; 6] = [
    &[(1099, 1)],
    &[(600, 500)],
    &[(1099, 1); 12],
    &[(511, 1), (512, 1), (1023, 1), (1024, 1), (0, 1)],
    &[(1050, 1), (10, 40), (0, 1), (1099, 1), (537, 3)],
    &[(64, 64), (128, 1)],
];
const ATTN_LEN: usize = 1100;

/// The query rows a step of [`shared_meta`] takes from the whole prompt's `[1100, …]` queries.
fn step_queries(q: &HostTensor, seqs: &[(usize, usize)]) -> Result<HostTensor> {
    let rb = q.data.len() / q.shape[0];
    let mut data = Vec::new();
    for &(ctx, new) in seqs {
        data.extend_from_slice(&q.data[ctx * rb..(ctx + new) * rb]);
    }
    let mut shape = q.shape.clone();
    shape[0] = data.len() / rb;
    HostTensor::new(shape, q.dtype, data)
}

/// Compares each step row with the whole prompt's row at its position.
fn same_as_prompt(
    op: &str,
    dt: DType,
    seqs: &[(usize, usize)],
    got: &HostTensor,
    full: &HostTensor,
) -> Result<()> {
    let mut row = 0;
    for &(ctx, new) in seqs {
        let case = format!("{dt} step {seqs:?}, positions {ctx}..{}", ctx + new);
        same_rows(op, &case, &rows(got, row, new)?, full, ctx)?;
        row += new;
    }
    Ok(())
}

/// `paged_attention`: a query's output is the same whatever step computes it.
pub fn check_attention_queries<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(43);
    let (h, hkv, hd, bs) = (8, 2, 64, 16);
    let blocks = ATTN_LEN.div_ceil(bs) + 2;
    let mut table: Vec<u32> = (0..blocks as u32).collect();
    rng.shuffle(&mut table);
    table.truncate(ATTN_LEN.div_ceil(bs));
    let q = rand_tensor(&mut rng, &[ATTN_LEN, h, hd], dt, 3.0)?;
    let kc = b.upload(&rand_tensor(&mut rng, &[blocks, bs, hkv, hd], dt, 1.0)?)?;
    let vc = b.upload(&rand_tensor(&mut rng, &[blocks, bs, hkv, hd], dt, 1.0)?)?;
    let scale = 0.125;
    let attend = |seqs: &[(usize, usize)], q: &HostTensor| -> Result<HostTensor> {
        let meta = b.upload_meta(shared_meta(bs, &table, seqs))?;
        b.download(&b.paged_attention(&b.upload(q)?, &kc, &vc, &meta, scale)?)
    };
    let full = attend(&[(0, ATTN_LEN)], &q)?;
    for seqs in STEPS {
        let got = attend(seqs, &step_queries(&q, seqs)?)?;
        same_as_prompt("paged_attention", dt, seqs, &got, &full)?;
    }
    Ok(())
}

/// `paged_latent_attention` (MLA over the latent cache): as [`check_attention_queries`].
pub fn check_latent_attention_queries<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(44);
    let (h, l, r, bs) = (4, 64, 16, 16);
    let blocks = ATTN_LEN.div_ceil(bs) + 1;
    let mut table: Vec<u32> = (0..blocks as u32).collect();
    rng.shuffle(&mut table);
    table.truncate(ATTN_LEN.div_ceil(bs));
    let q_lat = rand_tensor(&mut rng, &[ATTN_LEN, h, l], dt, 1.0)?;
    let q_rope = rand_tensor(&mut rng, &[ATTN_LEN, h, r], dt, 1.0)?;
    let cache = b.upload(&rand_tensor(&mut rng, &[blocks, bs, l + r], dt, 1.0)?)?;
    let attend =
        |seqs: &[(usize, usize)], ql: &HostTensor, qr: &HostTensor| -> Result<HostTensor> {
            let meta = b.upload_meta(shared_meta(bs, &table, seqs))?;
            let out =
                b.paged_latent_attention(&b.upload(ql)?, &b.upload(qr)?, &cache, &meta, 0.1)?;
            b.download(&out)
        };
    let full = attend(&[(0, ATTN_LEN)], &q_lat, &q_rope)?;
    for seqs in STEPS {
        let got = attend(
            seqs,
            &step_queries(&q_lat, seqs)?,
            &step_queries(&q_rope, seqs)?,
        )?;
        same_as_prompt("paged_latent_attention", dt, seqs, &got, &full)?;
    }
    Ok(())
}
