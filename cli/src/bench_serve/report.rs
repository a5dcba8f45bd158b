//! The numbers of a run (vLLM's `calculate_metrics`), the result block as `vllm bench serve`
//! prints it (plus a clearly separate block of extras), and the `--save-result` JSON.

use super::client::RequestOutput;
use serde_json::{json, Map, Value};

/// A latency metric that `--percentile-metrics` can select.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Time to first token.
    Ttft,
    /// Time per output token after the first.
    Tpot,
    /// Inter-token (inter-chunk) latency.
    Itl,
    /// End-to-end latency.
    E2el,
}

impl MetricKind {
    /// All four, in vLLM's print order.
    pub const ALL: [MetricKind; 4] = [
        MetricKind::Ttft,
        MetricKind::Tpot,
        MetricKind::Itl,
        MetricKind::E2el,
    ];

    /// The key in flags and JSON (`ttft`, …).
    pub fn key(self) -> &'static str {
        match self {
            MetricKind::Ttft => "ttft",
            MetricKind::Tpot => "tpot",
            MetricKind::Itl => "itl",
            MetricKind::E2el => "e2el",
        }
    }

    /// The label in rows (`TTFT`, …).
    pub fn label(self) -> &'static str {
        match self {
            MetricKind::Ttft => "TTFT",
            MetricKind::Tpot => "TPOT",
            MetricKind::Itl => "ITL",
            MetricKind::E2el => "E2EL",
        }
    }

    /// The section header.
    pub fn header(self) -> &'static str {
        match self {
            MetricKind::Ttft => "Time to First Token",
            MetricKind::Tpot => "Time per Output Token (excl. 1st token)",
            MetricKind::Itl => "Inter-token Latency",
            MetricKind::E2el => "End-to-end Latency",
        }
    }

    /// The metric named `key`, if any.
    pub fn from_key(key: &str) -> Option<MetricKind> {
        MetricKind::ALL.into_iter().find(|m| m.key() == key)
    }
}

/// numpy's `percentile` (linear interpolation) of sorted values; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (p / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// A sample of one metric, in seconds.
#[derive(Clone, Debug, Default)]
pub struct Dist {
    sorted: Vec<f64>,
}

impl Dist {
    /// The sample (any order).
    pub fn new(mut v: Vec<f64>) -> Dist {
        v.sort_by(f64::total_cmp);
        Dist { sorted: v }
    }

    /// Mean (s); 0 for an empty sample, as vLLM's `np.mean(x or 0)`.
    pub fn mean(&self) -> f64 {
        if self.sorted.is_empty() {
            return 0.0;
        }
        self.sorted.iter().sum::<f64>() / self.sorted.len() as f64
    }

    /// Population standard deviation (s), as `np.std`.
    pub fn std(&self) -> f64 {
        if self.sorted.is_empty() {
            return 0.0;
        }
        let m = self.mean();
        let var =
            self.sorted.iter().map(|x| (x - m).powi(2)).sum::<f64>() / self.sorted.len() as f64;
        var.sqrt()
    }

    /// The `p`-th percentile (s).
    pub fn percentile(&self, p: f64) -> f64 {
        percentile(&self.sorted, p)
    }

    /// The median (s).
    pub fn median(&self) -> f64 {
        self.percentile(50.0)
    }
}

