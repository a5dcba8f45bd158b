//! The service loop against a model-free engine double: routing, timing, aborts, failures,
//! shutdown, and the text stream. (Parity with the real engine: tests/tests/service.rs.)

use super::thread::{Produced, Stepper};
use super::*;
use crate::sampling::SamplingParams;
use crate::scheduler::FinishReason;
use anyhow::{bail, ensure};
use std::sync::mpsc::{Receiver, Sender};

const WAIT: Duration = Duration::from_secs(20);
const BLOCKS_PER_REQUEST: usize = 2;
const TOTAL_BLOCKS: usize = 16;

/// Generates `(prompt[0] + i) % 256` as token `i` of each request, one per step, after one
/// token-less prefill step for prompts of 4 tokens or more (a chunked prefill stand-in); takes
/// two blocks per request.
#[derive(Default)]
struct Fake {
    next_id: u64,
    running: Vec<FakeSeq>,
    /// Steps fail once this many requests are running.
    fail_with_running: Option<usize>,
    /// When set, each step waits for a permit (so a test knows where the engine is).
    gate: Option<Receiver<()>>,
}

struct FakeSeq {
    id: u64,
    first: u32,
    prefill_steps: usize,
    generated: usize,
    max_tokens: usize,
}

impl Stepper for Fake {
    fn add_request(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        _extra: crate::cache::prefix::ExtraKeys,
        _prompt_logprobs: Option<usize>,
    ) -> Result<u64> {
        if prompt.is_empty() {
            bail!("the prompt is empty: give at least one token");
        }
        let id = self.next_id;
        self.next_id += 1;
        self.running.push(FakeSeq {
            id,
            first: prompt[0],
            prefill_steps: usize::from(prompt.len() >= 4),
            generated: 0,
            max_tokens: params.max_tokens,
        });
        Ok(id)
    }

    fn step(&mut self, logits: bool) -> Result<Vec<Produced>> {
        if let Some(gate) = &self.gate {
            gate.recv_timeout(WAIT)
                .map_err(|_| anyhow!("the test gave no step permit"))?;
        }
        if self
            .fail_with_running
            .is_some_and(|n| self.running.len() >= n)
        {
            bail!("device lost with {} requests running", self.running.len());
        }
        let mut events = Vec::new();
        for s in &mut self.running {
            if s.prefill_steps > 0 {
                s.prefill_steps -= 1;
                continue;
            }
            let token = (s.first + s.generated as u32) % 256;
            s.generated += 1;
            let finish = (s.generated == s.max_tokens).then_some(FinishReason::Length);
            events.push(Produced {
                seq_id: s.id,
                token,
                finish,
                cached_tokens: 0,
                logprobs: None,
                // A stand-in row: the token id, twice.
                logits: logits.then(|| vec![token as f32; 2]),
                prompt_logprobs: None,
            });
        }
        self.running.retain(|s| s.generated < s.max_tokens);
        Ok(events)
    }

    /// One "layer": the prompt ids as floats; logits: the prompt's length.
    fn trace_prefill(&mut self, prompt: &[u32]) -> Result<thread::Trace> {
        let ids: Vec<f32> = prompt.iter().map(|&t| t as f32).collect();
        let hidden = dayone_backend::HostTensor::from_f32(vec![prompt.len(), 1], &ids)?;
        Ok((vec![hidden], vec![prompt.len() as f32]))
    }

    fn copy_bandwidth(&mut self) -> Result<f64> {
        Ok(1e9)
    }

    fn set_logits_processor(
        &mut self,
        _id: u64,
        _p: Box<dyn crate::sampling::LogitsProcessor>,
    ) -> Result<()> {
        Ok(())
    }

    fn prefill_progress(&self, _id: u64) -> Option<usize> {
        None
    }

    fn abort(&mut self, id: u64) -> Result<bool> {
        let before = self.running.len();
        self.running.retain(|s| s.id != id);
        Ok(self.running.len() < before)
    }

