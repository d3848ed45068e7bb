//! The five measurements, over any [`LeaseStore`] (library side) and a [`Raw`] protocol.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lease_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
use lease_core::{
    AcquireOutcome, AcquireRequest, Capabilities, KeyState, KeyWatch, Lease, LeaseKey, LeaseStore,
    OwnerId, ReleaseOutcome, RenewOutcome, Result,
};
use lease_testkit::faulty::{FaultyStore, Operation};
use tokio::time::Instant;

use crate::raw::Raw;
use crate::sys;

type Failure = String;

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

/// A forwarding store that can hide its watch (the supervisor then waits by bounded polling)
/// and its batched renewal (`renew_many` then renews one by one through [`LeaseStore::renew`],
/// as the trait's default does, so a counting store below sees every request).
#[derive(Debug)]
pub(crate) struct Wrapped {
    pub(crate) inner: Arc<dyn LeaseStore>,
    pub(crate) watch: bool,
    pub(crate) batch: bool,
}

impl Wrapped {
    pub(crate) fn no_watch(inner: Arc<dyn LeaseStore>) -> Self {
        Wrapped {
            inner,
            watch: false,
            batch: true,
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
        self.inner.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        self.inner.inspect(key).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        if self.batch {
            return self.inner.renew_many(leases).await;
        }
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            match self.inner.renew(lease).await {
                Err(e) if !e.is_invalid_input() => return Err(e),
                r => out.push(r),
            }
        }
        Ok(out)
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        if self.watch {
            self.inner.watch(key).await
        } else {
            Ok(None)
        }
    }
}

// ---- 1. throughput -------------------------------------------------------------------------

/// Acquire+release pairs per second through the library and through the raw protocol, measured
/// together: `clients` tasks switch between the two sides every `block` (all at the same
/// moments, so that all clients run the same side at once, as in a run of its own), each on
/// its own keys. Every task times each of its pairs and adds it to the side it ran on; a side's
/// rate is the sum over the clients of pairs done / time spent on that side. Slow drifts of a
/// shared machine (another process's burst, a background compaction of the store) then fall on
/// both sides alike, which consecutive runs of each side cannot promise. Without a raw
/// protocol the library runs the whole time.
pub(crate) async fn throughput_interleaved(
    store: &Arc<dyn LeaseStore>,
    raw: Option<&Arc<dyn Raw>>,
    ns: &str,
    clients: usize,
    run_for: Duration,
    block: Duration,
) -> (
    std::result::Result<f64, Failure>,
    Option<std::result::Result<f64, Failure>>,
    Option<f64>,
) {
    let ttl = legal_ttl(&store.capabilities(), Duration::from_secs(10));
    let start = Instant::now();
    let deadline = start + run_for;
    let block_ns = block.as_nanos().max(1);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let store = store.clone();
        let raw = raw.cloned();
        let req = AcquireRequest::new(key(ns, &format!("tl{c}")), OwnerId::random(), ttl);
        let raw_key = key(ns, &format!("tr{c}"));
        let raw_owner = OwnerId::random().to_string();
        tasks.push(tokio::spawn(async move {
            // [library, raw A, raw B]: (pairs, time)
            let mut sides = [(0u64, Duration::ZERO); 3];
            loop {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                let block_no = (now - start).as_nanos() / block_ns;
                let raw_turn = raw.is_some() && block_no.is_multiple_of(2);
                // Raw blocks alternate between two halves, A and B, whose ratio (A/A) shows
                // how far two measurements of the same protocol differ in this run.
                let half = if (block_no / 2).is_multiple_of(2) {
                    1
                } else {
                    2
                };
                if let (true, Some(raw)) = (raw_turn, raw.as_ref()) {
                    let g = raw
                        .acquire(&raw_key, &raw_owner, ttl)
                        .await
                        .map_err(|e| (1, e))?
                        .ok_or_else(|| (1, format!("raw acquire of {raw_key} refused")))?;
                    raw.release(&g).await.map_err(|e| (1, e))?;
                    sides[half].0 += 1;
                    sides[half].1 += now.elapsed();
                } else {
                    let lease = match store.acquire(&req).await.map_err(|e| (0, e.to_string()))? {
                        AcquireOutcome::Acquired(l) => l,
                        AcquireOutcome::Held(h) => {
                            return Err((0, format!("held by {}", h.owner)));
                        }
                    };
                    let _ = store
                        .release(&lease)
                        .await
                        .map_err(|e| (0, e.to_string()))?;
                    sides[0].0 += 1;
                    sides[0].1 += now.elapsed();
                }
            }
            Ok::<_, (usize, Failure)>(sides)
        }));
    }
    let mut rates = [Ok(0.0), Ok(0.0)];
    // Σ over the clients of the halves' rates; `None` once a client did not run both halves.
    let mut halves = Some((0.0, 0.0));
    for t in tasks {
        match t.await {
            Ok(Ok([l, a, b])) => {
                let raw_all = (a.0 + b.0, a.1 + b.1);
                for (r, (n, d)) in rates.iter_mut().zip([l, raw_all]) {
                    if let (Ok(r), true) = (r, n > 0) {
                        *r += rate(n, d);
                    }
                }
                halves = match halves {
                    Some((x, y)) if a.0 > 0 && b.0 > 0 => {
                        Some((x + rate(a.0, a.1), y + rate(b.0, b.1)))
                    }
                    _ => None,
                };
            }
            Ok(Err((side, e))) => {
                // The other side's figure lost this client's share: no figure either.
                rates[1 - side] = Err(format!("the other side failed: {e}"));
                rates[side] = Err(e);
            }
            Err(e) => rates = [Err(e.to_string()), Err(e.to_string())],
        }
    }
    let [lib, rawr] = rates;
    let aa = halves
        .filter(|(_, b)| *b > 0.0)
        .map(|(a, b)| a / b)
        .filter(|_| raw.is_some());
    (lib, raw.map(|_| rawr), aa)
}

