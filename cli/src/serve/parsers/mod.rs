//! Tool-call and reasoning parsers: one state machine per output format.
//!
//! The server decodes generated tokens incrementally (special tokens kept as
//! text) and feeds every new piece of text, of any length, to an
//! [`OutputParser`]; what comes back is sent as SSE deltas (serving.md A3).
//! The non-stream answer is [`collect`] of the very same deltas, so stream
//! and non-stream cannot disagree (vllm#54701).
//!
//! Changes against the brief's API sketch, for the server author:
//! - [`Delta::ToolCallInvalid`]: arguments stream as they arrive (vllm#50604:
//!   long arguments must not wait for the end), so a call whose JSON turns out
//!   invalid, or that `max_tokens` cut off, cannot be taken back from the
//!   stream; this delta marks it and [`collect`] drops it (vLLM PR #43280
//!   skips invalid calls). `finish_reason:"tool_calls"` should count only
//!   calls that were not marked invalid ([`Parsed::tool_calls`] non-empty).
//! - [`starts_in_reasoning`]: helper to compute `build`'s `thinking` flag from
//!   the rendered prompt.
//!
//! Whitespace: when a reasoning or tool format is active, `content` and
//! `reasoning` are trimmed at both ends (leading whitespace dropped, trailing
//! whitespace held until more text of the same kind follows), so the `\n\n`
//! after `</think>` or around tool blocks does not come out as content.
//! Tool-call arguments are always trimmed. With neither format the text
//! passes through untouched.

mod deepseek;
mod dsml;
mod harmony;
mod hermes;
mod kimi_k2;
mod markers;
mod qwen3_coder;
mod think;

/// One piece of parsed output, in the order it must be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Answer text (`delta.content`).
    Content(String),
    /// Reasoning text (`delta.reasoning` / `delta.reasoning_content`).
    Reasoning(String),
    /// A tool call begins: sent once per call, before its arguments
    /// (`{index, id, type:"function", function:{name}}`, serving.md A3).
    ToolCallStart {
        /// Position of the call in this answer, 0-based, never reused.
        index: usize,
        /// The call id (Kimi: the model's own `functions.NAME:IDX`).
        id: String,
        /// The function name.
        name: String,
    },
    /// The next fragment of call `index`'s JSON arguments string; the
    /// fragments of one call concatenate to its `arguments` byte for byte.
    ToolCallArgs {
        /// The call the fragment belongs to.
        index: usize,
        /// Raw JSON text, never empty.
        fragment: String,
    },
    /// Call `index` ended with arguments that are not a JSON object, or was cut
    /// off (`finish(truncated = true)` inside it): [`collect`] drops it, and a
    /// stream should not count it towards `finish_reason:"tool_calls"`.
    ToolCallInvalid {
        /// The call that is void.
        index: usize,
    },
}

// The server folds deltas itself (serve/session.rs); `collect` is the
// reference fold the tests check the parsers against, kept public for it.
#[allow(dead_code)]
/// A finished tool call (non-stream answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Call id, as sent in [`Delta::ToolCallStart`].
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as a JSON object string (validated with serde_json).
    pub arguments: String,
}

#[allow(dead_code)]
/// The whole answer, as the non-stream response carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// `message.content`; `None` when there was no answer text.
    pub content: Option<String>,
    /// `message.reasoning` / `reasoning_content`; `None` when there was none.
    pub reasoning: Option<String>,
    /// Valid tool calls in order (invalid or truncated ones dropped).
    pub tool_calls: Vec<ToolCall>,
}

/// A streaming parser for one answer.
pub trait OutputParser: Send {
    /// Feeds the next piece of decoded text (any length, split anywhere on a
    /// char boundary); returns what can be sent now. Never returns a delta
    /// with an empty string; adjacent deltas of one kind are merged.
    fn push(&mut self, text: &str) -> Vec<Delta>;
    /// End of output (`truncated` = stopped by `max_tokens`/length): flushes
    /// held-back text and closes an open tool call (invalid if truncated).
    fn finish(&mut self, truncated: bool) -> Vec<Delta>;
}

