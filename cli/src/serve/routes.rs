//! The routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/tokenize`,
//! `/detokenize`, `/health`, `/metrics`; the API key check on `/v1/*`; the body limit (413);
//! OpenAI-shaped errors for unknown paths (404) and wrong methods (405).

use super::errors::ApiError;
use super::protocol::{fields, parse_body};
use super::state::AppState;
use super::{chat, completions, metrics, ready};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

/// The server's router; request bodies above `Settings::max_body` bytes get 413.
pub fn router(state: &'static AppState) -> Router {
    let max_body = state.settings.max_body;
    Router::new()
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state, guard))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Compares in time independent of where the strings differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The API key on `/v1/*`, and OpenAI-shaped bodies for the errors axum itself produces (413
/// from the body limit, 400/415 from extractors).
async fn guard(State(state): State<&'static AppState>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(len) = declared.filter(|&l| l > state.settings.max_body as u64) {
        // Read (and drop) a moderately oversized body before answering: a client still
        // sending would otherwise see the connection reset instead of the 413.
        if len <= 4 * state.settings.max_body as u64 {
            let _ = axum::body::to_bytes(req.into_body(), len as usize).await;
        }
        state.note_rejected();
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is {len} bytes, more than the server's limit of {} bytes (--max-body-mb)",
                state.settings.max_body
            ),
        )
        .into_response();
    }
    if let Some(key) = &state.settings.api_key {
        if req.uri().path().starts_with("/v1") {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    // The scheme is case-insensitive (RFC 7235).
                    let (scheme, token) = v.split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then_some(token)
                })
                .map(str::trim);
            if !given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
                state.note_rejected();
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "missing or wrong API key: send Authorization: Bearer <key>",
                )
                .into_response();
            }
        }
    }
    let resp = next.run(req).await;
    let plain_error = resp.status().is_client_error()
        && resp
            .headers()
            .get(header::CONTENT_TYPE)
            .is_none_or(|v| !v.as_bytes().starts_with(b"application/json"));
    if !plain_error {
        return resp;
    }
    state.note_rejected();
    let status = resp.status();
    let text = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            "the request body is too large (see the server's --max-body-mb)".to_string()
        }
        _ if text.is_empty() => status.canonical_reason().unwrap_or("error").to_string(),
        _ => text,
    };
    ApiError::new(status, message).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// `GET /v1/models/{id}`: the served model's card, or 404.
async fn model(
    State(state): State<&'static AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if id != state.settings.model_name {
        state.note_rejected();
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "The model `{id}` does not exist: this server serves `{}`",
                state.settings.model_name
            ),
        )
        .into_response();
    }
    Json(model_card(state)).into_response()
}

/// `GET /v1/models`: the one served model.
async fn models(State(state): State<&'static AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(state)]}))
}

/// The model object of `/v1/models` (vLLM's ModelCard fields).
fn model_card(state: &AppState) -> Value {
    let s = &state.settings;
    let max_len = state
        .loaded
        .get()
        .map(|l| l.handle.model_info().max_context);
    json!({
        "id": s.model_name,
        "object": "model",
        "created": s.created,
        "owned_by": "dayone",
        "root": s.root,
        "parent": null,
        "max_model_len": max_len,
        "permission": [],
    })
}

/// `GET /health`: 200 once the model is loaded and the engine runs; 503 before and after.
async fn health(State(state): State<&'static AppState>) -> Response {
    match state.loaded.get() {
        None => ApiError::unavailable("Loading model").into_response(),
        Some(l) => match l.handle.stats() {
            Ok(_) => StatusCode::OK.into_response(),
            Err(e) => ApiError::unavailable(format!("{e:#}")).into_response(),
        },
    }
}

