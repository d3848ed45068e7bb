//! What this crate writes into etcd and into lease handles: lock key values, owners, handles,
//! TTL seconds.

use std::fmt;
use std::time::Duration;

use etcd_client::KeyValue;
use lease_core::{Error, FencingToken, OwnerId, Result};

use crate::error::protocol;

/// The tag that marks a lock key written by this crate; the owner id follows it. Keys written by
/// `etcdctl lock` or Go's `concurrency.Mutex` have an empty value.
const VALUE_TAG: &str = "lease-rs/1 ";

pub(crate) fn encode_owner(owner: &OwnerId) -> String {
    format!("{VALUE_TAG}{owner}")
}

/// The prefix of the stand-in owner ids under which holders of etcd's own lock (`etcdctl lock`,
/// Go's `concurrency.Mutex`) are reported. Reserved: no operation accepts such an owner.
pub(crate) const FOREIGN_OWNER: &str = "etcd-lock:";

/// Refuses owners in the stand-in form `etcd-lock:<key>`: they name holders of etcd's own lock,
/// whom nobody may renew or release through this crate.
pub(crate) fn check_owner(owner: &OwnerId) -> Result<()> {
    if owner.is_foreign() || owner.as_str().starts_with(FOREIGN_OWNER) {
        return Err(Error::InvalidOwner {
            owner: owner.as_str().chars().take(128).collect(),
            reason: "owner ids starting with \"etcd-lock:\" stand for holders of etcd's own lock \
                     (etcdctl lock, Go's concurrency.Mutex); nobody may act as them",
        });
    }
    Ok(())
}

/// The owner of a lock key written by this crate; `None` for any other key (`etcdctl lock`, a Go
/// mutex, a value written by hand), which no lease of this crate can hold.
pub(crate) fn our_owner(kv: &KeyValue) -> Option<OwnerId> {
    let owner = std::str::from_utf8(kv.value())
        .ok()?
        .strip_prefix(VALUE_TAG)?;
    OwnerId::new(owner).ok().filter(|o| check_owner(o).is_ok())
}

/// The owner named in a lock key, for reports: ours carry the owner id; a key of `etcdctl lock` or
/// a Go mutex is reported as `etcd-lock:<lock key>` (shortened to a legal owner id).
pub(crate) fn owner_of(kv: &KeyValue) -> OwnerId {
    if let Some(owner) = our_owner(kv) {
        return owner;
    }
    OwnerId::foreign(FOREIGN_OWNER, &String::from_utf8_lossy(kv.key()))
}

pub(crate) fn token_of(kv: &KeyValue) -> Result<FencingToken> {
    FencingToken::try_from(kv.create_revision())
        .map_err(|e| protocol(format!("lock key create revision: {e}")))
}

/// What a lease's handle records: its etcd lease, the granted TTL in seconds, the nonce of its
/// lock key when the etcd lease is shared, and the etcd lease named in the lock key (differs from
/// `lease_id` once a renewal moved the key onto another store's etcd lease). Written as hex
/// fields separated by `/`; the last one only when it differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) lease_id: i64,
    pub(crate) ttl_secs: i64,
    pub(crate) nonce: Option<u64>,
    pub(crate) named: i64,
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}/{:x}", self.lease_id, self.ttl_secs)?;
        match self.nonce {
            Some(n) if self.named != self.lease_id => write!(f, "/{n:x}/{:x}", self.named),
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
    let named = match parts.next() {
        Some(n) => i64::from_str_radix(n, 16).ok()?,
        None => lease_id,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(Handle {
        lease_id,
        ttl_secs,
        nonce,
        named,
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

/// The etcd lease named in a lock key (`<lock name>/<lease hex>[-<nonce hex>]`).
pub(crate) fn named_lease_of(lock_key: &[u8]) -> Option<i64> {
    let name = std::str::from_utf8(lock_key).ok()?;
    let (_, last) = name.rsplit_once('/')?;
    let hex = last.split_once('-').map_or(last, |(l, _)| l);
    i64::from_str_radix(hex, 16).ok()
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
                named: 0x694d_7b1a_22f3,
            },
            Handle {
                lease_id: 7,
                ttl_secs: 2,
                nonce: Some(0x1f),
                named: 7,
            },
            Handle {
                lease_id: 7,
                ttl_secs: 2,
                nonce: Some(0x1f),
                named: 0x9,
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
        assert_eq!(
            named_lease_of(b"lease/k/694d7b1a22f3-1f"),
            Some(0x694d_7b1a_22f3)
        );
        assert_eq!(named_lease_of(b"lease/k/1f"), Some(0x1f));
        assert_eq!(named_lease_of(b"lease/k/zz"), None);
    }
}
