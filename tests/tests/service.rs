//! The engine service handle on real engines: tokens streamed through [`EngineHandle`] equal
//! the synchronous engine's, bit for bit, alone, batched and from several submitting threads;
//! aborts (from another thread, or by dropping a stream) free every block; bad requests get
//! the engine's own error from `submit` and the service keeps serving. Every wait is bounded.

use anyhow::{bail, ensure, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::sampling::SamplingParams;
use dayone_engine::scheduler::{FinishReason, SchedulerConfig};
use dayone_engine::service::{EngineHandle, Request, RequestStream, StreamEvent};
use dayone_engine::EngineConfig;
use dayone_tests::{engine, greedy, on_every_backend, reference};
use std::time::Duration;

/// Longest wait for one event (lavapipe is slow; nothing is timed).
const WAIT: Duration = Duration::from_secs(300);
const NEW_TOKENS: usize = 10;

fn config(max_num_seqs: usize) -> EngineConfig {
    EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(4096),
        scheduler: SchedulerConfig {
            max_num_seqs,
            block_size: 16,
            ..Default::default()
        },
        // Bit-exact parity needs the batch-invariant kernels on CUDA (CPU and WGSL always are).
        batch_invariant: true,
        ..Default::default()
    }
}

/// Eight prompts: the fixture's reference prompts, then made-up ones of assorted lengths.
fn prompts(model: &str) -> Result<Vec<Vec<u32>>> {
    let mut p: Vec<Vec<u32>> = reference(model)?
        .cases
        .into_iter()
        .map(|c| c.prompt_ids)
        .collect();
    let mut n = 0u32;
    while p.len() < 8 {
        n += 1;
        p.push((0..5 + 9 * n).map(|i| (i * 31 + 7 * n) % 256).collect());
    }
    p.truncate(8);
    Ok(p)
}

fn start<B: Backend>(
    mk: fn() -> B,
    model: &'static str,
    cfg: EngineConfig,
) -> Result<EngineHandle> {
    EngineHandle::start(move || engine(mk(), model, cfg))
}

