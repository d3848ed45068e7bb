//! The key layout: where a lease, its token counter, its release channel and its fenced resource
//! live in Redis.

use lease_core::{Error, LeaseKey, Result};

use crate::BACKEND;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lease";

/// The longest legal key prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// Where the keys of one lease live.
///
/// For a prefix `p` and a lease key `k` (see [`LeaseKey`]):
///
/// | Redis name            | type    | what                                                        |
/// |-----------------------|---------|-------------------------------------------------------------|
/// | `p:{k}:lease`         | hash    | `owner`, `token`, `ttl` (ms) of the holder; expires by `PX`  |
/// | `p:{k}:gen`           | string  | the last token issued; **never deleted, never expires**      |
/// | `p:{k}:fence`         | hash    | the fenced resource: `hw`, `value`, `counter`, `accepted`    |
/// | `p:{k}:released`      | channel | pub/sub channel the release script publishes the token to   |
///
/// The `{k}` hash tag puts all keys of one lease into the same Redis Cluster hash slot, so every
/// script touches a single slot. This is why a prefix must not contain `{` or `}`: a brace in the
/// prefix would change which part of the name Redis hashes.
///
/// ```
/// use lease_core::LeaseKey;
/// use lease_redis::KeyLayout;
/// let layout = KeyLayout::new("jobs")?;
/// let key = LeaseKey::new("nightly")?;
/// assert_eq!(layout.lease(&key), "jobs:{nightly}:lease");
/// assert_eq!(layout.generation(&key), "jobs:{nightly}:gen");
/// assert!(KeyLayout::new("a{b").is_err());
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// A layout under `prefix`.
    ///
    /// # Errors
    /// [`Error::Config`] if the prefix is empty, longer than [`MAX_PREFIX_LEN`], contains `{` or
    /// `}` (it would break cluster slotting), or anything but printable ASCII without spaces.
    pub fn new(prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        let problem = if prefix.is_empty() {
            Some("must not be empty")
        } else if prefix.len() > MAX_PREFIX_LEN {
            Some("must be at most 64 bytes")
        } else if prefix.contains(['{', '}']) {
            Some("must not contain '{' or '}': the lease key is the cluster hash tag")
        } else if !prefix.bytes().all(|b| b.is_ascii_graphic()) {
            Some("must be printable ASCII without spaces")
        } else {
            None
        };
        match problem {
            Some(why) => Err(Error::config(
                BACKEND,
                format!("key prefix {prefix:?} {why}"),
                None,
            )),
            None => Ok(KeyLayout { prefix }),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn name(&self, key: &LeaseKey, suffix: &str) -> String {
        format!("{}:{{{}}}:{suffix}", self.prefix, key.as_str())
    }

    /// The hash holding the current holder.
    pub fn lease(&self, key: &LeaseKey) -> String {
        self.name(key, "lease")
    }

    /// The token counter (never deleted).
    pub fn generation(&self, key: &LeaseKey) -> String {
        self.name(key, "gen")
    }

    /// The fenced resource's hash.
    pub fn fence(&self, key: &LeaseKey) -> String {
        self.name(key, "fence")
    }

    /// The pub/sub channel a release publishes to.
    pub fn released_channel(&self, key: &LeaseKey) -> String {
        self.name(key, "released")
    }

    /// A `SCAN MATCH` pattern for every name of keys starting with `key_prefix` (for cleanup).
    pub fn scan_pattern(&self, key_prefix: &str) -> String {
        format!("{}:{{{key_prefix}*", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_hash_tag() {
        let layout = KeyLayout::new("p").unwrap();
        let key = LeaseKey::new("a.b-c").unwrap();
        for name in [
            layout.lease(&key),
            layout.generation(&key),
            layout.fence(&key),
            layout.released_channel(&key),
        ] {
            let open = name.find('{').unwrap();
            let close = name.find('}').unwrap();
            assert_eq!(&name[open + 1..close], "a.b-c", "{name}");
        }
        assert_eq!(layout.scan_pattern("lt1"), "p:{lt1*");
    }

    #[test]
    fn bad_prefixes_are_config_errors() {
        for bad in ["", "a{", "}b", "has space", "ü", &"x".repeat(65)] {
            assert!(
                matches!(
                    KeyLayout::new(bad),
                    Err(Error::Config {
                        backend: "redis",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert!(KeyLayout::new("tenant:7").is_ok());
    }
}
