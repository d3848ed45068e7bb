//! `LeaseSharing::PerTtl`: an acquire whose caller never learns the outcome (its future dropped,
//! or its connection reset, after the put was sent) leaves no lock key alive on the shared etcd
//! lease, although other keys keep that etcd lease alive.

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use leasehold_core::{AcquireRequest, LeaseStore, OwnerId, RenewOutcome};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
use leasehold_faults::proxy::{FaultProxy, Mode};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};
use tokio::time::Instant;

/// This file's cases for `sharing` (PerTtl only: with one etcd lease per grant a failed acquire revokes its lease).
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => vec![
            case!("etcd", a_dropped_acquire_leaves_no_key_alive),
            case!("etcd", a_failed_acquire_leaves_no_key_alive),
            case!("etcd", a_dropped_batched_acquire_leaves_no_key_alive),
            case!(
                "etcd",
                a_put_committed_after_the_sweepers_read_leaves_no_key_alive
            ),
        ],
        _ => Vec::new(),
    }
}

/// How the caller abandons its acquire once the put is applied.
#[derive(Debug, Clone, Copy)]
enum Abandon {
    /// The acquire future is dropped (a `timeout` around it, a cancelled task).
    Drop,
    /// The same, for an `acquire_many` of the one key (its batched transaction).
    DropBatch,
    /// The connection is reset before the answer arrives: the acquire fails with an error.
    Reset,
}

