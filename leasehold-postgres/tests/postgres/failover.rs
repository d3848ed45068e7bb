//! Failover to an asynchronous streaming standby, on a throwaway primary and
//! standby that `scripts/services/postgres-failover.sh` builds on free loopback ports (its own
//! test binary: it starts and kills its own servers, never the shared one).
//!
//! The standby stops receiving WAL (it is shut down) while the primary keeps granting, so the
//! newest grant and the sequence values logged after the standby's last WAL are lost when the
//! primary dies (`-m immediate`) and the standby is promoted. The next grant on the promoted
//! server must still be greater than every token granted before, and a fenced resource that
//! accepted the lost grant's token must accept the new one.
//!
//! Needs root (the servers run as user `postgres` through `runuser`) and the PostgreSQL server
//! binaries (the script installs them with apt when missing). Without them the test is skipped
//! with a message, and fails under `CI` / `LEASE_TEST_REQUIRE`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, FencedResource, LeaseKey, LeaseStore, MemoryFencedResource, OwnerId,
    ReleaseOutcome, WriteOp,
};
use leasehold_postgres::{PostgresLeaseStore, PostgresOptions};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/services/postgres-failover.sh")
}

/// The primary and standby; torn down (stopped, data deleted) when dropped, even if the test
/// panics.
struct Pair {
    dir: PathBuf,
    primary: u16,
    standby: u16,
}

impl Pair {
    fn setup() -> Result<Pair, String> {
        let state = leasehold_testkit::stores::state_dir();
        reap_leftovers(&PathBuf::from(&state));
        let dir = PathBuf::from(state).join(format!(
            "pg-failover-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let mut pair = Pair {
            dir,
            primary: 0,
            standby: 0,
        };
        let out = pair.run(&["setup"])?;
        for line in out.lines() {
            if let Some(p) = line.strip_prefix("PRIMARY_PORT=") {
                pair.primary = p.trim().parse().map_err(|e| format!("{line}: {e}"))?;
            }
            if let Some(p) = line.strip_prefix("STANDBY_PORT=") {
                pair.standby = p.trim().parse().map_err(|e| format!("{line}: {e}"))?;
            }
        }
        if pair.primary == 0 || pair.standby == 0 {
            return Err(format!("the script printed no ports: {out}"));
        }
        Ok(pair)
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        let started = std::time::Instant::now();
        let _log =
            Finally(move || eprintln!("postgres-failover.sh {args:?}: {:?}", started.elapsed()));
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .arg(args[0])
            .arg(&self.dir)
            .args(&args[1..]);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script().display()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "postgres-failover.sh {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn url(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/test")
    }
}

/// Tears down pairs left by an earlier run of this test that was killed before its `Drop` ran
/// (their directory names carry the pid of a process that no longer exists).
fn reap_leftovers(state: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(state) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("pg-failover-")
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !PathBuf::from(format!("/proc/{pid}")).exists() {
            let _ = Command::new("bash")
                .arg(script())
                .arg("teardown")
                .arg(entry.path())
                .output();
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        if let Err(e) = self.run(&["teardown"]) {
            eprintln!("{e}");
        }
    }
}

struct Finally<F: FnMut()>(F);
impl<F: FnMut()> Drop for Finally<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// The tests of this file one at a time: the script picks free ports for a pair, and two pairs
/// set up at once can pick the same ones.
static ONE_PAIR_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn options() -> PostgresOptions {
    PostgresOptions::default()
        .with_max_connections(2)
        .with_op_timeout(Duration::from_secs(10))
        .with_acquire_timeout(Duration::from_secs(10))
}

async fn grant(store: &PostgresLeaseStore, key: &LeaseKey, owner: &str) -> leasehold_core::Lease {
    let req = AcquireRequest::new(
        key.clone(),
        OwnerId::with_label(owner),
        Duration::from_secs(60),
    );
    store
        .acquire(&req)
        .await
        .expect("acquire")
        .lease()
        .expect("the key is free")
}