/// The run's numbers. Throughputs are per second of benchmark duration.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Successful requests.
    pub completed: usize,
    /// Failed requests.
    pub failed: usize,
    /// Σ prompt tokens of the successful requests.
    pub total_input: usize,
    /// Σ output tokens of the successful requests.
    pub total_output: usize,
    /// completed / duration (req/s).
    pub request_throughput: f64,
    /// total_output / duration (tok/s).
    pub output_throughput: f64,
    /// (total_input + total_output) / duration (tok/s).
    pub total_token_throughput: f64,
    /// The most output chunks landing in one 1-second bucket (tok/s; vLLM counts chunks).
    pub max_output_tokens_per_s: f64,
    /// The most successful requests alive during one 1-second bucket.
    pub max_concurrent_requests: f64,
    /// SGLang's `Concurrency`: Σ E2EL / duration.
    pub concurrency: f64,
    /// Output tokens per request (0 for failed ones), in request order.
    pub output_lens: Vec<usize>,
    /// Successful requests whose output tokens came from content chunks (no `usage`).
    pub without_usage: usize,
    /// TTFT (s) of the successful requests.
    pub ttft: Dist,
    /// TPOT (s) of the successful requests with more than one output token.
    pub tpot: Dist,
    /// Every ITL gap (s) of the successful requests.
    pub itl: Dist,
    /// E2EL (s) of the successful requests.
    pub e2el: Dist,
}

impl Metrics {
    /// The sample of `kind`.
    pub fn dist(&self, kind: MetricKind) -> &Dist {
        match kind {
            MetricKind::Ttft => &self.ttft,
            MetricKind::Tpot => &self.tpot,
            MetricKind::Itl => &self.itl,
            MetricKind::E2el => &self.e2el,
        }
    }
}

/// The prompt length counted for `o`: the dataset's, unless it was only estimated and the
/// server reported `usage.prompt_tokens`.
pub fn input_len(o: &RequestOutput, counted: bool) -> usize {
    match (counted, o.server_prompt_tokens) {
        (false, Some(n)) => n,
        _ => o.prompt_len,
    }
}

/// vLLM's metrics over `outputs` for a run of `duration` seconds. `counted[i]` says whether
/// request `i`'s prompt length was counted rather than estimated (see [`input_len`]).
pub fn calculate(outputs: &[RequestOutput], counted: &[bool], duration: f64) -> Metrics {
    let dur = if duration > 0.0 {
        duration
    } else {
        f64::MIN_POSITIVE
    };
    let mut m = Metrics::default();
    let (mut ttfts, mut tpots, mut itls, mut e2els) = (vec![], vec![], vec![], vec![]);
    for (i, o) in outputs.iter().enumerate() {
        if !o.success {
            m.failed += 1;
            m.output_lens.push(0);
            continue;
        }
        m.completed += 1;
        m.total_input += input_len(o, counted.get(i).copied().unwrap_or(true));
        m.output_lens.push(o.output_tokens);
        if !o.usage_reported {
            m.without_usage += 1;
        }
        if o.output_tokens > 1 {
            tpots.push((o.latency - o.ttft) / (o.output_tokens - 1) as f64);
        }
        itls.extend_from_slice(&o.itl);
        ttfts.push(o.ttft);
        e2els.push(o.latency);
    }
    m.total_output = m.output_lens.iter().sum();
    m.request_throughput = m.completed as f64 / dur;
    m.output_throughput = m.total_output as f64 / dur;
    m.total_token_throughput = (m.total_input + m.total_output) as f64 / dur;
    m.concurrency = e2els.iter().sum::<f64>() / dur;
    let (peak_tok, peak_conc) = peaks(outputs);
    m.max_output_tokens_per_s = peak_tok;
    m.max_concurrent_requests = peak_conc;
    m.ttft = Dist::new(ttfts);
    m.tpot = Dist::new(tpots);
    m.itl = Dist::new(itls);
    m.e2el = Dist::new(e2els);
    m
}

