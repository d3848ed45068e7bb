//! This backend's failures and their mapping into [`leasehold_core::Error`], by kind.

use std::time::Duration;

use leasehold_core::Error;

/// The backend name used in errors, logs and metrics.
pub(crate) const BACKEND: &str = "etcd";

/// What can go wrong talking to etcd, before it becomes a [`leasehold_core::Error`].
#[derive(Debug)]
pub(crate) enum EtcdError {
    /// The driver failed request `op`; `after` is the request timeout, reported when etcd says
    /// the deadline passed.
    Driver {
        op: &'static str,
        source: etcd_client::Error,
        after: Duration,
    },
    /// etcd answered something the protocol does not allow.
    Protocol(String),
}

impl From<EtcdError> for Error {
    fn from(e: EtcdError) -> Error {
        match e {
            EtcdError::Driver { op, source, after } => driver(op, source, after),
            EtcdError::Protocol(message) => Error::store_fault(BACKEND, message, None),
        }
    }
}

/// Maps a driver error into the core error (see [`EtcdError::Driver`]).
pub(crate) fn map(op: &'static str, source: etcd_client::Error, after: Duration) -> Error {
    EtcdError::Driver { op, source, after }.into()
}

/// A malformed or unexpected answer from etcd.
pub(crate) fn protocol(message: impl Into<String>) -> Error {
    EtcdError::Protocol(message.into()).into()
}

/// By the error's kind, never by its message. A request that certainly never reached etcd
/// (connection refused) is [`Error::refused`]: its outcome is known.
fn driver(op: &'static str, err: etcd_client::Error, after: Duration) -> Error {
    use etcd_client::Error as E;
    if let Some(tls) = tls_failure(&err) {
        let message = format!("{op}: the TLS handshake with etcd failed: {tls}");
        return Error::config(BACKEND, message, Some(Box::new(err) as _));
    }
    if let E::GRpcStatus(status) = &err
        && matches!(
            i32::from(status.code()),
            PERMISSION_DENIED | UNAUTHENTICATED
        )
    {
        let message = format!("{op}: etcd refused this client: {}", status.message());
        return Error::config(BACKEND, message, Some(Box::new(err) as _));
    }
    if not_sent(&err) {
        return Error::refused(BACKEND, format!("{op}: {err}"), Some(Box::new(err) as _));
    }
    match err {
        E::InvalidArgs(_) | E::InvalidUri(_) | E::EndpointError(_) | E::InvalidMetadataValue(_) => {
            Error::config(BACKEND, format!("{op}: {err}"), Some(Box::new(err) as _))
        }
        E::IoError(_) | E::TransportError(_) | E::EndpointsNotManaged => {
            Error::unavailable(BACKEND, format!("{op}: {err}"), Some(Box::new(err) as _))
        }
        E::GRpcStatus(ref status) => {
            let code = i32::from(status.code());
            let transient = matches!(code, CANCELLED | ABORTED | RESOURCE_EXHAUSTED | UNAVAILABLE)
                || (code == UNKNOWN && is_io(status as &(dyn std::error::Error + 'static)));
            if code == DEADLINE_EXCEEDED {
                Error::Timeout {
                    backend: BACKEND,
                    operation: op,
                    after,
                }
            } else if transient {
                Error::unavailable(BACKEND, format!("{op}: {err}"), Some(Box::new(err) as _))
            } else {
                Error::store_fault(BACKEND, format!("{op}: {err}"), Some(Box::new(err) as _))
            }
        }
        _ => Error::store_fault(BACKEND, format!("{op}: {err}"), Some(Box::new(err) as _)),
    }
}

// gRPC status codes (https://grpc.io/docs/guides/status-codes/); `tonic` is not a direct
// dependency, so its `Code` enum is compared through its numeric value.
const CANCELLED: i32 = 1;
const UNKNOWN: i32 = 2;
const DEADLINE_EXCEEDED: i32 = 4;
const NOT_FOUND: i32 = 5;
const OUT_OF_RANGE: i32 = 11;
const RESOURCE_EXHAUSTED: i32 = 8;
const ABORTED: i32 = 10;
const UNAVAILABLE: i32 = 14;
const INVALID_ARGUMENT: i32 = 3;
const FAILED_PRECONDITION: i32 = 9;
const PERMISSION_DENIED: i32 = 7;
const UNAUTHENTICATED: i32 = 16;

/// Whether etcd refused to authenticate a user: `InvalidArgument` ("authentication failed,
/// invalid user ID or password"), `FailedPrecondition` ("authentication is not enabled"),
/// `PermissionDenied` or `Unauthenticated`.
pub(crate) fn is_auth_refusal(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(s)
    if matches!(
        i32::from(s.code()),
        INVALID_ARGUMENT | FAILED_PRECONDITION | PERMISSION_DENIED | UNAUTHENTICATED
    ))
}

/// The TLS error (a certificate refused by either side, a handshake alert) somewhere in the
/// error's chain: rustls reports it inside an I/O error of kind `InvalidData`.
fn tls_failure(err: &etcd_client::Error) -> Option<&rustls::Error> {
    let root: &(dyn std::error::Error + 'static) = match err {
        etcd_client::Error::GRpcStatus(status) => status,
        etcd_client::Error::TransportError(e) => e,
        _ => return None,
    };
    let mut source = Some(root);
    while let Some(s) = source {
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = s
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        source = s.source();
    }
    None
}

/// Whether etcd answered `NotFound`: for lease requests, "requested lease not found" (the etcd
/// lease expired or was revoked).
pub(crate) fn is_not_found(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(s) if i32::from(s.code()) == NOT_FOUND)
}

/// Whether etcd answered `OutOfRange`: for a range at a past revision, "required revision has
/// been compacted".
pub(crate) fn is_compacted(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(s) if i32::from(s.code()) == OUT_OF_RANGE)
}

/// Whether an error carries an I/O error somewhere in its source chain (a refused or reset
/// connection that tonic reports as a status).
fn is_io(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = err.source();
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether the request certainly never reached etcd (the connection to the chosen endpoint was
/// refused), so that sending it again, possibly to another endpoint, cannot apply it twice.
pub(crate) fn not_sent(err: &etcd_client::Error) -> bool {
    let root: &(dyn std::error::Error + 'static) = match err {
        etcd_client::Error::GRpcStatus(status) => status,
        etcd_client::Error::TransportError(e) => e,
        _ => return false,
    };
    let mut source = Some(root);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::NotConnected
                    | std::io::ErrorKind::AddrNotAvailable
            );
        }
        source = s.source();
    }
    false
}
