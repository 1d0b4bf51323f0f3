//! Who may attach to this process: the ptracer exception Yama asks for, decided from
//! `kernel.yama.ptrace_scope` and the job's processes on this node, and set process-wide.
//!
//! The kernel lets a process read or write another's memory (`process_vm_readv`/
//! `writev`) when it may ptrace it. Yama narrows that further by `ptrace_scope`
//! (`/proc/sys/kernel/yama/ptrace_scope`):
//!
//! - absent (no Yama) or 0: any process of the same user may; nothing to change;
//! - 1: only ancestors, unless the target names a tracer with
//!   `prctl(PR_SET_PTRACER, pid)` (that process and its descendants may then attach) or
//!   `PR_SET_PTRACER_ANY` (any process of the user may). One tracer per process: the
//!   last call wins;
//! - 2: only holders of `CAP_SYS_PTRACE`; no prctl helps;
//! - 3: nobody; no prctl helps.
//!
//! [`decide`] turns that and the number of peer processes into a [`Ptracer`]: nothing,
//! name the one peer process, any process of the user, or cross-memory attach off.
//! [`apply`] carries it out for the whole process (several endpoints, several jobs: the
//! exceptions they need are merged, so a second peer process widens a named tracer to
//! any), logs every change once at `info`, and says once when attach cannot work.
//! [`allow_any`] is the explicit `PR_SET_PTRACER_ANY` of [`super::allow_peers`].

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Where Yama's setting is read.
pub const PTRACE_SCOPE_PATH: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// Yama's `ptrace_scope` on this machine: `None` without Yama (the file does not
/// exist). A file that exists but cannot be read or parsed counts as 1, the setting
/// under which quiver changes something (rather than turning attach off or doing
/// nothing on a guess).
pub fn ptrace_scope() -> Option<u32> {
    match std::fs::read_to_string(PTRACE_SCOPE_PATH) {
        Ok(s) => Some(s.trim().parse().unwrap_or(1)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(_) => Some(1),
    }
}

/// Whether this process holds `CAP_SYS_PTRACE` in its effective set (`CapEff` in
/// `/proc/self/status`), which lets it attach under `ptrace_scope` 2.
pub fn has_cap_sys_ptrace() -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// The job's other processes on this node, which read and write this one by attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerProcesses {
    /// None: no other rank on this node, or every one is this very process (ranks as
    /// threads), which needs no permission.
    None,
    /// Exactly one other process, by its pid (in this process's pid namespace).
    One(u32),
    /// Two or more, or some that could not be identified.
    Several,
}

/// What to change so that the job's same-node peers may attach to this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ptracer {
    /// Nothing: no Yama, `ptrace_scope` 0, no peer process, or `ptrace_scope` 2 with
    /// `CAP_SYS_PTRACE` (assumed held by the peers too: same user, same launcher).
    Unchanged,
    /// `prctl(PR_SET_PTRACER, pid)`: that one peer process (and its descendants) may
    /// attach.
    Name(u32),
    /// `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`: any process of this user may.
    Any,
    /// Nothing: attach cannot work here (`ptrace_scope` 3, or 2 without
    /// `CAP_SYS_PTRACE`), so it should be turned off.
    CmaOff,
}

/// The ptracer decision. `scope` is [`ptrace_scope`]'s answer, `cap_sys_ptrace`
/// [`has_cap_sys_ptrace`]'s; `peers` is asked only when the answer depends on it
/// (`ptrace_scope` 1), since finding the peer processes may wait for them.
///
/// | `ptrace_scope` | peers | decision |
/// |---|---|---|
/// | none, 0 | any | [`Ptracer::Unchanged`] |
/// | 1 (and values Yama does not define) | none | [`Ptracer::Unchanged`] |
/// | 1 | one process | [`Ptracer::Name`] it |
/// | 1 | several, or unknown | [`Ptracer::Any`] |
/// | 2 | any | [`Ptracer::Unchanged`] with `CAP_SYS_PTRACE`, else [`Ptracer::CmaOff`] |
/// | 3 | any | [`Ptracer::CmaOff`] |
pub fn decide(
    scope: Option<u32>,
    cap_sys_ptrace: bool,
    peers: impl FnOnce() -> PeerProcesses,
) -> Ptracer {
    match scope {
        None | Some(0) => Ptracer::Unchanged,
        Some(2) if cap_sys_ptrace => Ptracer::Unchanged,
        Some(2 | 3) => Ptracer::CmaOff,
        Some(_) => match peers() {
            PeerProcesses::None => Ptracer::Unchanged,
            PeerProcesses::One(pid) => Ptracer::Name(pid),
            PeerProcesses::Several => Ptracer::Any,
        },
    }
}

