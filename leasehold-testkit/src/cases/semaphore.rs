//! Fenced semaphores ([`leasehold_core::semaphore`]) on the backend: at most `N` believers, no
//! starved contender, a dead holder's permit taken after its TTL, tokens increasing per slot.
//!
//! Every contender has its own client of the store and its own [`Semaphore`], as separate
//! processes would.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_core::semaphore::{Permit, PermitAcquisition, Semaphore};
use leasehold_core::supervisor::SupervisorConfig;
use leasehold_core::{FencingToken, LeaseKey, OwnerId, ReleaseOutcome, WriteOp};
use tokio::time::Instant;

use super::Case;
use crate::history::{History, Op, Stamp};
use crate::{CaseResult, Ctx, Failed};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!("semaphore", semaphore_never_more_than_n_believers),
        crate::case!("semaphore", semaphore_no_contender_starves),
        crate::case!(
            "semaphore",
            semaphore_dead_holders_permit_is_taken_after_its_ttl
        ),
        crate::case!("semaphore", semaphore_tokens_increase_per_slot),
    ]
}

/// Permits of the semaphore in the believer case.
pub const PERMITS: u32 = 3;
/// Contenders in the believer case (more than [`PERMITS`]).
pub const CONTENDERS: usize = 8;
/// Rounds per contender in the believer case.
pub const ROUNDS: usize = 4;

/// A semaphore for one contender: its own client, `permits` permits of `name`.
async fn contender(
    ctx: &Ctx,
    name: &LeaseKey,
    permits: u32,
    config: SupervisorConfig,
) -> Result<Semaphore, Failed> {
    let store = ctx.other_client().await?;
    Ok(Semaphore::from_supervisor(
        leasehold_core::supervisor::Supervisor::from_arc(store, config),
        name,
        permits,
    )?)
}

/// Acquires a permit or fails the case naming who held the slots.
async fn must_acquire(sem: &Semaphore, who: &str) -> Result<Permit, String> {
    match sem.acquire().await.map_err(|e| format!("{who}: {e}"))? {
        PermitAcquisition::Acquired(p) => Ok(p),
        PermitAcquisition::NotAcquired { held, waited } => Err(format!(
            "{who} got no permit of {} within {waited:?}; holders {:?}",
            sem.name(),
            held.iter()
                .map(|h| (h.owner.as_str(), h.token.get()))
                .collect::<Vec<_>>()
        )),
        PermitAcquisition::Cancelled => Err(format!("{who}: acquisition cancelled")),
    }
}

