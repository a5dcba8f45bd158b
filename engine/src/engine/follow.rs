//! Keeping the engines of all ranks in step (SGLang's design: every tensor-parallel rank runs a
//! scheduler, and rank 0 forwards what it receives). Rank 0 records each call that changes the
//! scheduler's state (a request added or aborted, the prefix cache reset, new stop ids) and
//! sends the record before each step; the other ranks replay it and step too, so every rank
//! makes the same scheduling, caching, paging and checkpoint decisions on its own slice of the
//! cache (the host tier and state checkpoints included) without a second protocol for them.
//! Only rank 0 samples; the tokens it picks reach the others with the step.

use super::Engine;
use crate::cache::prefix::ExtraKeys;
use crate::sampling::SamplingParams;
use anyhow::{bail, Context, Result};
use dayone_backend::comm::HostGroup;
use dayone_backend::Backend;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What rank 0 tells the other ranks, in the order it happened.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) enum Command {
    /// `add_request_scored` that succeeded on rank 0 with id `id`.
    Add {
        id: u64,
        prompt: Vec<u32>,
        params: SamplingParams,
        extra_keys: ExtraKeys,
        prompt_logprobs: Option<usize>,
    },
    /// `abort(id)`.
    Abort(u64),
    /// `reset_prefix_cache()`.
    ResetPrefixCache,
    /// `set_eos_ids(ids)`.
    SetEos(Vec<u32>),
    /// `step()`: the tokens follow once rank 0 has sampled them.
    Step,
    /// `trace_prefill(prompt)`.
    Trace(Vec<u32>),
    /// Rank 0's engine is gone: leave [`Engine::follow`].
    Shutdown,
}

/// The engine's side of the rank group.
pub(super) struct Mirror {
    pub group: Arc<dyn HostGroup>,
    /// Rank 0: calls not yet sent.
    pub outbox: Vec<Command>,
    /// Set before the ranks part ([`crate::parallel::Distributed::done`]).
    pub done: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Mirror {
    /// The orderly end: marks it, then waits until every rank got there (so none exits while
    /// another still reads from it).
    fn part(&self) -> Result<()> {
        if let Some(d) = &self.done {
            d.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.group.barrier()
    }
}

impl<B: Backend> Engine<B> {
    /// Whether this engine replays rank 0's calls (a rank other than 0).
    pub(super) fn is_follower(&self) -> bool {
        self.mirror.as_ref().is_some_and(|m| m.group.rank() != 0)
    }

    /// Rank 0: remembers a call for the other ranks.
    pub(super) fn record(&mut self, c: Command) {
        if let Some(m) = self.mirror.as_mut() {
            if m.group.rank() == 0 {
                m.outbox.push(c);
            }
        }
    }

    /// Rank 0: sends the recorded calls followed by `last`.
    pub(super) fn send(&mut self, last: Command) -> Result<()> {
        let Some(m) = self.mirror.as_mut() else {
            return Ok(());
        };
        if m.group.rank() != 0 {
            return Ok(());
        }
        m.outbox.push(last);
        let msg = serde_json::to_vec(&m.outbox)?;
        m.outbox.clear();
        m.group.broadcast_bytes(&msg, false)?;
        Ok(())
    }

    /// Rank 0 sends the tokens it sampled this step; the others receive them.
    pub(super) fn share_tokens(&self, tokens: Option<&[u32]>) -> Result<Vec<u32>> {
        let m = self.mirror.as_ref().expect("called with a group");
        let mine: Vec<u8> = tokens
            .unwrap_or(&[])
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        let got = m
            .group
            .broadcast_bytes(&mine, false)
            .context("receiving the step's tokens from rank 0")?;
        Ok(got
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }

    /// A rank other than 0: replays rank 0's calls, stepping when it steps, until rank 0's
    /// engine shuts down. Errors: a broken group (a rank gone), or a rank whose state left
    /// rank 0's (named, never silently diverging).
    pub fn follow(&mut self) -> Result<()> {
        let Some(group) = self.mirror.as_ref().map(|m| m.group.clone()) else {
            bail!("follow: this engine is not part of a rank group");
        };
        if group.rank() == 0 {
            bail!("follow: rank 0 leads; only the other ranks follow");
        }
        loop {
            let msg = group.broadcast_bytes(&[], true)?;
            let cmds: Vec<Command> =
                serde_json::from_slice(&msg).context("a message from rank 0")?;
            for c in cmds {
                match c {
                    Command::Add {
                        id,
                        prompt,
                        params,
                        extra_keys,
                        prompt_logprobs,
                    } => {
                        let got = self
                            .add_request_scored(prompt, params, extra_keys, prompt_logprobs)
                            .with_context(|| format!("rank {}: request {id}", group.rank()))?;
                        if got != id {
                            bail!(
                                "rank {} numbered request {id} as {got}: the ranks diverged",
                                group.rank()
                            );
                        }
                    }
                    Command::Abort(id) => {
                        self.abort(id)?;
                    }
                    Command::ResetPrefixCache => self.reset_prefix_cache(),
                    Command::SetEos(ids) => self.set_eos_ids(ids),
                    Command::Step => {
                        self.step()?;
                    }
                    Command::Trace(prompt) => {
                        self.trace_prefill(&prompt)?;
                    }
                    Command::Shutdown => {
                        if let Some(m) = &self.mirror {
                            m.part()?;
                        }
                        return Ok(());
                    }
                }
            }
        }
    }
}

impl<B: Backend> Drop for Engine<B> {
    fn drop(&mut self) {
        // Rank 0 releases the followers; a broken group has nobody left to tell.
        if self.mirror.as_ref().is_some_and(|m| m.group.rank() == 0)
            && self.send(Command::Shutdown).is_ok()
        {
            if let Some(m) = &self.mirror {
                let _ = m.part();
            }
        }
    }
}
