//! The minimal baselines: a lease with a fencing counter written the way an expert would write
//! it by hand for each store, and no more. These are the floors the library's goals are judged
//! against (not the library's own protocol, which `raw.rs` issues to measure the wrapper).
//!
//! - PostgreSQL: one upsert on a plain table without trigger; release is one guarded `UPDATE`.
//!   Ablations ([`PgAblation`]) add the library's table layout, an update trigger or the
//!   library's clock-floored token, to price them.
//! - Redis: `SET NX PX` plus `INCR` in one script; release is a compare-and-delete script.
//!   Ablations ([`RedisAblation`]) add a `TIME` read, the library's clock-floored token or the
//!   release's `PUBLISH`.
//! - etcd: the shape of etcd's own `concurrency.Mutex`: one etcd lease per TTL, granted once and
//!   kept alive in the background (a `Session`), shared by every grant; acquire is a txn guarded by
//!   `create_revision == 0` that puts the key with that lease (the token is the txn's revision);
//!   release is a txn that deletes the key if its create revision is still the token. Two writes
//!   per pair, against the three of one etcd lease per grant.
//! - Kubernetes: a GET, then a resourceVersion-guarded REPLACE (or a CREATE); release is a
//!   REPLACE with an empty holder. The token is the written object's resourceVersion. The
//!   ablation [`KubeMinimal::annotated`] adds the library's token annotations.
//! - MySQL / MariaDB: one `INSERT .. ON DUPLICATE KEY UPDATE` on a plain InnoDB table without
//!   trigger, the token handed back in the OK packet through `LAST_INSERT_ID(expr)` (no second
//!   statement to read it); release is one guarded `UPDATE`.
//! - SQLite: one upsert in autocommit (a single statement is its own transaction, and SQLite's
//!   busy handler retries its write lock); release is one guarded `UPDATE`; the pool does not
//!   ping a connection before handing it out.
//!
//! Each uses the same driver and connection (pool, connection manager, client) as the library,
//! on keys or tables of its own.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use k8s_openapi::api::coordination::v1::{Lease as KubeLease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use leasehold_core::LeaseKey;

use crate::raw::{R, Raw, RawGrant, s, ttl_ms};

fn micro_now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

fn grant(key: &LeaseKey, owner: &str, token: i64) -> RawGrant {
    RawGrant {
        key: key.clone(),
        owner: owner.to_string(),
        token,
        lock: None,
        object: None,
    }
}

// ---- PostgreSQL ------------------------------------------------------------------------------

const PG_TABLE: &str = "CREATE TABLE IF NOT EXISTS lease_bench_minimal (\
     lease_key text PRIMARY KEY, owner_id uuid, \
     lease_until timestamptz NOT NULL DEFAULT '-infinity', fencing_token bigint NOT NULL DEFAULT 0)";

const PG_ACQUIRE: &str = "INSERT INTO lease_bench_minimal AS l (lease_key, owner_id, lease_until) \
     VALUES ($1, $2::uuid, clock_timestamp() + $3::bigint * interval '1 millisecond') \
     ON CONFLICT (lease_key) DO UPDATE SET owner_id = $2::uuid, \
       lease_until = clock_timestamp() + $3::bigint * interval '1 millisecond', \
       fencing_token = l.fencing_token + 1 \
     WHERE l.lease_until < clock_timestamp() OR l.owner_id = $2::uuid \
     RETURNING fencing_token";

const PG_RELEASE: &str = "UPDATE lease_bench_minimal SET lease_until = '-infinity' \
     WHERE lease_key = $1 AND owner_id = $2::uuid AND fencing_token = $3";

/// The ablation [`PgAblation::LibraryLayout`]: the library's table layout
/// (`leasehold-postgres/src/protocol.rs`, `LIBRARY_TABLE`: a text owner, `ttl_ms`, `wake` and the
/// three CHECKs), without its triggers.
const PG_LAYOUT_TABLE: &str = "CREATE TABLE IF NOT EXISTS lease_bench_minimal_layout (\
     resource_key text PRIMARY KEY, owner text NOT NULL, lease_until timestamptz NOT NULL, \
     fencing_token bigint NOT NULL CHECK (fencing_token > 0), ttl_ms bigint CHECK (ttl_ms > 0), \
     wake smallint NOT NULL DEFAULT 0 CHECK (wake IN (0, 1, 2)))";

