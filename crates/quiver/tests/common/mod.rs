//! Runs the ranks of a job as threads of the test process, with a rendezvous store
//! served by the test, so that whole-stack tests need no launcher.
#![allow(dead_code)]

use quiver::admin::{KvServer, KvServerHandle, StoreKey, KEY_VAR};
use quiver::{Config, Job, TransportChoice, WaitMode};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A running rendezvous store and the job id/token of one test job.
pub struct TestJob {
    pub server: KvServerHandle,
    pub job_id: u32,
    pub token: u64,
    pub size: u32,
    /// A store other than the server's (a `file://` store for ranks in namespaces).
    pub url: Option<String>,
    /// The key of the job's store.
    pub key: StoreKey,
}

impl TestJob {
    pub fn new(size: u32) -> TestJob {
        let key = StoreKey::generate();
        let server = KvServer::bind("127.0.0.1:0".parse().unwrap())
            .expect("bind rendezvous")
            .spawn(key.clone());
        let mut b = [0u8; 12];
        getrandom_fill(&mut b);
        TestJob {
            server,
            job_id: u32::from_le_bytes(b[..4].try_into().unwrap()) | 1,
            token: u64::from_le_bytes(b[4..].try_into().unwrap()),
            size,
            url: None,
            key,
        }
    }

    /// A job whose ranks meet in the store at `url` (the test's own tcp store stays
    /// unused).
    pub fn with_url(size: u32, url: String) -> TestJob {
        TestJob {
            url: Some(url),
            ..TestJob::new(size)
        }
    }

    pub fn url(&self) -> String {
        match &self.url {
            Some(u) => u.clone(),
            None => format!("tcp://{}", self.server.local_addr()),
        }
    }

    /// The variables `quiver run` would give `rank` (plus `extra`).
    pub fn env(&self, rank: u32, extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            ("QUIVER_RANK", rank.to_string()),
            ("QUIVER_SIZE", self.size.to_string()),
            ("QUIVER_JOB_ID", self.job_id.to_string()),
            ("QUIVER_JOB_TOKEN", format!("{:016x}", self.token)),
            ("QUIVER_RENDEZVOUS", self.url()),
            (KEY_VAR, self.key.to_hex()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in extra {
            m.insert(k.to_string(), v.to_string());
        }
        m
    }

    pub fn join(&self, rank: u32, config: Config, extra: &[(&str, &str)]) -> Job {
        let env = self.env(rank, extra);
        Job::from_lookup(&|k| env.get(k).cloned(), config).expect("join job")
    }
}

fn getrandom_fill(b: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(b))
        .expect("urandom");
}

/// Default configuration of test jobs: short polling so that four rank-threads share
/// two cores without starving each other.
pub fn config(transport: TransportChoice) -> Config {
    Config::default()
        .with_transport(transport)
        .with_wait(WaitMode::Hybrid(Duration::from_micros(20)))
}

/// Runs `body(job)` on `size` rank-threads and propagates the first panic. With
/// [`TransportChoice::Eth`] every rank runs on a node of its own of a [`TestCluster`]
/// (skipped with a note where namespaces cannot be made).
pub fn run_ranks<F>(size: u32, config: Config, body: F)
where
    F: Fn(Job) + Send + Sync + 'static,
{
    run_ranks_env(size, config, &[], body)
}

/// Like [`run_ranks`] with extra variables for every rank.
pub fn run_ranks_env<F>(size: u32, config: Config, extra: &[(&str, &str)], body: F)
where
    F: Fn(Job) + Send + Sync + 'static,
{
    run_ranks_checked(size, config, extra, true, None, body)
}

/// Like [`run_ranks`] over [`TransportChoice::Eth`] (or `Udp`) on a cluster of `nodes`
/// nodes (rank r on node r * nodes / size: over Ethernet, same-node ranks talk through
/// shared memory; forced UDP carries everything) whose switch drops each frame with
/// probability `loss` (nftables, as `quiver cluster up --loss`).
#[allow(dead_code)]
pub fn run_ranks_on_cluster<F>(size: u32, nodes: u32, loss: f64, config: Config, body: F)
where
    F: Fn(Job) + Send + Sync + 'static,
{
    assert!(matches!(
        config.transport,
        TransportChoice::Eth | TransportChoice::Udp
    ));
    let eth = config.transport == TransportChoice::Eth;
    run_ranks_checked(size, config, &[], eth, Some((nodes, loss)), body)
}

