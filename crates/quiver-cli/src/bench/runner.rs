//! The benchmark run inside a job: joins the job with a configuration fitted to the
//! benchmark (transport, wait mode, message and pool sizes), opens the endpoint shared by
//! rank 0 and rank 1, runs each planned benchmark size by size, and has rank 0 report
//! ([`Sink`]): to stdout, or as JSON lines to the file a suite names in
//! [`RESULTS_ENV`]. Ranks above 1 take part in the opening barrier only.

use super::output::{self, BenchResult, Reporter};
use super::progress::Progress;
use super::sizes::fmt_size;
use super::{bw, logp, pingpong, plot, Bench, BenchArgs, BenchOpts, Plan, TransportArg};
use anyhow::{bail, Context as _};
use quiver::{Config, Endpoint, Job, Message, Transport, TransportChoice, WaitMode};
use std::fs::File;
use std::io::Write as _;
use std::time::Duration;

/// Variable through which a suite asks rank 0 to append its results, as JSON lines, to
/// a file instead of printing them.
pub const RESULTS_ENV: &str = "QUIVER_BENCH_RESULTS";

/// DPID of the benchmark endpoint on both ranks.
pub const BENCH_DPID: u16 = 100;

/// How long a read waits over UDP, where a lost datagram would otherwise hang the run.
pub const UDP_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Margin per message added to pool-size estimates (record header and alignment).
pub const RECORD_SLACK: usize = 64;

/// What a benchmark needs to know about its side of the pair.
pub struct Ctx<'a> {
    /// The endpoint, targeted at the peer.
    pub ep: &'a Endpoint,
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
    /// The options of the run.
    pub opts: &'a BenchOpts,
}

impl<'a> Ctx<'a> {
    /// True over UDP.
    pub fn udp(&self) -> bool {
        self.transport == Transport::Udp
    }

    /// Transport name.
    pub fn transport_name(&self) -> String {
        self.transport.to_string()
    }

    /// Next message: blocking on shared memory, at most [`UDP_READ_TIMEOUT`] over UDP.
    pub fn recv(&self) -> quiver::Result<Message<'a>> {
        if self.udp() {
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
            Bench::Pingpong => super::pingpong_iters(size),
            Bench::Bw | Bench::Bibw => super::bw_iters(size, window),
            Bench::Logp => super::logp_iters(size),
        });
        (iters, super::warmup_for(self.opts, iters))
    }
}

/// Checks a received length.
pub fn check_len(len: usize, size: usize, what: &str) -> anyhow::Result<()> {
    if len != size {
        bail!("{what}: received {len} bytes, expected {size}");
    }
    Ok(())
}

/// Formats a wait mode the way `--wait` accepts it.
pub fn fmt_wait(w: WaitMode) -> String {
    match w {
        WaitMode::Spin => "spin".into(),
        WaitMode::Block => "block".into(),
        WaitMode::Hybrid(d) => format!("hybrid:{}", d.as_micros()),
    }
}

/// The job configuration for a run whose largest message is `max_size`: `QUIVER_*`
/// variables, then `--transport` and `--wait` (default spin); the maximum message and
/// the pool are raised to fit `max_size` unless `QUIVER_MAX_MESSAGE` / `QUIVER_POOL_SIZE`
/// say otherwise.
pub fn job_config(opts: &BenchOpts, max_size: usize) -> anyhow::Result<Config> {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    let mut cfg = Config::from_env().context("reading QUIVER_* configuration")?;
    if let Some(t) = opts.transport {
        cfg = cfg.with_transport(match t {
            TransportArg::Shm => TransportChoice::Auto,
            TransportArg::Udp => TransportChoice::Udp,
        });
    }
    let wait = super::effective_wait(opts);
    let mode = WaitMode::parse(&wait).with_context(|| format!("bad wait mode {wait:?}"))?;
    cfg = cfg.with_wait(mode);
    if let Some(r) = opts.reliability {
        cfg = cfg.with_reliability(r.mode());
    }
    if max_size > cfg.max_message {
        if set("QUIVER_MAX_MESSAGE") {
            bail!(
                "message size {} exceeds QUIVER_MAX_MESSAGE={}; raise it or drop the size",
                fmt_size(max_size),
                cfg.max_message
            );
        }
        cfg = cfg.with_max_message(max_size);
    }
    let want_pool = 2 * cfg.max_message + 64 * 1024;
    if cfg.pool_size < want_pool && !set("QUIVER_POOL_SIZE") {
        cfg = cfg.with_pool_size(want_pool);
    }
    cfg.validate().context("benchmark configuration")?;
    Ok(cfg)
}

