//! The Lua scripts. Each lease operation is exactly one script, so it is atomic on the server
//! and touches one hash slot (every key passed shares the `{key}` hash tag).
//!
//! Tokens are handled as decimal strings inside Lua wherever they are compared, so that tokens
//! issued by other backends (up to `i64::MAX`) compare exactly in the fenced resource.

use std::sync::LazyLock;

use redis::Script;

/// Acquire. `KEYS[1]` lease hash, `KEYS[2]` generation counter; `ARGV[1]` owner, `ARGV[2]` TTL ms.
///
/// Held by another owner: `{"held", owner, token, pttl, ttl}`, nothing written. Otherwise the next
/// token is `max(counter + 1, server TIME in unix microseconds)`, stored in the counter (which is
/// never deleted and has no TTL), and the hash is replaced and given `PEXPIRE ttl`:
/// `{"granted", token}`. `TIME` is allowed before writes because Redis 7 replicates script
/// effects, not scripts.
pub(crate) const ACQUIRE_LUA: &str = r"
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

/// [`ACQUIRE_LUA`] as a script (`EVALSHA`, falling back to `EVAL`).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));

/// Renew. `KEYS[1]` lease hash; `ARGV[1]` owner, `ARGV[2]` token, `ARGV[3]` TTL ms. Extends only
/// a live hash with the same owner and token (an expired hash is gone, so it is never revived).
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'ttl', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
",
    )
});

/// Renew many. `KEYS[i]` lease hash of the i-th lease; `ARGV[3i-2..3i]` its owner, token and
/// TTL ms. The same check as [`RENEW`] for each key, in one script (one round trip, atomic):
/// returns one `1` (renewed) or `0` (lost) per key, in order. All keys must live on one server
/// (the store uses one non-cluster connection).
pub(crate) static RENEW_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
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
",
    )
});

/// Release. `KEYS[1]` lease hash; `ARGV[1]` owner, `ARGV[2]` token, `ARGV[3]` release channel.
/// Deletes only the same owner's and token's hash (never a successor's), keeps the counter, and
/// publishes the token on the release channel to wake waiters.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[2])
  return 1
end
return 0
",
    )
});

/// Inspect. `KEYS[1]` lease hash, `KEYS[2]` counter. `{gen}` or `{gen, owner, token, pttl, ttl}`
/// (`gen` is `""` when the counter is unknown), read atomically.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token', 'ttl')
local gen = redis.call('GET', KEYS[2]) or ''
if cur[1] then
  return {gen, cur[1], cur[2], tostring(redis.call('PTTL', KEYS[1])), cur[3]}
end
return {gen}
",
    )
});

/// Fenced write or install. `KEYS[1]` fence hash; `ARGV[1]` token, `ARGV[2]` op (`put`, `add`,
/// `install`), `ARGV[3]` operand. A token below the high-water mark `hw` is rejected
/// (`{"rejected", hw}`); otherwise the mark moves to the token and the op is applied in the same
/// script (`{"accepted", token}`).
pub(crate) static FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
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
",
    )
});
