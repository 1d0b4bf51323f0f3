//! `quiver run`: starts the N ranks of one job on this host and supervises them.
//!
//! ```text
//! quiver run -n N [--no-prefix] [--timeout SECS] [--keep-going]
//!            [--cluster NAME [--ppn M]] [--] PROGRAM ARGS...
//! ```
//!
//! With `--cluster NAME` the ranks run on the nodes of the emulated cluster NAME
//! (`quiver cluster up`), M per node (see "Ranks on an emulated cluster" below).
//!
//! # What the launcher does
//!
//! 1. Draws a job id (random, nonzero `u32`) and a secret token (random `u64`), and serves a
//!    rendezvous store ([`quiver::admin::KvServer`]) on `127.0.0.1` on a port
//!    chosen by the kernel. The store lives until every rank has ended. (On a cluster the
//!    store is a private directory instead; see below.)
//! 2. Starts `PROGRAM ARGS...` N times. Each rank runs in a process group of its own, with
//!    stdin from `/dev/null` and its stdout and stderr piped back to the launcher. Should the
//!    launcher die, every rank receives `SIGTERM` (`PR_SET_PDEATHSIG`).
//! 3. Copies the ranks' output: with the prefix on (the default), every complete line that
//!    rank R writes is printed as `[R] line`, stdout to stdout and stderr to stderr, whole
//!    lines never mixed with another rank's; with `--no-prefix` bytes go through unchanged.
//! 4. Supervises the ranks. The first rank that exits with a non-zero status or is killed by
//!    a signal is reported (`quiver run: rank R exited with status S`, or `... was killed by
//!    signal NAME (NUM)`) and the job is terminated: every rank's process group receives
//!    `SIGTERM`, then `SIGKILL` 2 s later for what still runs. The same happens when the
//!    launcher receives `SIGINT`, `SIGTERM` or `SIGHUP` (a second such signal sends `SIGKILL`
//!    at once), when `--timeout` expires, and when a rank cannot be started.
//! 5. Once every rank has ended, waits for its output to drain. Processes that a rank left
//!    behind in its process group and that still hold its output open are killed. Then the
//!    rendezvous store is shut down (a directory store is deleted) and the shared-memory
//!    segments left by the job are removed ([`quiver::admin::cleanup_job`]).
//!
//! # Exit status
//!
//! - `0` when every rank exited with status 0;
//! - the first failing rank's status, or `128 + signal number` if it was killed by a signal;
//! - `124` when `--timeout` expired;
//! - `130`, `143`, `129` when the launcher was interrupted by `SIGINT`, `SIGTERM`, `SIGHUP`;
//! - `127` when the program cannot be found or executed;
//! - `1` for any other failure of the launcher itself (a cluster that does not exist or
//!   cannot be entered included), `2` for invalid arguments (ranks that do not fit on the
//!   cluster included).
//!
//! # Environment of a rank
//!
//! The launcher's environment, plus:
//!
//! | variable            | value                                                   |
//! |---------------------|---------------------------------------------------------|
//! | `QUIVER_RANK`       | this rank, `0..N`                                       |
//! | `QUIVER_SIZE`       | `N`                                                     |
//! | `QUIVER_LOCAL_RANK` | rank among the ranks of this host (= `QUIVER_RANK`)     |
//! | `QUIVER_LOCAL_SIZE` | number of ranks on this host (= `N`)                    |
//! | `QUIVER_JOB_ID`     | the job id, decimal, nonzero                            |
//! | `QUIVER_JOB_TOKEN`  | the job's secret token, exactly 16 lowercase hex digits |
//! | `QUIVER_RENDEZVOUS` | `tcp://127.0.0.1:PORT`, the rendezvous store            |
//!
//! The first four and the job id and token are identical for every rank of the job, except
//! the two rank numbers. [`LaunchSpec::extra_env`] adds further variables (used by the
//! benchmarks, which re-launch the `quiver` binary itself).
//!
//! # Ranks on an emulated cluster (`--cluster NAME [--ppn M]`)
//!
//! The placement is [`crate::cluster::Placement`]: rank r runs on node r / M (M defaults to
//! ceil(N / K) for a cluster of K nodes; more ranks than K * M is an error, status 2).
//! Each rank enters its node's network namespace between fork and exec (`setns(2)` on
//! `/run/netns/qv-NAME-nI`, opened by the launcher beforehand; this needs root), and its
//! environment differs from the above in:
//!
//! | variable            | value                                                   |
//! |---------------------|---------------------------------------------------------|
//! | `QUIVER_LOCAL_RANK` | r mod M, the rank among those of its node               |
//! | `QUIVER_LOCAL_SIZE` | the number of ranks on its node                          |
//! | `QUIVER_NODE`       | its node's name, `NAME-nI`                               |
//! | `QUIVER_ADDR`       | its node's IPv4 address                                  |
//! | `QUIVER_CLUSTER`    | `NAME`                                                   |
//! | `QUIVER_RENDEZVOUS` | `file:///TMP/quiver-run-...`, a private directory store  |
//!
//! The rendezvous store is a directory rather than the tcp store: the ranks live in
//! network namespaces that cannot reach the launcher's `127.0.0.1`, while the file system
//! (and `/dev/shm`) is the same for all of them. A directory needs no network path at
//! all, so the store keeps working whatever loss the cluster injects (a tcp store on a
//! node's address would pay retransmission timeouts of 200 ms and more for every lost
//! segment of a bootstrap). The directory is created with mode 0700 in `$TMPDIR` (else
//! `/tmp`) and deleted when the job ends.
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

