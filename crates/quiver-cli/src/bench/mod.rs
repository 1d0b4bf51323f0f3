//! `quiver bench`: point-to-point benchmarks between two ranks (ping-pong latency,
//! uni- and bi-directional bandwidth) and a default suite over both transports.
//!
//! Measured like the seeds: many iterations, the middle 80 % averaged, plus percentiles;
//! results as tables, CSV, JSON lines and PNG plots.
//!
//! This module owns the command line and the decision where a run happens:
//!
//! - outside a job (no `QUIVER_RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK` or
//!   `SLURM_PROCID`), `quiver bench` re-launches itself as a two-rank job ([`launch`]); the
//!   default suite launches one job per transport and summarizes ([`suite`]);
//! - inside a job, rank 0 and rank 1 run the benchmarks ([`runner`], [`pingpong`],
//!   [`bw`], [`logp`], [`matching`], [`early_late`], [`tune_btp`]); rank 0 reports.
//!
//! Two message APIs are measured (`--api`): Directed Point endpoints (`dm`, the default:
//! `write` / `read`) and tagged send/receive with the Push-Pull protocol (`tagged`:
//! [`quiver::tagged::Tagged`], with `--push zero|all|pull`). `match`, `early-late` and
//! `tune-btp` always use the tagged API.
//!
//! Submodules: [`sizes`] (size lists), [`stats`] (avg80, percentiles), [`output`] (every
//! table, CSV and JSON format), [`progress`] (progress bar), [`plot`] (PNG charts).

use clap::{Args, Subcommand, ValueEnum};
use quiver::tagged::PushMode;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

pub mod buffer;
pub mod bw;
pub mod ctx;
pub mod early_late;
pub mod launch;
pub mod logp;
pub mod matching;
pub mod output;
pub mod pingpong;
pub mod plot;
pub mod ports;
pub mod progress;
pub mod runner;
pub mod sizes;
pub mod stats;
pub mod suite;
pub mod tune_btp;

/// Environment variables that say a process is a rank of a job.
pub const JOB_RANK_VARS: [&str; 5] = [
    "QUIVER_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
    // Hydra's `mpiexec -pmi-port` names only the PMI server; the rank comes from it.
    "PMI_ID",
];

/// Arguments of `quiver bench`.
#[derive(Args, Debug, Clone)]
#[command(after_long_help = "\
Default sizes: pingpong 0..4M; bw and bibw 1K..4M; logp, rate and match 8; early-late 0..64K (tune-btp has its \
own). The suite (no subcommand) runs pingpong \
(0,8,64,1K,4K,64K,1M) and bw (4K,64K,1M) over shm, then over udp, and summarizes.

Outside a job, quiver bench starts itself as a job of two ranks (like `quiver run -n 2`); \
inside one (QUIVER_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID set), ranks 0 and 1 \
measure and rank 0 reports. Over udp, windows are capped at 2 MiB and every read gives up \
after 10 s. Latency is one-way (round trip / 2); bandwidth is in MB/s = 10^6 bytes/s; \
avg80 is the mean of the middle 80 % of the samples.")]
pub struct BenchArgs {
    /// The benchmark; without one, the default suite (pingpong and bw over shm and udp).
    #[command(subcommand)]
    pub command: Option<BenchCmd>,
    #[command(flatten)]
    pub opts: BenchOpts,
}

