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
        renew_one_by_one(self, leases).await
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

    /// Tries once to acquire each of `reqs`, in as few round trips as the backend allows (one
    /// statement, script per slot, transaction or a few in flight at once), with exactly the
    /// semantics of [`acquire`](LeaseStore::acquire) for each request: a free or expired key is
    /// granted with its own token, greater than every token issued for that key before; a key
    /// validly held by another owner is refused ([`AcquireOutcome::Held`], naming the holder)
    /// and left unchanged; a key already held by the request's owner is granted again with a
    /// greater token. Each request has its own owner and TTL.
    ///
    /// Outcomes come back in input order, one per request, so a partial grant is reported key by
    /// key. A per-request error (an invalid TTL or owner) is reported in its slot and nothing is
    /// sent for that request. The outer error is either bad input for the batch as a whole
    /// ([`validate_acquire_many`]: more than [`MAX_ACQUIRE_MANY`] requests, a key given twice),
    /// raised before anything is sent, or a failed round trip (the store unreachable): keys
    /// granted by the batch's other round trips are then not reported, and stay held until
    /// their TTL runs out, as after a dropped [`acquire`](LeaseStore::acquire) (the same owner
    /// acquiring them again gets them at once, with greater tokens). An empty batch sends
    /// nothing.
    ///
    /// Keys are not granted together: the batch is not a transaction over its keys, and
    /// another client may take some of them while this one takes the rest.
    ///
    /// The default runs [`acquire`](LeaseStore::acquire) for each request, at most
    /// [`ACQUIRE_MANY_CONCURRENCY`] at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = MemoryLeaseStore::new();
    /// let (a, b) = (OwnerId::random(), OwnerId::random());
    /// let ttl = Duration::from_secs(30);
    /// let held = store.acquire(&AcquireRequest::new(LeaseKey::new("shard-1")?, b.clone(), ttl)).await?;
    /// let reqs: Vec<AcquireRequest> = ["shard-0", "shard-1", "shard-2"]
    ///     .into_iter()
    ///     .map(|k| Ok(AcquireRequest::new(LeaseKey::new(k)?, a.clone(), ttl)))
    ///     .collect::<leasehold_core::Result<_>>()?;
    /// let out = store.acquire_many(&reqs).await?;
    /// assert!(matches!(out[0], Ok(AcquireOutcome::Acquired(_))));
    /// assert!(matches!(&out[1], Ok(AcquireOutcome::Held(h)) if h.owner == b));
    /// assert!(matches!(out[2], Ok(AcquireOutcome::Acquired(_))));
    /// # let _ = held; Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    /// Not cancel safe, as [`acquire`](LeaseStore::acquire): a dropped batch may have granted
    /// any of its keys; such grants expire after their TTL.
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        validate_acquire_many(reqs)?;
        let mut out = Vec::with_capacity(reqs.len());
        let mut next = reqs.iter();
        let mut in_flight = futures::stream::FuturesOrdered::new();
        loop {
            while in_flight.len() < ACQUIRE_MANY_CONCURRENCY {
                match next.next() {
                    Some(req) => in_flight.push_back(self.acquire(req)),
                    None => break,
                }
            }
            match in_flight.next().await {
                Some(Err(e)) if !e.is_invalid_input() => return Err(e),
                Some(r) => out.push(r),
                None => return Ok(out),
            }
        }
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

/// The most requests one [`LeaseStore::acquire_many`] call takes: a shard set of 10,000 shards
/// splits in one call. Larger batches are refused ([`validate_acquire_many`]); split them.
pub const MAX_ACQUIRE_MANY: usize = 10_000;

/// How many acquires the default [`LeaseStore::acquire_many`] keeps in flight at once.
pub const ACQUIRE_MANY_CONCURRENCY: usize = 16;

/// The default [`LeaseStore::renew_many`]: `store.renew` lease by lease, in order. A lease's
/// own invalid input (an invalid TTL) is its slot's error; any other error ends the batch as the
/// outer error. For a store whose batch falls back to single renewals in some case.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// use std::time::Duration;
/// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId, RenewOutcome};
/// use leasehold_core::store::renew_one_by_one;
/// let store = MemoryLeaseStore::new();
/// let req = AcquireRequest::new(LeaseKey::new("k")?, OwnerId::random(), Duration::from_secs(5));
/// let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? else { unreachable!() };
/// let out = renew_one_by_one(&store, &[lease]).await?;
/// assert!(matches!(out[0], Ok(RenewOutcome::Renewed(_))));
/// # Ok(()) }
/// ```
///
/// # Cancellation safety
/// As [`LeaseStore::renew`]: a dropped batch may or may not have extended each lease.
///
/// # Errors
/// The first error of a renewal that is not the lease's own invalid input.
pub async fn renew_one_by_one<S: LeaseStore + ?Sized>(
    store: &S,
    leases: &[Lease],
) -> Result<Vec<Result<RenewOutcome>>> {
    let mut out = Vec::with_capacity(leases.len());
    for lease in leases {
        match store.renew(lease).await {
            Err(e) if !e.is_invalid_input() => return Err(e),
            r => out.push(r),
        }
    }
    Ok(out)
}

/// Checks a batch for [`LeaseStore::acquire_many`] as a whole: at most [`MAX_ACQUIRE_MANY`]
/// requests, and no key given twice (two requests for one key in one batch would race each
/// other inside the store). Keys themselves are valid by construction ([`LeaseKey::new`]
/// refuses empty and oversized keys); TTLs and owners are checked per request by the store.
/// Backends call it before they send anything.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{AcquireRequest, Error, LeaseKey, OwnerId};
/// use leasehold_core::store::validate_acquire_many;
/// let req = AcquireRequest::new(LeaseKey::new("k")?, OwnerId::random(), Duration::from_secs(5));
/// assert!(validate_acquire_many(&[req.clone()]).is_ok());
/// let err = validate_acquire_many(&[req.clone(), req]).unwrap_err();
/// assert!(matches!(err, Error::InvalidInput(_)), "{err}");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidInput`](crate::Error::InvalidInput) naming the problem (the count, or the
/// first key given twice).
pub fn validate_acquire_many(reqs: &[AcquireRequest]) -> Result<()> {
    if reqs.len() > MAX_ACQUIRE_MANY {
        return Err(crate::Error::InvalidInput(format!(
            "acquire_many takes at most {MAX_ACQUIRE_MANY} requests, got {}",
            reqs.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(reqs.len());
    for req in reqs {
        if !seen.insert(&req.key) {
            return Err(crate::Error::InvalidInput(format!(
                "acquire_many got key {} twice in one batch",
                req.key
            )));
        }
    }
    Ok(())
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
            async fn acquire_many(
                &self,
                reqs: &[AcquireRequest],
            ) -> Result<Vec<Result<AcquireOutcome>>> {
                (**self).acquire_many(reqs).await
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
