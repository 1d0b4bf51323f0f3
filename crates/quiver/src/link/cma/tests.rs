use super::*;
use proptest::prelude::*;

fn me() -> u32 {
    std::process::id()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

#[test]
fn read_and_write_own_process_across_sizes() {
    for len in [0usize, 1, 4095, 4096, 4097, 1 << 20] {
        let src = pattern(len, 7);
        let mut dst = vec![0u8; len];
        assert_eq!(read_from(me(), &pieces_of(&src), &mut dst).unwrap(), len);
        assert_eq!(dst, src, "read of {len} bytes");

        let mut target = vec![0u8; len];
        let pieces = pieces_of(&target);
        let data = pattern(len, 99);
        assert_eq!(write_to(me(), &pieces, &data).unwrap(), len);
        // The kernel wrote behind the compiler's back: read through a fresh borrow
        // made after the call.
        assert_eq!(
            std::hint::black_box(&mut target)[..],
            data[..],
            "write of {len} bytes"
        );
    }
}

#[test]
fn pieces_of_a_buffer() {
    let buf = [1u8, 2, 3];
    assert_eq!(
        pieces_of(&buf),
        vec![Piece {
            addr: buf.as_ptr() as u64,
            len: 3
        }]
    );
    assert!(pieces_of(&[]).is_empty());
    assert_eq!(total_len(&[Piece::of(&buf), Piece::of(&buf)]).unwrap(), 6);
}

#[test]
fn scatter_list() {
    let bufs: Vec<Vec<u8>> = [5usize, 0, 4096, 1, 70_000, 3]
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u8))
        .collect();
    let pieces: Vec<Piece> = bufs.iter().map(|b| Piece::of(b)).collect();
    let whole: Vec<u8> = bufs.concat();
    let mut dst = vec![0u8; whole.len()];
    assert_eq!(read_from(me(), &pieces, &mut dst).unwrap(), whole.len());
    assert_eq!(dst, whole);

    let mut targets: Vec<Vec<u8>> = bufs.iter().map(|b| vec![0u8; b.len()]).collect();
    let pieces: Vec<Piece> = targets.iter().map(|b| Piece::of(b)).collect();
    let data = pattern(whole.len(), 200);
    assert_eq!(write_to(me(), &pieces, &data).unwrap(), data.len());
    assert_eq!(std::hint::black_box(&mut targets).concat(), data);
}

#[test]
fn more_pieces_than_iov_max() {
    // 3000 pieces of 7 bytes, every other 7-byte chunk of the source.
    let src = pattern(3000 * 14, 3);
    let pieces: Vec<Piece> = src.chunks(14).map(|c| Piece::of(&c[..7])).collect();
    assert!(pieces.len() > 2 * IOV_MAX);
    let want: Vec<u8> = src.chunks(14).flat_map(|c| c[..7].to_vec()).collect();
    let mut dst = vec![0u8; want.len()];
    assert_eq!(read_from(me(), &pieces, &mut dst).unwrap(), want.len());
    assert_eq!(dst, want);

    let mut target = vec![0u8; src.len()];
    let pieces: Vec<Piece> = target.chunks(14).map(|c| Piece::of(&c[..7])).collect();
    let data = pattern(pieces.len() * 7, 11);
    assert_eq!(write_to(me(), &pieces, &data).unwrap(), data.len());
    let target = std::hint::black_box(&mut target);
    for (i, c) in target.chunks(14).enumerate() {
        assert_eq!(c[..7], data[i * 7..i * 7 + 7]);
        assert_eq!(c[7..], [0u8; 7]);
    }
}

#[test]
fn large_transfer_64_mib() {
    let len = 64 << 20;
    let src = pattern(len, 1);
    let mut dst = vec![0u8; len];
    assert_eq!(read_from(me(), &pieces_of(&src), &mut dst).unwrap(), len);
    assert!(dst == src);
}

/// A `reps * chunk`-byte virtual range whose every `chunk` bytes map the same memfd:
/// gigabytes of address space over `chunk` bytes of memory.
struct Aliased {
    base: *mut u8,
    len: usize,
}

