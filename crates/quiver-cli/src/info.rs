//! `quiver info`: the configuration a process started here would get, read from the
//! `QUIVER_*` variables like [`quiver::Config::from_env`], whether cross-memory attach
//! works on this machine, and which path a tagged message of each size takes.
//!
//! Cross-memory attach is tried between two processes the way ranks use it: this
//! process starts itself again (`quiver info --cma-probe PID:ADDR:VALUE`, hidden), and
//! the child reads this process's probe word ([`quiver::admin::cma::probe`]). A child
//! reading its parent is not an ancestor reading a descendant, so, like two ranks
//! started side by side, it needs what Yama (`kernel.yama.ptrace_scope`) and container
//! profiles allow between unrelated processes of one user. A read of this process's own
//! memory tells first whether the system calls exist at all.
//!
//! The path of a tagged message follows `quiver::tagged`'s sender and receiver:
//!
//! - push mode `all`: everything is pushed (in chunks of the largest message less the
//!   tagged header), nothing pulled;
//! - `zero`: only the header is pushed, the receiver pulls the whole message;
//! - `pull`: a message of at most BTP(1) bytes goes whole with its header (eager); one
//!   of at most BTP(1) + BTP(2) bytes in two pushes; a longer one has BTP(1) + BTP(2)
//!   bytes pushed and the rest pulled.
//!
//! A pull is one copy by the receiver from the sender's buffer (cross-memory attach)
//! when the sender is on the same node (transport `auto`), `QUIVER_CMA` is on and the
//! kernel permits it; otherwise a `Pull` request that the sender answers with the bytes
//! (two copies, and the sender must be inside a quiver call to answer). A same-node pull
//! of `SPLIT_MIN` bytes or more is a split copy when `QUIVER_SPLIT_COPY` is on: a sender
//! waiting inside quiver writes part of it into the receive buffer meanwhile.

use clap::{Args, ValueEnum};
use quiver::admin::cma;
use quiver::tagged::PushMode;
use quiver::ReliabilityMode as Mode;
use quiver::{Config, Transport, TransportChoice, WaitMode};
use serde::Serialize;
use std::fmt::Write as _;
use std::process::Command;

/// Bytes of the tagged protocol header (the library's constant).
pub const TAGGED_HEADER: usize = quiver::tagged::HEADER_LEN;

/// Same-node pulls at least this long go to the pull thread (the library's constant).
pub const PULL_THREAD_MIN: usize = quiver::tagged::PULL_THREAD_MIN as usize;

/// Same-node pulls at least this long are split copies (the library's constant).
pub const SPLIT_MIN: usize = quiver::tagged::SPLIT_MIN as usize;

/// Arguments of `quiver info`.
#[derive(Args, Debug, Clone)]
pub struct InfoArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = InfoFormat::Table)]
    pub format: InfoFormat,
    /// Internal: probe the memory of process PID at ADDR for VALUE and exit.
    #[arg(long, hide = true, value_name = "PID:ADDR:VALUE")]
    pub cma_probe: Option<String>,
}

/// `quiver info --format` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoFormat {
    /// Aligned text.
    Table,
    /// One JSON object.
    Json,
}

/// Exit codes of the probing child.
const PROBE_OK: i32 = 0;
const PROBE_NOT_PERMITTED: i32 = 3;
const PROBE_UNSUPPORTED: i32 = 4;
const PROBE_NOT_THE_PEER: i32 = 5;
const PROBE_OTHER: i32 = 6;

/// What was found about cross-memory attach.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct CmaCheck {
    /// Whether a process could read another's memory (the probe word of its parent).
    pub works: bool,
    /// `works`, `not-permitted`, `unsupported`, `not-the-peer` or `error`.
    pub result: String,
    /// What happened, in words.
    pub detail: String,
    /// `kernel.yama.ptrace_scope`, where the kernel has Yama.
    pub yama_ptrace_scope: Option<u8>,
}

