//! Exit statuses of the `lease` command (documented in `docs/cli.md` and `lease --help`).

use std::process::ExitCode;

use leasehold::{Error, ErrorKind};

/// Usage error: bad arguments (sysexits `EX_USAGE`).
pub(crate) const USAGE: u8 = 64;
/// The store could not be reached or did not answer in time (sysexits `EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The store answered something unexpected, or an internal error (sysexits `EX_SOFTWARE`).
pub(crate) const SOFTWARE: u8 = 70;
/// `lease completions`, `lease man`: the output could not be written (sysexits `EX_IOERR`).
pub(crate) const IOERR: u8 = 74;
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
    let mut shown = err.to_string();
    eprintln!("lease: {context}: {shown}");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        let text = s.to_string();
        // Drivers often repeat their source's text in their own message: print what is new.
        if !shown.contains(&text) {
            eprintln!("  caused by: {text}");
            shown.push_str(&text);
        }
        source = s.source();
    }
    ExitCode::from(status_of(err))
}

/// The status for a library error.
pub(crate) fn status_of(err: &Error) -> u8 {
    match err.kind() {
        ErrorKind::Unavailable | ErrorKind::Timeout => UNAVAILABLE,
        ErrorKind::InvalidInput | ErrorKind::Config => CONFIG,
        _ => SOFTWARE,
    }
}

/// 128 + the signal number, as shells report a process killed by a signal.
pub(crate) fn signalled(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(0, 127)).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn errors_map_by_kind() {
        assert_eq!(
            status_of(&Error::unavailable("redis", "refused", None)),
            UNAVAILABLE
        );
        let timeout = Error::Timeout {
            backend: "etcd",
            operation: "acquire",
            after: Duration::from_secs(1),
        };
        assert_eq!(status_of(&timeout), UNAVAILABLE);
        assert_eq!(status_of(&Error::config("lease", "bad url", None)), CONFIG);
        assert_eq!(status_of(&Error::InvalidInput("x".into())), CONFIG);
        assert_eq!(
            status_of(&Error::store_fault("postgres", "corrupt row", None)),
            SOFTWARE
        );
    }

    #[test]
    fn signals_are_128_plus_n() {
        assert_eq!(signalled(2), 130);
        assert_eq!(signalled(15), 143);
        assert_eq!(signalled(9), 137);
    }

    #[test]
    fn statuses_are_distinct() {
        let all = [
            USAGE,
            UNAVAILABLE,
            SOFTWARE,
            NOT_ACQUIRED,
            LOST,
            CONFIG,
            CANNOT_EXECUTE,
            NOT_FOUND,
        ];
        let mut sorted = all.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
    }
}
