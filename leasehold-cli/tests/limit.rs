//! `lease run --limit N`: the real `lease` binary, as many processes, against SQLite (a
//! temporary file) and PostgreSQL (`LEASE_POSTGRES_URL`, skipped with a warning when unreachable
//! outside CI / `LEASE_TEST_REQUIRE=1`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const NOT_ACQUIRED: i32 = 75;
const USAGE: i32 = 64;

fn lease() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    cmd.env_remove("LEASE_STORE")
        .env_remove("LEASE_LOG")
        .stdin(Stdio::null());
    cmd
}

fn unique_key(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("cli-{name}-{}-{nanos}", std::process::id())
}

fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("leases.db").display());
    (dir, url)
}

/// The PostgreSQL URL, or `None` (after a warning) when it is unreachable outside CI.
fn postgres() -> Option<String> {
    let url = leasehold_testkit::stores::POSTGRES_URL.get();
    let out = lease()
        .args(["status", "--store", &url, "cli-probe"])
        .output()
        .expect("run lease");
    if out.status.success() {
        return Some(url);
    }
    let why = String::from_utf8_lossy(&out.stderr).into_owned();
    if leasehold_testkit::require_services() {
        panic!("PostgreSQL at {url} is required (CI or LEASE_TEST_REQUIRE) but unavailable: {why}");
    }
    eprintln!("WARNING: PostgreSQL at {url} unavailable, skipping: {why}");
    None
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("lease did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One run of the command as logged: start and end (ns since the epoch), slot, token, and the
/// environment it saw.
#[derive(Debug)]
struct Run {
    start: u128,
    end: u128,
    slot: u32,
    token: u64,
    key: String,
    limit: String,
    semaphore: String,
}

fn runs(log: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut starts: BTreeMap<(u32, u64), Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        assert_eq!(f.len(), 7, "bad line {line:?} in {text}");
        let id = (f[2].parse().expect("slot"), f[3].parse().expect("token"));
        if f[0] == "start" {
            starts.insert(id, f);
        } else {
            let s = starts.remove(&id).expect("an end after its start");
            out.push(Run {
                start: s[1].parse().expect("time"),
                end: f[1].parse().expect("time"),
                slot: id.0,
                token: id.1,
                key: s[4].clone(),
                limit: s[5].clone(),
                semaphore: s[6].clone(),
            });
        }
    }
    assert!(starts.is_empty(), "runs that never ended: {starts:?}");
    out
}

/// `runners` processes run `lease run --limit 2` on one key at once, each logging the start and
/// end of its command with its slot and token. Every command runs, never more than two at once
/// and at some instant two; each sees its slot's key, token, the limit and the name; on each slot
/// the tokens increase in the order the commands ran.
fn at_most_limit_at_once(store: &str) {
    let key = unique_key("limit");
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("log");
    let script = format!(
        "echo \"start $(date +%s%N) $LEASE_SLOT $LEASE_FENCING_TOKEN $LEASE_KEY $LEASE_LIMIT $LEASE_SEMAPHORE\" >> {log}; \
         sleep 0.3; \
         echo \"end $(date +%s%N) $LEASE_SLOT $LEASE_FENCING_TOKEN $LEASE_KEY $LEASE_LIMIT $LEASE_SEMAPHORE\" >> {log}",
        log = log.display()
    );
    let runners = 6;
    let mut children: Vec<Child> = (0..runners)
        .map(|_| {
            lease()
                .args([
                    "run", "--store", store, "--key", &key, "--limit", "2", "--ttl", "5s",
                    "--wait", "60s", "--", "sh", "-c", &script,
                ])
                .spawn()
                .expect("spawn lease run")
        })
        .collect();
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(90));
        assert_eq!(status.code(), Some(0), "{status:?}");
    }
    let mut runs = runs(&log);
    assert_eq!(runs.len(), runners, "{runs:#?}");
    let mut edges: Vec<(u128, i32)> = runs
        .iter()
        .flat_map(|r| [(r.start, 1), (r.end, -1)])
        .collect();
    edges.sort_by_key(|&(at, d)| (at, d));
    let (mut open, mut peak) = (0, 0);
    for (_, d) in edges {
        open += d;
        peak = peak.max(open);
    }
    assert!(
        peak <= 2,
        "{peak} commands ran at once with --limit 2: {runs:#?}"
    );
    assert_eq!(
        peak, 2,
        "--limit 2 never ran two commands at once: {runs:#?}"
    );
    runs.sort_by_key(|r| r.start);
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for r in &runs {
        assert!(r.slot < 2, "{r:?}");
        assert_eq!(r.key, format!("{key}.lease--permit.{}", r.slot), "{r:?}");
        assert_eq!(
            (r.limit.as_str(), r.semaphore.as_str()),
            ("2", key.as_str())
        );
        if let Some(prev) = last.insert(r.slot, r.token) {
            assert!(
                r.token > prev,
                "slot {}: token {} after {prev}",
                r.slot,
                r.token
            );
        }
    }
}

#[test]
fn limit_runs_at_most_n_commands_at_once_sqlite() {
    let (_dir, url) = sqlite();
    at_most_limit_at_once(&url);
}

#[test]
fn limit_runs_at_most_n_commands_at_once_postgres() {
    if let Some(url) = postgres() {
        at_most_limit_at_once(&url);
    }
}

/// With the one permit of `--limit 1` held, another `--limit 1 -n` is not acquired (75, or the
/// `-E` status) and names the holder; `--limit 2` gets the second slot. Out-of-range limits are
/// usage errors (64) before anything is connected.
#[test]
fn full_limit_is_not_acquired_and_bad_limits_are_usage_errors() {
    let (dir, url) = sqlite();
    let key = unique_key("full");
    let ready = dir.path().join("ready");
    let script = format!("touch {}; sleep 30", ready.display());
    let mut holder = lease()
        .args([
            "run", "--store", &url, "--key", &key, "--limit", "1", "--", "sh", "-c", &script,
        ])
        .spawn()
        .expect("spawn lease run");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the first run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = lease()
        .args([
            "run", "--store", &url, "--key", &key, "--limit", "1", "-n", "--", "true",
        ])
        .output()
        .expect("run lease");
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("no permit of") && text.contains("held by"),
        "{text}"
    );
    let out = lease()
        .args(["status", "--store", &url, "--limit", "2", "--json", &key])
        .output()
        .expect("run lease");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["key"], format!("{key}.lease--permit.0"));
    assert_eq!(
        (lines[0]["held"].as_bool(), lines[1]["held"].as_bool()),
        (Some(true), Some(false))
    );
    let out = lease()
        .args([
            "run", "--store", &url, "--key", &key, "--limit", "1", "-n", "-E", "0", "--", "false",
        ])
        .output()
        .expect("run lease");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = lease()
        .args([
            "run",
            "--store",
            &url,
            "--key",
            &key,
            "--limit",
            "2",
            "-n",
            "--",
            "sh",
            "-c",
            "test \"$LEASE_SLOT\" = 1",
        ])
        .output()
        .expect("run lease");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for bad in ["0", "1025", "-1", "many", "4294967296"] {
        let out = lease()
            .args([
                "run", "--store", &url, "--key", &key, "--limit", bad, "--", "true",
            ])
            .output()
            .expect("run lease");
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "--limit {bad}: {}",
            stderr(&out)
        );
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(holder.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    );
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
}
