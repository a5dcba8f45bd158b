//! `/metrics`: the engine's metrics in Prometheus text.
//!
//! [`render`] turns a [`MetricsSnapshot`] taken at scrape time, plus the few numbers only the
//! server knows ([`ServerGauges`]), into an OpenMetrics 1.0 exposition (serve it with
//! [`CONTENT_TYPE`]) through `prometheus-client`: a [`Collector`] encodes every metric from the
//! snapshot, so nothing is kept between scrapes.
//!
//! Names are vLLM's (serving.md §C1) with the prefix `dayone:` instead of `vllm:`, so vLLM
//! dashboards work after a rename; buckets are the snapshot's (vLLM's, chosen in
//! `dayone_engine::metrics`). Counters are registered without `_total` and rendered with it.
//! Every sample carries the label `model_name`. What is emitted:
//!
//! | name | type | from |
//! |---|---|---|
//! | `dayone:num_requests_running` | gauge | `requests_running` |
//! | `dayone:num_requests_waiting` | gauge | both queues |
//! | `dayone:num_requests_waiting_by_reason{reason="short"\|"long"}` | gauge | per admission queue (prompts up to / above `long_prefill_threshold`) |
//! | `dayone:kv_cache_usage_perc` | gauge | [`MetricsSnapshot::kv_cache_usage`] (0..1, cached blocks count as free) |
//! | `dayone:kv_blocks_used`, `dayone:kv_blocks_free`, `dayone:kv_blocks_cached` | gauge | KV block gauges (dayone) |
//! | `dayone:prefix_cache_queries`, `dayone:prefix_cache_hits` | counter | device prefix cache, tokens |
//! | `dayone:external_prefix_cache_queries`, `dayone:external_prefix_cache_hits` | counter | host tier, tokens (vLLM's name for the connector tier) |
//! | `dayone:state_checkpoint_queries`, `dayone:state_checkpoint_hits` | counter | recurrent-state checkpoints, tokens (dayone) |
//! | `dayone:kv_offload_{store,load}_bytes`, `…_time` (seconds), `…_count` | counter | host-tier copies |
//! | `dayone:num_preemptions` | counter | all preemptions |
//! | `dayone:num_preemptions_by_kind{kind="swap"\|"recompute"}` | counter | per kind (dayone) |
//! | `dayone:prompt_tokens`, `dayone:generation_tokens` | counter | tokens |
//! | `dayone:request_success{finished_reason="stop"\|"length"\|"context"\|"abort"}` | counter | finished requests |
//! | `dayone:time_to_first_token_seconds`, `dayone:inter_token_latency_seconds`, `dayone:request_time_per_output_token_seconds`, `dayone:e2e_request_latency_seconds`, `dayone:request_queue_time_seconds`, `dayone:request_prompt_tokens`, `dayone:request_generation_tokens` | histogram | the snapshot's histograms |
//! | `dayone:device_memory_bytes{kind="weights"\|"kv_cache"\|"workspace"}` | gauge | [`ServerGauges`] |
//! | `dayone:http_requests_rejected` | counter | [`ServerGauges::requests_rejected`] |
//!
//! Per-kind and per-queue splits get their own `_by_…` names rather than a label on the vLLM
//! name, so `dayone:num_requests_waiting` and `dayone:num_preemptions_total` stay single series
//! that vLLM queries can use unchanged.

use dayone_engine::metrics::{Histogram, MetricsSnapshot, TransferCounters};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::borrow::Cow;

/// Server-side numbers the engine does not know.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerGauges {
    /// Device memory taken by the model weights as the backend holds them (rank 0's under
    /// `-tp`), bytes (`dayone:device_memory_bytes{kind="weights"}`).
    pub weights_bytes: u64,
    /// Device memory taken by the KV cache (and recurrent state), bytes (`{kind="kv_cache"}`).
    pub kv_cache_bytes: u64,
    /// Device memory taken by activations and scratch buffers, bytes (`{kind="workspace"}`).
    pub workspace_bytes: u64,
    /// HTTP requests refused (4xx, 503 when overloaded or shutting down); a counter
    /// (`dayone:http_requests_rejected_total`).
    pub requests_rejected: u64,
    /// The server process's resident host memory, bytes
    /// (`dayone:process_resident_memory_bytes`; 0 where it cannot be read).
    pub resident_bytes: u64,
}

