//! One request's run on the engine: its `n` choices submitted to the [`EngineHandle`], and
//! each choice's tokens turned into what the API sends — text through the stop strings and the
//! tool-call / reasoning parser, token ids, log-probabilities — as [`ChoiceUpdate`]s. Chat and
//! completions, streamed or not, all read a [`Run`], so a streamed answer is the non-streamed
//! one cut into pieces.
//!
//! Dropping a [`Run`] (a client that went away) aborts every choice still running: the engine
//! frees their blocks before its next step.

use super::errors::{from_engine, ApiError};
use super::parsers::{self, Delta, OutputParser};
use super::protocol::GenSpec;
use super::state::Loaded;
use dayone_engine::json_constraint::{JsonObjectProcessor, TokenTable};
use dayone_engine::sampling::{Chain, LogitBias, LogitsProcessor, StopMatcher, TokenLogprobs};
use dayone_engine::scheduler::FinishReason;
use dayone_engine::service::{EngineHandle, ProcessorCell, Request, StreamEvent};
use dayone_engine::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Which parser reads the text of each choice.
#[derive(Debug, Clone, Copy)]
pub struct ParserChoice {
    /// Run the model's tool-call / reasoning parsers at all (chat: yes; completions: no).
    pub parse: bool,
    /// Tool calls are parsed (the request has tools and `tool_choice` is not `none`).
    pub tools: bool,
    /// The answer starts inside reasoning (thinking on for the format and the template).
    pub thinking: bool,
    /// Send reasoning (`include_reasoning`, default true).
    pub include_reasoning: bool,
}

/// A tool call's piece in one delta: the header once (`id`, `name`), then argument fragments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallDelta {
    /// The call's position in the answer.
    pub index: usize,
    /// Set in the call's first delta.
    pub id: Option<String>,
    /// Set in the call's first delta.
    pub name: Option<String>,
    /// The next fragment of the JSON arguments string.
    pub arguments: String,
}

/// One generated token's log-probability with its text (OpenAI's `logprobs.content[]`).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (special tokens spelled out).
    pub token: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// The most likely alternatives: (text, logprob).
    pub top: Vec<(String, f32)>,
}

/// What one choice adds to one chunk.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceDelta {
    /// Answer text.
    pub content: String,
    /// Reasoning text.
    pub reasoning: String,
    /// Tool-call pieces.
    pub tool_calls: Vec<ToolCallDelta>,
    /// Token ids produced (with `return_token_ids`).
    pub token_ids: Vec<u32>,
    /// Log-probabilities of the tokens produced (when asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// Calls (by index) whose arguments turned out invalid or cut off: already streamed, they
    /// are left out of the non-stream answer and of `finish_reason: "tool_calls"`.
    pub invalid_calls: Vec<usize>,
}

impl ChoiceDelta {
    /// Calls started minus calls voided in this delta.
    fn net_calls(&self) -> isize {
        self.tool_calls.iter().filter(|t| t.id.is_some()).count() as isize
            - self.invalid_calls.len() as isize
    }

    fn push(&mut self, d: Delta) {
        match d {
            Delta::Content(s) => self.content.push_str(&s),
            Delta::Reasoning(s) => self.reasoning.push_str(&s),
            Delta::ToolCallStart { index, id, name } => self.tool_calls.push(ToolCallDelta {
                index,
                id: Some(id),
                name: Some(name),
                arguments: String::new(),
            }),
            Delta::ToolCallArgs { index, fragment } => match self.tool_calls.last_mut() {
                Some(last) if last.index == index => last.arguments.push_str(&fragment),
                _ => self.tool_calls.push(ToolCallDelta {
                    index,
                    id: None,
                    name: None,
                    arguments: fragment,
                }),
            },
            Delta::ToolCallInvalid { index } => self.invalid_calls.push(index),
        }
    }
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// `stop`, `length`, `tool_calls` or `abort`.
    pub reason: &'static str,
    /// vLLM's `stop_reason`: the stop string or stop token id that ended it (`null` for EOS).
    pub stop_reason: Value,
}

/// One step of one choice.
#[derive(Debug, Clone)]
pub struct ChoiceUpdate {
    /// The choice's index.
    pub index: usize,
    /// What it adds (may be empty on a finish).
    pub delta: ChoiceDelta,
    /// Set once, on its last update.
    pub finish: Option<Finish>,
}