/// One size range of tagged messages and its path.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct PathRange {
    /// Smallest size of the range, bytes.
    pub from: u64,
    /// Largest size, bytes; none for no limit.
    pub to: Option<u64>,
    /// `eager` (whole message with the header), `pushed` (in two or more pushes, no
    /// pull), `pushed+pulled` or `pulled` (only the header pushed).
    pub kind: &'static str,
    /// How the pulled part travels to a rank of the same node: `none`, `cma` (one copy
    /// across address spaces) or `request` (a `Pull` answered with the data).
    pub pull_same_node: &'static str,
    /// The same towards a rank of another node (or any rank over UDP): `none` or
    /// `request`.
    pub pull_other_node: &'static str,
    /// The path in words.
    pub description: String,
}

/// Everything `quiver info` reports.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Info {
    /// `auto` or `udp` (`QUIVER_TRANSPORT`).
    pub transport: String,
    /// Wait mode (`QUIVER_WAIT`).
    pub wait: String,
    /// Reliability of network channels (`QUIVER_RELIABILITY`).
    pub reliability: String,
    /// Largest Directed Point message, bytes (`QUIVER_MAX_MESSAGE`).
    pub max_message: u64,
    /// Token buffer pool, bytes (`QUIVER_POOL_SIZE`).
    pub pool_size: u64,
    /// Frames in flight per network channel (`QUIVER_WINDOW`); `None`: the link's default
    /// (64 frames, 128 over UDP with segmentation offload).
    pub window: Option<u64>,
    /// Frames of an eth endpoint's receive ring (`QUIVER_ETH_RING`); `None`: one window
    /// per rank on another node, at least four windows.
    pub eth_ring: Option<u64>,
    /// Push mode of tagged messages (`QUIVER_PUSH`).
    pub push: String,
    /// BTP(1) as configured, bytes (`QUIVER_BTP1`).
    pub btp1: u64,
    /// BTP(1) in force: at most the largest message less the tagged header.
    pub btp1_effective: u64,
    /// BTP(2), bytes (`QUIVER_BTP2`).
    pub btp2: u64,
    /// Payload of one tagged protocol message at most (larger pushes and pulled data
    /// travel in chunks of it), bytes.
    pub tagged_chunk: u64,
    /// Whether same-node pulls may use cross-memory attach (`QUIVER_CMA`).
    pub cma: bool,
    /// Whether cross-memory attach works on this machine.
    pub cma_check: CmaCheck,
    /// Whether large same-node pulls are split with a waiting sender
    /// (`QUIVER_SPLIT_COPY`).
    pub split_copy: bool,
    /// The path of tagged messages by size, in the push mode in force.
    pub tagged_paths: Vec<PathRange>,
    /// Longest message pushed whole in a pipeline, inside a node and between nodes
    /// (`QUIVER_PIPELINE_MAX`, else the cost function's choice), bytes.
    pub pipeline_max_shm: u64,
    /// Between nodes.
    pub pipeline_max_net: u64,
    /// Whether `QUIVER_PIPELINE_MAX` set them.
    pub pipeline_max_set: bool,
    /// The cost function's estimates and choice for sizes from 4 KiB to 1 MiB.
    pub selection: Vec<Selection>,
    /// How a program started here would join its job: the launcher found and the store
    /// or launcher service it would use (`QUIVER_RENDEZVOUS`, `QUIVER_BOOTSTRAP`).
    pub bootstrap: String,
    /// GAMMA's ports (`quiver::ports`): what a process has.
    pub ports: PortsInfo,
}

/// The ports feature as configured.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct PortsInfo {
    /// Ports an application may bind (0 to this minus one).
    pub usable: u32,
    /// The port the library keeps.
    pub reserved: u8,
    /// Longest message through a port: the largest message less the port header.
    pub max_payload: u64,
    /// How long a wait polls before it sleeps by default, µs.
    pub wait_spin_us: u64,
    /// Whether a broadcast goes through the link's own broadcast where it has one
    /// (`QUIVER_NATIVE_BROADCAST`), else down a binomial tree.
    pub native_broadcast: bool,
}

