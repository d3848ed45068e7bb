//! The clock every validity decision is made on: tokio's monotonic [`Instant`] plus the time the
//! host spent suspended.
//!
//! Tokio's and std's `Instant` read `CLOCK_MONOTONIC`, which **stops while the host is suspended
//! or hibernating**. The store's clock does not stop: a lease whose TTL ran out while this host
//! slept is gone (and may be granted to someone else), yet a deadline measured on the monotonic
//! clock still lies in the future after resume. The supervisor therefore judges validity on
//! *validity time*, [`Clock::now`]: the monotonic instant shifted forward by
//! [`Clock::suspended`], the total time spent suspended. Timers still run on tokio's clock (so
//! paused-time tests keep working); the supervisor wakes often enough to notice a resume (see
//! [`SupervisorConfig`](crate::supervisor::SupervisorConfig)).
//!
//! - [`SystemClock`] (the default) reads `CLOCK_BOOTTIME - CLOCK_MONOTONIC` on Linux, which
//!   counts suspend and hibernation. On other operating systems it reports no suspension: there,
//!   validity is measured on the monotonic clock alone and a host suspend goes unnoticed until
//!   the next renewal is refused (fencing tokens still reject the stale holder's writes).
//! - `ManualClock` is for tests (feature `test-util`): `ManualClock::jump` simulates a suspend
//!   of any length.
//!
//! Only a suspend the kernel itself performs is counted. A pause it does not see (a virtual
//! machine stopped by its hypervisor, a process stopped with `SIGSTOP`, a long GC pause) is not:
//! the supervisor notices it at its next wake-up only if the monotonic clock moved meanwhile, and
//! otherwise only the fencing token protects the resource.
//!
//! ```
//! # #[cfg(feature = "test-util")] {
//! use std::time::Duration;
//! use leasehold_core::clock::{Clock, ManualClock};
//! let clock = ManualClock::new();
//! assert_eq!(clock.suspended(), Duration::ZERO);
//! clock.jump(Duration::from_secs(60)); // the host "slept" for a minute
//! assert_eq!(clock.suspended(), Duration::from_secs(60));
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Thirty years: what an instant that cannot be represented saturates to (as tokio does for
/// `sleep(Duration::MAX)`).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `at + d`, saturated to thirty years after `at` instead of overflowing.
pub(crate) fn saturating_add(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(FAR_FUTURE))
        .unwrap_or(at)
}

/// A source of suspended time. Object safe: pass it as `Arc<dyn Clock>`.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The total time the host has spent suspended since this clock was made. Never decreases.
    fn suspended(&self) -> Duration;

    /// Validity time: tokio's [`Instant::now`] shifted forward by [`Clock::suspended`]. Instants
    /// on this scale keep counting through a host suspend; compare them only with each other.
    fn now(&self) -> Instant {
        saturating_add(Instant::now(), self.suspended())
    }
}

/// The real clock: counts suspend and hibernation on Linux (`CLOCK_BOOTTIME`), reports none
/// elsewhere.
///
/// Readings are whole milliseconds: a difference between the two clocks below a millisecond is
/// read jitter, not a suspend, so a suspend is seen up to 1 ms short (the loss lead covers it).
#[derive(Debug)]
pub struct SystemClock {
    /// `boot - monotonic` at creation, in nanoseconds.
    baseline: Option<u128>,
    /// The largest reading so far, in milliseconds (readings never go back).
    last_ms: AtomicU64,
}

impl SystemClock {
    /// A clock counting suspension from now on.
    pub fn new() -> Self {
        SystemClock {
            baseline: boot_minus_monotonic(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// The process-wide clock, shared by every supervisor that was not given one.
    pub fn shared() -> Arc<dyn Clock> {
        static SHARED: std::sync::OnceLock<Arc<SystemClock>> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| Arc::new(SystemClock::new())).clone()
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn suspended(&self) -> Duration {
        let (Some(base), Some(now)) = (self.baseline, boot_minus_monotonic()) else {
            return Duration::ZERO;
        };
        let ms = u64::try_from(now.saturating_sub(base) / 1_000_000).unwrap_or(u64::MAX);
        let ms = self.last_ms.fetch_max(ms, Ordering::Relaxed).max(ms);
        Duration::from_millis(ms)
    }
}

/// `CLOCK_BOOTTIME - CLOCK_MONOTONIC` in nanoseconds: the time spent suspended since boot.
#[cfg(target_os = "linux")]
fn boot_minus_monotonic() -> Option<u128> {
    use nix::time::{ClockId, clock_gettime};
    fn nanos(id: ClockId) -> Option<u128> {
        let t = clock_gettime(id).ok()?;
        let secs = u128::try_from(t.tv_sec()).ok()?;
        let nanos = u128::try_from(t.tv_nsec()).ok()?;
        Some(secs * 1_000_000_000 + nanos)
    }
    // Monotonic read on both sides of the boot-time read: take the later one, so jitter can only
    // make the difference smaller, never invent a suspend.
    let _ = nanos(ClockId::CLOCK_MONOTONIC)?;
    let boot = nanos(ClockId::CLOCK_BOOTTIME)?;
    let mono = nanos(ClockId::CLOCK_MONOTONIC)?;
    Some(boot.saturating_sub(mono))
}

#[cfg(not(target_os = "linux"))]
fn boot_minus_monotonic() -> Option<u128> {
    None
}

/// A clock for tests: reports exactly the suspension it was told about with [`ManualClock::jump`].
/// Clones share their state. Behind the `test-util` feature: applications run on
/// [`SystemClock`].
#[cfg(feature = "test-util")]
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    suspended_ns: Arc<AtomicU64>,
}

#[cfg(feature = "test-util")]
impl ManualClock {
    /// A clock with no suspension yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Simulates a host suspend of `by`: validity time jumps forward by `by`, tokio's clock does
    /// not move. Saturates at about 584 years.
    pub fn jump(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .suspended_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(by))
            });
    }
}

#[cfg(feature = "test-util")]
impl Clock for ManualClock {
    fn suspended(&self) -> Duration {
        Duration::from_nanos(self.suspended_ns.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_reads_no_suspension_without_one() {
        let c = SystemClock::new();
        for _ in 0..1000 {
            assert_eq!(c.suspended(), Duration::ZERO);
        }
    }

    #[test]
    fn manual_clock_jumps_and_saturates() {
        let c = ManualClock::new();
        c.jump(Duration::from_secs(5));
        c.clone().jump(Duration::from_secs(5));
        assert_eq!(c.suspended(), Duration::from_secs(10));
        c.jump(Duration::MAX);
        assert_eq!(c.suspended(), Duration::from_nanos(u64::MAX));
        let _ = c.now(); // saturates instead of overflowing
    }
}