#[allow(dead_code)]
/// Collects deltas into the non-stream answer (stream and non-stream share
/// this code path). Calls marked [`Delta::ToolCallInvalid`], and as a second
/// guard any call whose arguments are not a JSON object, are left out.
pub fn collect(deltas: impl IntoIterator<Item = Delta>) -> Parsed {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls: Vec<(usize, ToolCall, bool)> = Vec::new();
    for d in deltas {
        match d {
            Delta::Content(s) => content.push_str(&s),
            Delta::Reasoning(s) => reasoning.push_str(&s),
            Delta::ToolCallStart { index, id, name } => calls.push((
                index,
                ToolCall {
                    id,
                    name,
                    arguments: String::new(),
                },
                true,
            )),
            Delta::ToolCallArgs { index, fragment } => {
                if let Some(c) = calls.iter_mut().rev().find(|c| c.0 == index) {
                    c.1.arguments.push_str(&fragment);
                }
            }
            Delta::ToolCallInvalid { index } => {
                if let Some(c) = calls.iter_mut().rev().find(|c| c.0 == index) {
                    c.2 = false;
                }
            }
        }
    }
    Parsed {
        content: (!content.is_empty()).then_some(content),
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        tool_calls: calls
            .into_iter()
            .filter(|c| c.2 && is_json_object(&c.1.arguments))
            .map(|c| c.1)
            .collect(),
    }
}

/// Tool-call output formats (vLLM `--tool-call-parser` names in
/// [`ToolFormat::from_name`]; wire formats in serving.md B1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Kimi-K2/K2.5/Linear: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>…<|tool_calls_section_end|>`
    /// (also the singular `<|tool_call_section_begin|>` spelling, llama.cpp PR #17376). vLLM `parser/kimi_k2.py`.
    KimiK2,
    /// DeepSeek-V3/R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{json}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`.
    /// The parser also accepts the V3.1 shape (a V3-only parser returning nothing on V3.1 output was vLLM PR #23454).
    DeepSeekV3,
    /// DeepSeek-V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜><｜tool▁calls▁end｜>`.
    DeepSeekV31,
    /// DeepSeek-V3.2 DSML: `<｜DSML｜function_calls><｜DSML｜invoke name="F"><｜DSML｜parameter name="p" string="true">v</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>`
    /// (also `tool_calls` block, self-closing invoke, raw-JSON invoke body). vLLM `parser/deepseek_v32.py`.
    DeepSeekV32,
    /// gpt-oss harmony: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{json}<|call|>`. vLLM `parser/harmony.py`.
    Harmony,
    /// Hermes / Qwen2.5 / Qwen3: `<tool_call>\n{"name":"f","arguments":{…}}\n</tool_call>`, repeatable. vLLM `hermes` parser.
    Hermes,
    /// Qwen3-Coder XML: `<tool_call><function=f><parameter=p>v</parameter></function></tool_call>`. vLLM `qwen3_coder`/`qwen3_xml`.
    Qwen3Coder,
}

const TOOL_NAMES: &[(&str, ToolFormat)] = &[
    ("kimi_k2", ToolFormat::KimiK2),
    ("deepseek_v3", ToolFormat::DeepSeekV3),
    ("deepseek_v31", ToolFormat::DeepSeekV31),
    ("deepseek_v32", ToolFormat::DeepSeekV32),
    ("openai", ToolFormat::Harmony),
    ("hermes", ToolFormat::Hermes),
    ("qwen3_coder", ToolFormat::Qwen3Coder),
    // Aliases (vLLM / SGLang spellings).
    ("qwen3", ToolFormat::Hermes),
    ("qwen3_json", ToolFormat::Hermes),
    ("qwen", ToolFormat::Hermes),
    ("qwen25", ToolFormat::Hermes),
    ("qwen3_xml", ToolFormat::Qwen3Coder),
    ("harmony", ToolFormat::Harmony),
    ("gpt_oss", ToolFormat::Harmony),
    ("gpt-oss", ToolFormat::Harmony),
    ("deepseekv3", ToolFormat::DeepSeekV3),
    ("deepseekv31", ToolFormat::DeepSeekV31),
    ("deepseekv32", ToolFormat::DeepSeekV32),
];

