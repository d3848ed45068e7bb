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

use leasehold_core::{Error, FencingToken, LeaseKey, OwnerId, Result, mutation};
use redis::Script;

use crate::error::BACKEND;

/// Acquire. `KEYS[1]` lease record, `KEYS[2]` generation counter; `ARGV[1]` owner, `ARGV[2]` TTL
/// ms.
///
/// Held by another owner: `{record, pttl}` (the record as stored, see [`KeyLayout`]; `pttl` its
/// remaining ms), nothing written. Otherwise the token is `max(counter + 1, server TIME in unix
/// microseconds)`; it is stored in the counter (which is never deleted and has no TTL), the
/// record `"<token> <owner> <ttl>"` is set with `PX ttl`, and the reply is the token.
///
/// Three commands on the common path (a free key whose counter is below the clock): `TIME`,
/// `SET record NX GET PX` (takes a free key and reads a held one in one command), and
/// `SET counter GET` (stores the clock floor and reads the previous counter). The clock's
/// microseconds are used as the decimal string `TIME` gives, and compared with the previous
/// counter as digit strings (length, then bytes), so the common path does no number formatting.
/// Only when the counter is not below the clock (grants within one microsecond, a clock stepped
/// back) are the counter and the record written again with `counter + 1`; the script is atomic,
/// so nobody sees the first values. Before anything is written for a held key, the script has returned.
/// `TIME` is allowed before writes because Redis 7 replicates script effects, not scripts.
///
/// A record left by an earlier version of this crate (a hash with `owner`, `token`, `ttl`) is
/// read as a record, so a mixed deployment never grants a key the other version holds. A counter
/// that is not an integer below 2^53 - 1 (Lua numbers are doubles) fails the script after
/// restoring the counter and removing the record it set: nothing changes.
pub const ACQUIRE_LUA: &str = r"
local t = redis.call('TIME')
local s = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local rec = ' ' .. ARGV[1] .. ' ' .. ARGV[2]
local cur = redis.pcall('SET', KEYS[1], s .. rec, 'NX', 'GET', 'PX', ARGV[2])
local written = not cur
if cur then
  if type(cur) == 'table' then
    if not string.find(tostring(cur.err), 'WRONGTYPE', 1, true) then return cur end
    local h = redis.call('HMGET', KEYS[1], 'token', 'owner', 'ttl')
    cur = h[2] and (tostring(h[1]) .. ' ' .. h[2] .. ' ' .. tostring(h[3])) or ''
  end
  if cur ~= '' and not string.find(cur, ' ' .. ARGV[1] .. ' ', 1, true) then
    return {cur, tostring(redis.call('PTTL', KEYS[1]))}
  end
end
local old = redis.pcall('SET', KEYS[2], s, 'GET')
if old then
  local function refuse()
    if type(old) == 'string' then redis.call('SET', KEYS[2], old) end
    if written then redis.call('DEL', KEYS[1]) end
    return redis.error_reply('ERR lease: the counter ' .. KEYS[2] .. ' is not an integer below 2^53 - 1')
  end
  if type(old) ~= 'string' or not string.find(old, '^%d+$') then return refuse() end
  if #old > #s or (#old == #s and old >= s) then
    local g = tonumber(old)
    if g >= 9007199254740991 then return refuse() end
    s = string.format('%.0f', math.max(g + 1, tonumber(s)))
    redis.call('SET', KEYS[2], s)
    written = false
  end
end
if not written then
  redis.call('SET', KEYS[1], s .. rec, 'PX', ARGV[2])
end
return s
";

// Each script the store runs passes a mutation switch point: the identity unless
// leasehold-core's `mutants` feature is on and a mutant is active.
/// [`ACQUIRE_LUA`] as the store sends it (through its mutation switch point).
pub(crate) fn acquire_lua() -> &'static str {
    mutation::text("redis.acquire", ACQUIRE_LUA)
}

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(acquire_lua()));

/// Acquire many: [`ACQUIRE_LUA`] for each key of the call, in one script (one round trip,
/// atomic). `KEYS[2i-1]`, `KEYS[2i]` the lease record and generation counter of the i-th key;
/// `ARGV[2i-1]`, `ARGV[2i]` its owner and TTL ms. The body of [`ACQUIRE_LUA`], word for word, is
/// a local function of those four values (built by [`acquire_many_lua`]); the reply is one
/// element per key, in order: what [`ACQUIRE_LUA`] replies for it (the token, `{record, pttl}`
/// when held, or an error element when its counter is corrupt). On Redis Cluster all keys of one
/// call must share a hash slot: the store sends one call per slot.
///
/// ```
/// let lua = leasehold_redis::protocol::acquire_many_lua();
/// assert!(lua.starts_with("local function acquire(lease, counter, owner, ttl)"));
/// assert!(!lua.contains("KEYS[1]") && !lua.contains("ARGV[1]"));
/// ```
pub fn acquire_many_lua() -> String {
    let body = acquire_lua()
        .replace("KEYS[1]", "lease")
        .replace("KEYS[2]", "counter")
        .replace("ARGV[1]", "owner")
        .replace("ARGV[2]", "ttl");
    format!(
        "local function acquire(lease, counter, owner, ttl){body}end\n\
         local out = {{}}\n\
         for i = 1, #KEYS / 2 do\n\
         \x20 out[i] = acquire(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], ARGV[2 * i])\n\
         end\n\
         return out\n"
    )
}

