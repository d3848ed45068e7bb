//! Table 6: shard ownership at scale (`leasehold-shard`). N workers in this process split K shards
//! over one client of the store; each worker reaches it through a link of its own that can be
//! cut (its "death": no renewal, no release, every call fails), and all links count their calls
//! in one [`Wrapped`] store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, HeldBy, KeyState, KeyWatch, Lease,
    LeaseKey, LeaseStore, ReleaseOutcome, RenewOutcome, Result,
};
use leasehold_shard::{RevokeReason, ShardHook, ShardSet, ShardSetConfig, Snapshot, Worker};
use tokio::time::Instant;

use crate::measure::{Calls, Wrapped, legal_ttl, requests_per_interval, warm_up_intervals};
use crate::raw::Raw;

/// What one shard run measured.
#[derive(Debug, Clone)]
pub(crate) struct ShardRun {
    pub(crate) shards: usize,
    pub(crate) workers: usize,
    pub(crate) ttl: Duration,
    pub(crate) interval: Duration,
    /// From the workers' joins (all at once) to every shard owned at the exact fair shares.
    pub(crate) initial: Duration,
    /// Acquire calls until then (the floor is one per shard, plus one membership slot each).
    pub(crate) initial_acquires: u64,
    /// Steady state, per rebalance interval, all workers together.
    pub(crate) renew_calls_per_interval: f64,
    pub(crate) scans_per_interval: f64,
    pub(crate) server_requests_per_interval: Option<f64>,
    /// One more worker joins: time to exact shares, shards whose owner changed, and the least
    /// that must move (the joiner's share).
    pub(crate) join: Phase,
    /// One worker dies (link cut): time until every shard is owned by the others again, time to
    /// exact shares, shards whose owner changed, and the least that must move (its shards).
    pub(crate) kill_owned: Duration,
    pub(crate) kill: Phase,
    /// Leases lost by live workers during the whole run (a renewal not confirmed in time).
    pub(crate) lost: u64,
    /// The split runs against the minimal split, before the rest ([`crate::split`]).
    pub(crate) splits: std::result::Result<Vec<crate::split::Split>, String>,
}

/// A planned or unplanned change of membership and what it cost.
#[derive(Debug, Clone)]
pub(crate) struct Phase {
    pub(crate) balanced: Duration,
    pub(crate) moved: usize,
    pub(crate) minimum: usize,
    /// Grants (assignments) during the phase, moves and re-takes included.
    pub(crate) grants: u64,
}

/// The scale of a run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShardPlan {
    pub(crate) shards: usize,
    pub(crate) workers: usize,
    pub(crate) ttl: Duration,
    /// How many runs of the split against the minimal split ([`crate::split`]).
    pub(crate) split_runs: usize,
}

/// Counts grants and losses (shared by every worker of a run).
#[derive(Debug, Default)]
struct Counts {
    grants: AtomicU64,
    lost: AtomicU64,
}

