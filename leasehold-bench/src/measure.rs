//! The five measurements, over the sides of [`SIDES`]: stores, the supervisor, and hand-written
//! protocols ([`Raw`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, HeldBy, KeyState, KeyWatch, Lease, LeaseKey,
    LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

use crate::raw::Raw;
use crate::sys;

type Failure = String;

/// The sides measured together in throughput and latency, in this order (the index constants
/// below): the bare store, the supervisor users run over it, the `leasehold-otel` decorated store,
/// the library's own protocol issued directly, the minimal hand-written lease, and the minimal
/// lease once more as a side of its own (the A/A pair: two measurements of the same side, whose
/// ratio shows the run's noise as an interval around 1).
pub(crate) const SIDES: [&str; 6] = [
    "library",
    "supervisor",
    "leasehold-otel store",
    "same protocol",
    "minimal",
    "minimal (A/A copy)",
];
/// Index of the bare library store in [`SIDES`].
pub(crate) const LIB: usize = 0;
/// Index of the supervisor in [`SIDES`].
pub(crate) const SUP: usize = 1;
/// Index of the `leasehold-otel` decorated store in [`SIDES`].
pub(crate) const OTEL: usize = 2;
/// Index of the library's own protocol, issued directly, in [`SIDES`].
pub(crate) const RAW: usize = 3;
/// Index of the minimal hand-written lease in [`SIDES`].
pub(crate) const MIN: usize = 4;
/// Index of the minimal lease's second copy (the A/A side) in [`SIDES`].
pub(crate) const AA: usize = 5;

fn key(ns: &str, name: &str) -> LeaseKey {
    LeaseKey::new(format!("{ns}-{name}")).expect("bench keys are legal")
}

/// Rounds `d` up to the backend's granularity and minimum.
pub(crate) fn legal_ttl(caps: &Capabilities, d: Duration) -> Duration {
    let d = d.max(caps.min_ttl);
    let g = caps.ttl_granularity.as_nanos().max(1);
    let n = d.as_nanos().div_ceil(g) * g;
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

/// Calls counted by [`Wrapped`] (the bench's own counter; no test kit needed).
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// Keys asked for: one per `acquire`, one per request of an `acquire_many`.
    acquire: AtomicU64,
    /// Acquiring calls: one per `acquire` and one per `acquire_many`.
    acquire_calls: AtomicU64,
    renew: AtomicU64,
    renew_wall_ns: AtomicU64,
    inspect_many: AtomicU64,
}

impl Calls {
    /// Keys asked for so far: one per `acquire` call, one per request of an `acquire_many`.
    pub(crate) fn acquires(&self) -> u64 {
        self.acquire.load(Ordering::Relaxed)
    }
    /// Acquiring calls so far: `acquire` and `acquire_many` calls, one each.
    pub(crate) fn acquire_calls(&self) -> u64 {
        self.acquire_calls.load(Ordering::Relaxed)
    }
    /// Scans so far: `inspect_many` and `holders_many` calls, but for a shard set's read of its
    /// shards alone, which rides beside its scan's `inspect_many`.
    pub(crate) fn inspect_manys(&self) -> u64 {
        self.inspect_many.load(Ordering::Relaxed)
    }
    /// Renewal round trips so far: one per `renew_many` where the store batches, one per
    /// lease where it renews one by one.
    pub(crate) fn renews(&self) -> u64 {
        self.renew.load(Ordering::Relaxed)
    }
    /// Wall time spent inside `renew_many` so far.
    pub(crate) fn renew_wall(&self) -> Duration {
        Duration::from_nanos(self.renew_wall_ns.load(Ordering::Relaxed))
    }
}

/// How many single renewals the Kubernetes store's `renew_many` runs at once (it has no batch).
pub(crate) const RENEW_CONCURRENCY: usize = leasehold_k8s::RENEW_MANY_IN_FLIGHT;

/// A forwarding store that counts calls, and can hide its watch (the supervisor then waits by
/// bounded polling) and count a store's `renew_many` per lease (`batch: false`: it still goes through
/// the store, each lease counted as one request: Kubernetes, whose `renew_many` sends one
/// request per lease, [`RENEW_CONCURRENCY`] at once).
#[derive(Debug)]
pub(crate) struct Wrapped {
    pub(crate) inner: Arc<dyn LeaseStore>,
    pub(crate) watch: bool,
    pub(crate) batch: bool,
    pub(crate) calls: Arc<Calls>,
}

impl Wrapped {
    pub(crate) fn new(inner: Arc<dyn LeaseStore>, watch: bool) -> Self {
        Wrapped {
            inner,
            watch,
            batch: true,
            calls: Arc::default(),
        }
    }
}

