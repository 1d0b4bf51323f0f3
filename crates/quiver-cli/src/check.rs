//! `quiver check`: a verification job that checks an installation end to end.
//!
//! ```text
//! quiver run -n N -- quiver check [--pattern pairs|all-to-all] [--sizes LIST] [--count N]
//!                                 [--transport shm|udp] [--tolerate-failures]
//! mpirun -n N -x QUIVER_RENDEZVOUS=tcp://HOST:PORT quiver check ...
//! ```
//!
//! Every rank joins the job ([`quiver::Job::from_env_with`], configuration from the
//! `QUIVER_*` variables, `--transport` overriding `QUIVER_TRANSPORT`) and opens DPID 1.
//! Its peers are, with `--pattern pairs` (the default), rank `r ^ 1` if that rank exists,
//! and with `--pattern all-to-all` every other rank.
//!
//! # Traffic
//!
//! The check proceeds in rounds: one round per size and repetition (`--count` rounds of
//! each size, sizes in increasing order). In round `k` every rank writes one message of
//! that round's size to each of its peers, then reads until it holds round `k`'s message
//! from every peer. A rank therefore starts round `k + 1` only after every peer has
//! started round `k`, so at most two messages per channel are ever waiting at a
//! receiver: they always fit the shared-memory ring of a sender (which `write` would
//! otherwise block on) and, over UDP (which has no flow control), the receiver's socket
//! buffer. After every write the endpoint is drained with `try_read`.
//!
//! # What is verified
//!
//! - Content: message `k` from rank `s` has the round's length and bytes that are a
//!   deterministic function of `(s, k, length)`; messages of 8 bytes or more carry `k` in
//!   their first 8 bytes (little endian), which names a reordered message precisely.
//! - Order: messages from each source arrive in the order they were sent (every message's
//!   expected `k` is the number of messages already received from its source).
//! - Exactly once: no message from a rank that is not a peer, no message beyond the
//!   expected count (each rank received exactly the rounds' messages from every peer),
//!   and, after a [`quiver::Job::barrier`] that every rank reaches only once it has sent
//!   everything, no further message is waiting.
//!
//! Rank 0 prints one summary line after a second barrier, that is once every rank has
//! passed every check, e.g.
//! `quiver check: 4 ranks, pattern all-to-all, transport shm, 120 messages (3.2 MB) verified`.
//! A rank that finds an error prints `quiver check: rank R: WHAT` to stderr and exits
//! with status 1 (the launcher then terminates the job).
//!
//! # Surviving failed peers (`--tolerate-failures`)
//!
//! Without the option, a peer reported failed ([`quiver::Error::PeerFailed`]) is an error
//! like any other. With it (start the job with `quiver run --keep-going`, so that the
//! launcher lets the survivors finish), a rank that learns that a peer failed
//!
//! - prints `quiver check: rank R: rank F failed (N of M messages received from it, the
//!   last S s ago): WHY` to stdout (WHY: the endpoint's error, or `declared failed in the
//!   job` when it learned it from [`quiver::Job::failed_ranks`]) and declares F failed to
//!   the job ([`quiver::Job::declare_failed`]);
//! - writes nothing more to F and stops waiting for it; what F sent before it failed is
//!   still verified as it arrives (content, order, no duplicates);
//! - goes on with the rounds among the other ranks, verified as usual.
//!
//! A rank learns of a failure from its endpoint (`PeerFailed` from a read or a write), or,
//! when no message at all has arrived for longer than `QUIVER_PEER_TIMEOUT`, from another
//! rank's declaration (a rank that waits for a dead network peer with nothing of its own
//! in flight to it may have no other way to know). The barriers are then
//! [`quiver::Job::barrier_live`], among the live ranks, whose failed ranks every survivor
//! adopts (a rank that never talked to the failed one learns of it there). After them
//! every survivor prints `quiver check: rank R: done; failed ranks: F,...`, the lowest
//! live rank prints the summary (counting the messages among the live ranks, e.g. `...,
//! transport shm, rank 1 failed, 240 messages (1.2 MB) among the 3 live ranks
//! verified`), and the survivors exit with status 0.

use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use quiver::{Config, Endpoint, Error, Job, TransportChoice};

