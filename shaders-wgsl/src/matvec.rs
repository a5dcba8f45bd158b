//! Decode matvec variants for packed-bf16 weights on GPU adapters (`linear` with M ≤ 16).
//!
//! A batch-1 decode step is a chain of matvecs that should run at memory bandwidth; how close
//! a kernel comes depends on the device (loads in flight per thread, workgroup size, reduction
//! cost), so the kernel is chosen by name ([`MATVEC_ENV`], [`crate::Options::matvec`] or
//! [`crate::WgslBackend::set_matvec`]) among generated variants, to be swept on the target GPU.
//!
//! Every variant computes, per workgroup, `R` outputs (rows of `w`) for a tile of up to 4
//! tokens: its `T` invocations stride along K with 16-byte loads (8 bf16 weights), `U` such
//! loads per row in flight per loop step, f32 accumulation, then a workgroup reduction per
//! token: a shared-memory tree (`log2 T` barriers) or, with `sg`, `subgroupAdd` and one barrier
//! (only where the adapter has [`wgpu::Features::SUBGROUP`]; else the tree twin runs). A token's
//! sums are formed in the same order whatever the other tokens of its tile, so a row's result
//! does not depend on the step's M (batch invariance of the decode path).
//!
//! The same generator writes two fused forms of each variant for the decode projections
//! ([`Kind`]): `linear_many` of 2 ..= [`MANY_MAX`] weights in one dispatch (a tile table picks
//! each workgroup's part) and `linear_silu_mul` (gate and up rows per workgroup, `silu(g)·u`
//! stored). Their loops and reductions are the single kernel's code, so every sum is formed in
//! the same order and the results are bit-equal to the unfused calls.
//!
//! Names: `r{R}t{T}u{U}[sg]`, e.g. `r4t128u2sg`; `wg64` is the original hand-written kernel
//! (`matvec_wg_b16` in `matmul_bf16.wgsl`: R = 4, T = 64, U = 1, tree). Kernel entry points (the
//! names the profiler prints) are `matvec_b16_<name>`, and `matvec_wg_b16` for `wg64`.

use crate::pipelines::{Access, Spec};
use std::sync::OnceLock;

/// Environment variable choosing the decode matvec variant by name (read once at backend
/// creation), e.g. `DAYONE_WGSL_MATVEC=wg64`; see [`matvec_variants`].
pub const MATVEC_ENV: &str = "DAYONE_WGSL_MATVEC";

/// The variant used when none is chosen (a guess until swept on the target GPU); its tree twin
/// (no `sg`) where the adapter has no subgroups.
pub const MATVEC_DEFAULT: &str = "r4t128u2sg";

/// One generated kernel's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Variant {
    /// Outputs (rows of `w`) per workgroup: 4 or 8.
    pub(crate) rows: u32,
    /// Invocations per workgroup.
    pub(crate) threads: u32,
    /// 16-byte loads per row in flight per loop step.
    pub(crate) unroll: u32,
    /// `subgroupAdd` reduction (needs [`wgpu::Features::SUBGROUP`]).
    pub(crate) subgroup: bool,
    /// False for the hand-written `matvec_wg_b16`.
    pub(crate) generated: bool,
}

const ROWS: [u32; 2] = [4, 8];
const THREADS: [u32; 3] = [64, 128, 256];
const UNROLL: [u32; 2] = [1, 2];
/// Generated variants (the legacy `wg64` is index 0 of [`variants`]).
const NGEN: usize = ROWS.len() * THREADS.len() * UNROLL.len() * 2;

/// A named variant: `name` for selection, `entry` its kernel's entry point (and the name the
/// profiler reports, `DAYONE_WGSL_PROFILE=1`).
pub(crate) struct Named {
    pub(crate) name: String,
    pub(crate) entry: String,
    pub(crate) v: Variant,
}

