//! `quiver run`: the launcher, end to end (through `sh`).
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Generous bound for "quickly" on a slow, loaded machine (jobs that would run 30 s).
const QUICK: Duration = Duration::from_secs(20);

fn quiver(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot start quiver");
    (out, start.elapsed())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Value of `key=` in a line of `key=value` words.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

#[test]
fn prefixed_output_and_environment() {
    let (out, _) = quiver(&[
        "run",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo r=$QUIVER_RANK s=$QUIVER_SIZE lr=$QUIVER_LOCAL_RANK ls=$QUIVER_LOCAL_SIZE \
         id=$QUIVER_JOB_ID tok=$QUIVER_JOB_TOKEN rv=$QUIVER_RENDEZVOUS",
    ]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}, stderr: {}",
        out.status,
        text(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "stdout: {stdout:?}");
    let mut ranks = Vec::new();
    for line in &lines {
        let rest = line.strip_prefix('[').expect("prefix");
        let (rank, rest) = rest.split_once("] ").expect("prefix");
        assert!(rest.starts_with("r="), "line {line:?}");
        assert_eq!(field(line, "r"), rank, "line {line:?}");
        assert_eq!(field(line, "lr"), rank, "line {line:?}");
        assert_eq!(field(line, "s"), "3");
        assert_eq!(field(line, "ls"), "3");
        ranks.push(rank.parse::<u32>().expect("rank"));
    }
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2]);

    let id = field(lines[0], "id");
    assert!(id.parse::<u32>().expect("job id") != 0);
    let token = field(lines[0], "tok");
    assert_eq!(token.len(), 16, "token {token:?}");
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "token {token:?}"
    );
    let rv = field(lines[0], "rv");
    let port = rv
        .strip_prefix("tcp://127.0.0.1:")
        .expect("rendezvous address");
    assert!(port.parse::<u16>().expect("port") != 0);
    for line in &lines[1..] {
        assert_eq!(field(line, "id"), id);
        assert_eq!(field(line, "tok"), token);
        assert_eq!(field(line, "rv"), rv);
    }
}

