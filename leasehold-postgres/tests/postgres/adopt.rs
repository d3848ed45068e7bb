//! The library adopts the seed's `coordination_lease` table in place
//! ([`TableLayout::CoordinationLease`]), and the seed's own statements, byte for byte, keep running next to
//! it.
//!
//! Each case works in a schema of its own (`lease_seed_<random>`, dropped at the end) and reaches
//! the seed's unqualified `coordination_lease` through `search_path`, as a seed service would.

use std::str::FromStr;
use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, Error, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_postgres::{PostgresLeaseStore, PostgresOptions, TableLayout, TableName};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use super::url;

/// The seed's table, as users created it.
const SEED_DDL: &str = "CREATE TABLE coordination_lease (
    resource_key  text PRIMARY KEY,
    owner_id      uuid,
    lease_until   timestamptz NOT NULL DEFAULT '-infinity',
    fencing_token bigint NOT NULL DEFAULT 0
)";

/// The seed's acquire, byte for byte: insert, or take over an expired lease with
/// `fencing_token + 1`. `$3` is an `interval`.
const SEED_ACQUIRE: &str = "INSERT INTO coordination_lease (resource_key, owner_id, lease_until, fencing_token) \
VALUES ($1, $2, now() + $3::interval, 1) \
ON CONFLICT (resource_key) DO UPDATE \
SET owner_id = EXCLUDED.owner_id, lease_until = EXCLUDED.lease_until, fencing_token = coordination_lease.fencing_token + 1 \
WHERE coordination_lease.lease_until < now() \
RETURNING fencing_token";

/// The seed's protected write check, byte for byte: the lease row locked and validated in the
/// writer's transaction.
const SEED_CHECK: &str = "SELECT 1 FROM coordination_lease \
WHERE resource_key = $1 AND owner_id = $2 AND fencing_token = $3 AND lease_until > now() \
FOR UPDATE";

/// The seed's release, byte for byte.
const SEED_RELEASE: &str = "UPDATE coordination_lease SET lease_until = '-infinity' \
WHERE resource_key = $1 AND owner_id = $2 AND fencing_token = $3";

/// A fresh schema holding the seed's table; a pool whose `search_path` is that schema (the
/// seed service's view), and the library's options for the same table.
pub(crate) async fn seed_schema()
-> Result<(String, PgPool, PostgresOptions), leasehold_testkit::Failed> {
    let schema = format!("lease_seed_{}", fastrand::u32(..));
    let connect = PgConnectOptions::from_str(&url())?.options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(connect)
        .await?;
    sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&pool)
        .await?;
    sqlx::query(SEED_DDL).execute(&pool).await?;
    let options = PostgresOptions::new(TableName::parse(&format!("{schema}.coordination_lease"))?)
        .with_layout(TableLayout::CoordinationLease)
        .with_max_connections(4)
        .with_acquire_timeout(Duration::from_secs(5));
    Ok((schema, pool, options))
}