#[async_trait]
impl LeaseStore for Wrapped {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities();
        caps.with_watch(caps.watch && self.watch)
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.calls.acquire.fetch_add(1, Ordering::Relaxed);
        self.calls.acquire_calls.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(req).await
    }
    /// Forwarded as one batch (the store's own `acquire_many`, not the trait's default loop),
    /// each request counted as an acquire and the call as one acquiring call.
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        let n = u64::try_from(reqs.len()).unwrap_or(u64::MAX);
        self.calls.acquire.fetch_add(n, Ordering::Relaxed);
        self.calls.acquire_calls.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire_many(reqs).await
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.calls.renew.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.inner.inspect(key).await
    }
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        self.calls.inspect_many.fetch_add(1, Ordering::Relaxed);
        self.inner.inspect_many(keys).await
    }
    async fn holders_many(&self, keys: &[LeaseKey]) -> Result<Vec<Option<HeldBy>>> {
        // A shard set's scan reads its shards alone here, in flight beside the `inspect_many`
        // of its slots and mailbox: one scan, counted there.
        if !keys.iter().all(|k| k.as_str().contains(".lease--s.")) {
            self.calls.inspect_many.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.holders_many(keys).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let t = Instant::now();
        let out = if self.batch {
            self.calls.renew.fetch_add(1, Ordering::Relaxed);
            self.inner.renew_many(leases).await
        } else {
            let n = u64::try_from(leases.len()).unwrap_or(u64::MAX);
            self.calls.renew.fetch_add(n, Ordering::Relaxed);
            self.inner.renew_many(leases).await
        };
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.calls.renew_wall_ns.fetch_add(ns, Ordering::Relaxed);
        out
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        if self.watch {
            self.inner.watch(key).await
        } else {
            Ok(None)
        }
    }
}

/// One way of taking and giving back a lease, measured side by side with the others.
#[derive(Clone)]
pub(crate) enum Side {
    /// A bare or decorated [`LeaseStore`]: `acquire` then `release`.
    Store(Arc<dyn LeaseStore>),
    /// The supervisor users run: `Supervisor::acquire` then `LeaseGuard::release`.
    Supervisor(Box<Supervisor>),
    /// A hand-written protocol: the library's own ([`crate::raw`]) or the minimal floor.
    Proto(Arc<dyn Raw>),
}

impl Side {
    /// One acquire of the free key `k` (timed: the figure returned) and its release (untimed).
    async fn pair(
        &self,
        k: &LeaseKey,
        owner: &OwnerId,
        ttl: Duration,
    ) -> std::result::Result<Duration, Failure> {
        let t = Instant::now();
        match self {
            Side::Store(store) => {
                let r = store
                    .acquire(&AcquireRequest::new(k.clone(), owner.clone(), ttl))
                    .await
                    .map_err(|e| e.to_string())?;
                let took = t.elapsed();
                let lease = r.lease().ok_or_else(|| format!("{k} held"))?;
                let _ = store.release(&lease).await.map_err(|e| e.to_string())?;
                Ok(took)
            }
            Side::Supervisor(sup) => {
                let g = match sup.acquire(k).await.map_err(|e| e.to_string())? {
                    Acquisition::Acquired(g) => g,
                    other => return Err(format!("{k}: {other:?}")),
                };
                let took = t.elapsed();
                let _ = g.release().await.map_err(|e| e.to_string())?;
                Ok(took)
            }
            Side::Proto(raw) => {
                let g = raw
                    .acquire(k, &owner.to_string(), ttl)
                    .await?
                    .ok_or_else(|| format!("{k} held"))?;
                let took = t.elapsed();
                raw.release(&g).await?;
                Ok(took)
            }
        }
    }
}

// ---- 1. throughput -------------------------------------------------------------------------

/// One process's throughput run: each side's rate (acquire+release pairs per second) over the
/// whole run, and per round each side's rate in that round (`None` where the run ended before
/// the side's block, or no client finished a pair in it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Throughput {
    pub(crate) rates: Vec<std::result::Result<f64, Failure>>,
    pub(crate) rounds: Vec<Vec<Option<f64>>>,
}