use crate::bench::sizes::parse_sizes;
use crate::bench::TransportArg;

/// DPID of the check's endpoint.
const DPID: u16 = 1;
/// How long a rank waits for the next message before it gives up.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// With `--tolerate-failures`: how long a waiting rank reads before it looks again for
/// failures that other ranks declared.
const DECLARED_POLL: Duration = Duration::from_millis(100);
/// With `--tolerate-failures`: how much longer than `QUIVER_PEER_TIMEOUT` a rank waits
/// without any message before it believes other ranks' declarations (its own endpoint
/// has spoken by then if it can).
const DECLARED_GRACE: Duration = Duration::from_millis(500);
/// Sizes checked by default: around zero, the 64-byte boundary, the UDP datagram payload
/// (1472), and multi-fragment messages up to 1 MiB.
const DEFAULT_SIZES: [usize; 10] = [0, 1, 63, 64, 65, 1471, 1472, 1473, 65536, 1 << 20];

/// Arguments of `quiver check`.
#[derive(Args, Debug)]
#[command(after_long_help = "\
Run it inside a job: `quiver run -n 4 -- quiver check --pattern all-to-all`, or under \
mpirun with QUIVER_RENDEZVOUS set (`mpirun -n 2 -x QUIVER_RENDEZVOUS=tcp://127.0.0.1:7777 \
quiver check`). Every message is verified byte for byte, in order and exactly once; rank 0 \
prints a summary line. Default sizes: 0,1,63,64,65,1471,1472,1473,64K,1M.")]
pub struct CheckArgs {
    /// Who talks to whom: pairs (rank r with rank r^1) or all-to-all.
    #[arg(long, value_enum, default_value_t = Pattern::Pairs)]
    pub pattern: Pattern,
    /// Message sizes: comma list with K/M suffixes and ranges of powers of two, e.g.
    /// `0,8,1K,64K,1M` or `0..1M`.
    #[arg(long, value_name = "LIST", value_parser = parse_size_list)]
    pub sizes: Option<SizeList>,
    /// Messages of each size sent to each peer.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// Transport: shm (shared memory where possible, the network between nodes), udp or eth (overrides QUIVER_TRANSPORT).
    #[arg(long, value_enum)]
    pub transport: Option<TransportArg>,
    /// Survive failed peers: a peer reported failed (PeerFailed) is dropped, what it sent
    /// is still verified, the traffic among the others completes and the survivors exit
    /// with status 0 after printing which ranks failed (use `quiver run --keep-going`).
    #[arg(long)]
    pub tolerate_failures: bool,
}

/// A parsed `--sizes` list (sorted, without duplicates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeList(pub Vec<usize>);

fn parse_size_list(s: &str) -> Result<SizeList, String> {
    parse_sizes(s).map(SizeList)
}

/// Communication pattern of `quiver check`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Rank r exchanges messages with rank r^1 (a rank without partner only synchronizes).
    Pairs,
    /// Every rank exchanges messages with every other rank.
    AllToAll,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Pairs => "pairs",
            Pattern::AllToAll => "all-to-all",
        }
    }

    /// The peers of `rank` in a job of `size` ranks, in the order `rank` writes to them
    /// (starting after itself, so that ranks do not all write to the same rank at once).
    fn peers(self, rank: u32, size: u32) -> Vec<u32> {
        match self {
            Pattern::Pairs => {
                let p = rank ^ 1;
                if p < size {
                    vec![p]
                } else {
                    Vec::new()
                }
            }
            Pattern::AllToAll => (1..size).map(|d| (rank + d) % size).collect(),
        }
    }
}