impl Aliased {
    fn new(chunk: usize, reps: usize) -> Aliased {
        let len = chunk * reps;
        // SAFETY: a fresh, CLOEXEC memfd; the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"quiver-cma-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: fd is our memfd.
        assert_eq!(unsafe { libc::ftruncate(fd, chunk as libc::off_t) }, 0);
        // SAFETY: reserving fresh address space; nothing is mapped over existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        for i in 0..reps {
            // SAFETY: MAP_FIXED inside the reservation made above, which we own.
            let at = unsafe {
                libc::mmap(
                    base.cast::<u8>().add(i * chunk).cast(),
                    chunk,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    0,
                )
            };
            assert_ne!(at, libc::MAP_FAILED);
        }
        // SAFETY: fd is ours; the mappings keep the memory.
        unsafe { libc::close(fd) };
        Aliased {
            base: base.cast(),
            len,
        }
    }
}

impl Drop for Aliased {
    fn drop(&mut self) {
        // SAFETY: the whole range was mapped by Aliased::new and is unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[test]
fn transfer_above_2_gib() {
    // 3 GiB in one piece, over 64 MiB of memory on each side.
    let chunk = 64usize << 20;
    let reps = 48;
    let src = Aliased::new(chunk, reps);
    let dst = Aliased::new(chunk, reps);
    let want = pattern(chunk, 5);
    // SAFETY: the first chunk of src is mapped read-write and not otherwise borrowed.
    unsafe { std::slice::from_raw_parts_mut(src.base, chunk) }.copy_from_slice(&want);
    let piece = Piece {
        addr: src.base as u64,
        len: src.len,
    };
    {
        // SAFETY: dst's range is mapped read-write; only the kernel writes through it
        // while this borrow lives.
        let local = unsafe { std::slice::from_raw_parts_mut(dst.base, dst.len) };
        assert_eq!(read_from(me(), &[piece], local).unwrap(), 3 << 30);
    }
    // SAFETY: mapped, no other borrow of dst lives now.
    let got = unsafe { std::slice::from_raw_parts(dst.base.add(dst.len - chunk), chunk) };
    assert!(got == &want[..]);
}

/// `pages` pages reserved read-write, with the page at `hole` made inaccessible
/// (`PROT_NONE`) and the page at `ro` (if any) read-only.
struct Pages {
    base: *mut u8,
    len: usize,
}

fn page() -> usize {
    // SAFETY: sysconf has no memory effects.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

impl Pages {
    fn new(pages: usize, hole: usize, ro: Option<usize>) -> Pages {
        let len = pages * page();
        // SAFETY: a fresh anonymous mapping.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base: *mut u8 = base.cast();
        // SAFETY: the pages lie inside the mapping made above.
        unsafe {
            std::ptr::write_bytes(base, 0x11, len);
            assert_eq!(
                libc::mprotect(base.add(hole * page()).cast(), page(), libc::PROT_NONE),
                0
            );
            if let Some(ro) = ro {
                assert_eq!(
                    libc::mprotect(base.add(ro * page()).cast(), page(), libc::PROT_READ),
                    0
                );
            }
        }
        Pages { base, len }
    }

    fn addr(&self, page_no: usize) -> u64 {
        self.base as u64 + (page_no * page()) as u64
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made by Pages::new, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[test]
fn bad_address() {
    let p = page();
    let pages = Pages::new(3, 1, Some(2));
    // An inaccessible page alone.
    let mut dst = vec![0u8; 10];
    match read_from(
        me(),
        &[Piece {
            addr: pages.addr(1),
            len: 10,
        }],
        &mut dst,
    ) {
        Err(CmaError::BadAddress { pid, addr, done }) => {
            assert_eq!((pid, addr, done), (me(), pages.addr(1), 0));
        }
        other => panic!("{other:?}"),
    }
    // A piece running from a good page into the hole: a partial transfer, then the
    // fault is reported where it stopped.
    let mut dst = vec![0u8; p + 100];
    match read_from(
        me(),
        &[Piece {
            addr: pages.addr(0),
            len: p + 100,
        }],
        &mut dst,
    ) {
        Err(CmaError::BadAddress { addr, done, .. }) => {
            assert_eq!((addr, done), (pages.addr(1), p));
            assert!(dst[..p].iter().all(|&b| b == 0x11));
        }
        other => panic!("{other:?}"),
    }
    // The same over two pieces.
    let pieces = [
        Piece {
            addr: pages.addr(0),
            len: p,
        },
        Piece {
            addr: pages.addr(1),
            len: 1,
        },
    ];
    let mut dst = vec![0u8; p + 1];
    assert!(matches!(
        read_from(me(), &pieces, &mut dst),
        Err(CmaError::BadAddress { done, addr, .. }) if done == p && addr == pages.addr(1)
    ));
    // Writing to a read-only page.
    let r = write_to(
        me(),
        &[Piece {
            addr: pages.addr(2),
            len: 8,
        }],
        &[0u8; 8],
    );
    assert!(
        matches!(r, Err(CmaError::BadAddress { done: 0, .. })),
        "{r:?}"
    );
    // Address 0 and the top of the address space.
    for addr in [0u64, 8, u64::MAX - 4096 - 16] {
        let r = read_from(me(), &[Piece { addr, len: 16 }], &mut [0u8; 16]);
        assert!(
            matches!(r, Err(CmaError::BadAddress { .. })),
            "{addr:#x}: {r:?}"
        );
    }
}

#[test]
fn no_such_process() {
    let mut dst = [0u8; 4];
    let src = [1u8; 4];
    // Above PID_MAX_LIMIT (4M), so never a live pid; and pids no process can have.
    for pid in [i32::MAX as u32, 0, u32::MAX, 1 << 31] {
        let r = read_from(pid, &pieces_of(&src), &mut dst);
        assert!(
            matches!(r, Err(CmaError::NoSuchProcess { pid: p }) if p == pid),
            "{pid}: {r:?}"
        );
        let r = write_to(pid, &pieces_of(&dst), &src);
        assert!(
            matches!(r, Err(CmaError::NoSuchProcess { .. })),
            "{pid}: {r:?}"
        );
    }
}

#[test]
fn malformed_piece_lists_are_rejected() {
    let src = [1u8; 10];
    let mut dst = [0u8; 9];
    let r = read_from(me(), &pieces_of(&src), &mut dst);
    assert!(
        matches!(
            r,
            Err(CmaError::LengthMismatch {
                remote: 10,
                local: 9
            })
        ),
        "{r:?}"
    );
    let r = write_to(me(), &pieces_of(&dst), &src);
    assert!(
        matches!(
            r,
            Err(CmaError::LengthMismatch {
                remote: 9,
                local: 10
            })
        ),
        "{r:?}"
    );
    // An empty list against a non-empty buffer, and the reverse.
    assert!(matches!(
        read_from(me(), &[], &mut dst),
        Err(CmaError::LengthMismatch { .. })
    ));
    assert!(matches!(
        read_from(me(), &pieces_of(&src), &mut []),
        Err(CmaError::LengthMismatch { .. })
    ));
    // A piece wrapping around the address space.
    let wrap = [Piece {
        addr: u64::MAX - 1,
        len: 10,
    }];
    let r = read_from(me(), &wrap, &mut [0u8; 10]);
    assert!(
        matches!(r, Err(CmaError::BadPiece { index: 0, .. })),
        "{r:?}"
    );
    // Lengths whose sum overflows.
    let huge = [
        Piece { addr: 0, len: 10 },
        Piece {
            addr: 0,
            len: isize::MAX as usize,
        },
        Piece {
            addr: 0,
            len: usize::MAX,
        },
    ];
    let r = read_from(me(), &huge, &mut [0u8; 10]);
    assert!(
        matches!(r, Err(CmaError::BadPiece { index: 1, .. })),
        "{r:?}"
    );
    // A mismatch is found before the pid is looked at.
    let r = read_from(0, &pieces_of(&src), &mut dst);
    assert!(matches!(r, Err(CmaError::LengthMismatch { .. })), "{r:?}");
}

#[test]
fn probe_own_process_and_probe_word() {
    let t = probe_target();
    assert_eq!(t, probe_target());
    assert_ne!(t.value, 0);
    probe(me(), t).unwrap();
    let wrong = ProbeTarget {
        value: t.value ^ 1,
        ..t
    };
    assert!(matches!(
        probe(me(), wrong),
        Err(CmaError::NotThePeer { .. })
    ));
    let unmapped = ProbeTarget { addr: 8, ..t };
    assert!(matches!(
        probe(me(), unmapped),
        Err(CmaError::NotThePeer { .. })
    ));
    assert!(matches!(
        probe(i32::MAX as u32, t),
        Err(CmaError::NotThePeer { .. })
    ));
}

#[test]
fn state_remembers_and_logs_once() {
    let s = CmaState::new();
    assert_eq!(s.availability(), Availability::Unknown);
    assert_eq!(s.probe(me(), probe_target()), Availability::Available);
    assert!(s.is_usable());

    // Errors about one transfer do not disable.
    let src = [3u8; 5];
    let mut dst = [0u8; 5];
    assert!(s.read_from(me(), &pieces_of(&src), &mut dst[..4]).is_err());
    assert!(s
        .read_from(i32::MAX as u32, &pieces_of(&src), &mut dst)
        .is_err());
    assert!(!s.record(1, &CmaError::NoSuchProcess { pid: 1 }));
    assert_eq!(s.read_from(me(), &pieces_of(&src), &mut dst).unwrap(), 5);
    assert_eq!(s.availability(), Availability::Available);

    // The first refusal disables (true: this call logged), later ones change nothing.
    let eperm = || CmaError::NotPermitted {
        pid: 1,
        source: io::Error::from_raw_os_error(libc::EPERM),
    };
    assert!(s.record(1, &eperm()));
    assert!(!s.record(1, &eperm()));
    assert!(!s.record(
        1,
        &CmaError::Unsupported {
            source: io::Error::from_raw_os_error(libc::ENOSYS)
        }
    ));
    assert_eq!(
        s.availability(),
        Availability::Unavailable(Unavailable::NotPermitted)
    );
    assert!(!s.is_usable());
    let r = s.read_from(me(), &pieces_of(&src), &mut dst);
    assert!(
        matches!(
            r,
            Err(CmaError::Disabled {
                reason: Unavailable::NotPermitted
            })
        ),
        "{r:?}"
    );
    let r = s.write_to(me(), &pieces_of(&dst), &src);
    assert!(matches!(r, Err(CmaError::Disabled { .. })), "{r:?}");
    assert_eq!(
        s.probe(me(), probe_target()),
        Availability::Unavailable(Unavailable::NotPermitted)
    );

    // A probe of the wrong process disables a fresh state.
    let s = CmaState::new();
    let t = probe_target();
    assert_eq!(
        s.probe(
            me(),
            ProbeTarget {
                value: !t.value,
                ..t
            }
        ),
        Availability::Unavailable(Unavailable::NotThePeer)
    );
}

#[test]
fn classify_maps_errnos() {
    let c = |e| classify(io::Error::from_raw_os_error(e), 9, 0x1000, 3);
    assert!(matches!(
        c(libc::EPERM),
        CmaError::NotPermitted { pid: 9, .. }
    ));
    assert!(matches!(c(libc::EACCES), CmaError::NotPermitted { .. }));
    assert!(matches!(c(libc::ESRCH), CmaError::NoSuchProcess { pid: 9 }));
    assert!(matches!(
        c(libc::EFAULT),
        CmaError::BadAddress {
            pid: 9,
            addr: 0x1000,
            done: 3
        }
    ));
    assert!(matches!(c(libc::ENOSYS), CmaError::Unsupported { .. }));
    assert!(matches!(c(libc::ENOMEM), CmaError::Io { .. }));
    let msg = c(libc::EPERM).to_string();
    assert!(
        msg.contains("allow_peers") && msg.contains("ptrace_scope"),
        "{msg}"
    );
}

#[test]
fn allow_peers_succeeds() {
    // Ok(false) without Yama, Ok(true) with it.
    allow_peers().unwrap();
}

/// Reaps a forked child: closes its quit pipe (so it exits), kills it if needed.
struct Child {
    pid: libc::pid_t,
    quit: libc::c_int,
}

impl Child {
    /// Lets the child exit and returns its wait status.
    fn finish(mut self) -> libc::c_int {
        let status = self.reap();
        std::mem::forget(self);
        status
    }

    fn reap(&mut self) -> libc::c_int {
        if self.quit >= 0 {
            // SAFETY: our end of the pipe, closed once.
            unsafe { libc::close(self.quit) };
            self.quit = -1;
        }
        let mut status = 0;
        // SAFETY: our child, waited for once.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0 {
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        status
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // SAFETY: our child (not yet reaped, so the pid is still its).
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        self.reap();
    }
}

fn pipe() -> [libc::c_int; 2] {
    let mut fds = [-1; 2];
    // SAFETY: fds has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    fds
}

fn read_byte(fd: libc::c_int) -> isize {
    let mut b = 0u8;
    loop {
        // SAFETY: one byte into a local.
        let n = unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
        if n >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return n;
        }
    }
}

#[test]
fn cross_process_read_and_write() {
    const LEN: usize = 3 * 4096 + 17;
    let mut buf = vec![0xa5u8; LEN];
    let addr = buf.as_mut_ptr();
    // Set the probe word before forking, so that the child inherits it.
    let target = probe_target();
    let ready = pipe();
    let quit = pipe();
    // SAFETY: the child runs only async-signal-safe code (memory stores, read,
    // write, close, _exit) and never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: in the child: `addr` points to the child's copy of `buf` (same
        // virtual address after fork), LEN bytes; the descriptors are the child's
        // copies of the pipes.
        unsafe {
            libc::close(ready[0]);
            libc::close(quit[1]);
            for i in 0..LEN {
                *addr.add(i) = (i % 251) as u8;
            }
            let b = 1u8;
            libc::write(ready[1], (&b as *const u8).cast(), 1);
            // Wait until the parent closes its end (or dies).
            while read_byte(quit[0]) > 0 {}
            libc::_exit(0);
        }
    }
    // SAFETY: the parent's ends not used by it.
    unsafe {
        libc::close(ready[1]);
        libc::close(quit[0]);
    }
    let child = Child { pid, quit: quit[1] };
    assert_eq!(read_byte(ready[0]), 1, "the child did not start");
    // SAFETY: our end of the pipe.
    unsafe { libc::close(ready[0]) };
    let cpid = pid as u32;
    let remote = [Piece {
        addr: addr as u64,
        len: LEN,
    }];

    let mut got = vec![0u8; LEN];
    assert_eq!(read_from(cpid, &remote, &mut got).unwrap(), LEN);
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    assert!(
        buf.iter().all(|&b| b == 0xa5),
        "the parent's copy is untouched"
    );

    // Write in two pieces, read back in one.
    let data = pattern(LEN, 42);
    let halves = [
        Piece {
            addr: addr as u64,
            len: 100,
        },
        Piece {
            addr: addr as u64 + 100,
            len: LEN - 100,
        },
    ];
    assert_eq!(write_to(cpid, &halves, &data).unwrap(), LEN);
    assert_eq!(read_from(cpid, &remote, &mut got).unwrap(), LEN);
    assert_eq!(got, data);
    assert!(buf.iter().all(|&b| b == 0xa5));

    // The child inherited the probe word: it passes the probe.
    let s = CmaState::new();
    assert_eq!(s.probe(cpid, target), Availability::Available);

    let status = child.finish();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
    // Reaped: no such process any more.
    let r = read_from(cpid, &remote, &mut got);
    assert!(matches!(r, Err(CmaError::NoSuchProcess { .. })), "{r:?}");
}

static TARGET_BYTE: AtomicU8 = AtomicU8::new(7);

#[test]
fn another_user_is_not_permitted() {
    // SAFETY: geteuid has no memory effects.
    if unsafe { libc::geteuid() } != 0 {
        crate::test_support::cannot_run("needs root to switch a child to another user");
        return;
    }
    let remote = libc::iovec {
        iov_base: TARGET_BYTE.as_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: the child runs only async-signal-safe code (raw system calls, a store
    // to a local, _exit).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: in the child, single-threaded: raw setresuid changes this thread's
        // (the process's) credentials; the iovecs point to a local byte and to the
        // parent's static (same address after fork).
        unsafe {
            if libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) != 0 {
                libc::_exit(200);
            }
            let mut b = 0u8;
            let local = libc::iovec {
                iov_base: (&mut b as *mut u8).cast(),
                iov_len: 1,
            };
            let n = libc::process_vm_readv(libc::getppid(), &local, 1, &remote, 1, 0);
            libc::_exit(if n == 1 {
                0
            } else {
                (*libc::__errno_location()).clamp(1, 199)
            });
        }
    }
    let child = Child { pid, quit: -1 };
    let status = child.finish();
    assert!(libc::WIFEXITED(status), "{status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, 200, "setresuid failed in the child");
    assert_ne!(code, 0, "an unprivileged child read root's memory");
    let err = classify(io::Error::from_raw_os_error(code), 1, 0, 0);
    assert!(
        matches!(err, CmaError::NotPermitted { .. }),
        "errno {code}: {err}"
    );
    assert_eq!(err.unavailable(), Some(Unavailable::NotPermitted));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any split of a buffer into pieces, under any call limits, reads and writes
    /// exactly the pieces' bytes.
    #[test]
    fn split_transfers(
        cuts in proptest::collection::vec((0usize..64, 0usize..5000), 0..40),
        iovs in 1usize..6,
        bytes in 1usize..9000,
    ) {
        let total: usize = cuts.iter().map(|&(g, n)| g + n).sum();
        let src = pattern(total, 13);
        let mut pieces = Vec::new();
        let mut want = Vec::new();
        let mut at = 0;
        for &(gap, n) in &cuts {
            at += gap;
            pieces.push(Piece::of(&src[at..at + n]));
            want.extend_from_slice(&src[at..at + n]);
            at += n;
        }
        let limits = Limits { iovs, bytes };
        let mut dst = vec![0u8; want.len()];
        let n = transfer(me(), &pieces, Local::Into(&mut dst), limits).unwrap();
        prop_assert_eq!(n, want.len());
        prop_assert_eq!(&dst, &want);

        let mut target = vec![0u8; total];
        let mut tpieces = Vec::new();
        let mut at = 0;
        for &(gap, n) in &cuts {
            at += gap;
            tpieces.push(Piece::of(&target[at..at + n]));
            at += n;
        }
        let data = pattern(want.len(), 77);
        let n = transfer(me(), &tpieces, Local::From(&data), limits).unwrap();
        prop_assert_eq!(n, data.len());
        let target = std::hint::black_box(&mut target);
        let mut at = 0;
        let mut from = 0;
        for &(gap, n) in &cuts {
            prop_assert!(target[at..at + gap].iter().all(|&b| b == 0));
            at += gap;
            prop_assert_eq!(&target[at..at + n], &data[from..from + n]);
            at += n;
            from += n;
        }
    }

    /// Garbage piece lists never panic; they read (harmlessly, from this process)
    /// or fail with a typed error.
    #[test]
    fn garbage_pieces_never_panic(
        raw in proptest::collection::vec((any::<u64>(), 0usize..4096, any::<bool>()), 0..20),
        other_len in 0usize..8192,
        exact in any::<bool>(),
    ) {
        let sum: usize = raw.iter().map(|&(_, len, _)| len).sum();
        let local_len = if exact { sum } else { other_len };
        let near = pattern(8192, 0);
        let pieces: Vec<Piece> = raw
            .iter()
            .map(|&(a, len, close)| Piece {
                addr: if close { near.as_ptr() as u64 + a % 4096 } else { a },
                len,
            })
            .collect();
        let mut dst = vec![0u8; local_len];
        match read_from(me(), &pieces, &mut dst) {
            Ok(n) => prop_assert_eq!(n, local_len),
            Err(CmaError::LengthMismatch { local, .. }) => prop_assert_eq!(local, local_len),
            Err(CmaError::BadAddress { done, .. }) => prop_assert!(done < local_len),
            Err(CmaError::BadPiece { index, .. }) => prop_assert!(index < pieces.len()),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}