    fn has_unfinished(&self) -> bool {
        !self.running.is_empty()
    }

    fn stats(&self, requests: usize) -> EngineStats {
        EngineStats {
            requests,
            free_blocks: TOTAL_BLOCKS - BLOCKS_PER_REQUEST * self.running.len(),
            total_blocks: TOTAL_BLOCKS,
            cached_blocks: 0,
            metrics: None,
            memory_reserved: None,
        }
    }
}

fn start(fake: Fake) -> Result<EngineHandle> {
    EngineHandle::start_stepper(move || {
        let model = ModelInfo {
            max_context: 512,
            vocab_size: 256,
            eos_ids: vec![],
            backend: "fake".into(),
            cache_bytes_per_token: 0,
            state_bytes_per_seq: 0,
            activation_dtype: DType::F32,
            weight_dtype: DType::F32,
            weight_bytes: 0,
            batch_invariant: true,
        };
        Ok((fake, model))
    })
}

fn req(first: u32, max_tokens: usize) -> Request {
    Request::new(
        vec![first, 7, 7],
        SamplingParams {
            max_tokens,
            ..Default::default()
        },
    )
}

/// A gated fake: `permits` lets it take that many steps.
fn gated() -> (Fake, Sender<()>) {
    let (permits, gate) = channel();
    let fake = Fake {
        gate: Some(gate),
        ..Default::default()
    };
    (fake, permits)
}

fn permit(permits: &Sender<()>, steps: usize) {
    for _ in 0..steps {
        // Fails once the loop has ended (and dropped the gate): nothing left to permit.
        let _ = permits.send(());
    }
}

#[test]
fn tokens_then_one_finished_event_with_timing() -> Result<()> {
    let h = start(Fake::default())?;
    let done = h.submit(req(40, 5))?.wait(WAIT)?;
    ensure!(done.tokens == [40, 41, 42, 43, 44], "{:?}", done.tokens);
    ensure!(done.reason == FinishReason::Length);
    ensure!(done.prompt_tokens == 3);
    let t = done.timing;
    let first = t.first_token.expect("a token came");
    ensure!(t.arrival <= first && first <= t.finished);
    ensure!(done.token_times[0] == first && done.itl().len() == 4);
    ensure!(t.ttft().is_some() && t.tpot(5).is_some() && t.tpot(1).is_none());
    Ok(())
}

#[test]
fn a_batch_is_queued_before_the_next_step() -> Result<()> {
    let (fake, permits) = gated();
    let h = start(fake)?;
    let (tx, rx) = channel();
    // 4-token prompts: one prefill step, then a token per step.
    let batch = (0..3u32).map(|i| {
        let tx = tx.clone();
        let r = Request::new(
            vec![10 * i, 1, 2, 3],
            SamplingParams {
                max_tokens: 2,
                ..Default::default()
            },
        );
        (r, move |e: StreamEvent| tx.send((i, e)).is_ok())
    });
    let ids = h.submit_batch_with(batch)?;
    drop(tx);
    ensure!(ids.len() == 3, "{ids:?}");
    permit(&permits, 3);
    let mut first: Vec<Option<Instant>> = vec![None; 3];
    let mut finished = 0;
    for (i, e) in rx.iter() {
        match e {
            StreamEvent::Token { index: 0, time, .. } => first[i as usize] = Some(time),
            StreamEvent::Finished { .. } => finished += 1,
            _ => {}
        }
    }
    ensure!(finished == 3);
    // All three prefilled in the first step and got their first token in the second.
    ensure!(
        first[0].is_some() && first.iter().all(|t| *t == first[0]),
        "{first:?}"
    );
    Ok(())
}

