//! Supervisor configuration.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::lease::{default_drift, validate_ttl};

use super::state::capped_loss_lead;

/// How a [`Supervisor`](super::Supervisor) acquires and renews.
///
/// Everything is derived from the TTL unless set: renew every third of the TTL, bound each renewal
/// by the time left before the loss deadline, report loss a little *before* the local deadline.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::supervisor::SupervisorConfig;
/// let cfg = SupervisorConfig::new(Duration::from_secs(30)).with_acquire_wait(Duration::from_secs(120));
/// assert_eq!(cfg.renew_interval(), Duration::from_secs(10));
/// assert_eq!(cfg.loss_lead(), Duration::from_secs(3));
/// ```
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    ttl: Duration,
    acquire_wait: Duration,
    renew_interval: Option<Duration>,
    op_timeout: Option<Duration>,
    drift_margin: Option<Duration>,
    loss_lead: Option<Duration>,
    backoff_min: Duration,
    backoff_max: Option<Duration>,
    batch_window: Option<Duration>,
    clock: Option<Arc<dyn Clock>>,
}

impl PartialEq for SupervisorConfig {
    fn eq(&self, other: &Self) -> bool {
        let same_clock = match (&self.clock, &other.clock) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_clock
            && self.ttl == other.ttl
            && self.acquire_wait == other.acquire_wait
            && self.renew_interval == other.renew_interval
            && self.op_timeout == other.op_timeout
            && self.drift_margin == other.drift_margin
            && self.loss_lead == other.loss_lead
            && self.backoff_min == other.backoff_min
            && self.backoff_max == other.backoff_max
            && self.batch_window == other.batch_window
    }
}

impl Eq for SupervisorConfig {}

impl SupervisorConfig {
    /// A configuration for leases of `ttl`, trying once to acquire (no wait).
    pub fn new(ttl: Duration) -> Self {
        SupervisorConfig {
            ttl,
            acquire_wait: Duration::ZERO,
            renew_interval: None,
            op_timeout: None,
            drift_margin: None,
            loss_lead: None,
            backoff_min: Duration::from_millis(10),
            backoff_max: None,
            batch_window: None,
            clock: None,
        }
    }

