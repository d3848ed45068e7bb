//! The raw protocols: the backends' own statements, scripts and requests, issued directly with
//! the same driver and the same connection (pool, connection manager, client) the library uses,
//! without the library's wrapping (its checks, timeouts, retries, caches and error mapping).
//!
//! Consumed from the backends, not copied:
//! - PostgreSQL: the statements of `leasehold_postgres::protocol::Statements` for the store's table
//!   and layout, and the store's notification channel;
//! - Kubernetes: the Lease objects of `leasehold_k8s::protocol` (`new_claim`, `with_token`,
//!   `regrant`, `released`), its annotations and watch selector, the store's object names;
//! - Redis: the acquire and release scripts of `leasehold_redis::protocol`, its `record_prefix` (what
//!   release compares with the stored record) and the store's `KeyLayout`; the commands its
//!   scripts run (for the request count) are read off those scripts;
//! - SQLite: the statements of `leasehold_sqlite::protocol`;
//! - MySQL / MariaDB: the statements of `leasehold_mysql::protocol::Statements` for the store's
//!   table;
//! - etcd: the key names, range, watch and transactions of `leasehold_etcd::protocol`
//!   (`LeaseSharing::PerGrant`: one etcd lease per grant);
//! - every backend: the TTL rounding of `leasehold_core::backend`.
//!
//! Copied: nothing of the protocols. The decisions the stores make around them (the order of the
//! requests, the Kubernetes store's local expiry clock and in-memory token floor, the SQLite
//! store's in-process waiter list) are written here in their simplest form: they are the logic whose cost the wrapper column measures.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::PutOptions;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use leasehold_core::backend::{RoundedTtl, ttl_millis, ttl_secs};
use leasehold_core::{FencingToken, LeaseKey, OwnerId};
use leasehold_etcd::protocol as protocol_etcd;
use leasehold_k8s::protocol::{self, TOKEN_ANNOTATION};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::mpsc;

/// One grant made through a raw protocol.
#[derive(Debug, Clone)]
pub(crate) struct RawGrant {
    pub(crate) key: LeaseKey,
    pub(crate) owner: String,
    pub(crate) token: i64,
    /// etcd: the lock key and its etcd lease.
    pub(crate) lock: Option<(String, i64)>,
    /// Kubernetes: the Lease object as written by the grant.
    pub(crate) object: Option<Box<KubeLease>>,
}

pub(crate) type R<T> = Result<T, String>;

pub(crate) fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A backend's raw protocol for acquire and release, plus a one-round-trip ping.
#[async_trait]
pub(crate) trait Raw: Send + Sync {
    /// What the ping is (`SELECT 1`, `PING`, ...).
    fn ping_name(&self) -> &'static str;
    /// One acquire attempt: `Some` if granted.
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>>;
    /// Releases a grant.
    async fn release(&self, grant: &RawGrant) -> R<()>;
    /// One round trip doing nothing.
    async fn ping(&self) -> R<()>;
    /// The server's version.
    async fn version(&self) -> R<String>;
    /// The store's own expiry delay, where the store expires keys itself and says when: one
    /// key is attached to a `ttl` lease of the raw protocol and watched; the figure is
    /// milliseconds from the nominal expiry (midpoint of the grant's round trip plus the granted
    /// TTL) to the deletion event. `None` where the store has no such event to observe.
    async fn expiry_delay(&self, key: &LeaseKey, ttl: Duration) -> R<Option<f64>> {
        let _ = (key, ttl);
        Ok(None)
    }
    /// Release notifications for `key` through the store's own mechanism (PostgreSQL `NOTIFY`,
    /// the Redis release channel, an etcd watch, a Kubernetes watch, SQLite's in-process wake),
    /// one `()` per event, subscribed before it returns; `None` where the store has none. A hint
    /// may be spurious: a waiter tries to acquire and keeps waiting while the key is held.
    async fn subscribe(&self, _key: &LeaseKey) -> R<Option<mpsc::Receiver<()>>> {
        Ok(None)
    }
    /// The number of requests the server has handled so far, counted by the server itself
    /// (etcd's gRPC metrics, Redis's `INFO commandstats`), **not counting the reads of this
    /// counter** (Redis leaves `INFO` out; etcd's `/metrics` is plain HTTP, not a gRPC
    /// message); `None` where it has no such counter. The difference of two readings is
    /// therefore exactly the requests sent between them, with nothing to subtract.
    async fn server_requests(&self) -> R<Option<u64>> {
        Ok(None)
    }
    /// How late [`Raw::server_requests`] may count a request: a reading includes every request
    /// answered at least this long before it. Counting should start this long after a burst
    /// that is not to be counted.
    fn counter_delay(&self) -> Duration {
        Duration::ZERO
    }
    /// Waits (bounded) until the server holds nothing of an earlier section that would reach
    /// [`Raw::server_requests`] later, so that a count started after it holds only what is
    /// sent after it. Returns what it waited for, if anything.
    async fn settle(&self) -> R<Option<String>> {
        Ok(None)
    }
}

/// Forwards each item of a notification stream as one hint until the stream ends or the
/// receiver is dropped.
fn forward<S>(stream: S) -> mpsc::Receiver<()>
where
    S: futures::Stream<Item = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = tx.closed() => return,
                item = stream.next() => match item {
                    Some(()) => {
                        if tx.send(()).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                },
            }
        }
    });
    rx
}

