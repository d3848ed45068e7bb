//! The habits of flock(1), consul lock and etcdctl lock, run with the real `lease` binary:
//! `-w`/`-n`/`-E`/`-c`, `lease hold KEY`, `lease elect -- CMD`, `lease elect --observe`, the
//! signals forwarded to the command, JSON events with timestamps and `--log-format json`.
//!
//! Store-dependent cases run on SQLite (a temporary file) and on the services of the env files
//! (`LEASE_REDIS_URL`, `LEASE_POSTGRES_URL`, `LEASE_ETCD_ENDPOINTS`); an unreachable service is
//! skipped with a warning, or fails under `CI=true` / `LEASE_TEST_REQUIRE=1`.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_testkit::stores::{ETCD, POSTGRES_URL, REDIS_URL};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(30);

fn lease() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    cmd.env_remove("LEASE_STORE")
        .env_remove("LEASE_LOG")
        .env_remove("RUST_LOG")
        .env_remove("LEASE_LOG_FORMAT")
        .env("LEASE_ACCEPT_REDIS_FAILOVER", "1");
    cmd
}

fn unique_key(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("habit-{name}-{}-{nanos}", std::process::id())
}

/// A SQLite store in a temporary directory (kept as long as the value lives).
struct Sqlite {
    _dir: tempfile::TempDir,
    url: String,
}

fn sqlite() -> Sqlite {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("leases.db").display());
    Sqlite { _dir: dir, url }
}

/// The URL from `env` (or `default`) if `lease status` can use it; otherwise a warning and
/// `None`, or a panic when services are required.
fn service(name: &str, env: &str, default: &str) -> Option<String> {
    let url = std::env::var(env)
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| default.to_string());
    let out = output(lease().args(["status", "--store", &url, "habit-probe"]));
    if out.status.success() {
        return Some(url);
    }
    let why = String::from_utf8_lossy(&out.stderr);
    if leasehold_testkit::require_services() {
        panic!("{name} at {url} is required (CI or LEASE_TEST_REQUIRE) but unavailable: {why}");
    }
    eprintln!("WARNING: {name} at {url} unavailable, skipping: {why}");
    None
}

/// Every store to run on: SQLite, then each reachable service.
fn stores() -> Vec<(String, Option<Sqlite>)> {
    let s = sqlite();
    let mut all = vec![(s.url.clone(), Some(s))];
    let etcd = ETCD.store_url().unwrap_or_default();
    for url in [
        service("Redis", REDIS_URL.name, &REDIS_URL.get()),
        service("PostgreSQL", POSTGRES_URL.name, &POSTGRES_URL.get()),
        service("etcd", "LEASE_CLI_ETCD_URL", &etcd),
    ]
    .into_iter()
    .flatten()
    {
        all.push((url, None));
    }
    all
}

fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run lease")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn pid(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pid"))
}

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

fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status_json(store: &str, key: &str) -> Value {
    let out = output(lease().args(["status", "--json", "--store", store, key]));
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Reads a child's stdout lines on a thread.
struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn of(child: &mut Child) -> Self {
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// The next line, at most `limit` away.
    fn next(&mut self, limit: Duration) -> String {
        let line = self
            .rx
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("no line within {limit:?}; saw {:?}", self.seen));
        self.seen.push(line.clone());
        line
    }

    /// Waits for a JSON line matching `pred`.
    fn wait_for(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {what} within {LIMIT:?}; saw {:?}", self.seen));
            self.seen.push(line.clone());
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            assert_timestamped(&v);
            if pred(&v) {
                return v;
            }
        }
    }
}

/// `ts` is RFC 3339 UTC with milliseconds, within a minute of now.
fn assert_timestamped(v: &Value) {
    let ts = v["ts"].as_str().unwrap_or_else(|| panic!("no ts in {v}"));
    assert_eq!(ts.len(), 24, "{ts}");
    assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts}");
    let year: i32 = ts[..4].parse().expect("year");
    let now_year = 1970
        + i32::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_secs()
                / 31_556_952,
        )
        .expect("year fits");
    assert!((year - now_year).abs() <= 1, "{ts}");
}

// ---------------------------------------------------------------------------------------------
// lease hold, -n, -E, -w

