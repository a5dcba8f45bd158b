//! Kernel table and the pipeline cache (one pipeline and bind-group layout per kernel).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Bytes of uniform parameters every kernel may read (binding 0, dynamic offset).
pub(crate) const PARAM_BYTES: u64 = 64;

/// How a kernel binds one storage buffer.
#[derive(Clone, Copy)]
pub(crate) enum Access {
    Read,
    Write,
}
use Access::{Read as R, Write as W};

/// A compute kernel: its shader source, entry point and storage bindings `1..`.
pub(crate) struct Spec {
    pub(crate) source: &'static str,
    pub(crate) file: &'static str,
    pub(crate) entry: &'static str,
    pub(crate) access: &'static [Access],
}

const ELEMENTWISE: &str = include_str!("../shaders/elementwise.wgsl");
const EMBEDDING: &str = include_str!("../shaders/embedding.wgsl");
const NORM: &str = include_str!("../shaders/norm.wgsl");
const ROPE: &str = include_str!("../shaders/rope.wgsl");
const ARGMAX: &str = include_str!("../shaders/argmax.wgsl");
const MATMUL: &str = include_str!("../shaders/matmul.wgsl");
const MATMUL_SCALAR: &str = include_str!("../shaders/matmul_scalar.wgsl");
const MATMUL_BF16: &str = include_str!("../shaders/matmul_bf16.wgsl");
const EMBEDDING_BF16: &str = include_str!("../shaders/embedding_bf16.wgsl");
const CONVERT: &str = include_str!("../shaders/convert.wgsl");
const KV_CACHE: &str = include_str!("../shaders/kv_cache.wgsl");
const ATTENTION_LANES: &str = include_str!("../shaders/attention_paged_lanes.wgsl");
const ATTENTION: &str = include_str!("../shaders/attention_paged.wgsl");
const ATTENTION_VARLEN: &str = include_str!("../shaders/attention_varlen.wgsl");
const HEAD_LINEAR: &str = include_str!("../shaders/head_linear.wgsl");
const WRITE_CACHE: &str = include_str!("../shaders/write_cache.wgsl");
const MLA_LANES: &str = include_str!("../shaders/mla_attention_lanes.wgsl");
const MLA: &str = include_str!("../shaders/mla_attention.wgsl");
const MOE_ROUTE: &str = include_str!("../shaders/moe_route.wgsl");
const MOE_ACT: &str = include_str!("../shaders/moe_act.wgsl");
const MOE_DOWN: &str = include_str!("../shaders/moe_down.wgsl");
const SHORT_CONV: &str = include_str!("../shaders/short_conv.wgsl");
const GATED_NORM: &str = include_str!("../shaders/gated_norm.wgsl");
const KDA_PREP: &str = include_str!("../shaders/kda_prep.wgsl");
const KDA_RECURRENT: &str = include_str!("../shaders/kda_recurrent.wgsl");
const KDA_CHUNK_PREP: &str = include_str!("../shaders/kda_chunk_prep.wgsl");
const KDA_CHUNK_STATE: &str = include_str!("../shaders/kda_chunk_state.wgsl");
const LAYER_NORM: &str = include_str!("../shaders/layer_norm.wgsl");
const DSA_TOPK: &str = include_str!("../shaders/dsa_topk.wgsl");
const DSA_SELECT: &str = include_str!("../shaders/dsa_select.wgsl");
const QUANT: &str = include_str!("../shaders/quant.wgsl");
const STREAM_MIX: &str = include_str!("../shaders/stream_mix.wgsl");

macro_rules! spec {
    ($name:ident, $src:ident, $file:literal, $entry:literal, [$($a:ident),*]) => {
        pub(crate) const $name: Spec =
            Spec { source: $src, file: $file, entry: $entry, access: &[$($a),*] };
    };
}

