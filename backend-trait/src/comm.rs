//! Collectives between the ranks of one model split over several devices (tensor and expert
//! parallelism), and the host-side group that carries a step's control messages.
//!
//! Two layers, as vLLM gives every group a device communicator and a CPU one:
//! - [`HostGroup`]: bytes between ranks on the host (the NCCL id at start-up, each step's
//!   requests and sampled tokens). [`star`] builds one over any [`Link`]: channels between
//!   threads ([`thread_group`]) or TCP sockets between processes and machines
//!   ([`crate::comm_tcp`]).
//! - [`Comm`]: collectives over device tensors of one backend. [`LocalComm`] is the world of
//!   one (every op is the identity), so single-device code paths are the parallel ones;
//!   [`HostComm`] runs the collectives through a [`HostGroup`] (download, exchange, upload) for
//!   the CPU and WGSL backends; the CUDA backend has NCCL (`dayone_cuda::NcclComm`).
//!
//! Every rank calls every collective in the same order (SPMD); a rank that leaves the group
//! turns the next collective of the others into an error naming it, never a hang.

use crate::{Backend, DType, HostTensor, TensorInfo};
use anyhow::{anyhow, bail, Result};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Collectives over device tensors of backend `B` among `world()` ranks.
///
/// Conventions: tensors are row-major; "rows" are slices along dim 0. All ranks pass tensors of
/// equal shape and dtype (except [`Comm::all_to_all`]'s row counts). Sums are in f32 for float
/// dtypes; the order of summation is the implementation's (NCCL's ring or tree; [`HostComm`]:
/// rank order), so results equal one rank's only within rounding.
pub trait Comm<B: Backend>: Send + Sync {
    /// This rank, `0..world()`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world(&self) -> usize;