/// All variants; index 0 is `wg64`.
pub(crate) fn variants() -> &'static [Named] {
    static V: OnceLock<Vec<Named>> = OnceLock::new();
    V.get_or_init(|| {
        let mut v = vec![Named {
            name: "wg64".to_string(),
            entry: crate::pipelines::MATVEC_WG_B16.entry.to_string(),
            v: Variant {
                rows: 4,
                threads: 64,
                unroll: 1,
                subgroup: false,
                generated: false,
            },
        }];
        for &rows in &ROWS {
            for &threads in &THREADS {
                for &unroll in &UNROLL {
                    for subgroup in [false, true] {
                        let name = format!(
                            "r{rows}t{threads}u{unroll}{}",
                            if subgroup { "sg" } else { "" }
                        );
                        v.push(Named {
                            entry: format!("matvec_b16_{name}"),
                            name,
                            v: Variant {
                                rows,
                                threads,
                                unroll,
                                subgroup,
                                generated: true,
                            },
                        });
                    }
                }
            }
        }
        debug_assert_eq!(v.len(), NGEN + 1);
        v
    })
}

/// Names of all decode matvec variants, for sweeps (`DAYONE_WGSL_MATVEC=<name>`).
pub fn matvec_variants() -> Vec<&'static str> {
    variants().iter().map(|n| n.name.as_str()).collect()
}

/// Index of variant `name`, downgraded to its tree twin when `subgroups` is false.
pub(crate) fn resolve(name: &str, subgroups: bool) -> Option<usize> {
    let all = variants();
    let i = all.iter().position(|n| n.name == name)?;
    if all[i].v.subgroup && !subgroups {
        let twin = name.strip_suffix("sg")?;
        return all.iter().position(|n| n.name == twin);
    }
    Some(i)
}

/// The kernel of variant `i` (of [`variants`]), its source generated once per process.
pub(crate) fn spec(i: usize) -> Spec {
    static SRC: [OnceLock<String>; NGEN + 1] = [const { OnceLock::new() }; NGEN + 1];
    let n = &variants()[i];
    if !n.v.generated {
        return crate::pipelines::MATVEC_WG_B16;
    }
    let source = SRC[i].get_or_init(|| source(&n.entry, &n.v, Kind::Single));
    Spec {
        source,
        file: &n.entry,
        entry: &n.entry,
        access: &[Access::Read, Access::Read, Access::Read, Access::Write],
    }
}

/// The fused kernel of `kind` (not [`Kind::Single`]) for generated variant `i`, its entry
/// point `matvec_b16_<name>_many<np>` or `matvec_b16_<name>_silu` (source generated once per
/// process); `None` for `wg64`, which has no generated form (the caller falls back to the
/// unfused calls).
pub(crate) fn fused_spec(i: usize, kind: Kind) -> Option<Spec> {
    use crate::pipelines::Access::{Read as R, Write as W};
    type Cache =
        std::sync::Mutex<std::collections::HashMap<(usize, Kind), &'static (String, String)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let n = &variants()[i];
    if !n.v.generated || kind == Kind::Single {
        return None;
    }
    let access: &'static [Access] = match kind {
        Kind::Many(2) => &[R, R, R, R, R, W, W],
        Kind::Many(3) => &[R, R, R, R, R, R, R, W, W, W],
        Kind::Many(4) => &[R, R, R, R, R, R, R, R, R, W, W, W, W],
        Kind::SiluMul => &[R, R, R, W],
        _ => return None,
    };
    let mut g = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    // Leaked once per (variant, kind): at most 25 × 4 small strings per process.
    let e: &'static (String, String) = g.entry((i, kind)).or_insert_with(|| {
        let entry = match kind {
            Kind::Many(np) => format!("{}_many{np}", n.entry),
            _ => format!("{}_silu", n.entry),
        };
        let src = source(&entry, &n.v, kind);
        Box::leak(Box::new((entry, src)))
    });
    Some(Spec {
        source: &e.1,
        file: &e.0,
        entry: &e.0,
        access,
    })
}

