//! `lease run`: acquire (bounded wait), run the command, renew, stop it on loss, release.

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::sync::Arc;
use std::time::Duration;

use leasehold::supervisor::{Acquisition, Health, LeaseGuard, Supervisor, SupervisorConfig};
use leasehold::{Holder, LeaseKey, LeaseStore};
use nix::sys::signal::{Signal, raise};
use nix::unistd::{Pid, getpid};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::duration::human;
use crate::tree::{self, Scope};
use crate::{RunArgs, exit, limit, owner_label, shim, store};

/// The signals `lease run` and `lease elect -- CMD` forward to the command: SIGINT, SIGTERM,
/// SIGHUP and SIGQUIT (which also cancel a wait for the lease), and SIGUSR1, SIGUSR2 and
/// SIGWINCH (ignored while waiting).
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    winch: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn install() -> std::io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
            winch: signal(SignalKind::window_change())?,
        })
    }

    /// The next signal received.
    ///
    /// Cancel safe: a signal not returned stays pending in its stream.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
            _ = self.usr1.recv() => Signal::SIGUSR1,
            _ = self.usr2.recv() => Signal::SIGUSR2,
            _ = self.winch.recv() => Signal::SIGWINCH,
        }
    }
}

/// Whether `sig` ends a wait for the lease (the others are only forwarded to a running command).
pub(crate) fn stops_waiting(sig: Signal) -> bool {
    matches!(
        sig,
        Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT
    )
}

/// The job-control signals (Ctrl-Z, and a background job touching the terminal): handled once
/// the command runs, so that `lease` stops its command before stopping itself.
struct JobControl {
    tstp: tokio::signal::unix::Signal,
    ttin: tokio::signal::unix::Signal,
    ttou: tokio::signal::unix::Signal,
}

impl JobControl {
    fn install() -> std::io::Result<Self> {
        Ok(JobControl {
            tstp: signal(SignalKind::from_raw(Signal::SIGTSTP as i32))?,
            ttin: signal(SignalKind::from_raw(Signal::SIGTTIN as i32))?,
            ttou: signal(SignalKind::from_raw(Signal::SIGTTOU as i32))?,
        })
    }

    /// The next job-control signal received.
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.tstp.recv() => Signal::SIGTSTP,
            _ = self.ttin.recv() => Signal::SIGTTIN,
            _ = self.ttou.recv() => Signal::SIGTTOU,
        }
    }
}

pub(crate) async fn main(args: RunArgs) -> ExitCode {
    let key = match LeaseKey::new(&args.key) {
        Ok(k) => k,
        Err(e) => return exit::from_error("bad --key", &e),
    };
    let config = SupervisorConfig::new(args.ttl);
    let grace = match fit_grace(args.grace, &config) {
        Ok(g) => g,
        Err(message) => {
            eprintln!("lease: {message}");
            return ExitCode::from(exit::USAGE);
        }
    };
    // Orphaned descendants of the command come to `lease` (if the shim is gone) rather than to
    // init, so that they are found, waited for and stopped with the rest.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("lease: cannot become a child subreaper: {e}");
        return ExitCode::from(exit::SOFTWARE);
    }
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
    let wait = args.wait.wait();
    store::warn_redis_failover(&url, &key, args.failover.accept_redis_failover);
    let label = owner_label(args.label.as_deref());
    let owner = match args.limit {
        // Each permit is held by an instance of the owner (17 more bytes): keep the label short.
        Some(_) => store::owner_for(&url, &label.chars().take(64).collect::<String>()),
        None => store::owner_for(&url, &label),
    };
    let config = config.with_acquire_wait(wait);
    let sup = Supervisor::from_arc(store.clone(), config).with_owner(owner);

    let conflict = args.wait.conflict_exit_code;
    let (guard, extra) = match args.limit {
        Some(limit) => match limit::acquire(sup, &key, limit, wait, conflict, &mut signals).await {
            Ok(permit) => {
                let env = limit::env(&key, &permit, limit);
                (permit.into_guard(), env)
            }
            Err(code) => return code,
        },
        None => match acquire(&sup, &store, &key, wait, conflict, &mut signals).await {
            Ok(guard) => (guard, Vec::new()),
            Err(code) => return code,
        },
    };
    let status = supervise(guard, &args, grace, &url, &extra, &mut signals).await;
    ExitCode::from(status)
}

