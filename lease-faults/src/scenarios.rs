//! The fault scenarios. Each runs unchanged against any [`Target`] and returns what it measured;
//! a violated safety property is an `Err` naming it.

use std::sync::Arc;
use std::time::Duration;

use lease_core::supervisor::{Health, Supervisor, SupervisorConfig};
use lease_core::{
    AcquireOutcome, AcquireRequest, FencedResource, FencingToken, LeaseKey, LeaseStore, OwnerId,
    WriteOp,
};
use lease_testkit::history::{History, Op};
use lease_testkit::proxy::{FaultProxy, Mode};
use tokio::time::{Instant, sleep, timeout};

use crate::child::{HolderProcess, Signal, holder_bin};
use crate::resource::ResourceServer;
use crate::target::Target;

/// What a scenario measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Measured {
    /// Faults injected.
    pub faults: u64,
    /// Stale writes the resource accepted (must be 0).
    pub stale_accepted: u64,
    /// Tokens that went back (must be 0).
    pub regressions: u64,
    /// Time between the holder reporting loss and anyone else being granted the key.
    pub margin: Option<Duration>,
    /// Healthy holders that lost their lease while the store still held it.
    pub false_expiries: u64,
    /// Time from the holder's death (or loss) to the next grant.
    pub takeover: Option<Duration>,
}

type Outcome = Result<Measured, String>;

fn key(name: &str) -> LeaseKey {
    // A fresh entropy-seeded generator: storms seed their own generators, and a namespace must
    // never repeat across runs (leftover records of an earlier run would collide).
    let mut rng = fastrand::Rng::new();
    let mut ns = String::from("lf");
    for _ in 0..10 {
        ns.push(rng.alphanumeric().to_ascii_lowercase());
    }
    LeaseKey::new(format!("{ns}-{name}")).expect("legal key")
}

fn e2s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Retries acquiring through `store` every 10 ms until granted or `within` passes.
async fn grant(
    store: &dyn LeaseStore,
    key: &LeaseKey,
    owner: &OwnerId,
    ttl: Duration,
    within: Duration,
) -> Result<(lease_core::Lease, Instant), String> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Ok(AcquireOutcome::Acquired(l))) = timeout(
            Duration::from_secs(5),
            store.acquire(&AcquireRequest::new(key.clone(), owner.clone(), ttl)),
        )
        .await
        {
            return Ok((l, Instant::now()));
        }
        if Instant::now() >= deadline {
            return Err(format!("{key} not granted within {within:?}"));
        }
        sleep(Duration::from_millis(10)).await;
    }
}

fn bound(t: &Target) -> Duration {
    t.ttl * 3 + t.takeover_slack + Duration::from_secs(5)
}

/// 3. A blackhole between holder and store: the holder reports `Lost` strictly before the store
///    grants the key to anyone else; the margin is measured.
pub async fn blackhole(t: &Target) -> Outcome {
    partition(t, Mode::Blackhole).await
}

/// 4. Renewals applied but their responses lost: never reported `Held` past the local deadline,
///    and `Lost` before anyone else is granted the key.
pub async fn lost_renewal_responses(t: &Target) -> Outcome {
    partition(t, Mode::DropResponses).await
}

