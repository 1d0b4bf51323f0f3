//! How blocking calls wait, and the endpoint's pollable descriptor.
//!
//! An endpoint's descriptor is an epoll instance that holds its shared-memory doorbell
//! and its UDP socket; an epoll descriptor is itself pollable, so a program can put it
//! into its own `poll`/`epoll` set. Waiting follows [`WaitMode`]: busy polling, sleeping
//! on the descriptor, or bounded polling then sleeping (GAMMA's `gamma_wait`). The
//! policy lives in `Waiter`, separate from what is polled, so that progress can later
//! be driven by a dedicated thread instead of the caller.

use crate::config::WaitMode;
use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// An epoll instance.
pub(crate) struct Poller {
    fd: OwnedFd,
}

impl Poller {
    pub(crate) fn new() -> Result<Poller> {
        // SAFETY: epoll_create1 has no memory preconditions; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io("epoll_create1", io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Poller { fd })
    }

    /// Adds `fd` (level-triggered, readable).
    pub(crate) fn add(&self, fd: RawFd) -> Result<()> {
        self.add_with(fd, false)
    }

    /// Adds `fd`, readable, edge-triggered if `edge`: for a descriptor that stays readable
    /// while its owner holds what arrived (a packet ring whose newest frame is held), so
    /// that a sleeper wakes once per arrival instead of spinning.
    pub(crate) fn add_with(&self, fd: RawFd, edge: bool) -> Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32 | if edge { libc::EPOLLET as u32 } else { 0 },
            u64: fd as u64,
        };
        // SAFETY: both descriptors are valid; ev is a valid epoll_event.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if rc != 0 {
            return Err(Error::io("epoll_ctl", io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Sleeps until a registered descriptor is readable or `timeout` passes.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let ms = match timeout {
            None => -1,
            Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
        };
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: evs is a writable array of 4 events.
        let rc = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), 4, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(Error::io("epoll_wait", e));
            }
        }
        Ok(())
    }
}

impl AsRawFd for Poller {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A wake-up descriptor between two threads of one process (an eventfd): one side
/// notifies, the other sleeps on it in a [`Poller`] and drains it on waking.
pub(crate) struct Notifier {
    fd: OwnedFd,
}

impl Notifier {
    pub(crate) fn new() -> Result<Notifier> {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io("eventfd", io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Notifier { fd })
    }