/// Parameters and bindings of the single-weight kernel, as in `matmul_bf16.wgsl`.
const PRELUDE: &str = r#"
struct Params {
    m: u32,
    k: u32,
    n: u32,
    n_off: u32,
    n_chunk: u32,
    has_bias: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w8: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn bias_at(n: u32) -> f32 {
    if (P.has_bias == 1u) {
        return bias[P.n_off + n];
    }
    return 0.0;
}

fn store(m: u32, n: u32, v: f32) {
    if (n < P.n_chunk && m < P.m) {
        y[m * P.n + P.n_off + n] = v + bias_at(n);
    }
}
"#;

/// bf16 helpers shared by every generated kernel (after its parameters and bindings).
const HELPERS: &str = r#"
// bf16 -> f32 is exact: the bf16 bits become the high half of the f32. Even-indexed weights are
// the low halves, odd-indexed the high halves.
fn lo(w: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(w << vec4<u32>(16u));
}
fn hi(w: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(w & vec4<u32>(0xffff0000u));
}

struct X8 {
    e: vec4<f32>,
    o: vec4<f32>,
}
// x[8i .. 8i+8] of the row starting at vec4 `base`, split into even and odd elements.
fn x8(base: u32, i: u32) -> X8 {
    let a = x4[base + 2u * i];
    let b = x4[base + 2u * i + 1u];
    return X8(vec4<f32>(a.x, a.z, b.x, b.z), vec4<f32>(a.y, a.w, b.y, b.w));
}

// One token's 4 outputs for one 8-weight step of 4 rows (loaded as v0..v3).
fn dot4x8(x: X8, v0: vec4<u32>, v1: vec4<u32>, v2: vec4<u32>, v3: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(dot(x.e, lo(v0)) + dot(x.o, hi(v0)), dot(x.e, lo(v1)) + dot(x.o, hi(v1)),
                     dot(x.e, lo(v2)) + dot(x.o, hi(v2)), dot(x.e, lo(v3)) + dot(x.o, hi(v3)));
}
"#;

/// What one generated kernel computes per workgroup (all kinds share the loop and reduction
/// code, so a fused kernel's sums are formed exactly as the single kernel forms them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// `linear`: `y = x · wᵀ (+ bias)` over one weight chunk.
    Single,
    /// `linear_many` of 2 ..= [`MANY_MAX`] unchunked weights: a workgroup takes its `R` rows
    /// from one part, chosen by a tile table in the parameters; each part has its own weight,
    /// bias and output binding (WGSL cannot index bindings, so the part's code is a branch).
    Many(u32),
    /// `linear_silu_mul`: `R` rows of both the gate and the up weight per workgroup (their
    /// loads in flight together), stored as `silu(g) · u`, never writing `g` or `u`.
    SiluMul,
}

/// Most parts of one fused `linear_many` dispatch (bindings: x, then per part a weight, a bias
/// and an output: 13 storage buffers; more parts take more dispatches).
pub(crate) const MANY_MAX: usize = 4;

/// Storage bindings of a kernel of `kind` (adapters with fewer per-stage storage buffers fall
/// back to the unfused calls).
pub(crate) fn storage_bindings(kind: Kind) -> u32 {
    match kind {
        Kind::Single | Kind::SiluMul => 4,
        Kind::Many(np) => 1 + 3 * np,
    }
}

