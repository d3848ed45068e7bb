//! Redis Sentinel: the master's address from the sentinels, and a connection that follows a
//! failover. The `redis` crate resolves the master once per call; this module keeps one
//! [`ConnectionManager`] to the current master and, when a command fails in a way that says the
//! master may have moved (a read-only replica, a dropped or refused connection, a timeout), or
//! when a sentinel announces `+switch-master`, asks the sentinels again and switches to the new
//! master. A failed command's error is returned unchanged (its outcome may be unknown); the next
//! command goes to the new master.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use leasehold_core::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisFuture, ServerErrorKind, Value};
use tokio::sync::Mutex;

use crate::error::{BACKEND, map};
use crate::store::bounded;

/// The parts of a `redis+sentinel://[user:password@]h1:p1,h2:p2,.../mastername[/db]` URL.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// `redis://host:port` of each sentinel.
    pub(crate) sentinels: Vec<String>,
    pub(crate) master: String,
    /// `user:password@` for the master and its replicas (not the sentinels), or empty.
    userinfo: String,
    db: i64,
}

/// The sentinel URL's parts, `None` for any other URL.
///
/// # Errors
/// [`Error::Config`] for no sentinel, no master name, or a database that is not a number.
pub(crate) fn parse(url: &str) -> Result<Option<SentinelUrl>> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    if !scheme.eq_ignore_ascii_case("redis+sentinel") {
        return Ok(None);
    }
    let bad = |why: &str| {
        Err(Error::config(
            BACKEND,
            format!(
                "unusable Redis Sentinel URL {}: {why} (expected \
                 redis+sentinel://[user:password@]host:port,host:port,.../mastername[/db])",
                crate::tls::redact(url)
            ),
            None,
        ))
    };
    if rest.contains(['?', '#']) {
        return bad("the driver's query parameters and fragments are not supported here");
    }
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r),
        None => (String::new(), rest),
    };
    let Some((hosts, path)) = rest.split_once('/') else {
        return bad("no master name");
    };
    let mut parts = path.split('/');
    let master = parts.next().unwrap_or_default().to_string();
    if master.is_empty() {
        return bad("no master name");
    }
    let db = match (parts.next(), parts.next()) {
        (None | Some(""), None) => 0,
        (Some(db), None) => match db.parse() {
            Ok(db) => db,
            Err(_) => return bad("the database is not a number"),
        },
        _ => return bad("too many path segments"),
    };
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{h}"))
        .collect();
    if sentinels.is_empty() {
        return bad("no sentinel listed");
    }
    Ok(Some(SentinelUrl {
        sentinels,
        master,
        userinfo,
        db,
    }))
}

/// A connection to the master the sentinels name, that follows a failover.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    current: RwLock<Current>,
    /// Credentials and database for the master (from the URL).
    node: redis::RedisConnectionInfo,
    resolver: Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    connect_timeout: Duration,
}

#[derive(Clone)]
struct Current {
    generation: u64,
    client: redis::Client,
    con: ConnectionManager,
}

