//! What every benchmark shares with the runner: its side of the pair ([`Ctx`]), where rank
//! 0's results go ([`Sink`]), and the tags and limits of the benchmark messages. The
//! benchmarks import this module and the runner imports the benchmarks, so nothing here
//! names a benchmark module.

use super::output::{self, BenchResult, Reporter};
use super::progress::Progress;
use super::{ApiArg, Bench, BenchOpts};
use anyhow::{bail, Context as _};
use quiver::ports::Ports;
use quiver::tagged::{PushMode, Tagged};
use quiver::{Endpoint, Message, Transport};
use std::fs::File;
use std::io::Write as _;
use std::time::Duration;

/// Variable through which a suite asks rank 0 to append its results, as JSON lines, to
/// a file instead of printing them.
pub const RESULTS_ENV: &str = "QUIVER_BENCH_RESULTS";

/// How long a read waits over UDP, where a lost datagram would otherwise hang the run.
pub const UDP_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Margin per message added to pool-size estimates (record header and alignment).
pub const RECORD_SLACK: usize = 64;

/// Tag of the measured messages of the tagged benchmarks.
pub const DATA_TAG: u32 = 1;
/// Tag of acknowledgements (bw, bibw) and of the values the ranks hand each other
/// (early-late: compute times and counts; tune-btp: the chosen BTP(2)).
pub const CONTROL_TAG: u32 = 2;
/// Tag of the barrier messages of early-late.
pub const BARRIER_TAG: u32 = 3;

/// What a benchmark needs to know about its side of the pair.
pub struct Ctx<'a> {
    /// The endpoint, targeted at the peer (the tagged endpoint's, with the tagged API).
    pub ep: &'a Endpoint,
    /// The tagged endpoint, with the tagged API.
    pub tagged: Option<&'a Tagged>,
    /// The ports, bound to the peer's (`bench::ports`), with the ports API.
    pub ports: Option<&'a Ports>,
    /// 0 (measures and reports) or 1 (echoes).
    pub rank: u32,
    /// Transport to the peer.
    pub transport: Transport,
    /// Wait mode, as reported (`spin`, `block`, `hybrid:US`).
    pub wait: String,
    /// Reliability of the network channel (`none`, `host`); None over shared memory.
    pub reliability: Option<String>,
    /// Bytes of receive pool per sender (shm) or per endpoint (udp).
    pub pool_size: usize,
    /// Frames in flight per network channel (`QUIVER_WINDOW`).
    pub net_window: u16,
    /// The options of the run.
    pub opts: &'a BenchOpts,
}

impl<'a> Ctx<'a> {
    /// True over a network transport (UDP or raw Ethernet).
    pub fn network(&self) -> bool {
        matches!(self.transport, Transport::Udp | Transport::Eth)
    }

    /// Transport name.
    pub fn transport_name(&self) -> String {
        self.transport.to_string()
    }

