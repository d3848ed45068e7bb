//! `lease run`: acquire (bounded wait), run the command, renew, stop it on loss, release.

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::sync::Arc;
use std::time::Duration;

use lease::supervisor::{Acquisition, Health, LeaseGuard, Supervisor, SupervisorConfig};
use lease::{Holder, LeaseKey, LeaseStore, OwnerId};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::duration::human;
use crate::{RunArgs, exit, owner_label, store};

/// The signals `lease run` forwards to the command (and which cancel a wait).
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received.
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
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
    let wait = if args.no_wait {
        Duration::ZERO
    } else {
        args.wait
    };
    store::warn_redis_failover(&url, &key, args.failover.accept_redis_failover);
    let owner = OwnerId::with_label(&owner_label(args.label.as_deref()));
    let config = config.with_acquire_wait(wait);
    let sup = Supervisor::from_arc(store.clone(), config).with_owner(owner);

    let guard = match acquire(&sup, &store, &key, wait, &mut signals).await {
        Ok(guard) => guard,
        Err(code) => return code,
    };
    let status = supervise(guard, &args, grace, &url, &mut signals).await;
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
fn fit_grace(asked: Option<Duration>, config: &SupervisorConfig) -> Result<Duration, String> {
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

/// Acquires with a bounded wait, showing progress on a terminal; a signal cancels the wait.
async fn acquire(
    sup: &Supervisor,
    store: &Arc<dyn LeaseStore>,
    key: &LeaseKey,
    wait: Duration,
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
                interrupted = Some(sig);
                cancel.cancel();
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
            Err(ExitCode::from(exit::NOT_ACQUIRED))
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
async fn supervise(
    guard: LeaseGuard,
    args: &RunArgs,
    grace: Duration,
    url: &str,
    signals: &mut Signals,
) -> u8 {
    let key = guard.key().clone();
    let token = guard.token();
    let Some((program, rest)) = args.command.split_first() else {
        let _ = guard.release().await;
        return exit::USAGE;
    };
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env("LEASE_KEY", key.as_str())
        .env("LEASE_OWNER", guard.owner().as_str())
        .env("LEASE_FENCING_TOKEN", token.to_string())
        .env("LEASE_TTL_MS", guard.lease().ttl().as_millis().to_string())
        .process_group(0);
    if std::env::var_os(store::STORE_ENV).is_none() && args.store.store.is_none() {
        // Children that call `lease status` see the same (default) store.
        cmd.env(store::STORE_ENV, url);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            eprintln!("lease: cannot run {}: {e}", program.to_string_lossy());
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let mut health = guard.subscribe();
    loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                let lost = matches!(guard.health(), Health::Lost(_));
                let released = guard.release().await;
                return match status {
                    Ok(_) if lost => {
                        eprintln!("lease: the lease on {key} (token {token}) was lost before the command ended");
                        exit::LOST
                    }
                    Ok(status) => {
                        if let Ok(lease::ReleaseOutcome::NotHeld) = released {
                            eprintln!("lease: warning: the lease on {key} (token {token}) was no longer held at release");
                        }
                        status_of(status)
                    }
                    Err(e) => {
                        eprintln!("lease: cannot wait for the command: {e}");
                        exit::SOFTWARE
                    }
                };
            }
            sig = signals.recv() => {
                if let Some(g) = group {
                    let _ = killpg(g, sig);
                }
            }
            changed = health.changed() => {
                let now = *health.borrow_and_update();
                match now {
                    Health::Lost(reason) => {
                        eprintln!("lease: lost the lease on {key} (token {token}): {reason}; stopping the command");
                        stop(&mut child, group, grace_before_deadline(&guard, grace)).await;
                        return exit::LOST;
                    }
                    Health::AtRisk => eprintln!("lease: warning: renewal of {key} not confirmed; the lease is at risk"),
                    Health::Held => eprintln!("lease: renewal of {key} confirmed again"),
                    _ => {}
                }
                if changed.is_err() {
                    // The supervisor ended without a final state we saw: treat as lost.
                    stop(&mut child, group, grace_before_deadline(&guard, grace)).await;
                    return exit::LOST;
                }
            }
        }
    }
}

/// SIGTERM to the command's process group, SIGKILL after `grace`.
async fn stop(child: &mut Child, group: Option<Pid>, grace: Duration) {
    match group {
        Some(g) => {
            let _ = killpg(g, Signal::SIGTERM);
        }
        None => {
            let _ = child.start_kill();
        }
    }
    if timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "lease: the command did not stop within {}; killing it",
            human(grace)
        );
        if let Some(g) = group {
            let _ = killpg(g, Signal::SIGKILL);
        }
        let _ = child.start_kill();
        let _ = child.wait().await;
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
