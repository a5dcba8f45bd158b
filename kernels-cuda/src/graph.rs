//! CUDA graphs (`Backend::capture_graph` / `replay_graph`): the work a closure queues on the
//! backend's stream is captured once (`cuStreamBeginCapture`, relaxed mode) and replayed with
//! one `cuGraphLaunch`, so a decode step costs one launch instead of hundreds (multigpu-perf.md
//! §D). What breaks a capture is refused while it runs: uploads, read-backs and synchronisation
//! (`CudaBackend::not_capturing`), so a model that reads back mid-step fails its capture with a
//! clear error and the caller stays eager. Memory: the allocator routes every allocation and
//! free of a capture to the graphs' lists (`Pool::begin_graph`), shared by all graphs (they
//! replay one at a time on the one stream), so the addresses a graph replays are never handed
//! to other tensors while any graph lives.

use crate::device::drv;
use crate::{CudaBackend, CudaTensor};
use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::{sys, CudaGraph};
use std::collections::HashMap;

/// The captured graphs of one backend, by id.
#[derive(Default)]
pub(crate) struct Graphs {
    next: u64,
    by_id: HashMap<u64, CudaGraph>,
}

// SAFETY: a `CudaGraph` is used only under the backend's `graphs` mutex (cudarc's note: graph
// objects must not be accessed from two threads at once).
unsafe impl Send for Graphs {}

impl CudaBackend {
    /// Errors when a graph capture is in progress: `what` would break it (a host copy or a
    /// synchronisation cannot be replayed).
    pub(crate) fn not_capturing(&self, what: &str) -> Result<()> {
        if self.pool.is_capturing() {
            bail!("{what} inside a CUDA graph capture: this step cannot run as a graph");
        }
        Ok(())
    }

    pub(crate) fn capture_graph_impl(
        &self,
        f: &mut dyn FnMut() -> Result<CudaTensor>,
    ) -> Result<(u64, CudaTensor)> {
        self.bind()?;
        // The in-kernel merges' counters exist before the capture, so a captured step takes
        // the same fused launches as an eager one (graphs == eager bit for bit).
        self.decode_counters()?;
        let id = {
            let mut g = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
            g.next += 1;
            g.next
        };
        self.pool.begin_graph();
        if let Err(e) = self
            .stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        {
            self.pool.end_graph(false);
            return Err(drv("cuStreamBeginCapture")(e));
        }
        let out = f();
        let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let graph = match (out, ended) {
            (Ok(t), Ok(Some(g))) => (t, g),
            (out, ended) => {
                self.pool.end_graph(false);
                let e = match (out, ended) {
                    (Err(e), _) => e,
                    (_, Err(e)) => drv("cuStreamEndCapture / cuGraphInstantiate")(e),
                    _ => anyhow!("the capture recorded no work"),
                };
                return Err(e.context("CUDA graph capture"));
            }
        };
        self.pool.end_graph(true);
        let (out, graph) = graph;
        if let Err(e) = graph.upload() {
            drop(graph);
            self.pool.drop_graph();
            return Err(drv("cuGraphUpload")(e));
        }
        self.graphs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .insert(id, graph);
        Ok((id, out))
    }

    pub(crate) fn replay_graph_impl(&self, id: u64) -> Result<()> {
        let g = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        let graph = g
            .by_id
            .get(&id)
            .with_context(|| format!("replay_graph: no CUDA graph {id}"))?;
        graph.launch().map_err(drv("cuGraphLaunch"))
    }

    pub(crate) fn drop_graph_impl(&self, id: u64) {
        let removed = self
            .graphs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .remove(&id);
        if let Some(graph) = removed {
            // The graph may still be running: its memory is reused only after the stream drains.
            let _ = self.stream.synchronize();
            drop(graph);
            self.pool.drop_graph();
        }
    }
}
