//! Image inputs of the engine: the vision tower of a multimodal checkpoint, its encoder cache,
//! and each request's spliced spans. A request's images are encoded once when it is added (or
//! found in the encoder cache by content hash); each prefill chunk then takes the rows of the
//! spans it overlaps, so chunked prefill and prefix-cache hits may cut through an image's run.
//! The image hashes are extra keys of the prefix cache's block hashes
//! ([`crate::cache::prefix::ExtraKeys::items`]): equal placeholder ids with different images
//! never share KV.

use super::vision_tower::VisionTower;
use super::Engine;
use crate::config::ModelConfig;
use crate::loader::Checkpoint;
use crate::models::EmbedSplice;
use crate::sampling::SamplingParams;
use crate::scheduler::ScheduledChunk;
use crate::vision::encoder_cache::{image_hash, EncoderCache};
use crate::vision::{PreprocessedImage, RgbImage};
use anyhow::{bail, ensure, Context, Result};
use dayone_backend::{Backend, DType, HostTensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Encoder rows kept by default, in projected tokens (vLLM sizes its encoder cache the same way).
const ENCODER_CACHE_ROWS: usize = 65_536;

/// One image's span in a request's prompt and its projected rows.
struct Span {
    start: usize,
    rows: Arc<HostTensor>,
}

/// The vision side of an engine (absent for text-only models).
pub(crate) struct Media<B: Backend> {
    vision: Option<Vision<B>>,
    /// Spliced spans per request id.
    spans: HashMap<u64, Vec<Span>>,
}

struct Vision<B: Backend> {
    tower: VisionTower<B>,
    placeholder: u32,
    cache: EncoderCache,
}

impl<B: Backend> Media<B> {
    /// Loads the vision tower when `config` has one.
    pub(crate) fn load(
        b: &B,
        config: &ModelConfig,
        ckpt: &Checkpoint,
        dtype: DType,
    ) -> Result<Self> {
        let vision =
            VisionTower::load(b, config, ckpt, dtype)?.map(|(tower, placeholder)| Vision {
                tower,
                placeholder,
                cache: EncoderCache::new(ENCODER_CACHE_ROWS),
            });
        Ok(Self {
            vision,
            spans: HashMap::new(),
        })
    }

    /// The rows of the step's chunks that fall in image spans, `None` when there are none.
    /// `query_start[s]` is chunk `s`'s first row in the step.
    pub(crate) fn splice(
        &self,
        chunks: &[ScheduledChunk],
        seq_ids: &[u64],
        query_start: &[u32],
    ) -> Result<Option<EmbedSplice>> {
        if self.spans.is_empty() {
            return Ok(None);
        }
        let (mut rows, mut values, mut width) = (Vec::new(), Vec::new(), 0);
        for (s, c) in chunks.iter().enumerate() {
            let Some(spans) = self.spans.get(&seq_ids[s]) else {
                continue;
            };
            for span in spans {
                let (n, d) = (span.rows.shape[0], span.rows.shape[1]);
                width = d;
                let lo = c.start.max(span.start);
                let hi = (c.start + c.len).min(span.start + n);
                if lo >= hi {
                    continue;
                }
                let all = span.rows.f32_values();
                for pos in lo..hi {
                    rows.push(query_start[s] + (pos - c.start) as u32);
                    let r = pos - span.start;
                    values.extend_from_slice(&all[r * d..(r + 1) * d]);
                }
            }
        }
        if rows.is_empty() {
            return Ok(None);
        }
        let values = HostTensor::from_f32(vec![rows.len(), width], &values)?;
        Ok(Some(EmbedSplice { rows, values }))
    }

    /// Drops the spans of requests that no longer exist.
    pub(crate) fn retain(&mut self, alive: impl Fn(u64) -> bool) {
        self.spans.retain(|id, _| alive(*id));
    }
}

/// What [`Engine::encoder_cache_stats`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncoderCacheStats {
    /// Images answered from the encoder cache.
    pub hits: u64,
    /// Images that ran the encoder.
    pub misses: u64,
}

impl<B: Backend> Engine<B> {
    /// Whether the model takes images.
    pub fn accepts_images(&self) -> bool {
        self.media.vision.is_some()
    }

    /// The image placeholder id (`<|media_pad|>`, `<|image|>`), when the model takes images.
    pub fn image_placeholder(&self) -> Option<u32> {
        self.media.vision.as_ref().map(|v| v.placeholder)
    }

    /// Tokens an image of `height × width` pixels becomes in the prompt.
    pub fn image_tokens(&self, height: usize, width: usize) -> Option<usize> {
        self.media
            .vision
            .as_ref()
            .map(|v| v.tower.num_tokens(height, width))
    }

