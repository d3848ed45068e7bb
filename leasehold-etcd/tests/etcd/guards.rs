//! The comparisons of the transactions that the shared suite's flows never put to the test:
//! each case builds the state in which a comparison alone decides, and checks that nothing
//! changes. The replacement of a same-owner re-acquire is sent when a newer contender queued
//! after the holder read (a race the store cannot be made to lose on cue, so its transaction is
//! sent directly, built by [`protocol::acquire_txn`] as the store builds it); the sweeper of a
//! store sharing etcd leases meets a key moved onto another store's etcd lease, and a new
//! incarnation of its key's name; a renewal through another store carries a wrong token.
//!
//! Every case builds its own stores with [`LeaseSharing::PerTtl`] where it needs them, so the
//! cases run once, in the `etcd` target.

use std::time::Duration;

use etcd_client::{Client, PutOptions};
use leasehold_core::{Lease, LeaseKey, LeaseStore, OwnerId, RenewOutcome};
use leasehold_etcd::{EtcdLeaseStore, LeaseSharing, protocol};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::time::Instant;

/// This file's cases (in the `etcd` target only: they choose their stores' sharing mode).
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => Vec::new(),
        _ => vec![
            case!("etcd", a_replacement_fails_while_a_newer_contender_queues),
            case!(
                "etcd",
                the_sweeper_leaves_a_key_moved_onto_another_etcd_lease
            ),
            case!("etcd", the_sweeper_leaves_a_new_incarnation_of_its_key_name),
            case!(
                "etcd",
                a_renewal_with_a_wrong_token_through_another_store_moves_nothing
            ),
        ],
    }
}

/// A store sharing etcd leases per TTL.
async fn per_ttl() -> Result<EtcdLeaseStore, Failed> {
    let options = super::options().with_lease_sharing(LeaseSharing::PerTtl);
    Ok(EtcdLeaseStore::connect_with(&super::url(), options).await?)
}

/// The only key under `key`'s lock prefix: (name, create revision, etcd lease).
async fn only_lock_key(
    client: &mut Client,
    store: &EtcdLeaseStore,
    key: &LeaseKey,
) -> Result<(String, i64, i64), Failed> {
    let prefix = protocol::mutex_prefix(store.options().prefix(), key);
    let resp = client
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await?;
    match resp.kvs() {
        [kv] => Ok((
            String::from_utf8_lossy(kv.key()).into_owned(),
            kv.create_revision(),
            kv.lease(),
        )),
        kvs => Err(format!("expected one lock key, found {}", kvs.len()).into()),
    }
}

/// The create revision and etcd lease of `name`, if it exists.
async fn lock_key(client: &mut Client, name: &str) -> Result<Option<(i64, i64)>, Failed> {
    let resp = client.get(name, None).await?;
    Ok(resp
        .kvs()
        .first()
        .map(|kv| (kv.create_revision(), kv.lease())))
}