/// `ttl` in whole milliseconds, rounded up as the backends round it.
pub(crate) fn ttl_ms(ttl: Duration) -> R<i64> {
    ttl_millis(ttl).map(RoundedTtl::as_i64).map_err(s)
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL: the statements of leasehold_postgres::protocol for the store's own table and layout,
// on the store's pool.

/// PostgreSQL over the library store's own pool and statements.
pub(crate) struct PgRaw {
    pool: sqlx::PgPool,
    sql: leasehold_postgres::protocol::Statements,
    /// The channel the release notifies, with the key as the payload.
    channel: String,
    /// Readings of the server's transaction counter so far (each is a transaction itself).
    stat_reads: std::sync::atomic::AtomicU64,
    /// The release statement: the library's `release_notify`, or (the ablation
    /// [`PgRaw::with_minimal_release`]) the minimal one.
    release: String,
}

impl PgRaw {
    pub(crate) fn new(store: &leasehold_postgres::PostgresLeaseStore) -> Self {
        let sql =
            leasehold_postgres::protocol::Statements::new(store.table(), store.options().layout());
        PgRaw {
            pool: store.pool().clone(),
            release: sql.release_notify.clone(),
            sql,
            channel: store.notify_channel().to_string(),
            stat_reads: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// An ablation (not a floor): the library's acquire on the library's own table (its
    /// triggers included), and the minimal release (see [`pg_minimal_release`]). Over the
    /// minimal, it prices the library's grant; the library's own protocol over it prices the
    /// library's release.
    pub(crate) fn with_minimal_release(store: &leasehold_postgres::PostgresLeaseStore) -> Self {
        let raw = Self::new(store);
        PgRaw {
            release: pg_minimal_release(&raw.sql),
            ..raw
        }
    }
}

/// The library's plain release (`Statements::release`, a guarded `UPDATE` by key, owner and
/// token) without its expiry check: no wake-up mark, no `RETURNING`, as the minimal releases.
fn pg_minimal_release(sql: &leasehold_postgres::protocol::Statements) -> String {
    sql.release
        .replace(" AND lease_until > clock_timestamp()", "")
}

#[async_trait]
impl Raw for PgRaw {
    fn ping_name(&self) -> &'static str {
        "a protocol Sync (sqlx's ping) on a pooled connection"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        // As the store: the grant alone (a free or own row), and the full statement (a refusal
        // that marks the row for a wake-up, library layout, or an insert) only when it granted
        // nothing.
        let ttl = ttl_ms(ttl)?;
        let row = match sqlx::query(AssertSqlSafe(self.sql.acquire_free.as_str()))
            .bind(key.as_str())
            .bind(owner)
            .bind(ttl)
            .fetch_optional(&self.pool)
            .await
            .map_err(s)?
        {
            Some(row) => row,
            None => sqlx::query(AssertSqlSafe(self.sql.acquire.as_str()))
                .bind(key.as_str())
                .bind(owner)
                .bind(ttl)
                .fetch_one(&self.pool)
                .await
                .map_err(s)?,
        };
        let holder: String = row.try_get("owner").map_err(s)?;
        let token: i64 = row.try_get("fencing_token").map_err(s)?;
        Ok((holder == owner).then(|| RawGrant {
            key: key.clone(),
            owner: owner.to_string(),
            token,
            lock: None,
            object: None,
        }))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        // The library's release notifies the table's channel in the same statement
        // (LISTEN/NOTIFY watch) when an acquire was refused since the last notification (the
        // refusal marked the row); the ablation's minimal release does not.
        sqlx::query(AssertSqlSafe(self.release.as_str()))
            .bind(g.key.as_str())
            .bind(g.owner.as_str())
            .bind(g.token)
            .execute(&self.pool)
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        // One round trip and nothing else: a Sync message answered by ReadyForQuery (no
        // statement to parse or plan), on a connection the pool hands out without a test of
        // its own (the library's pool does not ping before a checkout; `PgMinimal::new` checks).
        use sqlx::Connection;
        let mut conn = self.pool.acquire().await.map_err(s)?;
        conn.ping().await.map_err(s)
    }
    async fn subscribe(&self, key: &LeaseKey) -> R<Option<mpsc::Receiver<()>>> {
        // A listener on its own connection, as the library's (leasehold-postgres/src/notify.rs).
        let own = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with((*self.pool.connect_options()).clone());
        let mut listener = sqlx::postgres::PgListener::connect_with(&own)
            .await
            .map_err(s)?;
        listener.listen(&self.channel).await.map_err(s)?;
        let want = key.as_str().to_string();
        let stream = futures::stream::unfold(listener, |mut l| async move {
            let n = l.recv().await.ok()?;
            Some((n.payload().to_string(), l))
        })
        .filter_map(move |payload| std::future::ready((payload == want).then_some(())));
        Ok(Some(forward(stream)))
    }
    async fn version(&self) -> R<String> {
        sqlx::query_scalar::<_, String>("SHOW server_version")
            .fetch_one(&self.pool)
            .await
            .map(|v| format!("PostgreSQL {v}"))
            .map_err(s)
    }
    async fn settle(&self) -> R<Option<String>> {
        // A listening backend reads every notification in a transaction of its own
        // (ProcessIncomingNotify), but publishes its counts only when it next runs a command or
        // exits: a store's listener, lingering 30 s after its last watch, published the 102
        // wake-ups of the handoff section when it closed inside the renewal count (found with
        // the statement log, which showed 2 statements per interval there). Wait for it to go.
        let started = tokio::time::Instant::now();
        let bound = Duration::from_secs(90);
        loop {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'leasehold-postgres-listener'",
            )
            .fetch_one(&self.pool)
            .await
            .map_err(s)?;
            self.stat_reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n == 0 {
                let waited = started.elapsed();
                return Ok((waited > Duration::from_millis(500)).then(|| {
                    format!(
                        "{:.1} s for the store's listener connection to close",
                        waited.as_secs_f64()
                    )
                }));
            }
            if started.elapsed() >= bound {
                return Err(format!(
                    "{n} listener connection(s) still open after {bound:?}: the server count would include their wake-ups"
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    fn counter_delay(&self) -> Duration {
        // PostgreSQL 15 (pgstat.c): a backend flushes its counts when it goes idle, but at most
        // once per PGSTAT_MIN_INTERVAL (1 s); what is left is flushed by a timer
        // PGSTAT_IDLE_INTERVAL (10 s) later, or retried after PGSTAT_RETRY_INTERVAL (1 s) when
        // the shared entry was locked. So the last second of a burst (10,000 acquisitions) can
        // reach the counter 10-11 s after it.
        Duration::from_secs(12)
    }
    async fn server_requests(&self) -> R<Option<u64>> {
        // Transactions the server counted for this database (every statement of the store is
        // one transaction; a batch is one statement). Backends publish their counts when they
        // go idle, at most once a second, or 10 s later (PostgreSQL 15's shared-memory stats),
        // so a difference over a few intervals is exact to about one renewal wave. Our own
        // readings are transactions too: the ones before this are left out.
        let before = self
            .stat_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n: i64 = sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
             WHERE datname = current_database()",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(s)?;
        Ok(Some(u64::try_from(n).map_err(s)?.saturating_sub(before)))
    }
}

// ---------------------------------------------------------------------------------------------
// Redis: the scripts of leasehold_redis::protocol, on the library store's connection and key layout.

/// Redis over the library store's connection manager and key layout.
pub(crate) struct RedisRaw {
    pub(crate) con: leasehold_redis::RedisConnection,
    /// For the pub/sub connection of [`Raw::subscribe`].
    pub(crate) client: redis::Client,
    pub(crate) layout: leasehold_redis::protocol::KeyLayout,
    acquire: redis::Script,
    release: redis::Script,
}

/// The minimal release on the library's record (the ablation [`RedisRaw::with_minimal_release`]):
/// the library's release script without its `PUBLISH`, so compare (the record's prefix, which
/// carries the token and the owner) and delete. `ARGV[2]` and `ARGV[3]` go unused.
static REDIS_MINIMAL_RELEASE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    leasehold_redis::protocol::RELEASE_LUA
        .replace("  redis.call('PUBLISH', ARGV[2], ARGV[3])\n", "")
});

impl RedisRaw {
    pub(crate) fn new(store: &leasehold_redis::RedisLeaseStore, client: redis::Client) -> Self {
        RedisRaw {
            con: store.connection(),
            client,
            layout: store.layout().clone(),
            acquire: redis::Script::new(leasehold_redis::protocol::ACQUIRE_LUA),
            release: redis::Script::new(leasehold_redis::protocol::RELEASE_LUA),
        }
    }

    /// An ablation (not a floor): the library's acquire script on the library's keys, and a
    /// release that only compares and deletes (the library's release without its `PUBLISH`).
    /// Over the minimal, it prices the library's grant; the library's own protocol over it
    /// prices the release notification inside the library's protocol.
    pub(crate) fn with_minimal_release(
        store: &leasehold_redis::RedisLeaseStore,
        client: redis::Client,
    ) -> Self {
        RedisRaw {
            release: redis::Script::new(&REDIS_MINIMAL_RELEASE),
            ..Self::new(store, client)
        }
    }
}

#[async_trait]
impl Raw for RedisRaw {
    fn ping_name(&self) -> &'static str {
        "PING"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let mut con = self.con.clone();
        let reply: redis::Value = self
            .acquire
            .key(self.layout.lease(key))
            .key(self.layout.generation(key))
            .arg(owner)
            .arg(ttl_ms(ttl)?)
            .invoke_async(&mut con)
            .await
            .map_err(s)?;
        // The token (a string) when granted, `{record, pttl}` when held.
        match reply {
            redis::Value::BulkString(token) => Ok(Some(RawGrant {
                key: key.clone(),
                owner: owner.to_string(),
                token: std::str::from_utf8(&token).map_err(s)?.parse().map_err(s)?,
                lock: None,
                object: None,
            })),
            _ => Ok(None),
        }
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        let mut con = self.con.clone();
        let _: i64 = self
            .release
            .key(self.layout.lease(&g.key))
            .arg(leasehold_redis::protocol::record_prefix(
                FencingToken::new(u64::try_from(g.token).map_err(s)?).map_err(s)?,
                &OwnerId::new(&g.owner).map_err(s)?,
            ))
            .arg(self.layout.released_channel(&g.key))
            .arg(g.token)
            .invoke_async(&mut con)
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        let mut con = self.con.clone();
        let _: String = redis::cmd("PING").query_async(&mut con).await.map_err(s)?;
        Ok(())
    }
    async fn version(&self) -> R<String> {
        let mut con = self.con.clone();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut con)
            .await
            .map_err(s)?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map_or_else(
                || "Redis (unknown)".into(),
                |v| format!("Redis {}", v.trim()),
            ))
    }
    async fn subscribe(&self, key: &LeaseKey) -> R<Option<mpsc::Receiver<()>>> {
        // The release script publishes on the key's release channel (leasehold-redis/src/watch.rs).
        let mut pubsub = self.client.get_async_pubsub().await.map_err(s)?;
        pubsub
            .subscribe(self.layout.released_channel(key))
            .await
            .map_err(s)?;
        Ok(Some(forward(pubsub.into_on_message().map(|_| ()))))
    }
    async fn server_requests(&self) -> R<Option<u64>> {
        let mut con = self.con.clone();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut con)
            .await
            .map_err(s)?;
        Ok(Some(redis_client_requests(&info, &script_commands())))
    }
}

