//! The BPF program that keeps other endpoints' frames out of a link's receive ring, and
//! the per-process registry that decides when a link may do without it.

use super::*;

/// The classic BPF program that accepts what this endpoint must see: a frame of our
/// EtherType for `dpid`, either for this host (not outgoing, broadcast or another
/// host's) and `port`, or multicast to [`GROUP_PORT`] (a root's broadcast: which job's
/// is for the engine to check). Offsets count from the Ethernet header; a load past the
/// end of a short frame rejects it.
pub(super) fn filter(port: u16, dpid: u16) -> [libc::sock_filter; 13] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let ld_w_abs = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ld_h_abs = libc::BPF_LD | libc::BPF_H | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    // A failed test jumps to the last instruction (reject): jf = 11 - pc. Jumps go
    // forward only, so the multicast branch comes after the host branch, and both meet
    // at the DPID test.
    [
        /* 0 */ op(ld_h_abs, 0, 0, 12),
        /* 1 */ op(jeq, 0, 10, u32::from(ETHERTYPE)),
        /* 2 */
        op(
            ld_w_abs,
            0,
            0,
            (libc::SKF_AD_OFF + libc::SKF_AD_PKTTYPE) as u32,
        ),
        /* 3 */ op(jeq, 0, 2, u32::from(libc::PACKET_HOST)),
        /* 4 */ op(ld_h_abs, 0, 0, 14),
        /* 5: to the DPID test, 9 */ op(jeq, 3, 6, u32::from(port)),
        /* 6: A still holds the packet type */
        op(jeq, 0, 5, u32::from(libc::PACKET_MULTICAST)),
        /* 7 */ op(ld_h_abs, 0, 0, 14),
        /* 8 */ op(jeq, 0, 3, u32::from(GROUP_PORT)),
        // ldh loads big-endian; dst_dpid is little-endian on the wire.
        /* 9 */
        op(ld_h_abs, 0, 0, DPID_AT as u32),
        /* 10 */ op(jeq, 0, 1, u32::from(dpid.swap_bytes())),
        /* 11 */ op(ret, 0, 0, u32::MAX),
        /* 12 */ op(ret, 0, 0, 0),
    ]
}

pub(super) fn attach_filter(fd: BorrowedFd<'_>, port: u16, dpid: u16) -> io::Result<()> {
    let mut prog = filter(port, dpid);
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_mut_ptr(),
    };
    // The kernel copies the program during the call; `prog` outlives it.
    setsockopt(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// The raw Ethernet links open in this process, and those of them that run without
/// their BPF filter. The filter keeps the frames of the node's other endpoints out of a
/// link's ring, and costs every received frame a run (0.05 µs of a ping-pong through
/// 100 Mbit/s, PERFORMANCE section 3). A link whose rank is alone on its node, opened
/// while no other link is open in the process, has no other endpoint beside it and runs
/// without; `EthLink::rx_len` checks in user space what only the filter checked (the
/// frame is addressed to this host, and to our port). The next link to open in the
/// process attaches the filters of those first, since from then on every socket would
/// get the frames of all.
pub(super) struct ProcessLinks {
    pub(super) open: usize,
    pub(super) unfiltered: Vec<(RawFd, u16, u16)>,
}

pub(super) static PROCESS_LINKS: Mutex<ProcessLinks> = Mutex::new(ProcessLinks {
    open: 0,
    unfiltered: Vec::new(),
});

impl ProcessLinks {
    /// A link `(descriptor, port, dpid)` opens: whether it needs its filter, and the links
    /// that need theirs attached now.
    pub(super) fn opening(
        &mut self,
        alone_on_node: bool,
        link: (RawFd, u16, u16),
    ) -> (bool, Vec<(RawFd, u16, u16)>) {
        self.open += 1;
        if alone_on_node && self.open == 1 {
            self.unfiltered.push(link);
            (false, Vec::new())
        } else {
            (true, std::mem::take(&mut self.unfiltered))
        }
    }

    /// The link with this descriptor closes (before the descriptor does).
    pub(super) fn closing(&mut self, fd: RawFd) {
        self.open = self.open.saturating_sub(1);
        self.unfiltered.retain(|l| l.0 != fd);
    }
}
