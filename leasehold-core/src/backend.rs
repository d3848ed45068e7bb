//! **For backend authors**: the small mechanics every [`LeaseStore`] and
//! [`FencedResource`] implementation needs, in one place.
//!
//! Applications do not need this module: it is not part of the user API re-exported at the crate
//! root. A backend uses it to
//! - check a requested TTL ([`validate_ttl`]) and round it to what the store can hold
//!   ([`ttl_millis`], [`ttl_secs`]), reporting the rounded-up TTL as the one granted;
//! - decode what it stored back into typed values ([`decode_token`], [`decode_owner`]), with
//!   one error for records that do not decode ([`corrupt`]);
//! - build the [`Lease`] it grants ([`granted_lease`], with [`default_drift`] as the margin a
//!   request gets unless it asks for another);
//! - read its options from the query of a store URL ([`UrlParams`]), refusing unknown ones.
//!
//! Everything else a store implementation names is re-exported here too, so that a backend can
//! be written against this one module: the contracts ([`LeaseStore`], [`FencedResource`]) with
//! their request and outcome types (also at the crate root, where applications find them), the
//! batch limits of [`LeaseStore::acquire_many`] ([`validate_acquire_many`], [`MAX_ACQUIRE_MANY`],
//! [`ACQUIRE_MANY_CONCURRENCY`]), the default batch renewal ([`renew_one_by_one`]), the watch stream a store returns ([`KeyWatch`]), and the switch
//! points of protocol mutation testing ([`mutation`]).
//!
//! Errors for failures of the store itself are built with [`Error::unavailable`],
//! [`Error::refused`], [`Error::store_fault`] and [`Error::Timeout`]; classify them with
//! [`Error::kind`].
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::backend::{decode_token, ttl_millis};
//! let ttl = ttl_millis(Duration::from_micros(1500))?;
//! assert_eq!((ttl.as_i64(), ttl.granted()), (2, Duration::from_millis(2)));
//! assert_eq!(decode_token("postgres", "job", 7i64)?.get(), 7);
//! assert!(decode_token("postgres", "job", -1i64).is_err());
//! # Ok::<(), leasehold_core::Error>(())
//! ```

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

pub use crate::url_params::UrlParams;

pub use crate::capability::{Capabilities, ExpiryClock, TokenDurability};
pub use crate::fencing::{
    FenceOp, FencedResource, FencingToken, ResourceState, WriteOp, WriteOutcome,
};
pub use crate::lease::{
    AcquireOutcome, AcquireRequest, HeldBy, Holder, KeyState, Lease, LeaseKey, OwnerId,
    ReleaseOutcome, RenewOutcome,
};
pub use crate::mutation;
pub use crate::store::{
    ACQUIRE_MANY_CONCURRENCY, KeyWatch, LeaseStore, MAX_ACQUIRE_MANY, renew_one_by_one,
    validate_acquire_many,
};

use crate::error::{Error, Result};
use crate::lease::MAX_TTL;

/// Checks a requested TTL against the universal bounds (non-zero, at most [`MAX_TTL`]) and a
/// backend's minimum. Backends call this before sending anything.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::backend::validate_ttl;
/// assert!(validate_ttl(Duration::ZERO, Duration::from_millis(1)).is_err());
/// assert!(validate_ttl(Duration::from_secs(10), Duration::from_millis(1)).is_ok());
/// assert!(validate_ttl(Duration::from_secs(7 * 86_400), Duration::from_millis(1)).is_err());
/// ```
///
/// # Errors
/// [`Error::InvalidTtl`] naming the allowed range.
pub fn validate_ttl(ttl: Duration, min: Duration) -> Result<()> {
    let min = min.max(Duration::from_millis(1));
    if ttl < min || ttl > MAX_TTL {
        return Err(Error::InvalidTtl {
            ttl,
            reason: format!("must be between {min:?} and {MAX_TTL:?}"),
        });
    }
    Ok(())
}

