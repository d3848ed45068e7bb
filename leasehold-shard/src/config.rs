//! [`ShardSetConfig`]: the set's timings and bounds, each derived from the lease TTL unless set,
//! and their validation.

use std::time::Duration;

use leasehold_core::supervisor::SupervisorConfig;
use leasehold_core::{Error, MAX_TTL, Result};

/// How a [`ShardSet`](crate::ShardSet) behaves. Everything is derived from the lease TTL unless set.
///
/// No value of any setting panics: each either works or is refused by [`ShardSet::new`](crate::ShardSet::new) (and
/// [`ShardSet::join`](crate::ShardSet::join)) with [`Error::InvalidInput`] naming the setting, as each setter says.
///
/// ```
/// use std::time::Duration;
/// use leasehold_shard::ShardSetConfig;
/// let cfg = ShardSetConfig::new(Duration::from_secs(9)).with_max_steals(2);
/// assert_eq!(cfg.rebalance_interval(), Duration::from_secs(3));
/// assert_eq!(cfg.max_steals(100), 2);
/// // By default, a whole fair share (at least four) may be in flight at once: one round.
/// assert_eq!(ShardSetConfig::new(Duration::from_secs(9)).max_steals(909), 909);
/// ```
#[derive(Debug, Clone)]
pub struct ShardSetConfig {
    supervisor: SupervisorConfig,
    rebalance_interval: Option<Duration>,
    max_steals: Option<usize>,
    steal_wait: Option<Duration>,
    drain_timeout: Option<Duration>,
    max_workers: usize,
    acquire_concurrency: usize,
}

impl ShardSetConfig {
    /// Leases of `ttl`, renewed every third of it; a rebalance every renewal interval.
    pub fn new(ttl: Duration) -> Self {
        Self::with_supervisor(SupervisorConfig::new(ttl))
    }

    /// Uses `config` for every lease (TTL, renewal interval, op timeout, clock). Renewal
    /// batching is switched on by the set (a window of a twentieth of the renewal interval) if
    /// `config` has none.
    pub fn with_supervisor(config: SupervisorConfig) -> Self {
        ShardSetConfig {
            supervisor: config,
            rebalance_interval: None,
            max_steals: None,
            steal_wait: None,
            drain_timeout: None,
            max_workers: 32,
            acquire_concurrency: 32,
        }
    }

    /// How often a worker scans membership and ownership and rebalances (default: the renewal
    /// interval). At most [`MAX_TTL`] ([`ShardSet::new`](crate::ShardSet::new) refuses more); below a millisecond it
    /// is a millisecond.
    pub fn with_rebalance_interval(mut self, every: Duration) -> Self {
        self.rebalance_interval = Some(every);
        self
    }

    /// At most this many shards being stolen (handed over to this worker) at once; 0 turns
    /// stealing off. The default is the worker's whole fair share (at least four): a worker
    /// joining a fleet of 10 over 10,000 shards asks every member above its share for its excess
    /// in one round of handovers (one request in each victim's mailbox, answered on its watch
    /// at once). A smaller bound spreads a join's moves over rounds (the next starts an eighth of
    /// a rebalance interval after the last ends), so that fewer shards are between owners at
    /// once, at the price of a slower join.
    pub fn with_max_steals(mut self, n: usize) -> Self {
        self.max_steals = Some(n);
        self
    }

    /// How long a thief waits for the victim to hand a shard over (default: two rebalance
    /// intervals plus the drain timeout, at most [`MAX_TTL`]). It is also the lifetime of the
    /// thief's request in the victim's mailbox, a lease: more than zero and at most
    /// [`MAX_TTL`] ([`ShardSet::new`](crate::ShardSet::new) refuses others).
    pub fn with_steal_wait(mut self, wait: Duration) -> Self {
        self.steal_wait = Some(wait);
        self
    }

    /// How long a planned release waits for the application to drop the shard's guards
    /// (default: one rebalance interval; zero releases at once). A lost lease is never drained.
    /// At most [`MAX_TTL`] ([`ShardSet::new`](crate::ShardSet::new) refuses more).
    pub fn with_drain_timeout(mut self, wait: Duration) -> Self {
        self.drain_timeout = Some(wait);
        self
    }

