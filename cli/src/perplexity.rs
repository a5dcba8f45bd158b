//! `dayone perplexity`: perplexity of a model over a text file (llama.cpp's `llama-perplexity`
//! protocol, windows scored in batches through the engine service), and the KL divergence of a
//! run against a saved one (`--save-logprobs` / `--kl-base`).
//!
//! Protocol: the whole file is tokenized without special tokens and cut into consecutive,
//! non-overlapping windows of `--ctx` tokens (a final shorter window is dropped); with `--bos`
//! each window is the BOS id followed by `ctx − 1` text tokens. Tokens 2..N of each window are
//! scored given the earlier tokens of that window only; PPL = exp(mean NLL over every scored
//! token), and its standard error is llama-perplexity's: exp(mean) × sqrt(var(NLL) / (n − 1)).

use crate::engine_args::{CommandDefaults, EngineArgs};
use crate::usage::usage;
use crate::{interrupt, load, outln, parse};
use anyhow::{bail, Context, Result};
use clap::Args;
use dayone_engine::sampling::{SamplingParams, TokenLogprobs};
use dayone_engine::service::{EngineHandle, Request, StreamEvent};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flags of `dayone perplexity`.
#[derive(Args, Debug)]
#[command(after_long_help = PROTOCOL)]
pub struct PerplexityArgs {
    /// The engine flags (model, backend, dtype, cache, scheduler, --config FILE).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The text to score (UTF-8), tokenized whole without special tokens.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: PathBuf,
    /// Window length in tokens (BOS included with --bos): at least 2, at most the model's
    /// context window.
    #[arg(long, value_name = "N", value_parser = parse::non_negative, allow_negative_numbers = true)]
    pub ctx: usize,
    /// Start each window with the BOS token (then N − 1 text tokens per window).
    #[arg(long)]
    pub bos: bool,
    /// Windows submitted together (scored in the same engine steps); default: as many as fit
    /// in one step's token budget (--max-num-batched-tokens / N, at least 1).
    #[arg(long, value_name = "W", value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub batch_windows: Option<usize>,
    /// One JSON object on stdout: ppl, ppl_stderr, windows, scored_tokens, text_tokens, ctx,
    /// bos (and kl with --kl-base); the running estimate goes to stderr.
    #[arg(long)]
    pub json: bool,
    /// Save each scored token's log-probability and its top alternatives (--save-top) with
    /// the mass of the rest to PATH, for a later --kl-base.
    #[arg(long, value_name = "PATH")]
    pub save_logprobs: Option<PathBuf>,
    /// Alternatives saved per scored token with --save-logprobs (the vocabulary size or more:
    /// the full distribution).
    #[arg(long, value_name = "K", default_value_t = 32, requires = "save_logprobs",
          value_parser = parse::at_least_one, allow_negative_numbers = true)]
    pub save_top: usize,
    /// Compare this run against one saved with --save-logprobs (same text, --ctx and --bos):
    /// mean / p99 / max KL(base ‖ this), top-1 agreement, mean |Δ log p| of the right token.
    #[arg(long, value_name = "PATH")]
    pub kl_base: Option<PathBuf>,
}

/// The protocol, at the end of `--help`.
const PROTOCOL: &str = "Protocol (llama-perplexity's): the whole file is tokenized without special tokens and cut \
into consecutive non-overlapping windows of --ctx N tokens; a final window shorter than N is dropped. With --bos each \
window is the BOS id followed by N - 1 text tokens. Tokens 2..N of each window are scored given the earlier tokens of \
that window only (N - 1 per window); PPL = exp(mean NLL over every scored token), ± exp(mean) * sqrt(var(NLL) / (n - 1)). \
A running estimate is printed after each window ([i]ppl).\n\nKL: --save-logprobs PATH keeps each scored token's \
log-probability, its --save-top K most likely tokens and the log of the rest mass; --kl-base PATH compares a later run \
(another backend, dtype or quantisation) against it over the top-K tokens plus the rest: KL(base || this) per token \
(mean, p99, max), how often both agree on the most likely token, and the mean |log p(base) - log p(this)| of the \
text's token.";

