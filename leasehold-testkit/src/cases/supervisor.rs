//! The renewal supervisor and leader election on a real store (real time, short TTLs).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use leasehold_core::election::{Election, ElectionEvent};
use leasehold_core::supervisor::{Health, LossReason, Supervisor, SupervisorConfig};
use leasehold_core::{FencingToken, LeaseStore, OwnerId, ReleaseOutcome};
use tokio::time::Instant;

use super::Case;
use crate::faulty::{Fault, FaultyStore, Operation};
use crate::{CaseResult, Ctx};
use leasehold_core::supervisor::Acquisition;

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!("supervisor", supervisor_renews_past_the_ttl),
        crate::case!("supervisor", supervisor_refused_renewal_is_lost_at_once),
        crate::case!(
            "supervisor",
            supervisor_hanging_store_is_lost_before_the_deadline
        ),
        crate::case!("supervisor", supervisor_drop_releases_in_the_background),
        crate::case!(
            "supervisor",
            supervisor_dropped_acquire_releases_what_it_was_granted
        ),
        crate::case!("supervisor", supervisor_waiter_is_woken_by_the_release)
            .needs(&[super::Need::Watch]),
        crate::case!(
            "election",
            election_one_leader_at_a_time_with_increasing_terms
        ),
        crate::case!(
            "election",
            election_resign_hands_over_without_waiting_for_the_ttl
        ),
    ]
}

fn sup(store: Arc<dyn LeaseStore>, ttl: Duration) -> Supervisor {
    Supervisor::from_arc(store, SupervisorConfig::new(ttl))
}

/// The supervisor keeps a short lease for several TTLs by renewing it.
pub async fn supervisor_renews_past_the_ttl(ctx: Ctx) -> CaseResult {
    let key = ctx.key("sup-renew");
    let ttl = ctx.short_ttl();
    let guard = sup(ctx.store().clone(), ttl)
        .acquire(&key)
        .await?
        .guard()
        .ok_or("not acquired")?;
    let end = Instant::now() + ttl * 3;
    while Instant::now() < end {
        tokio::time::sleep(ttl / 4).await;
        assert_eq!(
            guard.health(),
            Health::Held,
            "health changed while the store was healthy"
        );
    }
    let h = ctx
        .store()
        .inspect(&key)
        .await?
        .holder
        .ok_or("lease expired despite renewals")?;
    assert_eq!(h.token, guard.token());
    assert_eq!(
        guard.release().await?,
        leasehold_core::ReleaseOutcome::Released
    );
    assert!(ctx.store().inspect(&key).await?.holder.is_none());
    Ok(())
}

/// A refused renewal (the token was superseded) is `Lost` at the next renewal, and the guarded
/// work is cancelled.
pub async fn supervisor_refused_renewal_is_lost_at_once(ctx: Ctx) -> CaseResult {
    let key = ctx.key("sup-refused");
    let ttl = ctx.long_ttl();
    let cfg = SupervisorConfig::new(ttl).with_renew_interval(Duration::from_millis(200));
    let s = Supervisor::from_arc(ctx.store().clone(), cfg);
    let guard = s.acquire(&key).await?.guard().ok_or("not acquired")?;
    let other = ctx.other_client().await?;
    let newer = ctx.must_acquire_with(&*other, &key, s.owner(), ttl).await?;
    assert!(newer.token() > guard.token());
    let t0 = Instant::now();
    let h = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .map_err(|_| "not lost within 10 s")?;
    assert_eq!(h, Health::Lost(LossReason::RenewalRefused));
    assert!(guard.cancellation().is_cancelled());
    assert!(Instant::now() - t0 < Duration::from_secs(5));
    // The newer grant is untouched.
    assert_eq!(
        ctx.store().inspect(&key).await?.holder.map(|h| h.token),
        Some(newer.token())
    );
    Ok(())
}

