//! The shim between `lease run` and the command: `lease` starts itself again as
//! `lease __lease-run-shim PID -- CMD ARGS...`, and that process
//!
//! 1. asks the kernel to signal it when its parent (`lease`, PID) dies
//!    (`PR_SET_PDEATHSIG`), then checks that the parent is still PID (it may have died before);
//! 2. becomes a child subreaper, so that every descendant of the command that is orphaned
//!    (a background job whose shell exited, a `setsid` daemon, a double fork) is re-parented to
//!    it rather than to init;
//! 3. runs the command as its child, in its own process group (which `lease run` made for it),
//!    reaps every descendant that ends, and exits only when none is left, with the command's
//!    status (128+N if signal N killed the command);
//! 4. if `lease` dies (SIGKILL, the OOM killer), sends SIGKILL to every descendant and exits, so
//!    that the command does not run on unsupervised.
//!
//! Setting the parent-death signal has to happen in the child, between `fork` and `exec`; the
//! standard library offers that only through `unsafe` `pre_exec`, which the workspace forbids.
//! Running `lease` itself as the child does it without `unsafe`, and the same process can then
//! stay behind as the subreaper that finds every descendant when `lease` is gone.
//!
//! The shim ignores SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 (they reach the
//! command through its process group, where `lease` sends them; left at their default action,
//! SIGQUIT, SIGUSR1 and SIGUSR2 would end the shim); any signal, and a check every 100 ms, makes
//! it look whether its parent changed.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Pid, getppid};
use tokio::signal::unix::{SignalKind, signal};

use crate::exit;
use crate::tree::{self, Scope};

/// The first argument that makes `lease` the shim.
pub(crate) const ARG: &str = "__lease-run-shim";

/// The optional argument after the PID: exit when the command exits (see [`main`]).
pub(crate) const EXIT_WITH_COMMAND: &str = "--exit-with-command";

/// How often the shim checks its parent when nothing else woke it.
const PARENT_CHECK: Duration = Duration::from_millis(100);

/// Runs the shim with the arguments after [`ARG`]: `PID [--exit-with-command] -- CMD ARGS...`.
pub(crate) fn main(args: &[OsString]) -> ExitCode {
    let parent = args
        .first()
        .and_then(|a| a.to_str())
        .and_then(|a| a.parse::<i32>().ok())
        .map(Pid::from_raw);
    // `--exit-with-command` (for `lease run --stop-leftovers`): exit as soon as the command
    // does; what it left running is then re-parented to `lease`, which stops it.
    let exit_with_command = args.get(1).is_some_and(|a| a == EXIT_WITH_COMMAND);
    let skip = if exit_with_command { 3 } else { 2 };
    let (Some(parent), Some((program, rest))) =
        (parent, args.get(skip..).and_then(|c| c.split_first()))
    else {
        eprintln!("lease: {ARG} is internal to `lease run`");
        return ExitCode::from(exit::USAGE);
    };
    // The signal only wakes the shim; what it does next depends on its parent (see below).
    if let Err(e) = prctl::set_pdeathsig(Signal::SIGHUP) {
        eprintln!("lease: cannot set the parent-death signal: {e}");
        return ExitCode::from(exit::SOFTWARE);
    }
    if getppid() != parent {
        // `lease` died before the signal was set: do not start the command at all.
        return ExitCode::from(exit::LOST);
    }
    if let Err(e) = prctl::set_child_subreaper(true) {
        eprintln!("lease: cannot become a child subreaper: {e}");
        return ExitCode::from(exit::SOFTWARE);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease: cannot start the runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    ExitCode::from(runtime.block_on(supervise(parent, exit_with_command, program, rest)))
}

async fn supervise(
    parent: Pid,
    exit_with_command: bool,
    program: &OsString,
    rest: &[OsString],
) -> u8 {
    let (Ok(mut int), Ok(mut term), Ok(mut hup), Ok(mut chld)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
        signal(SignalKind::child()),
    ) else {
        eprintln!("lease: cannot install signal handlers");
        return exit::SOFTWARE;
    };
    let (Ok(mut quit), Ok(mut usr1), Ok(mut usr2)) = (
        signal(SignalKind::quit()),
        signal(SignalKind::user_defined1()),
        signal(SignalKind::user_defined2()),
    ) else {
        eprintln!("lease: cannot install signal handlers");
        return exit::SOFTWARE;
    };
    let command = match std::process::Command::new(program).args(rest).spawn() {
        // Reaped below with every other descendant; the handle itself is not needed.
        Ok(child) => Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX)),
        Err(e) => {
            eprintln!("lease: cannot run {}: {e}", program.to_string_lossy());
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
        }
    };
    let mut status = None;
    loop {
        if getppid() != parent {
            kill_everything();
            return exit::LOST;
        }
        loop {
            match waitpid(None::<Pid>, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == command => {
                    status = Some(u8::try_from(code).unwrap_or(exit::SOFTWARE));
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == command => {
                    status = Some(exit::signalled(sig as i32));
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => break,
                // No child left: every descendant has ended (orphans come to this subreaper).
                Err(_) => return status.unwrap_or(exit::SOFTWARE),
                Ok(_) => {}
            }
        }
        if let Some(status) = status
            && exit_with_command
        {
            return status;
        }
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
            _ = quit.recv() => {}
            _ = usr1.recv() => {}
            _ = usr2.recv() => {}
            _ = chld.recv() => {}
            () = tokio::time::sleep(PARENT_CHECK) => {}
        }
    }
}

/// SIGKILL to every descendant until none runs (bounded: a process stuck in the kernel may take
/// a while to die, and nothing better can be done then).
fn kill_everything() {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        tree::signal_all(Scope::All, None, Signal::SIGKILL);
        while let Ok(s) = waitpid(None::<Pid>, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            if s == WaitStatus::StillAlive {
                break;
            }
        }
        if !tree::any_running(Scope::All) || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
