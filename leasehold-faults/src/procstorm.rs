//! The process storm: holders run as real processes (`lease-fault-holder --process-storm`) that
//! this process SIGKILLs, SIGSTOPs and SIGCONTs at random moments, while they acquire, renew,
//! write through the fenced resource and release. Each holder prints every operation with
//! `CLOCK_MONOTONIC` stamps (shared by all processes of the host), from which one history is
//! built and checked by the same checker as the in-process storms.
//!
//! What a signal does to the history:
//! - an operation a killed holder had begun and not ended is of **unknown outcome** (a write may
//!   have been applied, an acquisition may have granted a ghost lease), ended at the kill;
//! - a write whose run spans a pause of its holder is a [`LateWrite`](Op::LateWrite): a process
//!   frozen in flight cannot be stopped by its own deadline, so only the fence judges it (it must
//!   never be accepted after a greater token was);
//! - a loss that a holder paused during its grant reports on resuming is left out: a stopped
//!   process cannot report anything, and leaving the report out only makes the checker stricter
//!   (the holder's belief then lasts to its deadline).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use leasehold_core::{FencingToken, LeaseKey, OwnerId};
use leasehold_testkit::history::{Attempt, Event, History, Op, Stamp};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use crate::child::holder_bin;
use crate::record::{Record, check_record};
use crate::scenarios::{Measured, fresh_key};

/// `CLOCK_MONOTONIC` nanoseconds to instants of this process.
#[derive(Debug, Clone, Copy)]
struct Clock {
    at: std::time::Instant,
    ns: u64,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            at: std::time::Instant::now(),
            ns: mono(),
        }
    }
    fn instant(self, ns: u64) -> Instant {
        let i = if ns >= self.ns {
            self.at + Duration::from_nanos(ns - self.ns)
        } else {
            self.at
                .checked_sub(Duration::from_nanos(self.ns - ns))
                .unwrap_or(self.at)
        };
        Instant::from_std(i)
    }
}

fn mono() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

#[derive(Debug)]
struct Holder {
    name: String,
    owner: OwnerId,
    child: Option<Child>,
    /// The operation begun and not yet ended: (op, token, invoked, key).
    pending: Option<(String, Option<FencingToken>, u64, LeaseKey)>,
    /// Start of the current grant's acquisition.
    grant_started: u64,
    /// Pauses, as (SIGSTOP, SIGCONT) monotonic nanoseconds (`u64::MAX`: not resumed yet).
    pauses: Vec<(u64, u64)>,
    paused_until: Option<Instant>,
    killed_at: Option<u64>,
    finished: bool,
}

impl Holder {
    fn paused_within(&self, from: u64, to: u64) -> bool {
        self.pauses.iter().any(|&(s, e)| s < to && e > from)
    }
}

fn spawn(
    name: &str,
    args: &[String],
    wall_clock: Option<&std::path::Path>,
    tx: mpsc::UnboundedSender<(String, Option<Value>)>,
) -> Result<Child, String> {
    let mut cmd = Command::new(holder_bin());
    if let Some(file) = wall_clock {
        // libfaketime shifts the process's wall clock only: `CLOCK_MONOTONIC` (the stamps of the
        // history and every deadline) stays the host's. It reads the offset from the file at
        // every call, so writing the file steps the clock.
        cmd.env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    let mut child = cmd
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", holder_bin()))?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let name = name.to_string();
    tokio::spawn(async move {
        let mut lines = BufReader::new(out).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&l) {
                let _ = tx.send((name.clone(), Some(v)));
            }
        }
        let _ = tx.send((name, None));
    });
    Ok(child)
}

/// The host's wall clock, ms since the epoch.
fn host_wall_ms() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_millis()).unwrap_or(0))
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) -> Result<(), String> {
    let pid = child.id().ok_or("holder exited")?;
    let pid = i32::try_from(pid).map_err(|e| e.to_string())?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).map_err(|e| e.to_string())
}

