//! Table 6's initial split against a hand-written minimal split, over several runs with
//! staggered joins.
//!
//! Each run measures the same split twice on one store, the two sides in alternating order:
//! - **library**: `leasehold-shard` workers join (worker `i` at its offset, see
//!   [`join_offsets`]) and the run ends when every worker's own assignment (its watch, in this
//!   process: no store reads) holds exactly its fair share;
//! - **minimal**: worker `i` of `n` computes its share itself (the shards whose index is `i`
//!   modulo `n`: [`minimal_share`]) and takes it with the store's natural batch, one
//!   `acquire_many` call per [`MAX_ACQUIRE_MANY`] keys, starting at the same offset; the run ends
//!   when every worker's batch has answered. It knows the membership in advance, never scans,
//!   never renews during the split: the floor of a split over this store's API.
//!
//! Both sides use keys of one layout (a set's reserved shard keys, `SET.lease--s.pI`), so a store
//! that treats reserved keys apart (etcd's default shares their etcd leases) treats both alike.
//! The server's own request counter ([`Raw::server_requests`]) is read before the first join and
//! after the last grant (plus the counter's delay), for each side. Every library worker's beliefs
//! during the split (each shard's grant with its local deadline, confirmed renewals, releases and
//! losses, from the shard and lease hooks) are recorded and run through `leasehold-testkit`'s
//! history checker ([`History::check`]) when the split settles.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::store::MAX_ACQUIRE_MANY;
use leasehold_core::{AcquireOutcome, AcquireRequest, FencingToken, LeaseKey, LeaseStore, OwnerId};
use leasehold_shard::{ShardSet, ShardSetConfig, fair_share};
use tokio::sync::watch;
use tokio::time::Instant;

use leasehold_core::Lease;
use leasehold_core::hook::{Hook, RenewalResult};
use leasehold_shard::{RevokeReason, ShardHook};
use leasehold_testkit::history::{History, Op};

use crate::measure::{Calls, Wrapped};
use crate::raw::Raw;

/// One run of the split on both sides.
#[derive(Debug, Clone)]
pub(crate) struct Split {
    /// The last worker's join offset (zero: all at once).
    pub(crate) spread: Duration,
    /// From the first join until every worker owned exactly its fair share.
    pub(crate) library: Duration,
    /// Keys the library's workers asked for, and their acquiring calls (`acquire` and
    /// `acquire_many`, one each), membership slots included.
    pub(crate) library_acquires: u64,
    pub(crate) library_calls: u64,
    /// The library's acquiring round trips (see [`Rounds`]), all workers together.
    pub(crate) library_rounds: u64,
    /// The library's scans (`inspect_many` calls, and `holders_many` calls but for the read of
    /// the shards beside a scan's `inspect_many`), all workers together.
    pub(crate) library_scans: u64,
    /// Of `library_rounds + library_scans`, those made after the last worker joined (the
    /// others are the earlier workers' while the membership was still growing).
    pub(crate) library_trips_after_last_join: u64,
    /// The server's requests from before the first join to after the settle.
    pub(crate) library_server: Option<u64>,
    /// Shard grants the workers believed in during the split, and the violations the history
    /// checker found in their beliefs (two believers of one shard at once, a token that went
    /// back or repeated, ...).
    pub(crate) beliefs: u64,
    pub(crate) violations: u64,
    /// From the first worker's start until every worker's batch answered.
    pub(crate) minimal: Duration,
    /// The minimal side's `acquire_many` calls, all workers together.
    pub(crate) minimal_calls: u64,
    pub(crate) minimal_server: Option<u64>,
}

/// When worker `i` of `workers` joins in run `run`, from the run's start: all at once in run 0;
/// in run `r` the joins are spread evenly over `r / 4` of an interval (runs 4 and later: a whole
/// interval), in worker order.
pub(crate) fn join_offsets(run: usize, workers: usize, interval: Duration) -> Vec<Duration> {
    let quarters = u32::try_from(run.min(4)).unwrap_or(4);
    let spread = interval * quarters / 4;
    let n = u32::try_from(workers.max(1)).unwrap_or(u32::MAX);
    (0..workers)
        .map(|i| spread * u32::try_from(i).unwrap_or(u32::MAX) / n)
        .collect()
}

