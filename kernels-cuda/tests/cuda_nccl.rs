//! `NcclComm` on two ranks: every collective of `Comm` checked against values worked out by
//! hand. The test re-executes its own binary as two child processes, one per rank; both use
//! GPU 0, each with its own `NCCL_HOSTID` (NCCL refuses two ranks of one host on one GPU, so
//! each rank poses as its own host and NCCL talks over sockets). With
//! `DAYONE_NCCL_TEST_GPUS=2` rank r uses GPU r instead, without the host-id trick (NVLink/P2P).
//! Without a CUDA device or without libnccl.so the test prints one SKIPPED line and passes.
//!
//! Run on a GPU machine:
//! `cargo test -p dayone-cuda --release --test cuda_nccl -- --nocapture`
//! (the children's `[rank r]` lines show every check; `NCCL_DEBUG=INFO` for NCCL's own log,
//! `DAYONE_NCCL_TEST_TIMEOUT_S` to change the 180 s limit).

mod common;

use dayone_backend::comm::Comm;
use dayone_backend::{Backend, DType, HostTensor};
use dayone_cuda::{CudaBackend, CudaTensor, NcclComm};
use std::process::Command;
use std::time::{Duration, Instant};

const TEST: &str = "nccl_collectives_on_two_ranks";
const RANK_ENV: &str = "DAYONE_NCCL_TEST_RANK";
const ID_ENV: &str = "DAYONE_NCCL_TEST_ID";
const WORLD: usize = 2;