/// The longest grace that fits: half the loss lead.
///
/// Loss is published a loss lead before the lease's local deadline (the deadline itself lies
/// before the store's expiry). SIGTERM goes out at once, SIGKILL after the grace; the other half
/// of the lead absorbs a loss noticed late on a busy host and the time the kill takes.
pub(crate) fn grace_budget(config: &SupervisorConfig) -> Duration {
    config.loss_lead().min(config.ttl() / 2) / 2
}

/// The grace to use: the one asked for if it fits in [`grace_budget`], else an error explaining
/// the trade-off; the budget itself when none was asked for.
///
/// A grace that does not fit is refused rather than shortened in silence: what `--grace` says is
/// what the command gets whenever the loss is noticed on time.
pub(crate) fn fit_grace(
    asked: Option<Duration>,
    config: &SupervisorConfig,
) -> Result<Duration, String> {
    let budget = grace_budget(config);
    match asked {
        None => Ok(budget),
        Some(g) if g <= budget => Ok(g),
        Some(g) => Err(format!(
            "--grace {} cannot fit: after a lost lease the command must be dead before the \
             lease's local deadline, and loss is noticed only {} (the loss lead, a tenth of \
             --ttl {}) before it; --grace may be at most half of that, {}. Lower --grace, or \
             raise --ttl to twenty times the grace ({}).",
            human(g),
            human(config.loss_lead()),
            human(config.ttl()),
            human(budget),
            human(g.saturating_mul(20)),
        )),
    }
}

/// The grace for a loss noticed now: `grace`, shortened to half the time left before the
/// lease's local deadline, so that SIGKILL lands before it even when the loss was noticed late.
fn grace_before_deadline(guard: &LeaseGuard, grace: Duration) -> Duration {
    grace.min(guard.lease().remaining() / 2)
}

/// Acquires with a bounded wait, showing progress on a terminal; SIGINT, SIGTERM, SIGHUP or
/// SIGQUIT cancels the wait. Not acquired in time: `conflict` (75 unless `-E` says otherwise).
pub(crate) async fn acquire(
    sup: &Supervisor,
    store: &Arc<dyn LeaseStore>,
    key: &LeaseKey,
    wait: Duration,
    conflict: u8,
    signals: &mut Signals,
) -> Result<LeaseGuard, ExitCode> {
    let cancel = CancellationToken::new();
    let attempt = sup.acquire_until_cancelled(key, &cancel);
    tokio::pin!(attempt);
    let progress = std::io::stderr().is_terminal() && !wait.is_zero();
    let started = Instant::now();
    let mut interrupted = None;
    let mut shown = false;
    let result = loop {
        tokio::select! {
            r = &mut attempt => break r,
            sig = signals.recv(), if interrupted.is_none() => {
                if stops_waiting(sig) {
                    interrupted = Some(sig);
                    cancel.cancel();
                }
            }
            () = sleep(Duration::from_millis(500)), if progress => {
                if let Ok(Ok(state)) = timeout(Duration::from_secs(1), store.inspect(key)).await
                    && let Some(h) = state.holder
                {
                    eprint!(
                        "\r\x1b[2Klease: waiting for {key}: held by {} (token {}, {} left unless renewed); waited {} of {}",
                        h.owner, h.token, human(h.remaining), human(started.elapsed()), human(wait)
                    );
                    shown = true;
                }
            }
        }
    };
    if shown {
        eprint!("\r\x1b[2K");
    }
    match result {
        Ok(Acquisition::Acquired(guard)) => Ok(guard),
        Ok(Acquisition::NotAcquired { holder, waited }) => {
            eprintln!(
                "lease: {key} not acquired{}{}",
                if wait.is_zero() {
                    String::new()
                } else {
                    format!(" within {}", human(waited))
                },
                describe(holder.as_ref())
            );
            Err(ExitCode::from(conflict))
        }
        Ok(Acquisition::Cancelled) => {
            let sig = interrupted.unwrap_or(Signal::SIGINT);
            eprintln!("lease: interrupted ({sig}) while waiting for {key}");
            Err(ExitCode::from(exit::signalled(sig as i32)))
        }
        Err(e) => Err(exit::from_error(&format!("cannot acquire {key}"), &e)),
    }
}

