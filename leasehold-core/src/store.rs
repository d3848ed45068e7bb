//! The minimal contract every backend implements.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::capability::Capabilities;
use crate::error::Result;
use crate::lease::{
    AcquireOutcome, AcquireRequest, HeldBy, KeyState, Lease, LeaseKey, ReleaseOutcome, RenewOutcome,
};

/// A stream of "this key may have changed" signals, from
/// [`LeaseStore::watch`]. Each item is a hint to look again (acquire or inspect), never a
/// grant. The stream ending or yielding an error means the watch broke: fall back to polling.
pub struct KeyWatch {
    inner: BoxStream<'static, Result<()>>,
}

impl KeyWatch {
    /// Wraps a stream of change hints.
    pub fn new(stream: BoxStream<'static, Result<()>>) -> Self {
        KeyWatch { inner: stream }
    }

    /// Waits for the next change hint. `None` when the watch ended.
    ///
    /// # Cancellation safety
    /// Cancel safe: a hint is either returned or stays in the stream.
    pub async fn changed(&mut self) -> Option<Result<()>> {
        self.inner.next().await
    }
}

impl fmt::Debug for KeyWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyWatch").finish_non_exhaustive()
    }
}

/// A store of leases with fencing tokens.
///
/// The minimal contract; conveniences (bounded waits, renewal, leader election) live in the
/// [`supervisor`](crate::supervisor) and [`election`](crate::election) modules and work over
/// any implementation, including `Arc<dyn LeaseStore>`.
///
/// # The contract
/// - **acquire**: a free or expired key is granted with a token strictly greater than every token
///   ever issued for it. A key validly held by another owner returns
///   [`AcquireOutcome::Held`] naming the holder, its token and the time left, and changes nothing.
///   **The same owner acquiring a key it already holds gets a new grant with a greater token**;
///   its previous token is stale from then on (this lets a restarted process with a stable owner
///   id take its key back at once, and keeps "one grant, one token" true everywhere).
/// - **renew**: succeeds only for the same owner *and* token while the lease is unexpired, and
///   extends it by the lease's TTL. Otherwise [`RenewOutcome::Lost`] and nothing changes; an
///   expired lease is never revived.
/// - **release**: same owner and token frees the key and keeps its generation; anything else is
///   [`ReleaseOutcome::NotHeld`] and changes nothing.
/// - **inspect**: the unexpired holder and the last token, as the store sees them.
/// - Invalid input (keys, owners, TTLs outside the backend's range) is an
///   [`Error`](crate::Error) and sends nothing.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId, ReleaseOutcome};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
/// let key = LeaseKey::new("nightly-report")?;
/// let a = AcquireRequest::new(key.clone(), OwnerId::random(), Duration::from_secs(30));
/// let lease = store.acquire(&a).await?.lease().expect("free key");
/// let b = AcquireRequest::new(key.clone(), OwnerId::random(), Duration::from_secs(30));
/// match store.acquire(&b).await? {
///     AcquireOutcome::Held(holder) => assert_eq!(holder.token, lease.token()),
///     AcquireOutcome::Acquired(_) => unreachable!("the key is held"),
/// }
/// assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait LeaseStore: Send + Sync + fmt::Debug {
    /// A short name of the backend (`"memory"`, `"postgres"`, ...), used in logs and metrics.
    fn backend(&self) -> &'static str;

    /// What this backend promises.
    fn capabilities(&self) -> Capabilities;

    /// Tries once to acquire `req.key` for `req.owner`.
    ///
    /// # Cancellation safety
    /// Not cancel safe: if the future is dropped after the request was sent, the store may have
    /// granted the lease (a "ghost grant"); it then simply expires after its TTL.
    /// [`Supervisor::acquire`](crate::supervisor::Supervisor::acquire), when it is dropped,
    /// finishes this call in the background (within its op timeout) and releases such a grant.
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome>;

    /// Extends `lease` by its TTL if it is still held by its owner with its token.
    ///
    /// # Cancellation safety
    /// Cancel safe in the sense that matters: a dropped renew may or may not have extended the
    /// lease, and the previous local deadline stays correct either way.
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome>;

    /// Frees the key if `lease` still holds it.
    ///
    /// # Cancellation safety
    /// Not cancel safe: a dropped release may or may not have freed the key; the lease then
    /// expires on its own.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome>;

    /// Reports the key's current holder and last token.
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState>;

    /// Renews many leases in as few round trips as the backend allows (one statement, script or
    /// keepalive where it can), with exactly the semantics of [`renew`](LeaseStore::renew) for
    /// each. Outcomes come back in input order; a per-lease error (an invalid TTL) is reported in
    /// its slot, a failure of the whole batch (the store unreachable) as the outer error.
    ///
    /// The default renews one by one.
    ///
    /// # Cancellation safety
    /// As [`renew`](LeaseStore::renew): a dropped batch may or may not have extended each lease.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            match self.renew(lease).await {
                Err(e) if !e.is_invalid_input() => return Err(e),
                r => out.push(r),
            }
        }
        Ok(out)
    }

    /// Reports the state of many keys in as few round trips as the backend allows (one
    /// statement, script, range read or list where it can), with exactly the semantics of
    /// [`inspect`](LeaseStore::inspect) for each. States come back in input order, one per key; a
    /// key given twice is reported twice. A failure of the read (the store unreachable) is the
    /// error, for the whole batch.
    ///
    /// The states are read together but not necessarily at one instant: a backend that needs
    /// several round trips (pages) may report keys as of slightly different moments, each of
    /// them a state the key really had.
    ///
    /// The default inspects one by one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = MemoryLeaseStore::new();
    /// let (a, b) = (LeaseKey::new("shard-0")?, LeaseKey::new("shard-1")?);
    /// let req = AcquireRequest::new(a.clone(), OwnerId::random(), Duration::from_secs(30));
    /// let lease = store.acquire(&req).await?.lease().expect("free key");
    /// let states = store.inspect_many(&[a, b]).await?;
    /// assert_eq!(states[0].holder.as_ref().map(|h| h.token), Some(lease.token()));
    /// assert!(states[1].holder.is_none());
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(self.inspect(key).await?);
        }
        Ok(out)
    }

    /// The holders of many keys (owner and token, `None` for a free key), in input order,
    /// without the time left: for scans that need only who holds what, such as a shard set's
    /// rebalance. The same holders [`inspect_many`](LeaseStore::inspect_many) reports; the
    /// default calls it. A backend where the time left costs extra round trips (etcd: one per
    /// etcd lease) answers in fewer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = MemoryLeaseStore::new();
    /// let (a, b) = (LeaseKey::new("shard-0")?, LeaseKey::new("shard-1")?);
    /// let owner = OwnerId::random();
    /// let req = AcquireRequest::new(a.clone(), owner.clone(), Duration::from_secs(30));
    /// let lease = store.acquire(&req).await?.lease().expect("free key");
    /// let held = store.holders_many(&[a, b]).await?;
    /// assert_eq!(held[0].as_ref().map(|h| (&h.owner, h.token)), Some((&owner, lease.token())));
    /// assert!(held[1].is_none());
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<HeldBy>>> {
        Ok(self
            .inspect_many(keys)
            .await?
            .into_iter()
            .map(|s| s.holder.map(HeldBy::from))
            .collect())
    }

    /// Starts watching `key` for changes, if the backend can ([`Capabilities::watch`]).
    /// Returns `Ok(None)` when it cannot; callers then poll. Start the watch *before* the acquire
    /// attempt it should follow, so that no change between the two is missed.
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is held until the watch is returned.
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        let _ = key;
        Ok(None)
    }
}

macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<T: LeaseStore + ?Sized> LeaseStore for $ty {
            fn backend(&self) -> &'static str {
                (**self).backend()
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
                (**self).acquire(req).await
            }
            async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
                (**self).renew(lease).await
            }
            async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
                (**self).release(lease).await
            }
            async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
                (**self).inspect(key).await
            }
            async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
                (**self).renew_many(leases).await
            }
            async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
                (**self).inspect_many(keys).await
            }
            async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<HeldBy>>> {
                (**self).holders_many(keys).await
            }
            async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
                (**self).watch(key).await
            }
        }
    )*};
}

forward_store!(Arc<T>, Box<T>);
