//! What a lease's handle records, and how lock keys read back into owners and tokens (the text
//! itself is in [`protocol`](crate::protocol)).

use std::fmt;
use std::time::Duration;

use etcd_client::KeyValue;
use hmac::{Hmac, KeyInit, Mac};
use leasehold_core::backend::{decode_owner, decode_token};
use leasehold_core::{Error, FencingToken, LeaseKey, OwnerId, Result};
use sha2::Sha256;

use crate::error::BACKEND;
use crate::protocol::{self, FOREIGN_OWNER, owner_text};

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

/// What a lease's handle records: its etcd lease, the granted TTL in seconds, the name of its
/// lock key (one of the two [slot names](crate::protocol::slot_key) of a key alone on an etcd
/// lease of its own; or, for a key on a shared etcd lease, the etcd lease named in the key and its
/// nonce, the named lease differing from `lease_id` once a renewal moved the key onto another
/// store's etcd lease; or, for keys of earlier versions, the etcd lease alone), and, for a key
/// alone on its etcd lease, the tag with which a store vouches for that (see [`Secret`]).
/// Written as hex fields separated by `/`: `lease/ttl`, then `/s<slot>` for a slot name,
/// `/nonce[/named]` for a key on a shared etcd lease, and `/t<tag>` for a tagged handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) lease_id: i64,
    pub(crate) ttl_secs: i64,
    pub(crate) slot: Option<u8>,
    pub(crate) nonce: Option<u64>,
    pub(crate) named: i64,
    pub(crate) tag: Option<Tag>,
}

impl Handle {
    /// The handle of a lock key named after etcd lease `lease_id` (earlier versions' keys), on
    /// that etcd lease, untagged.
    pub(crate) fn per_grant(lease_id: i64, ttl_secs: i64) -> Handle {
        Handle {
            lease_id,
            ttl_secs,
            slot: None,
            nonce: None,
            named: lease_id,
            tag: None,
        }
    }

    /// The handle of a lock key with slot name `slot`, on etcd lease `lease_id`, untagged.
    pub(crate) fn in_slot(lease_id: i64, ttl_secs: i64, slot: u8) -> Handle {
        Handle {
            slot: Some(slot),
            ..Handle::per_grant(lease_id, ttl_secs)
        }
    }

    /// The handle of the lock key `lock_key` on etcd lease `lease_id`, as its name shows it.
    pub(crate) fn of_key(lock_key: &[u8], lease_id: i64, ttl_secs: i64) -> Handle {
        match protocol::slot_of(lock_key) {
            Some(slot) => Handle::in_slot(lease_id, ttl_secs, slot),
            None => Handle {
                nonce: protocol::nonce_of(lock_key),
                named: protocol::named_lease_of(lock_key).unwrap_or(lease_id),
                ..Handle::per_grant(lease_id, ttl_secs)
            },
        }
    }

    /// Whether the handle names a lock key that sits alone on its etcd lease (no nonce).
    pub(crate) fn alone(&self) -> bool {
        self.nonce.is_none() && (self.slot.is_some() || self.named == self.lease_id)
    }

    /// The lock key this handle names, for lease key `key` under lock name prefix `prefix`.
    pub(crate) fn lock_key(&self, prefix: &str, key: &LeaseKey) -> String {
        match self.slot {
            Some(slot) => protocol::slot_key(prefix, key, slot),
            None => protocol::lock_key(prefix, key, self.named, self.nonce),
        }
    }

    /// This handle with `tag`, if it names a lock key alone on its etcd lease; otherwise
    /// unchanged (a shared etcd lease is never revoked for one key).
    pub(crate) fn tagged(self, tag: Tag) -> Handle {
        if self.alone() {
            Handle {
                tag: Some(tag),
                ..self
            }
        } else {
            self
        }
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}/{:x}", self.lease_id, self.ttl_secs)?;
        if let Some(slot) = self.slot {
            write!(f, "/s{slot:x}")?;
        }
        match self.nonce {
            Some(n) if self.named != self.lease_id => write!(f, "/{n:x}/{:x}", self.named)?,
            Some(n) => write!(f, "/{n:x}")?,
            None => {}
        }
        match self.tag {
            Some(tag) if self.alone() => write!(f, "/t{tag}"),
            _ => Ok(()),
        }
    }
}

