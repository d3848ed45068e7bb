//! Runs every example against every backend it names: the demo and the election on the memory
//! store, SQLite and each networked backend; the fenced transaction on PostgreSQL; the controller
//! on Kubernetes. A networked backend that is unreachable fails under `CI` /
//! `LEASE_TEST_REQUIRE` (the binaries report the connection error) and is reported otherwise.

use std::collections::BTreeMap;
use std::process::Command;

fn run(bin: &str, store: &str, extra: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(bin);
    cmd.arg("--store")
        .arg(store)
        .args(extra)
        .env("RUST_BACKTRACE", "0");
    let out = cmd.output().expect("run example");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn stores() -> Vec<(&'static str, Option<String>)> {
    let tmp = std::env::temp_dir().join(format!("leasehold-examples-{}.db", std::process::id()));
    vec![
        ("memory", Some("memory:".to_string())),
        ("sqlite", Some(format!("sqlite://{}", tmp.display()))),
        ("postgres", std::env::var("LEASE_POSTGRES_URL").ok()),
        ("redis", std::env::var("LEASE_REDIS_URL").ok()),
        (
            "etcd",
            std::env::var("LEASE_ETCD_ENDPOINTS").ok().map(|e| {
                let hosts: Vec<String> = e
                    .split(',')
                    .map(|h| h.trim_start_matches("http://").to_string())
                    .collect();
                format!("etcd://{}", hosts.join(","))
            }),
        ),
        (
            "k8s",
            std::env::var("KUBECONFIG")
                .ok()
                .map(|_| "k8s://default".to_string()),
        ),
    ]
}

/// Whether a missing service must fail the run: `CI` is `true`/`1` or `LEASE_TEST_REQUIRE` is `1`
/// (the project's rule, as `leasehold_testkit::require_services`; the examples depend on `lease` only).
fn require_services() -> bool {
    let set = |name: &str| {
        std::env::var(name)
            .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
            .unwrap_or(false)
    };
    set("CI") || set("LEASE_TEST_REQUIRE")
}

fn check(bin: &str, expect: &str) {
    let require = require_services();
    let mut ran = 0;
    for (name, url) in stores() {
        let Some(url) = url else {
            assert!(
                !require,
                "{name}: its address variable is not set, but services are required"
            );
            eprintln!("{name}: not configured, skipped (set its address variable to run it)");
            continue;
        };
        if leasehold::StoreUrl::parse(&url)
            .map(|u| !u.is_enabled())
            .unwrap_or(true)
        {
            assert!(
                !require,
                "{name}: backend feature off in this build, but services are required (run with --all-features)"
            );
            eprintln!("{name}: backend feature off in this build");
            continue;
        }
        let started = std::time::Instant::now();
        let (ok, out) = run(bin, &url, &[]);
        assert!(
            ok && out.contains(expect),
            "{bin} --store {url} failed:\n{out}"
        );
        eprintln!("{name}: ok in {:?}", started.elapsed());
        ran += 1;
    }
    assert!(ran >= 2, "{bin} ran against fewer than two stores");
}

#[test]
fn demo_rejects_the_paused_replicas_write_on_every_store() {
    check(env!("CARGO_BIN_EXE_demo"), "the stale write was REJECTED");
}

#[test]
fn election_rejects_the_frozen_leaders_write_on_every_store() {
    check(
        env!("CARGO_BIN_EXE_election"),
        "a frozen leader's late write was rejected",
    );
}

#[test]
fn fenced_transaction_on_postgres() {
    let Some(bin) = option_env!("CARGO_BIN_EXE_fenced-transaction") else {
        assert!(
            !require_services(),
            "built without the postgres feature, but services are required (run with --all-features)"
        );
        eprintln!("built without the postgres feature");
        return;
    };
    let url = std::env::var("LEASE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (ok, out) = run(bin, &url, &[]);
    if !ok && !require_services() && out.contains("nreachable") {
        eprintln!("postgres unavailable: {out}");
        return;
    }
    assert!(ok && out.contains("LeaseLost, nothing written"), "{out}");
}

#[test]
fn k8s_controller_elects_reconciles_and_resigns() {
    let Some(bin) = option_env!("CARGO_BIN_EXE_k8s-controller") else {
        assert!(
            !require_services(),
            "built without the k8s feature, but services are required (run with --all-features)"
        );
        eprintln!("built without the k8s feature");
        return;
    };
    if std::env::var("KUBECONFIG").is_err() {
        assert!(
            !require_services(),
            "KUBECONFIG is not set, but services are required"
        );
        return;
    }
    let name = format!("example-controller-{}", std::process::id());
    let out = Command::new(bin)
        .args(["--store", "k8s://default", "--rounds", "2"])
        .env("LEASE_ELECTION", &name)
        .output()
        .expect("run controller");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.matches("reconciled with term").count(), 2, "{text}");
    assert!(
        text.contains("accepted") && text.contains("resigned"),
        "{text}"
    );
}

/// Runs `bin args` and returns (success, stdout + stderr), killing it after `limit` (its worker
/// processes then see their stdin close and leave).
fn run_bounded(bin: &str, args: &[&str], limit: std::time::Duration) -> (bool, String) {
    let child = Command::new(bin)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run example");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => {
            let out = out.expect("wait for example");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), text)
        }
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{bin} {args:?} did not finish within {limit:?}");
        }
    }
}

