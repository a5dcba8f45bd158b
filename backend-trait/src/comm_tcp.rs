//! A [`HostGroup`] over TCP: rank 0 listens on the master address (torchrun's
//! `MASTER_ADDR:MASTER_PORT`), every other rank connects to it, on one machine or many. The
//! same sockets carry the NCCL id at start-up and each step's control messages afterwards.
//!
//! Each worker opens two connections: one for messages and one only to notice a peer's exit
//! ([`TcpGroup::watch_peers`]): a rank stuck in a device collective (NCCL) after a peer died
//! cannot see it on the message socket, so a watcher thread ends the process with a message
//! naming the rank instead of letting it hang.

use crate::comm::{star, HostGroup, Link, Star};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes a worker sends first: a tag, then its rank, the world size and the connection's role.
const HELLO: &[u8; 8] = b"dayone1\0";

/// One framed TCP connection (`[len u64 LE][bytes]`).
struct TcpLink {
    s: TcpStream,
}

impl Link for TcpLink {
    fn send(&mut self, msg: &[u8]) -> Result<()> {
        self.s.write_all(&(msg.len() as u64).to_le_bytes())?;
        self.s.write_all(msg)?;
        Ok(())
    }

    fn recv(&mut self, timeout: Option<Duration>) -> Result<Vec<u8>> {
        self.s.set_read_timeout(timeout)?;
        let mut len = [0u8; 8];
        read_exact(&mut self.s, &mut len, timeout)?;
        let n = u64::from_le_bytes(len) as usize;
        let mut buf = vec![0u8; n];
        read_exact(&mut self.s, &mut buf, timeout)?;
        Ok(buf)
    }
}

/// `read_exact` with errors that say what happened (peer closed, timed out).
fn read_exact(s: &mut TcpStream, buf: &mut [u8], timeout: Option<Duration>) -> Result<()> {
    s.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => {
            anyhow!("the connection closed (the process exited)")
        }
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            anyhow!("no message within {:?}", timeout.unwrap_or_default())
        }
        _ => anyhow!(e),
    })
}

/// A group of ranks joined over TCP through rank 0.
pub struct TcpGroup {
    star: Star,
    /// Rank 0: the watch connection of each worker (rank order); a worker: its one to rank 0.
    watch: Vec<(usize, TcpStream)>,
}

/// Where and how long to meet.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    /// `host:port` rank 0 listens on (`MASTER_ADDR:MASTER_PORT`).
    pub master: String,
    /// This rank.
    pub rank: usize,
    /// All ranks.
    pub world: usize,
    /// How long rank 0 waits for every worker, and a worker for rank 0.
    pub join_timeout: Duration,
    /// How long any collective waits for the slowest rank.
    pub collective_timeout: Duration,
}

impl TcpGroup {
    /// Joins the group: rank 0 binds `master` (or takes `listener`, already bound, so a parent
    /// can pick a free port before spawning its workers) and waits for every other rank; a
    /// worker connects, retrying until rank 0 is up.
    ///
    /// Errors: the address does not resolve or bind; a rank that has not joined within
    /// `join_timeout` (the error lists the missing ranks); a worker of another world size.
    pub fn join(r: &Rendezvous, listener: Option<TcpListener>) -> Result<Self> {
        Self::join_checking(r, listener, &|| Ok(()))
    }

