//! Fenced semaphores: at most `N` holders of one name at a time, on any [`LeaseStore`].
//!
//! A semaphore `NAME` of `N` permits is `N` *slot keys* derived from the name in the library's
//! reserved namespace ([`LeaseKey::reserved`]): `NAME.lease--permit.0` to
//! `NAME.lease--permit.{N-1}`. A permit is a supervised lease on one slot, so everything a lease
//! has, a permit has, on every backend and with no change to the [`LeaseStore`] contract: the
//! [`Supervisor`] renews it, publishes its health, cancels guarded work strictly before its local
//! deadline when renewal cannot be confirmed, and releases it; a holder that dies leaves its
//! slot to expire after its TTL.
//!
//! # Fencing is per slot
//! A permit's [token](Permit::token) is its slot's fencing token: it strictly increases per
//! *slot*, not per semaphore (slot 0 may be at token 9 while slot 1 issues token 4). A resource
//! guarded by a semaphore must therefore fence by the slot key ([`Permit::key`]): each slot key
//! is a lease key like any other, with its own high-water mark in a
//! [`FencedResource`](crate::FencedResource). A single high-water mark for the whole semaphore
//! would reject valid holders of slots with lower tokens.
//!
//! # Acquiring
//! An acquisition reads the holders of every slot in one call
//! ([`holders_many`](LeaseStore::holders_many)) and tries the free ones, starting at a slot
//! chosen by the permit's owner (so that contenders do not all race for slot 0). When every slot
//! is held it waits, bounded by [`SupervisorConfig::acquire_wait`] or a cancellation token: woken
//! by the store's watch on (up to 16 of) the slots where the store has one, else polling with
//! jittered backoff between [`SupervisorConfig::backoff_min`] and
//! [`SupervisorConfig::backoff_max`].
//!
//! Each permit is acquired under its own owner id, an [instance](OwnerId::instance) of the
//! supervisor's owner, so two permits taken through one semaphore never look like one owner to
//! the store (the same owner acquiring a held key would take it over).
//!
//! **Fairness.** There is no queue: the store holds only the slots. Every waiter looks again at
//! least every [`SupervisorConfig::backoff_max`] (and on every change the watch reports), and
//! takes a slot that is free when it looks; a contender that asks again at once after releasing
//! can overtake waiters. What is promised: while permits cycle, a waiter that asks at intervals
//! longer than its backoff is never starved; no first-come-first-served order is promised.
//!
//! # Processes that disagree on `N`
//! `N` is not part of the slot keys: semaphores of one name with different `N` share their first
//! slots. Processes asking for 3 permits use slots 0 to 2, processes asking for 5 use slots 0 to
//! 4, so at most the **largest** `N` in use hold permits at once (never the sum), and a lowered
//! limit takes full effect once no process with the old limit is left. Each slot keeps its token
//! sequence across such a change.
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::{LeaseKey, MemoryLeaseStore};
//! use leasehold_core::semaphore::{PermitAcquisition, Semaphore};
//! use leasehold_core::supervisor::SupervisorConfig;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = MemoryLeaseStore::new();
//! let config = SupervisorConfig::new(Duration::from_secs(10));
//! let crawlers = Semaphore::new(store, &LeaseKey::new("crawlers")?, 2, config)?;
//! let a = crawlers.acquire().await?.permit().expect("a free permit");
//! let b = crawlers.acquire().await?.permit().expect("a free permit");
//! assert_ne!(a.slot(), b.slot());
//! // Both permits are taken: a third is refused (the configured wait is zero).
//! assert!(matches!(crawlers.try_acquire().await?, PermitAcquisition::NotAcquired { .. }));
//! // Fence writes by the slot key, with the slot's token.
//! println!("write to {} with token {}", a.key(), a.token());
//! a.release().await?;
//! assert!(crawlers.try_acquire().await?.permit().is_some());
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use crate::clock::saturating_add;
use crate::error::{Error, Result};
use crate::lease::{HeldBy, LeaseKey, OwnerId};
use crate::store::LeaseStore;
use crate::supervisor::{Acquisition, Supervisor, SupervisorConfig};

/// The most permits a semaphore may have. Every acquisition reads every slot, and a full
/// semaphore is polled as a whole, so a semaphore is meant for tens or hundreds of permits, not
/// for millions.
pub const MAX_PERMITS: u32 = 1024;

/// The most slots an acquisition watches while it waits (the first ones from its starting slot);
/// a change elsewhere is found by polling.
const MAX_WATCHED_SLOTS: usize = 16;

/// The role of slot `i` under the semaphore's name: `permit.I`.
const SLOT_ROLE: &str = "permit";

