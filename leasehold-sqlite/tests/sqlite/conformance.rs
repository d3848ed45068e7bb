//! SQLite-specific cases: configuration errors, durable tokens, concurrent opens, a missing
//! table, a busy file, commit durability modes, and the store as a fenced resource.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Error, FencedResource, FencingToken, LeaseKey, LeaseStore, OwnerId,
    ReleaseOutcome, WriteOp,
};
use leasehold_sqlite::{CommitSync, SqliteLeaseStore, SqliteOptions};
use leasehold_testkit::{CaseResult, Ctx};

use super::{dir, fresh_file, must_acquire, raw, raw_create, req};

/// An unparsable or foreign URL, an in-memory database, a directory that does not exist, or a
/// directory given as the file: each an `Error::Config`, and no file is created.
pub(crate) async fn bad_url_or_missing_directory_is_a_config_error(ctx: Ctx) -> CaseResult {
    let missing = dir().join(format!("{}-no-such-dir", ctx.namespace()));
    let missing_url = format!("sqlite://{}", missing.join("x.db").display());
    for url in [
        "not a url",
        "",
        "postgres://localhost/db",
        "sqlite://",
        "sqlite::memory:",
        "sqlite://x.db?mode=bogus",
        &missing_url,
    ] {
        match SqliteLeaseStore::connect(url).await {
            Err(Error::Config {
                backend: "sqlite", ..
            }) => {}
            other => return Err(format!("{url:?}: expected Error::Config, got {other:?}").into()),
        }
    }
    for path in [missing.join("x.db"), dir().to_path_buf()] {
        match SqliteLeaseStore::open(&path).await {
            Err(e @ Error::Config { .. }) => assert!(!e.is_retryable()),
            other => {
                return Err(
                    format!("{}: expected Error::Config, got {other:?}", path.display()).into(),
                );
            }
        }
    }
    assert!(
        !missing.exists(),
        "a failed open created {}",
        missing.display()
    );
    Ok(())
}

/// A file that is not a database, or one written by a newer schema, is a configuration error.
pub(crate) async fn foreign_or_newer_file_is_a_config_error(ctx: Ctx) -> CaseResult {
    let junk = fresh_file(&ctx, "junk");
    std::fs::write(&junk, vec![0x42u8; 8192]).map_err(|e| e.to_string())?;
    match SqliteLeaseStore::open(&junk).await {
        Err(Error::Config { .. }) => {}
        other => return Err(format!("junk file: expected Error::Config, got {other:?}").into()),
    }
    let newer = fresh_file(&ctx, "newer");
    SqliteLeaseStore::open(&newer).await?.close().await;
    let mut conn = raw(&newer).await.map_err(|e| e.to_string())?;
    sqlx::query("UPDATE lease_meta SET value = 99 WHERE name = 'schema_version'")
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    match SqliteLeaseStore::open(&newer).await {
        Err(Error::Config { message, .. }) => assert!(message.contains("99"), "{message}"),
        other => return Err(format!("newer schema: expected Error::Config, got {other:?}").into()),
    }
    Ok(())
}

