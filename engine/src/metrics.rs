//! The engine's metrics as plain data: gauges, counters and fixed-bucket histograms that the
//! engine thread updates through the `on_*` / `set_*` methods of [`EngineMetrics`], and that
//! readers take as a [`MetricsSnapshot`] (a `Clone + Send` copy, for the server's `/metrics`
//! exporter of issue [7], `dayone bench` and logs).
//!
//! Names and buckets follow vLLM (`vllm/v1/metrics/loggers.py`, `buckets.py`; serving.md §C1) so
//! that an exporter can publish each field under the vLLM name given in its doc comment and vLLM
//! dashboards work unchanged; fields vLLM has no name for are marked *dayone* with the name to
//! export. Units: seconds for times, tokens for token counts, bytes for bytes, blocks for blocks.
//! Counters only grow; gauges are set to the engine's current state.

use crate::scheduler::FinishReason;
use std::fmt::Write as _;

/// Time-to-first-token buckets, seconds (`vllm:time_to_first_token_seconds`).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// Per-token latency buckets, seconds (`vllm:inter_token_latency_seconds`,
/// `vllm:request_time_per_output_token_seconds`).
pub const TOKEN_LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// Request-level latency buckets, seconds (`vllm:e2e_request_latency_seconds`,
/// `vllm:request_queue_time_seconds`).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Token-count buckets `1, 2, 5, 10, 20, 50, …` up to and including `max` (vLLM
/// `build_1_2_5_buckets(max_model_len)`, for `vllm:request_prompt_tokens` and
/// `vllm:request_generation_tokens`). `max = 0` gives no bounds (one `+Inf` bucket).
pub fn token_buckets(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale: u64 = 1;
    'outer: loop {
        for m in [1u64, 2, 5] {
            match m.checked_mul(scale) {
                Some(v) if v <= max as u64 => out.push(v as f64),
                _ => break 'outer,
            }
        }
        match scale.checked_mul(10) {
            Some(s) => scale = s,
            None => break,
        }
    }
    out
}

/// A histogram with fixed upper bounds, as Prometheus keeps one: a value `v` falls into the
/// first bucket whose bound `b` satisfies `v ≤ b` (Prometheus `le`), else into the `+Inf`
/// bucket; the sum and count of all observations are kept beside.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// One count per bound plus the `+Inf` bucket (not cumulative).
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (non-finite bounds are dropped; the rest sorted and
    /// deduplicated, so the buckets are always well formed).
    pub fn new(bounds: &[f64]) -> Self {
        let mut b: Vec<f64> = bounds.iter().copied().filter(|x| x.is_finite()).collect();
        b.sort_by(f64::total_cmp);
        b.dedup();
        Self {
            counts: vec![0; b.len() + 1],
            bounds: b,
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one value. NaN is ignored (it would poison the sum).
    pub fn observe(&mut self, v: f64) {
        if v.is_nan() {
            return;
        }
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// The finite upper bounds, increasing.
    pub fn bounds(&self) -> &[f64] {
        &self.bounds
    }

    /// Observations per bucket (`bounds().len() + 1` entries, the last for `+Inf`), not
    /// cumulative.
    pub fn bucket_counts(&self) -> &[u64] {
        &self.counts
    }

    /// Cumulative counts as Prometheus exports them: entry `i` counts values `≤ bounds()[i]`;
    /// the last entry (`le="+Inf"`) equals [`Histogram::count`].
    pub fn cumulative_counts(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0u64, |acc, &c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }

    /// Sum of all observed values.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of observed values.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Mean of the observed values, `None` before the first.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }

    /// The `q`-quantile (`0 ≤ q ≤ 1`) estimated from the buckets as Prometheus'
    /// `histogram_quantile` does: linear within the bucket holding the rank, the first bucket
    /// starting at 0 (or at its bound when that is negative), and the largest finite bound for
    /// ranks in `+Inf`. `None` without observations or for `q` outside `[0, 1]`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = q * self.count as f64;
        let cum = self.cumulative_counts();
        let i = cum.iter().position(|&c| c as f64 >= rank)?;
        if i == self.bounds.len() {
            return self.bounds.last().copied().or(Some(f64::INFINITY));
        }
        let hi = self.bounds[i];
        let lo = if i == 0 {
            hi.min(0.0)
        } else {
            self.bounds[i - 1]
        };
        let below = if i == 0 { 0 } else { cum[i - 1] };
        let in_bucket = self.counts[i];
        if in_bucket == 0 {
            return Some(hi);
        }
        Some(lo + (hi - lo) * (rank - below as f64) / in_bucket as f64)
    }
}

/// Which admission queue a waiting request sits in (serving config
/// `runtime.long_prefill_threshold`: prompts above it wait in the long queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// Prompts up to the threshold.
    Short,
    /// Prompts above the threshold.
    Long,
}

/// How a running sequence was preempted to make room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preemption {
    /// Its blocks and state were copied to the host tier, to be paged back.
    Swap,
    /// Its blocks were freed; it recomputes its tokens when resumed.
    Recompute,
}