impl ShardHook for Counts {
    fn assigned(&self, _worker: &str, _shard: &str, _lease: &Lease) {
        self.grants.fetch_add(1, Ordering::Relaxed);
    }
    fn revoked(
        &self,
        _worker: &str,
        _shard: &str,
        _token: leasehold_core::FencingToken,
        reason: &RevokeReason,
    ) {
        if matches!(reason, RevokeReason::Lost(_)) {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A worker's link to the store: forwards, or fails every call once cut.
#[derive(Debug)]
struct Link {
    inner: Arc<dyn LeaseStore>,
    cut: AtomicBool,
}

impl Link {
    fn check(&self, operation: &'static str) -> Result<()> {
        if self.cut.load(Ordering::Relaxed) {
            return Err(Error::Timeout {
                backend: self.inner.backend(),
                operation,
                after: Duration::ZERO,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl LeaseStore for Link {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.check("acquire")?;
        self.inner.acquire(req).await
    }
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        self.check("acquire_many")?;
        self.inner.acquire_many(reqs).await
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.check("renew")?;
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.check("release")?;
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.check("inspect")?;
        self.inner.inspect(key).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        self.check("renew_many")?;
        self.inner.renew_many(leases).await
    }
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.check("inspect_many")?;
        self.inner.inspect_many(keys).await
    }
    async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<HeldBy>>> {
        self.check("holders_many")?;
        self.inner.holders_many(keys).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        self.check("watch")?;
        self.inner.watch(key).await
    }
}

/// Every shard owned by `workers`, each at exactly its fair share.
fn exact(s: &Snapshot, workers: &[String]) -> bool {
    let mut m = workers.to_vec();
    m.sort();
    let counts = s.counts();
    s.owners.values().all(|o| {
        o.as_ref()
            .is_some_and(|(w, _)| workers.iter().any(|x| x == w))
    }) && workers.iter().all(|w| {
        counts.get(w).copied().unwrap_or(0) == leasehold_shard::fair_share(s.owners.len(), &m, w)
    })
}

fn owned_by(s: &Snapshot, workers: &[String]) -> bool {
    s.owners.values().all(|o| {
        o.as_ref()
            .is_some_and(|(w, _)| workers.iter().any(|x| x == w))
    })
}

fn moved(before: &Snapshot, after: &Snapshot) -> usize {
    before
        .owners
        .iter()
        .filter(|(s, o)| {
            after.owners.get(*s).and_then(|x| x.as_ref()).map(|x| &x.0) != o.as_ref().map(|x| &x.0)
        })
        .count()
}

/// Polls `observer` every `poll` until `done`, at most `within`.
async fn until(
    observer: &ShardSet,
    poll: Duration,
    within: Duration,
    what: &str,
    done: impl Fn(&Snapshot) -> bool,
) -> std::result::Result<Snapshot, String> {
    let end = Instant::now() + within;
    let mut last = None;
    loop {
        let snap = observer.snapshot().await;
        if std::env::var_os("LEASE_BENCH_TRACE").is_some()
            && let Ok(s) = &snap
        {
            eprintln!("  {what}: {:?} members {:?}", s.counts(), s.members);
        }
        match snap {
            Ok(s) if done(&s) => return Ok(s),
            Ok(s) => last = Some(s.counts()),
            Err(e) => last = last.or_else(|| Some(BTreeMap::from([(e.to_string(), 0)]))),
        }
        if Instant::now() >= end {
            return Err(format!(
                "{what}: not within {within:?} (last counts {last:?})"
            ));
        }
        tokio::time::sleep(poll).await;
    }
}

/// Joins `name` over a link of its own; its events are consumed at once (the application's
/// work is instant, so a handover's drain does not wait for the drain timeout).
fn join(
    calls: &Arc<Calls>,
    store: &Arc<dyn LeaseStore>,
    set_name: &str,
    shards: &[String],
    config: &ShardSetConfig,
    counts: &Arc<Counts>,
    name: &str,
) -> std::result::Result<(Arc<Link>, Worker), String> {
    let link = Arc::new(Link {
        inner: Arc::new(Wrapped {
            inner: store.clone(),
            watch: true,
            batch: true,
            calls: calls.clone(),
        }),
        cut: AtomicBool::new(false),
    });
    let set = ShardSet::new(
        link.clone() as Arc<dyn LeaseStore>,
        set_name,
        shards,
        config.clone(),
    )
    .map_err(|e| e.to_string())?
    .with_shard_hook(counts.clone() as Arc<dyn ShardHook>);
    let worker = set.join(name).map_err(|e| e.to_string())?;
    Ok((link, worker))
}

/// Runs `plan` on `store`: the initial split, the steady state, a join and a death.
/// The tasks that consume the workers' events, each owning its worker: aborting one drops its
/// worker, which releases what it holds. All are aborted when this is dropped.
#[derive(Default)]
pub(crate) struct Consumers(pub(crate) Vec<tokio::task::JoinHandle<()>>);

impl Drop for Consumers {
    fn drop(&mut self) {
        for c in &self.0 {
            c.abort();
        }
    }
}

pub(crate) async fn shard_run(
    fresh: Option<&crate::split::FreshStore>,
    store: &Arc<dyn LeaseStore>,
    raw: Option<&Arc<dyn Raw>>,
    ns: &str,
    plan: ShardPlan,
) -> std::result::Result<ShardRun, String> {
    let ttl = legal_ttl(&store.capabilities(), plan.ttl);
    let config = ShardSetConfig::new(ttl);
    let interval = config.rebalance_interval();
    let poll = (interval / 10).min(Duration::from_secs(1));
    let set_name = format!("{ns}-sh");
    let shards: Vec<String> = (0..plan.shards).map(|i| format!("p{i}")).collect();
    let calls = Arc::new(Calls::default());
    let counts = Arc::new(Counts::default());
    let observer = ShardSet::new(store.clone(), &set_name, &shards, config.clone())
        .map_err(|e| e.to_string())?;
    // Settling bounds: generous, so that a slow backend reports its figure rather than failing.
    let settle = ttl * 10 + interval * 30;

    // 0. The split against the minimal split, in runs with staggered joins, on sets of their own.
    let splits = crate::split::split_runs(
        fresh,
        store,
        raw,
        ns,
        plan.shards,
        plan.workers,
        &config,
        plan.split_runs,
        settle,
    )
    .await;
    if let Err(e) = &splits {
        eprintln!("  shards: split runs: {e}");
    }

    // 1. All workers join at once.
    let mut names: Vec<String> = (0..plan.workers).map(|i| format!("w{i}")).collect();
    let started = Instant::now();
    let mut workers = Vec::new();
    for n in &names {
        workers.push(join(
            &calls, store, &set_name, &shards, &config, &counts, n,
        )?);
    }
    // Aborted when dropped, so that a phase that fails (an early return) stops the workers
    // too: left running, a failed run's workers went on renewing and contending through the
    // later sections and the later backends' measurements.
    let mut consumers = Consumers::default();
    let mut links = Vec::new();
    for (link, mut w) in workers {
        links.push(link);
        consumers.0.push(tokio::spawn(async move {
            while w.next_event().await.is_some() {}
        }));
    }
    let before = until(&observer, poll, settle, "initial split", |s| {
        exact(s, &names)
    })
    .await?;
    let initial = started.elapsed();
    let initial_acquires = calls.acquires();

    // 2. Steady state: two intervals after one of warm-up (or as many as the server's counter
    // needs to have counted the initial split).
    tokio::time::sleep(interval * warm_up_intervals(raw, interval)).await;
    let intervals = 2u32;
    let (r0, s0) = (calls.renews(), calls.inspect_manys());
    let server0 = match raw {
        Some(r) => r.server_requests().await?,
        None => None,
    };
    tokio::time::sleep(interval * intervals).await;
    let (r1, s1) = (calls.renews(), calls.inspect_manys());
    let server1 = match raw {
        Some(r) => r.server_requests().await?,
        None => None,
    };
    let per = |a: u64, b: u64| requests_per_interval(a, b, intervals);

    // 3. One more worker joins.
    let grants0 = counts.grants.load(Ordering::Relaxed);
    let joiner = format!("w{}", plan.workers);
    let joined = Instant::now();
    let (link, mut w) = join(&calls, store, &set_name, &shards, &config, &counts, &joiner)?;
    links.push(link);
    consumers.0.push(tokio::spawn(async move {
        while w.next_event().await.is_some() {}
    }));
    names.push(joiner.clone());
    let after_join = until(&observer, poll, settle, "join", |s| exact(s, &names)).await?;
    let mut sorted = names.clone();
    sorted.sort();
    let join = Phase {
        balanced: joined.elapsed(),
        moved: moved(&before, &after_join),
        minimum: leasehold_shard::fair_share(plan.shards, &sorted, &joiner),
        grants: counts.grants.load(Ordering::Relaxed) - grants0,
    };

    // 4. The first worker dies: its link is cut (no renewal, no release), its tasks dropped.
    let grants1 = counts.grants.load(Ordering::Relaxed);
    let victim = names.remove(0);
    let minimum = after_join.counts().get(&victim).copied().unwrap_or(0);
    links[0].cut.store(true, Ordering::Relaxed);
    let died = Instant::now();
    consumers.0.remove(0).abort();
    let _ = links.remove(0);
    let owned = until(
        &observer,
        poll,
        settle,
        "takeover of the dead worker's shards",
        |s| owned_by(s, &names),
    )
    .await?;
    let kill_owned = died.elapsed();
    let _ = owned;
    let after_kill = until(&observer, poll, settle, "balance after the death", |s| {
        exact(s, &names)
    })
    .await?;
    let kill = Phase {
        balanced: died.elapsed(),
        moved: moved(&after_join, &after_kill),
        minimum,
        grants: counts.grants.load(Ordering::Relaxed) - grants1,
    };
    let lost = counts.lost.load(Ordering::Relaxed);

    // Leave: dropping the consumers drops the workers, which release at once.
    drop(consumers);
    // Until their releases have landed (bounded): the next section counts the server's
    // requests, and 10,000 releases still in flight would be counted as its own.
    if let Err(e) = until(&observer, poll, settle, "leave", |s| {
        s.counts().values().all(|n| *n == 0)
    })
    .await
    {
        eprintln!("  shards: {e}");
    }
    Ok(ShardRun {
        shards: plan.shards,
        workers: plan.workers,
        ttl,
        interval,
        initial,
        initial_acquires,
        renew_calls_per_interval: per(r0, r1),
        scans_per_interval: per(s0, s1),
        server_requests_per_interval: server0.zip(server1).map(|(a, b)| per(a, b)),
        join,
        kill_owned,
        kill,
        lost,
        splits,
    })
}