impl ToolFormat {
    /// Parses a `--tool-call-parser` name (vLLM names `kimi_k2`, `deepseek_v3`,
    /// `deepseek_v31`, `deepseek_v32`, `openai`, `hermes`, `qwen3_coder`, plus
    /// aliases `qwen3`, `qwen3_json`, `qwen3_xml`, `harmony`, `gpt_oss`, SGLang's
    /// `deepseekv3`…); case-insensitive, `-` and `_` alike except in `gpt-oss`.
    pub fn from_name(name: &str) -> Option<Self> {
        let n = name.trim().to_ascii_lowercase();
        let n2 = n.replace('-', "_");
        TOOL_NAMES
            .iter()
            .find(|(k, _)| *k == n || *k == n2)
            .map(|(_, f)| *f)
    }
    /// The canonical names, one per format (for `--help` and error messages).
    pub fn names() -> &'static [&'static str] {
        &[
            "kimi_k2",
            "deepseek_v3",
            "deepseek_v31",
            "deepseek_v32",
            "openai",
            "hermes",
            "qwen3_coder",
        ]
    }
}

/// Reasoning output formats (vLLM `--reasoning-parser` names in
/// [`ReasoningFormat::from_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `<think>…</think>` (vLLM `qwen3`, `deepseek_r1`): with `thinking`
    /// everything before `</think>` is reasoning; without, only an output that
    /// opens with `<think>`.
    Think,
    /// Kimi-K2: `<think>…</think>`, and a tool section begin also ends
    /// reasoning (vLLM `parser/kimi_k2.py` transitions, PR #32216).
    KimiK2,
    /// DeepSeek-V3.1/V3.2: `<think>…</think>` when `chat_template_kwargs.thinking`
    /// (vLLM `deepseek_v3` reasoning parser; identity otherwise, which the
    /// caller expresses with `thinking = false`).
    DeepSeekV3,
    /// gpt-oss harmony channels: `analysis` is reasoning (vLLM `openai_gptoss`).
    Harmony,
}

const REASONING_NAMES: &[(&str, ReasoningFormat)] = &[
    ("think", ReasoningFormat::Think),
    ("qwen3", ReasoningFormat::Think),
    ("deepseek_r1", ReasoningFormat::Think),
    ("kimi_k2", ReasoningFormat::KimiK2),
    ("deepseek_v3", ReasoningFormat::DeepSeekV3),
    ("openai_gptoss", ReasoningFormat::Harmony),
    // Aliases.
    ("deepseek-r1", ReasoningFormat::Think),
    ("deepseek-v3", ReasoningFormat::DeepSeekV3),
    ("gpt_oss", ReasoningFormat::Harmony),
    ("gpt-oss", ReasoningFormat::Harmony),
    ("harmony", ReasoningFormat::Harmony),
];

impl ReasoningFormat {
    /// Parses a `--reasoning-parser` name (vLLM `qwen3`, `deepseek_r1`,
    /// `kimi_k2`, `deepseek_v3`, `openai_gptoss`; also `think`, SGLang's
    /// `deepseek-r1`, `gpt-oss`); case-insensitive.
    pub fn from_name(name: &str) -> Option<Self> {
        let n = name.trim().to_ascii_lowercase();
        let n2 = n.replace('-', "_");
        REASONING_NAMES
            .iter()
            .find(|(k, _)| *k == n || *k == n2)
            .map(|(_, f)| *f)
    }
    /// The canonical names, one per format plus the vLLM names that map to
    /// [`ReasoningFormat::Think`].
    pub fn names() -> &'static [&'static str] {
        &[
            "qwen3",
            "deepseek_r1",
            "kimi_k2",
            "deepseek_v3",
            "openai_gptoss",
            "think",
        ]
    }
}

