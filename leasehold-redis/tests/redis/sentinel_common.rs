//! The Redis Sentinel group the sentinel targets run against (`LEASE_REDIS_SENTINEL_URL`,
//! started by `scripts/services/redis-sentinel.sh`), and asking its sentinels and servers.

use std::time::Duration;

use leasehold_testkit::{CaseResult, Failed};
use tokio::time::Instant;

/// The master name the service script monitors.
pub(crate) const MASTER: &str = "lease-master";

/// The group's URL: `LEASE_REDIS_SENTINEL_URL`, default the service script's ports.
pub(crate) fn url() -> String {
    leasehold_testkit::stores::REDIS_SENTINEL_URL.get()
}

/// `redis://host:port` of each sentinel in the URL.
pub(crate) fn sentinels() -> Vec<String> {
    let url = url();
    let hosts = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map_or("", |(hosts, _)| hosts);
    hosts
        .split(',')
        .map(|h| format!("redis://{}", h.trim()))
        .collect()
}

/// A command to the first sentinel that answers it.
pub(crate) async fn ask_sentinels<T: redis::FromRedisValue>(cmd: &redis::Cmd) -> Result<T, Failed> {
    let mut last = String::from("no sentinel listed");
    for s in sentinels() {
        let client = redis::Client::open(s.as_str()).map_err(|e| e.to_string())?;
        match client.get_multiplexed_async_connection().await {
            Ok(mut con) => match cmd.query_async(&mut con).await {
                Ok(v) => return Ok(v),
                Err(e) => last = format!("{s}: {e}"),
            },
            Err(e) => last = format!("{s}: {e}"),
        }
    }
    Err(last.into())
}

/// The master's `(host, port)` as the sentinels name it.
pub(crate) async fn master_addr() -> Result<(String, String), Failed> {
    ask_sentinels(
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER),
    )
    .await
}

/// The value of `name` on the server at `addr`.
pub(crate) async fn record_on(addr: &(String, String), name: &str) -> Result<String, Failed> {
    let mut con = node(addr).await?;
    let record: Option<String> = redis::cmd("GET")
        .arg(name)
        .query_async(&mut con)
        .await
        .map_err(|e| e.to_string())?;
    record.ok_or_else(|| format!("no {name} on {addr:?}").into())
}

/// A plain connection to the server at `(host, port)`.
pub(crate) async fn node(
    addr: &(String, String),
) -> Result<redis::aio::MultiplexedConnection, Failed> {
    let client = redis::Client::open(format!("redis://{}:{}", addr.0, addr.1).as_str())
        .map_err(|e| e.to_string())?;
    Ok(client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?)
}

/// Waits until the server at `addr` reports `role` (`master`, `slave`) in `ROLE`.
pub(crate) async fn wait_role(addr: &(String, String), role: &str, within: Duration) -> CaseResult {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(mut con) = node(addr).await {
            let reply: redis::RedisResult<redis::Value> =
                redis::cmd("ROLE").query_async(&mut con).await;
            if let Ok(redis::Value::Array(items)) = reply
                && let Some(redis::Value::BulkString(r)) = items.first()
                && r.as_slice() == role.as_bytes()
            {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{addr:?} did not become {role} within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the master the sentinels name has a replica in sync (`WAIT 1` on a write of our
/// own is acknowledged), so that a failover can be coordinated.
pub(crate) async fn wait_replicated(within: Duration) -> CaseResult {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(master) = master_addr().await
            && let Ok(mut con) = node(&master).await
        {
            let acked: redis::RedisResult<(String, i64)> = redis::pipe()
                .cmd("SET")
                .arg("lease-test:sentinel-probe")
                .arg(1)
                .cmd("WAIT")
                .arg(1)
                .arg(500)
                .query_async(&mut con)
                .await;
            if matches!(acked, Ok((_, n)) if n >= 1) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no replica in sync with the master within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