/// The shard indexes worker `i` of `workers` takes in the minimal split: those equal to `i`
/// modulo `workers`.
pub(crate) fn minimal_share(i: usize, workers: usize, shards: usize) -> Vec<usize> {
    (0..shards).filter(|s| s % workers.max(1) == i).collect()
}

/// The median, least and greatest of `xs` (the mean of the middle two for an even count);
/// `None` for none.
pub(crate) fn spread_of(xs: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((median, v[0], v[n - 1]))
}

/// The server's request counter, `None` where it keeps none.
async fn server_count(raw: Option<&Arc<dyn Raw>>) -> Result<Option<u64>, String> {
    match raw {
        Some(r) => r.server_requests().await,
        None => Ok(None),
    }
}

/// The difference of two counter readings taken after waiting out the counter's delay.
async fn server_since(
    raw: Option<&Arc<dyn Raw>>,
    before: Option<u64>,
) -> Result<Option<u64>, String> {
    if let Some(r) = raw {
        tokio::time::sleep(r.counter_delay()).await;
    }
    let after = server_count(raw).await?;
    Ok(before.zip(after).map(|(a, b)| b.saturating_sub(a)))
}

/// Every worker's beliefs about the shards of one set, for the history checker. Each event's
/// client is the owner the shard was granted to (the worker's instance), its key the shard's key.
#[derive(Debug)]
struct Beliefs {
    history: History,
    set: LeaseKey,
    /// (shard key, token) -> the owner it was granted to.
    owners: std::sync::Mutex<std::collections::HashMap<(LeaseKey, FencingToken), String>>,
}

impl Beliefs {
    fn key(&self, shard: &str) -> Option<LeaseKey> {
        self.set.reserved(&format!("s.{shard}")).ok()
    }

    /// Only shard keys: the workers' membership and mailbox leases are not shards.
    fn is_shard(lease: &Lease) -> bool {
        lease.key().as_str().contains(".lease--s.")
    }

    /// The owner that was granted `key` with `token` (the shard hook's release and loss name
    /// the worker's id, its grant the worker's instance).
    fn client(&self, worker: &str, key: &LeaseKey, token: FencingToken) -> String {
        let owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        owners
            .get(&(key.clone(), token))
            .cloned()
            .unwrap_or_else(|| worker.to_string())
    }
}

impl ShardHook for Beliefs {
    fn assigned(&self, _worker: &str, _shard: &str, lease: &Lease) {
        let op = Op::Granted {
            owner: lease.owner().clone(),
            token: lease.token(),
            deadline: lease.deadline(),
        };
        let client = lease.owner().to_string();
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((lease.key().clone(), lease.token()), client.clone());
        self.history
            .record(&client, lease.key(), Instant::now(), op);
    }

    /// Called before the release is sent: the worker stops believing here.
    fn releasing(&self, worker: &str, shard: &str, token: FencingToken, _: &RevokeReason) {
        if let Some(key) = self.key(shard) {
            let client = self.client(worker, &key, token);
            self.history
                .record(&client, &key, Instant::now(), Op::Release { token });
        }
    }

    fn revoked(&self, worker: &str, shard: &str, token: FencingToken, reason: &RevokeReason) {
        if let (RevokeReason::Lost(_), Some(key)) = (reason, self.key(shard)) {
            let client = self.client(worker, &key, token);
            self.history
                .record(&client, &key, Instant::now(), Op::RenewLost { token });
        }
    }
}

impl Hook for Beliefs {
    fn renewal(&self, lease: &Lease, result: RenewalResult, latency: Duration) {
        if Beliefs::is_shard(lease) && matches!(result, RenewalResult::Confirmed { .. }) {
            let op = Op::Renewed {
                token: lease.token(),
                deadline: lease.deadline(),
            };
            let now = Instant::now();
            let invoked = now.checked_sub(latency).unwrap_or(now);
            let client = lease.owner().to_string();
            self.history.record(&client, lease.key(), invoked, op);
        }
    }
}

