//! The server's own prefix-cache counters from `GET /metrics` (Prometheus text), read before
//! and after the run so the report can show the hit rate the run itself produced.

use std::time::Duration;

/// Σ over label sets of the sample lines named `name` (`name{…} value [timestamp]`).
fn sum_samples(text: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = match rest.chars().next() {
            Some('{') => match rest.rfind('}') {
                Some(end) => &rest[end + 1..],
                None => continue,
            },
            Some(c) if c.is_whitespace() => rest,
            _ => continue, // a longer name with this one as its prefix
        };
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

/// The (hits, queries) prefix-cache token counters of a `/metrics` text: `dayone:` names if
/// present, else `vllm:` (`…prefix_cache_hits_total`, `…prefix_cache_queries_total`, or the
/// names without `_total`).
pub fn prefix_counters(text: &str) -> Option<(f64, f64)> {
    for ns in ["dayone", "vllm"] {
        let get = |what: &str| {
            sum_samples(text, &format!("{ns}:prefix_cache_{what}_total"))
                .or_else(|| sum_samples(text, &format!("{ns}:prefix_cache_{what}")))
        };
        if let (Some(h), Some(q)) = (get("hits"), get("queries")) {
            return Some((h, q));
        }
    }
    None
}

/// The text of `base/metrics`; `None` when the server has no such endpoint (never an error:
/// the metrics are an extra).
pub async fn scrape_text(
    client: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
) -> Option<String> {
    let mut req = client
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_secs(10));
    if let Some(k) = api_key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}

/// Reads the prefix-cache counters from `base/metrics`; `None` when the server has no such
/// endpoint or counters.
pub async fn scrape(
    client: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
) -> Option<(f64, f64)> {
    prefix_counters(&scrape_text(client, base, api_key).await?)
}

/// The server's load and memory gauges of one `/metrics` text (the soak's start and end
/// state); `None` for a gauge the server does not expose.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerState {
    /// `dayone:num_requests_running` (else `vllm:`).
    pub running: Option<f64>,
    /// `dayone:num_requests_waiting` (else `vllm:`).
    pub waiting: Option<f64>,
    /// `dayone:kv_blocks_used`: KV blocks some request holds (0 when idle; more is a leak).
    pub kv_blocks_used: Option<f64>,
    /// `dayone:kv_cache_usage_perc` (else `vllm:`), 0..1.
    pub kv_cache_usage: Option<f64>,
    /// `dayone:process_resident_memory_bytes`, else the standard
    /// `process_resident_memory_bytes`.
    pub resident_bytes: Option<f64>,
    /// Σ `dayone:device_memory_bytes` over its `kind` labels.
    pub device_bytes: Option<f64>,
}

/// The first of `dayone:NAME`, `vllm:NAME` present.
fn namespaced(text: &str, name: &str) -> Option<f64> {
    sum_samples(text, &format!("dayone:{name}"))
        .or_else(|| sum_samples(text, &format!("vllm:{name}")))
}

/// The [`ServerState`] of a `/metrics` text.
pub fn server_state(text: &str) -> ServerState {
    ServerState {
        running: namespaced(text, "num_requests_running"),
        waiting: namespaced(text, "num_requests_waiting"),
        kv_blocks_used: sum_samples(text, "dayone:kv_blocks_used"),
        kv_cache_usage: namespaced(text, "kv_cache_usage_perc"),
        resident_bytes: sum_samples(text, "dayone:process_resident_memory_bytes")
            .or_else(|| sum_samples(text, "process_resident_memory_bytes")),
        device_bytes: sum_samples(text, "dayone:device_memory_bytes"),
    }
}

/// The delta between two scrapes (after − before), when both exist.
pub fn delta(before: Option<(f64, f64)>, after: Option<(f64, f64)>) -> Option<(f64, f64)> {
    let ((h0, q0), (h1, q1)) = (before?, after?);
    Some((h1 - h0, q1 - q0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_from_openmetrics_text() {
        let text = "\
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 30.0
vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 10
vllm:prefix_cache_hits_created{engine=\"0\"} 1.7e9
vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 100.0 1700000000
vllm:external_prefix_cache_hits_total 5
# EOF
";
        assert_eq!(prefix_counters(text), Some((40.0, 100.0)));
        let dayone = "dayone:prefix_cache_hits_total 3\ndayone:prefix_cache_queries_total 4\n\
                      vllm:prefix_cache_hits_total 1\nvllm:prefix_cache_queries_total 1\n";
        assert_eq!(prefix_counters(dayone), Some((3.0, 4.0)));
        assert_eq!(prefix_counters("sglang:cache_hit_rate 0.5\n"), None);
        assert_eq!(
            delta(Some((40.0, 100.0)), Some((70.0, 160.0))),
            Some((30.0, 60.0))
        );
        assert_eq!(delta(None, Some((1.0, 1.0))), None);
    }

    #[test]
    fn server_state_gauges() {
        let text = "\
# TYPE dayone:num_requests_running gauge
dayone:num_requests_running{model_name=\"m\"} 0
dayone:num_requests_waiting{model_name=\"m\"} 2
dayone:num_requests_waiting_by_reason{model_name=\"m\",reason=\"capacity\"} 9
dayone:kv_blocks_used{model_name=\"m\"} 3
dayone:kv_blocks_used_total 100
dayone:kv_cache_usage_perc{model_name=\"m\"} 0.25
dayone:device_memory_bytes{model_name=\"m\",kind=\"weights\"} 1000
dayone:device_memory_bytes{model_name=\"m\",kind=\"kv_cache\"} 500
process_resident_memory_bytes 7e6
";
        let s = server_state(text);
        assert_eq!(s.running, Some(0.0));
        assert_eq!(
            s.waiting,
            Some(2.0),
            "the _by_reason family is another name"
        );
        assert_eq!(s.kv_blocks_used, Some(3.0));
        assert_eq!(s.kv_cache_usage, Some(0.25));
        assert_eq!(s.device_bytes, Some(1500.0));
        assert_eq!(
            s.resident_bytes,
            Some(7e6),
            "the standard name as a fallback"
        );
        let own = format!("{text}dayone:process_resident_memory_bytes{{model_name=\"m\"}} 8e6\n");
        assert_eq!(server_state(&own).resident_bytes, Some(8e6));
        let v = server_state("vllm:num_requests_running{engine=\"0\"} 4\n");
        assert_eq!(v.running, Some(4.0));
        assert_eq!(
            (v.kv_blocks_used, v.resident_bytes, v.device_bytes),
            (None, None, None)
        );
    }
}