/// Acquire+release pairs per second of every side, measured together: `clients` tasks switch
/// side every `block` (all at the same moments, so that all clients run the same side at
/// once, as in a run of its own), in the order [`round_order`] gives each round, each on keys
/// of its own. Every task times each of its pairs and adds it to the side and round it ran in;
/// a side's rate is the sum over the clients of pairs done / time spent on that side. Slow
/// drifts of a shared machine (another process's burst, a background compaction of the store)
/// then fall on all sides alike, which consecutive runs of each side cannot promise. Per round,
/// a side's rate is the clients' pairs over their time in its block, times the number of
/// clients: every round gives one paired ratio of any two sides ([`crate::stats`]).
pub(crate) async fn throughput_interleaved(
    sides: &[Side],
    ttl: Duration,
    ns: &str,
    clients: usize,
    run_for: Duration,
    block: Duration,
) -> Throughput {
    let n = sides.len().max(1);
    let start = Instant::now();
    let deadline = start + run_for;
    let block_ns = block.as_nanos().max(1);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let sides = sides.to_vec();
        let keys: Vec<LeaseKey> = (0..sides.len())
            .map(|i| key(ns, &format!("t{i}c{c}")))
            .collect();
        let owner = OwnerId::random();
        tasks.push(tokio::spawn(async move {
            // Per round, per side: (pairs, time).
            let mut done: Vec<Vec<(u64, Duration)>> = Vec::new();
            let mut order = (0u128, round_order(0, n));
            loop {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                let block_no = (now - start).as_nanos() / block_ns;
                let round = block_no / n as u128;
                let pos = usize::try_from(block_no % n as u128).unwrap_or(0);
                if order.0 != round {
                    order = (round, round_order(round, n));
                }
                let side = order.1[pos];
                sides[side]
                    .pair(&keys[side], &owner, ttl)
                    .await
                    .map_err(|e| (side, e))?;
                let r = usize::try_from(round).unwrap_or(usize::MAX);
                if done.len() <= r {
                    done.resize(r + 1, vec![(0, Duration::ZERO); sides.len()]);
                }
                done[r][side].0 += 1;
                done[r][side].1 += now.elapsed();
            }
            Ok::<_, (usize, Failure)>(done)
        }));
    }
    let mut rates: Vec<std::result::Result<f64, Failure>> = vec![Ok(0.0); sides.len()];
    // Per round, per side: Σ pairs, Σ time over the clients (a client that ran no pair in a
    // block adds nothing: the round's rate is that of the clients that ran, times `clients`).
    let mut rounds: Vec<Vec<(u64, Duration)>> = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(done)) => {
                for i in 0..sides.len() {
                    let pairs: u64 = done.iter().map(|r| r[i].0).sum();
                    let time: Duration = done.iter().map(|r| r[i].1).sum();
                    if let (Ok(r), true) = (&mut rates[i], pairs > 0) {
                        *r += rate(pairs, time);
                    }
                }
                if rounds.len() < done.len() {
                    rounds.resize(done.len(), vec![(0, Duration::ZERO); sides.len()]);
                }
                for (acc, r) in rounds.iter_mut().zip(&done) {
                    for (a, (pairs, time)) in acc.iter_mut().zip(r) {
                        *a = (a.0 + pairs, a.1 + *time);
                    }
                }
            }
            Ok(Err((side, e))) => {
                // The other sides' figures lost this client's share: no figures either.
                for (i, r) in rates.iter_mut().enumerate() {
                    *r = Err(if i == side {
                        e.clone()
                    } else {
                        format!("another side failed: {e}")
                    });
                }
            }
            Err(e) => rates.iter_mut().for_each(|r| *r = Err(e.to_string())),
        }
    }
    let clients_f = f64::from(u32::try_from(clients).unwrap_or(u32::MAX));
    let rounds = rounds
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|(pairs, time)| (pairs > 0).then(|| rate(pairs, time) * clients_f))
                .collect()
        })
        .collect();
    let rates = rates
        .into_iter()
        .map(|r| {
            r.and_then(|x| {
                if x > 0.0 {
                    Ok(x)
                } else {
                    Err("no pair done (the run was shorter than its blocks)".into())
                }
            })
        })
        .collect();
    Throughput { rates, rounds }
}

/// The order of the `n` sides in round `round`: the rows of a Williams design (a balanced Latin
/// square; for an odd `n`, the square and its mirror), in turn. Over `n` rounds (`2n` for an odd
/// `n`) every side takes every place once (twice) and follows every other side equally often
/// within a round. A fixed order would let whatever a block leaves behind (a table's pages, a
/// connection's caches, background work it set off on the server) fall on the same next side
/// in every round. Every client computes the same order from the round's number.
pub(crate) fn round_order(round: u128, n: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let period = if n.is_multiple_of(2) { n } else { 2 * n };
    let r = usize::try_from(round % period as u128).unwrap_or(0);
    // 0, 1, n-1, 2, n-2, ...
    let base = (0..n).map(|j| {
        if j % 2 == 1 {
            j.div_ceil(2)
        } else {
            (n - j / 2) % n
        }
    });
    let mut order: Vec<usize> = base.map(|b| (b + r % n) % n).collect();
    if r >= n {
        order.reverse();
    }
    order
}

fn rate(n: u64, d: Duration) -> f64 {
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    f64::from(n) / d.as_secs_f64().max(1e-9)
}

// ---- 1b. CPU per pair -----------------------------------------------------------------------

/// Where one side's acquire+release pairs spend their time, per pair, at one client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PairCost {
    /// Wall time per pair, in microseconds.
    pub(crate) wall_us: f64,
    /// This process's CPU per pair (every thread), in microseconds: the client's work.
    pub(crate) client_us: f64,
    /// The server processes' CPU per pair (every thread), in microseconds; `None` where the
    /// store runs in this process (SQLite) or its processes were not found.
    pub(crate) server_us: Option<f64>,
}

/// The CPU each side spends per acquire+release pair, on the client and on the server: one
/// client, one key per side, in blocks of `block` per side, the sides in turn (in the order
/// [`round_order`] gives each round), `rounds` times. Each block reads this process's and the server
/// processes' CPU time (`/proc/<pid>/task/*/schedstat`, nanoseconds) before and after it;
/// nothing else runs in this process meanwhile. A server's idle work during the block (Raft
/// heartbeats, `serverCron`) is counted too, the same per second on every side.
pub(crate) async fn cpu_per_pair(
    sides: &[Side],
    server: Option<&sys::ServerProcs>,
    ttl: Duration,
    ns: &str,
    block: Duration,
    rounds: usize,
) -> Vec<std::result::Result<PairCost, Failure>> {
    let n = sides.len();
    let owner = OwnerId::random();
    // Per side, one cost per pair per block: the median over the blocks is reported, so that a
    // block that met a periodic process of the server (a PostgreSQL checkpoint, an etcd
    // snapshot) does not move its side's figure.
    let mut acc: Vec<std::result::Result<Vec<PairCost>, Failure>> = vec![Ok(Vec::new()); n];
    for round in 0..rounds {
        for i in round_order(round as u128, n) {
            let Ok(costs) = &mut acc[i] else {
                continue;
            };
            let k = key(ns, &format!("c{i}"));
            let server_before = server.and_then(sys::ServerProcs::cpu);
            let client_before = sys::self_cpu();
            let start = Instant::now();
            let mut done = 0u64;
            let mut failed = None;
            while start.elapsed() < block {
                if let Err(e) = sides[i].pair(&k, &owner, ttl).await {
                    failed = Some(e);
                    break;
                }
                done += 1;
            }
            let elapsed = start.elapsed();
            let client_after = sys::self_cpu();
            let server_after = server.and_then(sys::ServerProcs::cpu);
            if let Some(e) = failed {
                acc[i] = Err(e);
                continue;
            }
            if done == 0 {
                continue;
            }
            let count = f64::from(u32::try_from(done).unwrap_or(u32::MAX));
            let per = |d: Duration| d.as_secs_f64() * 1e6 / count;
            costs.push(PairCost {
                wall_us: per(elapsed),
                client_us: per(client_after.saturating_sub(client_before)),
                server_us: match (server_before, server_after) {
                    (Some(b), Some(a)) => Some(per(a.saturating_sub(b))),
                    _ => None,
                },
            });
        }
    }
    acc.into_iter()
        .map(|r| {
            let costs = r?;
            if costs.is_empty() {
                return Err("no pair done".into());
            }
            Ok(median_cost(&costs))
        })
        .collect()
}