/// Once the acquire's put is seen in etcd (while a 500 ms proxy latency still holds back the
/// answer), the caller abandons the acquire. The store goes on renewing another key with the
/// same TTL, so the shared etcd lease lives; another owner must still get the key soon.
async fn abandoned_acquire_frees_the_key(ctx: Ctx, how: Abandon) -> CaseResult {
    let endpoint = super::endpoints();
    let first = endpoint.split(',').next().unwrap_or_default().trim();
    let upstream: SocketAddr = first
        .trim_start_matches("http://")
        .parse()
        .map_err(|e| format!("endpoint {first}: {e}"))?;
    let proxy = FaultProxy::start(upstream).await?;
    let options = EtcdOptions::default().with_lease_sharing(LeaseSharing::PerTtl);
    let store = EtcdLeaseStore::connect_with(&format!("etcd://{}", proxy.addr()), options).await?;
    let direct = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    // Long enough for `kept` to outlive the slow (proxied) acquire without a renewal.
    let ttl = Duration::from_secs(8);
    let (kept, abandoned) = (ctx.key("kept"), ctx.key("abandoned"));
    let a = OwnerId::with_label("a");
    let mut keep = ctx.must_acquire_with(&store, &kept, &a, ttl).await?;

    let prefix = format!("{}/", direct.options().lock_name(&abandoned));
    let mut events = direct
        .client()
        .watch(prefix, Some(WatchOptions::new().with_prefix()))
        .await?;
    match events.message().await? {
        Some(r) if r.created() => {}
        other => return Err(format!("watch not created: {other:?}").into()),
    }
    proxy.set_mode(Mode::Latency(Duration::from_millis(500)));
    let req = AcquireRequest::new(abandoned.clone(), OwnerId::with_label("b"), ttl);
    let mut acquire: futures::future::BoxFuture<'_, leasehold_core::Result<String>> = match how {
        Abandon::DropBatch => Box::pin(async {
            let out = store.acquire_many(std::slice::from_ref(&req)).await?;
            Ok(format!("{out:?}"))
        }),
        _ => Box::pin(async { Ok(format!("{:?}", store.acquire(&req).await?)) }),
    };
    let put_seen = async {
        loop {
            match events.message().await {
                Ok(Some(r)) if r.events().iter().any(|e| e.event_type() == EventType::Put) => {
                    return Ok::<(), Failed>(());
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err("the watch ended".into()),
                Err(e) => return Err(e.into()),
            }
        }
    };
    tokio::select! {
        r = &mut acquire => {
            return Err(format!("the acquire answered before its put was seen: {r:?}").into());
        }
        seen = tokio::time::timeout(Duration::from_secs(20), put_seen) => {
            seen.map_err(|_| "the acquire's put was not seen within 20 s")??;
        }
    }
    match how {
        Abandon::Drop | Abandon::DropBatch => drop(acquire),
        Abandon::Reset => {
            proxy.set_mode(Mode::Reset);
            match acquire.await {
                Err(e) => println!("the reset acquire failed: {e}"),
                Ok(o) => return Err(format!("the reset acquire answered {o:?}").into()),
            }
        }
    }
    proxy.heal();
    let abandoned_at = Instant::now();

    // The abandoned key is on the same shared etcd lease as `kept`, which stays renewed.
    let c = OwnerId::with_label("c");
    let other = ctx.request(&abandoned, &c, ttl);
    let waiter = super::wait_and_acquire(&direct, &other, Duration::from_millis(200), ttl * 2);
    tokio::pin!(waiter);
    let got = loop {
        tokio::select! {
            got = &mut waiter => break got,
            () = tokio::time::sleep(ttl / 4) => match store.renew(&keep).await? {
                RenewOutcome::Renewed(next) => keep = next,
                RenewOutcome::Lost => return Err("the renewed key was lost".into()),
            },
        }
    };
    let lease = got.map_err(|e| format!("{how:?}: the abandoned key locks others out: {e:?}"))?;
    println!(
        "{how:?}: abandoned key free for another owner after {:?} (ttl {ttl:?})",
        abandoned_at.elapsed()
    );
    assert_eq!(
        direct.release(&lease).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    assert!(matches!(
        store.renew(&keep).await?,
        RenewOutcome::Renewed(_)
    ));
    Ok(())
}

/// An acquire future dropped after its put was applied: the key is freed, not kept alive by the
/// shared etcd lease.
pub(crate) async fn a_dropped_acquire_leaves_no_key_alive(ctx: Ctx) -> CaseResult {
    abandoned_acquire_frees_the_key(ctx, Abandon::Drop).await
}

/// An `acquire_many` future dropped after its batched transaction put the key: the key is freed,
/// not kept alive by the shared etcd lease.
pub(crate) async fn a_dropped_batched_acquire_leaves_no_key_alive(ctx: Ctx) -> CaseResult {
    abandoned_acquire_frees_the_key(ctx, Abandon::DropBatch).await
}

/// An acquire that failed (connection reset) after its put was applied: the key is freed, not
/// kept alive by the shared etcd lease.
pub(crate) async fn a_failed_acquire_leaves_no_key_alive(ctx: Ctx) -> CaseResult {
    abandoned_acquire_frees_the_key(ctx, Abandon::Reset).await
}

/// An acquire dropped before its put reaches etcd, the put committing a second later (the test
/// hook sends it from a task that outlives the acquire, as a request already on the wire is
/// applied): the sweeper's first read of the key finds nothing, and the key that appears later
/// on the shared etcd lease, kept alive by another key's renewals, must still be deleted.
pub(crate) async fn a_put_committed_after_the_sweepers_read_leaves_no_key_alive(
    ctx: Ctx,
) -> CaseResult {
    let options = EtcdOptions::default().with_lease_sharing(LeaseSharing::PerTtl);
    let store = EtcdLeaseStore::connect_with(&super::url(), options).await?;
    let direct = EtcdLeaseStore::connect_with(&super::url(), super::options()).await?;
    let ttl = Duration::from_secs(3);
    let (kept, abandoned) = (ctx.key("kept"), ctx.key("late"));
    let a = OwnerId::with_label("a");
    let mut keep = ctx.must_acquire_with(&store, &kept, &a, ttl).await?;

    let prefix = format!("{}/", direct.options().lock_name(&abandoned));
    let mut events = direct
        .client()
        .watch(prefix, Some(WatchOptions::new().with_prefix()))
        .await?;
    match events.message().await? {
        Some(r) if r.created() => {}
        other => return Err(format!("watch not created: {other:?}").into()),
    }
    store.delay_acquire_puts(Duration::from_secs(1));
    let req = AcquireRequest::new(abandoned.clone(), OwnerId::with_label("b"), ttl);
    // Given up long before the put is sent; the sweeper reads the key within 100 ms of that.
    let gave_up = tokio::time::timeout(Duration::from_millis(100), store.acquire(&req)).await;
    if let Ok(r) = gave_up {
        return Err(format!("the delayed acquire answered: {r:?}").into());
    }
    store.delay_acquire_puts(Duration::ZERO);
    let put_seen = async {
        loop {
            match events.message().await {
                Ok(Some(r)) if r.events().iter().any(|e| e.event_type() == EventType::Put) => {
                    return Ok::<(), Failed>(());
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err("the watch ended".into()),
                Err(e) => return Err(e.into()),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), put_seen)
        .await
        .map_err(|_| "the late put was not seen within 20 s")??;
    let committed = Instant::now();

    // The late key is on the same shared etcd lease as `kept`, which stays renewed.
    let other = ctx.request(&abandoned, &OwnerId::with_label("c"), ttl);
    let waiter = super::wait_and_acquire(&direct, &other, Duration::from_millis(200), ttl * 4);
    tokio::pin!(waiter);
    let got = loop {
        tokio::select! {
            got = &mut waiter => break got,
            () = tokio::time::sleep(ttl / 4) => match store.renew(&keep).await? {
                RenewOutcome::Renewed(next) => keep = next,
                RenewOutcome::Lost => return Err("the renewed key was lost".into()),
            },
        }
    };
    let lease = got.map_err(|e| format!("the late key locks others out: {e:?}"))?;
    println!(
        "late put: key free for another owner {:?} after it committed (ttl {ttl:?})",
        committed.elapsed()
    );
    assert_eq!(
        direct.release(&lease).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    assert!(matches!(
        store.renew(&keep).await?,
        RenewOutcome::Renewed(_)
    ));
    Ok(())
}
