//! Batched acquisition ([`LeaseStore::acquire_many`]): each slot gets what
//! [`acquire`](LeaseStore::acquire) would give, partial grants are reported key by key, bad
//! batches are refused before anything changes, and two batchers over overlapping keys never
//! both hold a key.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::store::MAX_ACQUIRE_MANY;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, HeldBy, KeyState, KeyWatch, Lease,
    LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome,
};
use tokio::time::Instant;

use super::Case;
use crate::{CaseResult, Ctx};

/// This file's cases, with the capabilities each needs.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!("conformance", acquire_many_matches_acquire),
        crate::case!("conformance", acquire_many_reports_partial_grants),
        crate::case!("conformance", acquire_many_refuses_bad_input),
        crate::case!("conformance", acquire_many_contention_grants_each_key_once),
        crate::case!("conformance", acquire_many_timing),
    ]
}

/// How many keys [`acquire_many_timing`] acquires each way, unless the environment variable
/// `LEASE_ACQUIRE_MANY_KEYS` says otherwise (up to [`MAX_ACQUIRE_MANY`]).
pub const TIMING_KEYS: usize = 200;

fn requests(keys: &[LeaseKey], owner: &OwnerId, ttl: Duration) -> Vec<AcquireRequest> {
    keys.iter()
        .map(|k| AcquireRequest::new(k.clone(), owner.clone(), ttl))
        .collect()
}

fn granted(out: &leasehold_core::Result<AcquireOutcome>, what: &str) -> Result<Lease, String> {
    match out {
        Ok(AcquireOutcome::Acquired(lease)) => Ok(lease.clone()),
        Ok(AcquireOutcome::Held(h)) => Err(format!(
            "{what}: expected a grant, but {} holds it with token {}",
            h.owner, h.token
        )),
        Err(e) => Err(format!("{what}: expected a grant, got error {e}")),
    }
}

fn refused(
    out: &leasehold_core::Result<AcquireOutcome>,
    what: &str,
) -> Result<leasehold_core::Holder, String> {
    match out {
        Ok(AcquireOutcome::Held(h)) => Ok(h.clone()),
        Ok(AcquireOutcome::Acquired(l)) => Err(format!(
            "{what}: expected a refusal, but it was granted with token {}",
            l.token()
        )),
        Err(e) => Err(format!("{what}: expected a refusal, got error {e}")),
    }
}

