//! The raw protocols: the backends' own statements, scripts and requests, issued directly with
//! the same driver and the same connection (pool, connection manager, client) the library uses.
//! Copied from the backend crates; keep them in step when those change.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchFilterType,
    WatchOptions,
};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease as KubeLease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use lease_core::LeaseKey;
use lease_k8s::{TOKEN_ANNOTATION, TOKEN_HOLDER_ANNOTATION};
use sqlx::Row;
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

pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL: lease-postgres/src/sql.rs for the default table "public"."leases".

const PG_ACQUIRE: &str = "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now) \
     INSERT INTO \"public\".\"leases\" AS l (resource_key, owner, lease_until, fencing_token, ttl_ms) \
     SELECT $1, $2, c.now + $3::bigint * interval '1 millisecond', 1, $3 FROM c \
     ON CONFLICT (resource_key) DO UPDATE \
       SET owner = CASE WHEN (l.lease_until <= (SELECT now FROM c) OR l.owner = excluded.owner) THEN excluded.owner ELSE l.owner END, \
           lease_until = CASE WHEN (l.lease_until <= (SELECT now FROM c) OR l.owner = excluded.owner) THEN excluded.lease_until ELSE l.lease_until END, \
           fencing_token = CASE WHEN (l.lease_until <= (SELECT now FROM c) OR l.owner = excluded.owner) THEN l.fencing_token + 1 ELSE l.fencing_token END, \
           ttl_ms = CASE WHEN (l.lease_until <= (SELECT now FROM c) OR l.owner = excluded.owner) THEN excluded.ttl_ms ELSE l.ttl_ms END \
     RETURNING l.owner, l.fencing_token, l.ttl_ms, \
       ceil(extract(epoch FROM l.lease_until - (SELECT now FROM c)) * 1000000)::bigint AS remaining_us";

// The release notifies the table's channel in the same statement (LISTEN/NOTIFY watch).
const PG_RELEASE: &str = "WITH r AS (UPDATE \"public\".\"leases\" SET lease_until = '-infinity' \
     WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3 \
       AND lease_until > clock_timestamp() RETURNING resource_key) \
     SELECT pg_notify('lease:public.leases', r.resource_key) FROM r";

/// The channel the release notifies, with the key as the payload.
const PG_CHANNEL: &str = "lease:public.leases";

/// PostgreSQL over the library store's own pool.
pub(crate) struct PgRaw(pub(crate) sqlx::PgPool);

#[async_trait]
impl Raw for PgRaw {
    fn ping_name(&self) -> &'static str {
        "SELECT 1"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let row = sqlx::query(PG_ACQUIRE)
            .bind(key.as_str())
            .bind(owner)
            .bind(ttl_ms(ttl))
            .fetch_one(&self.0)
            .await
            .map_err(s)?;
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
        sqlx::query(PG_RELEASE)
            .bind(g.key.as_str())
            .bind(g.owner.as_str())
            .bind(g.token)
            .execute(&self.0)
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        sqlx::query("SELECT 1").execute(&self.0).await.map_err(s)?;
        Ok(())
    }
    async fn subscribe(&self, key: &LeaseKey) -> R<Option<mpsc::Receiver<()>>> {
        // A listener on its own connection, as the library's (lease-postgres/src/notify.rs).
        let own = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with((*self.0.connect_options()).clone());
        let mut listener = sqlx::postgres::PgListener::connect_with(&own)
            .await
            .map_err(s)?;
        listener.listen(PG_CHANNEL).await.map_err(s)?;
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
            .fetch_one(&self.0)
            .await
            .map(|v| format!("PostgreSQL {v}"))
            .map_err(s)
    }
}

// ---------------------------------------------------------------------------------------------
// Redis: lease-redis/src/scripts.rs, on the library store's connection manager.

const REDIS_ACQUIRE: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token', 'ttl')
if cur[1] and cur[1] ~= ARGV[1] then
  return {'held', cur[1], cur[2], tostring(redis.call('PTTL', KEYS[1])), cur[3]}
