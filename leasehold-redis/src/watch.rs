//! Waking waiters: the release channel, keyspace notifications for expiry, and bounded polling
//! when the server does not publish them. Every step is bounded: setting up a watch by the
//! store's operation deadline, and an open watch by a keepalive `PING` that must be answered
//! within the response timeout.

use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{Error, KeyWatch, LeaseKey, Result};
use redis::Msg;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::time::{Instant, sleep_until};

use crate::error::BACKEND;
use crate::error::map;
use crate::store::{RedisLeaseStore, bounded};

/// Whether the server publishes keyspace events for expiry (`notify-keyspace-events` contains
/// `K` and `x` or `A`; never on a cluster). `CONFIG` may be disabled (managed Redis), or the server may not answer
/// within the response timeout: then we assume not (and poll).
async fn expiry_notifications(store: &RedisLeaseStore) -> bool {
    // Keyspace events are published only on the node that holds the key, which may change: on
    // a cluster, poll.
    if store.inner.con.is_cluster() {
        return false;
    }
    let mut con = store.connection();
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("notify-keyspace-events");
    let query = cmd.query_async::<Vec<String>>(&mut con);
    match bounded("watch", store.inner.response_timeout, query).await {
        Ok(Ok(v)) => v.get(1).is_some_and(|flags| {
            flags.contains('K') && (flags.contains('x') || flags.contains('A'))
        }),
        _ => false,
    }
}

/// Subscribes (on a dedicated pub/sub connection) to the key's release channel and, when the
/// server publishes them, to the keyspace events of the lease record (only expiry and deletion wake
/// the watcher). Without keyspace events the watch also signals every poll interval, so a waiter
/// still notices an expiry within that bound.
///
/// The whole set-up is bounded by the store's operation deadline ([`Error::Timeout`] after it).
/// The open watch pings its connection every response timeout; a ping that is not answered within
/// the response timeout, or a connection that closes, ends the watch with a retryable error, so a
/// black-holed connection is noticed within twice the response timeout and the waiter falls back
/// to polling.
pub(crate) async fn watch(store: &RedisLeaseStore, key: &LeaseKey) -> Result<KeyWatch> {
    let live = store.bounded("watch", subscribe(store, key)).await?;
    let stream = futures::stream::unfold(Some(live), |state| async move {
        let mut live = state?;
        match live.next().await {
            Ok(()) => Some((Ok(()), Some(live))),
            // One error, then the stream ends: the watch is broken.
            Err(e) => Some((Err(e), None)),
        }
    });
    Ok(KeyWatch::new(Box::pin(stream)))
}

/// A pub/sub connection to the server, or to the first cluster node that answers (a release is
/// published to the whole cluster).
async fn pubsub(store: &RedisLeaseStore) -> Result<redis::aio::PubSub> {
    let inner = &store.inner;
    let mut last = None;
    let current = inner.con.current_client();
    for client in current.iter().chain(&inner.clients) {
        match bounded("watch", inner.connect_timeout, client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => return Ok(pubsub),
            Ok(Err(e)) => last = Some(map("watch", e, inner.connect_timeout)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::config(BACKEND, "no Redis node to watch through", None)))
}

async fn subscribe(store: &RedisLeaseStore, key: &LeaseKey) -> Result<Live> {
    let inner = &store.inner;
    // Asking whether the server publishes expiry and opening the pub/sub connection are
    // independent: both at once, then one SUBSCRIBE for every channel (one round trip).
    let (notify, pubsub) = tokio::join!(expiry_notifications(store), pubsub(store));
    let (mut sink, messages) = pubsub?.split();
    let mut channels = vec![inner.layout.released_channel(key)];
    if notify {
        channels.push(format!(
            "__keyspace@{}__:{}",
            inner.db,
            inner.layout.lease(key)
        ));
    }
    sink.subscribe(channels)
        .await
        .map_err(|e| map("watch", e, inner.response_timeout))?;
    let now = Instant::now();
    let keepalive = inner.response_timeout;
    // Without keyspace events, an expiry is only noticed by looking again every poll interval.
    let poll = (!notify).then_some(inner.poll_interval);
    Ok(Live {
        sink,
        messages,
        response_timeout: inner.response_timeout,
        keepalive,
        next_ping: later(now, keepalive),
        poll,
        next_tick: poll.map(|p| later(now, p)),
    })
}

/// `now + after`, or about a year from now if that overflows (a configured `Duration::MAX`).
fn later(now: Instant, after: Duration) -> Instant {
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// An open watch: its connection, and when to ping it or tick next.
struct Live {
    sink: PubSubSink,
    messages: PubSubStream,
    response_timeout: Duration,
    keepalive: Duration,
    next_ping: Instant,
    poll: Option<Duration>,
    next_tick: Option<Instant>,
}

/// Renewals (`set`, `expire`) are not worth waking a waiter for; a release, a deletion and an
/// expiry are.
fn wakes(msg: &Msg) -> bool {
    !msg.get_channel_name().starts_with("__keyspace@")
        || matches!(
            msg.get_payload::<String>().as_deref(),
            Ok("expired" | "del")
        )
}

impl Live {
    /// The next hint, or the error that broke the watch.
    ///
    /// Cancel safe in the way the stream uses it: the future is kept by `unfold` until it
    /// completes.
    async fn next(&mut self) -> Result<()> {
        loop {
            let tick = self.next_tick;
            tokio::select! {
                msg = self.messages.next() => match msg {
                    Some(msg) if wakes(&msg) => return Ok(()),
                    Some(_) => {}
                    None => {
                        return Err(Error::unavailable(
                            BACKEND,
                            "watch: the pub/sub connection closed",
                            None,
                        ));
                    }
                },
                () = sleep_until(self.next_ping) => {
                    let ping = self.sink.ping::<redis::Value>();
                    bounded("watch", self.response_timeout, ping)
                        .await?
                        .map_err(|e| map("watch", e, self.response_timeout))?;
                    self.next_ping = later(Instant::now(), self.keepalive);
                }
                () = async {
                    match tick {
                        Some(at) => sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    self.next_tick = self.poll.map(|p| later(Instant::now(), p));
                    return Ok(());
                }
            }
        }
    }
}