fn describe(holder: Option<&Holder>) -> String {
    match holder {
        Some(h) => format!(
            ": held by {} (token {}, {} left)",
            h.owner,
            h.token,
            human(h.remaining)
        ),
        None => String::new(),
    }
}

/// Runs the command under the guard; returns the exit status of `lease run`.
///
/// The command runs under the [`shim`] in a process group of its own. `lease` is a
/// child subreaper (set in [`main`]), so descendants orphaned when the shim is gone come to it;
/// the lease is kept until the shim has exited and no descendant runs any more.
async fn supervise(
    guard: LeaseGuard,
    args: &RunArgs,
    grace: Duration,
    url: &str,
    extra_env: &[(&'static str, String)],
    signals: &mut Signals,
) -> u8 {
    let key = guard.key().clone();
    let token = guard.token();
    let argv = args.argv();
    let Some((program, rest)) = argv.split_first() else {
        let _ = guard.release().await;
        return exit::USAGE;
    };
    let (mut chld, mut job) = match (signal(SignalKind::child()), JobControl::install()) {
        (Ok(c), Ok(j)) => (c, j),
        (Err(e), _) | (_, Err(e)) => {
            let _ = guard.release().await;
            eprintln!("lease: cannot install signal handlers: {e}");
            return exit::SOFTWARE;
        }
    };
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("lease")
        .arg(shim::ARG)
        .arg(getpid().to_string())
        .args(args.stop_leftovers.then_some(shim::EXIT_WITH_COMMAND))
        .arg("--")
        .arg(program)
        .args(rest)
        .env("LEASE_KEY", key.as_str())
        .env("LEASE_OWNER", guard.owner().as_str())
        .env("LEASE_FENCING_TOKEN", token.to_string())
        .env("LEASE_TTL_MS", guard.lease().ttl().as_millis().to_string())
        .envs(extra_env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    if std::env::var_os(store::STORE_ENV).is_none() && args.store.store.is_none() {
        // Children that call `lease status` see the same (default) store.
        cmd.env(store::STORE_ENV, url);
    }
    // Last check before anything runs: a lease that may no longer act (lost, at risk, or past
    // its loss deadline already, as with a TTL shorter than the time to get here) starts nothing.
    if !guard.may_act() {
        let health = guard.health();
        let _ = guard.release().await;
        eprintln!(
            "lease: the lease on {key} (token {token}) could no longer be relied on ({health:?}) \
             when the command was about to start; it was not started"
        );
        return exit::LOST;
    }
    // Spawned from the thread that runs `block_on` (the main thread), which lives as long as
    // the process: the shim's parent-death signal follows the thread that forked it.
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            eprintln!("lease: cannot start {}: {e}", program.to_string_lossy());
            return exit::SOFTWARE;
        }
    };
    let Some(group) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
    else {
        let _ = guard.release().await;
        eprintln!("lease: the command's process has no id");
        return exit::SOFTWARE;
    };
    let mut tree = Tree {
        child: &mut child,
        group,
        status: None,
    };
    let mut health = guard.subscribe();
    let mut poll = tokio::time::interval(LEFTOVER_POLL);
    // Whether `lease` stopped the command (job control) and has not continued it yet. It stays
    // stopped until the lease may act again (a renewal confirmed) or is lost (then it is killed
    // without running again).
    let mut suspended = false;
    let ended = loop {
        tokio::select! {
            biased;
            status = tree.child.wait(), if tree.status.is_none() => {
                tree.status = Some(match status {
                    Ok(status) => status_of(status),
                    Err(e) => {
                        eprintln!("lease: cannot wait for the command: {e}");
                        exit::SOFTWARE
                    }
                });
            }
            sig = signals.recv() => {
                tree::signal_all(Scope::OutsideMyGroup, Some(group), sig);
            }
            changed = health.changed() => {
                let now = *health.borrow_and_update();
                match now {
                    Health::Lost(reason) => {
                        eprintln!("lease: lost the lease on {key} (token {token}): {reason}; stopping the command");
                        tree.stop(grace_before_deadline(&guard, grace)).await;
                        return exit::LOST;
                    }
                    Health::AtRisk => eprintln!("lease: warning: renewal of {key} not confirmed; the lease is at risk"),
                    Health::Held => eprintln!("lease: renewal of {key} confirmed again"),
                    _ => {}
                }
                if changed.is_err() {
                    // The supervisor ended without a final state we saw: treat as lost.
                    tree.stop(grace_before_deadline(&guard, grace)).await;
                    return exit::LOST;
                }
            }
            sig = job.recv() => {
                // Ctrl-Z: stop the command, then `lease` itself (it no longer renews); on
                // SIGCONT, continue the command only under a lease that may still act.
                tree::signal_all(Scope::OutsideMyGroup, Some(group), Signal::SIGSTOP);
                // The shim (the group's leader, doing none of the work) runs on, so that it can
                // still kill the stopped tree if `lease` is killed while stopped.
                let _ = nix::sys::signal::kill(group, Signal::SIGCONT);
                suspended = true;
                eprintln!("lease: {sig}: stopped the command and `lease`; the lease is not renewed while stopped");
                let _ = raise(Signal::SIGSTOP);
            }
            _ = chld.recv() => {}
            _ = poll.tick(), if tree.status.is_some() || suspended => {}
        }
        if suspended && guard.may_act() {
            tree::signal_all(Scope::OutsideMyGroup, Some(group), Signal::SIGCONT);
            suspended = false;
        }
        tree::reap_orphans(Scope::OutsideMyGroup, Some(group));
        if let Some(status) = tree.status {
            if args.stop_leftovers && tree::any_running(Scope::OutsideMyGroup) {
                tree.stop(grace_before_deadline(&guard, grace)).await;
            }
            if !tree::any_running(Scope::OutsideMyGroup) {
                break status;
            }
        }
    };
    let lost = matches!(guard.health(), Health::Lost(_));
    let released = guard.release().await;
    if lost {
        eprintln!("lease: the lease on {key} (token {token}) was lost before the command ended");
        return exit::LOST;
    }
    if let Ok(leasehold::ReleaseOutcome::NotHeld) = released {
        // Expired, revoked or taken over before the command ended: its work may have overlapped
        // with the next holder's, so this is reported as a loss, not as the command's success.
        eprintln!(
            "lease: the lease on {key} (token {token}) was no longer held at release: it was lost \
             before the command ended"
        );
        return exit::LOST;
    }
    ended
}

/// How often `lease run` looks for descendants still running once the command itself ended.
const LEFTOVER_POLL: Duration = Duration::from_millis(50);

/// How long SIGKILL may take to end every descendant before `lease` gives up waiting (a process
/// stuck in uninterruptible sleep dies only when the kernel lets it).
const KILL_LIMIT: Duration = Duration::from_secs(5);

/// The command's process tree: the shim (the direct child, leader of the command's group) and
/// every descendant.
struct Tree<'a> {
    child: &'a mut Child,
    group: Pid,
    /// The shim's exit status once it ended.
    status: Option<u8>,
}