/// Copies between device and host tier, in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TransferCounters {
    /// Copies made (each a batch of blocks or one sequence's state), count.
    pub count: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds spent in the copies (wall time as measured by the engine).
    pub seconds: f64,
}

impl TransferCounters {
    /// Average bandwidth in bytes per second, `None` before any timed copy.
    pub fn bytes_per_second(&self) -> Option<f64> {
        (self.seconds > 0.0).then(|| self.bytes as f64 / self.seconds)
    }
}

/// Finished requests by reason (`vllm:request_success{finished_reason}`; dayone adds
/// `context`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FinishCounts {
    /// An end-of-sequence or stop token (`finished_reason="stop"`).
    pub stop: u64,
    /// `max_tokens` reached (`"length"`).
    pub length: u64,
    /// The context window filled (`"context"`, dayone).
    pub context: u64,
    /// Aborted by the caller (`"abort"`).
    pub abort: u64,
}

impl FinishCounts {
    /// The counter for `reason`.
    pub fn get(&self, reason: FinishReason) -> u64 {
        match reason {
            FinishReason::Eos => self.stop,
            FinishReason::Length => self.length,
            FinishReason::ContextFull => self.context,
            FinishReason::Abort => self.abort,
        }
    }

    fn bump(&mut self, reason: FinishReason) {
        let c = match reason {
            FinishReason::Eos => &mut self.stop,
            FinishReason::Length => &mut self.length,
            FinishReason::ContextFull => &mut self.context,
            FinishReason::Abort => &mut self.abort,
        };
        *c += 1;
    }

    /// All finished requests.
    pub fn total(&self) -> u64 {
        self.stop + self.length + self.context + self.abort
    }
}

/// What the engine knows about a request when it finishes, for
/// [`EngineMetrics::on_request_finished`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FinishedRequest {
    /// Why it stopped.
    pub reason: FinishReason,
    /// Seconds from arrival to first being scheduled (its whole life if it never was).
    pub queue_s: f64,
    /// Seconds from arrival to its first generated token; `None` if it produced none.
    pub ttft_s: Option<f64>,
    /// Seconds from arrival to finishing.
    pub e2e_s: f64,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Generated tokens.
    pub gen_len: usize,
}

