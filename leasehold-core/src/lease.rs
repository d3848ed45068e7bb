//! Leases and the outcomes of lease operations: what an acquirer asks for
//! ([`AcquireRequest`]), what a store grants ([`Lease`]) and answers ([`AcquireOutcome`],
//! [`RenewOutcome`], [`ReleaseOutcome`], [`Holder`], [`HeldBy`], [`KeyState`]). The identifiers
//! [`LeaseKey`] and [`OwnerId`] are in `lease/ids.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use crate::backend::{default_drift, validate_ttl};
use crate::fencing::FencingToken;

mod ids;

pub use ids::{LeaseKey, MAX_KEY_LEN, MAX_OWNER_LEN, OwnerId};

/// The longest TTL any store accepts: one day. Longer leases are almost always a bug (a lease is
/// meant to be renewed), and they would make a dead holder block a key for longer than anyone waits.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// What an acquirer asks for.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{AcquireRequest, LeaseKey, OwnerId};
/// let req = AcquireRequest::new(LeaseKey::new("nightly-job")?, OwnerId::random(), Duration::from_secs(30))
///     .with_drift_margin(Duration::from_millis(500));
/// assert_eq!(req.drift_margin(), Duration::from_millis(500));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The key to acquire.
    pub key: LeaseKey,
    /// Who asks.
    pub owner: OwnerId,
    /// How long the lease should last unless renewed.
    pub ttl: Duration,
    drift_margin: Option<Duration>,
}

impl AcquireRequest {
    /// A request with the default drift margin (see [`AcquireRequest::drift_margin`]).
    pub fn new(key: LeaseKey, owner: OwnerId, ttl: Duration) -> Self {
        AcquireRequest {
            key,
            owner,
            ttl,
            drift_margin: None,
        }
    }

    /// Sets the drift margin subtracted from the local validity deadline.
    pub fn with_drift_margin(mut self, margin: Duration) -> Self {
        self.drift_margin = Some(margin);
        self
    }

    /// The margin by which the local validity deadline is earlier than `sent + ttl`: covers clock
    /// *rate* differences between this host and the store. Default: 2% of the TTL plus 1 ms
    /// ([`backend::default_drift`](crate::backend::default_drift)).
    pub fn drift_margin(&self) -> Duration {
        self.drift_margin.unwrap_or_else(|| default_drift(self.ttl))
    }
}

/// A lease held by this process, as granted (or last renewed) by a store.
///
/// It carries the key, the owner, the **fencing token** to attach to every protected write, the
/// TTL the store actually granted, and the local validity deadline: the instant the request was
/// *sent* plus the granted TTL minus the drift margin. Because the store starts its TTL only after
/// it received the request, this process always believes the lease is gone before the store does.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, MemoryLeaseStore, OwnerId};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = MemoryLeaseStore::new();
/// let req = AcquireRequest::new(LeaseKey::new("reindex")?, OwnerId::random(), Duration::from_secs(10));
/// let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? else { unreachable!() };
/// assert!(lease.is_valid());
/// assert!(lease.remaining() <= Duration::from_secs(10));
/// println!("write with token {}", lease.token());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    key: LeaseKey,
    owner: OwnerId,
    token: FencingToken,
    ttl: Duration,
    drift_margin: Duration,
    deadline: Instant,
    handle: Option<Arc<str>>,
}

impl Lease {
    /// Builds a lease from a grant. `sent` is the instant the granting request was sent; `ttl` is
    /// the TTL the store granted. Backends call [`backend::granted_lease`](crate::backend::granted_lease).
    pub(crate) fn granted(
        key: LeaseKey,
        owner: OwnerId,
        token: FencingToken,
        ttl: Duration,
        drift_margin: Duration,
        sent: Instant,
    ) -> Self {
        let deadline = deadline_after(sent, ttl, drift_margin);
        Lease {
            key,
            owner,
            token,
            ttl,
            drift_margin,
            deadline,
            handle: None,
        }
    }

    /// Rebuilds a lease handle for a lease granted earlier (for example by another process that
    /// passed its token on). Its local deadline is *now*: the first renewal tells whether it is
    /// still held.
    pub fn resume(key: LeaseKey, owner: OwnerId, token: FencingToken, ttl: Duration) -> Self {
        Lease {
            key,
            owner,
            token,
            ttl,
            drift_margin: default_drift(ttl),
            deadline: Instant::now(),
            handle: None,
        }
    }