/// The median of each figure over the blocks (the upper median for an even count); the server
/// CPU only when every block read it.
fn median_cost(costs: &[PairCost]) -> PairCost {
    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
    let server: Option<Vec<f64>> = costs.iter().map(|c| c.server_us).collect();
    PairCost {
        wall_us: median(costs.iter().map(|c| c.wall_us).collect()),
        client_us: median(costs.iter().map(|c| c.client_us).collect()),
        server_us: server.map(median),
    }
}

// ---- 2. latency ----------------------------------------------------------------------------

/// One acquire latency of each side, in the order [`round_order`] gives round `round` (so no
/// side always goes first or after the same other side), added to `acc` (one list per side; a side that failed keeps its
/// error). The release after each acquire is not timed.
pub(crate) async fn latency_round(
    sides: &[Side],
    ttl: Duration,
    ns: &str,
    owner: &OwnerId,
    round: usize,
    acc: &mut [std::result::Result<Vec<Duration>, Failure>],
) {
    let n = sides.len();
    for i in round_order(round as u128, n) {
        if let Ok(v) = &mut acc[i] {
            match sides[i].pair(&key(ns, &format!("l{i}")), owner, ttl).await {
                Ok(d) => v.push(d),
                Err(e) => acc[i] = Err(e),
            }
        }
    }
}

/// The `q` quantile (0..=1) of `v`, in milliseconds.
pub(crate) fn quantile_ms(v: &[Duration], q: f64) -> f64 {
    let mut v: Vec<Duration> = v.to_vec();
    v.sort();
    if v.is_empty() {
        return f64::NAN;
    }
    let last = u32::try_from(v.len() - 1).unwrap_or(u32::MAX);
    let idx = (f64::from(last) * q).round();
    let idx = (0..v.len())
        .find(|i| f64::from(u32::try_from(*i).unwrap_or(u32::MAX)) >= idx)
        .unwrap_or(v.len() - 1);
    v[idx].as_secs_f64() * 1000.0
}

// ---- RTT -----------------------------------------------------------------------------------

/// The median of `n` pings (raw), or of `n` inspects of a free key (library, when no raw).
pub(crate) async fn rtt(
    raw: Option<&Arc<dyn Raw>>,
    store: &Arc<dyn LeaseStore>,
    ns: &str,
    n: usize,
) -> std::result::Result<f64, Failure> {
    let mut v = Vec::with_capacity(n);
    let k = key(ns, "rtt");
    for _ in 0..n {
        let t = Instant::now();
        match raw {
            Some(raw) => raw.ping().await?,
            None => {
                store.inspect(&k).await.map_err(|e| e.to_string())?;
            }
        }
        v.push(t.elapsed());
    }
    Ok(quantile_ms(&v, 0.5))
}

// ---- 3. takeover ---------------------------------------------------------------------------

/// Milliseconds from the holder's store-side expiry (estimated as the midpoint of its acquire
/// round trip plus the TTL) to the waiter's grant; the waiter is a supervisor waiting with the
/// store's watch (`watch`) or by bounded polling.
pub(crate) async fn takeover(
    store: &Arc<dyn LeaseStore>,
    ns: &str,
    rep: usize,
    watch: bool,
    ttl: Duration,
    floor: Option<&Arc<dyn Raw>>,
) -> (
    std::result::Result<f64, Failure>,
    Option<std::result::Result<f64, Failure>>,
) {
    let k = key(ns, &format!("to{rep}{}", if watch { "w" } else { "p" }));
    let floor_key = key(ns, &format!("to{rep}f"));
    let waiter_store: Arc<dyn LeaseStore> = Arc::new(Wrapped::new(store.clone(), watch));
    let sup = Supervisor::from_arc(
        waiter_store,
        SupervisorConfig::new(ttl).with_acquire_wait(ttl * 3 + Duration::from_secs(5)),
    );
    random_phase(Duration::from_millis(500)).await;
    let take = async {
        let sent = Instant::now();
        let holder = hold(store, &k, ttl, "takeover").await?;
        let received = Instant::now();
        // The holder "dies": it neither renews nor releases.
        drop(holder);
        let expiry = sent + (received - sent) / 2 + ttl;
        let guard = match sup.acquire(&k).await.map_err(|e| e.to_string())? {
            Acquisition::Acquired(g) => g,
            other => return Err(format!("the waiter did not take over: {other:?}")),
        };
        let granted = Instant::now();
        let _ = guard.release().await;
        Ok(signed_ms(granted, expiry))
    };
    // The store's own expiry delay, for a raw key granted at the same moment with the same
    // TTL, so that both expire in the same pass of the store's expiry process.
    let own = async {
        match floor {
            Some(raw) => raw.expiry_delay(&floor_key, ttl).await.transpose(),
            None => None,
        }
    };
    tokio::join!(take, own)
}