    /// Makes the descriptor readable (wakes the sleeper).
    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. A full counter (EAGAIN)
        // still leaves the descriptor readable, which is all a wake-up needs.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes the descriptor unreadable again (after waking).
    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for Notifier {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Pins the calling thread to `cpu` (`QUIVER_OFFLOAD_CPU`); a refusal is logged, not
/// fatal.
pub(crate) fn pin_current_thread(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it; the call affects
    // only the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(
                "QUIVER_OFFLOAD_CPU={cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// What the waiter polls and how it sleeps.
pub(crate) trait Waitable {
    type Output;
    /// One non-blocking attempt.
    fn poll_once(&self) -> Result<Option<Self::Output>>;
    /// Prepares to sleep (arms wake-ups); the waiter polls once more before sleeping.
    fn arm(&self);
    /// Back to polling.
    fn disarm(&self);
    /// Sleeps until woken or the timeout passes.
    fn sleep(&self, timeout: Option<Duration>) -> Result<()>;
}

/// The waiting policy.
pub(crate) struct Waiter {
    pub mode: WaitMode,
    /// The machine runs more of the job's processes than it has cores
    /// ([`oversubscribed`]): a polling waiter gives its core away between polls (as
    /// Open MPI's `yield_when_idle`), so that the process it waits for can run.
    pub yields: bool,
}

/// Whether this process's machine runs more of the job's ranks than it has cores online:
/// `local_ranks` of them share it. (Not the process's affinity mask: a rank bound to one
/// core of its own by its launcher is not oversubscribed.)
pub(crate) fn oversubscribed(local_ranks: usize) -> bool {
    // SAFETY: sysconf has no memory preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let cores = usize::try_from(online).ok().filter(|&n| n > 0).unwrap_or(1);
    local_ranks > cores
}

impl Waiter {
    /// Polls `w` until it yields, following the wait mode; `Error::Timeout` after `timeout`.
    pub(crate) fn wait<W: Waitable>(&self, w: &W, timeout: Option<Duration>) -> Result<W::Output> {
        if let Some(v) = w.poll_once()? {
            return Ok(v);
        }
        let spin_for = match self.mode {
            WaitMode::Spin => None,
            WaitMode::Block => Some(Duration::ZERO),
            WaitMode::Hybrid(d) => Some(d),
        };
        // Polling phase. The clock is read only every 64 polls (a message usually arrives
        // sooner, and a clock read costs as much as a few polls), and never when spinning
        // without a deadline. On an oversubscribed machine each poll gives the core away.
        // A hybrid waiter polls again after each wake-up: what woke it (a frame of a long
        // message, an acknowledgement) usually has more behind it, and a sleep per
        // arrival costs a long wait several system calls per frame (a 1 MiB MPI ping-pong
        // between nodes ran at half the speed of a spinning one).
        let needs_clock = timeout.is_some() || spin_for.is_some();
        let mut first = None;
        loop {
            let mut round = None;
            let mut n: u32 = 0;
            loop {
                if let Some(v) = w.poll_once()? {
                    return Ok(v);
                }
                if self.yields {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                n = n.wrapping_add(1);
                // A waiter that yields reads it every time: a yield may last a time slice.
                if needs_clock
                    && (self.yields || n.is_multiple_of(64) || spin_for == Some(Duration::ZERO))
                {
                    let now = Instant::now();
                    let first = *first.get_or_insert(now);
                    let round = *round.get_or_insert(now);
                    if timeout.is_some_and(|t| now - first >= t) {
                        return Err(Error::Timeout(timeout.unwrap_or_default()));
                    }
                    if spin_for.is_some_and(|s| now - round >= s) {
                        break;
                    }
                }
            }
            let deadline = timeout.map(|t| *first.get_or_insert_with(Instant::now) + t);
            // Sleeping phase: until something arrives (then, hybrid, polling again).
            loop {
                w.arm();
                let r = w.poll_once();
                match r {
                    Ok(Some(v)) => {
                        w.disarm();
                        return Ok(v);
                    }
                    Err(e) => {
                        w.disarm();
                        return Err(e);
                    }
                    Ok(None) => {}
                }
                let remaining = match deadline {
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            w.disarm();
                            return Err(Error::Timeout(timeout.unwrap_or_default()));
                        }
                        Some(d - now)
                    }
                    None => None,
                };
                let slept = w.sleep(remaining);
                w.disarm();
                slept?;
                if let Some(v) = w.poll_once()? {
                    return Ok(v);
                }
                if spin_for != Some(Duration::ZERO) {
                    break;
                }
            }
        }
    }
}

/// Waits for a condition that has no descriptor (a full ring draining): polls, then
/// backs off with short sleeps. Returns `Error::Timeout` after `timeout` if given.
pub(crate) fn backoff_until<T>(
    mode: WaitMode,
    timeout: Option<Duration>,
    mut attempt: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let spin_for = match mode {
        WaitMode::Spin => Duration::MAX,
        WaitMode::Block => Duration::from_micros(10),
        WaitMode::Hybrid(d) => d,
    };
    let mut pause = Duration::from_micros(5);
    let mut n: u32 = 0;
    loop {
        if let Some(v) = attempt()? {
            return Ok(v);
        }
        n = n.wrapping_add(1);
        let elapsed = start.elapsed();
        if timeout.is_some_and(|t| elapsed >= t) {
            return Err(Error::Timeout(timeout.unwrap_or_default()));
        }
        if elapsed < spin_for {
            std::hint::spin_loop();
            if n.is_multiple_of(1024) {
                std::thread::yield_now();
            }
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    struct Countdown {
        left: Cell<u32>,
        armed: Cell<u32>,
        slept: Cell<u32>,
    }

    impl Waitable for Countdown {
        type Output = ();
        fn poll_once(&self) -> Result<Option<()>> {
            let l = self.left.get();
            if l == 0 {
                return Ok(Some(()));
            }
            self.left.set(l - 1);
            Ok(None)
        }
        fn arm(&self) {
            self.armed.set(self.armed.get() + 1);
        }
        fn disarm(&self) {}
        fn sleep(&self, _t: Option<Duration>) -> Result<()> {
            self.slept.set(self.slept.get() + 1);
            Ok(())
        }
    }

    fn cd(n: u32) -> Countdown {
        Countdown {
            left: Cell::new(n),
            armed: Cell::new(0),
            slept: Cell::new(0),
        }
    }

    #[test]
    fn spin_never_sleeps() {
        let c = cd(10_000);
        Waiter {
            mode: WaitMode::Spin,
            yields: false,
        }
        .wait(&c, None)
        .unwrap();
        assert_eq!(c.slept.get(), 0);
    }

    #[test]
    fn block_sleeps_and_arms_first() {
        let c = cd(200);
        Waiter {
            mode: WaitMode::Block,
            yields: false,
        }
        .wait(&c, None)
        .unwrap();
        assert!(c.slept.get() >= 1);
        assert!(c.armed.get() >= c.slept.get());
    }

    #[test]
    fn timeout_is_reported() {
        let c = cd(u32::MAX);
        let e = Waiter {
            mode: WaitMode::Hybrid(Duration::from_micros(10)),
            yields: true,
        }
        .wait(&c, Some(Duration::from_millis(5)))
        .unwrap_err();
        assert!(matches!(e, Error::Timeout(_)));
    }

    /// Done after a number of sleeps; counts the polls between sleeps.
    struct Wakes {
        needed: u32,
        polls: Cell<u32>,
        between: std::cell::RefCell<Vec<u32>>,
    }

    impl Waitable for Wakes {
        type Output = ();
        fn poll_once(&self) -> Result<Option<()>> {
            if self.between.borrow().len() as u32 >= self.needed {
                return Ok(Some(()));
            }
            self.polls.set(self.polls.get() + 1);
            Ok(None)
        }
        fn arm(&self) {}
        fn disarm(&self) {}
        fn sleep(&self, _t: Option<Duration>) -> Result<()> {
            self.between.borrow_mut().push(self.polls.replace(0));
            Ok(())
        }
    }

    #[test]
    fn a_hybrid_waiter_polls_again_after_each_wake_up_and_a_blocking_one_does_not() {
        for (mode, again) in [
            (WaitMode::Hybrid(Duration::from_micros(50)), true),
            (WaitMode::Block, false),
        ] {
            let w = Wakes {
                needed: 4,
                polls: Cell::new(0),
                between: Default::default(),
            };
            Waiter {
                mode,
                yields: false,
            }
            .wait(&w, None)
            .unwrap();
            let between = w.between.into_inner();
            // Before each sleep after the first: the poll after the last wake-up, the
            // polling round (at least 64 polls before its clock is read), the poll
            // before sleeping.
            for &polls in &between[1..] {
                assert_eq!(polls >= 64, again, "{mode:?}: {between:?}");
            }
        }
    }

    #[test]
    fn more_ranks_than_cores_is_oversubscribed() {
        // SAFETY: sysconf has no memory preconditions.
        let cores = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
        assert!(!oversubscribed(1));
        assert!(!oversubscribed(cores));
        assert!(oversubscribed(cores + 1));
    }

    #[test]
    fn a_yielding_hybrid_waiter_polls_then_sleeps() {
        let c = cd(u32::MAX);
        let e = Waiter {
            mode: WaitMode::Hybrid(Duration::from_micros(200)),
            yields: true,
        }
        .wait(&c, Some(Duration::from_millis(20)))
        .unwrap_err();
        assert!(matches!(e, Error::Timeout(_)));
        assert!(c.slept.get() >= 1, "it went to sleep after polling");
    }

    #[test]
    fn poller_wakes_on_readable_fd() {
        let p = Poller::new().unwrap();
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        p.add(b.as_raw_fd()).unwrap();
        let t = Instant::now();
        p.wait(Some(Duration::from_millis(20))).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(15));
        a.send(b"x").unwrap();
        p.wait(None).unwrap(); // returns at once: readable
    }
}