/// Entry point of `quiver check`; returns the exit status.
pub fn main(args: CheckArgs) -> i32 {
    let sizes = match &args.sizes {
        Some(SizeList(list)) => list.clone(),
        None => DEFAULT_SIZES.to_vec(),
    };
    if sizes.is_empty() {
        eprintln!("quiver check: no message sizes given");
        return 1;
    }
    if !crate::bench::in_job() {
        eprintln!(
            "quiver check: not inside a job (none of {} is set); start it with \
             `quiver run -n 2 -- quiver check`, `mpirun -n 2 quiver check`, `mpiexec -n 2 \
             quiver check` or `srun --mpi=pmix -n 2 quiver check`",
            crate::bench::JOB_RANK_VARS.join(", ")
        );
        return 1;
    }
    let config = match job_config(&args, &sizes) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quiver check: {e}");
            return 1;
        }
    };
    let job = match Job::from_env_with(config) {
        Ok(job) => job,
        Err(e) => {
            eprintln!("quiver check: cannot join the job: {e}");
            return 1;
        }
    };
    match run(&job, &args, &sizes) {
        Ok(()) => 0,
        Err(what) => {
            eprintln!("quiver check: rank {}: {what}", job.rank());
            1
        }
    }
}

/// The configuration: `QUIVER_*` variables, `--transport` over `QUIVER_TRANSPORT`, and
/// the maximum message and pool raised to fit the largest size unless `QUIVER_MAX_MESSAGE`
/// or `QUIVER_POOL_SIZE` say otherwise.
fn job_config(args: &CheckArgs, sizes: &[usize]) -> Result<Config, String> {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(t) = args.transport {
        cfg.transport = match t {
            TransportArg::Shm => TransportChoice::Auto,
            TransportArg::Udp => TransportChoice::Udp,
            TransportArg::Eth => TransportChoice::Eth,
        };
    }
    let largest = sizes.iter().copied().max().unwrap_or(0);
    if largest > cfg.max_message {
        if set("QUIVER_MAX_MESSAGE") {
            return Err(format!(
                "message size {largest} exceeds QUIVER_MAX_MESSAGE={}; raise it or drop the size",
                cfg.max_message
            ));
        }
        cfg.max_message = largest;
    }
    // Two messages per channel may wait at a receiver (see the module documentation).
    let want_pool = 2 * cfg.max_message + 64 * 1024;
    if cfg.pool_size < want_pool && !set("QUIVER_POOL_SIZE") {
        cfg.pool_size = want_pool;
    }
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// Receive-side bookkeeping of one rank.
struct Tally<'a> {
    rank: u32,
    size: u32,
    sizes: &'a [usize],
    count: u64,
    /// Messages received per source rank (`u64::MAX` marks a rank that is not a peer).
    received: Vec<u64>,
    /// When the last message of each rank arrived (the start for none yet).
    last: Vec<Instant>,
    /// Ranks found failed: no more messages are expected from them.
    failed: Vec<bool>,
    /// Scratch buffer for the expected bytes.
    expected: Vec<u8>,
}

impl<'a> Tally<'a> {
    /// Bookkeeping for `rank` of a job of `size` ranks, expecting `count` messages of each
    /// of `sizes` from each of `peers`.
    fn new(rank: u32, size: u32, peers: &[u32], sizes: &'a [usize], count: u64) -> Self {
        let now = Instant::now();
        Tally {
            rank,
            size,
            sizes,
            count,
            received: (0..size)
                .map(|r| if peers.contains(&r) { 0 } else { u64::MAX })
                .collect(),
            last: vec![now; size as usize],
            failed: vec![false; size as usize],
            expected: Vec::new(),
        }
    }

    /// Length of message `k` of every sender.
    fn len_of(&self, k: u64) -> usize {
        self.sizes[(k / self.count) as usize]
    }

    fn total(&self) -> u64 {
        self.sizes.len() as u64 * self.count
    }

    /// Verifies one received message and counts it.
    fn accept(&mut self, src: u32, data: &[u8]) -> Result<(), String> {
        if src >= self.size {
            return Err(format!(
                "message from rank {src}, which is not in the job of {} ranks",
                self.size
            ));
        }
        let k = self.received[src as usize];
        if k == u64::MAX {
            return Err(format!(
                "unexpected message of {} bytes from rank {src}, which is not a peer of rank {}",
                data.len(),
                self.rank
            ));
        }
        if k >= self.total() {
            return Err(format!(
                "extra message of {} bytes from rank {src}: all {} expected messages had \
                 already arrived (duplicate?)",
                data.len(),
                self.total()
            ));
        }
        let len = self.len_of(k);
        if data.len() >= 8 {
            let seq = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
            if seq != k {
                return Err(format!(
                    "message from rank {src} out of order: expected message #{k} ({len} bytes), \
                     got message #{seq} ({} bytes)",
                    data.len()
                ));
            }
        }
        if data.len() != len {
            return Err(format!(
                "message #{k} from rank {src} has {} bytes, expected {len}",
                data.len()
            ));
        }
        self.expected.resize(len, 0);
        fill(&mut self.expected, src, k);
        if data != self.expected.as_slice() {
            let at = data
                .iter()
                .zip(&self.expected)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(format!(
                "message #{k} from rank {src} ({len} bytes) is corrupt: byte {at} is {:#04x}, \
                 expected {:#04x}",
                data[at], self.expected[at]
            ));
        }
        self.received[src as usize] = k + 1;
        self.last[src as usize] = Instant::now();
        Ok(())
    }