#[test]
fn no_prefix_copies_bytes_unchanged() {
    let (out, _) = quiver(&[
        "run",
        "--no-prefix",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "echo hello $QUIVER_RANK",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["hello 0", "hello 1"]);
}

#[test]
fn stderr_is_prefixed_too() {
    let (out, _) = quiver(&[
        "run",
        "-n",
        "2",
        "sh",
        "-c",
        "echo oops $QUIVER_RANK >&2; printf partial",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let mut lines: Vec<&str> = stderr.lines().filter(|l| l.contains("oops")).collect();
    lines.sort_unstable();
    assert_eq!(lines, ["[0] oops 0", "[1] oops 1"], "stderr: {stderr:?}");
    // A last line without newline is completed.
    let stdout = text(&out.stdout);
    assert!(stdout.ends_with('\n'), "stdout: {stdout:?}");
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["[0] partial", "[1] partial"]);
}

#[test]
fn failing_rank_terminates_the_job() {
    let (out, elapsed) = quiver(&[
        "run",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "if [ \"$QUIVER_RANK\" = 1 ]; then exit 3; fi; sleep 30",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    assert!(elapsed < QUICK, "took {elapsed:?}");
    assert!(
        stderr.contains("quiver run: rank 1 exited with status 3"),
        "stderr: {stderr}"
    );
    assert_eq!(
        stderr.matches("quiver run: rank").count(),
        1,
        "stderr: {stderr}"
    );
}

#[test]
fn keep_going_lets_the_other_ranks_finish() {
    let (out, elapsed) = quiver(&[
        "run",
        "-n",
        "3",
        "--keep-going",
        "--",
        "sh",
        "-c",
        "if [ \"$QUIVER_RANK\" = 1 ]; then kill -9 $$; fi; sleep 1; echo survived",
    ]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    // The job's status is still the failure's, but nobody was terminated for it.
    assert_eq!(out.status.code(), Some(137), "stderr: {stderr}");
    assert!(
        stdout.contains("[0] survived") && stdout.contains("[2] survived"),
        "stdout: {stdout}"
    );
    assert!(!stdout.contains("[1] survived"), "stdout: {stdout}");
    assert!(
        stderr.contains("quiver run: rank 1 was killed by signal SIGKILL"),
        "stderr: {stderr}"
    );
    assert!(elapsed < QUICK, "took {elapsed:?}");
}

#[test]
fn rank_killed_by_signal() {
    let (out, elapsed) = quiver(&["run", "-n", "1", "--", "sh", "-c", "kill -9 $$"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "stderr: {stderr}");
    assert!(elapsed < QUICK, "took {elapsed:?}");
    assert!(
        stderr.contains("quiver run: rank 0 was killed by signal SIGKILL"),
        "stderr: {stderr}"
    );

    let (out, elapsed) = quiver(&[
        "run",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "if [ \"$QUIVER_RANK\" = 1 ]; then kill -9 $$; fi; sleep 30",
    ]);
    assert_eq!(
        out.status.code(),
        Some(137),
        "stderr: {}",
        text(&out.stderr)
    );
    assert!(elapsed < QUICK, "took {elapsed:?}");
}

#[test]
fn timeout_terminates_the_job() {
    let (out, elapsed) = quiver(&["run", "-n", "2", "--timeout", "0.5", "--", "sleep", "30"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "stderr: {stderr}");
    assert!(elapsed < QUICK, "took {elapsed:?}");
    assert!(
        stderr.contains("quiver run: timeout after 0.5 s; terminating all ranks"),
        "stderr: {stderr}"
    );
}

#[test]
fn missing_program() {
    for program in [
        "quiver-no-such-program-xyz",
        "/nonexistent/quiver-no-such-program-xyz",
    ] {
        let (out, _) = quiver(&["run", "-n", "2", "--", program, "arg"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(127), "stderr: {stderr}");
        assert!(stderr.contains(program), "stderr: {stderr}");
    }
    // Not executable.
    let (out, _) = quiver(&["run", "-n", "1", "--", "/"]);
    assert_eq!(
        out.status.code(),
        Some(127),
        "stderr: {}",
        text(&out.stderr)
    );
}

#[test]
fn all_ranks_succeed() {
    let (out, _) = quiver(&["run", "-n", "4", "true"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(out.stdout.is_empty());
}

#[test]
fn invalid_arguments() {
    let (out, _) = quiver(&["run", "-n", "0", "true"]);
    assert!(!out.status.success());
    let (out, _) = quiver(&["run", "-n", "1"]);
    assert!(!out.status.success());
    let (out, _) = quiver(&["run", "-n", "1", "--timeout", "-1", "true"]);
    assert_eq!(out.status.code(), Some(2), "stderr: {}", text(&out.stderr));
}

#[test]
fn hyphen_arguments_go_to_the_program() {
    let (out, _) = quiver(&[
        "run",
        "-n",
        "1",
        "--no-prefix",
        "sh",
        "-c",
        "printf '%s|' \"$@\"",
        "sh",
        "-n",
        "--x",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "-n|--x|");
}

#[test]
fn leftover_background_process_does_not_hold_the_launcher() {
    let (out, elapsed) = quiver(&[
        "run",
        "-n",
        "1",
        "--",
        "sh",
        "-c",
        "sleep 30 & echo started",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "[0] started\n");
    assert!(elapsed < QUICK, "took {elapsed:?}");
}

#[test]
fn sigterm_to_the_launcher_terminates_the_job() {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["run", "-n", "2", "--", "sh", "-c", "echo ready; sleep 30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start quiver");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    for _ in 0..2 {
        let line = lines.next().expect("a line").expect("readable");
        assert!(line.ends_with("ready"), "line {line:?}");
    }
    // SAFETY: kill has no memory-safety preconditions.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(143));
    assert!(start.elapsed() < QUICK, "took {:?}", start.elapsed());
}

#[test]
fn rendezvous_store_accepts_connections_while_ranks_run() {
    if Command::new("bash")
        .args(["-c", "true"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        common::cannot_run("no bash");
        return;
    }
    let (out, _) = quiver(&[
        "run",
        "-n",
        "2",
        "--",
        "bash",
        "-c",
        "exec 3<>/dev/tcp/127.0.0.1/${QUIVER_RENDEZVOUS##*:} && echo connected",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["[0] connected", "[1] connected"]);
}

/// The CPUs this test may run on, as the kernel lists them (`0-1`, `0,2-3`, ...).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string();
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<usize>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

/// Each rank's `Cpus_allowed_list` under `quiver run -n N ARGS`.
fn rank_cpus(n: usize, args: &[&str]) -> Vec<String> {
    let n_text = n.to_string();
    let script = "grep Cpus_allowed_list /proc/self/status";
    let mut all = vec!["run", "-n", &n_text];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "sh", "-c", script]);
    let (out, _) = quiver(&all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    (0..n)
        .map(|rank| {
            let line = stdout
                .lines()
                .find(|l| l.starts_with(&format!("[{rank}] ")))
                .unwrap_or_else(|| panic!("no line of rank {rank} in {stdout:?}"));
            line.rsplit('\t').next().unwrap().trim().to_string()
        })
        .collect()
}

#[test]
fn pin_puts_each_rank_on_one_cpu_round_robin_by_default_only_when_oversubscribed() {
    let cpus = allowed_cpus();
    let mine = std::fs::read_to_string("/proc/self/status").unwrap();
    let mine = mine
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let round_robin =
        |n: usize| -> Vec<String> { (0..n).map(|r| cpus[r % cpus.len()].to_string()).collect() };
    let over = cpus.len() + 1;
    assert_eq!(rank_cpus(2, &["--pin"]), round_robin(2));
    // More ranks than CPUs: pinned unless told not to.
    assert_eq!(rank_cpus(over, &[]), round_robin(over));
    assert_eq!(rank_cpus(over, &["--no-pin"]), vec![mine.clone(); over]);
    // As many as the CPUs: a rank may run wherever the launcher may.
    assert_eq!(rank_cpus(cpus.len(), &[]), vec![mine; cpus.len()]);
    let (out, _) = quiver(&["run", "-n", "1", "--pin", "--no-pin", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