/// 1. `8` contenders (each with its own client) take `4` permits each, in turn, from a semaphore
///    of `3`: every holder writes through the fenced resource under its slot key and releases.
///    The history, per slot, is legal (no overlapping belief, no token regression, no stale
///    write), at no instant do more than `3` holders believe they hold a permit (a sweep over
///    every belief interval, from the grant's answer to the release's invocation or the local
///    deadline), and each slot's counter equals the grants on that slot. Then `3` contenders hold
///    a permit each at once, on distinct slots, and a fourth is refused (it is not a mutex, and
///    the limit holds without a race to win).
pub async fn semaphore_never_more_than_n_believers(ctx: Ctx) -> CaseResult {
    let name = ctx.key("believers");
    let history = History::new();
    let config = SupervisorConfig::new(ctx.long_ttl()).with_acquire_wait(Duration::from_secs(60));
    let mut tasks = Vec::new();
    for c in 0..CONTENDERS {
        let sem = contender(&ctx, &name, PERMITS, config.clone()).await?;
        let (ctx, history) = (ctx.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let who = format!("c{c}");
            for _ in 0..ROUNDS {
                let t0 = history.begin();
                let permit = must_acquire(&sem, &who).await?;
                let (key, token) = (permit.key().clone(), permit.token());
                history.end(
                    &who,
                    &key,
                    t0,
                    Op::Granted {
                        owner: permit.owner().clone(),
                        token,
                        deadline: permit.lease().deadline(),
                    },
                );
                let t0 = history.begin();
                let out = ctx
                    .resource()
                    .write(&key, token, WriteOp::Add(1))
                    .await
                    .map_err(|e| e.to_string())?;
                let accepted = out.is_accepted();
                history.end(&who, &key, t0, Op::Write { token, accepted });
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..30))).await;
                let t0 = history.begin();
                let released = permit.release().await.map_err(|e| e.to_string())?;
                history.end(&who, &key, t0, Op::Release { token });
                if !accepted || released != ReleaseOutcome::Released {
                    return Err(format!(
                        "{who}: a valid permit on {key} (token {token}) was refused: write {out:?}, release {released:?}"
                    ));
                }
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("contender panicked: {e}"))??;
    }
    let violations = history.check();
    if !violations.is_empty() {
        return Err(format!("history violations: {violations:#?}\n{}", history.dump()).into());
    }
    let peak = peak_believers(&history);
    if peak > PERMITS as usize {
        return Err(format!(
            "{peak} holders believed they held a permit at once (at most {PERMITS})\n{}",
            history.dump()
        )
        .into());
    }
    // Whether the churn above overlapped depends on scheduling; that the semaphore is not a
    // mutex is shown deterministically: PERMITS contenders hold a permit each at the same time
    // (each acquired while the earlier ones hold theirs, on distinct slots), and one more finds
    // none free.
    let mut held: Vec<Permit> = Vec::new();
    for c in 0..PERMITS {
        let sem = contender(&ctx, &name, PERMITS, config.clone()).await?;
        match sem.try_acquire().await? {
            PermitAcquisition::Acquired(p) => held.push(p),
            other => {
                return Err(format!(
                    "permit {c} of {PERMITS} refused while only {} were held (the semaphore \
                     acted as a mutex?): {other:?}",
                    held.len()
                )
                .into());
            }
        }
    }
    let mut slots: Vec<u32> = held.iter().map(Permit::slot).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(
        slots.len(),
        PERMITS as usize,
        "{PERMITS} permits on distinct slots"
    );
    let extra = contender(&ctx, &name, PERMITS, config.clone()).await?;
    if let PermitAcquisition::Acquired(p) = extra.try_acquire().await? {
        return Err(format!(
            "a permit beyond {PERMITS} was granted on slot {} while {PERMITS} were held",
            p.slot()
        )
        .into());
    }
    for p in held {
        let slot = p.slot();
        let released = p.release().await?;
        assert_eq!(released, ReleaseOutcome::Released, "release of slot {slot}");
    }
    let mut grants: BTreeMap<LeaseKey, i64> = BTreeMap::new();
    for e in history.events() {
        if matches!(e.op, Op::Granted { .. }) {
            *grants.entry(e.key).or_default() += 1;
        }
    }
    let mut total = 0;
    for (key, n) in &grants {
        let counter = ctx.resource().read(key).await?.counter;
        assert_eq!(counter, *n, "slot {key}: counter against grants");
        total += n;
    }
    assert_eq!(
        total,
        i64::try_from(CONTENDERS * ROUNDS).unwrap_or(i64::MAX),
        "every round was granted once"
    );
    Ok(())
}

/// The largest number of belief intervals (a grant's answer to its release's invocation, cut at
/// the grant's local deadline) open at one instant, over every slot of the history.
pub fn peak_believers(history: &History) -> usize {
    let events = history.events();
    let mut edges: Vec<(Stamp, i32)> = Vec::new();
    for g in &events {
        let Op::Granted {
            token, deadline, ..
        } = g.op
        else {
            continue;
        };
        let released = events
            .iter()
            .filter(|e| e.key == g.key && e.op == Op::Release { token })
            .map(|e| e.invoked)
            .min();
        // Ties count: a belief ends after every event at its deadline's instant.
        let expiry = Stamp {
            at: deadline,
            seq: u64::MAX,
        };
        let end = released.map_or(expiry, |r| r.min(expiry));
        if g.completed < end {
            edges.push((g.completed, 1));
            edges.push((end, -1));
        }
    }
    // At one stamp an end comes before a start (stamps of distinct events differ anyway).
    edges.sort_by_key(|&(at, d)| (at, d));
    let (mut open, mut peak) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        peak = peak.max(open);
    }
    usize::try_from(peak).unwrap_or(0)
}

/// Permits of the semaphore in the starvation case.
pub const FAIR_PERMITS: u32 = 2;
/// Contenders in the starvation case.
pub const FAIR_CONTENDERS: usize = 6;
/// How long each holder keeps its permit in the starvation case.
pub const FAIR_HOLD: Duration = Duration::from_millis(100);
/// How long each contender pauses after releasing before it asks again: longer than a waiter's
/// largest poll interval (100 ms here), so that a waiter looks at least once while the slot is
/// free.
pub const FAIR_PAUSE: Duration = Duration::from_millis(150);
/// The bound within which every acquisition must succeed.
pub const FAIR_BOUND: Duration = Duration::from_secs(15);

