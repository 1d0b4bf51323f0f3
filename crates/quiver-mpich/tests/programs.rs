//! MPI programs built against MPICH run on quiver's `libmpi.so.12` unchanged: C programs
//! of our own that check every byte they receive (`tests/c/verify.c`, and
//! `tests/c/rma.c` for one-sided communication; compiled with the MPICH wheel's `mpicc`,
//! run first on MPICH itself so that their checks are known to hold for a real MPI; and
//! `tests/c/abi.c`, compiled with its `mpicc_abi` for the MPI-5 standard ABI, on
//! quiver's `libmpi_abi.so.1`, crates/quiver-mpi-abi),
//! Intel's prebuilt IMB-P2P, IMB-MPI1 and IMB-RMA (from the `impi-rt` wheel), mpi4py's
//! own benchmarks and a script of mpi4py's common calls with every result checked
//! (`tests/python/checks.py`), on 1 to 4 ranks of one node, and between the two nodes
//! of an emulated cluster.
//!
//! The wheels come from PyPI through `bench/mpi-wheels` (into the target directory, once).
//! Without pip, network access to PyPI or root (for the cluster), a test says why in one
//! line and passes; under `.ci/run` (`QUIVER_CI` set) it fails instead. Jobs run one at a
//! time, each under `quiver run --timeout`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Seconds a job may run; generous for a loaded two-core machine.
const LIMIT: &str = "300";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Skips a test this machine cannot run, saying why; fails under `.ci/run`.
fn cannot_run(why: &str) {
    if std::env::var_os("QUIVER_CI").is_some() {
        panic!("{why} (QUIVER_CI is set: .ci/run must run this test)");
    }
    eprintln!("skipped: {why}");
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository")
}

/// This test binary's `<target>/<profile>` directory.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    exe.parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>/deps")
        .to_path_buf()
}

/// A command without the variables that would make a program think it is in a job
/// already, nor cargo's `LD_LIBRARY_PATH` (its `libmpi.so` would shadow the library a
/// job is meant to load).
fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_LIBRARY_PATH").env_remove("PYTHONPATH");
    for (var, _) in std::env::vars_os() {
        let v = var.to_string_lossy();
        if [
            "QUIVER_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "HYDRA_", "PRTE_", "MPI4PY_",
        ]
        .iter()
        .any(|p| v.starts_with(p))
        {
            cmd.env_remove(&var);
        }
    }
    cmd
}

fn describe(out: &Output) -> String {
    format!(
        "status {}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn output(mut cmd: Command) -> Output {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"))
}

/// The launcher, `libmpi.so` and `libmpi_abi.so` of this profile, built (cargo has them
/// up to date when the whole workspace was built; a test run of this package alone builds
/// them here; `cargo test` never builds a cdylib of another package).
fn quiver() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = profile_dir();
        let profile = match dir.file_name().and_then(OsStr::to_str) {
            Some("debug") => "dev".to_string(),
            Some(p) => p.to_string(),
            None => panic!("no profile in {}", dir.display()),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = command(cargo);
        build
            .current_dir(repo())
            .args([
                "build",
                "--profile",
                &profile,
                "-p",
                "quiver-cli",
                "-p",
                "quiver-mpich",
                "-p",
                "quiver-mpi-abi",
            ])
            .arg("--target-dir")
            .arg(dir.parent().expect("<target>"));
        let out = output(build);
        assert!(out.status.success(), "cargo build\n{}", describe(&out));
        dir.join("quiver")
    })
}

