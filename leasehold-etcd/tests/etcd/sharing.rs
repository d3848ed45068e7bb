//! `LeaseSharing::PerTtl`: one etcd lease and few keepalives for many keys, per-key expiry kept.

use std::time::Duration;

use leasehold_core::{LeaseStore, OwnerId, RenewOutcome};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::cluster::{Cluster, Timing};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;

/// This file's cases for `sharing` (PerTtl only (the last case builds its own PerGrant store)).
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => vec![
            case!("etcd", many_keys_share_one_etcd_lease_and_one_keepalive),
            case!(
                "etcd",
                an_unrenewed_key_expires_although_its_etcd_lease_lives
            ),
            case!(
                "etcd",
                a_renewal_through_another_store_holds_to_its_deadline
            ),
            case!("etcd", a_store_without_sharing_refuses_a_shared_key),
        ],
        _ => Vec::new(),
    }
}

/// etcd's count of lease keepalives (`etcd_debugging_lease_renewed_total` on `/metrics`).
async fn keepalives(endpoint: &str) -> Result<u64, Failed> {
    let addr = endpoint.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    conn.read_to_string(&mut body).await?;
    let line = body
        .lines()
        .find(|l| l.starts_with("etcd_debugging_lease_renewed_total "))
        .ok_or("no etcd_debugging_lease_renewed_total metric")?;
    let value = line.rsplit(' ').next().unwrap_or("");
    Ok(value.parse::<u64>().map_err(|e| format!("{line}: {e}"))?)
}

/// 20 keys acquired with one TTL by one store share one etcd lease, and renewing all of them at
/// once (`renew_many`) sends one keepalive, not twenty (counted by etcd itself, on our own member).
pub(crate) async fn many_keys_share_one_etcd_lease_and_one_keepalive(ctx: Ctx) -> CaseResult {
    let cluster = Cluster::start(1, Timing::FAST).await?;
    let endpoint = cluster.endpoints()[0].clone();
    let options = EtcdOptions::default().with_lease_sharing(LeaseSharing::PerTtl);
    let store = EtcdLeaseStore::connect_with(&cluster.url(), options).await?;
    let ttl = Duration::from_secs(3);
    let a = OwnerId::with_label("a");
    let mut leases = Vec::new();
    for i in 0..20 {
        leases.push(
            ctx.must_acquire_with(&store, &ctx.key(&format!("k{i}")), &a, ttl)
                .await?,
        );
    }
    let lease_ids: Vec<&str> = leases
        .iter()
        .map(|l| l.handle().and_then(|h| h.split('/').next()).unwrap_or(""))
        .collect();
    assert!(
        lease_ids
            .iter()
            .all(|id| *id == lease_ids[0] && !id.is_empty()),
        "etcd leases: {lease_ids:?}"
    );

    for round in 0..2 {
        tokio::time::sleep(ttl / 3).await;
        let before = keepalives(&endpoint).await?;
        let outcomes = store.renew_many(&leases).await?;
        let after = keepalives(&endpoint).await?;
        let mut next = Vec::new();
        for out in outcomes {
            match out? {
                RenewOutcome::Renewed(l) => next.push(l),
                RenewOutcome::Lost => {
                    return Err(format!("round {round}: a shared lease was lost").into());
                }
            }
        }
        leases = next;
        // One keepalive per round; another only if the first outlasted the reuse window.
        assert!(
            after - before <= 3,
            "round {round}: {} keepalives for 20 renewals",
            after - before
        );
    }
    for l in &leases {
        assert_eq!(
            store.inspect(l.key()).await?.holder.map(|h| h.token),
            Some(l.token())
        );
    }
    Ok(())
}

/// Two keys on one shared etcd lease: one is renewed, the other is not. The unrenewed key is freed
/// (by the store's sweeper) about its TTL after its last renewal although the etcd lease lives on,
/// its late renewal is refused, and the renewed key stays held.
pub(crate) async fn an_unrenewed_key_expires_although_its_etcd_lease_lives(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let other = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let ttl = ctx.short_ttl();
    let (kept, dropped) = (ctx.key("kept"), ctx.key("dropped"));
    let (a, b, c) = (
        OwnerId::with_label("a"),
        OwnerId::with_label("b"),
        OwnerId::with_label("c"),
    );
    let mut la = ctx.must_acquire_with(&store, &kept, &a, ttl).await?;
    let lb = ctx.must_acquire_with(&store, &dropped, &b, ttl).await?;
    let same = |l: &leasehold_core::Lease| {
        l.handle()
            .and_then(|h| h.split('/').next())
            .map(str::to_string)
    };
    assert_eq!(
        same(&la),
        same(&lb),
        "the two keys should share one etcd lease"
    );

    let granted = Instant::now();
    let req = ctx.request(&dropped, &c, ttl);
    let waiter = tokio::spawn(async move {
        let got = super::wait_and_acquire(
            &other,
            &req,
            Duration::from_secs(30),
            Duration::from_secs(20),
        )
        .await;
        (got, Instant::now())
    });
    let end = Instant::now() + ttl * 3;
    while Instant::now() < end {
        tokio::time::sleep(ttl / 4).await;
        match store.renew(&la).await? {
            RenewOutcome::Renewed(next) => la = next,
            RenewOutcome::Lost => return Err("the renewed key was lost".into()),
        }
    }
    let (got, at) = waiter.await?;
    let lc = got?;
    let freed_after = at - granted;
    println!("unrenewed key on a shared etcd lease freed after {freed_after:?} (ttl {ttl:?})");
    assert!(
        freed_after < ttl + Duration::from_secs(2),
        "freed after {freed_after:?}"
    );
    assert!(lc.token() > lb.token());
    assert_eq!(
        store.renew(&lb).await?,
        RenewOutcome::Lost,
        "a swept key was renewed"
    );
    assert_eq!(
        store.inspect(&kept).await?.holder.map(|h| h.token),
        Some(la.token())
    );
    Ok(())
}