/// Tokens never go back: not across closing and reopening the file, and not when the lease row
/// (or even the generation row) is deleted behind the store's back.
pub(crate) async fn tokens_survive_reopen_and_deleted_rows(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "durable");
    let key = LeaseKey::new("durable")?;
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let first = SqliteLeaseStore::open(&path).await?;
    let l1 = must_acquire(&first, &key, &a).await?;
    assert_eq!(first.release(&l1).await?, ReleaseOutcome::Released);
    first.close().await;
    // A closed store refuses writes and reads (nothing applied), and does not reopen itself.
    for _ in 0..2 {
        match first.acquire(&req(&key, &b)).await {
            Err(e @ Error::Unavailable { .. }) => assert!(!e.outcome_unknown(), "{e:?}"),
            other => return Err(format!("acquire on a closed store: {other:?}").into()),
        }
    }
    assert!(matches!(
        first.inspect(&key).await,
        Err(Error::Unavailable { .. })
    ));

    let second = SqliteLeaseStore::open(&path).await?;
    assert_eq!(
        second.inspect(&key).await?.last_token,
        Some(l1.token()),
        "the generation was lost on reopen"
    );
    let l2 = must_acquire(&second, &key, &b).await?;
    assert!(
        l2.token() > l1.token(),
        "{} !> {} after reopen",
        l2.token(),
        l1.token()
    );

    let mut conn = raw(&path).await.map_err(|e| e.to_string())?;
    sqlx::query("DELETE FROM lease_holder")
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let l3 = must_acquire(&second, &key, &a).await?;
    assert!(
        l3.token() > l2.token(),
        "{} !> {} after the lease row was deleted",
        l3.token(),
        l2.token()
    );

    // Even without the generation row, the holder row keeps the next token above it.
    sqlx::query("DELETE FROM lease_generation")
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let l4 = must_acquire(&second, &key, &a).await?;
    assert!(
        l4.token() > l3.token(),
        "{} !> {} after the generation row was deleted",
        l4.token(),
        l3.token()
    );

    // A released row deleted by a cleanup job (the row outlives its release) still floors the
    // next token, and so does a row deleted by key.
    assert_eq!(second.release(&l4).await?, ReleaseOutcome::Released);
    sqlx::query("DELETE FROM lease_holder WHERE expires_ms <= 0")
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(
        second.inspect(&key).await?.last_token,
        Some(l4.token()),
        "the token was lost with the released row"
    );
    let l5 = must_acquire(&second, &key, &b).await?;
    assert!(
        l5.token() > l4.token(),
        "{} !> {} after the released row was deleted",
        l5.token(),
        l4.token()
    );
    sqlx::query("DELETE FROM lease_holder WHERE key = ?1")
        .bind(key.as_str())
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let l6 = must_acquire(&second, &key, &a).await?;
    assert!(l6.token() > l5.token(), "{} !> {}", l6.token(), l5.token());

    // An update that would lower the token is refused and changes nothing.
    let lowered = sqlx::query("UPDATE lease_holder SET token = 1 WHERE key = ?1")
        .bind(key.as_str())
        .execute(&mut conn)
        .await;
    assert!(lowered.is_err(), "a lowered token was accepted");
    assert_eq!(
        second.inspect(&key).await?.holder.map(|h| h.token),
        Some(l6.token())
    );
    Ok(())
}

/// The schema of version 1 (leasehold-sqlite before the token moved into the holder row), as that
/// version created it, and the rows it wrote: every grant wrote `lease_generation`, release
/// deleted the holder row.
const SCHEMA_V1: [&str; 5] = [
    "CREATE TABLE lease_meta (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT",
    "CREATE TABLE lease_generation (key TEXT PRIMARY KEY NOT NULL, last_token INTEGER NOT NULL CHECK (last_token > 0)) STRICT",
    "CREATE TABLE lease_holder (key TEXT PRIMARY KEY NOT NULL, owner TEXT NOT NULL, token INTEGER NOT NULL CHECK (token > 0), ttl_ms INTEGER NOT NULL CHECK (ttl_ms > 0), expires_ms INTEGER NOT NULL) STRICT",
    "CREATE TABLE lease_fenced (key TEXT PRIMARY KEY NOT NULL, high_water INTEGER NOT NULL CHECK (high_water > 0), value BLOB, counter INTEGER NOT NULL DEFAULT 0, accepted INTEGER NOT NULL DEFAULT 0 CHECK (accepted >= 0)) STRICT",
    "INSERT INTO lease_meta (name, value) VALUES ('schema_version', 1)",
];

