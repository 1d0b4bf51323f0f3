//! IP multicast for the engine's group channel (GAMMA's native broadcast over UDP): the
//! job's group address, the socket on which each endpoint receives the job's broadcasts,
//! and the options with which the link's own socket sends them.
//!
//! Every endpoint of a job joins one IPv4 group (`239.113.x.y`, an organization-local
//! address) on one port, both from the job id, on the interface that carries its rank's
//! address; a root's frame sent there reaches every endpoint of the job on every node
//! (and, looped back, on its own: the engine drops what comes from a rank it reaches
//! over shared memory, and its own). Another job whose id falls on the same group and
//! port is told apart by the frame's job id and token, as on Ethernet. IPv6 is not
//! joined (the link then has no broadcast, and broadcasts go down a tree).
//!
//! The group socket is read after the link's own socket, every poll while broadcasts
//! arrive and every [`IDLE_EVERY`]th poll otherwise (one more system call per poll
//! would slow every unicast receive); its descriptor is the link's second one, which
//! waiters watch beside the first.

use super::{SlotPool, RECV_BATCH};
use crate::link::{setsockopt, Datagram};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

/// While no broadcast arrives, the group socket is read every this many polls.
const IDLE_EVERY: u32 = 4;
/// Polls that read the group socket every time after one that found a datagram.
const ACTIVE_POLLS: u32 = 64;

/// Job `job_id`'s group: its multicast address and port.
pub(crate) fn group_addr(job_id: u32) -> SocketAddrV4 {
    let h = job_id.wrapping_mul(0x9E37_79B9);
    let [a, b, c, _] = h.to_be_bytes();
    let port = 20_000 + (u16::from_be_bytes([a, b]) % 10_000);
    SocketAddrV4::new(Ipv4Addr::new(239, 113, c, h as u8), port)
}

/// The socket an endpoint receives its job's broadcasts on.
pub(super) struct GroupSocket {
    sock: UdpSocket,
    /// Where broadcasts go.
    pub(super) dest: SocketAddr,
    /// Polls since the socket was last read.
    polls: u32,
    /// Polls left that read the socket every time.
    active: u32,
}

impl GroupSocket {
    /// Joins job `job_id`'s group on the interface of `ip`, and sets `send` (the link's
    /// socket) to send to it from that interface, one hop, looped back to this host.
    pub(super) fn join(job_id: u32, ip: IpAddr, send: &UdpSocket) -> io::Result<GroupSocket> {
        let IpAddr::V4(ip) = ip else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "IP multicast over IPv6 is not joined",
            ));
        };
        let group = group_addr(job_id);
        // SAFETY: socket has no memory preconditions; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let sock = unsafe { UdpSocket::from_raw_fd(fd) };
        // Every endpoint of the job on this host binds the same group and port.
        setsockopt(
            &sock,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &(1 as libc::c_int),
        )?;
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: group.port().to_be(),
            sin_addr: in_addr(*group.ip()),
            sin_zero: [0; 8],
        };
        // SAFETY: `addr` is a valid sockaddr_in for the duration of the call.
        let rc = unsafe {
            libc::bind(
                fd,
                &addr as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let mreq = libc::ip_mreq {
            imr_multiaddr: in_addr(*group.ip()),
            imr_interface: in_addr(ip),
        };
        setsockopt(&sock, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &mreq)?;
        super::set_buffer(&sock, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, super::RCVBUF);
        setsockopt(send, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &in_addr(ip))?;
        setsockopt(
            send,
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_TTL,
            &(1 as libc::c_int),
        )?;
        setsockopt(
            send,
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_LOOP,
            &(1 as libc::c_int),
        )?;
        Ok(GroupSocket {
            sock,
            dest: SocketAddr::V4(group),
            polls: 0,
            active: 0,
        })
    }

    /// Reads what has arrived on the group socket into free slots of `pool`, when this
    /// poll is one that reads it (module documentation).
    pub(super) fn poll(&mut self, pool: &mut SlotPool, out: &mut Vec<Datagram>) -> io::Result<()> {
        self.polls += 1;
        if self.active == 0 && self.polls < IDLE_EVERY {
            return Ok(());
        }
        self.polls = 0;
        self.active = self.active.saturating_sub(1);
        for _ in 0..RECV_BATCH {
            let Some(&slot) = pool.free.last() else {
                return Ok(()); // the rest waits in the socket for free slots
            };
            let at = slot as usize * pool.slot_size;
            // SAFETY: sockaddr_in is plain data; zero is valid.
            let mut from: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            // SAFETY: the slot's bytes lie inside the pool, which is borrowed mutably
            // for the call; `from` is valid for `from_len` bytes.
            let n = unsafe {
                libc::recvfrom(
                    self.sock.as_raw_fd(),
                    pool.buf.as_mut_ptr().add(at) as *mut libc::c_void,
                    pool.slot_size,
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    &mut from as *mut _ as *mut libc::sockaddr,
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(()),
                    _ => Err(e),
                };
            }
            pool.free.pop();
            pool.sources[slot as usize] =
                IpAddr::V4(Ipv4Addr::from(u32::from_be(from.sin_addr.s_addr)));
            // A datagram longer than a slot is no quiver frame: length 0, which the
            // decoder rejects.
            let len = if n as usize > pool.slot_size {
                0
            } else {
                n as usize
            };
            out.push(Datagram { slot, len });
            self.active = ACTIVE_POLLS;
        }
        Ok(())
    }

    /// The group socket's descriptor, for waiters.
    pub(super) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

fn in_addr(ip: Ipv4Addr) -> libc::in_addr {
    libc::in_addr {
        s_addr: u32::from(ip).to_be(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_group_is_organization_local_and_fixed() {
        for job in [0, 1, 4242, u32::MAX] {
            let g = group_addr(job);
            assert_eq!(g, group_addr(job));
            assert_eq!(g.ip().octets()[..2], [239, 113]);
            assert!((20_000..30_000).contains(&g.port()));
        }
        assert_ne!(group_addr(1), group_addr(2));
    }
}
