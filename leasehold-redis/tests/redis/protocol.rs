//! The acquire script's paths that the conformance suite does not reach: grants on a server
//! clock that stands still or goes back (the `counter + 1` path), a record written by the
//! previous layout (a hash), a counter that is not a usable integer, and the command count of
//! the common path.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, Lease, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome,
};
use leasehold_testkit::case;
use leasehold_testkit::cases::Case;
use leasehold_testkit::{CaseResult, Ctx};

use crate::cases::{acquire_on, store_at};
use crate::server::RedisServer;

/// On a server whose wall clock stands still, every grant reads the same `TIME`: the tokens
/// still go up by one (release and regrant, same-owner reacquire), and when the clock is then
/// set a year back they keep going up from the counter.
pub(crate) async fn tokens_increase_while_the_server_clock_stands_still_or_goes_back(
    ctx: Ctx,
) -> CaseResult {
    let (server, clock) = RedisServer::start_with_fake_clock(&[]).await?;
    clock.freeze("2030-01-01 00:00:00")?;
    let store = store_at(&server.url(), "frozen").await?;
    let key = ctx.key("frozen");
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let ttl = Duration::from_secs(60);

    let first = acquire_on(&store, &key, &a, ttl).await?;
    // 2030-01-01 00:00:00 (in the server's time zone) in microseconds: the first grant's clock
    // floor.
    let day = 86_400_000_000;
    assert!(
        first.token().get().abs_diff(1_893_456_000_000_000) < day,
        "{}",
        first.token()
    );
    assert_eq!(store.release(&first).await?, ReleaseOutcome::Released);
    let second = acquire_on(&store, &key, &b, ttl).await?;
    assert_eq!(second.token().get(), first.token().get() + 1);
    let again = acquire_on(&store, &key, &b, ttl).await?;
    assert_eq!(again.token().get(), second.token().get() + 1);
    assert_eq!(store.renew(&second).await?, RenewOutcome::Lost);
    assert!(matches!(
        store.renew(&again).await?,
        RenewOutcome::Renewed(_)
    ));

    clock.freeze("2029-01-01 00:00:00")?;
    assert_eq!(store.release(&again).await?, ReleaseOutcome::Released);
    let back = acquire_on(&store, &key, &a, ttl).await?;
    assert_eq!(back.token().get(), again.token().get() + 1);
    assert_eq!(
        store.inspect(&key).await?.last_token,
        Some(back.token()),
        "the counter holds the last token"
    );
    Ok(())
}

/// A hash record `{owner, token, ttl}` (the layout before records were strings) is honoured: a
/// contender sees it as held, `inspect` reports it, a lease that is not its grant can neither
/// renew nor release it, and its own owner takes the key back with a greater token.
pub(crate) async fn a_hash_record_of_the_previous_layout_is_honoured(ctx: Ctx) -> CaseResult {
    let server = RedisServer::start(&[]).await?;
    let store = store_at(&server.url(), "legacy").await?;
    let key = ctx.key("legacy");
    let (old, b) = (OwnerId::with_label("old"), OwnerId::with_label("b"));
    let ttl = Duration::from_secs(60);
    let record = store.layout().lease(&key);
    let mut con = store.connection();
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg(&record)
        .arg("owner")
        .arg(old.as_str())
        .arg("token")
        .arg(55)
        .arg("ttl")
        .arg(60_000)
        .ignore()
        .cmd("PEXPIRE")
        .arg(&record)
        .arg(60_000)
        .ignore()
        .query_async(&mut con)
        .await?;

    match store
        .acquire(&AcquireRequest::new(key.clone(), b.clone(), ttl))
        .await?
    {
        AcquireOutcome::Held(h) => {
            assert_eq!((h.owner, h.token.get(), h.ttl), (old.clone(), 55, ttl));
            assert!(h.remaining <= ttl && h.remaining > Duration::ZERO);
        }
        other => return Err(format!("a hash record was not honoured: {other:?}").into()),
    }
    let state = store.inspect(&key).await?;
    assert_eq!(
        state.holder.map(|h| (h.owner, h.token.get())),
        Some((old.clone(), 55))
    );
    assert_eq!(state.last_token, None);
    let many = store.inspect_many(std::slice::from_ref(&key)).await?;
    assert_eq!(many[0].holder.as_ref().map(|h| h.token.get()), Some(55));
    // Leases that are not the hash's grant change nothing.
    let stranger = Lease::resume(
        key.clone(),
        b.clone(),
        leasehold_core::FencingToken::new(55)?,
        ttl,
    );
    assert_eq!(store.renew(&stranger).await?, RenewOutcome::Lost);
    assert_eq!(store.release(&stranger).await?, ReleaseOutcome::NotHeld);
    let kind: String = redis::cmd("TYPE")
        .arg(&record)
        .query_async(&mut con)
        .await?;
    assert_eq!(kind, "hash", "the old record is still there");

    // Its owner (a process that was upgraded) takes the key back: a new grant, a string record.
    let back = acquire_on(&store, &key, &old, ttl).await?;
    assert!(back.token().get() > 55);
    let kind: String = redis::cmd("TYPE")
        .arg(&record)
        .query_async(&mut con)
        .await?;
    assert_eq!(kind, "string");
    assert!(matches!(
        store.renew(&back).await?,
        RenewOutcome::Renewed(_)
    ));
    Ok(())
}

