//! `quiver cluster` and `quiver run --cluster`, end to end: building and removing an
//! emulated cluster leaves the host's network as it was; `list` shows every node; a
//! second `up` fails; `down` cleans up after a crashed or interrupted `up`; jobs (`quiver
//! check`, `quiver bench pingpong`) run with their ranks on different nodes.
//!
//! These tests need root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and the `ip`, `tc` and `nft`
//! commands; without them each test says why and passes without doing anything. Every
//! cluster is named after this process (`t<PID>-...`) and removed by a guard, so that a
//! failing test leaves nothing behind. Tests run one at a time.

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

const QUIVER: &str = env!("CARGO_BIN_EXE_quiver");

/// Deadline of one command; generous for a loaded two-core machine.
const LIMIT: Duration = Duration::from_secs(300);

/// One test at a time: the host snapshots must not see another test's namespaces, and
/// the jobs fill a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Variables of the test's own environment that would change what a job does.
const CLEAN_ENV: [&str; 16] = [
    "QUIVER_RANK",
    "QUIVER_SIZE",
    "QUIVER_LOCAL_RANK",
    "QUIVER_LOCAL_SIZE",
    "QUIVER_JOB_ID",
    "QUIVER_JOB_TOKEN",
    "QUIVER_RENDEZVOUS",
    "QUIVER_TRANSPORT",
    "QUIVER_WAIT",
    "QUIVER_NODE",
    "QUIVER_ADDR",
    "QUIVER_CLUSTER",
    "QUIVER_FAULTS",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
];

/// Why these tests cannot run here, if they cannot.
fn unsupported() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if caps & (1 << 12) == 0 || caps & (1 << 21) == 0 {
        return Some("not root (CAP_NET_ADMIN and CAP_SYS_ADMIN needed)".into());
    }
    for tool in ["ip", "tc", "nft"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("the `{tool}` command is missing"));
        }
    }
    None
}

/// Skips a test this machine cannot run ([`common::cannot_run`]: fails under `.ci/run`).
macro_rules! require_root {
    () => {
        if let Some(why) = unsupported() {
            common::cannot_run(&why);
            return;
        }
    };
}

fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for var in CLEAN_ENV {
        cmd.env_remove(var);
    }
    cmd
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn describe(out: &Output) -> String {
    format!(
        "status {}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// Kills the process group led by `child`.
fn kill_group(child: &Child, sig: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions; the group is the test's own.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), sig);
    }
}

/// Runs `cmd` with its output captured, in a process group of its own that is killed
/// past [`LIMIT`] (the test then fails with what the command printed).
fn run(mut cmd: Command) -> Output {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let pid = child.id() as libc::pid_t;
    let watchdog = thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < LIMIT {
            thread::sleep(Duration::from_millis(100));
            // SAFETY: signal 0 only probes whether the group still exists.
            if unsafe { libc::kill(-pid, 0) } != 0 {
                return false;
            }
        }
        // SAFETY: as above; the group is ours.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        true
    });
    let out = child.wait_with_output().expect("wait for the command");
    // SAFETY: leftovers of the group must not outlive the test.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
    assert!(
        !watchdog.join().unwrap_or(false),
        "{what} ran longer than {LIMIT:?}\n{}",
        describe(&out)
    );
    out
}

fn quiver(args: &[&str]) -> Output {
    let mut cmd = command(QUIVER);
    cmd.args(args);
    run(cmd)
}

fn quiver_ok(args: &[&str]) -> Output {
    let out = quiver(args);
    assert!(out.status.success(), "quiver {args:?}: {}", describe(&out));
    out
}

/// A cluster name unique to this test process.
fn unique(tag: &str) -> String {
    format!("t{}-{tag}", std::process::id())
}