    /// The number of membership slots, the most workers a set counts (default 32): from 1 to
    /// [`MAX_WORKERS`]; [`ShardSet::new`](crate::ShardSet::new) refuses others. Every scan reads every slot.
    pub fn with_max_workers(mut self, n: usize) -> Self {
        self.max_workers = n;
        self
    }

    /// How many acquisitions of free shards a worker keeps in flight (default 32), at least 1
    /// ([`ShardSet::new`](crate::ShardSet::new) refuses 0); a bound above the number of shards is the number of
    /// shards. Each is one attempt: a shard someone else took meanwhile is left alone until the
    /// next scan.
    pub fn with_acquire_concurrency(mut self, n: usize) -> Self {
        self.acquire_concurrency = n;
        self
    }

    /// The lease configuration.
    pub fn supervisor(&self) -> &SupervisorConfig {
        &self.supervisor
    }

    /// The rebalance interval.
    pub fn rebalance_interval(&self) -> Duration {
        self.rebalance_interval
            .unwrap_or_else(|| self.supervisor.renew_interval())
            .max(Duration::from_millis(1))
    }

    /// The steal bound for a worker whose fair share is `share`.
    pub fn max_steals(&self, share: usize) -> usize {
        self.max_steals.unwrap_or_else(|| share.max(4))
    }

    /// The bound on acquisitions of free shards in flight.
    pub fn acquire_concurrency(&self) -> usize {
        self.acquire_concurrency
    }

    /// The drain timeout.
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout
            .unwrap_or_else(|| self.rebalance_interval())
    }

    /// How long a thief waits for a handover.
    pub fn steal_wait(&self) -> Duration {
        self.steal_wait.unwrap_or_else(|| {
            self.rebalance_interval()
                .saturating_mul(2)
                .saturating_add(self.drain_timeout())
                .min(MAX_TTL)
        })
    }

    /// The number of membership slots.
    pub fn max_workers(&self) -> usize {
        self.max_workers
    }

    /// Refuses the settings no set can run with: counts and durations out of the ranges their
    /// setters document.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_workers == 0 || self.max_workers > MAX_WORKERS {
            return Err(Error::InvalidInput(format!(
                "max workers {} is out of range: a shard set has from 1 to {MAX_WORKERS} \
                 membership slots",
                self.max_workers
            )));
        }
        if self.acquire_concurrency == 0 {
            return Err(Error::InvalidInput(
                "acquire concurrency 0 would never take a shard: it must be at least 1".into(),
            ));
        }
        for (what, value) in [
            ("rebalance interval", self.rebalance_interval),
            ("drain timeout", self.drain_timeout),
            ("steal wait", self.steal_wait),
        ] {
            if let Some(d) = value.filter(|d| *d > MAX_TTL) {
                return Err(Error::InvalidInput(format!(
                    "{what} {d:?} is longer than the longest lease ({MAX_TTL:?})"
                )));
            }
        }
        if self.steal_wait.is_some_and(|d| d.is_zero()) {
            return Err(Error::InvalidInput(
                "a steal wait of zero gives no handover time to complete".into(),
            ));
        }
        Ok(())
    }

    /// The supervisor configuration the workers run with: batching on, and an acquire wait long
    /// enough for a steal (each attempt is bounded on its own).
    pub(crate) fn worker_supervisor(&self) -> Result<SupervisorConfig> {
        self.validate()?;
        let mut c = self.supervisor.clone();
        if c.renewal_batching().is_none() {
            let window = (c.renew_interval() / 20)
                .max(Duration::from_millis(1))
                .min(c.op_timeout() / 2);
            c = c.with_renewal_batching(window);
        }
        let wait = self.steal_wait().max(self.rebalance_interval());
        c = c.with_acquire_wait(wait);
        c.validate()?;
        Ok(c)
    }
}

/// The most membership slots a set may have ([`ShardSetConfig::with_max_workers`]).
pub const MAX_WORKERS: usize = 4096;
