//! What this crate writes into etcd and into lease handles: lock key values, owners, handles,
//! TTL seconds.

use std::fmt;
use std::time::Duration;

use etcd_client::KeyValue;
use lease_core::{FencingToken, OwnerId, Result};

use crate::error::protocol;

/// The tag that marks a lock key written by this crate; the owner id follows it. Keys written by
/// `etcdctl lock` or Go's `concurrency.Mutex` have an empty value.
const VALUE_TAG: &str = "lease-rs/1 ";

pub(crate) fn encode_owner(owner: &OwnerId) -> String {
    format!("{VALUE_TAG}{owner}")
}

/// The owner named in a lock key: ours carry the owner id; a key of `etcdctl lock` or a Go mutex
/// is reported as `etcd-lock:<lock key>` (shortened to a legal owner id).
pub(crate) fn owner_of(kv: &KeyValue) -> OwnerId {
    if let Some(owner) = std::str::from_utf8(kv.value())
        .ok()
        .and_then(|v| v.strip_prefix(VALUE_TAG))
        && let Ok(owner) = OwnerId::new(owner)
    {
        return owner;
    }
    let key = String::from_utf8_lossy(kv.key());
    let tail: String = key
        .chars()
        .rev()
        .take(100)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let text: String = format!("etcd-lock:{tail}")
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    OwnerId::new(text).unwrap_or_else(|_| OwnerId::with_label("etcd-lock"))
}

pub(crate) fn token_of(kv: &KeyValue) -> Result<FencingToken> {
    FencingToken::try_from(kv.create_revision())
        .map_err(|e| protocol(format!("lock key create revision: {e}")))
}

/// What a lease's handle records: its etcd lease, the granted TTL in seconds, and the nonce of
/// its lock key when the etcd lease is shared. Written as hex fields separated by `/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) lease_id: i64,
    pub(crate) ttl_secs: i64,
    pub(crate) nonce: Option<u64>,
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}/{:x}", self.lease_id, self.ttl_secs)?;
        match self.nonce {
            Some(n) => write!(f, "/{n:x}"),
            None => Ok(()),
        }
    }
}

pub(crate) fn parse_handle(handle: Option<&str>) -> Option<Handle> {
    let mut parts = handle?.split('/');
    let lease_id = i64::from_str_radix(parts.next()?, 16).ok()?;
    let ttl_secs = i64::from_str_radix(parts.next()?, 16).ok()?;
    let nonce = match parts.next() {
        Some(n) => Some(u64::from_str_radix(n, 16).ok()?),
        None => None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(Handle {
        lease_id,
        ttl_secs,
        nonce,
    })
}

/// The nonce in the name of a lock key created under a shared etcd lease
/// (`<lock name>/<lease hex>-<nonce hex>`), if it has one.
pub(crate) fn nonce_of(lock_key: &[u8]) -> Option<u64> {
    let name = std::str::from_utf8(lock_key).ok()?;
    let (_, last) = name.rsplit_once('/')?;
    let (_, nonce) = last.split_once('-')?;
    u64::from_str_radix(nonce, 16).ok()
}

/// A TTL in whole seconds, rounded up. TTLs are at most a day, so this always fits.
pub(crate) fn whole_secs(ttl: Duration) -> i64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(s).unwrap_or(i64::MAX)
}

pub(crate) fn secs(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(whole_secs(Duration::from_millis(600)), 1);
        assert_eq!(whole_secs(Duration::from_secs(2)), 2);
        assert_eq!(whole_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn handles_round_trip() {
        for h in [
            Handle {
                lease_id: 0x694d_7b1a_22f3,
                ttl_secs: 30,
                nonce: None,
            },
            Handle {
                lease_id: 7,
                ttl_secs: 2,
                nonce: Some(0x1f),
            },
        ] {
            assert_eq!(parse_handle(Some(&h.to_string())), Some(h));
        }
        assert_eq!(parse_handle(Some("nonsense")), None);
        assert_eq!(parse_handle(None), None);
    }

    #[test]
    fn nonces_are_read_from_lock_key_names() {
        assert_eq!(nonce_of(b"lease/k/694d7b1a22f3-1f"), Some(0x1f));
        assert_eq!(nonce_of(b"lease/k/694d7b1a22f3"), None);
        assert_eq!(nonce_of(b"lease/k/694d7b1a22f3-zz"), None);
        assert_eq!(nonce_of(b"no-slash"), None);
    }
}