/// Slot by slot what [`acquire`](LeaseStore::acquire) would give: a fresh key is granted, a
/// released key is granted with a token above its last one, a key held by another owner is
/// refused naming that holder and its token (and left as it was), and a key the batch's owner
/// already holds is granted again with a greater token (the old token no longer renews). Every
/// grant renews and releases like a single acquire's, and a second batch re-grants every key of
/// the owner with greater tokens.
pub async fn acquire_many_matches_acquire(ctx: Ctx) -> CaseResult {
    let keys = [
        ctx.key("fresh"),
        ctx.key("held"),
        ctx.key("own"),
        ctx.key("released"),
    ];
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.long_ttl();
    let other = ctx.other_client().await?;
    let theirs = ctx.must_acquire_with(&*other, &keys[1], &b, ttl).await?;
    let own = ctx.must_acquire(&keys[2], &a, ttl).await?;
    let freed = ctx.must_acquire(&keys[3], &b, ttl).await?;
    assert_eq!(ctx.store().release(&freed).await?, ReleaseOutcome::Released);

    let out = ctx.store().acquire_many(&requests(&keys, &a, ttl)).await?;
    assert_eq!(out.len(), keys.len(), "one outcome per request");
    let fresh = granted(&out[0], "fresh key")?;
    let holder = refused(&out[1], "key held by b")?;
    let again = granted(&out[2], "key a already holds")?;
    let after_release = granted(&out[3], "released key")?;

    for (lease, key) in [
        (&fresh, &keys[0]),
        (&again, &keys[2]),
        (&after_release, &keys[3]),
    ] {
        assert_eq!(lease.key(), key, "the outcome is in the request's slot");
        assert_eq!(lease.owner(), &a);
        assert!(
            lease.ttl() >= ttl,
            "granted ttl {:?} < {ttl:?}",
            lease.ttl()
        );
        assert!(lease.is_valid() && lease.remaining() <= lease.ttl());
    }
    assert_eq!(holder.owner, b, "the refusal names the holder");
    assert_eq!(holder.token, theirs.token());
    assert!(holder.remaining > Duration::ZERO && holder.remaining <= holder.ttl);
    assert!(
        again.token() > own.token(),
        "own key re-granted with {} !> {}",
        again.token(),
        own.token()
    );
    assert!(
        after_release.token() > freed.token(),
        "released key granted with {} !> {}",
        after_release.token(),
        freed.token()
    );
    assert_eq!(
        ctx.store().renew(&own).await?,
        RenewOutcome::Lost,
        "the token a batch superseded must not renew"
    );

    let states = ctx.store().inspect_many(&keys).await?;
    let holders: Vec<Option<(OwnerId, leasehold_core::FencingToken)>> = states
        .iter()
        .map(|s| s.holder.as_ref().map(|h| (h.owner.clone(), h.token)))
        .collect();
    assert_eq!(
        holders,
        vec![
            Some((a.clone(), fresh.token())),
            Some((b.clone(), theirs.token())),
            Some((a.clone(), again.token())),
            Some((a.clone(), after_release.token())),
        ],
        "the store holds exactly what the batch reported"
    );

    // A second batch by the same owner: its own keys again, each with a greater token.
    let mine = [keys[0].clone(), keys[2].clone(), keys[3].clone()];
    let second = ctx.store().acquire_many(&requests(&mine, &a, ttl)).await?;
    for ((out, before), key) in second
        .iter()
        .zip([&fresh, &again, &after_release])
        .zip(&mine)
    {
        let lease = granted(out, key.as_str())?;
        assert!(
            lease.token() > before.token(),
            "{key}: {} !> {}",
            lease.token(),
            before.token()
        );
        assert_eq!(ctx.store().renew(before).await?, RenewOutcome::Lost);
        assert!(matches!(
            ctx.store().renew(&lease).await?,
            RenewOutcome::Renewed(_)
        ));
        assert_eq!(ctx.store().release(&lease).await?, ReleaseOutcome::Released);
    }
    assert!(matches!(
        other.renew(&theirs).await?,
        RenewOutcome::Renewed(_)
    ));
    Ok(())
}

/// A batch over keys of which every third is held by another owner grants exactly the others,
/// each in its own slot, and leaves the held ones with their holder and token.
pub async fn acquire_many_reports_partial_grants(ctx: Ctx) -> CaseResult {
    let keys: Vec<LeaseKey> = (0..24).map(|i| ctx.key(&format!("p{i}"))).collect();
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.long_ttl();
    let other = ctx.other_client().await?;
    let mut theirs = std::collections::HashMap::new();
    for key in keys.iter().step_by(3) {
        theirs.insert(
            key.clone(),
            ctx.must_acquire_with(&*other, key, &b, ttl).await?,
        );
    }
    let out = ctx.store().acquire_many(&requests(&keys, &a, ttl)).await?;
    assert_eq!(out.len(), keys.len());
    let mut ours = Vec::new();
    for (key, slot) in keys.iter().zip(&out) {
        match theirs.get(key) {
            Some(lease) => {
                let h = refused(slot, key.as_str())?;
                assert_eq!((h.owner, h.token), (b.clone(), lease.token()), "{key}");
            }
            None => {
                let lease = granted(slot, key.as_str())?;
                assert_eq!(lease.key(), key, "outcomes are in input order");
                ours.push(lease);
            }
        }
    }
    assert_eq!(ours.len(), 16);
    let held = ctx.store().holders_many(&keys).await?;
    for (key, h) in keys.iter().zip(held) {
        let want = match theirs.get(key) {
            Some(l) => (b.clone(), l.token()),
            None => {
                let l = ours.iter().find(|l| l.key() == key).expect("granted above");
                (a.clone(), l.token())
            }
        };
        assert_eq!(h.map(|h| (h.owner, h.token)), Some(want), "{key}");
    }
    let renewed = ctx.store().renew_many(&ours).await?;
    assert!(
        renewed
            .iter()
            .all(|r| matches!(r, Ok(RenewOutcome::Renewed(_)))),
        "every batched grant renews: {renewed:?}"
    );
    Ok(())
}

