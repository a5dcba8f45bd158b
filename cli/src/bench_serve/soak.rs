//! `--duration-minutes`: the soak. Requests keep going out (the dataset cycled, the random one
//! with fresh prompts per pass) at `--max-concurrency` (and `--request-rate`, if finite) until
//! the time is up; then the in-flight ones finish (each bounded by `--timeout`). With
//! `--abort-fraction F` a request is dropped by the client, with probability F, after 1..=5
//! output chunks (its connection closed mid-stream). The report adds per-minute rows, the p99
//! drift from the first to the last full minute, and the server's state once it is idle again
//! (running / waiting requests, KV blocks still held, memory at start and end).

use super::client::RequestOutput;
use super::dataset::SampleRequest;
use super::report::percentile;
use super::schedule;
use super::server_metrics::{self, ServerState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The most output chunks an aborted request receives before the client drops it.
pub const MAX_ABORT_CHUNKS: usize = 5;

/// How long the server gets, after the soak, to report no running request.
pub const IDLE_WAIT: Duration = Duration::from_secs(30);

/// Which requests the client drops mid-stream: each draw is, with probability `fraction`, the
/// number of output chunks (1..=[`MAX_ABORT_CHUNKS`]) after which to drop it. Seeded, so a
/// seed gives the same aborts in the same request order.
pub struct AbortPlan {
    fraction: f64,
    rng: StdRng,
}

impl AbortPlan {
    /// A plan with abort probability `fraction` (0..=1).
    pub fn new(fraction: f64, seed: u64) -> AbortPlan {
        AbortPlan {
            fraction,
            // Its own stream, apart from the dataset's and the arrivals'.
            rng: StdRng::seed_from_u64(seed ^ 0xab07_7ab0_0000_0005),
        }
    }

    /// The next request's fate: `Some(chunks)` to drop it after that many output chunks.
    pub fn next_abort(&mut self) -> Option<usize> {
        if self.fraction <= 0.0 {
            return None;
        }
        let u: f64 = self.rng.random();
        (u < self.fraction).then(|| self.rng.random_range(1..=MAX_ABORT_CHUNKS))
    }
}

/// Makes pass `n` of the prompts (the random dataset's fresh ones).
pub type Refill<'a> = Box<dyn FnMut(u64) -> anyhow::Result<Vec<SampleRequest>> + 'a>;

/// Where the soak's prompts come from: a pool cycled in order, refilled (the random dataset's
/// fresh prompts) by `refill(pass)` when it is used up.
pub struct Feed<'a> {
    pool: Vec<SampleRequest>,
    pos: usize,
    pass: u64,
    refill: Option<Refill<'a>>,
}

impl<'a> Feed<'a> {
    /// Cycles `pool` (not empty); with `refill`, pass `n` (from 1) gets `refill(n)` instead.
    pub fn new(pool: Vec<SampleRequest>, refill: Option<Refill<'a>>) -> Feed<'a> {
        assert!(!pool.is_empty(), "a soak needs at least one prompt");
        Feed {
            pool,
            pos: 0,
            pass: 0,
            refill,
        }
    }

    /// The next request.
    pub fn next_request(&mut self) -> SampleRequest {
        if self.pos == self.pool.len() {
            self.pos = 0;
            self.pass += 1;
            if let Some(f) = &mut self.refill {
                match f(self.pass) {
                    Ok(p) if !p.is_empty() => self.pool = p,
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("warning: fresh prompts failed ({e:#}); cycling the last ones");
                        self.refill = None;
                    }
                }
            }
        }
        self.pos += 1;
        self.pool[self.pos - 1].clone()
    }
}

/// The soak's knobs.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// How long requests keep going out.
    pub duration: Duration,
    /// At most this many in flight.
    pub max_concurrency: Option<usize>,
    /// Arrivals per second (∞: as fast as the concurrency limit lets them).
    pub request_rate: f64,
    /// Gamma shape of the arrival gaps.
    pub burstiness: f64,
    /// Probability that a request is dropped mid-stream.
    pub abort_fraction: f64,
    /// Seed of the arrivals and the aborts.
    pub seed: u64,
}

/// What the soak did. `outputs` are in completion order, with whether each prompt length was
/// counted (see [`super::report::input_len`]).
pub struct SoakRun {
    /// Every request that landed.
    pub outputs: Vec<(RequestOutput, bool)>,
    /// Requests sent.
    pub sent: usize,
    /// Seconds spent sending (the duration, or less when interrupted).
    pub send_s: f64,
    /// Seconds until the last in-flight request landed.
    pub elapsed_s: f64,
    /// Ctrl-C stopped it (the in-flight requests were dropped).
    pub interrupted: bool,
}

