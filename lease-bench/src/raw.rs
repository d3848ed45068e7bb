//! The raw protocols: the backends' own statements, scripts and requests, issued directly with
//! the same driver and the same connection (pool, connection manager, client) the library uses.
//! Copied from the backend crates; keep them in step when those change.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};
use k8s_openapi::api::coordination::v1::{Lease as KubeLease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use lease_core::LeaseKey;
use lease_k8s::{TOKEN_ANNOTATION, TOKEN_HOLDER_ANNOTATION};
use sqlx::Row;

/// One grant made through a raw protocol.
#[derive(Debug, Clone)]
pub(crate) struct RawGrant {
    key: LeaseKey,
    owner: String,
    token: i64,
    /// etcd: the lock key and its etcd lease.
    lock: Option<(String, i64)>,
    /// Kubernetes: the Lease object as written by the grant.
    object: Option<Box<KubeLease>>,
}

type R<T> = Result<T, String>;

fn s<E: std::fmt::Display>(e: E) -> String {
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
    /// The number of requests the server has handled so far, counted by the server itself
    /// (etcd's gRPC metrics, Redis's `total_commands_processed`); `None` where it has no such
    /// counter. Deltas of it count round trips independently of the client.
    async fn server_requests(&self) -> R<Option<u64>> {
        Ok(None)
    }
}

fn ttl_ms(ttl: Duration) -> i64 {
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
    pub(crate) layout: lease_redis::KeyLayout,
    acquire: redis::Script,
    release: redis::Script,
}

impl RedisRaw {
    pub(crate) fn new(store: &lease_redis::RedisLeaseStore) -> Self {
        RedisRaw {
            con: store.connection(),
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
    async fn server_requests(&self) -> R<Option<u64>> {
        let mut con = self.con.clone();
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut con)
            .await
            .map_err(s)?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|v| v.trim().parse().ok()))
    }
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
        Ok(())
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

fn micro_now() -> MicroTime {
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
    async fn version(&self) -> R<String> {
        Ok(String::new())
    }
}
