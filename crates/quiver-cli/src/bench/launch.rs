//! Re-launching `quiver bench` as a two-rank job when it was started outside one: the
//! child command line (rebuilt from the parsed options, so that defaults resolved here,
//! like the wait mode, are the same on both ranks), its environment (`QUIVER_TRANSPORT`,
//! `QUIVER_WAIT`, a marker against launch loops) and the call to [`crate::run::launch`].
//! With `--cluster NAME` the job runs on that emulated cluster, one rank per node unless
//! `--ppn` says otherwise ([`crate::cluster::Placement`]).

use super::sizes::fmt_list;
use super::{BenchCmd, BenchOpts, TransportArg};
use crate::cluster::Placement;
use crate::run::{launch, LaunchSpec};
use std::ffi::OsString;

/// Set in the environment of re-launched ranks; a process that has it but no rank
/// variable was not started as a job, and stops instead of launching again.
pub const CHILD_MARKER: &str = "QUIVER_BENCH_CHILD";

/// Ranks of a benchmark job.
pub const RANKS: u32 = 2;

/// The arguments after the program name for a child running `cmd` (or the suite's
/// benchmarks when `None`) over `transport`; `--plot` is passed only when `plot`.
pub fn child_args(
    opts: &BenchOpts,
    cmd: Option<BenchCmd>,
    transport: TransportArg,
    plot: bool,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["bench".into()];
    match cmd {
        Some(BenchCmd::Pingpong) => a.push("pingpong".into()),
        Some(BenchCmd::Bw) => a.push("bw".into()),
        Some(BenchCmd::Bibw) => a.push("bibw".into()),
        Some(BenchCmd::Rate) => a.push("rate".into()),
        Some(BenchCmd::Logp) => a.push("logp".into()),
        Some(BenchCmd::Match) => a.push("match".into()),
        Some(BenchCmd::EarlyLate) => a.push("early-late".into()),
        Some(BenchCmd::TuneBtp) => a.push("tune-btp".into()),
        None => {}
    }
    let mut opt = |k: &str, v: String| {
        a.push(k.into());
        a.push(v.into());
    };
    opt("--transport", transport.name().into());
    opt("--wait", super::effective_wait(opts));
    opt("--window", opts.window.to_string());
    opt("--format", opts.format.name().into());
    if let Some(s) = &opts.sizes {
        opt("--sizes", fmt_list(&s.0));
    }
    if let Some(n) = opts.iters {
        opt("--iters", n.to_string());
    }
    if let Some(n) = opts.warmup {
        opt("--warmup", n.to_string());
    }
    if !opts.outstanding.is_empty() {
        let list: Vec<String> = opts.outstanding.iter().map(u32::to_string).collect();
        opt("--outstanding", list.join(","));
    }
    if let Some(api) = opts.api {
        opt("--api", api.name().into());
    }
    if let Some(p) = opts.push {
        opt("--push", p.name().into());
    }
    if opts.ports_copy {
        a.push("--ports-copy".into());
    }
    if opts.stats {
        a.push("--stats".into());
    }
    if plot {
        if let Some(p) = &opts.plot {
            a.push("--plot".into());
            a.push(p.clone().into_os_string());
        }
    }
    a
}

/// The environment a child needs on top of the inherited one.
pub fn child_env(opts: &BenchOpts, transport: TransportArg) -> Vec<(String, String)> {
    let mut env = vec![
        ("QUIVER_TRANSPORT".into(), transport.env_value().into()),
        ("QUIVER_WAIT".into(), super::effective_wait(opts)),
        (CHILD_MARKER.into(), "1".into()),
    ];
    if let Some(r) = opts.reliability {
        env.push(("QUIVER_RELIABILITY".into(), r.env_value().into()));
    }
    if let Some(width) = super::progress::env_for_children() {
        env.push((super::progress::PROGRESS_ENV.into(), width));
    }
    env
}

/// Launches a two-rank job of this executable with `args` and `extra_env` (on the
/// cluster of `--cluster`, if given); returns its exit code, or an error if it could not
/// be started.
pub fn launch_job(
    opts: &BenchOpts,
    args: Vec<OsString>,
    extra_env: Vec<(String, String)>,
) -> anyhow::Result<i32> {
    let program = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find the quiver executable to re-launch: {e}"))?
        .into_os_string();
    // On a cluster, one rank per node unless --ppn says otherwise.
    let ppn = Some(opts.ppn.unwrap_or(1));
    let placement = match &opts.cluster {
        None => None,
        Some(name) => Some(Placement::resolve(name, RANKS, ppn)?),
    };
    launch(&LaunchSpec {
        n: RANKS,
        program,
        args,
        prefix: false,
        timeout: opts.timeout,
        pin_cpus: !opts.no_pin,
        extra_env,
        keep_going: false,
        placement,
    })
}

