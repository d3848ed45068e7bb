//! Settings that never panic: every duration and count of [`PostgresOptions`] and
//! [`TxTimeouts`], drawn from the edges (zero, 1 ms, `Duration::MAX`, `u32::MAX`) mixed with
//! ordinary values, either works or gives a typed error, against the real server: connect,
//! acquire, renew, inspect, a fenced transaction and release, each within a bound.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, LeaseStore, OwnerId};
use leasehold_postgres::{FencedTx, PostgresLeaseStore, PostgresOptions, TxTimeouts};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case, settings};
use proptest::prelude::*;

use super::{table, url};

/// How many combinations are drawn.
const DRAWS: usize = 64;
/// How long one combination's calls may take in all: with a zero or one-millisecond bound every
/// call fails fast; with `Duration::MAX` every call still answers from a live server.
const BOUND: Duration = Duration::from_secs(30);

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0), Just(1), Just(u32::MAX), 1u32..16]
}

fn options() -> impl Strategy<Value = PostgresOptions> {
    (
        settings::edge_durations(),
        count(),
        settings::edge_durations(),
        (
            settings::edge_durations(),
            settings::edge_durations(),
            settings::edge_durations(),
            settings::edge_durations(),
        ),
    )
        .prop_map(|(op, max, acquire, (lock, statement, idle, deadline))| {
            PostgresOptions::new(table())
                .with_migrate(false)
                .with_op_timeout(op)
                .with_max_connections(max)
                .with_acquire_timeout(acquire)
                .with_tx_timeouts(
                    TxTimeouts::default()
                        .with_lock_timeout(lock)
                        .with_statement_timeout(statement)
                        .with_idle_timeout(idle)
                        .with_deadline(deadline),
                )
        })
}

/// Every call the options reach, each either a value or an error: only a panic or a hang fails.
async fn exercise(ctx: &Ctx, opts: PostgresOptions, n: usize) -> leasehold_core::Result<()> {
    let store = PostgresLeaseStore::connect_with(&url(), opts).await?;
    let key = ctx.key(&format!("opt{n}"));
    let req = ctx.request(&key, &OwnerId::with_label("opt"), Duration::from_secs(5));
    store.inspect(&key).await?;
    let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? else {
        return Ok(());
    };
    let _ = store.renew(&lease).await;
    let _ = store
        .fenced_transaction(&lease, |c| {
            Box::pin(async move { sqlx::query("SELECT 1").execute(c).await.map(|_| ()) })
        })
        .await
        .map(|t| matches!(t, FencedTx::Committed(())));
    let _ = store.fenced_resource();
    let _released = store.release(&lease).await?;
    Ok(())
}

pub(crate) async fn every_option_edge_works_or_is_a_typed_error(ctx: Ctx) -> CaseResult {
    let values = settings::draw(&options(), DRAWS)?;
    settings::never_panics_or_hangs(values, BOUND, |opts, n| {
        let ctx = ctx.clone();
        async move { exercise(&ctx, opts, n).await }
    })
    .await
}

/// A URL alone configures the store: a `coordination_lease` table used in place (`table=`,
/// `layout=coordination_lease`),
/// an operation bound and no notifications; a misspelt or malformed parameter is refused before
/// anything is sent.
pub(crate) async fn url_options_configure_the_store_and_unknown_ones_are_refused(
    ctx: Ctx,
) -> CaseResult {
    let (schema, pool, _) = super::adopt::seed_schema().await?;
    let base = url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let with = |q: &str| format!("{base}{sep}{q}");
    let store = PostgresLeaseStore::connect(&with(&format!(
        "table={schema}.coordination_lease&layout=coordination_lease&op_timeout=2s&notify=false&max_connections=2"
    )))
    .await;
    let result = async {
        let store = store?;
        assert_eq!(store.table().schema(), schema);
        assert_eq!(store.table().table(), "coordination_lease");
        assert_eq!(
            store.options().layout(),
            leasehold_postgres::TableLayout::CoordinationLease
        );
        assert_eq!(store.options().op_timeout(), Duration::from_secs(2));
        assert_eq!(store.options().max_connections(), 2);
        assert!(!store.capabilities().watch, "notify=false offers no watch");
        let key = ctx.key("url");
        let lease = ctx
            .must_acquire_with(&store, &key, &OwnerId::random(), ctx.long_ttl())
            .await?;
        let in_seed_table: i64 = sqlx::query_scalar(
            "SELECT fencing_token FROM coordination_lease WHERE resource_key = $1",
        )
        .bind(key.as_str())
        .fetch_one(&pool)
        .await?;
        assert_eq!(u64::try_from(in_seed_table).ok(), Some(lease.token().get()));
        let _released = store.release(&lease).await?;
        Ok::<_, leasehold_testkit::Failed>(())
    }
    .await;
    super::adopt::drop_schema(&pool, &schema).await?;
    result?;
    for bad in [
        "sslrootcrt=/etc/ca.pem",
        "tabel=public.leases",
        "op_timeout=5",
        "layout=other",
        "migrate=perhaps",
        "max_connections=-1",
        "table=public.leases&table=public.other",
    ] {
        match PostgresLeaseStore::connect_lazy(&with(bad), PostgresOptions::default()) {
            Err(e @ leasehold_core::Error::Config { .. }) => {
                let name = bad.split('=').next().unwrap_or(bad);
                if !e.to_string().contains(name) {
                    return Err(format!("{bad}: the error does not name {name}: {e}").into());
                }
            }
            other => return Err(format!("{bad}: expected Error::Config, got {other:?}").into()),
        }
    }
    Ok(())
}

pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("postgres", every_option_edge_works_or_is_a_typed_error),
        case!(
            "postgres",
            url_options_configure_the_store_and_unknown_ones_are_refused
        ),
    ]
}
