//! Expert parallelism by dispatch and combine (GShard, Lepikhin et al. 2020 §2.2; DeepEP's
//! normal mode): routed experts live on `ep` groups of ranks, each expert's width split over
//! the `world / ep` ranks of its group. Attention leaves every token on every rank, so each
//! rank takes a share of the tokens (rank `r`: tokens `r·T .. (r+1)·T`, `T = ⌈N / world⌉`):
//!
//! ```text
//! dispatch: for each owned token t and pick j (expert e, weight w): the row x_t goes to every
//!           rank of e's group, tagged (local expert, w)                   — all-to-all
//! experts:  each rank runs its experts on the rows it received (k = 1 per row), weighted
//! combine:  the outputs go back to the ranks that sent them                — all-to-all
//!           y_t = Σ over its k · (world / ep) returned rows, in a fixed order
//! gather:   every rank's owned y rows to every rank                        — all-gather
//! ```
//!
//! No token is dropped (buffers are sized by the counts of each step). The sum order per token is
//! fixed (pick, then rank in the group), so a run repeats bit for bit; it differs from one rank's
//! sum order, so results equal one rank's within rounding.

use super::Moe;
use anyhow::{bail, Result};
use dayone_backend::{Backend, HostTensor, TensorInfo};

/// One step's routing, planned on the host.
struct Plan {
    /// Tokens each rank owns (`T`; the last ranks may own fewer, padded to `T`).
    per_rank: usize,
    /// This rank's first owned token and how many it owns.
    owned: (usize, usize),
    /// Rows sent to each rank.
    send: Vec<usize>,
    /// Per sent row, in send order: the owned token's global index.
    rows: Vec<u32>,
    /// Per sent row: the expert on the destination rank.
    local_ids: Vec<u32>,
    /// Per sent row: the routing weight.
    weights: Vec<f32>,
    /// For contribution `c` (pick `j`, group rank `i`: `c = j·inner + i`) of owned token `t`:
    /// its row in send order, `slot[c][t]`.
    slot: Vec<Vec<u32>>,
}

impl<B: Backend> Moe<B> {
    /// Whether routed experts are spread over expert groups (dispatch and combine).
    pub(super) fn dispatches(&self) -> bool {
        self.local_experts < self.experts
    }

    fn plan(&self, ids: &[u32], weights: &[f32], n: usize, k: usize) -> Result<Plan> {
        let par = &self.parallel;
        let (world, rank, ep) = (par.world(), par.rank(), par.ep);
        let inner = world / ep;
        let per_group = self.experts / ep;
        let per_rank = n.div_ceil(world).max(1);
        let first = (rank * per_rank).min(n);
        let count = per_rank.min(n - first);
        // (destination, token, contribution, local expert, weight), then stably by destination.
        let mut picks = Vec::with_capacity(count * k * inner);
        for t in first..first + count {
            for j in 0..k {
                let e = ids[t * k + j] as usize;
                if e >= self.experts {
                    bail!("moe: the router chose expert {e} of {}", self.experts);
                }
                let g = e / per_group;
                for i in 0..inner {
                    picks.push((
                        g * inner + i,
                        t,
                        j * inner + i,
                        (e - g * per_group) as u32,
                        weights[t * k + j],
                    ));
                }
            }
        }
        picks.sort_by_key(|p| p.0);
        let mut send = vec![0usize; world];
        let mut slot = vec![vec![0u32; count]; k * inner];
        let (mut rows, mut local_ids, mut ws) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, &(dest, t, c, e, w)) in picks.iter().enumerate() {
            send[dest] += 1;
            slot[c][t - first] = pos as u32;
            rows.push(t as u32);
            local_ids.push(e);
            ws.push(w);
        }
        Ok(Plan {
            per_rank,
            owned: (first, count),
            send,
            rows,
            local_ids,
            weights: ws,
            slot,
        })
    }

    /// The routed experts' output `[N, D]` for `x` `[N, D]` with the router's choices `ids`,
    /// `weights` `[N, k]`, by dispatch and combine over the ranks (module doc).
    pub(super) fn dispatched_experts(
        &self,
        b: &B,
        x: &B::Tensor,
        ids: &B::Tensor,
        weights: &B::Tensor,
    ) -> Result<B::Tensor> {
        let comm = &self.parallel.comm;
        let (n, d) = (x.shape()[0], x.shape()[1]);
        let k = ids.shape()[1];
        let p = self.plan(
            &b.download(ids)?.to_u32()?,
            &b.download(weights)?.to_f32(),
            n,
            k,
        )?;
        let u32s =
            |v: &[u32]| -> Result<B::Tensor> { b.upload(&HostTensor::from_u32(vec![v.len()], v)?) };
        let sent = p.rows.len();
        // Dispatch: the rows, their experts and weights.
        let (x_in, x_counts) = if sent > 0 {
            comm.all_to_all(b, &b.embedding(x, &u32s(&p.rows)?)?, &p.send)?
        } else {
            comm.all_to_all(b, &b.zeros(&[0, d], x.dtype())?, &p.send)?
        };
        let (e_in, _) =
            comm.all_to_all(b, &b.reshape(&u32s(&p.local_ids)?, &[sent, 1])?, &p.send)?;
        let w_host = HostTensor::from_f32(vec![sent, 1], &p.weights)?;
        let (w_in, _) = comm.all_to_all(b, &b.upload(&w_host)?, &p.send)?;
        let got: usize = x_counts.iter().sum();
        // This rank's experts on what it received, one expert per row.
        let y_in = if got == 0 {
            b.zeros(&[0, d], x.dtype())?
        } else {
            match self.clamped {
                Some(l) => self.clamped_experts(b, &x_in, &e_in, &w_in, l)?,
                None => b.moe_experts(&x_in, &e_in, &w_in, &self.gate_up, &self.down)?,
            }
        };
        // Combine: back to the senders, in the order they sent.
        let (y_back, back) = comm.all_to_all(b, &y_in, &x_counts)?;
        if back != p.send {
            bail!("moe combine: got {back:?} rows back for {:?} sent", p.send);
        }
        // Each owned token's contributions summed in a fixed order (row gathers and adds).
        let (_, count) = p.owned;
        let mut mine = b.zeros(&[p.per_rank, d], x.dtype())?;
        if count > 0 {
            let pad = |v: &[u32]| {
                let mut v = v.to_vec();
                v.resize(p.per_rank, v[0]);
                v
            };
            for (c, s) in p.slot.iter().enumerate() {
                let part = b.embedding(&y_back, &u32s(&pad(s))?)?;
                mine = if c == 0 { part } else { b.add(&mine, &part)? };
            }
        }
        // Every rank's owned rows to every rank; the padding rows dropped.
        let all = comm.all_gather(b, &mine)?;
        let order: Vec<u32> = (0..n as u32).collect();
        b.embedding(&all, &u32s(&order)?)
    }
}
