//! The public entry points: [`Supervisor`], its bounded acquisition, and what it returns.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use super::batch;
use super::config::SupervisorConfig;
use super::guard::{LeaseGuard, LeaseGuardView};
use super::pending::{InFlight, Ungiven};
use super::state::LossReason;
use crate::clock::saturating_add;
use crate::error::{Error, Result};
use crate::fencing::FencedResource;
use crate::hook::{Hook, NoHook};
use crate::lease::{AcquireOutcome, AcquireRequest, Holder, LeaseKey, OwnerId, ReleaseOutcome};
use crate::store::{KeyWatch, LeaseStore};

/// Acquires and supervises leases on one store.
#[derive(Clone)]
pub struct Supervisor {
    store: Arc<dyn LeaseStore>,
    config: SupervisorConfig,
    owner: OwnerId,
    fence: Option<Arc<dyn FencedResource>>,
    hook: Arc<dyn Hook>,
    renewer: batch::Renewer,
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("backend", &self.store.backend())
            .field("owner", &self.owner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The result of a bounded acquisition.
#[derive(Debug)]
#[must_use]
pub enum Acquisition {
    /// Acquired; the guard renews until released, dropped or lost.
    Acquired(LeaseGuard),
    /// The wait ran out while someone else held the key.
    NotAcquired {
        /// The holder at the last attempt.
        holder: Option<Holder>,
        /// How long we waited.
        waited: Duration,
    },
    /// The cancellation token passed to [`Supervisor::acquire_until_cancelled`] fired.
    Cancelled,
}

impl Acquisition {
    /// The guard, if acquired.
    pub fn guard(self) -> Option<LeaseGuard> {
        match self {
            Acquisition::Acquired(g) => Some(g),
            _ => None,
        }
    }
}

impl Supervisor {
    /// A supervisor acting as a fresh random owner.
    pub fn new<S: LeaseStore + 'static>(store: S, config: SupervisorConfig) -> Self {
        Self::from_arc(Arc::new(store), config)
    }

    /// A supervisor over a shared store.
    pub fn from_arc(store: Arc<dyn LeaseStore>, config: SupervisorConfig) -> Self {
        let renewer = batch::Renewer::new(
            store.clone(),
            config.renewal_batching(),
            config.renew_interval(),
            config.op_timeout(),
        );
        Supervisor {
            store,
            config,
            owner: OwnerId::random(),
            fence: None,
            hook: Arc::new(NoHook),
            renewer,
        }
    }

    /// Acts as `owner` instead of a random one.
    pub fn with_owner(mut self, owner: OwnerId) -> Self {
        self.owner = owner;
        self
    }

    /// Immediate fencing: install every new token in `resource` before handing out the guard, so
    /// the previous holder is rejected even before the new one writes.
    pub fn with_fence_on_acquire(mut self, resource: Arc<dyn FencedResource>) -> Self {
        self.fence = Some(resource);
        self
    }

    /// Renamed to [`with_fence_on_acquire`](Supervisor::with_fence_on_acquire), which says when
    /// the resource is fenced.
    #[deprecated(note = "renamed to with_fence_on_acquire")]
    pub fn with_fence(self, resource: Arc<dyn FencedResource>) -> Self {
        self.with_fence_on_acquire(resource)
    }

    /// Reports every step to `hook` (metrics, audit).
    pub fn with_hook(mut self, hook: Arc<dyn Hook>) -> Self {
        self.hook = hook;
        self
    }

    /// The hook.
    pub fn hook(&self) -> &Arc<dyn Hook> {
        &self.hook
    }

    /// The owner id this supervisor acquires as.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The configuration.
    pub fn config(&self) -> &SupervisorConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.store
    }

    /// Acquires `key`, waiting at most the configured acquire wait.
    ///
    /// # Errors
    /// Invalid input, or the last store error if every attempt failed.
    ///
    /// # Cancellation safety
    /// Cancel safe: dropping it (a `timeout` or `select!` around it) stops waiting, and a grant it
    /// obtained but had not yet handed out as a guard (a store reply still in flight, or a grant
    /// waiting for its fence install) is released in a background task, within two op timeouts,
    /// instead of holding the key for a whole TTL. The caller's task polls the store call itself;
    /// a task is spawned only on such a drop.
    pub async fn acquire(&self, key: &LeaseKey) -> Result<Acquisition> {
        self.acquire_until_cancelled(key, &CancellationToken::new())
            .await
    }