/// Sends requests from `feed` until `cfg.duration` has passed since `t0`, then waits for the
/// ones in flight; needs `max_concurrency` or a finite `request_rate` (else it would send
/// without pause). `make(request, abort_after)` is one request's future (its send time is
/// taken when it starts, after its concurrency slot is free). `on_done` sees each result as it
/// lands; `stop()` (polled every 100 ms) ends the soak at once.
pub async fn run<F, Fut>(
    cfg: &SoakConfig,
    t0: Instant,
    feed: &mut Feed<'_>,
    make: F,
    mut on_done: impl FnMut(&RequestOutput, usize),
    stop: impl Fn() -> bool,
) -> SoakRun
where
    F: Fn(&SampleRequest, Option<usize>) -> Fut,
    Fut: Future<Output = RequestOutput> + Send + 'static,
{
    assert!(
        cfg.max_concurrency.is_some() || cfg.request_rate.is_finite(),
        "a soak needs a concurrency limit or a finite rate"
    );
    let sem = cfg.max_concurrency.map(|n| Arc::new(Semaphore::new(n)));
    let deadline = t0 + cfg.duration;
    let mut aborts = AbortPlan::new(cfg.abort_fraction, cfg.seed);
    let mut gaps = StdRng::seed_from_u64(cfg.seed ^ 0x5eed_a77a_1a15_0001);
    let scale = 1.0 / (cfg.request_rate * cfg.burstiness);
    let mut next_at = t0;
    let mut set: JoinSet<(RequestOutput, bool)> = JoinSet::new();
    let mut outputs = Vec::new();
    let mut sent = 0usize;
    let mut interrupted = false;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut land = |r: Result<(RequestOutput, bool), tokio::task::JoinError>,
                    outputs: &mut Vec<(RequestOutput, bool)>,
                    in_flight: usize| {
        // A task that panicked (none should) is lost.
        if let Ok(v) = r {
            on_done(&v.0, in_flight);
            outputs.push(v);
        }
    };
    loop {
        let slot = {
            let sem = sem.clone();
            async move {
                tokio::time::sleep_until(next_at.into()).await;
                match sem {
                    Some(s) => s.acquire_owned().await.ok(),
                    None => None,
                }
            }
        };
        tokio::select! {
            biased;
            Some(r) = set.join_next(), if !set.is_empty() => {
                land(r, &mut outputs, set.len());
            }
            _ = tokio::time::sleep_until(deadline.into()) => break,
            _ = tick.tick() => {
                if stop() {
                    interrupted = true;
                    break;
                }
            }
            permit = slot => {
                if Instant::now() >= deadline {
                    break;
                }
                let req = feed.next_request();
                let fut = make(&req, aborts.next_abort());
                let counted = req.prompt_len_counted;
                set.spawn(async move {
                    let _permit = permit;
                    (fut.await, counted)
                });
                sent += 1;
                if cfg.request_rate.is_finite() {
                    next_at += Duration::from_secs_f64(schedule::gamma(
                        cfg.burstiness,
                        scale,
                        &mut gaps,
                    ));
                }
            }
        }
    }
    let send_s = t0.elapsed().as_secs_f64().min(cfg.duration.as_secs_f64());
    if !interrupted {
        loop {
            tokio::select! {
                r = set.join_next() => match r {
                    None => break,
                    Some(r) => land(r, &mut outputs, set.len()),
                },
                _ = tick.tick() => {
                    if stop() {
                        interrupted = true;
                        break;
                    }
                }
            }
        }
    }
    set.abort_all();
    SoakRun {
        outputs,
        sent,
        send_s,
        elapsed_s: t0.elapsed().as_secs_f64(),
        interrupted,
    }
}

/// One minute (or `--soak-minute-s` seconds) of the soak. Successful requests count in the
/// minute their last output chunk landed in; failed and aborted ones in the minute they were
/// sent.
#[derive(Clone, Debug, PartialEq)]
pub struct MinuteRow {
    /// 0 for the first minute.
    pub index: usize,
    /// The minute lay wholly inside the sending window (the drift compares full minutes).
    pub full: bool,
    /// Successful requests.
    pub completed: usize,
    /// Requests dropped by the client.
    pub aborted: usize,
    /// Failed requests.
    pub failed: usize,
    /// P99 TTFT of the successful requests (ms).
    pub ttft_p99_ms: f64,
    /// P99 of their ITL gaps (ms).
    pub itl_p99_ms: f64,
    /// Their output tokens per second of the minute (of the part of it the run covered, for a
    /// last partial one).
    pub output_tok_s: f64,
}