/// A store that stops answering renewals drives `Held -> AtRisk -> Lost` before the local
/// deadline, and the guarded work is cancelled at that moment.
pub async fn supervisor_hanging_store_is_lost_before_the_deadline(ctx: Ctx) -> CaseResult {
    let key = ctx.key("sup-hang");
    let ttl = ctx.short_ttl();
    let faulty = FaultyStore::new(ctx.store().clone());
    let guard = sup(Arc::new(faulty.clone()), ttl)
        .acquire(&key)
        .await?
        .guard()
        .ok_or("not acquired")?;
    faulty.set(Operation::Renew, Fault::Hang);
    let mut rx = guard.subscribe();
    let mut seen = vec![];
    let work = guard.run(std::future::pending::<()>());
    let watch = async {
        while !rx.borrow().is_final() {
            if rx.changed().await.is_err() {
                break;
            }
            seen.push(*rx.borrow());
        }
    };
    let (result, ()) = tokio::time::timeout(ttl * 3 + Duration::from_secs(5), async {
        tokio::join!(work, watch)
    })
    .await
    .map_err(|_| "not lost in time")?;
    let lost_at = Instant::now();
    assert_eq!(result, Err(LossReason::DeadlineReached));
    assert_eq!(seen.first(), Some(&Health::AtRisk), "{seen:?}");
    assert_eq!(
        seen.last(),
        Some(&Health::Lost(LossReason::DeadlineReached))
    );
    assert!(
        lost_at < guard.lease().deadline() + Duration::from_millis(20),
        "lost after the local deadline"
    );
    Ok(())
}

/// Dropping a guard without releasing frees the key promptly (long before its TTL).
pub async fn supervisor_drop_releases_in_the_background(ctx: Ctx) -> CaseResult {
    let key = ctx.key("sup-drop");
    let guard = sup(ctx.store().clone(), ctx.long_ttl())
        .acquire(&key)
        .await?
        .guard()
        .ok_or("not acquired")?;
    let token = guard.token();
    drop(guard);
    let other = ctx.other_client().await?;
    let b = OwnerId::with_label("b");
    let next = ctx
        .acquire_within(&*other, &key, &b, ctx.long_ttl(), Duration::from_secs(10))
        .await?;
    assert!(next.token() > token);
    Ok(())
}

/// Polls a future at most `polls` times, each time after it woke its task (the first at once),
/// and gives it up (unfinished) after that: `Some(output)` if it finished within `polls` polls.
/// Each poll after a wake-up moves it past the await point it was waiting at, so giving it up
/// after n = 0, 1, 2, ... polls drops it at each of its await points in turn.
struct PollAtMost<'a, T> {
    fut: Pin<Box<dyn Future<Output = T> + Send + 'a>>,
    polls: usize,
}

impl<T> Future for PollAtMost<'_, T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if self.polls == 0 {
            return Poll::Ready(None);
        }
        self.polls -= 1;
        self.fut.as_mut().poll(cx).map(Some)
    }
}

