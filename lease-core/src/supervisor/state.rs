//! The lease-health state machine: an explicit state and a pure step function.
//!
//! ```text
//!  Held ──renewal failed/timed out/unknown──▶ AtRisk ──renewal confirmed──▶ Held
//!    │                                          │
//!    ├──renewal refused──────────────▶ Lost ◀───┤ (refused, or loss deadline reached)
//!    ├──loss deadline reached────────▶ Lost     │
//!    └──released─────────────────────▶ Released ◀┘
//! ```
//! `Lost` and `Released` are final. The *loss deadline* is the lease's local validity deadline
//! minus the loss lead, so loss is always signalled strictly before the deadline passes.
//!
//! The machine is pure: the driver gives it every instant (and every lease's deadline) on one
//! scale. The supervisor uses validity time ([`Clock::now`](crate::clock::Clock::now)), which
//! keeps counting through a host suspend.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::saturating_add;
use crate::lease::Lease;

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The store refused a renewal: the lease expired, was released, or was taken over.
    RenewalRefused,
    /// No renewal was confirmed before the loss deadline (store unreachable, slow, or answers lost).
    DeadlineReached,
    /// The store answered with a non-retryable error.
    StoreError,
    /// The guard was released but the store no longer held the lease.
    NotHeldAtRelease,
    /// The renewal task ended without a release: it panicked (in a [`Hook`](super::Hook), for
    /// example) or its runtime shut down. Nobody renews any more, so the lease is given up.
    RenewalTaskEnded,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::RenewalRefused => "renewal refused",
            LossReason::DeadlineReached => "no confirmed renewal before the deadline",
            LossReason::StoreError => "store error",
            LossReason::NotHeldAtRelease => "not held at release",
            LossReason::RenewalTaskEnded => "the renewal task ended",
        })
    }
}

/// The health of a held lease, as published by the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// The last renewal was confirmed; the lease is valid until its deadline.
    Held,
    /// A renewal failed, timed out or has an unknown outcome, and the loss deadline has not passed:
    /// stop *starting* side effects; the supervisor keeps trying.
    AtRisk,
    /// The lease is gone (final). Guarded work has been cancelled.
    Lost(LossReason),
    /// The lease was released on purpose (final).
    Released,
}

impl Health {
    /// Whether the state is final.
    pub fn is_final(&self) -> bool {
        matches!(self, Health::Lost(_) | Health::Released)
    }
}

/// What happened, as fed into [`Machine::step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A renewal was confirmed; the lease carries the new deadline.
    RenewConfirmed(Lease),
    /// The store refused the renewal.
    RenewRefused,
    /// The renewal failed with a retryable error or timed out (outcome unknown).
    RenewFailed,
    /// The renewal failed with an error that will not go away.
    RenewFatal,
    /// Time passed (the driver calls this when a timer fires).
    Tick,
    /// The owner released (or dropped) the guard and the store confirmed.
    Released,
    /// The owner released, but the store did not hold the lease any more.
    ReleaseNotHeld,
}

/// What the driver should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Sleep until `at`, then renew (bounded by `loss_deadline`).
    RenewAt {
        /// When to send the next renewal.
        at: Instant,
        /// When to give up and report loss.
        loss_deadline: Instant,
    },
    /// Nothing more: the state is final.
    Stop,
}

/// The pure state machine.
#[derive(Debug, Clone)]
pub struct Machine {
    health: Health,
    lease: Lease,
    renew_interval: Duration,
    retry_interval: Duration,
    loss_lead: Duration,
    last_confirmed: Instant,
}

impl Machine {
    /// A machine for a freshly granted lease, confirmed at `now`.
    pub fn new(
        lease: Lease,
        renew_interval: Duration,
        retry_interval: Duration,
        loss_lead: Duration,
        now: Instant,
    ) -> Self {
        let mut m = Machine {
            health: Health::Held,
            lease,
            renew_interval,
            retry_interval,
            loss_lead,
            last_confirmed: now,
        };
        if now >= m.loss_deadline() {
            m.health = Health::Lost(LossReason::DeadlineReached);
        }
        m
    }

    /// The current health.
    pub fn health(&self) -> Health {
        self.health
    }

    /// The latest lease (with its latest deadline).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The instant at which loss is declared without a confirmed renewal: the lease's deadline
    /// minus the loss lead (capped at half the TTL). This is the one place it is computed; the
    /// guard's [`may_act`](super::LeaseGuard::may_act) and the drain use the value published from
    /// here.
    pub fn loss_deadline(&self) -> Instant {
        let lead = self.loss_lead.min(self.lease.ttl() / 2);
        self.lease
            .deadline()
            .checked_sub(lead)
            .unwrap_or(self.lease.deadline())
    }

    /// Applies `event` at `now` and returns the new health. Final states never change.
    pub fn step(&mut self, event: Event, now: Instant) -> Health {
        if self.health.is_final() {
            return self.health;
        }
        self.health = match event {
            Event::RenewConfirmed(lease) => {
                // A confirmation that arrives after the loss deadline is too late to trust.
                if now >= self.loss_deadline() && lease.deadline() <= now {
                    Health::Lost(LossReason::DeadlineReached)
                } else {
                    if lease.deadline() >= self.lease.deadline() {
                        self.lease = lease;
                    }
                    self.last_confirmed = now;
                    Health::Held
                }
            }
            Event::RenewRefused => Health::Lost(LossReason::RenewalRefused),
            Event::RenewFatal => Health::Lost(LossReason::StoreError),
            Event::RenewFailed => Health::AtRisk,
            Event::Tick => self.health,
            Event::Released => Health::Released,
            Event::ReleaseNotHeld => Health::Lost(LossReason::NotHeldAtRelease),
        };
        if !self.health.is_final() && now >= self.loss_deadline() {
            self.health = Health::Lost(LossReason::DeadlineReached);
        }
        self.health
    }