/// The benchmarks.
#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchCmd {
    /// One-way latency: half of the round-trip time of a message echoed by rank 1.
    Pingpong,
    /// Uni-directional bandwidth: windows of messages, each acknowledged by one byte.
    Bw,
    /// Bi-directional bandwidth: both ranks send a window at the same time.
    Bibw,
    /// Message rate, as OSU's osu_mbw_mr with one pair: windows of --window messages
    /// (default 64) of 8 B (default), each window acknowledged; messages per second.
    Rate,
    /// LogP parameters: send and receive overhead, gap, latency and L (default size 8).
    Logp,
    /// Tag matching with other operations outstanding (tagged; default size 8).
    ///
    /// The tagged ping-pong while each rank holds N receives posted from the peer
    /// (posted), N receives posted from any source (wildcard) or N arrived messages not
    /// yet received (unexpected), none of which the ping-pong matches; N from
    /// --outstanding (default 0,1,64,1024).
    Match,
    /// Early and late receiver tests of Push-Pull (tagged; default sizes 0..64K).
    ///
    /// A compute-then-communicate ping-pong for every push mode (zero, all, pull; or
    /// --push), with the receive posted before the send arrives (early) or after (late);
    /// reports the time of an iteration less its compute on the critical path.
    EarlyLate,
    /// Choose BTP(1) and BTP(2) of Push-Pull for --transport (tagged).
    ///
    /// BTP(2) first, with BTP(1) = 0, on messages beyond the pushed bytes; then BTP(1) with
    /// that BTP(2) on small and medium messages; prints the values to set in QUIVER_BTP1
    /// and QUIVER_BTP2. --iters sets the round trips per candidate and size.
    TuneBtp,
}

/// Options of every benchmark.
#[derive(Args, Debug, Clone)]
pub struct BenchOpts {
    /// Transport between the two ranks: shm (shared memory where possible), udp or eth.
    #[arg(long, value_enum, global = true)]
    pub transport: Option<TransportArg>,
    /// Message sizes: comma list with K/M suffixes and ranges of powers of two, e.g.
    /// `0,8,1K,64K,1M` or `0..4M`.
    #[arg(long, value_parser = parse_sizes_arg, global = true)]
    pub sizes: Option<Sizes>,
    /// Measured iterations per size (round trips or windows); default scaled by size.
    #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: Option<u64>,
    /// Warm-up iterations per size; default a tenth of the iterations.
    #[arg(long, global = true)]
    pub warmup: Option<u64>,
    /// Numbers of operations outstanding on each rank, in each queue (match): comma
    /// list [default: 0,1,64,1024; at most 65536 each].
    #[arg(long, value_delimiter = ',', global = true,
          value_parser = clap::value_parser!(u32).range(0..=65_536))]
    pub outstanding: Vec<u32>,
    /// Messages per window (bw, bibw, rate).
    #[arg(long, default_value_t = 64, global = true,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub window: u32,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = output::Format::Table, global = true)]
    pub format: output::Format,
    /// Write a PNG chart of the results to this file.
    #[arg(long, value_name = "FILE.png", global = true)]
    pub plot: Option<PathBuf>,
    /// How blocking reads wait: spin, block, hybrid or hybrid:MICROSECONDS (sets
    /// QUIVER_WAIT; default spin).
    #[arg(long, value_parser = parse_wait_arg, global = true)]
    pub wait: Option<String>,
    /// Reliability of network channels: none (flow control only), host (retransmission
    /// by the process) or offload (by a progress thread; QUIVER_OFFLOAD_CPU pins it);
    /// sets QUIVER_RELIABILITY. Default: the library's (host).
    #[arg(long, value_enum, global = true)]
    pub reliability: Option<ReliabilityArg>,
    /// Message API: dm (Directed Point endpoints, write/read), tagged (Push-Pull tagged
    /// send/receive) or ports (GAMMA's ports: pingpong, bw, bibw and rate). Default dm;
    /// early-late and tune-btp always use tagged.
    #[arg(long, value_enum, global = true)]
    pub api: Option<ApiArg>,
    /// With --api ports, copy each received message out of the port's buffer into
    /// another (GAMMA's buffered curve: the cost of one receive copy).
    #[arg(long, global = true)]
    pub ports_copy: bool,
    /// At the end, each measuring rank prints its endpoint's counters (frames sent,
    /// retransmissions, timeouts, ...) to stderr.
    #[arg(long, global = true)]
    pub stats: bool,
    /// Push mode of tagged messages: zero (all pulled), all (all pushed) or pull (the
    /// first BTP(1) and BTP(2) bytes pushed, the rest pulled). Default: the library's
    /// (QUIVER_PUSH, else pull). With early-late, only this mode is run.
    #[arg(long, value_enum, global = true)]
    pub push: Option<PushArg>,
    /// Do not pin rank i to CPU i.
    #[arg(long, global = true)]
    pub no_pin: bool,
    /// Limit for each launched job, in seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_secs, global = true)]
    pub timeout: Option<Duration>,
    /// Run the two ranks on emulated cluster NAME (`quiver cluster up`), on different
    /// nodes unless --ppn 2; needs root.
    #[arg(long, value_name = "NAME", global = true)]
    pub cluster: Option<String>,
    /// Ranks per node with --cluster (default 1: the ranks talk through the switch).
    #[arg(long, value_name = "M", requires = "cluster", global = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ppn: Option<u32>,
}