impl Tree<'_> {
    /// SIGTERM to every process of the tree; SIGKILL after `grace` to whatever still runs, and
    /// again until nothing does. Returns once the tree is gone (or after [`KILL_LIMIT`]).
    async fn stop(&mut self, grace: Duration) {
        tree::signal_all(Scope::OutsideMyGroup, Some(self.group), Signal::SIGTERM);
        let until = Instant::now() + grace;
        while self.reap() && Instant::now() < until {
            sleep(Duration::from_millis(10)).await;
        }
        if self.reap() {
            eprintln!(
                "lease: the command did not stop within {}; killing it",
                human(grace)
            );
        }
        let until = Instant::now() + KILL_LIMIT;
        loop {
            tree::signal_all(Scope::OutsideMyGroup, Some(self.group), Signal::SIGKILL);
            if !self.reap() {
                break;
            }
            if Instant::now() > until {
                eprintln!(
                    "lease: some of the command's processes did not die within {} of SIGKILL",
                    human(KILL_LIMIT)
                );
                break;
            }
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// Reaps what ended; whether anything of the tree still runs.
    fn reap(&mut self) -> bool {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.status = Some(status_of(status));
        }
        tree::reap_orphans(Scope::OutsideMyGroup, Some(self.group));
        tree::any_running(Scope::OutsideMyGroup)
    }
}

/// The command's status, or 128+N if signal N killed it.
fn status_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::SOFTWARE),
        (None, Some(sig)) => exit::signalled(sig),
        (None, None) => exit::SOFTWARE,
    }
}