/// SQLite holders killed and paused during a storm (TTL 1 s, three holders at a time, each
/// killed one replaced, up to eight holders in all).
///
/// # Errors
/// If the holders cannot be started or the resource cannot be read at the end.
pub async fn sqlite_kill_pause(seed: u64) -> Result<Measured, String> {
    let dir = std::env::var("LEASE_SQLITE_DIR")
        .unwrap_or_else(|_| std::env::temp_dir().to_string_lossy().into_owned());
    let path = format!(
        "{dir}/leasehold-faults-procstorm-{}-{seed}-{}.db",
        std::process::id(),
        fastrand::u32(..)
    );
    let url = format!("sqlite://{path}");
    let r = process_storm(&url, &url, Duration::from_millis(1000), seed).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
    r
}

/// A process storm against the store at `url` and the fenced resource at `resource_url`.
///
/// # Errors
/// As [`sqlite_kill_pause`].
pub async fn process_storm(
    url: &str,
    resource_url: &str,
    ttl: Duration,
    seed: u64,
) -> Result<Measured, String> {
    process_storm_recorded(url, resource_url, ttl, seed, None).await
}

/// As [`process_storm`], and with `record` (the resource's own log of accepted writes, see
/// [`crate::record`]) installed before the holders start and checked against the history after
/// the storm.
///
/// # Errors
/// As [`sqlite_kill_pause`], or if the record cannot be installed or read.
pub async fn process_storm_recorded(
    url: &str,
    resource_url: &str,
    ttl: Duration,
    seed: u64,
    record: Option<&Record>,
) -> Result<Measured, String> {
    process_storm_skewed(url, resource_url, ttl, seed, record, &[]).await
}

/// The libfaketime library `LD_PRELOAD`ed into holders whose wall clock is skewed (Debian's
/// `faketime` package).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// As [`process_storm_recorded`], with the wall clock of holder `n` shifted by
/// `wall_skew_s[n % len]` seconds (libfaketime; 0 or an empty list: no shift). Every lease
/// decision rests on monotonic clocks and the server's clock, so a holder's wall clock must not
/// matter: the storm must stay clean however far apart the holders' wall clocks are.
///
/// # Errors
/// As [`process_storm_recorded`], or if a skew is asked for and libfaketime is not installed.
pub async fn process_storm_skewed(
    url: &str,
    resource_url: &str,
    ttl: Duration,
    seed: u64,
    record: Option<&Record>,
    wall_skew_s: &[i64],
) -> Result<Measured, String> {
    let plan = Plan {
        wall_skew_s: wall_skew_s.to_vec(),
        ..Plan::default()
    };
    // A `dyn` future: the storm's future type is deep enough that proving it `Send` inside the
    // soak's task pool overflows the compiler's recursion limit.
    let storm: std::pin::Pin<Box<dyn Future<Output = Result<Measured, String>> + Send + '_>> =
        Box::pin(async move {
            process_storm_planned(url, resource_url, ttl, seed, record, &plan).await
        });
    storm.await
}

/// The shape of a process storm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Holder `n`'s wall clock starts shifted by `wall_skew_s[n % len]` seconds (libfaketime; 0
    /// or an empty list: no shift).
    pub wall_skew_s: Vec<i64>,
    /// Whether some faults step a live holder's wall clock (libfaketime re-reading its
    /// timestamp file), forward and back in turn, by 10 to 120 s.
    pub clock_steps: bool,
    /// Holders running at a time (each killed one replaced, up to `2 * holders + 2` in all).
    pub holders: usize,
    /// Keys the holders contend for; each round a holder picks one at random.
    pub keys: usize,
}

impl Default for Plan {
    /// Three holders on one key, wall clocks neither shifted nor stepped.
    fn default() -> Self {
        Plan {
            wall_skew_s: Vec::new(),
            clock_steps: false,
            holders: 3,
            keys: 1,
        }
    }
}

/// The holders' wall-clock shifts of [`Plan::nemeses`], in seconds (holder `n` takes entry
/// `n % 3`): one on the host's clock, one 45 s behind, one 90 s ahead.
pub const NEMESIS_WALL_SKEW_S: [i64; 3] = [0, -45, 90];