/// The commands the store's Lua scripts (`leasehold_redis::protocol`) run (`redis.call('X', ...)` and
/// `redis.pcall('X', ...)`), lower-case.
fn script_commands() -> Vec<String> {
    use leasehold_redis::protocol::{
        ACQUIRE_LUA, FENCE_LUA, INSPECT_LUA, RELEASE_LUA, RENEW_LUA, RENEW_MANY_LUA,
    };
    let mut out: Vec<String> = [
        ACQUIRE_LUA,
        RENEW_LUA,
        RENEW_MANY_LUA,
        RELEASE_LUA,
        INSPECT_LUA,
        FENCE_LUA,
    ]
    .iter()
    .flat_map(|script| script.split("call('").skip(1))
    .filter_map(|rest| rest.split('\'').next())
    .map(str::to_ascii_lowercase)
    .collect();
    out.sort();
    out.dedup();
    out
}

/// Requests clients sent, from `INFO commandstats`: every command's calls except those of the
/// commands the store's scripts run (Redis counts a command a script runs like one a client
/// sent, in `total_commands_processed` as in its `cmdstat_*`) and of `INFO` itself. Script
/// invocations (`EVALSHA`, `EVAL`) are counted, one per batch.
fn redis_client_requests(info: &str, script_commands: &[String]) -> u64 {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()?;
            Some((name.to_ascii_lowercase(), calls))
        })
        .filter(|(name, _)| name != "info" && !script_commands.iter().any(|c| c == name))
        .map(|(_, calls)| calls)
        .sum()
}

