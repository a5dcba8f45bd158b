//! dayone's engine: everything a model needs, written once against the
//! [`dayone_backend::Backend`] trait — configs mirroring `config.json`, checkpoint loaders,
//! layers, models, the paged KV cache, the scheduler and the sampler.

pub mod cache;
pub mod chat_template;
pub mod config;
pub mod default_model;
pub mod engine;
pub mod json_constraint;
pub mod layers;
pub mod loader;
pub mod metrics;
pub mod models;
pub mod needle;
pub mod parallel;
pub mod prompt;
pub mod sampling;
pub mod scheduler;
pub mod service;
pub mod serving_config;
pub mod tokenizer;
pub mod vision;
pub mod weights;

pub use engine::{Engine, EngineConfig, TokenEvent};
