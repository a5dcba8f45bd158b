//! The engine loop: admit requests, schedule a step, run the model, sample, stream tokens.

use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::loader::Checkpoint;
use crate::models::{load_model, CausalLm};
use crate::sampling::SamplingParams;
use crate::scheduler::{FinishReason, ScheduledChunk, Scheduler, SchedulerConfig, Sequence};
use anyhow::{bail, Result};
use dayone_backend::{Backend, DType, HostTensor, StepMeta};

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Requested float dtype for weights and activations (the backend may compute bf16 in f32).
    pub dtype: DType,
    /// Tokens the KV cache holds over all sequences; `None`: the model's context window,
    /// clamped to 4096..=65536 tokens (million-token configs do not reserve their whole window),
    /// lowered to what fits when that is more than the device can hold. Either way the cache
    /// (plus the recurrent state slots) must fit in the device's free memory after the weights
    /// are loaded, less a headroom of max(10 %, 256 MiB); a requested size that does not fit is
    /// an error. Backends that cannot report free memory are not checked.
    pub kv_cache_tokens: Option<usize>,
    /// Scheduling limits.
    pub scheduler: SchedulerConfig,
    /// Prefix caching across requests (`--no-prefix-caching` turns it off).
    pub prefix_caching: bool,
    /// Host-memory tier for evicted blocks and swapped-out sequences, in bytes (0: none).
    pub host_cache_bytes: u64,
    /// Recurrent-state checkpoints (KDA layers) every this many prompt tokens, a multiple of the
    /// block size; 0: only at the ends of prefill steps, the last block boundary of a prompt and
    /// where a prompt leaves a cached prefix.
    pub state_checkpoint_interval: usize,
    /// State checkpoint slots kept for prefix caching of recurrent layers; `None`: as many as
    /// `max_num_seqs`.
    pub state_checkpoints: Option<usize>,
    /// Caps the model's context window (`--max-model-len`); `None`: the config's window.
    pub max_model_len: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            kv_cache_tokens: None,
            scheduler: SchedulerConfig::default(),
            prefix_caching: true,
            host_cache_bytes: 0,
            state_checkpoint_interval: 0,
            state_checkpoints: None,
            max_model_len: None,
        }
    }
}

/// A token produced by a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenEvent {
    /// The sequence it belongs to.
    pub seq_id: u64,
    /// The new token id.
    pub token: u32,
    /// Set when the sequence stopped with this token: `stop` (EOS), `length` (`max_tokens`) or
    /// `context` (the context window is full); see [`FinishReason::as_str`].
    pub finish: Option<FinishReason>,
}

/// A model on a backend with its cache and scheduler.
pub struct Engine<B: Backend> {
    /// The device.
    pub backend: B,
    /// The parsed `config.json`.
    pub config: ModelConfig,
    model: Box<dyn CausalLm<B>>,
    cache: KvCache<B>,
    scheduler: Scheduler,
    eos_ids: Vec<u32>,
    next_id: u64,
    cache_bytes_per_token: usize,
    state_bytes_per_seq: usize,
    /// When set, each step's logits rows are kept in [`Engine::last_logits`] (tests, `check`).
    pub capture_logits: bool,
    /// `(sequence id, logits [V] f32)` of the last step, when `capture_logits` is set.
    pub last_logits: Vec<(u64, Vec<f32>)>,
}