// ---------------------------------------------------------------------------------------------
// etcd: the requests of leasehold-etcd/src/store.rs (LeaseSharing::PerGrant), on its client:
// acquire = lease grant + `protocol::acquire_txn` on `protocol::slot_key(.., 0)`; release =
// lease revoke.

/// etcd over the library store's client.
pub(crate) struct EtcdRaw {
    pub(crate) client: etcd_client::Client,
    pub(crate) config: leasehold_etcd::EtcdOptions,
    /// `host:port` of the member's client URL, whose `/metrics` counts gRPC messages.
    pub(crate) metrics: Option<String>,
}

/// The sum of the `grpc_server_msg_received_total` counters (every unary request and every
/// streamed message, such as a lease keepalive) in a Prometheus text exposition.
fn grpc_messages_received(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .map(|v| format!("{v:.0}").parse::<u64>().unwrap_or(0))
        .sum()
}

/// The sum of `apiserver_request_total` over the series on Lease and ConfigMap objects.
fn apiserver_lease_requests(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"leases\"") || l.contains("resource=\"configmaps\""))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .map(|v| format!("{v:.0}").parse::<u64>().unwrap_or(0))
        .sum()
}

/// A minimal HTTP/1.0 GET on loopback (the benchmark has no HTTP client dependency).
async fn http_get(addr: &str, path: &str) -> R<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut c = tokio::net::TcpStream::connect(addr).await.map_err(s)?;
        c.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(s)?;
        let mut body = String::new();
        c.read_to_string(&mut body).await.map_err(s)?;
        Ok(body)
    };
    tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .map_err(|_| format!("GET http://{addr}{path} timed out"))?
}

