//! The lease-health state machine: an explicit state and a pure step function.
//!
//! ```text
//!  Held ──renewal failed/timed out/unknown──▶ AtRisk ──renewal confirmed──▶ Held
//!    │                                          │
//!    ├──renewal refused──────────────▶ Lost ◀───┤ (refused, or loss deadline reached)
//!    ├──loss deadline reached────────▶ Lost     │
//!    └──release started ─ ─ ─ ─ ─ ─ ─▶ (releasing: may not act, renews no more)
//!                                       ├──released──────────▶ Released
//!                                       └──not held any more─▶ Lost
//! ```
//! `Lost` and `Released` are final. The *loss deadline* is the lease's local validity deadline
//! minus the loss lead, so loss is always signalled strictly before the deadline passes. It is
//! computed in one place, [`Machine::loss_deadline`] (with the lead capped by
//! [`capped_loss_lead`], which the configuration's checks share).
//!
//! The machine is pure: the driver gives it every instant (and every lease's deadline) on one
//! scale. The supervisor uses validity time ([`Clock::now`](crate::clock::Clock::now)), which
//! keeps counting through a host suspend.
//!
//! This module is private: [`Health`] and [`LossReason`] are part of the supervisor's API.
//! [`Machine`], [`Event`] and [`Next`] are re-exported from [`supervisor`](super) only with the
//! `model` feature, for model checkers and simulators that drive the real machine; without it
//! they are the crate's own.

// Without `model` the machine's items are reachable only inside the crate.
#![cfg_attr(not(feature = "model"), allow(unreachable_pub))]

use std::fmt;
use std::hash::{Hash, Hasher};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// The owner asked to release (or dropped the guard): from now on the holder may not act
    /// and nothing is renewed. Health does not change until the release's outcome is stepped.
    ReleaseStarted,
    /// The owner released (or dropped) the guard and the store confirmed.
    Released,
    /// The owner released, but the store did not hold the lease any more.
    ReleaseNotHeld,
}

/// What the driver should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Next {
    /// Sleep until `at`, then renew (bounded by `loss_deadline`).
    RenewAt {
        /// When to send the next renewal.
        at: Instant,
        /// When to give up and report loss.
        loss_deadline: Instant,
    },
    /// Nothing more to renew: the state is final, or a release is under way.
    Stop,
}

/// The loss lead actually used for a lease of `ttl`: the configured `lead`, capped at half the
/// TTL so that a lease is always trusted for a while. The one formula shared by
/// [`Machine::loss_deadline`] and the configuration's checks.
pub(crate) fn capped_loss_lead(lead: Duration, ttl: Duration) -> Duration {
    lead.min(ttl / 2)
}

/// The pure state machine. Equality and hashing cover everything the machine decides on, so a
/// model checker can store machines in its state space as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    health: Health,
    lease: Lease,
    renew_interval: Duration,
    retry_interval: Duration,
    loss_lead: Duration,
    last_confirmed: Instant,
    releasing: bool,
}