/// The wheels' install directories (`bench/mpi-wheels`), or why they cannot be had.
fn wheels() -> Result<&'static [PathBuf; 3], String> {
    static WHEELS: OnceLock<Result<[PathBuf; 3], String>> = OnceLock::new();
    WHEELS
        .get_or_init(|| {
            let target = profile_dir().parent().expect("<target>").to_path_buf();
            let mut cmd = command(repo().join("bench/mpi-wheels"));
            cmd.arg("--target-dir")
                .arg(&target)
                .args(["mpich", "impi_rt", "mpi4py"]);
            let out = output(cmd);
            if !out.status.success() {
                return Err(format!(
                    "bench/mpi-wheels could not install the MPI wheels from PyPI:\n{}",
                    describe(&out)
                ));
            }
            let dirs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(PathBuf::from)
                .collect();
            dirs.try_into()
                .map_err(|d| format!("bench/mpi-wheels printed {d:?}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `program args` as `n` ranks of a job on quiver's MPI (`extra`: more arguments
/// of `quiver run`, placed before `--mpi`).
fn on_quiver(
    extra: &[&str],
    n: u32,
    program: &Path,
    args: &[&str],
    env: &[(&str, &OsStr)],
) -> Output {
    let mut cmd = command(quiver());
    cmd.args(["run", "--timeout", LIMIT, "--no-prefix"])
        .args(extra)
        .args(["--mpi", "-n", &n.to_string(), "--"])
        .arg(program)
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    output(cmd)
}

/// `tests/c/verify.c` built with the MPICH wheel's `mpicc` (once).
fn verify_program(mpich: &Path) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_c(mpich, "verify")).clone()
}

/// `tests/c/rma.c` built with the MPICH wheel's `mpicc` (once).
fn rma_program(mpich: &Path) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_c(mpich, "rma")).clone()
}

/// `tests/c/abi.c` built with the MPICH wheel's `mpicc_abi` (once).
fn abi_program(mpich: &Path) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| build_with(mpich, "mpicc_abi", "abi"))
        .clone()
}

/// `tests/c/NAME.c` built with the MPICH wheel's `mpicc`.
fn build_c(mpich: &Path, name: &str) -> PathBuf {
    build_with(mpich, "mpicc", name)
}

/// `tests/c/NAME.c` built with the MPICH wheel's compiler wrapper `cc`.
fn build_with(mpich: &Path, cc: &str, name: &str) -> PathBuf {
    let exe = profile_dir().join("mpi-tests").join(name);
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    let mut cc = command(mpich.join("bin").join(cc));
    cc.args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(repo().join(format!("crates/quiver-mpich/tests/c/{name}.c")));
    let out = output(cc);
    assert!(out.status.success(), "mpicc\n{}", describe(&out));
    exe
}

