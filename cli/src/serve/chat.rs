//! `POST /v1/chat/completions`: messages through the model's chat template (with `tools` and
//! `chat_template_kwargs`), the answer through the tool-call and reasoning parsers.

use super::errors::ApiError;
use super::protocol::{fields, parse_body, Common};
use super::session::{ChoiceDelta, ChoiceUpdate, ParserChoice, Run, TokenLogprob};
use super::sse::{self, ChunkShape, Envelope};
use super::state::{AppState, Loaded};
use super::{new_id, now_unix, ready};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// The chat-only fields.
#[derive(Deserialize, Debug, Default)]
struct ChatFields {
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<u64>,
    chat_template_kwargs: Option<Map<String, Value>>,
    add_generation_prompt: Option<bool>,
    include_reasoning: Option<bool>,
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

async fn run(state: &'static AppState, body: &[u8]) -> Result<Response, ApiError> {
    let body = parse_body(body)?;
    let common: Common = fields(&body)?;
    let chat: ChatFields = fields(&body)?;
    let settings = &state.settings;
    common.check_model(settings)?;
    let (loaded, tok) = ready(state)?;
    let template = loaded.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template (tokenizer_config.json or chat_template.jinja): use /v1/completions",
        )
    })?;
    let (messages, images) = normalize_messages(&chat.messages, settings)?;
    let parser = parser_choice(loaded, &chat)?;
    let mut vars = chat.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(tools) = &chat.tools {
        vars.insert("tools".into(), Value::from(tools.clone()));
    }
    let rendered = template
        .render_json(
            &messages,
            chat.add_generation_prompt.unwrap_or(true),
            &loaded.bos_token,
            &loaded.eos_token,
            &vars,
        )
        .map_err(|e| ApiError::bad_field("messages", format!("{e:#}")))?;
    // The template wrote BOS itself when the model wants one.
    let prompt = tok
        .encode(&rendered, false)
        .map_err(|e| ApiError::bad_field("messages", format!("{e:#}")))?;
    let field = if common.max_completion_tokens.is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let mut spec = common.spec(
        prompt,
        loaded.handle.model_info().max_context,
        settings,
        field,
        None,
    )?;
    spec.images = images;
    let logprobs = match (chat.logprobs.unwrap_or(false), chat.top_logprobs) {
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::bad_field(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
        (false, _) => None,
        (true, k) => {
            let k = k.unwrap_or(0);
            if k > settings.max_logprobs as u64 {
                return Err(ApiError::bad_field(
                    "top_logprobs",
                    format!(
                        "top_logprobs must be at most {}, got {k}",
                        settings.max_logprobs
                    ),
                ));
            }
            Some(k as usize)
        }
    };
    // The answer starts inside reasoning when the template opened it.
    let parser = ParserChoice {
        thinking: parser.thinking || super::parsers::starts_in_reasoning(&rendered),
        ..parser
    };
    let run = Run::start(loaded, tok, std::slice::from_ref(&spec), parser, logprobs)?;
    let env = Envelope {
        id: new_id("chatcmpl"),
        created: now_unix(),
        model: settings.model_name.clone(),
        prompt_token_ids: spec.return_token_ids.then(|| spec.prompt.clone()),
    };
    let shape = ChatShape {
        token_ids: spec.return_token_ids,
        logprobs: logprobs.is_some(),
    };
    if spec.stream {
        return Ok(
            sse::respond(run, shape, env, spec.include_usage, spec.continuous_usage)
                .into_response(),
        );
    }
    Ok(Json(collect(run, &shape, env).await?).into_response())
}