impl SentinelConnection {
    /// Asks the sentinels for the master of `url` and connects to it.
    pub(crate) async fn connect(
        url: &SentinelUrl,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> Result<Self> {
        let node = format!("redis://{}localhost/{}", url.userinfo, url.db)
            .into_connection_info()
            .map_err(|e| {
                Error::config(
                    BACKEND,
                    format!("unusable Redis Sentinel credentials: {e}"),
                    None,
                )
            })?;
        let node = node.redis_settings().clone();
        let node_info =
            SentinelNodeConnectionInfo::default().set_redis_connection_info(node.clone());
        let resolver = SentinelClient::build(
            url.sentinels.clone(),
            url.master.clone(),
            Some(node_info),
            SentinelServerType::Master,
        )
        .map_err(|e| map("connect", e, connect_timeout))?;
        let mut resolver = resolver;
        let client = resolve(&mut resolver, connect_timeout).await?;
        let con = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .map_err(|e| map("connect", e, connect_timeout))?;
        let connection = SentinelConnection {
            shared: Arc::new(Shared {
                current: RwLock::new(Current {
                    generation: 0,
                    client,
                    con,
                }),
                node,
                resolver: Mutex::new(resolver),
                config,
                connect_timeout,
            }),
        };
        tokio::spawn(follow_switches(
            Arc::downgrade(&connection.shared),
            url.sentinels.clone(),
            url.master.clone(),
        ));
        Ok(connection)
    }

    fn current(&self) -> Current {
        self.shared
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A client for the current master (for the watch's pub/sub connections).
    pub(crate) fn client(&self) -> redis::Client {
        self.current().client
    }

    /// The current master's address, for `Debug`.
    pub(crate) fn addr(&self) -> String {
        self.current()
            .client
            .get_connection_info()
            .addr()
            .to_string()
    }

    /// Asks the sentinels again after a failure seen on connection `generation`, and switches
    /// to the master they name if it is another server. Best effort: on failure the next
    /// command fails and asks again.
    async fn rediscover(&self, generation: u64, announced: Option<(&str, &str)>) {
        let mut resolver = self.shared.resolver.lock().await;
        if self.current().generation != generation {
            return; // another command already switched
        }
        let resolved = match announced {
            // The announcing sentinel has switched; the one the resolver asks first may not
            // know yet, so take the announced address.
            Some((host, port)) => format!("redis://{host}:{port}")
                .into_connection_info()
                .map(|info| info.set_redis_settings(self.shared.node.clone()))
                .and_then(redis::Client::open)
                .map_err(|e| map("connect", e, self.shared.connect_timeout)),
            None => resolve(&mut resolver, self.shared.connect_timeout).await,
        };
        let client = match resolved {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!(backend = BACKEND, "sentinels did not name a master: {e}");
                return;
            }
        };
        let old = self.current();
        if client.get_connection_info().addr() == old.client.get_connection_info().addr() {
            return;
        }
        let connect =
            ConnectionManager::new_with_config(client.clone(), self.shared.config.clone());
        match bounded("connect", self.shared.connect_timeout, connect).await {
            Ok(Ok(con)) => {
                tracing::info!(backend = BACKEND, from = %old.client.get_connection_info().addr(), to = %client.get_connection_info().addr(), "following the sentinels to a new master");
                *self
                    .shared
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Current {
                    generation: generation + 1,
                    client,
                    con,
                };
            }
            Ok(Err(e)) => {
                tracing::debug!(backend = BACKEND, "cannot connect to the new master: {e}");
            }
            Err(e) => tracing::debug!(backend = BACKEND, "cannot connect to the new master: {e}"),
        }
    }
}

/// Listens for the sentinels' `+switch-master` announcements of `master` and asks them for the
/// new master at once, so that the store moves before the old master is demoted (commands sent to
/// it in between would be granted there and lost with it). Ends when the connection is dropped.
/// Best effort: while no sentinel can be subscribed to, a failed command still triggers the
/// switch.
async fn follow_switches(shared: std::sync::Weak<Shared>, sentinels: Vec<String>, master: String) {
    use futures::StreamExt;
    let mut next = 0;
    loop {
        let Some(timeout) = shared.upgrade().map(|s| s.connect_timeout) else {
            return;
        };
        let sentinel = &sentinels[next % sentinels.len()];
        next += 1;
        let subscribed = async {
            let client = redis::Client::open(sentinel.as_str())?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            redis::RedisResult::Ok(pubsub)
        };
        if let Ok(Ok(mut pubsub)) = tokio::time::timeout(timeout, subscribed).await {
            let mut messages = pubsub.on_message();
            // Also wakes up now and then to notice that the store is gone.
            loop {
                match tokio::time::timeout(Duration::from_secs(1), messages.next()).await {
                    Ok(Some(msg)) => {
                        // `<master name> <old ip> <old port> <new ip> <new port>`
                        let payload: String = msg.get_payload().unwrap_or_default();
                        let fields: Vec<&str> = payload.split(' ').collect();
                        let [name, _, _, host, port] = fields.as_slice() else {
                            continue;
                        };
                        if *name != master {
                            continue;
                        }
                        let Some(shared) = shared.upgrade() else {
                            return;
                        };
                        let connection = SentinelConnection { shared };
                        let generation = connection.current().generation;
                        tracing::debug!(backend = BACKEND, "sentinel announced {payload}");
                        connection.rediscover(generation, Some((host, port))).await;
                    }
                    Ok(None) => break, // the sentinel went away: try the next one
                    Err(_) if shared.strong_count() == 0 => return,
                    Err(_) => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The master the sentinels name (checked with `ROLE` by the driver), within `timeout`.
async fn resolve(resolver: &mut SentinelClient, timeout: Duration) -> Result<redis::Client> {
    bounded("connect", timeout, resolver.async_get_client())
        .await?
        .map_err(|e| map("connect", e, timeout))
}

/// Whether `e` says the master may have moved.
fn master_may_have_moved(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
    ) || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
}

impl redis::aio::ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let Current {
                generation,
                mut con,
                ..
            } = self.current();
            let out = con.req_packed_command(cmd).await;
            if let Err(e) = &out
                && master_may_have_moved(e)
            {
                self.rediscover(generation, None).await;
            }
            out
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let Current {
                generation,
                mut con,
                ..
            } = self.current();
            let out = con.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &out
                && master_may_have_moved(e)
            {
                self.rediscover(generation, None).await;
            }
            out
        })
    }

    fn get_db(&self) -> i64 {
        self.current().con.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_their_sentinels_and_master() {
        assert_eq!(parse("redis://h:1").unwrap(), None);
        let u = parse("redis+sentinel://u:p@a:26379, b:26380/mymaster/2")
            .unwrap()
            .unwrap();
        assert_eq!(u.sentinels, ["redis://a:26379", "redis://b:26380"]);
        assert_eq!(u.master, "mymaster");
        assert_eq!(u.userinfo, "u:p@");
        assert_eq!(u.db, 2);
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel:///m",
            "redis+sentinel://a:1/m/x",
            "redis+sentinel://a:1/m/1/2",
            "redis+sentinel://a:1/m?protocol=resp3",
        ] {
            assert!(
                matches!(parse(bad), Err(Error::Config { .. })),
                "{bad}: {:?}",
                parse(bad)
            );
        }
    }
}
