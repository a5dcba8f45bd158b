//! `POST /v1/completions`: a prompt as text, a list of texts, token ids or lists of token ids;
//! plain text out (no chat template, no parsers).

use super::errors::ApiError;
use super::protocol::{fields, parse_body, Common, GenSpec};
use super::session::{ChoiceUpdate, ParserChoice, Run, TokenLogprob};
use super::sse::{self, ChunkShape, Envelope};
use super::state::{AppState, Loaded};
use super::{new_id, now_unix, ready};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dayone_engine::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// The completions-only fields.
#[derive(Deserialize, Debug)]
struct CompletionFields {
    prompt: Option<Value>,
    logprobs: Option<u64>,
    echo: Option<bool>,
    suffix: Option<String>,
}

/// The handler.
pub async fn completions(State(state): State<&'static AppState>, body: Bytes) -> Response {
    match run(state, &body).await {
        Ok(r) => r,
        Err(e) => {
            state.note_rejected();
            e.into_response()
        }
    }
}

/// The prompts of the `prompt` field, as token ids: a text is tokenized with the tokenizer's
/// special tokens (BOS) as the model wants.
fn prompts(v: &Value, loaded: &Loaded, tok: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = || {
        ApiError::bad_field(
            "prompt",
            "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids",
        )
    };
    let text = |s: &str| -> Result<Vec<u32>, ApiError> {
        loaded
            .encode_prompt(tok, s, true)
            .map_err(|e| ApiError::bad_field("prompt", format!("{e:#}")))
    };
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(bad)
            })
            .collect()
    };
    match v {
        Value::String(s) => Ok(vec![text(s)?]),
        Value::Array(a) if a.is_empty() => Err(bad()),
        Value::Array(a) if a.iter().all(Value::is_string) => a
            .iter()
            .map(|s| text(s.as_str().unwrap_or_default()))
            .collect(),
        Value::Array(a) if a.iter().all(Value::is_number) => Ok(vec![ids(a)?]),
        Value::Array(a) if a.iter().all(Value::is_array) => a
            .iter()
            .map(|x| ids(x.as_array().map(Vec::as_slice).unwrap_or_default()))
            .collect(),
        _ => Err(bad()),
    }
}

async fn run(state: &'static AppState, body: &[u8]) -> Result<Response, ApiError> {
    let body = parse_body(body)?;
    let common: Common = fields(&body)?;
    let f: CompletionFields = fields(&body)?;
    let settings = &state.settings;
    common.check_model(settings)?;
    if f.echo == Some(true) {
        return Err(ApiError::bad_field("echo", "echo is not supported"));
    }
    if f.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_field("suffix", "suffix is not supported"));
    }
    let (loaded, tok) = ready(state)?;
    let prompt = f
        .prompt
        .as_ref()
        .ok_or_else(|| ApiError::bad_field("prompt", "prompt is required"))?;
    let vocab = loaded.handle.model_info().vocab_size;
    let max_context = loaded.handle.model_info().max_context;
    let specs: Vec<GenSpec> = prompts(prompt, loaded, tok)?
        .into_iter()
        .map(|p| {
            if let Some(&bad) = p.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::bad_field(
                    "prompt",
                    format!("prompt token id {bad} is outside the vocabulary (vocab_size {vocab})"),
                ));
            }
            // OpenAI's (and vLLM's) completions default: 16 tokens.
            common.spec(p, max_context, settings, "max_tokens", Some(16))
        })
        .collect::<Result<_, _>>()?;
    let logprobs = match f.logprobs {
        Some(k) if k > settings.max_logprobs as u64 => {
            return Err(ApiError::bad_field(
                "logprobs",
                format!(
                    "logprobs must be at most {}, got {k}",
                    settings.max_logprobs
                ),
            ))
        }
        k => k.map(|k| k as usize),
    };
    let parser = ParserChoice {
        parse: false,
        tools: false,
        thinking: false,
        include_reasoning: true,
    };
    let spec0 = specs[0].clone();
    // Completions answer in plain text: no tool or reasoning parser.
    let run = Run::start(loaded, tok, &specs, parser, logprobs)?;
    let env = Envelope {
        id: new_id("cmpl"),
        created: now_unix(),
        model: settings.model_name.clone(),
        prompt_token_ids: (spec0.return_token_ids && specs.len() == 1)
            .then(|| spec0.prompt.clone()),
    };
    let shape = TextShape {
        token_ids: spec0.return_token_ids,
        logprobs: logprobs.is_some(),
        offsets: vec![0; run.n()],
    };
    if spec0.stream {
        return Ok(
            sse::respond(run, shape, env, spec0.include_usage, spec0.continuous_usage)
                .into_response(),
        );
    }
    Ok(Json(collect(run, shape, env).await?).into_response())
}