/// Waits (bounded) until the standby has replayed everything the primary has written so far.
async fn wait_replayed(primary: &PostgresLeaseStore, standby: &PostgresLeaseStore) {
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(primary.pool())
        .await
        .expect("primary LSN");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let caught_up: Option<bool> =
            sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn")
                .bind(&lsn)
                .fetch_one(standby.pool())
                .await
                .expect("standby replay LSN");
        if caught_up == Some(true) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby did not replay {lsn} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_an_async_standby_never_reuses_or_undercuts_a_token() {
    let _serial = ONE_PAIR_AT_A_TIME.lock().await;
    let require = leasehold_testkit::require_services();
    let pair = match Pair::setup() {
        Ok(p) => p,
        Err(e) => {
            assert!(!require, "cannot build a primary and standby: {e}");
            eprintln!("SKIPPED: cannot build a primary and standby: {e}");
            return;
        }
    };
    let primary = PostgresLeaseStore::connect_lazy(&Pair::url(pair.primary), options()).unwrap();
    primary.migrate().await.expect("migrate on the primary");
    primary.verify_schema().await.expect("schema installed");
    let key = LeaseKey::new("failover").unwrap();
    let resource = MemoryFencedResource::new();

    // A grant that reaches the standby.
    let first = grant(&primary, &key, "a").await;
    assert_eq!(
        primary.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    {
        let standby =
            PostgresLeaseStore::connect_lazy(&Pair::url(pair.standby), options()).unwrap();
        wait_replayed(&primary, &standby).await;
        standby.pool().close().await;
    }

    // The standby stops receiving WAL; the primary keeps granting (asynchronous replication
    // lets every commit return without the standby). More grants than the sequence prelogs
    // (32 values), so the lost WAL holds sequence values too.
    pair.run(&["stop", "standby", "fast"])
        .expect("stop the standby");
    let mut last = first.token();
    for i in 0..40 {
        let l = grant(&primary, &key, &format!("b{i}")).await;
        assert!(l.token() > last, "tokens increase on the primary");
        last = l.token();
        assert_eq!(primary.release(&l).await.unwrap(), ReleaseOutcome::Released);
    }
    let lost = grant(&primary, &key, "holder").await;
    assert!(lost.token() > last);
    // The holder writes to an outside resource with its token.
    assert!(
        resource
            .write(&key, lost.token(), WriteOp::Add(1))
            .await
            .unwrap()
            .is_accepted()
    );
    primary.pool().close().await;
    pair.run(&["stop", "primary", "immediate"])
        .expect("kill the primary");

    // Failover: the standby comes back without the primary and is promoted.
    pair.run(&["start", "standby"]).expect("start the standby");
    pair.run(&["promote"]).expect("promote the standby");
    let promoted = PostgresLeaseStore::connect_lazy(&Pair::url(pair.standby), options()).unwrap();
    let state = promoted
        .inspect(&key)
        .await
        .expect("inspect after failover");
    assert_eq!(
        state.last_token,
        Some(first.token()),
        "the promoted standby should have lost every grant after the first (else this test \
         shows nothing)"
    );
    let next = grant(&promoted, &key, "after-failover").await;
    let accepted = resource
        .write(&key, next.token(), WriteOp::Add(1))
        .await
        .unwrap();
    assert!(
        next.token() > lost.token(),
        "the first grant after failover has token {} but a holder already wrote with token {} \
         (lost with the old primary); the resource says {accepted:?}",
        next.token(),
        lost.token()
    );
    assert!(accepted.is_accepted(), "{accepted:?}");
    // Tokens keep increasing on the promoted server.
    assert_eq!(
        promoted.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
    let after = grant(&promoted, &key, "later").await;
    assert!(after.token() > next.token());
    promoted.pool().close().await;
    drop(pair);
}

/// A key first granted while the standby is cut off: its row, and the sequence values drawn for
/// it and for more new keys than the sequence prelogs (32), are lost with the old primary. The
/// promoted server's sequence starts again below them, so only the clock floor of the insert
/// trigger keeps the key's next grant above the lost one (a new row is the one grant whose token
/// the trigger draws: the insert asks for 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_never_undercuts_the_lost_first_grant_of_a_new_key() {
    let _serial = ONE_PAIR_AT_A_TIME.lock().await;
    let require = leasehold_testkit::require_services();
    let pair = match Pair::setup() {
        Ok(p) => p,
        Err(e) => {
            assert!(!require, "cannot build a primary and standby: {e}");
            eprintln!("SKIPPED: cannot build a primary and standby: {e}");
            return;
        }
    };
    let primary = PostgresLeaseStore::connect_lazy(&Pair::url(pair.primary), options()).unwrap();
    primary.migrate().await.expect("migrate on the primary");
    let resource = MemoryFencedResource::new();

    // A first grant that reaches the standby (its sequence has replayed a prelog).
    let seed = grant(&primary, &LeaseKey::new("seed").unwrap(), "a").await;
    {
        let standby =
            PostgresLeaseStore::connect_lazy(&Pair::url(pair.standby), options()).unwrap();
        wait_replayed(&primary, &standby).await;
        standby.pool().close().await;
    }
    pair.run(&["stop", "standby", "fast"])
        .expect("stop the standby");
    // New keys only: each grant inserts a row and draws from the sequence.
    let mut last = seed.token();
    for i in 0..40 {
        let l = grant(&primary, &LeaseKey::new(format!("new-{i}")).unwrap(), "b").await;
        assert!(l.token() > last, "tokens increase on the primary");
        last = l.token();
    }
    let key = LeaseKey::new("new-lost").unwrap();
    let lost = grant(&primary, &key, "holder").await;
    assert!(
        resource
            .write(&key, lost.token(), WriteOp::Add(1))
            .await
            .unwrap()
            .is_accepted()
    );
    primary.pool().close().await;
    pair.run(&["stop", "primary", "immediate"])
        .expect("kill the primary");

    pair.run(&["start", "standby"]).expect("start the standby");
    pair.run(&["promote"]).expect("promote the standby");
    let promoted = PostgresLeaseStore::connect_lazy(&Pair::url(pair.standby), options()).unwrap();
    let state = promoted
        .inspect(&key)
        .await
        .expect("inspect after failover");
    assert!(
        state.holder.is_none(),
        "the promoted standby should have lost the key's grant (else this test shows nothing)"
    );
    let next = grant(&promoted, &key, "after-failover").await;
    let accepted = resource
        .write(&key, next.token(), WriteOp::Add(1))
        .await
        .unwrap();
    assert!(
        next.token() > lost.token(),
        "the first grant of the key after failover has token {} but a holder already wrote with \
         token {} (lost with the old primary); the resource says {accepted:?}",
        next.token(),
        lost.token()
    );
    assert!(accepted.is_accepted(), "{accepted:?}");
    promoted.pool().close().await;
    drop(pair);
}