/// Waits (bounded by `within`) until `key` has no holder.
async fn wait_free(store: &dyn LeaseStore, key: &LeaseKey, within: Duration) -> CaseResult {
    let deadline = Instant::now() + within;
    while store.inspect(key).await?.holder.is_some() {
        if Instant::now() >= deadline {
            return Err(format!("{key} still held after {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The holder's own key replaced by a same-owner re-acquire: the replacing transaction compares
/// that nothing under the lock prefix is newer than the holder's key. Sent after an `etcdctl
/// lock` waiter (a key with an empty value on an etcd lease of its own, as etcdctl and Go's mutex
/// write it) queued behind the holder, it fails and changes nothing: the holder's key stays, so
/// the waiter still waits. Had it replaced the key, the new key would be newer than the waiter's,
/// and the waiter (the lowest create revision) would hold the lock while the store reported a
/// grant.
pub(crate) async fn a_replacement_fails_while_a_newer_contender_queues(ctx: Ctx) -> CaseResult {
    let store = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let mut client = store.client();
    let key = ctx.key("replace-queued");
    let a = OwnerId::with_label("a");
    let lease = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    let (held, created, _) = only_lock_key(&mut client, &store, &key).await?;
    assert_eq!(created, lease.token().to_i64());

    let waiter_lease = client.lease_grant(30, None).await?.id();
    let prefix = store.options().prefix();
    let waiter = protocol::lock_key(prefix, &key, waiter_lease, None);
    client
        .put(
            waiter.as_str(),
            "",
            Some(PutOptions::new().with_lease(waiter_lease)),
        )
        .await?;
    let replacement_lease = client.lease_grant(30, None).await?.id();
    let txn = protocol::acquire_txn(
        &protocol::mutex_prefix(prefix, &key),
        Some((held.as_bytes(), created)),
        &protocol::slot_key(prefix, &key, 1),
        &a,
        replacement_lease,
    );
    let replaced = client.txn(txn).await?.succeeded();
    let still = lock_key(&mut client, &held).await?;
    let holder = store.inspect(&key).await?.holder;
    for id in [waiter_lease, replacement_lease] {
        let _ = client.lease_revoke(id).await;
    }
    assert!(
        !replaced,
        "the replacement succeeded although a newer contender queued"
    );
    assert_eq!(
        still.map(|(c, _)| c),
        Some(created),
        "the holder's key changed"
    );
    assert_eq!(holder.map(|h| (h.owner, h.token)), Some((a, lease.token())));
    Ok(())
}

/// Two stores sharing etcd leases: a key acquired through the first is renewed through the
/// second (which moves it onto its own etcd lease) and kept renewed there. When the first
/// store's record of the key runs out, its sweeper's delete compares the etcd lease and leaves
/// the key alone: it stays held, and the second store's renewals keep succeeding, until a
/// sibling key acquired later through the first store (never renewed) has been swept.
pub(crate) async fn the_sweeper_leaves_a_key_moved_onto_another_etcd_lease(ctx: Ctx) -> CaseResult {
    let (first, second) = (per_ttl().await?, per_ttl().await?);
    let ttl = ctx.short_ttl();
    let (key, sibling) = (ctx.key("moved"), ctx.key("moved-sibling"));
    let a = OwnerId::with_label("a");
    let l0 = ctx.must_acquire_with(&first, &key, &a, ttl).await?;
    let mut lease = match second.renew(&l0).await? {
        RenewOutcome::Renewed(l) => l,
        RenewOutcome::Lost => return Err("renewal through the second store: Lost".into()),
    };
    // The sibling's record in the first store runs out after the moved key's: once the sweeper
    // has deleted it, it has handled the moved key as well.
    tokio::time::sleep(Duration::from_millis(500)).await;
    ctx.must_acquire_with(&first, &sibling, &a, ttl).await?;
    let deadline = Instant::now() + ctx.expiry_deadline(ttl);
    let mut swept = false;
    loop {
        let holder = first.inspect(&key).await?.holder.map(|h| h.token);
        if holder != Some(lease.token()) {
            return Err(format!(
                "the moved key is not held (holder token {holder:?}) although the second store \
                 renewed it"
            )
            .into());
        }
        if swept {
            break;
        }
        swept = first.inspect(&sibling).await?.holder.is_none();
        if Instant::now() >= deadline {
            return Err("the sibling key was never swept".into());
        }
        tokio::time::sleep(ttl / 4).await;
        lease = match second.renew(&lease).await? {
            RenewOutcome::Renewed(l) => l,
            RenewOutcome::Lost => {
                return Err("the second store's renewal of the moved key: Lost".into());
            }
        };
    }
    assert_eq!(lease.token(), l0.token());
    Ok(())
}

/// A store sharing etcd leases keeps a record of each key it put on its etcd lease. If the key's
/// name comes to hold a new incarnation on that same etcd lease (a key deleted and created again:
/// what an etcd lease id granted again after its lease ended, with a fresh store's nonces starting
/// over, produces), the sweeper's delete of the old incarnation compares the create revision and
/// leaves the new one alone.
pub(crate) async fn the_sweeper_leaves_a_new_incarnation_of_its_key_name(ctx: Ctx) -> CaseResult {
    let store = per_ttl().await?;
    let mut client = store.client();
    let ttl = ctx.short_ttl();
    let (key, sibling) = (ctx.key("incarnation"), ctx.key("incarnation-sibling"));
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let old = ctx.must_acquire_with(&store, &key, &a, ttl).await?;
    let (name, created, etcd_lease) = only_lock_key(&mut client, &store, &key).await?;
    assert_eq!(created, old.token().to_i64());
    client.delete(name.as_str(), None).await?;
    client
        .put(
            name.as_str(),
            protocol::encode_owner(&b),
            Some(PutOptions::new().with_lease(etcd_lease)),
        )
        .await?;
    let (again, _) = lock_key(&mut client, &name)
        .await?
        .ok_or("the new incarnation is missing")?;
    assert!(again > created);
    // The sibling's record runs out after the old incarnation's (see the moved-key case).
    tokio::time::sleep(Duration::from_millis(500)).await;
    ctx.must_acquire_with(&store, &sibling, &a, ttl).await?;
    // Nobody renews through the store: the test keeps the shared etcd lease alive itself, so
    // that only the sweeper deletes keys.
    let deadline = Instant::now() + ctx.expiry_deadline(ttl);
    loop {
        client.lease_keep_alive(etcd_lease).await?;
        if store.inspect(&sibling).await?.holder.is_none() {
            break;
        }
        if Instant::now() >= deadline {
            return Err("the sibling key was never swept".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = lock_key(&mut client, &name).await?;
    let _ = client.delete(name.as_str(), None).await;
    assert_eq!(
        now,
        Some((again, etcd_lease)),
        "the sweeper deleted a new incarnation of its key's name"
    );
    Ok(())
}

/// A renewal through a second store of a lease that carries the holder's handle but a wrong
/// token is Lost and moves nothing: the key stays on the first store's etcd lease with its
/// token, and the holder's own renewal through the first store still succeeds.
pub(crate) async fn a_renewal_with_a_wrong_token_through_another_store_moves_nothing(
    ctx: Ctx,
) -> CaseResult {
    let (first, second) = (per_ttl().await?, per_ttl().await?);
    let mut client = first.client();
    let key = ctx.key("move-wrong-token");
    let a = OwnerId::with_label("a");
    let ttl = ctx.long_ttl();
    let lease = ctx.must_acquire_with(&first, &key, &a, ttl).await?;
    let handle = lease.handle().ok_or("a granted lease has a handle")?;
    let (name, created, etcd_lease) = only_lock_key(&mut client, &first, &key).await?;
    let lower = leasehold_core::FencingToken::new(lease.token().get() - 1)?;
    for token in [lease.token().next()?, lower] {
        let forged = Lease::resume(key.clone(), a.clone(), token, ttl).with_handle(handle);
        assert_eq!(
            second.renew(&forged).await?,
            RenewOutcome::Lost,
            "a renewal with token {token} (the key's is {created}) through another store"
        );
        assert_eq!(
            lock_key(&mut client, &name).await?,
            Some((created, etcd_lease)),
            "the refused renewal moved the key"
        );
    }
    match first.renew(&lease).await? {
        RenewOutcome::Renewed(l) => assert_eq!(l.token(), lease.token()),
        RenewOutcome::Lost => return Err("the holder's own renewal: Lost".into()),
    }
    Ok(())
}