/// vLLM's peak output tok/s and peak concurrent requests: one-second buckets from the first
/// send; each output chunk (first at start+TTFT, then every ITL gap) adds 1 to its bucket; each
/// successful request adds 1 to every bucket from its start's to its end's.
pub fn peaks(outputs: &[RequestOutput]) -> (f64, f64) {
    let ok: Vec<&RequestOutput> = outputs.iter().filter(|o| o.success).collect();
    if ok.is_empty() {
        return (0.0, 0.0);
    }
    let min_start = ok
        .iter()
        .map(|o| o.start_time)
        .fold(f64::INFINITY, f64::min);
    let max_end = ok
        .iter()
        .map(|o| o.start_time + o.latency)
        .fold(f64::NEG_INFINITY, f64::max);
    let n = (max_end - min_start).ceil() as usize + 1;
    let mut tokens = vec![0u64; n];
    let mut alive = vec![0u64; n];
    let bucket = |t: f64| ((t - min_start).max(0.0) as usize).min(n - 1);
    for o in ok {
        let mut t = o.start_time + o.ttft;
        tokens[bucket(t)] += 1;
        for gap in &o.itl {
            t += gap;
            tokens[bucket(t)] += 1;
        }
        for a in &mut alive[bucket(o.start_time)..=bucket(o.start_time + o.latency)] {
            *a += 1;
        }
    }
    let max = |v: &[u64]| v.iter().copied().max().unwrap_or(0) as f64;
    (max(&tokens), max(&alive))
}

/// What the printout and JSON need besides the metrics.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// `--max-concurrency`.
    pub max_concurrency: Option<usize>,
    /// `--request-rate` (req/s; infinite = all at once).
    pub request_rate: f64,
    /// `--burstiness`.
    pub burstiness: f64,
    /// `--percentile-metrics`.
    pub selected: Vec<MetricKind>,
    /// `--metric-percentiles`.
    pub percentiles: Vec<f64>,
    /// Benchmark duration (s).
    pub duration: f64,
    /// The server's prefix-cache (hits, queries) token deltas over the run, when it exposes them.
    pub prefix_cache: Option<(f64, f64)>,
}

/// The percentiles the extras block adds, where `--metric-percentiles` lacks them.
pub const EXTRA_PERCENTILES: [f64; 3] = [50.0, 90.0, 95.0];

/// vLLM's name of a percentile: `99`, `99.9`.
pub fn p_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

fn row(out: &mut String, label: &str, value: impl std::fmt::Display) {
    out.push_str(&format!("{label:<40} {value:<10}\n"));
}

fn row_f(out: &mut String, label: &str, value: f64) {
    out.push_str(&format!("{label:<40} {value:<10.2}\n"));
}

/// The prefix-cache hit rate (%) of (hits, queries), if there were queries.
pub fn hit_rate(prefix_cache: Option<(f64, f64)>) -> Option<f64> {
    prefix_cache
        .filter(|&(_, q)| q > 0.0)
        .map(|(h, q)| 100.0 * h / q)
}