impl Hash for Machine {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // `Lease` is not `Hash`; hashing a subset of what `Eq` compares is consistent with it.
        let l = &self.lease;
        (l.key(), l.owner(), l.token(), l.ttl(), l.deadline()).hash(state);
        (
            self.health,
            self.renew_interval,
            self.retry_interval,
            self.loss_lead,
            self.last_confirmed,
            self.releasing,
        )
            .hash(state);
    }
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
            releasing: false,
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

    /// Whether a release has started ([`Event::ReleaseStarted`]) and its outcome is not in yet.
    #[cfg_attr(not(feature = "model"), allow(dead_code))] // read by the model checker only
    pub fn is_releasing(&self) -> bool {
        self.releasing && !self.health.is_final()
    }

    /// Whether the holder may still *start* a side effect at `now`: health is `Held`, no release
    /// has started, and the loss deadline has not passed. The guard's
    /// [`may_act`](super::LeaseGuard::may_act) is this, on the validity clock.
    pub fn may_act(&self, now: Instant) -> bool {
        self.health == Health::Held && !self.releasing && now < self.loss_deadline()
    }

    /// The instant at which loss is declared without a confirmed renewal: the lease's deadline
    /// minus the loss lead (capped at half the TTL). This is the one place it is computed; the
    /// guard's [`may_act`](super::LeaseGuard::may_act) and the drain read it from here.
    pub fn loss_deadline(&self) -> Instant {
        let lead = capped_loss_lead(self.loss_lead, self.lease.ttl());
        self.lease
            .deadline()
            .checked_sub(lead)
            .unwrap_or(self.lease.deadline())
    }

    /// Applies `event` at `now` and returns the new health. Final states never change.
    ///
    /// [`Event::ReleaseStarted`] changes no health (not even past the loss deadline): the
    /// release is sent whatever the health, and its outcome decides the final state.
    pub fn step(&mut self, event: Event, now: Instant) -> Health {
        if self.health.is_final() {
            return self.health;
        }
        if event == Event::ReleaseStarted {
            self.releasing = true;
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
            Event::ReleaseStarted => self.health, // handled above
            Event::Released => Health::Released,
            Event::ReleaseNotHeld => Health::Lost(LossReason::NotHeldAtRelease),
        };
        if !self.health.is_final() && now >= self.loss_deadline() {
            self.health = Health::Lost(LossReason::DeadlineReached);
        }
        self.health
    }

    /// What the driver should do next, at `now`: renew (when, and until when), or nothing more
    /// once the state is final or a release has started.
    pub fn next(&self, now: Instant) -> Next {
        if self.health.is_final() || self.releasing {
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
    fn release_start_stops_acting_and_renewing_and_its_outcome_decides() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        assert!(m.may_act(t0));
        assert_eq!(m.step(Event::ReleaseStarted, t0), Health::Held);
        assert!(m.is_releasing());
        assert!(!m.may_act(t0), "may_act after the release started");
        assert_eq!(m.next(t0), Next::Stop, "renews while releasing");
        let mut lost = m.clone();
        assert_eq!(m.step(Event::Released, t0), Health::Released);
        assert!(!m.is_releasing());
        assert_eq!(
            lost.step(Event::ReleaseNotHeld, t0),
            Health::Lost(LossReason::NotHeldAtRelease)
        );
    }

    #[test]
    fn a_release_started_past_the_loss_deadline_still_waits_for_its_outcome() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        let late = m.loss_deadline() + Duration::from_millis(1);
        assert_eq!(m.step(Event::ReleaseStarted, late), Health::Held);
        assert!(!m.may_act(late));
        assert_eq!(m.step(Event::Released, late), Health::Released);
    }

    #[test]
    fn a_final_machine_ignores_a_release_start() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        m.step(Event::RenewRefused, t0);
        m.step(Event::ReleaseStarted, t0);
        assert!(!m.is_releasing());
        assert_eq!(m.health(), Health::Lost(LossReason::RenewalRefused));
    }

    #[test]
    fn may_act_until_the_loss_deadline_and_only_when_held() {
        let t0 = Instant::now();
        let mut m = machine(t0);
        let ld = m.loss_deadline();
        assert!(m.may_act(ld - Duration::from_nanos(1)));
        assert!(!m.may_act(ld));
        m.step(Event::RenewFailed, t0 + Duration::from_secs(3));
        assert!(!m.may_act(t0 + Duration::from_secs(3)), "AtRisk may act");
    }

    #[test]
    fn machines_compare_and_hash_by_what_they_decide_on() {
        use std::collections::hash_map::DefaultHasher;
        fn h(m: &Machine) -> u64 {
            let mut s = DefaultHasher::new();
            m.hash(&mut s);
            s.finish()
        }
        let t0 = Instant::now();
        let a = machine(t0);
        let b = a.clone();
        assert_eq!(a, b);
        assert_eq!(h(&a), h(&b));
        let mut c = a.clone();
        c.step(Event::ReleaseStarted, t0);
        assert_ne!(a, c);
        let mut d = a.clone();
        d.step(Event::RenewFailed, t0);
        assert_ne!(a, d);
    }

    #[test]
    fn the_configured_checks_use_the_same_capped_lead() {
        let ttl = Duration::from_secs(9);
        assert_eq!(
            capped_loss_lead(Duration::from_secs(100), ttl),
            ttl / 2,
            "lead not capped at half the TTL"
        );
        let t0 = Instant::now();
        let m = Machine::new(
            lease(t0, ttl),
            Duration::from_secs(3),
            Duration::from_millis(500),
            Duration::MAX,
            t0,
        );
        assert_eq!(m.loss_deadline(), m.lease().deadline() - ttl / 2);
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
