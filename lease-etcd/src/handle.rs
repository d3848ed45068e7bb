//! What a lease's handle records, and how lock keys read back into owners and tokens (the text
//! itself is in [`protocol`](crate::protocol)).

use std::fmt;
use std::time::Duration;

use etcd_client::KeyValue;
use lease_core::backend::{decode_owner, decode_token};
use lease_core::{Error, FencingToken, OwnerId, Result};

use crate::error::BACKEND;
use crate::protocol::{FOREIGN_OWNER, owner_text};

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
    let owner = owner_text(kv.value())?;
    decode_owner(BACKEND, &String::from_utf8_lossy(kv.key()), owner)
        .ok()
        .filter(|o| check_owner(o).is_ok())
}

/// The owner named in a lock key, for reports: ours carry the owner id; a key of `etcdctl lock` or
/// a Go mutex is reported as `etcd-lock:<lock key>` (shortened to a legal owner id).
pub(crate) fn owner_of(kv: &KeyValue) -> OwnerId {
    if let Some(owner) = our_owner(kv) {
        return owner;
    }
    OwnerId::foreign(FOREIGN_OWNER, &String::from_utf8_lossy(kv.key()))
}

/// The fencing token of a lock key: its create revision.
pub(crate) fn token_of(kv: &KeyValue) -> Result<FencingToken> {
    decode_token(
        BACKEND,
        &String::from_utf8_lossy(kv.key()),
        kv.create_revision(),
    )
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

/// Whole seconds as reported by etcd (negative: none left) as a duration.
pub(crate) fn secs(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
