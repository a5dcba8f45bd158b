//! Restores the default action of SIGPIPE (the Rust runtime ignores it), so that a bench tool
//! piped into `head` ends quietly when `head` exits, as `dayone` does (cli/src/output.rs),
//! instead of panicking in `println!` with "Broken pipe".

/// Call first in `main`, before any thread exists.
pub fn restore() {
    #[cfg(unix)]
    // SAFETY: setting a signal disposition to SIG_DFL at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
