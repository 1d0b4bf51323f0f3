//! UDP transport: one socket per endpoint.
//!
//! Receiving: `recvmmsg` fills up to `RECV_BATCH` datagrams per system call straight
//! into free slots of the endpoint's receive pool (fixed-size slots, one datagram each);
//! a single-fragment message is then read in place from its slot. Sending: a message is
//! cut into Directed Messages of at most the configured datagram size; one fragment goes
//! out with `sendmsg`, several with `sendmmsg`, each straight from the buffer the
//! channel built it in (and keeps for retransmission). A run of
//! equal-size datagrams (the fragments of a long message) goes out in one `sendmsg` with
//! generic segmentation offload (`UDP_SEGMENT`): the kernel carries the run through its
//! stack as one packet and cuts it into datagrams at the end, as TCP's segmentation
//! offload does; a run is no longer on the wire than `RUN_TIME` at the pace of the
//! channel that sends it (`run_limit`). Where the kernel refuses it, the link says so
//! once and stops asking.
//! With `UDP_GRO` (optional) the kernel hands over such runs coalesced, up to 64 KiB per
//! receive, into a staging buffer; their datagrams are then copied into free slots, and
//! what does not fit waits in the staging buffer for slots to be freed (nothing is lost).
//!
//! A link may also join its job's IP multicast group (`group.rs`): the engine's group
//! channel then broadcasts through it.
//!
//! This module moves datagrams only; validation and reassembly are the job of the wire
//! and channel layers.

mod group;

use crate::error::{Error, Result};
use crate::link::Datagram;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Datagrams received per `recvmmsg` call at most.
pub(crate) const RECV_BATCH: usize = 32;
/// Fragments sent per `sendmmsg` call at most.
const SEND_BATCH: usize = 64;
/// Datagrams per segmentation-offload send at most (the kernel's `UDP_MAX_SEGMENTS`).
const GSO_SEGMENTS: usize = 64;
/// Bytes per segmentation-offload send at most: one IPv4 UDP datagram's payload.
const GSO_BYTES: usize = 65507;
/// Wire time of one offloaded run at most, at the rate the channel's window and round
/// trip give ([`run_limit`]). A run longer than a software-paced link's bucket (`tbf`)
/// is cut into frames by the link, each paced on its own timer, and udp lost 4-15 % at
/// 1 Gbit/s that way; a short run passes whole. 50 µs keeps full runs on an unshaped
/// veth (2-3 GB/s), about 40 datagrams at 10 Gbit/s, 4 at 1 Gbit/s, and none at
/// 100 Mbit/s (docs/DESIGN-NOTES.md, "Offloaded runs on a paced link").
pub(crate) const RUN_TIME: std::time::Duration = std::time::Duration::from_micros(50);
/// Bytes of the staging buffer of coalesced receives (the kernel coalesces at most
/// 64 KiB; the rest is margin, so that a truncation means a foreign sender).
const GRO_BYTES: usize = 128 << 10;
/// Socket buffer sizes asked for (the kernel may grant less).
const RCVBUF: usize = 16 << 20;
const SNDBUF: usize = 4 << 20;
/// Coalesced receives of one datagram each, in a row, after which traffic counts as sparse
/// and coalescing is turned off (a stream's empty polls do not count: a fast reader makes
/// many).
const SPARSE_AFTER: u32 = 8;
/// Destinations of one link that get a connected socket of their own (see
/// [`SockAddr`]); the others are sent to with `sendto`, so that a job of thousands of
/// ranks does not use thousands of descriptors per endpoint.
const CONNECTED_MAX: usize = 64;

/// The receive pool: `slots` buffers of `slot_size` bytes, each holding one datagram.
pub(crate) struct SlotPool {
    buf: Box<[u8]>,
    slot_size: usize,
    free: Vec<u32>,
    /// The address each slot's datagram came from (its sender is checked against the
    /// address its frame's rank published).
    sources: Vec<IpAddr>,
}

