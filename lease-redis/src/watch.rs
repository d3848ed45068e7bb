//! Waking waiters: the release channel, keyspace notifications for expiry, and bounded polling
//! when the server does not publish them.

use futures::StreamExt;
use lease_core::{KeyWatch, LeaseKey, Result};

use crate::error::map_redis;
use crate::store::RedisLeaseStore;

/// Whether the server publishes keyspace events for expiry (`notify-keyspace-events` contains
/// `K` and `x` or `A`). `CONFIG` may be disabled (managed Redis): then we assume not.
async fn expiry_notifications(store: &RedisLeaseStore) -> bool {
    let mut con = store.connection();
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(&mut con)
        .await;
    match reply {
        Ok(v) => v.get(1).is_some_and(|flags| {
            flags.contains('K') && (flags.contains('x') || flags.contains('A'))
        }),
        Err(_) => false,
    }
}

/// Subscribes (on a dedicated pub/sub connection) to the key's release channel and, when the
/// server publishes them, to the keyspace events of the lease hash (expiry, deletion, grants).
/// Without keyspace events the watch also signals every poll interval, so a waiter still notices
/// an expiry within that bound.
pub(crate) async fn watch(store: &RedisLeaseStore, key: &LeaseKey) -> Result<KeyWatch> {
    let inner = &store.inner;
    let notify = expiry_notifications(store).await;
    let connect = inner.client.get_async_pubsub();
    let mut pubsub = match tokio::time::timeout(inner.connect_timeout, connect).await {
        Ok(r) => r.map_err(|e| map_redis("watch", inner.connect_timeout, e))?,
        Err(_) => {
            return Err(lease_core::Error::Timeout {
                backend: crate::BACKEND,
                operation: "watch",
                after: inner.connect_timeout,
            });
        }
    };
    let map = |e| map_redis("watch", inner.response_timeout, e);
    pubsub
        .subscribe(inner.layout.released_channel(key))
        .await
        .map_err(map)?;
    if notify {
        let channel = format!("__keyspace@{}__:{}", inner.db, inner.layout.lease(key));
        pubsub.subscribe(channel).await.map_err(map)?;
    }
    let messages = pubsub.into_on_message().map(|_| Ok(()));
    if notify {
        return Ok(KeyWatch::new(Box::pin(messages)));
    }
    let interval = inner.poll_interval;
    let ticks = futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(interval).await;
        Some((Ok(()), ()))
    });
    Ok(KeyWatch::new(Box::pin(futures::stream::select(
        messages, ticks,
    ))))
}
