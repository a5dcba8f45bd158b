//! Ctrl-C (SIGINT): the first one asks the running command to stop after the current step
//! (it then prints what it has, with `finish_reason: "abort"`, and its stats); a second one
//! exits at once. Either way the exit code is 130 (128 + SIGINT), as llama.cpp's.

use std::sync::atomic::{AtomicBool, Ordering};

/// 128 + SIGINT, the shell's code for a process stopped by Ctrl-C.
pub const EXIT_CODE: i32 = 130;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Installs the handler. A failure (another handler already set) leaves Ctrl-C's default
/// behaviour, which still stops the process.
pub fn install() {
    let _ = ctrlc::set_handler(|| {
        if REQUESTED.swap(true, Ordering::SeqCst) {
            // The second Ctrl-C: the user does not want to wait for the current step.
            std::process::exit(EXIT_CODE);
        }
    });
}

/// Whether Ctrl-C was pressed; polled between engine steps.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Forgets a Ctrl-C already handled (`dayone chat`: it stopped one answer, the session goes on,
/// and the next Ctrl-C again only stops an answer).
pub fn clear() {
    REQUESTED.store(false, Ordering::SeqCst);
}