/// The exception this process holds (as far as quiver set it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// None set by quiver.
    Nothing,
    /// `PR_SET_PTRACER` with this pid.
    Named(u32),
    /// `PR_SET_PTRACER_ANY`.
    Any,
}

/// What to ask the kernel for, holding `held` and wanting `want` as well (the
/// exceptions of every endpoint of the process are merged: one named tracer fits only
/// one peer process); `None` when `held` covers it already.
pub(crate) fn merge(held: Held, want: Ptracer) -> Option<Held> {
    match (held, want) {
        (_, Ptracer::Unchanged | Ptracer::CmaOff) | (Held::Any, _) => None,
        (Held::Named(p), Ptracer::Name(q)) if p == q => None,
        (Held::Nothing, Ptracer::Name(q)) => Some(Held::Named(q)),
        (Held::Named(_), Ptracer::Name(_)) | (_, Ptracer::Any) => Some(Held::Any),
    }
}

/// This process's exception, as quiver set it (the last `PR_SET_PTRACER` wins, so every
/// change goes through here).
static HELD: Mutex<Held> = Mutex::new(Held::Nothing);

/// Whether [`apply`] said already that attach cannot work here.
static OFF_SAID: AtomicBool = AtomicBool::new(false);

/// Carries out `decision` for this process, merged with what earlier calls set
/// ([`merge`]); logs each change at `info`, and [`Ptracer::CmaOff`] once at `warn`.
/// Returns whether cross-memory attach may be used (false only for
/// [`Ptracer::CmaOff`]). A prctl that fails is logged at `debug` and changes nothing
/// (the peers' reads then fail, are logged there, and take the two-copy path).
pub fn apply(decision: Ptracer) -> bool {
    if decision == Ptracer::CmaOff {
        if !OFF_SAID.swap(true, Ordering::Relaxed) {
            let why = match ptrace_scope() {
                Some(2) => "kernel.yama.ptrace_scope = 2 and no CAP_SYS_PTRACE".to_string(),
                Some(s) => format!("kernel.yama.ptrace_scope = {s}"),
                None => "Yama".to_string(),
            };
            tracing::warn!(
                "cross-memory attach cannot work here ({why}): turned off; tagged messages \
                 inside a node take the two-copy path"
            );
        }
        return false;
    }
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let Some(next) = merge(*held, decision) else {
        return true;
    };
    match set_ptracer(next) {
        Ok(()) => {
            match (next, *held) {
                (Held::Named(pid), _) => tracing::info!(
                    "cross-memory attach: prctl(PR_SET_PTRACER, {pid}): the job's other \
                     process on this node may read and write this one (Yama ptrace_scope 1)"
                ),
                (Held::Any, Held::Named(was)) => tracing::info!(
                    "cross-memory attach: prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) instead \
                     of process {was}: more than one peer process now; any process of this \
                     user may read and write this one (Yama ptrace_scope 1)"
                ),
                _ => tracing::info!(
                    "cross-memory attach: prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY): any \
                     process of this user may read and write this one (Yama ptrace_scope 1; \
                     the job has several processes on this node)"
                ),
            }
            *held = next;
        }
        Err(e) => tracing::debug!("cross-memory attach: PR_SET_PTRACER {next:?}: {e}"),
    }
    true
}

