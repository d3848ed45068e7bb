//! Bad configuration: each a typed error, before or instead of touching any data.

use std::time::Duration;

use lease_core::{AcquireRequest, Error, LeaseStore, OwnerId};
use lease_redis::RedisLeaseStore;
use lease_testkit::{CaseResult, Ctx};

use super::server::RedisServer;
use super::{acquire_on, retry_within, url};

/// An unparsable URL and a prefix that would break cluster slotting are `Config` errors; a
/// server that refuses connections is `Unavailable` (retryable).
pub(crate) async fn bad_configuration_is_a_typed_error(_ctx: Ctx) -> CaseResult {
    for bad in [
        "not a url",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "",
    ] {
        match RedisLeaseStore::connect(bad).await {
            Err(Error::Config {
                backend: "redis", ..
            }) => {}
            other => return Err(format!("url {bad:?}: expected Config, got {other:?}").into()),
        }
    }
    for bad in ["a{b", "tag}", "{x}", "", "has space"] {
        match RedisLeaseStore::builder(url()).prefix(bad).connect().await {
            Err(Error::Config {
                backend: "redis", ..
            }) => {}
            other => return Err(format!("prefix {bad:?}: expected Config, got {other:?}").into()),
        }
    }
    let wait_too_long = RedisLeaseStore::builder(url())
        .response_timeout(Duration::from_secs(1))
        .wait_for_replicas(1, Duration::from_secs(1))
        .connect()
        .await;
    assert!(
        matches!(wait_too_long, Err(Error::Config { .. })),
        "{wait_too_long:?}"
    );

    // A free port with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let refused = RedisLeaseStore::builder(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1))
        .connect_retries(0)
        .connect()
        .await;
    match refused {
        Err(
            e @ Error::Unavailable {
                backend: "redis", ..
            },
        ) => assert!(e.is_retryable()),
        other => {
            return Err(format!("refused connection: expected Unavailable, got {other:?}").into());
        }
    }
    Ok(())
}

/// A server that stops answering (frozen with SIGSTOP) makes operations fail with `Timeout`
/// after the response timeout; once it answers again the same store works.
pub(crate) async fn a_frozen_server_is_a_timeout(ctx: Ctx) -> CaseResult {
    let server = RedisServer::start(&[]).await?;
    let store = RedisLeaseStore::builder(server.url())
        .prefix("frozen")
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await?;
    let key = ctx.key("frozen");
    let owner = OwnerId::with_label("a");
    server.signal("STOP")?;
    let out = store
        .acquire(&AcquireRequest::new(
            key.clone(),
            owner.clone(),
            Duration::from_secs(2),
        ))
        .await;
    server.signal("CONT")?;
    match out {
        Err(
            e @ Error::Timeout {
                backend: "redis", ..
            },
        ) => assert!(e.is_retryable() && e.outcome_unknown()),
        other => return Err(format!("frozen server: expected Timeout, got {other:?}").into()),
    }
    let state = retry_within(Duration::from_secs(10), || store.inspect(&key)).await?;
    // The request was sent before the freeze was noticed, so it may have been applied: either way
    // the store answers consistently once the server is back.
    if let Some(holder) = state.holder {
        assert_eq!(holder.owner, owner);
    }
    acquire_on(&store, &key, &owner, Duration::from_secs(2)).await?;
    Ok(())
}
