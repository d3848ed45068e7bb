//! `lease elect`: join an election and print leadership changes; with `-- CMD`, run CMD while
//! leading; with `--observe`, only print who leads.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::election::{DrainGuard, Election, ElectionEvent, Observer};
use leasehold::supervisor::SupervisorConfig;
use leasehold::{FencingToken, LeaseKey, OwnerId};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Map, Value, json};
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::run::{Signals, fit_grace, stops_waiting};
use crate::{ElectArgs, events, exit, owner_label, print_line, store};

pub(crate) async fn main(args: ElectArgs) -> ExitCode {
    let key = match LeaseKey::new(&args.name) {
        Ok(k) => k,
        Err(e) => return exit::from_error("bad --name", &e),
    };
    let config = SupervisorConfig::new(args.ttl);
    let grace = match fit_grace(args.grace, &config) {
        Ok(g) => g,
        Err(message) => {
            eprintln!("lease: {message}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lease: cannot install signal handlers: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let (url, store) = match store::open(args.store.store.as_deref()).await {
        Ok(s) => s,
        Err(e) => return exit::from_error("cannot open the store", &e),
    };
    if !args.observe {
        store::warn_redis_failover(&url, &key, args.failover.accept_redis_failover);
    }
    if let Err(e) = leasehold::backend::validate_ttl(args.ttl, store.capabilities().min_ttl) {
        return exit::from_error("bad --ttl", &e);
    }
    let id = OwnerId::with_label(&owner_label(args.label.as_deref()));
    let election = Election::from_arc(store, key.clone(), config);
    let observer = election.observe();
    let out = Printer {
        json: args.json,
        name: key.to_string(),
        id: (!args.observe).then(|| id.to_string()),
    };
    if args.observe {
        return observe(observer, &out, &mut signals).await;
    }
    let mut me = election.join(id.clone());
    let owner = me.owner().clone();
    out.line("joined", Map::new());
    let command = (!args.command.is_empty()).then_some(args.command.as_slice());
    let mut observer = observer;
    // The command of the current term, if one runs.
    let mut running: Option<Running> = None;
    let mut status = None;
    loop {
        let work = running.as_ref().map(|r| r.work.clone());
        tokio::select! {
            event = me.next_event() => match event {
                Some(ElectionEvent::Elected { term, work, drain }) => {
                    out.line("elected", term_of(term));
                    if let Some(r) = running.take() {
                        stop_and_report(r, grace, &out, "a new term began").await;
                    }
                    if let Some(cmd) = command {
                        match start(cmd, &key, &owner, term, work, drain) {
                            Ok(r) => {
                                let mut m = term_of(term);
                                m.insert("pid".into(), json!(r.pid.as_raw()));
                                out.line("started", m);
                                running = Some(r);
                            }
                            Err(code) => {
                                status = Some(code);
                                break;
                            }
                        }
                    }
                }
                Some(ElectionEvent::SteppedDown { term, reason }) => {
                    if let Some(r) = running.take() {
                        stop_and_report(r, grace, &out, "the term ended").await;
                    }
                    let mut m = term_of(term);
                    m.insert("reason".into(), json!(reason.to_string()));
                    out.line("stepped_down", m);
                }
                Some(_) => {}
                None => {
                    eprintln!("lease: the election ended unexpectedly");
                    if let Some(r) = running.take() {
                        stop_and_report(r, grace, &out, "the election ended").await;
                    }
                    return ExitCode::from(exit::SOFTWARE);
                }
            },
            // The term's work token is cancelled as soon as the term ends, before the event.
            () = async { if let Some(w) = &work { w.cancelled().await } }, if work.is_some() => {
                if let Some(r) = running.take() {
                    stop_and_report(r, grace, &out, "the term ended").await;
                }
            }
            ended = async {
                match running.as_mut() {
                    Some(r) => r.child.wait().await,
                    None => std::future::pending().await,
                }
            }, if running.is_some() => {
                let code = match ended {
                    Ok(s) => status_code(s),
                    Err(e) => {
                        eprintln!("lease: cannot wait for the command: {e}");
                        exit::SOFTWARE
                    }
                };
                if let Some(r) = running.take() {
                    // Whatever the command left in its group goes with it.
                    let _ = killpg(r.pid, Signal::SIGKILL);
                    let mut m = term_of(r.term);
                    m.insert("status".into(), json!(code));
                    out.line("exited", m);
                }
                status = Some(code);
                break;
            }
            seen = observer.changed() => {
                if let Some(l) = seen {
                    out.line("leader", leader_of(&l));
                }
            }
            sig = signals.recv() => {
                match &running {
                    // Forwarded to the command's group; `lease` ends when the command does.
                    Some(r) => { let _ = killpg(r.pid, sig); }
                    None if stops_waiting(sig) => break,
                    None => {}
                }
            }
        }
    }
    if let Some(r) = running.take() {
        stop_and_report(r, grace, &out, "lease is leaving").await;
    }
    // Print what already happened before leaving (an election may have just been won).
    while let Ok(Some(event)) = tokio::time::timeout(Duration::ZERO, me.next_event()).await {
        match event {
            ElectionEvent::Elected { term, .. } => out.line("elected", term_of(term)),
            ElectionEvent::SteppedDown { term, reason } => {
                let mut m = term_of(term);
                m.insert("reason".into(), json!(reason.to_string()));
                out.line("stepped_down", m);
            }
            _ => {}
        }
    }
    let was_leader = me.is_leader();
    me.resign().await;
    let mut m = Map::new();
    if was_leader {
        m.insert("reason".into(), json!("released the lease"));
    }
    out.line("resigned", m);
    ExitCode::from(status.unwrap_or(0))
}

/// `--observe`: print who leads until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
async fn observe(mut observer: Observer, out: &Printer, signals: &mut Signals) -> ExitCode {
    out.line("observing", Map::new());
    loop {
        tokio::select! {
            seen = observer.changed() => match seen {
                Some(l) => out.line("leader", leader_of(&l)),
                None => {
                    eprintln!("lease: the observer ended unexpectedly");
                    return ExitCode::from(exit::SOFTWARE);
                }
            },
            sig = signals.recv() => if stops_waiting(sig) {
                return ExitCode::SUCCESS;
            },
        }
    }
}

fn term_of(term: FencingToken) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("term".into(), json!(term.get()));
    m
}

fn leader_of(l: &leasehold::election::Leadership) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "leader".into(),
        json!(l.leader.as_ref().map(OwnerId::as_str)),
    );
    if let Some(t) = l.term {
        m.insert("term".into(), json!(t.get()));
    }
    m
}