/// The result block: vLLM's, byte for byte, then an extras block (SGLang's `Concurrency:`, the
/// prefix-cache hit rate, P50/P90/P95 rows) under its own rule.
pub fn render(m: &Metrics, info: &RunInfo) -> String {
    let mut s = String::new();
    s.push_str(&format!("{:=^50}\n", " Serving Benchmark Result "));
    row(&mut s, "Successful requests:", m.completed);
    row(&mut s, "Failed requests:", m.failed);
    if let Some(c) = info.max_concurrency {
        row(&mut s, "Maximum request concurrency:", c);
    }
    if info.request_rate.is_finite() {
        row_f(&mut s, "Request rate configured (RPS):", info.request_rate);
    }
    row_f(&mut s, "Benchmark duration (s):", info.duration);
    row(&mut s, "Total input tokens:", m.total_input);
    row(&mut s, "Total generated tokens:", m.total_output);
    row_f(&mut s, "Request throughput (req/s):", m.request_throughput);
    row_f(
        &mut s,
        "Output token throughput (tok/s):",
        m.output_throughput,
    );
    row_f(
        &mut s,
        "Peak output token throughput (tok/s):",
        m.max_output_tokens_per_s,
    );
    row_f(
        &mut s,
        "Peak concurrent requests:",
        m.max_concurrent_requests,
    );
    row_f(
        &mut s,
        "Total token throughput (tok/s):",
        m.total_token_throughput,
    );
    for kind in MetricKind::ALL {
        if !info.selected.contains(&kind) {
            continue;
        }
        let d = m.dist(kind);
        let l = kind.label();
        s.push_str(&format!("{:-^50}\n", kind.header()));
        row_f(&mut s, &format!("Mean {l} (ms):"), d.mean() * 1000.0);
        row_f(&mut s, &format!("Median {l} (ms):"), d.median() * 1000.0);
        for &p in &info.percentiles {
            row_f(
                &mut s,
                &format!("P{} {l} (ms):", p_word(p)),
                d.percentile(p) * 1000.0,
            );
        }
    }
    s.push_str(&format!("{}\n", "=".repeat(50)));
    // Extras: not in vLLM's block, so a diff against `vllm bench serve` stops above.
    s.push_str(&format!("{:-^50}\n", " Extra (not in vllm bench serve) "));
    row_f(&mut s, "Concurrency:", m.concurrency);
    if let Some(r) = hit_rate(info.prefix_cache) {
        row_f(&mut s, "Prefix cache hit rate (%):", r);
    }
    for kind in MetricKind::ALL {
        if !info.selected.contains(&kind) {
            continue;
        }
        for p in EXTRA_PERCENTILES {
            if !info.percentiles.contains(&p) {
                let v = m.dist(kind).percentile(p) * 1000.0;
                row_f(&mut s, &format!("P{} {} (ms):", p_word(p), kind.label()), v);
            }
        }
    }
    s.push_str(&format!("{}\n", "=".repeat(50)));
    s
}

/// A number for JSON (NaN/∞ become null rather than invalid JSON).
fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// Who ran against what, for the JSON header.
#[derive(Clone, Debug)]
pub struct Header {
    /// `YYYYMMDD-HHMMSS`, local time.
    pub date: String,
    /// `openai` or `openai-chat`.
    pub backend: String,
    /// The endpoint path.
    pub endpoint: String,
    /// The model name sent.
    pub model_id: String,
    /// The `--tokenizer` given, if any.
    pub tokenizer_id: Option<String>,
    /// `--num-prompts`.
    pub num_prompts: usize,
}

