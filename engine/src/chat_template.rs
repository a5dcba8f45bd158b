//! Chat templates rendered with minijinja, configured like Hugging Face's renderer:
//! `trim_blocks` and `lstrip_blocks` on, loop controls (`break`/`continue`), Python string and
//! dict methods (`.strip()`, `.startswith()`, `.items()`, …), `raise_exception(msg)`,
//! `strftime_now(fmt)` and a `tojson` filter that prints like Python's `json.dumps`
//! (`", "`/`": "` separators, non-ASCII kept, no HTML escaping).

use anyhow::{anyhow, Result};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles a Jinja template source. Errors carry the template's syntax error and line.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| anyhow!("chat template does not compile: {}", describe(&e)))?;
        Ok(Self { env })
    }

    /// Renders a conversation. `add_generation_prompt` asks the template to open the
    /// assistant's turn; `bos`/`eos` are the texts of the BOS/EOS tokens (`bos_token`,
    /// `eos_token` in the template).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String> {
        let tpl = self
            .env
            .get_template(NAME)
            .map_err(|e| anyhow!("chat template: {}", describe(&e)))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos,
            eos_token => eos,
        };
        tpl.render(ctx)
            .map_err(|e| anyhow!("chat template failed to render: {}", describe(&e)))
    }

    /// Renders OpenAI-shaped messages as JSON values (`tool_calls`, `tool_call_id`,
    /// `reasoning_content`, content parts: whatever the template reads), with `vars` as extra
    /// template variables: `tools` (the request's tool list) and each `chat_template_kwargs`
    /// entry (`enable_thinking`, `thinking`, …), as transformers' `apply_chat_template(...,
    /// tools=..., **kwargs)` passes them. `vars` cannot override `messages`,
    /// `add_generation_prompt`, `bos_token` or `eos_token`.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let tpl = self
            .env
            .get_template(NAME)
            .map_err(|e| anyhow!("chat template: {}", describe(&e)))?;
        let mut ctx: std::collections::BTreeMap<String, Value> = vars
            .iter()
            .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
            .collect();
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Value::from(bos));
        ctx.insert("eos_token".into(), Value::from(eos));
        tpl.render(ctx)
            .map_err(|e| anyhow!("chat template failed to render: {}", describe(&e)))
    }
}

/// An error with its detail and line, on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}

/// `raise_exception(msg)`: templates call it to reject a conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("the template raised an exception: {msg}"),
    ))
}

/// `strftime_now(fmt)`: the current UTC date/time formatted with `%Y %m %d %H %M %S %y %B %b
/// %A %a %j %e %p %I %%`.
fn strftime_now(fmt: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime(&fmt, secs)))
}

/// Formats a Unix time (UTC) with a subset of C's `strftime` directives.
pub(crate) fn strftime(fmt: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix.div_euclid(86_400);
    let tod = unix.rem_euclid(86_400);
    let (h, mi, s) = (tod / 3600, tod % 3600 / 60, tod % 60);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 })),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson(indent=None)`: Python `json.dumps(x, ensure_ascii=False)` formatting, keys in
/// insertion order.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_py_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// Python's `repr` of a float as `json.dumps` prints it.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust prints `1.5e-5`; Python prints `1.5e-05`.
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        return format!("{mant}e{sign}{digits:0>2}");
    }
    if f.fract() == 0.0 {
        format!("{f:.1}")
    } else {
        format!("{f}")
    }
}

/// Writes a value as Python's `json.dumps` does: `", "`/`": "` without indent, newlines and
/// `","` with one.
fn write_py_json(
    v: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            // Integers print as digits; floats (minijinja prints `2.0`, `1e-5`) the Python way.
            let text = v.to_string();
            if text.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
                out.push_str(&text);
            } else {
                out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN)));
            }
        }
        ValueKind::String => out.push_str(&quote(v.as_str().unwrap_or_default())),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&quote(&k.to_string()));
                out.push_str(": ");
                write_py_json(&v.get_item(k)?, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_py_json(x, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        _ => out.push_str(&quote(&v.to_string())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage {
                role: r.to_string(),
                content: c.to_string(),
            })
            .collect()
    }

    #[test]
    fn render_json_passes_tools_kwargs_and_tool_calls() {
        let src = "{% if tools %}T:{{ tools[0].function.name }};{% endif %}{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}{% else %}{{ m.content }}{% endif %};{% endfor %}{% if enable_thinking is defined and not enable_thinking %}nothink{% endif %}";
        let t = ChatTemplate::new(src).unwrap();
        let messages = serde_json::json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
        ]);
        let vars = serde_json::json!({"tools": [{"type": "function", "function": {"name": "g"}}], "enable_thinking": false, "messages": "ignored"});
        let out = t
            .render_json(&messages, false, "", "", vars.as_object().unwrap())
            .unwrap();
        assert_eq!(out, "T:g;user:hi;assistant:f;nothink");
    }

    #[test]
    fn chatml() {
        let src = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let t = ChatTemplate::new(src).unwrap();
        let out = t.render(&msgs(&[("user", "Hi")]), true, "", "").unwrap();
        assert_eq!(out, "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn hf_features() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\n  {{ m.content.strip() | upper }}{% if m.content.startswith(' h') %}!{% endif %}\n{% endfor %}{{ {'a': [1, 2.0, 'é<']} | tojson }}{{ eos_token }}";
        let t = ChatTemplate::new(src).unwrap();
        let out = t
            .render(
                &msgs(&[("system", "s"), ("user", " hi ")]),
                false,
                "<s>",
                "</s>",
            )
            .unwrap();
        assert_eq!(out, "<s>  HI!{\"a\": [1, 2.0, \"é<\"]}</s>");
        let t = ChatTemplate::new(
            "{% if messages|length > 1 %}{{ raise_exception('only one message') }}{% endif %}ok",
        )
        .unwrap();
        let e = t
            .render(&msgs(&[("user", "a"), ("user", "b")]), false, "", "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("only one message"), "{e}");
        let e = ChatTemplate::new("{% for %}").unwrap_err().to_string();
        assert!(e.contains("does not compile"), "{e}");
        let t = ChatTemplate::new("{{ strftime_now('%Y') | length }}").unwrap();
        assert_eq!(t.render(&[], false, "", "").unwrap(), "4");
        let t = ChatTemplate::new("{{ [1e-5, 2.5e20, 3.0, -7, 0.1, {}, []] | tojson }}").unwrap();
        assert_eq!(
            t.render(&[], false, "", "").unwrap(),
            "[1e-05, 2.5e+20, 3.0, -7, 0.1, {}, []]"
        );
        let t = ChatTemplate::new("{{ {'k': {'x': 1}} | tojson(indent=2) }}").unwrap();
        assert_eq!(
            t.render(&[], false, "", "").unwrap(),
            "{\n  \"k\": {\n    \"x\": 1\n  }\n}"
        );
    }

    #[test]
    fn strftime_dates() {
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A %j", 0),
            "1970-01-01 00:00:00 Thursday 001"
        );
        // 2024-02-29 12:34:56 UTC
        assert_eq!(
            strftime("%d %B %Y, %a %b %I%p %j", 1_709_210_096),
            "29 February 2024, Thu Feb 12PM 060"
        );
        assert_eq!(strftime("%d %b %Y", 1_735_689_600), "01 Jan 2025");
    }
}
