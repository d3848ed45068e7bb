//! The environment of the `lease` command: `LEASE_STORE` shown in `--help`, `RUST_LOG` honoured
//! beside `LEASE_LOG`, and a closed stdout that ends output quietly instead of a panic.

use std::process::{Command, Output, Stdio};

fn lease() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    cmd.env_remove("LEASE_STORE")
        .env_remove("LEASE_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    cmd
}

fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("leases.db").display());
    (dir, url)
}

fn no_panic(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "lease panicked: {stderr}");
    assert_ne!(out.status.code(), Some(101), "lease panicked: {stderr}");
    stderr
}

/// Every command that takes `--store` names `LEASE_STORE` as its environment variable in
/// `--help`, without showing its value (a URL may hold a password).
#[test]
fn help_names_lease_store_without_its_value() {
    for sub in ["run", "status", "elect", "shards"] {
        let out = lease()
            .env("LEASE_STORE", "postgres://user:hunter2@db/leases")
            .args([sub, "--help"])
            .output()
            .expect("lease --help");
        assert!(out.status.success(), "{sub} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("[env: LEASE_STORE"), "{sub} --help: {help}");
        assert!(
            !help.contains("hunter2"),
            "{sub} --help shows the URL: {help}"
        );
    }
}

/// `RUST_LOG` turns the logs on like `LEASE_LOG` (which wins when both are set).
#[test]
fn rust_log_is_honoured_beside_lease_log() {
    let (_dir, url) = sqlite();
    let logs = |var: &str| {
        let out = lease()
            .env(var, "trace")
            .args(["status", "--store", &url, "k"])
            .output()
            .expect("lease status");
        assert!(out.status.success(), "{var}");
        no_panic(&out)
    };
    // The control: LEASE_LOG=trace logs something on this command.
    assert!(
        !logs("LEASE_LOG").trim().is_empty(),
        "no logs with LEASE_LOG"
    );
    assert!(!logs("RUST_LOG").trim().is_empty(), "no logs with RUST_LOG");
    let out = lease()
        .env("RUST_LOG", "trace")
        .env("LEASE_LOG", "off")
        .args(["status", "--store", &url, "k"])
        .output()
        .expect("lease status");
    assert!(no_panic(&out).trim().is_empty(), "LEASE_LOG=off must win");
}

/// Output into a pipe nobody reads any more (`lease status ... | head -c0`): no panic, status 0.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let (_dir, url) = sqlite();
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = lease()
        .args(["status", "--store", &url, "a", "b", "c"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("lease status");
    no_panic(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