/// The minimal upsert on the library's layout: the same decision and counter, the TTL written
/// with each grant as the library does.
const PG_LAYOUT_ACQUIRE: &str = "INSERT INTO lease_bench_minimal_layout AS l \
       (resource_key, owner, lease_until, fencing_token, ttl_ms) \
     VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 millisecond', 1, $3::bigint) \
     ON CONFLICT (resource_key) DO UPDATE SET owner = $2, \
       lease_until = clock_timestamp() + $3::bigint * interval '1 millisecond', \
       fencing_token = l.fencing_token + 1, ttl_ms = $3::bigint \
     WHERE l.lease_until < clock_timestamp() OR l.owner = $2 \
     RETURNING fencing_token";

const PG_LAYOUT_RELEASE: &str = "UPDATE lease_bench_minimal_layout SET lease_until = '-infinity' \
     WHERE resource_key = $1 AND owner = $2 AND fencing_token = $3";

/// The ablation [`PgAblation::UpdateTrigger`]: the minimal table with a `BEFORE UPDATE OF
/// fencing_token` row trigger whose `WHEN` is false for every statement sent here, as the
/// library's update trigger (`leasehold-postgres/sql/leases.sql.template`) is for the library's own
/// grants and releases: its function never runs, and what is priced is what PostgreSQL does for
/// such a trigger anyway (it locks the row before evaluating `WHEN`, one more WAL record per
/// update). Separate statements: `simple_query` runs them in one implicit transaction.
const PG_TRIGGER_TABLE: &str = "CREATE TABLE IF NOT EXISTS lease_bench_minimal_trigger (\
     lease_key text PRIMARY KEY, owner_id uuid, \
     lease_until timestamptz NOT NULL DEFAULT '-infinity', fencing_token bigint NOT NULL DEFAULT 0);
CREATE OR REPLACE FUNCTION lease_bench_never() RETURNS trigger LANGUAGE plpgsql \
     AS $fn$ BEGIN RETURN NEW; END $fn$;
CREATE OR REPLACE TRIGGER lease_bench_minimal_trigger_update \
     BEFORE UPDATE OF fencing_token ON lease_bench_minimal_trigger FOR EACH ROW \
     WHEN (NEW.fencing_token < OLD.fencing_token) EXECUTE FUNCTION lease_bench_never()";

/// The ablation [`PgAblation::TokenFloor`]: the minimal upsert whose token is the library's,
/// `greatest(old + 1, the server's clock in microseconds)` (the floor of ADR 0010 that keeps a
/// token from repeating after the row's deletion or a failover), on the minimal table.
static PG_FLOOR_ACQUIRE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    PG_ACQUIRE.replace(
        "fencing_token = l.fencing_token + 1",
        "fencing_token = greatest(l.fencing_token + 1, \
           floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)",
    )
});

/// One of the library's PostgreSQL costs added to the minimal lease, to price it (not a floor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PgAblation {
    /// The minimal statements on the library's table layout.
    LibraryLayout,
    /// The minimal table with an update trigger whose function never runs.
    UpdateTrigger,
    /// The minimal upsert with the library's clock-floored token.
    TokenFloor,
}

/// The PostgreSQL floor (or an ablation of it), on the library store's pool.
pub(crate) struct PgMinimal {
    pool: sqlx::PgPool,
    acquire: &'static str,
    release: &'static str,
}

impl PgMinimal {
    /// The floor; creates its table if needed. The pool must not ping a connection before
    /// each checkout (sqlx's `test_before_acquire`): an expert turns that round trip off, and
    /// the library's pool has it off.
    pub(crate) async fn new(pool: sqlx::PgPool) -> R<Self> {
        if pool.options().get_test_before_acquire() {
            return Err("the pool pings each connection before a checkout \
                        (test_before_acquire): the floor would pay a round trip per statement"
                .into());
        }
        sqlx::query(PG_TABLE).execute(&pool).await.map_err(s)?;
        Ok(Self::floor(pool))
    }