/// Runs `program` on 3 ranks of the MPICH wheel's own library and launcher: its checks
/// hold for a real MPI, and it says so with `ok`.
fn passes_on_mpich(mpich: &Path, program: &Path, ok: &str) {
    let mut real = command("timeout");
    real.arg(LIMIT)
        .arg(mpich.join("bin/mpiexec"))
        .args(["-n", "3"])
        .arg(program);
    let out = output(real);
    assert!(
        out.status.success() && stdout(&out).contains(&format!("{ok} (3 ranks, another MPI)")),
        "on MPICH\n{}",
        describe(&out)
    );
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_program_built_with_mpichs_mpicc_checks_every_byte_on_mpich_and_on_quiver() {
    let _one = serial();
    let [mpich, _, _] = match wheels() {
        Ok(w) => w,
        Err(why) => return cannot_run(&why),
    };
    let verify = verify_program(mpich);
    passes_on_mpich(mpich, &verify, "verify: OK");
    for n in 1..=4 {
        let out = on_quiver(&[], n, &verify, &[], &[]);
        assert!(
            out.status.success()
                && stdout(&out).contains(&format!("verify: OK ({n} ranks, quiver)")),
            "{n} ranks on quiver\n{}",
            describe(&out)
        );
        // The one call it makes that quiver does not implement says so, once per rank.
        let said = String::from_utf8_lossy(&out.stderr)
            .matches("MPI_Intercomm_create is not supported")
            .count();
        assert_eq!(said, n as usize, "{}", describe(&out));
    }
}

#[test]
fn one_sided_calls_check_every_byte_on_mpich_and_on_quiver() {
    let _one = serial();
    let [mpich, _, _] = match wheels() {
        Ok(w) => w,
        Err(why) => return cannot_run(&why),
    };
    let rma = rma_program(mpich);
    passes_on_mpich(mpich, &rma, "rma: OK");
    for n in 1..=4 {
        let out = on_quiver(&[], n, &rma, &[], &[]);
        assert!(
            out.status.success() && stdout(&out).contains(&format!("rma: OK ({n} ranks, quiver)")),
            "{n} ranks on quiver\n{}",
            describe(&out)
        );
    }
}

#[test]
fn a_program_of_the_standard_abi_runs_on_mpichs_and_on_quivers_libmpi_abi() {
    let _one = serial();
    let [mpich, _, _] = match wheels() {
        Ok(w) => w,
        Err(why) => return cannot_run(&why),
    };
    // Built with the launcher (a crate of its own).
    let lib = quiver().with_file_name("libmpi_abi.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    let abi = abi_program(mpich);
    passes_on_mpich(mpich, &abi, "abi: OK");
    for n in 1..=4 {
        let out = on_quiver(&[], n, &abi, &[], &[]);
        assert!(
            out.status.success() && stdout(&out).contains(&format!("abi: OK ({n} ranks, quiver)")),
            "{n} ranks on quiver\n{}",
            describe(&out)
        );
    }
}

/// IMB-RMA's benchmarks, in the order it runs them.
const IMB_RMA: [&str; 17] = [
    "Unidir_put",
    "Bidir_put",
    "Unidir_get",
    "Bidir_get",
    "Put_local",
    "Put_all_local",
    "One_put_all",
    "All_put_all",
    "One_get_all",
    "All_get_all",
    "Exchange_put",
    "Exchange_get",
    "Accumulate",
    "Get_accumulate",
    "Fetch_and_op",
    "Compare_and_swap",
    "Truly_passive_put",
];

/// Runs IMB-RMA with `args` on `n` ranks (`extra`: `quiver run`'s own arguments) and
/// checks that every benchmark ran.
fn imb_rma_runs(impi: &Path, extra: &[&str], n: u32, args: &[&str]) {
    let out = on_quiver(extra, n, &impi.join("bin/IMB-RMA"), args, &[]);
    assert!(
        out.status.success() && stdout(&out).contains("All processes entering MPI_Finalize"),
        "IMB-RMA on {n} ranks {extra:?}\n{}",
        describe(&out)
    );
    let mut ran = benchmarked(&out);
    // Those with an aggregate and a non-aggregate mode print two tables.
    ran.dedup();
    assert_eq!(ran, IMB_RMA, "IMB-RMA on {n} ranks\n{}", describe(&out));
}

#[test]
fn imb_rma_runs_all_its_benchmarks() {
    let _one = serial();
    let [_, impi, _] = match wheels() {
        Ok(w) => w,
        Err(why) => return cannot_run(&why),
    };
    for n in [2, 4] {
        imb_rma_runs(
            impi,
            &[],
            n,
            &["-msglog", "0:18", "-iter", "200", "-time", "2"],
        );
    }
}

/// The benchmarks IMB printed a table for.
fn benchmarked(out: &Output) -> Vec<String> {
    stdout(out)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("# Benchmarking "))
        .map(|b| b.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn imb_p2p_runs_all_its_benchmarks() {
    let _one = serial();
    let [_, impi, _] = match wheels() {
        Ok(w) => w,
        Err(why) => return cannot_run(&why),
    };
    let imb = impi.join("bin/IMB-P2P");
    for (n, expect) in [
        (
            2,
            &[
                "PingPong",
                "PingPing",
                "Unirandom",
                "Birandom",
                "Corandom",
                "SendRecv_Replace",
            ][..],
        ),
        (
            4,
            &[
                "PingPong",
                "PingPing",
                "Unirandom",
                "Birandom",
                "Corandom",
                "Stencil2D",
                "SendRecv_Replace",
            ][..],
        ),
    ] {
        let out = on_quiver(
            &[],
            n,
            &imb,
            &["-msglog", "0:18", "-iter", "200", "-time", "2"],
            &[],
        );
        assert!(
            out.status.success(),
            "IMB-P2P on {n} ranks\n{}",
            describe(&out)
        );
        assert_eq!(
            benchmarked(&out),
            expect,
            "IMB-P2P on {n} ranks\n{}",
            describe(&out)
        );
        assert!(
            stdout(&out).contains("All processes entering MPI_Finalize"),
            "{}",
            describe(&out)
        );
    }
}

#[test]
fn imb_mpi1_runs_its_collectives_on_2_and_4_ranks() {
    let _one = serial();
    let [_, impi, _] = match wheels() {
        Ok(w) => w,
        Err(why) => return cannot_run(&why),
    };
    let imb = impi.join("bin/IMB-MPI1");
    let all = [
        "PingPong",
        "PingPing",
        "Sendrecv",
        "Exchange",
        "Allreduce",
        "Reduce",
        "Reduce_local",
        "Reduce_scatter",
        "Reduce_scatter_block",
        "Allgather",
        "Allgatherv",
        "Gather",
        "Gatherv",
        "Scatter",
        "Scatterv",
        "Alltoall",
        "Alltoallv",
        "Bcast",
        "Barrier",
    ];
    for n in [2, 4] {
        let out = on_quiver(
            &[],
            n,
            &imb,
            &[
                "-msglog",
                "0:12",
                "-iter",
                "50",
                "-time",
                "2",
                "-npmin",
                &n.to_string(),
            ],
            &[],
        );
        assert!(
            out.status.success(),
            "IMB-MPI1 on {n} ranks\n{}",
            describe(&out)
        );
        let got = benchmarked(&out);
        for b in all {
            assert!(
                got.iter().any(|g| g == b),
                "IMB-MPI1 on {n} ranks ran no {b}\n{}",
                describe(&out)
            );
        }
    }
}

/// The `site-packages` of the mpi4py wheel's prefix.
fn site_packages(mpi4py: &Path) -> PathBuf {
    std::fs::read_dir(mpi4py.join("lib"))
        .ok()
        .and_then(|mut d| d.next())
        .and_then(Result::ok)
        .map(|e| e.path().join("site-packages"))
        .expect("mpi4py's site-packages")
}

#[test]
fn mpi4py_runs_its_benchmarks() {
    let _one = serial();
    let [_, _, mpi4py] = match wheels() {
        Ok(w) => w,
        Err(why) => return cannot_run(&why),
    };
    let site = site_packages(mpi4py);
    let env = [("PYTHONPATH", site.as_os_str())];
    let python = Path::new("python3");
    let hello = on_quiver(&[], 3, python, &["-m", "mpi4py.bench", "helloworld"], &env);
    for r in 0..3 {
        assert!(
            stdout(&hello).contains(&format!("I am process {r} of 3")),
            "{}",
            describe(&hello)
        );
    }
    let ring = on_quiver(
        &[],
        3,
        python,
        &["-m", "mpi4py.bench", "ringtest", "-n", "1024", "-l", "100"],
        &env,
    );
    assert!(
        ring.status.success() && stdout(&ring).contains("(3 processes, 1024 bytes)"),
        "{}",
        describe(&ring)
    );
    let pp = on_quiver(
        &[],
        2,
        python,
        &[
            "-m",
            "mpi4py.bench",
            "pingpong",
            "-n",
            "1048576",
            "-l",
            "100",
        ],
        &env,
    );
    assert!(
        pp.status.success() && stdout(&pp).contains("1048576"),
        "{}",
        describe(&pp)
    );
}

/// Why an emulated cluster cannot be built here, if it cannot (root and `ip`, `tc`,
/// `nft` are needed).
fn no_cluster() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if caps & (1 << 12) == 0 || caps & (1 << 21) == 0 {
        return Some("not root (an emulated cluster needs CAP_NET_ADMIN and CAP_SYS_ADMIN)".into());
    }
    for tool in ["ip", "tc", "nft"] {
        if Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            return Some(format!("the `{tool}` command is missing"));
        }
    }
    None
}

/// An emulated cluster, removed when dropped.
struct Cluster(String);

impl Cluster {
    fn up(nodes: u32) -> Cluster {
        let name = format!("t{}m", std::process::id());
        let mut cmd = command(quiver());
        cmd.args(["cluster", "up", &name, "--nodes", &nodes.to_string()]);
        let out = output(cmd);
        let cluster = Cluster(name);
        assert!(out.status.success(), "cluster up\n{}", describe(&out));
        cluster
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut cmd = command(quiver());
        cmd.args(["cluster", "down", &self.0]);
        let _ = output(cmd);
    }
}

#[test]
fn between_two_nodes_every_byte_arrives_and_imb_p2p_imb_rma_and_mpi4py_run() {
    let _one = serial();
    if let Some(why) = no_cluster() {
        return cannot_run(&why);
    }
    let [mpich, impi, mpi4py] = match wheels() {
        Ok(w) => w,
        Err(why) => return cannot_run(&why),
    };
    let verify = verify_program(mpich);
    let cluster = Cluster::up(2);
    let on = ["--cluster", cluster.0.as_str()];
    for (n, transport) in [(2, "auto"), (4, "auto"), (2, "udp")] {
        let env = [("QUIVER_TRANSPORT", OsStr::new(transport))];
        let out = on_quiver(&on, n, &verify, &[], &env);
        assert!(
            out.status.success()
                && stdout(&out).contains(&format!("verify: OK ({n} ranks, quiver)")),
            "{n} ranks on 2 nodes, transport {transport}\n{}",
            describe(&out)
        );
    }
    // One-sided: every byte, and IMB-RMA (small sizes: between the nodes each flush
    // and atomic is a round trip).
    let rma = rma_program(mpich);
    for (n, transport) in [(2, "auto"), (4, "auto"), (2, "udp")] {
        let env = [("QUIVER_TRANSPORT", OsStr::new(transport))];
        let out = on_quiver(&on, n, &rma, &[], &env);
        assert!(
            out.status.success() && stdout(&out).contains(&format!("rma: OK ({n} ranks, quiver)")),
            "{n} ranks on 2 nodes, transport {transport}\n{}",
            describe(&out)
        );
    }
    imb_rma_runs(
        impi,
        &on,
        2,
        &["-msglog", "0:10", "-iter", "50", "-time", "1"],
    );
    let imb = impi.join("bin/IMB-P2P");
    let out = on_quiver(
        &on,
        2,
        &imb,
        &["-msglog", "0:20", "-iter", "100", "-time", "2"],
        &[],
    );
    assert!(
        out.status.success(),
        "IMB-P2P on 2 nodes\n{}",
        describe(&out)
    );
    assert_eq!(
        benchmarked(&out),
        [
            "PingPong",
            "PingPing",
            "Unirandom",
            "Birandom",
            "Corandom",
            "SendRecv_Replace"
        ],
        "{}",
        describe(&out)
    );
    // mpi4py between the nodes: a benchmark and the checked calls.
    let site = site_packages(mpi4py);
    let env = [("PYTHONPATH", site.as_os_str())];
    let python = Path::new("python3");
    let ring = on_quiver(
        &on,
        2,
        python,
        &["-m", "mpi4py.bench", "ringtest", "-n", "1024", "-l", "100"],
        &env,
    );
    assert!(
        ring.status.success() && stdout(&ring).contains("(2 processes, 1024 bytes)"),
        "{}",
        describe(&ring)
    );
    let checks = repo().join("crates/quiver-mpich/tests/python/checks.py");
    let out = on_quiver(&on, 2, python, &[checks.to_str().unwrap()], &env);
    assert!(
        out.status.success() && stdout(&out).contains("mpi4py checks: OK"),
        "{}",
        describe(&out)
    );
}
