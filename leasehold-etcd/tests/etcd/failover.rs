//! Failures of etcd itself: a member restart and a leader kill, on our own members.

use std::time::Duration;

use leasehold_core::{AcquireRequest, Lease, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions};
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::time::Instant;

use super::cluster::{Cluster, Timing};
use leasehold_etcd::LeaseSharing;
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;

/// This file's cases for `sharing` (PerGrant only: the failover cases do not depend on the sharing mode).
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => Vec::new(),
        _ => vec![
            case!("etcd", member_restart_while_a_lease_is_held),
            case!("etcd", leader_killed_in_a_three_member_cluster),
        ],
    }
}

/// Renews, retrying retryable errors until `within` passes; `None` if every attempt failed.
async fn renew_retrying(
    store: &EtcdLeaseStore,
    lease: &Lease,
    within: Duration,
) -> Result<Option<RenewOutcome>, Failed> {
    let deadline = Instant::now() + within;
    loop {
        match store.renew(lease).await {
            Ok(out) => return Ok(Some(out)),
            Err(e) if e.is_retryable() => {}
            Err(e) => return Err(format!("renew: {e}").into()),
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The only member is killed and restarted while a lease is held: the holder then keeps it or
/// has lost it (never both), and the next grant has a greater token.
pub(crate) async fn member_restart_while_a_lease_is_held(ctx: Ctx) -> CaseResult {
    let mut cluster = Cluster::start(1, Timing::FAST).await?;
    let options = EtcdOptions::default().with_request_timeout(Duration::from_secs(2));
    let store = EtcdLeaseStore::connect_with(&cluster.url(), options.clone()).await?;
    let key = ctx.key("restart");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = Duration::from_secs(2);
    let lease = ctx.must_acquire_with(&store, &key, &a, ttl).await?;

    cluster.kill(0).await?;
    assert!(
        store.renew(&lease).await.is_err_and(|e| e.is_retryable()),
        "renew with etcd down must be a retryable error"
    );
    cluster.restart(0).await?;

    let after = renew_retrying(&store, &lease, Duration::from_secs(10)).await?;
    let state = store.inspect(&key).await?;
    match after {
        Some(RenewOutcome::Renewed(renewed)) => {
            assert_eq!(
                state.holder.map(|h| h.token),
                Some(lease.token()),
                "renewed but not the holder"
            );
            assert_eq!(store.release(&renewed).await?, ReleaseOutcome::Released);
        }
        Some(RenewOutcome::Lost) | None => {
            assert_ne!(
                state.holder.map(|h| h.token),
                Some(lease.token()),
                "lost but still the holder"
            );
        }
    }
    let other = EtcdLeaseStore::connect_with(&cluster.url(), options).await?;
    let next = super::wait_and_acquire(
        &other,
        &AcquireRequest::new(key.clone(), b, ttl),
        Duration::from_millis(200),
        Duration::from_secs(15),
    )
    .await?;
    assert!(
        next.token() > lease.token(),
        "token after restart {} !> {}",
        next.token(),
        lease.token()
    );
    Ok(())
}

/// Three members; the leader is killed while two leases are held. The holder that keeps renewing
/// either keeps its lease or loses it, never both; a waiter on the key whose holder stopped
/// renewing takes over within TTL plus election time; tokens keep increasing.
pub(crate) async fn leader_killed_in_a_three_member_cluster(ctx: Ctx) -> CaseResult {
    let timing = Timing::FAST;
    let mut cluster = Cluster::start(3, timing).await?;
    let options = EtcdOptions::default().with_request_timeout(Duration::from_secs(1));
    let holder = EtcdLeaseStore::connect_with(&cluster.url(), options.clone()).await?;
    let waiter = EtcdLeaseStore::connect_with(&cluster.url(), options.clone()).await?;
    let ttl = Duration::from_secs(2);
    let (kept, orphan) = (ctx.key("kept"), ctx.key("orphan"));
    let (a, d, b) = (
        OwnerId::with_label("a"),
        OwnerId::with_label("d"),
        OwnerId::with_label("b"),
    );
    let la = ctx.must_acquire_with(&holder, &kept, &a, ttl).await?;
    let ld = ctx.must_acquire_with(&holder, &orphan, &d, ttl).await?; // never renewed
    let before = la.token().max(ld.token());

    // The waiter watches the orphaned key from before the failure.
    let req = AcquireRequest::new(orphan.clone(), b.clone(), ttl);
    let wait = tokio::spawn(async move {
        let got = super::wait_and_acquire(
            &waiter,
            &req,
            Duration::from_millis(250),
            Duration::from_secs(30),
        )
        .await;
        (got, Instant::now())
    });

    let leader = cluster.leader(Duration::from_secs(5)).await?;
    let killed = Instant::now();
    cluster.kill(leader).await?;

    // The holder renews every ttl/4 for three TTLs, across the election.
    let mut outcomes = Vec::new();
    let mut current = la.clone();
    let end = Instant::now() + ttl * 3;
    while Instant::now() < end {
        match holder.renew(&current).await {
            Ok(RenewOutcome::Renewed(next)) => {
                assert_eq!(next.token(), la.token());
                current = next;
                outcomes.push("renewed");
            }
            Ok(RenewOutcome::Lost) => outcomes.push("lost"),
            Err(e) if e.is_retryable() => outcomes.push("error"),
            Err(e) => return Err(format!("renew during failover: {e}").into()),
        }
        tokio::time::sleep(ttl / 4).await;
    }
    if let Some(first_lost) = outcomes.iter().position(|o| *o == "lost") {
        assert!(
            !outcomes[first_lost..].contains(&"renewed"),
            "renewed after being lost: {outcomes:?}"
        );
    }
    let final_holder = holder.inspect(&kept).await?.holder.map(|h| h.token);
    match outcomes.iter().rev().find(|o| **o != "error") {
        Some(&"renewed") if current.is_valid() => {
            assert_eq!(
                final_holder,
                Some(la.token()),
                "the holder kept renewing but lost the key: {outcomes:?}"
            )
        }
        Some(&"lost") => assert_ne!(
            final_holder,
            Some(la.token()),
            "lost, yet still the holder: {outcomes:?}"
        ),
        _ => {}
    }

    let (got, at) = wait.await?;
    let lb = got?;
    let takeover = at - killed;
    let election = Duration::from_millis(timing.election_ms);
    // TTL, the election, the lease extension a new leader grants, and slack for a loaded machine.
    let bound = ttl + election * 4 + Duration::from_secs(3);
    println!(
        "etcd takeover after leader kill: {takeover:?} (bound {bound:?}); holder renewals: {outcomes:?}"
    );
    assert!(
        takeover <= bound,
        "waiter took over after {takeover:?}, bound {bound:?}"
    );
    assert!(
        lb.token() > before,
        "token after failover {} !> {before}",
        lb.token()
    );

    // The killed member rejoins; tokens keep increasing through it.
    cluster.restart(leader).await?;
    let req = AcquireRequest::new(ctx.key("after"), a, ttl);
    let again = super::wait_and_acquire(
        &holder,
        &req,
        Duration::from_millis(200),
        Duration::from_secs(10),
    )
    .await?;
    assert!(again.token() > lb.token());
    Ok(())
}