/// The per-minute rows of a soak that sent for `send_s` seconds and ended after `elapsed_s`,
/// `bucket_s` seconds a row. Rows run from 0 to the last one with a request or inside the
/// sending window.
pub fn minute_rows(
    outputs: &[RequestOutput],
    send_s: f64,
    elapsed_s: f64,
    bucket_s: f64,
) -> Vec<MinuteRow> {
    let bucket = |t: f64| (t.max(0.0) / bucket_s).floor() as usize;
    let mut n = ((send_s / bucket_s).ceil() as usize).max(1);
    for o in outputs {
        let t = if o.success {
            o.start_time + o.latency
        } else {
            o.start_time
        };
        n = n.max(bucket(t) + 1);
    }
    let mut ttfts = vec![Vec::new(); n];
    let mut itls = vec![Vec::new(); n];
    let mut tokens = vec![0usize; n];
    let mut rows: Vec<MinuteRow> = (0..n)
        .map(|i| MinuteRow {
            index: i,
            // A hair of slack: a 2-minute soak has two full minutes although its send window
            // ends a few µs short.
            full: (i + 1) as f64 * bucket_s <= send_s + 1e-3,
            completed: 0,
            aborted: 0,
            failed: 0,
            ttft_p99_ms: 0.0,
            itl_p99_ms: 0.0,
            output_tok_s: 0.0,
        })
        .collect();
    for o in outputs {
        if o.success {
            let b = bucket(o.start_time + o.latency);
            rows[b].completed += 1;
            ttfts[b].push(o.ttft);
            itls[b].extend_from_slice(&o.itl);
            tokens[b] += o.output_tokens;
        } else if o.aborted {
            rows[bucket(o.start_time)].aborted += 1;
        } else {
            rows[bucket(o.start_time)].failed += 1;
        }
    }
    let p99_ms = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        percentile(v, 99.0) * 1000.0
    };
    let end = elapsed_s.max(send_s);
    for (i, r) in rows.iter_mut().enumerate() {
        r.ttft_p99_ms = p99_ms(&mut ttfts[i]);
        r.itl_p99_ms = p99_ms(&mut itls[i]);
        let span = (end - i as f64 * bucket_s).clamp(0.0, bucket_s);
        r.output_tok_s = if span > 0.0 {
            tokens[i] as f64 / span
        } else {
            0.0
        };
    }
    rows
}

/// The p99 drift: the last full minute's P99 over the first's.
#[derive(Clone, Debug, PartialEq)]
pub struct Drift {
    /// The first minute's index (0).
    pub first: usize,
    /// The last full minute's index.
    pub last: usize,
    /// TTFT P99 ratio (`None` when the first minute's is 0).
    pub ttft: Option<f64>,
    /// ITL P99 ratio (`None` when the first minute's is 0).
    pub itl: Option<f64>,
}

/// The drift between the first minute and the last full one; `None` with fewer than two full
/// minutes that both completed requests.
pub fn drift(rows: &[MinuteRow]) -> Option<Drift> {
    let first = rows.first().filter(|r| r.full && r.completed > 0)?;
    let last = rows
        .iter()
        .rev()
        .find(|r| r.full && r.index > first.index)
        .filter(|r| r.completed > 0)?;
    let ratio = |a: f64, b: f64| (a > 0.0).then(|| b / a);
    Some(Drift {
        first: first.index,
        last: last.index,
        ttft: ratio(first.ttft_p99_ms, last.ttft_p99_ms),
        itl: ratio(first.itl_p99_ms, last.itl_p99_ms),
    })
}

/// VmRSS of `/proc/PID/status`, in bytes.
pub fn proc_rss(pid: u32) -> Option<u64> {
    parse_vm_rss(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut it = line["VmRSS:".len()..].split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    let unit = match it.next().unwrap_or("kB") {
        "kB" | "KB" | "kb" => 1024,
        "mB" | "MB" => 1 << 20,
        "B" => 1,
        _ => return None,
    };
    Some(n * unit)
}

/// Σ memory.used over the GPUs `nvidia-smi` lists (MiB); `None` without `nvidia-smi`.
pub fn nvidia_smi_used_mib() -> Option<f64> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_smi(&String::from_utf8_lossy(&out.stdout))
}