/// Like [`run_ranks`] over [`TransportChoice::Eth`], without checking that Ethernet is
/// what the ranks use (for the test of the fallback to UDP).
#[allow(dead_code)]
pub fn run_ranks_allowing_udp<F>(size: u32, config: Config, body: F)
where
    F: Fn(Job) + Send + Sync + 'static,
{
    run_ranks_checked(size, config, &[], false, None, body)
}

/// The DPID of the endpoint that checks, before a test over Ethernet, that it really
/// runs over Ethernet (an endpoint that cannot open a raw socket falls back to UDP,
/// which would pass the test too).
const ETH_PROBE_DPID: u16 = u16::MAX;

/// Checks that `job`'s rank reaches every rank on another node (`other_node`) over
/// Ethernet ([`ETH_PROBE_DPID`]).
fn assert_reaches_over_eth(job: &Job, other_node: impl Fn(u32) -> bool) {
    let probe = job.open(ETH_PROBE_DPID).unwrap();
    for peer in (0..job.size()).filter(|&p| other_node(p)) {
        assert_eq!(
            probe.transport_to(peer).unwrap(),
            quiver::Transport::Eth,
            "rank {} of job {} would reach rank {peer} over another link",
            job.rank(),
            job.job_id()
        );
    }
}

fn run_ranks_checked<F>(
    size: u32,
    config: Config,
    extra: &[(&str, &str)],
    eth_required: bool,
    spec: Option<(u32, f64)>,
    body: F,
) where
    F: Fn(Job) + Send + Sync + 'static,
{
    let (nodes, loss) = spec.unwrap_or((size, 0.0));
    let node_of = move |rank: u32| (u64::from(rank) * u64::from(nodes) / u64::from(size)) as usize;
    let cluster = if config.transport == TransportChoice::Eth || spec.is_some() {
        match TestCluster::up(nodes) {
            Ok(c) => {
                if loss > 0.0 {
                    c.drop_frames(loss)
                        .expect("nftables loss on the test cluster's switch");
                }
                Some(Arc::new(c))
            }
            Err(why) => {
                cannot_run(&why.to_string());
                return;
            }
        }
    } else {
        None
    };
    let tj = Arc::new(match &cluster {
        Some(c) => TestJob::with_url(size, c.store_url()),
        None => TestJob::new(size),
    });
    let body = Arc::new(body);
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (tj, body, config, mut extra) =
                (tj.clone(), body.clone(), config.clone(), extra.clone());
            let cluster = cluster.clone();
            std::thread::Builder::new()
                .name(format!("rank{rank}"))
                .spawn(move || {
                    if let Some(c) = &cluster {
                        let node = node_of(rank);
                        c.enter(node);
                        extra.push(("QUIVER_NODE".into(), format!("node{node}")));
                        extra.push(("QUIVER_ADDR".into(), c.addr(node)));
                    }
                    let extra: Vec<(&str, &str)> = extra
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    let job = tj.join(rank, config, &extra);
                    if cluster.is_some() && eth_required {
                        assert_reaches_over_eth(&job, |p| node_of(p) != node_of(rank));
                    }
                    body(job)
                })
                .unwrap()
        })
        .collect();
    join_ranks(handles);
}

/// Runs `jobs` jobs of `size` ranks each at the same time on one cluster of `nodes` nodes
/// over [`TransportChoice::Eth`] or `Udp` (rank r of every job on node r * nodes / size),
/// each job with a store of its own: `body(job_index, job)` on every rank-thread. Several
/// jobs sharing nodes, as GAMMA's parallel multitasking.
#[allow(dead_code)]
pub fn run_jobs_on_cluster<F>(jobs: u32, size: u32, nodes: u32, config: Config, body: F)
where
    F: Fn(u32, Job) + Send + Sync + 'static,
{
    assert!(matches!(
        config.transport,
        TransportChoice::Eth | TransportChoice::Udp
    ));
    match TestCluster::up(nodes) {
        Ok(c) => run_jobs_in(jobs, size, Some((Arc::new(c), nodes)), config, body),
        Err(why) => cannot_run(&why),
    }
}

