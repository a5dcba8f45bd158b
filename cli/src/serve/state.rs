//! What every handler shares: the server's settings, and the loaded model once it is ready.

use super::metrics::ServerGauges;
use super::parsers::{ReasoningFormat, ToolFormat};
use dayone_engine::chat_template::ChatTemplate;
use dayone_engine::json_constraint::TokenTable;
use dayone_engine::service::EngineHandle;
use dayone_engine::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Settings fixed at start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The name clients send as `model` and `/v1/models` lists (`--served-model-name`, else
    /// the model path as given).
    pub model_name: String,
    /// The model path (`/v1/models` `root`).
    pub root: String,
    /// Required as `Authorization: Bearer <key>` on `/v1/*` when set.
    pub api_key: Option<String>,
    /// Most `n` a request may ask for.
    pub max_n: usize,
    /// Most `top_logprobs` / completions `logprobs` (vLLM's `--max-logprobs`).
    pub max_logprobs: usize,
    /// Unix time the server started (`created` of `/v1/models`).
    pub created: u64,
    /// Largest request body, bytes (413 above it).
    pub max_body: usize,
    /// The model's image markup ([`dayone_engine::vision::image_markup`]); `None`: text only.
    pub image_markup: Option<&'static str>,
    /// Local image files (`file://` URLs) are read only under this directory
    /// (`--allowed-local-media-path`, canonical); `None`: refused.
    pub allowed_local_media_path: Option<std::path::PathBuf>,
}

/// The loaded model: the engine handle and what turns text into ids and back.
pub struct Loaded {
    /// The engine service.
    pub handle: EngineHandle,
    /// The tokenizer (`None`: a checkpoint without one accepts only token-id prompts).
    pub tokenizer: Option<Tokenizer>,
    /// The chat template (`None`: `/v1/chat/completions` answers 400).
    pub template: Option<ChatTemplate>,
    /// Texts of the BOS/EOS tokens for the template.
    pub bos_token: String,
    /// See `bos_token`.
    pub eos_token: String,
    /// Whether a text prompt of `/v1/completions` starts with BOS (the tokenizer's own rule).
    pub add_bos: bool,
    /// The BOS id (`add_bos`).
    pub bos_id: Option<u32>,
    /// Tool-call format (`--tool-call-parser` or picked from the model).
    pub tool_format: Option<ToolFormat>,
    /// Reasoning format (`--reasoning-parser` or picked from the model).
    pub reasoning_format: Option<ReasoningFormat>,
    /// Device memory held, for `/metrics`.
    pub gauges: ServerGauges,
    /// Every token's text, built at the first `json_object` request.
    pub json_table: OnceLock<Arc<TokenTable>>,
}

impl Loaded {
    /// Token ids of a text prompt as generation sees it: the tokenizer's special tokens when
    /// `add_special` (its post-processor's BOS), and BOS in front where `tokenizer_config.json`
    /// asks for it (`add_bos_token`) and the post-processor did not add it. `/v1/completions`
    /// and `/tokenize` share it, so a prompt's count there is the count generation uses.
    ///
    /// Errors: the tokenizer's, as text.
    pub fn encode_prompt(
        &self,
        tok: &Tokenizer,
        text: &str,
        add_special: bool,
    ) -> anyhow::Result<Vec<u32>> {
        let mut ids = tok.encode(text, add_special)?;
        if add_special && self.add_bos {
            dayone_engine::prompt::ensure_bos(&mut ids, self.bos_id);
        }
        Ok(ids)
    }
}

/// The state behind every route.
pub struct AppState {
    /// Fixed settings.
    pub settings: Settings,
    /// Set once the model has loaded; `/health` is 200 from then on.
    pub loaded: OnceLock<Loaded>,
    /// Requests refused with a 4xx/5xx status (`dayone:http_requests_rejected_total`).
    pub rejected: AtomicU64,
}

impl AppState {
    /// A server whose model is still loading.
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            loaded: OnceLock::new(),
            rejected: AtomicU64::new(0),
        }
    }

    /// Counts one refused request.
    pub fn note_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }
}
