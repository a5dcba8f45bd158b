//! Moving cache bytes within the device (state checkpoints) and between the device and the
//! host-memory tier (evicted blocks, swapped sequences), around each step's forward pass.

use super::Engine;
use crate::metrics::Preemption;
use crate::scheduler::{ScheduledChunk, StepPlan};
use anyhow::Result;
use dayone_backend::{Backend, HostTensor};
use std::time::Instant;

impl<B: Backend> Engine<B> {
    /// Moves bytes between the device and the host tier before the step's forward pass: first
    /// every copy off the device (sequences swapped out, cached blocks evicted for new data),
    /// then every copy onto it (blocks paged back on a host hit, swapped sequences resumed), so
    /// that a block freed and reused within one step is read before it is overwritten.
    pub(super) fn page(&mut self, plan: &StepPlan) -> Result<()> {
        let evicted = self.scheduler.take_evicted();
        if self.scheduler.host_tier().is_none() {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut out_bytes = 0u64;
        let b = &self.backend;
        let blocks_t = self.cache.block_tensors();
        let state_t = self.cache.state_tensors();
        for (id, blocks, slot) in &plan.swap_out {
            let mut rows = Vec::new();
            for t in &blocks_t {
                rows.push(b.read_rows(t, blocks)?);
            }
            if let Some(slot) = slot {
                for t in &state_t {
                    rows.push(b.read_rows(t, &[*slot])?);
                }
            }
            out_bytes += rows.iter().map(|r| r.data.len() as u64).sum::<u64>();
            self.scheduler.swapped_out(*id, std::sync::Arc::new(rows));
            self.metrics.on_preemption(Preemption::Swap);
        }
        if !evicted.is_empty() {
            let ids: Vec<u32> = evicted.iter().map(|e| e.0).collect();
            // One read per cache tensor for all evicted blocks, regrouped by block (moved, not
            // copied again).
            let mut per_block: Vec<Vec<HostTensor>> = evicted.iter().map(|_| Vec::new()).collect();
            for t in &blocks_t {
                for (block, row) in per_block.iter_mut().zip(split_rows(b.read_rows(t, &ids)?)) {
                    block.push(row);
                }
            }
            for ((_, h), rows) in evicted.iter().zip(per_block) {
                out_bytes += rows.iter().map(|r| r.data.len() as u64).sum::<u64>();
                self.scheduler.store_evicted(*h, std::sync::Arc::new(rows));
            }
        }
        if out_bytes > 0 {
            self.metrics
                .on_host_store(out_bytes, t0.elapsed().as_secs_f64());
        }
        let t1 = Instant::now();
        let mut in_bytes = 0u64;
        if !plan.host_loads.is_empty() {
            // One copy per cache tensor for all of this step's blocks.
            let ids: Vec<u32> = plan.host_loads.iter().map(|l| l.0).collect();
            // Stacking the blocks' rows is host memcpy (and fresh pages) over every byte: one
            // thread per cache tensor, then the device writes in order.
            let bytes: usize = plan
                .host_loads
                .iter()
                .flat_map(|l| l.1.iter())
                .map(|r| r.data.len())
                .sum();
            let stacked: Vec<HostTensor> = if bytes < 8 << 20 {
                (0..blocks_t.len())
                    .map(|j| concat_rows(plan.host_loads.iter().map(|l| &l.1[j])))
                    .collect()
            } else {
                std::thread::scope(|sc| {
                    let jobs: Vec<_> = (0..blocks_t.len())
                        .map(|j| {
                            sc.spawn(move || concat_rows(plan.host_loads.iter().map(|l| &l.1[j])))
                        })
                        .collect();
                    jobs.into_iter()
                        .map(|h| h.join().expect("row stacking does not panic"))
                        .collect()
                })
            };
            for (t, rows) in blocks_t.iter().zip(&stacked) {
                in_bytes += rows.data.len() as u64;
                b.write_rows(t, &ids, rows)?;
            }
        }
        for (blocks, slot, rows) in &plan.swap_in {
            let (kv, state) = rows.split_at(blocks_t.len());
            for (t, r) in blocks_t.iter().zip(kv) {
                b.write_rows(t, blocks, r)?;
                in_bytes += r.data.len() as u64;
            }
            if let Some(slot) = slot {
                for (t, r) in state_t.iter().zip(state) {
                    b.write_rows(t, &[*slot], r)?;
                    in_bytes += r.data.len() as u64;
                }
            }
        }
        for (slot, rows) in &plan.state_loads {
            for (t, r) in state_t.iter().zip(rows.iter()) {
                b.write_rows(t, &[*slot], r)?;
                in_bytes += r.data.len() as u64;
            }
        }
        if in_bytes > 0 {
            // The copies are queued; wait for them so that the time measures the transfer.
            b.synchronize()?;
            self.metrics
                .on_host_load(in_bytes, t1.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Records the step's progress in the scheduler and takes the state checkpoints it asks
    /// for, keeping a checkpoint that a slot held in the host tier before copying over it (one
    /// pair at a time: a slot reused twice in one step is read before each overwrite).
    pub(super) fn advance(&mut self, chunks: &[ScheduledChunk]) -> Result<()> {
        for (from, to, old) in self.scheduler.update_from_output(chunks) {
            if let (Some(old), true) = (old, self.scheduler.host_tier().is_some()) {
                let rows = self
                    .cache
                    .state_tensors()
                    .into_iter()
                    .map(|t| self.backend.read_rows(t, &[to]))
                    .collect::<Result<Vec<_>>>()?;
                self.scheduler.store_state(&old, std::sync::Arc::new(rows));
            }
            self.copy_state_slots(&[(from, to)])?;
        }
        Ok(())
    }

    /// Copies state slot `from` to `to` for each pair, in every recurrent layer's tensors.
    pub(super) fn copy_state_slots(&self, pairs: &[(u32, u32)]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        for t in self.cache.state_tensors() {
            self.backend.copy_rows(t, pairs)?;
        }
        Ok(())
    }
}

/// `[n, …]` rows as `n` tensors `[1, …]` (bytes verbatim).
fn split_rows(t: HostTensor) -> Vec<HostTensor> {
    let n = t.shape.first().copied().unwrap_or(0);
    let row = t.data.len() / n.max(1);
    let mut shape = t.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = 1;
    }
    t.data
        .chunks(row.max(1))
        .take(n)
        .map(|c| HostTensor {
            shape: shape.clone(),
            dtype: t.dtype,
            data: c.to_vec(),
        })
        .collect()
}

/// Tensors `[1, …]` stacked into `[n, …]` (bytes verbatim).
fn concat_rows<'a>(rows: impl Iterator<Item = &'a HostTensor>) -> HostTensor {
    let mut out: Option<HostTensor> = None;
    for r in rows {
        match &mut out {
            None => out = Some(r.clone()),
            Some(o) => {
                o.shape[0] += r.shape[0];
                o.data.extend_from_slice(&r.data);
            }
        }
    }
    out.expect("at least one row")
}
