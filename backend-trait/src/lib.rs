//! The contract between dayone's model code and its compute backends.
//!
//! Model, scheduler and cache code in `dayone-engine` is written once against [`Backend`]; the WGSL
//! backend (`dayone-wgsl`) and the CUDA backend (`dayone-cuda`) implement it. Backends know tensor
//! ops, never models. Per-step metadata (positions, slot mapping, block tables) travels in
//! [`StepMeta`], apart from weights.

mod backend;
mod batch;
mod dtype;

pub use backend::{
    batch_invariant_from_env, gated_rms_norm_then_linear, host_available_memory,
    kda_from_projections_each, linear_then_add_rms_norm, moe_experts_then_shared,
    rms_norm_then_moe_route, rope_then_write_kv, short_conv_each, AttentionOptions, Backend,
    ExpertAct, ExpertOptions, KdaProjections, MoeRouting, NormedProjections, NormedRoute, RopeArgs,
    RopeStyle, TensorInfo,
};
pub use batch::{DeviceStepMeta, StepMeta};
pub use dtype::{DType, HostTensor};
pub use host_rows::{HostMem, HostRow};
pub use quant::{QuantFormat, QuantHost, QuantTensor};
pub use varlen::{DeviceVarlenMeta, VarlenMeta, VarlenResult};

pub mod comm;
pub mod comm_tcp;
pub mod conformance;
pub mod conformance_ext;
pub mod conformance_invariance;
pub mod conformance_quant;
pub mod conformance_varlen;
pub mod conformance_vision;
pub mod cpu;
pub mod host_copy;
pub mod host_rows;
pub mod quant;
pub mod quant_moe;
pub mod reference;
#[cfg(test)]
mod reference_tests;
pub mod rows;
pub mod varlen;
