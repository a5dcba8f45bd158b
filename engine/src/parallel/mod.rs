//! Tensor and expert parallelism: which slice of each layer a rank holds, and the collectives
//! that join the slices (Megatron-LM's column/row split, Shoeybi et al. 2019 §3; vLLM's
//! layouts, shared/docs/multigpu-perf.md §B).
//!
//! - Attention and KDA: heads split over the ranks (`W_q,k,v` by rows, `W_o` by columns, one
//!   all-reduce after `W_o`); key/value heads too, or replicated when there are fewer of them
//!   than ranks. MLA: query and `W_kvb` heads split, the latent projections and the latent
//!   cache replicated; the DSA indexer replicated.
//! - Dense MLP: `gate`/`up` by rows, `down` by columns, one all-reduce.
//! - MoE: routed experts over `ep` groups of ranks, each expert's width split over the
//!   `world / ep` ranks of its group; the router replicated; shared experts split over all
//!   ranks. With `ep = 1` routed and shared partial sums are joined by one all-reduce; with
//!   `ep > 1` tokens reach their experts by dispatch and combine all-to-alls
//!   ([`crate::layers::Moe`], `layers/moe_dispatch.rs`).
//! - Embedding and LM head split by vocabulary rows: a masked lookup plus an all-reduce, and
//!   local logits gathered in vocabulary order.
//!
//! - Context parallelism ([`context`]): the weights replicated, each long step's tokens split
//!   over the ranks; keys all-gathered, recurrent state passed from rank to rank.
//!
//! Every rank runs the same engine and scheduler on the same requests (rank 0 forwards them,
//! and the tokens it samples, see [`crate::engine`]); [`Parallel`] is what the layers see.

use crate::loader::Split;
use anyhow::{bail, Result};
use dayone_backend::comm::{Comm, HostGroup, LocalComm};
use dayone_backend::Backend;
use std::sync::Arc;

pub mod context;
pub use context::{ContextParallel, CpStep};

/// This rank's place in the model's split, handed to the layers at load time.
pub struct Parallel<B: Backend> {
    /// The collectives among the ranks a layer's weights are split over (tensor parallelism;
    /// the world of one under context parallelism, whose weights are replicated).
    pub comm: Arc<dyn Comm<B>>,
    /// Expert-parallel size: routed experts are divided among this many groups of ranks.
    pub ep: usize,
    /// Context parallelism: the ranks that split each long step's tokens ([`context`]).
    pub context: Option<Arc<dyn Comm<B>>>,
}

impl<B: Backend> Clone for Parallel<B> {
    fn clone(&self) -> Self {
        Self {
            comm: self.comm.clone(),
            ep: self.ep,
            context: self.context.clone(),
        }
    }
}

impl<B: Backend> Default for Parallel<B> {
    fn default() -> Self {
        Self::single()
    }
}

impl<B: Backend> Parallel<B> {
    /// One rank: every split is the whole tensor, every collective the identity.
    pub fn single() -> Self {
        Self {
            comm: Arc::new(LocalComm),
            ep: 1,
            context: None,
        }
    }

    /// Context parallelism over the ranks of `comm`: every rank holds the whole model (the
    /// weight split is the world of one) and each long step's tokens are split over the ranks.
    pub fn context(comm: Arc<dyn Comm<B>>) -> Self {
        Self {
            context: Some(comm),
            ..Self::single()
        }
    }

