//! Every option, at every edge (zero, one nanosecond, `Duration::MAX`, odd prefixes, missing or
//! empty TLS files, arbitrary users on a member without authentication): connecting
//! and one acquire/release either work or fail with a typed error, within a bound; nothing
//! panics, not even in a background task of the driver.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{AcquireOutcome, AcquireRequest, Error, LeaseStore, OwnerId, ReleaseOutcome};
use leasehold_etcd::{EtcdLeaseStore, EtcdOptions, LeaseSharing};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx, Failed};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// This file's cases for `sharing` (PerGrant only: the property draws the sharing mode itself).
pub(crate) fn cases(sharing: LeaseSharing) -> Vec<Case> {
    match sharing {
        LeaseSharing::PerTtl => Vec::new(),
        _ => vec![
            case!("etcd", no_option_value_panics_or_hangs),
            case!(
                "etcd",
                url_options_configure_the_store_and_unknown_ones_are_refused
            ),
        ],
    }
}

/// Panics seen anywhere in the process while the property runs (the hook counts them).
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Durations biased to the edges: zero, a nanosecond, a millisecond, plausible values, the
/// largest ones.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_millis(1)),
        (1u64..10_000).prop_map(Duration::from_millis),
        (0u64..=u64::MAX).prop_map(Duration::from_secs),
        Just(Duration::MAX),
        Just(Duration::MAX - Duration::from_nanos(1)),
    ]
}

fn prefix() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("lease/".to_string()),
        "\\PC{0,12}",
        "[a-z/]{1,8}",
    ]
}

/// File paths: empty, missing, arbitrary.
fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("/nonexistent/ca.crt".to_string()),
        "\\PC{0,12}",
    ]
}

fn options() -> impl Strategy<Value = EtcdOptions> {
    (
        (prefix(), prefix()),
        (duration(), duration()),
        prop_oneof![Just(LeaseSharing::PerGrant), Just(LeaseSharing::PerTtl)],
        proptest::option::weighted(0.15, path()),
        proptest::option::weighted(0.15, (path(), path())),
        proptest::option::weighted(0.15, ("\\PC{0,8}", "\\PC{0,8}")),
    )
        .prop_map(
            |((prefix, fence), (connect, request), sharing, ca, cert, user)| {
                let mut options = EtcdOptions::default()
                    .with_prefix(prefix)
                    .with_fence_prefix(fence)
                    .with_connect_timeout(connect)
                    .with_request_timeout(request)
                    .with_lease_sharing(sharing);
                if let Some(ca) = ca {
                    options = options.with_tls_ca(ca);
                }
                if let Some((cert, key)) = cert {
                    options = options.with_tls_client_cert(cert, key);
                }
                if let Some((user, password)) = user {
                    options = options.with_user(user, password);
                }
                options
            },
        )
}

/// Connects with `options` and, if that works, acquires and releases one key: each step works
/// or fails with a typed error.
async fn exercise(ctx: &Ctx, n: usize, options: EtcdOptions) -> Result<(), String> {
    let store = match EtcdLeaseStore::connect_with(&super::url(), options.clone()).await {
        Ok(store) => store,
        Err(Error::Config { .. } | Error::Unavailable { .. } | Error::Timeout { .. }) => {
            return Ok(());
        }
        Err(e) => return Err(format!("connect: untyped failure {e:?}")),
    };
    let key = ctx.key(&format!("opt{n}"));
    let req = AcquireRequest::new(key, OwnerId::random(), Duration::from_secs(5));
    match store.acquire(&req).await {
        Ok(AcquireOutcome::Acquired(lease)) => match store.release(&lease).await {
            Ok(ReleaseOutcome::Released) | Err(Error::Timeout { .. }) => Ok(()),
            other => Err(format!("release: {other:?}")),
        },
        Ok(AcquireOutcome::Held(h)) => Err(format!("a fresh key held by {}", h.owner)),
        Err(Error::Timeout { .. } | Error::Unavailable { .. }) => Ok(()),
        Err(e) => Err(format!("acquire: {e:?}")),
    }
}