impl<B: Backend> Engine<B> {
    /// Loads the model of `ckpt` onto `backend` and sizes the cache.
    ///
    /// Errors: unsupported `model_type`, bad tensors (naming file and tensor), or a cache that
    /// does not fit the device.
    pub fn new(
        backend: B,
        ckpt: &Checkpoint,
        cfg: &EngineConfig,
        progress: Option<&dyn Fn(usize, usize)>,
    ) -> Result<Self> {
        let origin = ckpt.path.join("config.json");
        let config = ModelConfig::from_json(&ckpt.config, &origin.display().to_string())?;
        if !matches!(cfg.dtype, DType::F32 | DType::BF16) {
            bail!("--dtype must be f32 or bf16, got {}", cfg.dtype);
        }
        let model = load_model(&backend, &config, ckpt, cfg.dtype, progress)?;
        let act = backend.activation_dtype(cfg.dtype);
        let bs = cfg.scheduler.block_size;
        let spec = model.cache_spec();
        // Sized after the weights are loaded, against what the device still has free.
        let num_blocks = crate::cache::cache_blocks(&crate::cache::CacheRequest {
            requested_tokens: cfg.kv_cache_tokens,
            default_tokens: config.max_context().clamp(4096, 65536),
            block_size: bs,
            bytes_per_token: spec.elements_per_token().saturating_mul(act.size()),
            largest_tensor_bytes_per_token: spec
                .largest_tensor_elements_per_token()
                .saturating_mul(act.size()),
            state_bytes_per_seq: spec.state_elements_per_seq().saturating_mul(4),
            largest_state_tensor_bytes_per_seq: spec
                .largest_state_tensor_elements_per_seq()
                .saturating_mul(4),
            state_slots: cfg.scheduler.max_num_seqs,
            free_bytes: backend.free_memory(),
            max_tensor_bytes: backend.max_buffer_bytes(),
        })?;
        let cache = KvCache::new(
            &backend,
            &model.cache_spec(),
            num_blocks,
            bs,
            act,
            cfg.scheduler.max_num_seqs,
        )?;
        let scheduler = Scheduler::new(cfg.scheduler.clone(), num_blocks)?;
        Ok(Self {
            cache_bytes_per_token: model.cache_spec().elements_per_token() * act.size(),
            state_bytes_per_seq: model.cache_spec().state_elements_per_seq() * 4,
            backend,
            config,
            model,
            cache,
            scheduler,
            eos_ids: ckpt.assets.eos_ids.clone(),
            next_id: 0,
            capture_logits: false,
            last_logits: Vec::new(),
        })
    }

    /// Bytes the cache keeps per token over all layers.
    pub fn cache_bytes_per_token(&self) -> usize {
        self.cache_bytes_per_token
    }

    /// Bytes of recurrent state (f32) each running sequence keeps over all layers.
    pub fn state_bytes_per_seq(&self) -> usize {
        self.state_bytes_per_seq
    }

    /// Token ids that stop generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Replaces the stop ids.
    pub fn set_eos_ids(&mut self, ids: Vec<u32>) {
        self.eos_ids = ids;
    }

    /// Free cache blocks (all of them once every sequence has finished).
    pub fn free_blocks(&self) -> usize {
        self.scheduler.allocator.num_free()
    }

    /// All cache blocks.
    pub fn total_blocks(&self) -> usize {
        self.scheduler.allocator.num_blocks()
    }