/// The number after `key=` in `line`.
fn field(line: &str, key: &str) -> i64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
        .parse()
        .unwrap_or_else(|e| panic!("{key} in {line}: {e}"))
}

/// 16 shards over 3 worker processes on SQLite with a 2 s TTL and `leasehold-otel` shard metrics:
/// the example itself waits (bounded by 30 TTLs per phase) until every shard is owned by a live
/// worker within one of its fair share, after the start, after killing `w2` and after adding
/// `w4`, and fails otherwise. Here: it succeeded, the new worker took shards, and the metrics
/// printed by each worker that left (not the killed one) are consistent with that, with no lease
/// lost by a live worker. (At a 1 s TTL one run lost 11 leases to renewals starved while a
/// release benchmark and a build shared the 2 cores: the renewal runs every 333 ms and gives up
/// 100 ms before the deadline. 2 s keeps the check for lost leases without testing the host.)
#[test]
fn shards_survive_a_kill_and_share_with_a_new_worker_on_sqlite() {
    let dir =
        std::env::temp_dir().join(format!("leasehold-examples-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let url = format!("sqlite://{}", dir.join("shards.db").display());
    let (ok, out) = run_bounded(
        env!("CARGO_BIN_EXE_shards"),
        &[
            "--store",
            &url,
            "--shards",
            "16",
            "--workers",
            "3",
            "--ttl-ms",
            "2000",
            "--metrics",
        ],
        std::time::Duration::from_secs(150),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "shards failed:\n{out}");
    assert!(
        out.contains("every shard owned and balanced") && out.contains("after the kill"),
        "{out}"
    );
    let joined = out
        .lines()
        .find(|l| l.starts_with("w4 joined:"))
        .unwrap_or_else(|| panic!("no join line:\n{out}"));
    // "w4 joined: M shard(s) moved, N of them to w4 (...)"
    let to_new: i64 = joined
        .split(", ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unparsable: {joined}"));
    assert!(to_new >= 1, "the new worker got no shard:\n{out}");

    let metrics: BTreeMap<&str, &str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("metrics "))
        .filter_map(|l| l.split_once(": "))
        .collect();
    assert_eq!(
        metrics.keys().copied().collect::<Vec<_>>(),
        ["w1", "w3", "w4"],
        "one metrics line per worker that left (the killed w2 prints none):\n{out}"
    );
    for (w, line) in &metrics {
        assert_eq!(field(line, "owned"), 0, "{w} left owning shards: {line}");
        assert_eq!(field(line, "moves.lost"), 0, "{w} lost a lease: {line}");
    }
    assert!(
        field(metrics["w4"], "steals") >= to_new,
        "w4's steal requests < shards it took:\n{out}"
    );
    let handoffs = field(metrics["w1"], "moves.handoff") + field(metrics["w3"], "moves.handoff");
    assert!(
        handoffs >= to_new,
        "fewer handoffs than shards moved to w4:\n{out}"
    );
    // Everything w4 held, it released when leaving.
    assert!(field(metrics["w4"], "moves.leaving") >= to_new, "{out}");
}