#[test]
fn nccl_collectives_on_two_ranks() {
    if let Ok(rank) = std::env::var(RANK_ENV) {
        run_rank(rank.parse().expect("rank number"));
        return;
    }
    let _ = common::ensure_nvrtc();
    if !dayone_cuda::is_available() {
        let why = match dayone_cuda::LibraryPresence::probe().check() {
            Err(e) => e.to_string(),
            Ok(()) => "no CUDA device".to_string(),
        };
        eprintln!("SKIPPED {TEST}: {why}");
        return;
    }
    if !NcclComm::is_available() {
        let why = NcclComm::unique_id().err().map(|e| format!("{e:#}"));
        eprintln!("SKIPPED {TEST}: {}", why.unwrap_or_default());
        return;
    }
    let spread = std::env::var("DAYONE_NCCL_TEST_GPUS").is_ok_and(|v| v == "2");
    // This process hosts NCCL's bootstrap root (started by ncclGetUniqueId); the ranks join it.
    let id = NcclComm::unique_id().expect("ncclGetUniqueId");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe().expect("test binary path");
    let mut kids = Vec::new();
    for r in 0..WORLD {
        let mut c = Command::new(&exe);
        c.args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(RANK_ENV, r.to_string())
            .env(ID_ENV, &hex)
            .env("NCCL_NVLS_ENABLE", "0");
        if !spread {
            c.env("NCCL_HOSTID", format!("dayone-nccl-test-rank{r}"));
        }
        if std::env::var_os("NCCL_DEBUG").is_none() {
            c.env("NCCL_DEBUG", "WARN");
        }
        kids.push(c.spawn().expect("spawning a rank process"));
    }
    eprintln!(
        "{TEST}: {WORLD} rank processes started ({})",
        if spread {
            "one GPU each"
        } else {
            "both on GPU 0, distinct NCCL_HOSTID"
        }
    );
    let limit = Duration::from_secs(
        std::env::var("DAYONE_NCCL_TEST_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(180),
    );
    let start = Instant::now();
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; WORLD];
    // Once a rank has failed, the other may wait in a collective forever: give it 10 s.
    let mut failed_at: Option<Instant> = None;
    while status.iter().any(|s| s.is_none()) {
        for (r, k) in kids.iter_mut().enumerate() {
            if status[r].is_none() {
                if let Some(s) = k.try_wait().expect("waiting for a rank") {
                    if !s.success() && failed_at.is_none() {
                        failed_at = Some(Instant::now());
                    }
                    status[r] = Some(s);
                }
            }
        }
        let late = start.elapsed() > limit
            || failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(10));
        if late && status.iter().any(|s| s.is_none()) {
            for (r, k) in kids.iter_mut().enumerate() {
                if status[r].is_none() {
                    let _ = k.kill();
                    let _ = k.wait();
                }
            }
            panic!(
                "{TEST}: ranks still running after {:.0?} were killed (a hang in NCCL? \
                 exits so far: {status:?})",
                start.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (r, s) in status.iter().enumerate() {
        let s = s.expect("every rank exited");
        assert!(s.success(), "rank {r} failed ({s}); its output is above");
    }
    eprintln!("{TEST}: both ranks passed every check");
}

/// One rank: a backend, the communicator, and every check.
fn run_rank(rank: usize) {
    let _ = common::ensure_nvrtc();
    let hex = std::env::var(ID_ENV).expect("the parent passes the NCCL id");
    let id: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("id hex"))
        .collect();
    let id: [u8; 128] = id.try_into().expect("a 128-byte id");
    let spread = std::env::var("DAYONE_NCCL_TEST_GPUS").is_ok_and(|v| v == "2");
    let b = CudaBackend::new(if spread { rank } else { 0 }).expect("CUDA backend");
    let host = std::env::var("NCCL_HOSTID").unwrap_or_else(|_| "-".into());
    println!("[rank {rank}] {}, NCCL_HOSTID={host}", b.name());
    let c = NcclComm::new(&b, rank, WORLD, id).expect("NcclComm::new");
    assert_eq!((c.rank(), c.world()), (rank, WORLD));
    let mut t = Checker { b: &b, rank, n: 0 };
    let r = rank as f32;

    // all_reduce_sum in every reducible dtype (values exact in each).
    let x = t.up(&[2, 2], &[r + 1.0, 10.0 * (r + 1.0), -r, 0.5], DType::F32);
    let sum = c.all_reduce_sum(&b, &x).unwrap();
    t.check(
        "all_reduce_sum f32 [2,2]",
        &sum,
        &[2, 2],
        &[3.0, 30.0, -1.0, 1.0],
    );
    let y = b.add(&sum, &x).unwrap();
    let want = [3.0 + r + 1.0, 30.0 + 10.0 * (r + 1.0), -1.0 - r, 1.5];
    t.check(
        "add(all_reduce_sum(x), x) (a kernel after NCCL on the stream)",
        &y,
        &[2, 2],
        &want,
    );
    let x = t.up(&[3], &[r + 1.0, 2.0, -0.5 * (r + 1.0)], DType::BF16);
    let sum = c.all_reduce_sum(&b, &x).unwrap();
    t.check("all_reduce_sum bf16 [3]", &sum, &[3], &[3.0, 4.0, -1.5]);
    let x = t.up(&[2], &[r + 0.5, 1024.0], DType::F16);
    let sum = c.all_reduce_sum(&b, &x).unwrap();
    t.check("all_reduce_sum f16 [2]", &sum, &[2], &[2.0, 2048.0]);
    let x = b
        .upload(&HostTensor::from_u32(vec![2], &[rank as u32 + 1, 1 << 31]).unwrap())
        .unwrap();
    let sum = b.download(&c.all_reduce_sum(&b, &x).unwrap()).unwrap();
    assert_eq!(
        sum.to_u32().unwrap(),
        vec![3, 0],
        "[rank {rank}] all_reduce_sum u32"
    );
    t.ok("all_reduce_sum u32 [2] (2^31 + 2^31 wraps to 0)");
    let n = 1 << 20;
    let v: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * (r + 1.0)).collect();
    let x = t.up(&[1024, 1024], &v, DType::F32);
    let want: Vec<f32> = (0..n).map(|i| 3.0 * (i % 97) as f32).collect();
    t.check(
        "all_reduce_sum f32 [1024,1024] (4 MiB)",
        &c.all_reduce_sum(&b, &x).unwrap(),
        &[1024, 1024],
        &want,
    );

    // all_gather: rank order along dim 0.
    let x = t.up(&[1, 3], &[r, r + 0.5, 100.0 * r], DType::F32);
    let g = c.all_gather(&b, &x).unwrap();
    t.check(
        "all_gather f32 [1,3] -> [2,3]",
        &g,
        &[2, 3],
        &[0.0, 0.5, 0.0, 1.0, 1.5, 100.0],
    );
    let x = t.up(&[2], &[r + 1.0, -(r + 1.0)], DType::BF16);
    let g = c.all_gather(&b, &x).unwrap();
    t.check(
        "all_gather bf16 [2] -> [4]",
        &g,
        &[4],
        &[1.0, -1.0, 2.0, -2.0],
    );

    // reduce_scatter_sum: x[i][j] = (r + 1)(2i + j); the sum is 3(2i + j); rank r keeps rows
    // 2r and 2r + 1.
    let v: Vec<f32> = (0..8).map(|k| (r + 1.0) * k as f32).collect();
    let x = t.up(&[4, 2], &v, DType::F32);
    let want: Vec<f32> = (0..4).map(|k| 3.0 * (4 * rank + k) as f32).collect();
    t.check(
        "reduce_scatter_sum f32 [4,2] -> [2,2]",
        &c.reduce_scatter_sum(&b, &x).unwrap(),
        &[2, 2],
        &want,
    );
    let bad = t.up(&[3, 2], &[0.0; 6], DType::F32);
    let e = c.reduce_scatter_sum(&b, &bad).unwrap_err().to_string();
    assert!(e.contains("does not split"), "[rank {rank}] {e}");
    t.ok("reduce_scatter_sum of 3 rows over 2 ranks is an error");

    // all_to_all: rank s sends s + j + 1 rows to rank j; row k of that block holds
    // 100 s + 10 j + k + 0.25 c in column c.
    let row = |s: usize, j: usize, k: usize| -> Vec<f32> {
        (0..3)
            .map(|col| (100 * s + 10 * j + k) as f32 + 0.25 * col as f32)
            .collect()
    };
    let send: Vec<usize> = (0..WORLD).map(|j| rank + j + 1).collect();
    let v: Vec<f32> = (0..WORLD)
        .flat_map(|j| (0..send[j]).flat_map(move |k| row(rank, j, k)))
        .collect();
    let x = t.up(&[send.iter().sum(), 3], &v, DType::F32);
    let (got, counts) = c.all_to_all(&b, &x, &send).unwrap();
    let from: Vec<usize> = (0..WORLD).map(|s| s + rank + 1).collect();
    assert_eq!(counts, from, "[rank {rank}] all_to_all counts");
    let want: Vec<f32> = (0..WORLD)
        .flat_map(|s| (0..from[s]).flat_map(move |k| row(s, rank, k)))
        .collect();
    t.check(
        &format!("all_to_all f32 send {send:?} -> counts {counts:?}"),
        &got,
        &[from.iter().sum(), 3],
        &want,
    );
    // Every row to rank 0: rank 1 receives nothing.
    let send = [rank + 1, 0];
    let v: Vec<f32> = (0..send[0]).flat_map(|k| row(rank, 0, k)).collect();
    let x = t.up(&[send[0], 3], &v, DType::F32);
    let (got, counts) = c.all_to_all(&b, &x, &send).unwrap();
    let (from, want): (Vec<usize>, Vec<f32>) = if rank == 0 {
        (
            vec![1, 2],
            (0..WORLD)
                .flat_map(|s| (0..s + 1).flat_map(move |k| row(s, 0, k)))
                .collect(),
        )
    } else {
        (vec![0, 0], vec![])
    };
    assert_eq!(
        counts, from,
        "[rank {rank}] all_to_all counts (all to rank 0)"
    );
    t.check(
        &format!("all_to_all f32 send {send:?} -> counts {counts:?}"),
        &got,
        &[from.iter().sum(), 3],
        &want,
    );
    let e = c
        .all_to_all(&b, &x, &[send[0] + 1, 0])
        .unwrap_err()
        .to_string();
    assert!(e.contains("do not split"), "[rank {rank}] {e}");
    t.ok("all_to_all with counts that do not add up is an error");

    // broadcast from each root.
    let x = t.up(&[2], &[7.0 * r + 1.0, r], DType::F32);
    t.check(
        "broadcast f32 [2] from rank 1",
        &c.broadcast(&b, &x, 1).unwrap(),
        &[2],
        &[8.0, 1.0],
    );
    t.check(
        "broadcast f32 [2] from rank 0",
        &c.broadcast(&b, &x, 0).unwrap(),
        &[2],
        &[1.0, 0.0],
    );
    let x = t.up(&[1, 2], &[r + 0.5, -r], DType::F16);
    t.check(
        "broadcast f16 [1,2] from rank 1",
        &c.broadcast(&b, &x, 1).unwrap(),
        &[1, 2],
        &[1.5, -1.0],
    );

    c.barrier().unwrap();
    t.ok("barrier");
    println!("[rank {rank}] all {} checks passed", t.n);
}

struct Checker<'a> {
    b: &'a CudaBackend,
    rank: usize,
    n: usize,
}

impl Checker<'_> {
    fn up(&self, shape: &[usize], v: &[f32], dt: DType) -> CudaTensor {
        self.b
            .upload(&HostTensor::from_f32_as(shape.to_vec(), v, dt).unwrap())
            .unwrap()
    }

    fn ok(&mut self, what: &str) {
        self.n += 1;
        println!("[rank {}] ok  {what}", self.rank);
    }

    /// `t` must have `shape` and exactly the values `want`.
    fn check(&mut self, what: &str, t: &CudaTensor, shape: &[usize], want: &[f32]) {
        let h = self.b.download(t).unwrap();
        let got = h.to_f32();
        let short = |v: &[f32]| {
            format!(
                "{:?}{}",
                &v[..v.len().min(8)],
                if v.len() > 8 { " …" } else { "" }
            )
        };
        if h.shape != shape || got != want {
            panic!(
                "[rank {}] FAILED {what}: got {:?} {}, want {shape:?} {}",
                self.rank,
                h.shape,
                short(&got),
                short(want)
            );
        }
        self.ok(&format!("{what}: {}", short(&got)));
    }
}
