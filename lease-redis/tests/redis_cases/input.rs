//! Bad configuration: each a typed error, before or instead of touching any data.

use std::time::Duration;

use lease_core::Error;
use lease_redis::RedisLeaseStore;
use lease_testkit::{CaseResult, Ctx};

use super::url;

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