async fn partition(t: &Target, mode: Mode) -> Outcome {
    let k = key("partition");
    let proxy = FaultProxy::start(t.upstream()).await.map_err(e2s)?;
    let holder = t.connect_via(proxy.addr()).await.map_err(e2s)?;
    let observer = t.connect().await.map_err(e2s)?;
    let sup = Supervisor::from_arc(holder, SupervisorConfig::new(t.ttl));
    let guard = sup
        .acquire(&k)
        .await
        .map_err(e2s)?
        .guard()
        .ok_or("holder did not acquire a free key")?;
    sleep(t.ttl / 2).await; // at least one renewal goes through
    if guard.health() != Health::Held {
        return Err(format!("healthy holder not Held: {:?}", guard.health()));
    }
    let mut rx = guard.subscribe();
    proxy.set_mode(mode);
    let b = OwnerId::with_label("observer");
    let (lost, granted) = tokio::join!(
        async {
            let mut last_held_deadline = None;
            loop {
                let h = *rx.borrow_and_update();
                if h == Health::Held {
                    last_held_deadline = Some(guard.lease().deadline());
                }
                if h.is_final() {
                    return (h, Instant::now(), last_held_deadline);
                }
                if rx.changed().await.is_err() {
                    return (guard.health(), Instant::now(), last_held_deadline);
                }
            }
        },
        grant(&*observer, &k, &b, t.ttl, bound(t))
    );
    proxy.heal();
    let (health, lost_at, _) = lost;
    let (next, granted_at) = granted?;
    if !matches!(health, Health::Lost(_)) {
        return Err(format!("holder ended {health:?}, expected Lost"));
    }
    // Safety: the store may grant the key to someone else only after the holder's own local
    // deadline, from which on the holder no longer acts (`may_act()` checks it on the spot).
    let deadline = guard.lease().deadline();
    if granted_at <= deadline {
        return Err(format!(
            "SAFETY: the store granted the key {:?} before the holder's local deadline",
            deadline - granted_at
        ));
    }
    // Timeliness: the supervisor publishes `Lost` before its deadline and before anyone else is
    // granted the key. On a CPU-starved host its timer can fire late; that is reported as a
    // failure of its own kind, not as a safety violation.
    if lost_at >= deadline {
        return Err(format!(
            "late loss report: Lost published {:?} after the holder's local deadline",
            lost_at - deadline
        ));
    }
    if granted_at <= lost_at {
        return Err(format!(
            "late loss report: Lost published {:?} after the store granted the key",
            lost_at - granted_at
        ));
    }
    let m = Measured {
        faults: 1,
        margin: Some(granted_at - lost_at),
        takeover: Some(granted_at - lost_at),
        ..Measured::default()
    };
    if next.token() <= guard.token() {
        return Err(format!(
            "token went back: {} after {}",
            next.token(),
            guard.token()
        ));
    }
    Ok(m)
}

/// 5. An acquisition applied but its response lost (a ghost grant): it expires, and the next
///    grant's token is greater than the ghost's.
pub async fn ghost_grant(t: &Target) -> Outcome {
    let k = key("ghost");
    let proxy = FaultProxy::start(t.upstream()).await.map_err(e2s)?;
    let client = t.connect_via(proxy.addr()).await.map_err(e2s)?;
    client.inspect(&k).await.map_err(e2s)?; // the connection is up before the fault
    let observer = t.connect().await.map_err(e2s)?;
    proxy.set_mode(Mode::DropResponses);
    let ghost = OwnerId::with_label("ghost");
    let r = timeout(
        t.ttl,
        client.acquire(&AcquireRequest::new(k.clone(), ghost.clone(), t.ttl)),
    )
    .await;
    if let Ok(Ok(AcquireOutcome::Acquired(_))) = r {
        return Err("the acquire response arrived through a proxy dropping responses".into());
    }
    proxy.heal();
    let seen = observer.inspect(&k).await.map_err(e2s)?;
    let ghost_token = seen
        .holder
        .as_ref()
        .filter(|h| h.owner == ghost)
        .map(|h| h.token)
        .or(seen.last_token);
    let (next, _) = grant(
        &*observer,
        &k,
        &OwnerId::with_label("next"),
        t.ttl,
        bound(t),
    )
    .await?;
    let m = Measured {
        faults: 1,
        ..Measured::default()
    };
    if let Some(g) = ghost_token
        && next.token() <= g
    {
        return Err(format!(
            "token reused after a ghost grant: {} <= {g}",
            next.token()
        ));
    }
    Ok(m)
}

/// 7. Latency near the TTL: a holder gives up by its deadline; counts false expiries (a healthy
///    holder losing while the store still held its lease).
pub async fn latency_near_ttl(t: &Target) -> Outcome {
    let k = key("latency");
    let proxy = FaultProxy::start(t.upstream()).await.map_err(e2s)?;
    let holder = t.connect_via(proxy.addr()).await.map_err(e2s)?;
    let observer = t.connect().await.map_err(e2s)?;
    let sup = Supervisor::from_arc(holder, SupervisorConfig::new(t.ttl));
    let guard = sup
        .acquire(&k)
        .await
        .map_err(e2s)?
        .guard()
        .ok_or("not acquired")?;
    proxy.set_mode(Mode::Latency(t.ttl / 5));
    let end = Instant::now() + t.ttl * 4;
    let mut m = Measured {
        faults: 1,
        ..Measured::default()
    };
    let lost = timeout(end.saturating_duration_since(Instant::now()), guard.lost()).await;
    if let Ok(Health::Lost(_)) = lost {
        let lost_at = Instant::now();
        if lost_at >= guard.lease().deadline() {
            return Err("lost reported after the local deadline".into());
        }
        let still = observer.inspect(&k).await.map_err(e2s)?;
        if still
            .holder
            .as_ref()
            .is_some_and(|h| h.token == guard.token())
        {
            m.false_expiries += 1;
        }
    }
    proxy.heal();
    Ok(m)
}