    /// Whether more messages are expected from peer `p` before round `n` is complete.
    fn owes(&self, p: u32, n: u64) -> bool {
        !self.failed[p as usize] && self.received[p as usize] < n
    }
}

fn read_error(e: Error) -> String {
    match e {
        Error::Lost { .. } => {
            format!("{e} (UDP datagrams were dropped, e.g. because a receive buffer overflowed)")
        }
        e => format!("read failed: {e}"),
    }
}

/// One rank's run of the check: its endpoint, its bookkeeping, and what it does when a
/// peer fails.
struct Checker<'a> {
    job: &'a Job,
    ep: &'a Endpoint,
    rx: Tally<'a>,
    /// `--tolerate-failures`: a failed peer is dropped instead of ending the check.
    tolerate: bool,
}

impl Checker<'_> {
    /// An error of the endpoint: under `--tolerate-failures`, a failed peer is dropped and
    /// the check goes on; anything else ends it, described by `describe`.
    fn on_error(&mut self, e: Error, describe: impl FnOnce(Error) -> String) -> Result<(), String> {
        match e {
            Error::PeerFailed { rank, .. } if self.tolerate && rank != self.rx.rank => {
                self.drop_rank(rank, &e.to_string())
            }
            e => Err(describe(e)),
        }
    }

    /// Stops expecting anything from `rank` and writing to it (once), says so, and
    /// declares it failed to the other ranks.
    fn drop_rank(&mut self, rank: u32, why: &str) -> Result<(), String> {
        let r = rank as usize;
        if r >= self.rx.failed.len() || self.rx.failed[r] {
            return Ok(());
        }
        self.rx.failed[r] = true;
        let since = self.rx.last[r].elapsed().as_secs_f64();
        let got = match self.rx.received[r] {
            u64::MAX => format!("not a peer of rank {}", self.rx.rank),
            0 => format!(
                "0 of {} messages received from it, {since:.2} s after the start",
                self.rx.total()
            ),
            n => format!(
                "{n} of {} messages received from it, the last {since:.2} s ago",
                self.rx.total()
            ),
        };
        println!(
            "quiver check: rank {}: rank {rank} failed ({got}): {why}",
            self.rx.rank
        );
        self.job
            .declare_failed(rank)
            .map_err(|e| format!("cannot declare rank {rank} failed: {e}"))
    }

    /// Drops the ranks that other ranks declared failed.
    fn adopt_declared(&mut self) -> Result<(), String> {
        let declared = self
            .job
            .failed_ranks()
            .map_err(|e| format!("cannot read the failed ranks: {e}"))?;
        self.adopt(&declared)
    }

    fn adopt(&mut self, failed: &[u32]) -> Result<(), String> {
        for &rank in failed {
            if rank != self.rx.rank && !self.rx.failed[rank as usize] {
                self.drop_rank(rank, "declared failed in the job")?;
            }
        }
        Ok(())
    }

    /// Sets the endpoint's target to `p`; `false` if `p` turned out to have failed.
    fn target(&mut self, p: u32) -> Result<bool, String> {
        match self.ep.target_rank(p) {
            Ok(()) => Ok(true),
            Err(e) if self.tolerate => {
                // A peer whose endpoint another rank removed after it died (shared
                // memory) is not found: believe the declaration, if there is one.
                let declared = self.job.failed_ranks().unwrap_or_default();
                if declared.contains(&p) {
                    self.adopt(&declared)?;
                    return Ok(false);
                }
                self.on_error(e, |e| format!("cannot reach rank {p}: {e}"))?;
                Ok(!self.rx.failed[p as usize])
            }
            Err(e) => Err(format!("cannot reach rank {p}: {e}")),
        }
    }

    /// Verifies every message that is waiting, without blocking.
    fn drain(&mut self) -> Result<(), String> {
        let ep = self.ep;
        loop {
            match ep.try_read() {
                Ok(Some(msg)) => {
                    let src = msg.source().rank;
                    self.rx.accept(src, &msg)?;
                }
                Ok(None) => return Ok(()),
                Err(e) => self.on_error(e, read_error)?,
            }
        }
    }

    /// Waits until `n` messages have arrived from each of `peers` that has not failed.
    ///
    /// Under `--tolerate-failures` the endpoint's own verdict comes first: a rank believes
    /// the failures other ranks declared only once it has waited longer than
    /// `QUIVER_PEER_TIMEOUT` for any message, which happens when it waits for a dead
    /// network peer that it has nothing in flight to and its channel cannot tell (before
    /// heartbeats on idle channels).
    fn wait_for(&mut self, peers: &[u32], n: u64) -> Result<(), String> {
        let ep = self.ep;
        let slice = if self.tolerate {
            DECLARED_POLL
        } else {
            READ_TIMEOUT
        };
        let believe_after = self.job.config().peer_timeout + DECLARED_GRACE;
        let mut since = Instant::now();
        while let Some(&slow) = peers.iter().find(|&&p| self.rx.owes(p, n)) {
            match ep.read_timeout(slice) {
                Ok(msg) => {
                    let src = msg.source().rank;
                    self.rx.accept(src, &msg)?;
                    since = Instant::now();
                }
                Err(Error::Timeout(_)) if self.tolerate && since.elapsed() < READ_TIMEOUT => {
                    if since.elapsed() >= believe_after {
                        self.adopt_declared()?;
                    }
                }
                Err(Error::Timeout(_)) => {
                    let got = self.rx.received[slow as usize];
                    return Err(format!(
                        "timed out after {READ_TIMEOUT:?} waiting for message #{got} from rank \
                         {slow} ({got} of {} received)",
                        self.rx.total()
                    ));
                }
                Err(e) => self.on_error(e, read_error)?,
            }
        }
        Ok(())
    }

    /// Every round: a message to each live peer, then wait for one from each.
    fn rounds(&mut self, peers: &[u32]) -> Result<(), String> {
        let rank = self.rx.rank;
        let mut buf = Vec::new();
        for k in 0..self.rx.total() {
            let len = self.rx.len_of(k);
            buf.resize(len, 0);
            fill(&mut buf, rank, k);
            for &p in peers {
                if self.rx.failed[p as usize] || !self.target(p)? {
                    continue;
                }
                if let Err(e) = self.ep.write(&buf) {
                    self.on_error(e, |e| {
                        format!("write of message #{k} ({len} bytes) to rank {p}: {e}")
                    })?;
                }
                self.drain()?;
            }
            self.wait_for(peers, k + 1)?;
        }
        Ok(())
    }

    /// The barrier after the traffic: of every rank, or, under `--tolerate-failures`, of
    /// the live ranks (whose failed set is adopted). Returns the failed ranks.
    fn barrier(&mut self) -> Result<Vec<u32>, String> {
        if !self.tolerate {
            self.job
                .barrier_progressing(&[self.ep])
                .map_err(|e| format!("barrier failed: {e}"))?;
            return Ok(Vec::new());
        }
        let failed = self
            .job
            .barrier_live(&[self.ep])
            .map_err(|e| format!("barrier failed: {e}"))?;
        self.adopt(&failed)?;
        Ok(failed)
    }
}