    /// What the driver should do next, at `now`.
    pub fn next(&self, now: Instant) -> Next {
        if self.health.is_final() {
            return Next::Stop;
        }
        let loss_deadline = self.loss_deadline();
        let at = match self.health {
            Health::Held => saturating_add(self.last_confirmed, self.renew_interval),
            _ => saturating_add(now, self.retry_interval),
        };
        Next::RenewAt {
            at: at.min(loss_deadline),
            loss_deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FencingToken, LeaseKey, OwnerId};

    fn lease(now: Instant, ttl: Duration) -> Lease {
        Lease::granted(
            LeaseKey::new("k").unwrap(),
            OwnerId::random(),
            FencingToken::MIN,
            ttl,
            Duration::ZERO,
            now,
        )
    }

    fn machine(now: Instant) -> Machine {
        let ttl = Duration::from_secs(9);
        Machine::new(
            lease(now, ttl),
            Duration::from_secs(3),
            Duration::from_millis(500),
            Duration::from_millis(100),
            now,
        )
    }

    #[test]
    fn held_renews_on_cadence_and_stays_held() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        assert_eq!(m.health(), Health::Held);
        assert_eq!(
            m.next(t0),
            Next::RenewAt {
                at: t0 + Duration::from_secs(3),
                loss_deadline: t0 + Duration::from_millis(8900)
            }
        );
        let t1 = t0 + Duration::from_secs(3);
        let renewed = m.lease().renewed(Duration::from_secs(9), t1);
        assert_eq!(m.step(Event::RenewConfirmed(renewed), t1), Health::Held);
        assert_eq!(m.loss_deadline(), t1 + Duration::from_millis(8900));
    }

    #[test]
    fn failure_is_at_risk_then_lost_at_the_deadline() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        let t1 = t0 + Duration::from_secs(3);
        assert_eq!(m.step(Event::RenewFailed, t1), Health::AtRisk);
        assert_eq!(
            m.next(t1),
            Next::RenewAt {
                at: t1 + Duration::from_millis(500),
                loss_deadline: t0 + Duration::from_millis(8900)
            }
        );
        assert_eq!(
            m.step(Event::Tick, t0 + Duration::from_millis(8899)),
            Health::AtRisk
        );
        assert_eq!(
            m.step(Event::Tick, t0 + Duration::from_millis(8900)),
            Health::Lost(LossReason::DeadlineReached)
        );
        assert!(
            m.loss_deadline() < m.lease().deadline(),
            "loss strictly before the deadline"
        );
        assert_eq!(m.next(t0 + Duration::from_secs(9)), Next::Stop);
    }

    #[test]
    fn at_risk_recovers_on_confirmation() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        let t1 = t0 + Duration::from_secs(4);
        m.step(Event::RenewFailed, t1);
        let renewed = m.lease().renewed(Duration::from_secs(9), t1);
        assert_eq!(
            m.step(
                Event::RenewConfirmed(renewed),
                t1 + Duration::from_millis(10)
            ),
            Health::Held
        );
    }

    #[test]
    fn refusal_is_lost_at_once_and_final() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        assert_eq!(
            m.step(Event::RenewRefused, t0),
            Health::Lost(LossReason::RenewalRefused)
        );
        let renewed = m.lease().renewed(Duration::from_secs(9), t0);
        assert_eq!(
            m.step(Event::RenewConfirmed(renewed), t0),
            Health::Lost(LossReason::RenewalRefused)
        );
        assert_eq!(
            m.step(Event::Released, t0),
            Health::Lost(LossReason::RenewalRefused)
        );
    }

    #[test]
    fn late_confirmation_does_not_resurrect() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        m.step(Event::RenewFailed, t0 + Duration::from_secs(3));
        // the answer to a renewal sent at t0 (deadline t0+9s) arrives after the loss deadline
        let stale = m.lease().renewed(Duration::from_secs(9), t0);
        assert_eq!(
            m.step(Event::RenewConfirmed(stale), t0 + Duration::from_secs(9)),
            Health::Lost(LossReason::DeadlineReached)
        );
    }

    #[test]
    fn release_outcomes() {
        let t0 = Instant::now();
        let mut a = machine(t0);
        assert_eq!(a.step(Event::Released, t0), Health::Released);
        let mut b = machine(t0);
        assert_eq!(
            b.step(Event::ReleaseNotHeld, t0),
            Health::Lost(LossReason::NotHeldAtRelease)
        );
    }

    #[test]
    fn expired_at_birth_is_lost() {
        let t0 = Instant::now();
        let l = lease(t0, Duration::from_millis(1));
        let m = Machine::new(
            l,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Duration::from_millis(100),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(m.health(), Health::Lost(LossReason::DeadlineReached));
    }
}