impl SlotPool {
    pub(crate) fn new(pool_bytes: usize, slot_size: usize) -> SlotPool {
        let slots = (pool_bytes / slot_size).max(RECV_BATCH);
        SlotPool {
            buf: vec![0u8; slots * slot_size].into_boxed_slice(),
            slot_size,
            free: (0..slots as u32).rev().collect(),
            sources: vec![IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED); slots],
        }
    }

    /// The address slot `i`'s datagram came from.
    pub(crate) fn source(&self, i: u32) -> IpAddr {
        self.sources[i as usize]
    }

    /// Bytes per slot: the largest datagram the pool receives.
    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// The bytes of slot `i`.
    pub(crate) fn slot(&self, i: u32) -> &[u8] {
        let at = i as usize * self.slot_size;
        &self.buf[at..at + self.slot_size]
    }

    pub(crate) fn free_slot(&mut self, i: u32) {
        debug_assert!(!self.free.contains(&i));
        self.free.push(i);
    }
}

/// An endpoint's UDP socket.
pub(crate) struct UdpLink {
    sock: UdpSocket,
    local: SocketAddr,
    /// Receive mode: while traffic is sparse (a ping-pong) receive one datagram per call
    /// with `recv`; after several datagrams in a row without an empty receive, switch to
    /// `recvmmsg` batches, and back when a batch brings at most one.
    batching: bool,
    /// Consecutive single receives that found a datagram.
    streak: u32,
    /// Whether runs of equal-size datagrams go out with `UDP_SEGMENT`; cleared for good
    /// when the kernel refuses it.
    gso: AtomicBool,
    /// Coalesced receives (`UDP_GRO`), when asked for and granted. The socket option is
    /// on only while traffic streams (`batching`): with it, every receive is a
    /// `recvmsg` into the staging buffer, which costs a sparse (ping-pong) reader about
    /// half a microsecond per message (DESIGN-NOTES).
    gro: Option<Staged>,
    /// Whether the socket may hold coalesced datagrams: the option is on, or was until
    /// the socket was last found empty. Receives are coalesced receives meanwhile.
    gro_on: bool,
    /// Consecutive coalesced receives that brought exactly one datagram: the signature of
    /// sparse traffic (a stream brings runs, or several queued datagrams).
    singles: u32,
    /// Connected sockets made for destinations so far (at most [`CONNECTED_MAX`]).
    connected: std::cell::Cell<usize>,
    /// The job's multicast group, once joined ([`UdpLink::join_group`]).
    group: Option<group::GroupSocket>,
}

/// A coalesced receive being handed over: `seg`-byte datagrams (the last may be shorter)
/// in `buf[at..len]`.
struct Staged {
    buf: Box<[u8]>,
    len: usize,
    seg: usize,
    at: usize,
    /// Where the staged run came from.
    from: IpAddr,
}

impl UdpLink {
    /// Binds a socket to `ip`, port chosen by the kernel; `gso`: send runs of equal-size
    /// datagrams with segmentation offload; `gro`: receive them coalesced.
    pub(crate) fn bind(ip: IpAddr, gso: bool, gro: bool) -> Result<UdpLink> {
        let sock = UdpSocket::bind((ip, 0))
            .map_err(|e| Error::io(format!("binding a UDP socket to {ip}"), e))?;
        let local = sock
            .local_addr()
            .map_err(|e| Error::io("UDP socket address", e))?;
        set_buffer(&sock, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, RCVBUF);
        set_buffer(&sock, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, SNDBUF);
        // Granted or not is learned now; the option itself waits for streaming traffic.
        let gro = gro && set_gro(&sock, true) && set_gro(&sock, false);
        Ok(UdpLink {
            sock,
            local,
            batching: false,
            streak: 0,
            gso: AtomicBool::new(gso),
            gro: gro.then(|| Staged {
                from: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                buf: vec![0u8; GRO_BYTES].into_boxed_slice(),
                len: 0,
                seg: 0,
                at: 0,
            }),
            connected: std::cell::Cell::new(0),
            group: None,
            gro_on: false,
            singles: 0,
        })
    }