use quiver::admin::{KvServer, StoreKey, KEY_VAR};

use crate::cluster::{self, BadPlacement, Placement};

/// Arguments of `quiver run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "np", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub np: u32,
    /// Copy the ranks' output unchanged instead of prefixing every line with `[RANK] `.
    #[arg(long)]
    pub no_prefix: bool,
    /// Terminate the job after SECS seconds (exit status 124).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// When a rank fails, let the others run on (for programs that survive the failure
    /// of a peer); the exit status is still that of the first rank that failed.
    #[arg(long)]
    pub keep_going: bool,
    /// Pin rank R (with all its threads, the offload engine's included) to the
    /// (R mod K)-th of the K CPUs `quiver run` may run on. The default when the ranks
    /// outnumber those CPUs (every rank shares a core anyway, and unpinned the scheduler
    /// may stack three ranks on one core while another runs alone); otherwise ranks are
    /// not pinned, so that a rank's threads can spread over the cores.
    #[arg(long, conflicts_with = "no_pin")]
    pub pin: bool,
    /// Never pin ranks to CPUs (see --pin).
    #[arg(long)]
    pub no_pin: bool,
    /// Run the ranks on the nodes of emulated cluster NAME (`quiver cluster up`), each in
    /// its node's network namespace; needs root.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// Ranks per node with --cluster: rank r runs on node r / M (default: ceil(N / nodes)).
    #[arg(long, value_name = "M", requires = "cluster",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ppn: Option<u32>,
    /// Run an MPI program built against MPICH or Intel MPI (`libmpi.so.12`), or against
    /// the MPI-5 standard ABI (`libmpi_abi.so.1`), on quiver's MPI: the ranks load
    /// quiver's libraries (from `QUIVER_MPI_LIB`, a directory, or the ones built beside
    /// this `quiver`: `cargo build --release -p quiver-mpich -p quiver-mpi-abi`).
    #[arg(long)]
    pub mpi: bool,
    /// The program to start and its arguments.
    #[arg(
        value_name = "PROGRAM",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true
    )]
    pub command: Vec<OsString>,
}

/// A job to launch on this host.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// Number of ranks (at least 1).
    pub n: u32,
    /// The program every rank runs (looked up in `PATH` if it has no `/`).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Prefix every output line with `[RANK] `.
    pub prefix: bool,
    /// Terminate the job (exit status 124) when it runs longer than this.
    pub timeout: Option<Duration>,
    /// Pin rank R to the (R mod K)-th of the K CPUs this process may run on.
    pub pin_cpus: bool,
    /// Variables added to every rank's environment (after the `QUIVER_*` ones).
    pub extra_env: Vec<(String, String)>,
    /// Do not terminate the other ranks when one fails.
    pub keep_going: bool,
    /// Run the ranks on the nodes of an emulated cluster instead of this host's network.
    pub placement: Option<Placement>,
}

