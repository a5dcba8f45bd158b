//! Usage errors found after parsing (a missing prompt, flags that only make sense together):
//! reported in clap's form and with clap's exit code 2, like the errors clap finds itself.

use clap::error::ErrorKind;

/// A mistake in the command line itself, not in the model or the device: exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A usage error as an `anyhow::Error` (for `bail!`-style returns).
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Prints `e` as clap prints its own errors (`error: …`, the subcommand's usage line, the hint
/// to try `--help`) and exits with clap's usage exit code, 2.
pub fn exit(cli: &mut clap::Command, subcommand: &str, e: &UsageError) -> ! {
    cli.build();
    match cli.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(ErrorKind::ArgumentConflict, &e.0).exit(),
        None => cli.error(ErrorKind::ArgumentConflict, &e.0).exit(),
    }
}