    /// The floor on a pool, for [`cleanup`](Self::cleanup) (no DDL).
    pub(crate) fn floor(pool: sqlx::PgPool) -> Self {
        PgMinimal {
            pool,
            acquire: PG_ACQUIRE,
            release: PG_RELEASE,
        }
    }

    /// The floor with one of the library's costs added; creates its table if needed.
    pub(crate) async fn with(pool: sqlx::PgPool, ablation: PgAblation) -> R<Self> {
        let m = match ablation {
            PgAblation::LibraryLayout => {
                sqlx::query(PG_LAYOUT_TABLE)
                    .execute(&pool)
                    .await
                    .map_err(s)?;
                PgMinimal {
                    pool,
                    acquire: PG_LAYOUT_ACQUIRE,
                    release: PG_LAYOUT_RELEASE,
                }
            }
            PgAblation::TokenFloor => {
                sqlx::query(PG_TABLE).execute(&pool).await.map_err(s)?;
                PgMinimal {
                    pool,
                    acquire: PG_FLOOR_ACQUIRE.as_str(),
                    release: PG_RELEASE,
                }
            }
            PgAblation::UpdateTrigger => {
                sqlx::raw_sql(sqlx::AssertSqlSafe(PG_TRIGGER_TABLE))
                    .execute(&pool)
                    .await
                    .map_err(s)?;
                PgMinimal {
                    acquire: PG_TRIGGER_ACQUIRE.as_str(),
                    release: PG_TRIGGER_RELEASE.as_str(),
                    pool,
                }
            }
        };
        Ok(m)
    }

    /// Deletes the rows of `ns`, on the floor's table and the ablations'.
    pub(crate) async fn cleanup(&self, ns: &str) {
        let tables = [
            ("lease_bench_minimal", "lease_key"),
            ("lease_bench_minimal_layout", "resource_key"),
            ("lease_bench_minimal_trigger", "lease_key"),
        ];
        for (table, column) in tables {
            // A table this run never created is not an error worth reporting.
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE starts_with({column}, $1)"
            )))
            .bind(ns)
            .execute(&self.pool)
            .await;
        }
    }
}

/// The floor's statements on the trigger ablation's table.
static PG_TRIGGER_ACQUIRE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    PG_ACQUIRE.replace("lease_bench_minimal", "lease_bench_minimal_trigger")
});
static PG_TRIGGER_RELEASE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    PG_RELEASE.replace("lease_bench_minimal", "lease_bench_minimal_trigger")
});

#[async_trait]
impl Raw for PgMinimal {
    fn ping_name(&self) -> &'static str {
        "SELECT 1"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let token: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(self.acquire))
            .bind(key.as_str())
            .bind(owner)
            .bind(ttl_ms(ttl)?)
            .fetch_optional(&self.pool)
            .await
            .map_err(s)?;
        Ok(token.map(|t| grant(key, owner, t)))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.release))
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
        Ok(String::new())
    }
}

// ---- Redis -----------------------------------------------------------------------------------

const REDIS_ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
";

const REDIS_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The minimal acquire plus one guarantee of the library's (not a floor: an ablation that
/// prices the guarantee): the server's clock read first, as the library's token floor does.
const REDIS_ACQUIRE_TIME: &str = r"
local t = redis.call('TIME')
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
";

/// The minimal release plus one guarantee of the library's (an ablation): the release
/// published on the key's channel, as the library wakes its waiters.
const REDIS_RELEASE_PUBLISH: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
";

