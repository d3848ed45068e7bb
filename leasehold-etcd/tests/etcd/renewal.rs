//! Renewal must check the key, not only the etcd lease; waiting is watch-driven.

use std::time::Duration;

use etcd_client::{DeleteOptions, PutOptions};
use leasehold_core::{LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome};
use leasehold_etcd::EtcdLeaseStore;
use leasehold_etcd::LeaseSharing;
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::cases::Need;
use leasehold_testkit::{CaseResult, Ctx};
use tokio::time::Instant;

/// This file's cases for `sharing`.
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => vec![
            case!(
                "etcd",
                keepalive_of_a_lease_whose_key_was_deleted_is_not_a_renewal
            ),
            case!("etcd", watch_wakes_a_waiter_on_release_and_on_expiry).needs(&[Need::Watch]),
        ],
        _ => vec![
            case!(
                "etcd",
                keepalive_of_a_lease_whose_key_was_deleted_is_not_a_renewal
            ),
            case!("etcd", watch_wakes_a_waiter_on_release_and_on_expiry).needs(&[Need::Watch]),
        ],
    }
}

/// A keepalive succeeds for an etcd lease whose lock key was deleted, or replaced by a key of the
/// same name on the same etcd lease: neither is a renewal.
pub(crate) async fn keepalive_of_a_lease_whose_key_was_deleted_is_not_a_renewal(
    ctx: Ctx,
) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let mut client = store.client();
    let key = ctx.key("deleted");
    let a = OwnerId::with_label("a");
    let prefix = format!("{}/", store.options().lock_name(&key));

    // Deleted: the etcd lease lives on, the key is gone.
    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let mut got = client
        .get(
            prefix.clone(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    let kv = got.take_kvs().pop().ok_or("no lock key")?;
    let (lock_key, lease_id) = (kv.key().to_vec(), kv.lease());
    client.delete(lock_key.clone(), None).await?;
    assert_eq!(
        store.renew(&lease).await?,
        RenewOutcome::Lost,
        "renewed a lease whose key was deleted"
    );
    assert!(store.inspect(&key).await?.holder.is_none());

    // Replaced: the same key name, the same etcd lease, the same value, but a new incarnation.
    client
        .put(
            lock_key.clone(),
            kv.value().to_vec(),
            Some(PutOptions::new().with_lease(lease_id)),
        )
        .await?;
    assert_eq!(
        store.renew(&lease).await?,
        RenewOutcome::Lost,
        "renewed a lease whose key was replaced"
    );
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::NotHeld);
    client
        .delete(prefix, Some(DeleteOptions::new().with_prefix()))
        .await?;
    let _ = client.lease_revoke(lease_id).await;
    Ok(())
}

/// A waiter blocked on the watch acquires right after a release and right after an expiry
/// (measured delays are printed; the bounds are generous for a loaded machine).
pub(crate) async fn watch_wakes_a_waiter_on_release_and_on_expiry(ctx: Ctx) -> CaseResult {
    let holder = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let waiter = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let key = ctx.key("takeover");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = ctx.short_ttl();
    // Polling only every 30 s: a quick takeover can only come from the watch.
    let poll = Duration::from_secs(30);

    let lease = ctx.must_acquire(&key, &a, ctx.long_ttl()).await?;
    let req = ctx.request(&key, &b, ttl);
    let wait = tokio::spawn(async move {
        let lease = super::wait_and_acquire(&waiter, &req, poll, Duration::from_secs(20)).await;
        (lease, Instant::now(), waiter)
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // let the waiter start watching
    let released = Instant::now();
    assert_eq!(holder.release(&lease).await?, ReleaseOutcome::Released);
    let (got, at, waiter) = wait.await?;
    let got = got?;
    let after_release = at - released;
    println!("etcd takeover after release: {after_release:?}");
    assert!(
        after_release < Duration::from_secs(2),
        "takeover after release took {after_release:?}"
    );
    assert!(got.token() > lease.token());

    // Expiry: b's lease runs out unrenewed; a waits on the watch.
    let req = ctx.request(&key, &a, ctx.long_ttl());
    let granted = Instant::now();
    let next = super::wait_and_acquire(&holder, &req, poll, Duration::from_secs(20)).await?;
    let after_grant = granted.elapsed();
    println!(
        "etcd takeover after expiry: {after_grant:?} after the grant of a {:?} lease",
        got.ttl()
    );
    assert!(
        after_grant < got.ttl() + Duration::from_secs(3),
        "takeover after expiry took {after_grant:?}"
    );
    assert!(next.token() > got.token());
    drop(waiter);
    assert_eq!(holder.release(&next).await?, ReleaseOutcome::Released);
    Ok(())
}