    /// Whether this socket sends runs of datagrams with segmentation offload (it was
    /// asked to, and the kernel has not refused it yet).
    pub(crate) fn segments(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Joins job `job_id`'s IP multicast group on the interface of `ip` (IPv4): from
    /// then on the link receives the job's broadcasts and can send them
    /// ([`UdpLink::group_dest`]).
    pub(crate) fn join_group(&mut self, job_id: u32, ip: IpAddr) -> Result<()> {
        let g = group::GroupSocket::join(job_id, ip, &self.sock).map_err(|e| {
            Error::io(
                format!(
                    "joining the job's IP multicast group {} on {ip}",
                    group::group_addr(job_id)
                ),
                e,
            )
        })?;
        self.group = Some(g);
        Ok(())
    }

    /// Where a broadcast to the group this link joined goes (sent from the link's own
    /// socket: it has the multicast options).
    pub(crate) fn group_dest(&self) -> Option<SockAddr> {
        let dest = self.group.as_ref()?.dest;
        Some(SockAddr::unconnected(&dest))
    }

    /// The group socket's descriptor, which a waiter watches beside the link's.
    pub(crate) fn group_fd(&self) -> Option<RawFd> {
        self.group.as_ref().map(group::GroupSocket::fd)
    }

    /// Receives up to a batch of datagrams into free slots of `pool` without blocking:
    /// from the link's socket, then from the group's when this poll reads it.
    /// Whether coalesced datagrams wait in the staging buffer for free slots: no
    /// descriptor says so, so a reader that skips reads must not skip then.
    pub(crate) fn holds_staged(&self) -> bool {
        self.gro.as_ref().is_some_and(|st| st.at < st.len)
    }

    pub(crate) fn recv_batch(
        &mut self,
        pool: &mut SlotPool,
        out: &mut Vec<Datagram>,
    ) -> Result<()> {
        self.recv_unicast(pool, out)?;
        match self.group.as_mut() {
            Some(g) => g
                .poll(pool, out)
                .map_err(|e| Error::io("receiving from the job's multicast group", e)),
            None => Ok(()),
        }
    }

    /// Receives up to a batch of datagrams from the link's own socket.
    fn recv_unicast(&mut self, pool: &mut SlotPool, out: &mut Vec<Datagram>) -> Result<()> {
        if self.gro.is_some() {
            if self.batching && !self.gro_on {
                // Streaming: let the kernel coalesce from now on.
                self.gro_on = set_gro(&self.sock, true);
            }
            let staged = self.gro.as_ref().is_some_and(|st| st.at < st.len);
            if self.gro_on || staged {
                let before = out.len();
                let empty = self.recv_coalesced(pool, out)?;
                match out.len() - before {
                    0 => {}
                    1 => self.singles += 1,
                    _ => self.singles = 0,
                }
                if self.batching && self.singles >= SPARSE_AFTER {
                    // Sparse again: stop coalescing, but keep reading coalesced until
                    // what was queued meanwhile is drained.
                    self.batching = false;
                    self.streak = 0;
                    self.singles = 0;
                    set_gro(&self.sock, false);
                } else if empty && !self.batching {
                    self.gro_on = false;
                }
                return Ok(());
            }
        }
        if !self.batching || pool.free.len() == 1 {
            return self.recv_one(pool, out);
        }
        let n = pool.free.len().min(RECV_BATCH);
        if n == 0 {
            return Ok(());
        }
        let slots: [u32; RECV_BATCH] = std::array::from_fn(|i| {
            if i < n {
                pool.free[pool.free.len() - 1 - i]
            } else {
                0
            }
        });
        let base = pool.buf.as_mut_ptr();
        let mut iov: [libc::iovec; RECV_BATCH] = std::array::from_fn(|i| libc::iovec {
            // SAFETY: slots[i] indexes a slot inside `buf` (free-list entries are < slots).
            iov_base: unsafe { base.add(slots[i] as usize * pool.slot_size) } as *mut libc::c_void,
            iov_len: pool.slot_size,
        });
        // SAFETY: mmsghdr and sockaddr_storage are plain data; zero is a valid state.
        let mut msgs: [libc::mmsghdr; RECV_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_storage; RECV_BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &mut names[i] as *mut _ as *mut libc::c_void;
            msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
        }
        // SAFETY: msgs[..n] point to iovecs over distinct free slots of the pool, which
        // stays borrowed mutably for the duration of the call, and to `names[..n]`.
        let got = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        self.batching = got > 1;
        self.streak = 0;
        if got < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(()),
                // ICMP port unreachable from an earlier send: not a receive problem.
                io::ErrorKind::ConnectionRefused => Ok(()),
                _ => Err(Error::io("recvmmsg", e)),
            };
        }
        for (i, m) in msgs.iter().enumerate().take(got as usize) {
            let len = m.msg_len as usize;
            let truncated = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            pool.free.pop();
            pool.sources[slots[i] as usize] = ip_of(&names[i]);
            // A truncated datagram is longer than any quiver frame: hand it on with a
            // length that the decoder rejects (the slot is freed by the caller).
            out.push(Datagram {
                slot: slots[i],
                len: if truncated { 0 } else { len },
            });
        }
        Ok(())
    }

    /// Receives with `UDP_GRO`: hands over the staged datagrams while free slots last,
    /// then receives the next (possibly coalesced) one into the staging buffer, up to a
    /// batch of datagrams per call.
    /// Returns whether the socket was found empty (nothing staged is left either).
    fn recv_coalesced(&mut self, pool: &mut SlotPool, out: &mut Vec<Datagram>) -> Result<bool> {
        let fd = self.sock.as_raw_fd();
        let st = self
            .gro
            .as_mut()
            .expect("coalesced receive without staging");
        let mut handed = 0;
        loop {
            while st.at < st.len {
                let Some(slot) = pool.free.pop() else {
                    return Ok(false); // the rest waits for free slots
                };
                let n = st.seg.min(st.len - st.at);
                // A datagram longer than a slot is no quiver frame: length 0, which the
                // decoder rejects and counts.
                let len = if n > pool.slot_size { 0 } else { n };
                let at = slot as usize * pool.slot_size;
                pool.buf[at..at + len].copy_from_slice(&st.buf[st.at..st.at + len]);
                pool.sources[slot as usize] = st.from;
                out.push(Datagram { slot, len });
                st.at += n;
                handed += 1;
            }
            if handed >= RECV_BATCH || pool.free.is_empty() {
                return Ok(false);
            }
            let mut iov = libc::iovec {
                iov_base: st.buf.as_mut_ptr() as *mut libc::c_void,
                iov_len: st.buf.len(),
            };
            // Room for one cmsg carrying an int, aligned for cmsghdr.
            let mut control = [0u64; 8];
            // SAFETY: msghdr is plain data; zero is a valid initial state.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            msg.msg_name = &mut name as *mut _ as *mut libc::c_void;
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: msg points to an iovec over the staging buffer, to `control` and to
            // `name`, all alive and exclusively borrowed for the call.
            let got = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
            if got < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(true),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused => Ok(false),
                    _ => Err(Error::io("recvmsg", e)),
                };
            }
            let got = got as usize;
            st.from = ip_of(&name);
            let mut seg = got;
            // SAFETY: the kernel filled msg_control with msg_controllen bytes of cmsgs;
            // CMSG_FIRSTHDR/CMSG_NXTHDR stay inside them and UDP_GRO carries an int.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        seg = v.max(1) as usize;
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            if got == 0 || msg.msg_flags & libc::MSG_TRUNC != 0 {
                // Empty or longer than any coalesced run: one rejected datagram.
                st.len = pool.slot_size + 1;
                st.seg = st.len;
            } else {
                st.len = got;
                st.seg = seg;
            }
            st.at = 0;
        }
    }

    /// Receives one datagram with `recv`, the cheapest receive call: a busy-polling
    /// reader spends most of its time in calls that find nothing, and the shorter each
    /// is, the sooner it sees the datagram that arrives.
    fn recv_one(&mut self, pool: &mut SlotPool, out: &mut Vec<Datagram>) -> Result<()> {
        let Some(&slot) = pool.free.last() else {
            return Ok(());
        };
        let at = slot as usize * pool.slot_size;
        let buf = &mut pool.buf[at..at + pool.slot_size];
        // SAFETY: sockaddr_storage is plain data; zero is a valid initial state.
        let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: buf is a writable slot of slot_size bytes and `name` a writable
        // sockaddr_storage of `namelen` bytes; MSG_TRUNC makes the call return the
        // datagram's real length, so an oversized one is recognised.
        let got = unsafe {
            libc::recvfrom(
                self.sock.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                &mut name as *mut _ as *mut libc::sockaddr,
                &mut namelen,
            )
        };
        if got < 0 {
            self.streak = 0;
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::Interrupted
                | io::ErrorKind::ConnectionRefused => Ok(()),
                _ => Err(Error::io("recv", e)),
            };
        }
        pool.free.pop();
        pool.sources[slot as usize] = ip_of(&name);
        let len = got as usize;
        out.push(Datagram {
            slot,
            len: if len > pool.slot_size { 0 } else { len },
        });
        self.streak += 1;
        self.batching = self.streak >= 4;
        Ok(())
    }

    /// The socket that sends to `addr`: its connected socket (made on first use), else
    /// this link's socket with the address.
    fn route(&self, addr: &SockAddr) -> Route {
        let conn = addr.conn.get_or_init(|| {
            if self.connected.get() >= CONNECTED_MAX {
                return None;
            }
            let made = UdpSocket::bind((self.local.ip(), 0)).and_then(|s| {
                s.connect(addr.addr)?;
                Ok(s)
            });
            match made {
                Ok(s) => {
                    set_buffer(&s, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, SNDBUF);
                    self.connected.set(self.connected.get() + 1);
                    Some(s)
                }
                Err(e) => {
                    tracing::debug!(
                        "a connected socket to {}: {e}; sending with sendto",
                        addr.addr
                    );
                    None
                }
            }
        });
        match conn {
            Some(s) => Route {
                fd: s.as_raw_fd(),
                name: std::ptr::null_mut(),
                namelen: 0,
            },
            None => Route {
                fd: self.sock.as_raw_fd(),
                name: addr.ptr(),
                namelen: addr.len,
            },
        }
    }

    /// Sends datagrams to `addr`: runs of equal-size datagrams (the last of a run may be
    /// shorter), at most `max_run` of them, with segmentation offload, the rest as many
    /// per `sendmmsg` call as fit in a batch. Order is kept.
    pub(crate) fn send_batch(
        &self,
        addr: &SockAddr,
        datagrams: &[&[u8]],
        max_run: usize,
    ) -> Result<()> {
        let offload = self.segments() && max_run >= 2;
        let mut rest = datagrams;
        while !rest.is_empty() {
            let run = if offload { gso_run(rest, max_run) } else { 0 };
            if run < 2 {
                // Up to the next run worth offloading, datagram by datagram.
                let mut n = 1;
                while n < rest.len() && (!offload || gso_run(&rest[n..], max_run) < 2) {
                    n += 1;
                }
                self.send_each(addr, &rest[..n])?;
                rest = &rest[n..];
                continue;
            }
            match self.send_segmented(addr, &rest[..run]) {
                Ok(()) => {}
                Err(e) if gso_refused(&e) => {
                    // Nothing of the run was sent: send it datagram by datagram.
                    self.gso.store(false, Ordering::Relaxed);
                    tracing::info!(
                        "UDP segmentation offload refused by the kernel ({e}); \
                         sending datagram by datagram"
                    );
                    self.send_each(addr, &rest[..run])?;
                }
                Err(e) => return Err(Error::io(format!("sendmsg to {}", addr.addr), e)),
            }
            rest = &rest[run..];
        }
        Ok(())
    }

    /// Sends a run of datagrams of `run[0].len()` bytes each (the last may be shorter) in
    /// one `sendmsg` that asks the kernel to segment it (`UDP_SEGMENT`).
    fn send_segmented(&self, addr: &SockAddr, run: &[&[u8]]) -> io::Result<()> {
        let mut iov: [libc::iovec; GSO_SEGMENTS] = std::array::from_fn(|i| libc::iovec {
            iov_base: run.get(i).map_or(std::ptr::null(), |d| d.as_ptr()) as *mut libc::c_void,
            iov_len: run.get(i).map_or(0, |d| d.len()),
        });
        // Control buffer for one cmsg carrying a u16, aligned for cmsghdr.
        let mut control = [0u64; 4];
        // SAFETY: msghdr is plain data; zero is a valid initial state.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        let route = self.route(addr);
        msg.msg_name = route.name;
        msg.msg_namelen = route.namelen;
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = run.len();
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE only computes a size.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
        // SAFETY: msg_control points to `control` (32 bytes, 8-aligned), which holds
        // CMSG_SPACE(2) bytes, so CMSG_FIRSTHDR returns a header inside it and its data
        // has room for the u16 written (unaligned-safe) below.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, run[0].len() as u16);
        }
        loop {
            // SAFETY: msg points to `addr`, to iovecs over the caller's datagrams and to
            // `control`, all alive for the call; the kernel only reads them.
            let n = unsafe { libc::sendmsg(route.fd, &msg, 0) };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                // An ICMP error of an earlier datagram; this run was not sent.
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused => continue,
                _ => return Err(e),
            }
        }
    }

    /// Sends datagrams to `addr`, as many per `sendmmsg` call as fit in a batch.
    fn send_each(&self, addr: &SockAddr, datagrams: &[&[u8]]) -> Result<()> {
        if let [one] = datagrams {
            return self.send_datagram(addr, one);
        }
        let route = self.route(addr);
        for chunk in datagrams.chunks(SEND_BATCH) {
            let mut iov: Vec<libc::iovec> = chunk
                .iter()
                .map(|d| libc::iovec {
                    iov_base: d.as_ptr() as *mut libc::c_void,
                    iov_len: d.len(),
                })
                .collect();
            // SAFETY: mmsghdr is plain data; zero is a valid initial state.
            let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; chunk.len()];
            for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
                m.msg_hdr.msg_name = route.name;
                m.msg_hdr.msg_namelen = route.namelen;
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
            }
            let mut done = 0;
            while done < msgs.len() {
                // SAFETY: every mmsghdr points to a live iovec over a caller's datagram
                // and to `addr`, all alive for the call; the kernel only reads them.
                let n = unsafe {
                    libc::sendmmsg(
                        route.fd,
                        msgs[done..].as_mut_ptr(),
                        (msgs.len() - done) as u32,
                        0,
                    )
                };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        // An ICMP error of an earlier datagram; this one was not sent.
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused => continue,
                        _ => return Err(Error::io(format!("sendmmsg to {}", addr.addr), e)),
                    }
                }
                done += n as usize;
            }
        }
        Ok(())
    }

    /// Sends one datagram built by a channel.
    pub(crate) fn send_datagram(&self, addr: &SockAddr, frame: &[u8]) -> Result<()> {
        let route = self.route(addr);
        loop {
            // SAFETY: frame and the address (null for a connected socket) are valid for
            // the duration of the call.
            let n = unsafe {
                libc::sendto(
                    route.fd,
                    frame.as_ptr() as *const libc::c_void,
                    frame.len(),
                    0,
                    route.name as *const libc::sockaddr,
                    route.namelen,
                )
            };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused => continue,
                _ => return Err(Error::io(format!("sendto {}", addr.addr), e)),
            }
        }
    }
}