pub(crate) async fn drop_schema(pool: &PgPool, schema: &str) -> CaseResult {
    sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

async fn seed_acquire(
    pool: &PgPool,
    key: &str,
    owner: Uuid,
    ttl: Duration,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar(SEED_ACQUIRE)
        .bind(key)
        .bind(owner)
        .bind(ttl)
        .fetch_optional(pool)
        .await
}

/// The columns of the seed table: `(name, type, default)`.
async fn columns(
    pool: &PgPool,
    schema: &str,
) -> sqlx::Result<Vec<(String, String, Option<String>)>> {
    sqlx::query_as(
        "SELECT column_name::text, data_type::text, column_default::text \
         FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = 'coordination_lease' ORDER BY ordinal_position",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
}

/// An un-migrated seed table is refused with a typed error naming what is missing; `migrate`
/// is idempotent, keeps the seed's columns and rows, and the library then reads the seed's
/// holder and grants above its token. An owner that is not a UUID is refused before anything is
/// sent.
pub(crate) async fn seed_table_migration_is_idempotent_and_refused_until_migrated(
    ctx: Ctx,
) -> CaseResult {
    let (schema, pool, options) = seed_schema().await?;
    let before = columns(&pool, &schema).await?;
    let key = ctx.key("adopt");
    let seed_owner = Uuid::new_v4();
    let t1 = seed_acquire(&pool, key.as_str(), seed_owner, Duration::from_millis(300))
        .await?
        .ok_or("the seed refused a fresh key")?;
    assert_eq!(
        t1, 1,
        "the un-migrated seed table grants the seed's literal token"
    );

    match PostgresLeaseStore::connect_with(&url(), options.clone().with_migrate(false)).await {
        Err(Error::Config { message, .. }) => {
            for missing in [
                "coordination_lease_token_seq",
                "coordination_lease_fence",
                "coordination_lease_token_floor",
            ] {
                assert!(message.contains(missing), "{missing} not named: {message}");
            }
        }
        other => return Err(format!("un-migrated seed table: {other:?}").into()),
    }

    let store = PostgresLeaseStore::connect_with(&url(), options.clone()).await?;
    store.migrate().await?;
    store.migrate().await?;
    store.verify_schema().await?;
    assert_eq!(
        columns(&pool, &schema).await?,
        before,
        "the seed's columns are kept"
    );
    let state = store.inspect(&key).await?;
    assert_eq!(state.last_token.map(|t| t.to_i64()), Some(t1));
    if let Some(h) = &state.holder {
        assert_eq!(h.owner.as_str(), seed_owner.to_string());
    }

    let labelled = OwnerId::with_label("not-a-uuid");
    let req = AcquireRequest::new(key.clone(), labelled, Duration::from_secs(5));
    assert!(
        matches!(store.acquire(&req).await, Err(Error::InvalidOwner { .. })),
        "a non-UUID owner must be refused on the seed layout"
    );
    assert_eq!(
        store.inspect(&key).await?.last_token.map(|t| t.to_i64()),
        Some(t1)
    );

    let me = OwnerId::random();
    let lease = ctx
        .acquire_within(
            &store,
            &key,
            &me,
            Duration::from_secs(5),
            ctx.expiry_deadline(Duration::from_millis(300)),
        )
        .await?;
    assert!(
        lease.token().to_i64() > t1,
        "library token {} !> seed token {t1}",
        lease.token()
    );
    // The seed's statements see the library's lease as held, and the library's release frees it.
    assert_eq!(
        seed_acquire(&pool, key.as_str(), Uuid::new_v4(), Duration::from_secs(1)).await?,
        None
    );
    assert_eq!(store.release(&lease).await?, ReleaseOutcome::Released);
    let t3 = seed_acquire(&pool, key.as_str(), Uuid::new_v4(), Duration::from_secs(1))
        .await?
        .ok_or("the seed refused a released key")?;
    assert!(t3 > lease.token().to_i64(), "seed token {t3} went back");
    drop_schema(&pool, &schema).await
}

/// The literal seed SQL and the library contend on one key of one table from concurrent
/// loops, while an operator deletes the row now and then. Every protected write (the seed's
/// `FOR UPDATE` check, the library's fenced transaction) is logged in the order the lease row
/// lock serialises them: no logged token is below an earlier one, and no grant repeats a token.
pub(crate) async fn seed_sql_and_library_contend_and_no_token_goes_back(ctx: Ctx) -> CaseResult {
    let (schema, pool, options) = seed_schema().await?;
    let store = PostgresLeaseStore::connect_with(&url(), options).await?;
    sqlx::query(
        "CREATE TABLE writes (id bigserial PRIMARY KEY, side text NOT NULL, token bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let key = ctx.key("contend");
    const ROUNDS: usize = 40;
    let ttl = Duration::from_millis(150);

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (pool, key) = (pool.clone(), key.clone());
        tasks.spawn(async move {
            let mut grants = Vec::new();
            for _ in 0..ROUNDS {
                let me = Uuid::new_v4();
                let Some(t) = seed_acquire(&pool, key.as_str(), me, ttl).await? else {
                    tokio::task::yield_now().await;
                    continue;
                };
                grants.push(t);
                let mut tx = pool.begin().await?;
                let ok: Option<i32> = sqlx::query_scalar(SEED_CHECK)
                    .bind(key.as_str())
                    .bind(me)
                    .bind(t)
                    .fetch_optional(&mut *tx)
                    .await?;
                if ok.is_some() {
                    sqlx::query("INSERT INTO writes (side, token) VALUES ('seed', $1)")
                        .bind(t)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                sqlx::query(SEED_RELEASE)
                    .bind(key.as_str())
                    .bind(me)
                    .bind(t)
                    .execute(&pool)
                    .await?;
            }
            Ok::<_, leasehold_testkit::Failed>(grants)
        });
    }
    for _ in 0..2 {
        let (store, key, schema) = (store.clone(), key.clone(), schema.clone());
        tasks.spawn(async move {
            let mut grants = Vec::new();
            for _ in 0..ROUNDS {
                let req = AcquireRequest::new(key.clone(), OwnerId::random(), ttl);
                let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let t = lease.token().to_i64();
                grants.push(t);
                let insert =
                    format!("INSERT INTO \"{schema}\".writes (side, token) VALUES ('library', $1)");
                let out = store
                    .fenced_transaction(&lease, move |conn| {
                        Box::pin(async move {
                            sqlx::query(AssertSqlSafe(insert))
                                .bind(t)
                                .execute(&mut *conn)
                                .await?;
                            Ok(())
                        })
                    })
                    .await?;
                let _ = out;
                let _ = store.release(&lease).await?;
            }
            Ok::<_, leasehold_testkit::Failed>(grants)
        });
    }
    // The operator: deletes the key's row a few times while the loops run.
    let deleter = {
        let (pool, key) = (pool.clone(), key.clone());
        tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                sqlx::query("DELETE FROM coordination_lease WHERE resource_key = $1")
                    .bind(key.as_str())
                    .execute(&pool)
                    .await?;
            }
            Ok::<_, sqlx::Error>(())
        })
    };
    let mut grants: Vec<i64> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        grants.extend(joined.map_err(|e| e.to_string())??);
    }
    deleter.await.map_err(|e| e.to_string())??;

    let log: Vec<(String, i64)> = sqlx::query_as("SELECT side, token FROM writes ORDER BY id")
        .fetch_all(&pool)
        .await?;
    let sides = |s: &str| log.iter().filter(|(side, _)| side == s).count();
    assert!(
        sides("seed") > 0 && sides("library") > 0,
        "both sides wrote: {log:?}"
    );
    for w in log.windows(2) {
        assert!(
            w[1].1 >= w[0].1,
            "a token went back: {:?} after {:?}",
            w[1],
            w[0]
        );
    }
    let n = grants.len();
    grants.sort_unstable();
    grants.dedup();
    assert_eq!(grants.len(), n, "a token was granted twice");
    drop_schema(&pool, &schema).await?;
    Ok(())
}

