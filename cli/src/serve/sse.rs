//! Streaming a [`Run`] as server-sent events, in the order OpenAI clients expect (serving.md
//! §A3): a first chunk per choice (chat: `role`), content / reasoning / tool-call deltas, a
//! finish chunk per choice, the usage chunk with `choices: []` when asked, `data: [DONE]`.
//! Every chunk carries the same id. A comment line keeps the connection alive during a long
//! prefill. An engine failure after the stream started goes out as one `{"error": ...}` event
//! before `[DONE]`. A client that disconnects drops the stream, which drops the run, which
//! aborts its requests.

use super::session::{ChoiceUpdate, Run, Usage};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::Stream;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// How one endpoint spells its chunks.
pub trait ChunkShape: Send + 'static {
    /// `object` of each chunk (`chat.completion.chunk`, `text_completion`).
    const OBJECT: &'static str;
    /// The choice object of choice `index`'s opening chunk (chat: the role), if any.
    fn opening(&self, index: usize) -> Option<Value>;
    /// The choice object for an update, or `None` when it has nothing to send.
    fn choice(&mut self, update: &ChoiceUpdate) -> Option<Value>;
}

/// The envelope every chunk shares.
pub struct Envelope {
    /// `chatcmpl-…` / `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// `prompt_token_ids` for the first chunk (with `return_token_ids`).
    pub prompt_token_ids: Option<Vec<u32>>,
}

impl Envelope {
    fn chunk(&self, object: &str, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            c["usage"] = u;
        }
        c
    }
}

/// The usage object (`prompt_tokens_details.cached_tokens`, and the reasoning tokens when
/// there were any).
pub fn usage_json(u: &Usage) -> Value {
    let mut v = json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    });
    if u.reasoning_tokens > 0 {
        v["completion_tokens_details"] = json!({"reasoning_tokens": u.reasoning_tokens});
    }
    v
}

/// Streams `run` as SSE.
pub fn respond<S: ChunkShape>(
    mut run: Run,
    mut shape: S,
    env: Envelope,
    include_usage: bool,
    continuous_usage: bool,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let send = |v: Value| Event::default().data(v.to_string());
        let usage_now = |run: &Run| continuous_usage.then(|| usage_json(&run.usage()));
        let mut env = env;
        for i in 0..run.n() {
            if let Some(c) = shape.opening(i) {
                let mut chunk = env.chunk(S::OBJECT, vec![c], usage_now(&run));
                if let Some(ids) = env.prompt_token_ids.take() {
                    chunk["prompt_token_ids"] = json!(ids);
                }
                if tx.send(send(chunk)).await.is_err() {
                    return;
                }
            }
        }
        loop {
            let next = tokio::select! {
                n = run.next() => n,
                // The client went away while the engine had nothing to say (a long prefill).
                _ = tx.closed() => return,
            };
            let Some(update) = next else { break };
            let event = match update {
                Ok(u) => match shape.choice(&u) {
                    Some(c) => {
                        let mut chunk = env.chunk(S::OBJECT, vec![c], usage_now(&run));
                        if let Some(ids) = env.prompt_token_ids.take() {
                            chunk["prompt_token_ids"] = json!(ids);
                        }
                        send(chunk)
                    }
                    None => continue,
                },
                Err(e) => {
                    let _ = tx.send(send(e.body())).await;
                    let _ = tx.send(Event::default().data("[DONE]")).await;
                    return;
                }
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
        if include_usage {
            let chunk = env.chunk(S::OBJECT, Vec::new(), Some(usage_json(&run.usage())));
            if tx.send(send(chunk)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    let stream = futures_util::StreamExt::map(ReceiverStream::new(rx), Ok::<Event, Infallible>);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
