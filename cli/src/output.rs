//! Writing to stdout: broken pipes, and text held back until its characters are complete.

/// Restores the default action of SIGPIPE (the Rust runtime ignores it), so that `dayone … |
/// head` ends quietly when `head` exits, killed by SIGPIPE like `cat`, `seq` or llama.cpp's
/// `llama-cli` (the shell reports 141), instead of failing with "Broken pipe". Generation stops
/// at the next write: nothing is computed for a reader that is gone.
pub fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal disposition to SIG_DFL at start-up (after parsing the command
    // line), before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `text` without a trailing incomplete character: the detokenizer renders the bytes of a
/// character cut off by the end of generation (or by Ctrl-C) as U+FFFD; those are dropped
/// rather than printed. A U+FFFD in the middle of the text is kept.
pub fn without_incomplete_tail(text: &str) -> &str {
    text.trim_end_matches('\u{FFFD}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_trailing_replacement_character_is_dropped() {
        assert_eq!(without_incomplete_tail("ab\u{FFFD}"), "ab");
        assert_eq!(without_incomplete_tail("a\u{FFFD}b"), "a\u{FFFD}b");
        assert_eq!(without_incomplete_tail(""), "");
    }
}
