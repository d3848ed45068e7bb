//! Settings that never panic: every duration and count of [`RedisOptions`], drawn from the edges
//! (zero, 1 ms, `Duration::MAX`, `usize::MAX`, `u32::MAX`) mixed with ordinary values, either
//! works or gives a typed error against the real server: connect, a watch, acquire, renew, a
//! fenced write and release, each within a bound.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, FencedResource, LeaseStore, OwnerId, WriteOp};
use leasehold_redis::{RedisLeaseStore, RedisOptions};
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, case, settings};
use proptest::prelude::*;

use super::cases::{PREFIX, url};

/// How many combinations are drawn.
const DRAWS: usize = 48;
/// How long one combination's calls may take in all: a `Duration::MAX` response timeout must
/// still answer from a live server, and a `WAIT` for replicas this server does not have is cut at
/// its own timeout, drawn below.
const BOUND: Duration = Duration::from_secs(30);

fn options() -> impl Strategy<Value = RedisOptions> {
    (
        settings::edge_durations(),
        settings::edge_durations(),
        prop_oneof![Just(0usize), Just(1), Just(usize::MAX), 0usize..4],
        prop::option::of((
            prop_oneof![Just(0u32), Just(1), Just(u32::MAX)],
            prop_oneof![
                Just(Duration::ZERO),
                Just(Duration::from_millis(1)),
                Just(Duration::MAX),
                (1u64..200).prop_map(Duration::from_millis),
            ],
        )),
        settings::edge_durations(),
        any::<bool>(),
    )
        .prop_map(|(response, connect, retries, wait, poll, eviction)| {
            let mut o = RedisOptions::default()
                .with_prefix(PREFIX)
                .with_response_timeout(response)
                .with_connect_timeout(connect)
                .with_connect_retries(retries)
                .with_watch_poll_interval(poll)
                .allow_eviction(eviction);
            if let Some((replicas, timeout)) = wait {
                o = o.with_wait_for_replicas(replicas, timeout);
            }
            o
        })
}

/// Every call the options reach, each either a value or an error: only a panic or a hang fails.
async fn exercise(ctx: &Ctx, opts: RedisOptions, n: usize) -> leasehold_core::Result<()> {
    let store = RedisLeaseStore::connect_with(&url(), opts).await?;
    let key = ctx.key(&format!("opt{n}"));
    let req = ctx.request(&key, &OwnerId::with_label("opt"), Duration::from_secs(5));
    let _watch = store.watch(&key).await?;
    let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? else {
        return Ok(());
    };
    let _renewed = store.renew(&lease).await;
    let _written = store
        .fenced_resource()
        .write(&key, lease.token(), WriteOp::Add(1))
        .await;
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

/// A URL alone configures the store: the key prefix (seen in the key the store writes), the
/// timeouts (seen in the operation deadline), retries, the watch poll interval, eviction and a
/// `WAIT` for replicas; a misspelt or malformed parameter is refused, naming it, before anything
/// is sent.
pub(crate) async fn url_options_configure_the_store_and_unknown_ones_are_refused(
    ctx: Ctx,
) -> CaseResult {
    let base = url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let with = |q: &str| format!("{base}{sep}{q}");
    let prefix = format!("{PREFIX}-url");
    let store = RedisLeaseStore::connect(&with(&format!(
        "prefix={prefix}&response_timeout=2s&connect_timeout=1500ms&connect_retries=1\
         &watch_poll_interval=100ms&allow_eviction=false&wait_for_replicas=0&wait_timeout=100ms"
    )))
    .await?;
    assert_eq!(store.layout().prefix(), prefix);
    // connect timeout + 2 x response timeout
    assert_eq!(store.op_deadline(), Duration::from_millis(5500));
    let key = ctx.key("url");
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::with_label("url"), ctx.long_ttl())
        .await?;
    let record = store.layout().lease(&key);
    assert!(record.starts_with(&prefix), "{record}");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&record)
        .query_async(&mut store.connection())
        .await
        .map_err(|e| format!("EXISTS {record}: {e}"))?;
    assert_eq!(
        exists, 1,
        "the lease record {record} is written under the URL's prefix"
    );
    let _released = store.release(&lease).await?;
    for bad in [
        "prefx=jobs",
        "sslmode=require",
        "response_timeout=5",
        "connect_timeout=soon",
        "connect_retries=-1",
        "allow_eviction=perhaps",
        "watch_poll_interval=1d",
        "wait_for_replicas=many&wait_timeout=1s",
        "wait_for_replicas=1",
        "wait_timeout=100ms",
        "prefix=a&prefix=b",
        "response_timeout=0s",
    ] {
        let connected = tokio::time::timeout(BOUND, RedisLeaseStore::connect(&with(bad))).await;
        match connected {
            Ok(Err(e @ leasehold_core::Error::Config { .. })) => {
                let name = bad.split('=').next().unwrap_or(bad).replace('_', " ");
                let shown = e.to_string().replace('_', " ");
                if !shown.contains(&name) {
                    return Err(format!("{bad}: the error does not name {name}: {e}").into());
                }
            }
            Ok(other) => {
                return Err(format!("{bad}: expected Error::Config, got {other:?}").into());
            }
            Err(_) => return Err(format!("{bad}: no answer within {BOUND:?}").into()),
        }
    }
    Ok(())
}

pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!("redis", every_option_edge_works_or_is_a_typed_error),
        case!(
            "redis",
            url_options_configure_the_store_and_unknown_ones_are_refused
        ),
    ]
}
