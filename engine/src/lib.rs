//! dayone's engine: everything a model needs, written once against the
//! [`dayone_backend::Backend`] trait — configs mirroring `config.json`, checkpoint loaders,
//! layers, models, the paged KV cache, the scheduler and the sampler.

pub mod chat_template;
pub mod default_model;
pub mod loader;
pub mod tokenizer;
