//! What the server must promise before a store uses it: that it never evicts a key with a TTL,
//! that is, `maxmemory-policy noeviction`. Read once, at connect.

use leasehold_core::{Error, Result};
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{ErrorKind, ServerErrorKind, Value};

use crate::connection::{Conn, RedisConnection};
use crate::error::{BACKEND, map};

/// The only policy under which Redis never deletes a key before its TTL runs out.
const SAFE_POLICY: &str = "noeviction";

/// Checks every server's `maxmemory-policy` (every master of a cluster).
///
/// - `noeviction` everywhere: `Ok`.
/// - Another policy: [`Error::Config`] naming it and the fix, unless `allow` is set, then a
///   warning.
/// - `CONFIG GET` refused by the server (renamed or denied by an ACL, as on many managed
///   services): a warning that the policy could not be checked, and `Ok`.
/// - Any other failure (the connection, `NOAUTH`): the error, mapped by kind.
pub(crate) async fn check_policy(
    con: &RedisConnection,
    allow: bool,
    response_timeout: std::time::Duration,
) -> Result<()> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let reply = match &con.inner {
        Conn::Single(c) => {
            let mut c = c.clone();
            cmd.query_async::<Value>(&mut c).await
        }
        Conn::Sentinel(c) => {
            let mut c = c.clone();
            cmd.query_async::<Value>(&mut c).await
        }
        Conn::Cluster(c) => {
            let mut c = c.clone();
            c.route_command(
                cmd,
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
            )
            .await
        }
    };
    let reply = match reply {
        Ok(reply) => reply,
        // An unknown (renamed) command, or one the ACL denies.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::Server(ServerErrorKind::ResponseError | ServerErrorKind::NoPerm)
            ) =>
        {
            unknown(allow, &e.to_string());
            return Ok(());
        }
        Err(e) => return Err(map("connect", e, response_timeout)),
    };
    let policies = policies(&reply);
    if policies.is_empty() {
        unknown(allow, &format!("unexpected reply {reply:?}"));
        return Ok(());
    }
    let Some(bad) = policies
        .iter()
        .find(|p| !p.eq_ignore_ascii_case(SAFE_POLICY))
    else {
        return Ok(());
    };
    if allow {
        tracing::warn!(
            backend = BACKEND,
            policy = %bad,
            "maxmemory-policy {bad} may evict a held lease (eviction allowed by the options): only fencing tokens protect the resource"
        );
        return Ok(());
    }
    Err(Error::config(
        BACKEND,
        format!(
            "the server's maxmemory-policy is {bad}: when memory is full it may evict a held \
             lease and grant the key again. Set `maxmemory-policy {SAFE_POLICY}` on the server, \
             or connect with RedisOptions::allow_eviction(true) to accept the risk"
        ),
        None,
    ))
}

/// The policy could not be read: warn (a store allowed to evict has nothing to warn about).
fn unknown(allow: bool, why: &str) {
    if allow {
        tracing::debug!(backend = BACKEND, "maxmemory-policy not readable: {why}");
    } else {
        tracing::warn!(
            backend = BACKEND,
            "could not read maxmemory-policy ({why}); assuming `{SAFE_POLICY}`: a server that \
             evicts keys may delete a held lease"
        );
    }
}

/// Every value that follows a `maxmemory-policy` name in `reply`: one per server, whether the
/// reply is one server's `CONFIG GET` (an array or, in RESP3, a map) or a cluster's map of node to
/// reply.
fn policies(reply: &Value) -> Vec<String> {
    fn strings(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => out.push(s.clone()),
            Value::Array(items) | Value::Set(items) => {
                items.iter().for_each(|i| strings(i, out));
            }
            Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
                strings(k, out);
                strings(v, out);
            }),
            _ => {}
        }
    }
    let mut all = Vec::new();
    strings(reply, &mut all);
    all.windows(2)
        .filter(|w| w[0].eq_ignore_ascii_case("maxmemory-policy"))
        .map(|w| w[1].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn policies_are_read_from_every_reply_shape() {
        let one = Value::Array(vec![bulk("maxmemory-policy"), bulk("volatile-lru")]);
        assert_eq!(policies(&one), ["volatile-lru"]);
        let resp3 = Value::Map(vec![(bulk("maxmemory-policy"), bulk("noeviction"))]);
        assert_eq!(policies(&resp3), ["noeviction"]);
        let cluster = Value::Map(vec![
            (bulk("127.0.0.1:7101"), one.clone()),
            (bulk("127.0.0.1:7102"), resp3),
        ]);
        assert_eq!(policies(&cluster), ["volatile-lru", "noeviction"]);
        assert!(policies(&Value::Array(vec![])).is_empty());
    }
}
