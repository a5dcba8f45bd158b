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

/// Reads the counters from `base/metrics`; `None` when the server has no such endpoint or
/// counters (never an error: the metrics are an extra).
pub async fn scrape(
    client: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
) -> Option<(f64, f64)> {
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
    prefix_counters(&resp.text().await.ok()?)
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
}