spec!(ADD, ELEMENTWISE, "elementwise.wgsl", "add", [R, R, W]);
spec!(
    STREAM_MIX_K,
    STREAM_MIX,
    "stream_mix.wgsl",
    "stream_mix",
    [R, R, W]
);
spec!(
    SILU_MUL,
    ELEMENTWISE,
    "elementwise.wgsl",
    "silu_mul",
    [R, R, W]
);
spec!(
    SILU_MUL_LIMIT,
    ELEMENTWISE,
    "elementwise.wgsl",
    "silu_mul_limit",
    [R, R, W]
);
spec!(GELU, ELEMENTWISE, "elementwise.wgsl", "gelu", [R, R, W]);
spec!(
    GELU_TANH,
    ELEMENTWISE,
    "elementwise.wgsl",
    "gelu_tanh",
    [R, R, W]
);
spec!(DEQUANT, QUANT, "quant.wgsl", "dequant", [R, R, R, R, W]);
spec!(MATVEC_Q, QUANT, "quant.wgsl", "matvec", [R, R, R, R, W]);
spec!(
    MATVEC_Q_SEQ,
    QUANT,
    "quant.wgsl",
    "matvec_seq",
    [R, R, R, R, W]
);
spec!(EMBED, EMBEDDING, "embedding.wgsl", "embedding", [R, R, W]);
spec!(RMS_NORM, NORM, "norm.wgsl", "rms_norm", [R, R, W]);
spec!(
    ADD_RMS_NORM,
    NORM,
    "norm.wgsl",
    "add_rms_norm",
    [R, R, W, R, W]
);
spec!(ROPE_K, ROPE, "rope.wgsl", "rope", [R, R, R, W]);
spec!(ARGMAX_K, ARGMAX, "argmax.wgsl", "argmax", [R, W]);
spec!(MATVEC_V4, MATMUL, "matmul.wgsl", "matvec_v4", [R, R, R, W]);
spec!(MATMUL_V4, MATMUL, "matmul.wgsl", "matmul_v4", [R, R, R, W]);
spec!(MATVEC_WG, MATMUL, "matmul.wgsl", "matvec_wg", [R, R, R, W]);
spec!(
    MATVEC_B16,
    MATMUL_BF16,
    "matmul_bf16.wgsl",
    "matvec_b16",
    [R, R, R, W]
);
spec!(
    MATMUL_B16,
    MATMUL_BF16,
    "matmul_bf16.wgsl",
    "matmul_b16",
    [R, R, R, W]
);
spec!(
    MATVEC_WG_B16,
    MATMUL_BF16,
    "matmul_bf16.wgsl",
    "matvec_wg_b16",
    [R, R, R, W]
);
spec!(
    EMBED_B16,
    EMBEDDING_BF16,
    "embedding_bf16.wgsl",
    "embedding_b16",
    [R, R, W]
);
spec!(
    ATTN_LANES,
    ATTENTION_LANES,
    "attention_paged_lanes.wgsl",
    "paged_attention_lanes",
    [R, R, R, R, R, R, W, R]
);
spec!(BF16_TO_F32, CONVERT, "convert.wgsl", "bf16_to_f32", [R, W]);
spec!(
    MATMUL_S,
    MATMUL_SCALAR,
    "matmul_scalar.wgsl",
    "matmul_s",
    [R, R, R, W]
);
spec!(WRITE_KV, KV_CACHE, "kv_cache.wgsl", "write_kv", [R, R, W]);
spec!(
    ATTN,
    ATTENTION,
    "attention_paged.wgsl",
    "paged_attention",
    [R, R, R, R, R, R, W, R]
);

spec!(
    HEAD_LINEAR_LANES,
    HEAD_LINEAR,
    "head_linear.wgsl",
    "head_linear_lanes",
    [R, R, W]
);
spec!(
    HEAD_LINEAR_WG,
    HEAD_LINEAR,
    "head_linear.wgsl",
    "head_linear_wg",
    [R, R, W]
);
spec!(
    WRITE_CACHE_K,
    WRITE_CACHE,
    "write_cache.wgsl",
    "write_cache",
    [R, R, W]
);
spec!(
    MLA_ATTN_LANES,
    MLA_LANES,
    "mla_attention_lanes.wgsl",
    "mla_attention_lanes",
    [R, R, R, R, R, R, W]
);
spec!(
    ATTN_VARLEN,
    ATTENTION_VARLEN,
    "attention_varlen.wgsl",
    "attention_varlen",
    [R, R, R, R, R, R, W, W]
);
spec!(
    MLA_ATTN,
    MLA,
    "mla_attention.wgsl",
    "mla_attention",
    [R, R, R, R, R, R, R, W]
);
spec!(
    MOE_ROUTE_K,
    MOE_ROUTE,
    "moe_route.wgsl",
    "moe_route",
    [R, R, W, W]
);
spec!(
    MOE_ACT_LANES,
    MOE_ACT,
    "moe_act.wgsl",
    "moe_act_lanes",
    [R, R, R, W, R]
);
spec!(
    MOE_ACT_WG,
    MOE_ACT,
    "moe_act.wgsl",
    "moe_act_wg",
    [R, R, R, W, R]
);
spec!(
    MOE_DOWN_LANES,
    MOE_DOWN,
    "moe_down.wgsl",
    "moe_down_lanes",
    [R, R, R, R, W, R]
);
spec!(
    MOE_DOWN_WG,
    MOE_DOWN,
    "moe_down.wgsl",
    "moe_down_wg",
    [R, R, R, R, W, R]
);

