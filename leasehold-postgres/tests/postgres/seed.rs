//! The seed's own SQL, run unchanged against the table this crate creates, next to the library;
//! and token monotonicity across row deletion and hand edits.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
use sqlx::{AssertSqlSafe, PgPool};

use super::{SCHEMA, store};

/// The seed's acquire: insert, or take over only when expired, incrementing the generation.
fn seed_acquire_sql() -> String {
    format!(
        "INSERT INTO {SCHEMA}.leases AS l (resource_key, owner, lease_until, fencing_token) \
         VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 millisecond', 1) \
         ON CONFLICT (resource_key) DO UPDATE \
           SET owner = excluded.owner, lease_until = excluded.lease_until, \
               fencing_token = l.fencing_token + 1 \
           WHERE l.lease_until < clock_timestamp() \
         RETURNING fencing_token"
    )
}

async fn seed_acquire(
    pool: &PgPool,
    key: &str,
    owner: &str,
    ttl_ms: i64,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar(AssertSqlSafe(seed_acquire_sql()))
        .bind(key)
        .bind(owner)
        .bind(ttl_ms)
        .fetch_optional(pool)
        .await
}

/// The seed's protected write: validate owner, token and expiry on the lease row in the same
/// transaction as the write. Returns whether it wrote.
async fn seed_protected_write(
    pool: &PgPool,
    key: &str,
    owner: &str,
    token: i64,
) -> sqlx::Result<bool> {
    let mut tx = pool.begin().await?;
    let ok: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT 1 FROM {SCHEMA}.leases WHERE resource_key = $1 AND owner = $2 \
           AND fencing_token = $3 AND lease_until > clock_timestamp() FOR UPDATE"
    )))
    .bind(key)
    .bind(owner)
    .bind(token)
    .fetch_optional(&mut *tx)
    .await?;
    if ok.is_none() {
        tx.rollback().await?;
        return Ok(false);
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {SCHEMA}.seed_writes (resource_key, fencing_token) VALUES ($1, $2)"
    )))
    .bind(key)
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

async fn writes(pool: &PgPool, key: &str) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT fencing_token FROM {SCHEMA}.seed_writes WHERE resource_key = $1 ORDER BY id"
    )))
    .bind(key)
    .fetch_all(pool)
    .await
}

/// The seed's statements keep their meaning on this crate's table, interleaved with the library:
/// the upsert grants only a free or expired key and increases the token; the protected write
/// accepts only the current, unexpired owner and token; the library and the seed refuse each
/// other while the other holds; tokens from both sides form one increasing sequence.
pub(crate) async fn seed_statements_behave_as_described_next_to_the_library(
    ctx: Ctx,
) -> CaseResult {
    let store = store().await?;
    let pool = store.pool().clone();
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {SCHEMA}.seed_writes \
         (id bigserial PRIMARY KEY, resource_key text NOT NULL, fencing_token bigint NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let key = ctx.key("seed");
    let k = key.as_str();
    let ttl = ctx.short_ttl();
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);

    // The seed acquires a fresh key.
    let s1 = seed_acquire(&pool, k, "seed-a", ttl_ms)
        .await?
        .ok_or("seed acquire of a fresh key refused")?;
    // While it holds: the seed's second owner and the library are refused; the library names the seed holder.
    assert_eq!(
        seed_acquire(&pool, k, "seed-b", ttl_ms).await?,
        None,
        "seed took over a valid lease"
    );
    let b = OwnerId::with_label("lib-b");
    match store
        .acquire(&ctx.request(&key, &b, ctx.long_ttl()))
        .await?
    {
        AcquireOutcome::Held(h) => {
            assert_eq!(h.owner.as_str(), "seed-a");
            assert_eq!(h.token.to_i64(), s1);
        }
        AcquireOutcome::Acquired(l) => {
            return Err(format!("library took a valid seed lease: {}", l.token()).into());
        }
    }
    // The seed's protected write: the holder writes, a wrong owner or token does not.
    assert!(seed_protected_write(&pool, k, "seed-a", s1).await?);
    assert!(!seed_protected_write(&pool, k, "seed-b", s1).await?);
    assert!(!seed_protected_write(&pool, k, "seed-a", s1 + 1).await?);

    // After the seed's lease expires the library takes over with a greater token...
    let lib = ctx
        .acquire_within(&store, &key, &b, ctx.long_ttl(), ctx.expiry_deadline(ttl))
        .await?;
    assert!(
        lib.token().to_i64() > s1,
        "library token {} !> seed token {s1}",
        lib.token()
    );
    // ...the seed's stale holder can no longer write, and the seed cannot take a valid library lease.
    assert!(
        !seed_protected_write(&pool, k, "seed-a", s1).await?,
        "stale seed write accepted"
    );
    assert_eq!(
        seed_acquire(&pool, k, "seed-b", ttl_ms).await?,
        None,
        "seed took over a valid library lease"
    );
    // The seed's protected write recognises the library's lease as valid, too.
    assert!(seed_protected_write(&pool, k, b.as_str(), lib.token().to_i64()).await?);

    // Released by the library: the seed acquires with a greater token, the library sees it.
    assert_eq!(store.release(&lib).await?, ReleaseOutcome::Released);
    let s2 = seed_acquire(&pool, k, "seed-b", ttl_ms)
        .await?
        .ok_or("seed refused a released key")?;
    assert!(
        s2 > lib.token().to_i64(),
        "seed token {s2} !> library token {}",
        lib.token()
    );
    let state = store.inspect(&key).await?;
    assert_eq!(
        state
            .holder
            .map(|h| (h.owner.as_str().to_string(), h.token.to_i64())),
        Some(("seed-b".to_string(), s2))
    );
    assert_eq!(state.last_token.map(|t| t.to_i64()), Some(s2));
    assert_eq!(
        writes(&pool, k).await?,
        vec![s1, lib.token().to_i64()],
        "exactly the valid writes landed"
    );
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {SCHEMA}.seed_writes WHERE resource_key = $1"
    )))
    .bind(k)
    .execute(&pool)
    .await?;
    Ok(())
}