/// One size of the protocol selection, for one kind of transport.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Selection {
    /// `shm` (inside a node) or `network` (udp, eth).
    pub transport: &'static str,
    pub size: u64,
    /// Estimated µs of the message pushed whole in a pipeline, and pushed in part and
    /// pulled.
    pub pipelined_us: f64,
    pub push_pull_us: f64,
    /// The way chosen (`eager`, `pipelined`, `push-pull`).
    pub way: &'static str,
}

/// Sizes of the selection table.
const SELECTION_SIZES: [usize; 9] = [
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
];

/// The protocol selection of push mode `pull`: (shm, network) longest pipelined messages
/// and the table.
fn selection(cfg: &Config, btp1: usize, chunk: usize, cma: bool) -> (usize, usize, Vec<Selection>) {
    use quiver::admin::select::{way, Costs, Pipeline};
    let mut rows = Vec::new();
    let mut maxima = [0; 2];
    for (i, (name, t)) in [("shm", Transport::Shm), ("network", Transport::Udp)]
        .into_iter()
        .enumerate()
    {
        let single_copy = cma && t == Transport::Shm;
        let c = Costs::of(t, single_copy);
        let pipe = Pipeline::of(cfg, t, single_copy, btp1, chunk);
        maxima[i] = pipe.max;
        for n in SELECTION_SIZES {
            rows.push(Selection {
                transport: name,
                size: n as u64,
                pipelined_us: (c.pipelined_us(n) * 100.0).round() / 100.0,
                push_pull_us: (c.push_pull_us(n, btp1) * 100.0).round() / 100.0,
                way: way(n, btp1, pipe.max, pipe.chunk).name(),
            });
        }
    }
    (maxima[0], maxima[1], rows)
}

/// Entry point of `quiver info`; returns the exit code.
pub fn main(args: InfoArgs) -> i32 {
    if let Some(spec) = &args.cma_probe {
        return probe_child(spec);
    }
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quiver info: {e}");
            return 1;
        }
    };
    let info = gather(&cfg, check_cma());
    match args.format {
        InfoFormat::Json => match serde_json::to_string(&info) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("quiver info: {e}");
                return 1;
            }
        },
        InfoFormat::Table => print!("{}", render(&info)),
    }
    0
}

fn wait_name(w: WaitMode) -> String {
    match w {
        WaitMode::Spin => "spin".into(),
        WaitMode::Block => "block".into(),
        WaitMode::Hybrid(d) => format!("hybrid:{}", d.as_micros()),
    }
}

/// The report for `cfg` and a CMA check.
pub fn gather(cfg: &Config, cma_check: CmaCheck) -> Info {
    let chunk = cfg.max_message.saturating_sub(TAGGED_HEADER);
    let btp1 = cfg.btp1.min(chunk);
    let cma_used = cfg.cma && cma_check.works && cfg.transport != TransportChoice::Udp;
    let (pipeline_max_shm, pipeline_max_net, selection) = selection(cfg, btp1, chunk, cma_used);
    let pipe = (pipeline_max_shm, pipeline_max_net);
    Info {
        transport: match cfg.transport {
            TransportChoice::Auto => "auto".into(),
            TransportChoice::Udp => "udp".into(),
            TransportChoice::Eth => "eth".into(),
        },
        wait: wait_name(cfg.wait),
        reliability: cfg.reliability.to_string(),
        max_message: cfg.max_message as u64,
        pool_size: cfg.pool_size as u64,
        window: cfg.window.map(u64::from),
        eth_ring: cfg.eth_ring.map(|n| n as u64),
        push: cfg.push.name().into(),
        btp1: cfg.btp1 as u64,
        btp1_effective: btp1 as u64,
        btp2: cfg.btp2 as u64,
        tagged_chunk: chunk as u64,
        cma: cfg.cma,
        split_copy: cfg.split_copy,
        cma_check,
        tagged_paths: paths(cfg.push, btp1, cfg.btp2, cma_used, pipe),
        pipeline_max_shm: pipeline_max_shm as u64,
        pipeline_max_net: pipeline_max_net as u64,
        pipeline_max_set: cfg.pipeline_max.is_some(),
        selection,
        bootstrap: quiver::admin::bootstrap_plan(),
        ports: PortsInfo {
            usable: u32::from(quiver::ports::RESERVED_PORT),
            reserved: quiver::ports::RESERVED_PORT,
            max_payload: cfg.max_message.saturating_sub(quiver::ports::HEADER_LEN) as u64,
            wait_spin_us: quiver::ports::DEFAULT_WAIT_SPIN.as_micros() as u64,
            native_broadcast: cfg.native_broadcast,
        },
    }
}