    /// Next message: blocking on shared memory, at most [`UDP_READ_TIMEOUT`] over the network.
    pub fn recv(&self) -> quiver::Result<Message<'a>> {
        if self.network() {
            self.ep.read_timeout(UDP_READ_TIMEOUT)
        } else {
            self.ep.read()
        }
    }

    /// Reads one message, releases it at once and checks its length.
    pub fn recv_expect(&self, size: usize, what: &str) -> anyhow::Result<()> {
        let msg = self.recv().with_context(|| format!("reading {what}"))?;
        let len = msg.len();
        drop(msg);
        check_len(len, size, what)
    }

    /// Writes one message.
    pub fn send(&self, data: &[u8], what: &str) -> anyhow::Result<()> {
        self.ep
            .write(data)
            .with_context(|| format!("writing {what}"))
    }

    /// Measured and warm-up iterations of `bench` at `size` (windows for bandwidth).
    pub fn iterations(&self, bench: Bench, size: usize, window: u32) -> (u64, u64) {
        let iters = self.opts.iters.unwrap_or_else(|| match bench {
            Bench::Pingpong | Bench::Match => super::pingpong_iters(size),
            Bench::Bw | Bench::Bibw | Bench::Rate => super::bw_iters(size, window),
            Bench::Logp => super::logp_iters(size),
            Bench::EarlyLate => super::early_late_iters(size),
            Bench::TuneBtp => super::tune_btp_iters(size),
        });
        (iters, super::warmup_for(self.opts, iters))
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        1 - self.rank
    }

    /// The tagged endpoint; an error with the DM API (a bug: the runner opens one for
    /// every benchmark that needs it).
    pub fn tagged(&self) -> anyhow::Result<&'a Tagged> {
        self.tagged
            .context("this benchmark needs the tagged endpoint (--api tagged)")
    }

    /// A result record for `bench` at `size` with the fields that describe the run: the
    /// transport, wait mode and reliability, and with the tagged API the API, the push
    /// mode and (in Push-Pull) BTP(1) and BTP(2).
    pub fn result(&self, bench: Bench, size: usize, iters: u64, warmup: u64) -> BenchResult {
        let mut r = BenchResult::new(
            bench,
            &self.transport_name(),
            &self.wait,
            size,
            iters,
            warmup,
        );
        r.reliability = self.reliability.clone();
        if self.ports.is_some() {
            r.api = Some(ApiArg::Ports.name().into());
        }
        if let Some(t) = self.tagged {
            let (mode, btp1, btp2) = t.push();
            r.api = Some(ApiArg::Tagged.name().into());
            r.push = Some(mode.name().into());
            if mode == PushMode::Pull {
                r.btp1 = Some(btp1 as u64);
                r.btp2 = Some(btp2 as u64);
            }
        }
        r
    }
}

/// Checks a received length.
pub fn check_len(len: usize, size: usize, what: &str) -> anyhow::Result<()> {
    if len != size {
        bail!("{what}: received {len} bytes, expected {size}");
    }
    Ok(())
}

/// Where rank 0's results go.
pub struct Sink {
    reporter: Reporter,
    file: Option<File>,
    /// The progress bar (on stderr).
    pub progress: Progress,
    /// Every result so far.
    pub results: Vec<BenchResult>,
    /// The output format.
    pub format: output::Format,
}

impl Sink {
    /// Reports to `RESULTS_ENV`'s file if set, else to stdout in `opts.format`.
    pub fn new(opts: &BenchOpts, steps: u64) -> anyhow::Result<Sink> {
        let file = match std::env::var_os(RESULTS_ENV) {
            Some(p) if !p.is_empty() => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .with_context(|| format!("opening {RESULTS_ENV}={}", p.to_string_lossy()))?,
            ),
            _ => None,
        };
        Ok(Sink {
            reporter: Reporter::new(opts.format),
            file,
            progress: Progress::new(steps, true),
            results: Vec::new(),
            format: opts.format,
        })
    }

    /// True when results go to a suite's file.
    pub fn to_file(&self) -> bool {
        self.file.is_some()
    }

    /// Prints `text` on stdout, above the progress bar.
    pub fn print(&self, text: &str) -> anyhow::Result<()> {
        self.progress.print(text).context("writing to stdout")
    }

    /// Records one result without printing it (a benchmark that presents its results
    /// itself).
    pub fn keep(&mut self, r: BenchResult) {
        self.results.push(r);
    }

    /// Reports one result.
    pub fn emit(&mut self, r: BenchResult) -> anyhow::Result<()> {
        if let Some(f) = &mut self.file {
            writeln!(f, "{}", r.to_json())
                .and_then(|()| f.flush())
                .context("writing results file")?;
        } else {
            self.progress
                .print(&self.reporter.render(&r))
                .context("writing to stdout")?;
        }
        self.results.push(r);
        Ok(())
    }
}