/// Runs one benchmark as a job of two ranks; returns the exit code. `logp` over a network
/// transport with no scheme named (no `--reliability`, no `QUIVER_RELIABILITY`) runs
/// once per scheme (none, host, offload), as LCI's Table 4 compares them; each run's
/// results name their scheme (table titles, JSON; CSV gets one header per run).
pub fn relaunch(opts: &BenchOpts, cmd: BenchCmd) -> i32 {
    let transport = opts.transport.unwrap_or(TransportArg::Shm);
    let named = opts.reliability.is_some() || std::env::var_os("QUIVER_RELIABILITY").is_some();
    if cmd != BenchCmd::Logp || named || transport == TransportArg::Shm {
        return relaunch_one(opts, cmd, transport, Vec::new());
    }
    let schemes = [
        super::ReliabilityArg::None,
        super::ReliabilityArg::Host,
        super::ReliabilityArg::Offload,
    ];
    let mut code = 0;
    for (i, scheme) in schemes.into_iter().enumerate() {
        let one = BenchOpts {
            reliability: Some(scheme),
            ..opts.clone()
        };
        // The later jobs continue the first one's CSV.
        let env = (i > 0).then(|| (super::output::CSV_CONTINUES.to_string(), "1".to_string()));
        code = code.max(relaunch_one(
            &one,
            cmd,
            transport,
            env.into_iter().collect(),
        ));
    }
    code
}

/// One job of [`relaunch`], with `extra` variables beside the child's own.
fn relaunch_one(
    opts: &BenchOpts,
    cmd: BenchCmd,
    transport: TransportArg,
    extra: Vec<(String, String)>,
) -> i32 {
    let args = child_args(opts, Some(cmd), transport, true);
    let mut env = child_env(opts, transport);
    env.extend(extra);
    let bench = super::Bench::from(cmd);
    match launch_job(opts, args, env) {
        // A failing rank has said what went wrong, and the launcher which rank failed.
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "quiver bench: {bench} over {}: cannot launch: {e:#}",
                transport.name()
            );
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{output::Format, Sizes};
    use super::*;
    use std::time::Duration;

    #[test]
    fn child_command_line_carries_the_options() {
        let opts = BenchOpts {
            transport: Some(TransportArg::Udp),
            sizes: Some(Sizes(vec![0, 8, 1024])),
            iters: Some(200),
            warmup: None,
            window: 16,
            format: Format::Json,
            plot: Some("x.png".into()),
            wait: Some("hybrid:20".into()),
            reliability: None,
            api: None,
            ports_copy: false,
            stats: false,
            push: None,
            no_pin: true,
            timeout: Some(Duration::from_secs(5)),
            cluster: None,
            ppn: None,
            outstanding: Vec::new(),
        };
        let a: Vec<String> = child_args(&opts, Some(BenchCmd::Bw), TransportArg::Udp, false)
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            a.join(" "),
            "bench bw --transport udp --wait hybrid:20 --window 16 --format json --sizes 0,8,1K --iters 200"
        );
        let with_plot = child_args(&opts, None, TransportArg::Shm, true);
        assert_eq!(
            with_plot.last().map(|s| s.to_string_lossy().into_owned()),
            Some("x.png".into())
        );
        let tagged = BenchOpts {
            api: Some(super::super::ApiArg::Tagged),
            push: Some(super::super::PushArg::All),
            ..opts.clone()
        };
        let a: Vec<String> =
            child_args(&tagged, Some(BenchCmd::EarlyLate), TransportArg::Shm, false)
                .into_iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
        assert_eq!(a[1], "early-late");
        assert!(a.join(" ").ends_with("--api tagged --push all"), "{a:?}");
        let counted = BenchOpts {
            stats: true,
            ..opts.clone()
        };
        let a = child_args(&counted, Some(BenchCmd::Bw), TransportArg::Udp, false);
        assert!(a.iter().any(|s| s == "--stats"), "{a:?}");
        let matching = BenchOpts {
            outstanding: vec![0, 64],
            ..tagged.clone()
        };
        let a = child_args(&matching, Some(BenchCmd::Match), TransportArg::Shm, false);
        let a: Vec<String> = a
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(a[1], "match");
        assert!(a.join(" ").contains("--outstanding 0,64"), "{a:?}");
        let env = child_env(&opts, TransportArg::Udp);
        assert!(env.contains(&("QUIVER_TRANSPORT".into(), "udp".into())));
        assert!(env.contains(&("QUIVER_WAIT".into(), "hybrid:20".into())));
    }
}