/// 1. A holder process paused beyond its TTL, then resumed: another owner has taken over with a
///    greater token; the resumed holder's write is rejected; it reports `Lost` on resume and starts
///    no side effect after its deadline.
pub async fn paused_process(t: &Target) -> Outcome {
    let k = key("paused");
    let res = ResourceServer::start().await.map_err(e2s)?;
    let (mut child, old) = start_holder(t, &k, &res).await?;
    child
        .wait_for(Duration::from_secs(10), |v| {
            v["event"] == "write" && v["accepted"] == true
        })
        .await?;
    child.signal(Signal::Stop).map_err(e2s)?;
    let stopped = Instant::now();
    let store = t.connect().await.map_err(e2s)?;
    let (lease, granted_at) =
        grant(&*store, &k, &OwnerId::with_label("b"), t.ttl * 10, bound(t)).await?;
    if lease.token() <= old {
        return Err(format!("token went back: {} after {old}", lease.token()));
    }
    let installed = res
        .resource()
        .install(&k, lease.token())
        .await
        .map_err(e2s)?;
    let wrote = res
        .resource()
        .write(&k, lease.token(), WriteOp::Add(1))
        .await
        .map_err(e2s)?;
    if !installed.is_accepted() || !wrote.is_accepted() {
        return Err(format!(
            "the new holder's token was refused: {installed:?} {wrote:?}"
        ));
    }
    child.signal(Signal::Cont).map_err(e2s)?;
    let late = child
        .wait_for(Duration::from_secs(30), |v| v["event"] == "late_write")
        .await?;
    let _ = child.finish(Duration::from_secs(10)).await;
    let m = Measured {
        faults: 1,
        takeover: Some(granted_at - stopped),
        ..Measured::default()
    };
    if late["accepted"] == true {
        return Err("SAFETY: the resumed holder's stale write was accepted".into());
    }
    let lost_idx = child
        .events
        .iter()
        .position(|v| v["event"] == "lost")
        .ok_or("the holder never reported Lost")?;
    let resumed_idx = child
        .events
        .iter()
        .position(|v| v["event"] == "resumed")
        .unwrap_or(lost_idx);
    if child.events[resumed_idx..lost_idx]
        .iter()
        .any(|v| v["event"] == "side_effect")
    {
        return Err(format!(
            "side effect after resuming, before reporting Lost: {:?}",
            child.events
        ));
    }
    if child
        .events
        .iter()
        .any(|v| v["event"] == "side_effect" && v["within_deadline"] == false)
    {
        return Err("a side effect started after the local deadline".into());
    }
    Ok(m)
}

/// Starts a holder process on `k` and waits until it reports its grant; returns it and its token.
async fn start_holder(
    t: &Target,
    k: &LeaseKey,
    res: &ResourceServer,
) -> Result<(HolderProcess, FencingToken), String> {
    let args = [
        "--url".to_string(),
        t.url(t.upstream()).map_err(e2s)?,
        "--key".into(),
        k.to_string(),
        "--ttl-ms".into(),
        t.ttl.as_millis().to_string(),
        "--resource".into(),
        res.addr().to_string(),
    ];
    let mut child = HolderProcess::spawn(&holder_bin(), &args)
        .map_err(|e| format!("spawning {}: {e}", holder_bin()))?;
    let acquired = child
        .wait_for(Duration::from_secs(30), |v| v["event"] == "acquired")
        .await?;
    let token = FencingToken::new(acquired["token"].as_u64().ok_or("no token")?).map_err(e2s)?;
    Ok((child, token))
}