/// A forwarding store that counts each owner's acquiring round trips: an `acquire` or
/// `acquire_many` call that starts while none of the same owner's is in flight starts one (calls
/// side by side, such as a worker's batches of one rebalance, share a round trip of latency).
/// `acquire_many` is forwarded as one batch.
#[derive(Debug)]
struct Rounds {
    inner: Arc<dyn LeaseStore>,
    in_flight: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    rounds: std::sync::atomic::AtomicU64,
}

/// One acquiring call of `owner` in flight (ended on drop, cancellation included).
struct InFlight<'a> {
    rounds: &'a Rounds,
    owner: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut m = self
            .rounds
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
        }
    }
}

impl Rounds {
    fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Rounds {
            inner,
            in_flight: Default::default(),
            rounds: Default::default(),
        }
    }

    fn begin(&self, owner: Option<&OwnerId>) -> InFlight<'_> {
        let owner = owner.map(ToString::to_string).unwrap_or_default();
        let mut m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(owner.clone()).or_default();
        if *n == 0 {
            self.rounds
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        *n += 1;
        InFlight {
            rounds: self,
            owner,
        }
    }

    fn rounds(&self) -> u64 {
        self.rounds.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[async_trait::async_trait]
impl LeaseStore for Rounds {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> leasehold_core::Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> leasehold_core::Result<AcquireOutcome> {
        let _f = self.begin(Some(&req.owner));
        self.inner.acquire(req).await
    }
    async fn acquire_many(
        &self,
        reqs: &[AcquireRequest],
    ) -> leasehold_core::Result<Vec<leasehold_core::Result<AcquireOutcome>>> {
        let _f = self.begin(reqs.first().map(|r| &r.owner));
        self.inner.acquire_many(reqs).await
    }
    async fn renew(&self, lease: &Lease) -> leasehold_core::Result<leasehold_core::RenewOutcome> {
        self.inner.renew(lease).await
    }
    async fn release(
        &self,
        lease: &Lease,
    ) -> leasehold_core::Result<leasehold_core::ReleaseOutcome> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> leasehold_core::Result<leasehold_core::KeyState> {
        self.inner.inspect(key).await
    }
    async fn inspect_many(
        &self,
        keys: &[LeaseKey],
    ) -> leasehold_core::Result<Vec<leasehold_core::KeyState>> {
        self.inner.inspect_many(keys).await
    }
    async fn holders_many(
        &self,
        keys: &[LeaseKey],
    ) -> leasehold_core::Result<Vec<Option<leasehold_core::HeldBy>>> {
        self.inner.holders_many(keys).await
    }
    async fn renew_many(
        &self,
        leases: &[Lease],
    ) -> leasehold_core::Result<Vec<leasehold_core::Result<leasehold_core::RenewOutcome>>> {
        self.inner.renew_many(leases).await
    }
    async fn watch(
        &self,
        key: &LeaseKey,
    ) -> leasehold_core::Result<Option<leasehold_core::KeyWatch>> {
        self.inner.watch(key).await
    }
}

/// The library's split of `shards` over `workers` joining at `offsets`, on a fresh set named
/// `set_name`; its workers are dropped (they release at once) and their releases waited for,
/// bounded by `settle`, before it returns.
async fn library_split(
    store: &Arc<dyn LeaseStore>,
    raw: Option<&Arc<dyn Raw>>,
    set_name: &str,
    shards: &[String],
    config: &ShardSetConfig,
    offsets: &[Duration],
    settle: Duration,
) -> Result<LibrarySplit, String> {
    let calls = Arc::new(Calls::default());
    let rounds = Arc::new(Rounds::new(store.clone()));
    let wrapped: Arc<dyn LeaseStore> = Arc::new(Wrapped {
        inner: rounds.clone(),
        watch: true,
        batch: true,
        calls: calls.clone(),
    });
    let beliefs = Arc::new(Beliefs {
        history: History::new(),
        set: LeaseKey::new(set_name).map_err(|e| e.to_string())?,
        owners: Default::default(),
    });
    let set = ShardSet::new(wrapped, set_name, shards, config.clone())
        .map_err(|e| e.to_string())?
        .with_shard_hook(beliefs.clone() as Arc<dyn ShardHook>)
        .with_lease_hook(beliefs.clone() as Arc<dyn Hook>);
    let names: Vec<String> = (0..offsets.len()).map(|i| format!("w{i}")).collect();
    let mut sorted = names.clone();
    sorted.sort();
    let server0 = server_count(raw).await?;
    let started = Instant::now();
    let mut subs: Vec<(usize, watch::Receiver<BTreeMap<String, FencingToken>>)> = Vec::new();
    // Aborted when dropped: an early return stops the workers joined so far.
    let mut consumers = crate::shards::Consumers::default();
    for (name, offset) in names.iter().zip(offsets) {
        tokio::time::sleep_until(started + *offset).await;
        let mut w = set.join(name).map_err(|e| e.to_string())?;
        subs.push((fair_share(shards.len(), &sorted, name), w.subscribe()));
        consumers.0.push(tokio::spawn(async move {
            while w.next_event().await.is_some() {}
        }));
    }
    let trips_at_last_join = rounds.rounds() + calls.inspect_manys();
    let wait = async {
        loop {
            if subs.iter().all(|(share, rx)| rx.borrow().len() == *share) {
                return Ok(());
            }
            let changes = subs.iter_mut().map(|(_, rx)| Box::pin(rx.changed()));
            if futures::future::select_all(changes).await.0.is_err() {
                return Err("a worker stopped during the split".to_string());
            }
        }
    };
    let settled = tokio::time::timeout(settle, wait).await;
    let took = started.elapsed();
    let outcome = match settled {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            let owned: Vec<usize> = subs.iter().map(|(_, rx)| rx.borrow().len()).collect();
            Err(format!(
                "library split: not at the fair shares within {settle:?} (owned {owned:?})"
            ))
        }
    };
    let (acquires, acquire_calls, scans) = (
        calls.acquires(),
        calls.acquire_calls(),
        calls.inspect_manys(),
    );
    let acquire_rounds = rounds.rounds();
    // The beliefs up to the settle, checked before the workers leave.
    let believed = beliefs
        .history
        .events()
        .iter()
        .filter(|e| matches!(e.op, Op::Granted { .. }))
        .count();
    let violations = beliefs.history.check();
    if !violations.is_empty() {
        eprintln!("  split {set_name}: the history checker found {violations:?}");
    }
    let server = match outcome {
        Ok(()) => server_since(raw, server0).await?,
        Err(_) => None,
    };
    drop(consumers);
    drop(subs);
    // The workers release as they drop: wait (bounded) until the set is empty again, so that the
    // other side's count holds nothing of this one.
    let end = Instant::now() + settle;
    while Instant::now() < end {
        match set.snapshot().await {
            Ok(s) if s.counts().values().all(|n| *n == 0) => break,
            _ => tokio::time::sleep(config.rebalance_interval() / 10).await,
        }
    }
    outcome.map(|()| LibrarySplit {
        took,
        acquires,
        calls: acquire_calls,
        rounds: acquire_rounds,
        scans,
        trips_after_last_join: (acquire_rounds + scans).saturating_sub(trips_at_last_join),
        server,
        beliefs: u64::try_from(believed).unwrap_or(u64::MAX),
        violations: u64::try_from(violations.len()).unwrap_or(u64::MAX),
    })
}

