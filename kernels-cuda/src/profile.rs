//! Per-kernel timing for finding where a step's time goes (`DAYONE_CUDA_PROFILE=1`).
//!
//! Nsight Systems is not available on every machine this runs on (and Nsight Compute replays
//! each kernel in isolation), so the backend can time its own launches: a pair of CUDA events
//! around each kernel and each cuBLAS call, outside graph captures. The events serialise the
//! stream (programmatic dependent launch no longer overlaps neighbours), so the table shows
//! each kernel's own duration, not the step's. When the backend is dropped it prints, to
//! stderr, one line per kernel name: launches, total ms, mean µs, share of the timed total.

use crate::device::drv;
use anyhow::Result;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Event pairs kept before they are folded into the totals (each fold synchronises).
const PENDING_MAX: usize = 4096;

/// Launch timings by kernel name.
pub(crate) struct Profiler {
    pending: Vec<(String, CudaEvent, CudaEvent)>,
    /// name → (launches, total milliseconds)
    totals: HashMap<String, (u64, f64)>,
}

impl Profiler {
    /// A profiler when `DAYONE_CUDA_PROFILE=1`, else `None`.
    pub(crate) fn from_env() -> Option<Mutex<Profiler>> {
        (std::env::var("DAYONE_CUDA_PROFILE").as_deref() == Ok("1")).then(|| {
            Mutex::new(Profiler {
                pending: Vec::new(),
                totals: HashMap::new(),
            })
        })
    }

    /// Records a start event on `stream`; pass it to [`Profiler::end`] after the launch.
    pub(crate) fn start(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>) -> Result<CudaEvent> {
        let e = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("profiler event"))?;
        e.record(stream).map_err(drv("profiler event record"))?;
        Ok(e)
    }

    /// Records the end event of `name`'s launch begun at `start`.
    pub(crate) fn end(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        name: String,
        start: CudaEvent,
    ) -> Result<()> {
        let end = Self::start(ctx, stream)?;
        self.pending.push((name, start, end));
        if self.pending.len() >= PENDING_MAX {
            self.fold()?;
        }
        Ok(())
    }

    /// Waits for the pending events and adds their durations to the totals.
    fn fold(&mut self) -> Result<()> {
        for (name, start, end) in self.pending.drain(..) {
            end.synchronize().map_err(drv("profiler event sync"))?;
            let ms = start.elapsed_ms(&end).map_err(drv("profiler elapsed"))? as f64;
            let t = self.totals.entry(name).or_insert((0, 0.0));
            t.0 += 1;
            t.1 += ms;
        }
        Ok(())
    }

    /// The table, longest total first (empty when nothing was timed).
    pub(crate) fn report(&mut self) -> String {
        if let Err(e) = self.fold() {
            return format!("DAYONE_CUDA_PROFILE: {e}\n");
        }
        let total: f64 = self.totals.values().map(|t| t.1).sum();
        let mut rows: Vec<_> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let mut s = format!(
            "DAYONE_CUDA_PROFILE: {:.3} ms in {} timed launches\n{:<44} {:>9} {:>11} {:>10} {:>7}\n",
            total,
            self.totals.values().map(|t| t.0).sum::<u64>(),
            "kernel",
            "launches",
            "total ms",
            "mean us",
            "share"
        );
        for (name, (n, ms)) in rows {
            s += &format!(
                "{:<44} {:>9} {:>11.3} {:>10.2} {:>6.1}%\n",
                name,
                n,
                ms,
                1e3 * ms / *n as f64,
                100.0 * ms / total.max(1e-12)
            );
        }
        s
    }
}
