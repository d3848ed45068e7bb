//! The fault scenarios. Each runs unchanged against any [`Target`] and returns what it measured;
//! a violated safety property is a typed [`Violation`] in the result, and `Err` is kept for
//! failures of the test itself (a service that cannot be reached, a holder that never started).

use std::time::Duration;

use leasehold_core::supervisor::{Health, Supervisor, SupervisorConfig};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, FencingToken, LeaseKey, LeaseStore, OwnerId,
    WriteOp,
};
use leasehold_testkit::history::{Verdict, Violation, ViolationKind};
use tokio::time::{Instant, sleep, timeout};

use crate::child::{HolderProcess, Signal, holder_bin};
use crate::link::LinkFault;
use crate::resource::ResourceServer;
use crate::target::Target;

/// What a scenario or storm measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Measured {
    /// Faults injected.
    pub faults: u64,
    /// The safety violations found, each naming its kind.
    pub violations: Vec<Violation>,
    /// Time between the holder reporting loss and anyone else being granted the key.
    pub margin: Option<Duration>,
    /// In storms: for every grant that followed a holder's loss report, the time from that
    /// report to the grant.
    pub margins: Vec<Duration>,
    /// At each loss report, the time the store itself still held the lease (its own expiry, read
    /// by `inspect`): a lower bound of the margin between the report and the store's expiry.
    pub store_margins: Vec<Duration>,
    /// Healthy holders that lost their lease while the store still held it.
    pub false_expiries: u64,
    /// Time from the holder's death (or loss) to the next grant.
    pub takeover: Option<Duration>,
    /// Confirmed renewals recorded in the history.
    pub renewals: u64,
    /// Operations of unknown outcome recorded in the history.
    pub unknown: u64,
    /// The history, when it holds a violation.
    pub history: Option<String>,
    /// Reads of the store by a client without faults (at every loss report, in storms) that
    /// could not be carried out: an error, a timeout or a panicked probe task. Each is a check
    /// that did not happen.
    pub failed_probes: u64,
    /// In process storms: steps of a holder's wall clock, and how many of them the holder's
    /// reported wall clock showed.
    pub clock_steps: u64,
    /// See [`clock_steps`](Self::clock_steps).
    pub clock_steps_seen: u64,
    /// In storms and process storms with the resource's own record ([`crate::record`]): the
    /// accepted writes it held.
    pub recorded: u64,
}

impl Measured {
    /// The violations counted by kind.
    pub fn verdict(&self) -> Verdict {
        Verdict::of(&self.violations)
    }

    fn violation(mut self, kind: ViolationKind, detail: impl Into<String>) -> Self {
        self.violations.push(Violation::new(kind, detail));
        self
    }
}

type Outcome = Result<Measured, String>;

/// A key in a fresh namespace.
pub(crate) fn fresh_key(name: &str) -> LeaseKey {
    // A fresh entropy-seeded generator: storms seed their own generators, and a namespace must
    // never repeat across runs (leftover records of an earlier run would collide).
    let mut rng = fastrand::Rng::new();
    let mut ns = String::from("lf");
    for _ in 0..10 {
        ns.push(rng.alphanumeric().to_ascii_lowercase());
    }
    LeaseKey::new(format!("{ns}-{name}")).expect("legal key")
}