    /// Like [`Supervisor::acquire`], but stops waiting (between attempts) when `cancel` fires.
    ///
    /// # Errors
    /// Invalid input, or the last store error if every attempt failed.
    ///
    /// # Cancellation safety
    /// Cancel safe through `cancel`: an attempt in flight finishes (bounded by the call timeout)
    /// and a lease it obtained is released before returning `Cancelled`. Dropping the future is
    /// cancel safe too, as for [`Supervisor::acquire`].
    pub async fn acquire_until_cancelled(
        &self,
        key: &LeaseKey,
        cancel: &CancellationToken,
    ) -> Result<Acquisition> {
        self.acquire_within(key, self.config.acquire_wait(), cancel)
            .await
    }

    /// One attempt, without waiting: the key if it is free (or expired) now, else
    /// [`Acquisition::NotAcquired`] naming the holder. Opens no watch. For callers that decide
    /// themselves when to try again (a shard set taking free shards, say).
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
    /// use leasehold_core::{LeaseKey, MemoryLeaseStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = MemoryLeaseStore::new();
    /// let a = Supervisor::new(store.clone(), SupervisorConfig::new(Duration::from_secs(30)));
    /// let b = Supervisor::new(store, SupervisorConfig::new(Duration::from_secs(30)));
    /// let key = LeaseKey::new("tenant-7")?;
    /// let guard = a.try_acquire(&key).await?.guard().expect("free key");
    /// assert!(matches!(b.try_acquire(&key).await?, Acquisition::NotAcquired { .. }));
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Invalid input, or the store error of the attempt.
    ///
    /// # Cancellation safety
    /// Cancel safe, as [`Supervisor::acquire`]: a grant whose reply lands after the drop, or that
    /// waits for its fence install, is released in the background within two op timeouts.
    pub async fn try_acquire(&self, key: &LeaseKey) -> Result<Acquisition> {
        self.acquire_within(key, Duration::ZERO, &CancellationToken::new())
            .await
    }

    /// Tries once to acquire each of `keys`, all in one [`LeaseStore::acquire_many`] call (as
    /// [`try_acquire`](Self::try_acquire) would for each, without waiting): outcomes in input
    /// order, a guard for each granted key (each renewed as any other), `NotAcquired` naming the
    /// holder for each refused one, or the key's own error. Bad batches are refused as
    /// [`validate_acquire_many`](crate::store::validate_acquire_many) says, before anything is
    /// sent.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{LeaseKey, MemoryLeaseStore};
    /// use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let sup = Supervisor::new(MemoryLeaseStore::new(), SupervisorConfig::new(Duration::from_secs(10)));
    /// let keys = [LeaseKey::new("shard-0")?, LeaseKey::new("shard-1")?];
    /// let out = sup.try_acquire_many(&keys).await?;
    /// assert!(out.iter().all(|o| matches!(o, Ok(Acquisition::Acquired(_)))));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Invalid input for the batch or the configuration; the store's error for the call, or
    /// [`Error::Timeout`] when it did not answer within the op timeout.
    ///
    /// # Cancellation safety
    /// Cancel safe: the store call runs in a task of its own (bounded by the op timeout), which
    /// releases the grants of a call whose answer nobody is waiting for; a grant not yet handed
    /// out as a guard when the future is dropped is released in the background.
    pub async fn try_acquire_many(&self, keys: &[LeaseKey]) -> Result<Vec<Result<Acquisition>>> {
        self.config.validate()?;
        let started = Instant::now();
        let reqs: Vec<AcquireRequest> = keys
            .iter()
            .map(|k| {
                AcquireRequest::new(k.clone(), self.owner.clone(), self.config.ttl())
                    .with_drift_margin(self.config.drift_margin())
            })
            .collect();
        crate::store::validate_acquire_many(&reqs)?;
        let op = self.config.op_timeout();
        let suspended = self.config.clock().suspended();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.store.clone();
        tokio::spawn(async move {
            let Ok(out) = timeout(op, store.acquire_many(&reqs)).await else {
                return;
            };
            if let Err(Ok(out)) = tx.send(out) {
                // The caller gave up on the call: nobody will hold its grants.
                for outcome in out.into_iter().flatten() {
                    if let AcquireOutcome::Acquired(lease) = outcome {
                        let _ = timeout(op, store.release(&lease)).await;
                    }
                }
            }
        });
        let outcomes = match timeout(op, rx).await {
            Ok(Ok(r)) => r?,
            Ok(Err(_)) | Err(_) => {
                return Err(Error::Timeout {
                    backend: self.store.backend(),
                    operation: "acquire_many",
                    after: op,
                });
            }
        };
        // Every grant is owned at once, so that a drop from here releases those not handed out.
        let owned: Vec<Result<std::result::Result<Ungiven, Holder>>> = outcomes
            .into_iter()
            .map(|o| {
                o.map(|o| match o {
                    AcquireOutcome::Acquired(lease) => {
                        Ok(Ungiven::new(self.store.clone(), lease, op))
                    }
                    AcquireOutcome::Held(h) => Err(h),
                })
            })
            .collect();
        let mut out = Vec::with_capacity(owned.len());
        for (key, o) in keys.iter().zip(owned) {
            out.push(match o {
                Err(e) => Err(e),
                Ok(Err(holder)) => {
                    let waited = started.elapsed();
                    self.hook.not_acquired(key, waited);
                    Ok(Acquisition::NotAcquired {
                        holder: Some(holder),
                        waited,
                    })
                }
                Ok(Ok(mut lease)) => {
                    lease.report_acquired(self.hook.clone(), started.elapsed());
                    self.start(lease, suspended)
                        .await
                        .map(Acquisition::Acquired)
                }
            });
        }
        Ok(out)
    }