/// Picks the formats for a model from its config's `model_type` and/or its
/// chat template text: `kimi_k2`/`kimi_linear`/`kimi_k25` → Kimi for both;
/// `deepseek_v3` → DeepSeek V3 (V3.1 if the template has no ```` ```json ````
/// fence, V3.2 DSML if it mentions `DSML`) with DeepSeek reasoning (active only
/// when the caller passes `thinking`); `deepseek_v32` → DSML; `qwen2*`/`qwen3*`
/// → Hermes (Qwen3-Coder if the template writes `<function=`) with `<think>`;
/// `gpt_oss` → harmony. Other model types go by the template alone:
/// `<|channel|>` → harmony, `tool_calls_section_begin` → Kimi, `DSML` → V3.2,
/// `tool▁sep` → DeepSeek, `<function=` → Qwen3-Coder, `<tool_call>` → Hermes;
/// `<think>` in the template → [`ReasoningFormat::Think`].
pub fn auto_formats(
    model_type: &str,
    chat_template: Option<&str>,
) -> (Option<ToolFormat>, Option<ReasoningFormat>) {
    let t = chat_template.unwrap_or("");
    let deepseek_tool = || {
        if t.contains("DSML") {
            ToolFormat::DeepSeekV32
        } else if t.contains("tool▁sep") && !t.contains("```json") {
            ToolFormat::DeepSeekV31
        } else {
            ToolFormat::DeepSeekV3
        }
    };
    let mt = model_type.to_ascii_lowercase();
    match mt.as_str() {
        "kimi_k2" | "kimi_linear" | "kimi_k25" => {
            return (Some(ToolFormat::KimiK2), Some(ReasoningFormat::KimiK2))
        }
        "deepseek_v3" | "deepseek_v31" => {
            return (Some(deepseek_tool()), Some(ReasoningFormat::DeepSeekV3))
        }
        "deepseek_v32" => {
            return (
                Some(ToolFormat::DeepSeekV32),
                Some(ReasoningFormat::DeepSeekV3),
            )
        }
        "gpt_oss" => return (Some(ToolFormat::Harmony), Some(ReasoningFormat::Harmony)),
        _ => {}
    }
    if mt.starts_with("qwen2") || mt.starts_with("qwen3") {
        let tool = if t.contains("<function=") {
            ToolFormat::Qwen3Coder
        } else {
            ToolFormat::Hermes
        };
        return (Some(tool), Some(ReasoningFormat::Think));
    }
    if t.contains("<|channel|>") {
        return (Some(ToolFormat::Harmony), Some(ReasoningFormat::Harmony));
    }
    if t.contains("tool_calls_section_begin") || t.contains("tool_call_section_begin") {
        return (Some(ToolFormat::KimiK2), Some(ReasoningFormat::KimiK2));
    }
    let tool = if t.contains("DSML") || t.contains("tool▁sep") {
        Some(deepseek_tool())
    } else if t.contains("<function=") {
        Some(ToolFormat::Qwen3Coder)
    } else if t.contains("<tool_call>") {
        Some(ToolFormat::Hermes)
    } else {
        None
    };
    let reasoning = if t.contains("<think>") || t.contains("</think>") {
        Some(match tool {
            Some(ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 | ToolFormat::DeepSeekV32) => {
                ReasoningFormat::DeepSeekV3
            }
            _ => ReasoningFormat::Think,
        })
    } else {
        None
    };
    (tool, reasoning)
}

/// Whether a rendered prompt leaves the answer inside reasoning: it ends
/// (ignoring whitespace) with an open `<think>` (DeepSeek-R1, V3.1 thinking,
/// Qwen3-thinking-2507 templates). Use it for [`build`]'s `thinking`.
pub fn starts_in_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with("<think>")
}

/// Builds the parser for one answer. `thinking`: the answer starts inside
/// reasoning (the template opened `<think>`, or thinking is on by default for
/// the format and not switched off by `chat_template_kwargs`); without it an
/// answer that opens with `<think>` is still split. `tools`: tool parsing on
/// (the request had tools and `tool_choice != "none"`); when off, tool
/// markers are plain content. Call ids are `call_<random>_<index>` except
/// Kimi's own `functions.NAME:IDX`.
pub fn build(
    tool: Option<ToolFormat>,
    reasoning: Option<ReasoningFormat>,
    thinking: bool,
    tools: bool,
) -> Box<dyn OutputParser> {
    let prefix = format!("{:016x}", rand::random::<u64>());
    build_with_ids(tool, reasoning, thinking, tools, &prefix)
}