/// Entry point of `quiver run`; returns the exit status.
pub fn main(args: RunArgs) -> i32 {
    let timeout = match args.timeout {
        None => None,
        Some(secs) => match Duration::try_from_secs_f64(secs) {
            Ok(d) if !d.is_zero() => Some(d),
            _ => {
                eprintln!("quiver run: --timeout must be a positive number of seconds, not {secs}");
                return 2;
            }
        },
    };
    let mut command = args.command.into_iter();
    let Some(program) = command.next() else {
        eprintln!("quiver run: no program given");
        return 2;
    };
    let placement = match &args.cluster {
        None => None,
        Some(name) => match Placement::resolve(name, args.np, args.ppn) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("quiver run: {e:#}");
                return if e.downcast_ref::<BadPlacement>().is_some() {
                    2
                } else {
                    1
                };
            }
        },
    };
    let mut extra_env = Vec::new();
    if args.mpi {
        match mpi_library_dir() {
            Ok(dir) => {
                let mut path = dir.into_os_string().into_string().unwrap_or_default();
                if let Ok(old) = std::env::var("LD_LIBRARY_PATH") {
                    if !old.is_empty() {
                        path = format!("{path}:{old}");
                    }
                }
                extra_env.push(("LD_LIBRARY_PATH".to_string(), path));
            }
            Err(e) => {
                eprintln!("quiver run: --mpi: {e}");
                return 2;
            }
        }
    }
    let spec = LaunchSpec {
        n: args.np,
        program,
        args: command.collect(),
        prefix: !args.no_prefix,
        timeout,
        pin_cpus: args.pin || (!args.no_pin && args.np as usize > allowed_cpus().len()),
        extra_env,
        keep_going: args.keep_going,
        placement,
    };
    match launch(&spec) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("quiver run: {e:#}");
            1
        }
    }
}