    /// Opens a watch on `key`, bounded like any store call: a watch that does not open in time
    /// (a subscription on a black-holed connection) leaves the caller polling.
    async fn open_watch(&self, key: &LeaseKey, wait: Duration) -> Option<KeyWatch> {
        let bound = self.config.op_timeout().min(wait);
        match timeout(bound, self.store.watch(key)).await {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => {
                tracing::debug!(backend = self.store.backend(), key = %key, error = %e, "watch failed; polling");
                None
            }
            Err(_) => {
                tracing::debug!(backend = self.store.backend(), key = %key, "watch did not open in time; polling");
                None
            }
        }
    }

    async fn acquire_within(
        &self,
        key: &LeaseKey,
        wait: Duration,
        cancel: &CancellationToken,
    ) -> Result<Acquisition> {
        self.config.validate()?;
        let clock = self.config.clock();
        let started = Instant::now();
        let deadline = saturating_add(started, wait);
        let req = AcquireRequest::new(key.clone(), self.owner.clone(), self.config.ttl())
            .with_drift_margin(self.config.drift_margin());
        // The watch is opened after the first refusal, not before the first attempt: an
        // uncontended acquire then costs no watch (a request on etcd and Kubernetes, a LISTEN
        // on PostgreSQL). Right after opening it the key is tried again at once, so a release
        // between the refusal and the watch is not missed.
        let mut watch: Option<KeyWatch> = None;
        let mut watch_opened = !self.store.capabilities().watch || wait.is_zero();
        let mut attempt: u32 = 0;
        let mut holder = None;
        loop {
            let op = self.config.op_timeout();
            // Suspended time before the request is sent: the grant's deadline is placed on the
            // validity clock with it (a suspend during the call only makes it earlier).
            let suspended = clock.suspended();
            // The call is polled here, in the caller's task; only if this future is dropped
            // before the call answers does a task finish it (see `InFlight`).
            let mut call = InFlight::new(self.store.clone(), req.clone(), op);
            let result = match timeout(op, &mut call).await {
                Ok(r) => r,
                Err(_) => {
                    call.abandon();
                    Err(Error::Timeout {
                        backend: self.store.backend(),
                        operation: "acquire",
                        after: op,
                    })
                }
            };
            let pause = match result {
                Ok(AcquireOutcome::Acquired(lease)) => {
                    // From here until a guard holds it, dropping this future releases the
                    // lease in the background.
                    let mut lease = Ungiven::new(self.store.clone(), lease, op);
                    if cancel.is_cancelled() {
                        lease.release().await;
                        return Ok(Acquisition::Cancelled);
                    }
                    lease.report_acquired(self.hook.clone(), started.elapsed());
                    return self
                        .start(lease, suspended)
                        .await
                        .map(Acquisition::Acquired);
                }
                Ok(AcquireOutcome::Held(h)) => {
                    // Retry when the holder's lease would expire, or earlier with backoff.
                    let until_expiry = h.remaining.saturating_add(Duration::from_millis(1));
                    holder = Some(h);
                    self.config
                        .backoff(attempt)
                        .max(self.config.backoff_min())
                        .min(until_expiry)
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(backend = self.store.backend(), key = %key, error = %e, "acquire attempt failed; retrying");
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    self.config.backoff(attempt)
                }
                Err(e) => return Err(e),
            };
            attempt = attempt.saturating_add(1);
            let now = Instant::now();
            if now >= deadline {
                self.hook.not_acquired(key, now - started);
                return Ok(Acquisition::NotAcquired {
                    holder,
                    waited: now - started,
                });
            }
            if !watch_opened {
                watch_opened = true;
                // Bounded by the op timeout within what is left of the acquire's wait, not by
                // the backoff (`pause`): opening a watch can take a connection and a LISTEN
                // (PostgreSQL) or a LIST (Kubernetes), longer than a first backoff of 10 ms.
                watch = self
                    .open_watch(key, deadline.saturating_duration_since(now))
                    .await;
                if watch.is_some() && !cancel.is_cancelled() {
                    continue;
                }
            }
            let wake = saturating_add(now, pause).min(deadline);
            tokio::select! {
                _ = cancel.cancelled() => {
                    self.hook.not_acquired(key, started.elapsed());
                    return Ok(Acquisition::Cancelled);
                }
                _ = tokio::time::sleep_until(wake) => {}
                changed = async {
                    match watch.as_mut() {
                        Some(w) => w.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if !matches!(changed, Some(Ok(()))) {
                        watch = None; // the watch broke: fall back to polling
                    }
                }
            }
        }
    }

    /// Acquires `key`, runs `work` with the guard while the lease is held, and releases after.
    /// `work` is dropped (cancelled) if the lease is lost.
    ///
    /// # Errors
    /// As [`Supervisor::acquire`].
    ///
    /// # Cancellation safety
    /// Cancel safe: dropped while acquiring, it releases what it was granted as
    /// [`Supervisor::acquire`] does; dropped while `work` runs or while releasing, it drops `work`
    /// and the guard, which releases in the background.
    pub async fn run<F, Fut, T>(&self, key: &LeaseKey, work: F) -> Result<RunOutcome<T>>
    where
        F: FnOnce(LeaseGuardView) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.acquire(key).await? {
            Acquisition::Acquired(guard) => {
                let r = guard.run(work(guard.view())).await;
                match r {
                    Ok(v) => {
                        let released = guard.release().await?;
                        Ok(RunOutcome::Completed { value: v, released })
                    }
                    Err(reason) => Ok(RunOutcome::Lost(reason)),
                }
            }
            Acquisition::NotAcquired { holder, .. } => Ok(RunOutcome::NotAcquired { holder }),
            Acquisition::Cancelled => Ok(RunOutcome::NotAcquired { holder: None }),
        }
    }