/// Runs the check on this rank; `Err` says what went wrong.
fn run(job: &Job, args: &CheckArgs, sizes: &[usize]) -> Result<(), String> {
    let (rank, size) = (job.rank(), job.size());
    let ep = job
        .open(DPID)
        .map_err(|e| format!("cannot open DPID {DPID}: {e}"))?;
    let peers = args.pattern.peers(rank, size);
    let mut check = Checker {
        job,
        ep: &ep,
        rx: Tally::new(rank, size, &peers, sizes, args.count),
        tolerate: args.tolerate_failures,
    };
    check.rounds(&peers)?;
    // Every rank reaches the barrier only after its last write: whatever is still waiting
    // now is a duplicate or a stray message. The barriers keep the endpoint making
    // progress, so that peers still waiting for an acknowledgement or a retransmission
    // from this rank get it.
    check.barrier()?;
    for _ in 0..64 {
        check.drain()?;
    }
    // Under --tolerate-failures, every survivor leaves the second barrier with the same
    // failed ranks (unless yet another rank fails meanwhile).
    let failed = check.barrier()?;
    if !failed.is_empty() {
        println!(
            "quiver check: rank {rank}: done; failed ranks: {}",
            join_ranks(&failed)
        );
    }

    // The lowest live rank prints the summary.
    if (0..size).find(|r| !failed.contains(r)) == Some(rank) {
        let live = |r: u32| !failed.contains(&r);
        let per_peer_msgs = check.rx.total();
        let per_peer_bytes = args.count * sizes.iter().map(|&s| s as u64).sum::<u64>();
        let channels: u64 = (0..size)
            .filter(|&r| live(r))
            .map(|r| {
                let peers = args.pattern.peers(r, size);
                peers.into_iter().filter(|&p| live(p)).count() as u64
            })
            .sum();
        // The transports this rank used, e.g. "shm+eth" on a cluster of several nodes.
        let mut used: Vec<String> = Vec::new();
        for p in (0..size).filter(|&p| p != rank) {
            let t = ep.transport_to(p).map_err(|e| e.to_string())?.to_string();
            if !used.contains(&t) {
                used.push(t);
            }
        }
        let transport = if used.is_empty() {
            "shm".to_string()
        } else {
            used.join("+")
        };
        let traffic = format!(
            "{} messages ({})",
            channels * per_peer_msgs,
            fmt_bytes(channels * per_peer_bytes)
        );
        if failed.is_empty() {
            println!(
                "quiver check: {size} ranks, pattern {}, transport {transport}, {traffic} verified",
                args.pattern.name(),
            );
            println!(
                "  started by {}; the ranks met through {}",
                job.launcher(),
                job.bootstrap()
            );
        } else {
            let which = match failed.len() {
                1 => format!("rank {} failed", failed[0]),
                _ => format!("ranks {} failed", join_ranks(&failed)),
            };
            println!(
                "quiver check: {size} ranks, pattern {}, transport {transport}, {which}, \
                 {traffic} among the {} live ranks verified",
                args.pattern.name(),
                size as usize - failed.len(),
            );
        }
    }
    Ok(())
}