/// 2. A holder process killed without releasing: another owner takes over within the TTL plus a
///    small bound, with a greater token.
pub async fn killed_process(t: &Target) -> Outcome {
    let k = key("killed");
    let res = ResourceServer::start().await.map_err(e2s)?;
    let (child, old) = start_holder(t, &k, &res).await?;
    child.signal(Signal::Kill).map_err(e2s)?;
    let killed = Instant::now();
    let store = t.connect().await.map_err(e2s)?;
    let (lease, at) = grant(&*store, &k, &OwnerId::with_label("b"), t.ttl, bound(t)).await?;
    let took = at - killed;
    if lease.token() <= old {
        return Err(format!("token went back: {} after {old}", lease.token()));
    }
    let limit = t.ttl + t.takeover_slack + Duration::from_millis(500);
    if took > limit {
        return Err(format!("takeover took {took:?}, more than {limit:?}"));
    }
    Ok(Measured {
        faults: 1,
        takeover: Some(took),
        ..Measured::default()
    })
}

/// 8. A randomized storm: in-process contenders, each behind its own fault proxy, race for one
///    key for `rounds` rounds while faults from the list above are injected at random; every holder
///    increments a counter through the fenced resource. The recorded history is checked against a
///    fenced-mutex model and the counter is exact.
pub async fn storm(t: &Target, seed: u64, contenders: usize, rounds: usize) -> Outcome {
    let k = key("storm");
    let res = Arc::new(lease_core::MemoryFencedResource::new());
    let history = History::new();
    let mut proxies = Vec::new();
    let mut tasks = Vec::new();
    let faults = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for i in 0..contenders {
        let proxy = Arc::new(FaultProxy::start(t.upstream()).await.map_err(e2s)?);
        proxies.push(proxy.clone());
        let store = t.connect_via(proxy.addr()).await.map_err(e2s)?;
        let (k, res, history, ttl) = (k.clone(), res.clone(), history.clone(), t.ttl);
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_add(i as u64));
        let faults = faults.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("c{i}");
            let sup =
                Supervisor::from_arc(store, SupervisorConfig::new(ttl).with_acquire_wait(ttl * 3));
            let mut acked = 0i64;
            for _ in 0..rounds {
                let t0 = Instant::now();
                let guard = match sup.acquire(&k).await {
                    Ok(a) => match a.guard() {
                        Some(g) => g,
                        None => continue,
                    },
                    Err(_) => continue,
                };
                history.record(
                    &name,
                    &k,
                    t0,
                    Op::Granted {
                        owner: sup.owner().clone(),
                        token: guard.token(),
                        deadline: guard.lease().deadline(),
                    },
                );
                // Sometimes this contender's network fails while it holds the lease.
                if rng.u8(0..4) == 0 {
                    let mode = match rng.u8(0..4) {
                        0 => Mode::Blackhole,
                        1 => Mode::DropResponses,
                        2 => Mode::Reset,
                        _ => Mode::Latency(ttl / 4),
                    };
                    faults.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    proxy.set_mode(mode);
                }
                for _ in 0..rng.u8(1..4) {
                    if !guard.may_act() {
                        break;
                    }
                    let t0 = Instant::now();
                    let out = res
                        .write(&k, guard.token(), WriteOp::Add(1))
                        .await
                        .map_err(e2s)?;
                    history.record(
                        &name,
                        &k,
                        t0,
                        Op::Write {
                            token: guard.token(),
                            accepted: out.is_accepted(),
                        },
                    );
                    if out.is_accepted() {
                        acked += 1;
                    }
                    sleep(Duration::from_millis(rng.u64(5..30))).await;
                }
                let t0 = Instant::now();
                if let Health::Lost(_) = guard.health() {
                    history.record(
                        &name,
                        &k,
                        t0,
                        Op::RenewLost {
                            token: guard.token(),
                        },
                    );
                } else {
                    history.record(
                        &name,
                        &k,
                        t0,
                        Op::Release {
                            token: guard.token(),
                        },
                    );
                }
                let _ = timeout(ttl * 2, guard.release()).await;
                proxy.heal();
            }
            Ok::<i64, String>(acked)
        }));
    }
    let mut acked = 0;
    for task in tasks {
        acked += task.await.map_err(e2s)??;
    }
    let state = res.read(&k).await.map_err(e2s)?;
    let violations = history.check();
    let m = Measured {
        faults: faults.load(std::sync::atomic::Ordering::Relaxed),
        ..Measured::default()
    };
    if state.counter != acked {
        return Err(format!(
            "seed {seed}: counter {} but {acked} acknowledged writes\n{}",
            state.counter,
            history.dump()
        ));
    }
    if !violations.is_empty() {
        return Err(format!("seed {seed}: {violations:#?}\n{}", history.dump()));
    }
    drop(proxies);
    Ok(m)
}