/// Runs `dayone perplexity`.
pub fn run(a: PerplexityArgs) -> Result<()> {
    if a.ctx < 2 {
        return Err(usage(format!(
            "--ctx must be at least 2 (a window scores its tokens 2..N), got {}",
            a.ctx
        )));
    }
    if let (Some(save), Some(base)) = (&a.save_logprobs, &a.kl_base) {
        // Writing the run over its own base would lose the base.
        let same = save == base
            || matches!((save.canonicalize(), base.canonicalize()), (Ok(x), Ok(y)) if x == y);
        if same {
            return Err(usage(format!(
                "--save-logprobs and --kl-base name the same file ({}): this run would overwrite its base; save to another path",
                save.display()
            )));
        }
    }
    // Everything that can fail without the model fails before loading it.
    let text = read_text(&a.file)?;
    let base = a.kl_base.as_deref().map(Saved::read).transpose()?;
    let mut resolved = a.engine.resolve(&CommandDefaults::default())?;
    let path = load::model_path(resolved.model.clone())?;
    let ckpt = load::open(&path)?;
    resolved.settle_dtype(&ckpt);
    let (kind, cfg) = (resolved.backend, resolved.engine);
    let (dtype, capped) = (cfg.dtype, cfg.max_model_len.is_some());
    let default_w = (cfg.scheduler.max_batched_tokens / a.ctx).max(1);
    let tok = ckpt.assets.tokenizer.clone().with_context(|| {
        format!(
            "{} has no tokenizer: perplexity scores a text",
            path.display()
        )
    })?;
    let bos = match (a.bos, ckpt.assets.bos_id) {
        (false, _) => None,
        (true, Some(id)) => Some(id),
        (true, None) => bail!(
            "--bos: {} names no BOS token (bos_token_id): run without --bos",
            path.display()
        ),
    };
    let ids = tok.encode(&text, false)?;
    let load_start = Instant::now();
    let handle = load::service(kind, ckpt, cfg, a.json)?;
    let load_time = load_start.elapsed();
    let info = handle.model_info().clone();
    if a.ctx > info.max_context {
        let window = if capped {
            "the context window --max-model-len allows"
        } else {
            "the model's context window"
        };
        return Err(usage(format!(
            "--ctx {} is above {window} of {} tokens",
            a.ctx, info.max_context
        )));
    }
    let per = a.ctx - usize::from(bos.is_some());
    let n_windows = ids.len() / per;
    if n_windows == 0 {
        bail!(
            "{} is {} tokens long, shorter than one window of {per} text tokens (--ctx {}{}): give a longer text or a smaller --ctx",
            a.file.display(),
            ids.len(),
            a.ctx,
            if bos.is_some() { " with --bos" } else { "" }
        );
    }
    let windows: Vec<Vec<u32>> = ids
        .chunks_exact(per)
        .map(|c| bos.into_iter().chain(c.iter().copied()).collect())
        .collect();
    let vocab = info.vocab_size;
    if let Some(b) = &base {
        b.check_against(vocab, a.ctx, a.bos, n_windows)?;
    }
    // What each scored token carries: full rows to compare against a saved run, else the
    // top-K to save, else nothing but the right token's log-probability.
    let top = if base.is_some() {
        vocab
    } else if a.save_logprobs.is_some() {
        a.save_top.min(vocab)
    } else {
        0
    };
    let mut saver = match &a.save_logprobs {
        Some(p) => Some(Saver::create(
            p,
            &Header {
                format: FORMAT.into(),
                version: 1,
                vocab_size: vocab,
                ctx: a.ctx,
                bos: a.bos,
                top: a.save_top.min(vocab),
                windows: n_windows,
                scored_tokens: n_windows * (a.ctx - 1),
                model: path.display().to_string(),
                backend: info.backend.clone(),
                dtype: dtype.to_string(),
            },
        )?),
        None => None,
    };
    let w = a.batch_windows.unwrap_or(default_w).min(n_windows);
    let mut stats = Stats::default();
    let mut kl = base.as_ref().map(|_| Kl::default());
    let mut running = RunningLine::new(a.json);
    let start = Instant::now();
    let mut done = 0;
    for batch in windows.chunks(w) {
        if interrupt::requested() {
            break;
        }
        let Some(scored) = score_batch(&handle, batch, top)? else {
            break; // interrupted
        };
        for lps in scored {
            for lp in lps.iter() {
                stats.push(-(lp.logprob as f64));
            }
            if let Some(s) = saver.as_mut() {
                s.write(&lps, a.save_top.min(vocab))?;
            }
            if let (Some(k), Some(b)) = (kl.as_mut(), base.as_ref()) {
                k.compare(b, done * (a.ctx - 1), &lps, vocab)?;
            }
            done += 1;
            running.push(done, stats.ppl())?;
        }
    }
    running.finish()?;
    let elapsed = start.elapsed();
    handle.shutdown(Duration::from_secs(1));
    if let Some(s) = saver {
        if done == n_windows {
            s.finish()?;
        } else {
            s.abandon();
            eprintln!("note: interrupted: --save-logprobs file not written");
        }
    }
    let tps = (done * a.ctx) as f64 / elapsed.as_secs_f64().max(1e-9);
    let (ppl, se) = (stats.ppl(), stats.ppl_stderr());
    let kl_json = kl.map(|k| k.json(base.as_ref().map(|b| b.ppl)));
    if a.json {
        let mut j = serde_json::json!({
            "ppl": ppl,
            "ppl_stderr": se,
            "nll_mean": stats.mean(),
            "windows": done,
            "scored_tokens": stats.n,
            "text_tokens": ids.len(),
            "ctx": a.ctx,
            "bos": a.bos,
            "batch_windows": w,
            "backend": info.backend,
            "dtype": dtype.to_string(),
            "activation_dtype": info.activation_dtype.to_string(),
            "batch_invariant": info.batch_invariant,
            "tokens_per_s": tps,
            "load_s": load_time.as_secs_f64(),
        });
        if let Some(k) = kl_json {
            j["kl"] = k;
        }
        outln!("{j}")?;
    } else {
        let se = se.map_or("n/a".to_string(), |s| format!("{s:.4}"));
        outln!("PPL = {ppl:.4} +/- {se}")?;
        outln!(
            "{done} windows of {} tokens{}, {} scored tokens of {} text tokens, {tps:.1} tok/s ({}, {dtype})",
            a.ctx,
            if a.bos { " (BOS + text)" } else { "" },
            stats.n,
            ids.len(),
            info.backend
        )?;
        if let Some(k) = kl_json {
            let f = |key: &str| k[key].as_f64().unwrap_or(f64::NAN);
            outln!(
                "KL vs base: mean {:.6}, p99 {:.6}, max {:.6}; top-1 agreement {:.2}%; mean |Δ log p| {:.6}; base PPL {:.4}",
                f("mean"),
                f("p99"),
                f("max"),
                100.0 * f("top1_agreement"),
                f("mean_abs_dlogp"),
                f("base_ppl")
            )?;
        }
    }
    Ok(())
}