impl Plan {
    /// The process storm the fault suite and the soak run on `backend`: 4 holders at a time
    /// over 3 keys, their wall clocks apart by [`NEMESIS_WALL_SKEW_S`] and stepped forward and
    /// back by 10 to 120 s during the storm.
    ///
    /// SQLite's holders are neither skewed nor stepped: its expiry is decided by its clients'
    /// wall clocks (`expires_ms`), which on its one host are one clock, so skewing them apart per
    /// process is outside what it promises. Every other backend decides expiry on the server or
    /// on monotonic clocks.
    #[must_use]
    pub fn nemeses(backend: &str) -> Plan {
        let sqlite = backend == "sqlite";
        Plan {
            wall_skew_s: if sqlite {
                Vec::new()
            } else {
                NEMESIS_WALL_SKEW_S.to_vec()
            },
            clock_steps: !sqlite,
            holders: 4,
            keys: 3,
        }
    }
}

/// One process storm of seed `seed` on `t`, shaped by [`Plan::nemeses`], with the resource's
/// own record of accepted writes checked where the backend keeps one ([`Record::for_url`]; every
/// backend of [`crate::target::targets_from_env`] does). Returns the measurement and whether that
/// record was checked. Violations are in the measurement, not an error.
///
/// # Errors
/// As [`process_storm_planned`].
pub async fn on_target(t: &crate::target::Target, seed: u64) -> Result<(Measured, bool), String> {
    let (record, url) = match Record::for_url(&t.direct_url()) {
        Some((r, url)) => (Some(r), url),
        None => (None, t.direct_url()),
    };
    let plan = Plan::nemeses(t.name);
    let m = process_storm_planned(&url, &url, t.ttl, seed, record.as_ref(), &plan).await?;
    Ok((m, record.is_some()))
}

/// A holder's wall clock as libfaketime reads it from the holder's timestamp file, re-read at
/// every call (`FAKETIME_NO_CACHE=1`), so that a new offset written to the file steps the clock.
#[derive(Debug)]
struct WallClock {
    file: std::path::PathBuf,
    /// The offset asked for, seconds.
    skew_s: i64,
    /// A step written and not yet seen in the holder's reported wall clock: (offset, written at).
    unseen: Option<(i64, Instant)>,
}

impl WallClock {
    fn set(&mut self, skew_s: i64) -> Result<(), String> {
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{skew_s:+}s\n")).map_err(|e| format!("{tmp:?}: {e}"))?;
        // A rename, so the holder never reads a half-written file.
        std::fs::rename(&tmp, &self.file).map_err(|e| format!("{:?}: {e}", self.file))?;
        self.skew_s = skew_s;
        Ok(())
    }
}