/// Every metric's value at one moment. Plain data (`Clone + Send`): a copy taken from the
/// engine thread that no later update changes.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsSnapshot {
    /// Gauge, requests: sequences scheduled (prefilling or decoding). `vllm:num_requests_running`.
    pub requests_running: u64,
    /// Gauge, requests: waiting in the short queue. `vllm:num_requests_waiting` is the sum of
    /// both queues; per queue *dayone* `dayone:num_requests_waiting{queue="short"}`.
    pub requests_waiting_short: u64,
    /// Gauge, requests: waiting in the long-prompt queue (`{queue="long"}`).
    pub requests_waiting_long: u64,
    /// Gauge, blocks: KV blocks held by at least one sequence. `vllm:kv_cache_usage_perc` is
    /// [`MetricsSnapshot::kv_cache_usage`].
    pub kv_blocks_used: u64,
    /// Gauge, blocks: KV blocks no sequence holds (cached ones included).
    pub kv_blocks_free: u64,
    /// Gauge, blocks: free blocks that still hold a cached prefix, evictable in LRU order
    /// (*dayone* `dayone:kv_blocks_cached`; SGLang `kv_evictable_tokens` counts tokens).
    pub kv_blocks_cached: u64,
    /// Counter, tokens: prompt tokens looked up in the device prefix cache.
    /// `vllm:prefix_cache_queries`.
    pub prefix_cache_queries: u64,
    /// Counter, tokens: of those, tokens found on the device. `vllm:prefix_cache_hits`.
    pub prefix_cache_hits: u64,
    /// Counter, tokens: tokens looked up in the host tier (after a device miss).
    /// `vllm:external_prefix_cache_queries`.
    pub host_cache_queries: u64,
    /// Counter, tokens: of those, tokens found on the host. `vllm:external_prefix_cache_hits`
    /// (also `vllm:prompt_tokens_cached_by_source{source="host"}`).
    pub host_cache_hits: u64,
    /// Counter, tokens: prompt tokens looked up in the recurrent-state checkpoints (hybrid
    /// models' KDA layers). *dayone* `dayone:state_checkpoint_queries` (serving.md §H.6: beside
    /// `vllm:prefix_cache_*`, so zero hits on hybrids are visible).
    pub state_checkpoint_queries: u64,
    /// Counter, tokens: of those, tokens for which a checkpoint resumed the state.
    /// *dayone* `dayone:state_checkpoint_hits`.
    pub state_checkpoint_hits: u64,
    /// Counters: copies device → host tier. `vllm:kv_offload_store_bytes` (bytes),
    /// `vllm:kv_offload_store_time` (seconds); count *dayone* `dayone:kv_offload_store_count`.
    pub host_store: TransferCounters,
    /// Counters: copies host tier → device. `vllm:kv_offload_load_bytes`,
    /// `vllm:kv_offload_load_time`; count *dayone* `dayone:kv_offload_load_count`.
    pub host_load: TransferCounters,
    /// Counter, preemptions: by swapping to the host tier. `vllm:num_preemptions` is the sum
    /// of both kinds; per kind `dayone:num_preemptions{kind="swap"}`.
    pub preemptions_swap: u64,
    /// Counter, preemptions: by freeing and recomputing (`{kind="recompute"}`).
    pub preemptions_recompute: u64,
    /// Counter, tokens: prompt tokens of requests that produced their first token.
    /// `vllm:prompt_tokens`.
    pub prompt_tokens: u64,
    /// Counter, tokens: generated tokens. `vllm:generation_tokens`.
    pub generation_tokens: u64,
    /// Counters, requests: finished, by reason. `vllm:request_success{finished_reason}`.
    pub finished: FinishCounts,
    /// Histogram, seconds: arrival to first token ([`TTFT_BUCKETS`]).
    /// `vllm:time_to_first_token_seconds`.
    pub ttft: Histogram,
    /// Histogram, seconds: between consecutive tokens of a request ([`TOKEN_LATENCY_BUCKETS`]).
    /// `vllm:inter_token_latency_seconds`.
    pub inter_token_latency: Histogram,
    /// Histogram, seconds: per request `(e2e − ttft) / (generated − 1)`, for requests with at
    /// least two tokens ([`TOKEN_LATENCY_BUCKETS`]). `vllm:request_time_per_output_token_seconds`.
    pub time_per_output_token: Histogram,
    /// Histogram, seconds: arrival to first scheduled ([`REQUEST_LATENCY_BUCKETS`]).
    /// `vllm:request_queue_time_seconds`.
    pub queue_time: Histogram,
    /// Histogram, seconds: arrival to finish ([`REQUEST_LATENCY_BUCKETS`]).
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e_latency: Histogram,
    /// Histogram, tokens: prompt length of finished requests ([`token_buckets`] of
    /// `max_model_len`). `vllm:request_prompt_tokens`.
    pub prompt_len: Histogram,
    /// Histogram, tokens: generated tokens of finished requests ([`token_buckets`]).
    /// `vllm:request_generation_tokens`.
    pub generation_len: Histogram,
}

/// `hits / queries`, `None` before any query.
fn ratio(hits: u64, queries: u64) -> Option<f64> {
    (queries > 0).then(|| hits as f64 / queries as f64)
}

impl MetricsSnapshot {
    fn new(max_model_len: usize) -> Self {
        let tokens = token_buckets(max_model_len);
        Self {
            requests_running: 0,
            requests_waiting_short: 0,
            requests_waiting_long: 0,
            kv_blocks_used: 0,
            kv_blocks_free: 0,
            kv_blocks_cached: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            host_cache_queries: 0,
            host_cache_hits: 0,
            state_checkpoint_queries: 0,
            state_checkpoint_hits: 0,
            host_store: TransferCounters::default(),
            host_load: TransferCounters::default(),
            preemptions_swap: 0,
            preemptions_recompute: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            finished: FinishCounts::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(TOKEN_LATENCY_BUCKETS),
            time_per_output_token: Histogram::new(TOKEN_LATENCY_BUCKETS),
            queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            e2e_latency: Histogram::new(REQUEST_LATENCY_BUCKETS),
            prompt_len: Histogram::new(&tokens),
            generation_len: Histogram::new(&tokens),
        }
    }