/// The file's text; errors name the file (missing, not UTF-8, empty).
fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("--file {}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("--file {}: not UTF-8 text ({e})", path.display()))?;
    if text.trim().is_empty() {
        bail!("--file {} is empty: nothing to score", path.display());
    }
    Ok(text)
}

/// Scores the windows of one batch, submitted together; returns each window's prompt
/// log-probabilities (`ctx − 1` entries), in order (`None`: interrupted, the batch aborted).
fn score_batch(
    handle: &EngineHandle,
    batch: &[Vec<u32>],
    top: usize,
) -> Result<Option<Vec<Arc<Vec<TokenLogprobs>>>>> {
    let (tx, rx) = mpsc::channel::<(usize, StreamEvent)>();
    let requests: Vec<_> = batch
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let tx = tx.clone();
            let request = Request {
                prompt_logprobs: Some(top),
                ..Request::new(
                    w.clone(),
                    SamplingParams {
                        max_tokens: 1,
                        ..Default::default()
                    },
                )
            };
            (request, move |e| tx.send((i, e)).is_ok())
        })
        .collect();
    drop(tx);
    let ids = handle.submit_batch_with(requests)?;
    let mut out: Vec<Option<Arc<Vec<TokenLogprobs>>>> = vec![None; batch.len()];
    let mut left = batch.len();
    while left > 0 {
        if interrupt::requested() {
            for &id in &ids {
                handle.abort(id)?;
            }
            return Ok(None);
        }
        let (i, event) = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(e) => e,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the engine stopped without finishing the windows")
            }
        };
        match event {
            StreamEvent::Finished {
                prompt_logprobs,
                reason,
                ..
            } => {
                let lps = prompt_logprobs.with_context(|| {
                    format!(
                        "window {i}: the engine returned no prompt log-probabilities ({reason})"
                    )
                })?;
                if lps.len() != batch[i].len() - 1 {
                    bail!(
                        "window {i}: {} prompt log-probabilities for {} tokens",
                        lps.len(),
                        batch[i].len()
                    );
                }
                out[i] = Some(lps);
                left -= 1;
            }
            StreamEvent::Error(msg) => bail!(msg),
            _ => {}
        }
    }
    Ok(Some(
        out.into_iter().map(|o| o.expect("all finished")).collect(),
    ))
}