end
local gen = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tok = string.format('%.0f', gen)
if floor > gen then
  tok = string.format('%.0f', floor)
  redis.call('SET', KEYS[2], tok)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', tok, 'ttl', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'granted', tok}
";

const REDIS_RELEASE: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[2])
  return 1
end
return 0
";

/// Redis over the library store's connection manager and key layout.
pub(crate) struct RedisRaw {
    pub(crate) con: redis::aio::ConnectionManager,
    /// For the pub/sub connection of [`Raw::subscribe`].
    pub(crate) client: redis::Client,
    pub(crate) layout: lease_redis::KeyLayout,
    acquire: redis::Script,
    release: redis::Script,
}

impl RedisRaw {
    pub(crate) fn new(store: &lease_redis::RedisLeaseStore, client: redis::Client) -> Self {
        RedisRaw {
            con: store.connection(),
            client,
            layout: store.layout().clone(),
            acquire: redis::Script::new(REDIS_ACQUIRE),
            release: redis::Script::new(REDIS_RELEASE),
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
        let reply: Vec<String> = self
            .acquire
            .key(self.layout.lease(key))
            .key(self.layout.generation(key))
            .arg(owner)
            .arg(ttl_ms(ttl))
            .invoke_async(&mut con)
            .await
            .map_err(s)?;
        match reply.as_slice() {
            [tag, token] if tag == "granted" => Ok(Some(RawGrant {
                key: key.clone(),
                owner: owner.to_string(),
                token: token.parse().map_err(s)?,
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
            .arg(g.owner.as_str())
            .arg(g.token)
            .arg(self.layout.released_channel(&g.key))
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
        // The release script publishes on the key's release channel (lease-redis/src/watch.rs).
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

/// The commands the store's Lua scripts run, read off `lease-redis/src/scripts.rs`
/// (`redis.call('X', ...)`), lower-case.
fn script_commands() -> Vec<String> {
    const SCRIPTS: &str = include_str!("../../lease-redis/src/scripts.rs");
    let mut out: Vec<String> = SCRIPTS
        .split("redis.call('")
        .skip(1)
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
// etcd: the requests of lease-etcd/src/store.rs (LeaseSharing::PerGrant), on its client.

/// etcd over the library store's client.
pub(crate) struct EtcdRaw {
    pub(crate) client: etcd_client::Client,
    pub(crate) config: lease_etcd::EtcdConfig,
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
        let prefix = format!("{}/", self.config.lock_name(key));
        let mut kv = self.client.kv_client();
        let opts = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let current = kv.get(prefix.clone(), Some(opts)).await.map_err(s)?;
        if !current.kvs().is_empty() {
            return Ok(None);
        }
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut lc = self.client.lease_client();
        let lease_id = lc.grant(ttl_secs, None).await.map_err(s)?.id();
        let lock_key = format!("{prefix}{lease_id:x}");
        let txn = Txn::new()
            .when(vec![
                Compare::create_revision(prefix, CompareOp::Equal, 0).with_prefix(),
            ])
            .and_then(vec![TxnOp::put(
                lock_key.clone(),
                format!("lease-rs/1 {owner}"),
                Some(PutOptions::new().with_lease(lease_id)),
            )]);
        let resp = kv.txn(txn).await.map_err(s)?;
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
        let (lock_key, lease_id) = g.lock.clone().ok_or("not an etcd grant")?;
        let mut kv = self.client.kv_client();
        let found = kv.get(lock_key.clone(), None).await.map_err(s)?;
        let Some(cur) = found.kvs().first() else {
            return Ok(());
        };
        if cur.create_revision() != g.token {
            return Ok(());
        }
        let txn = Txn::new()
            .when(vec![
                Compare::create_revision(lock_key.clone(), CompareOp::Equal, g.token),
                Compare::lease(lock_key.clone(), CompareOp::Equal, lease_id),
            ])
            .and_then(vec![TxnOp::delete(lock_key, None)]);
        kv.txn(txn).await.map_err(s)?;
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
        // The library's watch (lease-etcd/src/store.rs): deletions under the key's lock prefix,
        // confirmed by the server before any release is issued.
        let prefix = format!("{}/", self.config.lock_name(key));
        let opts = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        let mut wc = self.client.watch_client();
        let mut stream = wc.watch(prefix, Some(opts)).await.map_err(s)?;
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
// SQLite: lease-sqlite/src/sql.rs, on a pool with the store's options (WAL, synchronous NORMAL,
// 5 s busy timeout, 4 connections) on the same file.

const NOW_MS: &str = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)";

/// SQLite on its own pool with the library's settings.
pub(crate) struct SqliteRaw {
    pool: sqlx::SqlitePool,
    /// In-process waiters woken after a release commits, as the library's store wakes its own.
    waiters: std::sync::Mutex<Vec<(String, mpsc::Sender<()>)>>,
    acquire_read: String,
    release: String,
}

impl SqliteRaw {
    pub(crate) async fn open(path: &std::path::Path) -> R<Self> {
        use sqlx::sqlite::{
            SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
        };
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts)
            .await
            .map_err(s)?;
        Ok(SqliteRaw {
            pool,
            waiters: std::sync::Mutex::new(Vec::new()),
            acquire_read: format!(
                "SELECT {NOW_MS}, (SELECT last_token FROM lease_generation WHERE key = ?1), \
                 h.owner, h.token, h.ttl_ms, h.expires_ms FROM (SELECT 1) LEFT JOIN lease_holder h ON h.key = ?1"
            ),
            release: format!(
                "DELETE FROM lease_holder WHERE key = ?1 AND owner = ?2 AND token = ?3 AND expires_ms > {NOW_MS}"
            ),
        })
    }
}

type SqliteRow = (
    i64,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

#[async_trait]
impl Raw for SqliteRaw {
    fn ping_name(&self) -> &'static str {
        "SELECT 1"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(s)?;
        let (now, generation, holder, token, _ttl, expires): SqliteRow =
            sqlx::query_as(sqlx::AssertSqlSafe(self.acquire_read.as_str()))
                .bind(key.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(s)?;
        if let (Some(h), Some(exp)) = (&holder, expires)
            && exp > now
            && h != owner
        {
            tx.rollback().await.map_err(s)?;
            return Ok(None);
        }
        let next = generation.max(token).map_or(1, |t| t + 1);
        sqlx::query(
            "INSERT INTO lease_generation (key, last_token) VALUES (?1, ?2) \
             ON CONFLICT (key) DO UPDATE SET last_token = excluded.last_token",
        )
        .bind(key.as_str())
        .bind(next)
        .execute(&mut *tx)
        .await
        .map_err(s)?;
        let ms = ttl_ms(ttl);
        sqlx::query(
            "INSERT INTO lease_holder (key, owner, token, ttl_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = excluded.token, \
             ttl_ms = excluded.ttl_ms, expires_ms = excluded.expires_ms",
        )
        .bind(key.as_str())
        .bind(owner)
        .bind(next)
        .bind(ms)
        .bind(now.saturating_add(ms))
        .execute(&mut *tx)
        .await
        .map_err(s)?;
        tx.commit().await.map_err(s)?;
        Ok(Some(RawGrant {
            key: key.clone(),
            owner: owner.to_string(),
            token: next,
            lock: None,
            object: None,
        }))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.release.as_str()))
            .bind(g.key.as_str())
            .bind(g.owner.as_str())
            .bind(g.token)
            .execute(&self.pool)
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
// Kubernetes: the requests of lease-k8s/src/store.rs and the object edits of record.rs, on the
// store's client. Acquire reads the Lease and replaces it conditioned on its resourceVersion
// (or creates it); release replaces the granted object with an empty holder.

/// Kubernetes over a client configured like the library's.
pub(crate) struct KubeRaw {
    pub(crate) api: Api<KubeLease>,
    pub(crate) store: lease_k8s::KubeLeaseStore,
}

pub(crate) fn micro_now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

#[async_trait]
impl Raw for KubeRaw {
    fn ping_name(&self) -> &'static str {
        "GET of an absent Lease"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let name = self.store.object_name(key);
        let secs = i32::try_from(ttl.as_secs().max(1)).unwrap_or(i32::MAX);
        let t = micro_now();
        let written = match self.api.get_opt(&name).await.map_err(s)? {
            None => {
                let mut annotations = std::collections::BTreeMap::new();
                annotations.insert(TOKEN_ANNOTATION.to_string(), "1".to_string());
                annotations.insert(TOKEN_HOLDER_ANNOTATION.to_string(), owner.to_string());
                let obj = KubeLease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        annotations: Some(annotations),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(owner.to_string()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: Some(t.clone()),
                        renew_time: Some(t),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                match self.api.create(&PostParams::default(), &obj).await {
                    Ok(o) => o,
                    Err(_) => return Ok(None),
                }
            }
            Some(mut obj) => {
                let mut spec = obj.spec.take().unwrap_or_default();
                let holder = spec.holder_identity.clone().unwrap_or_default();
                if !holder.is_empty() && holder != owner {
                    return Ok(None);
                }
                let rv: u64 = obj
                    .metadata
                    .resource_version
                    .as_deref()
                    .unwrap_or("0")
                    .parse()
                    .map_err(s)?;
                let mut annotations = obj.metadata.annotations.take().unwrap_or_default();
                let recorded: u64 = annotations
                    .get(TOKEN_ANNOTATION)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let token = rv.max(recorded.saturating_add(1));
                annotations.insert(TOKEN_ANNOTATION.to_string(), token.to_string());
                annotations.insert(TOKEN_HOLDER_ANNOTATION.to_string(), owner.to_string());
                obj.metadata.annotations = Some(annotations);
                if holder != owner {
                    spec.acquire_time = Some(t.clone());
                    spec.lease_transitions =
                        Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                }
                spec.holder_identity = Some(owner.to_string());
                spec.lease_duration_seconds = Some(secs);
                spec.renew_time = Some(t);
                obj.spec = Some(spec);
                match self.api.replace(&name, &PostParams::default(), &obj).await {
                    Ok(o) => o,
                    Err(_) => return Ok(None),
                }
            }
        };
        let token = written
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TOKEN_ANNOTATION))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0);
        Ok(Some(RawGrant {
            key: key.clone(),
            owner: owner.to_string(),
            token,
            lock: None,
            object: Some(Box::new(written)),
        }))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        let mut obj = *g.object.clone().ok_or("not a Kubernetes grant")?;
        let name = self.store.object_name(&g.key);
        let mut spec = obj.spec.take().unwrap_or_default();
        let t = micro_now();
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(t.clone());
        spec.renew_time = Some(t);
        obj.spec = Some(spec);
        self.api
            .replace(&name, &PostParams::default(), &obj)
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        self.api
            .get_opt("lease-bench-absent-rtt-probe")
            .await
            .map_err(s)?;
        Ok(())
    }
    async fn subscribe(&self, key: &LeaseKey) -> R<Option<mpsc::Receiver<()>>> {
        // The library's watch (lease-k8s/src/watch.rs): every event of the one Lease, from the
        // object's current resourceVersion; the request is open before this returns.
        let name = self.store.object_name(key);
        let rv = match self.api.get_opt(&name).await.map_err(s)? {
            Some(o) => o.metadata.resource_version.unwrap_or_else(|| "0".into()),
            None => "0".into(),
        };
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
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
    fn redis_requests_leave_out_commands_scripts_run() {
        let cmds = script_commands();
        assert!(cmds.iter().any(|c| c == "pexpire"), "{cmds:?}");
        assert!(cmds.iter().any(|c| c == "hmget"), "{cmds:?}");
        let info = "# Commandstats\r\n\
                    cmdstat_evalsha:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_pexpire:calls=30000,usec=9,usec_per_call=0.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_hmget:calls=30000,usec=9,usec_per_call=0.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_info:calls=2,usec=9,usec_per_call=4.50,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_ping:calls=1,usec=1,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(redis_client_requests(info, &cmds), 4);
    }

    /// Issue 22 part 5: `INFO` was subtracted twice, once here (`cmdstat_info` left out) and
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