/// 2. No contender starves, with the fairness the semaphore promises: `6` contenders cycle
///    through the `2` permits (hold 100 ms, pause 150 ms, ask again; waiters poll at most every
///    100 ms or are woken by the watch), `3` rounds each, and **every** acquisition succeeds
///    within 15 s. The longest wait is reported.
pub async fn semaphore_no_contender_starves(ctx: Ctx) -> CaseResult {
    let name = ctx.key("fair");
    let config = SupervisorConfig::new(ctx.long_ttl())
        .with_acquire_wait(FAIR_BOUND)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(100));
    let mut tasks = Vec::new();
    for c in 0..FAIR_CONTENDERS {
        let sem = contender(&ctx, &name, FAIR_PERMITS, config.clone()).await?;
        tasks.push(tokio::spawn(async move {
            let who = format!("c{c}");
            let mut longest = Duration::ZERO;
            for _ in 0..3 {
                let t0 = Instant::now();
                let permit = must_acquire(&sem, &who).await?;
                longest = longest.max(t0.elapsed());
                tokio::time::sleep(FAIR_HOLD).await;
                let released = permit.release().await.map_err(|e| e.to_string())?;
                if released != ReleaseOutcome::Released {
                    return Err(format!("{who}: release of a valid permit: {released:?}"));
                }
                tokio::time::sleep(FAIR_PAUSE).await;
            }
            Ok::<Duration, String>(longest)
        }));
    }
    let mut longest = Duration::ZERO;
    for t in tasks {
        longest = longest.max(t.await.map_err(|e| format!("contender panicked: {e}"))??);
    }
    eprintln!("longest wait for a permit: {longest:?} (bound {FAIR_BOUND:?})");
    Ok(())
}

/// 3. Both slots of a semaphore of `2` are held by a holder that then dies (plain grants on the
///    slot keys with the short TTL, never renewed nor released). Another client's semaphore gets
///    a permit once they expire: within the expiry deadline, not before the dead grant's local
///    deadline, with a greater token than the dead holder's on that slot.
pub async fn semaphore_dead_holders_permit_is_taken_after_its_ttl(ctx: Ctx) -> CaseResult {
    let name = ctx.key("dead");
    let ttl = ctx.short_ttl();
    let dead_owner = OwnerId::with_label("dead");
    let mut dead = Vec::new();
    for slot in 0..2 {
        let key = Semaphore::slot_key(&name, slot)?;
        dead.push(ctx.must_acquire(&key, &dead_owner, ttl).await?);
    }
    let config = SupervisorConfig::new(ctx.long_ttl()).with_acquire_wait(ctx.expiry_deadline(ttl));
    let sem = contender(&ctx, &name, 2, config).await?;
    let permit = must_acquire(&sem, "successor").await?;
    let Some(before) = dead.get(permit.slot() as usize) else {
        return Err(format!("a permit on slot {} of a semaphore of 2", permit.slot()).into());
    };
    assert!(
        !before.is_valid(),
        "slot {} was granted before the dead holder's local deadline",
        permit.key()
    );
    assert!(
        permit.token() > before.token(),
        "slot {}: token {} after the dead holder's {}",
        permit.key(),
        permit.token(),
        before.token()
    );
    assert_eq!(permit.release().await?, ReleaseOutcome::Released);
    Ok(())
}

/// 4. Tokens strictly increase per slot: two contenders (own clients) take and release permits
///    of a semaphore of `2` in turn, `8` rounds each, one at a time; on every slot each grant's
///    token is greater than every earlier grant's, and the store's last token is the last
///    grant's.
pub async fn semaphore_tokens_increase_per_slot(ctx: Ctx) -> CaseResult {
    let name = ctx.key("tokens");
    let config = SupervisorConfig::new(ctx.long_ttl());
    let sems = [
        contender(&ctx, &name, 2, config.clone()).await?,
        contender(&ctx, &name, 2, config).await?,
    ];
    let mut per_slot: BTreeMap<u32, Vec<FencingToken>> = BTreeMap::new();
    for round in 0..16 {
        let sem = &sems[round % 2];
        // Hold one permit while taking another, so that both slots are used.
        let a = must_acquire(sem, "first").await?;
        let b = must_acquire(sem, "second").await?;
        for p in [&a, &b] {
            per_slot.entry(p.slot()).or_default().push(p.token());
        }
        assert_eq!(a.release().await?, ReleaseOutcome::Released);
        assert_eq!(b.release().await?, ReleaseOutcome::Released);
    }
    assert_eq!(per_slot.len(), 2, "both slots were used: {per_slot:?}");
    let keys = sems[0].slot_keys().to_vec();
    let states = ctx.store().inspect_many(&keys).await?;
    for (slot, tokens) in &per_slot {
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "slot {slot}: tokens do not strictly increase: {tokens:?}"
        );
        let last = states[*slot as usize].last_token;
        if let Some(last) = last {
            assert!(
                last >= *tokens.last().unwrap_or(&last),
                "slot {slot}: the store's last token {last} is below a granted {tokens:?}"
            );
        }
    }
    Ok(())
}
