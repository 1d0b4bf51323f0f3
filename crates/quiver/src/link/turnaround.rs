//! Turnaround probe of the raw Ethernet link (cargo feature `eth-turnaround`, off by
//! default): how long a reply takes from the kernel writing the frame it answers into the
//! receive ring to the `sendto` that sends the reply.
//!
//! The kernel stamps every frame it writes into a `TPACKET_V2` ring (`tp_sec`,
//! `tp_nsec`, `CLOCK_REALTIME`, taken while it fills the frame); the probe keeps the
//! newest stamp that `recv_batch` hands out and, at the next lone-frame send, reads
//! `CLOCK_REALTIME` again. The difference is the receiving side's share of a ping-pong's
//! one-way time: noticing the frame, everything quiver does with it and with the reply,
//! up to the system call. Together with the one-way time it splits a ping-pong into
//! that turnaround and the kernel's path from `sendto` into the peer's ring
//! (`bench/progs/afpacket_ring_pp.c` reports the same for a raw program;
//! docs/PERFORMANCE.md, "Where quiver eth's ping-pong time goes").
//!
//! What it owns: two `Cell`s of sums, per link. What it guarantees: a send counts only
//! once per received frame and only within [`MAX_NS`] of it (a send after an idle spell
//! is not a reply), and the mean is logged (`tracing` info) when the link closes. The
//! clock ticks in 256 ns steps on some virtual machines, so only the mean over many
//! replies means anything; the median does not.

use std::cell::Cell;

/// Replies later than this after their frame are not counted (not a ping-pong reply).
const MAX_NS: i64 = 5_000;

#[derive(Default)]
pub(crate) struct TurnaroundProbe {
    /// The kernel's stamp of the newest frame handed out, in ns; 0 once a send used it.
    stamp_ns: Cell<i64>,
    sum_ns: Cell<i64>,
    count: Cell<u64>,
}

impl TurnaroundProbe {
    /// A frame with the kernel's stamp `sec`, `nsec` was handed out.
    pub(crate) fn received(&self, sec: u32, nsec: u32) {
        self.stamp_ns
            .set(i64::from(sec) * 1_000_000_000 + i64::from(nsec));
    }

    /// A lone frame is about to be sent.
    pub(crate) fn sending(&self) {
        let stamp = self.stamp_ns.replace(0);
        if stamp == 0 {
            return;
        }
        let now = realtime_ns();
        let d = now - stamp;
        if (0..MAX_NS).contains(&d) {
            self.sum_ns.set(self.sum_ns.get() + d);
            self.count.set(self.count.get() + 1);
        }
    }

    /// Mean turnaround in µs and the number of replies counted.
    pub(crate) fn mean_us(&self) -> Option<(f64, u64)> {
        let n = self.count.get();
        (n > 0).then(|| (self.sum_ns.get() as f64 / n as f64 / 1e3, n))
    }
}

fn realtime_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives across the call.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    // time_t and c_long are i64 on 64-bit Linux, i32 on some 32-bit targets.
    #[allow(clippy::useless_conversion)]
    let (sec, nsec) = (i64::from(ts.tv_sec), i64::from(ts.tv_nsec));
    sec * 1_000_000_000 + nsec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_one_reply_per_frame_within_the_limit() {
        let p = TurnaroundProbe::default();
        p.sending(); // nothing received yet
        assert_eq!(p.mean_us(), None);
        let now = realtime_ns();
        let (sec, nsec) = ((now / 1_000_000_000) as u32, (now % 1_000_000_000) as u32);
        p.received(sec, nsec);
        p.sending();
        p.sending(); // the same frame again: not counted
        let (mean, n) = p.mean_us().expect("one reply");
        assert_eq!(n, 1);
        assert!((0.0..5.0).contains(&mean), "{mean}");
        // A frame a second old: not a reply.
        p.received(sec.wrapping_sub(1), nsec);
        p.sending();
        assert_eq!(p.mean_us().map(|m| m.1), Some(1));
    }
}