/// A directory with quiver's `libmpi.so.12` (and `libmpi.so`, which mpi4py looks for
/// first, and `libmpi_abi.so.1`, the MPI-5 standard ABI's): `QUIVER_MPI_LIB`, or `mpi/`
/// beside this executable, made there (links to the libraries cargo built beside it)
/// when missing, or the installed `../lib`.
fn mpi_library_dir() -> Result<std::path::PathBuf, String> {
    use std::path::PathBuf;
    if let Some(dir) = std::env::var_os("QUIVER_MPI_LIB") {
        let dir = PathBuf::from(dir);
        return if dir.join("libmpi.so.12").exists() {
            Ok(dir)
        } else {
            Err(format!(
                "QUIVER_MPI_LIB={} has no libmpi.so.12",
                dir.display()
            ))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let bin = exe.parent().ok_or("this executable has no directory")?;
    let built = bin.join("libmpi.so");
    if built.exists() {
        let dir = bin.join("mpi");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // The MPI-5 standard ABI's library, when it was built: it loads libmpi.so.12
        // from its own directory.
        let abi = bin
            .join("libmpi_abi.so")
            .exists()
            .then_some(("libmpi_abi.so.1", "../libmpi_abi.so"));
        let links = [
            ("libmpi.so.12", "../libmpi.so"),
            ("libmpi.so", "../libmpi.so"),
        ];
        for (name, to) in links.into_iter().chain(abi) {
            let link = dir.join(name);
            if !link.exists() {
                // Two jobs starting at once may both make it: the second finds it made.
                if let Err(e) = std::os::unix::fs::symlink(to, &link) {
                    if e.kind() != std::io::ErrorKind::AlreadyExists {
                        return Err(format!("{}: {e}", link.display()));
                    }
                }
            }
        }
        return Ok(dir);
    }
    let installed = bin.join("../lib");
    if installed.join("libmpi.so.12").exists() {
        return Ok(installed);
    }
    Err(format!(
        "quiver's libmpi.so.12 is not beside {} (build it: cargo build --release -p quiver-mpich; \
         or set QUIVER_MPI_LIB to its directory)",
        exe.display()
    ))
}

/// How long ranks get between `SIGTERM` and `SIGKILL`.
const TERM_GRACE: Duration = Duration::from_secs(2);
/// How long the output of ended ranks may stay open before their process groups are killed.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// How long an output stream may stay open, idle, after that kill before it is abandoned.
const ABANDON_AFTER: Duration = Duration::from_secs(5);
/// Interval of the supervision loop.
const POLL: Duration = Duration::from_millis(5);
/// A line longer than this is copied in pieces (the prefix only before the first).
const MAX_LINE: usize = 64 * 1024;

/// Launches the job described by `spec`, waits until all its ranks ended, and returns the
/// job's exit status (see the module documentation). Messages about the job (a failing
/// rank, the timeout, a program that cannot be started) are printed to stderr.
///
/// While it runs, `SIGINT`, `SIGTERM` and `SIGHUP` of this process are handled by the
/// launcher (the previous dispositions are restored before it returns); one launch at a
/// time per process.
pub fn launch(spec: &LaunchSpec) -> anyhow::Result<i32> {
    anyhow::ensure!(spec.n >= 1, "the number of ranks must be at least 1");
    let (job_id, token) = job_identity()?;
    // On a cluster: the nodes' namespaces, opened before any fork, and a directory store.
    let mut netns = Vec::new();
    if let Some(p) = &spec.placement {
        anyhow::ensure!(
            p.n == spec.n,
            "the placement is for {} ranks, the job has {}",
            p.n,
            spec.n
        );
        for node in &p.nodes[..p.used_nodes()] {
            let file = cluster::tools::open_netns(&node.namespace).with_context(|| {
                format!(
                    "cannot open the network namespace {} of cluster {}",
                    node.namespace, p.cluster
                )
            })?;
            netns.push(file);
        }
    }
    // The store admits only the ranks: they get its key in their environment (readable
    // by this user only).
    let store_key = StoreKey::generate();
    let (mut server, store_dir, rendezvous) = if spec.placement.is_some() {
        let dir = StoreDir::create(job_id)?;
        let url = format!("file://{}", dir.0.display());
        (None, Some(dir), url)
    } else {
        let server = KvServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .context("cannot start the rendezvous store")?
            .spawn(store_key.clone());
        let url = format!("tcp://{}", server.local_addr());
        (Some(server), None, url)
    };
    let _signals = SignalGuard::install();

    let pin = if spec.pin_cpus {
        allowed_cpus()
    } else {
        Vec::new()
    };
    if spec.pin_cpus && pin.is_empty() {
        eprintln!("quiver run: cannot read this process's CPU affinity; ranks are not pinned");
    }
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut ranks: Vec<Rank> = Vec::with_capacity(spec.n as usize);
    let mut streams: Vec<Stream> = Vec::with_capacity(2 * spec.n as usize);
    let mut outcome: Option<Outcome> = None;

    for rank in 0..spec.n {
        let mut cmd = Command::new(&spec.program);
        let (local_rank, local_size) = match &spec.placement {
            None => (rank, spec.n),
            Some(p) => {
                let slot = p.slot(rank);
                let node = &p.nodes[slot.node];
                cmd.env("QUIVER_NODE", &node.name)
                    .env("QUIVER_ADDR", node.ip.to_string())
                    .env("QUIVER_CLUSTER", &p.cluster);
                cluster::tools::enter_netns_before_exec(&mut cmd, &netns[slot.node]);
                (slot.local_rank, slot.local_size)
            }
        };
        cmd.args(&spec.args)
            .env("QUIVER_RANK", rank.to_string())
            .env("QUIVER_SIZE", spec.n.to_string())
            .env("QUIVER_LOCAL_RANK", local_rank.to_string())
            .env("QUIVER_LOCAL_SIZE", local_size.to_string())
            .env("QUIVER_JOB_ID", job_id.to_string())
            .env("QUIVER_JOB_TOKEN", format!("{token:016x}"))
            .env("QUIVER_RENDEZVOUS", &rendezvous)
            .env(KEY_VAR, store_key.to_hex())
            .envs(spec.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let cpu = (!pin.is_empty()).then(|| pin[rank as usize % pin.len()]);
        set_pre_exec(&mut cmd, cpu);
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                outcome = Some(spawn_failure(&spec.program, rank, e));
                break;
            }
        };
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let pid = child.id() as libc::pid_t;
        ranks.push(Rank {
            child,
            pid,
            exit: None,
        });
        match start_copiers(rank, spec.prefix, stdout, stderr, &done_tx) {
            Ok(mut s) => streams.append(&mut s),
            Err(e) => {
                outcome = Some(Outcome::Error(e));
                break;
            }
        }
    }
    drop(done_tx);

    supervise(&mut ranks, spec.timeout, spec.keep_going, &mut outcome);
    drain_output(&ranks, streams, &done_rx);
    for rank in &mut ranks {
        // Every rank has exited (it is a zombie kept for its process-group id); reap it.
        let _ = rank.child.wait();
    }
    let _ = io::stdout().flush();
    if let Some(server) = &mut server {
        server.shutdown();
    }
    drop(store_dir);
    drop(netns);
    quiver::admin::cleanup_job(job_id);

    match outcome {
        None => Ok(0),
        Some(Outcome::Code(code)) => Ok(code),
        Some(Outcome::Error(e)) => Err(e),
    }
}

/// Why the job ends (the first cause wins).
enum Outcome {
    /// Exit status of the launcher.
    Code(i32),
    /// The launcher itself failed.
    Error(anyhow::Error),
}

/// One started rank.
struct Rank {
    child: Child,
    /// Its pid, which is also the id of its process group.
    pid: libc::pid_t,
    /// How it ended, once it has (it stays unreaped until the end of the job).
    exit: Option<Exit>,
}

/// How a rank ended.
#[derive(Clone, Copy, Debug)]
enum Exit {
    Code(i32),
    Signal {
        sig: i32,
        core: bool,
    },
    /// `waitid` failed: somebody else reaped it.
    Unknown,
}

/// The private directory of a `file://` rendezvous store; deleted when dropped.
struct StoreDir(PathBuf);

impl StoreDir {
    /// Creates `$TMPDIR/quiver-run-JOBID-SALT` with mode 0700 (failing if it exists).
    fn create(job_id: u32) -> anyhow::Result<StoreDir> {
        let mut salt = [0u8; 8];
        getrandom::fill(&mut salt).map_err(|e| anyhow::anyhow!("cannot draw a name: {e}"))?;
        let path = std::env::temp_dir().join(format!(
            "quiver-run-{job_id}-{:016x}",
            u64::from_le_bytes(salt)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| {
                format!("cannot create the rendezvous directory {}", path.display())
            })?;
        Ok(StoreDir(path))
    }
}

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Draws the job id (nonzero) and token.
fn job_identity() -> anyhow::Result<(u32, u64)> {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("cannot draw a job id: {e}"))?;
    let [a, b, c, d, token @ ..] = bytes;
    let job_id = u32::from_le_bytes([a, b, c, d]).max(1);
    Ok((job_id, u64::from_le_bytes(token)))
}

/// Reports a rank that could not be started and picks the exit status.
fn spawn_failure(program: &OsStr, rank: u32, e: io::Error) -> Outcome {
    let name = program.to_string_lossy();
    match e.kind() {
        io::ErrorKind::NotFound => {
            eprintln!("quiver run: {name}: command not found");
            Outcome::Code(127)
        }
        io::ErrorKind::PermissionDenied => {
            eprintln!("quiver run: {name}: cannot execute: {e}");
            Outcome::Code(127)
        }
        _ if e.raw_os_error() == Some(libc::ENOEXEC) => {
            eprintln!("quiver run: {name}: cannot execute: {e}");
            Outcome::Code(127)
        }
        _ => Outcome::Error(
            anyhow::Error::new(e).context(format!("cannot start rank {rank} ({name})")),
        ),
    }
}

/// Sets what the child does between `fork` and `exec`: dies with the launcher, and is
/// pinned to `cpu` if given.
fn set_pre_exec(cmd: &mut Command, cpu: Option<usize>) {
    // SAFETY: CPU_ZERO and CPU_SET only write into the local set.
    let set = cpu.map(|cpu| unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        set
    });
    // SAFETY: getpid is always safe to call.
    let parent = unsafe { libc::getpid() };
    let hook = move || -> io::Result<()> {
        // This runs in the child between fork and exec, where only async-signal-safe
        // functions may be called; io::Error::from_raw_os_error allocates nothing.
        // SAFETY: only raw system calls (prctl, getppid, sched_setaffinity) on values
        // prepared before the fork; no allocation, no locks.
        unsafe {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGTERM as libc::c_ulong,
                0,
                0,
                0,
            );
            if libc::getppid() != parent {
                // The launcher died before the prctl took effect.
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(set) = &set {
                // Best effort: an affinity that cannot be set leaves the rank unpinned.
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
            }
        }
        Ok(())
    };
    // SAFETY: see inside the closure: it only calls async-signal-safe functions.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// The CPUs this process may run on, in increasing order (empty if they cannot be read).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into `set`;
    // CPU_ISSET reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

/// Waits until every rank has exited, terminating the job when a rank fails (unless
/// `keep_going`), a signal arrives or the timeout expires. Ranks are left unreaped.
fn supervise(
    ranks: &mut [Rank],
    timeout: Option<Duration>,
    keep_going: bool,
    outcome: &mut Option<Outcome>,
) {
    let start = Instant::now();
    // With keep_going, the first failure is the job's status but ends nothing.
    let mut first_failure: Option<i32> = None;
    // When SIGTERM was sent, and the signal count then; whether SIGKILL was sent.
    let mut terminating: Option<(Instant, u32)> = None;
    let mut killed = false;
    loop {
        let mut running = 0;
        for (rank, r) in ranks.iter_mut().enumerate() {
            if r.exit.is_some() {
                continue;
            }
            match poll_exit(r.pid) {
                Ok(None) => running += 1,
                Ok(Some(exit)) => {
                    r.exit = Some(exit);
                    if outcome.is_none() {
                        if let Some(code) = report_exit(rank, exit) {
                            if keep_going {
                                first_failure.get_or_insert(code);
                            } else {
                                *outcome = Some(Outcome::Code(code));
                            }
                        }
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => running += 1,
                Err(e) => {
                    r.exit = Some(Exit::Unknown);
                    if outcome.is_none() {
                        eprintln!("quiver run: cannot wait for rank {rank}: {e}");
                        *outcome = Some(Outcome::Code(1));
                    }
                }
            }
        }
        if running == 0 {
            if outcome.is_none() {
                *outcome = first_failure.map(Outcome::Code);
            }
            return;
        }
        if outcome.is_none() {
            let sig = SIGNAL.load(Ordering::SeqCst);
            if sig != 0 {
                *outcome = Some(Outcome::Code(128 + sig));
            } else if let Some(t) = timeout.filter(|&t| start.elapsed() >= t) {
                eprintln!(
                    "quiver run: timeout after {} s; terminating all ranks",
                    t.as_secs_f64()
                );
                *outcome = Some(Outcome::Code(124));
            }
        }
        if outcome.is_some() {
            match terminating {
                None => {
                    signal_groups(ranks, libc::SIGTERM);
                    terminating = Some((Instant::now(), SIGNAL_COUNT.load(Ordering::SeqCst)));
                }
                Some((since, count)) if !killed => {
                    if since.elapsed() >= TERM_GRACE || SIGNAL_COUNT.load(Ordering::SeqCst) > count
                    {
                        signal_groups(ranks, libc::SIGKILL);
                        killed = true;
                    }
                }
                Some(_) => {}
            }
        }
        thread::sleep(POLL);
    }
}

/// Prints how a failed rank ended; returns the launcher's exit status for it, or `None` if
/// it succeeded.
fn report_exit(rank: usize, exit: Exit) -> Option<i32> {
    match exit {
        Exit::Code(0) => None,
        Exit::Code(code) => {
            eprintln!("quiver run: rank {rank} exited with status {code}");
            Some(code)
        }
        Exit::Signal { sig, core } => {
            let core = if core { " (core dumped)" } else { "" };
            match signal_name(sig) {
                Some(name) => {
                    eprintln!("quiver run: rank {rank} was killed by signal {name} ({sig}){core}")
                }
                None => eprintln!("quiver run: rank {rank} was killed by signal {sig}{core}"),
            }
            Some(128 + sig)
        }
        Exit::Unknown => {
            eprintln!("quiver run: rank {rank} ended with an unknown status");
            Some(1)
        }
    }
}

/// Whether the rank with this pid has exited, without reaping it (`WNOWAIT`): as long as it
/// is not reaped, its pid, which is the id of its process group, cannot be reused, so the
/// group can be signalled safely.
fn poll_exit(pid: libc::pid_t) -> io::Result<Option<Exit>> {
    // SAFETY: an all-zero siginfo_t is valid; waitid writes into it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid siginfo_t to write into.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: for SIGCHLD-type information (what waitid fills in) these fields are valid;
    // si_pid stays 0 when no child has changed state.
    let (who, status) = unsafe { (info.si_pid(), info.si_status()) };
    if who == 0 {
        return Ok(None);
    }
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => Exit::Code(status),
        libc::CLD_KILLED => Exit::Signal {
            sig: status,
            core: false,
        },
        libc::CLD_DUMPED => Exit::Signal {
            sig: status,
            core: true,
        },
        _ => Exit::Unknown,
    }))
}

