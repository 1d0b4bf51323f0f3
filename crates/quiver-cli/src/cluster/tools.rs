//! Running `ip`, `tc` and `nft`, and what they need: the commands themselves, root's
//! capabilities, a lock against concurrent changes, the signals that interrupt a build.
//!
//! Every command runs with its stdout and stderr captured and in a process group of its
//! own (so a Ctrl-C at the terminal reaches `quiver`, which then removes what it built,
//! and not the half-done command). A command that fails becomes an error that quotes the
//! command line and the tool's own message; a refusal for lack of privileges becomes
//! [`PERMISSION`].

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{anyhow, bail, Context as _};

/// The one-line error for a process without the privileges a cluster needs.
pub const PERMISSION: &str = "emulated clusters need root: creating and entering network \
     namespaces takes CAP_SYS_ADMIN and CAP_NET_ADMIN; run as root (e.g. with sudo)";

/// Directories searched after `PATH` (`ip`, `tc` and `nft` live in sbin, which the `PATH`
/// of a user often lacks).
const EXTRA_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The path of the command `name`, or an error that names the package to install.
pub fn require(name: &str, package: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            anyhow!(
                "the `{name}` command is not installed; install the {package} package \
                 (e.g. apt-get install {package})"
            )
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Bit numbers of the capabilities in `/proc/self/status`.
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;

/// Fails with [`PERMISSION`] unless this process holds CAP_SYS_ADMIN and CAP_NET_ADMIN.
pub fn check_privileges() -> anyhow::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    match eff {
        Some(caps) if caps & (1 << CAP_NET_ADMIN) != 0 && caps & (1 << CAP_SYS_ADMIN) != 0 => {
            Ok(())
        }
        // Without /proc, let the first command tell.
        None => Ok(()),
        Some(_) => bail!(PERMISSION),
    }
}

/// Runs `program args...` (in the network namespace open as `netns`, if given, with
/// `input` on its stdin, if given) and returns its stdout.
pub fn run(
    program: &Path,
    args: &[String],
    netns: Option<&File>,
    input: Option<&str>,
) -> anyhow::Result<String> {
    let shown = show_command(program, args);
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .env("LC_ALL", "C");
    if let Some(ns) = netns {
        enter_netns_before_exec(&mut cmd, ns);
    }
    let mut child = cmd.spawn().map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) {
            anyhow!(PERMISSION)
        } else {
            anyhow!("cannot run `{shown}`: {e}")
        }
    })?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        // A tool that fails early closes its stdin: its status tells why.
        let _ = stdin.write_all(text.as_bytes());
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("cannot wait for `{shown}`"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let message = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
    if message.contains("Operation not permitted") || message.contains("Permission denied") {
        bail!(PERMISSION);
    }
    let status = match out.status.code() {
        Some(c) => format!("status {c}"),
        None => "a signal".to_string(),
    };
    let what = if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    };
    bail!("`{shown}` failed ({status}){what}");
}

/// The command line as a user would type it (for error messages).
fn show_command(program: &Path, args: &[String]) -> String {
    let name = program
        .file_name()
        .map_or_else(|| program.to_string_lossy(), |n| n.to_string_lossy());
    let mut s = name.into_owned();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// Makes `cmd`'s process enter the network namespace open as `ns` between `fork` and
/// `exec` (`setns(2)` with `CLONE_NEWNET`). `ns` must stay open until `cmd` is spawned;
/// the child's copy of the descriptor is closed by `exec` (it is close-on-exec).
pub fn enter_netns_before_exec(cmd: &mut Command, ns: &File) {
    let fd = ns.as_raw_fd();
    let hook = move || -> io::Result<()> {
        // SAFETY: setns is one async-signal-safe system call on a descriptor number; it
        // touches no memory of this process (a stale descriptor only makes it fail, and
        // the error is returned without allocating).
        if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook only makes the system call above: no allocation, no lock.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Opens the file of the named network namespace `ns` (`/run/netns/NS`).
pub fn open_netns(ns: &str) -> io::Result<File> {
    File::open(Path::new(super::NETNS_DIR).join(ns))
}

/// An exclusive lock on the state directory, held while clusters are built or removed
/// (two `up` at once would otherwise pick the same subnet). Released when dropped.
pub struct Lock {
    _dir: File,
}

impl Lock {
    /// Creates the state directory if missing and locks it, waiting for other holders.
    pub fn acquire(dir: &Path) -> anyhow::Result<Lock> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
        let file = File::open(dir)
            .with_context(|| format!("cannot open the state directory {}", dir.display()))?;
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(Lock { _dir: file });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(anyhow!("cannot lock {}: {e}", dir.display()));
            }
        }
    }
}

/// The first of SIGINT, SIGTERM, SIGHUP received while an [`Interrupts`] is alive.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only a lock-free atomic: async-signal-safe.
    let _ = SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// Catches SIGINT, SIGTERM and SIGHUP while a cluster is built, so that the build stops
/// at the next step and removes what it created; restores the previous handlers when
/// dropped.
pub struct Interrupts {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl Interrupts {
    /// Installs the handlers.
    pub fn catch() -> Interrupts {
        SIGNAL.store(0, Ordering::SeqCst);
        let mut previous = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: sigaction on valid, zero-initialised structures; the handler only
            // touches an atomic.
            unsafe {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                new.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut new.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &new, &mut old) == 0 {
                    previous.push((sig, old));
                }
            }
        }
        Interrupts { previous }
    }

    /// The signal received so far, if any.
    pub fn received(&self) -> Option<i32> {
        match SIGNAL.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

impl Drop for Interrupts {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores an action obtained from sigaction.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
    }
}
