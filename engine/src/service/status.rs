//! The service's state (serving, shutting down, stopped) and the command channel into the
//! engine thread, shared by handles and streams.

use super::thread::Command;
use anyhow::{anyhow, Result};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Where the service stands.
#[derive(Clone, Debug)]
enum State {
    Serving,
    /// `shutdown` was called: no new requests; in-flight ones finish or are aborted.
    ShuttingDown,
    /// The engine thread has ended, for the reason given.
    Stopped(String),
}

/// The service's state, written by handles (shutdown) and by the engine thread (stopped).
#[derive(Debug)]
pub(crate) struct Status(Mutex<State>);

impl Status {
    pub(crate) fn new() -> Self {
        Self(Mutex::new(State::Serving))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops accepting requests (unless already stopped).
    pub(crate) fn begin_shutdown(&self) {
        let mut s = self.lock();
        if matches!(*s, State::Serving) {
            *s = State::ShuttingDown;
        }
    }

    /// The engine thread has ended for `reason`.
    pub(crate) fn stop(&self, reason: String) {
        *self.lock() = State::Stopped(reason);
    }

    /// Errors when new requests are not accepted: shutting down, or stopped (with the reason).
    pub(crate) fn check_accepting(&self) -> Result<()> {
        match &*self.lock() {
            State::Serving => Ok(()),
            State::ShuttingDown => Err(anyhow!(
                "engine is shutting down: it accepts no new requests"
            )),
            State::Stopped(why) => Err(anyhow!("engine stopped: {why}")),
        }
    }

    /// `engine stopped: <reason>` (the reason is not known yet while the thread is unwinding).
    pub(crate) fn stopped_message(&self) -> String {
        match &*self.lock() {
            State::Stopped(why) => format!("engine stopped: {why}"),
            _ => "engine stopped: its thread ended unexpectedly".to_string(),
        }
    }
}

/// What handles and streams share: the command channel and the status.
pub(crate) struct Shared {
    pub(crate) commands: Sender<Command>,
    pub(crate) status: Arc<Status>,
}

impl Shared {
    /// Sends `cmd`; errors (`engine stopped: <reason>`) when the engine thread has ended.
    pub(crate) fn send(&self, cmd: Command) -> Result<()> {
        self.commands
            .send(cmd)
            .map_err(|_| anyhow!(self.status.stopped_message()))
    }

    /// Asks the engine thread to abort request `id` (a no-op if it has already finished).
    pub(crate) fn abort(&self, id: u64) -> Result<()> {
        self.send(Command::Abort(id))
    }
}