/// The size ranges of tagged messages and their paths in push mode `mode` with
/// (effective) BTP(1) and BTP(2); `cma` tells whether same-node pulls are single copies;
/// `pipe` holds the longest messages pushed whole in a pipeline inside a node and
/// between nodes.
pub fn paths(
    mode: PushMode,
    btp1: usize,
    btp2: usize,
    cma: bool,
    pipe: (usize, usize),
) -> Vec<PathRange> {
    let same = if cma { "cma" } else { "request" };
    let range =
        |from: usize, to: Option<usize>, kind, pulled: bool, description: String| PathRange {
            from: from as u64,
            to: to.map(|t| t as u64),
            kind,
            pull_same_node: if pulled { same } else { "none" },
            pull_other_node: if pulled { "request" } else { "none" },
            description,
        };
    match mode {
        PushMode::All => vec![range(
            0,
            None,
            "pushed",
            false,
            "pushed whole (in chunks), nothing pulled; with no receive posted the whole \
             message waits in the pushed buffer"
                .into(),
        )],
        PushMode::Zero => vec![
            range(0, Some(0), "eager", false, "the header alone".into()),
            range(
                1,
                None,
                "pulled",
                true,
                "the header pushed, the whole message pulled when a receive matches".into(),
            ),
        ],
        PushMode::Pull => {
            let mut v = vec![range(
                0,
                Some(btp1),
                "eager",
                false,
                "eager: the whole message pushed with its header".into(),
            )];
            let (shm, net) = pipe;
            let longest = shm.max(net);
            if longest > btp1 {
                let which = if shm == net {
                    String::new()
                } else {
                    format!(" (inside a node up to {shm} B, between nodes up to {net} B)")
                };
                v.push(range(
                    btp1 + 1,
                    Some(longest),
                    "pipelined",
                    false,
                    format!(
                        "pipelined: pushed whole in chunks, nothing pulled{which}; the \
                         cost function below chose the end (QUIVER_PIPELINE_MAX)"
                    ),
                ));
            }
            let pushed = btp1.saturating_add(btp2);
            let mut from = longest.max(btp1) + 1;
            if btp2 > 0 && from <= pushed && pushed <= quiver::tagged::SECOND_PUSH_MAX {
                v.push(range(
                    from,
                    Some(pushed),
                    "pushed",
                    false,
                    "pushed in two parts, BTP(1) bytes with the header and then the rest; \
                     nothing pulled"
                        .into(),
                ));
                from = pushed + 1;
            }
            v.push(range(
                from,
                None,
                "pushed+pulled",
                true,
                format!(
                    "{pushed} bytes pushed (BTP(1) + BTP(2)), the rest pulled when a \
                     receive matches; beyond {} KiB only BTP(1) is pushed",
                    quiver::tagged::SECOND_PUSH_MAX >> 10
                ),
            ));
            v
        }
    }
}