/// Token counts for `usage`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Prompt tokens (once, not per choice, as OpenAI counts).
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Tokens of reasoning text (by the same count: tokens whose text went to reasoning).
    pub reasoning_tokens: usize,
}

/// Aborts the choices still running when dropped.
struct AbortGuard {
    handle: EngineHandle,
    ids: Vec<(u64, bool)>,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        for &(id, done) in &self.ids {
            if !done {
                // Fails only when the engine has stopped, and then nothing runs.
                let _ = self.handle.abort(id);
            }
        }
    }
}

/// One choice's text pipeline: detokenizer → stop strings → parser.
struct Choice {
    decoder: StreamDecoder<'static>,
    stops: StopMatcher,
    parser: Box<dyn OutputParser>,
    /// A stop string ended it (its engine request was aborted for that).
    stopped_by: Option<String>,
    stop_token: Option<u32>,
    tool_calls: isize,
    generated: usize,
    reasoning_tokens: usize,
    done: bool,
}

/// The run of one request's choices.
pub struct Run {
    loaded: &'static Loaded,
    tok: &'static Tokenizer,
    events: UnboundedReceiver<(usize, StreamEvent)>,
    guard: AbortGuard,
    choices: Vec<Choice>,
    spec_stops_include: bool,
    ignore_eos: bool,
    stop_token_ids: Vec<u32>,
    logprobs: bool,
    include_reasoning: bool,
    usage: Usage,
}

impl Run {
    /// Submits the `spec.n` choices of each spec (choice `p·n + j` is prompt p's j-th, sampled
    /// with `seed + j`; the specs differ only in their prompts). `logprobs`: report the chosen
    /// token's log-probability and this many alternatives. Errors: the engine's refusal (400;
    /// 503 when its queue is full or it is shutting down; 500 when it stopped); choices already
    /// submitted are aborted.
    pub fn start(
        loaded: &'static Loaded,
        tok: &'static Tokenizer,
        specs: &[GenSpec],
        parser: ParserChoice,
        logprobs: Option<usize>,
    ) -> Result<Self, ApiError> {
        let spec = &specs[0];
        let (tx, events) = unbounded_channel();
        let mut guard = AbortGuard {
            handle: loaded.handle.clone(),
            ids: Vec::new(),
        };
        // Parsers read markers that are special tokens (`<think>`, `<|tool_call_begin|>`).
        let skip_special = spec.skip_special
            && !(parser.parse
                && (loaded.reasoning_format.is_some()
                    || (parser.tools && loaded.tool_format.is_some())));
        let mut choices = Vec::with_capacity(spec.n * specs.len());
        let all = specs.iter().flat_map(|s| (0..s.n).map(move |j| (s, j)));
        for (i, (spec, j)) in all.enumerate() {
            let mut params = spec.params.clone();
            params.seed = params.seed.wrapping_add(j as u64);
            params.logprobs = logprobs;
            let mut chain: Vec<Box<dyn LogitsProcessor>> = Vec::new();
            if !spec.logit_bias.is_empty() {
                let vocab = loaded.handle.model_info().vocab_size;
                if let Some(&(bad, _)) = spec.logit_bias.iter().find(|(t, _)| *t as usize >= vocab)
                {
                    return Err(ApiError::bad_field(
                        "logit_bias",
                        format!("logit_bias token id {bad} is outside the vocabulary (vocab_size {vocab})"),
                    ));
                }
                chain.push(Box::new(LogitBias(spec.logit_bias.clone())));
            }
            if spec.json_object {
                {
                    let vocab = loaded.handle.model_info().vocab_size;
                    let table = loaded
                        .json_table
                        .get_or_init(|| Arc::new(TokenTable::new(tok, vocab)))
                        .clone();
                    let mut eos = loaded.handle.model_info().eos_ids.clone();
                    eos.extend(&spec.params.stop_token_ids);
                    chain.push(Box::new(JsonObjectProcessor::new(table, eos)));
                }
            }
            let processor = match chain.len() {
                0 => ProcessorCell::default(),
                1 => ProcessorCell::new(chain.pop().expect("one")),
                _ => ProcessorCell::new(Box::new(Chain(chain))),
            };
            let request = Request {
                prompt: spec.prompt.clone(),
                params,
                cache_salt: spec.cache_salt.clone(),
                processor,
                report_prefill: false,
                return_logits: false,
                prompt_logprobs: None,
                images: spec.images.clone(),
            };
            let tx = tx.clone();
            // On the engine thread: forwards without blocking; `false` once the run is gone.
            let id = loaded
                .handle
                .submit_with(request, move |e| tx.send((i, e)).is_ok())
                .map_err(from_engine)?;
            guard.ids.push((id, false));
            choices.push(Choice {
                decoder: tok.stream_decoder(skip_special),
                stops: StopMatcher::new(&spec.stops),
                parser: match parser.parse {
                    true => parsers::build(
                        loaded.tool_format.filter(|_| parser.tools),
                        loaded.reasoning_format,
                        parser.thinking,
                        parser.tools,
                    ),
                    false => parsers::build(None, None, false, false),
                },
                stopped_by: None,
                stop_token: None,
                tool_calls: 0,
                generated: 0,
                reasoning_tokens: 0,
                done: false,
            });
        }
        Ok(Self {
            loaded,
            tok,
            events,
            guard,
            choices,
            spec_stops_include: spec.include_stop_str,
            ignore_eos: spec.params.ignore_eos,
            stop_token_ids: spec.params.stop_token_ids.clone(),
            logprobs: logprobs.is_some(),
            include_reasoning: parser.include_reasoning,
            usage: Usage {
                prompt_tokens: specs.iter().map(|s| s.prompt.len()).sum(),
                ..Usage::default()
            },
        })
    }