/// `lease hold KEY` prints the token once held and keeps it; `lease run -n` on that key ends at
/// once with 75, or with the status given with `-E`; `-w` waits that long first; SIGTERM
/// releases the key and exits 0.
fn hold_and_conflict(store: &str) {
    let key = unique_key("hold");
    let mut holder = lease()
        .args(["hold", &key, "--store", store, "--ttl", "5s"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn hold");
    let mut lines = Lines::of(&mut holder);
    let token: u64 = lines.next(LIMIT).trim().parse().expect("the token alone");
    let state = status_json(store, &key);
    assert_eq!(state["held"], true, "{state}");
    assert_eq!(state["token"].as_u64(), Some(token), "{state}");

    let out = output(lease().args(["run", "-n", "--store", store, "-k", &key, "--", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let out = output(lease().args([
        "run", "-n", "-E", "3", "--store", store, "-k", &key, "--", "true",
    ]));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let started = Instant::now();
    let out = output(lease().args([
        "run", "-w", "400ms", "-E", "9", "--store", store, "-k", &key, "-c", "exit 0",
    ]));
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(started.elapsed() >= Duration::from_millis(400));

    kill(pid(&holder), Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(wait_exit(&mut holder, LIMIT).code(), Some(0));
    assert_eq!(status_json(store, &key)["held"], false, "hold releases");
    // Free now: -c runs the string with /bin/sh, with the token in its environment.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("token");
    let script = format!("echo \"$LEASE_FENCING_TOKEN\" > '{}'", file.display());
    let out = output(lease().args(["run", "-n", "--store", store, "-k", &key, "-c", &script]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let next: u64 = read(&file).trim().parse().expect("a token");
    assert!(next > token, "{next} after {token}");
}

#[test]
fn hold_prints_the_token_and_no_wait_conflicts_exit_as_asked() {
    for (url, _keep) in stores() {
        eprintln!("store {url}");
        hold_and_conflict(&url);
    }
}

#[test]
fn hold_json_events_carry_timestamps() {
    let s = sqlite();
    let key = unique_key("holdjson");
    let mut holder = lease()
        .args(["hold", &key, "--store", &s.url, "--json", "--label", "h"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn hold");
    let mut lines = Lines::of(&mut holder);
    let acquired = lines.wait_for("acquired", |v| v["event"] == "acquired");
    assert_eq!(acquired["key"], key.as_str());
    assert!(acquired["token"].as_u64().is_some_and(|t| t > 0));
    assert!(
        acquired["owner"]
            .as_str()
            .is_some_and(|o| o.starts_with("h-"))
    );
    kill(pid(&holder), Signal::SIGINT).expect("SIGINT");
    lines.wait_for("released", |v| v["event"] == "released");
    assert_eq!(wait_exit(&mut holder, LIMIT).code(), Some(0));
}

#[test]
fn short_flags_refuse_bad_input_as_usage_errors() {
    let s = sqlite();
    for args in [
        vec!["run", "-k", "k", "-E", "256", "--", "true"],
        vec!["run", "-k", "k", "-E", "-1", "--", "true"],
        vec!["run", "-k", "k", "-w", "1s", "-n", "--", "true"],
        vec!["run", "-k", "k", "-c", "true", "--", "true"],
        vec!["run", "-k", "k"],
        vec!["hold"],
        vec!["elect", "--name", "n", "--observe", "--", "true"],
    ] {
        let (sub, rest) = args.split_first().expect("a subcommand");
        let out = output(lease().args([sub, &"--store", &s.url.as_str()]).args(rest));
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
    }
}

// ---------------------------------------------------------------------------------------------
// Signals

/// SIGUSR1, SIGUSR2, SIGWINCH and SIGQUIT reach the command; `lease` itself survives the first
/// three (their default action would end it) and passes the command's status on.
#[test]
fn quit_usr1_usr2_and_winch_are_forwarded_to_the_command() {
    let s = sqlite();
    let key = unique_key("signals");
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("log");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'echo usr1 >> {log}' USR1; trap 'echo usr2 >> {log}' USR2; \
         trap 'echo winch >> {log}' WINCH; trap 'echo quit >> {log}; exit 7' QUIT; \
         touch {ready}; while :; do sleep 0.05; done",
        log = log.display(),
        ready = ready.display()
    );
    let mut child = lease()
        .args(["run", "--store", &s.url, "-k", &key, "-c", &script])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn run");
    wait_until("the command's traps", LIMIT, || ready.exists());
    for (sig, word) in [
        (Signal::SIGUSR1, "usr1"),
        (Signal::SIGUSR2, "usr2"),
        (Signal::SIGWINCH, "winch"),
    ] {
        kill(pid(&child), sig).expect("signal");
        wait_until(word, LIMIT, || read(&log).lines().any(|l| l == word));
    }
    kill(pid(&child), Signal::SIGQUIT).expect("SIGQUIT");
    let status = wait_exit(&mut child, LIMIT);
    assert_eq!(status.code(), Some(7), "{status:?}");
    assert_eq!(read(&log), "usr1\nusr2\nwinch\nquit\n");
}

// ---------------------------------------------------------------------------------------------
// lease elect -- CMD, --observe

fn elect_cmd(store: &str, name: &str, label: &str, script: &str) -> Child {
    lease()
        .args([
            "elect", "--store", store, "--name", name, "--ttl", "2s", "--json", "--label", label,
            "--", "sh", "-c", script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn elect")
}

/// The command runs only while its candidate leads, with the term as its token: when the leader
/// resigns (SIGTERM), its command is stopped before the other candidate's command starts with a
/// greater term; when a command exits on its own, `lease elect` resigns and exits with its
/// status.
fn elect_runs_the_command_while_leading(store: &str) {
    let name = unique_key("electcmd");
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("log");
    // Each command appends "start LABEL TERM", and "stop LABEL TERM" when SIGTERM ends it.
    let script = |label: &str| {
        format!(
            "echo start {label} $LEASE_FENCING_TOKEN >> '{log}'; \
             trap 'echo stop {label} $LEASE_FENCING_TOKEN >> \"{log}\"; exit 0' TERM; \
             while :; do sleep 0.05; done",
            log = log.display()
        )
    };
    let mut a = elect_cmd(store, &name, "a", &script("a"));
    let mut a_lines = Lines::of(&mut a);
    let started = a_lines.wait_for("a started", |v| v["event"] == "started");
    let a_term = started["term"].as_u64().expect("term");
    assert!(started["pid"].as_u64().is_some(), "{started}");
    wait_until("a's command", LIMIT, || read(&log).contains("start a"));

    let mut b = elect_cmd(store, &name, "b", &script("b"));
    let mut b_lines = Lines::of(&mut b);
    b_lines.wait_for("b sees a lead", |v| {
        v["event"] == "leader" && v["leader"].as_str().is_some_and(|l| l.starts_with("a-"))
    });
    assert!(
        !read(&log).contains("start b"),
        "b's command ran while a led"
    );

    kill(pid(&a), Signal::SIGTERM).expect("SIGTERM a");
    let b_started = b_lines.wait_for("b started", |v| v["event"] == "started");
    let b_term = b_started["term"].as_u64().expect("term");
    assert!(b_term > a_term, "{b_term} after {a_term}");
    assert_eq!(wait_exit(&mut a, LIMIT).code(), Some(0));
    a_lines.wait_for("a resigned", |v| v["event"] == "resigned");
    wait_until("b's command", LIMIT, || read(&log).contains("start b"));
    let text = read(&log);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        &lines[..3],
        [
            format!("start a {a_term}"),
            format!("stop a {a_term}"),
            format!("start b {b_term}"),
        ],
        "a's command stopped before b's started: {text}"
    );

    // A command that ends on its own: `lease elect` resigns and passes its status on.
    kill(pid(&b), Signal::SIGTERM).expect("SIGTERM b");
    assert_eq!(wait_exit(&mut b, LIMIT).code(), Some(0));
    let mut c = lease()
        .args([
            "elect", "--store", store, "--name", &name, "--ttl", "2s", "--json", "--", "sh", "-c",
            "exit 5",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn elect");
    let mut c_lines = Lines::of(&mut c);
    let exited = c_lines.wait_for("exited", |v| v["event"] == "exited");
    assert_eq!(exited["status"], 5);
    assert_eq!(wait_exit(&mut c, LIMIT).code(), Some(5));
    assert_eq!(status_json(store, &name)["held"], false, "resigned");
}

#[test]
fn elect_runs_the_command_only_while_leading() {
    for (url, _keep) in stores() {
        eprintln!("store {url}");
        elect_runs_the_command_while_leading(&url);
    }
}

/// `--observe` prints who leads without joining: it never leads, and the leader it names is the
/// candidate's id.
#[test]
fn observe_only_prints_the_leader_without_joining() {
    let s = sqlite();
    let name = unique_key("observe");
    let mut watcher = lease()
        .args([
            "elect",
            "--store",
            &s.url,
            "--name",
            &name,
            "--ttl",
            "1s",
            "--json",
            "--observe",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn observer");
    let mut w = Lines::of(&mut watcher);
    w.wait_for("observing", |v| v["event"] == "observing");
    assert_eq!(
        status_json(&s.url, &name)["held"],
        false,
        "an observer holds nothing"
    );
    let mut cand = lease()
        .args([
            "elect", "--store", &s.url, "--name", &name, "--ttl", "1s", "--json", "--label", "c",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn candidate");
    let mut c = Lines::of(&mut cand);
    let elected = c.wait_for("elected", |v| v["event"] == "elected");
    let seen = w.wait_for("leader c", |v| {
        v["event"] == "leader" && v["leader"].as_str().is_some_and(|l| l.starts_with("c-"))
    });
    assert_eq!(seen["term"], elected["term"]);
    assert!(seen.get("id").is_none(), "an observer has no id: {seen}");
    kill(pid(&cand), Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(wait_exit(&mut cand, LIMIT).code(), Some(0));
    w.wait_for("no leader", |v| {
        v["event"] == "leader" && v["leader"].is_null()
    });
    kill(pid(&watcher), Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(wait_exit(&mut watcher, LIMIT).code(), Some(0));
    assert!(
        w.seen.iter().all(|l| !l.contains("\"elected\"")),
        "{:?}",
        w.seen
    );
}

// ---------------------------------------------------------------------------------------------
// Logs

/// `--log-format json`: every log line on stderr is a JSON object with `ts`, `level`, `target`.
#[test]
fn log_format_json_writes_json_lines() {
    let s = sqlite();
    let key = unique_key("logs");
    let out = output(lease().env("LEASE_LOG", "debug").args([
        "--log-format",
        "json",
        "run",
        "--store",
        &s.url,
        "-k",
        &key,
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stderr(&out);
    let records: Vec<Value> = text
        .lines()
        .filter(|l| !l.starts_with("lease:"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!records.is_empty(), "no log records: {text}");
    for r in &records {
        assert_timestamped(r);
        assert!(r["level"].is_string() && r["target"].is_string(), "{r}");
    }
    assert!(
        records.iter().any(|r| r["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("leasehold"))),
        "{text}"
    );
}

/// A leader that loses its lease (paused past its TTL with SIGSTOP while another candidate takes
/// over) stops its command as soon as it runs again: `stopped` with the ended term, then
/// `stepped_down`, and it campaigns on.
#[test]
fn elect_stops_the_command_when_the_lease_is_lost() {
    let s = sqlite();
    let name = unique_key("electloss");
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("log");
    let script = format!(
        "trap 'echo stop $LEASE_FENCING_TOKEN >> \"{log}\"; exit 0' TERM; \
         echo start $LEASE_FENCING_TOKEN >> '{log}'; while :; do sleep 0.05; done",
        log = log.display()
    );
    let elect = |label: &str| {
        lease()
            .args([
                "elect", "--store", &s.url, "--name", &name, "--ttl", "1s", "--json", "--label",
                label, "--", "sh", "-c", &script,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn elect")
    };
    let mut a = elect("a");
    let mut a_lines = Lines::of(&mut a);
    let started = a_lines.wait_for("a started", |v| v["event"] == "started");
    let a_term = started["term"].as_u64().expect("term");
    let a_cmd = started["pid"].as_u64().expect("pid");
    // Pause a past its TTL; b takes over meanwhile.
    kill(pid(&a), Signal::SIGSTOP).expect("SIGSTOP");
    let mut b = elect("b");
    let mut b_lines = Lines::of(&mut b);
    let b_term = b_lines.wait_for("b started", |v| v["event"] == "started")["term"]
        .as_u64()
        .expect("term");
    assert!(b_term > a_term);
    kill(pid(&a), Signal::SIGCONT).expect("SIGCONT");
    let stopped = a_lines.wait_for("a stopped", |v| v["event"] == "stopped");
    assert_eq!(stopped["term"].as_u64(), Some(a_term), "{stopped}");
    let down = a_lines.wait_for("a stepped down", |v| v["event"] == "stepped_down");
    assert!(
        down["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("lost")),
        "{down}"
    );
    // SIGTERM, then SIGKILL after the grace (50 ms at this TTL): the command is gone either way.
    wait_until("a's command gone", LIMIT, || {
        !Path::new(&format!("/proc/{a_cmd}")).exists()
    });
    assert!(read(&log).contains(&format!("start {a_term}")));
    // a campaigns on: it still runs, as a follower.
    assert!(
        a.try_wait().expect("try_wait").is_none(),
        "a keeps campaigning"
    );
    for child in [&mut a, &mut b] {
        kill(pid(child), Signal::SIGTERM).expect("SIGTERM");
        assert_eq!(wait_exit(child, LIMIT).code(), Some(0));
    }
}