/// Dropping [`Supervisor::acquire`], [`Supervisor::try_acquire`], [`Supervisor::run`] or a
/// fenced `acquire` at any of its await points leaves nothing behind: for n = 0, 1, 2, ... the
/// call is polled n times by hand (each after a wake-up) and dropped, until an n at which it
/// finishes; after each drop another owner, on its own client, must acquire the key within
/// two op timeouts plus a second (a grant that lands after the drop is released in the
/// background), never the 30 s TTL. Each n uses a key of its own.
pub async fn supervisor_dropped_acquire_releases_what_it_was_granted(ctx: Ctx) -> CaseResult {
    const MAX_POLLS: usize = 500;
    let ttl = ctx.long_ttl();
    let op = Duration::from_secs(2);
    let bound = op * 2 + Duration::from_secs(1);
    let cfg = SupervisorConfig::new(ttl).with_op_timeout(op);
    let plain = Supervisor::from_arc(ctx.store().clone(), cfg.clone());
    let fenced = Supervisor::from_arc(ctx.store().clone(), cfg)
        .with_fence_on_acquire(ctx.resource().clone());
    let other = ctx.other_client().await?;
    let b = OwnerId::with_label("other");
    for (i, call) in ["acquire", "try_acquire", "run", "fenced acquire"]
        .into_iter()
        .enumerate()
    {
        let mut finished = false;
        for polls in 0..=MAX_POLLS {
            let key = ctx.key(&format!("drop{i}-{polls}"));
            let fut: Pin<Box<dyn Future<Output = leasehold_core::Result<Option<_>>> + Send + '_>> =
                match call {
                    "acquire" => Box::pin(async { plain.acquire(&key).await.map(|a| a.guard()) }),
                    "try_acquire" => {
                        Box::pin(async { plain.try_acquire(&key).await.map(|a| a.guard()) })
                    }
                    "run" => Box::pin(async { plain.run(&key, |_| async {}).await.map(|_| None) }),
                    _ => Box::pin(async { fenced.acquire(&key).await.map(|a| a.guard()) }),
                };
            let out = PollAtMost { fut, polls }.await;
            if let Some(result) = out {
                if let Some(guard) = result? {
                    let released = guard.release().await?;
                    if released != ReleaseOutcome::Released {
                        return Err(
                            format!("{call} finished; its release said {released:?}").into()
                        );
                    }
                }
                finished = true;
            }
            let t0 = Instant::now();
            let next = ctx
                .acquire_within(&*other, &key, &b, ttl, bound)
                .await
                .map_err(|e| {
                    format!(
                        "{call} dropped after {polls} polls: another owner could not acquire: {}",
                        e.message().unwrap_or("no message")
                    )
                })?;
            let waited = t0.elapsed();
            let released = other.release(&next).await?;
            if released != ReleaseOutcome::Released {
                return Err(format!("the other owner's release said {released:?}").into());
            }
            if waited > bound {
                return Err(format!(
                    "{call} dropped after {polls} polls: the key was free only after {waited:?}"
                )
                .into());
            }
            if finished {
                break;
            }
        }
        if !finished {
            return Err(format!("{call} did not finish within {MAX_POLLS} polls").into());
        }
    }
    Ok(())
}

