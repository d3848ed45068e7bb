//! [`Permit`]: one held permit of a [`Semaphore`](super::Semaphore), a [`LeaseGuard`] on one
//! slot key with the slot's name and number; every method is the guard's.

use std::future::Future;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::fencing::FencingToken;
use crate::lease::{Lease, LeaseKey, OwnerId, ReleaseOutcome};
use crate::supervisor::{Health, LeaseGuard, LeaseGuardView, LossReason};

/// One permit of a [`Semaphore`](super::Semaphore): a supervised lease on one slot, renewed in the background
/// until released, dropped or lost, exactly as a [`LeaseGuard`] (which it wraps).
///
/// Dropping it without [`release`](Permit::release) stops renewal and releases in the
/// background.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{FencedResource, LeaseKey, MemoryFencedResource, MemoryLeaseStore, WriteOp};
/// use leasehold_core::semaphore::Semaphore;
/// use leasehold_core::supervisor::SupervisorConfig;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let resource = MemoryFencedResource::new();
/// let sem = Semaphore::new(MemoryLeaseStore::new(), &LeaseKey::new("uploads")?, 3, SupervisorConfig::new(Duration::from_secs(10)))?;
/// let permit = sem.acquire().await?.permit().expect("a free permit");
/// let (key, token) = (permit.key().clone(), permit.token());
/// // The work is cancelled (dropped) if the permit is lost; it fences by the slot key.
/// let out = permit.run(resource.write(&key, token, WriteOp::Add(1))).await.expect("held")?;
/// assert!(out.is_accepted());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Permit {
    pub(super) name: LeaseKey,
    pub(super) slot: u32,
    pub(super) guard: LeaseGuard,
}

impl Permit {
    /// The semaphore's name.
    pub fn name(&self) -> &LeaseKey {
        &self.name
    }

    /// The slot this permit holds (0 to N-1).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot key: the key a guarded resource fences by (tokens increase per slot).
    pub fn key(&self) -> &LeaseKey {
        self.guard.key()
    }

    /// The permit's owner (an instance of the supervisor's owner).
    pub fn owner(&self) -> &OwnerId {
        self.guard.owner()
    }

    /// The slot's fencing token of this grant: carry it, with [`Permit::key`], into every
    /// protected write.
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// The latest lease on the slot.
    pub fn lease(&self) -> Lease {
        self.guard.lease()
    }

    /// The current health.
    pub fn health(&self) -> Health {
        self.guard.health()
    }

    /// Whether it is still reasonable to start a side effect (see [`LeaseGuard::may_act`]).
    pub fn may_act(&self) -> bool {
        self.guard.may_act()
    }

    /// A receiver of health changes.
    pub fn subscribe(&self) -> watch::Receiver<Health> {
        self.guard.subscribe()
    }

    /// A child token cancelled when the permit is lost or released.
    pub fn cancellation(&self) -> CancellationToken {
        self.guard.cancellation()
    }

    /// The cheap, cloneable view for the guarded work (token, slot key, health, cancellation).
    pub fn view(&self) -> LeaseGuardView {
        self.guard.view()
    }

    /// Renamed to [`view`](Permit::view).
    #[deprecated(note = "renamed to view")]
    pub fn guard_ref(&self) -> LeaseGuardView {
        self.view()
    }

    /// The lease guard of the slot.
    pub fn guard(&self) -> &LeaseGuard {
        &self.guard
    }

    /// The lease guard of the slot, for code written against guards (the slot is
    /// [`LeaseGuard::key`]).
    pub fn into_guard(self) -> LeaseGuard {
        self.guard
    }

    /// Completes when the permit is lost (or released), with the final health.
    ///
    /// # Cancellation safety
    /// Cancel safe.
    pub async fn lost(&self) -> Health {
        self.guard.lost().await
    }

    /// Runs `work` until it completes or the permit is lost, as [`LeaseGuard::run`].
    ///
    /// # Cancellation safety
    /// Cancel safe: dropping it drops `work` and leaves the permit as it was.
    pub async fn run<F: Future>(&self, work: F) -> std::result::Result<F::Output, LossReason> {
        self.guard.run(work).await
    }

    /// Stops renewing, cancels guarded work and releases the slot, as [`LeaseGuard::release`].
    ///
    /// # Errors
    /// Never for store failures (the slot then expires after its TTL).
    ///
    /// # Cancellation safety
    /// Cancel safe: the release runs in the background and completes even if this future is
    /// dropped.
    pub async fn release(self) -> Result<ReleaseOutcome> {
        self.guard.release().await
    }
}
