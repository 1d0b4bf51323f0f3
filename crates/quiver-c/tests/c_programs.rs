//! The C library as its users meet it: installed with `make install` into a fresh prefix
//! (libraries, header, `quiver.pc`, the `quiver` launcher), C programs compiled against
//! that prefix by the system compiler with `pkg-config --cflags --libs quiver` (once
//! linked statically), and run as real jobs under the installed `quiver run` and under
//! Open MPI's `mpirun` (with no `QUIVER_*` variable: the ranks meet through PMIx): the examples of `examples/c/` (hello, ring, pingpong, ports, rma) and
//! `tests/c/errors.c`, which checks that every error path returns its code.
//!
//! The install runs cargo once more (`make all install` builds the release libraries and
//! the launcher as a user would); its prefix lives under the target directory
//! (`<profile>/c-tests`). Without `cc`, `make`, `pkg-config` or `mpirun` a test says
//! why in one line and passes; under `.ci/run` (`QUIVER_CI` set) it fails instead. Every
//! job runs under a deadline after which its process group is killed, one at a time.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Deadline of one job or build step; generous for a loaded two-core machine.
const LIMIT: Duration = Duration::from_secs(300);

/// One job at a time: several ranks per job already fill a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Skips a test that needs what this machine lacks, with one line saying why; under
/// `.ci/run` (`QUIVER_CI` set), which installs every tool, fails instead.
fn cannot_run(why: &str) {
    if std::env::var_os("QUIVER_CI").is_some() {
        panic!("{why} (QUIVER_CI is set: .ci/run must run this test)");
    }
    eprintln!("skipped: {why}");
}

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository")
}

/// Whether `program` is on the PATH.
fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// A command whose environment has no variable that would tell a program it is inside
/// a job (the test's own, or those of a launcher that started the test), and no
/// `LD_LIBRARY_PATH` (cargo points it at the build tree, whose `libquiver.so` would
/// win over the installed one the programs' rpath names).
fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_LIBRARY_PATH");
    for (var, _) in std::env::vars_os() {
        let v = var.to_string_lossy();
        if [
            "QUIVER_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "HYDRA_", "PRTE_",
        ]
        .iter()
        .any(|p| v.starts_with(p))
        {
            cmd.env_remove(&var);
        }
    }
    cmd
}

/// What a finished command left.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn describe(&self) -> String {
        format!(
            "status {}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    /// Fails the test, with everything printed, unless the command succeeded.
    fn ok(self, what: &str) -> Finished {
        assert!(self.status.success(), "{what} failed\n{}", self.describe());
        self
    }
}