/// As [`process_storm_recorded`], shaped by `plan`: skews and steps of the holders' wall
/// clocks, the number of holders at a time and of keys.
///
/// # Errors
/// As [`process_storm_recorded`], if a skew or step is asked for and libfaketime is not
/// installed, or if a skew or step did not take effect (the holder's reported wall clock is not
/// within 5 s of the asked offset).
pub async fn process_storm_planned(
    url: &str,
    resource_url: &str,
    ttl: Duration,
    seed: u64,
    record: Option<&Record>,
    plan: &Plan,
) -> Result<Measured, String> {
    let wall_skew_s = &plan.wall_skew_s[..];
    let faked = plan.clock_steps || wall_skew_s.iter().any(|&s| s != 0);
    if faked && !std::path::Path::new(LIBFAKETIME).exists() {
        return Err(format!(
            "{LIBFAKETIME} is missing (Debian package faketime)"
        ));
    }
    let skew_of = |n: u64| {
        usize::try_from(n)
            .ok()
            .and_then(|n| wall_skew_s.get(n % wall_skew_s.len().max(1)))
            .copied()
            .unwrap_or(0)
    };
    let base = fresh_key("procstorm");
    let keys: Vec<LeaseKey> = if plan.keys <= 1 {
        vec![base.clone()]
    } else {
        (0..plan.keys)
            .map(|i| LeaseKey::new(format!("{base}-{i}")).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?
    };
    let key_list = keys
        .iter()
        .map(LeaseKey::as_str)
        .collect::<Vec<_>>()
        .join(",");
    let clock_dir = std::env::temp_dir().join(format!("leasehold-faults-clocks-{base}"));
    if faked {
        std::fs::create_dir_all(&clock_dir).map_err(|e| format!("{clock_dir:?}: {e}"))?;
    }
    let mut clocks: HashMap<String, WallClock> = HashMap::new();
    let clock = Clock::new();
    let history = History::new();
    let mut seq = 0u64;
    let mut rng = fastrand::Rng::with_seed(seed);
    // The resource must exist before holders race to create it.
    let resource = leasehold::connect_resource(resource_url)
        .await
        .map_err(|e| e.to_string())?;
    let _store = leasehold::connect(url).await.map_err(|e| e.to_string())?;
    let mut recording = match record {
        Some(r) => Some(r.start(base.as_str()).await?),
        None => None,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut holders: HashMap<String, Holder> = HashMap::new();
    let spawned = std::sync::atomic::AtomicU64::new(0);
    let args = |n: u64, rounds: u32| -> Vec<String> {
        [
            "--process-storm",
            "--url",
            url,
            "--resource-url",
            resource_url,
            "--keys",
            key_list.as_str(),
        ]
        .iter()
        .map(ToString::to_string)
        .chain([
            "--ttl-ms".to_string(),
            ttl.as_millis().to_string(),
            "--rounds".to_string(),
            rounds.to_string(),
            "--seed".to_string(),
            (seed * 100 + n).to_string(),
        ])
        .collect()
    };
    let add = |holders: &mut HashMap<String, Holder>,
               clocks: &mut HashMap<String, WallClock>,
               rounds: u32|
     -> Result<(), String> {
        let n = spawned.load(std::sync::atomic::Ordering::Relaxed);
        let name = format!("p{n}");
        let wall = if faked {
            let mut w = WallClock {
                file: clock_dir.join(&name),
                skew_s: 0,
                unseen: None,
            };
            w.set(skew_of(n))?;
            Some(w)
        } else {
            None
        };
        let child = spawn(
            &name,
            &args(n, rounds),
            wall.as_ref().map(|w| w.file.as_path()),
            tx.clone(),
        )?;
        if let Some(w) = wall {
            clocks.insert(name.clone(), w);
        }
        spawned.store(n + 1, std::sync::atomic::Ordering::Relaxed);
        holders.insert(
            name.clone(),
            Holder {
                owner: OwnerId::with_label(&name),
                name,
                child: Some(child),
                pending: None,
                grant_started: 0,
                pauses: Vec::new(),
                paused_until: None,
                killed_at: None,
                finished: false,
            },
        );
        Ok(())
    };
    for _ in 0..plan.holders.max(1) {
        add(&mut holders, &mut clocks, 3)?;
    }
    let most = u64::try_from(plan.holders.max(1) * 2 + 2).unwrap_or(u64::MAX);
    let (mut kills, mut pauses, mut steps, mut steps_seen) = (0u64, 0u64, 0u64, 0u64);
    let mut unobserved = 0u64;
    let mut forward = true;
    let mut unskewed: Vec<String> = Vec::new();
    let started = Instant::now();
    let give_up = started + Duration::from_secs(90);
    let mut next_fault = started + ttl.mul_f64(1.0 + rng.f64());
    let mut stamp = |ns: u64| {
        seq += 1;
        Stamp {
            at: clock.instant(ns),
            seq,
        }
    };
    loop {
        if holders.values().all(|h| h.finished) {
            break;
        }
        let resume = holders.values().filter_map(|h| h.paused_until).min();
        let wake = resume
            .map_or(next_fault, |r| r.min(next_fault))
            .min(give_up);
        tokio::select! {
            msg = rx.recv() => {
                let Some((name, v)) = msg else { break };
                let Some(h) = holders.get_mut(&name) else { continue };
                let key_of = |v: &Value| {
                    v["key"]
                        .as_str()
                        .and_then(|k| keys.iter().find(|key| key.as_str() == k))
                        .unwrap_or(&keys[0])
                        .clone()
                };
                let Some(v) = v else {
                    // End of output: the process exited (or was killed).
                    h.finished = true;
                    if let (Some((op, token, t, key)), Some(k)) = (h.pending.take(), h.killed_at) {
                        let op = match (op.as_str(), token) {
                            ("write", Some(tk)) if h.paused_within(t, k) => {
                                Op::Unknown(Attempt::LateWrite(tk))
                            }
                            ("write", Some(tk)) => Op::Unknown(Attempt::Write(tk)),
                            ("release", Some(tk)) => Op::Release { token: tk },
                            _ => Op::Unknown(Attempt::Acquire),
                        };
                        let (invoked, completed) = (stamp(t), stamp(k));
                        history.push(Event { client: h.name.clone(), key: key.clone(), invoked, completed, op });
                    }
                    continue;
                };
                let tok = v["token"].as_u64().and_then(|t| FencingToken::new(t).ok());
                let n = |f: &str| v[f].as_u64().unwrap_or(0);
                let ev = v["event"].as_str().unwrap_or_default();
                let key = key_of(&v);
                // A step of this holder's wall clock must show in the next wall clock it reports.
                if let (Some(w), Some(wall)) = (clocks.get_mut(&name), v["wall_ms"].as_u64())
                    && let Some((want, at)) = w.unseen
                {
                    let off = i128::from(wall) - host_wall_ms();
                    if (off - i128::from(want) * 1000).abs() <= 5000 {
                        w.unseen = None;
                        steps_seen += 1;
                    } else if Instant::now() > at + Duration::from_secs(1) {
                        unskewed.push(format!(
                            "{name}: wall clock off by {off} ms more than 1 s after a step to {want} s"
                        ));
                        w.unseen = None;
                    }
                }
                let op = match (ev, tok) {
                    ("ready", _) => {
                        // A skewed holder's wall clock must be off by its skew (within 5 s): the
                        // one it started with, or the one a step asked for since (a step may
                        // come before the holder's first line).
                        let idx: u64 = name.trim_start_matches('p').parse().unwrap_or(0);
                        let off = i128::from(n("wall_ms")) - host_wall_ms();
                        let want = i128::from(skew_of(idx)) * 1000;
                        let stepped = clocks.get(&name).map(|w| i128::from(w.skew_s) * 1000);
                        let near = |w: i128| (off - w).abs() <= 5000;
                        if !near(want) && !stepped.is_some_and(near) {
                            unskewed.push(format!(
                                "{name}: wall clock off by {off} ms, asked {want} ms{}",
                                stepped.map_or(String::new(), |s| format!(" (then {s} ms)"))
                            ));
                        }
                        None
                    }
                    ("begin", _) => {
                        let op = v["op"].as_str().unwrap_or_default().to_string();
                        if op == "acquire" {
                            h.grant_started = n("t");
                        }
                        h.pending = Some((op, tok, n("t"), key.clone()));
                        None
                    }
                    ("granted", Some(token)) => Some(Op::Granted {
                        owner: h.owner.clone(),
                        token,
                        deadline: clock.instant(n("deadline")),
                    }),
                    ("refused", _) => Some(Op::Refused),
                    ("acquire_unknown", _) => Some(Op::Unknown(Attempt::Acquire)),
                    ("renewed", Some(token)) => Some(Op::Renewed {
                        token,
                        deadline: clock.instant(n("deadline")),
                    }),
                    ("lost", Some(token)) => {
                        if !h.paused_within(h.grant_started, u64::MAX) {
                            let s = stamp(n("t"));
                            history.push(Event { client: h.name.clone(), key: key.clone(), invoked: s, completed: s, op: Op::RenewLost { token } });
                        }
                        None
                    }
                    ("write", Some(token)) => {
                        let accepted = v["accepted"] == true;
                        Some(if h.paused_within(n("t0"), n("t1")) {
                            Op::LateWrite { token, accepted }
                        } else {
                            Op::Write { token, accepted }
                        })
                    }
                    ("write_unknown", Some(token)) => Some(Op::Unknown(
                        if h.paused_within(n("t0"), n("t1")) {
                            Attempt::LateWrite(token)
                        } else {
                            Attempt::Write(token)
                        },
                    )),
                    ("released", Some(token)) => Some(Op::Release { token }),
                    _ => None,
                };
                if let Some(op) = op {
                    if !matches!(op, Op::Renewed { .. }) {
                        h.pending = None;
                    }
                    let (invoked, completed) = (stamp(n("t0")), stamp(n("t1")));
                    history.push(Event { client: h.name.clone(), key, invoked, completed, op });
                }
            }
            () = sleep_until(wake) => {
                let now = Instant::now();
                if now >= give_up {
                    for h in holders.values_mut() {
                        if let Some(c) = h.child.as_ref() {
                            let _ = signal(c, nix::sys::signal::Signal::SIGCONT);
                        }
                        if let Some(mut c) = h.child.take() {
                            h.killed_at = Some(mono());
                            let _ = c.kill().await;
                        }
                    }
                    continue;
                }
                for h in holders.values_mut() {
                    if h.paused_until.is_some_and(|u| u <= now) {
                        if let Some(c) = h.child.as_ref() {
                            signal(c, nix::sys::signal::Signal::SIGCONT)?;
                        }
                        if let Some(p) = h.pauses.last_mut() {
                            p.1 = mono();
                        }
                        h.paused_until = None;
                    }
                }
                if now < next_fault {
                    continue;
                }
                next_fault = now + ttl.mul_f64(0.5 + rng.f64());
                let mut live: Vec<String> = holders
                    .values()
                    .filter(|h| !h.finished && h.child.is_some() && h.paused_until.is_none())
                    .map(|h| h.name.clone())
                    .collect();
                live.sort();
                if live.is_empty() {
                    continue;
                }
                let pick = live[rng.usize(0..live.len())].clone();
                match rng.u8(0..5) {
                    0 | 1 => {
                        let h = holders.get_mut(&pick).ok_or("holder vanished")?;
                        if let Some(mut c) = h.child.take() {
                            h.killed_at = Some(mono());
                            c.kill().await.map_err(|e| e.to_string())?;
                            kills += 1;
                        }
                        if spawned.load(std::sync::atomic::Ordering::Relaxed) < most {
                            add(&mut holders, &mut clocks, 2)?;
                        }
                    }
                    2 | 3 => {
                        let h = holders.get_mut(&pick).ok_or("holder vanished")?;
                        if let Some(c) = h.child.as_ref() {
                            signal(c, nix::sys::signal::Signal::SIGSTOP)?;
                            h.pauses.push((mono(), u64::MAX));
                            h.paused_until = Some(now + ttl.mul_f64(0.8 + rng.f64() * 0.8));
                            pauses += 1;
                        }
                    }
                    _ => {
                        // A step of the holder's wall clock, forward and back in turn.
                        if let Some(w) = clocks.get_mut(&pick).filter(|_| plan.clock_steps) {
                            let by = rng.i64(10..=120);
                            let to = w.skew_s + if forward { by } else { -by };
                            forward = !forward;
                            w.set(to)?;
                            // A step still unseen is overtaken by this one: never checked.
                            if w.unseen.replace((to, Instant::now())).is_some() {
                                unobserved += 1;
                            }
                            steps += 1;
                        }
                    }
                }
            }
        }
    }
    if faked {
        let _ = std::fs::remove_dir_all(&clock_dir);
    }
    if !unskewed.is_empty() {
        return Err(format!(
            "a wall-clock skew did not take effect: {unskewed:?}"
        ));
    }
    // Steps whose holder reported nothing after them (killed, paused or done right after the
    // step) could not be seen; every step a holder reported after is checked above.
    unobserved += clocks.values().filter(|w| w.unseen.is_some()).count() as u64;
    if plan.clock_steps && steps > unobserved && steps_seen == 0 {
        return Err(format!(
            "{steps} wall-clock step(s) asked for, none seen by a holder"
        ));
    }
    let mut violations = history.check();
    let mut recorded = 0;
    for key in &keys {
        let state = tokio::time::timeout(Duration::from_secs(10), resource.read(key))
            .await
            .map_err(|_| "reading the resource timed out".to_string())?
            .map_err(|e| format!("reading the resource: {e}"))?;
        violations.extend(history.check_counter(key, state.counter));
        violations.extend(history.check_high_water(key, state.high_water));
        if let Some(r) = recording.as_mut() {
            let log = r.read(key).await?;
            recorded += log.len() as u64;
            violations.extend(check_record(&history, key, &log));
        }
    }
    let events = history.events();
    let renewals = events
        .iter()
        .filter(|e| matches!(e.op, Op::Renewed { .. }))
        .count() as u64;
    if !events.iter().any(|e| matches!(e.op, Op::Granted { .. })) {
        return Err(format!("no holder was ever granted any of {key_list}"));
    }
    Ok(Measured {
        faults: kills + pauses + steps,
        clock_steps: steps,
        clock_steps_seen: steps_seen,
        recorded,
        renewals,
        unknown: history.unknown_outcomes(),
        history: (!violations.is_empty()).then(|| history.dump()),
        violations,
        ..Measured::default()
    })
}
