//! Running one model over several processes, one per device (`--tensor-parallel-size N`, or
//! `--context-parallel-size N` with the whole model on each), as vLLM, SGLang and mistral.rs do.
//!
//! Who is who:
//! - A launcher's variables give each process its rank: torchrun's `RANK`/`WORLD_SIZE`/
//!   `LOCAL_RANK`, Slurm's `SLURM_PROCID`/`SLURM_STEP_NUM_TASKS`/`SLURM_LOCALID`, Open MPI's
//!   `OMPI_COMM_WORLD_*`, MPICH's `PMI_RANK`/`PMI_SIZE`; they meet at
//!   `MASTER_ADDR:MASTER_PORT` (default port 29500; under Slurm `SLURM_LAUNCH_NODE_IPADDR`).
//! - Otherwise dayone starts its local ranks itself: the process the user ran is the node's
//!   first rank and spawns the others (the same executable and arguments, `DAYONE_RANK` …
//!   set, stdout discarded). Several nodes: `--nnodes K --node-rank i --master-addr A
//!   --master-port P` on each, `N / K` ranks per node.
//!
//! Rank 0 runs the command (and the scheduler); it meets the others over TCP
//! ([`TcpGroup`]), sends them its settings and model path, and every rank loads its slices.
//! The other ranks replay rank 0's engine calls ([`Engine::follow`]) until it shuts down. A rank
//! that dies or never joins ends the job with a message naming it.

use crate::backend_choice::BackendKind;
use crate::engine_args::{CommandDefaults, EngineArgs};
use anyhow::{bail, Context, Result};
use dayone_backend::comm::{Comm, HostComm, HostGroup};
use dayone_backend::comm_tcp::{Rendezvous, TcpGroup};
use dayone_backend::Backend;
use dayone_engine::parallel::{Distributed, Parallel};
use dayone_engine::{loader, Engine, EngineConfig};
use serde::{Deserialize, Serialize};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The launch flags (`--nnodes`, `--node-rank`, `--master-addr`, `--master-port`).
#[derive(Clone, Debug, Default)]
pub struct LaunchFlags {
    /// Machines taking part.
    pub nnodes: Option<usize>,
    /// This machine, `0..nnodes`.
    pub node_rank: Option<usize>,
    /// Where rank 0 listens.
    pub master_addr: Option<String>,
    /// Its port.
    pub master_port: Option<u16>,
}

/// The launch flags of this process, set once by [`crate::engine_args::EngineArgs::resolve`].
static FLAGS: OnceLock<LaunchFlags> = OnceLock::new();

/// Records this process's launch flags (the first call wins; one command per process).
pub fn set_flags(f: LaunchFlags) {
    let _ = FLAGS.set(f);
}

fn flags() -> LaunchFlags {
    FLAGS.get().cloned().unwrap_or_default()
}

/// This process's place in the job.
#[derive(Clone, Debug)]
struct Role {
    rank: usize,
    world: usize,
    /// Rank on this machine (picks the GPU).
    local_rank: usize,
    /// Ranks on this machine (they share its memory, or its GPUs when there are fewer).
    local_world: usize,
    /// `host:port` of rank 0.
    master: String,
    /// Ranks this process must start itself (global ranks), when dayone launches.
    spawn: Vec<usize>,
}

/// Whether a launcher's variables make this process a rank other than 0 (its engine notes would
/// repeat rank 0's, so it logs only warnings unless `DAYONE_LOG` says otherwise).
pub fn launched_as_follower() -> bool {
    matches!(env_ranks(), Ok(Some((r, _, _))) if r > 0)
}

/// `(rank, world, local rank)` from a launcher's variables, the first family present.
fn env_ranks() -> Result<Option<(usize, usize, Option<usize>)>> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let num = |k: &str| -> Result<Option<usize>> {
        get(k)
            .map(|v| {
                v.trim()
                    .parse::<usize>()
                    .with_context(|| format!("{k}={v}: expected a non-negative integer"))
            })
            .transpose()
    };
    // dayone's own children first; `DAYONE_IGNORE_LAUNCHER=1` makes dayone start its ranks
    // itself inside a launcher's job. Slurm's step size (set by `srun`, not in a batch
    // script) counts, not the job's `SLURM_NTASKS`. A world of one is no launch at all.
    let ignore = get("DAYONE_IGNORE_LAUNCHER").is_some_and(|v| v != "0");
    for (rank, world, local) in [
        ("DAYONE_RANK", "DAYONE_WORLD_SIZE", "DAYONE_LOCAL_RANK"),
        ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"),
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ] {
        if ignore && rank != "DAYONE_RANK" {
            continue;
        }
        if let (Some(r), Some(w)) = (num(rank)?, num(world)?) {
            if r >= w {
                bail!("{rank}={r} is not below {world}={w}");
            }
            if w == 1 {
                return Ok(None);
            }
            return Ok(Some((r, w, num(local)?)));
        }
    }
    Ok(None)
}

