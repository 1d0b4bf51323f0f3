//! The protocol clock: what the channels' timers and the driver's deadlines are measured
//! against.

use crate::channel::reliable::Time;

/// Where the driver reads the time: the protocol clock in production, a virtual clock in
/// the simulator.
pub(crate) trait Clock {
    /// The time since the clock's epoch.
    fn now(&self) -> Time;
}

impl Clock for ProtocolClock {
    #[inline]
    fn now(&self) -> Time {
        ProtocolClock::now(self)
    }
}

/// The clock of the channels' timers: nanoseconds since it was made, read from the CPU's
/// time-stamp counter where that is invariant (quanta calibrates it against the OS clock
/// once per process), else from the OS monotonic clock. A message is read at least once on
/// its way in and once on its way out, and a counter read costs about 10 ns where
/// `Instant::now` (a vDSO call whose data the kernel keeps rewriting from another core)
/// cost 50-60 ns on the ping-pong path. Counters of two cores may disagree by a little:
/// [`Time`] saturates, so a reading slightly behind an earlier one is only "no time
/// passed".
pub(crate) struct ProtocolClock {
    clock: quanta::Clock,
    epoch: u64,
}

impl ProtocolClock {
    pub(crate) fn new() -> ProtocolClock {
        let clock = quanta::Clock::new();
        let epoch = clock.raw();
        ProtocolClock { clock, epoch }
    }

    /// The time since the clock was made.
    #[inline]
    pub(crate) fn now(&self) -> Time {
        Time::from_nanos(self.clock.delta_as_nanos(self.epoch, self.clock.raw()))
    }
}

#[cfg(test)]
mod tests {
    use super::ProtocolClock;
    use std::time::{Duration, Instant};

    /// The counter-based clock measures the same intervals as the OS clock (quanta's
    /// calibration is right).
    #[test]
    fn protocol_clock_agrees_with_the_os_clock() {
        let clock = ProtocolClock::new();
        for pause in [Duration::from_millis(2), Duration::from_millis(30)] {
            let (t0, i0) = (clock.now(), Instant::now());
            std::thread::sleep(pause);
            let (t1, i1) = (clock.now(), Instant::now());
            let ours = t1.saturating_since(t0);
            let os = i1 - i0;
            assert!(ours >= pause, "slept {pause:?}, the clock says {ours:?}");
            let diff = ours.abs_diff(os);
            assert!(
                diff <= Duration::from_micros(200) + os / 50,
                "clock {ours:?} vs OS {os:?} over the same interval"
            );
        }
    }
}
