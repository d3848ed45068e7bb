//! PostgreSQL restarted while a lease is held (its own test binary: cargo runs test binaries one
//! after another, so no other case sees the outage).
//!
//! The holder's supervisor must never report `Held` past its local deadline; it either recovers
//! (`Held` again after the restart) or reports `Lost`; a token issued after the restart is
//! greater than every token before it. The restart uses `pg_ctlcluster` (root); where it is not
//! available the test is skipped with a message, and fails under `CI` / `LEASE_TEST_REQUIRE`.

use std::process::Command;
use std::time::Duration;

use leasehold_core::supervisor::{Health, Supervisor, SupervisorConfig};
use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId};
use leasehold_postgres::{PostgresLeaseStore, PostgresOptions};
use tokio::time::Instant;

/// `LEASE_POSTGRES_URL`, or its default in leasehold-testkit's test store table.
fn url() -> String {
    leasehold_testkit::stores::POSTGRES_URL.get()
}

fn cluster() -> Option<String> {
    let out = Command::new("pg_lsclusters").arg("-h").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(" 5432 ") || l.split_whitespace().nth(2) == Some("5432"))?;
    let mut f = line.split_whitespace();
    Some(format!("{} {}", f.next()?, f.next()?))
}

fn restart(cluster: &str) -> Result<(), String> {
    let mut args: Vec<&str> = vec!["--skip-systemctl-redirect"];
    args.extend(cluster.split(' '));
    args.push("restart");
    let out = Command::new("pg_ctlcluster")
        .args(&args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_held_never_held_past_deadline_and_tokens_increase() {
    let require = leasehold_testkit::require_services();
    let Some(cluster) = cluster() else {
        assert!(
            !require,
            "no PostgreSQL cluster on port 5432 found with pg_lsclusters"
        );
        eprintln!("SKIPPED: no local PostgreSQL cluster to restart");
        return;
    };
    // Migrate first: `connect` checks the schema, which a fresh database does not have yet.
    let store = match PostgresLeaseStore::connect_lazy(&url(), PostgresOptions::default()) {
        Ok(s) => s,
        Err(e) => panic!("bad LEASE_POSTGRES_URL: {e}"),
    };
    if let Err(e) = store.migrate().await {
        assert!(!require, "postgres unavailable: {e}");
        eprintln!("SKIPPED: postgres unavailable: {e}");
        return;
    }
    let key = LeaseKey::new(format!("restart-{}", OwnerId::random())).unwrap();
    let ttl = Duration::from_secs(20);
    let sup = Supervisor::new(
        store.clone(),
        SupervisorConfig::new(ttl).with_renew_interval(Duration::from_millis(500)),
    );
    let guard = sup.acquire(&key).await.unwrap().guard().expect("fresh key");
    let before = guard.token();
    let mut rx = guard.subscribe();
    let watcher = tokio::spawn(async move {
        let mut seen = vec![];
        loop {
            let h = *rx.borrow_and_update();
            seen.push((h, Instant::now()));
            if h.is_final() || rx.changed().await.is_err() {
                return seen;
            }
        }
    });

    let t0 = Instant::now();
    if let Err(e) = restart(&cluster) {
        assert!(!require, "pg_ctlcluster restart failed: {e}");
        eprintln!("SKIPPED: cannot restart PostgreSQL here: {e}");
        return;
    }
    eprintln!("PostgreSQL restarted in {:?}", t0.elapsed());

    // Wait (bounded) until the store answers again and the supervisor settles.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if store.inspect(&key).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "postgres did not come back within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A new store in the same process (new pool) connects and migrates after the restart.
    let fresh =
        PostgresLeaseStore::connect_with(&url(), PostgresOptions::default().with_migrate(false))
            .await
            .expect("connect after the restart");
    fresh.migrate().await.expect("migrate after the restart");
    let settle = Instant::now() + Duration::from_secs(5);
    while Instant::now() < settle && guard.health() != Health::Held && !guard.health().is_final() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let health = guard.health();
    assert!(
        matches!(health, Health::Held | Health::Lost(_)),
        "after the restart the holder is neither Held nor Lost: {health:?}"
    );
    if health == Health::Held {
        assert!(
            guard.lease().is_valid(),
            "Held with an expired local deadline"
        );
        let h = store
            .inspect(&key)
            .await
            .unwrap()
            .holder
            .expect("held lease visible after restart");
        assert_eq!(h.token, before, "the store lost the holder's token");
    }
    let _ = guard.release().await;
    let seen = watcher.await.unwrap();
    eprintln!(
        "health over the restart: {:?}",
        seen.iter().map(|s| s.0).collect::<Vec<_>>()
    );

    // A token issued after the restart is greater than every token before it.
    let other = OwnerId::with_label("after-restart");
    let next = store
        .acquire(&AcquireRequest::new(
            key.clone(),
            other,
            Duration::from_secs(5),
        ))
        .await
        .unwrap()
        .lease()
        .expect("released key is free");
    assert!(
        next.token() > before,
        "token went back after a restart: {} <= {before}",
        next.token()
    );
    let _ = store.release(&next).await;
}
