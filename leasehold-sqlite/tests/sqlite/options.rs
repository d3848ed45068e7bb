//! Settings that never panic: every duration and count of [`SqliteOptions`], drawn from the edges
//! (zero, 1 ms, `Duration::MAX`, `u32::MAX`) mixed with ordinary values, either works or gives a
//! typed error: open, acquire, a watch, renew, a fenced write and release on a real file, each
//! within a bound.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, FencedResource, LeaseStore, OwnerId};
use leasehold_sqlite::{CommitSync, SqliteLeaseStore, SqliteOptions};
use leasehold_testkit::{CaseResult, Ctx, settings};
use proptest::prelude::*;

use super::fresh_file;

/// How many combinations are drawn.
const DRAWS: usize = 48;
/// How long one combination's calls may take in all.
const BOUND: Duration = Duration::from_secs(30);

fn options() -> impl Strategy<Value = SqliteOptions> {
    (
        settings::edge_durations(),
        prop_oneof![Just(0u32), Just(1), Just(u32::MAX), 1u32..16],
        any::<bool>(),
        any::<bool>(),
        settings::edge_durations(),
    )
        .prop_map(|(busy, max, full, watch, interval)| {
            SqliteOptions::new()
                .with_busy_timeout(busy)
                .with_max_connections(max)
                .with_commit_sync(if full {
                    CommitSync::Full
                } else {
                    CommitSync::Normal
                })
                .with_watch(watch)
                .with_watch_poll_interval(interval)
        })
}

/// Every call the options reach, each either a value or an error: only a panic or a hang fails.
async fn exercise(ctx: &Ctx, opts: SqliteOptions, n: usize) -> leasehold_core::Result<()> {
    let store = SqliteLeaseStore::open_with(fresh_file(ctx, &format!("opt{n}")), opts).await?;
    let key = ctx.key("opt");
    let req = ctx.request(&key, &OwnerId::with_label("opt"), Duration::from_secs(5));
    let watch = store.watch(&key).await?;
    let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? else {
        return Err(leasehold_core::Error::InvalidInput(
            "a fresh file's key is held".into(),
        ));
    };
    let _ = store.renew(&lease).await?;
    let _ = store
        .fenced_resource()
        .write(&key, lease.token(), leasehold_core::WriteOp::Add(1))
        .await?;
    let _ = store.release(&lease).await?;
    drop(watch);
    store.close().await;
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

/// A URL alone configures the store, on top of the options given in code; a misspelt or
/// malformed parameter is refused before the file is touched.
pub(crate) async fn url_options_configure_the_store_and_unknown_ones_are_refused(
    ctx: Ctx,
) -> CaseResult {
    let file = fresh_file(&ctx, "url");
    let url = format!(
        "sqlite://{}?busy_timeout=2s&commit_sync=full&watch=false&max_connections=2&mode=rwc",
        file.display()
    );
    let store = SqliteLeaseStore::connect(&url).await?;
    assert!(!store.capabilities().watch, "watch=false offers no watch");
    assert!(store.watch(&ctx.key("w")).await?.is_none());
    let key = ctx.key("url");
    let req = ctx.request(&key, &OwnerId::with_label("url"), Duration::from_secs(5));
    let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? else {
        return Err("a fresh file's key is held".into());
    };
    let _released = store.release(&lease).await?;
    store.close().await;
    for bad in [
        "busy_timout=2s",
        "busy_timeout=2",
        "commit_sync=sometimes",
        "watch=maybe",
        "max_connections=many",
        "watch_poll_interval=-1ms",
    ] {
        let url = format!("sqlite://{}?{bad}", fresh_file(&ctx, "bad").display());
        match SqliteLeaseStore::connect(&url).await {
            Err(e @ leasehold_core::Error::Config { .. }) => {
                let name = bad.split('=').next().unwrap_or(bad);
                if !e.to_string().contains(name) {
                    return Err(format!("{bad}: the error does not name {name}: {e}").into());
                }
            }
            other => return Err(format!("{bad}: expected Error::Config, got {other:?}").into()),
        }
    }
    assert!(
        !fresh_file(&ctx, "bad").exists(),
        "a refused URL created its file"
    );
    Ok(())
}