/// A counter that Lua cannot step exactly (not digits, at or above 2^53 - 1, not a string) fails
/// the acquire with an error and changes nothing: no record, the counter as it was.
pub(crate) async fn an_unusable_counter_fails_the_acquire_and_changes_nothing(
    ctx: Ctx,
) -> CaseResult {
    let server = RedisServer::start(&[]).await?;
    let store = store_at(&server.url(), "counter").await?;
    let key = ctx.key("counter");
    let a = OwnerId::with_label("a");
    let (record, counter) = (store.layout().lease(&key), store.layout().generation(&key));
    let mut con = store.connection();
    for bad in ["abc", "-5", "9007199254740991", "99999999999999999999"] {
        let _: () = redis::cmd("SET")
            .arg(&counter)
            .arg(bad)
            .query_async(&mut con)
            .await?;
        let r = store
            .acquire(&AcquireRequest::new(
                key.clone(),
                a.clone(),
                Duration::from_secs(60),
            ))
            .await;
        assert!(
            matches!(&r, Err(e) if !e.is_retryable()),
            "counter {bad:?}: {r:?}"
        );
        let kept: String = redis::cmd("GET")
            .arg(&counter)
            .query_async(&mut con)
            .await?;
        assert_eq!(kept, bad, "the counter changed");
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&record)
            .query_async(&mut con)
            .await?;
        assert_eq!(exists, 0, "counter {bad:?}: a record was left");
    }
    let _: () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut con)
        .await?;
    let _: () = redis::cmd("HSET")
        .arg(&counter)
        .arg("x")
        .arg(1)
        .query_async(&mut con)
        .await?;
    let r = store
        .acquire(&AcquireRequest::new(
            key.clone(),
            a.clone(),
            Duration::from_secs(60),
        ))
        .await;
    assert!(r.is_err(), "a hash counter: {r:?}");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&record)
        .query_async(&mut con)
        .await?;
    assert_eq!(exists, 0, "a hash counter: a record was left");
    Ok(())
}

/// The calls of each command since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
async fn command_calls(
    con: &mut impl redis::aio::ConnectionLike,
) -> Result<BTreeMap<String, u64>, leasehold_testkit::Failed> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await?;
    Ok(info
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_string(), calls.parse().ok()?))
        })
        .filter(|(name, _)| name != "info" && !name.starts_with("config"))
        .collect())
}

/// The common path, counted by the server: an acquire of a free key is one script running
/// `TIME` and two `SET`s, a release one script running `GET`, `DEL` and `PUBLISH`, a renewal
/// one script running `GET` and `SET`.
pub(crate) async fn the_common_path_runs_the_fewest_commands(ctx: Ctx) -> CaseResult {
    let server = RedisServer::start(&[]).await?;
    let store = store_at(&server.url(), "count").await?;
    let key = ctx.key("count");
    let a = OwnerId::with_label("a");
    let ttl = Duration::from_secs(60);
    // The first grant loads the scripts and creates the counter.
    let l = acquire_on(&store, &key, &a, ttl).await?;
    let RenewOutcome::Renewed(l) = store.renew(&l).await? else {
        return Err("renewal refused".into());
    };
    assert_eq!(store.release(&l).await?, ReleaseOutcome::Released);
    let mut admin = server.admin().await?;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await?;

    let l = acquire_on(&store, &key, &a, ttl).await?;
    let expect = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    assert_eq!(
        command_calls(&mut admin).await?,
        expect(&[("evalsha", 1), ("set", 2), ("time", 1)]),
        "acquire"
    );
    let RenewOutcome::Renewed(l) = store.renew(&l).await? else {
        return Err("renewal refused".into());
    };
    assert_eq!(
        command_calls(&mut admin).await?,
        expect(&[("evalsha", 2), ("get", 1), ("set", 3), ("time", 1)]),
        "acquire, renew"
    );
    assert_eq!(store.release(&l).await?, ReleaseOutcome::Released);
    assert_eq!(
        command_calls(&mut admin).await?,
        expect(&[
            ("del", 1),
            ("evalsha", 3),
            ("get", 2),
            ("publish", 1),
            ("set", 3),
            ("time", 1)
        ]),
        "acquire, renew, release"
    );
    Ok(())
}

/// This file's cases.
pub(crate) fn cases() -> Vec<Case> {
    vec![
        case!(
            "redis",
            tokens_increase_while_the_server_clock_stands_still_or_goes_back
        ),
        case!("redis", a_hash_record_of_the_previous_layout_is_honoured),
        case!(
            "redis",
            an_unusable_counter_fails_the_acquire_and_changes_nothing
        ),
        case!("redis", the_common_path_runs_the_fewest_commands),
        case!(
            "redis",
            crate::many::inspect_many_in_batches_matches_inspect
        ),
    ]
}