/// `--reliability` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReliabilityArg {
    /// Credit-based flow control, loss reported as an error (LCI's RX_no).
    None,
    /// Retransmission by the process itself (LCI's RX_h).
    Host,
    /// Retransmission by the offload engine's progress thread (LCI's RX_ni).
    Offload,
}

impl ReliabilityArg {
    /// The value of QUIVER_RELIABILITY.
    pub fn env_value(self) -> &'static str {
        match self {
            ReliabilityArg::None => "none",
            ReliabilityArg::Host => "host",
            ReliabilityArg::Offload => "offload",
        }
    }

    /// The library's mode.
    pub fn mode(self) -> quiver::ReliabilityMode {
        match self {
            ReliabilityArg::None => quiver::ReliabilityMode::None,
            ReliabilityArg::Host => quiver::ReliabilityMode::Host,
            ReliabilityArg::Offload => quiver::ReliabilityMode::Offload,
        }
    }
}

/// `--api` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiArg {
    /// Directed Point endpoints: `write` and `read` (zero-copy views).
    Dm,
    /// Tagged send/receive with the Push-Pull protocol.
    Tagged,
    /// GAMMA's ports: a send through a bound port, a wait for the port's signal.
    Ports,
}

impl ApiArg {
    /// Name on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            ApiArg::Dm => "dm",
            ApiArg::Tagged => "tagged",
            ApiArg::Ports => "ports",
        }
    }
}

/// `--push` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushArg {
    /// Push-Zero: nothing pushed, the receiver pulls the whole message.
    Zero,
    /// Push-All: the whole message pushed.
    All,
    /// Push-Pull: BTP(1) + BTP(2) bytes pushed, the rest pulled.
    Pull,
}

impl PushArg {
    /// The library's mode.
    pub fn mode(self) -> PushMode {
        match self {
            PushArg::Zero => PushMode::Zero,
            PushArg::All => PushMode::All,
            PushArg::Pull => PushMode::Pull,
        }
    }

    /// Name on the command line (and of `QUIVER_PUSH`).
    pub fn name(self) -> &'static str {
        self.mode().name()
    }
}

/// `--transport` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportArg {
    /// Shared memory between ranks of one host (QUIVER_TRANSPORT=auto).
    Shm,
    /// UDP even between ranks of one host (QUIVER_TRANSPORT=udp).
    Udp,
    /// Raw Ethernet between nodes of an emulated cluster (QUIVER_TRANSPORT=eth; needs
    /// --cluster and CAP_NET_RAW).
    Eth,
}

impl TransportArg {
    /// Name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TransportArg::Shm => "shm",
            TransportArg::Udp => "udp",
            TransportArg::Eth => "eth",
        }
    }
    /// Value of `QUIVER_TRANSPORT` that selects it.
    pub fn env_value(self) -> &'static str {
        match self {
            TransportArg::Shm => "auto",
            TransportArg::Udp => "udp",
            TransportArg::Eth => "eth",
        }
    }
}

/// A parsed `--sizes` list (sorted, without duplicates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes(pub Vec<usize>);

fn parse_sizes_arg(s: &str) -> Result<Sizes, String> {
    sizes::parse_sizes(s).map(Sizes)
}

fn parse_wait_arg(s: &str) -> Result<String, String> {
    quiver::WaitMode::parse(s)
        .map(|_| s.to_string())
        .ok_or_else(|| format!("{s:?}: expected spin, block, hybrid or hybrid:MICROSECONDS"))
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("{s:?}: expected a positive number of seconds")),
    }
}

