//! Runs every example against every backend it names: the demo and the election on the memory
//! store, SQLite and each networked backend; the fenced transaction on PostgreSQL; the controller
//! on Kubernetes. A networked backend that is unreachable fails under `CI` /
//! `LEASE_TEST_REQUIRE` (the binaries report the connection error) and is reported otherwise.

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
    let tmp = std::env::temp_dir().join(format!("lease-examples-{}.db", std::process::id()));
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

fn check(bin: &str, expect: &str) {
    let require = lease_testkit::require_services();
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
        if lease::StoreUrl::parse(&url)
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
            !lease_testkit::require_services(),
            "built without the postgres feature, but services are required (run with --all-features)"
        );
        eprintln!("built without the postgres feature");
        return;
    };
    let url = std::env::var("LEASE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let (ok, out) = run(bin, &url, &[]);
    if !ok && !lease_testkit::require_services() && out.contains("nreachable") {
        eprintln!("postgres unavailable: {out}");
        return;
    }
    assert!(ok && out.contains("LeaseLost, nothing written"), "{out}");
}

#[test]
fn k8s_controller_elects_reconciles_and_resigns() {
    let Some(bin) = option_env!("CARGO_BIN_EXE_k8s-controller") else {
        assert!(
            !lease_testkit::require_services(),
            "built without the k8s feature, but services are required (run with --all-features)"
        );
        eprintln!("built without the k8s feature");
        return;
    };
    if std::env::var("KUBECONFIG").is_err() {
        assert!(
            !lease_testkit::require_services(),
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