/// Datagrams per offloaded run at most for a channel with `window` frames in flight and
/// the smoothed round trip `srtt`: the window's share of [`RUN_TIME`] (a window takes a
/// round trip on the wire when the channel is limited by it, so window / round trip is
/// its rate); every datagram the kernel allows while the round trip is not known yet.
/// Below 2 no run is offloaded.
pub(crate) fn run_limit(window: u16, srtt: Option<std::time::Duration>) -> usize {
    let Some(rtt) = srtt.filter(|t| !t.is_zero()) else {
        return GSO_SEGMENTS;
    };
    let run = u128::from(window) * RUN_TIME.as_nanos() / rtt.as_nanos();
    usize::try_from(run).map_or(GSO_SEGMENTS, |r| r.min(GSO_SEGMENTS))
}

/// How many of `datagrams`, from the first, form a run that one segmentation-offload send
/// can carry: datagrams of the first one's size, the last possibly shorter, at most
/// `max_run` (and GSO_SEGMENTS) of them and GSO_BYTES in all.
fn gso_run(datagrams: &[&[u8]], max_run: usize) -> usize {
    let seg = datagrams[0].len();
    if seg == 0 {
        return 1;
    }
    let max = (GSO_BYTES / seg)
        .min(GSO_SEGMENTS)
        .min(max_run.max(1))
        .min(datagrams.len());
    let mut n = 1;
    while n < max && datagrams[n].len() == seg {
        n += 1;
    }
    if n < max && datagrams[n].len() < seg && !datagrams[n].is_empty() {
        n += 1;
    }
    n
}