/// The line a holder process prints once granted: `granted <half its acquire round trip in µs>`.
pub(crate) const HOLDER_GRANTED: &str = "granted";

/// Takeover from a dead process: a holder in a process of its own (`holder`, given the key and
/// the TTL in milliseconds as its last two arguments) acquires the free key with its own
/// connections and reports its grant; it is killed with SIGKILL at once, and a supervisor of
/// this process (with the store's watch where it has one) waits for the key. Figure:
/// milliseconds from the store-side expiry (the midpoint of the holder's acquire round trip,
/// taken as the moment its report is read less half the round trip it measured, plus the TTL)
/// to the waiter's grant.
pub(crate) async fn takeover_killed(
    store: &Arc<dyn LeaseStore>,
    ns: &str,
    rep: usize,
    ttl: Duration,
    mut holder: tokio::process::Command,
) -> std::result::Result<f64, Failure> {
    use tokio::io::AsyncBufReadExt;
    let k = key(ns, &format!("tk{rep}"));
    let sup = Supervisor::from_arc(
        store.clone(),
        SupervisorConfig::new(ttl).with_acquire_wait(ttl * 3 + Duration::from_secs(5)),
    );
    random_phase(Duration::from_millis(500)).await;
    let mut child = holder
        .arg(k.as_str())
        .arg(ttl.as_millis().to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting the holder process: {e}"))?;
    let stdout = child.stdout.take().ok_or("the holder has no stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| "the holder did not report a grant within 30 s".to_string())?
        .map_err(|e| e.to_string())?
        .ok_or("the holder exited without a grant")?;
    let read_at = Instant::now();
    // SIGKILL: no release, no clean close of its connections.
    child.start_kill().map_err(|e| e.to_string())?;
    let _ = child.wait().await;
    let half_rtt = line
        .strip_prefix(HOLDER_GRANTED)
        .and_then(|us| us.trim().parse::<u64>().ok())
        .map(Duration::from_micros)
        .ok_or_else(|| format!("the holder said {line:?}"))?;
    let expiry = read_at - half_rtt + ttl;
    let guard = match sup.acquire(&k).await.map_err(|e| e.to_string())? {
        Acquisition::Acquired(g) => g,
        other => return Err(format!("the waiter did not take over: {other:?}")),
    };
    let granted = Instant::now();
    let _ = guard.release().await;
    Ok(signed_ms(granted, expiry))
}

/// The holder process of [`takeover_killed`]: acquires `key` for `ttl` on `store`, prints
/// [`HOLDER_GRANTED`] with half its acquire round trip, and waits to be killed (at most a
/// minute, in case its parent died first).
pub(crate) async fn hold_until_killed(
    store: &Arc<dyn LeaseStore>,
    key: &str,
    ttl: Duration,
) -> std::result::Result<(), Failure> {
    use std::io::Write as _;
    let k = LeaseKey::new(key).map_err(|e| e.to_string())?;
    let sent = Instant::now();
    hold(store, &k, ttl, "takeover-from-a-process").await?;
    let half = (Instant::now() - sent) / 2;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{HOLDER_GRANTED} {}", half.as_micros()).map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    drop(out);
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

/// A fresh owner's grant of `k`, which must be free (`what` names the measurement in errors).
async fn hold(
    store: &Arc<dyn LeaseStore>,
    k: &LeaseKey,
    ttl: Duration,
    what: &str,
) -> std::result::Result<leasehold_core::Lease, Failure> {
    store
        .acquire(&AcquireRequest::new(k.clone(), OwnerId::random(), ttl))
        .await
        .map_err(|e| e.to_string())?
        .lease()
        .ok_or_else(|| format!("{what} key held"))
}

fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        (later - earlier).as_secs_f64() * 1000.0
    } else {
        -(earlier - later).as_secs_f64() * 1000.0
    }
}

// ---- 4. handoff ----------------------------------------------------------------------------

/// Milliseconds from the holder's release call to the waiting supervisor's grant.
pub(crate) async fn handoff(
    store: &Arc<dyn LeaseStore>,
    ns: &str,
    rep: usize,
    watch: bool,
) -> std::result::Result<f64, Failure> {
    let ttl = legal_ttl(&store.capabilities(), Duration::from_secs(10));
    let k = key(ns, &format!("ho{rep}{}", if watch { "w" } else { "p" }));
    let holder = hold(store, &k, ttl, "handoff").await?;
    let counted = Arc::new(Wrapped::new(store.clone(), watch));
    let calls = counted.calls.clone();
    let sup = Supervisor::from_arc(
        counted,
        SupervisorConfig::new(ttl).with_acquire_wait(ttl * 2),
    );
    let waiter = tokio::spawn(async move {
        let r = sup.acquire(&k).await;
        let at = Instant::now();
        (r, at)
    });
    // Let the waiter make its first attempt and settle into waiting.
    let settle = Instant::now() + Duration::from_secs(10);
    while calls.acquires() == 0 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let _ = store.release(&holder).await.map_err(|e| e.to_string())?;
    let (r, at) = waiter.await.map_err(|e| e.to_string())?;
    match r.map_err(|e| e.to_string())? {
        Acquisition::Acquired(g) => {
            let _ = g.release().await;
        }
        other => return Err(format!("the waiter was not granted: {other:?}")),
    }
    Ok(signed_ms(at, t0))
}

/// The handoff floor of the raw protocol: milliseconds of one release immediately followed by
/// the next owner's acquire, back to back on one task (a waiter woken by a perfect, free
/// notification could do no better); one figure per repetition.
pub(crate) async fn handoff_floor(
    raw: &Arc<dyn Raw>,
    caps: &Capabilities,
    ns: &str,
    name: &str,
    reps: usize,
) -> std::result::Result<Vec<Duration>, Failure> {
    let ttl = legal_ttl(caps, Duration::from_secs(10));
    let k = key(ns, name);
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        let first = raw
            .acquire(&k, &OwnerId::random().to_string(), ttl)
            .await?
            .ok_or("raw handoff-floor key held")?;
        let t = Instant::now();
        raw.release(&first).await?;
        let next = raw
            .acquire(&k, &OwnerId::random().to_string(), ttl)
            .await?
            .ok_or("raw handoff floor: the released key was not granted")?;
        out.push(t.elapsed());
        raw.release(&next).await?;
    }
    Ok(out)
}