/// The text report.
pub fn render(info: &Info) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "quiver configuration (QUIVER_* variables, defaults where unset)"
    );
    let row = |out: &mut String, k: &str, v: String, var: &str| {
        let _ = writeln!(out, "  {k:<20} {var:<20} {v}");
    };
    let transport = match info.transport.as_str() {
        "auto" => "auto (shared memory within a node, UDP between nodes)".to_string(),
        t => format!("{t} (UDP between every pair of ranks)"),
    };
    row(
        &mut out,
        "bootstrap",
        info.bootstrap.clone(),
        "QUIVER_BOOTSTRAP",
    );
    row(&mut out, "transport", transport, "QUIVER_TRANSPORT");
    row(&mut out, "wait", info.wait.clone(), "QUIVER_WAIT");
    row(
        &mut out,
        "reliability",
        info.reliability.clone(),
        "QUIVER_RELIABILITY",
    );
    row(
        &mut out,
        "max message",
        format!("{} B", info.max_message),
        "QUIVER_MAX_MESSAGE",
    );
    row(
        &mut out,
        "pool size",
        format!("{} B", info.pool_size),
        "QUIVER_POOL_SIZE",
    );
    let window = match info.window {
        Some(w) => format!("{w} frames"),
        None => format!(
            "{} frames ({} over UDP with segmentation offload)",
            quiver::config::DEFAULT_WINDOW,
            quiver::config::DEFAULT_WINDOW_SEGMENTED
        ),
    };
    row(&mut out, "network window", window, "QUIVER_WINDOW");
    let ring = match info.eth_ring {
        Some(n) => format!("{n} frames"),
        None => format!(
            "a window per rank on another node, at least {} windows",
            quiver::config::ETH_RING_MIN_WINDOWS
        ),
    };
    row(&mut out, "eth receive ring", ring, "QUIVER_ETH_RING");
    row(
        &mut out,
        "push mode (tagged)",
        info.push.clone(),
        "QUIVER_PUSH",
    );
    let btp1 = if info.btp1_effective == info.btp1 {
        format!("{} B", info.btp1)
    } else {
        format!(
            "{} B (in force: {} B, the largest message less the header)",
            info.btp1, info.btp1_effective
        )
    };
    row(&mut out, "BTP(1)", btp1, "QUIVER_BTP1");
    row(
        &mut out,
        "BTP(2)",
        format!("{} B", info.btp2),
        "QUIVER_BTP2",
    );
    row(
        &mut out,
        "cross-memory attach",
        if info.cma { "on" } else { "off" }.into(),
        "QUIVER_CMA",
    );
    let c = &info.cma_check;
    row(
        &mut out,
        "  works here",
        format!("{}: {}", if c.works { "yes" } else { "no" }, c.detail),
        "",
    );
    if let Some(y) = c.yama_ptrace_scope {
        row(&mut out, "", format!("kernel.yama.ptrace_scope = {y}"), "");
    }
    row(
        &mut out,
        "split copy",
        if info.split_copy && info.cma {
            format!("on (same-node pulls of {} KiB or more)", SPLIT_MIN >> 10)
        } else {
            "off".into()
        },
        "QUIVER_SPLIT_COPY",
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "tagged messages, push mode {}{}: path by size (chunks of {} B)",
        info.push,
        if info.push == "pull" {
            format!(
                " (BTP(1) = {}, BTP(2) = {})",
                info.btp1_effective, info.btp2
            )
        } else {
            String::new()
        },
        info.tagged_chunk
    );
    for r in &info.tagged_paths {
        let span = match r.to {
            Some(to) if to == r.from => format!("{} B", r.from),
            Some(to) => format!("{} .. {} B", r.from, to),
            None => format!("{} B and more", r.from),
        };
        let _ = writeln!(out, "  {span:<20} {}", r.description);
        if r.kind == "pulled" || r.kind == "pushed+pulled" {
            let same = if r.pull_same_node == "cma" && info.split_copy {
                format!(
                    "one copy by the receiver from the sender's buffer (cross-memory attach; \
                     from {} KiB a sender waiting in quiver copies part of it), then a Done \
                     to the sender",
                    SPLIT_MIN >> 10
                )
            } else if r.pull_same_node == "cma" {
                "one copy by the receiver from the sender's buffer (cross-memory attach), \
                 then a Done to the sender"
                    .to_string()
            } else {
                format!("by request, as between nodes ({})", info.no_cma_reason())
            };
            let _ = writeln!(out, "  {:<20}   same node: {same}", "");
            let _ = writeln!(
                out,
                "  {:<20}   between nodes: by request (a Pull the sender answers with the \
                 data, from inside a quiver call: two copies)",
                ""
            );
        }
    }
    if info.push == "pull" {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "protocol selection in push mode pull (estimated µs to land in a posted buffer; \
             pipelined up to the largest size where it is no slower than push-pull, at most \
             {} KiB; QUIVER_PIPELINE_MAX{}):",
            quiver::admin::select::PIPELINE_CAP >> 10,
            if info.pipeline_max_set {
                " set: its value rules"
            } else {
                " overrides"
            }
        );
        let _ = writeln!(
            out,
            "  {:<10} {:<9} {:>12} {:>12}  chosen",
            "size", "transport", "pipelined", "push-pull"
        );
        for r in &info.selection {
            let size = if r.size >= 1 << 20 {
                format!("{} MiB", r.size >> 20)
            } else {
                format!("{} KiB", r.size >> 10)
            };
            let _ = writeln!(
                out,
                "  {size:<10} {:<9} {:>12.2} {:>12.2}  {}",
                r.transport, r.pipelined_us, r.push_pull_us, r.way
            );
        }
    }
    if info.reliability == Mode::Offload.to_string()
        && info.tagged_paths.iter().any(|r| r.pull_same_node == "cma")
    {
        let _ = writeln!(
            out,
            "  (QUIVER_RELIABILITY=offload: same-node pulls of {} KiB or more are made by a \
             pull thread)",
            PULL_THREAD_MIN >> 10
        );
    }
    let p = &info.ports;
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "ports (GAMMA): ports 0 to {} per process, {} reserved by the library; messages of at \
         most {} B (the largest message less the {}-byte header), delivered into the port's \
         buffer, then its handler runs inside the application's next call; a wait polls {} µs, \
         then sleeps; a broadcast goes {}",
        p.usable - 1,
        p.reserved,
        p.max_payload,
        quiver::ports::HEADER_LEN,
        p.wait_spin_us,
        if p.native_broadcast {
            "through the link's own broadcast where it has one (Ethernet or IP multicast, \
             the engine's group channel; the node's ranks through a shared ring from 4 KiB), \
             else down a binomial tree"
        } else {
            "down a binomial tree of unicasts (QUIVER_NATIVE_BROADCAST=off)"
        }
    );
    let _ = writeln!(
        out,
        "  another job's ports: through a joint job of both jobs' ranks (Job::invite on one, \
         Job::join on both, with the invitation's text)"
    );
    out
}