/// The Content-Type of `render`'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renders the metrics with the `dayone:` prefix and a `model_name` label.
///
/// The output is a complete OpenMetrics text exposition: `# HELP` / `# TYPE` per metric, one
/// sample a line, ending with `# EOF`. `model_name` is escaped as a label value (`\`, `"` and
/// newlines), which `prometheus-client` leaves to its caller.
pub fn render(snapshot: &MetricsSnapshot, server: &ServerGauges, model_name: &str) -> String {
    let labels = [(
        Cow::Borrowed("model_name"),
        Cow::Owned(escape_label_value(model_name)),
    )];
    let mut registry = Registry::with_labels(labels.into_iter());
    registry.register_collector(Box::new(Exposition {
        snapshot: snapshot.clone(),
        server: *server,
    }));
    let mut out = String::new();
    // Writing into a String cannot fail, and no encoder here returns an error of its own.
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("encoding metrics into a String");
    out
}

/// OpenMetrics label-value escaping: backslash, double quote and line feed.
fn escape_label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The collector behind [`render`]: one scrape's values.
#[derive(Debug)]
struct Exposition {
    snapshot: MetricsSnapshot,
    server: ServerGauges,
}

/// A histogram of the snapshot, encoded from its bounds and per-bucket counts.
struct HistogramMetric<'a>(&'a Histogram);

impl EncodeMetric for HistogramMetric<'_> {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let h = self.0;
        // The encoder accumulates the counts itself and writes `le="+Inf"` for `f64::MAX`.
        let buckets: Vec<(f64, u64)> = h
            .bounds()
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(h.bucket_counts().iter().copied())
            .collect();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            h.sum(),
            h.count(),
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: V,
) -> std::fmt::Result {
    let g = ConstGauge::new(value);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    let c = ConstCounter::new(value);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

fn counter_f64(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> std::fmt::Result {
    let c = ConstCounter::new(value);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

/// A metric family with one label `key`, one sample per `(value, number)`.
fn family<V: Copy>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: MetricType,
    key: &str,
    samples: &[(&str, V)],
    encode: impl Fn(V, prometheus_client::encoding::MetricEncoder) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, metric_type)?;
    for &(label, v) in samples {
        let labels = [(key, label)];
        encode(v, m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter_family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    key: &str,
    samples: &[(&str, u64)],
) -> std::fmt::Result {
    family(
        enc,
        name,
        help,
        MetricType::Counter,
        key,
        samples,
        |v, e| ConstCounter::new(v).encode(e),
    )
}

fn gauge_family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    key: &str,
    samples: &[(&str, u64)],
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Gauge, key, samples, |v, e| {
        ConstGauge::new(v).encode(e)
    })
}

fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &Histogram,
) -> std::fmt::Result {
    HistogramMetric(h).encode(enc.encode_descriptor(name, help, None, MetricType::Histogram)?)
}

