//! The whole leasehold-testkit conformance suite on the grouped mode ([`K8sGroupedStore`]: one
//! membership Lease per owner, key assignments in group ConfigMaps) against a real
//! kube-apiserver, plus the grouped mode's own cases: what a renewal of 10,000 keys over 10
//! owners costs in API requests, the takeover of a dead owner's keys, and a deleted group object.
//! Environment as in `main.rs`.

#![allow(dead_code)] // env.rs is shared with the `k8s` target, which uses other parts of it

mod env;

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::try_join_all;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, Lease, LeaseStore, OwnerId, RenewOutcome,
};
use leasehold_k8s::{DEFAULT_GROUPS, GROUP_SET_LABEL, K8sGroupedStore};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{Backend, BoxFuture, CaseResult, Ctx, Failed, case};

/// The set every conformance case's stores share.
const SET: &str = "conformance";

async fn grouped(set: &str) -> leasehold_core::Result<K8sGroupedStore> {
    env::store().await?.grouped(set, DEFAULT_GROUPS)
}

/// The backend handle the testkit drives: grouped stores of one set.
#[derive(Debug, Clone, Copy)]
struct Grouped;

impl Backend for Grouped {
    fn name(&self) -> &'static str {
        "k8s-grouped"
    }

    fn connect(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(grouped(SET).await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, leasehold_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(grouped(SET).await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    /// 2 s, as the single-Lease target (see `main.rs`).
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            env::cleanup(namespace).await;
            prune_entries(SET, namespace).await;
        })
    }
}

/// Removes the entries of keys starting with `prefix` from the set's groups (best effort: a
/// lost race leaves them).
async fn prune_entries(set: &str, prefix: &str) {
    let Ok(client) = env::client().await else {
        return;
    };
    let maps: Api<ConfigMap> = Api::namespaced(client, &env::namespace());
    let lp = ListParams::default().labels(&format!("{GROUP_SET_LABEL}={set}"));
    let Ok(list) = maps.list(&lp).await else {
        return;
    };
    for mut cm in list.items {
        let Some(data) = cm.data.as_mut() else {
            continue;
        };
        let before = data.len();
        data.retain(|k, _| !k.starts_with(prefix));
        if data.len() != before
            && let Some(name) = cm.metadata.name.clone()
        {
            let _ = maps.replace(&name, &PostParams::default(), &cm).await;
        }
    }
}