/// Where rank 0 listens: the flags, else `MASTER_ADDR`/`MASTER_PORT`, else Slurm's launch node,
/// port 29500 (torchrun's default).
fn master_from(f: &LaunchFlags) -> String {
    let addr = f
        .master_addr
        .clone()
        .or_else(|| std::env::var("MASTER_ADDR").ok())
        .or_else(|| std::env::var("SLURM_LAUNCH_NODE_IPADDR").ok())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = f
        .master_port
        .or_else(|| std::env::var("MASTER_PORT").ok()?.parse().ok())
        .unwrap_or(29500);
    if addr.contains(':') && !addr.starts_with('[') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

/// The flag that sets the number of ranks: `--tensor-parallel-size`, or
/// `--context-parallel-size` when that is above 1.
fn ranks_flag(cfg: &EngineConfig) -> &'static str {
    if cfg.context_parallel_size > 1 {
        "--context-parallel-size"
    } else {
        "--tensor-parallel-size"
    }
}

/// Works out this process's role for a model run over `tp` ranks (the tensor- or
/// context-parallel size, set by `flag`); `None` for one rank.
fn role(tp: usize, flag: &str) -> Result<Option<Role>> {
    let f = flags();
    if let Some((rank, world, local)) = env_ranks()? {
        if world != tp {
            bail!(
                "the launcher started {world} processes (WORLD_SIZE or its equivalent) but {flag} is {tp}: they must match (one process per device), or set DAYONE_IGNORE_LAUNCHER=1 for dayone to start its ranks itself"
            );
        }
        return Ok(Some(Role {
            rank,
            world,
            local_rank: local.unwrap_or(rank),
            local_world: local_world_from_env().unwrap_or(world),
            master: master_from(&f),
            spawn: Vec::new(),
        }));
    }
    if tp == 1 {
        return Ok(None);
    }
    let nnodes = f.nnodes.unwrap_or(1);
    let node = f.node_rank.unwrap_or(0);
    if nnodes == 0 || !tp.is_multiple_of(nnodes) {
        bail!("{flag} {tp} does not split over --nnodes {nnodes}");
    }
    if node >= nnodes {
        bail!("--node-rank {node} is not below --nnodes {nnodes}");
    }
    if nnodes > 1 && f.master_addr.is_none() && std::env::var_os("MASTER_ADDR").is_none() {
        bail!("--nnodes {nnodes} needs --master-addr (the address of node 0) on every node");
    }
    if nnodes > 1 && f.master_port == Some(0) {
        bail!("--master-port 0 cannot be shared between nodes: give node 0's port (default 29500)");
    }
    let local = tp / nnodes;
    let first = node * local;
    Ok(Some(Role {
        rank: first,
        world: tp,
        local_rank: 0,
        local_world: local,
        master: master_from(&f),
        spawn: (first + 1..first + local).collect(),
    }))
}

/// Ranks on this machine from a launcher's variables (torchrun, Open MPI, Slurm's
/// `SLURM_STEP_TASKS_PER_NODE` such as `4(x2)`, dayone's own).
fn local_world_from_env() -> Option<usize> {
    [
        "DAYONE_LOCAL_WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "SLURM_STEP_TASKS_PER_NODE",
    ]
    .iter()
    .find_map(|k| {
        let v = std::env::var(k).ok()?;
        let digits: String = v.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok().filter(|&n: &usize| n > 0)
    })
}

/// How many ranks draw on one pool of memory here: all of this machine's ranks on the CPU and
/// WGSL backends (one host, one adapter); on CUDA the ranks sharing each GPU.
fn ranks_per_memory(kind: BackendKind, local_world: usize) -> usize {
    match kind {
        BackendKind::Cuda => local_world
            .div_ceil(dayone_cuda::device_count().max(1))
            .max(1),
        _ => local_world.max(1),
    }
}

/// What rank 0 sends every other rank once they have met.
#[derive(Serialize, Deserialize)]
struct Setup {
    model: PathBuf,
    backend: String,
    engine: EngineConfig,
    /// NCCL's communicator id (CUDA).
    nccl_id: Option<Vec<u8>>,
}