/// Turns coalesced receives (`UDP_GRO`) on or off; false if the kernel refused (logged).
fn set_gro(sock: &UdpSocket, on: bool) -> bool {
    let on = libc::c_int::from(on);
    // SAFETY: setsockopt with a valid fd and a c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            &on as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::info!(
            "UDP_GRO refused by the kernel ({}); receiving datagram by datagram",
            io::Error::last_os_error()
        );
    }
    rc == 0
}

/// Whether a segmentation-offload send failed because the kernel or device cannot do it
/// (rather than for a reason that would fail a plain send too).
fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
    )
}

impl AsRawFd for UdpLink {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// The IP address in a sender's socket address (the unspecified address if the kernel
/// gave none); an IPv4-mapped IPv6 address as IPv4.
fn ip_of(name: &libc::sockaddr_storage) -> IpAddr {
    match name.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large
            // enough and aligned for.
            let sin = unsafe { &*(name as *const _ as *const libc::sockaddr_in) };
            IpAddr::V4(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6, as above.
            let sin6 = unsafe { &*(name as *const _ as *const libc::sockaddr_in6) };
            IpAddr::V6(std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr)).to_canonical()
        }
        _ => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    }
}

/// A destination in the C layout, converted once per connection, with the socket that
/// sends to it.
pub(crate) struct SockAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
    addr: SocketAddr,
    /// A socket of its own, bound to the link's address and *connected* to this
    /// destination, made on the first send: a connected socket skips the route lookup
    /// that every `sendto` on an unconnected one makes (~0.18 µs a datagram here, see
    /// DESIGN-NOTES). It only sends: replies come to the link's socket, whose address
    /// the peer knows; receivers identify senders by the frame header, not the source
    /// port. `None` if it could not be made (then the link's socket sends, with the
    /// address).
    conn: std::cell::OnceCell<Option<UdpSocket>>,
}