/// `GET /metrics`: Prometheus text.
async fn metrics_text(State(state): State<&'static AppState>) -> Response {
    let Some(l) = state.loaded.get() else {
        return ApiError::unavailable("Loading model").into_response();
    };
    let stats = match l.handle.stats() {
        Ok(s) => s,
        Err(e) => return ApiError::unavailable(format!("{e:#}")).into_response(),
    };
    let Some(snapshot) = stats.metrics else {
        return ApiError::internal("the engine keeps no metrics").into_response();
    };
    let gauges = metrics::ServerGauges {
        requests_rejected: state.rejected.load(Ordering::Relaxed),
        resident_bytes: resident_bytes(),
        ..l.gauges
    };
    let text = metrics::render(&snapshot, &gauges, &state.settings.model_name);
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        Body::from(text),
    )
        .into_response()
}

/// This process's resident memory (Linux `/proc/self/statm`, pages × 4096; 0 elsewhere).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[derive(Deserialize)]
struct TokenizeFields {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<Value>>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    return_token_strs: Option<bool>,
}

/// `POST /tokenize`: `{prompt | messages, add_special_tokens = true}` →
/// `{count, max_model_len, tokens, token_strs?}` (vLLM's shape).
async fn tokenize(State(state): State<&'static AppState>, body: Bytes) -> Response {
    let r = async {
        let body = parse_body(&body)?;
        let f: TokenizeFields = fields(&body)?;
        super::protocol::Common {
            model: f.model.clone(),
            ..Default::default()
        }
        .check_model(&state.settings)?;
        let (loaded, tok) = ready(state)?;
        let ids = match (&f.prompt, &f.messages) {
            (Some(p), None) => loaded
                .encode_prompt(tok, p, f.add_special_tokens.unwrap_or(true))
                .map_err(|e| ApiError::bad_field("prompt", format!("{e:#}")))?,
            (None, Some(m)) => {
                let t = loaded.template.as_ref().ok_or_else(|| {
                    ApiError::bad_field("messages", "this model has no chat template")
                })?;
                // The messages as /v1/chat/completions shapes them (checks, parts joined, tool
                // arguments parsed), so the count is the one a chat request would run.
                let (messages, _images) = super::chat::normalize_messages(m, &state.settings)?;
                let text = t
                    .render_json(
                        &messages,
                        f.add_generation_prompt.unwrap_or(true),
                        &loaded.bos_token,
                        &loaded.eos_token,
                        &Default::default(),
                    )
                    .map_err(|e| ApiError::bad_field("messages", format!("{e:#}")))?;
                tok.encode(&text, false)
                    .map_err(|e| ApiError::bad_field("messages", format!("{e:#}")))?
            }
            _ => {
                return Err(ApiError::bad_request(
                    "give exactly one of prompt (a string) or messages",
                ))
            }
        };
        let mut out = json!({
            "count": ids.len(),
            "max_model_len": loaded.handle.model_info().max_context,
            "tokens": ids,
        });
        if f.return_token_strs.unwrap_or(false) {
            out["token_strs"] = ids
                .iter()
                .map(|&i| json!(tok.id_to_token(i)))
                .collect::<Vec<_>>()
                .into();
        }
        Ok::<_, ApiError>(Json(out))
    }
    .await;
    respond(state, r)
}

#[derive(Deserialize)]
struct DetokenizeFields {
    tokens: Vec<u32>,
}

/// `POST /detokenize`: `{tokens}` → `{prompt}`.
async fn detokenize(State(state): State<&'static AppState>, body: Bytes) -> Response {
    let r = async {
        let body = parse_body(&body)?;
        let f: DetokenizeFields = fields(&body)?;
        let (loaded, tok) = ready(state)?;
        let vocab = loaded.handle.model_info().vocab_size;
        if let Some(&bad) = f.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::bad_field(
                "tokens",
                format!("token id {bad} is outside the vocabulary (vocab_size {vocab})"),
            ));
        }
        let text = tok
            .decode(&f.tokens, false)
            .map_err(|e| ApiError::bad_field("tokens", format!("{e:#}")))?;
        Ok(Json(json!({"prompt": text})))
    }
    .await;
    respond(state, r)
}

fn respond(state: &AppState, r: Result<Json<Value>, ApiError>) -> Response {
    match r {
        Ok(j) => j.into_response(),
        Err(e) => {
            state.note_rejected();
            e.into_response()
        }
    }
}