/// Bad batches are refused with a typed error before anything is sent: a key given twice, more
/// than [`MAX_ACQUIRE_MANY`] requests. An empty batch is an empty answer. A request with an
/// invalid TTL gets its error in its own slot, and the rest of the batch is granted.
pub async fn acquire_many_refuses_bad_input(ctx: Ctx) -> CaseResult {
    let (k1, k2, k3) = (ctx.key("dup-a"), ctx.key("dup-b"), ctx.key("ttl"));
    let a = OwnerId::with_label("a");
    let ttl = ctx.long_ttl();
    let store = ctx.store();

    let dup = vec![
        ctx.request(&k1, &a, ttl),
        ctx.request(&k2, &a, ttl),
        ctx.request(&k1, &a, ttl),
    ];
    match store.acquire_many(&dup).await {
        Err(Error::InvalidInput(msg)) => assert!(msg.contains(k1.as_str()), "{msg}"),
        other => {
            return Err(format!("a key given twice: expected InvalidInput, got {other:?}").into());
        }
    }
    let too_many: Vec<AcquireRequest> = (0..=MAX_ACQUIRE_MANY)
        .map(|i| ctx.request(&ctx.key(&format!("m{i}")), &a, ttl))
        .collect();
    match store.acquire_many(&too_many).await {
        Err(e @ Error::InvalidInput(_)) => assert!(!e.is_retryable()),
        other => {
            return Err(format!(
                "{} requests: expected InvalidInput, got {:?}",
                too_many.len(),
                other.map(|v| v.len())
            )
            .into());
        }
    }
    let states = store
        .inspect_many(&[k1.clone(), k2.clone(), too_many[0].key.clone()])
        .await?;
    for s in &states {
        assert!(
            s.holder.is_none() && s.last_token.is_none(),
            "a refused batch changed {}: {s:?}",
            s.key
        );
    }
    assert!(store.acquire_many(&[]).await?.is_empty());

    let mixed = vec![
        ctx.request(&k1, &a, ttl),
        ctx.request(&k3, &a, Duration::ZERO),
        ctx.request(&k2, &a, ttl),
    ];
    let out = store.acquire_many(&mixed).await?;
    assert_eq!(out.len(), 3);
    granted(&out[0], "valid request before the invalid one")?;
    match &out[1] {
        Err(e) if e.is_invalid_input() => {}
        other => {
            return Err(format!(
                "a zero TTL: expected an invalid-input error in its slot, got {other:?}"
            )
            .into());
        }
    }
    granted(&out[2], "valid request after the invalid one")?;
    assert!(
        store.inspect(&k3).await?.holder.is_none(),
        "the invalid request was sent"
    );
    Ok(())
}

/// Two clients with different owners acquire overlapping key sets at the same moment, one in
/// ascending and one in descending key order, several rounds on fresh keys. Every key is granted
/// exactly once: where both asked, one got it and the other was refused naming it and its
/// token; where one asked, it got it; and the store holds exactly the reported winners.
pub async fn acquire_many_contention_grants_each_key_once(ctx: Ctx) -> CaseResult {
    const ROUNDS: usize = 4;
    const KEYS: usize = 48;
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.long_ttl();
    let (sa, sb) = (ctx.other_client().await?, ctx.other_client().await?);
    let mut contested = 0;
    for round in 0..ROUNDS {
        let keys: Vec<LeaseKey> = (0..KEYS)
            .map(|i| ctx.key(&format!("r{round}-{i:02}")))
            .collect();
        // a asks for the first two thirds, b for the last two thirds in reverse order.
        let ka: Vec<LeaseKey> = keys[..KEYS * 2 / 3].to_vec();
        let kb: Vec<LeaseKey> = keys[KEYS / 3..].iter().rev().cloned().collect();
        let (ra, rb) = (requests(&ka, &a, ttl), requests(&kb, &b, ttl));
        let (oa, ob) = tokio::join!(sa.acquire_many(&ra), sb.acquire_many(&rb));
        let (oa, ob) = (oa?, ob?);
        let mut winner: std::collections::HashMap<
            LeaseKey,
            (OwnerId, leasehold_core::FencingToken),
        > = std::collections::HashMap::new();
        let mut refusals = Vec::new();
        for (keys, outs, owner) in [(&ka, &oa, &a), (&kb, &ob, &b)] {
            assert_eq!(outs.len(), keys.len());
            for (key, out) in keys.iter().zip(outs) {
                match out {
                    Ok(AcquireOutcome::Acquired(lease)) => {
                        assert_eq!(lease.key(), key);
                        if let Some(prev) =
                            winner.insert(key.clone(), (owner.clone(), lease.token()))
                        {
                            return Err(format!(
                                "{key} granted twice: to {} ({}) and to {owner} ({})",
                                prev.0,
                                prev.1,
                                lease.token()
                            )
                            .into());
                        }
                    }
                    Ok(AcquireOutcome::Held(h)) => refusals.push((key.clone(), h.clone())),
                    Err(e) => return Err(format!("{key}: {e}").into()),
                }
            }
        }
        contested += refusals.len();
        for (key, h) in refusals {
            let w = winner
                .get(&key)
                .ok_or_else(|| format!("{key} refused to both batchers"))?;
            assert_eq!(
                (&h.owner, h.token),
                (&w.0, w.1),
                "{key}: refusal names the winner"
            );
        }
        assert_eq!(winner.len(), KEYS, "every key granted exactly once");
        let held = ctx.store().holders_many(&keys).await?;
        for (key, h) in keys.iter().zip(held) {
            let w = &winner[key];
            assert_eq!(
                h.map(|h| (h.owner, h.token)),
                Some((w.0.clone(), w.1)),
                "{key}: the store's holder is the reported winner"
            );
        }
    }
    assert_eq!(
        contested,
        ROUNDS * KEYS / 3,
        "one refusal per overlapping key"
    );
    Ok(())
}