/// A fenced semaphore: at most `N` permits of one name held at a time, each a supervised lease
/// on one of `N` slot keys (see the [module docs](self)).
#[derive(Clone)]
pub struct Semaphore {
    sup: Supervisor,
    name: LeaseKey,
    slots: Arc<[LeaseKey]>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.slots.len())
            .field("supervisor", &self.sup)
            .finish()
    }
}

/// The result of a bounded acquisition of a permit.
#[derive(Debug)]
#[must_use]
pub enum PermitAcquisition {
    /// Acquired; the permit is renewed until released, dropped or lost.
    Acquired(Permit),
    /// The wait ran out while every slot was held.
    NotAcquired {
        /// The holders of the slots at the last look (the store's view; empty if it could not be
        /// read).
        held: Vec<HeldBy>,
        /// How long we waited.
        waited: Duration,
    },
    /// The cancellation token passed to [`Semaphore::acquire_until_cancelled`] fired.
    Cancelled,
}

impl PermitAcquisition {
    /// The permit, if acquired.
    pub fn permit(self) -> Option<Permit> {
        match self {
            PermitAcquisition::Acquired(p) => Some(p),
            _ => None,
        }
    }
}

impl Semaphore {
    /// A semaphore `name` of `permits` permits on `store`, acquiring as a fresh random owner with
    /// `config` (TTL, acquire wait, backoff, ...).
    ///
    /// # Errors
    /// - [`Error::InvalidInput`] if `permits` is zero or greater than [`MAX_PERMITS`], or the
    ///   timings of `config` leave no time to renew (see [`SupervisorConfig::validate`]).
    /// - [`Error::InvalidKey`] if `name` is too long to derive its slot keys (they add up to 19
    ///   bytes to it).
    /// - [`Error::InvalidTtl`] for a zero or absurd TTL.
    pub fn new<S: LeaseStore + 'static>(
        store: S,
        name: &LeaseKey,
        permits: u32,
        config: SupervisorConfig,
    ) -> Result<Self> {
        Self::from_supervisor(Supervisor::new(store, config), name, permits)
    }

    /// A semaphore whose permits are acquired and renewed by `sup`: its store, configuration,
    /// owner (each permit is held by an [instance](OwnerId::instance) of it), fence and hook.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{Error, LeaseKey, MemoryLeaseStore, OwnerId};
    /// use leasehold_core::semaphore::{MAX_PERMITS, Semaphore};
    /// use leasehold_core::supervisor::{Supervisor, SupervisorConfig};
    /// let sup = Supervisor::new(MemoryLeaseStore::new(), SupervisorConfig::new(Duration::from_secs(10)))
    ///     .with_owner(OwnerId::new("worker-7")?);
    /// let name = LeaseKey::new("exports")?;
    /// let sem = Semaphore::from_supervisor(sup.clone(), &name, 4)?;
    /// assert_eq!(sem.slot_keys()[3].as_str(), "exports.lease--permit.3");
    /// assert!(matches!(Semaphore::from_supervisor(sup.clone(), &name, 0), Err(Error::InvalidInput(_))));
    /// assert!(Semaphore::from_supervisor(sup, &name, MAX_PERMITS + 1).is_err());
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Semaphore::new`], and [`Error::InvalidOwner`] if the supervisor's owner is too long
    /// to make instances of (more than 111 bytes).
    pub fn from_supervisor(sup: Supervisor, name: &LeaseKey, permits: u32) -> Result<Self> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::InvalidInput(format!(
                "a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"
            )));
        }
        sup.config().validate()?;
        OwnerId::instance(sup.owner().identity())?;
        let slots = (0..permits)
            .map(|i| Self::slot_key(name, i))
            .collect::<Result<Vec<_>>>()?;
        Ok(Semaphore {
            sup,
            name: name.clone(),
            slots: slots.into(),
        })
    }

    /// The key of slot `slot` of the semaphore `name`: `NAME.lease--permit.SLOT`. The same for
    /// every `N` (see [processes that disagree on `N`](self#processes-that-disagree-on-n)).
    /// A resource guarded by the semaphore fences by this key.
    ///
    /// ```
    /// use leasehold_core::LeaseKey;
    /// use leasehold_core::semaphore::Semaphore;
    /// let key = Semaphore::slot_key(&LeaseKey::new("crawlers")?, 2)?;
    /// assert_eq!(key.as_str(), "crawlers.lease--permit.2");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidKey`] if the slot key would be longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN).
    pub fn slot_key(name: &LeaseKey, slot: u32) -> Result<LeaseKey> {
        name.reserved(&format!("{SLOT_ROLE}.{slot}"))
    }

    /// The semaphore's name.
    pub fn name(&self) -> &LeaseKey {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        u32::try_from(self.slots.len()).unwrap_or(MAX_PERMITS)
    }

    /// The slot keys, slot 0 first.
    pub fn slot_keys(&self) -> &[LeaseKey] {
        &self.slots
    }

    /// The supervisor that acquires and renews the permits.
    pub fn supervisor(&self) -> &Supervisor {
        &self.sup
    }

    /// The holder of every slot as the store sees it now (`None` for a free slot), slot 0
    /// first, in one [`holders_many`](LeaseStore::holders_many) call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{LeaseKey, MemoryLeaseStore};
    /// use leasehold_core::semaphore::Semaphore;
    /// use leasehold_core::supervisor::SupervisorConfig;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let sem = Semaphore::new(MemoryLeaseStore::new(), &LeaseKey::new("jobs")?, 2, SupervisorConfig::new(Duration::from_secs(10)))?;
    /// let permit = sem.acquire().await?.permit().expect("free");
    /// let holders = sem.holders().await?;
    /// assert_eq!(holders.iter().flatten().count(), 1);
    /// assert_eq!(holders[permit.slot() as usize].as_ref().map(|h| h.token), Some(permit.token()));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The store's error.
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    pub async fn holders(&self) -> Result<Vec<Option<HeldBy>>> {
        self.sup.store().holders_many(&self.slots).await
    }

    /// Acquires a permit, waiting at most the configured
    /// [acquire wait](SupervisorConfig::with_acquire_wait).
    ///
    /// # Errors
    /// Invalid input, a non-retryable store error, or the last store error if no slot could be
    /// read or tried in the last round before the wait ran out.
    ///
    /// # Cancellation safety
    /// Cancel safe, as [`Supervisor::acquire`]: dropping it stops waiting, and a slot it was
    /// granted but had not yet handed out as a permit is released in the background within two
    /// op timeouts.
    pub async fn acquire(&self) -> Result<PermitAcquisition> {
        self.acquire_within(self.sup.config().acquire_wait(), &CancellationToken::new())
            .await
    }

    /// Like [`Semaphore::acquire`], but stops waiting when `cancel` fires.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{LeaseKey, MemoryLeaseStore};
    /// use leasehold_core::semaphore::{PermitAcquisition, Semaphore};
    /// use leasehold_core::supervisor::SupervisorConfig;
    /// use tokio_util::sync::CancellationToken;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let config = SupervisorConfig::new(Duration::from_secs(10)).with_acquire_wait(Duration::from_secs(60));
    /// let sem = Semaphore::new(MemoryLeaseStore::new(), &LeaseKey::new("gpu")?, 1, config)?;
    /// let held = sem.acquire().await?.permit().expect("free");
    /// let cancel = CancellationToken::new();
    /// cancel.cancel();
    /// assert!(matches!(sem.acquire_until_cancelled(&cancel).await?, PermitAcquisition::Cancelled));
    /// held.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    ///
    /// # Cancellation safety
    /// Cancel safe through `cancel`: an attempt in flight finishes (bounded by the op timeout)
    /// and a slot it obtained is released before returning `Cancelled`. Dropping the future is
    /// cancel safe too, as for [`Semaphore::acquire`].
    pub async fn acquire_until_cancelled(
        &self,
        cancel: &CancellationToken,
    ) -> Result<PermitAcquisition> {
        self.acquire_within(self.sup.config().acquire_wait(), cancel)
            .await
    }

    /// One look, without waiting: a permit if a slot is free (or expired) now, else
    /// [`PermitAcquisition::NotAcquired`] naming the holders. Opens no watch.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    ///
    /// # Cancellation safety
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn try_acquire(&self) -> Result<PermitAcquisition> {
        self.acquire_within(Duration::ZERO, &CancellationToken::new())
            .await
    }

    async fn acquire_within(
        &self,
        wait: Duration,
        cancel: &CancellationToken,
    ) -> Result<PermitAcquisition> {
        let config = self.sup.config();
        config.validate()?;
        let started = Instant::now();
        let deadline = saturating_add(started, wait);
        let owner = OwnerId::instance(self.sup.owner().identity())?;
        let sup = self.sup.clone().with_owner(owner.clone());
        let order = rotation(&owner, self.slots.len());
        let mut watch_opened = !sup.store().capabilities().watch || wait.is_zero();
        let mut watch: Option<SelectAll<BoxStream<'static, Result<()>>>> = None;
        let mut attempt: u32 = 0;
        loop {
            if cancel.is_cancelled() {
                return Ok(PermitAcquisition::Cancelled);
            }
            let (candidates, mut held, mut last_err) = match self.scan(&order).await {
                Ok((free, held)) => (free, held, None),
                Err(e) if e.is_retryable() => (order.clone(), Vec::new(), Some(e)),
                Err(e) => return Err(e),
            };
            let mut answered = last_err.is_none();
            for slot in candidates {
                if cancel.is_cancelled() {
                    return Ok(PermitAcquisition::Cancelled);
                }
                match sup.try_acquire(&self.slots[slot]).await {
                    Ok(Acquisition::Acquired(guard)) => {
                        if cancel.is_cancelled() {
                            let _ = guard.release().await;
                            return Ok(PermitAcquisition::Cancelled);
                        }
                        return Ok(PermitAcquisition::Acquired(Permit {
                            name: self.name.clone(),
                            slot: u32::try_from(slot).unwrap_or(u32::MAX),
                            guard,
                        }));
                    }
                    Ok(Acquisition::NotAcquired { holder, .. }) => {
                        answered = true;
                        held.extend(holder.map(HeldBy::from));
                    }
                    Ok(Acquisition::Cancelled) => {}
                    Err(e) if e.is_retryable() => last_err = Some(e),
                    Err(e) => return Err(e),
                }
            }
            attempt = attempt.saturating_add(1);
            let now = Instant::now();
            if now >= deadline {
                if let (false, Some(e)) = (answered, last_err) {
                    return Err(e);
                }
                return Ok(PermitAcquisition::NotAcquired {
                    held,
                    waited: now - started,
                });
            }
            if !watch_opened {
                watch_opened = true;
                watch = self.open_watches(&order, deadline - now).await;
                if watch.is_some() {
                    // Look again at once: a release between the look and the watch is not missed.
                    continue;
                }
            }
            let wake = saturating_add(now, config.backoff(attempt)).min(deadline);
            tokio::select! {
                _ = cancel.cancelled() => return Ok(PermitAcquisition::Cancelled),
                _ = tokio::time::sleep_until(wake) => {}
                hint = async {
                    match watch.as_mut() {
                        Some(w) => w.next().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if !matches!(hint, Some(Ok(()))) {
                        watch = None; // a watch broke: poll from here on
                    }
                }
            }
        }
    }

    /// The free slots, in `order`, and the holders of the others, from one read of every slot
    /// (bounded by the op timeout).
    async fn scan(&self, order: &[usize]) -> Result<(Vec<usize>, Vec<HeldBy>)> {
        let store = self.sup.store();
        let op = self.sup.config().op_timeout();
        let holders = timeout(op, store.holders_many(&self.slots))
            .await
            .map_err(|_| Error::Timeout {
                backend: store.backend(),
                operation: "holders_many",
                after: op,
            })??;
        if holders.len() != self.slots.len() {
            return Err(Error::Backend {
                backend: store.backend(),
                message: format!(
                    "holders_many reported {} holders for {} keys",
                    holders.len(),
                    self.slots.len()
                ),
                source: None,
            });
        }
        let free = order.iter().copied().filter(|&i| holders[i].is_none());
        Ok((free.collect(), holders.into_iter().flatten().collect()))
    }

    /// Opens watches on the first [`MAX_WATCHED_SLOTS`] slots of `order`, together, bounded by
    /// the op timeout within `left`. `None` if none opened.
    async fn open_watches(
        &self,
        order: &[usize],
        left: Duration,
    ) -> Option<SelectAll<BoxStream<'static, Result<()>>>> {
        let store = self.sup.store();
        let bound = self.sup.config().op_timeout().min(left);
        let opens = order
            .iter()
            .take(MAX_WATCHED_SLOTS)
            .map(|&i| store.watch(&self.slots[i]));
        let opened = timeout(bound, futures::future::join_all(opens))
            .await
            .ok()?;
        let mut all = SelectAll::new();
        for w in opened.into_iter().flatten().flatten() {
            let s = futures::stream::unfold(w, |mut w| async move {
                w.changed().await.map(|hint| (hint, w))
            });
            all.push(s.boxed());
        }
        (!all.is_empty()).then_some(all)
    }
}

/// The slots in the order an acquisition by `owner` tries them: all of them, starting at one
/// chosen by a hash of the owner (a fresh instance for each acquisition).
fn rotation(owner: &OwnerId, n: usize) -> Vec<usize> {
    // FNV-1a: spreads the starting slots; nothing depends on it being hard to predict.
    let hash = owner
        .as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    let start = usize::try_from(hash % u64::try_from(n.max(1)).unwrap_or(1)).unwrap_or(0);
    (0..n).map(|i| (start + i) % n).collect()
}

mod permit;

pub use permit::Permit;

#[cfg(test)]
mod tests;