    /// The same lease with a new deadline computed from a renewal sent at `sent`.
    pub fn renewed(&self, ttl: Duration, sent: Instant) -> Self {
        let mut next = self.clone();
        next.ttl = ttl;
        next.deadline = deadline_after(sent, ttl, self.drift_margin);
        next
    }

    /// The same lease with its deadline moved `by` later: the deadline on the supervisor's
    /// validity clock, for a request sent when the host had been suspended for `by` in total.
    pub(crate) fn shifted(&self, by: Duration) -> Self {
        let mut next = self.clone();
        // Unrepresentable only for absurd shifts; the unshifted deadline is the earlier one.
        next.deadline = self.deadline.checked_add(by).unwrap_or(self.deadline);
        next
    }

    /// Attaches backend-private data (an etcd lease id, a Kubernetes resourceVersion).
    pub fn with_handle(mut self, handle: impl Into<Arc<str>>) -> Self {
        self.handle = Some(handle.into());
        self
    }

    /// Backend-private data attached by the store that issued this lease.
    pub fn handle(&self) -> Option<&str> {
        self.handle.as_deref()
    }

    /// The leased key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// The holder.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The fencing token of this grant: attach it to every protected write.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The TTL the store granted (may be larger than requested where a backend rounds up, never
    /// smaller).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The drift margin used for the deadline.
    pub fn drift_margin(&self) -> Duration {
        self.drift_margin
    }

    /// The local validity deadline (tokio's clock).
    ///
    /// Tokio's clock is monotonic and stops while the host is suspended, so this deadline (and
    /// [`remaining`](Lease::remaining), [`is_valid`](Lease::is_valid)) does not see a suspend. A
    /// supervised lease's [`may_act`](crate::supervisor::LeaseGuard::may_act) does (see
    /// [`clock`](crate::clock)).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left until the local deadline (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the local deadline has not yet passed. This is a *belief*, not authority: the
    /// resource decides with the token.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.deadline
    }
}

/// `sent + ttl - drift`. A deadline this process cannot represent (a TTL of centuries) is taken as
/// `sent`: a lease whose end cannot be computed is not trusted at all.
fn deadline_after(sent: Instant, ttl: Duration, drift: Duration) -> Instant {
    sent.checked_add(ttl.saturating_sub(drift)).unwrap_or(sent)
}

/// The current holder of a key, as the store sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Who holds it.
    pub owner: OwnerId,
    /// The holder's fencing token.
    pub token: FencingToken,
    /// Time left before the store considers the lease expired (for stores without a server clock,
    /// an upper bound estimated from local observation).
    pub remaining: Duration,
    /// The TTL of the holder's lease.
    pub ttl: Duration,
}

/// Who holds a key and with which token, without the time left: what
/// [`LeaseStore::holders_many`](crate::LeaseStore::holders_many) reports for a held key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBy {
    /// Who holds it.
    pub owner: OwnerId,
    /// The holder's fencing token.
    pub token: FencingToken,
}

impl From<Holder> for HeldBy {
    fn from(h: Holder) -> Self {
        HeldBy {
            owner: h.owner,
            token: h.token,
        }
    }
}

/// What [`LeaseStore::inspect`](crate::LeaseStore::inspect) reports for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// The key.
    pub key: LeaseKey,
    /// The current, unexpired holder, if any.
    pub holder: Option<Holder>,
    /// The highest token ever issued for the key, if the store still knows it.
    pub last_token: Option<FencingToken>,
}

/// The result of an acquire that reached the store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum AcquireOutcome {
    /// The key was free or expired (or already ours, see the store contract): it is ours now,
    /// with a token greater than every token issued for the key before.
    Acquired(Lease),
    /// Someone else holds a valid lease on the key; nothing changed.
    Held(Holder),
}

impl AcquireOutcome {
    /// The lease, if acquired.
    pub fn lease(self) -> Option<Lease> {
        match self {
            AcquireOutcome::Acquired(lease) => Some(lease),
            AcquireOutcome::Held(_) => None,
        }
    }
}

/// The result of a renew that reached the store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum RenewOutcome {
    /// Extended: the returned lease has the new deadline and the same token.
    Renewed(Lease),
    /// The lease is gone (expired, released, taken over, or the owner or token does not match);
    /// nothing changed. It can never be revived: acquire again for a new token.
    Lost,
}

/// The result of a release that reached the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum ReleaseOutcome {
    /// The key is free now; its generation is kept, so the next token is still greater.
    Released,
    /// The lease was not held by this owner and token (expired, taken over, never granted);
    /// nothing changed.
    NotHeld,
}