/// A benchmark kind as it appears in results (`"pingpong"`, `"bw"`, `"bibw"`, `"logp"`,
/// `"early-late"`, `"tune-btp"`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Bench {
    /// Ping-pong latency.
    Pingpong,
    /// Uni-directional bandwidth.
    Bw,
    /// Bi-directional bandwidth.
    Bibw,
    /// Message rate (uni-directional windows, counted in messages).
    Rate,
    /// LogP parameters (o_s, o_r, g, L, latency).
    Logp,
    /// Ping-pong with other operations outstanding (tag matching).
    Match,
    /// Early and late receiver tests (Push-Pull paper, section 5.3).
    #[serde(rename = "early-late")]
    EarlyLate,
    /// BTP(1) / BTP(2) tuning (Push-Pull paper, section 5.2).
    #[serde(rename = "tune-btp")]
    TuneBtp,
}

impl Bench {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Bench::Pingpong => "pingpong",
            Bench::Bw => "bw",
            Bench::Bibw => "bibw",
            Bench::Rate => "rate",
            Bench::Logp => "logp",
            Bench::Match => "match",
            Bench::EarlyLate => "early-late",
            Bench::TuneBtp => "tune-btp",
        }
    }
    /// True for the bandwidth benchmarks.
    pub fn is_bandwidth(self) -> bool {
        matches!(self, Bench::Bw | Bench::Bibw)
    }
    /// True for the benchmarks whose headline is a latency (`latency_us_median`).
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Bench::Pingpong | Bench::Match | Bench::EarlyLate | Bench::TuneBtp
        )
    }
    /// True for the benchmarks that only exist on the tagged API.
    pub fn tagged_only(self) -> bool {
        matches!(self, Bench::Match | Bench::EarlyLate | Bench::TuneBtp)
    }
}

impl std::fmt::Display for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<BenchCmd> for Bench {
    fn from(c: BenchCmd) -> Bench {
        match c {
            BenchCmd::Pingpong => Bench::Pingpong,
            BenchCmd::Bw => Bench::Bw,
            BenchCmd::Bibw => Bench::Bibw,
            BenchCmd::Rate => Bench::Rate,
            BenchCmd::Logp => Bench::Logp,
            BenchCmd::Match => Bench::Match,
            BenchCmd::EarlyLate => Bench::EarlyLate,
            BenchCmd::TuneBtp => Bench::TuneBtp,
        }
    }
}

/// Default sizes of each benchmark: `pingpong` 0 and the powers of two up to 4 MiB,
/// `bw` and `bibw` 1 KiB to 4 MiB, `logp`, `rate` and `match` 8 B, `early-late` 0 to 64 KiB; `tune-btp`
/// measures the sizes of its two steps ([`tune_btp::sizes`]).
pub fn default_sizes(bench: Bench) -> Vec<usize> {
    let (lo, hi) = match bench {
        Bench::Pingpong => (0, 4 << 20),
        Bench::Bw | Bench::Bibw => (1 << 10, 4 << 20),
        Bench::Logp | Bench::Rate | Bench::Match => return vec![8],
        Bench::EarlyLate => (0, 64 << 10),
        Bench::TuneBtp => return tune_btp::sizes(),
    };
    let mut v = if lo == 0 { vec![0] } else { Vec::new() };
    let mut s = lo.max(1);
    while s <= hi {
        v.push(s);
        s *= 2;
    }
    v
}

/// Sizes of the default suite.
pub fn suite_sizes(bench: Bench) -> Vec<usize> {
    match bench {
        Bench::Pingpong => vec![0, 8, 64, 1 << 10, 4 << 10, 64 << 10, 1 << 20],
        Bench::Bw | Bench::Bibw => vec![4 << 10, 64 << 10, 1 << 20],
        Bench::Logp | Bench::Rate | Bench::Match => vec![8],
        Bench::EarlyLate | Bench::TuneBtp => default_sizes(bench),
    }
}

/// One benchmark to run over a list of sizes.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Which benchmark.
    pub bench: Bench,
    /// Sizes in bytes, ascending.
    pub sizes: Vec<usize>,
}