#[async_trait]
impl Raw for EtcdRaw {
    fn ping_name(&self) -> &'static str {
        "Status"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        // The store's acquire (LeaseSharing::PerGrant): the etcd lease first, then one txn that
        // creates the lock key, under its first slot name, if the prefix is empty (and reads the
        // holder otherwise).
        let prefix = protocol_etcd::mutex_prefix(self.config.prefix(), key);
        let who = OwnerId::new(owner).map_err(s)?;
        let ttl_secs = ttl_secs(ttl).map_err(s)?.as_i64();
        let mut lc = self.client.lease_client();
        let lease_id = lc.grant(ttl_secs, None).await.map_err(s)?.id();
        let lock_key = protocol_etcd::slot_key(self.config.prefix(), key, 0);
        let txn = protocol_etcd::acquire_txn(&prefix, None, &lock_key, &who, lease_id);
        let resp = self.client.kv_client().txn(txn).await.map_err(s)?;
        if !resp.succeeded() {
            let _ = lc.revoke(lease_id).await;
            return Ok(None);
        }
        let token = resp.header().map(|h| h.revision()).ok_or("no header")?;
        Ok(Some(RawGrant {
            key: key.clone(),
            owner: owner.to_string(),
            token,
            lock: Some((lock_key, lease_id)),
            object: None,
        }))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        // The store's release of a lease it granted (its handle tagged): revoke the etcd lease,
        // which carries the lock key alone; etcd deletes the key in the same write.
        let (_, lease_id) = g.lock.clone().ok_or("not an etcd grant")?;
        self.client
            .lease_client()
            .revoke(lease_id)
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        self.client.maintenance_client().status().await.map_err(s)?;
        Ok(())
    }
    async fn version(&self) -> R<String> {
        let st = self.client.maintenance_client().status().await.map_err(s)?;
        Ok(format!("etcd {}", st.version()))
    }
    async fn subscribe(&self, key: &LeaseKey) -> R<Option<mpsc::Receiver<()>>> {
        // The library's watch (leasehold-etcd/src/store.rs): deletions under the key's lock prefix,
        // confirmed by the server before any release is issued.
        let prefix = protocol_etcd::mutex_prefix(self.config.prefix(), key);
        let mut wc = self.client.watch_client();
        let mut stream = wc
            .watch(prefix, Some(protocol_etcd::waiter_watch()))
            .await
            .map_err(s)?;
        match tokio::time::timeout(Duration::from_secs(5), stream.message()).await {
            Ok(Ok(Some(r))) if r.created() => {}
            _ => return Err("etcd did not confirm the watch".into()),
        }
        let hints = futures::stream::unfold(stream, |mut stream| async move {
            loop {
                match stream.message().await {
                    Ok(Some(r)) if !r.events().is_empty() => return Some(((), stream)),
                    Ok(Some(r)) if r.canceled() => return None,
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return None,
                }
            }
        });
        Ok(Some(forward(hints)))
    }
    async fn expiry_delay(&self, key: &LeaseKey, ttl: Duration) -> R<Option<f64>> {
        let k = format!("{}/expiry-floor", self.config.lock_name(key));
        let mut wc = self.client.watch_client();
        let mut stream = wc
            .watch(
                k.clone(),
                Some(
                    etcd_client::WatchOptions::new()
                        .with_filters([etcd_client::WatchFilterType::NoPut]),
                ),
            )
            .await
            .map_err(s)?;
        match stream.message().await.map_err(s)? {
            Some(r) if r.created() => {}
            _ => return Err("etcd did not confirm the watch".into()),
        }
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut lc = self.client.lease_client();
        let sent = tokio::time::Instant::now();
        let granted = lc.grant(ttl_secs, None).await.map_err(s)?;
        let received = tokio::time::Instant::now();
        let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl()).map_err(s)?);
        let expiry = sent + (received - sent) / 2 + granted_ttl;
        self.client
            .kv_client()
            .put(
                k,
                "expiry-floor",
                Some(PutOptions::new().with_lease(granted.id())),
            )
            .await
            .map_err(s)?;
        let wait = granted_ttl * 3 + Duration::from_secs(5);
        let deleted = tokio::time::timeout(wait, async {
            loop {
                match stream.message().await {
                    Ok(Some(r)) if !r.events().is_empty() => return Ok(tokio::time::Instant::now()),
                    Ok(Some(_)) => {}
                    Ok(None) => return Err("the watch ended".to_string()),
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
        .await
        .map_err(|_| format!("etcd did not expire the key within {wait:?}"))??;
        Ok(Some(if deleted >= expiry {
            (deleted - expiry).as_secs_f64() * 1000.0
        } else {
            -(expiry - deleted).as_secs_f64() * 1000.0
        }))
    }
    async fn server_requests(&self) -> R<Option<u64>> {
        let Some(addr) = &self.metrics else {
            return Ok(None);
        };
        let text = http_get(addr, "/metrics").await?;
        Ok(Some(grpc_messages_received(&text)))
    }
}

// ---------------------------------------------------------------------------------------------
// SQLite: the statements of leasehold_sqlite::protocol, as the store sends them: writes on one
// connection of their own (taken in turn), reads on a pool, both with the store's options (WAL,
// synchronous NORMAL, the default busy timeout and connection limit) on the same file. Acquire
// is one upsert; when it grants nothing, one read of the holder and, should the key be free
// again by then, the upsert and the read once more in one immediate transaction. Release is one
// guarded `UPDATE`.

/// SQLite with the library's connections and settings.
pub(crate) struct SqliteRaw {
    /// The write connection (the store's, without its two-level queue in front).
    writer: tokio::sync::Mutex<sqlx::SqliteConnection>,
    /// Reads (the holder after a refused upsert, the ping).
    pool: sqlx::SqlitePool,
    /// In-process waiters woken after a release commits, as the library's store wakes its own.
    waiters: std::sync::Mutex<Vec<(String, mpsc::Sender<()>)>>,
}

impl SqliteRaw {
    pub(crate) async fn open(path: &std::path::Path) -> R<Self> {
        use sqlx::Connection;
        use sqlx::sqlite::{
            SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
        };
        let defaults = leasehold_sqlite::SqliteOptions::default();
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(defaults.get_busy_timeout());
        let pool = SqlitePoolOptions::new()
            .max_connections(defaults.get_max_connections())
            .acquire_timeout(defaults.get_busy_timeout() + Duration::from_secs(5))
            .test_before_acquire(false)
            .connect_with(opts.clone())
            .await
            .map_err(s)?;
        let writer = sqlx::SqliteConnection::connect_with(&opts)
            .await
            .map_err(s)?;
        Ok(SqliteRaw {
            writer: tokio::sync::Mutex::new(writer),
            pool,
            waiters: std::sync::Mutex::new(Vec::new()),
        })
    }
}

/// A row of `leasehold_sqlite::protocol::HOLDER`: `(owner, token, ttl_ms, remaining_ms)`.
type SqliteHolder = (String, i64, i64, i64);

#[async_trait]
impl Raw for SqliteRaw {
    fn ping_name(&self) -> &'static str {
        "SELECT 1"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        use sqlx::Connection;
        let ms = ttl_ms(ttl)?;
        let upsert = || {
            sqlx::query_scalar::<_, i64>(leasehold_sqlite::protocol::ACQUIRE)
                .bind(key.as_str())
                .bind(owner)
                .bind(ms)
        };
        let grant = |token| RawGrant {
            key: key.clone(),
            owner: owner.to_string(),
            token,
            lock: None,
            object: None,
        };
        let token = upsert()
            .fetch_optional(&mut *self.writer.lock().await)
            .await
            .map_err(s)?;
        if let Some(token) = token {
            return Ok(Some(grant(token)));
        }
        let held: Option<SqliteHolder> = sqlx::query_as(leasehold_sqlite::protocol::HOLDER)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(s)?;
        if let Some((holder, _, _, remaining)) = held
            && remaining > 0
            && holder != owner
        {
            return Ok(None);
        }
        let mut writer = self.writer.lock().await;
        let mut tx = writer
            .begin_with(leasehold_sqlite::protocol::BEGIN)
            .await
            .map_err(s)?;
        let token = upsert().fetch_optional(&mut *tx).await.map_err(s)?;
        if token.is_none() {
            let _: Option<SqliteHolder> = sqlx::query_as(leasehold_sqlite::protocol::HOLDER)
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(s)?;
        }
        tx.commit().await.map_err(s)?;
        Ok(token.map(grant))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        sqlx::query(leasehold_sqlite::protocol::RELEASE)
            .bind(g.key.as_str())
            .bind(g.owner.as_str())
            .bind(g.token)
            .execute(&mut *self.writer.lock().await)
            .await
            .map_err(s)?;
        let mut waiters = self
            .waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        waiters.retain(|(_, tx)| !tx.is_closed());
        for (key, tx) in waiters.iter() {
            if key == g.key.as_str() {
                let _ = tx.try_send(());
            }
        }
        Ok(())
    }
    async fn subscribe(&self, key: &LeaseKey) -> R<Option<mpsc::Receiver<()>>> {
        let (tx, rx) = mpsc::channel(256);
        self.waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((key.as_str().to_string(), tx));
        Ok(Some(rx))
    }
    async fn ping(&self) -> R<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn version(&self) -> R<String> {
        sqlx::query_scalar::<_, String>("SELECT sqlite_version()")
            .fetch_one(&self.pool)
            .await
            .map(|v| format!("SQLite {v}"))
            .map_err(s)
    }
}

// ---------------------------------------------------------------------------------------------
// MySQL / MariaDB: the statements of leasehold_mysql::protocol for the store's table, on the
// store's pool, in the store's order: the guarded grant of a key's row; when it matched nothing,
// the holder's row, and the insert when the key has no row. A grant's token comes back in the OK
// packet (LAST_INSERT_ID(expr)) or, where the server leaves it out (the insert), from the
// session. Release is the library's guarded UPDATE.

/// MySQL over the library store's own pool and statements.
pub(crate) struct MysqlRaw {
    pool: sqlx::MySqlPool,
    sql: leasehold_mysql::protocol::Statements,
    /// The release statement: the library's, or (the ablation
    /// [`MysqlRaw::with_minimal_release`]) the minimal one.
    release: String,
    /// Readings of the server's statement counter so far (each is a statement itself).
    questions_read: std::sync::atomic::AtomicU64,
}

impl MysqlRaw {
    pub(crate) fn new(store: &leasehold_mysql::MysqlLeaseStore) -> Self {
        let sql = store.statements().clone();
        MysqlRaw {
            pool: store.pool().clone(),
            release: sql.release.clone(),
            sql,
            questions_read: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// An ablation (not a floor): the library's acquire on the library's own table (its
    /// triggers included), and the minimal release (see [`mysql_minimal_release`]). Over the
    /// minimal, it prices the library's grant; the library's own protocol over it prices the
    /// library's release.
    pub(crate) fn with_minimal_release(store: &leasehold_mysql::MysqlLeaseStore) -> Self {
        let raw = Self::new(store);
        MysqlRaw {
            release: mysql_minimal_release(&raw.sql),
            ..raw
        }
    }
}

/// The library's release (a guarded `UPDATE` by key, owner and token) without its expiry check,
/// as the minimal releases.
fn mysql_minimal_release(sql: &leasehold_mysql::protocol::Statements) -> String {
    sql.release
        .replace(" AND lease_until > UTC_TIMESTAMP(6)", "")
}

/// The session's `LAST_INSERT_ID()`: the token of the grant this connection just made.
async fn mysql_session_id(conn: &mut sqlx::MySqlConnection) -> R<u64> {
    sqlx::query_scalar(leasehold_mysql::protocol::LAST_INSERT_ID)
        .fetch_one(conn)
        .await
        .map_err(s)
}

#[async_trait]
impl Raw for MysqlRaw {
    fn ping_name(&self) -> &'static str {
        "COM_PING (sqlx's ping) on a pooled connection"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let ms = ttl_ms(ttl)?;
        let us = ms.saturating_mul(1000);
        let mut conn = self.pool.acquire().await.map_err(s)?;
        let grant = |token: u64| -> R<Option<RawGrant>> {
            Ok(Some(RawGrant {
                key: key.clone(),
                owner: owner.to_string(),
                token: i64::try_from(token).map_err(s)?,
                lock: None,
                object: None,
            }))
        };
        loop {
            let r = sqlx::query(AssertSqlSafe(self.sql.acquire_free.as_str()))
                .bind(owner)
                .bind(us)
                .bind(ms)
                .bind(key.as_str())
                .bind(owner)
                .execute(&mut *conn)
                .await
                .map_err(s)?;
            if r.rows_affected() == 1 {
                return match r.last_insert_id() {
                    0 => grant(mysql_session_id(&mut conn).await?),
                    id => grant(id),
                };
            }
            let held: Option<bool> = sqlx::query(AssertSqlSafe(self.sql.holder.as_str()))
                .bind(key.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(s)?
                .map(|row| row.try_get("held"))
                .transpose()
                .map_err(s)?;
            match held {
                Some(true) => return Ok(None),
                // Freed between the two statements: the grant again.
                Some(false) => {}
                None => {
                    sqlx::query(AssertSqlSafe(self.sql.acquire_insert.as_str()))
                        .bind(key.as_str())
                        .bind(owner)
                        .bind(us)
                        .bind(key.as_str())
                        .bind(ms)
                        .execute(&mut *conn)
                        .await
                        .map_err(s)?;
                    return grant(mysql_session_id(&mut conn).await?);
                }
            }
        }
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        sqlx::query(AssertSqlSafe(self.release.as_str()))
            .bind(g.key.as_str())
            .bind(g.owner.as_str())
            .bind(g.token)
            .execute(&self.pool)
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        use sqlx::Connection;
        let mut conn = self.pool.acquire().await.map_err(s)?;
        conn.ping().await.map_err(s)
    }
    async fn version(&self) -> R<String> {
        sqlx::query_scalar::<_, String>("SELECT VERSION()")
            .fetch_one(&self.pool)
            .await
            .map(|v| format!("MySQL/MariaDB {v}"))
            .map_err(s)
    }
    async fn server_requests(&self) -> R<Option<u64>> {
        // Statements the server counted from every client (`Questions`: each statement a client
        // sends, prepared ones included; not pings, not statements inside triggers). Our own
        // readings are statements too: the ones before this are left out. Global, so the server
        // must not be serving anyone else meanwhile.
        let before = self
            .questions_read
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (_, n): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
            .fetch_one(&self.pool)
            .await
            .map_err(s)?;
        let n: u64 = n.trim().parse().map_err(s)?;
        Ok(Some(n.saturating_sub(before)))
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes: the objects of leasehold_k8s::protocol (new_claim, with_token, regrant, released), sent
// as the store sends them, on the store's client. Acquire reads the Lease; a missing one is
// created as a claim and then given its token (the created version) by a replace conditioned on
// that version; a free one is replaced conditioned on its resourceVersion. Release replaces the
// granted object with the released one. Left out: the store's local expiry clock (a foreign
// holder counts as holding) and its in-memory token floor.

/// Kubernetes over a client configured like the library's.
pub(crate) struct KubeRaw {
    pub(crate) api: Api<KubeLease>,
    pub(crate) store: leasehold_k8s::K8sLeaseStore,
}

/// The token recorded in a Lease's annotation, if any.
fn recorded_token(obj: &KubeLease) -> Option<u64> {
    obj.metadata
        .annotations
        .as_ref()?
        .get(TOKEN_ANNOTATION)?
        .parse()
        .ok()
}

#[async_trait]
impl Raw for KubeRaw {
    fn ping_name(&self) -> &'static str {
        "GET of an absent Lease"
    }
    /// The apiserver's own count of requests on Lease and ConfigMap objects
    /// (`apiserver_request_total` with `resource="leases"` or `"configmaps"`, all verbs and codes,
    /// watches included: the grouped mode keeps its assignments in ConfigMaps), read from its
    /// `/metrics`;
    /// that read is a non-resource URL and so not counted in it. Every client of the apiserver
    /// counts (the bench is the only one writing Leases during a measurement); `None` if the
    /// credentials may not read `/metrics`.
    async fn server_requests(&self) -> R<Option<u64>> {
        let req = http::Request::get("/metrics").body(Vec::new()).map_err(s)?;
        match self.api.clone().into_client().request_text(req).await {
            Ok(text) => Ok(Some(apiserver_lease_requests(&text))),
            Err(_) => Ok(None),
        }
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let name = self.store.object_name(key);
        let secs = ttl_secs(ttl).map_err(s)?.as_i32();
        let who = OwnerId::new(owner).map_err(s)?;
        let pp = PostParams::default();
        let (written, token) = match self.api.get_opt(&name).await.map_err(s)? {
            None => {
                let claim = protocol::new_claim(&name, &who, secs);
                let Ok(created) = self.api.create(&pp, &claim).await else {
                    return Ok(None);
                };
                let rv = protocol::parse_resource_version(
                    &name,
                    created.metadata.resource_version.as_deref(),
                )
                .map_err(s)?;
                let token = FencingToken::new(rv).map_err(s)?;
                let next = protocol::with_token(&created, &who, token);
                match self.api.replace(&name, &pp, &next).await {
                    Ok(o) => (o, token),
                    Err(_) => return Ok(None),
                }
            }
            Some(obj) => {
                let holder = obj
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    .unwrap_or_default();
                if !holder.is_empty() && holder != owner {
                    return Ok(None);
                }
                // The first version the replace can write, above the recorded token (ADR 0040).
                let rv = protocol::parse_resource_version(
                    &name,
                    obj.metadata.resource_version.as_deref(),
                )
                .map_err(s)?;
                let at_least = recorded_token(&obj)
                    .map_or(rv, |t| rv.max(t))
                    .saturating_add(1);
                let token = FencingToken::new(at_least).map_err(s)?;
                let next = protocol::regrant(&obj, &who, token, secs);
                match self.api.replace(&name, &pp, &next).await {
                    Ok(o) => (o, token),
                    Err(_) => return Ok(None),
                }
            }
        };
        Ok(Some(RawGrant {
            key: key.clone(),
            owner: owner.to_string(),
            token: i64::try_from(token.get()).map_err(s)?,
            lock: None,
            object: Some(Box::new(written)),
        }))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        let obj = g.object.as_deref().ok_or("not a Kubernetes grant")?;
        let name = self.store.object_name(&g.key);
        self.api
            .replace(&name, &PostParams::default(), &protocol::released(obj))
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        self.api
            .get_opt("leasehold-bench-absent-rtt-probe")
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn subscribe(&self, key: &LeaseKey) -> R<Option<mpsc::Receiver<()>>> {
        // The library's watch (leasehold-k8s/src/watch.rs): every event of the one Lease, from the
        // object's current resourceVersion; the request is open before this returns.
        let name = self.store.object_name(key);
        let rv = match self.api.get_opt(&name).await.map_err(s)? {
            Some(o) => o.metadata.resource_version.unwrap_or_else(|| "0".into()),
            None => "0".into(),
        };
        let params = WatchParams::default()
            .fields(&protocol::name_selector(&name))
            .timeout(290);
        let opened = tokio::time::timeout(Duration::from_secs(5), self.api.watch(&params, &rv))
            .await
            .map_err(|_| "the Kubernetes watch did not open".to_string())?
            .map_err(s)?;
        let hints = opened
            .take_while(|e| std::future::ready(e.is_ok()))
            .filter_map(|e| {
                std::future::ready(
                    matches!(
                        e,
                        Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_))
                    )
                    .then_some(()),
                )
            });
        Ok(Some(forward(hints)))
    }
    async fn version(&self) -> R<String> {
        Ok(String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_releases_are_the_librarys_without_its_extras() {
        // Derived from the library's text by removing one clause: a change there that the
        // derivation no longer matches must fail here, not silently measure the library's release.
        let sql = leasehold_postgres::protocol::Statements::new(
            &leasehold_postgres::TableName::default(),
            leasehold_postgres::TableLayout::default(),
        );
        let pg = pg_minimal_release(&sql);
        assert_ne!(pg, sql.release);
        assert!(
            pg.starts_with("UPDATE ") && !pg.contains("clock_timestamp"),
            "{pg}"
        );
        assert!(pg.ends_with("AND fencing_token = $3"), "{pg}");
        let my = leasehold_mysql::protocol::Statements::new(&leasehold_mysql::TableName::default());
        let mysql = mysql_minimal_release(&my);
        assert_ne!(mysql, my.release);
        assert!(
            mysql.starts_with("UPDATE ") && !mysql.contains("UTC_TIMESTAMP"),
            "{mysql}"
        );
        assert!(mysql.ends_with("AND fencing_token = ?"), "{mysql}");
        let lua = REDIS_MINIMAL_RELEASE.as_str();
        assert!(!lua.contains("PUBLISH") && lua.contains("'DEL'"), "{lua}");
    }

    #[test]
    fn apiserver_requests_count_only_leases_and_configmaps() {
        let text = "# HELP apiserver_request_total [STABLE] Counter of apiserver requests\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",group=\"coordination.k8s.io\",resource=\"leases\",verb=\"PUT\",version=\"v1\"} 1200\n\
            apiserver_request_total{code=\"409\",component=\"apiserver\",group=\"coordination.k8s.io\",resource=\"leases\",verb=\"PUT\",version=\"v1\"} 3\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",group=\"\",resource=\"pods\",verb=\"LIST\",version=\"v1\"} 50\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",group=\"\",resource=\"configmaps\",verb=\"PUT\",version=\"v1\"} 40\n\
            apiserver_request_total{code=\"200\",component=\"\",group=\"\",resource=\"\",verb=\"GET\",version=\"\"} 7\n\
            apiserver_request_duration_seconds_count{resource=\"leases\",verb=\"PUT\"} 1203\n";
        assert_eq!(apiserver_lease_requests(text), 1243);
    }

    #[test]
    fn redis_requests_leave_out_commands_scripts_run() {
        let cmds = script_commands();
        // `GET` runs only through `redis.pcall` in the scripts; `HMGET` (legacy records) and
        // `PUBLISH` through `redis.call`.
        for c in ["get", "set", "hmget", "publish", "pttl", "time", "del"] {
            assert!(cmds.iter().any(|x| x == c), "{c} missing from {cmds:?}");
        }
        let info = "# Commandstats\r\n\
                    cmdstat_evalsha:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_set:calls=30000,usec=9,usec_per_call=0.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_get:calls=30000,usec=9,usec_per_call=0.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_info:calls=2,usec=9,usec_per_call=4.50,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_ping:calls=1,usec=1,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(redis_client_requests(info, &cmds), 4);
    }

    /// `INFO` was once subtracted twice, once here (`cmdstat_info` left out) and
    /// once more in the renewal load's difference of two readings.
    #[test]
    fn requests_between_two_info_readings_are_not_reduced_twice() {
        let cmds = script_commands();
        let reading = |info_calls: u32, pings: u32| {
            format!(
                "# Commandstats\r\n\
                 cmdstat_info:calls={info_calls},usec=9,usec_per_call=4.50\r\n\
                 cmdstat_ping:calls={pings},usec=1,usec_per_call=1.00\r\n"
            )
        };
        // First INFO, then exactly 5 PINGs, then the second INFO.
        let before = redis_client_requests(&reading(1, 10), &cmds);
        let after = redis_client_requests(&reading(2, 15), &cmds);
        assert_eq!(
            crate::measure::requests_per_interval(before, after, 1),
            5.0,
            "5 PINGs were sent between the two readings"
        );
    }
}