fn key(name: &str) -> LeaseKey {
    fresh_key(name)
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
) -> Result<(leasehold_core::Lease, Instant), String> {
    let deadline = Instant::now() + within;
    let mut attempts = 0u32;
    let mut last: String;
    loop {
        attempts += 1;
        match timeout(
            Duration::from_secs(5),
            store.acquire(&AcquireRequest::new(key.clone(), owner.clone(), ttl)),
        )
        .await
        {
            Ok(Ok(AcquireOutcome::Acquired(l))) => return Ok((l, Instant::now())),
            Ok(Ok(AcquireOutcome::Held(h))) => last = format!("held: {h:?}"),
            Ok(Err(e)) => last = format!("error: {e}"),
            Err(_) => last = "the acquire timed out after 5 s".to_string(),
        }
        if Instant::now() >= deadline {
            // Why, so that a run without a verdict can be told apart from a store that never
            // lets go (`docs/faults.md` lists the reasons).
            return Err(format!(
                "{key} not granted within {within:?} ({attempts} attempts; the last: {last})"
            ));
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
    partition(t, LinkFault::Blackhole).await
}

/// 4. Renewals applied but their responses lost: never reported `Held` past the local deadline,
///    and `Lost` before anyone else is granted the key.
pub async fn lost_renewal_responses(t: &Target) -> Outcome {
    partition(t, LinkFault::DropResponses).await
}

async fn partition(t: &Target, mode: LinkFault) -> Outcome {
    let k = key("partition");
    let (holder, proxy) = t.faulty_client().await.map_err(e2s)?;
    let observer = t.connect().await.map_err(e2s)?;
    let inspector = t.connect().await.map_err(e2s)?;
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
    proxy.set(mode);
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
                    break;
                }
                if rx.changed().await.is_err() {
                    break;
                }
            }
            // The store's own view at the loss report: how long it still holds the lease.
            let at = Instant::now();
            let seen = timeout(Duration::from_secs(2), inspector.inspect(&k)).await;
            (guard.health(), at, last_held_deadline, seen, at.elapsed())
        },
        grant(&*observer, &k, &b, t.ttl, bound(t))
    );
    proxy.heal();
    let (health, lost_at, _, seen, took) = lost;
    let (next, granted_at) = granted?;
    if !matches!(health, Health::Lost(_)) {
        return Err(format!("holder ended {health:?}, expected Lost"));
    }
    let mut m = Measured {
        faults: 1,
        ..Measured::default()
    };
    // Loss before expiry, against the store: the store must still hold the lease when the holder
    // reports the loss (its remaining time is a lower bound of the margin).
    if let Ok(Ok(state)) = seen {
        match state.holder.as_ref().filter(|h| h.token == guard.token()) {
            Some(h) => m.store_margins.push(h.remaining),
            None => {
                m = m.violation(
                    ViolationKind::LateLoss,
                    format!(
                        "the store no longer held the lease when Lost was reported (inspected within {took:?}): {state:?}"
                    ),
                );
            }
        }
    }
    // Safety: the store may grant the key to someone else only after the holder's own local
    // deadline, from which on the holder no longer acts (`may_act()` checks it on the spot). A
    // grant at the deadline's very instant counts as overlapping.
    let deadline = guard.lease().deadline();
    if granted_at <= deadline {
        m = m.violation(
            ViolationKind::OverlappingBelief,
            format!(
                "the store granted the key {:?} before the holder's local deadline",
                deadline - granted_at
            ),
        );
    }
    // Timeliness: the supervisor publishes `Lost` strictly before its deadline and before anyone
    // else is granted the key.
    if lost_at >= deadline {
        m = m.violation(
            ViolationKind::LateLoss,
            format!(
                "Lost published {:?} after the holder's local deadline",
                lost_at - deadline
            ),
        );
    } else if granted_at <= lost_at {
        m = m.violation(
            ViolationKind::LateLoss,
            format!(
                "Lost published {:?} after the store granted the key",
                lost_at - granted_at
            ),
        );
    } else {
        m.margin = Some(granted_at - lost_at);
        m.takeover = Some(granted_at - lost_at);
    }
    if next.token() <= guard.token() {
        m = m.violation(
            ViolationKind::TokenRegression,
            format!("token went back: {} after {}", next.token(), guard.token()),
        );
    }
    Ok(m)
}

/// 5. An acquisition applied but its response lost (a ghost grant): it expires, and the next
///    grant's token is greater than the ghost's.
pub async fn ghost_grant(t: &Target) -> Outcome {
    let k = key("ghost");
    let (client, proxy) = t.faulty_client().await.map_err(e2s)?;
    client.inspect(&k).await.map_err(e2s)?; // the connection is up before the fault
    let observer = t.connect().await.map_err(e2s)?;
    proxy.set(LinkFault::DropResponses);
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
    let mut m = Measured {
        faults: 1,
        ..Measured::default()
    };
    if let Some(g) = ghost_token
        && next.token() <= g
    {
        m = m.violation(
            ViolationKind::TokenRegression,
            format!("token reused after a ghost grant: {} <= {g}", next.token()),
        );
    }
    Ok(m)
}

