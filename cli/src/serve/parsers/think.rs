//! Generic `<think>…</think>` reasoning (vLLM `deepseek_r1`/`qwen3`
//! reasoning parsers, SGLang `DeepSeekR1Detector`), layered in front of a
//! tool-format stage that gets everything after reasoning.

use super::markers::{scan, Scan};
use super::{Delta, Stage};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not thinking: waits to see whether the output opens with `<think>`.
    Sniff,
    /// Thinking: drops a leading `<think>` if the model repeats it.
    Open,
    Reasoning,
    Content,
}

/// Splits reasoning from the rest; `enders` are extra markers (tool-call
/// openers) that end reasoning and go, with what follows, to `inner`.
pub(super) struct Think {
    inner: Box<dyn Stage>,
    state: State,
    buf: String,
    markers: Vec<&'static str>,
}

impl Think {
    pub(super) fn new(inner: Box<dyn Stage>, thinking: bool, enders: Vec<&'static str>) -> Self {
        let mut markers = vec![CLOSE, OPEN];
        markers.extend(enders);
        Think {
            inner,
            state: if thinking { State::Open } else { State::Sniff },
            buf: String::new(),
            markers,
        }
    }

    fn run(&mut self, out: &mut Vec<Delta>) {
        loop {
            match self.state {
                State::Sniff | State::Open => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Reasoning;
                    } else if OPEN.starts_with(t) {
                        return; // Empty, blank, or a prefix of `<think>`.
                    } else if self.state == State::Sniff {
                        self.state = State::Content;
                        let b = std::mem::take(&mut self.buf);
                        self.inner.push(&b, out);
                        return;
                    } else {
                        self.state = State::Reasoning;
                    }
                }
                State::Reasoning => match scan(&self.buf, &self.markers) {
                    Scan::Found { at, which } => {
                        out.push(Delta::Reasoning(self.buf[..at].to_string()));
                        match which {
                            0 => {
                                let rest = self.buf[at + CLOSE.len()..].to_string();
                                self.buf.clear();
                                self.state = State::Content;
                                self.inner.push(&rest, out);
                                return;
                            }
                            // A stray `<think>` inside reasoning is dropped
                            // (SGLang keeps it out of reasoning text).
                            1 => {
                                self.buf.drain(..at + OPEN.len());
                            }
                            // A tool-call opener: reasoning is over, the
                            // marker itself belongs to the tool stage.
                            _ => {
                                let rest = self.buf[at..].to_string();
                                self.buf.clear();
                                self.state = State::Content;
                                self.inner.push(&rest, out);
                                return;
                            }
                        }
                    }
                    Scan::Clear { safe } => {
                        out.push(Delta::Reasoning(self.buf[..safe].to_string()));
                        self.buf.drain(..safe);
                        return;
                    }
                },
                State::Content => return,
            }
        }
    }
}

impl Stage for Think {
    fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        if self.state == State::Content {
            return self.inner.push(text, out);
        }
        self.buf.push_str(text);
        self.run(out);
    }

    fn finish(&mut self, truncated: bool, out: &mut Vec<Delta>) {
        let b = std::mem::take(&mut self.buf);
        match self.state {
            State::Sniff => self.inner.push(&b, out),
            // No `</think>` at all: when the answer started in reasoning, all
            // of it is reasoning (deepseek_r1 behaviour).
            State::Open | State::Reasoning => out.push(Delta::Reasoning(b)),
            State::Content => {}
        }
        self.inner.finish(truncated, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{ReasoningFormat, ToolFormat};

    #[test]
    fn thinking_splits_at_close() {
        let m = maker(None, Some(ReasoningFormat::Think), true, false);
        let p = check(&m, "Let me see.\n</think>\n\nThe answer is 4.", false);
        assert_eq!(
            p,
            parsed(Some("The answer is 4."), Some("Let me see."), &[])
        );
        // A leading `<think>` is dropped.
        let p = check(&m, "<think>\nhmm</think>ok", false);
        assert_eq!(p, parsed(Some("ok"), Some("hmm"), &[]));
    }

    #[test]
    fn thinking_without_close_is_all_reasoning() {
        let m = maker(None, Some(ReasoningFormat::Think), true, false);
        let p = check(&m, "still thinking about 1 < 2 and </thin", true);
        assert_eq!(
            p,
            parsed(None, Some("still thinking about 1 < 2 and </thin"), &[])
        );
    }

    #[test]
    fn not_thinking_but_output_opens_think() {
        let m = maker(None, Some(ReasoningFormat::Think), false, false);
        let p = check(&m, "\n<think>plan</think>\n\nanswer", false);
        assert_eq!(p, parsed(Some("answer"), Some("plan"), &[]));
        let p = check(&m, "just an answer with </think> inside", false);
        assert_eq!(
            p,
            parsed(Some("just an answer with </think> inside"), None, &[])
        );
        let p = check(&m, "<thin", false);
        assert_eq!(p, parsed(Some("<thin"), None, &[]));
    }

    #[test]
    fn close_split_in_one_piece_gives_both_kinds() {
        let m = maker(None, Some(ReasoningFormat::Think), true, false);
        let mut p = m();
        let d = p.push("abc</think>def");
        assert_eq!(
            d,
            vec![
                super::Delta::Reasoning("abc".into()),
                super::Delta::Content("def".into())
            ]
        );
        let m = maker(None, Some(ReasoningFormat::Think), true, false);
        let mut p = m();
        assert!(p.push("abc</th").len() == 1);
        assert_eq!(p.push("ink>x"), vec![super::Delta::Content("x".into())]);
    }

    #[test]
    fn deepseek_reasoning_then_v31_call_inside_reasoning() {
        // With thinking on, a V3.1 call that opens before `</think>` still ends
        // reasoning and is extracted (sglang PR #9446).
        let m = maker(
            Some(ToolFormat::DeepSeekV31),
            Some(ReasoningFormat::DeepSeekV3),
            true,
            true,
        );
        let p = check(
            &m,
            "need weather<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            false,
        );
        assert_eq!(
            p,
            parsed(
                None,
                Some("need weather"),
                &[("call_t_0", "get_weather", "{\"city\":\"Paris\"}")]
            )
        );
    }
}