/// A file written by schema version 1 keeps working: opening it upgrades it in place (version
/// 2, the triggers added), its holder stays the holder, and tokens continue above the old ones,
/// for a released key (token only in `lease_generation`), a held one and an expired one.
pub(crate) async fn schema_v1_file_is_upgraded_and_tokens_continue(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "v1");
    let mut conn = raw_create(&path).await.map_err(|e| e.to_string())?;
    for ddl in SCHEMA_V1 {
        sqlx::query(ddl)
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    // released: granted up to 41, released (holder row deleted by version 1);
    // held: token 7, held by "old" for an hour; expired: token 12, expired a minute ago.
    let a = OwnerId::with_label("old");
    for (key, token) in [("released", 41), ("held", 7), ("expired", 12)] {
        sqlx::query("INSERT INTO lease_generation (key, last_token) VALUES (?1, ?2)")
            .bind(key)
            .bind(token)
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    for (key, token, expires) in [("held", 7, 3_600_000), ("expired", 12, -60_000)] {
        sqlx::query(
            "INSERT INTO lease_holder (key, owner, token, ttl_ms, expires_ms) \
             VALUES (?1, ?2, ?3, 60000, CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) + ?4)",
        )
        .bind(key)
        .bind(a.as_str())
        .bind(token)
        .bind(expires)
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    }

    let store = SqliteLeaseStore::open(&path).await?;
    let version: i64 =
        sqlx::query_scalar("SELECT value FROM lease_meta WHERE name = 'schema_version'")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    assert_eq!(version, leasehold_sqlite::protocol::SCHEMA_VERSION);
    assert_eq!(version, 2);
    let triggers: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    assert_eq!(triggers, 2, "the triggers were not added");

    let b = OwnerId::with_label("new");
    let (released, held, expired) = (
        LeaseKey::new("released")?,
        LeaseKey::new("held")?,
        LeaseKey::new("expired")?,
    );
    let states = store
        .inspect_many(&[released.clone(), held.clone(), expired.clone()])
        .await?;
    let last: Vec<_> = states
        .iter()
        .map(|s| s.last_token.map(|t| t.get()))
        .collect();
    assert_eq!(last, [Some(41), Some(7), Some(12)]);
    match store.acquire(&req(&held, &b)).await? {
        AcquireOutcome::Held(h) => assert_eq!((h.owner, h.token.get()), (a.clone(), 7)),
        AcquireOutcome::Acquired(l) => {
            return Err(format!("granted {} over a key held in the old file", l.token()).into());
        }
    }
    assert_eq!(must_acquire(&store, &released, &b).await?.token().get(), 42);
    assert_eq!(must_acquire(&store, &expired, &b).await?.token().get(), 13);
    // The old holder keeps renewing and releasing with the token it has.
    let old = leasehold_core::Lease::resume(
        held.clone(),
        a.clone(),
        FencingToken::new(7)?,
        Duration::from_secs(60),
    );
    assert!(matches!(
        store.renew(&old).await?,
        leasehold_core::RenewOutcome::Renewed(_)
    ));
    assert_eq!(store.release(&old).await?, ReleaseOutcome::Released);
    assert_eq!(must_acquire(&store, &held, &b).await?.token().get(), 8);
    // Opening it again changes nothing.
    drop(store);
    let again = SqliteLeaseStore::open(&path).await?;
    assert_eq!(
        again.inspect(&released).await?.last_token.map(|t| t.get()),
        Some(42)
    );
    Ok(())
}

/// Several stores opening one fresh file at once all succeed (the schema is created once), and
/// `migrate()` again keeps the data.
pub(crate) async fn concurrent_open_and_repeated_migrate_are_safe(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "migrate");
    let opens = (0..6).map(|_| {
        let path = path.clone();
        tokio::spawn(async move { SqliteLeaseStore::open(&path).await })
    });
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.map_err(|e| e.to_string())??);
    }
    let key = LeaseKey::new("kept")?;
    let lease = must_acquire(&stores[0], &key, &OwnerId::with_label("a")).await?;
    for s in &stores {
        s.migrate().await?;
    }
    let state = stores[5].inspect(&key).await?;
    assert_eq!(
        state.holder.map(|h| h.token),
        Some(lease.token()),
        "migrate changed the data"
    );
    Ok(())
}

/// A missing table (dropped behind the store's back) is a configuration error, and `migrate()`
/// repairs it.
pub(crate) async fn missing_table_is_a_config_error(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "dropped");
    let store = SqliteLeaseStore::open(&path).await?;
    let mut conn = raw(&path).await.map_err(|e| e.to_string())?;
    sqlx::query("DROP TABLE lease_holder")
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let key = LeaseKey::new("k")?;
    match store.acquire(&req(&key, &OwnerId::with_label("a"))).await {
        Err(Error::Config { .. }) => {}
        other => return Err(format!("expected Error::Config, got {other:?}").into()),
    }
    store.migrate().await?;
    must_acquire(&store, &key, &OwnerId::with_label("a")).await?;
    Ok(())
}