    /// The clock validity is judged on (default: [`SystemClock::shared`], which counts host
    /// suspend on Linux). Tests pass a `clock::ManualClock` (feature `test-util`) to simulate a
    /// suspend; see the [`clock`](crate::clock) module.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The clock validity is judged on.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone().unwrap_or_else(SystemClock::shared)
    }

    /// How long [`acquire`](super::Supervisor::acquire) may wait for a held key (default: zero,
    /// one attempt). Always bounded.
    pub fn with_acquire_wait(mut self, wait: Duration) -> Self {
        self.acquire_wait = wait;
        self
    }

    /// Renewal cadence (default: a third of the TTL).
    pub fn with_renew_interval(mut self, every: Duration) -> Self {
        self.renew_interval = Some(every);
        self
    }

    /// The longest a single store call may take (default: a third of the TTL). A renewal is
    /// additionally cut off at the loss deadline.
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = Some(timeout);
        self
    }

    /// The drift margin passed to the store (see
    /// [`AcquireRequest::drift_margin`](crate::AcquireRequest::drift_margin)).
    pub fn with_drift_margin(mut self, margin: Duration) -> Self {
        self.drift_margin = Some(margin);
        self
    }

    /// How long before the local deadline loss is signalled when no renewal was confirmed
    /// (default: a tenth of the TTL, at least 1 ms; capped at half the TTL). Loss is always
    /// signalled strictly before the deadline.
    ///
    /// The lead is the time the guarded work has, after it is cancelled, to stop before the lease
    /// may be gone; it also absorbs a late timer on a busy host (a starved runtime can fire the
    /// loss timer tens of milliseconds late). Shrink it only when the work stops at once and the
    /// host is never overloaded.
    pub fn with_loss_lead(mut self, lead: Duration) -> Self {
        self.loss_lead = Some(lead);
        self
    }

    /// Backoff bounds for acquire retries and failed renewals (defaults: 10 ms, a quarter of the
    /// TTL capped at 1 s).
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = Some(max);
        self
    }

    /// Coalesces the renewals of all guards of one supervisor: renewals due within `window` of
    /// each other are sent as one [`renew_many`](crate::LeaseStore::renew_many) call (one
    /// statement, script or keepalive on backends that batch). Guards renewed together stay
    /// aligned, and guards acquired at different times are brought into line: a held guard's
    /// renewal moves *earlier* (never later, and by at most half of its wait) to the last point
    /// of a grid of half a renewal interval shared by the supervisor's guards. After one interval
    /// a process holding thousands of leases renews them in at most two waves per interval (one
    /// more per 5,000 leases in a wave), whatever the spread of their acquisitions. Keep `window`
    /// small next to the renewal interval (a few percent).
    pub fn with_renewal_batching(mut self, window: Duration) -> Self {
        self.batch_window = Some(window);
        self
    }

    /// The renewal batching window, if batching is on.
    pub fn renewal_batching(&self) -> Option<Duration> {
        self.batch_window
    }

    /// Checks the TTL and the derived timings. Every other duration may be anything up to
    /// `Duration::MAX`: waits and timeouts saturate instead of overflowing.
    ///
    /// # Errors
    /// - [`Error::InvalidTtl`](crate::Error::InvalidTtl) for a zero or absurd TTL.
    /// - [`Error::InvalidInput`](crate::Error::InvalidInput) when the timings leave no time to
    ///   renew: the drift margin plus the loss lead (capped at half the TTL) use up the TTL, or
    ///   the renewal interval (plus the batching window and 1 ms of timer resolution) is not
    ///   shorter than what is left, so the lease would be given up before its first renewal; or the batching window is not shorter
    ///   than the op timeout, so every batched renewal would time out.
    pub fn validate(&self) -> Result<()> {
        validate_ttl(self.ttl, Duration::from_millis(1))?;
        let drift = self.drift_margin();
        let lead = capped_loss_lead(self.loss_lead(), self.ttl);
        let budget = self.loss_budget();
        if budget.is_zero() {
            return Err(Error::InvalidInput(format!(
                "a TTL of {:?} minus the drift margin {drift:?} and the loss lead {lead:?} \
                 leaves no time in which the lease may be trusted",
                self.ttl
            )));
        }
        // A timer may fire up to a millisecond late (tokio's resolution): keep that much slack.
        let renew = self
            .renew_interval()
            .saturating_add(self.batch_window.unwrap_or(Duration::ZERO))
            .saturating_add(Duration::from_millis(1));
        if renew >= budget {
            return Err(Error::InvalidInput(format!(
                "the renewal interval {:?} (plus a batching window of {:?} and 1 ms of timer \
                 resolution) must be shorter than the {budget:?} a lease of {:?} is trusted \
                 (TTL minus drift margin and loss lead)",
                self.renew_interval(),
                self.batch_window.unwrap_or(Duration::ZERO),
                self.ttl
            )));
        }
        if let Some(window) = self.batch_window
            && window.saturating_add(Duration::from_millis(1)) >= self.op_timeout()
        {
            return Err(Error::InvalidInput(format!(
                "the renewal batching window {window:?} (plus 1 ms of timer resolution) must be \
                 shorter than the op timeout {:?}: a batched renewal waits for its window before \
                 it is sent",
                self.op_timeout()
            )));
        }
        Ok(())
    }

    /// How long after a request is sent the lease it obtains is trusted: the TTL minus the drift
    /// margin and the loss lead (capped at half the TTL). Zero if nothing is left.
    pub(crate) fn loss_budget(&self) -> Duration {
        self.ttl
            .saturating_sub(self.drift_margin())
            .saturating_sub(capped_loss_lead(self.loss_lead(), self.ttl))
    }

    /// How often a sleeping supervisor wakes to look at the [clock](Self::with_clock), so that a
    /// host suspend is noticed soon after resume: a twentieth of the TTL, between 1 ms and 1 s.
    pub fn clock_check_interval(&self) -> Duration {
        let ms = (self.ttl / 20).as_millis().clamp(1, 1000);
        Duration::from_millis(u64::try_from(ms).unwrap_or(1000))
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The bounded acquire wait.
    pub fn acquire_wait(&self) -> Duration {
        self.acquire_wait
    }

    /// The renewal cadence.
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
            .unwrap_or(self.ttl / 3)
            .max(Duration::from_millis(1))
    }

    /// The per-call timeout.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
            .unwrap_or(self.ttl / 3)
            .max(Duration::from_millis(1))
    }

    /// The drift margin.
    pub fn drift_margin(&self) -> Duration {
        self.drift_margin.unwrap_or_else(|| default_drift(self.ttl))
    }

    /// The loss lead.
    pub fn loss_lead(&self) -> Duration {
        self.loss_lead
            .unwrap_or((self.ttl / 10).max(Duration::from_millis(1)))
            .max(Duration::from_nanos(1))
    }

    /// The smallest backoff.
    pub fn backoff_min(&self) -> Duration {
        self.backoff_min
    }

    /// The largest backoff.
    pub fn backoff_max(&self) -> Duration {
        self.backoff_max
            .unwrap_or((self.ttl / 4).min(Duration::from_secs(1)))
            .max(self.backoff_min)
    }

    /// A jittered exponential backoff for attempt `n` (0-based): `min * 2^n`, capped, times a
    /// random factor in [0.5, 1.0]; never below 1 ms (a zero backoff would spin on the store).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let base = self
            .backoff_min
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.backoff_max());
        let half = base / 2;
        half.saturating_add(half.mul_f64(fastrand::f64()))
            .max(Duration::from_millis(1))
    }
}