/// Deletes every object of `set`: its group ConfigMaps and its membership Leases.
async fn delete_set(set: &str) -> leasehold_core::Result<()> {
    let client = env::client().await?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &env::namespace());
    let leases: Api<KubeLease> = Api::namespaced(client, &env::namespace());
    let lp = ListParams::default().labels(&format!("{GROUP_SET_LABEL}={set}"));
    for cm in maps.list(&lp).await.map_err(|e| err(&e))?.items {
        if let Some(name) = cm.metadata.name {
            let _ = maps.delete(&name, &DeleteParams::default()).await;
        }
    }
    let members = format!("{set}.m-");
    for l in leases
        .list(&ListParams::default())
        .await
        .map_err(|e| err(&e))?
        .items
    {
        if let Some(name) = l.metadata.name.filter(|n| n.starts_with(&members)) {
            let _ = leases.delete(&name, &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// Runs a case body on `set`, then deletes the set's objects, also when the body panicked (an
/// assertion), whose panic then goes on.
async fn with_set(set: &str, body: impl Future<Output = CaseResult>) -> CaseResult {
    let outcome = AssertUnwindSafe(body).catch_unwind().await;
    let deleted = delete_set(set).await;
    match outcome {
        Ok(result) => {
            result?;
            deleted?;
            Ok(())
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn err(e: &kube::Error) -> leasehold_core::Error {
    leasehold_core::Error::store_fault("k8s", e.to_string(), None)
}

/// A set name of its own for a case (a DNS label).
fn own_set(ctx: &Ctx, what: &str) -> String {
    format!("{what}-{}", ctx.namespace())
}

fn leases_of(out: Vec<leasehold_core::Result<AcquireOutcome>>) -> Result<Vec<Lease>, String> {
    out.into_iter()
        .map(|o| match o {
            Ok(AcquireOutcome::Acquired(l)) => Ok(l),
            Ok(AcquireOutcome::Held(h)) => Err(format!("held by {}", h.owner)),
            Err(e) => Err(e.to_string()),
        })
        .collect()
}

/// 10,000 keys over 10 owners, each owner with its own store (its own client, as a worker
/// process): the owners split the keys with one `acquire_many` each, then each renews all its
/// keys with one `renew_many`. The renewal round must cost at most two requests per owner (its
/// membership Lease and one LIST of the groups), whatever the number of keys: counted by the
/// stores themselves ([`K8sGroupedStore::requests_sent`]), every GET, LIST, create and replace.
async fn renewal_of_10000_keys_over_10_owners_costs_requests_per_owner(ctx: Ctx) -> CaseResult {
    const OWNERS: usize = 10;
    const KEYS: usize = 10_000;
    let set = own_set(&ctx, "scale");
    let ttl = Duration::from_secs(60);
    with_set(&set, async {
        let mut stores = Vec::with_capacity(OWNERS);
        for _ in 0..OWNERS {
            stores.push(grouped(&set).await?);
        }
        let owners: Vec<OwnerId> = (0..OWNERS)
            .map(|w| OwnerId::with_label(&format!("worker-{w}")))
            .collect();
        let keys: Vec<_> = (0..KEYS).map(|i| ctx.key(&format!("s{i}"))).collect();
        let count = |stores: &[K8sGroupedStore]| -> u64 { stores.iter().map(K8sGroupedStore::requests_sent).sum() };

        // The split: each owner takes its share in one batch, all owners at once.
        let before = count(&stores);
        let t0 = tokio::time::Instant::now();
        let splits = stores.iter().zip(&owners).enumerate().map(|(w, (store, owner))| {
            let reqs: Vec<AcquireRequest> = keys
                .iter()
                .skip(w)
                .step_by(OWNERS)
                .map(|k| AcquireRequest::new(k.clone(), owner.clone(), ttl))
                .collect();
            async move { store.acquire_many(&reqs).await }
        });
        let granted: Vec<Vec<Lease>> = try_join_all(splits)
            .await?
            .into_iter()
            .map(leases_of)
            .collect::<Result<_, _>>()?;
        let split_requests = count(&stores) - before;
        println!(
            "split of {KEYS} keys over {OWNERS} owners: {split_requests} requests, {:?}",
            t0.elapsed()
        );
        assert_eq!(granted.iter().map(Vec::len).sum::<usize>(), KEYS);

        // One renewal round: every owner renews all its keys.
        let before = count(&stores);
        let t0 = tokio::time::Instant::now();
        let rounds = stores.iter().zip(&granted).map(|(store, leases)| store.renew_many(leases));
        let renewed = try_join_all(rounds).await?;
        let renew_requests = count(&stores) - before;
        println!(
            "renewal of {KEYS} keys over {OWNERS} owners: {renew_requests} requests in one interval ({:?})",
            t0.elapsed()
        );
        for outcomes in &renewed {
            for o in outcomes {
                assert!(matches!(o, Ok(RenewOutcome::Renewed(_))), "{o:?}");
            }
        }
        assert!(
            renew_requests <= 2 * OWNERS as u64,
            "renewal cost {renew_requests} requests, more than two per owner ({OWNERS} owners)"
        );

        // The scan a shard set's rebalance makes: every key's holder.
        let before = stores[0].requests_sent();
        let holders = stores[0].holders_many(&keys).await?;
        let scan_requests = stores[0].requests_sent() - before;
        println!("holders_many of {KEYS} keys: {scan_requests} requests");
        for (i, h) in holders.iter().enumerate() {
            let h = h.as_ref().ok_or_else(|| format!("key {i} free"))?;
            assert_eq!(h.owner, owners[i % OWNERS], "key {i}");
        }
        // One LIST of the groups and one of the set's membership Leases, whatever the number
        // of owners (a GET per owner named before: 11).
        assert!(scan_requests <= 2, "scan cost {scan_requests}");
        Ok::<(), Failed>(())
    })
    .await
}

/// An owner holding three keys stops renewing. Another owner, polling, takes all three once it
/// has seen the first owner's membership Lease unchanged for the TTL (one revocation of that
/// owner's term), with greater tokens; the first owner's next renewal is lost for every key,
/// and its stale tokens are refused by the fenced resource.
async fn a_dead_owners_keys_are_taken_together_and_its_renewal_is_lost(ctx: Ctx) -> CaseResult {
    let set = own_set(&ctx, "dead");
    with_set(&set, async {
        let (sa, sb) = (grouped(&set).await?, grouped(&set).await?);
        let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
        let ttl = ctx.short_ttl();
        let keys: Vec<_> = ["x", "y", "z"].iter().map(|k| ctx.key(k)).collect();
        let reqs = |o: &OwnerId| -> Vec<AcquireRequest> {
            keys.iter()
                .map(|k| AcquireRequest::new(k.clone(), o.clone(), ttl))
                .collect()
        };
        let held = leases_of(sa.acquire_many(&reqs(&a)).await?)?;
        // B is refused while A's term is live.
        for o in sb.acquire_many(&reqs(&b)).await? {
            assert!(
                matches!(o, Ok(AcquireOutcome::Held(ref h)) if h.owner == a),
                "{o:?}"
            );
        }
        let deadline = tokio::time::Instant::now() + ctx.expiry_deadline(ttl);
        let taken = loop {
            let out = sb.acquire_many(&reqs(&b)).await?;
            if out
                .iter()
                .all(|o| matches!(o, Ok(AcquireOutcome::Acquired(_))))
            {
                break leases_of(out)?;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "A's keys never became free: {out:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for (old, new) in held.iter().zip(&taken) {
            assert!(
                new.token() > old.token(),
                "{} then {}",
                old.token(),
                new.token()
            );
        }
        // A's term was revoked by a write on its membership Lease (so that a renewal of A's in
        // flight during the takeover conflicts), not merely left to expire: the Lease no longer
        // names A.
        let member = sa.membership_object_name(&a, ttl)?;
        let leases: Api<KubeLease> = Api::namespaced(env::client().await?, &env::namespace());
        let spec = leases
            .get(&member)
            .await
            .map_err(|e| err(&e))?
            .spec
            .unwrap_or_default();
        assert_ne!(
            spec.holder_identity.as_deref(),
            Some(a.as_str()),
            "A's expired term was taken over without a write on its membership Lease"
        );
        for o in sa.renew_many(&held).await? {
            assert_eq!(o?, RenewOutcome::Lost);
        }
        // A's own store reports B as the holder, with B's tokens.
        let states = sa.inspect_many(&keys).await?;
        for (s, l) in states.iter().zip(&taken) {
            let h = s.holder.as_ref().expect("held by B");
            assert_eq!((&h.owner, h.token), (&b, l.token()));
        }
        let res = sa.fenced_resource();
        let newest = taken[0].token();
        assert!(
            res.write(&keys[0], newest, leasehold_core::WriteOp::Add(1))
                .await?
                .is_accepted()
        );
        assert!(
            !res.write(&keys[0], held[0].token(), leasehold_core::WriteOp::Add(1))
                .await?
                .is_accepted()
        );
        Ok::<(), Failed>(())
    })
    .await
}

/// Someone deletes a group object under a holder: its renewal is lost at once, and the next
/// grant (the group recreated) carries a greater token although the entry that recorded the old
/// one is gone.
async fn deleted_group_loses_the_key_and_tokens_keep_increasing(ctx: Ctx) -> CaseResult {
    let set = own_set(&ctx, "del");
    with_set(&set, async {
        let (sa, sb) = (grouped(&set).await?, grouped(&set).await?);
        let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
        let key = ctx.key("k");
        let lease = ctx.must_acquire_with(&sa, &key, &a, ctx.long_ttl()).await?;
        let maps: Api<ConfigMap> = Api::namespaced(env::client().await?, &env::namespace());
        maps.delete(&sa.group_object_name(&key), &DeleteParams::default())
            .await
            .map_err(|e| err(&e))?;
        assert_eq!(sa.renew(&lease).await?, RenewOutcome::Lost);
        let next = ctx.must_acquire_with(&sb, &key, &b, ctx.long_ttl()).await?;
        assert!(
            next.token() > lease.token(),
            "{} then {}",
            lease.token(),
            next.token()
        );
        Ok::<(), Failed>(())
    })
    .await
}

/// One store's releases of many keys of one group, all at once (a worker handing shards over),
/// each bounded as a supervisor bounds it: each lands within the bound, and a release whose
/// caller stops waiting at once lands too. Before releases were coalesced per group, a hundred
/// of them raced each other's conditional writes for seconds, the bound cut them off, and the
/// entries of those keys stayed assigned for as long as the owner's term lived.
async fn a_stores_concurrent_releases_in_one_group_all_land(ctx: Ctx) -> CaseResult {
    const KEYS: usize = 100;
    let bound = Duration::from_secs(2);
    let set = own_set(&ctx, "rel");
    with_set(&set, async {
        let store = env::store().await?.grouped(&set, 1)?;
        let owner = OwnerId::with_label("a");
        let keys: Vec<_> = (0..KEYS).map(|i| ctx.key(&format!("k{i}"))).collect();
        let reqs: Vec<AcquireRequest> = keys
            .iter()
            .map(|k| AcquireRequest::new(k.clone(), owner.clone(), ctx.long_ttl()))
            .collect();
        let leases = leases_of(store.acquire_many(&reqs).await?)?;
        let (waited, dropped) = leases.split_at(KEYS / 2);
        // Half are dropped after their first poll: the caller stops waiting at once.
        for l in dropped {
            let _ = tokio::time::timeout(Duration::ZERO, store.release(l)).await;
        }
        let released = futures::future::join_all(
            waited
                .iter()
                .map(|l| tokio::time::timeout(bound, store.release(l))),
        )
        .await;
        let failed: Vec<String> = released
            .iter()
            .filter(|r| !matches!(r, Ok(Ok(leasehold_core::ReleaseOutcome::Released))))
            .map(|r| format!("{r:?}"))
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {} releases did not land within {bound:?}: {:?}",
            failed.len(),
            waited.len(),
            failed.first()
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let held = store
                .holders_many(&keys)
                .await?
                .into_iter()
                .filter(Option::is_some)
                .count();
            if held == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{held} keys still assigned 20 s after their releases"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<(), Failed>(())
    })
    .await
}

/// A store's batches running at the same time (a shard set takes its share in batches of 128,
/// side by side) share their writes: one membership renewal for the owner and at most two reads
/// and replaces per group for all eight batches, where each batch writing alone read and
/// replaced every group (8 renewals and 256 group requests for these eight). Two owners'
/// batches on the same keys at the same time: each key goes to exactly one of them, and the
/// other is told that owner holds it.
async fn a_stores_concurrent_batches_share_their_group_writes(ctx: Ctx) -> CaseResult {
    const BATCHES: usize = 8;
    const PER_BATCH: usize = 125;
    let set = own_set(&ctx, "batch");
    with_set(&set, async {
        let store = grouped(&set).await?;
        let owner = OwnerId::with_label("a");
        let req = |k: &leasehold_core::LeaseKey, o: &OwnerId| {
            AcquireRequest::new(k.clone(), o.clone(), ctx.long_ttl())
        };
        // Every group object exists and the owner's term has started.
        let warm: Vec<AcquireRequest> = (0..400)
            .map(|i| req(&ctx.key(&format!("w{i}")), &owner))
            .collect();
        leases_of(store.acquire_many(&warm).await?)?;

        let before = store.requests_sent();
        let batches = (0..BATCHES).map(|b| {
            let reqs: Vec<AcquireRequest> = (0..PER_BATCH)
                .map(|i| req(&ctx.key(&format!("k{b}-{i}")), &owner))
                .collect();
            let store = &store;
            async move { store.acquire_many(&reqs).await }
        });
        let granted: Vec<Vec<Lease>> = try_join_all(batches)
            .await?
            .into_iter()
            .map(leases_of)
            .collect::<Result<_, _>>()?;
        let sent = store.requests_sent() - before;
        println!("{BATCHES} concurrent batches of {PER_BATCH} keys: {sent} requests");
        assert_eq!(granted.iter().map(Vec::len).sum::<usize>(), BATCHES * PER_BATCH);
        let bound = 1 + 4 * u64::from(DEFAULT_GROUPS);
        assert!(
            sent <= bound,
            "{BATCHES} concurrent batches cost {sent} requests, more than {bound} (one renewal, two reads and replaces per group)"
        );

        // Two owners, the same keys, at the same time.
        let (sb, b) = (grouped(&set).await?, OwnerId::with_label("b"));
        let keys: Vec<_> = (0..50).map(|i| ctx.key(&format!("both{i}"))).collect();
        let ra: Vec<AcquireRequest> = keys.iter().map(|k| req(k, &owner)).collect();
        let rb: Vec<AcquireRequest> = keys.iter().map(|k| req(k, &b)).collect();
        let (oa, ob) = tokio::try_join!(store.acquire_many(&ra), store.acquire_many(&rb))?;
        let (ob2, oa2) = tokio::try_join!(sb.acquire_many(&rb), store.acquire_many(&ra))?;
        for (i, ((a1, b1), (b2, a2))) in oa.iter().zip(&ob).zip(ob2.iter().zip(&oa2)).enumerate() {
            let winner = match (a1, b1) {
                (Ok(AcquireOutcome::Acquired(_)), Ok(AcquireOutcome::Held(h))) if h.owner == owner => &owner,
                (Ok(AcquireOutcome::Held(h)), Ok(AcquireOutcome::Acquired(_))) if h.owner == b => &b,
                other => panic!("key {i}: not exactly one owner granted: {other:?}"),
            };
            // Whoever holds a key keeps it against the other store and gets it again itself.
            let again = if winner == &owner { a2 } else { b2 };
            assert!(matches!(again, Ok(AcquireOutcome::Acquired(_))), "key {i}: {again:?}");
            let other = if winner == &owner { b2 } else { a2 };
            assert!(
                matches!(other, Ok(AcquireOutcome::Held(h)) if &h.owner == winner),
                "key {i}: {other:?}"
            );
        }
        Ok::<(), Failed>(())
    })
    .await
}

/// The grouped mode's own cases.
fn all() -> Vec<Case> {
    vec![
        case!(
            "k8s-grouped",
            renewal_of_10000_keys_over_10_owners_costs_requests_per_owner
        ),
        case!(
            "k8s-grouped",
            a_dead_owners_keys_are_taken_together_and_its_renewal_is_lost
        ),
        case!(
            "k8s-grouped",
            deleted_group_loses_the_key_and_tokens_keep_increasing
        ),
        case!(
            "k8s-grouped",
            a_stores_concurrent_releases_in_one_group_all_land
        ),
        case!(
            "k8s-grouped",
            a_stores_concurrent_batches_share_their_group_writes
        ),
    ]
}

fn main() {
    // Membership Leases and group entries left by earlier runs of this target (best effort;
    // nothing of this set is in use before the cases start).
    if let Ok(rt) = tokio::runtime::Runtime::new() {
        rt.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(20), delete_set(SET)).await;
        });
    }
    leasehold_testkit::run_with(Grouped, all());
}
