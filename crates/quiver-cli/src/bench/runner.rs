//! The benchmark run inside a job: joins the job with a configuration fitted to the
//! benchmark (transport, wait mode, message and pool sizes, push mode), opens the endpoint
//! shared by rank 0 and rank 1 (a Directed Point endpoint, or a tagged endpoint with
//! `--api tagged`, `early-late` and `tune-btp`), runs each planned benchmark size by
//! size, and has rank 0 report ([`Sink`]): to stdout, or as JSON lines to the file a
//! suite names in [`RESULTS_ENV`](super::ctx::RESULTS_ENV). Ranks above 1 take part in the opening barrier only.

use super::ctx::{Ctx, Sink};
use super::output;
use super::ports as bench_ports;
use super::sizes::fmt_size;
use super::{
    bw, early_late, logp, matching, pingpong, plot, tune_btp, ApiArg, Bench, BenchArgs, BenchCmd,
    BenchOpts, Plan, TransportArg,
};
use anyhow::{bail, Context as _};
use quiver::ports::Ports;
use quiver::tagged::Tagged;
use quiver::{Config, Endpoint, Job, Transport, TransportChoice, WaitMode};

/// DPID of the benchmark endpoint on both ranks.
pub const BENCH_DPID: u16 = 100;

/// Formats a wait mode the way `--wait` accepts it.
pub fn fmt_wait(w: WaitMode) -> String {
    match w {
        WaitMode::Spin => "spin".into(),
        WaitMode::Block => "block".into(),
        WaitMode::Hybrid(d) => format!("hybrid:{}", d.as_micros()),
    }
}

/// The job configuration for a run whose largest message is `max_size`: `QUIVER_*`
/// variables, then `--transport`, `--wait` (default spin), `--reliability` and `--push`;
/// for Directed Point messages (`tagged` false) the maximum message is raised to fit
/// `max_size` unless `QUIVER_MAX_MESSAGE` says otherwise (tagged messages of any size
/// travel in chunks of the maximum message); the pool is raised to hold two maximum
/// messages unless `QUIVER_POOL_SIZE` is set.
pub fn job_config(opts: &BenchOpts, max_size: usize, tagged: bool) -> anyhow::Result<Config> {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    let mut cfg = Config::from_env().context("reading QUIVER_* configuration")?;
    if let Some(t) = opts.transport {
        cfg = cfg.with_transport(match t {
            TransportArg::Shm => TransportChoice::Auto,
            TransportArg::Udp => TransportChoice::Udp,
            TransportArg::Eth => TransportChoice::Eth,
        });
    }
    let wait = super::effective_wait(opts);
    let mode = WaitMode::parse(&wait).with_context(|| format!("bad wait mode {wait:?}"))?;
    cfg = cfg.with_wait(mode);
    if let Some(r) = opts.reliability {
        cfg = cfg.with_reliability(r.mode());
    }
    if let Some(p) = opts.push {
        cfg = cfg.with_push(p.mode());
    }
    if max_size > cfg.max_message && !tagged {
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
    let api = super::effective_api(args.command, opts);
    // A port's message carries its header inside one engine message.
    let largest = match api {
        ApiArg::Ports => max_size + quiver::ports::HEADER_LEN,
        _ => max_size,
    };
    let cfg = job_config(opts, largest, api == ApiArg::Tagged)
        .with_context(|| format!("{label}: configuration"))?;
    let wait = fmt_wait(cfg.wait);
    let cfg_wait = cfg.wait;
    let pool_size = cfg.pool_size;
    // The tagged window is capped by the smaller default (a quarter of it) unless set.
    let net_window = cfg.channel_window(false);
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
    let (mut tagged, mut ports, mut dm) = (None, None, None);
    match api {
        ApiArg::Tagged => {
            tagged = Some(
                Tagged::open(&job, BENCH_DPID)
                    .with_context(|| setup(&format!("opening tagged endpoint {BENCH_DPID}")))?,
            );
        }
        ApiArg::Ports => {
            ports = Some(
                Ports::open(&job, BENCH_DPID)
                    .with_context(|| setup(&format!("opening ports on endpoint {BENCH_DPID}")))?,
            );
        }
        ApiArg::Dm => {
            dm = Some(
                job.open(BENCH_DPID)
                    .with_context(|| setup(&format!("opening endpoint {BENCH_DPID}")))?,
            );
        }
    }
    let ep: &Endpoint = match (&tagged, &ports, &dm) {
        (Some(t), _, _) => t.endpoint(),
        (_, Some(p), _) => p.endpoint(),
        (_, _, Some(ep)) => ep,
        _ => bail!("{}", setup("no endpoint opened")),
    };
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
    let asked = match opts.transport {
        Some(TransportArg::Udp) => Some(Transport::Udp),
        Some(TransportArg::Eth) => Some(Transport::Eth),
        _ => None,
    };
    if let Some(want) = asked.filter(|&w| w != transport) {
        bail!(
            "{}",
            setup(&format!(
                "--transport {want} asked for, but the endpoint uses {transport}"
            ))
        );
    }
    if let Some(p) = &ports {
        bench_ports::bind(p, peer, max_size, cfg_wait)
            .with_context(|| setup(&format!("binding the ports to rank {peer}")))?;
    }
    let ctx = Ctx {
        ep,
        tagged: tagged.as_ref(),
        ports: ports.as_ref(),
        rank,
        transport,
        wait,
        reliability: matches!(transport, Transport::Udp | Transport::Eth).then_some(reliability),
        pool_size,
        net_window,
        opts,
    };
    let steps: u64 = match args.command {
        Some(BenchCmd::EarlyLate) => early_late::steps(opts, &plans[0].sizes),
        Some(BenchCmd::TuneBtp) => tune_btp::steps(),
        Some(BenchCmd::Match) => matching::steps(&plans[0].sizes, &super::outstanding(opts)),
        _ => plans.iter().map(|p| p.sizes.len() as u64).sum(),
    };
    let mut sink = if rank == 0 {
        Some(Sink::new(opts, steps)?)
    } else {
        None
    };
    match args.command {
        Some(BenchCmd::EarlyLate) => early_late::run(&ctx, &plans[0].sizes, sink.as_mut())?,
        Some(BenchCmd::TuneBtp) => tune_btp::run(&ctx, sink.as_mut())?,
        Some(BenchCmd::Match) => matching::run(
            &ctx,
            &plans[0].sizes,
            &super::outstanding(opts),
            sink.as_mut(),
        )?,
        _ => {
            for plan in &plans {
                run_plan(&ctx, plan, sink.as_mut())?;
            }
        }
    }
    if opts.stats {
        eprintln!("rank {rank} endpoint stats: {:?}", ctx.ep.stats());
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
            Bench::Bw | Bench::Bibw | Bench::Rate => bw::run(ctx, plan.bench, size),
            Bench::Logp => logp::run(ctx, size),
            Bench::Match | Bench::EarlyLate | Bench::TuneBtp => {
                bail!("{} runs through its own module", plan.bench)
            }
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