/// The default drift margin for a TTL: 2% plus 1 ms (see
/// [`AcquireRequest::drift_margin`](crate::AcquireRequest::drift_margin)).
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::backend::default_drift;
/// assert_eq!(default_drift(Duration::from_secs(10)), Duration::from_millis(201));
/// ```
pub fn default_drift(ttl: Duration) -> Duration {
    ttl / 50 + Duration::from_millis(1)
}

/// Builds the [`Lease`] a store grants. `sent` is the instant the granting request was sent;
/// `ttl` is the TTL the store granted (after rounding, never below the request); `drift_margin`
/// is the request's [`drift_margin`](crate::AcquireRequest::drift_margin). The local deadline is
/// `sent + ttl - drift_margin`.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{FencingToken, LeaseKey, OwnerId};
/// use leasehold_core::backend::granted_lease;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let sent = tokio::time::Instant::now();
/// let lease = granted_lease(LeaseKey::new("job")?, OwnerId::random(), FencingToken::MIN,
///     Duration::from_secs(10), Duration::from_secs(1), sent);
/// assert_eq!(lease.deadline(), sent + Duration::from_secs(9));
/// # Ok(()) }
/// ```
pub fn granted_lease(
    key: LeaseKey,
    owner: OwnerId,
    token: FencingToken,
    ttl: Duration,
    drift_margin: Duration,
    sent: Instant,
) -> Lease {
    Lease::granted(key, owner, token, ttl, drift_margin, sent)
}

/// A TTL rounded **up** to whole units (milliseconds or seconds) of what a store can hold.
///
/// The count is at least 1 and at most [`MAX_TTL`] in milliseconds (86 400 000), so it fits
/// every integer type a store uses: `u32`, `i32`, `i64` and `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundedTtl {
    units: u32,
    granted: Duration,
}

impl RoundedTtl {
    /// The number of whole units.
    pub fn get(self) -> u32 {
        self.units
    }

    /// The number of whole units as an `i64` (SQL `BIGINT`, etcd and Kubernetes integers).
    pub fn as_i64(self) -> i64 {
        i64::from(self.units)
    }

    /// The number of whole units as a `u64` (Redis `PX`).
    pub fn as_u64(self) -> u64 {
        u64::from(self.units)
    }

    /// The number of whole units as an `i32` (Kubernetes `leaseDurationSeconds`). Never
    /// saturates in practice: the count is at most 86 400 000.
    pub fn as_i32(self) -> i32 {
        i32::try_from(self.units).unwrap_or(i32::MAX)
    }

    /// The TTL the rounded count stands for: at least the requested TTL. Report this as the
    /// granted TTL.
    pub fn granted(self) -> Duration {
        self.granted
    }
}

fn rounded(ttl: Duration, unit: Duration, unit_name: &str) -> Result<RoundedTtl> {
    if ttl.is_zero() || ttl > MAX_TTL {
        return Err(Error::InvalidTtl {
            ttl,
            reason: format!("must be between 1ns and {MAX_TTL:?} to round to whole {unit_name}"),
        });
    }
    // ttl <= MAX_TTL, so the count is at most 86_400_000 and both conversions succeed.
    let count = ttl.as_nanos().div_ceil(unit.as_nanos());
    let units = u32::try_from(count).map_err(|_| Error::InvalidTtl {
        ttl,
        reason: format!("does not fit in whole {unit_name}"),
    })?;
    Ok(RoundedTtl {
        units,
        granted: unit.saturating_mul(units),
    })
}

/// `ttl` in whole milliseconds, rounded up (1.5 ms becomes 2 ms), and the granted TTL it stands
/// for.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::backend::ttl_millis;
/// assert_eq!(ttl_millis(Duration::from_nanos(1))?.get(), 1);
/// assert!(ttl_millis(Duration::ZERO).is_err());
/// assert!(ttl_millis(Duration::MAX).is_err());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidTtl`] for a zero TTL or one above [`MAX_TTL`]; never panics.
pub fn ttl_millis(ttl: Duration) -> Result<RoundedTtl> {
    rounded(ttl, Duration::from_millis(1), "milliseconds")
}

