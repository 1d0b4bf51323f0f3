//! Jobs started the way HPC users start them, with no `QUIVER_*` variable at all: Open
//! MPI's `mpirun` (PMIx), MPICH's Hydra `mpiexec` (PMI-2, PMI-1, and PMI-1 over a port)
//! and Slurm's `srun --mpi=pmix` and `--mpi=pmi2`, on a single-node Slurm the test starts
//! itself (munged, slurmctld and slurmd in a directory of their own, on free ports).
//! Each runs a ping-pong and `quiver check`, and checks which service the ranks met
//! through. A launcher that is not installed (or Slurm without root) skips its test with
//! one line saying why, except under `.ci/run`, which installs them all.

mod common;

use common::jobs::{command, run_limited, serial, summary, Finished};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const QUIVER: &str = env!("CARGO_BIN_EXE_quiver");

/// Deadline of one job; generous for a loaded two-core machine.
const LIMIT: Duration = Duration::from_secs(180);

/// The first of `names` on the PATH (or in /usr/sbin, where Debian puts daemons).
fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/usr/bin", "/sbin"].map(PathBuf::from));
    names
        .iter()
        .find_map(|n| dirs.iter().map(|d| d.join(n)).find(|p| p.is_file()))
}

fn version_text(program: &Path, arg: &str) -> String {
    Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        })
        .unwrap_or_default()
}

/// Runs `cmd` (a launcher with its arguments, then `quiver ARGS`); expects success.
fn launch(mut cmd: Command, args: &[&str]) -> Finished {
    let _one = serial();
    cmd.arg(QUIVER).args(args);
    let what = format!("{cmd:?}");
    let done = run_limited(cmd, LIMIT);
    assert!(done.status.success(), "{what} failed\n{}", done.describe());
    done
}

/// The line under `quiver check`'s summary that says how the ranks met.
fn met_through(done: &Finished) -> String {
    summary(done);
    done.stdout
        .lines()
        .find(|l| l.contains("the ranks met through"))
        .unwrap_or_else(|| panic!("no line says how the ranks met\n{}", done.describe()))
        .to_string()
}

/// A ping-pong of 0 B to 1 KiB and a check of every pair; both must say the ranks met
/// through `service`.
fn pingpong_and_check(launcher: impl Fn() -> Command, service: &str, n: u32) {
    let done = launch(
        launcher(),
        &[
            "bench", "pingpong", "--sizes", "0,8,1K", "--iters", "200", "--format", "json",
        ],
    );
    let sizes: Vec<u64> = done
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
            let median = v["latency_us_median"].as_f64().expect("latency_us_median");
            assert!(median > 0.0 && median.is_finite(), "{v}");
            v["size"].as_u64().expect("size")
        })
        .collect();
    assert_eq!(sizes, [0, 8, 1024], "{}", done.describe());
    let done = launch(launcher(), &["check", "--pattern", "all-to-all"]);
    let line = summary(&done);
    assert!(
        line.starts_with(&format!("quiver check: {n} ranks, pattern all-to-all")),
        "{line}"
    );
    let met = met_through(&done);
    assert!(met.contains(service), "expected {service}: {met}");
}

// ---------------------------------------------------------------------------------------
// Open MPI (PMIx)
// ---------------------------------------------------------------------------------------

/// Open MPI's `mpirun`, or why it cannot be used.
fn open_mpi() -> Result<PathBuf, String> {
    let mpirun = find(&["mpirun.openmpi", "mpirun"])
        .ok_or("Open MPI's mpirun is not installed (install openmpi-bin)")?;
    let text = version_text(&mpirun, "--version");
    if !text.contains("Open MPI") && !text.contains("OpenRTE") {
        return Err(format!("{} is not Open MPI's", mpirun.display()));
    }
    Ok(mpirun)
}

fn mpirun(mpirun: &Path, n: u32) -> Command {
    let mut cmd = command(mpirun);
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &n.to_string(),
    ]);
    cmd
}

#[test]
fn mpirun_without_configuration_meets_through_pmix() {
    let mpi = match open_mpi() {
        Ok(p) => p,
        Err(why) => return common::cannot_run(&why),
    };
    pingpong_and_check(|| mpirun(&mpi, 2), "PMIx", 2);
    // Four ranks too: every rank learns the store from rank 0 after one fence.
    let done = launch(mpirun(&mpi, 4), &["check", "--pattern", "all-to-all"]);
    assert!(met_through(&done).contains("PMIx"), "{}", done.describe());
    // `quiver info` says what a program started there would use.
    let done = launch(mpirun(&mpi, 1), &["info"]);
    let line = done
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("bootstrap"))
        .unwrap_or_else(|| panic!("no bootstrap row\n{}", done.describe()));
    assert!(
        line.contains("PMIx (libpmix.so.2)") && line.contains("Open MPI (mpirun), rank 0 of 1"),
        "{line}"
    );
    // Without the PMIx library, an error says what to install.
    let _one = serial();
    let mut cmd = mpirun(&mpi, 2);
    cmd.args(["-x", "QUIVER_PMIX_LIB=libpmix-absent.so.9", QUIVER, "check"]);
    let done = run_limited(cmd, LIMIT);
    assert!(!done.status.success(), "{}", done.describe());
    assert!(
        done.stderr.contains("libpmix-absent.so.9") && done.stderr.contains("libpmix2"),
        "{}",
        done.describe()
    );
}