/// Not an assertion on speed: acquires [`TIMING_KEYS`] fresh keys (or
/// `LEASE_ACQUIRE_MANY_KEYS`) with the backend's `acquire_many`, and as many with the trait's
/// default (acquire per key, a few in flight), and prints both durations. Both must grant every
/// key.
pub async fn acquire_many_timing(ctx: Ctx) -> CaseResult {
    let n = std::env::var("LEASE_ACQUIRE_MANY_KEYS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(TIMING_KEYS)
        .clamp(1, MAX_ACQUIRE_MANY);
    let ttl = ctx.long_ttl();
    let owner = OwnerId::with_label("timing");
    let mut took = Vec::new();
    for (run, (how, store)) in [
        ("acquire_many", ctx.store().clone()),
        (
            "default loop",
            Arc::new(DefaultLoop(ctx.store().clone())) as Arc<dyn LeaseStore>,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let keys: Vec<LeaseKey> = (0..n).map(|i| ctx.key(&format!("t{run}-{i}"))).collect();
        let reqs = requests(&keys, &owner, ttl);
        let start = Instant::now();
        let out = store.acquire_many(&reqs).await?;
        let elapsed = start.elapsed();
        let got = out
            .iter()
            .filter(|o| matches!(o, Ok(AcquireOutcome::Acquired(_))))
            .count();
        assert_eq!(got, n, "{how}: granted {got} of {n}");
        took.push((how, elapsed));
    }
    eprintln!(
        "acquire_many timing [{}]: {n} keys: acquire_many {:?}, default loop {:?}",
        ctx.backend().name(),
        took[0].1,
        took[1].1
    );
    Ok(())
}

/// A store that forwards everything but [`acquire_many`](LeaseStore::acquire_many), which keeps
/// the trait's default: the baseline of [`acquire_many_timing`].
#[derive(Debug)]
struct DefaultLoop(Arc<dyn LeaseStore>);

#[async_trait]
impl LeaseStore for DefaultLoop {
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> leasehold_core::Result<AcquireOutcome> {
        self.0.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> leasehold_core::Result<RenewOutcome> {
        self.0.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> leasehold_core::Result<ReleaseOutcome> {
        self.0.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> leasehold_core::Result<KeyState> {
        self.0.inspect(key).await
    }
    async fn inspect_many(&self, keys: &[LeaseKey]) -> leasehold_core::Result<Vec<KeyState>> {
        self.0.inspect_many(keys).await
    }
    async fn holders_many(&self, keys: &[LeaseKey]) -> leasehold_core::Result<Vec<Option<HeldBy>>> {
        self.0.holders_many(keys).await
    }
    async fn watch(&self, key: &LeaseKey) -> leasehold_core::Result<Option<KeyWatch>> {
        self.0.watch(key).await
    }
}