/// [`build`] with a fixed call-id prefix (deterministic ids for tests).
fn build_with_ids(
    tool: Option<ToolFormat>,
    reasoning: Option<ReasoningFormat>,
    thinking: bool,
    tools: bool,
    id_prefix: &str,
) -> Box<dyn OutputParser> {
    let tool = if tools { tool } else { None };
    let calls = Calls::new(id_prefix);
    let shape = tool.is_some() || reasoning.is_some();
    // Harmony carries its own channels, so it replaces the `<think>` layer.
    if tool == Some(ToolFormat::Harmony) || reasoning == Some(ReasoningFormat::Harmony) {
        let stage = harmony::Harmony::new(tool == Some(ToolFormat::Harmony), calls);
        return Box::new(Pipeline::new(Box::new(stage), true));
    }
    let (inner, openers): (Box<dyn Stage>, &'static [&'static str]) = match tool {
        Some(ToolFormat::KimiK2) => (Box::new(kimi_k2::Kimi::new(calls)), kimi_k2::OPENERS),
        Some(ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31) => {
            (Box::new(deepseek::DeepSeek::new(calls)), deepseek::OPENERS)
        }
        Some(ToolFormat::DeepSeekV32) => (Box::new(dsml::Dsml::new(calls)), dsml::OPENERS),
        Some(ToolFormat::Hermes) => (Box::new(hermes::Hermes::new(calls)), hermes::OPENERS),
        Some(ToolFormat::Qwen3Coder) => (
            Box::new(qwen3_coder::Qwen3Coder::new(calls)),
            qwen3_coder::OPENERS,
        ),
        Some(ToolFormat::Harmony) | None => (Box::new(Plain), &[]),
    };
    let stage: Box<dyn Stage> = match reasoning {
        None => inner,
        Some(r) => {
            // A tool-call opener ends reasoning (Kimi PR #32216; V3.1 calls
            // inside reasoning must still be extracted, sglang PR #9446).
            // Kimi's section markers end it even with tools off, so they never
            // show up in reasoning (MoonshotAI/Kimi-K2#89).
            let mut enders: Vec<&'static str> = openers.to_vec();
            if r == ReasoningFormat::KimiK2 {
                for m in kimi_k2::OPENERS {
                    if !enders.contains(m) {
                        enders.push(m);
                    }
                }
            }
            Box::new(think::Think::new(inner, thinking, enders))
        }
    };
    Box::new(Pipeline::new(stage, shape))
}

/// True when `s` is a JSON object (what OpenAI `arguments` must hold).
fn is_json_object(s: &str) -> bool {
    matches!(
        serde_json::from_str::<serde_json::Value>(s),
        Ok(serde_json::Value::Object(_))
    )
}

/// A format state machine: turns text into raw deltas (possibly empty or
/// untrimmed strings; [`Pipeline`] cleans them up).
trait Stage: Send {
    fn push(&mut self, text: &str, out: &mut Vec<Delta>);
    fn finish(&mut self, truncated: bool, out: &mut Vec<Delta>);
}

/// No tool format: everything is content.
struct Plain;

impl Stage for Plain {
    fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        out.push(Delta::Content(text.to_string()));
    }
    fn finish(&mut self, _truncated: bool, _out: &mut Vec<Delta>) {}
}

/// Tool-call bookkeeping shared by the formats: indices, ids, the raw
/// arguments seen so far (to validate at the end), and the end-of-call rule.
struct Calls {
    next: usize,
    open: Option<OpenCall>,
    id_prefix: String,
}

struct OpenCall {
    index: usize,
    named: bool,
    args: String,
}

impl Calls {
    fn new(id_prefix: &str) -> Self {
        Calls {
            next: 0,
            open: None,
            id_prefix: id_prefix.to_string(),
        }
    }