spec!(
    SHORT_CONV_K,
    SHORT_CONV,
    "short_conv.wgsl",
    "short_conv",
    [R, R, W, R, R, W]
);
spec!(
    SHORT_CONV_STATE,
    SHORT_CONV,
    "short_conv.wgsl",
    "short_conv_state",
    [R, R, W, R, R, W]
);
spec!(
    GATED_RMS_NORM,
    GATED_NORM,
    "gated_norm.wgsl",
    "gated_rms_norm",
    [R, R, R, W]
);
spec!(
    KDA_PREP_K,
    KDA_PREP,
    "kda_prep.wgsl",
    "kda_prep",
    [R, R, R, R, R, W, W, W]
);
spec!(
    KDA_RECURRENT_K,
    KDA_RECURRENT,
    "kda_recurrent.wgsl",
    "kda_recurrent",
    [R, R, R, R, R, W, R, W]
);
spec!(
    KDA_CHUNK_PREP_K,
    KDA_CHUNK_PREP,
    "kda_chunk_prep.wgsl",
    "kda_chunk_prep",
    [R, R, R, R, R, R, W]
);
spec!(
    KDA_CHUNK_STATE_K,
    KDA_CHUNK_STATE,
    "kda_chunk_state.wgsl",
    "kda_chunk_state",
    [R, R, W, W]
);

spec!(
    LAYER_NORM_K,
    LAYER_NORM,
    "layer_norm.wgsl",
    "layer_norm",
    [R, R, R, W]
);
spec!(
    DSA_SCORE,
    DSA_TOPK,
    "dsa_topk.wgsl",
    "dsa_score",
    [R, R, R, R, R, R, W]
);
spec!(
    DSA_SELECT_K,
    DSA_SELECT,
    "dsa_select.wgsl",
    "dsa_select",
    [R, R, W]
);

/// A compiled kernel.
pub(crate) struct Kernel {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// Lazily compiled kernels, keyed by file and entry point; shader modules are shared per file.
pub(crate) struct Pipelines {
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    kernels: Mutex<HashMap<KernelKey, Arc<Kernel>>>,
}

/// File and entry point.
type KernelKey = (&'static str, &'static str);

impl Pipelines {
    pub(crate) fn new() -> Self {
        Self {
            modules: Mutex::new(HashMap::new()),
            kernels: Mutex::new(HashMap::new()),
        }
    }

    /// The compiled kernel `spec` (compiled on first use).
    pub(crate) fn get(&self, device: &wgpu::Device, spec: &Spec) -> Arc<Kernel> {
        let key: KernelKey = (spec.file, spec.entry);
        let mut kernels = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kernels.get(&key) {
            return k.clone();
        }
        let module = {
            let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            modules
                .entry(spec.file)
                .or_insert_with(|| {
                    device.create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(spec.file),
                        source: wgpu::ShaderSource::Wgsl(spec.source.into()),
                    })
                })
                .clone()
        };
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: None,
            },
            count: None,
        }];
        for (i, a) in spec.access.iter().enumerate() {
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage {
                        read_only: matches!(a, Access::Read),
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            });
        }
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(spec.entry),
            entries: &entries,
        });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(spec.entry),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(spec.entry),
            layout: Some(&pl),
            module: &module,
            entry_point: Some(spec.entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let k = Arc::new(Kernel { pipeline, layout });
        kernels.insert(key, k.clone());
        k
    }
}