fn parse_smi(text: &str) -> Option<f64> {
    let vals: Vec<f64> = text
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .collect();
    (!vals.is_empty()).then(|| vals.iter().sum())
}

/// The server's state and memory at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// From `/metrics` (`None`: no such endpoint).
    pub server: Option<ServerState>,
    /// VmRSS of `--server-pid` (bytes).
    pub pid_rss: Option<u64>,
    /// nvidia-smi's used memory (MiB, all GPUs).
    pub gpu_used_mib: Option<f64>,
}

/// Takes a [`Snapshot`]; with `wait_idle`, first polls `/metrics` (for up to [`IDLE_WAIT`])
/// until no request runs or waits.
pub async fn snapshot(
    http: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
    pid: Option<u32>,
    wait_idle: bool,
) -> Snapshot {
    let t = Instant::now();
    let server = loop {
        let s = server_metrics::scrape_text(http, base, api_key)
            .await
            .map(|t| server_metrics::server_state(&t));
        let busy =
            s.is_some_and(|s| s.running.unwrap_or(0.0) > 0.0 || s.waiting.unwrap_or(0.0) > 0.0);
        if !wait_idle || !busy || t.elapsed() >= IDLE_WAIT {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    Snapshot {
        server,
        pid_rss: pid.and_then(proc_rss),
        gpu_used_mib: tokio::task::spawn_blocking(nvidia_smi_used_mib)
            .await
            .ok()
            .flatten(),
    }
}

/// The soak's whole outcome, for the report and the verdict.
pub struct SoakReport {
    /// `--duration-minutes`.
    pub duration_minutes: f64,
    /// `--abort-fraction`.
    pub abort_fraction: f64,
    /// Seconds a row covers.
    pub bucket_s: f64,
    /// Requests sent.
    pub sent: usize,
    /// Successful requests.
    pub completed: usize,
    /// Requests the client dropped.
    pub aborted: usize,
    /// Failed requests.
    pub failed: usize,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// Seconds spent sending.
    pub send_s: f64,
    /// Seconds until the last request landed.
    pub elapsed_s: f64,
    /// Ctrl-C ended it.
    pub interrupted: bool,
    /// Per-minute rows.
    pub rows: Vec<MinuteRow>,
    /// First vs last full minute.
    pub drift: Option<Drift>,
    /// Before the soak.
    pub start: Snapshot,
    /// After it, once the server was idle (or [`IDLE_WAIT`] passed).
    pub end: Snapshot,
}

impl SoakReport {
    /// Builds the report of a run.
    pub fn new(
        run: &SoakRun,
        duration_minutes: f64,
        abort_fraction: f64,
        bucket_s: f64,
        start: Snapshot,
        end: Snapshot,
    ) -> SoakReport {
        let outs: Vec<RequestOutput> = run.outputs.iter().map(|(o, _)| o.clone()).collect();
        let rows = minute_rows(&outs, run.send_s, run.elapsed_s, bucket_s);
        let drift = drift(&rows);
        let failed: Vec<&RequestOutput> =
            outs.iter().filter(|o| !o.success && !o.aborted).collect();
        SoakReport {
            duration_minutes,
            abort_fraction,
            bucket_s,
            sent: run.sent,
            completed: outs.iter().filter(|o| o.success).count(),
            aborted: outs.iter().filter(|o| o.aborted).count(),
            failed: failed.len(),
            first_error: failed.first().map(|o| o.error.clone()),
            send_s: run.send_s,
            elapsed_s: run.elapsed_s,
            interrupted: run.interrupted,
            rows,
            drift,
            start,
            end,
        }
    }

    /// KV blocks some request still holds after the run (a leak when nothing runs).
    pub fn leaked_blocks(&self) -> Option<f64> {
        self.end.server.and_then(|s| s.kv_blocks_used)
    }

    /// Why the soak failed (empty: it passed): failed requests, leaked KV blocks, requests
    /// still running [`IDLE_WAIT`] after the soak.
    pub fn failures(&self) -> Vec<String> {
        let mut why = Vec::new();
        if self.failed > 0 {
            why.push(format!(
                "{} of {} requests failed (first: {})",
                self.failed,
                self.sent,
                self.first_error.as_deref().unwrap_or("")
            ));
        }
        if let Some(s) = self.end.server {
            if let Some(r) = s.running.filter(|&r| r > 0.0) {
                why.push(format!(
                    "{r} requests still running {} s after the soak",
                    IDLE_WAIT.as_secs()
                ));
            }
        }
        if let Some(b) = self.leaked_blocks().filter(|&b| b > 0.0) {
            why.push(format!(
                "{b} KV blocks still used after the run (leaked blocks)"
            ));
        }
        why
    }

    /// The soak section printed after the usual result block.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let row = |s: &mut String, label: &str, v: String| {
            s.push_str(&format!("{label:<40} {v:<10}\n"));
        };
        s.push_str(&format!("{:=^50}\n", " Soak Result "));
        row(
            &mut s,
            "Soak duration (min):",
            format!("{:.2}", self.duration_minutes),
        );
        row(
            &mut s,
            "Abort fraction:",
            format!("{:.2}", self.abort_fraction),
        );
        row(&mut s, "Requests sent:", self.sent.to_string());
        row(&mut s, "Requests completed:", self.completed.to_string());
        row(
            &mut s,
            "Requests aborted (by the client):",
            self.aborted.to_string(),
        );
        row(&mut s, "Requests failed:", self.failed.to_string());
        row(&mut s, "Sending time (s):", format!("{:.2}", self.send_s));
        row(&mut s, "Total time (s):", format!("{:.2}", self.elapsed_s));
        if self.interrupted {
            row(&mut s, "Interrupted:", "yes".into());
        }
        let unit = if self.bucket_s == 60.0 {
            " Per minute ".to_string()
        } else {
            format!(" Per {} s ", self.bucket_s)
        };
        s.push_str(&format!("{unit:-^50}\n"));
        s.push_str(&format!(
            "{:>6} {:>6} {:>5} {:>5} {:>9} {:>8} {:>9}\n",
            "minute", "done", "abort", "fail", "TTFT p99", "ITL p99", "tok/s"
        ));
        for r in &self.rows {
            let idx = format!("{}{}", r.index, if r.full { "" } else { "*" });
            s.push_str(&format!(
                "{:>6} {:>6} {:>5} {:>5} {:>9.2} {:>8.2} {:>9.2}\n",
                idx, r.completed, r.aborted, r.failed, r.ttft_p99_ms, r.itl_p99_ms, r.output_tok_s
            ));
        }
        s.push_str("(p99 in ms; * = a minute not wholly inside the sending window)\n");
        s.push_str(&format!(
            "{:-^50}\n",
            " P99 drift (last full / first minute) "
        ));
        let ratio = |v: Option<f64>| v.map_or("n/a".to_string(), |x| format!("{x:.2}"));
        match &self.drift {
            Some(d) => {
                row(
                    &mut s,
                    "Minutes compared:",
                    format!("{} -> {}", d.first, d.last),
                );
                row(&mut s, "TTFT P99 drift:", ratio(d.ttft));
                row(&mut s, "ITL P99 drift:", ratio(d.itl));
            }
            None => row(
                &mut s,
                "P99 drift:",
                "n/a (needs two full minutes with completed requests)".into(),
            ),
        }
        s.push_str(&format!("{:-^50}\n", " Server after the run "));
        let opt = |v: Option<f64>| v.map_or("n/a".to_string(), |x| format!("{x}"));
        let end = self.end.server.unwrap_or_default();
        if self.end.server.is_none() {
            row(&mut s, "GET /metrics:", "n/a".into());
        }
        row(&mut s, "Requests running:", opt(end.running));
        row(&mut s, "Requests waiting:", opt(end.waiting));
        row(&mut s, "KV blocks used (leaked):", opt(end.kv_blocks_used));
        let mib = |v: Option<f64>| v.map_or("n/a".to_string(), |b| format!("{:.1}", b / 1048576.0));
        let st = self.start.server.unwrap_or_default();
        row(&mut s, "Server RSS start (MiB):", mib(st.resident_bytes));
        row(&mut s, "Server RSS end (MiB):", mib(end.resident_bytes));
        if self.start.pid_rss.is_some() || self.end.pid_rss.is_some() {
            let p = |v: Option<u64>| mib(v.map(|b| b as f64));
            row(
                &mut s,
                "Server RSS start, /proc (MiB):",
                p(self.start.pid_rss),
            );
            row(&mut s, "Server RSS end, /proc (MiB):", p(self.end.pid_rss));
        }
        row(&mut s, "Device memory start (MiB):", mib(st.device_bytes));
        row(&mut s, "Device memory end (MiB):", mib(end.device_bytes));
        if self.start.gpu_used_mib.is_some() || self.end.gpu_used_mib.is_some() {
            let g = |v: Option<f64>| v.map_or("n/a".to_string(), |x| format!("{x:.0}"));
            row(
                &mut s,
                "GPU memory used start (MiB, smi):",
                g(self.start.gpu_used_mib),
            );
            row(
                &mut s,
                "GPU memory used end (MiB, smi):",
                g(self.end.gpu_used_mib),
            );
        }
        let why = self.failures();
        row(
            &mut s,
            "Soak verdict:",
            if self.interrupted {
                "not judged (interrupted)".into()
            } else if why.is_empty() {
                "pass".into()
            } else {
                "FAIL".into()
            },
        );
        s.push_str(&format!("{}\n", "=".repeat(50)));
        s
    }

    /// The JSON's `soak` object.
    pub fn to_json(&self) -> Value {
        let num = |x: f64| {
            serde_json::Number::from_f64(x)
                .map(Value::Number)
                .unwrap_or(Value::Null)
        };
        let onum = |x: Option<f64>| x.map_or(Value::Null, num);
        let snap = |s: &Snapshot| {
            let m = s.server.unwrap_or_default();
            json!({
                "metrics_available": s.server.is_some(),
                "num_requests_running": onum(m.running),
                "num_requests_waiting": onum(m.waiting),
                "kv_blocks_used": onum(m.kv_blocks_used),
                "kv_cache_usage_perc": onum(m.kv_cache_usage),
                "resident_memory_bytes": onum(m.resident_bytes),
                "device_memory_bytes": onum(m.device_bytes),
                "pid_rss_bytes": s.pid_rss,
                "gpu_memory_used_mib": onum(s.gpu_used_mib),
            })
        };
        let why = self.failures();
        json!({
            "duration_minutes": num(self.duration_minutes),
            "abort_fraction": num(self.abort_fraction),
            "bucket_seconds": num(self.bucket_s),
            "send_seconds": num(self.send_s),
            "elapsed_seconds": num(self.elapsed_s),
            "interrupted": self.interrupted,
            "sent": self.sent,
            "completed": self.completed,
            "aborted": self.aborted,
            "failed": self.failed,
            "minutes": self.rows.iter().map(|r| json!({
                "minute": r.index,
                "full": r.full,
                "completed": r.completed,
                "aborted": r.aborted,
                "failed": r.failed,
                "p99_ttft_ms": num(r.ttft_p99_ms),
                "p99_itl_ms": num(r.itl_p99_ms),
                "output_throughput": num(r.output_tok_s),
            })).collect::<Vec<_>>(),
            "p99_drift": self.drift.as_ref().map(|d| json!({
                "first_minute": d.first,
                "last_minute": d.last,
                "ttft": onum(d.ttft),
                "itl": onum(d.itl),
            })),
            "leaked_blocks": onum(self.leaked_blocks()),
            "server_start": snap(&self.start),
            "server_end": snap(&self.end),
            "passed": why.is_empty(),
            "failures": why,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(start: f64, ttft: f64, latency: f64, itl: Vec<f64>, tokens: usize) -> RequestOutput {
        RequestOutput {
            success: true,
            start_time: start,
            ttft,
            latency,
            itl,
            output_tokens: tokens,
            ..Default::default()
        }
    }

    #[test]
    fn abort_fraction_over_many_draws() {
        for f in [0.1, 0.5, 0.9] {
            let mut p = AbortPlan::new(f, 7);
            let draws: Vec<Option<usize>> = (0..20_000).map(|_| p.next_abort()).collect();
            let hit = draws.iter().filter(|d| d.is_some()).count() as f64 / 20_000.0;
            assert!((hit - f).abs() < 0.015, "fraction {f}: {hit}");
            let ks: Vec<usize> = draws.iter().flatten().copied().collect();
            assert!(ks.iter().all(|&k| (1..=MAX_ABORT_CHUNKS).contains(&k)));
            for k in 1..=MAX_ABORT_CHUNKS {
                let share = ks.iter().filter(|&&x| x == k).count() as f64 / ks.len() as f64;
                assert!((share - 0.2).abs() < 0.03, "k {k}: {share}");
            }
            // Fixed seed, same aborts; another seed, others.
            let mut again = AbortPlan::new(f, 7);
            assert!(draws.iter().all(|d| *d == again.next_abort()));
            let mut other = AbortPlan::new(f, 8);
            assert!(draws.iter().any(|d| *d != other.next_abort()));
        }
        let mut none = AbortPlan::new(0.0, 1);
        assert!((0..1000).all(|_| none.next_abort().is_none()));
        let mut all = AbortPlan::new(1.0, 1);
        assert!((0..1000).all(|_| all.next_abort().is_some()));
    }

    #[test]
    fn minute_bucketing() {
        let outs = vec![
            // Minute 0: ends at 10 and 59.9.
            ok(0.0, 0.1, 10.0, vec![0.01, 0.02], 10),
            ok(50.0, 0.3, 9.9, vec![0.03], 20),
            // Sent in minute 0, ends in minute 1 (at 61).
            ok(55.0, 0.2, 6.0, vec![0.04], 30),
            // Minute 2 (a partial one: the soak sent for 150 s, ended at 170).
            ok(130.0, 0.5, 40.0, vec![0.05], 40),
            RequestOutput {
                aborted: true,
                start_time: 61.0,
                ..Default::default()
            },
            RequestOutput {
                start_time: 125.0,
                error: "boom".into(),
                ..Default::default()
            },
        ];
        let rows = minute_rows(&outs, 150.0, 175.0, 60.0);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows.iter().map(|r| r.completed).collect::<Vec<_>>(),
            vec![2, 1, 1]
        );
        assert_eq!(
            rows.iter()
                .map(|r| (r.aborted, r.failed))
                .collect::<Vec<_>>(),
            vec![(0, 0), (1, 0), (0, 1)]
        );
        assert_eq!(
            rows.iter().map(|r| r.full).collect::<Vec<_>>(),
            vec![true, true, false]
        );
        // numpy percentile of [0.1, 0.3] at 99: 0.1 + 0.2·0.99.
        assert!((rows[0].ttft_p99_ms - 298.0).abs() < 1e-9, "{rows:?}");
        assert!((rows[0].itl_p99_ms - (20.0 + 10.0 * 0.98)).abs() < 1e-9);
        assert!((rows[1].ttft_p99_ms - 200.0).abs() < 1e-9);
        assert!((rows[0].output_tok_s - 30.0 / 60.0).abs() < 1e-12);
        // The last minute ran 55 s (120..175).
        assert!((rows[2].output_tok_s - 40.0 / 55.0).abs() < 1e-12);
        // An empty minute inside the window is a row of zeros; the window alone sets the count.
        let rows = minute_rows(&outs[..1], 150.0, 150.0, 60.0);
        assert_eq!(rows.len(), 3);
        assert_eq!((rows[1].completed, rows[1].ttft_p99_ms), (0, 0.0));
        // A request landing after the window adds rows.
        let late = minute_rows(&[ok(50.0, 1.0, 200.0, vec![], 1)], 60.0, 250.0, 60.0);
        assert_eq!(late.len(), 5);
        assert_eq!(late[4].completed, 1);
        assert!(late[0].full && !late[1].full);
        // Short buckets (the test flag).
        let short = minute_rows(&outs[..2], 60.0, 60.0, 20.0);
        assert_eq!(short.len(), 3);
        assert_eq!(
            short.iter().map(|r| r.completed).collect::<Vec<_>>(),
            vec![1, 0, 1]
        );
    }

    #[test]
    fn drift_first_vs_last_full_minute() {
        let row = |index, full, completed, ttft, itl| MinuteRow {
            index,
            full,
            completed,
            aborted: 0,
            failed: 0,
            ttft_p99_ms: ttft,
            itl_p99_ms: itl,
            output_tok_s: 0.0,
        };
        let rows = vec![
            row(0, true, 5, 100.0, 10.0),
            row(1, true, 5, 500.0, 50.0),
            row(2, true, 5, 150.0, 12.0),
            row(3, false, 2, 900.0, 90.0),
        ];
        let d = drift(&rows).unwrap();
        assert_eq!((d.first, d.last), (0, 2), "the partial minute 3 is skipped");
        assert!((d.ttft.unwrap() - 1.5).abs() < 1e-12);
        assert!((d.itl.unwrap() - 1.2).abs() < 1e-12);
        // One full minute: no drift.
        assert_eq!(drift(&rows[..1]), None);
        assert_eq!(drift(&[rows[0].clone(), rows[3].clone()]), None);
        // An empty first or last minute: no drift.
        assert_eq!(drift(&[row(0, true, 0, 0.0, 0.0), rows[1].clone()]), None);
        assert_eq!(drift(&[rows[0].clone(), row(1, true, 0, 0.0, 0.0)]), None);
        // A first minute without ITL gaps (one-token outputs): that ratio is n/a.
        let d = drift(&[row(0, true, 3, 10.0, 0.0), row(1, true, 3, 20.0, 5.0)]).unwrap();
        assert_eq!((d.ttft, d.itl), (Some(2.0), None));
    }

    #[test]
    fn feed_cycles_and_refills() {
        use super::super::dataset::Prompt;
        let req = |n: usize| SampleRequest {
            prompt: Prompt::Text(n.to_string()),
            prompt_len: n,
            prompt_len_counted: true,
            output_len: 1,
        };
        let mut f = Feed::new(vec![req(1), req(2)], None);
        let lens: Vec<usize> = (0..5).map(|_| f.next_request().prompt_len).collect();
        assert_eq!(lens, vec![1, 2, 1, 2, 1]);
        let mut passes = Vec::new();
        let mut f = Feed::new(
            vec![req(1), req(2)],
            Some(Box::new(|p| {
                passes.push(p);
                Ok(vec![req(10 * p as usize), req(10 * p as usize + 1)])
            })),
        );
        let lens: Vec<usize> = (0..6).map(|_| f.next_request().prompt_len).collect();
        assert_eq!(lens, vec![1, 2, 10, 11, 20, 21]);
        drop(f);
        assert_eq!(passes, vec![1, 2]);
        let mut f = Feed::new(vec![req(1)], Some(Box::new(|_| anyhow::bail!("no"))));
        let lens: Vec<usize> = (0..3).map(|_| f.next_request().prompt_len).collect();
        assert_eq!(lens, vec![1, 1, 1], "a failed refill cycles the last pool");
    }

    #[test]
    fn memory_probes_parse() {
        let status = "Name:\tdayone\nVmPeak:\t  999 kB\nVmRSS:\t  123456 kB\nThreads: 9\n";
        assert_eq!(parse_vm_rss(status), Some(123456 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert_eq!(parse_smi("1024\n2048\n"), Some(3072.0));
        assert_eq!(parse_smi("[N/A]\n"), None);
        // This process's own RSS is readable.
        assert!(proc_rss(std::process::id()).is_some_and(|b| b > 0));
        assert_eq!(proc_rss(u32::MAX), None);
    }

    #[test]
    fn verdict_and_json() {
        let run = SoakRun {
            outputs: vec![
                (ok(0.0, 0.1, 0.5, vec![0.1; 4], 5), true),
                (
                    RequestOutput {
                        aborted: true,
                        ..Default::default()
                    },
                    true,
                ),
            ],
            sent: 2,
            send_s: 3.0,
            elapsed_s: 3.5,
            interrupted: false,
        };
        let idle = ServerState {
            running: Some(0.0),
            waiting: Some(0.0),
            kv_blocks_used: Some(0.0),
            ..Default::default()
        };
        let snap = |s| Snapshot {
            server: Some(s),
            ..Default::default()
        };
        let r = SoakReport::new(&run, 0.05, 0.5, 60.0, Snapshot::default(), snap(idle));
        assert!(r.failures().is_empty());
        assert_eq!((r.completed, r.aborted, r.failed), (1, 1, 0));
        let j = r.to_json();
        assert_eq!(j["passed"], true);
        assert_eq!(j["leaked_blocks"], 0.0);
        assert_eq!(j["p99_drift"], Value::Null);
        assert_eq!(j["server_start"]["metrics_available"], false);
        assert!(r
            .render()
            .contains(&format!("{:<40} pass", "Soak verdict:")));
        let leaky = ServerState {
            kv_blocks_used: Some(7.0),
            ..idle
        };
        let r = SoakReport::new(&run, 0.05, 0.5, 60.0, Snapshot::default(), snap(leaky));
        assert_eq!(r.failures().len(), 1);
        assert!(r.failures()[0].contains("leaked"), "{:?}", r.failures());
        assert_eq!(r.to_json()["passed"], false);
        let mut bad = run;
        bad.outputs.push((
            RequestOutput {
                error: "HTTP 500".into(),
                ..Default::default()
            },
            true,
        ));
        let r = SoakReport::new(
            &bad,
            0.05,
            0.5,
            60.0,
            Snapshot::default(),
            Snapshot::default(),
        );
        assert_eq!(r.failures().len(), 1);
        assert!(r.failures()[0].contains("HTTP 500"));
        assert!(r
            .render()
            .contains(&format!("{:<40} n/a", "KV blocks used (leaked):")));
    }
}