/// Sums of the per-token NLL.
#[derive(Default)]
struct Stats {
    n: usize,
    sum: f64,
    sum2: f64,
}

impl Stats {
    fn push(&mut self, nll: f64) {
        self.n += 1;
        self.sum += nll;
        self.sum2 += nll * nll;
    }
    fn mean(&self) -> f64 {
        self.sum / self.n.max(1) as f64
    }
    fn ppl(&self) -> f64 {
        self.mean().exp()
    }
    /// llama-perplexity's: exp(mean) × sqrt((E[nll²] − mean²) / (n − 1)); `None` below 2 tokens.
    fn ppl_stderr(&self) -> Option<f64> {
        if self.n < 2 {
            return None;
        }
        let m = self.mean();
        let var = (self.sum2 / self.n as f64 - m * m).max(0.0);
        Some((var / (self.n - 1) as f64).sqrt() * m.exp())
    }
}

/// llama-perplexity's running estimate: `[1]12.3456,[2]12.0123,…` on one line (stdout, or
/// stderr under --json).
struct RunningLine {
    to_stderr: bool,
    any: bool,
}

impl RunningLine {
    fn new(to_stderr: bool) -> Self {
        Self {
            to_stderr,
            any: false,
        }
    }
    fn push(&mut self, i: usize, ppl: f64) -> Result<()> {
        let s = format!("[{i}]{ppl:.4},");
        self.any = true;
        if self.to_stderr {
            eprint!("{s}");
            Ok(())
        } else {
            let mut o = std::io::stdout().lock();
            o.write_all(s.as_bytes())
                .and_then(|()| o.flush())
                .context("writing to stdout")
        }
    }
    fn finish(&mut self) -> Result<()> {
        if !self.any {
            return Ok(());
        }
        if self.to_stderr {
            eprintln!();
            Ok(())
        } else {
            outln!()
        }
    }
}

/// The saved file's format name.
const FORMAT: &str = "dayone-logprobs";

/// The first line of a saved file (JSON); records follow.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
struct Header {
    format: String,
    version: u32,
    vocab_size: usize,
    ctx: usize,
    bos: bool,
    /// Alternatives per record.
    top: usize,
    windows: usize,
    scored_tokens: usize,
    model: String,
    backend: String,
    dtype: String,
}

/// Writes a saved file: the header line, then per scored token (little-endian) the token id
/// (u32), its log-probability (f32), the log of the mass outside the top (f32, −inf when the top
/// is the whole vocabulary) and `top` × (id u32, log-probability f32), most likely first.
struct Saver {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<std::fs::File>,
    /// The top is the whole vocabulary.
    full: bool,
}