#[test]
fn quiver_rendezvous_overrides_the_launchers_service() {
    let mpi = match open_mpi() {
        Ok(p) => p,
        Err(why) => return common::cannot_run(&why),
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut cmd = mpirun(&mpi, 2);
    cmd.arg("-x")
        .arg(format!("QUIVER_RENDEZVOUS=tcp://127.0.0.1:{port}"));
    let done = launch(cmd, &["check"]);
    let met = met_through(&done);
    assert!(
        met.contains("(QUIVER_RENDEZVOUS)") && !met.contains("PMIx"),
        "{met}"
    );
}

// ---------------------------------------------------------------------------------------
// MPICH's Hydra (PMI-2, PMI-1)
// ---------------------------------------------------------------------------------------

fn hydra() -> Result<PathBuf, String> {
    let mpiexec =
        find(&["mpiexec.hydra"]).ok_or("MPICH's mpiexec.hydra is not installed (install mpich)")?;
    if !version_text(&mpiexec, "--version").contains("HYDRA") {
        return Err(format!("{} is not Hydra", mpiexec.display()));
    }
    Ok(mpiexec)
}

fn mpiexec(hydra: &Path, n: u32, extra: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = command(hydra);
    cmd.args(extra).args(["-n", &n.to_string()]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

#[test]
fn mpiexec_hydra_without_configuration_meets_through_pmi() {
    let hydra = match hydra() {
        Ok(p) => p,
        Err(why) => return common::cannot_run(&why),
    };
    pingpong_and_check(|| mpiexec(&hydra, 2, &[], &[]), "PMI-2 over descriptor", 2);
    // PMI-1 when asked, and over the port of `-pmi-port` (no rank in the environment:
    // the server says it).
    let pmi1 = [("QUIVER_BOOTSTRAP", "pmi1")];
    pingpong_and_check(
        || mpiexec(&hydra, 2, &[], &pmi1),
        "PMI-1 over descriptor",
        2,
    );
    let done = launch(mpiexec(&hydra, 3, &["-pmi-port"], &[]), &["check"]);
    assert!(
        met_through(&done).contains("(PMI_PORT)"),
        "{}",
        done.describe()
    );
}

// ---------------------------------------------------------------------------------------
// Slurm (PMIx, PMI-2)
// ---------------------------------------------------------------------------------------

/// A single-node Slurm of the test's own (`tests/slurm-single-node.sh`: munged,
/// slurmctld and slurmd in a directory of their own, on free ports), stopped and removed
/// when dropped.
struct Slurm {
    dir: PathBuf,
    conf: PathBuf,
}

impl Slurm {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/slurm-single-node.sh")
    }

    fn start() -> Result<Slurm, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("starting a Slurm of the test's own needs root".into());
        }
        let dir = std::env::temp_dir().join(format!(
            "quiver-slurm-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        let out = Command::new(Self::script())
            .arg("start")
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", Self::script().display()))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        let conf = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(Slurm { dir, conf })
    }

    fn srun(&self, n: u32, mpi: &str) -> Command {
        let mut cmd = command("srun");
        cmd.env("SLURM_CONF", &self.conf)
            .args(["-n", &n.to_string(), &format!("--mpi={mpi}")]);
        cmd
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = Command::new(Self::script())
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .status();
    }
}

#[test]
fn srun_without_configuration_meets_through_pmix_and_pmi2() {
    let slurm = match Slurm::start() {
        Ok(s) => s,
        Err(why) => return common::cannot_run(&format!("no Slurm for the test: {why}")),
    };
    pingpong_and_check(|| slurm.srun(2, "pmix"), "PMIx", 2);
    pingpong_and_check(|| slurm.srun(2, "pmi2"), "PMI-2 over descriptor", 2);
    // Without a key-value service the error says how to get one.
    let _one = serial();
    let mut cmd = slurm.srun(2, "none");
    cmd.arg(QUIVER).arg("check");
    let done = run_limited(cmd, LIMIT);
    assert!(!done.status.success(), "{}", done.describe());
    assert!(done.stderr.contains("--mpi=pmix"), "{}", done.describe());
}