    /// Requests waiting in both queues (`vllm:num_requests_waiting`).
    pub fn requests_waiting(&self) -> u64 {
        self.requests_waiting_short + self.requests_waiting_long
    }

    /// Fraction `0..=1` of KV blocks held by sequences, `used / (used + free)`
    /// (`vllm:kv_cache_usage_perc`; cached blocks are free). 0 without blocks.
    pub fn kv_cache_usage(&self) -> f64 {
        ratio(
            self.kv_blocks_used,
            self.kv_blocks_used + self.kv_blocks_free,
        )
        .unwrap_or(0.0)
    }

    /// Device prefix-cache hit rate in tokens, `None` before any query.
    pub fn prefix_cache_hit_rate(&self) -> Option<f64> {
        ratio(self.prefix_cache_hits, self.prefix_cache_queries)
    }

    /// Host-tier hit rate in tokens, `None` before any query.
    pub fn host_cache_hit_rate(&self) -> Option<f64> {
        ratio(self.host_cache_hits, self.host_cache_queries)
    }

    /// State-checkpoint hit rate in tokens, `None` before any query.
    pub fn state_checkpoint_hit_rate(&self) -> Option<f64> {
        ratio(self.state_checkpoint_hits, self.state_checkpoint_queries)
    }

    /// All preemptions (`vllm:num_preemptions`).
    pub fn preemptions(&self) -> u64 {
        self.preemptions_swap + self.preemptions_recompute
    }

    /// A few lines for people (`dayone bench`, logs): gauges, counters with hit rates, and
    /// per histogram its count, mean and bucket-estimated median and p99.
    pub fn render_text(&self) -> String {
        let pct = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{:.1}%", 100.0 * r));
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let rate = |t: &TransferCounters| {
            t.bytes_per_second()
                .map_or("-".to_string(), |r| format!("{:.2} GB/s", r / 1e9))
        };
        let f = &self.finished;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "requests: {} running, {} waiting ({} short, {} long); finished {} (stop {}, length {}, context {}, abort {})",
            self.requests_running,
            self.requests_waiting(),
            self.requests_waiting_short,
            self.requests_waiting_long,
            f.total(),
            f.stop,
            f.length,
            f.context,
            f.abort
        );
        let _ = writeln!(
            s,
            "kv blocks: {} used, {} free ({} cached), usage {:.1}%",
            self.kv_blocks_used,
            self.kv_blocks_free,
            self.kv_blocks_cached,
            100.0 * self.kv_cache_usage()
        );
        let _ = writeln!(
            s,
            "prefix cache: {}/{} tokens hit ({}); host tier {}/{} ({}); state checkpoints {}/{} ({})",
            self.prefix_cache_hits,
            self.prefix_cache_queries,
            pct(self.prefix_cache_hit_rate()),
            self.host_cache_hits,
            self.host_cache_queries,
            pct(self.host_cache_hit_rate()),
            self.state_checkpoint_hits,
            self.state_checkpoint_queries,
            pct(self.state_checkpoint_hit_rate())
        );
        let _ = writeln!(
            s,
            "host tier: {} stores {:.1} MiB ({}), {} loads {:.1} MiB ({})",
            self.host_store.count,
            mib(self.host_store.bytes),
            rate(&self.host_store),
            self.host_load.count,
            mib(self.host_load.bytes),
            rate(&self.host_load)
        );
        let _ = writeln!(
            s,
            "preemptions: {} swap, {} recompute; tokens: {} prompt, {} generated",
            self.preemptions_swap,
            self.preemptions_recompute,
            self.prompt_tokens,
            self.generation_tokens
        );
        for (name, unit, h) in [
            ("ttft", "s", &self.ttft),
            ("inter-token latency", "s", &self.inter_token_latency),
            ("time per output token", "s", &self.time_per_output_token),
            ("queue time", "s", &self.queue_time),
            ("e2e latency", "s", &self.e2e_latency),
            ("prompt length", " tokens", &self.prompt_len),
            ("generation length", " tokens", &self.generation_len),
        ] {
            let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}{unit}"));
            let _ = writeln!(
                s,
                "{name}: n={} mean {} p50≈{} p99≈{}",
                h.count(),
                num(h.mean()),
                num(h.quantile(0.5)),
                num(h.quantile(0.99))
            );
        }
        s
    }
}