pub(crate) static ACQUIRE_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(&acquire_many_lua()));

/// Renew. `KEYS[1]` lease record; `ARGV[1]` the grant's [`record_prefix`] (token and owner),
/// `ARGV[2]` TTL ms. Extends only a live record of the same token and owner, with one `SET .. PX`
/// (an expired record is gone, so it is never revived). Replies `1` (renewed) or `0` (lost).
pub const RENEW_LUA: &str = r"
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'string' and string.sub(cur, 1, #ARGV[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1] .. ARGV[2], 'PX', ARGV[2])
  return 1
end
return 0
";

pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(mutation::text("redis.renew", RENEW_LUA)));

/// Renew many. `KEYS[i]` lease record of the i-th lease; `ARGV[2i-1]`, `ARGV[2i]` its
/// [`record_prefix`] and TTL ms. The same check as [`RENEW_LUA`] for each key, in one script (one
/// round trip, atomic): returns one `1` (renewed) or `0` (lost) per key, in order. On Redis
/// Cluster all keys of one call must share a hash slot: the store sends one call per slot (see
/// [`LeaseStore::renew_many`](leasehold_core::LeaseStore::renew_many) on the store).
pub const RENEW_MANY_LUA: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local p, ttl = ARGV[2 * i - 1], ARGV[2 * i]
  local cur = redis.pcall('GET', key)
  if type(cur) == 'string' and string.sub(cur, 1, #p) == p then
    redis.call('SET', key, p .. ttl, 'PX', ttl)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

pub(crate) static RENEW_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(mutation::text("redis.renew_many", RENEW_MANY_LUA)));

/// Release. `KEYS[1]` lease record; `ARGV[1]` the grant's [`record_prefix`], `ARGV[2]` release
/// channel, `ARGV[3]` token. Deletes only the same token's and owner's record (never a
/// successor's), keeps the counter, and publishes the token on the release channel to wake
/// waiters. Replies `1` (released) or `0` (not held).
pub const RELEASE_LUA: &str = r"
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'string' and string.sub(cur, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
";

pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(mutation::text("redis.release", RELEASE_LUA)));

/// Inspect any number of keys. `KEYS[2i-1]` lease record and `KEYS[2i]` counter of the i-th
/// key. Three strings per key, in order, each key read atomically: the counter (`""` when
/// unknown), the record (`""` when free) and its remaining ms (`""` when free). On Redis
/// Cluster all keys of one call must share a hash slot (the store sends one call per slot).
pub const INSPECT_LUA: &str = r"
local out, n = {}, 0
for i = 1, #KEYS, 2 do
  local cur = redis.pcall('GET', KEYS[i])
  if type(cur) == 'table' then
    local h = redis.call('HMGET', KEYS[i], 'token', 'owner', 'ttl')
    cur = h[2] and (tostring(h[1]) .. ' ' .. h[2] .. ' ' .. tostring(h[3]))
  end
  out[n + 1] = redis.call('GET', KEYS[i + 1]) or ''
  if cur then
    out[n + 2] = cur
    out[n + 3] = tostring(redis.call('PTTL', KEYS[i]))
  else
    out[n + 2] = ''
    out[n + 3] = ''
  end
  n = n + 3
end
return out
";

pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));

/// The start of the record a grant of `token` to `owner` wrote: `"<token> <owner> "`. Renew and
/// release compare it with the stored record. Owner ids have no spaces and tokens are digits, so
/// the prefix matches only the record of that very grant.
///
/// ```
/// use leasehold_core::{FencingToken, OwnerId};
/// use leasehold_redis::protocol::record_prefix;
/// let p = record_prefix(FencingToken::new(7)?, &OwnerId::new("worker-1")?);
/// assert_eq!(p, "7 worker-1 ");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
pub fn record_prefix(token: FencingToken, owner: &OwnerId) -> String {
    format!("{} {} ", token.get(), owner.as_str())
}

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

pub(crate) static FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(mutation::text("redis.fence", FENCE_LUA)));

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
/// | `p:{k}:lease`         | string  | `"<token> <owner> <ttl ms>"` of the holder; expires by `PX`  |
/// | `p:{k}:gen`           | string  | the last token issued; **never deleted, never expires**      |
/// | `p:{k}:fence`         | hash    | the fenced resource: `hw`, `value`, `counter`, `accepted`    |
/// | `p:{k}:released`      | channel | pub/sub channel the release script publishes the token to   |
///
/// The `{k}` hash tag puts all keys of one lease into the same Redis Cluster hash slot, so every
/// script touches a single slot. This is why a prefix must not contain `{` or `}`: a brace in the
/// prefix would change which part of the name Redis hashes.
///
/// ```
/// use leasehold_core::LeaseKey;
/// use leasehold_redis::protocol::KeyLayout;
/// let layout = KeyLayout::new("jobs")?;
/// let key = LeaseKey::new("nightly")?;
/// assert_eq!(layout.lease(&key), "jobs:{nightly}:lease");
/// assert_eq!(layout.generation(&key), "jobs:{nightly}:gen");
/// assert!(KeyLayout::new("a{b").is_err());
/// # Ok::<(), leasehold_core::Error>(())
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

    /// The record of the current holder (a string, see the table above).
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