/// Runs the seed's acquire for `owner` until it grants (the key's lease expires), within `within`.
async fn seed_acquire_within(
    pool: &PgPool,
    key: &str,
    owner: Uuid,
    ttl: Duration,
    within: Duration,
) -> Result<i64, leasehold_testkit::Failed> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(t) = seed_acquire(pool, key, owner, ttl).await? {
            return Ok(t);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(
                format!("the seed's acquire of {key} did not grant within {within:?}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A takeover by the seed's own statement (`fencing_token + 1`) is floored like every grant, so
/// that a failover to an asynchronous standby that lost it cannot grant its token again. The
/// standby is stood in for by putting the row and the token sequence back to what they were
/// before the takeover (with the table's triggers off, as replication would write them); the
/// next seed takeover must still be above the lost one (the server clock floor).
pub(crate) async fn seed_takeover_lost_in_a_failover_is_not_granted_again(ctx: Ctx) -> CaseResult {
    let (schema, pool, options) = seed_schema().await?;
    let store = PostgresLeaseStore::connect_with(&url(), options).await?;
    store.migrate().await?;
    let key = ctx.key("lost-takeover");
    let ttl = Duration::from_millis(100);
    let within = ctx.expiry_deadline(ttl);
    let first = seed_acquire_within(&pool, key.as_str(), Uuid::new_v4(), ttl, within).await?;
    let seq = format!("\"{schema}\".\"coordination_lease_token_seq\"");
    let row: (Option<Uuid>, String, i64) = sqlx::query_as(
        "SELECT owner_id, lease_until::text, fencing_token FROM coordination_lease \
             WHERE resource_key = $1",
    )
    .bind(key.as_str())
    .fetch_one(&pool)
    .await?;
    let (last, called): (i64, bool) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT last_value, is_called FROM {seq}"
    )))
    .fetch_one(&pool)
    .await?;
    assert_eq!(row.2, first);
    // The takeover the standby will not have.
    let lost = seed_acquire_within(&pool, key.as_str(), Uuid::new_v4(), ttl, within).await?;
    assert!(
        lost > first,
        "the seed's takeover {lost} is not above {first}"
    );
    let mut tx = pool.begin().await?;
    sqlx::query("ALTER TABLE coordination_lease DISABLE TRIGGER USER")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE coordination_lease SET owner_id = $2, lease_until = $3::timestamptz, fencing_token = $4 \
         WHERE resource_key = $1",
    )
    .bind(key.as_str())
    .bind(row.0)
    .bind(row.1)
    .bind(row.2)
    .execute(&mut *tx)
    .await?;
    sqlx::query("ALTER TABLE coordination_lease ENABLE TRIGGER USER")
        .execute(&mut *tx)
        .await?;
    sqlx::query(AssertSqlSafe(format!(
        "SELECT setval('{}', $1, $2)",
        seq.replace('\'', "''")
    )))
    .bind(last)
    .bind(called)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let after = seed_acquire_within(&pool, key.as_str(), Uuid::new_v4(), ttl, within).await?;
    assert!(
        after > lost,
        "after the failover the seed's takeover got {after}, not above the lost grant {lost}"
    );
    drop_schema(&pool, &schema).await
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(
            "postgres",
            seed_table_migration_is_idempotent_and_refused_until_migrated
        ),
        case!(
            "postgres",
            seed_sql_and_library_contend_and_no_token_goes_back
        ),
        case!(
            "postgres",
            seed_takeover_lost_in_a_failover_is_not_granted_again
        ),
    ]
}
