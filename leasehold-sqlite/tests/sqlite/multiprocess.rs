//! Several OS processes on one database file.
//!
//! This binary is both the test and its workers: when `LEASE_SQLITE_MP_ROLE` is set it runs as a
//! child process in that role; otherwise it runs the tests, which spawn the binary itself as
//! children. The file is fresh, so the children also race on creating it and its schema.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencedResource, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome,
    WriteOp,
};
use leasehold_sqlite::SqliteLeaseStore;
use libtest_mimic::{Arguments, Failed, Trial};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};

const ROLE: &str = "LEASE_SQLITE_MP_ROLE";
const DB: &str = "LEASE_SQLITE_MP_DB";
const MARKER: &str = "LEASE_SQLITE_MP_MARKER";
const KEY: &str = "mp-key";
const WORKERS: usize = 3;
const ROUNDS: usize = 15;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("leasehold-sqlite-mp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test directory");
    dir
}

fn child(role: &str, db: &Path, marker: &Path) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .env(ROLE, role)
        .env(DB, db)
        .env(MARKER, marker)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
}

// ---- child roles -------------------------------------------------------------------------

/// Contends for the key `ROUNDS` times. While holding it, owns an exclusive marker file (created
/// with O_EXCL): if another process held the key at the same time, one of the two creations
/// fails. Prints each granted token.
async fn contend(db: &Path, marker: &Path) -> Result<(), String> {
    let store = SqliteLeaseStore::open(db)
        .await
        .map_err(|e| e.to_string())?;
    let res = store.fenced_resource();
    let key = LeaseKey::new(KEY).map_err(|e| e.to_string())?;
    let owner = OwnerId::with_label(&format!("pid{}", std::process::id()));
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..ROUNDS {
        let lease = loop {
            let req = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(30));
            match store.acquire(&req).await.map_err(|e| e.to_string())? {
                AcquireOutcome::Acquired(lease) => break lease,
                AcquireOutcome::Held(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(1..6))).await;
                }
                AcquireOutcome::Held(h) => {
                    return Err(format!("still held by {} at the deadline", h.owner));
                }
            }
        };
        if let Err(e) = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(marker)
        {
            return Err(format!(
                "OVERLAP: token {} granted while the marker exists ({e})",
                lease.token()
            ));
        }
        let out = res
            .write(&key, lease.token(), WriteOp::Add(1))
            .await
            .map_err(|e| e.to_string())?;
        if !out.is_accepted() {
            return Err(format!(
                "write with current token {} rejected: {out:?}",
                lease.token()
            ));
        }
        tokio::task::yield_now().await;
        std::fs::remove_file(marker).map_err(|e| e.to_string())?;
        if store.release(&lease).await.map_err(|e| e.to_string())? != ReleaseOutcome::Released {
            return Err(format!("release of token {} refused", lease.token()));
        }
        println!("granted {}", lease.token());
    }
    Ok(())
}

/// Acquires the key with a short TTL, prints the token, and waits to be killed.
async fn hold(db: &Path) -> Result<(), String> {
    let store = SqliteLeaseStore::open(db)
        .await
        .map_err(|e| e.to_string())?;
    let key = LeaseKey::new(KEY).map_err(|e| e.to_string())?;
    let req = AcquireRequest::new(
        key,
        OwnerId::with_label("holder"),
        Duration::from_millis(800),
    );
    match store.acquire(&req).await.map_err(|e| e.to_string())? {
        AcquireOutcome::Acquired(lease) => println!("granted {}", lease.token()),
        AcquireOutcome::Held(h) => return Err(format!("held by {}", h.owner)),
    }
    std::future::pending::<()>().await;
    Ok(())
}

fn run_child(role: &str) -> ! {
    let db = PathBuf::from(std::env::var_os(DB).expect("LEASE_SQLITE_MP_DB"));
    let marker = PathBuf::from(std::env::var_os(MARKER).expect("LEASE_SQLITE_MP_MARKER"));
    let result = runtime().block_on(async {
        match role {
            "contend" => contend(&db, &marker).await,
            "hold" => hold(&db).await,
            other => Err(format!("unknown role {other}")),
        }
    });
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("child {role} (pid {}): {e}", std::process::id());
            std::process::exit(1)
        }
    }
}

// ---- tests -------------------------------------------------------------------------------