/// The raw protocol's handoff with its own notification: a raw waiter subscribed through the
/// store's mechanism ([`Raw::subscribe`]) tries a raw acquire on every hint; figure: from the
/// start of the raw release to the waiter's grant, one per repetition. `None` where the store
/// has no notification.
pub(crate) async fn handoff_notified(
    raw: &Arc<dyn Raw>,
    caps: &Capabilities,
    ns: &str,
    reps: usize,
) -> std::result::Result<Option<Vec<Duration>>, Failure> {
    let ttl = legal_ttl(caps, Duration::from_secs(10));
    let k = key(ns, "hn");
    let Some(mut hints) = raw.subscribe(&k).await? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        let first = raw
            .acquire(&k, &OwnerId::random().to_string(), ttl)
            .await?
            .ok_or("raw notified-handoff key held")?;
        let (waiter_raw, waiter_key) = (raw.clone(), k.clone());
        let waiter = tokio::spawn(async move {
            let deadline = Instant::now() + ttl * 2;
            let owner = OwnerId::random().to_string();
            // As the supervisor: subscribed first, then an attempt, then a wait for a hint (a
            // store may notify only releases that follow a refused attempt: PostgreSQL does).
            let granted = loop {
                match waiter_raw.acquire(&waiter_key, &owner, ttl).await {
                    Ok(Some(g)) => break Ok((Instant::now(), g)),
                    Ok(None) => {}
                    Err(e) => break Err(e),
                }
                match tokio::time::timeout_at(deadline, hints.recv()).await {
                    Err(_) => break Err("no notification let the raw waiter in".to_string()),
                    Ok(None) => break Err("the subscription ended".to_string()),
                    Ok(Some(())) => {}
                }
            };
            (hints, granted)
        });
        // As in `handoff`: the waiter settles (hints of the first acquire are spent on failed
        // attempts) before the release.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t0 = Instant::now();
        raw.release(&first).await?;
        let (back, granted) = waiter.await.map_err(|e| e.to_string())?;
        hints = back;
        let (at, next) = granted?;
        out.push(at.duration_since(t0));
        raw.release(&next).await?;
    }
    Ok(Some(out))
}

/// A pause of a pseudo-random length in `0..max`, so that repetitions do not lock onto a
/// periodic process of the store (etcd revokes expired leases on a fixed tick: a holder that
/// always acquires just after the previous tick always expires just after a tick too).
pub(crate) async fn random_phase(max: Duration) {
    let seed = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0),
    );
    let max_ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
    // splitmix64 of the clock's nanoseconds: plenty for spreading a phase.
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    tokio::time::sleep(Duration::from_nanos(z % max_ns)).await;
}

// ---- 5. renewal load -----------------------------------------------------------------------

/// What the renewal-load run measured.
#[derive(Debug, Clone)]
pub(crate) struct RenewalLoad {
    pub(crate) leases: usize,
    pub(crate) ttl: Duration,
    pub(crate) window: Duration,
    pub(crate) acquire_spread: Duration,
    pub(crate) intervals: u32,
    pub(crate) round_trips_per_interval: f64,
    /// Wall time spent inside `renew_many` per interval (summed over overlapping calls).
    pub(crate) renew_wall_ms_per_interval: f64,
    /// Requests counted by the server over the same span, where it counts them.
    pub(crate) server_requests_per_interval: Option<f64>,
    pub(crate) cpu_ms_per_interval: f64,
    pub(crate) rss_bytes_per_lease: f64,
    pub(crate) still_held: usize,
}