pub(crate) fn parse_handle(handle: Option<&str>) -> Option<Handle> {
    let mut parts = handle?.split('/').peekable();
    let lease_id = i64::from_str_radix(parts.next()?, 16).ok()?;
    let ttl_secs = i64::from_str_radix(parts.next()?, 16).ok()?;
    let mut handle = Handle::per_grant(lease_id, ttl_secs);
    if let Some(s) = parts.peek().and_then(|p| p.strip_prefix('s')) {
        handle.slot = Some(u8::from_str_radix(s, 16).ok().filter(|s| *s < 2)?);
        parts.next();
    } else if let Some(n) = parts.peek().filter(|p| !p.starts_with('t')) {
        handle.nonce = Some(u64::from_str_radix(n, 16).ok()?);
        parts.next();
        if let Some(named) = parts.peek().filter(|p| !p.starts_with('t')) {
            handle.named = i64::from_str_radix(named, 16).ok()?;
            parts.next();
        }
    }
    if let Some(t) = parts.next() {
        handle.tag = Some(Tag::parse(t.strip_prefix('t')?)?);
        if !handle.alone() {
            return None;
        }
    }
    if parts.next().is_some() {
        return None;
    }
    Some(handle)
}

/// How many bytes of the HMAC a [`Tag`] keeps: 128 bits, so that guessing a tag takes about
/// 2^127 tries (each failed guess only costs its release the checked path).
const TAG_LEN: usize = 16;

/// A store's voucher, in a lease's handle, that the lease's etcd lease carries exactly the
/// lease's lock key: the first 128 bits of HMAC-SHA-256 under the store's [`Secret`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag([u8; TAG_LEN]);

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({self})")
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl Tag {
    fn parse(hex: &str) -> Option<Tag> {
        if hex.len() != 2 * TAG_LEN || !hex.is_ascii() {
            return None;
        }
        let mut out = [0u8; TAG_LEN];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Tag(out))
    }
}