/// Sends `sig` to the process group of every rank. Every rank is still unreaped, so its
/// group id cannot have been reused (a rank whose status is unknown may have been reaped
/// by someone else: it is skipped).
fn signal_groups(ranks: &[Rank], sig: libc::c_int) {
    for r in ranks {
        if matches!(r.exit, Some(Exit::Unknown)) {
            continue;
        }
        // SAFETY: kill has no memory-safety preconditions. ESRCH (group gone) is fine.
        unsafe {
            libc::kill(-r.pid, sig);
        }
    }
}

/// Name of the common signals.
fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------
// Signals of the launcher
// ---------------------------------------------------------------------------------------

/// The first of SIGINT / SIGTERM / SIGHUP received during the launch (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// How many of them were received.
static SIGNAL_COUNT: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only lock-free atomics: async-signal-safe.
    let _ = SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    SIGNAL_COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Handlers of SIGINT, SIGTERM and SIGHUP for the duration of a launch; restores the
/// previous ones when dropped. A signal that was ignored stays ignored.
struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalGuard {
    fn install() -> SignalGuard {
        SIGNAL.store(0, Ordering::SeqCst);
        SIGNAL_COUNT.store(0, Ordering::SeqCst);
        let mut previous = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: plain sigaction calls on valid, zero-initialised structures; the
            // handler only touches atomics.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction == libc::SIG_IGN
                {
                    continue;
                }
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                new.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut new.sa_mask);
                if libc::sigaction(sig, &new, &mut old) == 0 {
                    previous.push((sig, old));
                }
            }
        }
        SignalGuard { previous }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores an action obtained from sigaction.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------