/// Which parsers run: tools when the request has tools and `tool_choice` allows them;
/// `required` or a named function would need constrained decoding (400).
fn parser_choice(loaded: &Loaded, chat: &ChatFields) -> Result<ParserChoice, ApiError> {
    let has_tools = chat.tools.as_ref().is_some_and(|t| !t.is_empty());
    let choice = chat.tool_choice.as_ref().filter(|v| !v.is_null());
    let tools = match choice {
        None => has_tools,
        Some(Value::String(s)) if s == "auto" => has_tools,
        Some(Value::String(s)) if s == "none" => false,
        Some(Value::String(s)) if s == "required" => {
            return Err(ApiError::bad_field(
                "tool_choice",
                "tool_choice \"required\" is not supported: forcing a call needs constrained decoding, which dayone does not have yet (use \"auto\")",
            ))
        }
        Some(Value::Object(_)) => {
            return Err(ApiError::bad_field(
                "tool_choice",
                "a named tool_choice is not supported: forcing a call needs constrained decoding, which dayone does not have yet (use \"auto\")",
            ))
        }
        Some(other) => {
            return Err(ApiError::bad_field(
                "tool_choice",
                format!("tool_choice must be \"none\", \"auto\", \"required\" or an object, got {other}"),
            ))
        }
    };
    if tools && loaded.tool_format.is_none() {
        return Err(ApiError::bad_field(
            "tools",
            format!(
                "this server has no tool-call parser for its model: start it with --tool-call-parser (one of {})",
                super::parsers::ToolFormat::names().join(", ")
            ),
        ));
    }
    let kwargs = chat.chat_template_kwargs.as_ref();
    let switched_off = kwargs.is_some_and(|k| {
        ["enable_thinking", "thinking"]
            .iter()
            .any(|name| k.get(*name) == Some(&Value::Bool(false)))
    });
    Ok(ParserChoice {
        parse: true,
        tools,
        thinking: false,
        include_reasoning: chat.include_reasoning.unwrap_or(true) && !switched_off,
    })
}

/// Checks each message and shapes it for templates: `content` as a string (text parts
/// joined; each `image_url` part becomes the model's image markup, its image decoded and
/// returned in order), tool-call `arguments` parsed into objects (templates print them with
/// `tojson`, as vLLM passes them), `reasoning` renamed `reasoning_content`.
pub(super) fn normalize_messages(
    messages: &[Value],
    settings: &super::state::Settings,
) -> Result<(Value, Vec<std::sync::Arc<dayone_engine::vision::RgbImage>>), ApiError> {
    let mut images = Vec::new();
    if messages.is_empty() {
        return Err(ApiError::bad_field(
            "messages",
            "messages is empty: give at least one",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}]{f}");
        let Some(obj) = m.as_object() else {
            return Err(ApiError::bad_field(
                &at(""),
                "each message must be an object",
            ));
        };
        let mut obj = obj.clone();
        let role = obj.get("role").and_then(Value::as_str).map(str::to_owned);
        match role.as_deref() {
            Some("system" | "user" | "assistant" | "tool" | "developer") => {}
            Some(r) => {
                return Err(ApiError::bad_field(
                    &at(".role"),
                    format!(
                        "unknown role '{r}': expected system, developer, user, assistant or tool"
                    ),
                ))
            }
            None => return Err(ApiError::bad_field(&at(".role"), "role must be a string")),
        }
        let content = match obj.get("content") {
            // Only an assistant turn may go without content (it made tool calls); a template
            // would print another's missing content as the text `None`.
            None | Some(Value::Null) if role.as_deref() != Some("assistant") => {
                return Err(ApiError::bad_field(
                    &at(".content"),
                    format!(
                        "a {} message needs content (a string or a list of parts)",
                        role.as_deref().unwrap_or_default()
                    ),
                ))
            }
            None | Some(Value::Null) => Value::Null,
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (k, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        (Some("image_url"), _) if settings.image_markup.is_some() => {
                            let field = at(&format!(".content[{k}].image_url.url"));
                            let url = p
                                .pointer("/image_url/url")
                                .or_else(|| p.get("image_url").filter(|u| u.is_string()))
                                .and_then(Value::as_str)
                                .ok_or_else(|| {
                                    ApiError::bad_field(&field, "image_url.url must be a string")
                                })?;
                            images.push(super::media::load_image_url(url, settings, &field)?);
                            text.push_str(settings.image_markup.unwrap_or_default());
                        }
                        (Some(kind), _) if kind != "text" => {
                            return Err(ApiError::bad_field(
                                &at(&format!(".content[{k}]")),
                                if settings.image_markup.is_some() {
                                    format!("content part type '{kind}' is not supported: use \"text\" or \"image_url\"")
                                } else {
                                    format!("content part type '{kind}' is not supported by this model (text only)")
                                },
                            ))
                        }
                        _ => {
                            return Err(ApiError::bad_field(
                                &at(&format!(".content[{k}]")),
                                "a content part must be {\"type\": \"text\", \"text\": string}",
                            ))
                        }
                    }
                }
                Value::String(text)
            }
            Some(_) => {
                return Err(ApiError::bad_field(
                    &at(".content"),
                    "content must be a string or a list of parts (null only for an assistant turn)",
                ))
            }
        };
        obj.insert("content".into(), content);
        if let Some(r) = obj.remove("reasoning") {
            obj.entry("reasoning_content").or_insert(r);
        }
        if let Some(Value::Array(calls)) = obj.get_mut("tool_calls") {
            for c in calls.iter_mut() {
                if let Some(args) = c.pointer_mut("/function/arguments") {
                    if let Some(parsed) = args
                        .as_str()
                        .and_then(|s| serde_json::from_str::<Value>(s).ok())
                        .filter(Value::is_object)
                    {
                        *args = parsed;
                    }
                }
            }
        }
        out.push(Value::Object(obj));
    }
    Ok((Value::Array(out), images))
}