/// 7. Latency near the TTL: a holder gives up by its deadline; counts false expiries (a healthy
///    holder losing while the store still held its lease).
pub async fn latency_near_ttl(t: &Target) -> Outcome {
    let k = key("latency");
    let (holder, proxy) = t.faulty_client().await.map_err(e2s)?;
    let observer = t.connect().await.map_err(e2s)?;
    let sup = Supervisor::from_arc(holder, SupervisorConfig::new(t.ttl));
    let guard = sup
        .acquire(&k)
        .await
        .map_err(e2s)?
        .guard()
        .ok_or("not acquired")?;
    proxy.set(LinkFault::Latency(t.ttl / 5 * 2));
    let end = Instant::now() + t.ttl * 4;
    let mut m = Measured {
        faults: 1,
        ..Measured::default()
    };
    let lost = timeout(end.saturating_duration_since(Instant::now()), guard.lost()).await;
    if let Ok(Health::Lost(_)) = lost {
        let lost_at = Instant::now();
        if lost_at >= guard.lease().deadline() {
            m = m.violation(
                ViolationKind::LateLoss,
                "Lost reported at or after the local deadline",
            );
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
    let regression = (lease.token() <= old).then(|| {
        Violation::new(
            ViolationKind::TokenRegression,
            format!("token went back: {} after {old}", lease.token()),
        )
    });
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
    // Writes the resource accepted up to the new holder's write: any accepted after it came from
    // the stale holder.
    let accepted_before = res.resource().read(&k).await.map_err(e2s)?.accepted;
    child.signal(Signal::Cont).map_err(e2s)?;
    let late = child
        .wait_for(Duration::from_secs(30), |v| v["event"] == "late_write")
        .await?;
    let _ = child.finish(Duration::from_secs(10)).await;
    let mut m = Measured {
        faults: 1,
        takeover: Some(granted_at - stopped),
        ..Measured::default()
    };
    let accepted_after = res.resource().read(&k).await.map_err(e2s)?.accepted;
    if accepted_after > accepted_before {
        m = m.violation(
            ViolationKind::StaleWriteAccepted,
            format!(
                "the resource accepted {} write(s) of the resumed holder after the new holder's: {:?}",
                accepted_after - accepted_before,
                child.events
            ),
        );
    } else if late["accepted"] == true {
        // Its late write was accepted, but before the new token reached the resource: the holder
        // lost its lease (on an overloaded host) and wrote late before it was paused, so this run
        // never tested a resumed holder. Rightly accepted; no verdict either way.
        return Err(format!(
            "the holder lost its lease before it was paused (its late write preceded the new grant and was rightly accepted); events: {:?}",
            child.events
        ));
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
    m.violations.extend(regression);
    if child.events[resumed_idx..lost_idx]
        .iter()
        .any(|v| v["event"] == "side_effect")
    {
        m = m.violation(
            ViolationKind::WriteAfterDeadline,
            format!(
                "side effect after resuming, before reporting Lost: {:?}",
                child.events
            ),
        );
    }
    if child
        .events
        .iter()
        .any(|v| v["event"] == "side_effect" && v["within_deadline"] == false)
    {
        m = m.violation(
            ViolationKind::WriteAfterDeadline,
            "a side effect started after the local deadline",
        );
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
        t.direct_url(),
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
    let limit = t.ttl + t.takeover_slack + Duration::from_millis(500);
    if took > limit {
        return Err(format!("takeover took {took:?}, more than {limit:?}"));
    }
    let mut m = Measured {
        faults: 1,
        takeover: Some(took),
        ..Measured::default()
    };
    if lease.token() <= old {
        m = m.violation(
            ViolationKind::TokenRegression,
            format!("token went back: {} after {old}", lease.token()),
        );
    }
    Ok(m)
}
