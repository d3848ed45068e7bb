//! Failover to an asynchronous replica, on a throwaway MariaDB primary and replica that
//! `scripts/services/mariadb-failover.sh` builds on free loopback ports (never the shared
//! server).
//!
//! The replica stops applying the primary's binary log (`STOP SLAVE`) while the primary keeps
//! granting, so the newest grant is lost when the primary is killed (SIGKILL) and the replica is
//! promoted. The next grant on the promoted server must still be greater than every token
//! granted before (the clock floor), and a fenced resource that accepted the lost grant's token
//! must accept the new one and reject the surviving older one.
//!
//! Needs the MariaDB server binaries (the script installs them with apt when missing) and, as
//! root, the `mysql` user to run them.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use leasehold_core::{
    AcquireRequest, FencedResource, LeaseKey, LeaseStore, MemoryFencedResource, OwnerId,
    ReleaseOutcome, WriteOp,
};
use leasehold_mysql::{MysqlLeaseStore, MysqlOptions};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/services/mariadb-failover.sh")
}

/// The primary and replica; stopped and deleted when dropped, even if the test panics.
struct Pair {
    dir: PathBuf,
    primary: u16,
    replica: u16,
}

impl Pair {
    fn setup() -> Pair {
        let state = leasehold_testkit::stores::state_dir();
        let dir = PathBuf::from(state).join(format!(
            "mariadb-failover-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let mut pair = Pair {
            dir,
            primary: 0,
            replica: 0,
        };
        let out = pair.run("setup");
        for line in out.lines() {
            if let Some(p) = line.strip_prefix("PRIMARY_PORT=") {
                pair.primary = p.trim().parse().expect("a port");
            }
            if let Some(p) = line.strip_prefix("REPLICA_PORT=") {
                pair.replica = p.trim().parse().expect("a port");
            }
        }
        assert!(pair.primary > 0 && pair.replica > 0, "no ports in {out}");
        pair
    }

    fn run(&self, cmd: &str) -> String {
        let out = Command::new("bash")
            .arg(script())
            .arg(cmd)
            .arg(&self.dir)
            .output()
            .expect("run mariadb-failover.sh");
        assert!(
            out.status.success(),
            "mariadb-failover.sh {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn url(port: u16) -> String {
        format!("mysql://root@127.0.0.1:{port}/test")
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// Polls `f` every 20 ms until it returns true; panics after `within`.
async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promoted_replica_that_lost_the_newest_grant_still_grants_greater_tokens() {
    let pair = Pair::setup();
    let opts = || MysqlOptions::default().with_max_connections(2);
    let primary = MysqlLeaseStore::connect_with(&Pair::url(pair.primary), opts())
        .await
        .expect("connect to the primary");
    let admin = sqlx::MySqlPool::connect(&Pair::url(pair.replica))
        .await
        .expect("connect to the replica");
    let key = LeaseKey::new("failover").unwrap();
    let ttl = Duration::from_secs(30);
    let req = |owner: &str| AcquireRequest::new(key.clone(), OwnerId::with_label(owner), ttl);

    // A grant the replica receives.
    let first = primary.acquire(&req("a")).await.unwrap().lease().unwrap();
    assert_eq!(
        primary.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    let t1 = first.token().to_i64();
    eventually(
        Duration::from_secs(20),
        // The release too: a replica stopped between the grant and the release would still see
        // "a" holding the key.
        "the replica to apply the first grant and its release",
        || {
            let admin = admin.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT fencing_token FROM leases \
                     WHERE resource_key = 'failover' AND lease_until <= UTC_TIMESTAMP(6)",
                )
                .fetch_optional(&admin)
                .await
                .ok()
                .flatten()
                    == Some(t1)
            }
        },
    )
    .await;

    // The replica stops applying; the primary grants once more, and the grant's token is
    // accepted by a fenced resource outside the cluster.
    sqlx::query("STOP SLAVE").execute(&admin).await.unwrap();
    let lost = primary.acquire(&req("b")).await.unwrap().lease().unwrap();
    assert!(lost.token() > first.token());
    let fence = MemoryFencedResource::new();
    assert!(
        fence
            .write(&key, lost.token(), WriteOp::Add(1))
            .await
            .unwrap()
            .is_accepted()
    );

    // The primary dies; the replica is promoted.
    pair.run("kill-primary");
    for stmt in ["RESET SLAVE ALL", "SET GLOBAL read_only = OFF"] {
        sqlx::query(stmt).execute(&admin).await.unwrap();
    }
    let promoted = MysqlLeaseStore::connect_with(&Pair::url(pair.replica), opts())
        .await
        .expect("connect to the promoted replica");
    let state = promoted.inspect(&key).await.unwrap();
    assert_eq!(
        state.last_token,
        Some(first.token()),
        "the replica was expected to have lost the newest grant"
    );

    // The next grant is above the lost one (the clock floor), so the fence accepts it and
    // still rejects the older surviving token.
    let next = promoted.acquire(&req("c")).await.unwrap().lease().unwrap();
    assert!(
        next.token() > lost.token(),
        "the token went back across the failover: {} after the lost {}",
        next.token(),
        lost.token()
    );
    assert!(
        fence
            .write(&key, next.token(), WriteOp::Add(1))
            .await
            .unwrap()
            .is_accepted()
    );
    assert!(
        !fence
            .write(&key, first.token(), WriteOp::Add(1))
            .await
            .unwrap()
            .is_accepted()
    );
    drop(pair);
}