    /// Starts a call (ending one still open). `id`: the model's own id, if
    /// the format carries one.
    fn start(&mut self, out: &mut Vec<Delta>, id: Option<String>, name: &str) {
        if self.open.is_some() {
            self.end(out, false);
        }
        let index = self.next;
        self.next += 1;
        let id = id
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("call_{}_{index}", self.id_prefix));
        out.push(Delta::ToolCallStart {
            index,
            id,
            name: name.to_string(),
        });
        self.open = Some(OpenCall {
            index,
            named: !name.trim().is_empty(),
            args: String::new(),
        });
    }

    /// Streams an arguments fragment of the open call.
    fn args(&mut self, out: &mut Vec<Delta>, text: &str) {
        if text.is_empty() {
            return;
        }
        if let Some(o) = &mut self.open {
            o.args.push_str(text);
            out.push(Delta::ToolCallArgs {
                index: o.index,
                fragment: text.to_string(),
            });
        }
    }

    /// Ends the open call: no arguments at all → `{}`; cut off, unnamed, or
    /// not a JSON object → [`Delta::ToolCallInvalid`].
    fn end(&mut self, out: &mut Vec<Delta>, truncated: bool) {
        let Some(o) = self.open.take() else { return };
        let t = o.args.trim();
        let ok = if truncated || !o.named {
            false
        } else if t.is_empty() {
            out.push(Delta::ToolCallArgs {
                index: o.index,
                fragment: "{}".to_string(),
            });
            true
        } else {
            is_json_object(t)
        };
        if !ok {
            out.push(Delta::ToolCallInvalid { index: o.index });
        }
    }
}

/// Trims one text channel: drops leading whitespace, holds trailing
/// whitespace until more non-blank text of the same channel follows.
#[derive(Default)]
struct Trim {
    started: bool,
    pending: String,
}

impl Trim {
    fn feed(&mut self, text: &str) -> Option<String> {
        let t = if self.started {
            text
        } else {
            text.trim_start()
        };
        let body = t.trim_end();
        if body.is_empty() {
            if self.started {
                self.pending.push_str(t);
            }
            return None;
        }
        self.started = true;
        let mut s = std::mem::take(&mut self.pending);
        s.push_str(body);
        self.pending.push_str(&t[body.len()..]);
        Some(s)
    }
}

/// A [`Stage`] plus the clean-up every format shares: trimming, no empty
/// deltas, adjacent deltas of one kind merged.
struct Pipeline {
    stage: Box<dyn Stage>,
    trim_text: bool,
    content: Trim,
    reasoning: Trim,
    args: Vec<(usize, Trim)>,
}

impl Pipeline {
    fn new(stage: Box<dyn Stage>, trim_text: bool) -> Self {
        Pipeline {
            stage,
            trim_text,
            content: Trim::default(),
            reasoning: Trim::default(),
            args: Vec::new(),
        }
    }

    fn shape(&mut self, raw: Vec<Delta>) -> Vec<Delta> {
        let mut out: Vec<Delta> = Vec::new();
        for d in raw {
            let d = match d {
                Delta::Content(s) => {
                    let s = if self.trim_text {
                        self.content.feed(&s)
                    } else {
                        Some(s)
                    };
                    match s {
                        Some(s) if !s.is_empty() => Delta::Content(s),
                        _ => continue,
                    }
                }
                Delta::Reasoning(s) => {
                    let s = if self.trim_text {
                        self.reasoning.feed(&s)
                    } else {
                        Some(s)
                    };
                    match s {
                        Some(s) if !s.is_empty() => Delta::Reasoning(s),
                        _ => continue,
                    }
                }
                Delta::ToolCallStart { index, .. } => {
                    self.args.push((index, Trim::default()));
                    d
                }
                Delta::ToolCallArgs { index, fragment } => {
                    let Some(t) = self.args.iter_mut().rev().find(|a| a.0 == index) else {
                        continue;
                    };
                    match t.1.feed(&fragment) {
                        Some(fragment) => Delta::ToolCallArgs { index, fragment },
                        None => continue,
                    }
                }
                Delta::ToolCallInvalid { .. } => d,
            };
            match (out.last_mut(), d) {
                (Some(Delta::Content(a)), Delta::Content(b)) => a.push_str(&b),
                (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) => a.push_str(&b),
                (
                    Some(Delta::ToolCallArgs {
                        index: i,
                        fragment: a,
                    }),
                    Delta::ToolCallArgs {
                        index: j,
                        fragment: b,
                    },
                ) if *i == j => a.push_str(&b),
                (_, d) => out.push(d),
            }
        }
        out
    }
}