    /// The number of choices.
    pub fn n(&self) -> usize {
        self.choices.len()
    }

    /// Token counts so far (final once [`Run::next`] has returned `None`).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Runs to the end and returns each choice's whole answer (the updates of the stream, merged:
    /// texts joined, a call's argument fragments joined) with how it finished, and the usage.
    /// The non-stream responses are built from it, so they are the stream put together.
    pub async fn collect(
        mut self,
    ) -> Result<(Vec<(ChoiceDelta, Option<Finish>)>, Usage), ApiError> {
        let mut acc: Vec<(ChoiceDelta, Option<Finish>)> =
            (0..self.n()).map(|_| Default::default()).collect();
        while let Some(u) = self.next().await {
            let u = u?;
            let (a, finish) = &mut acc[u.index];
            let d = u.delta;
            a.content.push_str(&d.content);
            a.reasoning.push_str(&d.reasoning);
            a.token_ids.extend(d.token_ids);
            a.logprobs.extend(d.logprobs);
            a.invalid_calls.extend(d.invalid_calls);
            for t in d.tool_calls {
                match a.tool_calls.iter_mut().find(|x| x.index == t.index) {
                    Some(x) => x.arguments.push_str(&t.arguments),
                    None => a.tool_calls.push(t),
                }
            }
            if u.finish.is_some() {
                *finish = u.finish;
            }
        }
        Ok((acc, self.usage))
    }

