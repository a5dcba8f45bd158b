//! Moving cache bytes within the device (state checkpoints) and between the device and the
//! host-memory tier (evicted blocks, swapped sequences), around each step's forward pass.

use super::Engine;
use crate::metrics::Preemption;
use crate::scheduler::{ScheduledChunk, StepPlan};
use anyhow::Result;
use dayone_backend::{Backend, HostRow};
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
                rows.push(b.rows_to_host(t, blocks)?);
            }
            if let Some(slot) = slot {
                for t in &state_t {
                    rows.push(b.rows_to_host(t, &[*slot])?);
                }
            }
            out_bytes += row_bytes(&rows);
            self.scheduler.swapped_out(*id, std::sync::Arc::new(rows));
            self.metrics.on_preemption(Preemption::Swap);
        }
        if !evicted.is_empty() {
            let ids: Vec<u32> = evicted.iter().map(|e| e.0).collect();
            // One copy per cache tensor for all evicted blocks, regrouped by block (moved).
            let mut per_block: Vec<Vec<Vec<HostRow>>> =
                evicted.iter().map(|_| Vec::new()).collect();
            for t in &blocks_t {
                for (block, row) in per_block.iter_mut().zip(b.rows_to_host(t, &ids)?) {
                    block.push(vec![row]);
                }
            }
            for ((_, h), rows) in evicted.iter().zip(per_block) {
                out_bytes += row_bytes(&rows);
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
            // One copy per cache tensor for all of this step's blocks, straight from the rows
            // (on CUDA one kernel reads the page-locked rows; elsewhere they are stacked).
            let ids: Vec<u32> = plan.host_loads.iter().map(|l| l.0).collect();
            for (j, t) in blocks_t.iter().enumerate() {
                let src: Vec<&HostRow> = plan.host_loads.iter().flat_map(|l| &l.1[j]).collect();
                in_bytes += src.iter().map(|r| r.len() as u64).sum::<u64>();
                b.rows_from_host(t, &ids, &src)?;
            }
        }
        for (blocks, slot, rows) in &plan.swap_in {
            let (kv, state) = rows.split_at(blocks_t.len());
            for (t, r) in blocks_t.iter().zip(kv) {
                b.rows_from_host(t, blocks, &r.iter().collect::<Vec<_>>())?;
            }
            if let Some(slot) = slot {
                for (t, r) in state_t.iter().zip(state) {
                    b.rows_from_host(t, &[*slot], &r.iter().collect::<Vec<_>>())?;
                }
            }
            in_bytes += row_bytes(rows);
        }
        for (slot, rows) in &plan.state_loads {
            for (t, r) in state_t.iter().zip(rows.iter()) {
                b.rows_from_host(t, &[*slot], &r.iter().collect::<Vec<_>>())?;
            }
            in_bytes += row_bytes(rows);
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
                    .map(|t| self.backend.rows_to_host(t, &[to]))
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

/// Bytes held by the rows of every cache tensor of one entry.
fn row_bytes(rows: &[Vec<HostRow>]) -> u64 {
    rows.iter().flatten().map(|r| r.len() as u64).sum()
}
