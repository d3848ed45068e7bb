//! Hooks: how observability (metrics, audit logs) sees what the supervisor and election do,
//! without the core depending on any metrics library.

use std::fmt;
use std::time::Duration;

use crate::fencing::FencingToken;
use crate::lease::{Lease, LeaseKey, OwnerId, ReleaseOutcome};

use crate::supervisor::Health;

/// How a renewal attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewalResult {
    /// Confirmed; `remaining_before` is how much local validity was left when it landed.
    Confirmed {
        /// Local validity left (before the extension) when the confirmation arrived.
        remaining_before: Duration,
    },
    /// Refused by the store (the lease is gone).
    Refused,
    /// Failed with an error (retryable or not).
    Failed,
    /// No answer before the attempt's bound.
    TimedOut,
}

/// Called by the supervisor and the election at each step. Every method has an empty default;
/// implementations must be cheap and must not block.
///
/// ```
/// use leasehold_core::hook::Hook;
/// use leasehold_core::supervisor::Health;
/// use leasehold_core::Lease;
///
/// #[derive(Debug)]
/// struct PrintLosses;
/// impl Hook for PrintLosses {
///     fn health_changed(&self, lease: &Lease, from: Health, to: Health) {
///         if matches!(to, Health::Lost(_)) {
///             eprintln!("{} lost token {} ({from:?} -> {to:?})", lease.key(), lease.token());
///         }
///     }
/// }
/// ```
pub trait Hook: Send + Sync + fmt::Debug {
    /// A lease was acquired after waiting `waited`.
    fn acquired(&self, lease: &Lease, waited: Duration) {
        let _ = (lease, waited);
    }
    /// The bounded wait ran out (or was cancelled) without a grant.
    fn not_acquired(&self, key: &LeaseKey, waited: Duration) {
        let _ = (key, waited);
    }
    /// A renewal attempt ended after `latency`. `lease` is the lease after the attempt: the
    /// renewed lease (with its new deadline) when confirmed, the unchanged one otherwise.
    fn renewal(&self, lease: &Lease, result: RenewalResult, latency: Duration) {
        let _ = (lease, result, latency);
    }
    /// The health of a held lease changed.
    fn health_changed(&self, lease: &Lease, from: Health, to: Health) {
        let _ = (lease, from, to);
    }
    /// The lease ended (released, or lost and given up) after being held for `held_for`.
    fn ended(&self, lease: &Lease, held_for: Duration, released: Option<ReleaseOutcome>) {
        let _ = (lease, held_for, released);
    }
    /// Leadership of an election changed for `candidate` (the id it joined with, not the instance
    /// that holds the lease): `Some(term)` when elected, `None` when it stepped down.
    fn leadership(&self, key: &LeaseKey, candidate: &OwnerId, term: Option<FencingToken>) {
        let _ = (key, candidate, term);
    }
}

/// The hook that does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHook;

impl Hook for NoHook {}