/// `ttl` in whole seconds, rounded up (1.001 s becomes 2 s), and the granted TTL it stands for.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::backend::ttl_secs;
/// let t = ttl_secs(Duration::from_millis(1001))?;
/// assert_eq!((t.get(), t.granted()), (2, Duration::from_secs(2)));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidTtl`] for a zero TTL or one above [`MAX_TTL`]; never panics.
pub fn ttl_secs(ttl: Duration) -> Result<RoundedTtl> {
    rounded(ttl, Duration::from_secs(1), "seconds")
}

/// The error for a stored record that does not decode: a negative token, an illegal owner, a
/// missing field. An [`Error::Backend`] whose message names the backend, the key (or storage
/// name) and what was wrong. Not retryable, and [`Error::outcome_unknown`] is false.
///
/// ```
/// use leasehold_core::{ErrorKind, backend::corrupt};
/// let e = corrupt("sqlite", "job", "token: -1 is negative");
/// assert_eq!(e.kind(), ErrorKind::Backend);
/// assert_eq!(e.to_string(), "sqlite backend error: corrupt record for key \"job\": token: -1 is negative");
/// ```
pub fn corrupt(backend: &'static str, key: &str, what: impl fmt::Display) -> Error {
    Error::Backend {
        backend,
        message: format!("corrupt record for key {key:?}: {what}"),
        source: None,
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i64 {}
    impl Sealed for u64 {}
    impl Sealed for &str {}
    impl Sealed for String {}
}

/// A form in which backends store a fencing token: `i64` (SQL `BIGINT`, etcd revisions), `u64`,
/// or decimal text (`&str`, `String`: Redis fields, Kubernetes annotations). Sealed.
pub trait StoredToken: sealed::Sealed + fmt::Debug {
    /// The token, or why the stored value is not one.
    fn to_token(&self) -> Result<FencingToken>;
}

impl StoredToken for i64 {
    fn to_token(&self) -> Result<FencingToken> {
        FencingToken::try_from(*self)
    }
}

impl StoredToken for u64 {
    fn to_token(&self) -> Result<FencingToken> {
        FencingToken::new(*self)
    }
}

impl StoredToken for &str {
    fn to_token(&self) -> Result<FencingToken> {
        self.parse()
    }
}

impl StoredToken for String {
    fn to_token(&self) -> Result<FencingToken> {
        self.parse()
    }
}

/// Decodes a stored fencing token of `key`.
///
/// ```
/// use leasehold_core::backend::decode_token;
/// assert_eq!(decode_token("redis", "job", "42")?.get(), 42);
/// assert!(decode_token("redis", "job", "4x2").is_err());
/// assert!(decode_token("etcd", "job", 0u64).is_err());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
///
/// # Errors
/// [`corrupt`] (an [`Error::Backend`]) naming `backend`, `key` and the value, if the value is
/// not a legal token (0, negative, above `i64::MAX`, not a number).
pub fn decode_token(
    backend: &'static str,
    key: &str,
    value: impl StoredToken,
) -> Result<FencingToken> {
    value
        .to_token()
        .map_err(|e| corrupt(backend, key, format_args!("token {value:?}: {e}")))
}

/// Decodes a stored owner id of `key`. Foreign owners (see
/// [`OwnerId::foreign`](crate::OwnerId::foreign)) do not decode: a backend that reports them
/// builds them itself.
///
/// ```
/// use leasehold_core::backend::decode_owner;
/// assert_eq!(decode_owner("postgres", "job", "web-7")?.as_str(), "web-7");
/// assert!(decode_owner("postgres", "job", "").is_err());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
///
/// # Errors
/// [`corrupt`] naming `backend`, `key` and the value, if it is not a legal [`OwnerId`].
pub fn decode_owner(backend: &'static str, key: &str, value: &str) -> Result<OwnerId> {
    OwnerId::new(value).map_err(|e| corrupt(backend, key, format_args!("owner: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn millis_round_up_and_report_the_granted_ttl() {
        let t = ttl_millis(Duration::from_nanos(1_000_001)).unwrap();
        assert_eq!((t.get(), t.granted()), (2, Duration::from_millis(2)));
        let t = ttl_millis(Duration::from_millis(250)).unwrap();
        assert_eq!((t.as_i64(), t.as_u64()), (250, 250));
        let t = ttl_millis(MAX_TTL).unwrap();
        assert_eq!((t.get(), t.granted()), (86_400_000, MAX_TTL));
    }

    #[test]
    fn seconds_round_up_and_report_the_granted_ttl() {
        let t = ttl_secs(Duration::from_millis(1)).unwrap();
        assert_eq!((t.as_i32(), t.granted()), (1, Duration::from_secs(1)));
        let t = ttl_secs(Duration::from_secs(30)).unwrap();
        assert_eq!((t.get(), t.granted()), (30, Duration::from_secs(30)));
        let t = ttl_secs(Duration::from_nanos(30_000_000_001)).unwrap();
        assert_eq!(t.get(), 31);
    }

    #[test]
    fn zero_and_absurd_ttls_are_typed_errors() {
        for bad in [
            Duration::ZERO,
            MAX_TTL + Duration::from_nanos(1),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ] {
            for r in [ttl_millis(bad), ttl_secs(bad)] {
                assert!(
                    matches!(r, Err(Error::InvalidTtl { ttl, .. }) if ttl == bad),
                    "{bad:?}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn tokens_decode_from_every_stored_form() {
        assert_eq!(decode_token("b", "k", 5i64).unwrap().get(), 5);
        assert_eq!(decode_token("b", "k", 5u64).unwrap().get(), 5);
        assert_eq!(decode_token("b", "k", " 5 ").unwrap().get(), 5);
        assert_eq!(decode_token("b", "k", "5".to_string()).unwrap().get(), 5);
        assert_eq!(decode_token("b", "k", i64::MAX).unwrap(), FencingToken::MAX);
    }

    #[test]
    fn bad_tokens_are_corrupt_records_naming_backend_key_and_value() {
        let bad: Vec<Error> = vec![
            decode_token("postgres", "job", 0i64).unwrap_err(),
            decode_token("postgres", "job", -3i64).unwrap_err(),
            decode_token("postgres", "job", u64::MAX).unwrap_err(),
            decode_token("postgres", "job", "").unwrap_err(),
            decode_token("postgres", "job", "-3").unwrap_err(),
            decode_token("postgres", "job", "x".to_string()).unwrap_err(),
        ];
        for e in bad {
            assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
            assert!(!e.is_retryable() && !e.outcome_unknown(), "{e}");
            let text = e.to_string();
            assert!(
                text.starts_with("postgres backend error: corrupt record for key \"job\": token"),
                "{text}"
            );
        }
        let e = decode_token("redis", "k", "-3").unwrap_err().to_string();
        assert!(e.contains("\"-3\""), "{e}");
    }

    #[test]
    fn owners_decode_and_bad_owners_are_corrupt_records() {
        assert_eq!(decode_owner("b", "k", "a-1").unwrap().as_str(), "a-1");
        for bad in ["", "has space", "etcd-lock:/x", &"x".repeat(200)] {
            let e = decode_owner("sqlite", "job", bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Backend, "{bad:?}");
            assert!(
                e.to_string()
                    .contains("corrupt record for key \"job\": owner"),
                "{e}"
            );
        }
    }

    #[test]
    fn validate_ttl_bounds() {
        let min = Duration::from_secs(1);
        assert!(validate_ttl(Duration::from_millis(999), min).is_err());
        assert!(validate_ttl(min, min).is_ok());
        assert!(validate_ttl(MAX_TTL, min).is_ok());
        assert!(validate_ttl(Duration::MAX, min).is_err());
        assert!(validate_ttl(Duration::ZERO, Duration::ZERO).is_err());
    }

    #[test]
    fn granted_lease_deadline_is_sent_plus_ttl_minus_drift() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(10);
        let lease = granted_lease(
            LeaseKey::new("k").unwrap(),
            OwnerId::random(),
            FencingToken::MIN,
            ttl,
            default_drift(ttl),
            sent,
        );
        assert_eq!(lease.deadline(), sent + Duration::from_millis(9_799));
        assert_eq!(lease.ttl(), ttl);
    }
}