/// How long ranks wait to meet, and for a collective.
fn timeouts() -> (Duration, Duration) {
    let secs = |k: &str, d: u64| match std::env::var(k) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("note: {k}={v} is not a number of seconds: using {d}");
            d
        }),
        Err(_) => d,
    };
    (
        Duration::from_secs(secs("DAYONE_DIST_JOIN_TIMEOUT_S", 300)),
        Duration::from_secs(secs("DAYONE_DIST_TIMEOUT_S", 1800)),
    )
}

/// Starts this node's other ranks: this executable with the same arguments, the rank in
/// `DAYONE_RANK`. Their stdout is discarded (rank 0 prints the results), stderr kept.
fn spawn_ranks(r: &Role, master: &str, share_gpu: bool) -> Result<Vec<Child>> {
    let exe =
        std::env::current_exe().context("finding this executable to start the other ranks")?;
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let mut out = Vec::new();
    for (i, &rank) in r.spawn.iter().enumerate() {
        let mut c = Command::new(&exe);
        c.args(&args)
            .env("DAYONE_RANK", rank.to_string())
            .env("DAYONE_WORLD_SIZE", r.world.to_string())
            .env("DAYONE_LOCAL_RANK", (r.local_rank + i + 1).to_string())
            .env("DAYONE_LOCAL_WORLD_SIZE", r.local_world.to_string())
            .env(
                "MASTER_ADDR",
                master
                    .rsplit_once(':')
                    .map_or(master, |m| m.0)
                    .trim_matches(['[', ']']),
            )
            .env(
                "MASTER_PORT",
                master.rsplit_once(':').map_or("29500", |m| m.1),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if share_gpu {
            c.env("NCCL_HOSTID", format!("dayone-rank{rank}"));
        }
        out.push(
            c.spawn()
                .with_context(|| format!("starting rank {rank} ({})", exe.display()))?,
        );
    }
    Ok(out)
}

/// Whether this node's ranks must share GPUs (fewer devices than ranks): NCCL then needs a
/// distinct `NCCL_HOSTID` per process and runs over sockets (for tests, not speed).
fn gpus_shared(kind: BackendKind, local_ranks: usize) -> bool {
    kind == BackendKind::Cuda && dayone_cuda::device_count() < local_ranks
}

/// The group, joined; the other ranks of this node started first when dayone launches them.
fn join(r: &Role, kind: BackendKind) -> Result<TcpGroup> {
    let (join_t, coll_t) = timeouts();
    let local_ranks = r.spawn.len() + 1;
    let share = gpus_shared(kind, local_ranks);
    // A single machine without a given port: rank 0 picks a free one before starting the rest.
    let (listener, master) = if r.rank == 0
        && !r.spawn.is_empty()
        && flags().master_port.is_none()
        && std::env::var_os("MASTER_PORT").is_none()
    {
        let l = TcpListener::bind("127.0.0.1:0").context("rank 0: binding a local port")?;
        let m = l.local_addr()?.to_string();
        (Some(l), m)
    } else if r.rank == 0 {
        let l = TcpListener::bind(&r.master).with_context(|| {
            format!(
                "rank 0: cannot listen on {} (--master-addr/--master-port)",
                r.master
            )
        })?;
        (Some(l), r.master.clone())
    } else {
        (None, r.master.clone())
    };
    if share && std::env::var_os("NCCL_HOSTID").is_none() {
        eprintln!(
            "note: {local_ranks} ranks share {} GPU(s): NCCL runs over sockets between them (NCCL_HOSTID per rank); correct but slow, for testing",
            dayone_cuda::device_count()
        );
        // Set before NCCL starts in this process (no other thread uses the environment yet).
        std::env::set_var("NCCL_HOSTID", format!("dayone-rank{}", r.rank));
    }
    let children = spawn_ranks(r, &master, share)?;
    CHILDREN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(children);
    let rv = Rendezvous {
        master,
        rank: r.rank,
        world: r.world,
        join_timeout: join_t,
        collective_timeout: coll_t,
    };
    // A rank this process started that exits before joining is named at once.
    let alive = || -> Result<()> {
        let mut kids = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
        for (c, &rank) in kids.iter_mut().zip(&r.spawn) {
            if let Ok(Some(status)) = c.try_wait() {
                bail!("rank {rank} exited ({status}) before joining; its error is above");
            }
        }
        Ok(())
    };
    TcpGroup::join_checking(&rv, listener, &alive)
}

/// Rank 0's part in a split model, kept until the job ends.
pub struct Leader {
    /// The control group.
    pub group: Arc<dyn HostGroup>,
    /// Set before an orderly shutdown, so peers leaving is not an error.
    pub done: Arc<AtomicBool>,
    nccl_id: Option<[u8; 128]>,
    /// Ranks sharing this rank's memory pool.
    shared_by: usize,
}

/// The rank processes this process started, reaped by [`reap_children`].
static CHILDREN: std::sync::Mutex<Vec<Child>> = std::sync::Mutex::new(Vec::new());

/// Waits (up to `limit`) for the rank processes this process started, which end when rank
/// 0's engine shuts down or exits; kills any still running after that.
pub fn reap_children(limit: Duration) {
    let mut kids = std::mem::take(&mut *CHILDREN.lock().unwrap_or_else(|p| p.into_inner()));
    let deadline = std::time::Instant::now() + limit;
    while !kids.is_empty() {
        kids.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        if std::time::Instant::now() > deadline {
            for c in &mut kids {
                let _ = c.kill();
                let _ = c.wait();
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// When `cfg` splits the model over several ranks and this process is rank 0: meets the other
/// ranks (starting this node's), sends them the settings and returns the group; `None` for one
/// rank. Errors: the launch does not add up, a rank does not join, NCCL is missing.
pub fn lead(
    kind: BackendKind,
    ckpt: &loader::Checkpoint,
    cfg: &EngineConfig,
) -> Result<Option<Leader>> {
    let Some(r) = role(cfg.ranks(), ranks_flag(cfg))? else {
        return Ok(None);
    };
    if r.rank != 0 {
        bail!("internal: rank {} reached rank 0's start-up", r.rank);
    }
    // A split that cannot work fails here, once, before any other rank starts.
    let origin = ckpt.path.join("config.json").display().to_string();
    let config = dayone_engine::config::ModelConfig::from_json(&ckpt.config, &origin)?;
    let plan = dayone_engine::models::layer_plan(&config)?;
    if cfg.context_parallel_size > 1 {
        plan.check_context_parallel()?;
    } else {
        plan.check_parallel(cfg.tensor_parallel_size, cfg.expert_parallel_size)?;
    }
    let nccl_id = match kind {
        BackendKind::Cuda => Some(dayone_cuda::NcclComm::unique_id()?),
        _ => None,
    };
    let mut g = join(&r, kind)?;
    let done = Arc::new(AtomicBool::new(false));
    g.watch_peers(done.clone());
    let setup = Setup {
        model: ckpt.path.clone(),
        backend: kind.name().into(),
        engine: cfg.clone(),
        nccl_id: nccl_id.map(|i| i.to_vec()),
    };
    g.broadcast_bytes(&serde_json::to_vec(&setup)?, false)?;
    Ok(Some(Leader {
        group: Arc::new(g),
        done,
        nccl_id,
        shared_by: ranks_per_memory(kind, r.local_world),
    }))
}

/// A backend's collectives for a rank: the host group by default (CPU, WGSL), NCCL on CUDA.
pub trait RankComm: Backend {
    /// The communicator of this rank in `group` (`nccl_id`: rank 0's NCCL id, CUDA only).
    fn rank_comm(
        &self,
        group: &Arc<dyn HostGroup>,
        _nccl_id: Option<[u8; 128]>,
    ) -> Result<Arc<dyn Comm<Self>>> {
        Ok(Arc::new(HostComm::new(group.clone())))
    }
}

impl RankComm for dayone_backend::cpu::CpuBackend {}

impl RankComm for dayone_wgsl::WgslBackend {}

impl RankComm for dayone_cuda::CudaBackend {
    fn rank_comm(
        &self,
        group: &Arc<dyn HostGroup>,
        id: Option<[u8; 128]>,
    ) -> Result<Arc<dyn Comm<Self>>> {
        let id = id.context("internal: no NCCL id for a CUDA rank")?;
        Ok(Arc::new(dayone_cuda::NcclComm::new(
            self,
            group.rank(),
            group.world(),
            id,
        )?))
    }
}

impl Leader {
    /// Rank 0's engine on `backend`: its slices loaded, the group attached.
    pub fn engine<B: RankComm>(
        &self,
        backend: B,
        ckpt: &loader::Checkpoint,
        cfg: &EngineConfig,
        progress: Option<&dyn Fn(usize, usize)>,
    ) -> Result<Engine<B>> {
        let rank = Rank {
            group: &self.group,
            nccl_id: self.nccl_id,
            done: &self.done,
            shared_by: self.shared_by,
        };
        distributed_engine(backend, ckpt, cfg, progress, &rank)
    }
}

/// What one rank's engine is built with.
struct Rank<'a> {
    group: &'a Arc<dyn HostGroup>,
    nccl_id: Option<[u8; 128]>,
    done: &'a Arc<AtomicBool>,
    shared_by: usize,
}

fn distributed_engine<B: RankComm>(
    backend: B,
    ckpt: &loader::Checkpoint,
    cfg: &EngineConfig,
    progress: Option<&dyn Fn(usize, usize)>,
    rank: &Rank,
) -> Result<Engine<B>> {
    let comm = backend.rank_comm(rank.group, rank.nccl_id)?;
    let parallel = if cfg.context_parallel_size > 1 {
        Parallel::context(comm)
    } else {
        Parallel::new(comm, cfg.expert_parallel_size)?
    };
    let dist = Distributed {
        parallel,
        group: rank.group.clone(),
        done: Some(rank.done.clone()),
        memory_shared_by: rank.shared_by,
    };
    Engine::new_distributed(backend, ckpt, cfg, progress, Some(dist))
}

/// Before a command runs: when this process is one of the other ranks of a split model, serves
/// rank 0 until it shuts down and exits the process (status 0, or 1 with the error on stderr);
/// otherwise returns so that the command runs (as rank 0, or alone). Only the engine flags
/// count here (the other ranks take every other setting from rank 0), so a rank never reads a
/// prompt, a file or a port of the command. `splittable`: whether the command can run split.
///
/// Errors: the flags' (usage errors), a launch that does not add up, a command that runs on
/// one device asked to split.
pub fn follow_if_rank(engine: &EngineArgs, splittable: bool) -> Result<()> {
    let resolved = engine.resolve(&CommandDefaults::default())?;
    let tp = resolved.engine.ranks();
    if !splittable {
        if tp > 1 || env_ranks()?.is_some() {
            bail!(crate::usage::usage(
                "--tensor-parallel-size or --context-parallel-size > 1 (or a launcher's ranks) works with generate, bench, check, perplexity and serve; this command runs on one device"
            ));
        }
        return Ok(());
    }
    let Some(r) = role(tp, ranks_flag(&resolved.engine))? else {
        return Ok(());
    };
    if r.rank == 0 {
        return Ok(());
    }
    let code = match follow(&r, resolved.backend) {
        Ok(()) => 0,
        Err(e) => {
            let msg = format!("{e:#}");
            if msg.starts_with("rank ") {
                eprintln!("error: {msg}");
            } else {
                eprintln!("error: rank {}: {msg}", r.rank);
            }
            1
        }
    };
    reap_children(Duration::from_secs(if code == 0 { 30 } else { 5 }));
    std::process::exit(code);
}

fn follow(r: &Role, kind: BackendKind) -> Result<()> {
    let mut g = join(r, kind)?;
    let done = Arc::new(AtomicBool::new(false));
    g.watch_peers(done.clone());
    let group: Arc<dyn HostGroup> = Arc::new(g);
    let setup: Setup =
        serde_json::from_slice(&group.broadcast_bytes(&[], false)?).context("rank 0's settings")?;
    let ckpt = loader::open(&setup.model)
        .with_context(|| format!("rank {}: opening the model rank 0 uses", r.rank))?;
    let id = match setup.nccl_id {
        Some(v) => Some(
            <[u8; 128]>::try_from(v.as_slice())
                .map_err(|_| anyhow::anyhow!("a malformed NCCL id"))?,
        ),
        None => None,
    };
    let cfg = setup.engine;
    let kind = match setup.backend.as_str() {
        "cpu" => BackendKind::Cpu,
        "wgsl" => BackendKind::Wgsl,
        "cuda" => BackendKind::Cuda,
        other => bail!("rank 0 runs an unknown backend `{other}`"),
    };
    let rank = Rank {
        group: &group,
        nccl_id: id,
        done: &done,
        shared_by: ranks_per_memory(kind, r.local_world),
    };
    match kind {
        BackendKind::Cpu => run(dayone_backend::cpu::CpuBackend, &ckpt, &cfg, &rank),
        BackendKind::Wgsl => run(dayone_wgsl::WgslBackend::new()?, &ckpt, &cfg, &rank),
        BackendKind::Cuda => {
            let n = dayone_cuda::device_count().max(1);
            run(
                dayone_cuda::CudaBackend::new(r.local_rank % n)?,
                &ckpt,
                &cfg,
                &rank,
            )
        }
    }
}

fn run<B: RankComm>(
    b: B,
    ckpt: &loader::Checkpoint,
    cfg: &EngineConfig,
    rank: &Rank,
) -> Result<()> {
    let mut e = distributed_engine(b, ckpt, cfg, None, rank)?;
    e.follow()
}