/// Parameters and bindings of the `linear_many` kernel of `np` parts. The tile table: part `p`
/// has `n[p]` rows and owns a token tile's tiles `start[p] ..` (`tiles` in all per token tile).
fn prelude_many(np: u32) -> String {
    use std::fmt::Write;
    let mut s = String::from(
        r#"
struct Params {
    m: u32,
    k: u32,
    tiles: u32,
    _p0: u32,
    n: vec4<u32>,
    start: vec4<u32>,
    has_bias: vec4<u32>,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
"#,
    );
    for p in 0..np {
        let _ = writeln!(
            s,
            "@group(0) @binding({}) var<storage, read> w8_{p}: array<vec4<u32>>;",
            2 + p
        );
    }
    for p in 0..np {
        let _ = writeln!(
            s,
            "@group(0) @binding({}) var<storage, read> bias_{p}: array<f32>;",
            2 + np + p
        );
    }
    for p in 0..np {
        let _ = writeln!(
            s,
            "@group(0) @binding({}) var<storage, read_write> y_{p}: array<f32>;",
            2 + 2 * np + p
        );
    }
    // The single kernel's store with n_off = 0 (an unchunked weight): the same `v + bias`
    // (+ 0.0 without a bias, which turns -0.0 into +0.0 there too).
    for p in 0..np {
        let _ = write!(
            s,
            r#"
fn bias_at_{p}(n: u32) -> f32 {{
    if (P.has_bias[{p}] == 1u) {{
        return bias_{p}[n];
    }}
    return 0.0;
}}

fn store_{p}(m: u32, n: u32, v: f32) {{
    if (n < P.n[{p}] && m < P.m) {{
        y_{p}[m * P.n[{p}] + n] = v + bias_at_{p}(n);
    }}
}}
"#
        );
    }
    s
}

/// Parameters (the single kernel's, `n_off` = 0, `n_chunk` = `n`, `_p0` = 0) and bindings of
/// the `linear_silu_mul` kernel. `zero()` is `+0.0` read at run time: the unfused path adds
/// `bias_at(n)` = +0.0 to each projection (turning -0.0 into +0.0), which a compile-time
/// constant might let a compiler drop.
const PRELUDE_SILU: &str = r#"
struct Params {
    m: u32,
    k: u32,
    n: u32,
    n_off: u32,
    n_chunk: u32,
    has_bias: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w8_g: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> w8_u: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn zero() -> f32 {
    return bitcast<f32>(P._p0);
}

// silu(g) * u as `silu_mul` (elementwise.wgsl) computes it from the two stored projections.
fn store2(m: u32, n: u32, ga: f32, ua: f32) {
    if (n < P.n_chunk && m < P.m) {
        let g = ga + zero();
        let u = ua + zero();
        y[m * P.n + n] = g / (1.0 + exp(-g)) * u;
    }
}
"#;

/// WGSL of a generated variant of `kind`. Per-row and per-token values are unrolled into
/// named variables (an indexed array may live in local memory on a GPU compiler).
fn source(name: &str, v: &Variant, kind: Kind) -> String {
    use std::fmt::Write;
    let (r, t) = (v.rows, v.threads);
    let q = r / 4; // vec4 accumulators per token and weight
    let sets = if kind == Kind::SiluMul { 2 } else { 1 };
    let mut s = String::new();
    // No `enable subgroups;`: naga 30 refuses the directive and takes the subgroup builtins
    // when the device has wgpu::Features::SUBGROUP.
    match kind {
        Kind::Single => s += PRELUDE,
        Kind::Many(np) => s += &prelude_many(np),
        Kind::SiluMul => s += PRELUDE_SILU,
    }
    s += HELPERS;
    // Partials per (row quad, slot): a slot per invocation for the tree, per subgroup (at least
    // 4 invocations each in wgpu) for the subgroup reduction.
    let slots = if v.subgroup { t / 4 } else { t };
    let _ = writeln!(s, "\nconst WG: u32 = {t}u;");
    let _ = writeln!(
        s,
        "var<workgroup> red: array<array<vec4<f32>, {slots}>, {}>;\n",
        sets * q
    );
    let _ = writeln!(s, "@compute @workgroup_size({t})");
    let _ = write!(
        s,
        "fn {name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,\n    @builtin(local_invocation_index) lid: u32"
    );
    if v.subgroup {
        s += ", @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_id) sgid: u32,\n    @builtin(num_subgroups) nsg: u32";
    }
    s += ") {\n";
    match kind {
        Kind::Single | Kind::SiluMul => {
            let _ = writeln!(s, "    let tiles = (P.n_chunk + {}u) / {r}u;", r - 1);
            s += "    let id = wid.x + wid.y * nwg.x;\n";
            s += "    let mt = id / tiles;\n";
            let _ = writeln!(s, "    let n0 = (id - mt * tiles) * {r}u;");
            let w = if kind == Kind::Single {
                ["w8", ""]
            } else {
                ["w8_g", "w8_u"]
            };
            body(
                &mut s,
                v,
                "    ",
                "P.n_chunk",
                &w[..sets as usize],
                &|tok, vals| {
                    if kind == Kind::Single {
                        format!("store(m0 + {tok}u, n0 + lid, {});", vals[0])
                    } else {
                        format!("store2(m0 + {tok}u, n0 + lid, {}, {});", vals[0], vals[1])
                    }
                },
            );
        }
        Kind::Many(np) => {
            s += "    let id = wid.x + wid.y * nwg.x;\n";
            s += "    let mt = id / P.tiles;\n";
            s += "    let tile = id - mt * P.tiles;\n";
            // The part owning this tile (workgroup-uniform, so its barriers stay uniform).
            for p in 0..np {
                if p + 1 < np {
                    let _ = writeln!(
                        s,
                        "    {}if (tile < P.start[{}]) {{",
                        if p == 0 { "" } else { "} else " },
                        p + 1
                    );
                } else {
                    s += "    } else {\n";
                }
                let _ = writeln!(s, "        let n0 = (tile - P.start[{p}]) * {r}u;");
                let n = format!("P.n[{p}]");
                let w = format!("w8_{p}");
                body(&mut s, v, "        ", &n, &[&w], &|tok, vals| {
                    format!("store_{p}(m0 + {tok}u, n0 + lid, {});", vals[0])
                });
            }
            s += "    }\n";
        }
    }
    s += "}\n";
    s
}

/// The kernel body after `n0` (first row) is known: the K loop over `w.len()` weights (the
/// same rows of each), the reduction, and `store(tok, sums)` (one sum expression per weight).
/// `n` is the rows of the weights (rows past it are clamped to the last). `ind` is the indent
/// of the enclosing block.
fn body(
    s: &mut String,
    v: &Variant,
    ind0: &str,
    n: &str,
    w: &[&str],
    store: &dyn Fn(u32, &[String]) -> String,
) {
    use std::fmt::Write;
    let (r, t, u) = (v.rows, v.threads, v.unroll);
    let q = r / 4;
    let sets = w.len() as u32;
    let nacc = sets * q; // vec4 accumulators per token: weight `s`'s are `s·q ..`
    let _ = writeln!(s, "{ind0}let m0 = mt * 4u;");
    let _ = writeln!(s, "{ind0}if (m0 >= P.m) {{\n{ind0}    return;\n{ind0}}}");
    let _ = writeln!(s, "{ind0}let mc = min(4u, P.m - m0);");
    let _ = writeln!(
        s,
        "{ind0}let k8 = P.k / 8u;\n{ind0}let k4 = P.k / 4u;\n{ind0}let last = {n} - 1u;"
    );
    for j in 0..r {
        let _ = writeln!(s, "{ind0}let r{j} = min(n0 + {j}u, last) * k8;");
    }
    for tok in 0..4 {
        for a in 0..nacc {
            let _ = writeln!(s, "{ind0}var a{tok}_{a} = vec4<f32>(0.0);");
        }
    }
    // One loop step: all loads first (U·R per weight of 16 bytes in flight), then the math per
    // token. Weight `s`'s row `j` is `v{k}_{s·R + j}`.
    let step = |s: &mut String, nk: u32, ind: &str| {
        for k in 0..nk {
            for (si, wn) in w.iter().enumerate() {
                for j in 0..r {
                    let _ = writeln!(
                        s,
                        "{ind}let v{k}_{} = {wn}[r{j} + i + {}u];",
                        si as u32 * r + j,
                        k * t
                    );
                }
            }
        }
        for k in 0..nk {
            for tok in 0..4u32 {
                let ind2 = if tok == 0 {
                    ind.to_string()
                } else {
                    let _ = writeln!(s, "{ind}if (mc > {tok}u) {{");
                    format!("{ind}    ")
                };
                let _ = writeln!(
                    s,
                    "{ind2}let x{k}_{tok} = x8((m0 + {tok}u) * k4, i + {}u);",
                    k * t
                );
                for a in 0..nacc {
                    let b = 4 * a;
                    let _ = writeln!(
                        s,
                        "{ind2}a{tok}_{a} += dot4x8(x{k}_{tok}, v{k}_{b}, v{k}_{}, v{k}_{}, v{k}_{});",
                        b + 1,
                        b + 2,
                        b + 3
                    );
                }
                if tok > 0 {
                    let _ = writeln!(s, "{ind}}}");
                }
            }
        }
    };
    let ind1 = format!("{ind0}    ");
    let _ = writeln!(s, "{ind0}var i = lid;");
    if u > 1 {
        let _ = writeln!(
            s,
            "{ind0}for (; i + {}u < k8; i += {}u) {{",
            (u - 1) * t,
            u * t
        );
        step(s, u, &ind1);
        let _ = writeln!(s, "{ind0}}}");
    }
    let _ = writeln!(s, "{ind0}for (; i < k8; i += {t}u) {{");
    step(s, 1, &ind1);
    let _ = writeln!(s, "{ind0}}}");
    // Reductions, one token at a time (workgroup memory for one token only).
    for tok in 0..4u32 {
        let ind = if tok == 0 {
            ind0.to_string()
        } else {
            let _ = writeln!(s, "{ind0}if (mc > {tok}u) {{");
            // The previous token's partials were read.
            let _ = writeln!(s, "{ind1}workgroupBarrier();");
            ind1.clone()
        };
        if v.subgroup {
            for a in 0..nacc {
                let _ = writeln!(s, "{ind}let s{tok}_{a} = subgroupAdd(a{tok}_{a});");
            }
            let _ = writeln!(s, "{ind}if (sgi == 0u) {{");
            for a in 0..nacc {
                let _ = writeln!(s, "{ind}    red[{a}][sgid] = s{tok}_{a};");
            }
            let _ = writeln!(s, "{ind}}}");
            let _ = writeln!(s, "{ind}workgroupBarrier();");
            let _ = writeln!(s, "{ind}if (lid < {r}u) {{");
            let accs: Vec<String> = (0..sets)
                .map(|si| {
                    if si == 0 {
                        "acc".into()
                    } else {
                        format!("acc{si}")
                    }
                })
                .collect();
            for a in &accs {
                let _ = writeln!(s, "{ind}    var {a} = 0.0;");
            }
            let _ = writeln!(s, "{ind}    for (var g = 0u; g < nsg; g++) {{");
            for (si, a) in accs.iter().enumerate() {
                let quad = if si == 0 {
                    "lid / 4u".to_string()
                } else {
                    format!("{}u + lid / 4u", si as u32 * q)
                };
                let _ = writeln!(s, "{ind}        {a} += red[{quad}][g][lid % 4u];");
            }
            let _ = writeln!(s, "{ind}    }}");
            let _ = writeln!(s, "{ind}    {}", store(tok, &accs));
            let _ = writeln!(s, "{ind}}}");
        } else {
            for a in 0..nacc {
                let _ = writeln!(s, "{ind}red[{a}][lid] = a{tok}_{a};");
            }
            let _ = writeln!(s, "{ind}workgroupBarrier();");
            let _ = writeln!(s, "{ind}for (var st = {}u; st > 0u; st >>= 1u) {{", t / 2);
            let _ = writeln!(s, "{ind}    if (lid < st) {{");
            for a in 0..nacc {
                let _ = writeln!(s, "{ind}        red[{a}][lid] += red[{a}][lid + st];");
            }
            let _ = writeln!(s, "{ind}    }}");
            let _ = writeln!(s, "{ind}    workgroupBarrier();");
            let _ = writeln!(s, "{ind}}}");
            let _ = writeln!(s, "{ind}if (lid < {r}u) {{");
            let vals: Vec<String> = (0..sets)
                .map(|si| {
                    if si == 0 {
                        "red[lid / 4u][0][lid % 4u]".to_string()
                    } else {
                        format!("red[{}u + lid / 4u][0][lid % 4u]", si * q)
                    }
                })
                .collect();
            let _ = writeln!(s, "{ind}    {}", store(tok, &vals));
            let _ = writeln!(s, "{ind}}}");
        }
        if tok > 0 {
            let _ = writeln!(s, "{ind0}}}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve() {
        assert_eq!(variants()[0].name, "wg64");
        assert_eq!(variants().len(), NGEN + 1);
        assert!(resolve(MATVEC_DEFAULT, true).is_some());
        let twin = resolve("r8t256u2sg", false).unwrap();
        assert_eq!(variants()[twin].name, "r8t256u2");
        assert!(resolve("nope", true).is_none());
    }
}