    /// `Σ_ranks x`, the same on every rank. `x` any shape → same shape and dtype.
    fn all_reduce_sum(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor>;

    /// Every rank's `x` `[R, ...]` stacked in rank order → `[world·R, ...]`.
    fn all_gather(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor>;

    /// `Σ_ranks x` split into `world` row blocks, block `rank` kept: `x` `[world·R, ...]` →
    /// `[R, ...]`.
    fn reduce_scatter_sum(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor>;

    /// All-to-all with variable row counts (MoE dispatch and combine): `x` `[Σ send, ...]`
    /// holds `send[j]` consecutive rows for rank `j`, in rank order; returns the rows every rank
    /// sent to this one, in source-rank order, and how many came from each rank.
    fn all_to_all(&self, b: &B, x: &B::Tensor, send: &[usize]) -> Result<(B::Tensor, Vec<usize>)>;

    /// Rank `root`'s `x` on every rank (`x` of the same shape and dtype everywhere).
    fn broadcast(&self, b: &B, x: &B::Tensor, root: usize) -> Result<B::Tensor>;

    /// An all-gather of unequal row counts (context parallelism's key rows and logits): the
    /// first `counts[r]` rows of rank `r`'s `x`, stacked in rank order → `[Σ counts, ...]`.
    /// `x` `[R, ...]` with `R ≥ max(counts[rank], 1)` (rows past `counts[rank]` are ignored),
    /// the same trailing shape and dtype everywhere; `counts` (one per rank, not all zero) the
    /// same on every rank.
    ///
    /// Default: pad every rank's rows to the largest count with a row gather
    /// ([`Backend::embedding`] over a `[R, width]` view, so float dtypes only),
    /// [`Comm::all_gather`], and pick the real rows with a second row gather.
    fn all_gather_rows(&self, b: &B, x: &B::Tensor, counts: &[usize]) -> Result<B::Tensor> {
        let (me, w) = (self.rank(), self.world());
        let (rows, tail) = gather_rows_shape(x.shape(), counts, me, w)?;
        let total: usize = counts.iter().sum();
        let max = counts.iter().copied().max().unwrap_or(0);
        let width: usize = tail.iter().product();
        let out_shape: Vec<usize> = std::iter::once(total).chain(tail.iter().copied()).collect();
        if counts.iter().all(|&c| c == rows) {
            return b.reshape(&self.all_gather(b, x)?, &out_shape);
        }
        let ids = |v: Vec<u32>| b.upload(&HostTensor::from_u32(vec![v.len()], &v)?);
        let flat = b.reshape(x, &[rows, width])?;
        let pad = ids((0..max).map(|i| i.min(rows - 1) as u32).collect())?;
        let all = self.all_gather(b, &b.embedding(&flat, &pad)?)?;
        let pick = ids((0..w)
            .flat_map(|r| (0..counts[r]).map(move |i| (r * max + i) as u32))
            .collect())?;
        b.reshape(&b.embedding(&all, &pick)?, &out_shape)
    }

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
}

/// Checks [`Comm::all_gather_rows`]'s arguments; returns `x`'s rows and its trailing shape.
fn gather_rows_shape(
    shape: &[usize],
    counts: &[usize],
    rank: usize,
    world: usize,
) -> Result<(usize, Vec<usize>)> {
    let rows = shape.first().copied().unwrap_or(0);
    if counts.len() != world || counts.iter().all(|&c| c == 0) {
        bail!("all_gather_rows: {counts:?} must give one row count per rank ({world}), not all 0");
    }
    if rows < counts[rank].max(1) {
        bail!(
            "all_gather_rows: rank {rank} has {rows} rows of {shape:?}, fewer than its count {} (or 1)",
            counts[rank]
        );
    }
    Ok((rows, shape[1..].to_vec()))
}

/// The world of one rank: every collective returns its input.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalComm;

impl<B: Backend> Comm<B> for LocalComm {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        Ok(x.clone())
    }
    fn all_gather(&self, _b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        Ok(x.clone())
    }
    fn reduce_scatter_sum(&self, _b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        Ok(x.clone())
    }
    fn all_to_all(&self, _b: &B, x: &B::Tensor, send: &[usize]) -> Result<(B::Tensor, Vec<usize>)> {
        Ok((x.clone(), send.to_vec()))
    }
    fn broadcast(&self, _b: &B, x: &B::Tensor, _root: usize) -> Result<B::Tensor> {
        Ok(x.clone())
    }
    fn all_gather_rows(&self, b: &B, x: &B::Tensor, counts: &[usize]) -> Result<B::Tensor> {
        let (rows, _) = gather_rows_shape(x.shape(), counts, 0, 1)?;
        if rows == counts[0] {
            return Ok(x.clone());
        }
        let ids: Vec<u32> = (0..counts[0] as u32).collect();
        let flat = b.reshape(x, &[rows, x.numel() / rows])?;
        let out = b.embedding(
            &flat,
            &b.upload(&HostTensor::from_u32(vec![ids.len()], &ids)?)?,
        )?;
        let mut shape = x.shape().to_vec();
        shape[0] = counts[0];
        b.reshape(&out, &shape)
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

/// Bytes between the ranks of a group, on the host.
pub trait HostGroup: Send + Sync {
    /// This rank, `0..world()`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world(&self) -> usize;

    /// Every rank's `mine`, in rank order (a collective: every rank calls it).
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Rank 0's `data` on every rank (the others' `data` is ignored). With `idle`, a worker
    /// waits without the collective timeout (for the next step of an idle server); a peer that
    /// exits still ends the wait.
    fn broadcast_bytes(&self, data: &[u8], idle: bool) -> Result<Vec<u8>>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()> {
        self.all_gather_bytes(&[]).map(|_| ())
    }
}

/// One end of a point-to-point byte pipe between rank 0 and a worker.
pub trait Link: Send {
    /// Sends one message.
    fn send(&mut self, msg: &[u8]) -> Result<()>;
    /// Receives one message, waiting at most `timeout` (`None`: as long as it takes). A closed
    /// pipe is an error.
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Vec<u8>>;
}

/// A [`HostGroup`] as a star: rank 0 holds a link to every worker, each worker one link to
/// rank 0. A collective costs one round trip through rank 0 (the control messages are small;
/// tensors of the CPU and WGSL backends go this way too, which is slow but exact).
pub struct Star {
    rank: usize,
    world: usize,
    /// Rank 0: links to ranks `1..world` in order; a worker: its link to rank 0.
    links: Mutex<Vec<Box<dyn Link>>>,
    timeout: Duration,
}

/// Builds a [`Star`] group; `links` as in [`Star`]; `timeout` bounds every wait of a
/// collective (not the idle wait of [`HostGroup::broadcast_bytes`]).
pub fn star(
    rank: usize,
    world: usize,
    links: Vec<Box<dyn Link>>,
    timeout: Duration,
) -> Result<Star> {
    let want = if rank == 0 { world - 1 } else { 1 };
    if links.len() != want || rank >= world {
        bail!(
            "internal: rank {rank} of {world} needs {want} links, got {}",
            links.len()
        );
    }
    Ok(Star {
        rank,
        world,
        links: Mutex::new(links),
        timeout,
    })
}

/// Frames a list of messages into one: `[count u32][len u32, bytes]…` (little-endian).
fn frame(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + parts.iter().map(|p| p.len() + 4).sum::<usize>());
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// The inverse of [`frame`].
fn unframe(mut b: &[u8]) -> Result<Vec<Vec<u8>>> {
    let total = b.len();
    let mut take = |n: usize| -> Result<&[u8]> {
        if b.len() < n {
            bail!("internal: truncated group message");
        }
        let (h, t) = b.split_at(n);
        b = t;
        Ok(h)
    };
    let count = u32::from_le_bytes(take(4)?.try_into()?) as usize;
    if count > total / 4 {
        bail!("a malformed group message: the ranks' collectives are out of step (did rank 0 stop mid-step?)");
    }
    let mut parts = Vec::with_capacity(count);
    for _ in 0..count {
        let len = u32::from_le_bytes(take(4)?.try_into()?) as usize;
        parts.push(take(len)?.to_vec());
    }
    Ok(parts)
}

impl Star {
    fn links(&self) -> std::sync::MutexGuard<'_, Vec<Box<dyn Link>>> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Names the peer behind link `i` in errors.
    fn peer(&self, i: usize) -> usize {
        if self.rank == 0 {
            i + 1
        } else {
            0
        }
    }
}

impl HostGroup for Star {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut links = self.links();
        let t = Some(self.timeout);
        if self.rank == 0 {
            let mut all = vec![mine.to_vec()];
            for (i, l) in links.iter_mut().enumerate() {
                all.push(l.recv(t).map_err(|e| {
                    anyhow!(
                        "rank {} did not take part in a collective: {e:#}",
                        self.peer(i)
                    )
                })?);
            }
            let msg = frame(&all);
            for (i, l) in links.iter_mut().enumerate() {
                l.send(&msg)
                    .map_err(|e| anyhow!("rank {} is gone: {e:#}", self.peer(i)))?;
            }
            Ok(all)
        } else {
            let l = &mut links[0];
            l.send(mine).map_err(|e| anyhow!("rank 0 is gone: {e:#}"))?;
            let all = unframe(
                &l.recv(t)
                    .map_err(|e| anyhow!("rank 0 did not finish a collective: {e:#}"))?,
            )?;
            if all.len() != self.world {
                bail!(
                    "internal: a gather of {} parts in a world of {}",
                    all.len(),
                    self.world
                );
            }
            Ok(all)
        }
    }

    fn broadcast_bytes(&self, data: &[u8], idle: bool) -> Result<Vec<u8>> {
        let mut links = self.links();
        if self.rank == 0 {
            for (i, l) in links.iter_mut().enumerate() {
                l.send(data)
                    .map_err(|e| anyhow!("rank {} is gone: {e:#}", self.peer(i)))?;
            }
            Ok(data.to_vec())
        } else {
            let t = if idle { None } else { Some(self.timeout) };
            links[0]
                .recv(t)
                .map_err(|e| anyhow!("rank 0 stopped sending: {e:#}"))
        }
    }
}

/// A link between two threads of one process (tests, and ranks run as threads).
struct ChannelLink {
    tx: std::sync::mpsc::Sender<Vec<u8>>,
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
}

impl Link for ChannelLink {
    fn send(&mut self, msg: &[u8]) -> Result<()> {
        self.tx
            .send(msg.to_vec())
            .map_err(|_| anyhow!("the peer thread has ended"))
    }
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Vec<u8>> {
        use std::sync::mpsc::RecvTimeoutError;
        match timeout {
            None => self
                .rx
                .recv()
                .map_err(|_| anyhow!("the peer thread has ended")),
            Some(t) => self.rx.recv_timeout(t).map_err(|e| match e {
                RecvTimeoutError::Timeout => anyhow!("no message within {t:?}"),
                RecvTimeoutError::Disconnected => anyhow!("the peer thread has ended"),
            }),
        }
    }
}

/// `world` groups joined by channels, one per rank (hand each to its own thread).
pub fn thread_group(world: usize, timeout: Duration) -> Vec<Star> {
    let mut hub: Vec<Box<dyn Link>> = Vec::new();
    let mut spokes = Vec::new();
    for _ in 1..world {
        let (to_worker, from_hub) = std::sync::mpsc::channel();
        let (to_hub, from_worker) = std::sync::mpsc::channel();
        hub.push(Box::new(ChannelLink {
            tx: to_worker,
            rx: from_worker,
        }));
        spokes.push(Box::new(ChannelLink {
            tx: to_hub,
            rx: from_hub,
        }) as Box<dyn Link>);
    }
    let mut out = vec![star(0, world, hub, timeout).expect("world - 1 links")];
    for (i, s) in spokes.into_iter().enumerate() {
        out.push(star(i + 1, world, vec![s], timeout).expect("one link"));
    }
    out
}

/// [`Comm`] through a [`HostGroup`]: every collective downloads the tensor, exchanges bytes on
/// the host and uploads the result. Exact and portable (the CPU and WGSL backends, CI); as
/// slow as the host round trip.
pub struct HostComm {
    group: Arc<dyn HostGroup>,
}

impl HostComm {
    /// Collectives over `group`'s ranks.
    pub fn new(group: Arc<dyn HostGroup>) -> Self {
        Self { group }
    }
}

/// `t`'s rows as a tensor of `rows` rows (the rest of the shape kept).
fn with_rows(t: &HostTensor, rows: usize, data: Vec<u8>) -> Result<HostTensor> {
    let mut shape = t.shape.clone();
    if shape.is_empty() {
        shape.push(1);
    }
    shape[0] = rows;
    HostTensor::new(shape, t.dtype, data)
}

/// Bytes of one row of `t` (from its shape: a tensor of no rows still has a row width).
fn row_bytes(t: &HostTensor) -> usize {
    t.shape.iter().skip(1).product::<usize>() * t.dtype.size()
}

impl HostComm {
    /// `Σ_ranks x` on the host, in rank order, in f32 for floats (u32 wrapping).
    fn sum_host(&self, mine: &HostTensor) -> Result<HostTensor> {
        let all = self.group.all_gather_bytes(&mine.data)?;
        for (r, part) in all.iter().enumerate() {
            if part.len() != mine.data.len() {
                bail!(
                    "all_reduce: rank {r} sent {} bytes, this rank {} ({:?} {})",
                    part.len(),
                    mine.data.len(),
                    mine.shape,
                    mine.dtype
                );
            }
        }
        let parts: Vec<HostTensor> = all
            .into_iter()
            .map(|d| HostTensor::new(mine.shape.clone(), mine.dtype, d))
            .collect::<Result<_>>()?;
        if mine.dtype == DType::U32 {
            let mut acc = vec![0u32; mine.numel()];
            for p in &parts {
                for (a, v) in acc.iter_mut().zip(p.to_u32()?) {
                    *a = a.wrapping_add(v);
                }
            }
            return HostTensor::from_u32(mine.shape.clone(), &acc);
        }
        let mut acc = vec![0f32; mine.numel()];
        for p in &parts {
            for (a, v) in acc.iter_mut().zip(p.f32_values().iter()) {
                *a += v;
            }
        }
        HostTensor::from_f32_as(mine.shape.clone(), &acc, mine.dtype)
    }
}

impl<B: Backend> Comm<B> for HostComm {
    fn rank(&self) -> usize {
        self.group.rank()
    }
    fn world(&self) -> usize {
        self.group.world()
    }

    fn all_reduce_sum(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let sum = self.sum_host(&b.download(x)?)?;
        b.upload(&sum)
    }

    fn all_gather(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let mine = b.download(x)?;
        let all = self.group.all_gather_bytes(&mine.data)?;
        if all.iter().any(|p| p.len() != mine.data.len()) {
            bail!(
                "all_gather: the ranks' tensors differ in size ({:?} here)",
                mine.shape
            );
        }
        let rows = mine.shape.first().copied().unwrap_or(1) * all.len();
        b.upload(&with_rows(&mine, rows, all.concat())?)
    }

    fn reduce_scatter_sum(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let w = self.group.world();
        let rows = x.shape().first().copied().unwrap_or(0);
        if rows % w != 0 {
            bail!("reduce_scatter: {rows} rows do not split over {w} ranks");
        }
        let sum = self.sum_host(&b.download(x)?)?;
        let per = rows / w * row_bytes(&sum);
        let r = self.group.rank();
        b.upload(&with_rows(
            &sum,
            rows / w,
            sum.data[r * per..(r + 1) * per].to_vec(),
        )?)
    }

    fn all_to_all(&self, b: &B, x: &B::Tensor, send: &[usize]) -> Result<(B::Tensor, Vec<usize>)> {
        let w = self.group.world();
        let mine = b.download(x)?;
        let rows = mine.shape.first().copied().unwrap_or(0);
        if send.len() != w || send.iter().sum::<usize>() != rows {
            bail!("all_to_all: send counts {send:?} do not split {rows} rows over {w} ranks");
        }
        // Every rank's counts and rows reach every rank (a star has no direct paths); each
        // keeps the blocks addressed to it.
        let mut msg: Vec<u8> = send
            .iter()
            .flat_map(|&c| (c as u64).to_le_bytes())
            .collect();
        msg.extend_from_slice(&mine.data);
        let all = self.group.all_gather_bytes(&msg)?;
        let rb = row_bytes(&mine);
        let me = self.group.rank();
        let (mut data, mut counts) = (Vec::new(), Vec::with_capacity(w));
        for (src, m) in all.iter().enumerate() {
            if m.len() < 8 * w {
                bail!("all_to_all: a short message from rank {src}");
            }
            let c: Vec<usize> = (0..w)
                .map(|j| u64::from_le_bytes(m[8 * j..8 * j + 8].try_into().unwrap()) as usize)
                .collect();
            let start = 8 * w + c[..me].iter().sum::<usize>() * rb;
            let end = start + c[me] * rb;
            if end > m.len() {
                bail!("all_to_all: rank {src} sent fewer rows than it announced");
            }
            data.extend_from_slice(&m[start..end]);
            counts.push(c[me]);
        }
        let total = counts.iter().sum();
        Ok((b.upload(&with_rows(&mine, total, data)?)?, counts))
    }

    fn broadcast(&self, b: &B, x: &B::Tensor, root: usize) -> Result<B::Tensor> {
        let mine = b.download(x)?;
        let data = if root == 0 {
            self.group.broadcast_bytes(&mine.data, false)?
        } else {
            // Rank 0 is the star's hub: gather, then everyone reads the root's part.
            self.group
                .all_gather_bytes(&mine.data)?
                .into_iter()
                .nth(root)
                .ok_or_else(|| anyhow!("broadcast: no rank {root}"))?
        };
        if data.len() != mine.data.len() {
            bail!(
                "broadcast: rank {root}'s tensor differs in size from {:?}",
                mine.shape
            );
        }
        b.upload(&HostTensor::new(mine.shape.clone(), mine.dtype, data)?)
    }

    fn all_gather_rows(&self, b: &B, x: &B::Tensor, counts: &[usize]) -> Result<B::Tensor> {
        let (me, w) = (self.group.rank(), self.group.world());
        gather_rows_shape(x.shape(), counts, me, w)?;
        let mine = b.download(x)?;
        let rb = row_bytes(&mine);
        let all = self.group.all_gather_bytes(&mine.data[..counts[me] * rb])?;
        for (r, part) in all.iter().enumerate() {
            if part.len() != counts[r] * rb {
                bail!(
                    "all_gather_rows: rank {r} sent {} bytes for {} rows of {rb} bytes",
                    part.len(),
                    counts[r]
                );
            }
        }
        b.upload(&with_rows(&mine, counts.iter().sum(), all.concat())?)
    }

    fn barrier(&self) -> Result<()> {
        self.group.barrier()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{CpuBackend, CpuTensor};

    fn on_threads<T: Send + 'static>(
        world: usize,
        f: impl Fn(HostComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = thread_group(world, Duration::from_secs(10))
            .into_iter()
            .map(|g| {
                let f = f.clone();
                std::thread::spawn(move || f(HostComm::new(Arc::new(g))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn t(b: &CpuBackend, shape: Vec<usize>, v: &[f32]) -> <CpuBackend as Backend>::Tensor {
        b.upload(&HostTensor::from_f32(shape, v).unwrap()).unwrap()
    }

    #[test]
    fn host_collectives_on_three_ranks() {
        let out = on_threads(3, |c| {
            let b = CpuBackend;
            let r = Comm::<CpuBackend>::rank(&c) as f32;
            let x = t(&b, vec![2, 2], &[r, r + 1.0, 10.0 * r, 1.0]);
            let sum = b
                .download(&c.all_reduce_sum(&b, &x).unwrap())
                .unwrap()
                .to_f32();
            let gat = b.download(&c.all_gather(&b, &x).unwrap()).unwrap();
            let x6 = t(&b, vec![3, 1], &[r, 2.0 * r, 3.0 * r]);
            let rs = b
                .download(&c.reduce_scatter_sum(&b, &x6).unwrap())
                .unwrap()
                .to_f32();
            // Rank r sends r + 1 rows to every rank j, each row = 100 r + j.
            let n = Comm::<CpuBackend>::rank(&c) + 1;
            let rows: Vec<f32> = (0..3).flat_map(|j| vec![100.0 * r + j as f32; n]).collect();
            let x = t(&b, vec![3 * n, 1], &rows);
            let (got, counts) = c.all_to_all(&b, &x, &[n, n, n]).unwrap();
            let bc = b
                .download(&c.broadcast(&b, &t(&b, vec![1], &[r]), 2).unwrap())
                .unwrap();
            Comm::<CpuBackend>::barrier(&c).unwrap();
            (
                sum,
                gat.shape.clone(),
                gat.to_f32(),
                rs,
                b.download(&got).unwrap().to_f32(),
                counts,
                bc.to_f32(),
            )
        });
        for (r, (sum, gshape, gat, rs, a2a, counts, bc)) in out.into_iter().enumerate() {
            assert_eq!(sum, vec![3.0, 6.0, 30.0, 3.0]);
            assert_eq!(gshape, vec![6, 2]);
            assert_eq!(gat[4..8], [1.0, 2.0, 10.0, 1.0]);
            assert_eq!(rs, vec![3.0 * (r as f32 + 1.0)]);
            assert_eq!(counts, vec![1, 2, 3]);
            let want: Vec<f32> = (0..3)
                .flat_map(|s| vec![100.0 * s as f32 + r as f32; s + 1])
                .collect();
            assert_eq!(a2a, want);
            assert_eq!(bc, vec![2.0]);
        }
    }

    /// [`HostComm`] without its own `all_gather_rows`, to run the trait's default (NCCL's).
    struct DefaultRows(HostComm);

    impl Comm<CpuBackend> for DefaultRows {
        fn rank(&self) -> usize {
            Comm::<CpuBackend>::rank(&self.0)
        }
        fn world(&self) -> usize {
            Comm::<CpuBackend>::world(&self.0)
        }
        fn all_reduce_sum(&self, b: &CpuBackend, x: &CpuTensor) -> Result<CpuTensor> {
            self.0.all_reduce_sum(b, x)
        }
        fn all_gather(&self, b: &CpuBackend, x: &CpuTensor) -> Result<CpuTensor> {
            self.0.all_gather(b, x)
        }
        fn reduce_scatter_sum(&self, b: &CpuBackend, x: &CpuTensor) -> Result<CpuTensor> {
            self.0.reduce_scatter_sum(b, x)
        }
        fn all_to_all(
            &self,
            b: &CpuBackend,
            x: &CpuTensor,
            send: &[usize],
        ) -> Result<(CpuTensor, Vec<usize>)> {
            self.0.all_to_all(b, x, send)
        }
        fn broadcast(&self, b: &CpuBackend, x: &CpuTensor, root: usize) -> Result<CpuTensor> {
            self.0.broadcast(b, x, root)
        }
        fn barrier(&self) -> Result<()> {
            Comm::<CpuBackend>::barrier(&self.0)
        }
    }

    #[test]
    fn all_gather_rows_of_unequal_counts() {
        // Rank r holds r + 2 rows [r, i] of which the first counts[r] count.
        let counts = [1usize, 3, 0];
        let out = on_threads(3, move |c| {
            let b = CpuBackend;
            let r = Comm::<CpuBackend>::rank(&c);
            let v: Vec<f32> = (0..r + 2)
                .flat_map(|i| [r as f32, i as f32, -1.0])
                .collect();
            let x = t(&b, vec![r + 2, 1, 3], &v);
            let host = b
                .download(&c.all_gather_rows(&b, &x, &counts).unwrap())
                .unwrap();
            let default = DefaultRows(c);
            let dflt = b
                .download(&default.all_gather_rows(&b, &x, &counts).unwrap())
                .unwrap();
            let err = default.all_gather_rows(&b, &x, &[9, 9, 9]).unwrap_err();
            (host, dflt, format!("{err:#}"))
        });
        let want: Vec<f32> = [(0, 0), (1, 0), (1, 1), (1, 2)]
            .iter()
            .flat_map(|&(r, i)| [r as f32, i as f32, -1.0])
            .collect();
        for (host, dflt, err) in out {
            assert_eq!(host.shape, vec![4, 1, 3]);
            assert_eq!(host.to_f32(), want);
            assert_eq!(dflt.shape, vec![4, 1, 3]);
            assert_eq!(dflt.to_f32(), want);
            assert!(err.contains("fewer than its count 9"), "{err}");
        }
        let one = CpuBackend;
        let x = t(&one, vec![3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let got = LocalComm.all_gather_rows(&one, &x, &[2]).unwrap();
        assert_eq!(
            one.download(&got).unwrap().to_f32(),
            vec![1.0, 2.0, 3.0, 4.0]
        );
    }

    #[test]
    fn a_rank_that_leaves_is_named() {
        let mut groups = thread_group(2, Duration::from_secs(5));
        let worker = groups.pop().unwrap();
        drop(worker);
        let err = groups[0].all_gather_bytes(b"x").unwrap_err();
        assert!(format!("{err:#}").contains("rank 1"), "{err:#}");
    }
}