/// The plans of a command: one benchmark, or the suite's pingpong and bw.
pub fn plans(command: Option<BenchCmd>, opts: &BenchOpts) -> Vec<Plan> {
    let sized = |bench: Bench, default: fn(Bench) -> Vec<usize>| Plan {
        bench,
        sizes: opts
            .sizes
            .as_ref()
            .map(|s| s.0.clone())
            .unwrap_or_else(|| default(bench)),
    };
    match command {
        // tune-btp chooses its own sizes.
        Some(BenchCmd::TuneBtp) => vec![Plan {
            bench: Bench::TuneBtp,
            sizes: tune_btp::sizes(),
        }],
        Some(c) => vec![sized(c.into(), default_sizes)],
        None => vec![
            sized(Bench::Pingpong, suite_sizes),
            sized(Bench::Bw, suite_sizes),
        ],
    }
}

/// Default measured iterations of a ping-pong of `size` bytes: 20000 round trips up to
/// 1 KiB, fewer for larger messages so that a sweep to 4 MiB stays within seconds.
pub fn pingpong_iters(size: usize) -> u64 {
    match size {
        0..=1024 => 20_000,
        1025..=16_384 => 10_000,
        16_385..=131_072 => 2_000,
        131_073..=1_048_576 => 500,
        _ => 200,
    }
}

/// Default messages per phase of `logp` at `size` bytes: 10000 up to 1 KiB, fewer for
/// larger messages.
pub fn logp_iters(size: usize) -> u64 {
    match size {
        0..=1024 => 10_000,
        1025..=65_536 => 2_000,
        _ => 200,
    }
}

/// Default measured iterations of `early-late` at `size` bytes, per push mode and
/// receiver: 1000 up to 64 KiB, fewer beyond (an iteration computes 60 us or more).
pub fn early_late_iters(size: usize) -> u64 {
    match size {
        0..=65_536 => 1000,
        65_537..=1_048_576 => 200,
        _ => 30,
    }
}

/// Default measured round trips of `tune-btp` per candidate value and size: 2000 up to
/// 16 KiB, 1000 up to 64 KiB, 300 beyond (about 1 s per transport over shared memory,
/// 15 s over UDP on one host).
pub fn tune_btp_iters(size: usize) -> u64 {
    match size {
        0..=16_384 => 2000,
        16_385..=65_536 => 1000,
        _ => 300,
    }
}

/// Default measured windows of a bandwidth run: about 128 MiB per size, from 20 to 2000
/// windows.
pub fn bw_iters(size: usize, window: u32) -> u64 {
    let bytes = (size.max(1) as u64).saturating_mul(u64::from(window.max(1)));
    ((128u64 << 20) / bytes).clamp(20, 2000)
}

/// Warm-up iterations: `--warmup`, or a tenth of the measured ones (at least one).
pub fn warmup_for(opts: &BenchOpts, iters: u64) -> u64 {
    opts.warmup.unwrap_or((iters / 10).max(1))
}

/// The wait mode benchmarks use: `--wait`, else `QUIVER_WAIT`, else spin.
pub fn effective_wait(opts: &BenchOpts) -> String {
    opts.wait
        .clone()
        .or_else(|| std::env::var("QUIVER_WAIT").ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "spin".to_string())
}

/// The numbers of outstanding operations of `match`: `--outstanding`, else
/// [`matching::DEFAULT_OUTSTANDING`].
pub fn outstanding(opts: &BenchOpts) -> Vec<u32> {
    if opts.outstanding.is_empty() {
        matching::DEFAULT_OUTSTANDING.to_vec()
    } else {
        opts.outstanding.clone()
    }
}

/// The message API `command` uses: tagged for `match`, `early-late` and `tune-btp`,
/// else `--api` (default dm).
pub fn effective_api(command: Option<BenchCmd>, opts: &BenchOpts) -> ApiArg {
    match command {
        Some(BenchCmd::Match | BenchCmd::EarlyLate | BenchCmd::TuneBtp) => ApiArg::Tagged,
        _ => opts.api.unwrap_or(ApiArg::Dm),
    }
}