/// A supervisor waiting for a held key (needs [`Need::Watch`](super::Need::Watch)) is let in
/// by the holder's release through the store's watch, not by its own retry timer: its backoff
/// here is longer than the holder's TTL, so without a wake-up it would retry only when the
/// holder's lease expires (30 s). It must be granted within 10 s of the release, after at most
/// one attempt per hint (the first refusal, the retry after opening the watch, the grant, and
/// one spare for a watch that reports the holder's own state once).
pub async fn supervisor_waiter_is_woken_by_the_release(ctx: Ctx) -> CaseResult {
    let key = ctx.key("sup-wake");
    let ttl = ctx.long_ttl();
    let holder = ctx
        .must_acquire(&key, &OwnerId::with_label("holder"), ttl)
        .await?;
    let counted = Arc::new(FaultyStore::new(ctx.other_client().await?));
    let sup = Supervisor::from_arc(
        counted.clone(),
        SupervisorConfig::new(ttl)
            .with_acquire_wait(ttl * 2)
            .with_backoff(ttl * 4, ttl * 4),
    );
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move { sup.acquire(&key).await })
    };
    // The waiter has settled once it was refused twice (before and after opening its watch).
    let settle = Instant::now() + Duration::from_secs(10);
    while counted.calls(Operation::Acquire) < 2 {
        if Instant::now() >= settle {
            return Err("the waiter did not make its first two attempts within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if waiter.is_finished() {
        return Err("the waiter finished while the key was held".into());
    }
    let before = counted.calls(Operation::Acquire);
    assert_eq!(
        ctx.store().release(&holder).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    let guard = match tokio::time::timeout(Duration::from_secs(10), waiter).await {
        Err(_) => {
            return Err(format!(
                "the waiter was not woken by the release: no grant within 10 s \
                 ({} acquire attempts; its own retry would come at the holder's expiry)",
                counted.calls(Operation::Acquire)
            )
            .into());
        }
        Ok(joined) => match joined.map_err(|e| e.to_string())?? {
            Acquisition::Acquired(g) => g,
            other => return Err(format!("the waiter was not granted: {other:?}").into()),
        },
    };
    let attempts = counted.calls(Operation::Acquire);
    if attempts > 4 {
        return Err(format!(
            "the waiter made {attempts} acquire attempts ({before} before the release): \
             more than one per hint"
        )
        .into());
    }
    assert!(
        guard.token() > holder.token(),
        "the waiter's token did not increase"
    );
    let _ = guard.release().await?;
    Ok(())
}

/// Three candidates, the leader repeatedly cut off from the store: exactly one leader at a time,
/// strictly increasing terms.
pub async fn election_one_leader_at_a_time_with_increasing_terms(ctx: Ctx) -> CaseResult {
    let key = ctx.key("elect");
    let ttl = ctx.short_ttl();
    let cfg = SupervisorConfig::new(ttl).with_acquire_wait(ttl);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut stores = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let f = FaultyStore::new(ctx.other_client().await?);
        stores.push(f.clone());
        let mut c =
            Election::new(f, key.clone(), cfg.clone()).join(OwnerId::with_label(&format!("c{i}")));
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(ev) = c.next_event().await {
                let _ = tx.send((i, ev, Instant::now()));
            }
        }));
    }
    let mut terms: Vec<(usize, FencingToken, Instant, Option<Instant>)> = Vec::new();
    let mut losses = 0;
    let bound = ctx.expiry_deadline(ttl) * 2;
    while losses < 3 {
        let (i, ev, at) = tokio::time::timeout(bound, rx.recv())
            .await
            .map_err(|_| "election stalled")?
            .ok_or("closed")?;
        match ev {
            ElectionEvent::Elected { term, .. } => {
                terms.push((i, term, at, None));
                for (j, s) in stores.iter().enumerate() {
                    if j == i {
                        s.set_all(Fault::Hang);
                    } else {
                        s.heal();
                    }
                }
            }
            ElectionEvent::SteppedDown { term, .. } => {
                if let Some(t) = terms.iter_mut().find(|t| t.0 == i && t.1 == term) {
                    t.3 = Some(at);
                }
                losses += 1;
            }
            _ => {}
        }
    }
    for t in tasks {
        t.abort();
    }
    for w in terms.windows(2) {
        assert!(w[1].1 > w[0].1, "terms did not increase: {terms:?}");
        let end = w[0]
            .3
            .ok_or("a leader never stepped down before the next was elected")?;
        assert!(w[1].2 >= end, "two leaders at once: {terms:?}");
    }
    Ok(())
}

/// A resigning leader is replaced at once, without waiting for its TTL.
pub async fn election_resign_hands_over_without_waiting_for_the_ttl(ctx: Ctx) -> CaseResult {
    let key = ctx.key("resign");
    let ttl = ctx.long_ttl();
    let cfg = SupervisorConfig::new(ttl).with_acquire_wait(ttl);
    let mut a = Election::new(ctx.other_client().await?, key.clone(), cfg.clone())
        .join(OwnerId::with_label("a"));
    let Some(ElectionEvent::Elected { term: ta, work, .. }) =
        tokio::time::timeout(Duration::from_secs(10), a.next_event())
            .await
            .map_err(|_| "a not elected")?
    else {
        return Err("a: unexpected event".into());
    };
    let mut b =
        Election::new(ctx.other_client().await?, key.clone(), cfg).join(OwnerId::with_label("b"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!b.is_leader(), "two leaders");
    let t0 = Instant::now();
    a.resign().await;
    assert!(work.is_cancelled());
    let ev = tokio::time::timeout(Duration::from_secs(10), b.next_event())
        .await
        .map_err(|_| "b not elected within 10 s of the resignation")?;
    let Some(ElectionEvent::Elected { term: tb, .. }) = ev else {
        return Err(format!("b: unexpected {ev:?}").into());
    };
    assert!(tb > ta);
    assert!(Instant::now() - t0 < Duration::from_secs(10));
    b.resign().await;
    Ok(())
}
