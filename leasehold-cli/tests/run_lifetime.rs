//! `lease run` never lets the command, or anything it started, outlive the lease: on loss every
//! descendant dies (even one that ignores SIGTERM or left the process group with `setsid`), on a
//! normal exit the lease is kept while any descendant still runs, and a stopped (Ctrl-Z) runner
//! stops its command too.
//!
//! These run the real `lease` binary against a SQLite file. A lease is lost the way a paused
//! runner loses it: `lease` is stopped with SIGSTOP while another runner takes the key over.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const LOST: i32 = 76;
/// Generous: every wait below ends in well under a second when `lease` behaves.
const LIMIT: Duration = Duration::from_secs(20);

fn lease() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    cmd.env_remove("LEASE_STORE")
        .env_remove("LEASE_LOG")
        .env_remove("RUST_LOG");
    cmd
}

fn unique_key(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("life-{name}-{}-{nanos}", std::process::id())
}

/// A temporary directory with the SQLite store in it; scripts and markers go there too.
struct Fixture {
    dir: tempfile::TempDir,
    url: String,
    key: String,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("leases.db").display());
        Fixture {
            dir,
            url,
            key: unique_key(name),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `body` into the script `name` and returns its path.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, body).expect("write script");
        path
    }

    /// `lease run --ttl 1s` of `sh -c SCRIPT` in the fixture's directory, stdin closed.
    fn run(&self, script: &str) -> Child {
        self.run_ttl("1s", script)
    }

    /// `lease run --ttl TTL` of `sh -c SCRIPT` in the fixture's directory, stdin closed.
    fn run_ttl(&self, ttl: &str, script: &str) -> Child {
        lease()
            .args([
                "run", "--store", &self.url, "--key", &self.key, "--ttl", ttl, "--", "sh", "-c",
                script,
            ])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            // A file, not a pipe: a descendant that outlives `lease` would keep a pipe open.
            .stderr(std::fs::File::create(self.path("stderr")).expect("stderr file"))
            .spawn()
            .expect("spawn lease run")
    }

    fn is_held(&self) -> bool {
        let out = lease()
            .args(["status", "--json", "--store", &self.url, &self.key])
            .output()
            .expect("lease status");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v["held"].as_bool().expect("held")
    }

    /// Another runner takes the key (waiting until the holder's lease has expired).
    fn steal(&self) {
        let out = lease()
            .args([
                "run", "--store", &self.url, "--key", &self.key, "--ttl", "1s", "--wait", "20s",
                "--", "true",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run the thief");
        assert!(
            out.status.success(),
            "the thief did not get the key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Releases the key on behalf of its holder, as an operator revoking it would: the holder's
    /// next renewal is refused while its lease is still valid locally, so `lease` notices the loss
    /// with its whole grace ahead.
    fn revoke(&self) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let store = leasehold::connect(&self.url).await.expect("open the store");
            let key = leasehold::LeaseKey::new(&self.key).expect("key");
            let holder = store
                .inspect(&key)
                .await
                .expect("inspect")
                .holder
                .expect("the key is held");
            let lease = leasehold::backend::granted_lease(
                key,
                holder.owner,
                holder.token,
                holder.ttl,
                Duration::ZERO,
                tokio::time::Instant::now(),
            );
            let outcome = store.release(&lease).await.expect("release");
            assert_eq!(outcome, leasehold::ReleaseOutcome::Released);
        });
    }

    /// The pid a script wrote into `name`, waiting for it.
    fn pid_in(&self, name: &str) -> Pid {
        let path = self.path(name);
        wait_until(&format!("{name} to be written"), LIMIT, || {
            read(&path).trim().parse::<i32>().is_ok()
        });
        Pid::from_raw(read(&path).trim().parse().expect("pid"))
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pid"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Polls `check` until it is true, at most `limit`.
fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` (started by [`Fixture::run`]) to exit, at most [`LIMIT`]; its status and
/// stderr.
fn finish(f: &Fixture, child: &mut Child) -> (ExitStatus, String) {
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("lease did not exit within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, read(&f.path("stderr")))
}

/// The state letter of `pid` in /proc (`R`, `S`, `T`, `Z`, ...), `None` once it is gone.
fn state(pid: Pid) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Whether `pid` no longer runs (gone, or a zombie nobody reaped yet).
fn dead(pid: Pid) -> bool {
    matches!(state(pid), None | Some('Z' | 'X'))
}

/// Kills what a failed test left running, so that it does not write on forever.
struct Reap(Vec<Pid>);

impl Drop for Reap {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = kill(*pid, Signal::SIGKILL);
        }
    }
}

/// A background loop that ignores SIGTERM and appends to `marker` every 50 ms; its pid goes to
/// `pidfile`.
const STUBBORN: &str =
    "trap '' TERM; echo $$ > \"$1\"; while :; do echo x >> marker; sleep 0.05; done";

/// On loss, the background loop the command started must be dead when `lease` exits 76, however
/// it treats SIGTERM: nothing may write after the exit. The lease is revoked while valid, so
/// `lease` has its whole grace (300 ms here) to wait for the command before SIGKILL.
fn loss_kills(name: &str, command: &str) {
    let f = Fixture::new(name);
    f.script("stubborn.sh", STUBBORN);
    let mut runner = lease()
        .args([
            "run", "--store", &f.url, "--key", &f.key, "--ttl", "6s", "--grace", "300ms", "--",
            "sh", "-c", command,
        ])
        .current_dir(f.dir.path())
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(f.path("stderr")).expect("stderr file"))
        .spawn()
        .expect("spawn lease run");
    let bg = f.pid_in("bgpid");
    let _reap = Reap(vec![bg]);
    wait_until("the background loop to write", LIMIT, || {
        read(&f.path("marker")).lines().count() >= 2
    });
    f.revoke();
    let (status, stderr) = finish(&f, &mut runner);
    assert_eq!(status.code(), Some(LOST), "{status:?}: {stderr}");
    assert!(
        dead(bg),
        "the background loop {bg} still runs after `lease` exited 76: {stderr}"
    );
}

/// The direct child (`sh ... & wait`) dies of SIGTERM at once; the loop it started ignores
/// SIGTERM and stays in the process group.
#[test]
fn on_loss_a_background_child_that_ignores_sigterm_dies() {
    loss_kills("bg-term", "sh stubborn.sh bgpid & wait");
}

/// A descendant that left the process group (`setsid`) dies on loss too.
#[test]
fn on_loss_a_setsid_descendant_dies() {
    loss_kills("bg-setsid", "setsid sh stubborn.sh bgpid & wait");
}

/// `sh -c 'task &'` exits at once; the lease is held (and renewed: the TTL is 1 s) until the
/// task ends, and only then released; `lease` exits with the command's status.
fn held_while_descendants_run(name: &str, start: &str) {
    let f = Fixture::new(name);
    f.script(
        "task.sh",
        "echo $$ > \"$1\"; while [ ! -e go ]; do sleep 0.05; done; echo done > out",
    );
    let mut runner = f.run(&format!(
        "echo $$ > shpid; {start} sh task.sh bgpid & exit 3"
    ));
    let bg = f.pid_in("bgpid");
    let sh = f.pid_in("shpid");
    let _reap = Reap(vec![bg]);
    wait_until("the command to exit", LIMIT, || dead(sh));
    // Two TTLs: the lease must be renewed meanwhile, not merely left to expire.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(
            runner.try_wait().expect("try_wait").is_none(),
            "`lease` exited while the background task still ran"
        );
        assert!(f.is_held(), "the lease was given up while the task ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(f.path("go"), "").expect("write go");
    let (status, stderr) = finish(&f, &mut runner);
    assert_eq!(status.code(), Some(3), "{status:?}: {stderr}");
    assert_eq!(read(&f.path("out")).trim(), "done");
    assert!(dead(bg));
    assert!(!f.is_held(), "released once everything ended");
}

#[test]
fn a_background_child_keeps_the_lease_until_it_ends() {
    held_while_descendants_run("keep-bg", "");
}

#[test]
fn a_setsid_descendant_keeps_the_lease_until_it_ends() {
    held_while_descendants_run("keep-setsid", "setsid");
}

/// `lease` is killed with SIGKILL: the command, its background child and a `setsid`
/// descendant all die (the shim between them and `lease` gets the parent-death signal).
#[test]
fn when_lease_is_killed_every_descendant_dies() {
    let f = Fixture::new("killed");
    f.script("stubborn.sh", STUBBORN);
    let mut runner = f.run(
        "echo $$ > shpid; sh stubborn.sh bgpid & setsid sh stubborn.sh sidpid & \
         trap '' TERM; while :; do sleep 0.05; done",
    );
    let pids = [f.pid_in("shpid"), f.pid_in("bgpid"), f.pid_in("sidpid")];
    let _reap = Reap(pids.to_vec());
    kill(pid_of(&runner), Signal::SIGKILL).expect("SIGKILL lease");
    let _ = runner.wait();
    for pid in pids {
        wait_until(
            &format!("process {pid} to die after `lease` was killed"),
            LIMIT,
            || dead(pid),
        );
    }
}

fn stopped(pid: Pid) -> bool {
    state(pid) == Some('T')
}

/// Ctrl-Z (SIGTSTP) stops `lease` and the whole command; SIGCONT continues both while the lease
/// is valid. Stopped past its lease (another runner took the key meanwhile), the command is
/// killed without running again and `lease` exits 76.
#[test]
fn ctrl_z_stops_the_command_and_it_resumes_only_under_a_valid_lease() {
    let f = Fixture::new("tstp");
    f.script("stubborn.sh", STUBBORN);
    let mut runner = f.run_ttl(
        "3s",
        "echo $$ > shpid; setsid sh stubborn.sh bgpid & while :; do sleep 0.05; done",
    );
    let (sh, bg) = (f.pid_in("shpid"), f.pid_in("bgpid"));
    let _reap = Reap(vec![sh, bg]);
    let me = pid_of(&runner);

    kill(me, Signal::SIGTSTP).expect("SIGTSTP");
    wait_until("lease and the command to stop", LIMIT, || {
        stopped(me) && stopped(sh) && stopped(bg)
    });
    kill(me, Signal::SIGCONT).expect("SIGCONT");
    wait_until("the command to run again", LIMIT, || {
        !stopped(me) && !stopped(sh) && !stopped(bg)
    });
    assert!(f.is_held());

    kill(me, Signal::SIGTSTP).expect("SIGTSTP");
    wait_until("lease and the command to stop", LIMIT, || {
        stopped(me) && stopped(sh) && stopped(bg)
    });
    let written = read(&f.path("marker")).len();
    f.steal();
    kill(me, Signal::SIGCONT).expect("SIGCONT");
    let (status, stderr) = finish(&f, &mut runner);
    assert_eq!(status.code(), Some(LOST), "{status:?}: {stderr}");
    assert!(
        dead(sh) && dead(bg),
        "the command outlived `lease`: {stderr}"
    );
    assert_eq!(
        read(&f.path("marker")).len(),
        written,
        "the command ran again after its lease was lost"
    );
}

/// The lease is revoked while the command runs, and the command ends before the next renewal
/// would notice: the release finds the lease gone, and `lease` reports the loss (76), not the
/// command's success.
#[test]
fn a_lease_found_gone_at_release_is_reported_lost() {
    let f = Fixture::new("gone");
    let mut runner = f.run_ttl("30s", "while [ ! -e go ]; do sleep 0.05; done; exit 0");
    wait_until("the lease to be held", LIMIT, || f.is_held());
    f.revoke();
    std::fs::write(f.path("go"), "").expect("write go");
    let (status, stderr) = finish(&f, &mut runner);
    assert_eq!(status.code(), Some(LOST), "{status:?}: {stderr}");
    assert!(stderr.contains("no longer held at release"), "{stderr}");
}

/// `lease` is stopped with Ctrl-Z (its command with it) and then killed: the stopped command and
/// its `setsid` descendant die too (the orphaned, stopped group is continued by the kernel, and
/// the shim, woken, kills every descendant).
#[test]
fn when_a_stopped_lease_is_killed_every_descendant_dies() {
    let f = Fixture::new("stopped-killed");
    f.script("stubborn.sh", STUBBORN);
    let mut runner = f.run_ttl(
        "3s",
        "echo $$ > shpid; setsid sh stubborn.sh bgpid & while :; do sleep 0.05; done",
    );
    let (sh, bg) = (f.pid_in("shpid"), f.pid_in("bgpid"));
    let _reap = Reap(vec![sh, bg]);
    let me = pid_of(&runner);
    kill(me, Signal::SIGTSTP).expect("SIGTSTP");
    wait_until("lease and the command to stop", LIMIT, || {
        stopped(me) && stopped(sh) && stopped(bg)
    });
    kill(me, Signal::SIGKILL).expect("SIGKILL lease");
    let _ = runner.wait();
    for pid in [sh, bg] {
        wait_until(
            &format!("process {pid} to die after the stopped `lease` was killed"),
            LIMIT,
            || dead(pid),
        );
    }
}

/// With `--stop-leftovers`, what the command left running is stopped (here: SIGKILL after the
/// grace, as it ignores SIGTERM) when the command exits, and the lease released at once.
#[test]
fn stop_leftovers_kills_what_the_command_left_and_releases() {
    let f = Fixture::new("leftovers");
    f.script("stubborn.sh", STUBBORN);
    let mut runner = lease()
        .args([
            "run",
            "--store",
            &f.url,
            "--key",
            &f.key,
            "--ttl",
            "6s",
            "--stop-leftovers",
            "--",
            "sh",
            "-c",
            "setsid sh stubborn.sh bgpid & while [ ! -s bgpid ]; do sleep 0.05; done; exit 3",
        ])
        .current_dir(f.dir.path())
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(f.path("stderr")).expect("stderr file"))
        .spawn()
        .expect("spawn lease run");
    let bg = f.pid_in("bgpid");
    let _reap = Reap(vec![bg]);
    let (status, stderr) = finish(&f, &mut runner);
    assert_eq!(status.code(), Some(3), "{status:?}: {stderr}");
    assert!(dead(bg), "the leftover still runs: {stderr}");
    assert!(!f.is_held());
}

/// SIGTERM to `lease` is forwarded to the command's group and, once, to a `setsid` descendant
/// outside it; `lease` exits when both have ended, with the command's status (128 + 15).
#[test]
fn sigterm_reaches_a_setsid_descendant_once() {
    let f = Fixture::new("forward");
    f.script(
        "polite.sh",
        "trap 'echo got >> term; exit 0' TERM; echo $$ > \"$1\"; while :; do sleep 0.05; done",
    );
    let mut runner = f.run_ttl("6s", "setsid sh polite.sh bgpid & wait");
    let bg = f.pid_in("bgpid");
    let _reap = Reap(vec![bg]);
    kill(pid_of(&runner), Signal::SIGTERM).expect("SIGTERM");
    let (status, stderr) = finish(&f, &mut runner);
    assert_eq!(status.code(), Some(128 + 15), "{status:?}: {stderr}");
    assert!(dead(bg));
    assert_eq!(read(&f.path("term")), "got\n", "{stderr}");
}