/// The minimal acquire with the library's token (an ablation): `max(counter + 1, server TIME in
/// microseconds)`, computed as the library's acquire computes it (the clock's digits compared
/// with the previous counter's as strings, `SET .. GET` on the counter, a second `SET` only when
/// the counter is not below the clock), so that a token never repeats after the counter's loss.
const REDIS_ACQUIRE_FLOOR: &str = r"
local t = redis.call('TIME')
local s = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local old = redis.call('SET', KEYS[2], s, 'GET')
  if old and (#old > #s or (#old == #s and old >= s)) then
    s = string.format('%.0f', tonumber(old) + 1)
    redis.call('SET', KEYS[2], s)
  end
  return s
end
return false
";

/// One of the library's guarantees added to the minimal Redis lease, to price it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedisAblation {
    /// `TIME` before the acquire (the library's token floor reads the server clock).
    ServerClock,
    /// The token floored by the server clock, computed as the library does.
    TokenFloor,
    /// `PUBLISH` in the release (the library's release notification).
    ReleaseNotification,
}

/// The Redis floor, on the library store's connection manager.
pub(crate) struct RedisMinimal {
    con: leasehold_redis::RedisConnection,
    acquire: redis::Script,
    release: redis::Script,
    /// The release publishes (the [`RedisAblation::ReleaseNotification`] variant).
    publish: bool,
}

impl RedisMinimal {
    pub(crate) fn new(con: leasehold_redis::RedisConnection) -> Self {
        RedisMinimal {
            con,
            acquire: redis::Script::new(REDIS_ACQUIRE),
            release: redis::Script::new(REDIS_RELEASE),
            publish: false,
        }
    }

    /// The minimal lease with one of the library's guarantees added (for pricing it; same keys).
    pub(crate) fn with(con: leasehold_redis::RedisConnection, ablation: RedisAblation) -> Self {
        let mut m = Self::new(con);
        match ablation {
            RedisAblation::ServerClock => m.acquire = redis::Script::new(REDIS_ACQUIRE_TIME),
            RedisAblation::TokenFloor => m.acquire = redis::Script::new(REDIS_ACQUIRE_FLOOR),
            RedisAblation::ReleaseNotification => {
                m.release = redis::Script::new(REDIS_RELEASE_PUBLISH);
                m.publish = true;
            }
        }
        m
    }

    /// The holder key and the counter key of `key`.
    fn keys(key: &LeaseKey) -> (String, String) {
        (
            format!("bench-min:{}", key.as_str()),
            format!("bench-min:{}:token", key.as_str()),
        )
    }

    /// Deletes the keys of `ns`.
    pub(crate) async fn cleanup(&self, ns: &str) {
        redis_delete_matching(self.con.clone(), &format!("bench-min:{ns}*")).await;
    }
}

/// Deletes every key matching `pattern` (`SCAN` + `DEL`), best effort.
pub(crate) async fn redis_delete_matching(
    mut con: leasehold_redis::RedisConnection,
    pattern: &str,
) {
    let mut cursor: u64 = 0;
    loop {
        let r: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await;
        let Ok((next, keys)) = r else { break };
        if !keys.is_empty() {
            let _: redis::RedisResult<i64> =
                redis::cmd("DEL").arg(&keys).query_async(&mut con).await;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

#[async_trait]
impl Raw for RedisMinimal {
    fn ping_name(&self) -> &'static str {
        "PING"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let (holder, counter) = Self::keys(key);
        let mut con = self.con.clone();
        let token: Option<i64> = self
            .acquire
            .key(holder)
            .key(counter)
            .arg(owner)
            .arg(ttl_ms(ttl)?)
            .invoke_async(&mut con)
            .await
            .map_err(s)?;
        Ok(token.map(|t| grant(key, owner, t)))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        let (holder, _) = Self::keys(&g.key);
        let mut con = self.con.clone();
        let mut inv = self.release.key(&holder);
        inv.arg(g.owner.as_str());
        if self.publish {
            inv.arg(format!("{holder}:released")).arg(g.token);
        }
        let _: i64 = inv.invoke_async(&mut con).await.map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        let mut con = self.con.clone();
        let _: String = redis::cmd("PING").query_async(&mut con).await.map_err(s)?;
        Ok(())
    }
    async fn version(&self) -> R<String> {
        Ok(String::new())
    }
}

// ---- etcd ------------------------------------------------------------------------------------

/// The etcd floor, on the library store's client: grants share one etcd lease per TTL, kept
/// alive by a task of its own while the floor lives.
pub(crate) struct EtcdMinimal {
    client: etcd_client::Client,
    /// The shared etcd lease per TTL in seconds, with the task that keeps it alive.
    leases: tokio::sync::Mutex<Vec<(i64, i64, tokio::task::JoinHandle<()>)>>,
}

impl EtcdMinimal {
    pub(crate) fn new(client: etcd_client::Client) -> Self {
        EtcdMinimal {
            client,
            leases: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    /// The shared etcd lease of `ttl_secs`, granted (and its keepalive started) on first use.
    async fn lease(&self, ttl_secs: i64) -> R<i64> {
        let mut leases = self.leases.lock().await;
        if let Some((_, id, _)) = leases.iter().find(|(t, _, _)| *t == ttl_secs) {
            return Ok(*id);
        }
        let mut lc = self.client.lease_client();
        let id = lc.grant(ttl_secs, None).await.map_err(s)?.id();
        let (mut keeper, mut responses) = lc.keep_alive(id).await.map_err(s)?;
        let every = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(1).max(1)) / 3;
        // As etcd's Session: a keepalive every third of the TTL until the floor is dropped.
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                match responses.message().await {
                    Ok(Some(_)) => {}
                    _ => return,
                }
            }
        });
        leases.push((ttl_secs, id, task));
        Ok(id)
    }
}

