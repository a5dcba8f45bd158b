//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status as `code` (vLLM's Python server; serving.md §A4). Every failure a handler can meet
//! becomes one of these, so a bad request never takes the server down.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// A request that cannot be served, with the status it maps to.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status (also the body's `code`).
    pub status: StatusCode,
    /// What was wrong, for people (names the field and what was expected).
    pub message: String,
    /// The request field at fault, when there is one (`messages[1].content`, `max_tokens`).
    pub param: Option<String>,
}

impl ApiError {
    /// 400: a bad field, bad JSON, a prompt longer than the context.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 naming the field at fault.
    pub fn bad_field(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::bad_request(message)
        }
    }

    /// Any status with a message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// 503: the model is still loading, the queue is full, or the engine is shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500: the engine failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The `type` string OpenAI clients show (vLLM's spellings).
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::PAYLOAD_TOO_LARGE => "PayloadTooLargeError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            s if s.is_server_error() => "InternalServerError",
            _ => "BadRequestError",
        }
    }

    /// The error object (`{"error": {...}}`), also sent as one SSE event when a stream fails
    /// after it started.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        ApiError::bad_request(format!("the body is not valid JSON: {e}"))
    }
}

/// Maps an error from the engine service: queue full or shutting down → 503, the engine stopped
/// → 500, anything else (the engine's validation of the request) → 400.
pub fn from_engine(e: anyhow::Error) -> ApiError {
    let msg = format!("{e:#}");
    if e.downcast_ref::<dayone_engine::scheduler::QueueFull>()
        .is_some()
        || msg.starts_with("engine is shutting down")
    {
        ApiError::unavailable(msg)
    } else if msg.starts_with("engine stopped") {
        ApiError::internal(msg)
    } else {
        ApiError::bad_request(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape_with_status_code() {
        let e = ApiError::bad_field("max_tokens", "too large");
        let b = e.body();
        assert_eq!(b["error"]["code"], 400);
        assert_eq!(b["error"]["param"], "max_tokens");
        assert_eq!(b["error"]["type"], "BadRequestError");
        assert_eq!(b["error"]["message"], "too large");
        assert_eq!(ApiError::unavailable("x").body()["error"]["code"], 503);
    }
}