/// Where a copy thread writes.
#[derive(Clone, Copy, Debug)]
enum Sink {
    Stdout,
    Stderr,
}

impl Sink {
    /// Writes `bytes` in one piece (under the stream's lock) and flushes.
    fn write(self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(bytes)?;
                out.flush()
            }
            Sink::Stderr => {
                let mut out = io::stderr().lock();
                out.write_all(bytes)?;
                out.flush()
            }
        }
    }
}

/// Phases of a copy thread, for the launcher to tell an idle stream from a busy one.
const READING: u8 = 0;
const WRITING: u8 = 1;
const DONE: u8 = 2;

/// What a copy thread shows the launcher.
#[derive(Default)]
struct Progress {
    phase: AtomicU8,
    bytes: AtomicU64,
}

/// A copy thread.
struct Stream {
    rank: u32,
    name: &'static str,
    progress: Arc<Progress>,
    handle: JoinHandle<()>,
}

/// Starts the threads that copy a rank's stdout and stderr.
fn start_copiers(
    rank: u32,
    prefix: bool,
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    done: &mpsc::Sender<()>,
) -> anyhow::Result<Vec<Stream>> {
    let mut streams = Vec::with_capacity(2);
    type Source = Box<dyn Read + Send>;
    let pieces: [(Option<Source>, Sink, &'static str); 2] = [
        (
            stdout.map(|s| Box::new(s) as Source),
            Sink::Stdout,
            "stdout",
        ),
        (
            stderr.map(|s| Box::new(s) as Source),
            Sink::Stderr,
            "stderr",
        ),
    ];
    for (src, sink, name) in pieces {
        let Some(src) = src else { continue };
        let progress = Arc::new(Progress::default());
        let shown = Arc::clone(&progress);
        let done = done.clone();
        let line_prefix = prefix.then(|| format!("[{rank}] ").into_bytes());
        let handle = thread::Builder::new()
            .name(format!("quiver-run-{rank}-{name}"))
            .spawn(move || {
                copy_stream(src, line_prefix.as_deref(), &shown, |bytes| {
                    sink.write(bytes)
                });
                shown.phase.store(DONE, Ordering::SeqCst);
                let _ = done.send(());
            })
            .with_context(|| format!("cannot start the thread copying rank {rank}'s {name}"))?;
        streams.push(Stream {
            rank,
            name,
            progress,
            handle,
        });
    }
    Ok(streams)
}

/// Copies `src` to `sink` until end of file. With a prefix, copies complete lines, each
/// preceded by the prefix (a last line without newline gets one; a line longer than
/// [`MAX_LINE`] is copied in pieces); without, copies bytes as they come. Once the sink
/// fails (our stdout closed), the rest is read and discarded so that the rank never blocks.
fn copy_stream(
    mut src: impl Read,
    prefix: Option<&[u8]>,
    progress: &Progress,
    mut sink: impl FnMut(&[u8]) -> io::Result<()>,
) {
    let mut chunk = vec![0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    // The start of the pending line was already copied (it was too long).
    let mut continuing = false;
    let mut broken = false;
    let mut emit = |bytes: &[u8], broken: &mut bool| {
        if !*broken && !bytes.is_empty() {
            progress.phase.store(WRITING, Ordering::SeqCst);
            *broken = sink(bytes).is_err();
            progress.phase.store(READING, Ordering::SeqCst);
        }
    };
    loop {
        let n = match src.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        progress.bytes.fetch_add(n as u64, Ordering::SeqCst);
        let Some(prefix) = prefix else {
            emit(&chunk[..n], &mut broken);
            continue;
        };
        pending.extend_from_slice(&chunk[..n]);
        out.clear();
        let mut start = 0;
        while let Some(pos) = pending[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos + 1;
            if !continuing {
                out.extend_from_slice(prefix);
            }
            out.extend_from_slice(&pending[start..end]);
            continuing = false;
            start = end;
        }
        pending.drain(..start);
        if pending.len() >= MAX_LINE {
            if !continuing {
                out.extend_from_slice(prefix);
            }
            out.append(&mut pending);
            continuing = true;
        }
        emit(&out, &mut broken);
    }
    if let Some(prefix) = prefix {
        out.clear();
        if !pending.is_empty() {
            if !continuing {
                out.extend_from_slice(prefix);
            }
            out.append(&mut pending);
            out.push(b'\n');
        } else if continuing {
            out.push(b'\n');
        }
        emit(&out, &mut broken);
    }
}

/// Waits, once every rank has ended, for the copy threads to finish and joins them.
///
/// Output still open [`DRAIN_GRACE`] after the ranks ended is held by processes they left
/// behind: their process groups are killed. A stream still open and idle [`ABANDON_AFTER`]
/// later is held by a process outside the groups: it is left to its thread, which is not
/// joined.
fn drain_output(ranks: &[Rank], streams: Vec<Stream>, done: &mpsc::Receiver<()>) {
    let total = streams.len();
    let mut finished = 0;
    let wait_until = |deadline: Instant, finished: &mut usize| {
        while *finished < total {
            let left = deadline.saturating_duration_since(Instant::now());
            match done.recv_timeout(left) {
                Ok(()) => *finished += 1,
                Err(_) => break,
            }
        }
    };
    wait_until(Instant::now() + DRAIN_GRACE, &mut finished);
    if finished < total {
        signal_groups(ranks, libc::SIGKILL);
        // Wait for the streams, as long as each unfinished one is busy or makes progress.
        let mut last: Vec<u64> = streams
            .iter()
            .map(|s| s.progress.bytes.load(Ordering::SeqCst))
            .collect();
        let mut idle_since = Instant::now();
        while finished < total {
            wait_until(Instant::now() + Duration::from_millis(100), &mut finished);
            let mut active = false;
            for (s, seen) in streams.iter().zip(last.iter_mut()) {
                let bytes = s.progress.bytes.load(Ordering::SeqCst);
                let phase = s.progress.phase.load(Ordering::SeqCst);
                if phase == WRITING || bytes != *seen {
                    active = true;
                }
                *seen = bytes;
            }
            if active {
                idle_since = Instant::now();
            } else if idle_since.elapsed() >= ABANDON_AFTER {
                break;
            }
        }
    }
    for s in streams {
        if s.progress.phase.load(Ordering::SeqCst) == DONE {
            let _ = s.handle.join();
        } else {
            eprintln!(
                "quiver run: rank {}'s {} is still held open by a process outside the job; not waiting for it",
                s.rank, s.name
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(input: &[u8], prefix: Option<&[u8]>) -> Vec<u8> {
        let mut got = Vec::new();
        let progress = Progress::default();
        copy_stream(input, prefix, &progress, |b| {
            got.extend_from_slice(b);
            Ok(())
        });
        got
    }

    #[test]
    fn prefixes_lines() {
        assert_eq!(
            copy(b"a\nbc\n\nd", Some(b"[3] ")),
            b"[3] a\n[3] bc\n[3] \n[3] d\n"
        );
        assert_eq!(copy(b"", Some(b"[3] ")), b"");
        assert_eq!(copy(b"a\nb", None), b"a\nb");
    }

    #[test]
    fn long_lines_in_pieces() {
        let mut input = vec![b'x'; MAX_LINE * 3];
        input.push(b'\n');
        input.extend_from_slice(b"y\n");
        let got = copy(&input, Some(b"[0] "));
        let mut want = b"[0] ".to_vec();
        want.extend_from_slice(&input[..MAX_LINE * 3 + 1]);
        want.extend_from_slice(b"[0] y\n");
        assert_eq!(got, want);
    }

    #[test]
    fn keeps_reading_after_sink_fails() {
        let progress = Progress::default();
        let input = vec![b'z'; 100_000];
        copy_stream(&input[..], Some(b"[0] "), &progress, |_| {
            Err(io::ErrorKind::BrokenPipe.into())
        });
        assert_eq!(progress.bytes.load(Ordering::SeqCst), 100_000);
    }

    #[test]
    fn pins_ranks_to_one_cpu() {
        let spec = LaunchSpec {
            n: 2,
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "grep -Eq '^Cpus_allowed_list:[[:space:]]+[0-9]+$' /proc/self/status".into(),
            ],
            prefix: true,
            timeout: Some(Duration::from_secs(60)),
            pin_cpus: true,
            extra_env: vec![("QUIVER_TEST_EXTRA".into(), "1".into())],
            keep_going: false,
            placement: None,
        };
        if allowed_cpus().is_empty() {
            return;
        }
        assert_eq!(launch(&spec).ok(), Some(0));
    }
}