/// Tokens never go back: not after release, not after an operator deletes the row, not after a
/// token was written by hand above the sequence and the row was deleted, not after the seed's
/// statements re-created the row.
pub(crate) async fn tokens_never_go_back_after_row_deletion_or_hand_edits(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let pool = store.pool().clone();
    let key = ctx.key("never-back");
    let a = OwnerId::with_label("a");
    let delete = format!("DELETE FROM {SCHEMA}.leases WHERE resource_key = $1");
    let mut seen = Vec::new();

    let l1 = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    seen.push(l1.token().to_i64());
    assert_eq!(store.release(&l1).await?, ReleaseOutcome::Released);
    // An operator deletes the row: the store forgets the key...
    sqlx::query(AssertSqlSafe(delete.clone()))
        .bind(key.as_str())
        .execute(&pool)
        .await?;
    assert_eq!(store.inspect(&key).await?.last_token, None);
    // ...but the next grant is still greater.
    let l2 = ctx
        .must_acquire_with(&store, &key, &a, ctx.long_ttl())
        .await?;
    seen.push(l2.token().to_i64());

    // A token written by hand far above the sequence, then the row deleted.
    let high = l2.token().to_i64() + 1_000_000;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {SCHEMA}.leases SET fencing_token = $2, lease_until = '-infinity' WHERE resource_key = $1"
    )))
    .bind(key.as_str())
    .bind(high)
    .execute(&pool)
    .await?;
    assert_eq!(
        store.inspect(&key).await?.last_token.map(|t| t.to_i64()),
        Some(high)
    );
    seen.push(high);
    sqlx::query(AssertSqlSafe(delete.clone()))
        .bind(key.as_str())
        .execute(&pool)
        .await?;
    let l3 = ctx
        .must_acquire_with(&store, &key, &a, Duration::from_millis(200))
        .await?;
    seen.push(l3.token().to_i64());

    // The seed's statements re-create a deleted row with their literal token 1: still greater.
    sqlx::query(AssertSqlSafe(delete))
        .bind(key.as_str())
        .execute(&pool)
        .await?;
    let s = seed_acquire(&pool, key.as_str(), "seed", 200)
        .await?
        .ok_or("seed refused a deleted key")?;
    seen.push(s);
    let l4 = ctx
        .acquire_within(
            &store,
            &key,
            &a,
            ctx.long_ttl(),
            ctx.expiry_deadline(Duration::from_millis(200)),
        )
        .await?;
    seen.push(l4.token().to_i64());
    for w in seen.windows(2) {
        assert!(w[1] > w[0], "tokens went back: {seen:?}");
    }
    Ok(())
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(
            "postgres",
            seed_statements_behave_as_described_next_to_the_library
        ),
        case!(
            "postgres",
            tokens_never_go_back_after_row_deletion_or_hand_edits
        ),
    ]
}