/// Checks the combination of subcommand, `--api` and `--push`.
pub fn check_api(command: Option<BenchCmd>, opts: &BenchOpts) -> Result<(), String> {
    let bench = command.map(Bench::from);
    if bench.is_some_and(Bench::tagged_only) && opts.api == Some(ApiArg::Dm) {
        return Err(format!(
            "{} measures tagged messages; drop --api dm",
            bench.map_or("", Bench::name)
        ));
    }
    let api = effective_api(command, opts);
    if api == ApiArg::Tagged && command == Some(BenchCmd::Logp) {
        return Err("logp measures Directed Point endpoints only; drop --api tagged".into());
    }
    if opts.push.is_some() && api != ApiArg::Tagged {
        return Err("--push selects the push mode of tagged messages; add --api tagged".into());
    }
    if api == ApiArg::Ports
        && !matches!(
            command,
            Some(BenchCmd::Pingpong | BenchCmd::Bw | BenchCmd::Bibw | BenchCmd::Rate)
        )
    {
        return Err("--api ports runs pingpong, bw, bibw and rate; name one of them".into());
    }
    if opts.ports_copy && api != ApiArg::Ports {
        return Err("--ports-copy copies messages out of a port's buffer; add --api ports".into());
    }
    if !opts.outstanding.is_empty() && command != Some(BenchCmd::Match) {
        return Err("--outstanding sets the outstanding operations of match only".into());
    }
    if command == Some(BenchCmd::TuneBtp) && opts.sizes.is_some() {
        return Err("tune-btp measures sizes of its own; drop --sizes".into());
    }
    if command == Some(BenchCmd::TuneBtp) && opts.push.is_some_and(|p| p != PushArg::Pull) {
        return Err(
            "tune-btp tunes Push-Pull (--push pull); BTP does not apply to zero or all".into(),
        );
    }
    Ok(())
}