impl Saver {
    fn create(path: &Path, h: &Header) -> Result<Self> {
        // PATH.partial beside PATH (appended, not replacing an extension: `run.a` and `run.b`
        // must not share one temporary file).
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".partial");
        let tmp = PathBuf::from(tmp);
        let f = std::fs::File::create(&tmp)
            .with_context(|| format!("--save-logprobs {}", tmp.display()))?;
        let mut out = BufWriter::new(f);
        writeln!(out, "{}", serde_json::to_string(h)?)?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            out,
            full: h.top >= h.vocab_size,
        })
    }

    fn write(&mut self, lps: &[TokenLogprobs], top: usize) -> Result<()> {
        for lp in lps {
            let kept = &lp.top[..top.min(lp.top.len())];
            let rest = rest_logmass(kept, self.full);
            let mut rec = Vec::with_capacity(12 + 8 * top);
            rec.extend(lp.token.to_le_bytes());
            rec.extend(lp.logprob.to_le_bytes());
            rec.extend(rest.to_le_bytes());
            for &(id, p) in kept {
                rec.extend(id.to_le_bytes());
                rec.extend(p.to_le_bytes());
            }
            // Rows shorter than `top` cannot happen (top ≤ vocab); padded to keep records fixed.
            for _ in kept.len()..top {
                rec.extend(0u32.to_le_bytes());
                rec.extend(f32::NEG_INFINITY.to_le_bytes());
            }
            self.out
                .write_all(&rec)
                .with_context(|| format!("writing {}", self.tmp.display()))?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("--save-logprobs {}", self.path.display()))
    }

    fn abandon(self) {
        drop(self.out);
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// ln(1 − Σ exp(lp)) over `top` (f64), −inf when nothing is left (or `full`: the top is the
/// whole vocabulary, and the sum's rounding is not mass).
fn rest_logmass(top: &[(u32, f32)], full: bool) -> f32 {
    if full {
        return f32::NEG_INFINITY;
    }
    let s: f64 = top.iter().map(|&(_, p)| (p as f64).exp()).sum();
    let rest = 1.0 - s;
    if rest > 0.0 {
        rest.ln() as f32
    } else {
        f32::NEG_INFINITY
    }
}

/// One scored token of a saved run.
struct SavedToken {
    token: u32,
    logprob: f32,
    rest: f32,
    top: Vec<(u32, f32)>,
}

/// A saved run ([`Saver`]'s file).
struct Saved {
    path: PathBuf,
    header: Header,
    tokens: Vec<SavedToken>,
    ppl: f64,
}

impl Saved {
    fn read(path: &Path) -> Result<Self> {
        let name = || format!("--kl-base {}", path.display());
        let f = std::fs::File::open(path).with_context(name)?;
        let mut r = BufReader::new(f);
        let mut line = String::new();
        r.read_line(&mut line).with_context(name)?;
        let header: Header = serde_json::from_str(line.trim_end())
            .ok()
            .filter(|h: &Header| h.format == FORMAT)
            .with_context(|| format!("{}: not a file written by --save-logprobs", name()))?;
        if header.version != 1 {
            bail!(
                "{}: format version {} (this dayone reads 1)",
                name(),
                header.version
            );
        }
        if header.top == 0 {
            bail!(
                "{}: saved without alternatives: KL needs --save-top 1 or more",
                name()
            );
        }
        let mut body = Vec::new();
        r.read_to_end(&mut body).with_context(name)?;
        let rec = 12 + 8 * header.top;
        if body.len() != rec * header.scored_tokens {
            bail!(
                "{}: {} bytes of records, expected {} scored tokens × {rec}: the file is truncated or damaged",
                name(),
                body.len(),
                header.scored_tokens
            );
        }
        let u = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let f = |b: &[u8]| f32::from_le_bytes(b.try_into().expect("4 bytes"));
        let mut tokens = Vec::with_capacity(header.scored_tokens);
        let mut nll = 0.0f64;
        for c in body.chunks_exact(rec) {
            let t = SavedToken {
                token: u(&c[0..4]),
                logprob: f(&c[4..8]),
                rest: f(&c[8..12]),
                top: c[12..]
                    .chunks_exact(8)
                    .map(|e| (u(&e[0..4]), f(&e[4..8])))
                    .collect(),
            };
            if t.token as usize >= header.vocab_size
                || t.top
                    .iter()
                    .any(|&(id, _)| id as usize >= header.vocab_size)
            {
                bail!(
                    "{}: a token id beyond its vocabulary of {}",
                    name(),
                    header.vocab_size
                );
            }
            nll -= t.logprob as f64;
            tokens.push(t);
        }
        let ppl = (nll / tokens.len().max(1) as f64).exp();
        Ok(Self {
            path: path.to_path_buf(),
            header,
            tokens,
            ppl,
        })
    }

    /// Errors when the saved run cannot be compared with this one.
    fn check_against(&self, vocab: usize, ctx: usize, bos: bool, windows: usize) -> Result<()> {
        let h = &self.header;
        let name = format!("--kl-base {}", self.path.display());
        if h.vocab_size != vocab {
            bail!(
                "{name} was saved from a model with a vocabulary of {} tokens ({}); this model has {vocab}: compare runs of the same model",
                h.vocab_size,
                h.model
            );
        }
        if h.ctx != ctx || h.bos != bos {
            bail!(
                "{name} was saved with --ctx {}{}; this run has --ctx {ctx}{}: use the same windows",
                h.ctx,
                if h.bos { " --bos" } else { "" },
                if bos { " --bos" } else { "" }
            );
        }
        if h.windows != windows {
            bail!(
                "{name} holds {} windows; this text makes {windows}: it was saved from another text or tokenizer",
                h.windows
            );
        }
        Ok(())
    }
}

/// KL(base ‖ this) of one scored token, in nats: over the base's saved top tokens plus the rest
/// of the mass (this run's rest computed as the saved one was, so a run against itself gives
/// exactly 0). `dense` `[V]` holds this run's log-probabilities. NaN when this run's are NaN
/// (non-finite logits): `max(0)` would turn NaN into a perfect 0.
fn token_kl(b: &SavedToken, dense: &[f32]) -> f64 {
    let mut kl = 0.0f64;
    let q_top: Vec<(u32, f32)> = b
        .top
        .iter()
        .map(|&(id, _)| (id, dense[id as usize]))
        .collect();
    for (&(_, p), &(_, q)) in b.top.iter().zip(&q_top) {
        if p.is_finite() {
            kl += (p as f64).exp() * (p as f64 - q as f64);
        }
    }
    if b.rest.is_finite() {
        let p_rest = b.rest as f64;
        let q_rest = rest_logmass(&q_top, false).max(-69.0) as f64;
        kl += p_rest.exp() * (p_rest - q_rest);
    }
    // KL ≥ 0; a tiny negative sum is the rounding of log-probabilities saved as f32.
    if kl.is_nan() {
        // A positive NaN: `total_cmp` sorts it last, so p99 and max show it (a NaN from x86
        // arithmetic has its sign bit set and would sort first).
        f64::NAN
    } else {
        kl.max(0.0)
    }
}

/// The KL comparison against a saved run, token by token.
#[derive(Default)]
struct Kl {
    kls: Vec<f64>,
    top1_same: usize,
    abs_dlogp: f64,
}

impl Kl {
    /// Compares one window's tokens (full rows, `cur[i].top` the whole vocabulary) with the
    /// saved ones from index `first`.
    fn compare(
        &mut self,
        base: &Saved,
        first: usize,
        cur: &[TokenLogprobs],
        vocab: usize,
    ) -> Result<()> {
        let mut dense = vec![f32::NEG_INFINITY; vocab];
        for (j, c) in cur.iter().enumerate() {
            let b = &base.tokens[first + j];
            if b.token != c.token {
                bail!(
                    "--kl-base {}: scored token {} is id {} there but {} here: it was saved from another text or tokenizer",
                    base.path.display(),
                    first + j,
                    b.token,
                    c.token
                );
            }
            for &(id, p) in &c.top {
                dense[id as usize] = p;
            }
            self.kls.push(token_kl(b, &dense));
            let cur_top1 = c.top.first().map(|t| t.0);
            if b.top.first().map(|t| t.0) == cur_top1 {
                self.top1_same += 1;
            }
            self.abs_dlogp += (b.logprob as f64 - c.logprob as f64).abs();
        }
        Ok(())
    }

    fn json(mut self, base_ppl: Option<f64>) -> serde_json::Value {
        let n = self.kls.len().max(1) as f64;
        let mean = self.kls.iter().sum::<f64>() / n;
        self.kls.sort_by(f64::total_cmp);
        let p99 = self
            .kls
            .get(((self.kls.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0);
        serde_json::json!({
            "mean": mean,
            "p99": p99,
            "max": self.kls.last().copied().unwrap_or(0.0),
            "top1_agreement": self.top1_same as f64 / n,
            "mean_abs_dlogp": self.abs_dlogp / n,
            "base_ppl": base_ppl,
            "tokens": self.kls.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(top: Vec<(u32, f32)>) -> SavedToken {
        SavedToken {
            token: top[0].0,
            logprob: top[0].1,
            rest: rest_logmass(&top, false),
            top,
        }
    }

    #[test]
    fn token_kl_is_zero_against_itself_and_nan_for_nan_logprobs() {
        let half = 0.5f32.ln();
        let quarter = 0.25f32.ln();
        let b = saved(vec![(0, half), (2, quarter)]);
        let same = [half, quarter, quarter, f32::NEG_INFINITY];
        assert_eq!(token_kl(&b, &same), 0.0);
        let other = [quarter, half, quarter, f32::NEG_INFINITY];
        assert!(token_kl(&b, &other) > 0.0);
        let nan = [f32::NAN; 4];
        assert!(
            token_kl(&b, &nan).is_nan(),
            "NaN log-probabilities must not read as KL 0"
        );
        let negative_nan = [-f32::NAN; 4];
        let kl = token_kl(&b, &negative_nan);
        assert!(
            kl.is_nan() && kl.is_sign_positive(),
            "a NaN that total_cmp sorts last"
        );
    }
}
