//! Bad configuration: each a typed error, before or instead of touching any data.

use std::time::Duration;

use leasehold_core::{AcquireRequest, Error, LeaseStore, OwnerId};
use leasehold_faults::proxy::{FaultProxy, Mode};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx};

use crate::cases::{acquire_on, retry_within, url};
use crate::server::RedisServer;

/// An unparsable URL and a prefix that would break cluster slotting are `Config` errors; a
/// server that refuses connections is `Unavailable` (retryable). A zero response or connect timeout
/// is a `Config` error; `Duration::MAX` works (every deadline saturates, nothing panics).
pub(crate) async fn bad_configuration_is_a_typed_error(ctx: Ctx) -> CaseResult {
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
        match RedisLeaseStore::connect_with(&url(), RedisOptions::default().with_prefix(bad)).await
        {
            Err(Error::Config {
                backend: "redis", ..
            }) => {}
            other => return Err(format!("prefix {bad:?}: expected Config, got {other:?}").into()),
        }
    }
    let wait_too_long = RedisLeaseStore::connect_with(
        &url(),
        RedisOptions::default()
            .with_response_timeout(Duration::from_secs(1))
            .with_wait_for_replicas(1, Duration::from_secs(1)),
    )
    .await;
    assert!(
        matches!(wait_too_long, Err(Error::Config { .. })),
        "{wait_too_long:?}"
    );

    for (response, connect) in [
        (Duration::ZERO, Duration::from_secs(1)),
        (Duration::from_secs(1), Duration::ZERO),
    ] {
        let zero = RedisLeaseStore::connect_with(
            &url(),
            RedisOptions::default()
                .with_response_timeout(response)
                .with_connect_timeout(connect),
        )
        .await;
        assert!(
            matches!(zero, Err(Error::Config { .. })),
            "zero timeout: {zero:?}"
        );
    }
    // `Duration::MAX` is not an error, and must not panic anywhere (deadlines saturate).
    let huge = RedisLeaseStore::connect_with(
        &url(),
        RedisOptions::default()
            .with_prefix(crate::cases::PREFIX)
            .with_response_timeout(Duration::MAX)
            .with_connect_timeout(Duration::MAX),
    )
    .await?;
    assert_eq!(huge.op_deadline(), Duration::MAX);
    let key = ctx.key("huge-timeouts");
    let held = acquire_on(
        &huge,
        &key,
        &OwnerId::with_label("a"),
        Duration::from_secs(5),
    )
    .await?;
    let mut watch = huge.watch(&key).await?.ok_or("redis claims watch")?;
    assert_eq!(
        huge.release(&held).await?,
        leasehold_core::ReleaseOutcome::Released
    );
    match tokio::time::timeout(Duration::from_secs(10), watch.changed()).await {
        Ok(Some(Ok(()))) => {}
        other => return Err(format!("watch with huge timeouts: {other:?}").into()),
    }

    // A free port with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let refused = RedisLeaseStore::connect_with(
        &format!("redis://127.0.0.1:{port}"),
        RedisOptions::default()
            .with_connect_timeout(Duration::from_secs(1))
            .with_connect_retries(0),
    )
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
    let store = RedisLeaseStore::connect_with(
        &server.url(),
        RedisOptions::default()
            .with_prefix("frozen")
            .with_response_timeout(Duration::from_millis(300)),
    )
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

/// While every connection to the server is reset (a server that crashes on accept, a load
/// balancer without backends), each operation still returns a retryable error within the store's
/// deadline, even with a connection manager told to retry (re)connecting a hundred thousand
/// times: an operation never waits out the retries. Once the fault heals the same store works.
pub(crate) async fn operations_are_bounded_while_the_connection_is_being_reset(
    ctx: Ctx,
) -> CaseResult {
    const HUNG: Duration = Duration::from_secs(30);
    let server = RedisServer::start(&[]).await?;
    let proxy = FaultProxy::start(([127, 0, 0, 1], server.port()).into())
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    let store = RedisLeaseStore::connect_with(
        &format!("redis://127.0.0.1:{}", proxy.port()),
        RedisOptions::default()
            .with_prefix("reset")
            .with_response_timeout(Duration::from_millis(300))
            .with_connect_timeout(Duration::from_millis(300))
            .with_connect_retries(100_000),
    )
    .await?;
    let key = ctx.key("reset");
    let owner = OwnerId::with_label("a");
    let held = acquire_on(&store, &key, &owner, Duration::from_secs(30)).await?;

    proxy.set_mode(Mode::Reset);
    for attempt in 0..3 {
        match tokio::time::timeout(HUNG, store.renew(&held)).await {
            Ok(Err(e)) if e.is_retryable() => {}
            Ok(other) => {
                return Err(format!(
                    "renew {attempt} through resets: expected a retryable error, got {other:?}"
                )
                .into());
            }
            Err(_) => {
                return Err(format!("renew {attempt} through resets hung for {HUNG:?}").into());
            }
        }
    }
    proxy.heal();
    let state = retry_within(Duration::from_secs(10), || store.inspect(&key)).await?;
    assert_eq!(state.holder.map(|h| h.token), Some(held.token()));
    Ok(())
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("redis", bad_configuration_is_a_typed_error),
        case!("redis", a_frozen_server_is_a_timeout),
        case!(
            "redis",
            operations_are_bounded_while_the_connection_is_being_reset
        ),
    ]
}
