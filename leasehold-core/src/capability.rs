//! What a backend promises, so that the testkit and the supervisor know what to expect.

use std::time::Duration;

/// How far a backend's fencing tokens can be trusted never to go back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenDurability {
    /// Tokens live only as long as the store process (the in-memory store).
    Process,
    /// Tokens are derived from a counter flooried by the store's clock: they survive restarts and
    /// failovers that lose the counter **as long as the store's clock does not go back** by more
    /// than the time since the lost increments (Redis without persistence).
    ClockFloored,
    /// Tokens are stored durably (a WAL-backed table, a replicated consensus log) and survive
    /// restarts, failovers and deletion of the lease record.
    Durable,
}

/// How expiry is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExpiryClock {
    /// By the store's own clock (server-side TTL or `clock_timestamp()`).
    Server,
    /// By the acquirer's local monotonic clock: a lease counts as expired only after the same
    /// record was observed unchanged for its whole duration (Kubernetes Leases, as client-go does).
    ObservedLocally,
    /// By the process's own monotonic clock, in the process that owns the store (memory store).
    InProcess,
}

/// A few documented facts a backend promises.
///
/// ```
/// use leasehold_core::{LeaseStore, MemoryLeaseStore, TokenDurability};
/// let caps = MemoryLeaseStore::new().capabilities();
/// assert_eq!(caps.token_durability, TokenDurability::Process);
/// assert!(caps.watch);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Whether tokens survive a restart of the store.
    pub token_durability: TokenDurability,
    /// Whether [`LeaseStore::watch`](crate::LeaseStore::watch) can wake a waiter when a key
    /// changes, instead of polling.
    pub watch: bool,
    /// Whose clock decides expiry.
    pub expiry_clock: ExpiryClock,
    /// The shortest TTL the backend grants.
    pub min_ttl: Duration,
    /// The TTL granularity: requested TTLs are rounded **up** to a multiple of it, and the lease
    /// reports the granted TTL.
    pub ttl_granularity: Duration,
}

impl Capabilities {
    /// Capabilities with the given durability and expiry clock, no watch, and millisecond TTLs.
    pub const fn new(token_durability: TokenDurability, expiry_clock: ExpiryClock) -> Self {
        Capabilities {
            token_durability,
            watch: false,
            expiry_clock,
            min_ttl: Duration::from_millis(1),
            ttl_granularity: Duration::from_millis(1),
        }
    }

    /// Sets [`Capabilities::watch`].
    pub const fn with_watch(mut self, watch: bool) -> Self {
        self.watch = watch;
        self
    }

    /// Sets [`Capabilities::min_ttl`].
    pub const fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Sets [`Capabilities::ttl_granularity`].
    pub const fn with_ttl_granularity(mut self, granularity: Duration) -> Self {
        self.ttl_granularity = granularity;
        self
    }

    /// Whether tokens survive a store restart.
    pub fn tokens_survive_restart(&self) -> bool {
        !matches!(self.token_durability, TokenDurability::Process)
    }
}