impl std::fmt::Display for MetricsSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render_text())
    }
}

/// The engine's metrics, owned by the engine thread and updated by it; readers get
/// [`EngineMetrics::snapshot`]s. Each method documents which fields of [`MetricsSnapshot`] it
/// changes (their units and vLLM names are documented there).
#[derive(Clone, Debug)]
pub struct EngineMetrics {
    m: MetricsSnapshot,
}

impl EngineMetrics {
    /// Zeroed metrics; the token-length histograms get [`token_buckets`]`(max_model_len)`.
    pub fn new(max_model_len: usize) -> Self {
        Self {
            m: MetricsSnapshot::new(max_model_len),
        }
    }

    /// A copy of every value now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        self.m.clone()
    }

    /// The human summary of [`MetricsSnapshot::render_text`], without a copy.
    pub fn render_text(&self) -> String {
        self.m.render_text()
    }

    /// Sets the request gauges: `running` sequences and the waiting queues' lengths.
    pub fn set_requests(&mut self, running: usize, waiting_short: usize, waiting_long: usize) {
        self.m.requests_running = running as u64;
        self.m.requests_waiting_short = waiting_short as u64;
        self.m.requests_waiting_long = waiting_long as u64;
    }

    /// Sets the waiting gauge of one queue.
    pub fn set_waiting(&mut self, queue: Queue, waiting: usize) {
        match queue {
            Queue::Short => self.m.requests_waiting_short = waiting as u64,
            Queue::Long => self.m.requests_waiting_long = waiting as u64,
        }
    }

    /// Sets the KV block gauges: `used` (held by sequences), `free` (held by none) and
    /// `cached` (of the free ones, those still holding a cached prefix).
    pub fn set_kv_blocks(&mut self, used: usize, free: usize, cached: usize) {
        self.m.kv_blocks_used = used as u64;
        self.m.kv_blocks_free = free as u64;
        self.m.kv_blocks_cached = cached as u64;
    }

    /// A device prefix-cache lookup of `query_tokens` prompt tokens that found `hit_tokens`
    /// (`prefix_cache_queries`, `prefix_cache_hits`).
    pub fn on_prefix_query(&mut self, query_tokens: usize, hit_tokens: usize) {
        self.m.prefix_cache_queries += query_tokens as u64;
        self.m.prefix_cache_hits += hit_tokens as u64;
    }

    /// A host-tier lookup of `query_tokens` tokens that found `hit_tokens`
    /// (`host_cache_queries`, `host_cache_hits`).
    pub fn on_host_query(&mut self, query_tokens: usize, hit_tokens: usize) {
        self.m.host_cache_queries += query_tokens as u64;
        self.m.host_cache_hits += hit_tokens as u64;
    }

    /// A state-checkpoint lookup of `query_tokens` tokens that resumed from a checkpoint
    /// covering `hit_tokens` (`state_checkpoint_queries`, `state_checkpoint_hits`).
    pub fn on_state_checkpoint_query(&mut self, query_tokens: usize, hit_tokens: usize) {
        self.m.state_checkpoint_queries += query_tokens as u64;
        self.m.state_checkpoint_hits += hit_tokens as u64;
    }

    /// One copy of `bytes` bytes from the device to the host tier that took `seconds`
    /// (`host_store`).
    pub fn on_host_store(&mut self, bytes: u64, seconds: f64) {
        add_transfer(&mut self.m.host_store, bytes, seconds);
    }

    /// One copy of `bytes` bytes from the host tier back to the device that took `seconds`
    /// (`host_load`).
    pub fn on_host_load(&mut self, bytes: u64, seconds: f64) {
        add_transfer(&mut self.m.host_load, bytes, seconds);
    }

    /// One sequence preempted (`preemptions_swap` or `preemptions_recompute`).
    pub fn on_preemption(&mut self, kind: Preemption) {
        match kind {
            Preemption::Swap => self.m.preemptions_swap += 1,
            Preemption::Recompute => self.m.preemptions_recompute += 1,
        }
    }

    /// A request's first generated token, `ttft_s` seconds after it arrived, with a prompt of
    /// `prompt_len` tokens (`ttft`, `prompt_tokens`, one `generation_tokens`).
    pub fn on_first_token(&mut self, prompt_len: usize, ttft_s: f64) {
        self.m.ttft.observe(ttft_s);
        self.m.prompt_tokens += prompt_len as u64;
        self.m.generation_tokens += 1;
    }

    /// A later token of a request, `itl_s` seconds after its previous one
    /// (`inter_token_latency`, one `generation_tokens`).
    pub fn on_next_token(&mut self, itl_s: f64) {
        self.m.inter_token_latency.observe(itl_s);
        self.m.generation_tokens += 1;
    }

    /// A request finished (`finished`, `queue_time`, `e2e_latency`, `prompt_len`,
    /// `generation_len`, and `time_per_output_token` when it produced at least two tokens).
    pub fn on_request_finished(&mut self, r: &FinishedRequest) {
        self.m.finished.bump(r.reason);
        self.m.queue_time.observe(r.queue_s);
        self.m.e2e_latency.observe(r.e2e_s);
        self.m.prompt_len.observe(r.prompt_len as f64);
        self.m.generation_len.observe(r.gen_len as f64);
        if let (Some(ttft), true) = (r.ttft_s, r.gen_len > 1) {
            self.m
                .time_per_output_token
                .observe((r.e2e_s - ttft) / (r.gen_len - 1) as f64);
        }
    }
}