/// Completions' chunk spelling.
struct TextShape {
    token_ids: bool,
    logprobs: bool,
    /// Characters sent so far per choice (`text_offset`).
    offsets: Vec<usize>,
}

impl TextShape {
    /// The legacy logprobs object: `{tokens, token_logprobs, top_logprobs, text_offset}`.
    /// The sampled token is among `top_logprobs` even when it is not in the top N (vLLM).
    fn logprobs_json(&mut self, index: usize, l: &[TokenLogprob]) -> Value {
        let mut offsets = Vec::with_capacity(l.len());
        for x in l {
            offsets.push(self.offsets[index]);
            self.offsets[index] += x.token.chars().count();
        }
        json!({
            "tokens": l.iter().map(|x| &x.token).collect::<Vec<_>>(),
            "token_logprobs": l.iter().map(|x| x.logprob).collect::<Vec<_>>(),
            "top_logprobs": l.iter().map(|x| {
                let mut m: Map<String, Value> =
                    x.top.iter().map(|(t, p)| (t.clone(), json!(p))).collect();
                m.entry(x.token.clone()).or_insert(json!(x.logprob));
                m
            }).collect::<Vec<_>>(),
            "text_offset": offsets,
        })
    }
}

impl ChunkShape for TextShape {
    const OBJECT: &'static str = "text_completion";

    fn opening(&self, _index: usize) -> Option<Value> {
        None
    }

    fn choice(&mut self, u: &ChoiceUpdate) -> Option<Value> {
        let d = &u.delta;
        let has_logprobs = self.logprobs && !d.logprobs.is_empty();
        // A token without text still goes out when its id is asked for (`return_token_ids`).
        let has_ids = self.token_ids && !d.token_ids.is_empty();
        if d.content.is_empty() && u.finish.is_none() && !has_logprobs && !has_ids {
            return None;
        }
        let mut c = json!({
            "index": u.index,
            "text": d.content,
            "logprobs": if has_logprobs { self.logprobs_json(u.index, &d.logprobs) } else { Value::Null },
            "finish_reason": u.finish.as_ref().map(|f| f.reason),
        });
        if let Some(f) = &u.finish {
            c["stop_reason"] = f.stop_reason.clone();
        }
        if self.token_ids {
            c["token_ids"] = json!(d.token_ids);
        }
        Some(c)
    }
}

async fn collect(run: Run, mut shape: TextShape, env: Envelope) -> Result<Value, ApiError> {
    let (acc, usage) = run.collect().await?;
    let logprobs = shape.logprobs;
    let choices: Vec<Value> = acc
        .into_iter()
        .enumerate()
        .map(|(i, (d, f))| {
            let mut c = json!({
                "index": i,
                "text": d.content,
                "logprobs": if logprobs { shape.logprobs_json(i, &d.logprobs) } else { Value::Null },
                "finish_reason": f.as_ref().map(|f| f.reason),
                "stop_reason": f.as_ref().map_or(Value::Null, |f| f.stop_reason.clone()),
            });
            if shape.token_ids {
                c["token_ids"] = json!(d.token_ids);
            }
            c
        })
        .collect();
    let mut out = json!({
        "id": env.id,
        "object": "text_completion",
        "created": env.created,
        "model": env.model,
        "choices": choices,
        "usage": sse::usage_json(&usage),
    });
    if let Some(ids) = env.prompt_token_ids {
        out["prompt_token_ids"] = json!(ids);
    }
    Ok(out)
}
