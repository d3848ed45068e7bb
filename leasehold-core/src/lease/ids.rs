//! The identifiers: [`LeaseKey`], the name of a leased resource (legal on every backend as it
//! is, or derived from any text), and [`OwnerId`], who holds a lease (unique per instance).
//! Both are validated once, on construction; the rest of the crate takes them as valid.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The longest legal [`LeaseKey`], in bytes.
///
/// Kubernetes object names may be 253 characters; we keep 53 in reserve so that a backend may add
/// a prefix and still produce a legal name.
pub const MAX_KEY_LEN: usize = 200;

/// The longest legal [`OwnerId`], in bytes.
pub const MAX_OWNER_LEN: usize = 128;

/// The name of a leased resource.
///
/// A key is validated once, on construction, and is then legal on **every** backend unchanged:
/// it is a DNS-1123 subdomain (the rule for Kubernetes object names) of at most [`MAX_KEY_LEN`]
/// bytes: lowercase ASCII letters, digits, `-` and `.`, where every dot-separated label starts
/// and ends with a letter or digit. PostgreSQL, Redis and etcd accept such keys as they are, so no
/// backend needs an encoding and no two keys can collide (see `docs/adr/0002-portable-keys.md`).
/// To derive a key from arbitrary text (a tenant name, a path) use [`LeaseKey::derive`].
///
/// ```
/// use leasehold_core::LeaseKey;
/// let key = LeaseKey::new("tenant-42.reindex")?;
/// assert_eq!(key.as_str(), "tenant-42.reindex");
/// assert!(LeaseKey::new("Tenant/42").is_err());
/// assert!(LeaseKey::new("").is_err());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey(Arc<str>);

impl LeaseKey {
    /// Validates `key` and wraps it.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] if the key is empty, longer than [`MAX_KEY_LEN`], or not a DNS-1123
    /// subdomain.
    pub fn new(key: impl AsRef<str>) -> Result<Self> {
        let key = key.as_ref();
        validate_key(key).map_err(|reason| Error::InvalidKey {
            key: truncate(key),
            reason,
        })?;
        Ok(LeaseKey(Arc::from(key)))
    }

    /// Derives a legal key from arbitrary text: a readable part (the text lowercased, every
    /// other character replaced by `-`, runs of `-` folded, cut to fit), then `-` and 32 hex
    /// digits: the first 128 bits of the SHA-256 of the original text. `"Tenant/42"` becomes
    /// `tenant-42-6d211b502ab0c8948c7249f3d1b0d6a7`.
    ///
    /// Many texts share a readable part (`"Tenant/42"`, `"tenant 42"`, `"TENANT_42"`), so the hash
    /// is what keeps their keys apart, and it must hold against a user who picks the text: with a
    /// cryptographic hash, finding a text whose key equals a given text's key takes about 2^128
    /// hashes, and finding any two texts with one key about 2^64. (A 48-bit FNV-1a hash was used
    /// before; a birthday search found two texts sharing a key in seconds, so keys derived by
    /// that version differ from these.) The result is deterministic: the same text gives the same
    /// key in every process and on every platform, and is at most [`MAX_KEY_LEN`] bytes.
    ///
    /// ```
    /// use leasehold_core::LeaseKey;
    /// let a = LeaseKey::derive("Tenant/42");
    /// let b = LeaseKey::derive("tenant-42");
    /// assert_ne!(a, b);
    /// assert_eq!(a.as_str(), "tenant-42-6d211b502ab0c8948c7249f3d1b0d6a7");
    /// ```
    pub fn derive(text: &str) -> Self {
        let mut out = String::with_capacity(text.len().min(MAX_KEY_LEN));
        for c in text.chars() {
            let c = c.to_ascii_lowercase();
            let mapped = if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            };
            if mapped == '-' && (out.is_empty() || out.ends_with('-')) {
                continue;
            }
            out.push(mapped);
            if out.len() >= MAX_KEY_LEN - 1 - 2 * DERIVED_HASH_BYTES {
                break;
            }
        }
        while out.ends_with('-') {
            out.pop();
        }
        if out.is_empty() {
            out.push('k');
        }
        out.push('-');
        let hash = Sha256::digest(text.as_bytes());
        for b in &hash[..DERIVED_HASH_BYTES] {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        LeaseKey(Arc::from(out.as_str()))
    }

