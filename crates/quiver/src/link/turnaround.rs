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
//! What it owns: the newest stamp and the running sum and count, per link. What it
//! guarantees: a send counts only once per received frame and only within [`MAX_NS`] of
//! it (a send after an idle spell is not a reply), and the mean is logged (`tracing`
//! info) when the link closes. The
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
        if self.stamp_ns.get() != 0 {
            self.sending_at(realtime_ns());
        }
    }

    /// [`sending`](Self::sending) at `now_ns` (`CLOCK_REALTIME`).
    fn sending_at(&self, now_ns: i64) {
        let stamp = self.stamp_ns.replace(0);
        if stamp == 0 {
            return;
        }
        let d = now_ns - stamp;
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

    const SEC: i64 = 1_000_000_000;

    #[test]
    fn counts_one_reply_per_frame_within_the_limit() {
        let p = TurnaroundProbe::default();
        p.sending_at(5 * SEC); // nothing received yet
        assert_eq!(p.mean_us(), None);
        p.received(5, 100);
        p.sending_at(5 * SEC + 700);
        p.sending_at(5 * SEC + 900); // the same frame again: not counted
        assert_eq!(p.mean_us(), Some((0.6, 1)));
        p.received(6, 0);
        p.sending_at(6 * SEC + 1_000);
        assert_eq!(p.mean_us(), Some((0.8, 2)));
        // A reply later than the limit, and a clock that went back: neither counted.
        p.received(7, 0);
        p.sending_at(7 * SEC + MAX_NS);
        p.received(8, 0);
        p.sending_at(8 * SEC - 1);
        assert_eq!(p.mean_us(), Some((0.8, 2)));
    }

    #[test]
    fn reads_the_realtime_clock() {
        // The kernel's stamps are CLOCK_REALTIME: seconds since 1970, not since boot.
        let now = realtime_ns();
        assert!(now > 1_600_000_000 * SEC, "{now}");
        let p = TurnaroundProbe::default();
        p.received((now / SEC) as u32, (now % SEC) as u32);
        assert_eq!(p.stamp_ns.get(), now);
    }
}
