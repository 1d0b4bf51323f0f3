//! Running whole jobs from a test: commands under a deadline after which their
//! whole process group is killed (a hung job fails the test instead of hanging CI), with
//! an environment cleaned of the test's own job and launcher variables, one job at a time.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// One job at a time: several ranks per job already fill a small machine.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Prefixes of the test's own environment variables that would change what a job does
/// (its configuration, or a launcher's variables that would make it think it is a rank).
pub const CLEAN_PREFIXES: [&str; 6] = ["QUIVER_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCAL"];

/// A command whose environment holds none of [`CLEAN_PREFIXES`]' variables.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if CLEAN_PREFIXES.iter().any(|p| text.starts_with(p)) {
            cmd.env_remove(&name);
        }
    }
    cmd
}

/// What a finished command left.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn describe(&self) -> String {
        format!(
            "status {}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

pub fn reader(mut src: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = src.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Kills the process group of `child` (it leads one of its own).
pub fn kill_group(child: &Child) {
    // SAFETY: kill has no memory-safety preconditions; the group is ours.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
}

/// Runs `cmd` in a process group of its own with its output captured; past `limit` the
/// group is killed and the test fails with what the command printed.
pub fn run_limited(mut cmd: Command, limit: Duration) -> Finished {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let out = reader(child.stdout.take().expect("piped stdout"));
    let err = reader(child.stderr.take().expect("piped stderr"));
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the command") {
            break status;
        }
        if start.elapsed() > limit {
            timed_out = true;
            kill_group(&child);
            break child.wait().expect("wait for the killed command");
        }
        thread::sleep(Duration::from_millis(20));
    };
    // Whatever the command left behind in its group must not hold the pipes open.
    kill_group(&child);
    let finished = Finished {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    };
    assert!(
        !timed_out,
        "{what} still ran after {limit:?} and was killed\n{}",
        finished.describe()
    );
    finished
}

/// The one summary line of a successful check (printed by rank 0 only).
pub fn summary(done: &Finished) -> String {
    let lines: Vec<&str> = done
        .stdout
        .lines()
        .filter(|l| l.contains("quiver check:"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one summary line\n{}",
        done.describe()
    );
    assert!(lines[0].ends_with("verified"), "{}", done.describe());
    lines[0].to_string()
}