fn transfers(
    enc: &mut DescriptorEncoder,
    dir: &str,
    what: &str,
    t: &TransferCounters,
) -> std::fmt::Result {
    counter(
        enc,
        &format!("dayone:kv_offload_{dir}_bytes"),
        &format!("Bytes copied {what} the host KV tier."),
        t.bytes,
    )?;
    counter_f64(
        enc,
        &format!("dayone:kv_offload_{dir}_time"),
        &format!("Seconds spent copying {what} the host KV tier."),
        t.seconds,
    )?;
    counter(
        enc,
        &format!("dayone:kv_offload_{dir}_count"),
        &format!(
            "Copies {what} the host KV tier (each a batch of blocks or one sequence's state)."
        ),
        t.count,
    )
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.snapshot;
        let e = &mut enc;

        // Scheduler state.
        gauge(
            e,
            "dayone:num_requests_running",
            "Number of requests in model execution batches.",
            s.requests_running,
        )?;
        gauge(
            e,
            "dayone:num_requests_waiting",
            "Number of requests waiting to be processed.",
            s.requests_waiting(),
        )?;
        gauge_family(
            e,
            "dayone:num_requests_waiting_by_reason",
            "Number of requests waiting, by admission queue (short or long prompts).",
            "reason",
            &[
                ("short", s.requests_waiting_short),
                ("long", s.requests_waiting_long),
            ],
        )?;

        // KV cache.
        gauge(
            e,
            "dayone:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            s.kv_cache_usage(),
        )?;
        gauge(
            e,
            "dayone:kv_blocks_used",
            "KV cache blocks held by at least one request.",
            s.kv_blocks_used,
        )?;
        gauge(
            e,
            "dayone:kv_blocks_free",
            "KV cache blocks no request holds, cached ones included.",
            s.kv_blocks_free,
        )?;
        gauge(
            e,
            "dayone:kv_blocks_cached",
            "Free KV cache blocks that still hold a cached prefix (evictable).",
            s.kv_blocks_cached,
        )?;
        counter(
            e,
            "dayone:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries,
        )?;
        counter(
            e,
            "dayone:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_cache_hits,
        )?;
        counter(
            e,
            "dayone:external_prefix_cache_queries",
            "Host-tier prefix cache queries (after a device miss), in terms of number of queried tokens.",
            s.host_cache_queries,
        )?;
        counter(
            e,
            "dayone:external_prefix_cache_hits",
            "Host-tier prefix cache hits, in terms of number of cached tokens.",
            s.host_cache_hits,
        )?;
        counter(
            e,
            "dayone:state_checkpoint_queries",
            "Recurrent-state checkpoint queries, in terms of number of queried tokens.",
            s.state_checkpoint_queries,
        )?;
        counter(
            e,
            "dayone:state_checkpoint_hits",
            "Recurrent-state checkpoint hits, in terms of number of tokens resumed from a checkpoint.",
            s.state_checkpoint_hits,
        )?;
        transfers(e, "store", "from the device to", &s.host_store)?;
        transfers(e, "load", "back to the device from", &s.host_load)?;

        // Preemptions, tokens, finished requests.
        counter(
            e,
            "dayone:num_preemptions",
            "Cumulative number of preemption from the engine.",
            s.preemptions(),
        )?;
        counter_family(
            e,
            "dayone:num_preemptions_by_kind",
            "Cumulative number of preemption from the engine, by kind (swap to the host tier or recompute).",
            "kind",
            &[
                ("swap", s.preemptions_swap),
                ("recompute", s.preemptions_recompute),
            ],
        )?;
        counter(
            e,
            "dayone:prompt_tokens",
            "Number of prefill tokens processed.",
            s.prompt_tokens,
        )?;
        counter(
            e,
            "dayone:generation_tokens",
            "Number of generation tokens processed.",
            s.generation_tokens,
        )?;
        let f = &s.finished;
        counter_family(
            e,
            "dayone:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            &[
                ("stop", f.stop),
                ("length", f.length),
                ("context", f.context),
                ("abort", f.abort),
            ],
        )?;

        // Latency and length histograms.
        histogram(
            e,
            "dayone:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &s.ttft,
        )?;
        histogram(
            e,
            "dayone:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &s.inter_token_latency,
        )?;
        histogram(
            e,
            "dayone:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            &s.time_per_output_token,
        )?;
        histogram(
            e,
            "dayone:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &s.e2e_latency,
        )?;
        histogram(
            e,
            "dayone:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &s.queue_time,
        )?;
        histogram(
            e,
            "dayone:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &s.prompt_len,
        )?;
        histogram(
            e,
            "dayone:request_generation_tokens",
            "Number of generation tokens processed.",
            &s.generation_len,
        )?;

        // Server side.
        let g = &self.server;
        gauge_family(
            e,
            "dayone:device_memory_bytes",
            "Device memory in use, in bytes, by kind (weights, KV cache, workspace).",
            "kind",
            &[
                ("weights", g.weights_bytes),
                ("kv_cache", g.kv_cache_bytes),
                ("workspace", g.workspace_bytes),
            ],
        )?;
        gauge(
            e,
            "dayone:process_resident_memory_bytes",
            "Resident host memory of the server process, in bytes.",
            g.resident_bytes,
        )?;
        counter(
            e,
            "dayone:http_requests_rejected",
            "HTTP requests rejected (4xx, or 503 when overloaded or shutting down).",
            g.requests_rejected,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dayone_engine::metrics::{EngineMetrics, FinishedRequest, Preemption};
    use dayone_engine::scheduler::FinishReason;
    use std::collections::HashMap;

    /// One sample line: name, labels in order, value.
    type Sample = (String, Vec<(String, String)>, f64);

    /// Parses a sample line `name{k="v",...} value` strictly (OpenMetrics escapes in values).
    fn parse_sample(line: &str) -> Result<Sample, String> {
        let name_end = line
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .ok_or_else(|| format!("no value: {line}"))?;
        let name = &line[..name_end];
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("bad name: {line}"));
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(r) = rest.strip_prefix('{') {
            rest = r;
            loop {
                let eq = rest.find('=').ok_or_else(|| format!("no '=': {line}"))?;
                let key = &rest[..eq];
                if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!("bad label name {key:?}: {line}"));
                }
                rest = rest[eq + 1..]
                    .strip_prefix('"')
                    .ok_or_else(|| format!("unquoted value: {line}"))?;
                let mut value = String::new();
                let mut chars = rest.char_indices();
                let close = loop {
                    match chars.next() {
                        Some((i, '"')) => break i,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, c @ ('\\' | '"'))) => value.push(c),
                            _ => return Err(format!("bad escape: {line}")),
                        },
                        Some((_, '\n')) => return Err(format!("raw newline: {line}")),
                        Some((_, c)) => value.push(c),
                        None => return Err(format!("unterminated value: {line}")),
                    }
                };
                labels.push((key.to_string(), value));
                rest = &rest[close + 1..];
                if let Some(r) = rest.strip_prefix(',') {
                    rest = r;
                } else if let Some(r) = rest.strip_prefix('}') {
                    rest = r;
                    break;
                } else {
                    return Err(format!("bad label list: {line}"));
                }
            }
        }
        let value = rest
            .strip_prefix(' ')
            .ok_or_else(|| format!("no space before value: {line}"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| format!("bad value {v:?}: {line}"))?,
        };
        Ok((name.to_string(), labels, value))
    }

    struct Parsed {
        /// Metric family name → TYPE.
        types: HashMap<String, String>,
        /// Metric family name → HELP.
        helps: HashMap<String, String>,
        samples: Vec<Sample>,
    }

    fn parse(text: &str) -> Parsed {
        assert!(text.ends_with("# EOF\n"), "ends with # EOF: {text}");
        let mut p = Parsed {
            types: HashMap::new(),
            helps: HashMap::new(),
            samples: Vec::new(),
        };
        let body = text.strip_suffix("# EOF\n").unwrap();
        for line in body.lines() {
            if let Some(r) = line.strip_prefix("# TYPE ") {
                let (n, t) = r.split_once(' ').expect("TYPE name type");
                assert!(
                    p.types.insert(n.into(), t.into()).is_none(),
                    "one TYPE: {n}"
                );
            } else if let Some(r) = line.strip_prefix("# HELP ") {
                let (n, h) = r.split_once(' ').expect("HELP name text");
                assert!(!h.is_empty(), "HELP text for {n}");
                p.helps.insert(n.into(), h.into());
            } else {
                assert!(!line.starts_with('#'), "unexpected comment: {line}");
                p.samples
                    .push(parse_sample(line).unwrap_or_else(|e| panic!("{e}")));
            }
        }
        p
    }

    impl Parsed {
        /// The value of the sample `name` whose labels, besides `model_name`, are `extra`.
        fn value(&self, name: &str, extra: &[(&str, &str)]) -> f64 {
            let found: Vec<f64> = self
                .samples
                .iter()
                .filter(|(n, l, _)| {
                    n == name
                        && l.len() == extra.len() + 1
                        && extra
                            .iter()
                            .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
                })
                .map(|s| s.2)
                .collect();
            assert_eq!(found.len(), 1, "one sample {name}{extra:?}: {found:?}");
            found[0]
        }
    }

    fn snapshot() -> MetricsSnapshot {
        let mut m = EngineMetrics::new(1000);
        m.set_requests(3, 2, 1);
        m.set_kv_blocks(25, 75, 10);
        m.on_prefix_query(200, 50);
        m.on_host_query(150, 30);
        m.on_state_checkpoint_query(100, 64);
        m.on_host_store(4096, 0.5);
        m.on_host_store(1024, 0.25);
        m.on_host_load(2048, 0.125);
        m.on_preemption(Preemption::Swap);
        m.on_preemption(Preemption::Recompute);
        m.on_preemption(Preemption::Recompute);
        m.on_first_token(200, 0.03);
        m.on_first_token(7, 3.0);
        m.on_next_token(0.02);
        m.on_next_token(0.02);
        m.on_next_token(100.0);
        m.on_request_finished(&FinishedRequest {
            reason: FinishReason::Eos,
            queue_s: 0.1,
            ttft_s: Some(0.03),
            e2e_s: 2.03,
            prompt_len: 200,
            gen_len: 3,
        });
        m.on_request_finished(&FinishedRequest {
            reason: FinishReason::Length,
            queue_s: 2.0,
            ttft_s: Some(3.0),
            e2e_s: 4.0,
            prompt_len: 7,
            gen_len: 2,
        });
        m.on_request_finished(&FinishedRequest {
            reason: FinishReason::Abort,
            queue_s: 9000.0,
            ttft_s: None,
            e2e_s: 9000.0,
            prompt_len: 5000,
            gen_len: 0,
        });
        m.snapshot()
    }

    const SERVER: ServerGauges = ServerGauges {
        weights_bytes: 16 << 30,
        kv_cache_bytes: 40 << 30,
        workspace_bytes: 1 << 30,
        requests_rejected: 4,
        resident_bytes: 7 << 20,
    };

    const GAUGES: &[&str] = &[
        "dayone:num_requests_running",
        "dayone:num_requests_waiting",
        "dayone:num_requests_waiting_by_reason",
        "dayone:kv_cache_usage_perc",
        "dayone:kv_blocks_used",
        "dayone:kv_blocks_free",
        "dayone:kv_blocks_cached",
        "dayone:device_memory_bytes",
        "dayone:process_resident_memory_bytes",
    ];
    const COUNTERS: &[&str] = &[
        "dayone:prefix_cache_queries",
        "dayone:prefix_cache_hits",
        "dayone:external_prefix_cache_queries",
        "dayone:external_prefix_cache_hits",
        "dayone:state_checkpoint_queries",
        "dayone:state_checkpoint_hits",
        "dayone:kv_offload_store_bytes",
        "dayone:kv_offload_store_time",
        "dayone:kv_offload_store_count",
        "dayone:kv_offload_load_bytes",
        "dayone:kv_offload_load_time",
        "dayone:kv_offload_load_count",
        "dayone:num_preemptions",
        "dayone:num_preemptions_by_kind",
        "dayone:prompt_tokens",
        "dayone:generation_tokens",
        "dayone:request_success",
        "dayone:http_requests_rejected",
    ];
    const HISTOGRAMS: &[&str] = &[
        "dayone:time_to_first_token_seconds",
        "dayone:inter_token_latency_seconds",
        "dayone:request_time_per_output_token_seconds",
        "dayone:e2e_request_latency_seconds",
        "dayone:request_queue_time_seconds",
        "dayone:request_prompt_tokens",
        "dayone:request_generation_tokens",
    ];

    #[test]
    fn every_metric_has_its_type_and_help() {
        let p = parse(&render(&snapshot(), &SERVER, "m"));
        for (names, ty) in [
            (GAUGES, "gauge"),
            (COUNTERS, "counter"),
            (HISTOGRAMS, "histogram"),
        ] {
            for &n in names {
                assert_eq!(p.types.get(n).map(String::as_str), Some(ty), "TYPE of {n}");
                assert!(p.helps.contains_key(n), "HELP of {n}");
            }
        }
        assert_eq!(
            p.types.len(),
            GAUGES.len() + COUNTERS.len() + HISTOGRAMS.len(),
            "no metric left untested: {:?}",
            p.types.keys()
        );
        // Sample names: counters end in `_total`, histograms in `_bucket`/`_sum`/`_count`,
        // everything starts with `dayone:` (no `dayone_` prefix from the crate).
        for (name, labels, _) in &p.samples {
            assert!(name.starts_with("dayone:"), "{name}");
            assert_eq!(labels[0], ("model_name".into(), "m".into()), "{name}");
            let family = if let Some(f) = name.strip_suffix("_total") {
                assert_eq!(p.types[f], "counter", "{name}");
                f
            } else if let Some(f) = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|f| p.types.get(*f).is_some_and(|t| t == "histogram"))
            {
                f
            } else {
                assert_eq!(p.types[name.as_str()], "gauge", "{name}");
                name
            };
            assert!(p.types.contains_key(family), "{name}");
        }
    }

    #[test]
    fn gauge_and_counter_values() {
        let s = snapshot();
        let p = parse(&render(&s, &SERVER, "m"));
        let v = |n: &str| p.value(n, &[]);
        assert_eq!(v("dayone:num_requests_running"), 3.0);
        assert_eq!(v("dayone:num_requests_waiting"), 3.0);
        assert_eq!(
            p.value(
                "dayone:num_requests_waiting_by_reason",
                &[("reason", "short")]
            ),
            2.0
        );
        assert_eq!(
            p.value(
                "dayone:num_requests_waiting_by_reason",
                &[("reason", "long")]
            ),
            1.0
        );
        // 25 used of 100; the 10 cached blocks are free.
        assert_eq!(v("dayone:kv_cache_usage_perc"), 0.25);
        assert_eq!(v("dayone:kv_blocks_used"), 25.0);
        assert_eq!(v("dayone:kv_blocks_free"), 75.0);
        assert_eq!(v("dayone:kv_blocks_cached"), 10.0);
        assert_eq!(v("dayone:prefix_cache_queries_total"), 200.0);
        assert_eq!(v("dayone:prefix_cache_hits_total"), 50.0);
        assert_eq!(v("dayone:external_prefix_cache_queries_total"), 150.0);
        assert_eq!(v("dayone:external_prefix_cache_hits_total"), 30.0);
        assert_eq!(v("dayone:state_checkpoint_queries_total"), 100.0);
        assert_eq!(v("dayone:state_checkpoint_hits_total"), 64.0);
        assert_eq!(v("dayone:kv_offload_store_bytes_total"), 5120.0);
        assert_eq!(v("dayone:kv_offload_store_time_total"), 0.75);
        assert_eq!(v("dayone:kv_offload_store_count_total"), 2.0);
        assert_eq!(v("dayone:kv_offload_load_bytes_total"), 2048.0);
        assert_eq!(v("dayone:kv_offload_load_time_total"), 0.125);
        assert_eq!(v("dayone:kv_offload_load_count_total"), 1.0);
        assert_eq!(v("dayone:num_preemptions_total"), 3.0);
        let kind = |k| p.value("dayone:num_preemptions_by_kind_total", &[("kind", k)]);
        assert_eq!((kind("swap"), kind("recompute")), (1.0, 2.0));
        assert_eq!(v("dayone:prompt_tokens_total"), 207.0);
        assert_eq!(v("dayone:generation_tokens_total"), 5.0);
        let fin = |r| p.value("dayone:request_success_total", &[("finished_reason", r)]);
        assert_eq!(
            [fin("stop"), fin("length"), fin("context"), fin("abort")],
            [1.0, 1.0, 0.0, 1.0]
        );
        let mem = |k| p.value("dayone:device_memory_bytes", &[("kind", k)]);
        assert_eq!(mem("weights"), (16u64 << 30) as f64);
        assert_eq!(mem("kv_cache"), (40u64 << 30) as f64);
        assert_eq!(mem("workspace"), (1u64 << 30) as f64);
        assert_eq!(v("dayone:http_requests_rejected_total"), 4.0);
        assert_eq!(
            v("dayone:process_resident_memory_bytes"),
            (7u64 << 20) as f64
        );
    }

    #[test]
    fn histograms_are_cumulative_with_inf_equal_to_count() {
        let s = snapshot();
        let p = parse(&render(&s, &SERVER, "m"));
        let hists: [(&str, &Histogram); 7] = [
            ("dayone:time_to_first_token_seconds", &s.ttft),
            ("dayone:inter_token_latency_seconds", &s.inter_token_latency),
            (
                "dayone:request_time_per_output_token_seconds",
                &s.time_per_output_token,
            ),
            ("dayone:e2e_request_latency_seconds", &s.e2e_latency),
            ("dayone:request_queue_time_seconds", &s.queue_time),
            ("dayone:request_prompt_tokens", &s.prompt_len),
            ("dayone:request_generation_tokens", &s.generation_len),
        ];
        for (name, h) in hists {
            let bucket = format!("{name}_bucket");
            let buckets: Vec<(f64, f64)> = p
                .samples
                .iter()
                .filter(|(n, _, _)| *n == bucket)
                .map(|(_, l, v)| {
                    assert_eq!(l.len(), 2, "{name}: model_name and le");
                    assert_eq!(l[1].0, "le");
                    let le = match l[1].1.as_str() {
                        "+Inf" => f64::INFINITY,
                        b => b.parse().unwrap(),
                    };
                    (le, *v)
                })
                .collect();
            assert_eq!(buckets.len(), h.bounds().len() + 1, "{name}");
            let cum = h.cumulative_counts();
            for (i, &(le, c)) in buckets.iter().enumerate() {
                let bound = h.bounds().get(i).copied().unwrap_or(f64::INFINITY);
                assert_eq!(le, bound, "{name} bucket {i}");
                assert_eq!(c, cum[i] as f64, "{name} le={le}");
            }
            assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{name}");
            let count = p.value(&format!("{name}_count"), &[]);
            assert_eq!(count, h.count() as f64, "{name}");
            assert_eq!(buckets.last().unwrap().1, count, "{name}: +Inf == count");
            assert_eq!(p.value(&format!("{name}_sum"), &[]), h.sum(), "{name}");
        }
        // Spot checks against hand-computed values.
        let ttft = |le| p.value("dayone:time_to_first_token_seconds_bucket", &[("le", le)]);
        assert_eq!(
            (ttft("0.02"), ttft("0.04"), ttft("2.5"), ttft("5.0")),
            (0.0, 1.0, 1.0, 2.0)
        );
        assert_eq!(ttft("+Inf"), 2.0);
        let itl = |le| p.value("dayone:inter_token_latency_seconds_bucket", &[("le", le)]);
        assert_eq!((itl("0.025"), itl("80.0"), itl("+Inf")), (2.0, 2.0, 3.0));
        let itl_sum = p.value("dayone:inter_token_latency_seconds_sum", &[]);
        assert!((itl_sum - 100.04).abs() < 1e-9, "{itl_sum}");
        // The aborted 5000-token prompt lies above the largest token bucket (1000).
        let pl = |le| p.value("dayone:request_prompt_tokens_bucket", &[("le", le)]);
        assert_eq!((pl("10.0"), pl("1000.0"), pl("+Inf")), (1.0, 2.0, 3.0));
        // 0 generated tokens fall in the first bucket (≤ 1).
        assert_eq!(
            p.value("dayone:request_generation_tokens_bucket", &[("le", "1.0")]),
            1.0
        );
    }

    #[test]
    fn empty_snapshot_renders_zeros() {
        let s = EngineMetrics::new(0).snapshot();
        let text = render(&s, &ServerGauges::default(), "m");
        let p = parse(&text);
        assert_eq!(p.value("dayone:kv_cache_usage_perc", &[]), 0.0);
        assert_eq!(p.value("dayone:prompt_tokens_total", &[]), 0.0);
        // `token_buckets(0)` has no bounds: only the `+Inf` bucket.
        assert_eq!(
            p.value("dayone:request_prompt_tokens_bucket", &[("le", "+Inf")]),
            0.0
        );
        assert_eq!(p.value("dayone:request_prompt_tokens_count", &[]), 0.0);
        assert_eq!(
            p.samples
                .iter()
                .filter(|s| s.0 == "dayone:request_prompt_tokens_bucket")
                .count(),
            1
        );
    }

    #[test]
    fn literal_format_and_label_escaping() {
        let text = render(&snapshot(), &SERVER, "org/model \"q\" \\ x\ny");
        let label = r#"model_name="org/model \"q\" \\ x\ny""#;
        assert!(
            text.contains(&format!(
                "# HELP dayone:num_requests_running Number of requests in model execution batches.\n\
                 # TYPE dayone:num_requests_running gauge\n\
                 dayone:num_requests_running{{{label}}} 3\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "dayone:request_success_total{{{label},finished_reason=\"stop\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "dayone:time_to_first_token_seconds_bucket{{{label},le=\"+Inf\"}} 2\n"
            )),
            "{text}"
        );
        assert!(!text.contains("dayone_"), "no underscore prefix: {text}");
        assert!(text.ends_with("\n# EOF\n"));
        let p = parse(&text);
        assert_eq!(p.samples[0].1[0].1, "org/model \"q\" \\ x\ny");
        assert!(CONTENT_TYPE.starts_with("application/openmetrics-text; version=1.0.0"));
    }
}
