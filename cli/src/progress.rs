//! Progress bars on stderr (hidden when stderr is not a terminal), each one line that fits the
//! terminal's width (80 columns as well as 200): the variable part is a `{wide_msg}`, which
//! indicatif truncates to the room left.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// Prompts at least this long get a prefill bar (shorter ones finish before it would show).
pub const PREFILL_BAR_MIN_TOKENS: usize = 256;

/// A bar of `len` steps drawn on stderr (hidden when `quiet`); indicatif itself draws nothing
/// when stderr is not a terminal.
fn bar(len: u64, quiet: bool) -> ProgressBar {
    if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
    }
}

/// The load bar: `loading <file> on <backend> [=====>    ] 12/30` (tensors).
pub fn load_bar(tensors: usize, what: String, quiet: bool) -> ProgressBar {
    let b = bar(tensors as u64, quiet);
    b.set_style(
        ProgressStyle::with_template("loading {wide_msg} [{bar:20}] {pos}/{len}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    b.set_message(what);
    b
}

/// The prefill bar: `prefill [=====>    ] 2048/2351 tokens, 812 tok/s, 2.5 s` (hidden for prompts
/// shorter than [`PREFILL_BAR_MIN_TOKENS`]).
pub fn prefill_bar(prompt_tokens: usize, quiet: bool) -> ProgressBar {
    let b = bar(
        prompt_tokens as u64,
        quiet || prompt_tokens < PREFILL_BAR_MIN_TOKENS,
    );
    b.set_style(
        ProgressStyle::with_template(
            "prefill [{bar:20}] {pos}/{len} tokens, {tps}, {elapsed_s}{wide_msg}",
        )
        .expect("valid template")
        .with_key("tps", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.0} tok/s", s.per_sec());
        })
        .with_key(
            "elapsed_s",
            |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.1} s", s.elapsed().as_secs_f64());
            },
        )
        .progress_chars("=> "),
    );
    // Drawn at once, and redrawn every half second: the first chunk of a long prompt may take
    // a minute, and the elapsed time should move meanwhile.
    b.tick();
    if !b.is_hidden() {
        b.enable_steady_tick(std::time::Duration::from_millis(500));
    }
    b
}

/// The last path component (a model directory's or a GGUF file's name), for one-line messages.
pub fn short_path(p: &std::path::Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}