fn reader(mut src: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = src.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Kills the process group of `child` (it leads one of its own).
fn kill_group(child: &Child) {
    // SAFETY: kill has no memory-safety preconditions; the group is ours.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
}

/// Runs `cmd` in a process group of its own with its output captured; past `LIMIT` the
/// group is killed and the test fails with what the command printed.
fn run(mut cmd: Command) -> Finished {
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
        if start.elapsed() > LIMIT {
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
        "{what} still ran after {LIMIT:?} and was killed\n{}",
        finished.describe()
    );
    finished
}

/// The library installed as a user installs it.
struct Installed {
    /// Where programs are compiled.
    work: PathBuf,
    /// The installation prefix.
    prefix: PathBuf,
}

impl Installed {
    /// The installed launcher.
    fn quiver(&self) -> PathBuf {
        self.prefix.join("bin/quiver")
    }

    /// `pkg-config ARGS quiver` against the prefix, as a list of arguments.
    fn pkg_config(&self, args: &[&str]) -> Vec<String> {
        let mut cmd = Command::new("pkg-config");
        cmd.env("PKG_CONFIG_PATH", self.prefix.join("lib/pkgconfig"))
            .args(args)
            .arg("quiver");
        let done = run(cmd).ok("pkg-config");
        done.stdout.split_whitespace().map(str::to_string).collect()
    }
}

/// The tools the tests need, or why they cannot run.
fn tools() -> Result<(), String> {
    for tool in ["cc", "make", "pkg-config"] {
        if !have(tool) {
            return Err(format!(
                "{tool} is not installed (apt-get install gcc make pkg-config)"
            ));
        }
    }
    Ok(())
}

/// `make all install PREFIX=...` once per test run, for the profile and target directory of
/// this test binary; `None` (the test then skips) when a tool is missing.
fn installed() -> Option<&'static Installed> {
    static ONCE: OnceLock<Result<Installed, String>> = OnceLock::new();
    let got = ONCE.get_or_init(|| {
        tools()?;
        // This binary is <target>/<profile>/deps/c_programs-HASH.
        let exe = std::env::current_exe().expect("the test binary");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("<target>/<profile>");
        let target = profile_dir.parent().expect("<target>");
        let profile = match profile_dir.file_name().and_then(OsStr::to_str) {
            Some("debug") => "dev",
            Some(p) => p,
            None => panic!("no profile in {}", exe.display()),
        };
        let work = profile_dir.join("c-tests");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(work.join("bin")).expect("the work directory");
        let prefix = work.join("prefix");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
        let mut make = command("make");
        make.arg("-C")
            .arg(repo().join("crates/quiver-c"))
            .args(["all", "install"])
            .arg(format!("PREFIX={}", prefix.display()))
            .arg(format!("PROFILE={profile}"))
            .arg(format!("TARGET_DIR={}", target.display()))
            .arg(format!("CARGO={}", Path::new(&cargo).display()));
        run(make).ok("make install");
        for file in [
            "lib/libquiver.so",
            "lib/libquiver.a",
            "include/quiver.h",
            "lib/pkgconfig/quiver.pc",
            "bin/quiver",
        ] {
            assert!(prefix.join(file).is_file(), "make install left no {file}");
        }
        Ok(Installed { work, prefix })
    });
    match got {
        Ok(i) => Some(i),
        Err(why) => {
            cannot_run(why);
            None
        }
    }
}

/// How a program is linked.
#[derive(Clone, Copy, PartialEq)]
enum Link {
    /// With `libquiver.so`, found through the rpath.
    Shared,
    /// With `libquiver.a` (`pkg-config --static` for what it needs).
    Static,
    /// With `libquiver.so`, the program built with AddressSanitizer and
    /// UndefinedBehaviorSanitizer (what the library frees, the C side's memory).
    Sanitized,
}

/// Compiles `source` (relative to the repository) into the work directory as `name`,
/// warnings as errors, the way the README tells users to.
fn compile(inst: &Installed, source: &str, name: &str, link: Link) -> PathBuf {
    let out = inst.work.join("bin").join(name);
    let mut cc = Command::new("cc");
    cc.args([
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-O2",
    ])
    .arg(repo().join(source))
    .arg("-o")
    .arg(&out)
    .args(inst.pkg_config(&["--cflags"]));
    if link == Link::Sanitized {
        cc.args([
            "-g",
            "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer",
        ]);
    }
    match link {
        Link::Shared | Link::Sanitized => {
            cc.args(inst.pkg_config(&["--libs"]))
                .arg(format!("-Wl,-rpath,{}", inst.prefix.join("lib").display()));
        }
        Link::Static => {
            for arg in inst.pkg_config(&["--static", "--libs"]) {
                if arg == "-lquiver" {
                    cc.args(["-Wl,-Bstatic", "-lquiver", "-Wl,-Bdynamic"]);
                } else {
                    cc.arg(arg);
                }
            }
        }
    }
    cc.arg("-pthread");
    run(cc).ok(&format!("compiling {source}"));
    out
}

/// Runs `prog ARGS` as `n` ranks under the installed `quiver run`.
fn quiver_run(
    inst: &Installed,
    n: u32,
    prog: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Finished {
    let _one = serial();
    let mut cmd = command(inst.quiver());
    cmd.args(["run", "-n", &n.to_string(), "--timeout", "240", "--"])
        .arg(prog)
        .args(args)
        .envs(env.iter().copied());
    run(cmd)
}

/// `mpirun` of Open MPI (`mpirun.openmpi` first: with MPICH installed too, `mpirun` may
/// be Hydra's), or why it cannot be used.
fn open_mpi() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mpirun = ["mpirun.openmpi", "mpirun"]
        .iter()
        .find_map(|name| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
        .ok_or("Open MPI's mpirun is not installed (apt-get install openmpi-bin)")?;
    let out = Command::new(&mpirun)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", mpirun.display()))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !text.contains("Open MPI") && !text.contains("OpenRTE") {
        return Err(format!("{} is not Open MPI's", mpirun.display()));
    }
    Ok(mpirun)
}