impl Clone for SockAddr {
    /// A copy that sends from the link's socket, with the address: it never makes a
    /// connected socket of its own (which would count against the link's limit) nor
    /// duplicates one. Only the fault injector copies destinations, for the datagrams it
    /// holds back.
    fn clone(&self) -> SockAddr {
        let conn = std::cell::OnceCell::from(None);
        SockAddr {
            storage: self.storage,
            len: self.len,
            addr: self.addr,
            conn,
        }
    }
}

impl SockAddr {
    /// A destination that the link's own socket always sends to, with the address (a
    /// multicast group: no connected socket of its own, which would lack the link's
    /// multicast options).
    pub(crate) fn unconnected(a: &SocketAddr) -> SockAddr {
        let mut d = SockAddr::from(a);
        d.conn = std::cell::OnceCell::from(None);
        d
    }

    /// The destination's IP address (an IPv4-mapped IPv6 address as IPv4).
    pub(crate) fn ip(&self) -> IpAddr {
        self.addr.ip().to_canonical()
    }

    fn ptr(&self) -> *mut libc::c_void {
        &self.storage as *const _ as *mut libc::c_void
    }
}

/// Where a send goes: the descriptor, and the address to name (null for a connected
/// socket).
struct Route {
    fd: RawFd,
    name: *mut libc::c_void,
    namelen: libc::socklen_t,
}