    /// Ranks joined by `comm`, experts over `ep` groups. Errors: `ep` not dividing the world.
    pub fn new(comm: Arc<dyn Comm<B>>, ep: usize) -> Result<Self> {
        let world = comm.world();
        if ep == 0 || world % ep != 0 {
            bail!("expert_parallel_size ({ep}) must divide tensor_parallel_size ({world})");
        }
        Ok(Self {
            comm,
            ep,
            context: None,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Whether this is the first rank of the job (rank 0 of the tensor-parallel and of the
    /// context-parallel group): the one that logs what every rank would say alike.
    pub fn is_first(&self) -> bool {
        self.rank() == 0 && self.context.as_ref().is_none_or(|c| c.rank() == 0)
    }

    /// Ranks in all.
    pub fn world(&self) -> usize {
        self.comm.world()
    }

    /// Piece `rank` of `world` along `dim` (column-parallel weights: dim 0 of `[out, in]`;
    /// row-parallel: dim 1).
    pub fn split(&self, dim: usize) -> Split {
        Split::along(dim, self.world(), self.rank())
    }

    /// The key/value heads this rank keeps out of `kv_heads` when the query heads are split
    /// over the ranks: `(first, count)`. With fewer key/value heads than ranks each is
    /// replicated on `world / kv_heads` ranks (vLLM). Errors: counts that do not divide.
    pub fn kv_heads(&self, heads: usize, kv_heads: usize) -> Result<(usize, usize)> {
        kv_split(self.rank(), self.world(), heads, kv_heads)
    }

    /// `(first expert, experts, split of each expert's width)` this rank holds of `experts`.
    /// Errors: experts not dividing over the expert groups, or a width not dividing over the
    /// ranks of a group.
    pub fn experts(&self, experts: usize, width: usize) -> Result<(usize, usize, Split)> {
        expert_split(self.rank(), self.world(), self.ep, experts, width)
    }

    /// `Σ_ranks x` (the end of a row-parallel layer); the identity on one rank.
    pub fn all_reduce(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        if self.world() == 1 {
            return Ok(x.clone());
        }
        self.comm.all_reduce_sum(b, x)
    }
}

/// What an engine needs to run as one rank of several: the device collectives its layers use
/// and the host group that keeps the ranks' schedulers in step.
pub struct Distributed<B: Backend> {
    /// The split and its collectives.
    pub parallel: Parallel<B>,
    /// Control messages (rank 0's requests and sampled tokens).
    pub group: Arc<dyn HostGroup>,
    /// Set just before the ranks part in order (rank 0's engine shutting down), so that a
    /// watcher of the peers ([`dayone_backend::comm_tcp::TcpGroup::watch_peers`]) does not take
    /// their exit for a failure.
    pub done: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Ranks drawing on this rank's pool of memory (several ranks on one host's memory, or on
    /// one GPU): the cache is sized from this share of the free memory. At least 1.
    pub memory_shared_by: usize,
}

/// [`Parallel::kv_heads`] for `rank` of `world`.
pub fn kv_split(
    rank: usize,
    world: usize,
    heads: usize,
    kv_heads: usize,
) -> Result<(usize, usize)> {
    if !heads.is_multiple_of(world) {
        bail!("the layer's {heads} attention heads do not split over tensor_parallel_size {world}");
    }
    if kv_heads.is_multiple_of(world) {
        Ok((rank * kv_heads / world, kv_heads / world))
    } else if world.is_multiple_of(kv_heads) {
        Ok((rank * kv_heads / world, 1))
    } else {
        bail!(
            "the layer's {kv_heads} key/value heads neither split over nor divide tensor_parallel_size {world}"
        )
    }
}

/// [`Parallel::experts`] for `rank` of `world` with `ep` expert groups.
pub fn expert_split(
    rank: usize,
    world: usize,
    ep: usize,
    experts: usize,
    width: usize,
) -> Result<(usize, usize, Split)> {
    if ep == 0 || !world.is_multiple_of(ep) {
        bail!("expert_parallel_size ({ep}) must divide tensor_parallel_size ({world})");
    }
    if !experts.is_multiple_of(ep) {
        bail!("{experts} routed experts do not split over expert_parallel_size {ep}");
    }
    let inner = world / ep;
    if !width.is_multiple_of(inner) {
        bail!(
            "the experts' width {width} does not split over the {inner} ranks of each expert group (tensor_parallel_size {world} / expert_parallel_size {ep})"
        );
    }
    let group = rank / inner;
    let per = experts / ep;
    Ok((group * per, per, Split::along(0, inner, rank % inner)))
}

/// Whether `width` (heads, an MLP's width) splits over `world` ranks, as an error naming `what`.
pub fn divides(width: usize, world: usize, what: &str) -> Result<()> {
    if !width.is_multiple_of(world) {
        bail!("the layer's {width} {what} do not split over tensor_parallel_size {world}");
    }
    Ok(())
}
