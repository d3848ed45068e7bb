//! For baselines and tooling: the exact text this backend sends. Every Lua script the store
//! runs, and the key layout its keys and channels follow.
//!
//! Each lease operation is exactly one script, so it is atomic on the server and touches one
//! hash slot: every key a script is given shares the lease key's `{key}` hash tag (see
//! [`KeyLayout`]), which is what lets the store run on Redis Cluster unchanged.
//!
//! Tokens are handled as decimal strings inside Lua wherever they are compared, so that tokens
//! issued by other backends (up to `i64::MAX`) compare exactly in the fenced resource.

use std::sync::LazyLock;

use lease_core::{Error, LeaseKey, Result};
use redis::Script;

use crate::error::BACKEND;

/// Acquire. `KEYS[1]` lease hash, `KEYS[2]` generation counter; `ARGV[1]` owner, `ARGV[2]` TTL ms.
///
/// Held by another owner: `{"held", owner, token, pttl, ttl}`, nothing written. Otherwise the next
/// token is `max(counter + 1, server TIME in unix microseconds)`, stored in the counter (which is
/// never deleted and has no TTL), and the hash is replaced and given `PEXPIRE ttl`:
/// `{"granted", token}`. `TIME` is allowed before writes because Redis 7 replicates script
/// effects, not scripts.
pub const ACQUIRE_LUA: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token', 'ttl')
if cur[1] and cur[1] ~= ARGV[1] then
  return {'held', cur[1], cur[2], tostring(redis.call('PTTL', KEYS[1])), cur[3]}
end
local gen = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tok = string.format('%.0f', gen)
if floor > gen then
  tok = string.format('%.0f', floor)
  redis.call('SET', KEYS[2], tok)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', tok, 'ttl', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'granted', tok}
";

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));

/// Renew. `KEYS[1]` lease hash; `ARGV[1]` owner, `ARGV[2]` token, `ARGV[3]` TTL ms. Extends only
/// a live hash with the same owner and token (an expired hash is gone, so it is never revived).
pub const RENEW_LUA: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'ttl', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
";

pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));

/// Renew many. `KEYS[i]` lease hash of the i-th lease; `ARGV[3i-2..3i]` its owner, token and
/// TTL ms. The same check as [`RENEW_LUA`] for each key, in one script (one round trip, atomic):
/// returns one `1` (renewed) or `0` (lost) per key, in order. On Redis Cluster all keys of one
/// call must share a hash slot: the store sends one call per slot (see
/// [`LeaseStore::renew_many`](lease_core::LeaseStore::renew_many) on the store).
pub const RENEW_MANY_LUA: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local a = (i - 1) * 3
  local cur = redis.call('HMGET', key, 'owner', 'token')
  if cur[1] == ARGV[a + 1] and cur[2] == ARGV[a + 2] then
    redis.call('HSET', key, 'ttl', ARGV[a + 3])
    redis.call('PEXPIRE', key, ARGV[a + 3])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

pub(crate) static RENEW_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_MANY_LUA));

/// Release. `KEYS[1]` lease hash; `ARGV[1]` owner, `ARGV[2]` token, `ARGV[3]` release channel.
/// Deletes only the same owner's and token's hash (never a successor's), keeps the counter, and
/// publishes the token on the release channel to wake waiters.
pub const RELEASE_LUA: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[2])
  return 1
end
return 0
";

pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

/// Inspect. `KEYS[1]` lease hash, `KEYS[2]` counter. `{gen}` or `{gen, owner, token, pttl, ttl}`
/// (`gen` is `""` when the counter is unknown), read atomically.
pub const INSPECT_LUA: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token', 'ttl')
local gen = redis.call('GET', KEYS[2]) or ''
if cur[1] then
  return {gen, cur[1], cur[2], tostring(redis.call('PTTL', KEYS[1])), cur[3]}
end
return {gen}
";

pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));

/// Fenced write or install. `KEYS[1]` fence hash; `ARGV[1]` token, `ARGV[2]` op (`put`, `add`,
/// `install`), `ARGV[3]` operand. A token below the high-water mark `hw` is rejected
/// (`{"rejected", hw}`); otherwise the mark moves to the token and the op is applied in the same
/// script (`{"accepted", token}`).
pub const FENCE_LUA: &str = r"
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local hw = redis.call('HGET', KEYS[1], 'hw')
if hw and less(ARGV[1], hw) then
  return {'rejected', hw}
end
if ARGV[2] == 'add' then
  redis.call('HINCRBY', KEYS[1], 'counter', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'accepted', 1)
elseif ARGV[2] == 'put' then
  redis.call('HSET', KEYS[1], 'value', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'accepted', 1)
end
redis.call('HSET', KEYS[1], 'hw', ARGV[1])
return {'accepted', ARGV[1]}
";

pub(crate) static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(FENCE_LUA));

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
/// use lease_redis::protocol::KeyLayout;
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
