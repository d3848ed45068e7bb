//! The renewal supervisor: bounded acquisition, renewal, a health state machine, and a guard that
//! cancels the guarded work when the lease is lost.
//!
//! The promise to the application is not "you got a lease" but "you will know, in time, when you
//! may no longer act, and your work will be stopped":
//! - [`Supervisor::acquire`] tries, then retries with jittered backoff (woken by the store's watch
//!   when it has one) until the configured wait runs out or it is cancelled. No unbounded waits.
//! - While held, a small task renews every third of the TTL, each attempt bounded so that it ends
//!   before the loss deadline. Health moves `Held -> AtRisk -> Lost` (or `Released`), published on
//!   a `tokio::sync::watch` channel ([`LeaseGuard::health`]).
//! - Loss is signalled strictly **before** the lease's local validity deadline, and the guard's
//!   [`CancellationToken`](tokio_util::sync::CancellationToken) is cancelled at that moment. [`LeaseGuard::may_act`] checks the same
//!   *loss deadline* on the spot; a guard whose loss deadline passed before it was handed out (a
//!   very slow answer) is born `Lost`.
//!
//! # Host suspend
//! Validity is judged on the configured [`Clock`](crate::clock::Clock)
//! ([`SupervisorConfig::with_clock`]; by default the system clock): tokio's monotonic clock plus
//! the time the host spent suspended. Linux counts suspend and hibernation (`CLOCK_BOOTTIME`);
//! other operating systems count none, so there a suspend goes unnoticed until the next renewal
//! is refused. Timers run on tokio's clock, which does not count a suspend, so every sleep of the
//! renewal task wakes at least every [`SupervisorConfig::clock_check_interval`] (a twentieth of
//! the TTL, 1 ms to 1 s) to look at the clock. After a resume past the loss deadline:
//! `may_act()` is false at once; health turns `Lost(DeadlineReached)`, the work is cancelled and
//! an election leader steps down within that interval. A renewal confirmed after the resume does
//! not revive the lease.
//!
//! # Failure of the renewal task
//! If the renewal task ends early (a panicking [`Hook`], its runtime shutting down), the work is
//! cancelled and health becomes `Lost(RenewalTaskEnded)`; nobody is left `Held` without renewal.
//! Durations never panic: [`SupervisorConfig::validate`] (run by every acquire) rejects timings
//! that leave no time to renew with a typed error, and every other wait or timeout, up to
//! `Duration::MAX`, saturates. Opening a store's watch is bounded like any store call; a watch
//! that does not open in time leaves the acquirer polling.
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::{LeaseKey, MemoryLeaseStore};
//! use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let sup = Supervisor::new(MemoryLeaseStore::new(), SupervisorConfig::new(Duration::from_secs(10)));
//! let Acquisition::Acquired(guard) = sup.acquire(&LeaseKey::new("reindex")?).await? else {
//!     return Ok(()); // someone else is doing it
//! };
//! let token = guard.token();
//! // The work is cancelled (dropped) if the lease is lost; carry the token into every write.
//! let result = guard.run(async move { token.get() * 2 }).await;
//! assert!(result.is_ok());
//! guard.release().await?;
//! # Ok(()) }
//! ```

//!
//! # Layout
//! - `entry.rs`: the public entry points, [`Supervisor`] (bounded acquisition) and what it
//!   returns ([`Acquisition`], [`RunOutcome`]).
//! - `pending.rs`: what an acquisition holds before a guard exists (a store call in flight, a
//!   grant no guard holds yet), released in the background if the acquire is dropped half way.
//! - `guard.rs`: [`LeaseGuard`] and its view for the guarded work, [`LeaseGuardView`].
//! - `driver.rs`: the renewal task, a thin loop that feeds the pure state machine and carries
//!   out what it decides; `plan.rs`: the task's own decisions, pure (when to renew on the batch
//!   grid, how long each call may take, what each answer means), unit-tested in `plan_tests.rs`.
//! - `state.rs` (private): the pure state machine, `Machine` (public with the `model` feature,
//!   for the model checker), with [`Health`] and [`LossReason`].
//! - `config.rs`: [`SupervisorConfig`]; `batch.rs`: renewal coalescing.

mod batch;
mod config;
mod driver;
mod entry;
mod guard;
mod pending;
mod plan;
mod state;
#[cfg(test)]
mod tests;

pub use config::SupervisorConfig;
pub use entry::{Acquisition, RunOutcome, Supervisor};
#[allow(deprecated)]
pub use guard::LeaseGuardRef;
pub use guard::{LeaseGuard, LeaseGuardView};
pub use state::{Health, LossReason};
// The pure state machine the renewal task runs, for model checkers and simulators that drive it
// themselves (leasehold-model): behind the `model` feature, since applications do not need it.
#[cfg(feature = "model")]
pub use state::{Event, Machine, Next};

// Hooks moved to [`crate::hook`]; re-exported here for the crates that name them by this path.
pub use crate::hook::{Hook, NoHook, RenewalResult};
