//! Deleting what a test left under a prefix, one routine per kind of key space, so that each
//! backend's tests wipe alike: Redis's `SCAN`/`DEL` loop ([`redis_delete_matching`]) and a
//! store with a prefix delete (etcd's range delete, the SQL stores' `delete_prefix`) over a
//! case's namespace under each of its prefixes ([`delete_namespace`]).
//!
//! The testkit depends on no client library: a test implements [`RedisKeyspace`] or
//! [`PrefixDelete`] on a newtype over its own client (a few lines), and the loops live here.
//! Wipes are best effort, as cleanup after a case is: they report how many keys went, never
//! fail the case.

use crate::BoxFuture;

/// A Redis connection as far as a wipe needs it.
pub trait RedisKeyspace: Send {
    /// One `SCAN cursor MATCH pattern COUNT count` page: the next cursor (0 at the end) and the
    /// keys of this page.
    fn scan_page<'a>(
        &'a mut self,
        cursor: u64,
        pattern: &'a str,
        count: usize,
    ) -> BoxFuture<'a, Result<(u64, Vec<String>), String>>;

    /// `DEL keys...`: how many of them existed.
    fn del<'a>(&'a mut self, keys: &'a [String]) -> BoxFuture<'a, Result<u64, String>>;
}

/// How [`redis_delete_matching`] groups its `DEL`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelBatch {
    /// One `DEL` per `SCAN` page (one server: every key lives on it).
    Page,
    /// One `DEL` per key: a Redis Cluster node refuses a `DEL` over keys of several hash slots,
    /// and a replica refuses every `DEL` (its master does them), so each key is tried alone.
    Key,
}

/// Deletes every key matching `pattern` (`SCAN ... MATCH pattern COUNT 1000`, then `DEL` as
/// `batch` says). A `SCAN` error ends the wipe; a refused `DEL` is skipped. Gives how many keys
/// were deleted.
///
/// Cancel safe: dropping the future stops the wipe between commands (what was deleted stays
/// deleted).
pub async fn redis_delete_matching<C: RedisKeyspace + ?Sized>(
    con: &mut C,
    pattern: &str,
    batch: DelBatch,
) -> u64 {
    let mut deleted = 0;
    let mut cursor = 0;
    loop {
        let Ok((next, keys)) = con.scan_page(cursor, pattern, 1000).await else {
            return deleted;
        };
        match batch {
            DelBatch::Page if !keys.is_empty() => deleted += con.del(&keys).await.unwrap_or(0),
            DelBatch::Page => {}
            DelBatch::Key => {
                for key in keys {
                    deleted += con.del(std::slice::from_ref(&key)).await.unwrap_or(0);
                }
            }
        }
        if next == 0 {
            return deleted;
        }
        cursor = next;
    }
}

/// A store that can delete every key under a prefix (etcd's range delete, a SQL table's
/// `LIKE 'prefix%'`).
pub trait PrefixDelete: Send {
    /// Deletes every key that starts with `prefix`: how many there were.
    fn delete_prefix<'a>(&'a mut self, prefix: &'a str) -> BoxFuture<'a, Result<u64, String>>;
}

/// Deletes a case's `namespace` under each of `prefixes` (a store's key prefix, its fence
/// prefix, ...): every key starting with `{prefix}{namespace}`. A refused delete is skipped.
/// Gives how many keys were deleted.
///
/// Cancel safe: dropping the future stops between prefixes.
pub async fn delete_namespace<C: PrefixDelete + ?Sized>(
    con: &mut C,
    prefixes: &[&str],
    namespace: &str,
) -> u64 {
    let mut deleted = 0;
    for prefix in prefixes {
        deleted += con
            .delete_prefix(&format!("{prefix}{namespace}"))
            .await
            .unwrap_or(0);
    }
    deleted
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// A key space in memory, scanned two keys at a time in a fixed order (a cursor that
    /// deletions do not move), that refuses `DEL`s over more than one key when `one_slot` is
    /// set (as a cluster node does across slots).
    struct Keys {
        order: Vec<String>,
        keys: BTreeSet<String>,
        one_slot: bool,
    }

    impl RedisKeyspace for Keys {
        fn scan_page<'a>(
            &'a mut self,
            cursor: u64,
            pattern: &'a str,
            _count: usize,
        ) -> BoxFuture<'a, Result<(u64, Vec<String>), String>> {
            Box::pin(async move {
                let prefix = pattern.trim_end_matches('*');
                let start = usize::try_from(cursor).map_err(|e| e.to_string())?;
                let hits = self
                    .order
                    .iter()
                    .skip(start)
                    .take(2)
                    .filter(|k| self.keys.contains(*k) && k.starts_with(prefix))
                    .cloned()
                    .collect();
                let next = if start + 2 >= self.order.len() {
                    0
                } else {
                    start + 2
                };
                Ok((next as u64, hits))
            })
        }

        fn del<'a>(&'a mut self, keys: &'a [String]) -> BoxFuture<'a, Result<u64, String>> {
            Box::pin(async move {
                if self.one_slot && keys.len() > 1 {
                    return Err("CROSSSLOT".into());
                }
                Ok(keys.iter().filter(|k| self.keys.remove(*k)).count() as u64)
            })
        }
    }

    /// Pages `[a1 a2] [a3 b1] [a4]`.
    fn keys(one_slot: bool) -> Keys {
        let order: Vec<String> = ["a1", "a2", "a3", "b1", "a4"].map(String::from).into();
        Keys {
            keys: order.iter().cloned().collect(),
            order,
            one_slot,
        }
    }

    #[test]
    fn every_matching_key_goes_and_no_other() {
        let rt = crate::env::runtime();
        for batch in [DelBatch::Page, DelBatch::Key] {
            let mut k = keys(false);
            let n = rt.block_on(redis_delete_matching(&mut k, "a*", batch));
            assert_eq!(n, 4, "{batch:?}");
            assert_eq!(k.keys, BTreeSet::from(["b1".to_string()]), "{batch:?}");
        }
    }

    /// A refused `DEL` is skipped, not the end of the wipe: with pages refused, only the
    /// pages of one matching key go; one key per `DEL` takes them all.
    #[test]
    fn one_key_per_del_where_pages_are_refused() {
        let rt = crate::env::runtime();
        let mut k = keys(true);
        let n = rt.block_on(redis_delete_matching(&mut k, "a*", DelBatch::Page));
        assert_eq!(n, 2, "[a1 a2] refused, a3 and a4 alone in their pages");
        let mut k = keys(true);
        let n = rt.block_on(redis_delete_matching(&mut k, "a*", DelBatch::Key));
        assert_eq!(n, 4);
        assert_eq!(k.keys, BTreeSet::from(["b1".to_string()]));
    }

    struct Prefixes(Vec<String>);

    impl PrefixDelete for Prefixes {
        fn delete_prefix<'a>(&'a mut self, prefix: &'a str) -> BoxFuture<'a, Result<u64, String>> {
            Box::pin(async move {
                let before = self.0.len();
                self.0.retain(|k| !k.starts_with(prefix));
                Ok((before - self.0.len()) as u64)
            })
        }
    }

    #[test]
    fn a_namespace_goes_under_every_prefix() {
        let mut p = Prefixes(
            ["lease/ns1-a", "fence/ns1-a", "lease/ns2-a", "lease/ns1"]
                .map(String::from)
                .into(),
        );
        let rt = crate::env::runtime();
        let n = rt.block_on(delete_namespace(&mut p, &["lease/", "fence/"], "ns1"));
        assert_eq!(n, 3);
        assert_eq!(p.0, ["lease/ns2-a"]);
    }
}