impl OutputParser for Pipeline {
    fn push(&mut self, text: &str) -> Vec<Delta> {
        let mut raw = Vec::new();
        if !text.is_empty() {
            self.stage.push(text, &mut raw);
        }
        self.shape(raw)
    }
    fn finish(&mut self, truncated: bool) -> Vec<Delta> {
        let mut raw = Vec::new();
        self.stage.finish(truncated, &mut raw);
        self.shape(raw)
    }
}

/// Helpers shared by the per-format tests.
#[cfg(test)]
mod testutil {
    use super::*;

    /// Every way the tests cut an output: whole, 1/2/3/7-char pieces, and
    /// random 1..=12-char pieces from a fixed-seed LCG (all on char boundaries).
    pub(super) fn splits(text: &str) -> Vec<Vec<String>> {
        let chars: Vec<char> = text.chars().collect();
        let chunk = |sizes: &mut dyn FnMut() -> usize| {
            let mut v = Vec::new();
            let mut i = 0;
            while i < chars.len() {
                let n = sizes().max(1).min(chars.len() - i);
                v.push(chars[i..i + n].iter().collect::<String>());
                i += n;
            }
            v
        };
        let mut all = vec![vec![text.to_string()]];
        for n in [1usize, 2, 3, 7] {
            all.push(chunk(&mut || n));
        }
        for seed in [1u64, 7, 42] {
            let mut s = seed;
            all.push(chunk(&mut || {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                1 + ((s >> 33) % 12) as usize
            }));
        }
        all
    }

    /// Feeds `pieces` to a fresh parser and returns every delta.
    pub(super) fn run(
        make: &dyn Fn() -> Box<dyn OutputParser>,
        pieces: &[String],
        truncated: bool,
    ) -> Vec<Delta> {
        let mut p = make();
        let mut out = Vec::new();
        for piece in pieces {
            out.extend(p.push(piece));
        }
        out.extend(p.finish(truncated));
        out
    }

    /// The property test: every split gives the same `collect` as the whole
    /// string, no empty delta, each call started once before its arguments,
    /// and collected arguments are JSON objects. Returns the answer.
    pub(super) fn check(
        make: &dyn Fn() -> Box<dyn OutputParser>,
        text: &str,
        truncated: bool,
    ) -> Parsed {
        let whole = collect(run(make, &[text.to_string()], truncated));
        for pieces in splits(text) {
            let ds = run(make, &pieces, truncated);
            let mut started = Vec::new();
            for d in &ds {
                match d {
                    Delta::Content(s) | Delta::Reasoning(s) => assert!(!s.is_empty(), "{ds:?}"),
                    Delta::ToolCallStart { index, .. } => {
                        assert!(!started.contains(index), "{ds:?}");
                        started.push(*index);
                    }
                    Delta::ToolCallArgs { index, fragment } => {
                        assert!(!fragment.is_empty(), "{ds:?}");
                        assert!(started.contains(index), "{ds:?}");
                    }
                    Delta::ToolCallInvalid { index } => assert!(started.contains(index)),
                }
            }
            let got = collect(ds);
            assert_eq!(got, whole, "split {pieces:?}");
        }
        for c in &whole.tool_calls {
            // vllm#54701: every merged call has a name and JSON arguments.
            assert!(!c.name.is_empty() && !c.id.is_empty(), "{c:?}");
            assert!(is_json_object(&c.arguments), "{c:?}");
        }
        whole
    }