    /// A key in the namespace reserved for keys the library derives for its own use beside
    /// `self`: `SELF.lease--ROLE` (an election's handover reservation, a shard set's shard,
    /// membership and mailbox keys).
    ///
    /// [`LeaseKey::new`] refuses `--` in a key, so no key a user can name is equal to a reserved
    /// one, and since `role` may not contain `--` either, two different `(self, role)` pairs never
    /// give the same key.
    ///
    /// ```
    /// use leasehold_core::LeaseKey;
    /// let jobs = LeaseKey::new("jobs")?;
    /// let reservation = jobs.reserved("handover")?;
    /// assert_eq!(reservation.as_str(), "jobs.lease--handover");
    /// assert!(LeaseKey::new("jobs.lease--handover").is_err());
    /// assert!(jobs.reserved("a--b").is_err());
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidKey`] if `role` is not itself a legal key, or the result is longer than
    /// [`MAX_KEY_LEN`].
    pub fn reserved(&self, role: &str) -> Result<LeaseKey> {
        let key = format!("{}.{RESERVED_LABEL_PREFIX}{role}", self.0);
        let reason = match validate_key(role) {
            Err(reason) => Some(reason),
            Ok(()) if key.len() > MAX_KEY_LEN => Some("a key must be at most 200 bytes"),
            Ok(()) => None,
        };
        match reason {
            Some(reason) => Err(Error::InvalidKey {
                key: truncate(&key),
                reason,
            }),
            None => Ok(LeaseKey(Arc::from(key.as_str()))),
        }
    }

    /// Whether this key lies in the library's reserved namespace (see [`LeaseKey::reserved`]).
    pub fn is_reserved(&self) -> bool {
        self.0.contains("--")
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The first label of the part a [`LeaseKey::reserved`] key adds starts with this.
const RESERVED_LABEL_PREFIX: &str = "lease--";

/// How many bytes of SHA-256 a [`LeaseKey::derive`] key ends with (as twice as many hex digits).
const DERIVED_HASH_BYTES: usize = 16;

const HEX: &[u8; 16] = b"0123456789abcdef";

fn validate_key(key: &str) -> std::result::Result<(), &'static str> {
    if key.is_empty() {
        return Err("a key must not be empty");
    }
    if key.len() > MAX_KEY_LEN {
        return Err("a key must be at most 200 bytes");
    }
    for label in key.split('.') {
        let bytes = label.as_bytes();
        let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
            return Err("a key must not have empty dot-separated labels");
        };
        if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
            return Err("every dot-separated label must start and end with a letter or digit");
        }
        for b in bytes {
            if !(b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-') {
                return Err("a key may contain only lowercase ASCII letters, digits, '-' and '.'");
            }
        }
    }
    if key.contains("--") {
        return Err("'--' is reserved for the keys the library derives for its own use");
    }
    Ok(())
}

fn reserved_prefix(id: &str) -> Option<&'static str> {
    OwnerId::FOREIGN_PREFIXES
        .iter()
        .copied()
        .find(|p| id.starts_with(p))
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for LeaseKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        LeaseKey::new(s)
    }
}

impl AsRef<str> for LeaseKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Who holds (or wants) a lease: unique per holder *instance*.
///
/// Stores compare owner ids on renew and release. An owner id is **not** a fence: two instances
/// that share an id would be indistinguishable, which is why [`OwnerId::random`] is the default
/// and [`OwnerId::with_label`] only prefixes a readable label to a random part.
///
/// Legal owner ids are 1 to [`MAX_OWNER_LEN`] bytes of printable ASCII without spaces.
///
/// ```
/// use leasehold_core::OwnerId;
/// let a = OwnerId::with_label("web-7");
/// let b = OwnerId::with_label("web-7");
/// assert_ne!(a, b);
/// assert!(a.as_str().starts_with("web-7-"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(Arc<str>);

impl OwnerId {
    /// A fresh random id (a UUID v4).
    pub fn random() -> Self {
        OwnerId(Arc::from(uuid::Uuid::new_v4().to_string().as_str()))
    }