impl Drop for EtcdMinimal {
    fn drop(&mut self) {
        for (_, _, task) in self.leases.get_mut().iter() {
            task.abort();
        }
    }
}

#[async_trait]
impl Raw for EtcdMinimal {
    fn ping_name(&self) -> &'static str {
        "Status"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let k = format!("bench-min/{}", key.as_str());
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let lease_id = self.lease(ttl_secs).await?;
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(
                k.clone(),
                owner,
                Some(PutOptions::new().with_lease(lease_id)),
            )]);
        let resp = self.client.kv_client().txn(txn).await.map_err(s)?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let token = resp.header().map(|h| h.revision()).ok_or("no header")?;
        let mut g = grant(key, owner, token);
        g.lock = Some((k, lease_id));
        Ok(Some(g))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        let (k, _) = g.lock.clone().ok_or("not an etcd grant")?;
        // The key goes only if it is still this grant's (created at the token's revision).
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.clone(),
                CompareOp::Equal,
                g.token,
            )])
            .and_then(vec![TxnOp::delete(k, None)]);
        self.client.kv_client().txn(txn).await.map_err(s)?;
        Ok(())
    }
    async fn ping(&self) -> R<()> {
        self.client.maintenance_client().status().await.map_err(s)?;
        Ok(())
    }
    async fn version(&self) -> R<String> {
        Ok(String::new())
    }
}

// ---- Kubernetes ------------------------------------------------------------------------------

/// The Kubernetes floor, on a client configured like the library's.
pub(crate) struct KubeMinimal {
    api: Api<KubeLease>,
    /// The ablation "minimal + the token annotations": each grant also writes the library's
    /// token and token-holder annotations (`leasehold-k8s/src/protocol.rs`), the token being the old
    /// annotation + 1, so that it never goes back when the object is deleted and created again
    /// (the resourceVersion is no such counter). Priced, not a floor.
    annotate: bool,
}

impl KubeMinimal {
    /// The floor.
    pub(crate) fn new(api: Api<KubeLease>) -> Self {
        KubeMinimal {
            api,
            annotate: false,
        }
    }

    /// The floor with the library's token annotations on every grant.
    pub(crate) fn annotated(api: Api<KubeLease>) -> Self {
        KubeMinimal {
            api,
            annotate: true,
        }
    }

    fn name(&self, key: &LeaseKey) -> String {
        let side = if self.annotate { "mina" } else { "min" };
        format!("{side}-{}", key.as_str())
    }