#[test]
fn a_batch_with_a_bad_request_queues_none_of_it() -> Result<()> {
    let h = start(Fake::default())?;
    let called = Arc::new(Mutex::new(0usize));
    let batch = [vec![1, 2], vec![], vec![3]].into_iter().map(|p| {
        let called = called.clone();
        let sink = move |_: StreamEvent| {
            *called.lock().unwrap() += 1;
            true
        };
        (Request::new(p, SamplingParams::default()), sink)
    });
    let e = h.submit_batch_with(batch).unwrap_err();
    ensure!(format!("{e:#}").contains("prompt is empty"), "{e:#}");
    let stats = h.stats()?;
    ensure!(
        stats.requests == 0 && stats.free_blocks == TOTAL_BLOCKS,
        "{stats:?}"
    );
    ensure!(*called.lock().unwrap() == 0);
    ensure!(h.submit(req(5, 1))?.wait(WAIT)?.tokens == [5]);
    Ok(())
}

#[test]
fn logits_rows_go_only_to_requests_that_asked() -> Result<()> {
    let h = start(Fake::default())?;
    let asked = Request {
        return_logits: true,
        ..req(20, 2)
    };
    let mut with = h.submit(asked)?;
    let mut without = h.submit(req(30, 2))?;
    let mut rows = Vec::new();
    while let Some(e) = with.recv_timeout(WAIT)? {
        if let StreamEvent::Token { logits, token, .. } = e {
            ensure!(
                logits.as_deref() == Some(&vec![token as f32; 2]),
                "{logits:?}"
            );
            rows.push(token);
        }
    }
    ensure!(rows == [20, 21], "{rows:?}");
    while let Some(e) = without.recv_timeout(WAIT)? {
        if let StreamEvent::Token { logits, .. } = e {
            ensure!(logits.is_none(), "{logits:?}");
        }
    }
    Ok(())
}

