//! Runs the real `lease` binary against SQLite (a temporary file), Redis (`LEASE_REDIS_URL`),
//! PostgreSQL (`LEASE_POSTGRES_URL`), etcd (`LEASE_ETCD_ENDPOINTS`) and Kubernetes (`KUBECONFIG`),
//! their defaults from leasehold-testkit's test store table (`leasehold_testkit::stores`).
//!
//! Redis and PostgreSQL cases follow the project's skip rule: when Redis is unreachable they print a warning and
//! pass, except under `CI=true` / `LEASE_TEST_REQUIRE=1`, where they fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_testkit::stores::{ETCD, K8S, POSTGRES_URL, REDIS_URL};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const NOT_ACQUIRED: i32 = 75;
const LOST: i32 = 76;
const CONFIG: i32 = 78;
const USAGE: i32 = 64;
const NOT_FOUND: i32 = 127;

fn lease() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    cmd.env_remove("LEASE_STORE").env_remove("LEASE_LOG");
    cmd
}

/// A key no other test (or earlier run) uses.
fn unique_key(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("cli-{name}-{}-{nanos}", std::process::id())
}

struct Sqlite {
    _dir: tempfile::TempDir,
    url: String,
}

fn sqlite() -> Sqlite {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("leases.db").display());
    Sqlite { _dir: dir, url }
}

/// The Redis URL, or `None` (after a warning) when Redis is unreachable outside CI.
fn redis() -> Option<String> {
    service("Redis", REDIS_URL.name, &REDIS_URL.get())
}

/// The PostgreSQL URL, or `None` (after a warning) when PostgreSQL is unreachable outside CI.
fn postgres() -> Option<String> {
    service("PostgreSQL", POSTGRES_URL.name, &POSTGRES_URL.get())
}

/// The etcd URL built from `LEASE_ETCD_ENDPOINTS` (default in leasehold-testkit's test store
/// table), or `None`.
fn etcd() -> Option<String> {
    service(
        "etcd",
        "LEASE_CLI_ETCD_URL",
        &ETCD.store_url().unwrap_or_default(),
    )
}

/// The Kubernetes URL for `LEASE_K8S_NAMESPACE` (default `default`) with the ambient
/// kubeconfig (`KUBECONFIG`), or `None`.
fn k8s() -> Option<String> {
    service(
        "Kubernetes",
        "LEASE_CLI_K8S_URL",
        &K8S.store_url().unwrap_or_default(),
    )
}

/// The URL from `env` (or `default`) if `lease status` can use it; otherwise a warning and
/// `None`, or a panic under `CI=true` / `LEASE_TEST_REQUIRE=1`.
fn service(name: &str, env: &str, default: &str) -> Option<String> {
    let url = std::env::var(env)
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| default.to_string());
    let out = lease()
        .args(["status", "--store", &url, "cli-probe"])
        .output()
        .expect("run lease status");
    if out.status.success() {
        return Some(url);
    }
    let why = String::from_utf8_lossy(&out.stderr);
    if leasehold_testkit::require_services() {
        panic!("{name} at {url} is required (CI or LEASE_TEST_REQUIRE) but unavailable: {why}");
    }
    eprintln!(
        "WARNING: {name} at {url} unavailable, skipping (set LEASE_TEST_REQUIRE=1 to fail): {why}"
    );
    None
}

fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run lease")
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or_else(|| {
        panic!(
            "lease was killed: {:?}; stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits for `child` to exit, at most `limit`.
fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
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

/// Polls `check` until it is true, at most `limit`.
fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_held(store: &str, key: &str) -> bool {
    let out = output(lease().args(["status", "--json", "--store", store, key]));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("status --json prints JSON");
    v["held"].as_bool().expect("held is a bool")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Exit statuses

#[test]
fn child_status_passes_through() {
    let s = sqlite();
    let key = unique_key("status");
    let out = output(lease().args([
        "run", "--store", &s.url, "--key", &key, "--", "sh", "-c", "exit 3",
    ]));
    assert_eq!(code(&out), 3);
    let out = output(lease().args(["run", "--store", &s.url, "--key", &key, "--", "true"]));
    assert_eq!(code(&out), 0);
    // Killed by a signal: 128 + N.
    let out = output(lease().args([
        "run",
        "--store",
        &s.url,
        "--key",
        &key,
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]));
    assert_eq!(code(&out), 128 + 15);
    // The lease was released after each run.
    assert!(!is_held(&s.url, &key));
}

#[test]
fn command_not_found_is_127_and_releases() {
    let s = sqlite();
    let key = unique_key("nf");
    let out = output(lease().args([
        "run",
        "--store",
        &s.url,
        "--key",
        &key,
        "--",
        "/nonexistent/command",
    ]));
    assert_eq!(code(&out), NOT_FOUND);
    assert!(!is_held(&s.url, &key));
}

#[test]
fn child_gets_key_owner_and_token() {
    let s = sqlite();
    let key = unique_key("env");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("env");
    let script = format!(
        "echo \"$LEASE_KEY $LEASE_OWNER $LEASE_FENCING_TOKEN\" > {}",
        file.display()
    );
    for _ in 0..2 {
        let out = output(lease().args([
            "run", "--store", &s.url, "--key", &key, "--label", "tester", "--", "sh", "-c", &script,
        ]));
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    }
    let text = read(&file);
    let parts: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(parts.len(), 3, "{text:?}");
    assert_eq!(parts[0], key);
    assert!(parts[1].starts_with("tester-"), "{text:?}");
    let token: u64 = parts[2].parse().expect("a numeric token");
    assert!(
        token >= 2,
        "the second run must have a later token, got {token}"
    );
}

#[test]
fn bad_input_has_documented_statuses() {
    let s = sqlite();
    let out = output(lease().args(["run", "--store", "ftp://x", "--key", "k", "--", "true"]));
    assert_eq!(code(&out), CONFIG);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown store URL scheme"));
    let out = output(lease().args(["run", "--store", &s.url, "--key", "Bad/Key", "--", "true"]));
    assert_eq!(code(&out), CONFIG);
    let out = output(lease().args(["status", "--store", &s.url, "Bad/Key"]));
    assert_eq!(code(&out), CONFIG);
    // An unreachable store: 69 (retry later).
    let out = output(lease().args(["status", "--store", "redis://127.0.0.1:1", "k"]));
    assert_eq!(code(&out), 69, "{}", String::from_utf8_lossy(&out.stderr));
    // Missing command, unparsable duration: usage errors.
    let out = output(lease().args(["run", "--store", &s.url, "--key", "k"]));
    assert_eq!(code(&out), USAGE);
    let out = output(lease().args(["run", "--key", "k", "--ttl", "soon", "--", "true"]));
    assert_eq!(code(&out), USAGE);
    let out = output(lease().args([
        "run",
        "--key",
        "k",
        "--wait",
        "1s",
        "--no-wait",
        "--",
        "true",
    ]));
    assert_eq!(code(&out), USAGE);
}

#[test]
fn default_store_is_sqlite_under_the_state_dir() {
    let state = tempfile::tempdir().expect("temp dir");
    let key = unique_key("default");
    let out = output(lease().env("XDG_STATE_HOME", state.path()).args([
        "run",
        "--key",
        &key,
        "--",
        "sh",
        "-c",
        "echo \"$LEASE_STORE\"",
    ]));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let db = state.path().join("lease").join("leases.db");
    assert!(db.is_file(), "{} was not created", db.display());
    assert!(String::from_utf8_lossy(&out.stdout).contains("leases.db"));
    // LEASE_STORE overrides the default.
    let s = sqlite();
    let out = output(
        lease()
            .env("LEASE_STORE", &s.url)
            .args(["status", "--json", &key]),
    );
    assert_eq!(code(&out), 0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        v["last_token"].is_null(),
        "a fresh store knows no token: {v}"
    );
}

#[test]
fn status_shows_holder_token_and_time_left() {
    let s = sqlite();
    let key = unique_key("show");
    let free = unique_key("free");
    let mut holder = lease()
        .args([
            "run", "--store", &s.url, "--key", &key, "--ttl", "2s", "--label", "shower", "--",
            "sleep", "30",
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn holder");
    wait_until("the holder to acquire", Duration::from_secs(20), || {
        is_held(&s.url, &key)
    });
    let out = output(lease().args(["status", "--json", "--store", &s.url, &key, &free]));
    assert_eq!(code(&out), 0);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["key"], key.as_str());
    assert!(
        lines[0]["owner"]
            .as_str()
            .is_some_and(|o| o.starts_with("shower-"))
    );
    assert!(lines[0]["token"].as_u64().is_some_and(|t| t >= 1));
    let left = lines[0]["remaining_ms"].as_u64().expect("remaining_ms");
    assert!(left > 0 && left <= 2000, "{left}");
    assert_eq!(lines[0]["ttl_ms"], 2000);
    assert_eq!(lines[1]["held"], false);
    let text = output(lease().args(["status", "--store", &s.url, &key]));
    assert!(String::from_utf8_lossy(&text.stdout).contains("held by shower-"));
    kill(
        Pid::from_raw(i32::try_from(holder.id()).expect("pid")),
        Signal::SIGINT,
    )
    .expect("SIGINT");
    let status = wait_exit(&mut holder, Duration::from_secs(20));
    assert_eq!(
        status.code(),
        Some(128 + 2),
        "SIGINT is forwarded: {status:?}"
    );
}

/// A held key: `--no-wait` and a short `--wait` give 75; SIGTERM to the holder's `lease run`
/// is forwarded to its command (128 + 15).
fn not_acquired_then_forwarded_signal(store: &str) {
    let key = unique_key("held");
    let mut holder = lease()
        .args([
            "run", "--store", store, "--key", &key, "--ttl", "2s", "--", "sleep", "30",
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn holder");
    wait_until("the holder to acquire", Duration::from_secs(20), || {
        is_held(store, &key)
    });

    let out = output(lease().args([
        "run",
        "--store",
        store,
        "--key",
        &key,
        "--no-wait",
        "--",
        "true",
    ]));
    assert_eq!(
        code(&out),
        NOT_ACQUIRED,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("held by"));
    let started = Instant::now();
    let out = output(lease().args([
        "run", "--store", store, "--key", &key, "--wait", "700ms", "--", "true",
    ]));
    assert_eq!(code(&out), NOT_ACQUIRED);
    assert!(started.elapsed() >= Duration::from_millis(700));

    let status = lease()
        .args(["status", "--store", store, &key])
        .output()
        .expect("status");
    assert!(String::from_utf8_lossy(&status.stdout).contains("held by"));

    let pid = Pid::from_raw(i32::try_from(holder.id()).expect("pid"));
    kill(pid, Signal::SIGTERM).expect("signal the holder");
    let status = wait_exit(&mut holder, Duration::from_secs(20));
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(!is_held(store, &key), "released after the command ended");
}

#[test]
fn not_acquired_and_signal_forwarding_sqlite() {
    let s = sqlite();
    not_acquired_then_forwarded_signal(&s.url);
}

#[test]
fn not_acquired_and_signal_forwarding_redis() {
    if let Some(url) = redis() {
        not_acquired_then_forwarded_signal(&url);
    }
}

#[test]
fn not_acquired_and_signal_forwarding_etcd() {
    if let Some(url) = etcd() {
        not_acquired_then_forwarded_signal(&url);
    }
}

#[test]
fn not_acquired_and_signal_forwarding_k8s() {
    if let Some(url) = k8s() {
        not_acquired_then_forwarded_signal(&url);
    }
}

// ---------------------------------------------------------------------------------------------
// Mutual exclusion across processes

/// Several `lease run` processes on one key, each child logging start and end with its token:
/// the intervals never overlap and tokens increase in order.
fn never_overlap(store: &str) {
    let key = unique_key("excl");
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("log");
    let script = format!(
        "echo \"start $LEASE_FENCING_TOKEN $(date +%s%N)\" >> {log}; sleep 0.2; \
         echo \"end $LEASE_FENCING_TOKEN $(date +%s%N)\" >> {log}",
        log = log.display()
    );
    let runners = 4;
    let mut children: Vec<Child> = (0..runners)
        .map(|_| {
            lease()
                .args([
                    "run", "--store", store, "--key", &key, "--ttl", "2s", "--wait", "60s", "--",
                    "sh", "-c", &script,
                ])
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn lease run")
        })
        .collect();
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(90));
        assert_eq!(status.code(), Some(0), "{status:?}");
    }
    let text = read(&log);
    let mut events: Vec<(u128, &str, u64)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "bad line {l:?}");
            (
                f[2].parse().expect("time"),
                f[0],
                f[1].parse().expect("token"),
            )
        })
        .collect();
    assert_eq!(events.len(), 2 * runners, "{text}");
    events.sort_by_key(|e| (e.0, e.1 == "start"));
    let mut last_token = 0;
    for pair in events.chunks(2) {
        let (start, end) = (pair[0], pair[1]);
        assert_eq!(start.1, "start", "overlap in {text}");
        assert_eq!(end.1, "end", "overlap in {text}");
        assert_eq!(start.2, end.2, "interleaved runs in {text}");
        assert!(start.2 > last_token, "tokens must increase: {text}");
        last_token = start.2;
    }
}

#[test]
fn runs_never_overlap_sqlite() {
    let s = sqlite();
    never_overlap(&s.url);
}

#[test]
fn runs_never_overlap_redis() {
    if let Some(url) = redis() {
        never_overlap(&url);
    }
}

#[test]
fn runs_never_overlap_postgres() {
    if let Some(url) = postgres() {
        never_overlap(&url);
    }
}

// ---------------------------------------------------------------------------------------------
// A paused `lease run` loses its lease; its command is stopped

fn paused_runner_stops_its_command(store: &str) {
    let key = unique_key("pause");
    let dir = tempfile::tempdir().expect("temp dir");
    let pidfile: PathBuf = dir.path().join("pid");
    let log = dir.path().join("log");
    let script = format!(
        "echo $$ > {pid}; echo start >> {log}; sleep 30; echo end >> {log}",
        pid = pidfile.display(),
        log = log.display()
    );
    let mut runner = lease()
        .args([
            "run", "--store", store, "--key", &key, "--ttl", "1s", "--", "sh", "-c", &script,
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn lease run");
    wait_until("the command to start", Duration::from_secs(20), || {
        read(&pidfile).trim().parse::<i32>().is_ok()
    });
    let child = Pid::from_raw(read(&pidfile).trim().parse().expect("pid"));
    let runner_pid = Pid::from_raw(i32::try_from(runner.id()).expect("pid"));

    kill(runner_pid, Signal::SIGSTOP).expect("SIGSTOP");
    // While it is paused, the lease expires: another runner gets the key (bounded wait).
    let out = output(lease().args([
        "run", "--store", store, "--key", &key, "--ttl", "1s", "--wait", "20s", "--", "true",
    ]));
    let took_over = code(&out);
    kill(runner_pid, Signal::SIGCONT).expect("SIGCONT");
    assert_eq!(took_over, 0, "{}", String::from_utf8_lossy(&out.stderr));

    let status = wait_exit(&mut runner, Duration::from_secs(20));
    assert_eq!(status.code(), Some(LOST), "{status:?}");
    // The command (and its `sleep`) is gone and never finished its work.
    assert!(
        kill(child, None).is_err(),
        "the command {child} still runs after the lease was lost"
    );
    assert_eq!(read(&log).trim(), "start");
}

#[test]
fn paused_runner_stops_its_command_sqlite() {
    let s = sqlite();
    paused_runner_stops_its_command(&s.url);
}

#[test]
fn paused_runner_stops_its_command_redis() {
    if let Some(url) = redis() {
        paused_runner_stops_its_command(&url);
    }
}

#[test]
fn paused_runner_stops_its_command_postgres() {
    if let Some(url) = postgres() {
        paused_runner_stops_its_command(&url);
    }
}

// ---------------------------------------------------------------------------------------------
// Elections

#[test]
fn elect_prints_json_leadership_changes() {
    let s = sqlite();
    let name = unique_key("elect");
    let limit = Duration::from_secs(20);
    let mut a = lease()
        .args([
            "elect", "--store", &s.url, "--name", &name, "--ttl", "1s", "--json", "--label", "a",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn elect");
    let mut lines = Lines::of(&mut a);
    let elected = lines.wait_for("elected", limit, |e| e["event"] == "elected");
    assert!(elected["term"].as_u64().is_some_and(|t| t > 0));
    assert!(
        elected["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("a-"))
    );
    assert_eq!(elected["name"], name.as_str());
    assert!(is_held(&s.url, &name));
    kill(
        Pid::from_raw(i32::try_from(a.id()).expect("pid")),
        Signal::SIGTERM,
    )
    .expect("SIGTERM");
    assert_eq!(wait_exit(&mut a, limit).code(), Some(0));
    lines.wait_for("resigned", limit, |e| e["event"] == "resigned");
    assert_eq!(
        lines.seen.first().map(|e| e["event"].clone()),
        Some("joined".into())
    );
    assert!(!is_held(&s.url, &name), "resigning releases the lease");
}

/// Reads a child's JSON lines on a thread, so a test can wait for a specific event.
struct Lines {
    rx: std::sync::mpsc::Receiver<serde_json::Value>,
    seen: Vec<serde_json::Value>,
}

impl Lines {
    fn of(child: &mut Child) -> Self {
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let Ok(line) = line else { break };
                let v = serde_json::from_str(&line).expect("a JSON line");
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits (at most `limit`) for an event matching `pred` and returns it.
    fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        if let Some(v) = self.seen.iter().find(|v| pred(v)) {
            return v.clone();
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {what} within {limit:?}; saw {:?}", self.seen));
            self.seen.push(v.clone());
            if pred(&v) {
                return v;
            }
        }
    }
}

#[test]
fn elect_hands_over_with_a_greater_term() {
    let s = sqlite();
    let name = unique_key("failover");
    let candidate = |label: &str| {
        lease()
            .args([
                "elect", "--store", &s.url, "--name", &name, "--ttl", "1s", "--json", "--label",
                label,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn elect")
    };
    let limit = Duration::from_secs(20);
    let mut a = candidate("a");
    let mut a_lines = Lines::of(&mut a);
    let a_term = a_lines.wait_for("a elected", limit, |e| e["event"] == "elected")["term"]
        .as_u64()
        .expect("term");
    let mut b = candidate("b");
    let mut b_lines = Lines::of(&mut b);
    // b sees a lead, then a resigns (releasing), and b is elected with a greater term.
    let seen = b_lines.wait_for("b to see a lead", limit, |e| {
        e["event"] == "leader" && e["leader"].as_str().is_some_and(|l| l.starts_with("a-"))
    });
    assert_eq!(seen["term"].as_u64(), Some(a_term));
    let pid = |c: &Child| Pid::from_raw(i32::try_from(c.id()).expect("pid"));
    kill(pid(&a), Signal::SIGTERM).expect("SIGTERM a");
    assert_eq!(wait_exit(&mut a, limit).code(), Some(0));
    a_lines.wait_for("a resigned", limit, |e| e["event"] == "resigned");
    let b_term = b_lines.wait_for("b elected", limit, |e| e["event"] == "elected")["term"]
        .as_u64()
        .expect("term");
    assert!(
        b_term > a_term,
        "terms must increase: a {a_term}, b {b_term}"
    );
    kill(pid(&b), Signal::SIGTERM).expect("SIGTERM b");
    assert_eq!(wait_exit(&mut b, limit).code(), Some(0));
    b_lines.wait_for("b resigned", limit, |e| e["event"] == "resigned");
}

// ---------------------------------------------------------------------------------------------
// Durations: out-of-range values are usage errors, never a panic

const HUGE: &str = "3000000000000000h";

/// `lease run` with one duration flag set to `value`; `sh -c true` as the command.
fn run_with(store: &str, flag: &str, value: &str) -> Output {
    output(lease().args([
        "run",
        "--store",
        store,
        "--key",
        &unique_key("dur"),
        flag,
        value,
        "--",
        "true",
    ]))
}

/// The status, failing the test (instead of reading garbage) when `lease` panicked.
fn no_panic(out: &Output, what: &str) -> i32 {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "{what}: lease panicked: {stderr}"
    );
    let status = code(out);
    assert_ne!(status, 101, "{what}: lease panicked: {stderr}");
    status
}

#[test]
fn huge_durations_are_usage_errors_not_panics() {
    let s = sqlite();
    for flag in ["--ttl", "--wait", "--grace"] {
        let out = run_with(&s.url, flag, HUGE);
        let what = format!("run {flag} {HUGE}");
        assert_eq!(no_panic(&out, &what), USAGE, "{what}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(flag) && stderr.contains("at most"),
            "{what}: the message names the flag and its range: {stderr}"
        );
    }
    let out = output(lease().args(["elect", "--store", &s.url, "--name", "dur", "--ttl", HUGE]));
    assert_eq!(no_panic(&out, "elect --ttl huge"), USAGE);
    // Just above each maximum is refused; the maximum itself parses (ttl: 24h, wait: 168h).
    assert_eq!(no_panic(&run_with(&s.url, "--ttl", "24h1ms"), "ttl"), USAGE);
    assert_eq!(
        no_panic(&run_with(&s.url, "--wait", "168h1ms"), "wait"),
        USAGE
    );
    let out = run_with(&s.url, "--wait", "168h");
    assert_eq!(
        no_panic(&out, "wait 168h"),
        0,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn zero_durations_are_refused_or_mean_at_once() {
    let s = sqlite();
    // A zero TTL is refused before any store is touched.
    let out = run_with("redis://127.0.0.1:1", "--ttl", "0");
    assert_eq!(no_panic(&out, "run --ttl 0"), USAGE);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ttl"));
    let out = run_with(&s.url, "--ttl", "0ms");
    assert_eq!(no_panic(&out, "run --ttl 0ms"), USAGE);
    let out = output(lease().args(["elect", "--store", &s.url, "--name", "dur", "--ttl", "0"]));
    assert_eq!(no_panic(&out, "elect --ttl 0"), USAGE);
    // A zero wait is one attempt; a zero grace is SIGKILL right after SIGTERM.
    for flag in ["--wait", "--grace"] {
        let out = run_with(&s.url, flag, "0");
        assert_eq!(
            no_panic(&out, flag),
            0,
            "{flag} 0: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The command never outlives the lease

#[test]
fn a_grace_that_cannot_fit_before_the_deadline_is_refused() {
    let s = sqlite();
    // The loss lead is a tenth of the TTL (3 s at 30 s); the grace may use half of it.
    let out = output(lease().args([
        "run", "--store", &s.url, "--key", "fit", "--ttl", "30s", "--grace", "10s", "--", "true",
    ]));
    assert_eq!(no_panic(&out, "grace 10s"), USAGE);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--grace") && stderr.contains("1.5s"),
        "{stderr}"
    );
    let out = output(lease().args([
        "run", "--store", &s.url, "--key", "fit", "--ttl", "30s", "--grace", "1500ms", "--", "true",
    ]));
    assert_eq!(
        no_panic(&out, "grace 1.5s"),
        0,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `host:port` and the rest of a `redis://host:port/db` URL.
fn split_redis(url: &str) -> (std::net::SocketAddr, String) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr = std::net::ToSocketAddrs::to_socket_addrs(hostport)
        .expect("resolve the Redis address")
        .next()
        .expect("an address");
    (addr, path.to_string())
}

/// Nanoseconds since the epoch (the clock `date +%s%N` reads in the command).
fn epoch_nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).expect("after 1970").as_nanos()
}

/// The command traps SIGTERM (`trap '' TERM`, inherited by its `sleep`) and writes a timestamp
/// every 50 ms. The store becomes unreachable (a silent partition through a fault proxy).
/// With the default grace, the command must be killed before the lease's local deadline: no
/// timestamp may be written at or after it. The local deadline is at most the instant the
/// partition started plus the TTL (no renewal sent later can have been confirmed).
#[test]
fn command_ignoring_sigterm_dies_before_the_local_deadline_redis() {
    let Some(url) = redis() else { return };
    let (upstream, path) = split_redis(&url);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let proxy = rt
        .block_on(leasehold_faults::proxy::FaultProxy::start(upstream))
        .expect("start the proxy");
    let store = format!("redis://127.0.0.1:{}/{path}", proxy.port());
    let ttl = Duration::from_secs(4);
    let key = unique_key("outlive");
    let dir = tempfile::tempdir().expect("temp dir");
    let pidfile = dir.path().join("pid");
    let marker = dir.path().join("marker");
    let script = format!(
        "trap '' TERM; echo $$ > {pid}; while :; do date +%s%N >> {marker}; sleep 0.05; done",
        pid = pidfile.display(),
        marker = marker.display()
    );
    let mut runner = lease()
        .args([
            "run",
            "--store",
            &store,
            "--key",
            &key,
            "--ttl",
            "4s",
            "--accept-redis-failover",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lease run");
    wait_until("the command to write", Duration::from_secs(20), || {
        read(&marker).lines().count() >= 2 && read(&pidfile).trim().parse::<i32>().is_ok()
    });
    let child = Pid::from_raw(read(&pidfile).trim().parse().expect("pid"));
    proxy.set_mode(leasehold_faults::proxy::Mode::Blackhole);
    let partitioned = SystemTime::now();
    let deadline_bound = epoch_nanos(partitioned + ttl);

    let status = wait_exit(&mut runner, Duration::from_secs(60));
    let mut stderr = String::new();
    if let Some(mut e) = runner.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert_eq!(status.code(), Some(LOST), "{status:?}: {stderr}");
    assert!(
        kill(child, None).is_err(),
        "the command {child} still runs after `lease` exited: {stderr}"
    );
    let last: u128 = read(&marker)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .expect("timestamps");
    assert!(
        last < deadline_bound,
        "the command wrote {} ms after the lease's local deadline (at the latest): {stderr}",
        (last - deadline_bound) / 1_000_000
    );
    eprintln!(
        "the command's last write came {} ms before the latest possible local deadline",
        (deadline_bound - last) / 1_000_000
    );
    drop(proxy);
}

// ---------------------------------------------------------------------------------------------
// Redis: failover is shared by the lease and any fence kept in the same Redis

const FAILOVER_WARNING: &str = "replicates asynchronously";

#[test]
fn redis_store_warns_about_failover_unless_acknowledged() {
    let Some(url) = redis() else { return };
    let key = unique_key("failover-warn");
    let out = output(lease().args(["run", "--store", &url, "--key", &key, "--", "true"]));
    assert_eq!(code(&out), 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(FAILOVER_WARNING) && stderr.contains("--accept-redis-failover"),
        "no failover warning: {stderr}"
    );
    // Acknowledged by the flag or by the environment: silent.
    let out = output(lease().args([
        "run",
        "--store",
        &url,
        "--key",
        &key,
        "--accept-redis-failover",
        "--",
        "true",
    ]));
    assert_eq!(code(&out), 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains(FAILOVER_WARNING));
    let out = output(
        lease()
            .env("LEASE_ACCEPT_REDIS_FAILOVER", "1")
            .args(["run", "--store", &url, "--key", &key, "--", "true"]),
    );
    assert_eq!(code(&out), 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains(FAILOVER_WARNING));
    // Other stores: no warning.
    let s = sqlite();
    let out = output(lease().args(["run", "--store", &s.url, "--key", &key, "--", "true"]));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(FAILOVER_WARNING));

    // `lease elect` (its term is the fencing token) warns too.
    let mut e = lease()
        .args([
            "elect", "--store", &url, "--name", &key, "--ttl", "2s", "--json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn elect");
    let mut lines = Lines::of(&mut e);
    lines.wait_for("joined", Duration::from_secs(20), |v| {
        v["event"] == "joined"
    });
    kill(
        Pid::from_raw(i32::try_from(e.id()).expect("pid")),
        Signal::SIGTERM,
    )
    .expect("SIGTERM");
    assert_eq!(wait_exit(&mut e, Duration::from_secs(20)).code(), Some(0));
    let mut stderr = String::new();
    if let Some(mut err) = e.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
    }
    assert!(stderr.contains(FAILOVER_WARNING), "elect: {stderr}");
}

// ---------------------------------------------------------------------------------------------
// Shard sets

#[test]
fn shards_prints_json_assignments_and_hands_over_to_a_second_worker() {
    let s = sqlite();
    let name = unique_key("shards");
    let limit = Duration::from_secs(30);
    let spawn = |worker: &str| {
        lease()
            .args([
                "shards", "--store", &s.url, "--name", &name, "--shards", "8", "--ttl", "1s",
                "--worker", worker, "--json",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn shards")
    };
    let mut a = spawn("a");
    let mut a_lines = Lines::of(&mut a);
    let assigned = |lines: &Lines| {
        lines
            .seen
            .iter()
            .filter(|e| e["event"] == "assigned")
            .count()
            - lines
                .seen
                .iter()
                .filter(|e| e["event"] == "revoked")
                .count()
    };
    let more = |lines: &mut Lines| {
        let v = lines
            .rx
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("no line within {limit:?}; saw {:?}", lines.seen));
        lines.seen.push(v);
    };
    while assigned(&a_lines) < 8 {
        more(&mut a_lines);
    }
    let first = a_lines
        .seen
        .iter()
        .find(|e| e["event"] == "assigned")
        .expect("assigned")
        .clone();
    assert_eq!(first["worker"], "a");
    assert!(first["token"].as_u64().is_some_and(|t| t > 0));
    let mut b = spawn("b");
    let mut b_lines = Lines::of(&mut b);
    // b takes half by handover: a reports the revocations with the thief's name.
    while assigned(&b_lines) < 4 {
        more(&mut b_lines);
    }
    let revoked = a_lines.wait_for("a revocation", limit, |e| e["event"] == "revoked");
    assert_eq!(revoked["reason"], "handed over to b");
    for child in [&mut a, &mut b] {
        kill(
            Pid::from_raw(i32::try_from(child.id()).expect("pid")),
            Signal::SIGTERM,
        )
        .expect("SIGTERM");
        assert_eq!(wait_exit(child, limit).code(), Some(0));
    }
    b_lines.wait_for("left", limit, |e| e["event"] == "left");
}

/// Runs `sql` with psql against `url` (the PostgreSQL client is installed by the test script's
/// PostgreSQL service).
fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-XqAt", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The store URL alone chooses the table and its layout: `lease run` on the seed's
/// `coordination_lease` table, used in place, writes its grant into that table; a misspelt
/// parameter is refused with the configuration status before anything runs.
#[test]
fn run_on_the_seeds_table_chosen_in_the_url() {
    let Some(url) = postgres() else { return };
    let schema = format!("lease_cli_seed_{}", std::process::id());
    psql(
        &url,
        &format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
             CREATE TABLE {schema}.coordination_lease (resource_key text PRIMARY KEY, \
             owner_id uuid, lease_until timestamptz NOT NULL DEFAULT '-infinity', \
             fencing_token bigint NOT NULL DEFAULT 0)"
        ),
    );
    let sep = if url.contains('?') { '&' } else { '?' };
    let store = format!("{url}{sep}table={schema}.coordination_lease&layout=seed");
    let key = unique_key("seed");
    let out = output(lease().args([
        "run",
        "--store",
        &store,
        "--key",
        &key,
        "--",
        "sh",
        "-c",
        "echo \"$LEASE_FENCING_TOKEN\"",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let row = psql(
        &url,
        &format!(
            "SELECT fencing_token FROM {schema}.coordination_lease WHERE resource_key = '{key}'"
        ),
    );
    let typo = output(lease().args([
        "run",
        "--store",
        &format!("{url}{sep}tabel={schema}.coordination_lease"),
        "--key",
        &key,
        "--",
        "true",
    ]));
    psql(&url, &format!("DROP SCHEMA {schema} CASCADE"));
    assert_eq!(code(&out), 0, "lease run on the seed's table: {stderr}");
    assert!(!token.is_empty(), "no token printed: {stderr}");
    assert_eq!(row, token, "the grant is the seed table's row");
    assert_eq!(
        code(&typo),
        78,
        "a misspelt URL parameter is a configuration error"
    );
    assert!(
        String::from_utf8_lossy(&typo.stderr).contains("tabel"),
        "the error names the parameter: {}",
        String::from_utf8_lossy(&typo.stderr)
    );
}