impl From<&SocketAddr> for SockAddr {
    fn from(a: &SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is plain data; zero is valid.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match a {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        SockAddr {
            storage,
            len: len as libc::socklen_t,
            addr: *a,
            conn: std::cell::OnceCell::new(),
        }
    }
}

/// Asks for a socket buffer of `bytes` (forcing it where permitted) and warns once if the
/// kernel grants much less: a small receive buffer loses datagrams under bursts.
fn set_buffer(sock: &UdpSocket, force: i32, plain: i32, bytes: usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    let v = bytes as libc::c_int;
    let granted = || {
        let mut got: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt with a valid fd writing one c_int into `got`.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                plain,
                &mut got as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        // Linux reports twice the usable size (it adds bookkeeping overhead).
        if rc == 0 {
            got as usize / 2
        } else {
            0
        }
    };
    for opt in [force, plain] {
        // SAFETY: setsockopt with a valid fd and a c_int option value.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            break;
        }
    }
    let got = granted();
    if got < bytes / 2 && !WARNED.swap(true, Ordering::Relaxed) {
        let which = if plain == libc::SO_RCVBUF {
            "receive"
        } else {
            "send"
        };
        tracing::warn!(
            "UDP {which} buffer is {got} bytes, {bytes} asked for (raise net.core.{}mem_max or run with CAP_NET_ADMIN): bursts may lose datagrams",
            if plain == libc::SO_RCVBUF { "r" } else { "w" }
        );
    }
}

#[cfg(test)]
mod tests;
