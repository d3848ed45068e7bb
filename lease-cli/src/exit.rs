//! Exit statuses of the `lease` command (documented in `docs/cli.md` and `lease --help`).

use std::process::ExitCode;

use lease::Error;

/// Usage error: bad arguments (sysexits `EX_USAGE`).
pub(crate) const USAGE: u8 = 64;
/// The store could not be reached or did not answer in time (sysexits `EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The store answered something unexpected, or an internal error (sysexits `EX_SOFTWARE`).
pub(crate) const SOFTWARE: u8 = 70;
/// `lease run`: the lease was not acquired within `--wait` (or at once with `--no-wait`)
/// (sysexits `EX_TEMPFAIL`: try again later).
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// `lease run`: the lease was lost while the command ran; the command was stopped.
pub(crate) const LOST: u8 = 76;
/// Bad configuration: an unparsable store URL, a disabled backend, an illegal key or TTL
/// (sysexits `EX_CONFIG`).
pub(crate) const CONFIG: u8 = 78;
/// `lease run`: the command was found but could not be executed (as in shells).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// `lease run`: the command was not found (as in shells).
pub(crate) const NOT_FOUND: u8 = 127;

/// The status for a library error, after printing it.
pub(crate) fn from_error(context: &str, err: &Error) -> ExitCode {
    eprintln!("lease: {context}: {err}");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        eprintln!("  caused by: {s}");
        source = s.source();
    }
    ExitCode::from(status_of(err))
}

/// The status for a library error.
pub(crate) fn status_of(err: &Error) -> u8 {
    if err.is_retryable() {
        UNAVAILABLE
    } else if err.is_invalid_input() || matches!(err, Error::Config { .. }) {
        CONFIG
    } else {
        SOFTWARE
    }
}

/// 128 + the signal number, as shells report a process killed by a signal.
pub(crate) fn signalled(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(0, 127)).unwrap_or(u8::MAX)
}