    /// The next update of some choice; `None` once every choice has finished. Errors: the
    /// engine failed (500).
    pub async fn next(&mut self) -> Option<Result<ChoiceUpdate, ApiError>> {
        loop {
            if self.choices.iter().all(|c| c.done) {
                return None;
            }
            let Some((i, event)) = self.events.recv().await else {
                return Some(Err(ApiError::internal(
                    "the engine dropped the request without finishing it",
                )));
            };
            match self.on_event(i, event) {
                Ok(Some(u)) => return Some(Ok(u)),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    fn on_event(&mut self, i: usize, event: StreamEvent) -> Result<Option<ChoiceUpdate>, ApiError> {
        if self.choices[i].done {
            return Ok(None);
        }
        match event {
            StreamEvent::Token {
                token, logprobs, ..
            } => self.on_token(i, token, logprobs).map(Some),
            StreamEvent::Finished {
                reason,
                cached_tokens,
                prompt_tokens,
                ..
            } => {
                self.usage.cached_tokens = self.usage.cached_tokens.max(cached_tokens);
                // The engine's count: a chat prompt's image placeholders as the tokens they
                // became (never below the ids sent, so several prompts keep their sum).
                self.usage.prompt_tokens = self.usage.prompt_tokens.max(prompt_tokens);
                self.guard.ids[i].1 = true;
                self.finish(i, reason).map(Some)
            }
            StreamEvent::Error(msg) => {
                self.guard.ids[i].1 = true;
                Err(ApiError::internal(msg))
            }
            StreamEvent::Prefill { .. } => Ok(None),
        }
    }

    fn on_token(
        &mut self,
        i: usize,
        token: u32,
        logprobs: Option<TokenLogprobs>,
    ) -> Result<ChoiceUpdate, ApiError> {
        let mut delta = ChoiceDelta {
            token_ids: vec![token],
            ..ChoiceDelta::default()
        };
        if let (true, Some(l)) = (self.logprobs, logprobs) {
            delta.logprobs.push(self.describe(&l));
        }
        let ends = (!self.ignore_eos && self.loaded.handle.model_info().eos_ids.contains(&token))
            || self.stop_token_ids.contains(&token);
        let c = &mut self.choices[i];
        if c.stopped_by.is_some() {
            // Produced in the step that matched the stop string: not part of the answer.
            return Ok(ChoiceUpdate {
                index: i,
                delta: ChoiceDelta::default(),
                finish: None,
            });
        }
        c.generated += 1;
        self.usage.completion_tokens += 1;
        if ends {
            // The stop token itself is not text (vLLM leaves EOS out of the answer).
            if self.stop_token_ids.contains(&token) {
                c.stop_token = Some(token);
            }
            return Ok(ChoiceUpdate {
                index: i,
                delta,
                finish: None,
            });
        }
        let piece = c
            .decoder
            .push(token)
            .map_err(|e| ApiError::internal(format!("{e:#}")))?;
        let out = c.stops.push(&piece);
        let before = delta.reasoning.len();
        for d in c.parser.push(&out.text) {
            delta.push(d);
        }
        if let Some(s) = out.stopped {
            if self.spec_stops_include {
                for d in c.parser.push(&s) {
                    delta.push(d);
                }
            }
            c.stopped_by = Some(s);
            let id = self.guard.ids[i].0;
            // The finish comes back as an abort, reported as `stop` (the string matched).
            let _ = self.loaded.handle.abort(id);
        }
        if delta.reasoning.len() > before {
            c.reasoning_tokens += 1;
            self.usage.reasoning_tokens += 1;
        }
        c.tool_calls += delta.net_calls();
        Ok(self.filtered(i, delta, None))
    }

    fn finish(&mut self, i: usize, reason: FinishReason) -> Result<ChoiceUpdate, ApiError> {
        let include_stop = self.spec_stops_include;
        let c = &mut self.choices[i];
        c.done = true;
        let mut delta = ChoiceDelta::default();
        if c.stopped_by.is_none() {
            let rest = c
                .decoder
                .finish()
                .map_err(|e| ApiError::internal(format!("{e:#}")))?;
            let out = c.stops.push(&rest);
            let mut text = out.text;
            if out.stopped.is_none() {
                text.push_str(&c.stops.finish());
            }
            for d in c.parser.push(&text) {
                delta.push(d);
            }
            if let Some(s) = out.stopped {
                if include_stop {
                    for d in c.parser.push(&s) {
                        delta.push(d);
                    }
                }
                c.stopped_by = Some(s);
            }
        }
        let truncated = c.stopped_by.is_none()
            && matches!(reason, FinishReason::Length | FinishReason::ContextFull);
        for d in c.parser.finish(truncated) {
            delta.push(d);
        }
        c.tool_calls += delta.net_calls();
        let (reason, stop_reason) = match (&c.stopped_by, reason) {
            (Some(s), _) => ("stop", Value::from(s.clone())),
            (None, FinishReason::Eos) => ("stop", c.stop_token.map_or(Value::Null, Value::from)),
            (None, FinishReason::Length | FinishReason::ContextFull) => ("length", Value::Null),
            (None, FinishReason::Abort) => ("abort", Value::Null),
        };
        // OpenAI: an answer that ended with calls finishes as `tool_calls`.
        let reason = if reason == "stop" && c.tool_calls > 0 {
            "tool_calls"
        } else {
            reason
        };
        Ok(self.filtered(
            i,
            delta,
            Some(Finish {
                reason,
                stop_reason,
            }),
        ))
    }

    /// Drops reasoning when the request asked not to see it.
    fn filtered(&self, i: usize, mut delta: ChoiceDelta, finish: Option<Finish>) -> ChoiceUpdate {
        if !self.include_reasoning {
            delta.reasoning.clear();
        }
        ChoiceUpdate {
            index: i,
            delta,
            finish,
        }
    }

    fn describe(&self, l: &TokenLogprobs) -> TokenLogprob {
        let text = |id: u32| self.tok.decode(&[id], false).unwrap_or_default();
        TokenLogprob {
            token: text(l.token),
            logprob: l.logprob,
            top: l.top.iter().map(|&(t, p)| (text(t), p)).collect(),
        }
    }
}
