//! Bad configuration and TTLs below etcd's minimum: typed errors.

use std::net::TcpListener;
use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, Error, LeaseStore, OwnerId};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions};
use leasehold_testkit::{CaseResult, Ctx};
use tokio::time::Instant;

use super::cluster::{Cluster, Timing};
use leasehold_etcd::LeaseSharing;
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;

/// This file's cases for `sharing` (PerGrant only: input checks do not depend on the sharing mode).
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => Vec::new(),
        _ => vec![
            case!("etcd", unreachable_endpoints_fail_fast_and_retryable),
            case!("etcd", malformed_endpoints_are_config_errors),
            case!(
                "etcd",
                ttl_below_the_server_minimum_is_invalid_and_others_round_up
            ),
        ],
    }
}

/// A refused port and a port that accepts connections but never answers fail within the
/// timeouts, as retryable errors.
pub(crate) async fn unreachable_endpoints_fail_fast_and_retryable(_ctx: Ctx) -> CaseResult {
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    // The kernel completes the TCP handshake into the backlog; nobody ever speaks HTTP/2.
    let silent = TcpListener::bind("127.0.0.1:0")?;
    let silent_port = silent.local_addr()?.port();
    for endpoint in [
        format!("etcd://127.0.0.1:{closed}"),
        format!("etcd://127.0.0.1:{silent_port}"),
    ] {
        let options = EtcdOptions::default()
            .with_connect_timeout(Duration::from_millis(300))
            .with_request_timeout(Duration::from_millis(700));
        let started = Instant::now();
        match EtcdLeaseStore::connect_with(&endpoint, options).await {
            Err(e @ (Error::Unavailable { .. } | Error::Timeout { .. })) => {
                assert!(e.is_retryable())
            }
            other => {
                return Err(
                    format!("{endpoint}: expected Unavailable or Timeout, got {other:?}").into(),
                );
            }
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "{endpoint}: failing took {took:?}"
        );
    }
    drop(silent);
    Ok(())
}

/// Empty, scheme-less garbage and broken URLs are configuration errors, before any I/O.
pub(crate) async fn malformed_endpoints_are_config_errors(_ctx: Ctx) -> CaseResult {
    let urls = [
        "",
        "etcd://",
        "http://127.0.0.1:2379",
        "ftp://host:2379",
        "etcd://bad host:1",
        "etcd://h:1,::::",
        "etcd://h:1,,h:2",
        "etcd://[::1:2379",
    ];
    for url in urls {
        match EtcdLeaseStore::connect(url).await {
            Err(Error::Config { message, .. }) if message.contains(url) => {}
            other => {
                return Err(format!("{url:?}: expected Config naming it, got {other:?}").into());
            }
        }
    }
    let zero = EtcdOptions::default().with_request_timeout(Duration::ZERO);
    assert!(matches!(
        EtcdLeaseStore::connect_with("etcd://127.0.0.1:1", zero).await,
        Err(Error::Config { .. })
    ));
    Ok(())
}

/// On a member with etcd's default timing the minimum TTL is 2 s: the store reports it, 1 s and
/// 1.5 s TTLs are `InvalidTtl` and create nothing, and 2.5 s is granted as 3 s (reported in the
/// lease and by inspect).
pub(crate) async fn ttl_below_the_server_minimum_is_invalid_and_others_round_up(
    ctx: Ctx,
) -> CaseResult {
    let cluster = Cluster::start(1, Timing::DEFAULT).await?;
    let store = EtcdLeaseStore::connect(&cluster.url()).await?;
    assert_eq!(store.capabilities().min_ttl, Duration::from_secs(2));
    assert_eq!(store.capabilities().ttl_granularity, Duration::from_secs(1));
    let key = ctx.key("min-ttl");
    let a = OwnerId::with_label("a");
    for ttl in [Duration::from_secs(1), Duration::from_millis(1500)] {
        match store
            .acquire(&AcquireRequest::new(key.clone(), a.clone(), ttl))
            .await
        {
            Err(Error::InvalidTtl { .. }) => {}
            other => {
                return Err(format!(
                    "{ttl:?} below a 2 s minimum: expected InvalidTtl, got {other:?}"
                )
                .into());
            }
        }
    }
    let state = store.inspect(&key).await?;
    assert!(state.holder.is_none() && state.last_token.is_none());
    let asked = Duration::from_millis(2500);
    let lease = match store
        .acquire(&AcquireRequest::new(key.clone(), a, asked))
        .await?
    {
        AcquireOutcome::Acquired(lease) => lease,
        AcquireOutcome::Held(h) => return Err(format!("fresh key held by {}", h.owner).into()),
    };
    assert_eq!(lease.ttl(), Duration::from_secs(3), "granted ttl");
    assert!(lease.remaining() <= Duration::from_secs(3));
    let holder = store.inspect(&key).await?.holder.ok_or("not held")?;
    assert_eq!(holder.ttl, Duration::from_secs(3));
    Ok(())
}