/// Removes the cluster when the test ends, however it ends.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = command(QUIVER)
            .args(["cluster", "down", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The namespaces of cluster `name` that exist.
fn namespaces_of(name: &str) -> Vec<String> {
    let prefix = format!("qv-{name}-");
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mut v: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix(&prefix).is_some_and(|role| {
                role == "sw"
                    || role
                        .strip_prefix('n')
                        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .collect();
    v.sort();
    v
}

/// `value` without the fields that change by themselves (counters, lifetimes).
fn stable(value: Value) -> Value {
    const VOLATILE: [&str; 7] = [
        "stats",
        "stats64",
        "valid_life_time",
        "preferred_life_time",
        "expires",
        "packets",
        "bytes",
    ];
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(k, _)| !VOLATILE.contains(&k.as_str()))
                .map(|(k, v)| (k, stable(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(stable).collect()),
        v => v,
    }
}

/// The host's network as the tools show it.
fn host_snapshot() -> Vec<(String, Value)> {
    let mut snapshot = Vec::new();
    let json = |program: &str, args: &[&str]| -> Value {
        let out = Command::new(program)
            .args(args)
            .output()
            .expect("run a network tool");
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            describe(&out)
        );
        let t = text(&out.stdout);
        if t.trim().is_empty() {
            Value::Null
        } else {
            stable(serde_json::from_str(&t).unwrap_or_else(|e| panic!("{program} {args:?}: {e}")))
        }
    };
    for (program, args) in [
        ("ip", &["-j", "link", "show"][..]),
        ("ip", &["-j", "addr", "show"]),
        ("ip", &["-j", "-4", "route", "show", "table", "all"]),
        ("ip", &["-j", "-6", "route", "show", "table", "all"]),
        ("ip", &["-j", "neigh", "show"]),
        ("tc", &["-j", "qdisc", "show"]),
        ("nft", &["-j", "list", "ruleset"]),
    ] {
        snapshot.push((format!("{program} {}", args.join(" ")), json(program, args)));
    }
    let netns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    snapshot.push(("ip netns list".into(), Value::String(text(&netns.stdout))));
    snapshot.push((
        "bridge netfilter".into(),
        Value::String(bridge_netfilter(None)),
    ));
    snapshot
}

/// The bridge's calls into iptables & co. (br_netfilter's settings, when it is loaded)
/// in the host's namespace or in `netns`, as `name=value` lines.
fn bridge_netfilter(netns: Option<&str>) -> String {
    let script = "for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ -e \"$f\" ] && echo \"$f=$(cat $f)\"; done; true";
    let out = match netns {
        None => Command::new("sh").args(["-c", script]).output(),
        Some(ns) => Command::new("ip")
            .args(["netns", "exec", ns, "sh", "-c", script])
            .output(),
    }
    .expect("sh");
    assert!(out.status.success(), "{}", describe(&out));
    text(&out.stdout)
}

fn assert_same_host(before: &[(String, Value)], after: &[(String, Value)]) {
    for ((what, a), (_, b)) in before.iter().zip(after) {
        assert_eq!(a, b, "`{what}` changed:\nbefore: {a}\nafter: {b}");
    }
}

fn list_json() -> Vec<Value> {
    let out = quiver_ok(&["cluster", "list", "--format", "json"]);
    match serde_json::from_slice(&out.stdout) {
        Ok(Value::Array(v)) => v,
        other => panic!("list --format json is not an array: {other:?}"),
    }
}

fn find_cluster(name: &str) -> Option<Value> {
    list_json().into_iter().find(|c| c["name"] == name)
}

#[test]
fn up_and_down_leave_the_host_as_found() {
    require_root!();
    let _one = serial();
    let before = host_snapshot();
    let name = unique("host");
    {
        let _down = Down(name.clone());
        let up = quiver_ok(&[
            "cluster", "up", &name, "--nodes", "3", "--link", "1gbit", "--loss", "2%", "--mtu",
            "9000",
        ]);
        assert!(
            text(&up.stdout).contains(&format!("{name}-n2")),
            "{}",
            describe(&up)
        );
        let c = find_cluster(&name).expect("the cluster is listed");
        assert_eq!(c["complete"], true, "{c}");
        assert_eq!(c["link"], "1gbit");
        assert_eq!(c["loss"], 0.02);
        assert_eq!(c["mtu"], 9000);
        // Frames are paced by a peak bucket of about one frame, the rate by a bucket
        // that also covers 250 µs of link time.
        let minburst = c["tbf"]["minburst"].as_u64().expect("tbf minburst");
        assert!(
            (9014..=9014 + 6250 + 64).contains(&minburst),
            "minburst {minburst}"
        );
        let burst = c["tbf"]["burst"].as_u64().expect("tbf burst");
        assert!((9014..=9014 + 31250 + 64).contains(&burst), "burst {burst}");
        assert_eq!(c["tbf"]["peakrate_bps"], 1_050_000_000u64);
        assert_eq!(namespaces_of(&name).len(), 4);
        // Both ends of every link are shaped; the loss rule is in the switch.
        let tc = Command::new("tc")
            .args(["-n", &format!("qv-{name}-sw"), "qdisc", "show"])
            .output()
            .expect("tc");
        assert_eq!(
            text(&tc.stdout).matches("tbf").count(),
            3,
            "{}",
            text(&tc.stdout)
        );
        let tc = Command::new("tc")
            .args([
                "-n",
                &format!("qv-{name}-n1"),
                "qdisc",
                "show",
                "dev",
                "qv0",
            ])
            .output()
            .expect("tc");
        assert!(text(&tc.stdout).contains("tbf"), "{}", text(&tc.stdout));
        // The switch does not run frames through the host's firewall.
        let nf = bridge_netfilter(Some(&format!("qv-{name}-sw")));
        assert!(
            nf.lines().all(|l| l.ends_with("=0")),
            "bridge netfilter in the switch: {nf}"
        );
        quiver_ok(&["cluster", "down", &name]);
        assert!(namespaces_of(&name).is_empty());
    }
    // The kernel tears namespaces down in the background; give it a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let after = host_snapshot();
        if after == before || Instant::now() > deadline {
            assert_same_host(&before, &after);
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn list_second_up_and_down_after_a_lost_state_file() {
    require_root!();
    let _one = serial();
    let name = unique("list");
    let _down = Down(name.clone());
    quiver_ok(&["cluster", "up", &name, "--nodes", "2"]);
    let c = find_cluster(&name).expect("the cluster is listed");
    let nodes = c["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 2, "{c}");
    let subnet = c["subnet"].as_str().expect("subnet");
    let base = subnet.strip_suffix(".0/24").expect("a /24");
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(node["node"], format!("{name}-n{i}"));
        assert_eq!(node["namespace"], format!("qv-{name}-n{i}"));
        assert_eq!(node["interface"], "qv0");
        assert_eq!(node["mac"], format!("02:71:76:00:00:{i:02x}"));
        assert_eq!(node["ip"], format!("{base}.{}", i + 1));
    }
    assert_eq!(c["link"], "unlimited");
    assert_eq!(c["tbf"], Value::Null);
    let text_list = quiver_ok(&["cluster", "list"]);
    assert!(text(&text_list.stdout).contains("02:71:76:00:00:01"));

    // A second `up` of the same name fails and says what to do.
    let again = quiver(&["cluster", "up", &name, "--nodes", "2"]);
    assert_eq!(again.status.code(), Some(1), "{}", describe(&again));
    let err = text(&again.stderr);
    assert!(err.contains("exists") && err.contains("down"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // Without its state file the cluster is still listed (incomplete) and removed.
    std::fs::remove_file(format!("/run/quiver/clusters/{name}.json")).expect("state file");
    let c = find_cluster(&name).expect("still listed");
    assert_eq!(c["complete"], false);
    assert_eq!(c["link"], Value::Null);
    assert_eq!(c["nodes"].as_array().map(Vec::len), Some(2));
    quiver_ok(&["cluster", "down", &name]);
    assert!(namespaces_of(&name).is_empty());
    assert!(find_cluster(&name).is_none());
    let gone = quiver(&["cluster", "down", &name]);
    assert_eq!(gone.status.code(), Some(1), "{}", describe(&gone));
    assert!(text(&gone.stderr).contains(&format!("no cluster {name}")));
}

#[test]
fn invalid_arguments_are_refused_before_anything_is_built() {
    require_root!();
    let _one = serial();
    for args in [
        &["cluster", "up", "Bad_Name", "--nodes", "2"][..],
        &["cluster", "up", "x", "--nodes", "0"],
        &["cluster", "up", "x", "--nodes", "2", "--loss", "100%"],
        &["cluster", "up", "x", "--nodes", "2", "--link", "fast"],
        &["cluster", "up", "x", "--nodes", "2", "--mtu", "70000"],
    ] {
        let out = quiver(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
    }
    assert!(namespaces_of("x").is_empty());
}

/// A copy of the `quiver` binary that user `nobody` can execute, in a new directory of
/// /tmp (not `TMPDIR`, which may itself be private): the build's own may lie under a
/// directory other users cannot enter (a clone in `/root`, or under `mktemp -d`).
/// Removed when dropped.
struct ReachableCopy(PathBuf);

impl ReachableCopy {
    fn new() -> ReachableCopy {
        use std::os::unix::fs::PermissionsExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = PathBuf::from(format!(
            "/tmp/quiver-as-nobody-{}-{nanos}",
            std::process::id()
        ));
        // A new directory: one that exists (or a link planted there) is refused.
        std::fs::create_dir(&dir).expect("a new directory in /tmp");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let bin = dir.join("quiver");
        std::fs::copy(QUIVER, &bin).expect("copy the quiver binary");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ReachableCopy(dir)
    }

    fn binary(&self) -> PathBuf {
        self.0.join("quiver")
    }
}

impl Drop for ReachableCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether user `nobody` can execute `copy` at all (/tmp may be mounted `noexec`).
fn quiver_unprivileged_runs(copy: &ReachableCopy) -> Result<(), String> {
    match unprivileged(copy, &["--version"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "user nobody cannot run a copy of quiver in /tmp: {}",
            describe(&out)
        )),
        Err(e) => Err(format!(
            "user nobody cannot run a copy of quiver in /tmp ({e}): is /tmp noexec?"
        )),
    }
}

/// `quiver ARGS` as user `nobody`, without any capability, from `copy`.
fn quiver_unprivileged(copy: &ReachableCopy, args: &[&str]) -> Output {
    run(unprivileged(copy, args))
}

/// The command `quiver ARGS` of `copy`, to run as user `nobody` without any capability.
fn unprivileged(copy: &ReachableCopy, args: &[&str]) -> Command {
    let mut cmd = command(copy.binary());
    cmd.current_dir("/").args(args);
    // SAFETY: between fork and exec the hook makes only async-signal-safe system calls
    // (setgroups, setgid, setuid) on constants.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn without_root_one_line_says_so() {
    require_root!();
    let _one = serial();
    let name = unique("user");
    let _down = Down(name.clone());
    let copy = ReachableCopy::new();
    if let Err(why) = quiver_unprivileged_runs(&copy) {
        return common::cannot_run(&why);
    }
    for args in [
        &["cluster", "up", &name, "--nodes", "2"][..],
        &["cluster", "down", &name],
        &["cluster", "list"],
        &["run", "--cluster", &name, "-n", "2", "--", "true"],
    ] {
        let out = quiver_unprivileged(&copy, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", describe(&out));
        let err = text(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("need root"), "{args:?}: {err}");
    }
    assert!(namespaces_of(&name).is_empty());
}

#[test]
fn a_failing_step_removes_what_was_built() {
    require_root!();
    let _one = serial();
    let name = unique("fail");
    let _down = Down(name.clone());
    // A `tc` that fails: found first in PATH, so the build fails at the shaping step,
    // after every namespace, device and address exists.
    let bin = std::env::temp_dir().join(format!("quiver-cluster-test-{}", std::process::id()));
    std::fs::create_dir_all(&bin).expect("temp dir");
    let tc = bin.join("tc");
    std::fs::write(
        &tc,
        "#!/bin/sh\necho 'RTNETLINK answers: simulated failure' >&2\nexit 2\n",
    )
    .expect("fake tc");
    std::fs::set_permissions(&tc, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = command(QUIVER);
    cmd.args(["cluster", "up", &name, "--nodes", "3", "--link", "1gbit"])
        .env("PATH", path);
    let out = run(cmd);
    let _ = std::fs::remove_dir_all(&bin);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = text(&out.stderr);
    assert!(err.contains("simulated failure"), "{err}");
    assert!(err.contains("removed what was built"), "{err}");
    assert!(
        namespaces_of(&name).is_empty(),
        "{:?}",
        namespaces_of(&name)
    );
    assert!(find_cluster(&name).is_none());
}

/// Starts `up` of a large cluster and waits until its first namespace exists.
fn start_slow_up(name: &str) -> Child {
    let mut cmd = command(QUIVER);
    cmd.args([
        "cluster", "up", name, "--nodes", "60", "--link", "100mbit", "--loss", "1%",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .process_group(0);
    let child = cmd.spawn().expect("start quiver cluster up");
    let deadline = Instant::now() + Duration::from_secs(60);
    while namespaces_of(name).is_empty() {
        assert!(Instant::now() < deadline, "up created nothing within 60 s");
        thread::sleep(Duration::from_millis(5));
    }
    child
}

fn wait(child: Child) -> (ExitStatus, String) {
    let out = child.wait_with_output().expect("wait");
    (out.status, text(&out.stderr))
}

#[test]
fn down_after_up_was_killed_half_way() {
    require_root!();
    let _one = serial();
    let name = unique("kill");
    let _down = Down(name.clone());
    let child = start_slow_up(&name);
    kill_group(&child, libc::SIGKILL);
    let _ = wait(child);
    assert!(
        !namespaces_of(&name).is_empty(),
        "nothing was left to clean up"
    );
    let out = quiver_ok(&["cluster", "down", &name]);
    assert!(text(&out.stdout).contains("removed"), "{}", describe(&out));
    assert!(
        namespaces_of(&name).is_empty(),
        "{:?}",
        namespaces_of(&name)
    );
}

#[test]
fn interrupted_up_removes_what_it_built() {
    require_root!();
    let _one = serial();
    let name = unique("int");
    let _down = Down(name.clone());
    let child = start_slow_up(&name);
    kill_group(&child, libc::SIGINT);
    let (status, stderr) = wait(child);
    // The signal may land after the last step: then the cluster is complete.
    if status.success() {
        quiver_ok(&["cluster", "down", &name]);
    } else {
        assert_eq!(status.code(), Some(130), "{stderr}");
        assert!(stderr.contains("interrupted"), "{stderr}");
    }
    assert!(
        namespaces_of(&name).is_empty(),
        "{:?}",
        namespaces_of(&name)
    );
}

#[test]
fn ranks_are_placed_on_the_nodes() {
    require_root!();
    let _one = serial();
    let name = unique("place");
    let _down = Down(name.clone());
    quiver_ok(&["cluster", "up", &name, "--nodes", "2"]);
    let out = quiver_ok(&[
        "run",
        "--cluster",
        &name,
        "-n",
        "3",
        "--ppn",
        "2",
        "--",
        "sh",
        "-c",
        "echo r=$QUIVER_RANK node=$QUIVER_NODE addr=$QUIVER_ADDR lr=$QUIVER_LOCAL_RANK \
         ls=$QUIVER_LOCAL_SIZE cluster=$QUIVER_CLUSTER \
         iface=$(grep -c qv0: /proc/self/net/dev) rv=$QUIVER_RENDEZVOUS",
    ]);
    let stdout = text(&out.stdout);
    let c = find_cluster(&name).expect("listed");
    let ip = |i: usize| c["nodes"][i]["ip"].as_str().expect("ip").to_string();
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (rank, node, local, size) in [(0, 0, 0, 2), (1, 0, 1, 2), (2, 1, 0, 1)] {
        let want = format!(
            "[{rank}] r={rank} node={name}-n{node} addr={} lr={local} ls={size} cluster={name} iface=1 rv=file://",
            ip(node)
        );
        assert!(
            lines[rank].starts_with(&want),
            "{:?} != {want:?}",
            lines[rank]
        );
    }
    // The private store is gone once the job has ended.
    let rv = lines[0].split("rv=file://").nth(1).expect("store");
    assert!(!std::path::Path::new(rv).exists(), "{rv} left behind");

    let too_many = quiver(&[
        "run",
        "--cluster",
        &name,
        "-n",
        "3",
        "--ppn",
        "1",
        "--",
        "true",
    ]);
    assert_eq!(too_many.status.code(), Some(2), "{}", describe(&too_many));
    assert!(text(&too_many.stderr).contains("do not fit"));
    let missing = quiver(&["run", "--cluster", &unique("none"), "-n", "2", "--", "true"]);
    assert_eq!(missing.status.code(), Some(1), "{}", describe(&missing));
    assert!(text(&missing.stderr).contains("no cluster"));
}

/// Runs `quiver check` (all-to-all, so that ranks talk across nodes too) as 2 ranks per
/// node on `nodes` nodes, every byte checked, nothing lost or duplicated; checks that it
/// used the transports `expect` (e.g. "shm+eth") and that the job's shared-memory
/// segments are gone afterwards. `env` adds variables (QUIVER_TRANSPORT,
/// QUIVER_RELIABILITY).
fn check_job(name: &str, nodes: u32, env: &[(&str, &str)], expect: &str) {
    let ranks = (2 * nodes).to_string();
    // Fewer and smaller messages as the job grows: every rank talks to every other.
    let sizes = if nodes > 2 {
        "0,1,8,1K,4K,64K"
    } else {
        "0,1,8,1K,4K,64K,1M"
    };
    let script =
        format!("echo job=$QUIVER_JOB_ID; exec \"$0\" check --pattern all-to-all --sizes {sizes}");
    let mut cmd = command(QUIVER);
    cmd.args([
        "run",
        "--cluster",
        name,
        "-n",
        &ranks,
        "--ppn",
        "2",
        "--timeout",
        "240",
        "--",
        "sh",
        "-c",
        &script,
        QUIVER,
    ]);
    cmd.envs(env.iter().copied());
    let out = run(cmd);
    assert!(
        out.status.success(),
        "check with {env:?}: {}",
        describe(&out)
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("verified"), "{}", describe(&out));
    assert!(
        stdout.contains(&format!("transport {expect},")),
        "expected transport {expect}: {}",
        describe(&out)
    );
    let job: u32 = stdout
        .split("job=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no job id in {stdout}"));
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let prefix = format!("quiver-{uid}-{job:08x}-");
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "shared memory left behind: {left:?}");
}

#[test]
fn check_passes_across_two_nodes() {
    require_root!();
    let _one = serial();
    let name = unique("check");
    let _down = Down(name.clone());
    quiver_ok(&["cluster", "up", &name, "--nodes", "2", "--link", "1gbit"]);
    // Between nodes of an emulated cluster, auto picks raw Ethernet.
    check_job(&name, 2, &[], "shm+eth");
    check_job(&name, 2, &[("QUIVER_TRANSPORT", "eth")], "shm+eth");
    check_job(&name, 2, &[("QUIVER_TRANSPORT", "udp")], "udp");
}

#[test]
fn check_passes_across_four_nodes() {
    require_root!();
    let _one = serial();
    let name = unique("four");
    let _down = Down(name.clone());
    quiver_ok(&["cluster", "up", &name, "--nodes", "4"]);
    check_job(&name, 4, &[], "shm+eth");
    check_job(&name, 4, &[("QUIVER_TRANSPORT", "udp")], "udp");
}

#[test]
fn check_passes_over_a_lossy_switch() {
    require_root!();
    let _one = serial();
    let name = unique("loss");
    let _down = Down(name.clone());
    quiver_ok(&[
        "cluster", "up", &name, "--nodes", "2", "--link", "1gbit", "--loss", "1%",
    ]);
    for reliability in ["host", "offload"] {
        let r = ("QUIVER_RELIABILITY", reliability);
        check_job(&name, 2, &[r], "shm+eth");
        check_job(&name, 2, &[r, ("QUIVER_TRANSPORT", "udp")], "udp");
    }
}

/// Issue 31's all-to-all, sized for CI: 4 nodes, one rank each, whose switch drops 5 % of
/// the frames (nftables), moving 134 MB of all-to-all traffic (`quiver check
/// --count 10`) over raw Ethernet and over UDP, with the process retransmitting and with
/// the offload engine, every byte verified. (The full-sized run, `--count 80`, 1.1 GB,
/// is recorded in docs/PERFORMANCE.md.)
#[test]
fn all_to_all_on_4_nodes_with_5_percent_loss() {
    require_root!();
    let _one = serial();
    let name = unique("a2a");
    let _down = Down(name.clone());
    quiver_ok(&["cluster", "up", &name, "--nodes", "4", "--loss", "5%"]);
    for reliability in ["host", "offload"] {
        for transport in ["eth", "udp"] {
            let mut cmd = command(QUIVER);
            cmd.args([
                "run",
                "--cluster",
                &name,
                "-n",
                "4",
                "--timeout",
                "240",
                "--",
            ])
            .arg(QUIVER)
            .args(["check", "--pattern", "all-to-all", "--count", "10"])
            .args(["--transport", transport])
            .env("QUIVER_RELIABILITY", reliability);
            let out = run(cmd);
            let stdout = text(&out.stdout);
            assert!(
                out.status.success()
                    && stdout.contains(&format!(
                        "4 ranks, pattern all-to-all, transport {transport}, 1200 messages \
                         (134.2 MB) verified"
                    )),
                "{reliability} over {transport}: {}",
                describe(&out)
            );
        }
    }
}

#[test]
fn bench_pingpong_between_two_nodes() {
    require_root!();
    let _one = serial();
    let name = unique("bench");
    let _down = Down(name.clone());
    quiver_ok(&["cluster", "up", &name, "--nodes", "2", "--link", "1gbit"]);
    let out = quiver_ok(&[
        "bench",
        "pingpong",
        "--cluster",
        &name,
        "--sizes",
        "0,1K",
        "--iters",
        "200",
        "--warmup",
        "20",
        "--format",
        "json",
        "--timeout",
        "120",
        "--no-pin",
    ]);
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    assert_eq!(lines.len(), 2, "{}", describe(&out));
    for v in &lines {
        let lat = v["latency_us_median"].as_f64().unwrap_or(0.0);
        assert!(lat > 0.0, "{v}");
    }
}