    /// Sets the token annotations of a grant to `owner` over `old` ones; the token is returned.
    fn annotate(&self, meta: &mut ObjectMeta, owner: &str) -> Option<i64> {
        if !self.annotate {
            return None;
        }
        let a = meta.annotations.get_or_insert_with(Default::default);
        let token = a
            .get(leasehold_k8s::protocol::TOKEN_ANNOTATION)
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(0)
            .saturating_add(1);
        a.insert(
            leasehold_k8s::protocol::TOKEN_ANNOTATION.to_string(),
            token.to_string(),
        );
        a.insert(
            leasehold_k8s::protocol::TOKEN_HOLDER_ANNOTATION.to_string(),
            owner.to_string(),
        );
        Some(token)
    }
}

#[async_trait]
impl Raw for KubeMinimal {
    fn ping_name(&self) -> &'static str {
        "GET of an absent Lease"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let name = self.name(key);
        let secs = i32::try_from(ttl.as_secs().max(1)).unwrap_or(i32::MAX);
        let t = micro_now();
        let spec = |old: Option<&LeaseSpec>| LeaseSpec {
            holder_identity: Some(owner.to_string()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(t.clone()),
            renew_time: Some(t.clone()),
            lease_transitions: Some(
                old.and_then(|o| o.lease_transitions)
                    .unwrap_or(0)
                    .saturating_add(1),
            ),
            ..LeaseSpec::default()
        };
        let annotated;
        let written = match self.api.get_opt(&name).await.map_err(s)? {
            None => {
                let mut obj = KubeLease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec(None)),
                };
                annotated = self.annotate(&mut obj.metadata, owner);
                match self.api.create(&PostParams::default(), &obj).await {
                    Ok(o) => o,
                    Err(_) => return Ok(None),
                }
            }
            Some(mut obj) => {
                let old = obj.spec.take().unwrap_or_default();
                let holder = old.holder_identity.as_deref().unwrap_or("");
                let expired = match (&old.renew_time, old.lease_duration_seconds) {
                    (Some(r), Some(d)) => r.0 + jiff::SignedDuration::from_secs(i64::from(d)) < t.0,
                    _ => true,
                };
                if !holder.is_empty() && holder != owner && !expired {
                    return Ok(None);
                }
                obj.spec = Some(spec(Some(&old)));
                annotated = self.annotate(&mut obj.metadata, owner);
                // The object keeps its resourceVersion: the REPLACE fails if anyone wrote since.
                match self.api.replace(&name, &PostParams::default(), &obj).await {
                    Ok(o) => o,
                    Err(_) => return Ok(None),
                }
            }
        };
        let token = annotated.unwrap_or_else(|| {
            written
                .metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(0)
        });
        let mut g = grant(key, owner, token);
        g.object = Some(Box::new(written));
        Ok(Some(g))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        let mut obj = *g.object.clone().ok_or("not a Kubernetes grant")?;
        let mut spec = obj.spec.take().unwrap_or_default();
        spec.holder_identity = Some(String::new());
        obj.spec = Some(spec);
        self.api
            .replace(&self.name(&g.key), &PostParams::default(), &obj)
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
    async fn version(&self) -> R<String> {
        Ok(String::new())
    }
}

// ---- MySQL / MariaDB ---------------------------------------------------------------------------

const MYSQL_TABLE: &str = "CREATE TABLE IF NOT EXISTS lease_bench_minimal (\
     lease_key VARBINARY(255) NOT NULL PRIMARY KEY, owner_id VARBINARY(255) NOT NULL, \
     lease_until DATETIME(6) NOT NULL, fencing_token BIGINT NOT NULL) ENGINE=InnoDB";

