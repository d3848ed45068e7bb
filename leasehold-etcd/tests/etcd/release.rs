//! The common path's cost (requests per acquire and release, counted by etcd itself) and what
//! release reports and changes on each of its paths.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};

use super::batch::requests;
use super::cluster::{Cluster, Timing};

/// This file's cases for `sharing`.
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    let mut cases = vec![
        case!("etcd", acquire_and_release_cost_what_the_minimal_costs),
        case!("etcd", release_after_a_hand_deletion_frees_nothing_else),
    ];
    if sharing == LeaseSharing::PerTtl {
        cases.push(case!(
            "etcd",
            a_store_without_sharing_never_revokes_a_shared_etcd_lease
        ));
    } else {
        cases.push(case!("etcd", grants_of_one_key_reuse_two_lock_key_names));
    }
    cases
}

/// With one etcd lease per grant, every grant of a key creates its lock key under one of two
/// names (the second one only for a same-owner re-acquire, whose transaction deletes the old key
/// and creates the new one), whoever acquires: etcd keeps a deleted key's index entry until
/// compaction, and every acquire's comparison over the lock prefix visits them all, so a name per
/// grant slows every later acquire of the key (measured in ADR 0031).
pub(crate) async fn grants_of_one_key_reuse_two_lock_key_names(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let other = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let key = ctx.key("names");
    let prefix = format!("{}/", store.options().lock_name(&key));
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = Duration::from_secs(10);
    let mut names = std::collections::BTreeSet::new();
    for round in 0..12 {
        let (s, owner) = if round % 3 == 2 {
            (&other, &b)
        } else {
            (&store, &a)
        };
        let lease = ctx.must_acquire_with(s, &key, owner, ttl).await?;
        let held = store
            .client()
            .get(
                prefix.clone(),
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await?;
        assert_eq!(held.kvs().len(), 1, "one lock key");
        names.insert(String::from_utf8_lossy(held.kvs()[0].key()).into_owned());
        assert_eq!(s.release(&lease).await?, ReleaseOutcome::Released);
    }
    assert_eq!(names.len(), 1, "lock key names: {names:?}");
    // A same-owner re-acquire: the old key and the new one exist in one transaction.
    let first = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
    let second = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
    assert!(second.token() > first.token());
    let held = store
        .client()
        .get(
            prefix.clone(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    assert_eq!(held.kvs().len(), 1, "one lock key");
    names.insert(String::from_utf8_lossy(held.kvs()[0].key()).into_owned());
    assert_eq!(store.release(&first).await?, ReleaseOutcome::NotHeld);
    assert_eq!(store.release(&second).await?, ReleaseOutcome::Released);
    assert_eq!(names.len(), 2, "lock key names: {names:?}");
    Ok(())
}

/// The etcd leases the member knows (one `LeaseLeases` request, read outside the counted spans).
async fn etcd_leases(store: &EtcdLeaseStore) -> Result<Vec<i64>, Failed> {
    let mut ids: Vec<i64> = store
        .client()
        .leases()
        .await?
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// On our own member, counted by etcd (`grpc_server_msg_received_total`): with one etcd lease
/// per grant, a free acquire is two requests (grant, transaction) and its release one (revoke):
/// three, as the minimal etcd lease (grant, guarded put, revoke). A refused acquire is four
/// (grant, transaction that reads the holder, the holder's TTL, revoke of the unused grant) and
/// leaves no etcd lease behind; a same-owner re-acquire at most four; releasing the replaced
/// lease one request, `NotHeld`. With shared etcd leases, a free acquire is one transaction
/// (plus a keepalive or grant at most once per tenth of the TTL) and its release one transaction.
pub(crate) async fn acquire_and_release_cost_what_the_minimal_costs(ctx: Ctx) -> CaseResult {
    let cluster = Cluster::start(1, Timing::FAST).await?;
    let endpoint = cluster.endpoints()[0].clone();
    let sharing = super::options().lease_sharing();
    let options = EtcdOptions::default().with_lease_sharing(sharing);
    let store = EtcdLeaseStore::connect_with(&cluster.url(), options).await?;
    // Long, so that a shared etcd lease's keepalive (sent at most once a tenth of the TTL) is
    // reused by every acquire of the case even on a slow machine.
    let ttl = Duration::from_secs(100);
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let per_grant = sharing == LeaseSharing::PerGrant;
    // With shared etcd leases the first acquire grants the store's etcd lease for this TTL.
    if !per_grant {
        ctx.must_acquire_with(&store, &ctx.key("warm"), &a, ttl)
            .await?;
    }

    let key = ctx.key("pair");
    for round in 0..3 {
        let before = requests(&endpoint).await?;
        let lease = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
        let acquired = requests(&endpoint).await?;
        assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
        let released = requests(&endpoint).await?;
        let (acq, rel) = ((acquired - before).all, (released - acquired).all);
        println!("{sharing:?} round {round}: acquire {acq} requests, release {rel}");
        assert_eq!(acq, if per_grant { 2 } else { 1 }, "acquire");
        assert_eq!(rel, 1, "release");
        assert!(store.inspect(&key).await?.holder.is_none(), "not freed");
    }

    // Refused: the holder is read by the acquire's own transaction.
    let lease = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
    let leases_before = etcd_leases(&store).await?;
    let before = requests(&endpoint).await?;
    match store.acquire(&ctx.request(&key, &b, ttl)).await? {
        AcquireOutcome::Held(h) => assert_eq!((h.owner, h.token), (a.clone(), lease.token())),
        AcquireOutcome::Acquired(l) => return Err(format!("granted {} twice", l.token()).into()),
    }
    let refused = (requests(&endpoint).await? - before).all;
    println!("{sharing:?}: refused acquire {refused} requests");
    assert_eq!(refused, if per_grant { 4 } else { 2 }, "refused acquire");
    assert_eq!(
        etcd_leases(&store).await?,
        leases_before,
        "a refused acquire left an etcd lease behind"
    );

    // The same owner again: a new grant replaces its key.
    let before = requests(&endpoint).await?;
    let again = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
    let reacquired = (requests(&endpoint).await? - before).all;
    println!("{sharing:?}: same-owner re-acquire {reacquired} requests");
    assert!(again.token() > lease.token());
    assert!(reacquired <= 4, "same-owner re-acquire: {reacquired}");
    let before = requests(&endpoint).await?;
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::NotHeld);
    assert_eq!((requests(&endpoint).await? - before).all, 1);
    assert_eq!(
        store.inspect(&key).await?.holder.map(|h| h.token),
        Some(again.token())
    );
    assert_eq!(store.release(&again).await?, ReleaseOutcome::Released);
    if per_grant {
        assert_eq!(
            etcd_leases(&store).await?,
            Vec::<i64>::new(),
            "etcd leases left"
        );
    }
    Ok(())
}

/// Someone deletes our lock key by hand while its etcd lease lives, and another owner acquires.
/// Our release must leave the new holder alone. What it reports depends on the path: a tagged
/// lease (one etcd lease per grant) is released by revoking its etcd lease, which etcd still
/// knows, so the report is `Released` although the key was already gone (the documented
/// limit of the one-request release); the checked path (shared etcd leases, or a lease this
/// store did not tag) compares the key and reports `NotHeld`.
pub(crate) async fn release_after_a_hand_deletion_frees_nothing_else(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let other_store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let ttl = Duration::from_secs(30);
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    for (i, (path, releaser)) in [("own store", &store), ("another store", &other_store)]
        .into_iter()
        .enumerate()
    {
        let key = ctx.key(&format!("deleted-by-hand-{i}"));
        let lease = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
        let prefix = format!("{}/", store.options().lock_name(&key));
        let opts = etcd_client::DeleteOptions::new().with_prefix();
        store.client().delete(prefix, Some(opts)).await?;
        let taker = ctx.must_acquire_with(&store, &key, &b, ttl).await?;
        let out = releaser.release(&lease).await?;
        let revoke_only =
            super::options().lease_sharing() == LeaseSharing::PerGrant && path == "own store";
        let expected = if revoke_only {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        };
        assert_eq!(out, expected, "{path}");
        let holder = store.inspect(&key).await?.holder.ok_or("taker freed")?;
        assert_eq!((holder.owner, holder.token), (b.clone(), taker.token()));
        assert!(matches!(
            store.renew(&taker).await?,
            RenewOutcome::Renewed(ref l) if l.token() == taker.token()
        ));
        assert_eq!(store.release(&taker).await?, ReleaseOutcome::Released);
    }
    Ok(())
}

/// A store with one etcd lease per grant releases (and re-acquires for the same owner) leases
/// acquired through a store that shares etcd leases: it must delete that one key, never revoke
/// the shared etcd lease, whose other keys stay held.
pub(crate) async fn a_store_without_sharing_never_revokes_a_shared_etcd_lease(
    ctx: Ctx,
) -> CaseResult {
    let shared = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let plain = EtcdLeaseStore::connect_with(
        &super::url(),
        super::options().with_lease_sharing(LeaseSharing::PerGrant),
    )
    .await?;
    let ttl = Duration::from_secs(30);
    let a = OwnerId::with_label("a");
    let (k1, k2, k3) = (ctx.key("s1"), ctx.key("s2"), ctx.key("s3"));
    let l1 = ctx.must_acquire_with(&shared, &k1, &a, ttl).await?;
    let l2 = ctx.must_acquire_with(&shared, &k2, &a, ttl).await?;
    let l3 = ctx.must_acquire_with(&shared, &k3, &a, ttl).await?;
    let etcd_lease = |l: &leasehold_core::Lease| {
        l.handle()
            .and_then(|h| h.split('/').next())
            .map(str::to_string)
    };
    assert_eq!(
        etcd_lease(&l1),
        etcd_lease(&l2),
        "not one shared etcd lease"
    );
    assert_eq!(plain.release(&l1).await?, ReleaseOutcome::Released);
    // Resumed (no handle): found through the lock's holder.
    let resumed = leasehold_core::Lease::resume(k3.clone(), a.clone(), l3.token(), ttl);
    assert_eq!(plain.release(&resumed).await?, ReleaseOutcome::Released);
    assert!(shared.inspect(&k1).await?.holder.is_none());
    assert!(shared.inspect(&k3).await?.holder.is_none());
    let held = shared.inspect(&k2).await?.holder.ok_or("k2 lost with k1")?;
    assert_eq!(held.token, l2.token());
    // The same owner re-acquiring through the plain store replaces its key, and still leaves
    // the shared etcd lease alone.
    let l2b = ctx.must_acquire_with(&shared, &k1, &a, ttl).await?;
    let replaced = ctx.must_acquire_with(&plain, &k1, &a, ttl).await?;
    assert!(replaced.token() > l2b.token());
    let held = shared
        .inspect(&k2)
        .await?
        .holder
        .ok_or("k2 lost by a re-acquire")?;
    assert_eq!(held.token, l2.token());
    assert!(matches!(
        shared.renew(&l2).await?,
        RenewOutcome::Renewed(ref l) if l.token() == l2.token()
    ));
    assert_eq!(shared.release(&l2).await?, ReleaseOutcome::Released);
    assert_eq!(plain.release(&replaced).await?, ReleaseOutcome::Released);
    Ok(())
}