/// Runs `prog ARGS` as `n` ranks under Open MPI's `mpirun`, with no `QUIVER_*` variable
/// (the ranks meet through mpirun's PMIx); `None` (the test skips) when there is no
/// Open MPI.
fn mpirun(n: u32, prog: &Path, args: &[&str]) -> Option<Finished> {
    let mpi = match open_mpi() {
        Ok(p) => p,
        Err(why) => {
            cannot_run(&why);
            return None;
        }
    };
    let _one = serial();
    let mut cmd = command(mpi);
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &n.to_string(),
    ])
    .arg(prog)
    .args(args);
    Some(run(cmd))
}

/// The lines of `text` that contain `tag`, without the launcher's `[rank] ` prefix.
fn lines_with<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.contains(tag))
        .map(|l| match l.strip_prefix('[') {
            Some(rest) => rest.split_once("] ").map_or(l, |(_, s)| s),
            None => l,
        })
        .collect()
}

/// Every rank of `n` said hello once.
fn check_hello(done: &Finished, n: u32) {
    let mut lines = lines_with(&done.stdout, "hello from rank");
    lines.sort_by_key(|l| {
        l.split_whitespace()
            .nth(3)
            .and_then(|r| r.parse::<u32>().ok())
    });
    assert_eq!(lines.len(), n as usize, "{}", done.describe());
    for (r, line) in lines.iter().enumerate() {
        assert!(
            line.starts_with(&format!(
                "hello from rank {r} of {n} on node 0 of 1 (started by "
            )),
            "{line}\n{}",
            done.describe()
        );
    }
}

#[test]
fn the_header_compiles_alone_as_c99_and_as_cpp() {
    let Some(inst) = installed() else { return };
    let src = inst.work.join("header_only.c");
    std::fs::write(
        &src,
        "#include <quiver.h>\n\
         int main(void) { return quiver_version() == QUIVER_VERSION ? 0 : 1; }\n",
    )
    .expect("write the source");
    let out = inst.work.join("bin/header_only");
    let mut cc = Command::new("cc");
    cc.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .args(inst.pkg_config(&["--cflags", "--libs"]))
        .arg(format!("-Wl,-rpath,{}", inst.prefix.join("lib").display()));
    run(cc).ok("compiling the header as C99");
    run(command(&out)).ok("the header's version is the library's");
    if !have("c++") {
        cannot_run("c++ is not installed (apt-get install g++)");
        return;
    }
    let mut cxx = Command::new("c++");
    cxx.args([
        "-std=c++11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fsyntax-only",
        "-x",
        "c++",
    ])
    .arg(&src)
    .args(inst.pkg_config(&["--cflags"]));
    run(cxx).ok("compiling the header as C++");
}

#[test]
fn hello_under_quiver_run() {
    let Some(inst) = installed() else { return };
    let hello = compile(inst, "examples/c/hello.c", "hello", Link::Shared);
    let done = quiver_run(inst, 3, &hello, &[], &[]).ok("quiver run hello");
    check_hello(&done, 3);
    assert!(
        done.stdout.contains("(started by quiver run)"),
        "{}",
        done.describe()
    );
}

/// The ring's summary line for `n` ranks and `laps` laps over `transport`.
fn ring_line(n: u32, laps: u32, transport: &str) -> String {
    format!(
        "ring: {n} ranks, {laps} laps over {transport}, the token came back after {} hops, \
         every hop verified",
        n * laps
    )
}

#[test]
fn ring_under_quiver_run() {
    let Some(inst) = installed() else { return };
    let ring = compile(inst, "examples/c/ring.c", "ring", Link::Shared);
    let done = quiver_run(inst, 4, &ring, &["20"], &[]).ok("quiver run ring");
    assert_eq!(
        lines_with(&done.stdout, "ring:"),
        [ring_line(4, 20, "shm")],
        "{}",
        done.describe()
    );
}