/// What [`library_split`] measured.
#[derive(Debug)]
struct LibrarySplit {
    took: Duration,
    acquires: u64,
    calls: u64,
    rounds: u64,
    scans: u64,
    trips_after_last_join: u64,
    server: Option<u64>,
    beliefs: u64,
    violations: u64,
}

/// The minimal split: worker `i` takes [`minimal_share`] with `acquire_many` at `offsets[i]`
/// (a call that fails retryably is sent again, at most three times, each counted). Every grant
/// is released (64 at a time) before it returns.
async fn minimal_split(
    store: &Arc<dyn LeaseStore>,
    raw: Option<&Arc<dyn Raw>>,
    set_name: &str,
    shards: usize,
    ttl: Duration,
    offsets: &[Duration],
) -> Result<(Duration, u64, Option<u64>), String> {
    let set = LeaseKey::new(set_name).map_err(|e| e.to_string())?;
    let keys: Vec<LeaseKey> = (0..shards)
        .map(|i| set.reserved(&format!("s.p{i}")))
        .collect::<leasehold_core::Result<_>>()
        .map_err(|e| e.to_string())?;
    let workers = offsets.len();
    let server0 = server_count(raw).await?;
    let started = Instant::now();
    let tasks = offsets.iter().enumerate().map(|(i, offset)| {
        // One owner per worker, as a worker holds its share: on a store that keeps a membership
        // per owner (Kubernetes's grouped mode) an owner per key would cost a membership each.
        let owner = OwnerId::with_label(&format!("m{i}"));
        let reqs: Vec<AcquireRequest> = minimal_share(i, workers, shards)
            .into_iter()
            .map(|s| AcquireRequest::new(keys[s].clone(), owner.clone(), ttl))
            .collect();
        let store = store.clone();
        let at = started + *offset;
        async move {
            tokio::time::sleep_until(at).await;
            let mut leases = Vec::with_capacity(reqs.len());
            let mut calls = 0u64;
            for chunk in reqs.chunks(MAX_ACQUIRE_MANY) {
                // A call that fails retryably (a pool with no connection free in time while
                // the other workers' batches hold them all) is sent again, as an expert's
                // split would, up to three times.
                let mut attempts = 0;
                let out = loop {
                    calls += 1;
                    attempts += 1;
                    match store.acquire_many(chunk).await {
                        Err(e) if e.is_retryable() && attempts < 3 => continue,
                        r => break r.map_err(|e| e.to_string())?,
                    }
                };
                for (req, r) in chunk.iter().zip(out) {
                    match r.map_err(|e| e.to_string())? {
                        AcquireOutcome::Acquired(l) => leases.push(l),
                        AcquireOutcome::Held(h) => {
                            return Err(format!("minimal split: {} held by {}", req.key, h.owner));
                        }
                    }
                }
            }
            Ok::<_, String>((leases, calls))
        }
    });
    let results = futures::future::join_all(tasks).await;
    let took = started.elapsed();
    let mut leases = Vec::new();
    let mut calls = 0;
    let mut failed = None;
    for r in results {
        match r {
            Ok((l, c)) => {
                leases.extend(l);
                calls += c;
            }
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    let server = match failed {
        None => server_since(raw, server0).await?,
        Some(_) => None,
    };
    futures::stream::iter(leases)
        .for_each_concurrent(64, |l| {
            let store = store.clone();
            async move {
                let _ = store.release(&l).await;
            }
        })
        .await;
    match failed {
        Some(e) => Err(e),
        None => Ok((took, calls, server)),
    }
}

/// A store of its own for one side of one split run, named after its set (Kubernetes's grouped
/// mode: a group set per run, so that no run writes group objects that hold an earlier run's
/// entries); `None` uses the section's store.
pub(crate) type FreshStore = Arc<dyn Fn(&str) -> Result<Arc<dyn LeaseStore>, String> + Send + Sync>;

/// `runs` runs of the split of `shards` shards over `workers` workers, each on both sides (the
/// library first in even runs, the minimal split first in odd ones), with the joins of run `r`
/// at [`join_offsets`]`(r, ..)`. Keys are named after `ns` and the run; each side runs on
/// `fresh`'s store for its set where given.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn split_runs(
    fresh: Option<&FreshStore>,
    store: &Arc<dyn LeaseStore>,
    raw: Option<&Arc<dyn Raw>>,
    ns: &str,
    shards: usize,
    workers: usize,
    config: &ShardSetConfig,
    runs: usize,
    settle: Duration,
) -> Result<Vec<Split>, String> {
    let ttl = config.supervisor().ttl();
    let interval = config.rebalance_interval();
    let names: Vec<String> = (0..shards).map(|i| format!("p{i}")).collect();
    let mut out = Vec::with_capacity(runs);
    for run in 0..runs {
        let offsets = join_offsets(run, workers, interval);
        let lib_name = format!("{ns}-sl{run}");
        let min_name = format!("{ns}-sm{run}");
        let side = |name: &str| match fresh {
            Some(f) => f(name),
            None => Ok(store.clone()),
        };
        let (lib_store, min_store) = (side(&lib_name)?, side(&min_name)?);
        let (lib, min) = if run % 2 == 0 {
            let lib =
                library_split(&lib_store, raw, &lib_name, &names, config, &offsets, settle).await?;
            let min = minimal_split(&min_store, raw, &min_name, shards, ttl, &offsets).await?;
            (lib, min)
        } else {
            let min = minimal_split(&min_store, raw, &min_name, shards, ttl, &offsets).await?;
            let lib =
                library_split(&lib_store, raw, &lib_name, &names, config, &offsets, settle).await?;
            (lib, min)
        };
        if std::env::var_os("LEASE_BENCH_TRACE").is_some() {
            eprintln!("  split run {run}: library {lib:?}, minimal {min:?}");
        }
        out.push(Split {
            spread: offsets.last().copied().unwrap_or_default(),
            library: lib.took,
            library_acquires: lib.acquires,
            library_calls: lib.calls,
            library_rounds: lib.rounds,
            library_scans: lib.scans,
            library_trips_after_last_join: lib.trips_after_last_join,
            library_server: lib.server,
            beliefs: lib.beliefs,
            violations: lib.violations,
            minimal: min.0,
            minimal_calls: min.1,
            minimal_server: min.2,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rounds_count_an_owners_calls_side_by_side_once() {
        let rounds = Rounds::new(Arc::new(leasehold_core::MemoryLeaseStore::new()));
        let req = |key: &str, owner: &str| {
            AcquireRequest::new(
                LeaseKey::new(key).unwrap(),
                OwnerId::new(owner).unwrap(),
                Duration::from_secs(10),
            )
        };
        {
            // A call of w0 in flight (held by hand): a batch that starts meanwhile shares its
            // round trip.
            let _f = rounds.begin(Some(&OwnerId::new("w0").unwrap()));
            assert_eq!(rounds.rounds(), 1);
            let batch = [req("a1", "w0"), req("a2", "w0")];
            assert!(rounds.acquire_many(&batch).await.is_ok());
            assert_eq!(rounds.rounds(), 1);
        }
        // After it: another.
        assert!(
            rounds
                .acquire(&req("a3", "w0"))
                .await
                .unwrap()
                .lease()
                .is_some()
        );
        assert_eq!(rounds.rounds(), 2);
        // Another owner's calls are its own round trips.
        assert!(
            rounds
                .acquire(&req("b1", "w1"))
                .await
                .unwrap()
                .lease()
                .is_some()
        );
        assert_eq!(rounds.rounds(), 3);
    }

    #[test]
    fn joins_are_at_once_in_the_first_run_then_spread_over_up_to_an_interval() {
        let i = Duration::from_secs(4);
        assert_eq!(join_offsets(0, 3, i), vec![Duration::ZERO; 3]);
        assert_eq!(
            join_offsets(1, 4, i),
            [0, 250, 500, 750].map(Duration::from_millis).to_vec()
        );
        for run in 1..8 {
            let o = join_offsets(run, 10, i);
            assert_eq!(o.len(), 10);
            assert_eq!(o[0], Duration::ZERO);
            assert!(o.windows(2).all(|w| w[0] < w[1]), "run {run}: {o:?}");
            assert!(*o.last().unwrap() < i, "run {run}: {o:?}");
        }
        assert_eq!(join_offsets(4, 10, i), join_offsets(7, 10, i));
        assert!(join_offsets(2, 0, i).is_empty());
    }

    #[test]
    fn the_minimal_shares_cover_every_shard_once_at_the_fair_sizes() {
        for (workers, shards) in [(1, 5), (3, 40), (10, 10_000), (7, 3)] {
            let mut all: Vec<usize> = (0..workers)
                .flat_map(|i| minimal_share(i, workers, shards))
                .collect();
            all.sort_unstable();
            assert_eq!(all, (0..shards).collect::<Vec<_>>());
            for i in 0..workers {
                let n = minimal_share(i, workers, shards).len();
                assert!(
                    n == shards / workers || n == shards / workers + 1,
                    "{i}: {n}"
                );
            }
        }
    }

    #[test]
    fn spreads_are_median_least_and_greatest() {
        assert_eq!(spread_of(&[]), None);
        assert_eq!(spread_of(&[2.0]), Some((2.0, 2.0, 2.0)));
        assert_eq!(spread_of(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(spread_of(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(spread_of(&[f64::NAN, 1.0]), Some((1.0, 1.0, 1.0)));
    }
}