/// Holds `n` leases through one supervisor with renewal batching and counts `renew_many` calls
/// (one call = one round trip where the store batches) over `intervals` renewal intervals.
pub(crate) async fn renewal_load(
    store: &Arc<dyn LeaseStore>,
    raw: Option<&Arc<dyn Raw>>,
    ns: &str,
    n: usize,
    ttl: Duration,
    intervals: u32,
    batch: bool,
) -> std::result::Result<RenewalLoad, Failure> {
    let ttl = legal_ttl(&store.capabilities(), ttl);
    let interval = ttl / 3;
    let window = interval / 20;
    let calls = Arc::new(Calls::default());
    let sup = Supervisor::from_arc(
        Arc::new(Wrapped {
            inner: store.clone(),
            watch: true,
            batch,
            calls: calls.clone(),
        }),
        SupervisorConfig::new(ttl)
            .with_renewal_batching(window)
            .with_acquire_wait(Duration::from_secs(5)),
    );
    if let Some(r) = raw
        && let Some(waited) = r.settle().await?
    {
        eprintln!("  renewal load: waited {waited} before counting");
    }
    let rss0 = sys::rss_bytes();
    let start = Instant::now();
    let keys: Vec<LeaseKey> = (0..n).map(|i| key(ns, &format!("rn{i}"))).collect();
    let results: Vec<_> = futures::stream::iter(keys.iter().map(|k| sup.acquire(k)))
        .buffer_unordered(64)
        .collect()
        .await;
    let acquire_spread = start.elapsed();
    let mut guards = Vec::with_capacity(n);
    let mut first_err = None;
    for r in results {
        match r {
            Ok(Acquisition::Acquired(g)) => guards.push(g),
            Ok(other) => first_err = first_err.or(Some(format!("{other:?}"))),
            Err(e) => first_err = first_err.or(Some(e.to_string())),
        }
    }
    let rss1 = sys::rss_bytes();
    if let Some(e) = first_err {
        release_all(guards).await;
        return Err(format!("acquiring {n} leases: {e}"));
    }
    // Warm up one interval (the first renewals), or as many whole intervals as the server's
    // counter needs to have counted every acquisition, then count.
    tokio::time::sleep(interval * warm_up_intervals(raw, interval) + window * 2).await;
    let calls0 = calls.renews();
    let wall0 = calls.renew_wall();
    let server0 = match raw {
        Some(r) => r.server_requests().await?,
        None => None,
    };
    let cpu0 = sys::cpu_time();
    if std::env::var_os("LEASE_BENCH_TRACE").is_some() {
        let end = Instant::now() + interval * intervals;
        while Instant::now() < end {
            tokio::time::sleep(interval / 10).await;
            eprintln!(
                "  renew calls so far: {} at +{:?}",
                calls.renews() - calls0,
                start.elapsed()
            );
        }
    } else {
        tokio::time::sleep(interval * intervals).await;
    }
    let calls1 = calls.renews();
    let wall1 = calls.renew_wall();
    let cpu1 = sys::cpu_time();
    let server1 = match raw {
        Some(r) => r.server_requests().await?,
        None => None,
    };
    let still_held = guards.iter().filter(|g| g.may_act()).count();
    release_all(guards).await;
    let renew_calls = u32::try_from(calls1 - calls0).unwrap_or(u32::MAX);
    let leases_f = f64::from(u32::try_from(n.max(1)).unwrap_or(u32::MAX));
    let grown = rss1.saturating_sub(rss0);
    Ok(RenewalLoad {
        leases: n,
        ttl,
        window,
        acquire_spread,
        intervals,
        round_trips_per_interval: f64::from(renew_calls) / f64::from(intervals),
        renew_wall_ms_per_interval: wall1.saturating_sub(wall0).as_secs_f64() * 1000.0
            / f64::from(intervals),
        server_requests_per_interval: server0
            .zip(server1)
            .map(|(a, b)| requests_per_interval(a, b, intervals)),
        cpu_ms_per_interval: cpu1.saturating_sub(cpu0).as_secs_f64() * 1000.0
            / f64::from(intervals),
        rss_bytes_per_lease: f64::from(u32::try_from(grown).unwrap_or(u32::MAX)) / leases_f,
        still_held,
    })
}

async fn release_all(guards: Vec<leasehold_core::supervisor::LeaseGuard>) {
    futures::stream::iter(guards.into_iter().map(|g| g.release()))
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
}

/// Whole intervals of warm-up before a server count starts: one, or enough for the server's
/// counter to have counted everything sent before the warm-up ([`Raw::counter_delay`]), so that
/// a burst of acquisitions is not counted as steady-state traffic.
pub(crate) fn warm_up_intervals(raw: Option<&Arc<dyn Raw>>, interval: Duration) -> u32 {
    let delay = raw.map_or(Duration::ZERO, |r| r.counter_delay());
    let n = delay.as_nanos().div_ceil(interval.as_nanos().max(1));
    u32::try_from(n).unwrap_or(u32::MAX).max(1)
}