fn rate(n: u64, d: Duration) -> f64 {
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    f64::from(n) / d.as_secs_f64().max(1e-9)
}

// ---- 2. latency ----------------------------------------------------------------------------

/// Acquire latencies (the release after each is not timed).
pub(crate) async fn latency_lib(
    store: &Arc<dyn LeaseStore>,
    ns: &str,
    samples: usize,
) -> std::result::Result<Vec<Duration>, Failure> {
    let ttl = legal_ttl(&store.capabilities(), Duration::from_secs(10));
    let req = AcquireRequest::new(key(ns, "ll"), OwnerId::random(), ttl);
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        let r = store.acquire(&req).await.map_err(|e| e.to_string())?;
        out.push(t.elapsed());
        let lease = r.lease().ok_or("latency key held")?;
        let _ = store.release(&lease).await.map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Raw acquire latencies.
pub(crate) async fn latency_raw(
    raw: &Arc<dyn Raw>,
    caps: &Capabilities,
    ns: &str,
    samples: usize,
) -> std::result::Result<Vec<Duration>, Failure> {
    let ttl = legal_ttl(caps, Duration::from_secs(10));
    let k = key(ns, "lr");
    let owner = OwnerId::random().to_string();
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        let g = raw.acquire(&k, &owner, ttl).await?;
        out.push(t.elapsed());
        raw.release(&g.ok_or("raw latency key held")?).await?;
    }
    Ok(out)
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

/// The `q` quantile of `v` taken as `rounds` consecutive equal rounds: the best (lowest) of the
/// rounds' quantiles, in milliseconds, as throughput takes the best of its rounds.
pub(crate) fn best_quantile_ms(v: &[Duration], rounds: usize, q: f64) -> f64 {
    let per = v.len() / rounds.max(1);
    if per == 0 {
        return quantile_ms(v, q);
    }
    v.chunks_exact(per)
        .map(|c| quantile_ms(c, q))
        .fold(f64::INFINITY, f64::min)
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
    let waiter_store: Arc<dyn LeaseStore> = if watch {
        store.clone()
    } else {
        Arc::new(Wrapped::no_watch(store.clone()))
    };
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

/// A fresh owner's grant of `k`, which must be free (`what` names the measurement in errors).
async fn hold(
    store: &Arc<dyn LeaseStore>,
    k: &LeaseKey,
    ttl: Duration,
    what: &str,
) -> std::result::Result<lease_core::Lease, Failure> {
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
    let inner: Arc<dyn LeaseStore> = if watch {
        store.clone()
    } else {
        Arc::new(Wrapped::no_watch(store.clone()))
    };
    let counted = FaultyStore::new(inner);
    let sup = Supervisor::from_arc(
        Arc::new(counted.clone()),
        SupervisorConfig::new(ttl).with_acquire_wait(ttl * 2),
    );
    let waiter = tokio::spawn(async move {
        let r = sup.acquire(&k).await;
        let at = Instant::now();
        (r, at)
    });
    // Let the waiter make its first attempt and settle into waiting.
    let settle = Instant::now() + Duration::from_secs(10);
    while counted.calls(Operation::Acquire) == 0 && Instant::now() < settle {
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
    reps: usize,
) -> std::result::Result<Vec<Duration>, Failure> {
    let ttl = legal_ttl(caps, Duration::from_secs(10));
    let k = key(ns, "hf");
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
            let granted = loop {
                match tokio::time::timeout_at(deadline, hints.recv()).await {
                    Err(_) => break Err("no notification let the raw waiter in".to_string()),
                    Ok(None) => break Err("the subscription ended".to_string()),
                    Ok(Some(())) => {}
                }
                match waiter_raw.acquire(&waiter_key, &owner, ttl).await {
                    Ok(Some(g)) => break Ok((Instant::now(), g)),
                    Ok(None) => {}
                    Err(e) => break Err(e),
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
    let counted = FaultyStore::new(store.clone());
    let sup = Supervisor::from_arc(
        Arc::new(Wrapped {
            inner: Arc::new(counted.clone()),
            watch: true,
            batch,
        }),
        SupervisorConfig::new(ttl)
            .with_renewal_batching(window)
            .with_acquire_wait(Duration::from_secs(5)),
    );
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
    // Warm up one interval (the first renewals), then count.
    tokio::time::sleep(interval + window * 2).await;
    let calls0 = counted.calls(Operation::Renew);
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
                counted.calls(Operation::Renew) - calls0,
                start.elapsed()
            );
        }
    } else {
        tokio::time::sleep(interval * intervals).await;
    }
    let calls1 = counted.calls(Operation::Renew);
    let cpu1 = sys::cpu_time();
    let server1 = match raw {
        Some(r) => r.server_requests().await?,
        None => None,
    };
    let still_held = guards.iter().filter(|g| g.may_act()).count();
    release_all(guards).await;
    let calls = u32::try_from(calls1 - calls0).unwrap_or(u32::MAX);
    let leases_f = f64::from(u32::try_from(n.max(1)).unwrap_or(u32::MAX));
    let grown = rss1.saturating_sub(rss0);
    Ok(RenewalLoad {
        leases: n,
        ttl,
        window,
        acquire_spread,
        intervals,
        round_trips_per_interval: f64::from(calls) / f64::from(intervals),
        // The two counter reads themselves are one request each (Redis counts the first INFO).
        server_requests_per_interval: server0.zip(server1).map(|(a, b)| {
            let d = u32::try_from(b.saturating_sub(a).saturating_sub(1)).unwrap_or(u32::MAX);
            f64::from(d) / f64::from(intervals)
        }),
        cpu_ms_per_interval: cpu1.saturating_sub(cpu0).as_secs_f64() * 1000.0
            / f64::from(intervals),
        rss_bytes_per_lease: f64::from(u32::try_from(grown).unwrap_or(u32::MAX)) / leases_f,
        still_held,
    })
}

async fn release_all(guards: Vec<lease_core::supervisor::LeaseGuard>) {
    futures::stream::iter(guards.into_iter().map(|g| g.release()))
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
}