fn add_transfer(t: &mut TransferCounters, bytes: u64, seconds: f64) {
    t.count += 1;
    t.bytes += bytes;
    if seconds.is_finite() && seconds > 0.0 {
        t.seconds += seconds;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_on_a_bound_goes_into_that_bucket() {
        let mut h = Histogram::new(&[1.0, 2.0, 5.0]);
        for v in [1.0, 0.5, -3.0, 1.000001, 2.0, 5.0, 5.000001, 1e9] {
            h.observe(v);
        }
        // ≤1: 1.0, 0.5, -3.0 · (1,2]: 1.000001, 2.0 · (2,5]: 5.0 · +Inf: 5.000001, 1e9
        assert_eq!(h.bucket_counts(), [3, 2, 1, 2]);
        assert_eq!(h.cumulative_counts(), [3, 5, 6, 8]);
        assert_eq!(h.count(), 8);
    }

    #[test]
    fn sum_count_and_mean() {
        let mut h = Histogram::new(TTFT_BUCKETS);
        assert_eq!(h.mean(), None);
        for v in [0.25, 0.5, 1.25] {
            h.observe(v);
        }
        h.observe(f64::NAN);
        assert_eq!(h.count(), 3);
        assert_eq!(h.sum(), 2.0);
        assert_eq!(h.mean(), Some(2.0 / 3.0));
        assert_eq!(h.cumulative_counts().last(), Some(&3));
    }

    #[test]
    fn bounds_are_sorted_and_finite() {
        let h = Histogram::new(&[5.0, f64::INFINITY, 1.0, 1.0, f64::NAN, 2.0]);
        assert_eq!(h.bounds(), [1.0, 2.0, 5.0]);
        assert_eq!(h.bucket_counts().len(), 4);
    }

    #[test]
    fn quantile_interpolates_within_buckets() {
        let mut h = Histogram::new(&[1.0, 2.0, 4.0]);
        for v in [0.5, 1.5, 1.5, 3.0] {
            h.observe(v);
        }
        // rank 2 of 4 lies halfway through the (1, 2] bucket (cumulative 1 → 3).
        assert_eq!(h.quantile(0.5), Some(1.5));
        assert_eq!(h.quantile(1.0), Some(4.0));
        assert_eq!(h.quantile(1.5), None);
        h.observe(100.0);
        assert_eq!(
            h.quantile(1.0),
            Some(4.0),
            "+Inf ranks report the largest bound"
        );
    }

    #[test]
    fn vllm_bucket_bounds() {
        let m = EngineMetrics::new(4096).snapshot();
        assert_eq!(m.ttft.bounds().len(), 22);
        assert_eq!(m.ttft.bounds()[0], 0.001);
        assert_eq!(m.ttft.bounds().last(), Some(&2560.0));
        assert_eq!(m.inter_token_latency.bounds(), TOKEN_LATENCY_BUCKETS);
        assert_eq!(m.time_per_output_token.bounds().len(), 19);
        assert_eq!(m.e2e_latency.bounds().len(), 21);
        assert_eq!(m.queue_time.bounds().last(), Some(&7680.0));
        assert_eq!(token_buckets(100), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(m.prompt_len.bounds().last(), Some(&2000.0));
        assert_eq!(token_buckets(1_000_000).last(), Some(&1_000_000.0));
        assert!(token_buckets(0).is_empty());
        assert!(
            token_buckets(usize::MAX).len() > 50,
            "no overflow at the top"
        );
    }

    #[test]
    fn snapshot_is_independent_of_later_updates() {
        fn clone_send<T: Clone + Send + 'static>(_: &T) {}
        let mut m = EngineMetrics::new(1024);
        m.on_prefix_query(64, 32);
        m.on_first_token(64, 0.2);
        let before = m.snapshot();
        clone_send(&before);
        m.on_prefix_query(64, 64);
        m.on_next_token(0.02);
        m.set_kv_blocks(3, 7, 2);
        assert_eq!(before.prefix_cache_queries, 64);
        assert_eq!(before.prefix_cache_hit_rate(), Some(0.5));
        assert_eq!(before.inter_token_latency.count(), 0);
        assert_eq!(before.kv_blocks_used, 0);
        let after = m.snapshot();
        assert_eq!(after.prefix_cache_hits, 96);
        assert_eq!(after.generation_tokens, 2);
        assert_eq!(after.kv_cache_usage(), 0.3);
        assert_ne!(before, after);
    }

    #[test]
    fn finished_requests_feed_the_request_histograms() {
        let mut m = EngineMetrics::new(1024);
        m.on_request_finished(&FinishedRequest {
            reason: FinishReason::Length,
            queue_s: 0.1,
            ttft_s: Some(0.5),
            e2e_s: 2.5,
            prompt_len: 100,
            gen_len: 5,
        });
        m.on_request_finished(&FinishedRequest {
            reason: FinishReason::Abort,
            queue_s: 3.0,
            ttft_s: None,
            e2e_s: 3.0,
            prompt_len: 7,
            gen_len: 0,
        });
        let s = m.snapshot();
        assert_eq!(s.finished.get(FinishReason::Length), 1);
        assert_eq!(s.finished.get(FinishReason::Abort), 1);
        assert_eq!(s.finished.total(), 2);
        // (2.5 − 0.5) / 4 = 0.5 s per output token; the aborted request has none.
        assert_eq!(s.time_per_output_token.count(), 1);
        assert_eq!(s.time_per_output_token.sum(), 0.5);
        assert_eq!(s.e2e_latency.sum(), 5.5);
        assert_eq!(s.queue_time.count(), 2);
        assert_eq!(s.prompt_len.sum(), 107.0);
        assert_eq!(s.generation_len.cumulative_counts()[0], 1, "0 tokens ≤ 1");
    }

    #[test]
    fn counters_and_gauges_by_kind() {
        let mut m = EngineMetrics::new(1024);
        m.set_requests(4, 2, 1);
        m.set_waiting(Queue::Long, 3);
        m.on_preemption(Preemption::Swap);
        m.on_preemption(Preemption::Recompute);
        m.on_preemption(Preemption::Recompute);
        m.on_host_store(4 << 20, 0.002);
        m.on_host_load(1 << 20, 0.0);
        m.on_host_query(128, 64);
        m.on_state_checkpoint_query(100, 0);
        let s = m.snapshot();
        assert_eq!((s.requests_running, s.requests_waiting()), (4, 5));
        assert_eq!((s.preemptions_swap, s.preemptions_recompute), (1, 2));
        assert_eq!(s.preemptions(), 3);
        assert_eq!(
            s.host_store.bytes_per_second(),
            Some((4 << 20) as f64 / 0.002)
        );
        assert_eq!(s.host_load.count, 1);
        assert_eq!(s.host_load.bytes_per_second(), None);
        assert_eq!(s.host_cache_hit_rate(), Some(0.5));
        assert_eq!(s.state_checkpoint_hit_rate(), Some(0.0));
    }

    #[test]
    fn text_summary_reports_rates() {
        let mut m = EngineMetrics::new(1024);
        m.on_prefix_query(200, 50);
        m.on_first_token(200, 0.04);
        let t = m.render_text();
        assert!(t.contains("prefix cache: 50/200 tokens hit (25.0%)"), "{t}");
        assert!(t.contains("state checkpoints 0/0 (-)"), "{t}");
        assert!(t.contains("ttft: n=1 mean 0.0400s"), "{t}");
        assert_eq!(t, m.snapshot().to_string());
    }
}
