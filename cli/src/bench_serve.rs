//! `dayone bench-serve`: a load generator for any OpenAI-compatible server (dayone, vLLM,
//! SGLang, llama-server) whose printout and JSON match `vllm bench serve` (serving.md G), so a
//! run against dayone and one against vLLM diff line by line.
//!
//! Flow: resolve the model (`GET /v1/models` unless `--model`), build the dataset, send one
//! test request (as vLLM does; it also proves the server is reachable), the warm-ups, then the
//! timed run (arrivals from [`schedule`], one streaming request each through [`client`]), and
//! report through [`report`]. `GET /metrics` is read before and after for the prefix-cache hit
//! rate. Ctrl-C stops the run and reports the requests finished so far.
//!
//! `--duration-minutes` turns the run into a soak ([`soak`]): requests keep going out until the
//! time is up (optionally some dropped mid-stream, `--abort-fraction`), and a soak section
//! follows the usual block (per-minute p99, drift, the server's state and memory after); the
//! exit code is 1 when a request failed or KV blocks leaked.

mod client;
mod dataset;
mod report;
mod schedule;
mod server_metrics;
mod soak;

use crate::parse;
use crate::usage::usage;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use client::{Api, RequestOutput, Sampling, Target};
use dataset::SampleRequest;
use dayone_engine::tokenizer::Tokenizer;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use report::MetricKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which prompts to send (`--dataset-name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DatasetName {
    /// Random token ids (`--random-*`).
    Random,
    /// A ShareGPT JSON file (`--dataset-path`).
    Sharegpt,
}

/// `--percentile-metrics`: which latency metrics get a section.
#[derive(Clone, Debug)]
pub struct MetricList(pub Vec<MetricKind>);

/// `--metric-percentiles`: which percentiles each section shows.
#[derive(Clone, Debug)]
pub struct PercentileList(pub Vec<f64>);

fn metric_list(s: &str) -> Result<MetricList, String> {
    let mut v = Vec::new();
    for k in s.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        match MetricKind::from_key(k) {
            Some(m) if !v.contains(&m) => v.push(m),
            Some(_) => {}
            None => {
                return Err(format!(
                    "unknown metric '{k}' (choose from ttft, tpot, itl, e2el)"
                ))
            }
        }
    }
    if v.is_empty() {
        return Err("name at least one of ttft, tpot, itl, e2el".into());
    }
    Ok(MetricList(v))
}

fn percentile_list(s: &str) -> Result<PercentileList, String> {
    let mut v = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let x: f64 = p.parse().map_err(|_| format!("'{p}' is not a number"))?;
        if !(x > 0.0 && x < 100.0) {
            return Err(format!("percentiles must be in (0, 100), got {p}"));
        }
        v.push(x);
    }
    if v.is_empty() {
        return Err("give at least one percentile, e.g. 99 or 50,90,99".into());
    }
    Ok(PercentileList(v))
}

/// Requests per second: a number > 0, or `inf` (all at once).
fn request_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("inf") || t.eq_ignore_ascii_case("infinity") {
        return Ok(f64::INFINITY);
    }
    let v: f64 = t
        .parse()
        .map_err(|_| format!("'{s}' is not a number or 'inf'"))?;
    if v.is_nan() || v <= 0.0 {
        return Err(format!("must be > 0 or 'inf', got {t}"));
    }
    Ok(v)
}

/// A ratio in [0, 1).
fn range_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !(0.0..1.0).contains(&v) {
        return Err(format!("must be in [0, 1), got {}", s.trim()));
    }
    Ok(v)
}

/// A fraction in [0, 1].
fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("must be in [0, 1], got {}", s.trim()));
    }
    Ok(v)
}

/// `dayone bench-serve` flags (vLLM's `vllm bench serve` names).
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// The server's base URL (a trailing /v1 is dropped).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The API path: /v1/completions, or /v1/chat/completions.
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// Model name sent in requests [default: the first id of GET /v1/models].
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer token [default: $OPENAI_API_KEY].
    #[arg(long)]
    pub api_key: Option<String>,
    /// Prompts: random token ids, or a ShareGPT file (--dataset-path).
    #[arg(long, value_enum, default_value_t = DatasetName::Random)]
    pub dataset_name: DatasetName,
    /// The ShareGPT JSON file (a list of {conversations: [{from, value}]}).
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Output length of every ShareGPT request [default: the reply's length].
    #[arg(long, value_parser = parse::at_least_one)]
    pub sharegpt_output_len: Option<usize>,
    /// A tokenizer.json, or a model directory holding one: counts ShareGPT tokens, gives the
    /// random dataset its vocabulary and turns random ids into text for the chat endpoint.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Requests to send (with --duration-minutes: the pool of prompts cycled; the random
    /// dataset draws a fresh pool of this size each pass).
    #[arg(long, default_value_t = 1000, value_parser = parse::at_least_one)]
    pub num_prompts: usize,
    /// Random dataset: input tokens per request (besides the prefix).
    #[arg(long, default_value_t = 1024, value_parser = parse::at_least_one)]
    pub random_input_len: usize,
    /// Random dataset: output tokens per request.
    #[arg(long, default_value_t = 128, value_parser = parse::at_least_one)]
    pub random_output_len: usize,
    /// Random dataset: lengths uniform in [len·(1−r), len·(1+r)].
    #[arg(long, default_value_t = 0.0, value_parser = range_ratio)]
    pub random_range_ratio: f64,
    /// Random dataset: tokens of a prefix shared by every prompt.
    #[arg(long, default_value_t = 0, value_parser = parse::non_negative)]
    pub random_prefix_len: usize,
    /// Random dataset without --tokenizer: ids are drawn from [0, N) (use the model's vocab).
    #[arg(long, value_parser = parse::at_least_one)]
    pub random_vocab_size: Option<usize>,
    /// Arrivals per second (Poisson, or gamma with --burstiness), or inf: all at once.
    #[arg(long, default_value = "inf", value_parser = request_rate)]
    pub request_rate: f64,
    /// Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 more even.
    #[arg(long, default_value_t = 1.0, value_parser = parse::positive_finite)]
    pub burstiness: f64,
    /// At most this many requests in flight [default: no limit].
    #[arg(long, value_parser = parse::at_least_one)]
    pub max_concurrency: Option<usize>,
    /// Untimed requests (copies of the first prompt) before the run.
    #[arg(long, default_value_t = 0, value_parser = parse::non_negative)]
    pub num_warmups: usize,
    /// Sends ignore_eos: true (every request generates its full output length).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Seed of the dataset and the arrivals.
    #[arg(long, default_value_t = 0, value_parser = parse::seed)]
    pub seed: u64,
    /// Metrics that get a section: comma list of ttft, tpot, itl, e2el.
    #[arg(long, default_value = "ttft,tpot,itl", value_parser = metric_list)]
    pub percentile_metrics: MetricList,
    /// Percentiles shown per metric: comma list, e.g. 50,90,99.
    #[arg(long, default_value = "99", value_parser = percentile_list)]
    pub metric_percentiles: PercentileList,
    /// Writes the result JSON (vLLM's keys).
    #[arg(long)]
    pub save_result: bool,
    /// Directory of the result JSON [default: .] (implies --save-result).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    /// File name of the result JSON [default: vLLM's
    /// BACKEND-RATEqps[-concurrencyN]-MODEL-DATE.json] (implies --save-result).
    #[arg(long)]
    pub result_filename: Option<String>,
    /// No progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
    /// Per-request limit in seconds, send to end of stream (a request past it fails).
    #[arg(long, default_value_t = 3600.0, value_parser = parse::positive_finite)]
    pub timeout: f64,
    /// Sampling temperature sent with every request.
    #[arg(long, default_value_t = 0.0, value_parser = parse::non_negative_finite)]
    pub temperature: f32,
    /// Soak: instead of --num-prompts requests, keep sending (at --max-concurrency) for this
    /// many minutes, then wait for the requests in flight (each bounded by --timeout); adds a
    /// soak report and exits 1 when a request failed or KV blocks leaked.
    #[arg(long, value_parser = parse::positive_finite)]
    pub duration_minutes: Option<f64>,
    /// Soak: the share of requests (0..1, seeded by --seed) the client drops after 1..=5
    /// output chunks, closing the connection mid-stream (counted as aborted, not failed).
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    pub abort_fraction: f64,
    /// Soak: the server's process id, to read its RSS from /proc/PID/status at start and end.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Soak: seconds per report row (for tests).
    #[arg(long, default_value_t = 60.0, value_parser = parse::positive_finite, hide = true)]
    pub soak_minute_s: f64,
}

/// The base URL without a trailing `/` or `/v1`.
fn base_url(url: &str) -> Result<String> {
    let u = url.trim().trim_end_matches('/');
    let u = u.strip_suffix("/v1").unwrap_or(u);
    if u.starts_with("https://") {
        return Err(usage(format!(
            "--url {url}: https is not supported (this build has no TLS); use http://"
        )));
    }
    if !u.starts_with("http://") || u.len() <= "http://".len() {
        return Err(usage(format!(
            "--url {url}: expected http://HOST:PORT (e.g. http://127.0.0.1:8000)"
        )));
    }
    Ok(u.to_string())
}

/// A tokenizer.json, or the one in a model directory.
fn load_tokenizer(p: &Path) -> Result<Tokenizer> {
    let file = if p.is_dir() {
        p.join("tokenizer.json")
    } else {
        p.to_path_buf()
    };
    if !file.is_file() {
        bail!(
            "--tokenizer {}: no such file (expected a tokenizer.json or a directory holding one)",
            file.display()
        );
    }
    Tokenizer::from_file(&file)
}

/// The first model id of `GET base/v1/models`.
async fn first_model(client: &reqwest::Client, base: &str, key: Option<&str>) -> Result<String> {
    let url = format!("{base}/v1/models");
    let mut req = client.get(&url).timeout(Duration::from_secs(30));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {base}: {}", client::error_chain(&e)))?;
    let status = resp.status();
    if !status.is_success() {
        let body: String = resp
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(300)
            .collect();
        bail!(
            "GET {url} returned HTTP {status} {}; pass --model",
            body.trim()
        );
    }
    let v: serde_json::Value = resp
        .json()
        .await
        .with_context(|| format!("GET {url}: the answer is not JSON; pass --model"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("GET {url} lists no model (no data[0].id); pass --model"))
}

/// `YYYYMMDD-HHMMSS` in local time (vLLM's `date`).
fn local_date() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as libc::time_t)
        .unwrap_or(0);
    // SAFETY: localtime_r writes only into `tm`, which lives for the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&now, &mut tm).is_null() };
    if !ok {
        return "19700101-000000".into();
    }
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Python's `str(float)` for the file name (`inf`, `10.0`, `2.5`).
fn py_float(x: f64) -> String {
    if x.is_infinite() {
        "inf".into()
    } else if x.fract() == 0.0 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// Everything the run needs, checked.
struct Plan {
    base: String,
    target: Target,
    api: Api,
    requests: Vec<SampleRequest>,
    model: String,
    sampling: Sampling,
}

/// The random dataset's spec, vocabulary and (for the chat endpoint) the tokenizer that turns
/// its ids into text.
fn random_parts<'t>(
    a: &BenchServeArgs,
    api: Api,
    tok: Option<&'t Tokenizer>,
) -> Result<(dataset::RandomSpec, dataset::Vocab, Option<&'t Tokenizer>)> {
    let vocab = match (a.random_vocab_size, tok) {
        (Some(n), _) => dataset::Vocab::Range(u32::try_from(n).map_err(|_| {
            usage(format!(
                "--random-vocab-size {n} is too large (at most {})",
                u32::MAX
            ))
        })?),
        (None, Some(t)) => dataset::Vocab::from_tokenizer(t)?,
        (None, None) => {
            return Err(usage(
                "--dataset-name random needs --tokenizer PATH or --random-vocab-size N \
                 (the model's vocabulary size) to draw prompt token ids",
            ))
        }
    };
    let as_text = match api {
        Api::Completions => None,
        Api::Chat => Some(tok.ok_or_else(|| {
            usage(
                "--dataset-name random with a chat endpoint needs --tokenizer (random ids \
                 are decoded to text for the chat message)",
            )
        })?),
    };
    let spec = dataset::RandomSpec {
        num_prompts: a.num_prompts,
        input_len: a.random_input_len,
        output_len: a.random_output_len,
        range_ratio: a.random_range_ratio,
        prefix_len: a.random_prefix_len,
        seed: a.seed,
    };
    Ok((spec, vocab, as_text))
}

fn build_dataset(
    a: &BenchServeArgs,
    api: Api,
    tok: Option<&Tokenizer>,
) -> Result<Vec<SampleRequest>> {
    match a.dataset_name {
        DatasetName::Sharegpt => {
            let Some(path) = &a.dataset_path else {
                return Err(usage("--dataset-name sharegpt needs --dataset-path FILE"));
            };
            dataset::sharegpt_requests(path, a.num_prompts, a.sharegpt_output_len, tok, a.seed)
        }
        DatasetName::Random => {
            let (spec, vocab, as_text) = random_parts(a, api, tok)?;
            dataset::random_requests(&spec, &vocab, as_text)
        }
    }
}

fn body(plan: &Plan, r: &SampleRequest) -> serde_json::Value {
    client::request_body(
        plan.api,
        &plan.model,
        &r.prompt,
        r.output_len,
        &plan.sampling,
    )
}

/// Runs the benchmark.
pub fn run(a: BenchServeArgs) -> Result<()> {
    let base = base_url(&a.url)?;
    let endpoint = if a.endpoint.starts_with('/') {
        a.endpoint.clone()
    } else {
        format!("/{}", a.endpoint)
    };
    let api = Api::from_endpoint(&endpoint).ok_or_else(|| {
        usage(format!(
            "--endpoint {}: expected /v1/completions or /v1/chat/completions",
            a.endpoint
        ))
    })?;
    if a.dataset_path.is_some() && a.dataset_name != DatasetName::Sharegpt {
        return Err(usage("--dataset-path is for --dataset-name sharegpt"));
    }
    if a.duration_minutes.is_none() {
        if a.abort_fraction > 0.0 {
            return Err(usage(
                "--abort-fraction is for a soak (--duration-minutes M)",
            ));
        }
        if a.server_pid.is_some() {
            return Err(usage("--server-pid is for a soak (--duration-minutes M)"));
        }
    } else if a.max_concurrency.is_none() && a.request_rate.is_infinite() {
        return Err(usage(
            "--duration-minutes needs --max-concurrency N (or a finite --request-rate): \
             without either the soak would send without pause",
        ));
    }
    let api_key = a
        .api_key
        .clone()
        .or_else(|| std::env::var("OPENAI_API_KEY").ok())
        .filter(|k| !k.is_empty());
    let tok = a.tokenizer.as_deref().map(load_tokenizer).transpose()?;
    // Checked before any network traffic, so a bad dataset fails fast.
    let requests = build_dataset(&a, api, tok.as_ref())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .context("building the HTTP client")?;
        let model = match &a.model {
            Some(m) => m.clone(),
            None => first_model(&http, &base, api_key.as_deref()).await?,
        };
        let plan = Plan {
            target: Target {
                url: format!("{base}{endpoint}"),
                api_key,
                timeout: Duration::from_secs_f64(a.timeout),
            },
            base,
            api,
            requests,
            model,
            sampling: Sampling {
                temperature: a.temperature,
                ignore_eos: a.ignore_eos,
            },
        };
        bench(&a, &http, plan, &endpoint, tok.as_ref()).await
    })
}

/// What the timed part produced: the outputs reported in the usual block (aborted ones left
/// out), whether each prompt length was counted, the duration, the requests sent, and the soak
/// report of a soak.
struct Timed {
    outputs: Vec<RequestOutput>,
    counted: Vec<bool>,
    duration: f64,
    sent: usize,
    soak: Option<soak::SoakReport>,
}

/// The fixed-size run: `--num-prompts` requests at their arrival times.
async fn fixed_run(a: &BenchServeArgs, http: &reqwest::Client, plan: &Arc<Plan>) -> Timed {
    let n = plan.requests.len();
    let offsets = schedule::arrival_offsets(n, a.request_rate, a.burstiness, a.seed);
    let bar = progress(
        a,
        n as u64,
        "requests [{bar:30}] {pos}/{len} {elapsed_precise} {wide_msg}",
    );
    let bodies: Arc<Vec<serde_json::Value>> =
        Arc::new(plan.requests.iter().map(|r| body(plan, r)).collect());
    let t0 = Instant::now();
    let mut failed = 0usize;
    let results = schedule::dispatch(
        &offsets,
        a.max_concurrency,
        t0,
        |i| {
            let (h, p, b) = (http.clone(), plan.clone(), bodies.clone());
            async move { client::send(&h, &p.target, &b[i], p.requests[i].prompt_len, t0).await }
        },
        |_, o: &RequestOutput| {
            if !o.success {
                failed += 1;
                bar.set_message(format!("{failed} failed"));
            }
            bar.inc(1);
        },
        crate::interrupt::requested,
    )
    .await;
    let duration = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();
    // Interrupted runs report the requests that finished.
    let finished: Vec<usize> = (0..n).filter(|&i| results[i].is_some()).collect();
    if finished.len() < n {
        eprintln!(
            "interrupted: reporting the {} of {n} requests that finished",
            finished.len()
        );
    }
    let counted = finished
        .iter()
        .map(|&i| plan.requests[i].prompt_len_counted)
        .collect();
    Timed {
        outputs: results.into_iter().flatten().collect(),
        counted,
        duration,
        sent: a.num_prompts,
        soak: None,
    }
}

/// The soak: `--duration-minutes` of requests, then the server's state once idle.
async fn soak_run(
    a: &BenchServeArgs,
    http: &reqwest::Client,
    plan: &Arc<Plan>,
    tok: Option<&Tokenizer>,
    minutes: f64,
) -> Result<Timed> {
    let key = plan.target.api_key.as_deref();
    let start = soak::snapshot(http, &plan.base, key, a.server_pid, false).await;
    let refill: Option<soak::Refill<'_>> = match a.dataset_name {
        DatasetName::Sharegpt => None,
        DatasetName::Random => {
            let (spec, vocab, as_text) = random_parts(a, plan.api, tok)?;
            Some(Box::new(move |pass| {
                dataset::random_batch(&spec, &vocab, as_text, pass)
            }))
        }
    };
    let mut feed = soak::Feed::new(plan.requests.clone(), refill);
    let cfg = soak::SoakConfig {
        duration: Duration::from_secs_f64(minutes * 60.0),
        max_concurrency: a.max_concurrency,
        request_rate: a.request_rate,
        burstiness: a.burstiness,
        abort_fraction: a.abort_fraction,
        seed: a.seed,
    };
    eprintln!(
        "Soak: {minutes} min, then up to {} s for the requests in flight; abort fraction {}",
        a.timeout, a.abort_fraction
    );
    let secs = cfg.duration.as_secs().max(1);
    let bar = progress(a, secs, "soak [{bar:30}] {pos}/{len} s {wide_msg}");
    let (mut done, mut aborted, mut failed) = (0usize, 0usize, 0usize);
    // Without a bar (logs), one line a minute.
    let mut logged_minute = 0u64;
    let t0 = Instant::now();
    let run = soak::run(
        &cfg,
        t0,
        &mut feed,
        |r, abort| {
            let (h, p) = (http.clone(), plan.clone());
            let b = body(plan, r);
            let len = r.prompt_len;
            async move { client::send_with(&h, &p.target, &b, len, t0, abort).await }
        },
        |o, in_flight| {
            if o.success {
                done += 1;
            } else if o.aborted {
                aborted += 1;
            } else {
                failed += 1;
            }
            let el = t0.elapsed().as_secs();
            bar.set_position(el.min(secs));
            if a.disable_tqdm && el / 60 > logged_minute {
                logged_minute = el / 60;
                eprintln!(
                    "soak: {logged_minute} min: {done} done, {aborted} aborted, {failed} failed, \
                     {in_flight} in flight"
                );
            }
            bar.set_message(format!(
                "{done} done, {aborted} aborted, {failed} failed, {in_flight} in flight"
            ));
        },
        crate::interrupt::requested,
    )
    .await;
    bar.finish_and_clear();
    if run.interrupted {
        eprintln!(
            "interrupted: reporting the {} of {} requests that landed",
            run.outputs.len(),
            run.sent
        );
    } else {
        eprintln!("Soak sending done; waiting for the server to go idle...");
    }
    let end = soak::snapshot(http, &plan.base, key, a.server_pid, !run.interrupted).await;
    let report =
        soak::SoakReport::new(&run, minutes, a.abort_fraction, a.soak_minute_s, start, end);
    let (outputs, counted) = run.outputs.into_iter().filter(|(o, _)| !o.aborted).unzip();
    Ok(Timed {
        outputs,
        counted,
        duration: run.elapsed_s,
        sent: run.sent,
        soak: Some(report),
    })
}

/// A progress bar on stderr (hidden with --disable-tqdm).
fn progress(a: &BenchServeArgs, len: u64, template: &str) -> ProgressBar {
    let bar = if a.disable_tqdm {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

async fn bench(
    a: &BenchServeArgs,
    http: &reqwest::Client,
    plan: Plan,
    endpoint: &str,
    tok: Option<&Tokenizer>,
) -> Result<()> {
    let plan = Arc::new(plan);
    let http = http.clone();
    eprintln!("Starting initial single prompt test run...");
    let first = &plan.requests[0];
    let test = client::send(
        &http,
        &plan.target,
        &body(&plan, first),
        first.prompt_len,
        Instant::now(),
    )
    .await;
    if !test.success && test.error.starts_with("error sending request") {
        bail!("cannot reach {}: {}", plan.base, test.error);
    }
    if !test.success {
        bail!(
            "initial test request to {} failed: {} (check --url, --endpoint, --model)",
            plan.target.url,
            test.error
        );
    }
    eprintln!("Initial test run completed. Starting main benchmark run...");
    if a.num_warmups > 0 {
        eprintln!("Warming up with {} requests...", a.num_warmups);
        let b = Arc::new(body(&plan, first));
        let len = first.prompt_len;
        let (h, p, t0) = (http.clone(), plan.clone(), Instant::now());
        schedule::dispatch(
            &vec![0.0; a.num_warmups],
            a.max_concurrency,
            t0,
            |_| {
                let (h, p, b) = (h.clone(), p.clone(), b.clone());
                async move { client::send(&h, &p.target, &b, len, t0).await }
            },
            |_, _| {},
            crate::interrupt::requested,
        )
        .await;
        eprintln!("Warmup completed.");
    }
    eprintln!("Traffic request rate: {}", py_float(a.request_rate));
    if a.burstiness == 1.0 {
        eprintln!(
            "Burstiness factor: {} (Poisson process)",
            py_float(a.burstiness)
        );
    } else {
        eprintln!(
            "Burstiness factor: {} (Gamma process)",
            py_float(a.burstiness)
        );
    }
    match a.max_concurrency {
        Some(c) => eprintln!("Maximum request concurrency: {c}"),
        None => eprintln!("Maximum request concurrency: None"),
    }
    let before = server_metrics::scrape(&http, &plan.base, plan.target.api_key.as_deref()).await;
    let Timed {
        outputs,
        counted,
        duration,
        sent,
        soak,
    } = match a.duration_minutes {
        None => fixed_run(a, &http, &plan).await,
        Some(m) => soak_run(a, &http, &plan, tok, m).await?,
    };
    let after = server_metrics::scrape(&http, &plan.base, plan.target.api_key.as_deref()).await;

    let m = report::calculate(&outputs, &counted, duration);
    let info = report::RunInfo {
        max_concurrency: a.max_concurrency,
        request_rate: a.request_rate,
        burstiness: a.burstiness,
        selected: a.percentile_metrics.0.clone(),
        percentiles: a.metric_percentiles.0.clone(),
        duration,
        prefix_cache: server_metrics::delta(before, after),
    };
    if m.completed == 0 && !outputs.is_empty() {
        eprintln!(
            "warning: all requests failed; first error: {}",
            outputs.first().map(|o| o.error.as_str()).unwrap_or("")
        );
    }
    if m.without_usage > 0 {
        eprintln!(
            "note: {} of {} successful requests carried no usage; their output tokens are counted \
             as content chunks (a chunk may hold several tokens)",
            m.without_usage, m.completed
        );
    }
    if a.dataset_name == DatasetName::Random && plan.api == Api::Chat {
        eprintln!(
            "note: chat prompts are random ids decoded to text: input lengths are approximate \
             (re-encoding differs, and the chat template is not counted)"
        );
    }
    if plan.requests.iter().any(|r| !r.prompt_len_counted) {
        eprintln!(
            "note: without --tokenizer, ShareGPT lengths are chars/4 estimates (input tokens use \
             the server's usage.prompt_tokens where it reports them)"
        );
    }
    let mut text = report::render(&m, &info);
    if let Some(s) = &soak {
        text.push_str(&s.render());
    }
    for line in text.lines() {
        crate::outln!("{line}")?;
    }

    if a.save_result || a.result_dir.is_some() || a.result_filename.is_some() {
        let header = report::Header {
            date: local_date(),
            backend: plan.api.backend().into(),
            endpoint: endpoint.to_string(),
            model_id: plan.model.clone(),
            tokenizer_id: a.tokenizer.as_ref().map(|p| p.display().to_string()),
            num_prompts: sent,
        };
        let input_lens: Vec<usize> = outputs
            .iter()
            .zip(&counted)
            .map(|(o, &c)| report::input_len(o, c))
            .collect();
        let mut json = report::to_json(&header, &m, &info, &outputs, &input_lens);
        if let Some(s) = &soak {
            json["soak"] = s.to_json();
        }
        let name = match &a.result_filename {
            Some(f) => f.clone(),
            None => {
                let conc = a
                    .max_concurrency
                    .map(|c| format!("-concurrency{c}"))
                    .unwrap_or_default();
                let model = plan.model.rsplit('/').next().unwrap_or(&plan.model);
                format!(
                    "{}-{}qps{conc}-{model}-{}.json",
                    header.backend,
                    py_float(a.request_rate),
                    header.date
                )
            }
        };
        let path = match &a.result_dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .with_context(|| format!("creating --result-dir {}", d.display()))?;
                d.join(name)
            }
            None => PathBuf::from(name),
        };
        let s = serde_json::to_string(&json).context("serialising the result")?;
        std::fs::write(&path, s).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("saved result to {}", path.display());
    }
    // An interrupted soak is reported, not judged (Ctrl-C dropped requests mid-flight): it
    // exits 130 as any interrupted command.
    if let Some(s) = soak.as_ref().filter(|s| !s.interrupted) {
        let why = s.failures();
        if !why.is_empty() {
            bail!("soak failed: {}", why.join("; "));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_parsers() {
        assert_eq!(request_rate("inf"), Ok(f64::INFINITY));
        assert_eq!(request_rate("2.5"), Ok(2.5));
        assert!(request_rate("0").is_err() && request_rate("x").is_err());
        assert!(range_ratio("1").is_err() && range_ratio("-0.1").is_err());
        assert_eq!(range_ratio("0.5"), Ok(0.5));
        assert_eq!(
            metric_list("ttft, e2el,ttft").unwrap().0,
            vec![MetricKind::Ttft, MetricKind::E2el]
        );
        assert!(metric_list("ttft,goodput").is_err());
        assert_eq!(percentile_list("50,99.9").unwrap().0, vec![50.0, 99.9]);
        assert!(percentile_list("100").is_err() && percentile_list("").is_err());
        assert_eq!(base_url("http://h:1/v1/").unwrap(), "http://h:1");
        assert!(base_url("https://h").is_err() && base_url("h:80").is_err());
        assert_eq!(py_float(10.0), "10.0");
        assert_eq!(py_float(f64::INFINITY), "inf");
        assert_eq!(local_date().len(), 15);
        assert_eq!(fraction("0"), Ok(0.0));
        assert_eq!(fraction("1"), Ok(1.0));
        assert!(fraction("1.01").is_err() && fraction("-0.1").is_err() && fraction("x").is_err());
    }
}