/// The command of one term.
struct Running {
    child: Child,
    /// The command's process group (it leads a group of its own).
    pid: Pid,
    term: FencingToken,
    work: CancellationToken,
    /// Held while the command runs: a planned end of the term waits (bounded) for it to stop.
    _drain: DrainGuard,
}

/// Starts CMD for `term` in a process group of its own, with `LEASE_KEY`, `LEASE_OWNER` and
/// `LEASE_FENCING_TOKEN` (the term) in its environment. Err: the exit status to leave with.
fn start(
    cmd: &[OsString],
    key: &LeaseKey,
    owner: &OwnerId,
    term: FencingToken,
    work: CancellationToken,
    drain: DrainGuard,
) -> Result<Running, u8> {
    let Some((program, rest)) = cmd.split_first() else {
        return Err(exit::USAGE);
    };
    let spawned = Command::new(program)
        .args(rest)
        .env("LEASE_KEY", key.as_str())
        .env("LEASE_OWNER", owner.as_str())
        .env("LEASE_FENCING_TOKEN", term.to_string())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lease: cannot run {}: {e}", program.to_string_lossy());
            return Err(match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            });
        }
    };
    let Some(pid) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
    else {
        eprintln!("lease: the command's process has no id");
        return Err(exit::SOFTWARE);
    };
    Ok(Running {
        child,
        pid,
        term,
        work,
        _drain: drain,
    })
}

/// Stops the command's group (SIGTERM, SIGKILL after `grace`) and prints `stopped`.
async fn stop_and_report(mut r: Running, grace: Duration, out: &Printer, why: &str) {
    let _ = killpg(r.pid, Signal::SIGTERM);
    let until = Instant::now() + grace;
    let mut status = None;
    while Instant::now() < until {
        if let Ok(Some(s)) = r.child.try_wait() {
            status = Some(s);
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    // SIGKILL to the group in any case: what the command started goes with it.
    let _ = killpg(r.pid, Signal::SIGKILL);
    let status = match status {
        Some(s) => Some(s),
        None => tokio::time::timeout(Duration::from_secs(5), r.child.wait())
            .await
            .ok()
            .and_then(Result::ok),
    };
    let mut m = term_of(r.term);
    m.insert("reason".into(), json!(why));
    if let Some(s) = status {
        m.insert("status".into(), json!(status_code(s)));
    }
    out.line("stopped", m);
}

/// The command's status, or 128+N if signal N killed it.
fn status_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::SOFTWARE),
        (None, Some(sig)) => exit::signalled(sig),
        (None, None) => exit::SOFTWARE,
    }
}

struct Printer {
    json: bool,
    name: String,
    /// This candidate's id (`None` when only observing).
    id: Option<String>,
}

impl Printer {
    /// One line per event: a JSON object with `event`, `ts`, `name`, `id` and `fields`, or text.
    fn line(&self, event: &str, fields: Map<String, Value>) {
        if self.json {
            let mut v = Map::new();
            v.insert("event".into(), json!(event));
            v.insert("ts".into(), json!(events::now()));
            v.insert("name".into(), json!(self.name));
            if let Some(id) = &self.id {
                v.insert("id".into(), json!(id));
            }
            v.extend(fields);
            let _ = print_line(Value::Object(v));
            return;
        }
        let term = fields
            .get("term")
            .map(|t| format!(" term {t}"))
            .unwrap_or_default();
        match event {
            "leader" => match fields.get("leader").and_then(Value::as_str) {
                Some(l) => print_out!("{}: leader is {l}{term}", self.name),
                None => print_out!("{}: no leader", self.name),
            },
            _ => {
                let mut extra = String::new();
                if let Some(pid) = fields.get("pid") {
                    extra.push_str(&format!(" pid {pid}"));
                }
                if let Some(s) = fields.get("status") {
                    extra.push_str(&format!(" status {s}"));
                }
                if let Some(r) = fields.get("reason").and_then(Value::as_str) {
                    extra.push_str(&format!(" ({r})"));
                }
                let who = self.id.as_deref().unwrap_or("observer");
                print_out!("{}: {who} {event}{term}{extra}", self.name);
            }
        }
    }
}