    /// A fresh id with a readable label (host or pod name) followed by a random part. Characters
    /// of the label that are not printable ASCII are replaced by `_`; the label is shortened if
    /// needed. A label that would start with a [reserved prefix](OwnerId::FOREIGN_PREFIXES) has
    /// its `:` replaced by `_`, so the result is always a legal owner.
    ///
    /// ```
    /// use leasehold_core::OwnerId;
    /// let id = OwnerId::with_label("etcd-lock:x");
    /// assert!(!id.is_foreign());
    /// assert!(id.as_str().starts_with("etcd-lock_x-"));
    /// ```
    pub fn with_label(label: &str) -> Self {
        let mut clean: String = label
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .take(MAX_OWNER_LEN - 37)
            .collect();
        if reserved_prefix(&clean).is_some() {
            clean = clean.replace(':', "_");
        }
        OwnerId(Arc::from(
            format!("{clean}-{}", uuid::Uuid::new_v4()).as_str(),
        ))
    }

    /// Prefixes reserved for holders that are not clients of this library (for example
    /// `etcd-lock:` for holders of etcd's own lock, `etcdctl lock` and Go's
    /// `concurrency.Mutex`). [`OwnerId::new`] refuses them, so nobody can resume, renew or release
    /// as such a holder; only [`OwnerId::foreign`] builds them, for reports.
    pub const FOREIGN_PREFIXES: &'static [&'static str] = &["etcd-lock:"];

    /// A holder that is not a client of this library, as a backend reports it in
    /// a [`Holder`](super::Holder) from `inspect` (for example `("etcd-lock:", "/locks/job")`). The result
    /// is [foreign](OwnerId::is_foreign): every store refuses it as an owner, and
    /// [`OwnerId::new`] can never produce it. Characters that are not printable ASCII become `_`;
    /// the name keeps its last characters if it is too long.
    ///
    /// # Panics
    /// Never; a `prefix` that is not one of [`OwnerId::FOREIGN_PREFIXES`] is replaced by the
    /// first of them.
    ///
    /// ```
    /// use leasehold_core::OwnerId;
    /// let go = OwnerId::foreign("etcd-lock:", "/locks/nightly");
    /// assert!(go.is_foreign());
    /// assert_eq!(go.as_str(), "etcd-lock:/locks/nightly");
    /// assert!(OwnerId::new(go.as_str()).is_err());
    /// ```
    pub fn foreign(prefix: &str, name: &str) -> Self {
        let prefix = Self::FOREIGN_PREFIXES
            .iter()
            .copied()
            .find(|p| *p == prefix)
            .unwrap_or(Self::FOREIGN_PREFIXES[0]);
        let room = MAX_OWNER_LEN - prefix.len();
        let chars: Vec<char> = name
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .collect();
        let tail: String = chars[chars.len().saturating_sub(room)..].iter().collect();
        OwnerId(Arc::from(format!("{prefix}{tail}").as_str()))
    }

    /// Whether this id stands for a holder that is not a client of this library (see
    /// [`OwnerId::foreign`]). Stores refuse such owners with [`Error::InvalidOwner`].
    pub fn is_foreign(&self) -> bool {
        reserved_prefix(&self.0).is_some()
    }