impl Info {
    /// Why same-node pulls do not use cross-memory attach.
    pub fn no_cma_reason(&self) -> &'static str {
        if self.transport == "udp" {
            "QUIVER_TRANSPORT=udp"
        } else if !self.cma {
            "QUIVER_CMA=off"
        } else if !self.cma_check.works {
            "cross-memory attach does not work here"
        } else {
            "cross-memory attach in use"
        }
    }
}

/// Yama's `ptrace_scope`, where the kernel has Yama.
fn yama() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

fn classify(e: &cma::CmaError) -> (&'static str, i32) {
    match e.unavailable() {
        Some(cma::Unavailable::NotPermitted) => ("not-permitted", PROBE_NOT_PERMITTED),
        Some(cma::Unavailable::Unsupported) => ("unsupported", PROBE_UNSUPPORTED),
        Some(cma::Unavailable::NotThePeer) => ("not-the-peer", PROBE_NOT_THE_PEER),
        None => ("error", PROBE_OTHER),
    }
}

/// Checks cross-memory attach: this process's own memory, then a child reading it.
pub fn check_cma() -> CmaCheck {
    let yama_ptrace_scope = yama();
    let check = |works: bool, result: &str, detail: String| CmaCheck {
        works,
        result: result.into(),
        detail,
        yama_ptrace_scope,
    };
    let target = cma::probe_target();
    if let Err(e) = cma::probe(std::process::id(), target) {
        let (result, _) = classify(&e);
        return check(
            false,
            result,
            format!("reading this process's own memory: {e}"),
        );
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            return check(
                false,
                "error",
                format!("cannot find the quiver executable to start a probe: {e}"),
            )
        }
    };
    let spec = format!("{}:{}:{}", std::process::id(), target.addr, target.value);
    let out = match Command::new(exe)
        .args(["info", "--cma-probe", &spec])
        .env_remove("QUIVER_LOG")
        .output()
    {
        Ok(o) => o,
        Err(e) => return check(false, "error", format!("cannot start a probe: {e}")),
    };
    let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match out.status.code() {
        Some(PROBE_OK) => check(
            true,
            "works",
            "another process (a child) read this one's memory".into(),
        ),
        Some(code) => {
            let result = match code {
                PROBE_NOT_PERMITTED => "not-permitted",
                PROBE_UNSUPPORTED => "unsupported",
                PROBE_NOT_THE_PEER => "not-the-peer",
                _ => "error",
            };
            let mut detail = format!("a child reading this process: {said}");
            if result == "not-permitted" && yama_ptrace_scope == Some(1) {
                detail.push_str(
                    " (Yama ptrace_scope 1: this probe asks for no exception; a job's \
                     endpoints give their same-node peers one themselves, PR_SET_PTRACER, \
                     see docs/DESIGN-NOTES.md, \"What quiver changes in your process\")",
                );
            }
            check(false, result, detail)
        }
        None => check(false, "error", format!("the probe was killed: {said}")),
    }
}