    /// A `Parsed` literal for expectations.
    pub(super) fn parsed(
        content: Option<&str>,
        reasoning: Option<&str>,
        calls: &[(&str, &str, &str)],
    ) -> Parsed {
        Parsed {
            content: content.map(str::to_string),
            reasoning: reasoning.map(str::to_string),
            tool_calls: calls
                .iter()
                .map(|(id, name, args)| ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: args.to_string(),
                })
                .collect(),
        }
    }

    /// A parser factory with deterministic ids (`call_t_<index>`).
    pub(super) fn maker(
        tool: Option<ToolFormat>,
        reasoning: Option<ReasoningFormat>,
        thinking: bool,
        tools: bool,
    ) -> impl Fn() -> Box<dyn OutputParser> {
        move || build_with_ids(tool, reasoning, thinking, tools, "t")
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in ToolFormat::names() {
            assert!(ToolFormat::from_name(n).is_some(), "{n}");
        }
        for n in ReasoningFormat::names() {
            assert!(ReasoningFormat::from_name(n).is_some(), "{n}");
        }
        assert_eq!(
            ToolFormat::from_name("qwen3_xml"),
            Some(ToolFormat::Qwen3Coder)
        );
        assert_eq!(ToolFormat::from_name("openai"), Some(ToolFormat::Harmony));
        assert_eq!(ToolFormat::from_name("nope"), None);
        assert_eq!(
            ReasoningFormat::from_name("openai_gptoss"),
            Some(ReasoningFormat::Harmony)
        );
    }

    #[test]
    fn auto_formats_by_model_and_template() {
        use ReasoningFormat as R;
        use ToolFormat as T;
        assert_eq!(
            auto_formats("kimi_k2", None),
            (Some(T::KimiK2), Some(R::KimiK2))
        );
        assert_eq!(
            auto_formats("kimi_linear", None),
            (Some(T::KimiK2), Some(R::KimiK2))
        );
        assert_eq!(
            auto_formats("gpt_oss", None),
            (Some(T::Harmony), Some(R::Harmony))
        );
        assert_eq!(
            auto_formats("qwen3_moe", None),
            (Some(T::Hermes), Some(R::Think))
        );
        assert_eq!(
            auto_formats("qwen3_moe", Some("<tool_call>\n<function=x>")),
            (Some(T::Qwen3Coder), Some(R::Think))
        );
        assert_eq!(
            auto_formats("deepseek_v3", Some("<｜tool▁sep｜>' + name + '\\n```json")),
            (Some(T::DeepSeekV3), Some(R::DeepSeekV3))
        );
        assert_eq!(
            auto_formats("deepseek_v3", Some("name + '<｜tool▁sep｜>' + args")),
            (Some(T::DeepSeekV31), Some(R::DeepSeekV3))
        );
        assert_eq!(
            auto_formats("deepseek_v32", None),
            (Some(T::DeepSeekV32), Some(R::DeepSeekV3))
        );
        assert_eq!(auto_formats("llama", None), (None, None));
        assert_eq!(
            auto_formats("llama", Some("{{'<tool_call>'}}")),
            (Some(T::Hermes), None)
        );
        assert_eq!(
            auto_formats("mystery", Some("<|start|>assistant<|channel|>")),
            (Some(T::Harmony), Some(R::Harmony))
        );
        assert!(starts_in_reasoning("<｜Assistant｜><think>\n"));
        assert!(!starts_in_reasoning("<think>\n\n</think>\n\n"));
    }

    #[test]
    fn plain_passthrough_keeps_whitespace() {
        let m = maker(None, None, false, false);
        let p = check(&m, "  hi <|x|>\n", false);
        assert_eq!(p, parsed(Some("  hi <|x|>\n"), None, &[]));
    }

    #[test]
    fn collect_drops_invalid_calls() {
        let ds = vec![
            Delta::ToolCallStart {
                index: 0,
                id: "a".into(),
                name: "f".into(),
            },
            Delta::ToolCallArgs {
                index: 0,
                fragment: "{\"x\":".into(),
            },
            Delta::ToolCallInvalid { index: 0 },
            Delta::ToolCallStart {
                index: 1,
                id: "b".into(),
                name: "g".into(),
            },
            Delta::ToolCallArgs {
                index: 1,
                fragment: "{}".into(),
            },
        ];
        assert_eq!(collect(ds), parsed(None, None, &[("b", "g", "{}")]));
    }
}