/// Greedy tokens of each prompt run alone through the synchronous engine.
fn alone<B: Backend>(b: B, model: &str, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>> {
    let mut e = engine(b, model, config(16))?;
    let mut out = Vec::new();
    for p in prompts {
        e.add_request(p.clone(), greedy(NEW_TOKENS))?;
        let mut done = e.run_to_completion()?;
        ensure!(done.len() == 1);
        out.push(done.remove(0).1);
    }
    Ok(out)
}

/// A stream's tokens; checks its events are well formed (indices in order, then one
/// `Finished` that counts them).
fn tokens(stream: RequestStream, prompt_len: usize) -> Result<Vec<u32>> {
    let id = stream.id();
    let done = stream.wait(WAIT)?;
    ensure!(done.id == id && done.prompt_tokens == prompt_len);
    ensure!(done.reason == FinishReason::Length, "{}", done.reason);
    Ok(done.tokens)
}

fn all_blocks_free(h: &EngineHandle) -> Result<()> {
    let s = h.stats()?;
    ensure!(
        s.requests == 0 && s.free_blocks == s.total_blocks,
        "after every request ended: {s:?}"
    );
    Ok(())
}

fn streamed_equals_run_to_completion<B: Backend>(mk: fn() -> B, model: &'static str) -> Result<()> {
    let prompts = prompts(model)?;
    let mut e = engine(mk(), model, config(16))?;
    for p in &prompts {
        e.add_request(p.clone(), greedy(NEW_TOKENS))?;
    }
    let want: Vec<Vec<u32>> = e.run_to_completion()?.into_iter().map(|(_, t)| t).collect();
    drop(e);
    let h = start(mk, model, config(16))?;
    let streams = prompts
        .iter()
        .map(|p| h.submit(Request::new(p.clone(), greedy(NEW_TOKENS))))
        .collect::<Result<Vec<_>>>()?;
    for (i, (s, p)) in streams.into_iter().zip(&prompts).enumerate() {
        let got = tokens(s, p.len())?;
        ensure!(
            got == want[i],
            "prompt {i}: streamed {got:?} != engine {:?}",
            want[i]
        );
    }
    all_blocks_free(&h)
}

fn concurrent_submitters_equal_alone<B: Backend>(mk: fn() -> B, model: &'static str) -> Result<()> {
    let prompts = prompts(model)?;
    let want = alone(mk(), model, &prompts)?;
    let h = start(mk, model, config(16))?;
    let got = std::thread::scope(|scope| {
        let workers: Vec<_> = prompts
            .chunks(2)
            .map(|pair| {
                let h = h.clone();
                scope.spawn(move || -> Result<Vec<Vec<u32>>> {
                    // Both submitted before either is read, so all eight overlap.
                    let streams = pair
                        .iter()
                        .map(|p| h.submit(Request::new(p.clone(), greedy(NEW_TOKENS))))
                        .collect::<Result<Vec<_>>>()?;
                    streams
                        .into_iter()
                        .zip(pair)
                        .map(|(s, p)| tokens(s, p.len()))
                        .collect()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("submitter thread panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    let got: Vec<Vec<u32>> = got.into_iter().flatten().collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        ensure!(g == w, "prompt {i}: from 4 threads {g:?} != alone {w:?}");
    }
    all_blocks_free(&h)
}

/// Tokens a long request may generate: up to the context window or the 4096-token cache.
fn long_tokens(h: &EngineHandle) -> usize {
    h.model_info().max_context.min(4096) - 3
}

/// A request that runs until the context window or the cache is full (unless aborted).
fn long_request(h: &EngineHandle) -> Request {
    Request::new(vec![5, 6, 7], greedy(long_tokens(h)))
}

fn abort_from_another_thread<B: Backend>(mk: fn() -> B, model: &'static str) -> Result<()> {
    let h = start(mk, model, config(16))?;
    let max_tokens = long_tokens(&h);
    let mut s = h.submit(long_request(&h))?;
    let mut got = 0;
    ensure!(matches!(
        s.recv_timeout(WAIT)?,
        Some(StreamEvent::Token { .. })
    ));
    got += 1;
    let (h2, id) = (h.clone(), s.id());
    std::thread::spawn(move || h2.abort(id))
        .join()
        .expect("abort thread")?;
    let end = loop {
        match s.recv_timeout(WAIT)? {
            Some(StreamEvent::Token { .. }) => got += 1,
            Some(end) => break end,
            None => bail!("the stream ended without a last event"),
        }
    };
    let StreamEvent::Finished {
        reason,
        generated_tokens,
        ..
    } = end
    else {
        bail!("expected Finished, got {end:?}");
    };
    ensure!(reason == FinishReason::Abort, "finished with {reason}");
    ensure!(generated_tokens == got && got < max_tokens, "{got} tokens");
    all_blocks_free(&h)?;
    // The service keeps serving.
    let p = vec![9, 8, 7];
    let want = alone(mk(), model, std::slice::from_ref(&p))?;
    ensure!(tokens(h.submit(Request::new(p.clone(), greedy(NEW_TOKENS)))?, 3)? == want[0]);
    Ok(())
}

fn dropping_a_stream_aborts<B: Backend>(mk: fn() -> B, model: &'static str) -> Result<()> {
    // One running sequence at a time: the second request waits, produces no token, and only
    // the drop of its stream can remove it.
    let h = start(mk, model, config(1))?;
    let mut running = h.submit(long_request(&h))?;
    let waiting = h.submit(long_request(&h))?;
    ensure!(matches!(
        running.recv_timeout(WAIT)?,
        Some(StreamEvent::Token { .. })
    ));
    drop(waiting);
    let s = h.stats()?;
    ensure!(s.requests == 1, "after dropping the waiting stream: {s:?}");
    drop(running);
    all_blocks_free(&h)
}

fn bad_requests_are_refused<B: Backend>(mk: fn() -> B, model: &'static str) -> Result<()> {
    let h = start(mk, model, config(16))?;
    let info = h.model_info().clone();
    let bad = [
        Request::new(vec![], greedy(4)),
        Request::new(vec![1, info.vocab_size as u32, 2], greedy(4)),
        Request::new(vec![1; info.max_context], greedy(4)),
        Request::new(vec![1, 2], greedy(0)),
    ];
    let mut e = engine(mk(), model, config(16))?;
    for r in bad {
        let want = format!(
            "{:#}",
            e.add_request(r.prompt.clone(), r.params.clone())
                .unwrap_err()
        );
        let got = match h.submit(r) {
            Ok(s) => bail!("submit accepted a bad request (id {})", s.id()),
            Err(err) => format!("{err:#}"),
        };
        ensure!(got == want, "submit said {got:?}, add_request {want:?}");
    }
    let p = vec![4, 5, 6, 7];
    let want = alone(mk(), model, std::slice::from_ref(&p))?;
    ensure!(tokens(h.submit(Request::new(p.clone(), greedy(NEW_TOKENS)))?, 4)? == want[0]);
    all_blocks_free(&h)
}

fn shutdown_ends_the_service<B: Backend>(mk: fn() -> B, model: &'static str) -> Result<()> {
    let h = start(mk, model, config(16))?;
    let s = h.submit(Request::new(vec![3, 4], greedy(NEW_TOKENS)))?;
    let long = h.submit(long_request(&h))?;
    // A bounded grace: the short request may finish, the long one is aborted.
    h.shutdown(Duration::from_millis(50));
    let short = s.wait(WAIT)?;
    ensure!(matches!(
        short.reason,
        FinishReason::Length | FinishReason::Abort
    ));
    ensure!(long.wait(WAIT)?.reason == FinishReason::Abort);
    let e = h
        .submit(Request::new(vec![1], SamplingParams::default()))
        .unwrap_err();
    ensure!(e.to_string() == "engine stopped: it was shut down", "{e}");
    Ok(())
}

on_every_backend! {
    streamed => |mk: fn() -> _| streamed_equals_run_to_completion(mk, "llama_tiny");
    kda_streamed => |mk: fn() -> _| streamed_equals_run_to_completion(mk, "kimi_linear_tiny");
    concurrent => |mk: fn() -> _| concurrent_submitters_equal_alone(mk, "llama_tiny");
    kda_concurrent => |mk: fn() -> _| concurrent_submitters_equal_alone(mk, "kimi_linear_tiny");
    // Aborts and shutdown on the model whose long request runs longest (4 093 tokens, about 2 s
    // on the CPU backend), so the abort surely lands mid-generation.
    abort => |mk: fn() -> _| abort_from_another_thread(mk, "kimi_linear_tiny");
    dropped_stream => |mk: fn() -> _| dropping_a_stream_aborts(mk, "kimi_linear_tiny");
    shutdown => |mk: fn() -> _| shutdown_ends_the_service(mk, "kimi_linear_tiny");
    bad_requests => |mk: fn() -> _| bad_requests_are_refused(mk, "llama_tiny");
}