/// Requests per interval between two readings of [`Raw::server_requests`], which leaves out its
/// own reads: the difference is the requests sent in between, nothing to subtract.
pub(crate) fn requests_per_interval(before: u64, after: u64, intervals: u32) -> f64 {
    let d = u32::try_from(after.saturating_sub(before)).unwrap_or(u32::MAX);
    f64::from(d) / f64::from(intervals.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease that takes `acquire` to grant (in tokio's clock) and no time to release.
    struct Timed {
        acquire: Duration,
    }

    #[async_trait]
    impl Raw for Timed {
        fn ping_name(&self) -> &'static str {
            "none"
        }
        async fn acquire(
            &self,
            key: &LeaseKey,
            owner: &str,
            _ttl: Duration,
        ) -> crate::raw::R<Option<crate::raw::RawGrant>> {
            tokio::time::sleep(self.acquire).await;
            Ok(Some(crate::raw::RawGrant {
                key: key.clone(),
                owner: owner.to_string(),
                token: 1,
                lock: None,
                object: None,
            }))
        }
        async fn release(&self, _: &crate::raw::RawGrant) -> crate::raw::R<()> {
            Ok(())
        }
        async fn ping(&self) -> crate::raw::R<()> {
            Ok(())
        }
        async fn version(&self) -> crate::raw::R<String> {
            Ok(String::new())
        }
    }

    /// The whole path from the interleaved run to the verdict, in paused time: a side that is
    /// deliberately 10% slower than the floor is missed against 0.95, and the same side against
    /// a copy of itself (A/A) gives an interval around 1 that meets it.
    #[tokio::test(start_paused = true)]
    async fn a_deliberately_slower_side_is_missed_and_an_aa_pair_is_not() {
        let side = |ms: u64| {
            Side::Proto(Arc::new(Timed {
                acquire: Duration::from_micros(ms),
            }))
        };
        // library (11 ms), minimal (10 ms), the minimal's A/A copy (10 ms); tokio's timer counts
        // whole milliseconds.
        let sides = [side(11_000), side(10_000), side(10_000)];
        let mut groups = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = throughput_interleaved(
                &sides,
                Duration::from_secs(10),
                "t",
                2,
                Duration::from_secs(9),
                Duration::from_millis(200),
            )
            .await;
            assert!(t.rates.iter().all(Result::is_ok), "{:?}", t.rates);
            let ratio = |a: usize, b: usize| -> Vec<f64> {
                t.rounds
                    .iter()
                    .filter_map(|r| Some(r[a]? / r[b]?))
                    .collect()
            };
            groups.0.push(ratio(0, 1));
            groups.1.push(ratio(2, 1));
        }
        let slow = crate::stats::ratio_interval(&groups.0, 1).expect("rounds");
        assert!(slow.n >= 3 * 14, "{slow:?}");
        assert!((slow.est - 1.0 / 1.1).abs() < 0.02, "{slow:?}");
        assert_eq!(
            crate::stats::Outcome::at_least(&slow, 0.95),
            crate::stats::Outcome::Missed,
            "{slow:?}"
        );
        let aa = crate::stats::ratio_interval(&groups.1, 1).expect("rounds");
        assert!(aa.lo <= 1.0 && 1.0 <= aa.hi, "{aa:?}");
        assert_eq!(
            crate::stats::Outcome::at_least(&aa, 0.95),
            crate::stats::Outcome::Met,
            "{aa:?}"
        );
    }

    fn cost(wall: f64, server: Option<f64>) -> PairCost {
        PairCost {
            wall_us: wall,
            client_us: wall / 2.0,
            server_us: server,
        }
    }

    /// One block that met a checkpoint does not move a side's figure; a block without a server
    /// reading leaves the server figure out rather than biased.
    #[test]
    fn a_slow_block_does_not_decide_the_cost() {
        let blocks = [
            cost(100.0, Some(50.0)),
            cost(900.0, Some(700.0)),
            cost(110.0, Some(55.0)),
        ];
        let m = median_cost(&blocks);
        assert!((m.wall_us - 110.0).abs() < 1e-9);
        assert!((m.client_us - 55.0).abs() < 1e-9);
        assert_eq!(m.server_us, Some(55.0));
        let m = median_cost(&[cost(100.0, Some(50.0)), cost(120.0, None)]);
        assert_eq!(m.server_us, None);
        assert!((m.wall_us - 120.0).abs() < 1e-9);
    }

    /// Every round's order is a permutation, the same for every caller, and within the rounds
    /// of a throughput run each side follows every other side equally often and comes first and
    /// last.
    #[test]
    fn round_orders_are_permutations_that_vary_who_follows_whom() {
        let n = SIDES.len();
        let rounds = 2 * n as u128; // one period (16 s in blocks of 200 ms: 16 rounds)
        let mut follows = std::collections::HashMap::new();
        let (mut first, mut last) = (vec![0; n], vec![0; n]);
        for r in 0..rounds {
            let order = round_order(r, n);
            assert_eq!(order, round_order(r, n), "deterministic");
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "round {r}: {order:?}");
            first[order[0]] += 1;
            last[order[n - 1]] += 1;
            for w in order.windows(2) {
                *follows.entry((w[0], w[1])).or_insert(0) += 1;
            }
        }
        let counts: Vec<usize> = follows.values().copied().collect();
        assert_eq!(
            follows.len(),
            n * (n - 1),
            "some side never follows another: {follows:?}"
        );
        let (lo, hi) = (counts.iter().min(), counts.iter().max());
        assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "{follows:?}");
        assert!(
            first.iter().chain(&last).all(|&c| c > 0),
            "{first:?} {last:?}"
        );
        assert_eq!(round_order(0, 1), vec![0]);
        assert!(round_order(0, 0).is_empty());
    }
}