#[test]
fn trace_prefill_runs_only_on_an_idle_engine() -> Result<()> {
    let (fake, permits) = gated();
    let h = start(fake)?;
    let (hidden, logits) = h.trace_prefill(vec![4, 5, 6])?;
    ensure!(hidden.len() == 1 && hidden[0].to_f32() == [4.0, 5.0, 6.0]);
    ensure!(logits == [3.0]);
    ensure!(h.copy_bandwidth()? == 1e9);
    let s = h.submit(req(1, 100))?;
    // The engine waits in its first step: ask from another thread, let steps run until the
    // command has been answered (between two of them).
    let h2 = h.clone();
    let traced = std::thread::spawn(move || h2.trace_prefill(vec![1]));
    let mut steps = 0;
    while !traced.is_finished() {
        ensure!(steps < 90, "no answer to the trace");
        permit(&permits, 1);
        steps += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let e = traced.join().unwrap().unwrap_err();
    ensure!(format!("{e:#}").contains("needs an idle engine"), "{e:#}");
    drop(s);
    permit(&permits, 1);
    ensure!(h.stats()?.requests == 0);
    ensure!(h.trace_prefill(vec![7])?.1 == [1.0]);
    Ok(())
}

#[test]
fn a_stream_ends_after_its_last_event() -> Result<()> {
    let h = start(Fake::default())?;
    let mut s = h.submit(req(1, 2))?;
    let events: Vec<StreamEvent> = s.by_ref().collect();
    ensure!(events.len() == 3 && events[2].is_last(), "{events:?}");
    ensure!(matches!(
        events[2],
        StreamEvent::Finished {
            generated_tokens: 2,
            ..
        }
    ));
    ensure!(s.recv().is_none() && s.recv_timeout(WAIT)?.is_none());
    Ok(())
}

#[test]
fn abort_mid_generation_ends_the_stream_and_frees_its_blocks() -> Result<()> {
    let (fake, permits) = gated();
    let h = start(fake)?;
    // One request only: a second synchronous submit would wait for the gated step.
    let mut s = h.submit(req(9, 100))?;
    permit(&permits, 2);
    for _ in 0..2 {
        ensure!(matches!(
            s.recv_timeout(WAIT)?,
            Some(StreamEvent::Token { .. })
        ));
    }
    let id = s.id();
    let h2 = h.clone();
    std::thread::spawn(move || h2.abort(id)).join().unwrap()?;
    permit(&permits, 1); // the loop drains the abort after the step it is in
    let mut tokens = 2;
    let end = loop {
        match s.recv_timeout(WAIT)? {
            Some(StreamEvent::Token { .. }) => tokens += 1,
            Some(ev) => break ev,
            None => bail!("stream ended without a last event"),
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
    ensure!(reason == FinishReason::Abort, "{reason}");
    ensure!(generated_tokens == tokens && tokens <= 3, "{tokens}");
    let stats = h.stats()?;
    ensure!(
        stats.requests == 0 && stats.free_blocks == stats.total_blocks,
        "{stats:?}"
    );
    Ok(())
}

#[test]
fn dropping_a_stream_aborts_its_request() -> Result<()> {
    let (fake, permits) = gated();
    let h = start(fake)?;
    // A 4-token prompt: no token before the first step (its prefill) ends, so only the drop
    // can abort it (a sink that fails at a token would abort it too, later).
    let s = h.submit(Request::new(vec![3, 1, 4, 1], SamplingParams::default()))?;
    drop(s);
    permit(&permits, 1);
    // Without the abort the loop would wait for a second permit and this would fail.
    let stats = h.stats()?;
    ensure!(
        stats.requests == 0 && stats.free_blocks == TOTAL_BLOCKS,
        "{stats:?}"
    );
    Ok(())
}

#[test]
fn a_sink_that_stops_listening_aborts() -> Result<()> {
    let (fake, permits) = gated();
    let h = start(fake)?;
    let (tx, rx) = channel();
    h.submit_with(req(3, 100), move |e| tx.send(e).is_ok())?;
    drop(rx);
    permit(&permits, 1); // the first token finds nobody listening
    let (sync, synced) = channel();
    h.submit_with(req(5, 1), move |e| sync.send(e).is_ok())?;
    permit(&permits, 1);
    synced.recv_timeout(WAIT)?;
    let stats = h.stats()?;
    ensure!(stats.requests == 0, "{stats:?}");
    Ok(())
}

#[test]
fn a_step_error_reaches_every_request_and_stops_the_service() -> Result<()> {
    let h = start(Fake {
        fail_with_running: Some(2),
        ..Default::default()
    })?;
    // The first request runs alone until the second arrives; the next step fails.
    let a = h.submit(req(1, 1 << 20))?;
    let b = h.submit(req(2, 50))?;
    for s in [a, b] {
        let e = s.wait(WAIT).unwrap_err().to_string();
        ensure!(e == "device lost with 2 requests running", "{e}");
    }
    let e = h.submit(req(1, 1)).unwrap_err().to_string();
    ensure!(
        e == "engine stopped: device lost with 2 requests running",
        "{e}"
    );
    ensure!(h.stats().is_err() && h.abort(0).is_err());
    h.shutdown(Duration::ZERO); // still returns
    Ok(())
}

#[test]
fn a_rejected_request_leaves_the_service_serving() -> Result<()> {
    let h = start(Fake::default())?;
    let e = h.submit(Request::new(vec![], SamplingParams::default()));
    ensure!(e.unwrap_err().to_string() == "the prompt is empty: give at least one token");
    ensure!(h.submit(req(8, 2))?.wait(WAIT)?.tokens == [8, 9]);
    Ok(())
}

#[test]
fn load_errors_come_back_from_start() {
    let e = EngineHandle::start_stepper(|| -> Result<(Fake, ModelInfo)> {
        bail!("config.json: missing field `hidden_size`")
    })
    .unwrap_err();
    assert_eq!(e.to_string(), "config.json: missing field `hidden_size`");
    let e = EngineHandle::start_stepper(|| -> Result<(Fake, ModelInfo)> { panic!("boom") })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "engine stopped: the engine thread panicked: boom"
    );
}

#[test]
fn shutdown_lets_requests_finish_within_the_grace() -> Result<()> {
    let h = start(Fake::default())?;
    let s = h.submit(req(20, 4))?;
    h.shutdown(WAIT);
    let done = s.wait(WAIT)?;
    ensure!(done.reason == FinishReason::Length && done.tokens.len() == 4);
    let e = h.submit(req(1, 1)).unwrap_err().to_string();
    ensure!(e == "engine stopped: it was shut down", "{e}");
    Ok(())
}

#[test]
fn shutdown_aborts_what_is_left_after_the_grace() -> Result<()> {
    let (fake, permits) = gated();
    // One step per millisecond until the loop ends (a send fails once the gate is dropped).
    let feeder = std::thread::spawn(move || {
        while permits.send(()).is_ok() {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    let h = start(fake)?;
    let s = h.submit(req(20, usize::MAX))?;
    let h2 = h.clone();
    let stopper = std::thread::spawn(move || h2.shutdown(Duration::ZERO));
    // New requests are refused from the moment shutdown begins.
    let deadline = Instant::now() + WAIT;
    let refused = loop {
        match h.submit(req(1, 1)) {
            Ok(_) => ensure!(Instant::now() < deadline, "submit still accepted"),
            Err(e) => break e.to_string(),
        }
    };
    ensure!(
        refused == "engine is shutting down: it accepts no new requests"
            || refused == "engine stopped: it was shut down",
        "{refused}"
    );
    stopper.join().unwrap();
    feeder.join().unwrap();
    let done = s.wait(WAIT)?;
    ensure!(done.reason == FinishReason::Abort, "{}", done.reason);
    Ok(())
}

#[test]
fn dropping_the_last_handle_shuts_down() -> Result<()> {
    let h = start(Fake::default())?;
    let s = h.submit(req(30, 3))?;
    let clone = h.clone();
    drop(h);
    ensure!(clone.stats().is_ok(), "a clone keeps the engine running");
    drop(clone); // joins the thread after the request finished (within the grace)
    ensure!(s.wait(WAIT)?.reason == FinishReason::Length);
    Ok(())
}

/// GPT-2's byte → printable character map (the ByteLevel pre-tokenizer's alphabet).
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap()
}

fn token(t: u32, index: usize) -> StreamEvent {
    StreamEvent::Token {
        token: t,
        index,
        time: Instant::now(),
        logprobs: None,
        logits: None,
    }
}

#[test]
fn text_stream_holds_back_split_characters() -> Result<()> {
    // One token per byte, so every multi-byte character is split across tokens.
    let tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let tok =
        crate::tokenizer::Tokenizer::from_gpt2_vocab(&tokens, &[], &[1; 256], "gpt2", None, false)?;
    let text = "aé€😀 b";
    let ids: Vec<u32> = text.bytes().map(u32::from).collect();
    let mut ts = TextStream::new(&tok, true);
    let mut out = String::new();
    let mut empty = 0;
    for (i, &id) in ids.iter().enumerate() {
        let delta = ts.push(&token(id, i))?;
        ensure!(
            !delta.contains('\u{FFFD}'),
            "delta {delta:?} after byte {i}"
        );
        empty += delta.is_empty() as usize;
        out.push_str(&delta);
    }
    let end = StreamEvent::Error("x".into());
    out.push_str(&ts.push(&end)?);
    ensure!(out == text, "{out:?}");
    // é, €, 😀: 1 + 2 + 3 tokens held back before the last byte of each.
    ensure!(empty == 6, "{empty}");
    ensure!(ts.tokens() == ids);
    // A character cut off by the end of the stream comes out as U+FFFD, as decode prints it.
    let mut ts = TextStream::new(&tok, true);
    ensure!(ts.push(&token(0xE2, 0))?.is_empty());
    ensure!(ts.push(&end)? == "\u{FFFD}");
    Ok(())
}

#[test]
fn handles_and_streams_cross_threads() {
    fn shared<T: Clone + Send + Sync + 'static>() {}
    fn sent<T: Send + 'static>() {}
    shared::<EngineHandle>();
    sent::<RequestStream>();
    sent::<StreamEvent>();
}