/// One upsert, one round trip. A new key's row is inserted with token 1; an existing row is
/// taken when expired or already the owner's. `ON DUPLICATE KEY UPDATE` assigns left to right,
/// each assignment seeing the ones before it: the token first (judged on the old owner and
/// expiry), then the owner (judged on the same), then the expiry (the owner is the caller's now
/// exactly when the row was granted). The token comes back in the OK packet through
/// `LAST_INSERT_ID(expr)`, the last call of the statement: 1 for an insert, the new token for a
/// grant, 0 for a refusal (`LAST_INSERT_ID(0)` adds nothing to the old token).
const MYSQL_ACQUIRE: &str = "INSERT INTO lease_bench_minimal \
       (lease_key, owner_id, lease_until, fencing_token) \
     VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, LAST_INSERT_ID(1)) \
     ON DUPLICATE KEY UPDATE \
       fencing_token = IF(lease_until <= UTC_TIMESTAMP(6) OR owner_id = VALUES(owner_id), \
         LAST_INSERT_ID(fencing_token + 1), fencing_token + LAST_INSERT_ID(0)), \
       owner_id = IF(lease_until <= UTC_TIMESTAMP(6) OR owner_id = VALUES(owner_id), \
         VALUES(owner_id), owner_id), \
       lease_until = IF(owner_id = VALUES(owner_id), VALUES(lease_until), lease_until)";

/// Renewal by the same statement: the owner's own row is granted again with the next token.
const MYSQL_RELEASE: &str = "UPDATE lease_bench_minimal SET lease_until = '1970-01-01 00:00:00' \
     WHERE lease_key = ? AND owner_id = ? AND fencing_token = ?";

/// The ablation [`MysqlMinimal::token_floor`]: the minimal upsert whose token is the library's,
/// `GREATEST(old + 1, the server's clock in microseconds)` (a new key's: the clock), so that a
/// token does not repeat after the row's deletion or a failover.
static MYSQL_FLOOR_ACQUIRE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let clock = leasehold_mysql::protocol::CLOCK_US;
    MYSQL_ACQUIRE
        .replace(
            "LAST_INSERT_ID(1)",
            &format!("LAST_INSERT_ID(GREATEST(1, {clock}))"),
        )
        .replace(
            "LAST_INSERT_ID(fencing_token + 1)",
            &format!("LAST_INSERT_ID(GREATEST(fencing_token + 1, {clock}))"),
        )
});

/// The MySQL / MariaDB floor (or its ablation), on the library store's pool: one statement per
/// acquire (or renewal) and per release, each one round trip (a prepared statement, cached per
/// connection, executed in one `COM_STMT_EXECUTE`).
pub(crate) struct MysqlMinimal {
    pool: sqlx::MySqlPool,
    acquire: &'static str,
}

impl MysqlMinimal {
    /// The floor; creates its table if needed, and checks on a probe key that the server hands
    /// the token back in the OK packet as the statement expects (a grant, a refusal, a grant
    /// after release): without that, refusals would read as grants or the reverse. The pool
    /// must not ping a connection before each checkout (see [`PgMinimal::new`]).
    pub(crate) async fn new(pool: sqlx::MySqlPool) -> R<Self> {
        if pool.options().get_test_before_acquire() {
            return Err("the pool pings each connection before a checkout \
                        (test_before_acquire): the floor would pay a round trip per statement"
                .into());
        }
        Self::checked(Self::floor(pool)).await
    }

    /// The floor with the library's clock-floored token (an ablation, not a floor); creates its
    /// table and checks it as [`new`](Self::new) does.
    pub(crate) async fn token_floor(pool: sqlx::MySqlPool) -> R<Self> {
        Self::checked(MysqlMinimal {
            pool,
            acquire: MYSQL_FLOOR_ACQUIRE.as_str(),
        })
        .await
    }

