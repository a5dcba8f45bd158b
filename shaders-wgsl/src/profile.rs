//! Per-kernel GPU timing for finding where a step's time goes (`DAYONE_WGSL_PROFILE=1`).
//!
//! The WGSL twin of the CUDA backend's profiler: a pair of GPU timestamps around each dispatch
//! (inside the compute pass with [`wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES`], else one
//! compute pass per dispatch with pass timestamps, [`wgpu::Features::TIMESTAMP_QUERY`]). The
//! timestamps are resolved at each submission and read back there (synchronously: profiled
//! runs serialise the host and the GPU, so compare wall-clock times only with unprofiled runs).
//! When the backend is dropped it prints, to stderr, one line per kernel entry point: launches,
//! total ms, mean µs, share of the timed total; plus the GPU time the submissions spanned from
//! their first to their last timestamp, whose excess over the kernels' sum is the GPU idling
//! between dispatches (barriers, launch gaps).

use std::collections::HashMap;

/// Environment variable turning the profiler on: `1`, or `pass` to time each dispatch in a
/// compute pass of its own even where timestamps inside passes are available.
pub const PROFILE_ENV: &str = "DAYONE_WGSL_PROFILE";

/// How timestamps are written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// `ComputePass::write_timestamp` around each dispatch in the shared pass.
    InsidePasses,
    /// A compute pass per dispatch with beginning/end-of-pass timestamps.
    PerPass,
}

/// Launch timings by kernel entry point.
pub(crate) struct Profiler {
    pub(crate) mode: Mode,
    pub(crate) queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
    /// Entry points of the dispatches recorded since the last submission; dispatch `i` writes
    /// queries `2i` (start) and `2i + 1` (end).
    pub(crate) pending: Vec<&'static str>,
    /// entry → (launches, total ms)
    totals: HashMap<&'static str, (u64, f64)>,
    /// GPU ms from the first to the last timestamp of each submission, summed.
    span_ms: f64,
}

impl Profiler {
    /// The features to request for `mode` on an adapter offering `have`: `None` (after one
    /// warning line) when it cannot time dispatches.
    pub(crate) fn features(have: wgpu::Features) -> Option<(Mode, wgpu::Features)> {
        let ts = wgpu::Features::TIMESTAMP_QUERY;
        let inside = ts | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        if have.contains(inside) {
            Some((Mode::InsidePasses, inside))
        } else if have.contains(ts) {
            Some((Mode::PerPass, ts))
        } else {
            eprintln!(
                "{PROFILE_ENV}: this adapter has no timestamp queries (TIMESTAMP_QUERY); profiling nothing"
            );
            None
        }
    }

    /// A profiler for up to `max_ops` dispatches per submission.
    pub(crate) fn new(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        mode: Mode,
        max_ops: usize,
    ) -> Self {
        let n = 2 * max_ops as u32;
        let bytes = n as u64 * wgpu::QUERY_SIZE as u64;
        Self {
            mode,
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("dayone-wgsl profile"),
                ty: wgpu::QueryType::Timestamp,
                count: n,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("dayone-wgsl profile resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            staging: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("dayone-wgsl profile staging"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            period_ns: queue.get_timestamp_period() as f64,
            pending: Vec::new(),
            totals: HashMap::new(),
            span_ms: 0.0,
        }
    }

    /// Records, into `enc` (the compute pass already ended), the copy of this submission's
    /// timestamps to the staging buffer. Returns whether there is anything to collect.
    pub(crate) fn resolve(&self, enc: &mut wgpu::CommandEncoder) -> bool {
        let n = 2 * self.pending.len() as u32;
        if n == 0 {
            return false;
        }
        enc.resolve_query_set(&self.queries, 0..n, &self.resolve, 0);
        enc.copy_buffer_to_buffer(
            &self.resolve,
            0,
            &self.staging,
            0,
            Some(n as u64 * wgpu::QUERY_SIZE as u64),
        );
        true
    }

    /// After the submission holding [`Profiler::resolve`]'s copy: waits for it and adds the
    /// durations to the totals.
    pub(crate) fn collect(&mut self, device: &wgpu::Device) {
        let n = 2 * self.pending.len();
        let bytes = (n * wgpu::QUERY_SIZE as usize) as u64;
        let slice = self.staging.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let ok = device.poll(wgpu::PollType::wait_indefinitely()).is_ok()
            && matches!(rx.recv(), Ok(Ok(())));
        if ok {
            let ticks: Vec<u64> = match slice.get_mapped_range() {
                Ok(v) => bytemuck::cast_slice::<u8, u64>(&v).to_vec(),
                Err(_) => Vec::new(),
            };
            self.staging.unmap();
            let (mut lo, mut hi) = (u64::MAX, 0u64);
            for (i, name) in self.pending.iter().enumerate() {
                let (Some(&a), Some(&b)) = (ticks.get(2 * i), ticks.get(2 * i + 1)) else {
                    break;
                };
                lo = lo.min(a);
                hi = hi.max(b);
                let ms = b.saturating_sub(a) as f64 * self.period_ns * 1e-6;
                let t = self.totals.entry(name).or_insert((0, 0.0));
                t.0 += 1;
                t.1 += ms;
            }
            if hi > lo {
                self.span_ms += (hi - lo) as f64 * self.period_ns * 1e-6;
            }
        }
        self.pending.clear();
    }

    /// The table, longest total first, and resets the totals (`None` when nothing was timed).
    pub(crate) fn take_report(&mut self) -> Option<String> {
        if self.totals.is_empty() {
            return None;
        }
        let total: f64 = self.totals.values().map(|t| t.1).sum();
        let mut rows: Vec<_> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let mut s = format!(
            "{PROFILE_ENV}: {:.3} ms in {} timed dispatches ({:?} timestamps); submissions \
             spanned {:.3} ms of GPU time (the excess is idling between dispatches)\n\
             {:<44} {:>9} {:>11} {:>10} {:>7}\n",
            total,
            self.totals.values().map(|t| t.0).sum::<u64>(),
            self.mode,
            self.span_ms,
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
        self.totals.clear();
        self.span_ms = 0.0;
        Some(s)
    }
}
