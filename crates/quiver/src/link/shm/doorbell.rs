//! The doorbell: a Unix datagram socket per receiving endpoint, in the abstract namespace
//! (`quiver-UID-JOB-RANK-DPID`), that makes the endpoint's descriptor readable when a
//! sender rings it. Only used when the receiver sleeps (see `wake`); datagrams carry no
//! data, and a full socket buffer just means the receiver is already being woken.

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

fn address(job_id: u32, rank: u32, dpid: u16) -> io::Result<SocketAddr> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    SocketAddr::from_abstract_name(format!("quiver-{uid}-{job_id:08x}-{rank}-{dpid}"))
}

/// How long a taken doorbell address is tried again ([`Doorbell::bind`]).
const REBIND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The receiver's end.
pub(crate) struct Doorbell {
    sock: UnixDatagram,
}

impl Doorbell {
    /// Binds the receiver's socket. The address stays taken while any copy of the old
    /// socket is open: an endpoint closed and opened again on the same DPID can find
    /// it taken for the moment another thread of the process spends between `fork` and
    /// `exec` (its child holds a copy of every descriptor until `exec` closes them),
    /// so a taken address is tried again for up to [`REBIND_WAIT`]. A DPID open twice
    /// in one process is refused before this, by the job's registry; what is still
    /// taken after the wait is another process's endpoint.
    pub(crate) fn bind(job_id: u32, rank: u32, dpid: u16) -> Result<Doorbell> {
        let addr = address(job_id, rank, dpid).map_err(|e| Error::io("doorbell address", e))?;
        let start = std::time::Instant::now();
        let sock = loop {
            match UnixDatagram::bind_addr(&addr) {
                Ok(sock) => break sock,
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    if start.elapsed() >= REBIND_WAIT {
                        return Err(Error::DpidInUse { dpid });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => return Err(Error::io("binding the doorbell socket", e)),
            }
        };
        sock.set_nonblocking(true)
            .map_err(|e| Error::io("doorbell socket", e))?;
        Ok(Doorbell { sock })
    }

    /// Empties the socket.
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 16];
        while self.sock.recv(&mut buf).is_ok() {}
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// A sender's handle on one receiver's doorbell.
pub(crate) struct Bell {
    sock: UnixDatagram,
    addr: SocketAddr,
}

impl Bell {
    pub(crate) fn new(job_id: u32, rank: u32, dpid: u16) -> Result<Bell> {
        let addr = address(job_id, rank, dpid).map_err(|e| Error::io("doorbell address", e))?;
        let sock = UnixDatagram::unbound().map_err(|e| Error::io("doorbell socket", e))?;
        sock.set_nonblocking(true)
            .map_err(|e| Error::io("doorbell socket", e))?;
        Ok(Bell { sock, addr })
    }

    /// Rings; errors are ignored: a full buffer means a wake-up is already queued, and a
    /// missing receiver is detected by the liveness checks of the sender.
    pub(crate) fn ring(&self) {
        let _ = self.sock.send_to_addr(&[1], &self.addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child forked while the doorbell was open holds a copy of its socket until it
    /// execs or exits: the address is taken meanwhile, and the endpoint closed and
    /// opened again binds once the copy is gone instead of failing.
    #[test]
    fn a_doorbell_reopened_while_a_fork_holds_the_old_one_binds_when_it_is_gone() {
        let job = 0x7d00_0000 | std::process::id() & 0xffff;
        let bell = Doorbell::bind(job, 0, 7).unwrap();
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only reads the pipe and exits (async-signal-safe calls),
        // touching nothing the parent's other threads may hold locked.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork");
        if child == 0 {
            let mut b = 0u8;
            // SAFETY: in the child: wait for the parent's word, then leave without
            // running any destructor.
            unsafe {
                libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
                libc::_exit(0);
            }
        }
        drop(bell);
        let addr = address(job, 0, 7).unwrap();
        let taken = UnixDatagram::bind_addr(&addr).err().map(|e| e.kind());
        // SAFETY: writing one byte from a live buffer to the pipe's write end, then
        // closing both ends (ours).
        unsafe {
            libc::write(fds[1], [1u8].as_ptr().cast(), 1);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let again = Doorbell::bind(job, 0, 7);
        let mut status = 0;
        // SAFETY: reaping the child made above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(
            taken,
            Some(io::ErrorKind::AddrInUse),
            "the child's copy keeps it"
        );
        assert!(again.is_ok(), "{:?}", again.err());
    }
}
