//! Time as a value: the state machines of [`reliable`](super) never read a clock.
//!
//! A [`Time`] is a number of nanoseconds since an epoch that the caller chooses (the
//! engine: an `Instant` taken when the endpoint opened; the simulator: the start of the
//! simulation). Only differences between two `Time`s of one caller mean anything.
//! Arithmetic saturates instead of overflowing, so no input can make it panic.

use core::fmt;
use core::ops::{Add, AddAssign};
use std::time::Duration;

/// A point in time: nanoseconds since the caller's epoch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The epoch itself.
    pub const ZERO: Time = Time(0);

    /// The time `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    #[cfg(test)]
    /// The time `micros` microseconds after the epoch (saturating).
    pub const fn from_micros(micros: u64) -> Time {
        Time(micros.saturating_mul(1_000))
    }

    /// The time `since_epoch` after the epoch (saturating at about 584 years).
    pub fn from_duration(since_epoch: Duration) -> Time {
        Time(u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The time since the epoch as a [`Duration`].
    pub const fn as_duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// How long after `earlier` this is; zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;

    fn add(self, d: Duration) -> Time {
        // In u64 throughout (`as_nanos` is a u128): every timer deadline is a sum.
        let d = d
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()));
        Time(self.0.saturating_add(d))
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{:?}", self.as_duration())
    }
}

/// The earlier of two optional deadlines (`None` means "no deadline").
pub(crate) fn earliest(a: Option<Time>, b: Option<Time>) -> Option<Time> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

#[cfg(test)]
mod tests {
    use super::Time;
    use std::time::Duration;

    #[test]
    fn adding_a_duration_counts_its_seconds_and_nanoseconds_and_saturates() {
        let t = Time::from_nanos(1);
        assert_eq!(t + Duration::new(2, 3), Time::from_nanos(2_000_000_004));
        assert_eq!(t + Duration::ZERO, t);
        // Seconds beyond u64 nanoseconds, and a sum past the end: both saturate.
        assert_eq!(t + Duration::MAX, Time::from_nanos(u64::MAX));
        assert_eq!(
            Time::from_nanos(u64::MAX - 1) + Duration::from_nanos(5),
            Time::from_nanos(u64::MAX)
        );
        let mut u = Time::ZERO;
        u += Duration::from_micros(7);
        assert_eq!(u, Time::from_micros(7));
    }
}