/// Options drawn over every field (timeouts at the edges, arbitrary prefixes, both sharing
/// modes): connecting to the shared member and one acquire/release give a result or a typed
/// error within 20 s, and no thread panics meanwhile.
pub(crate) async fn no_option_value_panics_or_hangs(ctx: Ctx) -> CaseResult {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        previous(info);
    }));
    let handle = tokio::runtime::Handle::current();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let drawn = AtomicUsize::new(0);
    let result = tokio::task::block_in_place(|| {
        runner
            .run(&options(), |options| {
                let n = drawn.fetch_add(1, Ordering::Relaxed);
                let before = PANICS.load(Ordering::SeqCst);
                let run = handle.spawn({
                    let (ctx, options) = (ctx.clone(), options.clone());
                    async move {
                        tokio::time::timeout(Duration::from_secs(20), exercise(&ctx, n, options))
                            .await
                    }
                });
                let outcome = match handle.block_on(run) {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => Err("no answer within 20 s".to_string()),
                    Err(e) => Err(format!("panicked: {e}")),
                };
                let panics = PANICS.load(Ordering::SeqCst) - before;
                if panics > 0 {
                    return Err(TestCaseError::fail(format!(
                        "{panics} panic(s) with {options:?}"
                    )));
                }
                outcome.map_err(|e| TestCaseError::fail(format!("{e} with {options:?}")))
            })
            .map_err(|e| e.to_string())
    });
    let _ = std::panic::take_hook();
    result.map_err(Failed::from)
}

/// A URL alone configures the store: the lock-name and fence prefixes (seen in the keys the
/// store writes), both timeouts and the lease sharing; a misspelt or malformed parameter is
/// refused, naming it, before anything is sent.
pub(crate) async fn url_options_configure_the_store_and_unknown_ones_are_refused(
    ctx: Ctx,
) -> CaseResult {
    use leasehold_core::{FencedResource, WriteOp};
    let base = super::url();
    let (prefix, fence) = ("lease-url-test/", "lease-url-fence/");
    let store = EtcdLeaseStore::connect(&format!(
        "{base}?prefix={prefix}&fence_prefix={fence}&connect_timeout=1500ms\
         &request_timeout=3s&lease_sharing=per_ttl"
    ))
    .await?;
    let o = store.options();
    assert_eq!((o.prefix(), o.fence_prefix()), (prefix, fence));
    assert_eq!(o.connect_timeout(), Duration::from_millis(1500));
    assert_eq!(o.request_timeout(), Duration::from_secs(3));
    assert_eq!(o.lease_sharing(), LeaseSharing::PerTtl);
    let key = ctx.key("url");
    let lease = ctx
        .must_acquire_with(&store, &key, &OwnerId::random(), ctx.long_ttl())
        .await?;
    let written = store
        .fenced_resource()
        .write(&key, lease.token(), WriteOp::Add(1))
        .await?;
    let mut client = store.client();
    let count = |p: String| {
        let mut client = client.clone();
        async move {
            let opts = etcd_client::GetOptions::new()
                .with_prefix()
                .with_count_only();
            client
                .get(p.clone(), Some(opts))
                .await
                .map(|r| r.count())
                .map_err(|e| format!("get {p}: {e}"))
        }
    };
    let holders = count(format!("{}/", store.options().lock_name(&key))).await?;
    let fenced = count(format!("{fence}{key}")).await?;
    let _released = store.release(&lease).await?;
    let all = etcd_client::DeleteOptions::new().with_prefix();
    let _ = client.delete(prefix, Some(all.clone())).await;
    let _ = client.delete(fence, Some(all)).await;
    assert!(store.options().lock_name(&key).starts_with(prefix));
    assert_eq!(holders, 1, "the holder's key is under the URL's prefix");
    assert!(written.is_accepted());
    assert_eq!(
        fenced, 1,
        "the fenced state is under the URL's fence_prefix"
    );
    for bad in [
        "prefx=jobs/",
        "sslmode=require",
        "request_timeout=5",
        "connect_timeout=soon",
        "lease_sharing=sometimes",
        "prefix=a/&prefix=b/",
        "request_timeout=0s",
    ] {
        let url = format!("{base}?{bad}");
        match tokio::time::timeout(Duration::from_secs(20), EtcdLeaseStore::connect(&url)).await {
            Ok(Err(e @ Error::Config { .. })) => {
                let name = bad.split('=').next().unwrap_or(bad).replace('_', " ");
                let shown = e.to_string().replace('_', " ");
                if !shown.contains(&name) {
                    return Err(format!("{bad}: the error does not name {name}: {e}").into());
                }
            }
            Ok(other) => {
                return Err(format!("{bad}: expected Error::Config, got {other:?}").into());
            }
            Err(_) => return Err(format!("{bad}: no answer within 20 s").into()),
        }
    }
    Ok(())
}
