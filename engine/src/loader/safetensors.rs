//! safetensors files, single or sharded, memory-mapped.

/// Tensors from one or more safetensors files.
pub struct SafetensorsSource;