/// `PR_SET_PTRACER_ANY`, whatever Yama's setting; recorded so that quiver never narrows
/// it afterwards. `Ok(false)` without Yama (`EINVAL`).
pub fn allow_any() -> io::Result<bool> {
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    match set_ptracer(Held::Any) {
        Ok(()) => {
            *held = Held::Any;
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `prctl(PR_SET_PTRACER, ...)`. `EINVAL`: no Yama, or no process with that pid here.
fn set_ptracer(to: Held) -> io::Result<()> {
    let arg: libc::c_ulong = match to {
        Held::Nothing => 0,
        Held::Named(pid) => libc::c_ulong::from(pid),
        Held::Any => libc::PR_SET_PTRACER_ANY,
    };
    let zero: libc::c_ulong = 0;
    // SAFETY: PR_SET_PTRACER takes an integer argument (a pid, 0, or
    // PR_SET_PTRACER_ANY); no memory is passed, the trailing arguments are unused zeros.
    let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, arg, zero, zero, zero) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> PeerProcesses {
        panic!("the peers are asked for only under ptrace_scope 1")
    }

    #[test]
    fn without_yama_or_at_scope_0_nothing_changes() {
        for cap in [false, true] {
            assert_eq!(decide(None, cap, never), Ptracer::Unchanged);
            assert_eq!(decide(Some(0), cap, never), Ptracer::Unchanged);
        }
    }

    #[test]
    fn at_scope_1_the_one_peer_process_is_named_else_any() {
        for cap in [false, true] {
            let d = |p| decide(Some(1), cap, || p);
            assert_eq!(d(PeerProcesses::None), Ptracer::Unchanged);
            assert_eq!(d(PeerProcesses::One(4242)), Ptracer::Name(4242));
            assert_eq!(d(PeerProcesses::Several), Ptracer::Any);
        }
        // A value Yama does not define is read as 1.
        assert_eq!(
            decide(Some(7), false, || PeerProcesses::One(9)),
            Ptracer::Name(9)
        );
    }

    #[test]
    fn at_scope_2_attach_needs_cap_sys_ptrace_and_at_3_it_is_off() {
        assert_eq!(decide(Some(2), true, never), Ptracer::Unchanged);
        assert_eq!(decide(Some(2), false, never), Ptracer::CmaOff);
        for cap in [false, true] {
            assert_eq!(decide(Some(3), cap, never), Ptracer::CmaOff);
        }
    }

    #[test]
    fn exceptions_merge_narrowest_first_and_widen_for_a_second_process() {
        use Held::*;
        assert_eq!(merge(Nothing, Ptracer::Unchanged), None);
        assert_eq!(merge(Nothing, Ptracer::CmaOff), None);
        assert_eq!(merge(Nothing, Ptracer::Name(5)), Some(Named(5)));
        assert_eq!(merge(Named(5), Ptracer::Name(5)), None, "held already");
        assert_eq!(
            merge(Named(5), Ptracer::Name(6)),
            Some(Any),
            "one named tracer cannot cover two processes (the last call wins)"
        );
        assert_eq!(merge(Nothing, Ptracer::Any), Some(Any));
        assert_eq!(merge(Named(5), Ptracer::Any), Some(Any));
        for want in [Ptracer::Name(5), Ptracer::Any, Ptracer::Unchanged] {
            assert_eq!(merge(Any, want), None, "never narrowed again");
        }
        assert_eq!(merge(Named(5), Ptracer::Unchanged), None);
    }

    #[test]
    fn the_scope_and_capabilities_are_read_without_error() {
        // Whatever this machine has: the file's absence is no Yama, and CapEff parses.
        let scope = ptrace_scope();
        assert!(scope.is_none() || std::path::Path::new(PTRACE_SCOPE_PATH).exists());
        let _ = has_cap_sys_ptrace();
        // A decision this machine would make: attach stays on unless Yama forbids it.
        let d = decide(scope, has_cap_sys_ptrace(), || PeerProcesses::None);
        assert_eq!(
            d == Ptracer::CmaOff,
            matches!(scope, Some(3)) || (scope == Some(2) && !has_cap_sys_ptrace())
        );
        // Unchanged and CmaOff make no system call; only CmaOff turns attach off.
        assert!(apply(Ptracer::Unchanged));
    }
}