/// Chat's chunk spelling.
struct ChatShape {
    token_ids: bool,
    logprobs: bool,
}

fn logprobs_json(l: &[TokenLogprob]) -> Value {
    let entry = |t: &str, lp: f32| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()});
    json!({"content": l.iter().map(|x| {
        let mut e = entry(&x.token, x.logprob);
        e["top_logprobs"] = x.top.iter().map(|(t, p)| entry(t, *p)).collect();
        e
    }).collect::<Vec<_>>()})
}

fn tool_calls_json(d: &ChoiceDelta) -> Vec<Value> {
    d.tool_calls
        .iter()
        .map(|t| {
            let mut f = json!({"arguments": t.arguments});
            if let Some(n) = &t.name {
                f["name"] = json!(n);
            }
            let mut c = json!({"index": t.index, "function": f});
            if let Some(id) = &t.id {
                c["id"] = json!(id);
                c["type"] = json!("function");
            }
            c
        })
        .collect()
}

impl ChunkShape for ChatShape {
    const OBJECT: &'static str = "chat.completion.chunk";

    fn opening(&self, index: usize) -> Option<Value> {
        Some(json!({
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": null,
            "finish_reason": null,
        }))
    }

    fn choice(&mut self, u: &ChoiceUpdate) -> Option<Value> {
        let d = &u.delta;
        let mut delta = Map::new();
        if !d.content.is_empty() {
            delta.insert("content".into(), json!(d.content));
        }
        if !d.reasoning.is_empty() {
            // Both spellings: vLLM now sends `reasoning`, SGLang and llama.cpp `reasoning_content`.
            delta.insert("reasoning_content".into(), json!(d.reasoning));
            delta.insert("reasoning".into(), json!(d.reasoning));
        }
        if !d.tool_calls.is_empty() {
            delta.insert("tool_calls".into(), json!(tool_calls_json(d)));
        }
        let has_logprobs = self.logprobs && !d.logprobs.is_empty();
        // A token without text still goes out when its id is asked for (`return_token_ids`).
        let has_ids = self.token_ids && !d.token_ids.is_empty();
        if delta.is_empty() && u.finish.is_none() && !has_logprobs && !has_ids {
            return None;
        }
        let mut c = json!({
            "index": u.index,
            "delta": delta,
            "logprobs": if has_logprobs { logprobs_json(&d.logprobs) } else { Value::Null },
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

async fn collect(run: Run, shape: &ChatShape, env: Envelope) -> Result<Value, ApiError> {
    let (acc, usage) = run.collect().await?;
    let choices: Vec<Value> = acc
        .into_iter()
        .enumerate()
        .map(|(i, (mut d, finish))| {
            let invalid = std::mem::take(&mut d.invalid_calls);
            d.tool_calls.retain(|t| !invalid.contains(&t.index));
            let d = &d;
            let calls = tool_calls_json(d)
                .into_iter()
                .map(|mut c| {
                    if let Some(o) = c.as_object_mut() {
                        o.remove("index");
                    }
                    c
                })
                .collect::<Vec<_>>();
            let mut message = json!({
                "role": "assistant",
                "content": if d.content.is_empty() && !calls.is_empty() { Value::Null } else { json!(d.content) },
            });
            if !d.reasoning.is_empty() {
                message["reasoning_content"] = json!(d.reasoning);
                message["reasoning"] = json!(d.reasoning);
            }
            if !calls.is_empty() {
                message["tool_calls"] = json!(calls);
            }
            let finish = finish.as_ref();
            let mut c = json!({
                "index": i,
                "message": message,
                "logprobs": if shape.logprobs { logprobs_json(&d.logprobs) } else { Value::Null },
                "finish_reason": finish.map(|f| f.reason),
                "stop_reason": finish.map_or(Value::Null, |f| f.stop_reason.clone()),
            });
            if shape.token_ids {
                c["token_ids"] = json!(d.token_ids);
            }
            c
        })
        .collect();
    let mut out = json!({
        "id": env.id,
        "object": "chat.completion",
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
