//! One streaming request to an OpenAI-compatible server and its timings, measured as
//! `vllm bench serve` measures them (serving.md G): TTFT at the first chunk carrying output,
//! E2EL at the last one, ITL between consecutive output chunks, output tokens from `usage`.

use super::dataset::Prompt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Which OpenAI API the endpoint speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`: `prompt`, chunks carry `choices[].text`.
    Completions,
    /// `/v1/chat/completions`: `messages`, chunks carry `choices[].delta`.
    Chat,
}

impl Api {
    /// The API of an endpoint path (`…/chat/completions` or `…/completions`), else `None`.
    pub fn from_endpoint(endpoint: &str) -> Option<Api> {
        let e = endpoint.trim_end_matches('/');
        if e.ends_with("/chat/completions") {
            Some(Api::Chat)
        } else if e.ends_with("/completions") {
            Some(Api::Completions)
        } else {
            None
        }
    }

    /// vLLM's `--backend` name for this API (the JSON's `backend`).
    pub fn backend(self) -> &'static str {
        match self {
            Api::Completions => "openai",
            Api::Chat => "openai-chat",
        }
    }
}

/// The sampling settings every request carries.
#[derive(Clone, Debug)]
pub struct Sampling {
    /// `temperature`.
    pub temperature: f32,
    /// Sends `ignore_eos: true` (only when set, as vLLM does).
    pub ignore_eos: bool,
}

/// The JSON body of one streaming request asking for `max_tokens` tokens.
pub fn request_body(
    api: Api,
    model: &str,
    prompt: &Prompt,
    max_tokens: usize,
    s: &Sampling,
) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "temperature": s.temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let prompt_value = match prompt {
        Prompt::Ids(ids) => json!(ids),
        Prompt::Text(t) => json!(t),
    };
    match api {
        Api::Completions => body["prompt"] = prompt_value,
        Api::Chat => {
            body["messages"] = json!([{"role": "user", "content": prompt_value}]);
            body["max_completion_tokens"] = json!(max_tokens);
        }
    }
    if s.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    body
}

/// Where requests go.
#[derive(Clone, Debug)]
pub struct Target {
    /// The full URL (base + endpoint).
    pub url: String,
    /// Sent as `Authorization: Bearer …`.
    pub api_key: Option<String>,
    /// Per-request limit, send to end of stream.
    pub timeout: Duration,
}

/// What one request did. Times are seconds; `start_time` is from the benchmark's start, the
/// others from this request's send time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestOutput {
    /// At least one output chunk arrived and no error (HTTP status, error event, timeout,
    /// broken connection) happened.
    pub success: bool,
    /// Time to the first chunk carrying output (s).
    pub ttft: f64,
    /// Gaps between consecutive output chunks (s).
    pub itl: Vec<f64>,
    /// Time to the last output chunk (s) (E2EL; the usage chunk does not extend it).
    pub latency: f64,
    /// Output tokens: `usage.completion_tokens`, else the number of output chunks.
    pub output_tokens: usize,
    /// Whether `output_tokens` came from a `usage` object.
    pub usage_reported: bool,
    /// The dataset's prompt length (tokens).
    pub prompt_len: usize,
    /// `usage.prompt_tokens`, when the server sent one.
    pub server_prompt_tokens: Option<usize>,
    /// Send time (s) after the benchmark's start.
    pub start_time: f64,
    /// Why it failed ("" on success).
    pub error: String,
    /// The client closed the connection mid-stream on purpose (soak `--abort-fraction`): not a
    /// success and not a failure.
    pub aborted: bool,
}

/// What a line of the stream means for the caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    /// Keep reading.
    More,
    /// `data: [DONE]`: the stream is over.
    Done,
}

/// The timing state of one SSE stream, fed line by line (pure, so the metric rules are
/// testable without a server).
#[derive(Debug, Default)]
pub struct StreamState {
    first: Option<f64>,
    last: f64,
    itl: Vec<f64>,
    chunks: usize,
    usage_completion: Option<usize>,
    usage_prompt: Option<usize>,
    /// An error event's message.
    pub error: Option<String>,
}

/// Whether a choice (completions or chat) carries output: text, content, reasoning or a
/// tool-call delta.
fn carries_output(choice: &Value) -> bool {
    let nonempty = |v: Option<&Value>| match v {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        _ => false,
    };
    if nonempty(choice.get("text")) {
        return true;
    }
    let Some(delta) = choice.get("delta") else {
        return false;
    };
    ["content", "reasoning", "reasoning_content", "tool_calls"]
        .iter()
        .any(|k| nonempty(delta.get(*k)))
}

/// The message of an error event (`{"error": {...}}`, `{"error": "..."}`, or SGLang's flat
/// `{"object": "error", "message": ...}`).
fn error_message(data: &Value) -> Option<String> {
    if let Some(e) = data.get("error") {
        if e.is_null() {
            return None;
        }
        return Some(match e.get("message").and_then(Value::as_str) {
            Some(m) => m.to_string(),
            None => match e.as_str() {
                Some(s) => s.to_string(),
                None => e.to_string(),
            },
        });
    }
    if data.get("object").and_then(Value::as_str) == Some("error") {
        let m = data.get("message").and_then(Value::as_str).unwrap_or("");
        return Some(m.to_string());
    }
    None
}

impl StreamState {
    /// Takes one line of the event stream received `t` seconds after the send. Comment lines
    /// (`:`), blank lines and other fields (`event:`, `id:`) are skipped; `data:` JSON updates the
    /// timings and usage; `data: [DONE]` ends the stream.
    pub fn feed_line(&mut self, line: &str, t: f64) -> Flow {
        let line = line.trim();
        let Some(data) = line.strip_prefix("data:") else {
            return Flow::More;
        };
        let data = data.trim_start();
        if data == "[DONE]" {
            return Flow::Done;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            // Not JSON: nothing to time (vLLM would fail on it; a stray line is not an error
            // worth losing the request for).
            return Flow::More;
        };
        if let Some(m) = error_message(&v) {
            self.error = Some(m);
            return Flow::More;
        }
        let has_output = v
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|c| c.iter().any(carries_output));
        if has_output {
            match self.first {
                None => self.first = Some(t),
                Some(_) => self.itl.push(t - self.last),
            }
            self.last = t;
            self.chunks += 1;
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            if let Some(n) = u.get("completion_tokens").and_then(Value::as_u64) {
                self.usage_completion = Some(n as usize);
            }
            if let Some(n) = u.get("prompt_tokens").and_then(Value::as_u64) {
                self.usage_prompt = Some(n as usize);
            }
        }
        Flow::More
    }

    /// The request's result (without `prompt_len`/`start_time`, which the caller knows).
    pub fn finish(self) -> RequestOutput {
        let mut out = RequestOutput {
            itl: self.itl,
            server_prompt_tokens: self.usage_prompt,
            ..Default::default()
        };
        match (self.first, self.error) {
            (_, Some(e)) => out.error = e,
            (None, None) => out.error = "the stream carried no output chunk".into(),
            (Some(first), None) => {
                out.success = true;
                out.ttft = first;
                out.latency = self.last;
                out.usage_reported = self.usage_completion.is_some();
                out.output_tokens = self.usage_completion.unwrap_or(self.chunks);
            }
        }
        if !out.success {
            out.itl.clear();
        }
        out
    }
}

/// Splits a byte stream into lines (`\n` or `\r\n`), across chunk boundaries.
#[derive(Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
}

impl LineBuffer {
    /// Appends bytes and returns the complete lines they finish.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut lines = Vec::new();
        let mut start = 0;
        while let Some(p) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + p;
            let line = &self.buf[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            lines.push(String::from_utf8_lossy(line).into_owned());
            start = end + 1;
        }
        self.buf.drain(..start);
        lines
    }

    /// What is left after the stream closed (a last line without `\n`).
    pub fn rest(&mut self) -> Option<String> {
        let s = String::from_utf8_lossy(&self.buf).trim().to_string();
        self.buf.clear();
        (!s.is_empty()).then_some(s)
    }
}

/// An error with its causes, one line (`reqwest`'s top-level message alone hides "connection
/// refused").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = c.source();
    }
    s
}

/// Sends one streaming request and times it. `t0` is the benchmark's start (for
/// `start_time`). Never fails: problems land in `error` with `success: false`.
pub async fn send(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    prompt_len: usize,
    t0: Instant,
) -> RequestOutput {
    send_with(client, target, body, prompt_len, t0, None).await
}

/// [`send`], and with `abort_after: Some(k)` the request is dropped (its connection closed)
/// once `k` output chunks have arrived; it then comes back `aborted` (a stream that ends
/// before `k` chunks is an ordinary request).
pub async fn send_with(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    prompt_len: usize,
    t0: Instant,
    abort_after: Option<usize>,
) -> RequestOutput {
    let st = Instant::now();
    let fut = stream(client, target, body, st, abort_after);
    let mut out = match tokio::time::timeout(target.timeout, fut).await {
        Ok(o) => o,
        Err(_) => RequestOutput {
            error: format!(
                "timed out after {} s (--timeout)",
                target.timeout.as_secs_f64()
            ),
            ..Default::default()
        },
    };
    out.prompt_len = prompt_len;
    out.start_time = st.duration_since(t0).as_secs_f64();
    out
}

async fn stream(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    st: Instant,
    abort_after: Option<usize>,
) -> RequestOutput {
    use futures_util::StreamExt;
    let fail = |error: String| RequestOutput {
        error,
        ..Default::default()
    };
    let mut req = client.post(&target.url).json(body);
    if let Some(k) = &target.api_key {
        req = req.bearer_auth(k);
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return fail(error_chain(&e)),
    };
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let text: String = text.trim().chars().take(500).collect();
        return fail(format!("HTTP {status}: {text}"));
    }
    let mut state = StreamState::default();
    let mut lines = LineBuffer::default();
    let mut bytes = resp.bytes_stream();
    'read: while let Some(chunk) = bytes.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return fail(format!("stream broke: {}", error_chain(&e))),
        };
        let t = st.elapsed().as_secs_f64();
        for line in lines.push(&chunk) {
            if state.feed_line(&line, t) == Flow::Done {
                break 'read;
            }
            if let Some(k) = abort_after.filter(|&k| state.chunks >= k && state.error.is_none()) {
                // Dropping the body stream closes the connection: the server sees a client
                // that went away mid-stream.
                drop(bytes);
                return RequestOutput {
                    aborted: true,
                    error: format!("aborted by the client after {k} chunks"),
                    ..Default::default()
                };
            }
        }
    }
    if let Some(line) = lines.rest() {
        state.feed_line(&line, st.elapsed().as_secs_f64());
    }
    state.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lines: &[(&str, f64)]) -> RequestOutput {
        let mut s = StreamState::default();
        for (l, t) in lines {
            if s.feed_line(l, *t) == Flow::Done {
                break;
            }
        }
        s.finish()
    }

    #[test]
    fn chat_stream_timings() {
        let out = feed(&[
            (": keep-alive", 0.05),
            (
                r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                0.08,
            ),
            (
                r#"data: {"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}"#,
                0.10,
            ),
            (
                r#"data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
                0.15,
            ),
            (
                r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#,
                0.25,
            ),
            (
                r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
                0.30,
            ),
            (
                r#"data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}"#,
                0.40,
            ),
            ("data: [DONE]", 0.41),
            (
                r#"data: {"choices":[{"index":0,"delta":{"content":"late"}}]}"#,
                0.5,
            ),
        ]);
        assert!(out.success, "{out:?}");
        assert_eq!(out.ttft, 0.10, "role chunk and comment skipped");
        assert_eq!(
            out.latency, 0.25,
            "finish and usage chunks do not extend E2EL"
        );
        assert_eq!(out.itl.len(), 2);
        assert!((out.itl[0] - 0.05).abs() < 1e-12 && (out.itl[1] - 0.10).abs() < 1e-12);
        assert_eq!(out.output_tokens, 5);
        assert!(out.usage_reported);
        assert_eq!(out.server_prompt_tokens, Some(7));
    }

    #[test]
    fn completions_without_usage_counts_chunks() {
        let out = feed(&[
            (r#"data:{"choices":[{"text":"a"}]}"#, 1.0),
            (r#"data: {"choices":[{"text":"b"}]}"#, 1.5),
            (
                r#"data: {"choices":[{"text":"c","finish_reason":"stop"}]}"#,
                2.5,
            ),
            ("data: [DONE]", 2.6),
        ]);
        assert!(out.success);
        assert_eq!((out.ttft, out.latency, out.output_tokens), (1.0, 2.5, 3));
        assert!(!out.usage_reported);
        assert_eq!(out.itl, vec![0.5, 1.0]);
    }

    #[test]
    fn error_event_and_empty_stream_fail() {
        let out = feed(&[
            (r#"data: {"choices":[{"text":"a"}]}"#, 0.1),
            (
                r#"data: {"error":{"message":"boom","type":"InternalServerError"}}"#,
                0.2,
            ),
            ("data: [DONE]", 0.3),
        ]);
        assert!(!out.success);
        assert_eq!(out.error, "boom");
        let flat = feed(&[(r#"data: {"object":"error","message":"flat"}"#, 0.1)]);
        assert_eq!((flat.success, flat.error.as_str()), (false, "flat"));
        let empty = feed(&[("data: [DONE]", 0.1)]);
        assert!(!empty.success && empty.error.contains("no output"));
    }

    #[test]
    fn lines_split_across_chunks() {
        let mut b = LineBuffer::default();
        assert!(b.push(b"data: {\"a\"").is_empty());
        assert_eq!(b.push(b":1}\r\n\r\ndata: [DO"), vec!["data: {\"a\":1}", ""]);
        assert_eq!(b.push(b"NE]\n"), vec!["data: [DONE]"]);
        assert_eq!(b.push(b"tail"), Vec::<String>::new());
        assert_eq!(b.rest().as_deref(), Some("tail"));
    }

    #[test]
    fn bodies() {
        let s = Sampling {
            temperature: 0.0,
            ignore_eos: true,
        };
        let b = request_body(Api::Completions, "m", &Prompt::Ids(vec![1, 2]), 8, &s);
        assert_eq!(b["prompt"], json!([1, 2]));
        assert_eq!(b["max_tokens"], 8);
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["ignore_eos"], true);
        let b = request_body(
            Api::Chat,
            "m",
            &Prompt::Text("hi".into()),
            8,
            &Sampling {
                temperature: 0.5,
                ignore_eos: false,
            },
        );
        assert_eq!(b["messages"][0]["content"], "hi");
        assert_eq!(b["max_completion_tokens"], 8);
        assert_eq!(b["temperature"], 0.5);
        assert!(b.get("ignore_eos").is_none());
        assert_eq!(Api::from_endpoint("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(
            Api::from_endpoint("/v1/completions/"),
            Some(Api::Completions)
        );
        assert_eq!(Api::from_endpoint("/v1/embeddings"), None);
    }
}
