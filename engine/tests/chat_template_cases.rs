//! Chat templates rendered by dayone against outputs of transformers' Jinja setup
//! (`tests/data/gen_chat_template_cases.py` wrote the cases with Python's jinja2).

use dayone_engine::chat_template::{ChatMessage, ChatTemplate};
use serde_json::Value;

#[test]
fn matches_python_jinja() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/chat_template_cases.json"
    ))
    .unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    let mut failures = Vec::new();
    for c in &cases {
        let name = c["name"].as_str().unwrap();
        let messages: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).unwrap();
        let t = ChatTemplate::new(c["template"].as_str().unwrap()).unwrap();
        let got = t.render(
            &messages,
            c["add_generation_prompt"].as_bool().unwrap(),
            c["bos_token"].as_str().unwrap(),
            c["eos_token"].as_str().unwrap(),
        );
        match (
            got,
            c.get("output").and_then(|o| o.as_str()),
            c.get("error").and_then(|e| e.as_str()),
        ) {
            (Ok(out), Some(want), _) if out == want => {}
            (Err(e), None, Some(msg)) if e.to_string().contains(msg) => {}
            (got, want, err) => failures.push(format!(
                "{name}:\n  got  {got:?}\n  want {want:?} / error {err:?}"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