/// A random key, drawn when a store connects and never shown, under which the store tags the
/// handles of leases whose lock key sits alone on an etcd lease of its own (checked by the grant
/// or by a renewal's read). Only such a lease may be released by revoking its etcd lease alone:
/// a handle anybody could write (`Lease::with_handle` is public) could otherwise name somebody
/// else's etcd lease, such as an `etcdctl lock` session's, and revoke it.
///
/// Holds the key already absorbed into HMAC-SHA-256's inner and outer states (the `hmac` crate's
/// keyed instance), so that each tag clones a state instead of hashing the key again.
#[derive(Clone)]
pub(crate) struct Secret(Hmac<Sha256>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A key of 256 bits from the operating system's random generator (`getrandom`).
    ///
    /// # Errors
    /// [`Error::Backend`] if the operating system's generator fails (no `getrandom` system call
    /// and no `/dev/urandom`, for example in a sandbox that forbids both).
    pub(crate) fn random() -> Result<Secret> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| Error::Backend {
            backend: BACKEND,
            message: format!(
                "the operating system's random generator failed ({e}): the store draws the \
                 secret that tags its handles from it"
            ),
            source: Some(Box::new(e)),
        })?;
        Ok(Secret::from_key(&key))
    }

    /// The secret with key `key`. HMAC zero-pads a key shorter than SHA-256's 64-byte block, so
    /// the padded block is the same key, given in the one length the keyed constructor takes
    /// without a length check.
    fn from_key(key: &[u8; 32]) -> Secret {
        let mut block = [0u8; 64];
        block[..32].copy_from_slice(key);
        Secret(<Hmac<Sha256> as KeyInit>::new(&block.into()))
    }

    /// HMAC-SHA-256 under this secret, already fed the tagged fields: the domain string (part of
    /// the wire format: changing it changes every tag), the lock key and the owner, each preceded
    /// by its length as 8 big-endian bytes, then the token, the etcd lease id and the TTL, each
    /// as 8 big-endian bytes.
    fn mac(
        &self,
        lock_key: &str,
        owner: &OwnerId,
        token: FencingToken,
        lease_id: i64,
        ttl_secs: i64,
    ) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        for field in [
            b"lease-etcd/revoke-only/1".as_slice(),
            lock_key.as_bytes(),
            owner.as_str().as_bytes(),
        ] {
            mac.update(&u64::try_from(field.len()).unwrap_or(u64::MAX).to_be_bytes());
            mac.update(field);
        }
        mac.update(&token.get().to_be_bytes());
        mac.update(&lease_id.to_be_bytes());
        mac.update(&ttl_secs.to_be_bytes());
        mac
    }

    /// The tag of lock key `lock_key` (which names the key, the lock prefix and the etcd lease)
    /// for `owner`, `token`, etcd lease `lease_id` and TTL `ttl_secs`.
    pub(crate) fn tag(
        &self,
        lock_key: &str,
        owner: &OwnerId,
        token: FencingToken,
        lease_id: i64,
        ttl_secs: i64,
    ) -> Tag {
        let full = self
            .mac(lock_key, owner, token, lease_id, ttl_secs)
            .finalize()
            .into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        Tag(tag)
    }

    /// Whether `tag` is this secret's tag of the same fields (compared in constant time, by the
    /// `hmac` crate's truncated verification).
    pub(crate) fn verify(
        &self,
        tag: Tag,
        lock_key: &str,
        owner: &OwnerId,
        token: FencingToken,
        lease_id: i64,
        ttl_secs: i64,
    ) -> bool {
        self.mac(lock_key, owner, token, lease_id, ttl_secs)
            .verify_truncated_left(&tag.0)
            .is_ok()
    }
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
        let tag = Tag([0xab; TAG_LEN]);
        for h in [
            Handle::per_grant(0x694d_7b1a_22f3, 30),
            Handle::per_grant(0x694d_7b1a_22f3, 30).tagged(tag),
            Handle::in_slot(0x694d_7b1a_22f3, 30, 0),
            Handle::in_slot(0x694d_7b1a_22f3, 30, 1).tagged(tag),
            Handle {
                nonce: Some(0x1f),
                ..Handle::per_grant(7, 2)
            },
            Handle {
                nonce: Some(0x1f),
                named: 0x9,
                ..Handle::per_grant(7, 2)
            },
        ] {
            assert_eq!(parse_handle(Some(&h.to_string())), Some(h), "{h}");
        }
        // A shared etcd lease's key is never tagged.
        let shared = Handle {
            nonce: Some(1),
            ..Handle::per_grant(7, 2)
        };
        assert_eq!(shared.tagged(tag), shared);
        let t = "ab".repeat(TAG_LEN);
        assert_eq!(parse_handle(Some(&format!("7/2/1/t{t}"))), None);
        assert_eq!(parse_handle(Some("nonsense")), None);
        assert_eq!(parse_handle(Some("7/2/tab")), None);
        assert_eq!(parse_handle(Some("7/2/s2")), None);
        assert_eq!(parse_handle(Some(&format!("7/2/t{t}/1"))), None);
        assert_eq!(parse_handle(None), None);
        let key = LeaseKey::new("k").unwrap();
        assert_eq!(
            Handle::in_slot(7, 2, 1).lock_key("lease/", &key),
            "lease/k/lease-rs.1"
        );
        assert_eq!(
            Handle::per_grant(0x2a, 2).lock_key("lease/", &key),
            "lease/k/2a"
        );
        for name in ["lease/k/lease-rs.1", "lease/k/2a", "lease/k/2a-7"] {
            let h = Handle::of_key(name.as_bytes(), 0x2a, 2);
            assert_eq!(h.lock_key("lease/", &key), name);
        }
    }

    #[test]
    fn tags_bind_every_field_to_one_secret() {
        let (s, other) = (Secret::random().unwrap(), Secret::random().unwrap());
        let owner = OwnerId::new("w-1").unwrap();
        let t = FencingToken::new(42).unwrap();
        let tag = s.tag("lease/k/2a", &owner, t, 0x2a, 10);
        assert!(s.verify(tag, "lease/k/2a", &owner, t, 0x2a, 10));
        assert!(!other.verify(tag, "lease/k/2a", &owner, t, 0x2a, 10));
        assert!(!s.verify(tag, "lease/j/2a", &owner, t, 0x2a, 10));
        assert!(!s.verify(
            tag,
            "lease/k/2a",
            &OwnerId::new("w-2").unwrap(),
            t,
            0x2a,
            10
        ));
        assert!(!s.verify(tag, "lease/k/2a", &owner, t.next().unwrap(), 0x2a, 10));
        assert!(!s.verify(tag, "lease/k/2a", &owner, t, 0x2b, 10));
        assert!(!s.verify(tag, "lease/k/2a", &owner, t, 0x2a, 11));
    }

    /// A tag is written into the lease's handle, which etcd stores and other stores of the same
    /// process read back: its bytes must not change with the HMAC's implementation. The value was
    /// computed by the crate's earlier hand-written HMAC-SHA-256 (and agrees with Python's
    /// `hmac.new(bytes(range(32)), msg, hashlib.sha256)`).
    #[test]
    fn tag_of_a_known_secret_and_fields_is_fixed() {
        let secret = Secret::from_key(&std::array::from_fn(|i| u8::try_from(i).unwrap()));
        let owner = OwnerId::new("worker-1").unwrap();
        let tag = secret.tag(
            "lease/tenant-42/694d7b1a22f3",
            &owner,
            FencingToken::new(42).unwrap(),
            0x694d_7b1a_22f3,
            30,
        );
        assert_eq!(tag.to_string(), "078dcce7e4f9dc834c47cb0cc165c339");
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231 test case 2 has a short key; with the key zero-padded to 32 bytes HMAC is
        // the same function (keys shorter than a block are zero-padded).
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let mac = Secret::from_key(&key)
            .0
            .chain_update(b"what do ya want for nothing?")
            .finalize()
            .into_bytes();
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