/// Reads every `granted N` line of a child's stdout until it ends.
async fn granted_tokens(child: &mut Child) -> Result<Vec<u64>, String> {
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut tokens = Vec::new();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        if let Some(t) = line.strip_prefix("granted ") {
            tokens.push(t.trim().parse::<u64>().map_err(|e| e.to_string())?);
        }
    }
    Ok(tokens)
}

/// Three processes contend for one key on one fresh file, 15 rounds each: no two ever hold it at
/// once (an O_EXCL marker file), every grant has a unique token, and the fenced counter is exact.
async fn processes_on_one_file_never_both_hold() -> Result<(), Failed> {
    let dir = fresh_dir("contend");
    let (db, marker) = (dir.join("mp.db"), dir.join("holder.marker"));
    let mut children = Vec::new();
    for _ in 0..WORKERS {
        children.push(child("contend", &db, &marker).map_err(|e| e.to_string())?);
    }
    let mut tokens = Vec::new();
    for mut c in children {
        let out = timeout(Duration::from_secs(90), async {
            let t = granted_tokens(&mut c).await?;
            let status = c.wait().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((t, status))
        })
        .await
        .map_err(|_| "a child did not finish within 90 s")??;
        if !out.1.success() {
            return Err(format!("a child failed ({}); see its stderr above", out.1).into());
        }
        tokens.extend(out.0);
    }
    assert_eq!(tokens.len(), WORKERS * ROUNDS, "grants: {tokens:?}");
    let mut unique = tokens.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        tokens.len(),
        "a token was granted twice: {tokens:?}"
    );

    let store = SqliteLeaseStore::open(&db).await?;
    let key = LeaseKey::new(KEY)?;
    let state = store.fenced_resource().read(&key).await?;
    assert_eq!(
        state.counter,
        i64::try_from(WORKERS * ROUNDS).unwrap_or(i64::MAX),
        "the count is not exact"
    );
    let ks = store.inspect(&key).await?;
    assert!(
        ks.holder.is_none(),
        "the key is still held after every child released"
    );
    assert_eq!(ks.last_token.map(u64::from), unique.last().copied());
    Ok(())
}

/// A holder process killed with SIGKILL leaves its lease to expire; another process then takes
/// the key over with a greater token (nothing was lost with the killed process).
async fn killed_holder_expires_and_is_taken_over() -> Result<(), Failed> {
    let dir = fresh_dir("killed");
    let (db, marker) = (dir.join("mp.db"), dir.join("unused.marker"));
    let mut holder = child("hold", &db, &marker).map_err(|e| e.to_string())?;
    let stdout = holder.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| "the holder did not report a grant within 30 s")?
        .map_err(|e| e.to_string())?
        .ok_or("the holder exited before reporting a grant")?;
    let held: u64 = line
        .strip_prefix("granted ")
        .ok_or(format!("unexpected line {line:?}"))?
        .trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| e.to_string())?;

    let store = SqliteLeaseStore::open(&db).await?;
    let key = LeaseKey::new(KEY)?;
    let me = OwnerId::with_label("successor");
    let req = AcquireRequest::new(key.clone(), me.clone(), Duration::from_secs(30));
    match store.acquire(&req).await? {
        AcquireOutcome::Held(h) => assert_eq!(h.token.get(), held),
        AcquireOutcome::Acquired(l) => {
            return Err(format!("granted {} while the child holds {held}", l.token()).into());
        }
    }
    holder.kill().await.map_err(|e| e.to_string())?;

    let deadline = Instant::now() + Duration::from_secs(10);
    let lease = loop {
        if let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? {
            break lease;
        }
        if Instant::now() >= deadline {
            return Err("the killed holder's lease did not expire within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(lease.token().get() > held, "{} !> {held}", lease.token());
    Ok(())
}

/// A test body: builds the future to run.
type Body = fn() -> std::pin::Pin<Box<dyn Future<Output = Result<(), Failed>>>>;

fn trial(name: &'static str, f: Body) -> Trial {
    Trial::test(name, move || runtime().block_on(f()))
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        run_child(&role);
    }
    let args = Arguments::from_args();
    let trials = vec![
        trial(
            "multiprocess::processes_on_one_file_never_both_hold",
            || Box::pin(processes_on_one_file_never_both_hold()),
        ),
        trial(
            "multiprocess::killed_holder_expires_and_is_taken_over",
            || Box::pin(killed_holder_expires_and_is_taken_over()),
        ),
    ];
    libtest_mimic::run(&args, trials).exit()
}