/// The `--save-result` JSON, with vLLM's keys (times in the arrays in seconds, as vLLM writes
/// them; `start_times` from the benchmark's start) plus a few extras (`concurrency`,
/// `prefix_cache_*`, `num_requests_without_usage`, P50/P90/P95 keys).
pub fn to_json(
    h: &Header,
    m: &Metrics,
    info: &RunInfo,
    outputs: &[RequestOutput],
    input_lens: &[usize],
) -> Value {
    let mut j = Map::new();
    let mut put = |k: &str, v: Value| {
        j.insert(k.to_string(), v);
    };
    put("date", json!(h.date));
    put("backend", json!(h.backend));
    put("endpoint", json!(h.endpoint));
    put("model_id", json!(h.model_id));
    put("tokenizer_id", json!(h.tokenizer_id));
    put("num_prompts", json!(h.num_prompts));
    put(
        "request_rate",
        if info.request_rate.is_finite() {
            num(info.request_rate)
        } else {
            json!("inf")
        },
    );
    put("burstiness", num(info.burstiness));
    put("max_concurrency", json!(info.max_concurrency));
    put("duration", num(info.duration));
    put("completed", json!(m.completed));
    put("failed", json!(m.failed));
    put("total_input_tokens", json!(m.total_input));
    put("total_output_tokens", json!(m.total_output));
    put("request_throughput", num(m.request_throughput));
    put("request_goodput", Value::Null);
    put("output_throughput", num(m.output_throughput));
    put("total_token_throughput", num(m.total_token_throughput));
    put("max_output_tokens_per_s", num(m.max_output_tokens_per_s));
    put("max_concurrent_requests", num(m.max_concurrent_requests));
    put("input_lens", json!(input_lens));
    put("output_lens", json!(m.output_lens));
    put(
        "ttfts",
        json!(outputs.iter().map(|o| o.ttft).collect::<Vec<_>>()),
    );
    put(
        "itls",
        json!(outputs.iter().map(|o| &o.itl).collect::<Vec<_>>()),
    );
    put(
        "latencies",
        json!(outputs.iter().map(|o| o.latency).collect::<Vec<_>>()),
    );
    put(
        "start_times",
        json!(outputs.iter().map(|o| o.start_time).collect::<Vec<_>>()),
    );
    put(
        "errors",
        json!(outputs.iter().map(|o| &o.error).collect::<Vec<_>>()),
    );
    for kind in MetricKind::ALL {
        if !info.selected.contains(&kind) {
            continue;
        }
        let d = m.dist(kind);
        let k = kind.key();
        put(&format!("mean_{k}_ms"), num(d.mean() * 1000.0));
        put(&format!("median_{k}_ms"), num(d.median() * 1000.0));
        put(&format!("std_{k}_ms"), num(d.std() * 1000.0));
        for p in info.percentiles.iter().chain(EXTRA_PERCENTILES.iter()) {
            put(
                &format!("p{}_{k}_ms", p_word(*p)),
                num(d.percentile(*p) * 1000.0),
            );
        }
    }
    put("concurrency", num(m.concurrency));
    put("num_requests_without_usage", json!(m.without_usage));
    if let Some((hits, queries)) = info.prefix_cache {
        put("prefix_cache_hits", num(hits));
        put("prefix_cache_queries", num(queries));
        put(
            "prefix_cache_hit_rate",
            hit_rate(info.prefix_cache).map(num).unwrap_or(Value::Null),
        );
    }
    Value::Object(j)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(start: f64, ttft: f64, itl: Vec<f64>, tokens: usize, prompt: usize) -> RequestOutput {
        let latency = ttft + itl.iter().sum::<f64>();
        RequestOutput {
            success: true,
            ttft,
            itl,
            latency,
            output_tokens: tokens,
            usage_reported: true,
            prompt_len: prompt,
            server_prompt_tokens: None,
            start_time: start,
            error: String::new(),
            aborted: false,
        }
    }

    fn failed() -> RequestOutput {
        RequestOutput {
            error: "HTTP 500".into(),
            prompt_len: 9,
            ..Default::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_match_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // np.percentile([1,2,3,4], [0, 50, 90, 99, 100]) = 1, 2.5, 3.7, 3.97, 4
        for (p, want) in [
            (0.0, 1.0),
            (50.0, 2.5),
            (90.0, 3.7),
            (99.0, 3.97),
            (100.0, 4.0),
        ] {
            assert!(
                close(percentile(&v, p), want),
                "p{p}: {}",
                percentile(&v, p)
            );
        }
        assert_eq!(percentile(&[], 99.0), 0.0);
        assert_eq!(percentile(&[5.0], 10.0), 5.0);
        let d = Dist::new(vec![4.0, 1.0, 3.0, 2.0]);
        assert!(close(d.mean(), 2.5));
        assert!(close(d.std(), 1.25f64.sqrt()), "population std");
        assert!(close(d.median(), 2.5));
        assert_eq!(p_word(99.0), "99");
        assert_eq!(p_word(99.9), "99.9");
    }

    #[test]
    fn metric_math_by_hand() {
        // A: sent at 0, first chunk 0.1, then 0.2 and 0.3 later: E2EL 0.6, 4 tokens (usage),
        //    TPOT = (0.6 - 0.1) / 3.
        // B: sent at 0.5, one chunk at 0.4: 1 token, no TPOT.
        // C: failed.
        let outs = vec![
            ok(0.0, 0.1, vec![0.2, 0.3], 4, 10),
            ok(0.5, 0.4, vec![], 1, 20),
            failed(),
        ];
        let m = calculate(&outs, &[true, true, true], 2.0);
        assert_eq!((m.completed, m.failed), (2, 1));
        assert_eq!(m.total_input, 30, "failed prompts not counted");
        assert_eq!(m.total_output, 5);
        assert_eq!(m.output_lens, vec![4, 1, 0]);
        assert!(close(m.request_throughput, 1.0));
        assert!(close(m.output_throughput, 2.5));
        assert!(close(m.total_token_throughput, 17.5));
        assert!(close(m.ttft.mean(), 0.25));
        assert!(close(m.ttft.median(), 0.25));
        assert_eq!(m.tpot.sorted.len(), 1);
        assert!(close(m.tpot.mean(), 0.5 / 3.0));
        assert!(close(m.itl.mean(), 0.25));
        assert!(close(m.e2el.mean(), 0.5));
        assert!(close(m.concurrency, 1.0 / 2.0), "ΣE2EL / duration");
        // Chunks: A at 0.1, 0.3, 0.6 (bucket 0); B at 0.9 (bucket 0): 4 in second 0.
        assert_eq!(m.max_output_tokens_per_s, 4.0);
        assert_eq!(m.max_concurrent_requests, 2.0);
        assert!(m.ttft.mean() <= m.e2el.mean());
    }

    #[test]
    fn estimated_prompt_lengths_defer_to_usage() {
        let mut a = ok(0.0, 0.1, vec![], 1, 10);
        a.server_prompt_tokens = Some(12);
        assert_eq!(input_len(&a, true), 10);
        assert_eq!(input_len(&a, false), 12);
        let m = calculate(&[a], &[false], 1.0);
        assert_eq!(m.total_input, 12);
    }

    #[test]
    fn peaks_over_seconds() {
        // Two requests not overlapping: 0..0.5 and 2.0..2.5; three chunks each, same second.
        let outs = vec![
            ok(0.0, 0.1, vec![0.1, 0.1], 3, 1),
            ok(2.0, 0.1, vec![0.1, 0.1], 3, 1),
        ];
        assert_eq!(peaks(&outs), (3.0, 1.0));
        assert_eq!(peaks(&[failed()]), (0.0, 0.0));
    }

    fn info() -> RunInfo {
        RunInfo {
            max_concurrency: Some(4),
            request_rate: 2.0,
            burstiness: 1.0,
            selected: vec![MetricKind::Ttft, MetricKind::Tpot, MetricKind::Itl],
            percentiles: vec![99.0],
            duration: 12.3456,
            prefix_cache: Some((30.0, 120.0)),
        }
    }

    #[test]
    fn printout_matches_vllm_layout() {
        let outs = vec![
            ok(0.0, 0.1, vec![0.2, 0.3], 4, 10),
            ok(0.5, 0.4, vec![], 1, 20),
        ];
        let m = calculate(&outs, &[true, true], 2.0);
        let text = render(&m, &info());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "============ Serving Benchmark Result ============"
        );
        assert_eq!(lines[0].len(), 50);
        assert_eq!(
            lines[1],
            format!("{:<40} {:<10}", "Successful requests:", 2)
        );
        assert_eq!(
            lines[1],
            "Successful requests:                     2         "
        );
        assert_eq!(
            lines[3],
            "Maximum request concurrency:             4         "
        );
        assert_eq!(
            lines[4],
            "Request rate configured (RPS):           2.00      "
        );
        assert_eq!(
            lines[5],
            "Benchmark duration (s):                  12.35     "
        );
        let want = [
            "Successful requests:",
            "Failed requests:",
            "Maximum request concurrency:",
            "Request rate configured (RPS):",
            "Benchmark duration (s):",
            "Total input tokens:",
            "Total generated tokens:",
            "Request throughput (req/s):",
            "Output token throughput (tok/s):",
            "Peak output token throughput (tok/s):",
            "Peak concurrent requests:",
            "Total token throughput (tok/s):",
        ];
        for (l, w) in lines[1..].iter().zip(want) {
            assert!(l.starts_with(w), "{l:?} vs {w:?}");
            assert_eq!(l.len(), 51, "{l:?}");
        }
        assert_eq!(
            lines[13],
            "---------------Time to First Token----------------"
        );
        assert_eq!(
            lines[14],
            "Mean TTFT (ms):                          250.00    "
        );
        assert_eq!(
            lines[15],
            "Median TTFT (ms):                        250.00    "
        );
        assert!(lines[16].starts_with("P99 TTFT (ms):"));
        assert_eq!(
            lines[17],
            "-----Time per Output Token (excl. 1st token)------"
        );
        assert_eq!(
            lines[21],
            "---------------Inter-token Latency----------------"
        );
        assert!(!text.contains("End-to-end Latency"), "e2el not selected");
        assert_eq!(lines[25], "=".repeat(50));
        assert_eq!(
            lines[26],
            "-------- Extra (not in vllm bench serve) ---------"
        );
        assert_eq!(
            lines[27],
            "Concurrency:                             0.50      "
        );
        assert_eq!(
            lines[28],
            "Prefix cache hit rate (%):               25.00     "
        );
        assert!(lines[29].starts_with("P50 TTFT (ms):"));
        assert_eq!(lines.last().copied(), Some("=".repeat(50).as_str()));
        let e2el = RunInfo {
            max_concurrency: None,
            request_rate: f64::INFINITY,
            selected: vec![MetricKind::E2el],
            percentiles: vec![50.0, 99.9],
            prefix_cache: None,
            ..info()
        };
        let text = render(&m, &e2el);
        assert!(!text.contains("Maximum request concurrency:"));
        assert!(!text.contains("Request rate configured"));
        assert!(!text.contains("Prefix cache"));
        assert!(text.contains("----------------End-to-end Latency----------------\n"));
        assert!(text.contains("P99.9 E2EL (ms):"));
        assert_eq!(
            text.matches("P50 E2EL (ms):").count(),
            1,
            "no duplicate extra row"
        );
    }

    #[test]
    fn json_has_vllm_keys() {
        let outs = vec![ok(0.0, 0.1, vec![0.2, 0.3], 4, 10), failed()];
        let m = calculate(&outs, &[true, true], 2.0);
        let h = Header {
            date: "20260101-000000".into(),
            backend: "openai".into(),
            endpoint: "/v1/completions".into(),
            model_id: "m".into(),
            tokenizer_id: None,
            num_prompts: 2,
        };
        let j = to_json(&h, &m, &info(), &outs, &[10, 9]);
        for k in [
            "date",
            "backend",
            "endpoint",
            "model_id",
            "num_prompts",
            "request_rate",
            "burstiness",
            "max_concurrency",
            "duration",
            "completed",
            "failed",
            "total_input_tokens",
            "total_output_tokens",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "max_output_tokens_per_s",
            "max_concurrent_requests",
            "input_lens",
            "output_lens",
            "ttfts",
            "itls",
            "latencies",
            "start_times",
            "errors",
            "mean_ttft_ms",
            "median_ttft_ms",
            "std_ttft_ms",
            "p99_ttft_ms",
            "p99_tpot_ms",
            "mean_itl_ms",
            "p95_itl_ms",
        ] {
            assert!(j.get(k).is_some(), "missing {k}");
        }
        assert!(j.get("mean_e2el_ms").is_none(), "e2el not selected");
        assert_eq!(j["errors"], json!(["", "HTTP 500"]));
        assert_eq!(j["itls"][0].as_array().unwrap().len(), 2);
        assert_eq!(j["completed"], 1);
        assert_eq!(j["prefix_cache_hit_rate"], 25.0);
        assert!((j["mean_ttft_ms"].as_f64().unwrap() - 100.0).abs() < 1e-9);
        let inf = RunInfo {
            request_rate: f64::INFINITY,
            ..info()
        };
        assert_eq!(
            to_json(&h, &m, &inf, &outs, &[10, 9])["request_rate"],
            "inf"
        );
    }
}