/// A writer that keeps the file locked past the busy timeout makes operations fail with a
/// retryable `Error::Unavailable` that was certainly not applied (`Error::refused`: not a panic,
/// not an outcome, `outcome_unknown()` false); they succeed once the lock is gone, and the
/// failed acquire changed nothing.
pub(crate) async fn busy_file_is_refused_and_retryable(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "busy");
    let opts = SqliteOptions::new().with_busy_timeout(Duration::from_millis(200));
    let store = SqliteLeaseStore::open_with(&path, opts).await?;
    let key = LeaseKey::new("busy")?;
    let a = OwnerId::with_label("a");
    let lease = must_acquire(&store, &key, &a).await?;

    let mut locker = raw(&path).await.map_err(|e| e.to_string())?;
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut locker)
        .await
        .map_err(|e| e.to_string())?;
    /// Whether `r` is the refusal of a busy file: retryable, certainly not applied.
    fn refused<T: std::fmt::Debug>(what: &str, r: leasehold_core::Result<T>) -> CaseResult {
        match r {
            Err(
                e @ Error::Unavailable {
                    backend: "sqlite", ..
                },
            ) if e.is_retryable() && !e.outcome_unknown() => Ok(()),
            other => Err(format!(
                "{what} on a locked file: expected a refused Error::Unavailable, got {other:?}"
            )
            .into()),
        }
    }
    let started = tokio::time::Instant::now();
    refused(
        "acquire",
        store.acquire(&req(&key, &OwnerId::with_label("b"))).await,
    )?;
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "gave up before the busy timeout"
    );
    refused("renew", store.renew(&lease).await)?;
    refused(
        "fenced write",
        store
            .fenced_resource()
            .write(&key, lease.token(), WriteOp::Add(1))
            .await,
    )?;
    // Readers are not blocked by a writer in WAL mode.
    assert_eq!(
        store.inspect(&key).await?.holder.map(|h| h.token),
        Some(lease.token())
    );
    sqlx::query("ROLLBACK")
        .execute(&mut locker)
        .await
        .map_err(|e| e.to_string())?;

    let state = store.inspect(&key).await?;
    assert_eq!(
        state.holder.map(|h| (h.owner, h.token)),
        Some((a, lease.token())),
        "a failed acquire changed the holder"
    );
    assert_eq!(
        state.last_token,
        Some(lease.token()),
        "a failed acquire issued a token"
    );
    assert!(matches!(
        store.renew(&lease).await?,
        leasehold_core::RenewOutcome::Renewed(_)
    ));
    Ok(())
}

/// Stores with either commit durability share one file: a grant made with `CommitSync::Full`
/// is seen by a default store, and tokens keep increasing across both.
pub(crate) async fn commit_sync_modes_share_one_file(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "sync");
    let full = SqliteLeaseStore::open_with(
        &path,
        SqliteOptions::new().with_commit_sync(CommitSync::Full),
    )
    .await?;
    let normal = SqliteLeaseStore::open(&path).await?;
    let key = LeaseKey::new("sync")?;
    let (a, b) = (OwnerId::with_label("a"), OwnerId::with_label("b"));
    let la = must_acquire(&full, &key, &a).await?;
    match normal.acquire(&req(&key, &b)).await? {
        AcquireOutcome::Held(h) => assert_eq!((h.owner, h.token), (a.clone(), la.token())),
        AcquireOutcome::Acquired(l) => {
            return Err(format!("granted {} over a held key", l.token()).into());
        }
    }
    assert!(matches!(
        full.renew(&la).await?,
        leasehold_core::RenewOutcome::Renewed(_)
    ));
    assert_eq!(normal.release(&la).await?, ReleaseOutcome::Released);
    let lb = must_acquire(&normal, &key, &b).await?;
    assert!(lb.token() > la.token());
    assert_eq!(
        full.inspect(&key).await?.holder.map(|h| h.token),
        Some(lb.token())
    );
    Ok(())
}

/// The store itself is a fenced resource over the same table as `fenced_resource()`.
pub(crate) async fn store_and_fenced_resource_share_the_table(ctx: Ctx) -> CaseResult {
    let path = fresh_file(&ctx, "fenced");
    let store = SqliteLeaseStore::open(&path).await?;
    let key = LeaseKey::new("ledger")?;
    let (t1, t2) = (FencingToken::new(1)?, FencingToken::new(2)?);
    assert!(store.write(&key, t2, WriteOp::Add(5)).await?.is_accepted());
    let res = store.fenced_resource();
    assert!(!res.write(&key, t1, WriteOp::Add(1)).await?.is_accepted());
    let state = FencedResource::read(&store, &key).await?;
    assert_eq!(
        (state.high_water, state.counter, state.accepted),
        (Some(t2), 5, 1)
    );
    Ok(())
}