/// Runs `jobs` jobs of `size` ranks each at the same time on this host, each job with a
/// store of its own: `body(job_index, job)` on every rank-thread.
#[allow(dead_code)]
pub fn run_jobs<F>(jobs: u32, size: u32, config: Config, body: F)
where
    F: Fn(u32, Job) + Send + Sync + 'static,
{
    run_jobs_in(jobs, size, None, config, body)
}

fn run_jobs_in<F>(
    jobs: u32,
    size: u32,
    cluster: Option<(Arc<TestCluster>, u32)>,
    config: Config,
    body: F,
) where
    F: Fn(u32, Job) + Send + Sync + 'static,
{
    let body = Arc::new(body);
    let mut handles = Vec::new();
    for j in 0..jobs {
        let tj = Arc::new(match &cluster {
            Some((c, _)) => {
                let dir = c.store.join(format!("job{j}"));
                std::fs::create_dir_all(&dir).expect("the job's store directory");
                TestJob::with_url(size, format!("file://{}", dir.display()))
            }
            None => TestJob::new(size),
        });
        for rank in 0..size {
            let (tj, body, config, cluster) =
                (tj.clone(), body.clone(), config.clone(), cluster.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("job{j}-rank{rank}"))
                    .spawn(move || {
                        let Some((cluster, nodes)) = cluster else {
                            return body(j, tj.join(rank, config, &[]));
                        };
                        let node_of =
                            |r: u32| (u64::from(r) * u64::from(nodes) / u64::from(size)) as usize;
                        let node = node_of(rank);
                        cluster.enter(node);
                        let (name, addr) = (format!("node{node}"), cluster.addr(node));
                        let extra = [
                            ("QUIVER_NODE", name.as_str()),
                            ("QUIVER_ADDR", addr.as_str()),
                        ];
                        let eth = config.transport == TransportChoice::Eth;
                        let job = tj.join(rank, config, &extra);
                        if eth {
                            assert_reaches_over_eth(&job, |p| node_of(p) != node);
                        }
                        body(j, job)
                    })
                    .unwrap(),
            );
        }
    }
    join_ranks(handles);
}

/// How long the other ranks get to finish once one has panicked: they may be waiting for
/// it in a barrier (whose timeout is an hour).
const AFTER_PANIC: Duration = Duration::from_secs(5);

/// Joins the rank threads and propagates the first panic. Once a rank has panicked, the
/// others get [`AFTER_PANIC`] to end; those still running then are left behind, so that
/// the test fails now instead of when their barrier times out.
fn join_ranks(mut handles: Vec<std::thread::JoinHandle<()>>) {
    let mut first_panic = None;
    let mut panicked_at = None;
    while !handles.is_empty() {
        if panicked_at.is_some_and(|t: std::time::Instant| t.elapsed() > AFTER_PANIC) {
            eprintln!(
                "{} rank thread(s) still running {AFTER_PANIC:?} after a rank panicked; left behind",
                handles.len()
            );
            break;
        }
        let Some(i) = handles.iter().position(|h| h.is_finished()) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if let Err(p) = handles.swap_remove(i).join() {
            first_panic.get_or_insert(p);
            panicked_at.get_or_insert_with(std::time::Instant::now);
        }
    }
    if let Some(p) = first_panic {
        std::panic::resume_unwind(p);
    }
}