    /// Hands out the guard for `lease`, granted to a request sent after `suspended` of host
    /// suspend.
    async fn start(&self, lease: Ungiven, suspended: Duration) -> Result<LeaseGuard> {
        if let Some(fence) = &self.fence {
            let out = match timeout(
                self.config.op_timeout(),
                fence.install(lease.get().key(), lease.get().token()),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    backend: "fence",
                    operation: "install",
                    after: self.config.op_timeout(),
                }),
            };
            match out {
                Ok(o) if o.is_accepted() => {}
                other => {
                    let lease = lease.release().await;
                    return Err(match other {
                        Err(e) => e,
                        Ok(o) => Error::InvalidInput(format!(
                            "the fenced resource refused to install token {}: {o:?}",
                            lease.token()
                        )),
                    });
                }
            }
        }
        // No await from here to the guard: the guard owns the lease from now on.
        let lease = lease.take();
        tracing::info!(backend = self.store.backend(), key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "lease acquired");
        Ok(LeaseGuard::spawn(
            self.store.clone(),
            self.config.clone(),
            lease,
            suspended,
            self.hook.clone(),
            self.renewer.clone(),
        ))
    }
}

/// What [`Supervisor::run`] ended with.
#[derive(Debug)]
pub enum RunOutcome<T> {
    /// The work completed while the lease was held; it was then released.
    Completed {
        /// The work's output.
        value: T,
        /// What the store said to the release.
        released: ReleaseOutcome,
    },
    /// The lease was lost; the work was cancelled.
    Lost(LossReason),
    /// Someone else held the key for the whole wait.
    NotAcquired {
        /// The holder at the last attempt.
        holder: Option<Holder>,
    },
}