/// Polls `key` every 50 ms until `until`: while `lease` is valid, the key must be held with its
/// token.
async fn held_until(
    store: &EtcdLeaseStore,
    lease: &leasehold_core::Lease,
    until: Instant,
    what: &str,
) -> CaseResult {
    while Instant::now() < until {
        let holder = store.inspect(lease.key()).await?.holder.map(|h| h.token);
        if holder != Some(lease.token()) && lease.is_valid() {
            return Err(format!(
                "{what}: key {} not held (holder token {holder:?}) {:?} before the reported deadline",
                lease.key(),
                lease.remaining()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Two `PerTtl` stores (as two processes would have): a lease acquired through the first is
/// renewed through the second, then through the first again. The key stays held for as long as
/// each reported deadline says (no store's sweeper deletes a key another store renewed), and is
/// freed once the renewals stop.
pub(crate) async fn a_renewal_through_another_store_holds_to_its_deadline(ctx: Ctx) -> CaseResult {
    let first = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let second = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let ttl = Duration::from_secs(4);
    let key = ctx.key("elsewhere");
    let a = OwnerId::with_label("a");
    let l0 = ctx.must_acquire_with(&first, &key, &a, ttl).await?;
    held_until(&first, &l0, Instant::now() + ttl / 2, "acquired").await?;
    let l1 = match second.renew(&l0).await? {
        RenewOutcome::Renewed(l) => l,
        RenewOutcome::Lost => return Err("renewal through the second store: Lost".into()),
    };
    held_until(
        &first,
        &l1,
        l1.deadline() - ttl / 4,
        "renewed through the second store",
    )
    .await?;
    let l2 = match first.renew(&l1).await? {
        RenewOutcome::Renewed(l) => l,
        RenewOutcome::Lost => return Err("renewal back through the first store: Lost".into()),
    };
    held_until(
        &first,
        &l2,
        l2.deadline(),
        "renewed back through the first store",
    )
    .await?;
    // Nobody renews any more: the key is freed (not kept alive by either store).
    let b = OwnerId::with_label("b");
    let stopped = Instant::now();
    let lb = super::wait_and_acquire(
        &second,
        &ctx.request(&key, &b, ttl),
        Duration::from_millis(200),
        ttl * 3,
    )
    .await?;
    println!(
        "key renewed through two stores freed {:?} after the last deadline",
        stopped.elapsed()
    );
    assert!(lb.token() > l2.token());
    Ok(())
}

/// A store without lease sharing cannot know when a shared etcd lease's store sweeps a key, so it
/// refuses (`InvalidInput`) to renew a lease acquired with `PerTtl`, with or without its handle,
/// and changes nothing: the acquiring store still renews it.
pub(crate) async fn a_store_without_sharing_refuses_a_shared_key(ctx: Ctx) -> CaseResult {
    let shared = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let plain = EtcdLeaseStore::connect_with(
        &super::url(),
        super::options().with_lease_sharing(LeaseSharing::PerGrant),
    )
    .await?;
    let ttl = Duration::from_secs(4);
    let key = ctx.key("mixed");
    let lease = ctx
        .must_acquire_with(&shared, &key, &OwnerId::with_label("a"), ttl)
        .await?;
    let resumed =
        leasehold_core::Lease::resume(key.clone(), lease.owner().clone(), lease.token(), ttl);
    for l in [&lease, &resumed] {
        match plain.renew(l).await {
            Err(leasehold_core::Error::InvalidInput(_)) => {}
            other => return Err(format!("expected InvalidInput, got {other:?}").into()),
        }
    }
    assert!(matches!(
        shared.renew(&lease).await?,
        RenewOutcome::Renewed(l) if l.token() == lease.token()
    ));
    Ok(())
}