/// True when this process is a rank of a job started by some launcher.
pub fn in_job() -> bool {
    JOB_RANK_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

/// Entry point of `quiver bench`; returns the exit code.
pub fn main(args: BenchArgs) -> i32 {
    if let Err(e) = check_api(args.command, &args.opts) {
        eprintln!("quiver bench: {e}");
        return 2;
    }
    if in_job() {
        return runner::main(&args);
    }
    if std::env::var_os(launch::CHILD_MARKER).is_some() {
        eprintln!(
            "quiver bench: re-launched by quiver bench but no rank variable ({}) is set; \
             the launcher did not start a job",
            JOB_RANK_VARS.join(", ")
        );
        return 1;
    }
    match args.command {
        Some(cmd) => launch::relaunch(&args.opts, cmd),
        None => suite::main(&args.opts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Top,
    }
    #[derive(clap::Subcommand)]
    enum Top {
        Bench(BenchArgs),
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        let mut v = vec!["quiver", "bench"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| match c.cmd {
            Top::Bench(b) => b,
        })
    }

    #[test]
    fn options_before_or_after_the_subcommand() {
        let a = parse(&[
            "pingpong", "--sizes", "0,8,1K", "--iters", "200", "--format", "json",
        ])
        .unwrap();
        assert_eq!(a.command, Some(BenchCmd::Pingpong));
        assert_eq!(a.opts.sizes, Some(Sizes(vec![0, 8, 1024])));
        assert_eq!(a.opts.iters, Some(200));
        assert_eq!(a.opts.format, output::Format::Json);
        let b = parse(&["--transport", "udp", "bw", "--window", "8"]).unwrap();
        assert_eq!(b.command, Some(BenchCmd::Bw));
        assert_eq!(b.opts.transport, Some(TransportArg::Udp));
        assert_eq!(b.opts.window, 8);
        let c = parse(&[]).unwrap();
        assert_eq!(c.command, None);
        assert_eq!(c.opts.window, 64);
    }

    #[test]
    fn bad_options_are_rejected() {
        assert!(parse(&["pingpong", "--sizes", "3..8"]).is_err());
        assert!(parse(&["pingpong", "--wait", "sometimes"]).is_err());
        assert!(parse(&["bw", "--window", "0"]).is_err());
        assert!(parse(&["bw", "--iters", "0"]).is_err());
        assert!(parse(&["bw", "--timeout", "-1"]).is_err());
        assert!(parse(&["--transport", "infiniband"]).is_err());
        assert!(parse(&["pingpong", "--wait", "hybrid:50"]).is_ok());
    }

    #[test]
    fn api_and_push() {
        let a = parse(&["pingpong", "--api", "tagged", "--push", "zero"]).unwrap();
        assert_eq!(a.opts.api, Some(ApiArg::Tagged));
        assert_eq!(a.opts.push, Some(PushArg::Zero));
        assert_eq!(a.opts.push.unwrap().mode(), PushMode::Zero);
        assert!(check_api(a.command, &a.opts).is_ok());
        assert_eq!(effective_api(a.command, &a.opts), ApiArg::Tagged);
        let e = parse(&["early-late", "--sizes", "0..64K"]).unwrap();
        assert_eq!(e.command, Some(BenchCmd::EarlyLate));
        assert_eq!(effective_api(e.command, &e.opts), ApiArg::Tagged);
        assert!(check_api(e.command, &e.opts).is_ok());
        assert_eq!(plans(e.command, &e.opts)[0].bench, Bench::EarlyLate);
        let t = parse(&["tune-btp", "--transport", "udp"]).unwrap();
        assert_eq!(t.command, Some(BenchCmd::TuneBtp));
        assert_eq!(plans(t.command, &t.opts)[0].sizes, tune_btp::sizes());
        assert!(parse(&["pingpong", "--push", "some"]).is_err());
        assert!(parse(&["pingpong", "--api", "mpi"]).is_err());
        let bad = |args: &[&str]| {
            let a = parse(args).unwrap();
            check_api(a.command, &a.opts).is_err()
        };
        assert!(bad(&["logp", "--api", "tagged"]));
        assert!(bad(&["bw", "--push", "all"]));
        assert!(bad(&["early-late", "--api", "dm"]));
        assert!(bad(&["tune-btp", "--push", "zero"]));
        assert!(bad(&["tune-btp", "--sizes", "8"]));
        assert!(bad(&["pingpong", "--outstanding", "64"]));
        assert!(bad(&["match", "--api", "dm"]));
        assert!(!bad(&["match", "--outstanding", "0,1,1024"]));
        let m = parse(&["match", "--outstanding", "0,1,1024"]).unwrap();
        assert_eq!(outstanding(&m.opts), [0, 1, 1024]);
        assert_eq!(
            outstanding(&parse(&["match"]).unwrap().opts),
            [0, 1, 64, 1024]
        );
        assert_eq!(effective_api(m.command, &m.opts), ApiArg::Tagged);
        assert!(!bad(&["tune-btp", "--push", "pull"]));
        assert!(!bad(&["--api", "tagged"])); // the suite
                                             // Names in results.
        assert_eq!(
            serde_json::to_string(&Bench::EarlyLate).unwrap(),
            "\"early-late\""
        );
        assert_eq!(
            serde_json::from_str::<Bench>("\"tune-btp\"").unwrap(),
            Bench::TuneBtp
        );
        assert_eq!(default_sizes(Bench::EarlyLate).last(), Some(&(64 << 10)));
    }

    #[test]
    fn defaults() {
        let pp = default_sizes(Bench::Pingpong);
        assert_eq!(pp[..4], [0, 1, 2, 4]);
        assert_eq!(*pp.last().unwrap(), 4 << 20);
        let bw = default_sizes(Bench::Bw);
        assert_eq!(bw[0], 1024);
        assert_eq!(*bw.last().unwrap(), 4 << 20);
        assert_eq!(pingpong_iters(8), 20_000);
        assert!(pingpong_iters(4 << 20) >= 100);
        assert_eq!(bw_iters(4 << 20, 64), 20);
        assert_eq!(bw_iters(1024, 64), 2000);
        assert_eq!(default_sizes(Bench::Logp), [8]);
        assert_eq!(logp_iters(8), 10_000);
        assert_eq!(logp_iters(1024), 10_000);
        assert!(logp_iters(1 << 20) < 10_000);
        assert!(!Bench::Logp.is_bandwidth());
        let l = parse(&["logp", "--sizes", "8,64"]).unwrap();
        assert_eq!(l.command, Some(BenchCmd::Logp));
        assert_eq!(plans(l.command, &l.opts)[0].bench, Bench::Logp);
        // The suite does not include logp.
        assert!(plans(None, &l.opts).iter().all(|p| p.bench != Bench::Logp));
    }
}