    /// Prompt tokens of unfinished request `id` (image placeholders expanded).
    pub fn prompt_len(&self, id: u64) -> Option<usize> {
        self.scheduler.sequence(id).map(|s| s.prompt_len)
    }

    /// Encoder-cache hits and misses so far.
    pub fn encoder_cache_stats(&self) -> EncoderCacheStats {
        self.media
            .vision
            .as_ref()
            .map(|v| EncoderCacheStats {
                hits: v.cache.hits,
                misses: v.cache.misses,
            })
            .unwrap_or_default()
    }

    /// [`Engine::add_request_with`] for a prompt with images: `prompt` holds the placeholder id
    /// ([`Engine::image_placeholder`]) once per image, in the order of `images`; each is expanded
    /// to the image's token count, the image encoded (or found in the encoder cache by content
    /// hash) and its rows spliced over the expanded run during prefill. The image hashes join
    /// `extra_keys`, so the prefix cache tells different images apart.
    ///
    /// Errors: a model without a vision tower, a placeholder count that differs from the image
    /// count, or an expanded prompt the engine refuses ([`Engine::add_request`]).
    pub fn add_request_with_images(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        mut extra_keys: crate::cache::prefix::ExtraKeys,
        images: &[RgbImage],
    ) -> Result<u64> {
        if images.is_empty() {
            return self.add_request_with(prompt, params, extra_keys);
        }
        if self.mirror.is_some() {
            // The spliced rows live on rank 0 only; the other ranks would embed placeholders.
            bail!("image inputs are not supported with several ranks (tensor or context parallelism) yet");
        }
        let b = &self.backend;
        let Some(v) = self.media.vision.as_mut() else {
            bail!(
                "this model takes no image inputs (model_type {})",
                self.config.model_type()
            );
        };
        let found = prompt.iter().filter(|&&t| t == v.placeholder).count();
        ensure!(
            found == images.len(),
            "the prompt has {found} image placeholder(s) (token {}) for {} image(s): put the model's image markup once per image",
            v.placeholder,
            images.len()
        );
        let pre: Vec<PreprocessedImage> = images.iter().map(|im| v.tower.preprocess(im)).collect();
        // The expanded length is known from the grids: refuse an over-long prompt before
        // minutes of encoder work, not after.
        let area = v.tower.merge_area();
        let image_tokens: Vec<usize> = pre.iter().map(|p| p.num_patches() / area).collect();
        let total = prompt.len() - images.len() + image_tokens.iter().sum::<usize>();
        let ctx = self.max_context;
        ensure!(
            total < ctx,
            "the prompt has {total} tokens with its image(s) ({image_tokens:?} image tokens, {} text) but the context window is {ctx}: use smaller images or a shorter prompt",
            prompt.len() - images.len()
        );
        let hashes: Vec<[u8; 32]> = pre.iter().map(image_hash).collect();
        let mut rows: Vec<Option<Arc<HostTensor>>> =
            hashes.iter().map(|h| v.cache.get(h)).collect();
        let missing: Vec<usize> = (0..pre.len()).filter(|&i| rows[i].is_none()).collect();
        if !missing.is_empty() {
            // One encoder call for every image not cached (each attends only to itself).
            let batch: Vec<PreprocessedImage> = missing.iter().map(|&i| pre[i].clone()).collect();
            let out = b.download(&v.tower.encode(b, &batch)?)?;
            let (d, all) = (out.shape[1], out.to_f32());
            let area = v.tower.merge_area();
            let mut at = 0;
            for &i in &missing {
                let n = pre[i].num_patches() / area;
                let t = Arc::new(HostTensor::from_f32(
                    vec![n, d],
                    &all[at * d..(at + n) * d],
                )?);
                at += n;
                v.cache.insert(hashes[i], t.clone());
                rows[i] = Some(t);
            }
        }
        let mut expanded = Vec::with_capacity(prompt.len());
        let mut spans = Vec::with_capacity(images.len());
        let mut next = 0;
        for &t in &prompt {
            if t != v.placeholder {
                expanded.push(t);
                continue;
            }
            let r = rows[next].clone().context("encoder rows")?;
            let n = r.shape[0];
            extra_keys
                .items
                .push((expanded.len(), expanded.len() + n, hashes[next]));
            spans.push(Span {
                start: expanded.len(),
                rows: r,
            });
            expanded.extend(std::iter::repeat_n(t, n));
            next += 1;
        }
        let id = self.add_request_with(expanded, params, extra_keys)?;
        self.media.spans.insert(id, spans);
        Ok(id)
    }
}