    /// Queues a request; returns its id.
    ///
    /// Errors: an empty prompt, a token id outside the vocabulary, a prompt that leaves no room in
    /// the context window, or one whose prompt plus `max_tokens` (clipped to the context window)
    /// the KV cache cannot hold at once.
    pub fn add_request(&mut self, prompt: Vec<u32>, params: SamplingParams) -> Result<u64> {
        params.validate()?;
        if prompt.is_empty() {
            bail!("the prompt is empty: give at least one token");
        }
        let vocab = self.config.vocab_size();
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            bail!("prompt token id {bad} is outside the vocabulary (vocab_size {vocab})");
        }
        let ctx = self.config.max_context();
        if prompt.len() >= ctx {
            bail!(
                "the prompt has {} tokens but the context window (max_position_embeddings) is {ctx}: shorten it",
                prompt.len()
            );
        }
        // Generation stops at the context window, so `max_tokens` is first clipped to it; the
        // request then needs every token but the last in the cache at once (vLLM likewise
        // refuses a request longer than its cache rather than failing mid-generation).
        let capacity = self.cache.num_blocks * self.cache.block_size;
        let room = ctx - prompt.len();
        let generated = params.max_tokens.min(room);
        let need = prompt.len() + generated - 1;
        if need > capacity {
            let gen = if generated < params.max_tokens {
                format!("{generated} generated tokens (--max-tokens clipped to the context window of {ctx})")
            } else {
                format!("--max-tokens ({generated})")
            };
            bail!(
                "prompt ({} tokens) + {gen} need {need} tokens of KV cache (all but the last token are cached) but it holds {capacity}: raise --kv-cache-tokens or lower --max-tokens",
                prompt.len()
            );
        }
        let id = self.next_id;
        self.next_id += 1;
        self.scheduler.add(Sequence::new(id, prompt, params));
        Ok(id)
    }

    /// Aborts request `id` (waiting or running): its blocks and state slot are freed at once.
    /// Returns whether it was still unfinished. Call between steps (the engine is single-threaded;
    /// [`crate::service`] serialises aborts from other threads).
    pub fn abort(&mut self, id: u64) -> Result<bool> {
        Ok(self.scheduler.abort(id)?.is_some())
    }

    /// Whether requests remain.
    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished()
    }

    /// Runs one step: schedules, runs the model over the step's tokens, samples a token for each
    /// sequence whose prompt is fully computed, and retires finished sequences.
    pub fn step(&mut self) -> Result<Vec<TokenEvent>> {
        let chunks = self.scheduler.schedule()?;
        if chunks.is_empty() {
            if self.scheduler.has_unfinished() {
                // Unreachable when every request passed `add_request`'s size check (preemption
                // frees the whole cache for the oldest sequence); reported rather than looping.
                bail!(
                    "the scheduler could not place any of {} unfinished requests ({} of {} KV cache blocks free): raise --kv-cache-tokens",
                    self.scheduler.waiting.len() + self.scheduler.running.len(),
                    self.scheduler.allocator.num_free(),
                    self.scheduler.allocator.num_blocks()
                );
            }
            return Ok(Vec::new());
        }
        let (ids, meta) = self.build_step(&chunks);
        let b = &self.backend;
        let ids = b.upload(&HostTensor::from_u32(vec![ids.len()], &ids)?)?;
        let want: Vec<usize> = chunks
            .iter()
            .filter(|c| c.wants_logits)
            .map(|c| c.index)
            .collect();
        let meta = b.upload_meta(meta)?;
        let logits = self.model.forward(b, &ids, &meta, &self.cache, None)?;
        let greedy = want
            .iter()
            .all(|&i| self.scheduler.running[i].params.is_greedy());
        let tokens: Vec<u32> = if greedy && !self.capture_logits {
            b.download(&b.argmax(&logits)?)?.to_u32()?
        } else {
            let host = b.download(&logits)?.to_f32();
            let v = host.len() / want.len().max(1);
            self.last_logits.clear();
            want.iter()
                .enumerate()
                .map(|(r, &i)| {
                    let row = &host[r * v..(r + 1) * v];
                    let seq = &mut self.scheduler.running[i];
                    if self.capture_logits {
                        self.last_logits.push((seq.id, row.to_vec()));
                    }
                    seq.sampler.sample(row, &seq.params)
                })
                .collect()
        };
        for c in &chunks {
            self.scheduler.running[c.index].num_computed += c.len;
        }
        let ctx = self.config.max_context();
        let mut events = Vec::with_capacity(want.len());
        for (&i, &token) in want.iter().zip(&tokens) {
            let seq = &mut self.scheduler.running[i];
            seq.tokens.push(token);
            let finish = if !seq.params.ignore_eos && self.eos_ids.contains(&token) {
                Some(FinishReason::Eos)
            } else if seq.generated().len() >= seq.params.max_tokens {
                Some(FinishReason::Length)
            } else if seq.tokens.len() >= ctx {
                Some(FinishReason::ContextFull)
            } else {
                None
            };
            seq.finished = finish;
            events.push(TokenEvent {
                seq_id: seq.id,
                token,
                finish,
            });
        }
        self.scheduler.reap_finished()?;
        Ok(events)
    }

    /// Token ids and metadata for the scheduled chunks.
    fn build_step(&self, chunks: &[ScheduledChunk]) -> (Vec<u32>, StepMeta) {
        let bs = self.cache.block_size;
        let running = &self.scheduler.running;
        let max_blocks = chunks
            .iter()
            .map(|c| running[c.index].blocks.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let mut ids = Vec::new();
        let mut m = StepMeta {
            max_blocks,
            block_size: bs,
            query_start: vec![0],
            ..Default::default()
        };
        for (s, c) in chunks.iter().enumerate() {
            let seq = &running[c.index];
            for pos in c.start..c.start + c.len {
                ids.push(seq.tokens[pos]);
                m.positions.push(pos as u32);
                m.token_seq.push(s as u32);
                m.slot_mapping
                    .push(seq.blocks[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            let mut row = seq.blocks.clone();
            row.resize(max_blocks, 0);
            m.block_tables.extend(row);
            let len = (c.start + c.len) as u32;
            m.seq_lens.push(len);
            m.state_slots.push(seq.slot.unwrap_or(0));
            m.max_seq_len = m.max_seq_len.max(len as usize);
            m.query_start.push(m.positions.len() as u32);
            if c.wants_logits {
                m.logit_rows.push(m.positions.len() as u32 - 1);
            }
        }
        (ids, m)
    }

    /// Runs every queued request to completion; returns the generated ids per request id order.
    pub fn run_to_completion(&mut self) -> Result<Vec<(u64, Vec<u32>)>> {
        let mut out: std::collections::BTreeMap<u64, Vec<u32>> = Default::default();
        while self.has_unfinished() {
            for e in self.step()? {
                out.entry(e.seq_id).or_default().push(e.token);
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Prefill `prompt` alone with tracing on: the hidden state `[N, D]` (f32) after the embedding
    /// and each layer (HF `output_hidden_states` order) plus the last-token logits `[V]`.
    /// Uses and then frees cache blocks; the engine must be idle.
    pub fn trace_prefill(&mut self, prompt: &[u32]) -> Result<(Vec<HostTensor>, Vec<f32>)> {
        if self.has_unfinished() {
            bail!("trace_prefill needs an idle engine");
        }
        let id = self.add_request(
            prompt.to_vec(),
            SamplingParams {
                max_tokens: 1,
                ..Default::default()
            },
        )?;
        let mut seq = self.scheduler.waiting.pop_back().expect("just added");
        debug_assert_eq!(seq.id, id);
        let Some(blocks) = self
            .scheduler
            .allocator
            .allocate(prompt.len().div_ceil(self.cache.block_size))
        else {
            bail!(
                "the prompt ({} tokens) does not fit in the free KV cache blocks",
                prompt.len()
            );
        };
        seq.blocks = blocks;
        self.scheduler.running.push(seq);
        let chunk = ScheduledChunk {
            index: self.scheduler.running.len() - 1,
            start: 0,
            len: prompt.len(),
            wants_logits: true,
        };
        let (ids, meta) = self.build_step(&[chunk]);
        let b = &self.backend;
        let ids = b.upload(&HostTensor::from_u32(vec![ids.len()], &ids)?)?;
        let meta = b.upload_meta(meta)?;
        let mut trace = Vec::new();
        let result = self
            .model
            .forward(b, &ids, &meta, &self.cache, Some(&mut trace));
        let seq = self.scheduler.running.pop().expect("pushed above");
        self.scheduler.allocator.release(&seq.blocks)?;
        let logits = b.download(&result?)?.to_f32();
        let hidden = trace
            .iter()
            .map(|t| b.download(t))
            .collect::<Result<Vec<_>>>()?;
        Ok((hidden, logits))
    }
}
