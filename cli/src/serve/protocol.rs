//! Request fields of the OpenAI API (chat and completions) and their checks, turned into what
//! the engine runs ([`GenSpec`]). Unknown fields are ignored (OpenAI clients send them; vLLM
//! ignores them too); a known field with a wrong type or value is a 400 naming the field.

use super::errors::ApiError;
use super::state::Settings;
use dayone_engine::sampling::SamplingParams;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

/// Deserializes `T` from the body's JSON; a wrong type names its field (`param`).
pub fn fields<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        ApiError {
            param: param.clone(),
            ..ApiError::bad_request(match param {
                Some(p) => format!("{p}: {}", e.inner()),
                None => format!("the body must be a JSON object: {}", e.inner()),
            })
        }
    })
}

/// Parses the raw body: valid UTF-8 JSON object (serde_json rejects invalid UTF-8 and nesting
/// deeper than 128 levels).
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes)?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    Ok(v)
}

/// `stop`: one string or a list of them.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct StreamOptions {
    /// Send a usage chunk (`choices: []`) before `[DONE]`.
    pub include_usage: Option<bool>,
    /// Put `usage` on every chunk.
    pub continuous_usage_stats: Option<bool>,
}

/// The sampling and output fields chat and completions share.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct Common {
    /// The served model's name (404 when it is another).
    pub model: Option<String>,
    /// Most tokens to generate (chat: deprecated by `max_completion_tokens`, which wins).
    pub max_tokens: Option<u64>,
    /// Most tokens to generate (chat).
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature, 0..=2 (0 = greedy); default 1 (OpenAI's).
    pub temperature: Option<f64>,
    /// Nucleus mass, (0, 1].
    pub top_p: Option<f64>,
    /// Keep the k most likely (−1 or 0 = all; vLLM's extension).
    pub top_k: Option<i64>,
    /// Min-p, 0..=1.
    pub min_p: Option<f64>,
    /// −2..=2.
    pub presence_penalty: Option<f64>,
    /// −2..=2.
    pub frequency_penalty: Option<f64>,
    /// > 0 (1 = off).
    pub repetition_penalty: Option<f64>,
    /// Seed of the sampler (choice i uses seed + i).
    pub seed: Option<i64>,
    /// Stop strings (not included in the output).
    pub stop: Option<Stop>,
    /// Token ids that also stop generation.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Completions per prompt.
    pub n: Option<u64>,
    /// Stream the answer as server-sent events.
    pub stream: Option<bool>,
    /// Usage reporting of a stream.
    pub stream_options: Option<StreamOptions>,
    /// Keep generating past EOS.
    pub ignore_eos: Option<bool>,
    /// Drop special tokens from the text (default true).
    pub skip_special_tokens: Option<bool>,
    /// Keep the matched stop string in the text.
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM's extension: the answer carries `prompt_token_ids` and each choice's `token_ids`.
    pub return_token_ids: Option<bool>,
    /// Keeps this request's prefix-cache entries apart (one salt per tenant).
    pub cache_salt: Option<String>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`.
    pub response_format: Option<Value>,
    /// Minimum tokens before EOS may stop the answer (only 0 is supported).
    pub min_tokens: Option<u64>,
    /// `{"token id": bias}`, bias in [−100, 100], added to the logits before sampling.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
}

/// Everything the engine needs to run one request (all its choices).
#[derive(Debug, Clone)]
pub struct GenSpec {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling of choice 0 (choice i: seed + i).
    pub params: SamplingParams,
    /// Number of choices.
    pub n: usize,
    /// Stop strings.
    pub stops: Vec<String>,
    /// Keep the matched stop string in the text.
    pub include_stop_str: bool,
    /// Drop special tokens from the text.
    pub skip_special: bool,
    /// Server-sent events.
    pub stream: bool,
    /// Usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Usage on every chunk.
    pub continuous_usage: bool,
    /// Token ids in the answer.
    pub return_token_ids: bool,
    /// Prefix-cache salt.
    pub cache_salt: Option<String>,
    /// `response_format: json_object`: the answer is constrained to one JSON object.
    pub json_object: bool,
    /// `logit_bias`, checked: (token id, bias).
    pub logit_bias: Vec<(u32, f32)>,
    /// Images of the prompt (chat `image_url` parts), in placeholder order.
    pub images: Vec<std::sync::Arc<dayone_engine::vision::RgbImage>>,
}

fn range(name: &str, v: Option<f64>, lo: f64, hi: f64, default: f64) -> Result<f32, ApiError> {
    let x = v.unwrap_or(default);
    if !(x.is_finite() && (lo..=hi).contains(&x)) {
        // A bound of f64::MIN_POSITIVE means "above 0"; f64::MAX "no upper bound".
        let low = if lo == f64::MIN_POSITIVE {
            "(0".to_string()
        } else {
            format!("[{lo}")
        };
        let high = if hi == f64::MAX {
            "∞)".to_string()
        } else {
            format!("{hi}]")
        };
        return Err(ApiError::bad_field(
            name,
            format!("{name} must be in {low}, {high}, got {x}"),
        ));
    }
    Ok(x as f32)
}

impl Common {
    /// Checks `model` against the served name: 404 for another model.
    pub fn check_model(&self, settings: &Settings) -> Result<(), ApiError> {
        match &self.model {
            Some(m) if *m != settings.model_name => Err(ApiError {
                param: Some("model".into()),
                ..ApiError::new(
                    axum::http::StatusCode::NOT_FOUND,
                    format!(
                        "The model `{m}` does not exist: this server serves `{}`",
                        settings.model_name
                    ),
                )
            }),
            _ => Ok(()),
        }
    }

    /// The engine's run of `prompt` under these fields; `max_context` is the model's window.
    /// Errors (400): out-of-range values, a prompt that leaves no room to generate (both
    /// numbers in the message, as vLLM words it), `max_tokens` past the window, unsupported
    /// `response_format` or `min_tokens`.
    pub fn spec(
        &self,
        prompt: Vec<u32>,
        max_context: usize,
        settings: &Settings,
        max_tokens_field: &str,
        default_max_tokens: Option<usize>,
    ) -> Result<GenSpec, ApiError> {
        if prompt.is_empty() {
            return Err(ApiError::bad_field(
                "prompt",
                "the prompt is empty: give at least one token",
            ));
        }
        if prompt.len() >= max_context {
            return Err(ApiError::bad_field(
                "input_tokens",
                format!(
                    "This model's maximum context length is {max_context} tokens. However, your prompt contains {} input tokens, which leaves no room for any output. Please reduce the length of the input.",
                    prompt.len()
                ),
            ));
        }
        let room = max_context - prompt.len();
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => default_max_tokens.unwrap_or(room).min(room),
            Some(0) => {
                return Err(ApiError::bad_field(
                    max_tokens_field,
                    format!("{max_tokens_field} must be at least 1"),
                ))
            }
            Some(m) if m > room as u64 => {
                return Err(ApiError::bad_field(
                    max_tokens_field,
                    format!(
                        "{max_tokens_field} is too large: {m}. This model's maximum context length is {max_context} tokens and your request has {} input tokens ({max_tokens_field} must be at most {room}).",
                        prompt.len()
                    ),
                ))
            }
            Some(m) => m as usize,
        };
        let n = self.n.unwrap_or(1);
        if n == 0 || n > settings.max_n as u64 {
            return Err(ApiError::bad_field(
                "n",
                format!("n must be in [1, {}], got {n}", settings.max_n),
            ));
        }
        if self.min_tokens.unwrap_or(0) > 0 {
            return Err(ApiError::bad_field(
                "min_tokens",
                "min_tokens is not supported yet: only 0",
            ));
        }
        let json_object = check_response_format(self.response_format.as_ref())?;
        let mut logit_bias = Vec::new();
        for (k, &b) in self.logit_bias.iter().flatten() {
            let id = k.parse::<u32>().map_err(|_| {
                ApiError::bad_field(
                    "logit_bias",
                    format!("logit_bias keys are token ids, got '{k}'"),
                )
            })?;
            if !(-100.0..=100.0).contains(&b) {
                return Err(ApiError::bad_field(
                    "logit_bias",
                    format!("logit_bias values must be in [-100, 100], got {b} for token {id}"),
                ));
            }
            logit_bias.push((id, b as f32));
        }
        let temperature = range("temperature", self.temperature, 0.0, 2.0, 1.0)?;
        let top_p = range("top_p", self.top_p, f64::MIN_POSITIVE, 1.0, 1.0)?;
        let min_p = range("min_p", self.min_p, 0.0, 1.0, 0.0)?;
        let presence = range("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?;
        let frequency = range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, 0.0)?;
        let repetition = range(
            "repetition_penalty",
            self.repetition_penalty,
            f64::MIN_POSITIVE,
            f64::MAX,
            1.0,
        )?;
        let top_k = match self.top_k.unwrap_or(0) {
            k if (-1..=0).contains(&k) => 0,
            k if k > 0 => k as usize,
            k => {
                return Err(ApiError::bad_field(
                    "top_k",
                    format!("top_k must be -1 (all), 0 (all) or positive, got {k}"),
                ))
            }
        };
        // No seed: a fresh one per request, so sampled answers differ between requests.
        let seed = self.seed.map_or_else(rand::random::<u64>, |s| s as u64);
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let params = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty: repetition,
            presence_penalty: presence,
            frequency_penalty: frequency,
            seed,
            max_tokens,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            logprobs: None,
        };
        let opts = self.stream_options.clone().unwrap_or_default();
        Ok(GenSpec {
            prompt,
            params,
            n: n as usize,
            stops,
            include_stop_str: self.include_stop_str_in_output.unwrap_or(false),
            skip_special: self.skip_special_tokens.unwrap_or(true),
            stream: self.stream.unwrap_or(false),
            include_usage: opts.include_usage.unwrap_or(false),
            continuous_usage: opts.continuous_usage_stats.unwrap_or(false),
            return_token_ids: self.return_token_ids.unwrap_or(false),
            cache_salt: self.cache_salt.clone(),
            json_object,
            logit_bias,
            images: Vec::new(),
        })
    }
}

/// `response_format`: `text` runs as usual (`false`); `json_object` constrains the answer to
/// one JSON object (`true`); `json_schema` would need a schema compiler, which dayone does not
/// have, so it is refused (400) rather than ignored.
fn check_response_format(rf: Option<&Value>) -> Result<bool, ApiError> {
    let Some(rf) = rf.filter(|v| !v.is_null()) else {
        return Ok(false);
    };
    let kind = rf.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_field(
            "response_format.type",
            "response_format needs a string `type`: text, json_object or json_schema",
        )
    })?;
    match kind {
        "text" => Ok(false),
        "json_object" => Ok(true),
        "json_schema" => Err(ApiError::bad_field(
            "response_format",
            "response_format json_schema is not supported: dayone constrains output to JSON (json_object) but cannot enforce a schema",
        )),
        other => Err(ApiError::bad_field(
            "response_format.type",
            format!("unknown response_format type '{other}': expected text, json_object or json_schema"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            image_markup: None,
            allowed_local_media_path: None,
            model_name: "m".into(),
            root: "m".into(),
            api_key: None,
            max_n: 16,
            max_logprobs: 20,
            max_body: 1 << 20,
            created: 0,
        }
    }

    fn common(v: Value) -> Result<Common, ApiError> {
        fields(&v)
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = common(serde_json::json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = common(serde_json::json!({"max_tokens": -3})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn limits_and_defaults() {
        let s = settings();
        let c = common(serde_json::json!({})).unwrap();
        let g = c.spec(vec![1, 2, 3], 10, &s, "max_tokens", None).unwrap();
        assert_eq!(g.params.max_tokens, 7, "defaults to the room left");
        assert_eq!(g.params.temperature, 1.0);
        let e = c.spec(vec![1; 10], 10, &s, "max_tokens", None).unwrap_err();
        assert!(e.message.contains("10 tokens") && e.message.contains("10 input tokens"));
        let c = common(serde_json::json!({"max_tokens": 1_000_000_000_000u64})).unwrap();
        let e = c.spec(vec![1], 10, &s, "max_tokens", None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let c = common(serde_json::json!({"n": 1_000_000})).unwrap();
        assert_eq!(
            c.spec(vec![1], 10, &s, "max_tokens", None)
                .unwrap_err()
                .param
                .as_deref(),
            Some("n")
        );
        let c = common(serde_json::json!({"temperature": -1})).unwrap();
        assert!(c.spec(vec![1], 10, &s, "max_tokens", None).is_err());
        let c = common(serde_json::json!({"response_format": {"type": "json_schema"}})).unwrap();
        assert!(c.spec(vec![1], 10, &s, "max_tokens", None).is_err());
        let c = common(serde_json::json!({"max_completion_tokens": 2, "max_tokens": 5})).unwrap();
        assert_eq!(
            c.spec(vec![1], 10, &s, "max_tokens", None)
                .unwrap()
                .params
                .max_tokens,
            2
        );
    }
}