/// GAMMA's ports from C: handlers, a broadcast, an error handler, every byte checked by
/// the program itself, over shared memory, over UDP, and over UDP with the handlers on
/// the offload engine's thread.
#[test]
fn ports_under_quiver_run() {
    let Some(inst) = installed() else { return };
    let prog = compile(inst, "examples/c/ports.c", "ports", Link::Shared);
    let udp = ("QUIVER_TRANSPORT", "udp");
    for (n, env) in [
        (4, vec![("QUIVER_TRANSPORT", "auto")]),
        (3, vec![udp]),
        (3, vec![udp, ("QUIVER_RELIABILITY", "offload")]),
    ] {
        let done = quiver_run(inst, n, &prog, &["15"], &env).ok("quiver run ports");
        let lines = lines_with(&done.stdout, "ports: rank");
        assert_eq!(lines.len(), n as usize, "{}", done.describe());
        for rank in 0..n {
            let want = format!(
                "ports: rank {rank}: 15 laps, {} broadcasts, 1 port error, every byte verified",
                n - 1
            );
            assert!(
                lines.iter().any(|l| l.ends_with(&want)),
                "{want}\n{}",
                done.describe()
            );
        }
    }
}

#[test]
fn rma_under_quiver_run() {
    let Some(inst) = installed() else { return };
    let prog = compile(inst, "examples/c/rma.c", "rma", Link::Shared);
    let udp = ("QUIVER_TRANSPORT", "udp");
    for (n, env) in [
        (3, vec![("QUIVER_TRANSPORT", "auto")]),
        (3, vec![udp]),
        (2, vec![udp, ("QUIVER_RELIABILITY", "offload")]),
    ] {
        let done = quiver_run(inst, n, &prog, &["3"], &env).ok("quiver run rma");
        let lines = lines_with(&done.stdout, "rma: rank");
        assert_eq!(lines.len(), n as usize, "{}", done.describe());
        for rank in 0..n {
            let want = format!("rma: rank {rank}: 3 rounds, ");
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains(&want) && l.ends_with("every byte verified")),
                "{want}\n{}",
                done.describe()
            );
        }
    }
}

#[test]
fn ring_over_udp_under_quiver_run() {
    let Some(inst) = installed() else { return };
    let ring = compile(inst, "examples/c/ring.c", "ring_udp", Link::Shared);
    let env = [("QUIVER_TRANSPORT", "udp")];
    let done = quiver_run(inst, 3, &ring, &["10"], &env).ok("quiver run ring over udp");
    assert_eq!(
        lines_with(&done.stdout, "ring:"),
        [ring_line(3, 10, "udp")],
        "{}",
        done.describe()
    );
}

#[test]
fn ring_linked_statically_under_quiver_run() {
    let Some(inst) = installed() else { return };
    let ring = compile(inst, "examples/c/ring.c", "ring_static", Link::Static);
    // Nothing of libquiver.so is needed at run time.
    let mut readelf = Command::new("readelf");
    readelf.arg("-d").arg(&ring);
    let dynamic = run(readelf).ok("readelf -d");
    assert!(
        !dynamic.stdout.contains("libquiver"),
        "the static ring needs libquiver.so:\n{}",
        dynamic.stdout
    );
    let done = quiver_run(inst, 3, &ring, &["5"], &[]).ok("quiver run ring (static)");
    assert_eq!(
        lines_with(&done.stdout, "ring:"),
        [ring_line(3, 5, "shm")],
        "{}",
        done.describe()
    );
}

/// The ping-pong printed every size, the exchange and the send from the shared pool,
/// each verified.
fn check_pingpong(done: &Finished, iters: u32) {
    let lines = lines_with(&done.stdout, "pingpong:");
    assert_eq!(lines.len(), 7, "{}", done.describe());
    for (line, size) in lines.iter().zip([0, 8, 1024, 65536, 1048576]) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.get(1), Some(&size.to_string().as_str()), "{line}");
        let rtt: f64 = fields[3]
            .parse()
            .unwrap_or_else(|_| panic!("no time in {line}"));
        assert!(rtt > 0.0 && rtt.is_finite(), "{line}");
        assert!(
            line.ends_with(&format!("({iters} iterations, verified)")),
            "{line}"
        );
    }
    assert_eq!(
        lines[5],
        "pingpong: exchanged 1048576 bytes both ways at once with isend/irecv, verified",
        "{}",
        done.describe()
    );
    assert_eq!(
        lines[6],
        "pingpong: sent 1048576 bytes from the shared pool, verified",
        "{}",
        done.describe()
    );
}