/// `1,3,4`.
fn join_ranks(ranks: &[u32]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Fills `buf` with the bytes of message `seq` of rank `src` (of length `buf.len()`): a
/// pseudo-random stream seeded by `(src, seq, len)`, whose first 8 bytes are replaced by
/// the sequence number when the message has room for them.
fn fill(buf: &mut [u8], src: u32, seq: u64) {
    let len = buf.len() as u64;
    let seed = mix(((src as u64) << 40) ^ seq.rotate_left(20) ^ len.wrapping_mul(0x9e37_79b9));
    let rest = if buf.len() >= 8 {
        let (head, rest) = buf.split_at_mut(8);
        head.copy_from_slice(&seq.to_le_bytes());
        rest
    } else {
        buf
    };
    for (i, chunk) in rest.chunks_mut(8).enumerate() {
        let word = mix(seed.wrapping_add(i as u64)).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// SplitMix64's finalizer.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `950 B`, `12.3 kB`, `3.2 MB`, `1.5 GB` (decimal units).
fn fmt_bytes(n: u64) -> String {
    let x = n as f64;
    if n < 1000 {
        format!("{n} B")
    } else if x < 1e6 {
        format!("{:.1} kB", x / 1e3)
    } else if x < 1e9 {
        format!("{:.1} MB", x / 1e6)
    } else {
        format!("{:.1} GB", x / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_of_each_pattern() {
        assert_eq!(Pattern::Pairs.peers(0, 3), [1]);
        assert_eq!(Pattern::Pairs.peers(1, 3), [0]);
        assert!(Pattern::Pairs.peers(2, 3).is_empty());
        assert_eq!(Pattern::AllToAll.peers(1, 4), [2, 3, 0]);
        assert!(Pattern::AllToAll.peers(0, 1).is_empty());
    }

    #[test]
    fn pattern_depends_on_source_sequence_and_length() {
        let bytes = |src, seq, len| {
            let mut b = vec![0u8; len];
            fill(&mut b, src, seq);
            b
        };
        assert_eq!(bytes(1, 5, 100), bytes(1, 5, 100));
        assert_ne!(bytes(1, 5, 100), bytes(2, 5, 100));
        assert_ne!(bytes(1, 5, 100)[8..], bytes(1, 6, 100)[8..]);
        assert_ne!(bytes(1, 5, 100)[..50], bytes(1, 5, 101)[..50]);
        assert_eq!(bytes(1, 5, 100)[..8], 5u64.to_le_bytes());
        assert_eq!(bytes(3, 9, 3).len(), 3);
        assert_ne!(bytes(3, 9, 7), bytes(4, 9, 7));
        assert!(bytes(3, 9, 0).is_empty());
    }

    #[test]
    fn tally_detects_corruption_reordering_strays_and_duplicates() {
        let sizes = [3, 100];
        let msg = |src, seq, len| {
            let mut b = vec![0u8; len];
            fill(&mut b, src, seq);
            b
        };
        // Rank 0 of 3 expects two messages of each size from rank 1 only.
        let mut t = Tally::new(0, 3, &[1], &sizes, 2);
        assert!(t
            .accept(2, &msg(2, 0, 3))
            .unwrap_err()
            .contains("not a peer"));
        assert!(t
            .accept(7, &msg(7, 0, 3))
            .unwrap_err()
            .contains("not in the job"));
        t.accept(1, &msg(1, 0, 3)).unwrap();
        let e = t.accept(1, &msg(1, 0, 3)).unwrap_err();
        assert!(e.contains("corrupt"), "{e}");
        t.accept(1, &msg(1, 1, 3)).unwrap();
        let e = t.accept(1, &msg(1, 3, 100)).unwrap_err();
        assert!(e.contains("out of order") && e.contains("#2"), "{e}");
        let e = t.accept(1, &msg(1, 2, 3)).unwrap_err();
        assert!(e.contains("has 3 bytes, expected 100"), "{e}");
        let mut bad = msg(1, 2, 100);
        bad[57] ^= 1;
        let e = t.accept(1, &bad).unwrap_err();
        assert!(e.contains("byte 57"), "{e}");
        t.accept(1, &msg(1, 2, 100)).unwrap();
        t.accept(1, &msg(1, 3, 100)).unwrap();
        let e = t.accept(1, &msg(1, 3, 100)).unwrap_err();
        assert!(e.contains("extra message"), "{e}");
    }

    #[test]
    fn a_failed_peer_is_not_waited_for_but_what_it_sent_is_verified() {
        let sizes = [16];
        let msg = |src, seq| {
            let mut b = vec![0u8; 16];
            fill(&mut b, src, seq);
            b
        };
        // Rank 0 of 3 expects four messages from ranks 1 and 2; rank 2 fails after one.
        let mut t = Tally::new(0, 3, &[1, 2], &sizes, 4);
        t.accept(2, &msg(2, 0)).unwrap();
        assert!(t.owes(1, 1) && !t.owes(2, 1) && t.owes(2, 2));
        t.failed[2] = true;
        assert!(t.owes(1, 1) && !t.owes(2, 2) && !t.owes(2, 4));
        // A message it sent before it failed arrives late: still checked.
        let e = t.accept(2, &msg(2, 2)).unwrap_err();
        assert!(e.contains("out of order"), "{e}");
        t.accept(2, &msg(2, 1)).unwrap();
        assert_eq!(t.received[2], 2);
        assert_eq!(join_ranks(&[1, 3, 4]), "1,3,4");
    }

    #[test]
    fn bytes_are_formatted_in_decimal_units() {
        assert_eq!(fmt_bytes(999), "999 B");
        assert_eq!(fmt_bytes(3_200_000), "3.2 MB");
        assert_eq!(fmt_bytes(12_345), "12.3 kB");
    }
}