    /// Creates the table if needed and checks `m` on a probe key: a grant, a refusal to
    /// another owner, and after the release a grant with a greater token.
    async fn checked(m: Self) -> R<Self> {
        sqlx::query(MYSQL_TABLE).execute(&m.pool).await.map_err(s)?;
        let probe = LeaseKey::new(format!(
            "bench-probe-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ))
        .map_err(s)?;
        let ttl = Duration::from_secs(30);
        let first = m.acquire(&probe, "a", ttl).await?.ok_or("probe: refused")?;
        let refused = m.acquire(&probe, "b", ttl).await?;
        m.release(&first).await?;
        let again = m.acquire(&probe, "b", ttl).await?;
        sqlx::query("DELETE FROM lease_bench_minimal WHERE lease_key = ?")
            .bind(probe.as_str())
            .execute(&m.pool)
            .await
            .map_err(s)?;
        match (first.token, refused, again) {
            (t, None, Some(g)) if t >= 1 && g.token > t => Ok(m),
            (t, r, a) => Err(format!(
                "the server does not report the statement's LAST_INSERT_ID as expected: \
                 grant {t}, refusal {:?}, grant after release {:?} (want a token, none, a \
                 greater token)",
                r.map(|g| g.token),
                a.map(|g| g.token)
            )),
        }
    }

    /// The floor on a pool, for [`cleanup`](Self::cleanup) (no DDL).
    pub(crate) fn floor(pool: sqlx::MySqlPool) -> Self {
        MysqlMinimal {
            pool,
            acquire: MYSQL_ACQUIRE,
        }
    }

    /// Deletes the rows of `ns`.
    pub(crate) async fn cleanup(&self, ns: &str) {
        let _ = sqlx::query("DELETE FROM lease_bench_minimal WHERE LEFT(lease_key, LENGTH(?)) = ?")
            .bind(ns)
            .bind(ns)
            .execute(&self.pool)
            .await;
    }
}

#[async_trait]
impl Raw for MysqlMinimal {
    fn ping_name(&self) -> &'static str {
        "COM_PING"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let r = sqlx::query(sqlx::AssertSqlSafe(self.acquire))
            .bind(key.as_str())
            .bind(owner)
            .bind(ttl_ms(ttl)?.saturating_mul(1000))
            .execute(&self.pool)
            .await
            .map_err(s)?;
        Ok(match r.last_insert_id() {
            0 => None,
            t => Some(grant(key, owner, i64::try_from(t).map_err(s)?)),
        })
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        sqlx::query(MYSQL_RELEASE)
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
        Ok(String::new())
    }
}

// ---- SQLite ----------------------------------------------------------------------------------

const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS minimal_lease (\
     lease_key TEXT PRIMARY KEY, owner_id TEXT NOT NULL, \
     lease_until INTEGER NOT NULL, fencing_token INTEGER NOT NULL DEFAULT 0)";

/// The store's clock expression, so the floor reads time as the library does.
const SQLITE_NOW_MS: &str = leasehold_sqlite::protocol::NOW_MS;

/// The SQLite floor, on a file and pool of its own with the store's settings.
pub(crate) struct SqliteMinimal {
    pool: sqlx::SqlitePool,
    acquire: String,
    release: &'static str,
}

impl SqliteMinimal {
    pub(crate) async fn open(path: &std::path::Path) -> R<Self> {
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
            .connect_with(opts)
            .await
            .map_err(s)?;
        sqlx::query(SQLITE_TABLE).execute(&pool).await.map_err(s)?;
        Ok(SqliteMinimal {
            pool,
            acquire: format!(
                "INSERT INTO minimal_lease (lease_key, owner_id, lease_until) \
                 VALUES (?1, ?2, {SQLITE_NOW_MS} + ?3) \
                 ON CONFLICT (lease_key) DO UPDATE SET owner_id = ?2, \
                   lease_until = {SQLITE_NOW_MS} + ?3, fencing_token = fencing_token + 1 \
                 WHERE lease_until < {SQLITE_NOW_MS} OR owner_id = ?2 \
                 RETURNING fencing_token"
            ),
            release: "UPDATE minimal_lease SET lease_until = 0 \
                      WHERE lease_key = ?1 AND owner_id = ?2 AND fencing_token = ?3",
        })
    }
}

#[async_trait]
impl Raw for SqliteMinimal {
    fn ping_name(&self) -> &'static str {
        "SELECT 1"
    }
    async fn acquire(&self, key: &LeaseKey, owner: &str, ttl: Duration) -> R<Option<RawGrant>> {
        let token: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(self.acquire.as_str()))
            .bind(key.as_str())
            .bind(owner)
            .bind(ttl_ms(ttl)?)
            .fetch_optional(&self.pool)
            .await
            .map_err(s)?;
        Ok(token.map(|t| grant(key, owner, t)))
    }
    async fn release(&self, g: &RawGrant) -> R<()> {
        sqlx::query(self.release)
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
        Ok(String::new())
    }
}