/// The hidden child: probes `PID:ADDR:VALUE` and exits with a code [`check_cma`] reads.
fn probe_child(spec: &str) -> i32 {
    let mut f = spec.split(':').map(|x| x.parse::<u64>().ok());
    let (Some(Some(pid)), Some(Some(addr)), Some(Some(value)), None) =
        (f.next(), f.next(), f.next(), f.next())
    else {
        eprintln!("bad --cma-probe {spec:?}: expected PID:ADDR:VALUE");
        return PROBE_OTHER;
    };
    let Ok(pid) = u32::try_from(pid) else {
        eprintln!("bad pid {pid}");
        return PROBE_OTHER;
    };
    match cma::probe(pid, cma::ProbeTarget { addr, value }) {
        Ok(()) => PROBE_OK,
        Err(e) => {
            eprintln!("{e}");
            classify(&e).1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(v: &[PathRange]) -> Vec<(u64, Option<u64>, &str, &str, &str)> {
        v.iter()
            .map(|r| (r.from, r.to, r.kind, r.pull_same_node, r.pull_other_node))
            .collect()
    }

    #[test]
    fn paths_follow_the_push_mode() {
        assert_eq!(
            kinds(&paths(PushMode::Pull, 1024, 7168, true, (65536, 65536))),
            vec![
                (0, Some(1024), "eager", "none", "none"),
                (1025, Some(65536), "pipelined", "none", "none"),
                (65537, None, "pushed+pulled", "cma", "request"),
            ]
        );
        // No pipeline: eager, pushed in two parts, then pulled.
        assert_eq!(
            kinds(&paths(PushMode::Pull, 1024, 7168, true, (0, 0))),
            vec![
                (0, Some(1024), "eager", "none", "none"),
                (1025, Some(8192), "pushed", "none", "none"),
                (8193, None, "pushed+pulled", "cma", "request"),
            ]
        );
        assert_eq!(
            kinds(&paths(PushMode::Pull, 80, 0, false, (0, 0))),
            vec![
                (0, Some(80), "eager", "none", "none"),
                (81, None, "pushed+pulled", "request", "request"),
            ]
        );
        // BTP(1) = 0: only the empty message is eager.
        assert_eq!(paths(PushMode::Pull, 0, 680, true, (0, 0))[1].from, 1);
        // Pipelines of two lengths: the longer ends the range, the text names both.
        let p = paths(PushMode::Pull, 4096, 0, true, (65536, 262144));
        assert_eq!(p[1].to, Some(262144));
        assert!(p[1].description.contains("65536"), "{}", p[1].description);
        assert_eq!(
            kinds(&paths(PushMode::Zero, 1024, 7168, true, (0, 0))),
            vec![
                (0, Some(0), "eager", "none", "none"),
                (1, None, "pulled", "cma", "request"),
            ]
        );
        assert_eq!(
            kinds(&paths(PushMode::All, 1024, 7168, true, (0, 0))),
            vec![(0, None, "pushed", "none", "none")]
        );
    }

    #[test]
    fn report_from_a_config() {
        let cfg = Config::default()
            .with_push(PushMode::Pull)
            .with_btp(2 << 20, 4096)
            .with_cma(false);
        let ok = CmaCheck {
            works: true,
            result: "works".into(),
            detail: "fine".into(),
            yama_ptrace_scope: None,
        };
        let info = gather(&cfg, ok);
        // BTP(1) is clamped to a chunk: the largest message less the header.
        assert_eq!(info.btp1, 2 << 20);
        assert_eq!(info.btp1_effective, (1 << 20) - TAGGED_HEADER as u64);
        // CMA off: same-node pulls by request.
        assert_eq!(info.tagged_paths.last().unwrap().pull_same_node, "request");
        let text = render(&info);
        assert!(
            text.contains("QUIVER_BTP1") && text.contains("in force"),
            "{text}"
        );
        assert!(text.contains("QUIVER_SPLIT_COPY    off"), "{text}");
        // The cost function's table, and the override named.
        assert!(text.contains("protocol selection"), "{text}");
        assert_eq!(info.selection.len(), 2 * SELECTION_SIZES.len());
        assert!(!info.pipeline_max_set);
        let set = gather(
            &Config::default().with_pipeline_max(Some(8192)),
            info.cma_check.clone(),
        );
        assert_eq!((set.pipeline_max_shm, set.pipeline_max_net), (8192, 8192));
        let way_of = |size: u64| {
            set.selection
                .iter()
                .find(|r| r.size == size && r.transport == "shm")
                .unwrap()
                .way
        };
        assert_eq!((way_of(8192), way_of(16384)), ("pipelined", "push-pull"));
        let v: serde_json::Value = serde_json::to_value(&info).unwrap();
        assert_eq!(v["push"], "pull");
        assert_eq!(v["cma"], false);
        assert_eq!(v["cma_check"]["works"], true);
        // The ports feature: 255 usable ports, and what a port's message may carry.
        assert!(text.contains("ports (GAMMA): ports 0 to 254"), "{text}");
        assert_eq!(v["ports"]["usable"], 255);
        assert_eq!(
            v["ports"]["max_payload"],
            (1 << 20) - quiver::ports::HEADER_LEN as u64
        );
        // With cross-memory attach, large pulls are split copies (unless turned off).
        for split in [true, false] {
            let cfg = Config::default().with_split_copy(split);
            let ok = CmaCheck {
                works: true,
                result: "works".into(),
                detail: "fine".into(),
                yama_ptrace_scope: None,
            };
            let text = render(&gather(&cfg, ok));
            assert_eq!(
                text.contains("a sender waiting in quiver copies part"),
                split,
                "{text}"
            );
            assert_eq!(
                text.contains("same-node pulls of 128 KiB or more"),
                split,
                "{text}"
            );
        }
    }

    #[test]
    fn the_probe_child_rejects_garbage() {
        assert_eq!(probe_child("1:2"), PROBE_OTHER);
        assert_eq!(probe_child("x:1:2"), PROBE_OTHER);
        // Our own probe word, read by ourselves.
        let t = cma::probe_target();
        let spec = format!("{}:{}:{}", std::process::id(), t.addr, t.value);
        let code = probe_child(&spec);
        assert!(
            code == PROBE_OK || code == PROBE_UNSUPPORTED || code == PROBE_NOT_PERMITTED,
            "{code}"
        );
    }
}