    /// Uses `id` as it is, after validation. Use this to resume as a known owner (for example a
    /// Kubernetes `holderIdentity` chosen by a Go controller).
    ///
    /// # Errors
    /// [`Error::InvalidOwner`] if `id` is empty, too long, not printable ASCII, or starts with
    /// one of the [reserved prefixes](OwnerId::FOREIGN_PREFIXES) of foreign holders.
    pub fn new(id: impl AsRef<str>) -> Result<Self> {
        let id = id.as_ref();
        let reason = if id.is_empty() {
            Some("an owner id must not be empty")
        } else if id.len() > MAX_OWNER_LEN {
            Some("an owner id must be at most 128 bytes")
        } else if !id.bytes().all(|b| b.is_ascii_graphic()) {
            Some("an owner id must be printable ASCII without spaces")
        } else if reserved_prefix(id).is_some() {
            Some(
                "owner ids starting with a reserved prefix (\"etcd-lock:\") stand for holders \
                 that are not clients of this library; nobody may act as them",
            )
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidOwner {
                owner: truncate(id),
                reason,
            }),
            None => Ok(OwnerId(Arc::from(id))),
        }
    }

    /// An owner for one live *instance* of a stable identity: `ID#` followed by 16 random hex
    /// digits. Elections and shard sets hold their leases under such owners, so that two
    /// processes started with the same id (a fixed `--worker`, a pod name reused by a
    /// StatefulSet, PID 1 in two containers) are two different owners to the store and can never
    /// both hold one key; [`OwnerId::identity`] gives `ID` back.
    ///
    /// ```
    /// use leasehold_core::OwnerId;
    /// let a = OwnerId::instance("worker-1")?;
    /// let b = OwnerId::instance("worker-1")?;
    /// assert_ne!(a, b);
    /// assert_eq!(a.identity(), "worker-1");
    /// assert_eq!(b.identity(), "worker-1");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOwner`] if `id` is not a legal owner id or leaves no room (17 bytes) for
    /// the instance part.
    pub fn instance(id: &str) -> Result<Self> {
        if id.len() > MAX_OWNER_LEN - INSTANCE_SUFFIX_LEN {
            return Err(Error::InvalidOwner {
                owner: truncate(id),
                reason: "an instance's id must be at most 111 bytes (17 are kept for the instance)",
            });
        }
        OwnerId::new(id)?;
        // fastrand, not a UUID: a deterministic simulation that seeds fastrand on its thread
        // replays the same instances; elsewhere each thread's generator is seeded at random.
        let nonce = fastrand::u64(..);
        OwnerId::new(format!("{id}#{nonce:016x}"))
    }

    /// The stable identity of an [instance](OwnerId::instance) owner (the part before `#` and
    /// its 16 hex digits); any other owner id is its own identity.
    ///
    /// ```
    /// use leasehold_core::OwnerId;
    /// assert_eq!(OwnerId::new("web#7")?.identity(), "web#7");
    /// assert_eq!(OwnerId::new("web#00000000000000ff")?.identity(), "web");
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn identity(&self) -> &str {
        let s = &*self.0;
        if s.len() > INSTANCE_SUFFIX_LEN {
            let (id, suffix) = s.split_at(s.len() - INSTANCE_SUFFIX_LEN);
            let mut suffix = suffix.bytes();
            if suffix.next() == Some(b'#')
                && suffix.all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return id;
            }
        }
        s
    }

    /// The stable identity as an owner id: [`OwnerId::identity`] without a new validation (a
    /// prefix of a legal id that ends before `#` is legal). Elections report their leaders this
    /// way, so users see the id they chose, not the instance.
    ///
    /// ```
    /// use leasehold_core::OwnerId;
    /// let id = OwnerId::new("worker-1")?;
    /// assert_eq!(OwnerId::instance("worker-1")?.to_identity(), id);
    /// assert_eq!(id.to_identity(), id);
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn to_identity(&self) -> OwnerId {
        let id = self.identity();
        if id.len() == self.0.len() {
            self.clone()
        } else {
            OwnerId(Arc::from(id))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `#` and 16 hex digits: the part [`OwnerId::instance`] appends.
const INSTANCE_SUFFIX_LEN: usize = 17;

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
#[path = "ids_tests.rs"]
mod tests;
