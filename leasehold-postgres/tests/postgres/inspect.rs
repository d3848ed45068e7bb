//! `inspect_many` at the size leasehold-shard uses it (about 10,000 keys every rebalance interval):
//! one statement, the same answers as 10,000 single `inspect`s, in input order. The time of
//! both is printed (not asserted: the machine is shared), for the benchmark notes.

use leasehold_core::{LeaseKey, LeaseStore};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case};
use sqlx::AssertSqlSafe;
use tokio::time::Instant;

use super::{SCHEMA, store};

/// 10,000 keys: a third held, a third released, a third never seen; plus a duplicate.
pub(crate) async fn inspect_many_of_10000_keys_matches_single_inspects(ctx: Ctx) -> CaseResult {
    let store = store().await?;
    let n = 10_000;
    let keys: Vec<LeaseKey> = (0..n).map(|i| ctx.key(&format!("k{i:05}"))).collect();
    // Rows written in one statement (the floor trigger draws their tokens): i % 3 == 0 held,
    // i % 3 == 1 released, i % 3 == 2 no row.
    let written: Vec<&str> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 2)
        .map(|(_, k)| k.as_str())
        .collect();
    let held: Vec<bool> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 2)
        .map(|(i, _)| i % 3 == 0)
        .collect();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {SCHEMA}.leases (resource_key, owner, lease_until, fencing_token, ttl_ms) \
         SELECT k, 'holder', CASE WHEN h THEN clock_timestamp() + interval '5 minutes' \
                             ELSE '-infinity' END, 1, 300000 \
         FROM unnest($1::text[], $2::bool[]) AS t(k, h)"
    )))
    .bind(&written)
    .bind(&held)
    .execute(store.pool())
    .await?;

    let mut asked = keys.clone();
    asked.push(keys[0].clone());
    let t = Instant::now();
    let many = store.inspect_many(&asked).await?;
    let one_statement = t.elapsed();
    let t = Instant::now();
    let mut single = Vec::with_capacity(asked.len());
    for k in &asked {
        single.push(store.inspect(k).await?);
    }
    let one_by_one = t.elapsed();

    assert_eq!(many.len(), asked.len());
    for (i, (m, s)) in many.iter().zip(&single).enumerate() {
        assert_eq!(m.key, asked[i], "order");
        assert_eq!(m.key, s.key);
        assert_eq!(m.last_token, s.last_token, "{}", m.key);
        assert_eq!(
            m.holder.as_ref().map(|h| (&h.owner, h.token, h.ttl)),
            s.holder.as_ref().map(|h| (&h.owner, h.token, h.ttl)),
            "{}",
            m.key
        );
        let expect_held = i % 3 == 0 || i == n;
        assert_eq!(m.holder.is_some(), expect_held, "{}", m.key);
        assert_eq!(m.last_token.is_none(), i % 3 == 2 && i != n, "{}", m.key);
    }
    eprintln!(
        "inspect_many of {} keys: {:?} in one statement, {:?} as single inspects ({:.0}x)",
        asked.len(),
        one_statement,
        one_by_one,
        one_by_one.as_secs_f64() / one_statement.as_secs_f64().max(1e-9)
    );
    Ok(())
}

/// This file's cases, registered by `main.rs`.
pub(crate) fn cases() -> Vec<Case> {
    vec![case!(
        "postgres",
        inspect_many_of_10000_keys_matches_single_inspects
    )]
}