    /// [`TcpGroup::join`], calling `alive` while rank 0 waits for the others (every 20 ms): an
    /// error from it (a rank process this one started has exited) ends the wait at once.
    pub fn join_checking(
        r: &Rendezvous,
        listener: Option<TcpListener>,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<Self> {
        if r.world < 2 || r.rank >= r.world {
            bail!("rank {} of a world of {}: nothing to join", r.rank, r.world);
        }
        if r.rank == 0 {
            Self::host(r, listener, alive)
        } else {
            Self::connect(r)
        }
    }

    fn host(
        r: &Rendezvous,
        listener: Option<TcpListener>,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<Self> {
        let l = match listener {
            Some(l) => l,
            None => TcpListener::bind(&r.master).with_context(|| {
                format!(
                    "rank 0: cannot listen on {} (MASTER_ADDR:MASTER_PORT)",
                    r.master
                )
            })?,
        };
        l.set_nonblocking(true)?;
        let deadline = Instant::now() + r.join_timeout;
        let mut msg: Vec<Option<TcpStream>> = (0..r.world).map(|_| None).collect();
        let mut watch: Vec<Option<TcpStream>> = (0..r.world).map(|_| None).collect();
        while msg.iter().skip(1).any(Option::is_none) || watch.iter().skip(1).any(Option::is_none) {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)?;
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(Duration::from_secs(10)))?;
                    let mut hello = [0u8; 8 + 4 + 4 + 1];
                    if s.read_exact(&mut hello).is_err() || &hello[..8] != HELLO {
                        continue; // not one of ours (a port scan, a stale client)
                    }
                    let rank = u32::from_le_bytes(hello[8..12].try_into()?) as usize;
                    let world = u32::from_le_bytes(hello[12..16].try_into()?) as usize;
                    if world != r.world {
                        bail!(
                            "rank {rank} was started with a world size of {world}, rank 0 with {}",
                            r.world
                        );
                    }
                    if rank == 0 || rank >= r.world {
                        bail!("a process joined as rank {rank}, outside 1..{}", r.world);
                    }
                    let slot = if hello[16] == 1 { &mut watch } else { &mut msg };
                    if slot[rank].is_some() {
                        bail!("two processes joined as rank {rank}");
                    }
                    s.set_read_timeout(None)?;
                    slot[rank] = Some(s);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    alive()?;
                    if Instant::now() > deadline {
                        let missing: Vec<usize> = (1..r.world)
                            .filter(|&i| msg[i].is_none() || watch[i].is_none())
                            .collect();
                        bail!(
                            "ranks {missing:?} did not join within {:?} (rank 0 listening on {})",
                            r.join_timeout,
                            r.master
                        );
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e).context("rank 0: accepting a rank"),
            }
        }
        let links: Vec<Box<dyn Link>> = msg
            .into_iter()
            .skip(1)
            .map(|s| {
                Box::new(TcpLink {
                    s: s.expect("all joined"),
                }) as Box<dyn Link>
            })
            .collect();
        let watch = watch
            .into_iter()
            .enumerate()
            .skip(1)
            .map(|(i, s)| (i, s.expect("all joined")))
            .collect();
        let star = star(0, r.world, links, r.collective_timeout)?;
        // Everyone is in: release the workers together.
        star.broadcast_bytes(b"go", false)?;
        Ok(Self { star, watch })
    }

    fn connect(r: &Rendezvous) -> Result<Self> {
        let deadline = Instant::now() + r.join_timeout;
        let open = |role: u8| -> Result<TcpStream> {
            loop {
                let addrs = r
                    .master
                    .to_socket_addrs()
                    .with_context(|| format!("rank {}: cannot resolve {}", r.rank, r.master))?;
                for a in addrs {
                    if let Ok(mut s) = TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
                        s.set_nodelay(true)?;
                        let mut hello = HELLO.to_vec();
                        hello.extend_from_slice(&(r.rank as u32).to_le_bytes());
                        hello.extend_from_slice(&(r.world as u32).to_le_bytes());
                        hello.push(role);
                        s.write_all(&hello)?;
                        return Ok(s);
                    }
                }
                if Instant::now() > deadline {
                    bail!(
                        "rank {}: rank 0 did not answer at {} within {:?}",
                        r.rank,
                        r.master,
                        r.join_timeout
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        let mut link = TcpLink { s: open(0)? };
        let w = open(1)?;
        // Rank 0 releases everyone once all have joined.
        let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(5);
        let go = link
            .recv(Some(left))
            .with_context(|| format!("rank {}: waiting for the other ranks to join", r.rank))?;
        if go != b"go" {
            bail!("rank {}: unexpected greeting from rank 0", r.rank);
        }
        let star = star(r.rank, r.world, vec![Box::new(link)], r.collective_timeout)?;
        Ok(Self {
            star,
            watch: vec![(0, w)],
        })
    }

    /// Ends this process when a peer's watch connection closes while `done` is still unset
    /// (rank 0 sets it before an orderly shutdown): prints `error: rank R exited; stopping
    /// rank ME` and exits with status 1. One thread per peer.
    pub fn watch_peers(&mut self, done: Arc<AtomicBool>) {
        let me = self.star.rank();
        for (peer, mut s) in std::mem::take(&mut self.watch) {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                let _ = s.set_read_timeout(None);
                // Nothing is ever sent on it: any return is the peer going away.
                let _ = s.read(&mut b);
                if !done.load(Ordering::SeqCst) {
                    eprintln!("error: rank {peer} exited; stopping rank {me}");
                    std::process::exit(1);
                }
            });
        }
    }
}

impl HostGroup for TcpGroup {
    fn rank(&self) -> usize {
        self.star.rank()
    }
    fn world(&self) -> usize {
        self.star.world()
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.star.all_gather_bytes(mine)
    }
    fn broadcast_bytes(&self, data: &[u8], idle: bool) -> Result<Vec<u8>> {
        self.star.broadcast_bytes(data, idle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_ranks_meet_over_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let master = l.local_addr().unwrap().to_string();
        let r = |rank| Rendezvous {
            master: master.clone(),
            rank,
            world: 3,
            join_timeout: Duration::from_secs(20),
            collective_timeout: Duration::from_secs(20),
        };
        let workers: Vec<_> = (1..3)
            .map(|k| {
                let rv = r(k);
                std::thread::spawn(move || {
                    let g = TcpGroup::join(&rv, None).unwrap();
                    let all = g.all_gather_bytes(&[k as u8]).unwrap();
                    let b = g.broadcast_bytes(&[], true).unwrap();
                    (all, b)
                })
            })
            .collect();
        let g = TcpGroup::join(&r(0), Some(l)).unwrap();
        assert_eq!(
            g.all_gather_bytes(&[0]).unwrap(),
            vec![vec![0], vec![1], vec![2]]
        );
        g.broadcast_bytes(b"step", false).unwrap();
        for w in workers {
            let (all, b) = w.join().unwrap();
            assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
            assert_eq!(b, b"step");
        }
    }

    #[test]
    fn a_missing_rank_is_named() {
        let r = Rendezvous {
            master: "127.0.0.1:0".into(),
            rank: 0,
            world: 2,
            join_timeout: Duration::from_millis(300),
            collective_timeout: Duration::from_secs(1),
        };
        let err = TcpGroup::join(&r, None).err().unwrap();
        assert!(
            format!("{err:#}").contains("ranks [1] did not join"),
            "{err:#}"
        );
    }
}