#[test]
fn pingpong_under_quiver_run() {
    let Some(inst) = installed() else { return };
    let pingpong = compile(inst, "examples/c/pingpong.c", "pingpong", Link::Shared);
    let done = quiver_run(inst, 2, &pingpong, &["20"], &[]).ok("quiver run pingpong");
    check_pingpong(&done, 20);
}

#[test]
fn hello_under_mpirun() {
    let Some(inst) = installed() else { return };
    let hello = compile(inst, "examples/c/hello.c", "hello_mpi", Link::Shared);
    let Some(done) = mpirun(2, &hello, &[]) else {
        return;
    };
    check_hello(&done.ok("mpirun hello"), 2);
}

#[test]
fn ring_under_mpirun() {
    let Some(inst) = installed() else { return };
    let ring = compile(inst, "examples/c/ring.c", "ring_mpi", Link::Shared);
    let Some(done) = mpirun(3, &ring, &["10"]) else {
        return;
    };
    let done = done.ok("mpirun ring");
    assert_eq!(
        lines_with(&done.stdout, "ring:"),
        [ring_line(3, 10, "shm")],
        "{}",
        done.describe()
    );
}

#[test]
fn pingpong_under_mpirun() {
    let Some(inst) = installed() else { return };
    let pingpong = compile(inst, "examples/c/pingpong.c", "pingpong_mpi", Link::Shared);
    let Some(done) = mpirun(2, &pingpong, &["10"]) else {
        return;
    };
    check_pingpong(&done.ok("mpirun pingpong"), 10);
}

/// The number of checks of the summary line `errors: N checks, 0 failed` (asserting that
/// none failed), one per rank.
fn checks_passed(done: &Finished) -> Vec<u32> {
    lines_with(&done.stdout, "errors:")
        .iter()
        .map(|l| {
            let n = l
                .strip_prefix("errors: ")
                .and_then(|r| r.strip_suffix(" checks, 0 failed"))
                .unwrap_or_else(|| panic!("{l}\n{}", done.describe()));
            n.parse().expect("a count")
        })
        .collect()
}

#[test]
fn every_error_path_returns_its_code_outside_a_job() {
    let Some(inst) = installed() else { return };
    let errors = compile(
        inst,
        "crates/quiver-c/tests/c/errors.c",
        "errors",
        Link::Shared,
    );
    let mut cmd = command(&errors);
    cmd.arg("outside");
    let done = run(cmd).ok("errors outside");
    let counts = checks_passed(&done);
    assert!(
        counts.len() == 1 && counts[0] > 100,
        "{counts:?}\n{}",
        done.describe()
    );
}

#[test]
fn every_error_path_under_the_sanitizers() {
    let Some(inst) = installed() else { return };
    let errors = compile(
        inst,
        "crates/quiver-c/tests/c/errors.c",
        "errors_asan",
        Link::Sanitized,
    );
    // The Rust side leaks on purpose at exit (thread-locals, the store's threads).
    let env = [
        ("QUIVER_CONNECT_TIMEOUT", "2"),
        ("QUIVER_MAX_MESSAGE", "65536"),
        ("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1"),
        ("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1"),
    ];
    let done = quiver_run(inst, 2, &errors, &[], &env).ok("quiver run errors (sanitized)");
    assert_eq!(checks_passed(&done).len(), 2, "{}", done.describe());
    assert!(
        !done.stderr.contains("runtime error"),
        "{}",
        done.describe()
    );
}

#[test]
fn every_error_path_returns_its_code_in_a_job() {
    let Some(inst) = installed() else { return };
    let errors = compile(
        inst,
        "crates/quiver-c/tests/c/errors.c",
        "errors_job",
        Link::Shared,
    );
    let env = [
        ("QUIVER_CONNECT_TIMEOUT", "2"),
        ("QUIVER_MAX_MESSAGE", "65536"),
    ];
    let done = quiver_run(inst, 2, &errors, &[], &env).ok("quiver run errors");
    let counts = checks_passed(&done);
    assert!(
        counts.len() == 2 && counts.iter().all(|&n| n > 200),
        "{counts:?}\n{}",
        done.describe()
    );
}