/// Where rank 0's results go.
pub struct Sink {
    reporter: Reporter,
    file: Option<File>,
    progress: Progress,
    /// Every result so far.
    pub results: Vec<BenchResult>,
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
        })
    }

    /// True when results go to a suite's file.
    pub fn to_file(&self) -> bool {
        self.file.is_some()
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

/// Runs the benchmarks of `args` in this rank of a job; returns the exit code.
pub fn main(args: &BenchArgs) -> i32 {
    match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("quiver bench: {e:#}");
            1
        }
    }
}

fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let opts = &args.opts;
    let plans = super::plans(args.command, opts);
    let max_size = plans
        .iter()
        .flat_map(|p| p.sizes.iter().copied())
        .max()
        .unwrap_or(0);
    // Names the run in set-up errors; errors of a measurement name bench and size.
    let label = plans
        .iter()
        .map(|p| p.bench.name())
        .collect::<Vec<_>>()
        .join(" and ");
    let cfg = job_config(opts, max_size).with_context(|| format!("{label}: configuration"))?;
    let wait = fmt_wait(cfg.wait);
    let pool_size = cfg.pool_size;
    let reliability = cfg.reliability.to_string();
    let job = Job::from_env_with(cfg).with_context(|| format!("{label}: joining the job"))?;
    let rank = job.rank();
    let size = job.size();
    let setup = |what: &str| format!("rank {rank}: {label}: {what}");
    if size < 2 {
        bail!(
            "{}",
            setup(&format!(
                "the job has {size} rank(s); benchmarks need 2 (rank 0 and rank 1)"
            ))
        );
    }
    let ep = job
        .open(BENCH_DPID)
        .with_context(|| setup(&format!("opening endpoint {BENCH_DPID}")))?;
    job.barrier().with_context(|| setup("opening barrier"))?;
    if rank >= 2 {
        return Ok(());
    }
    let peer = 1 - rank;
    ep.target_rank(peer)
        .with_context(|| setup(&format!("targeting rank {peer}")))?;
    let transport = ep
        .transport_to(peer)
        .with_context(|| setup(&format!("transport to rank {peer}")))?;
    if opts.transport == Some(TransportArg::Udp) && transport != Transport::Udp {
        bail!(
            "{}",
            setup(&format!(
                "--transport udp asked for, but the endpoint uses {transport}"
            ))
        );
    }
    let ctx = Ctx {
        ep: &ep,
        rank,
        transport,
        wait,
        reliability: (transport == Transport::Udp).then_some(reliability),
        pool_size,
        opts,
    };
    let steps: u64 = plans.iter().map(|p| p.sizes.len() as u64).sum();
    let mut sink = if rank == 0 {
        Some(Sink::new(opts, steps)?)
    } else {
        None
    };
    for plan in &plans {
        run_plan(&ctx, plan, sink.as_mut())?;
    }
    let Some(mut sink) = sink else { return Ok(()) };
    sink.progress.finish();
    if sink.to_file() {
        return Ok(());
    }
    if args.command.is_none() {
        match output::summary_block(opts.format, &sink.results) {
            (text, output::Stream::Stdout) => {
                sink.progress.print(&text).context("writing to stdout")?
            }
            (text, output::Stream::Stderr) => eprint!("{text}"),
        }
    }
    if let Some(path) = &opts.plot {
        plot::write_png(path, &sink.results)?;
    }
    Ok(())
}

fn run_plan(ctx: &Ctx<'_>, plan: &Plan, mut sink: Option<&mut Sink>) -> anyhow::Result<()> {
    for &size in &plan.sizes {
        let what = format!("{} {}", plan.bench, fmt_size(size));
        if let Some(s) = sink.as_deref_mut() {
            s.progress.begin(&what);
        }
        let result = match plan.bench {
            Bench::Pingpong => pingpong::run(ctx, size),
            Bench::Bw | Bench::Bibw => bw::run(ctx, plan.bench, size),
            Bench::Logp => logp::run(ctx, size),
        }
        .with_context(|| {
            format!(
                "rank {}: {}, size {} B over {}",
                ctx.rank, plan.bench, size, ctx.transport
            )
        })?;
        if let Some(s) = sink.as_deref_mut() {
            s.progress.end();
            if let Some(r) = result {
                s.emit(r)?;
            }
        }
    }
    Ok(())
}