/// Deterministic contents for message `seq` of `len` bytes from `src`.
pub fn pattern(src: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut x = (src as u64) << 32 | seq as u64 | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small emulated cluster for whole-stack tests over raw Ethernet: one network
/// namespace per node, each with a veth into a bridge in a switch namespace, addresses
/// 10.213.0.N. The namespaces are private to the test (their addresses cannot clash with
/// the host's or another test's) and are removed on drop. Rank threads enter their node's
/// namespace with `setns`, which moves only the calling thread.
pub struct TestCluster {
    prefix: String,
    nodes: usize,
    store: std::path::PathBuf,
}

impl TestCluster {
    /// Builds a cluster of `nodes` nodes, or says why this machine cannot (not root, no
    /// `ip`). Any other failure of the set-up is a bug or a broken machine, not a reason
    /// to skip: it panics.
    pub fn up(nodes: u32) -> Result<TestCluster, String> {
        if let Some(why) = clusters_unsupported() {
            return Err(why);
        }
        match Self::build(nodes) {
            Ok(c) => Ok(c),
            Err(e) => panic!("building a test cluster failed unexpectedly (as root, with ip): {e}"),
        }
    }

    fn build(nodes: u32) -> Result<TestCluster, String> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            remove_stale_clusters();
        }
        let prefix = format!("qvt{}-{id}", std::process::id());
        let store = std::env::temp_dir().join(format!("{prefix}-store"));
        let c = TestCluster {
            prefix,
            nodes: nodes as usize,
            store,
        };
        let sw = c.ns("sw");
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for n in 0..c.nodes {
            let ns = c.ns(&format!("n{n}"));
            let port = format!("p{n}");
            ip(&["netns", "add", &ns])?;
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "qv0", "netns",
                &ns,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", c.addr(n)),
                "dev",
                "qv0",
            ])?;
            ip(&["-n", &ns, "link", "set", "qv0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        std::fs::create_dir_all(&c.store).map_err(|e| e.to_string())?;
        Ok(c)
    }

    fn ns(&self, what: &str) -> String {
        format!("{}-{what}", self.prefix)
    }

    /// The address of node `n`.
    pub fn addr(&self, n: usize) -> String {
        format!("10.213.0.{}", n + 1)
    }

    /// A `file://` rendezvous store every namespace reaches (the file system is shared).
    pub fn store_url(&self) -> String {
        format!("file://{}", self.store.display())
    }

    /// Makes the switch drop each frame it forwards with probability `p` (nftables in
    /// the switch's namespace, as `quiver cluster up --loss` does).
    pub fn drop_frames(&self, p: f64) -> Result<(), String> {
        let rules = format!(
            "table bridge qvtest {{\n  chain forward {{\n    type filter hook forward priority 0; \
             policy accept;\n    numgen random mod 1000000 lt {} counter drop\n  }}\n}}\n",
            (p * 1e6).round() as u64
        );
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &self.ns("sw"), "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("ip netns exec nft: {e}"))?;
        use std::io::Write as _;
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(rules.as_bytes())
            .map_err(|e| e.to_string())?;
        match child.wait() {
            Ok(s) if s.success() => Ok(()),
            other => Err(format!("nft -f: {other:?}")),
        }
    }

    /// Moves the calling thread into node `n`'s network namespace.
    pub fn enter(&self, n: usize) {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(format!("/run/netns/{}", self.ns(&format!("n{n}"))))
            .expect("open the node's namespace");
        // SAFETY: setns on a valid namespace descriptor; it changes only this thread's
        // network namespace.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.ns("sw")]);
        for n in 0..self.nodes {
            let _ = ip(&["netns", "del", &self.ns(&format!("n{n}"))]);
        }
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// Removes the namespaces and stores of test clusters whose test process is gone (one
/// killed by a timeout or a signal runs no `Drop`), so that a crashed run leaves nothing
/// behind after the next one starts. Names are `qvt<pid>-<id>-<node>`.
pub fn remove_stale_clusters() {
    let dead = |name: &str| {
        name.strip_prefix("qvt")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    let names = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| dead(n))
                    .collect()
            })
            .unwrap_or_default()
    };
    for ns in names(std::path::Path::new("/run/netns")) {
        let _ = ip(&["netns", "del", &ns]);
    }
    let tmp = std::env::temp_dir();
    for store in names(&tmp).into_iter().filter(|n| n.ends_with("-store")) {
        let _ = std::fs::remove_dir_all(tmp.join(store));
    }
}

/// Why this machine cannot build test clusters (not root, no `ip`), if it cannot.
fn clusters_unsupported() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    // CAP_NET_ADMIN (12) for namespaces and links, CAP_SYS_ADMIN (21) for setns.
    if caps & (1 << 12) == 0 || caps & (1 << 21) == 0 {
        return Some("not root (CAP_NET_ADMIN and CAP_SYS_ADMIN needed)".into());
    }
    let has_ip = std::process::Command::new("ip")
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    (!has_ip).then(|| "the `ip` command is missing".into())
}

/// Runs `ip ARGS`; the error says what failed.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Skips a test that needs what this machine lacks (root, a command), with one line
/// saying why; under `.ci/run` (`QUIVER_CI` set), which runs as root with every tool
/// installed, fails instead, so that CI never passes a test it did not run.
pub fn cannot_run(why: &str) {
    if std::env::var_os("QUIVER_CI").is_some() {
        panic!("{why} (QUIVER_CI is set: .ci/run must run this test)");
    }
    eprintln!("skipped: {why}");
}
