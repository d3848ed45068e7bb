//! For baselines and tooling: the exact text this backend sends to etcd, in one place. Key
//! layouts, the values it writes, the range and watch requests it makes and the shape of every
//! transaction. The store, the renewal code, the sweeper and the fenced resource build their
//! requests only from here, so a benchmark baseline that uses these functions sends what the
//! library sends.
//!
//! # Keys
//! - lock name of lease key `k`: `<prefix>k` ([`lock_name`]; prefix [`DEFAULT_PREFIX`] by
//!   default), the name `etcdctl lock` and Go's `concurrency.Mutex` are given;
//! - contender keys: with one etcd lease per grant, `<prefix>k/lease-rs.0` (or `.1` for a
//!   same-owner re-acquire) ([`slot_key`], [`SLOT_NAMES`]); on a shared etcd lease,
//!   `<prefix>k/<etcd lease id in hex>-<nonce in hex>` ([`lock_key`]); Go's mutex and `etcdctl
//!   lock` name theirs `<prefix>k/<etcd lease id in hex>` (as this crate did before). The holder
//!   is the key under `<prefix>k/` ([`mutex_prefix`]) with the lowest create revision
//!   ([`holder_query`]); names play no part in it;
//! - the fenced resource's state of key `k`: `<fence prefix>k` ([`state_key`]; prefix
//!   [`DEFAULT_FENCE_PREFIX`] by default).
//!
//! # Values
//! - a lock key written by this crate: [`VALUE_TAG`] followed by the owner id
//!   ([`encode_owner`]); keys of other lock clients have an empty value;
//! - a fenced state key: `v1 <high water or 0> <counter> <accepted> <0|1>\n<value bytes>`
//!   ([`encode_state`], [`decode_state`]).
//!
//! ```
//! use leasehold_core::LeaseKey;
//! use leasehold_etcd::protocol;
//! let key = LeaseKey::new("job")?;
//! assert_eq!(protocol::lock_name(protocol::DEFAULT_PREFIX, &key), "lease/job");
//! assert_eq!(protocol::lock_key(protocol::DEFAULT_PREFIX, &key, 0x2a, None), "lease/job/2a");
//! assert_eq!(protocol::lock_key(protocol::DEFAULT_PREFIX, &key, 0x2a, Some(7)), "lease/job/2a-7");
//! # Ok::<(), leasehold_core::Error>(())
//! ```

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions,
};
use leasehold_core::{FencingToken, LeaseKey, OwnerId, ResourceState, Result, mutation};

use crate::error::BACKEND;

/// The default key prefix of lock names: a lease on key `k` is the etcd lock named `lease/k`.
pub const DEFAULT_PREFIX: &str = "lease/";

/// The default key prefix of the fenced resource's state keys.
pub const DEFAULT_FENCE_PREFIX: &str = "lease-fence/";

/// The tag that marks a lock key written by this crate; the owner id follows it. Keys written by
/// `etcdctl lock` or Go's `concurrency.Mutex` have an empty value.
pub const VALUE_TAG: &str = "lease-rs/1 ";

/// The prefix of the stand-in owner ids under which holders of etcd's own lock (`etcdctl lock`,
/// Go's `concurrency.Mutex`) are reported (`etcd-lock:<lock key>`). Reserved: no operation
/// accepts such an owner.
pub const FOREIGN_OWNER: &str = "etcd-lock:";

/// The etcd lock name of `key` under `prefix`: what `etcdctl lock` must be given to contend for
/// it.
pub fn lock_name(prefix: &str, key: &LeaseKey) -> String {
    format!("{prefix}{key}")
}

/// `<prefix><key>/`: the range of the contenders' keys of `key`'s lock.
pub fn mutex_prefix(prefix: &str, key: &LeaseKey) -> String {
    format!("{}/", lock_name(prefix, key))
}

/// The contender key of `key` on etcd lease `lease_id`: `<prefix><key>/<lease id hex>`, as Go's
/// mutex names its keys (and this crate named keys alone on their etcd lease before they took
/// [slot names](SLOT_NAMES)); with a shared etcd lease a `-<nonce hex>` suffix tells apart the
/// keys of one lease (the lock protocol only reads revisions).
pub fn lock_key(prefix: &str, key: &LeaseKey, lease_id: i64, nonce: Option<u64>) -> String {
    match nonce {
        None => format!("{}{lease_id:x}", mutex_prefix(prefix, key)),
        Some(n) => format!("{}{lease_id:x}-{n:x}", mutex_prefix(prefix, key)),
    }
}

/// The two names a lock key alone on an etcd lease of its own (one etcd lease per grant) takes,
/// after the lock prefix: every grant of a key uses the first, except a same-owner re-acquire,
/// whose transaction deletes the old key and creates the new one and so needs the other.
/// etcd keeps a deleted key's entry in its index until compaction, and every range over the
/// lock prefix (the acquire's comparison) visits them all: reusing two names keeps that range
/// small, where a name per grant would grow it by one entry per grant. Neither name is
/// hexadecimal, so neither is ever the name of an `etcdctl lock` or Go mutex contender
/// (`<lock name>/<lease id in hex>`).
pub const SLOT_NAMES: [&str; 2] = ["lease-rs.0", "lease-rs.1"];

/// The lock key of `key` with slot name `slot` ([`SLOT_NAMES`]; 0 or 1).
///
/// ```
/// use leasehold_core::LeaseKey;
/// use leasehold_etcd::protocol;
/// let key = LeaseKey::new("job")?;
/// assert_eq!(protocol::slot_key(protocol::DEFAULT_PREFIX, &key, 0), "lease/job/lease-rs.0");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
pub fn slot_key(prefix: &str, key: &LeaseKey, slot: u8) -> String {
    let name = SLOT_NAMES[usize::from(slot.min(1))];
    format!("{}{name}", mutex_prefix(prefix, key))
}

/// The slot of a lock key with a [slot name](SLOT_NAMES), if it has one.
pub fn slot_of(lock_key: &[u8]) -> Option<u8> {
    let name = std::str::from_utf8(lock_key).ok()?;
    let (_, last) = name.rsplit_once('/')?;
    let slot = SLOT_NAMES.iter().position(|s| *s == last)?;
    u8::try_from(slot).ok()
}

/// The fenced resource's state key of `key` under `fence_prefix`.
pub fn state_key(fence_prefix: &str, key: &LeaseKey) -> String {
    format!("{fence_prefix}{key}")
}

/// The value of a lock key this crate writes for `owner`.
pub fn encode_owner(owner: &OwnerId) -> String {
    format!("{VALUE_TAG}{owner}")
}

/// The owner id text in a lock key's value, if this crate wrote it (it starts with
/// [`VALUE_TAG`]); `None` for keys of other lock clients.
pub fn owner_text(value: &[u8]) -> Option<&str> {
    std::str::from_utf8(value).ok()?.strip_prefix(VALUE_TAG)
}

/// The nonce in the name of a lock key created under a shared etcd lease
/// (`<lock name>/<lease hex>-<nonce hex>`), if it has one.
pub fn nonce_of(lock_key: &[u8]) -> Option<u64> {
    let name = std::str::from_utf8(lock_key).ok()?;
    let (_, last) = name.rsplit_once('/')?;
    let (_, nonce) = last.split_once('-')?;
    u64::from_str_radix(nonce, 16).ok()
}

/// The etcd lease named in a lock key (`<lock name>/<lease hex>[-<nonce hex>]`).
pub fn named_lease_of(lock_key: &[u8]) -> Option<i64> {
    let name = std::str::from_utf8(lock_key).ok()?;
    let (_, last) = name.rsplit_once('/')?;
    let hex = last.split_once('-').map_or(last, |(l, _)| l);
    i64::from_str_radix(hex, 16).ok()
}

/// The range request that finds a lock's holder: the first key under [`mutex_prefix`] by create
/// revision (the response's count is the number of contenders).
pub fn holder_query() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(
            SortTarget::Create,
            // Mutation switch point (`mutation::on` is false unless a mutant is active).
            if mutation::on("etcd.holder.newest_first") {
                SortOrder::Descend
            } else {
                SortOrder::Ascend
            },
        )
        .with_limit(1)
}

/// How many keys one range request of a batched renewal returns at most: the supervisor's
/// largest batch. A lock key is at most about 230 bytes of name, 140 of value (ours: the owner
/// id; `etcdctl lock`'s: empty) and 40 of revisions and lease, so a page stays near 2 MB, below
/// gRPC's 4 MiB response limit; 10,000 leases are read back in two requests.
pub const RANGE_PAGE: i64 = 5_000;

/// One page of a batched renewal's read-back: from the request's key up to `end` (exclusive),
/// at most [`RANGE_PAGE`] keys.
pub fn page_query(end: &str) -> GetOptions {
    GetOptions::new().with_range(end).with_limit(RANGE_PAGE)
}

/// The watch of a lock's contender keys that wakes waiters: deletions under [`mutex_prefix`]
/// (release, expiry, revocation).
pub fn waiter_watch() -> WatchOptions {
    WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoPut])
}

/// The acquire transaction: create `lock_key` (value [`encode_owner`], attached to `lease_id`)
/// if the lock is free, i.e. nothing under `mutex_prefix` has a create revision. With
/// `previous = Some((key, create_revision))` (the caller's own key, alone under the prefix) it
/// replaces that key instead, if nothing under the prefix is newer and the key is unchanged.
/// If the comparison fails, the transaction reads the lock's holder instead ([`holder_query`]:
/// the lowest key by create revision, and the number of keys), so that a refused acquire learns
/// who holds the lock in the same request.
pub fn acquire_txn(
    mutex_prefix: &str,
    previous: Option<(&[u8], i64)>,
    lock_key: &str,
    owner: &OwnerId,
    lease_id: i64,
) -> Txn {
    let mut ops = Vec::with_capacity(2);
    // Each comparison (and the put's etcd lease) passes a mutation switch point: `mutation::on`
    // is false unless leasehold-core's `mutants` feature is on and that mutant is active.
    let mut compares = match previous {
        None => vec![Compare::create_revision(mutex_prefix, CompareOp::Equal, 0).with_prefix()],
        Some((key, rev)) => {
            ops.push(TxnOp::delete(key.to_vec(), None));
            vec![
                Compare::create_revision(mutex_prefix, CompareOp::Less, rev + 1).with_prefix(),
                Compare::create_revision(key.to_vec(), CompareOp::Equal, rev),
            ]
        }
    };
    let drop_compare = match previous {
        None => mutation::on("etcd.acquire.no_free_compare").then_some(0),
        Some(_) if mutation::on("etcd.acquire.replace_without_newer_check") => Some(0),
        Some(_) => mutation::on("etcd.acquire.replace_without_own_check").then_some(1),
    };
    if let Some(i) = drop_compare {
        compares.remove(i);
    }
    let put = if mutation::on("etcd.acquire.no_lease") {
        PutOptions::new()
    } else {
        PutOptions::new().with_lease(lease_id)
    };
    ops.push(TxnOp::put(lock_key, encode_owner(owner), Some(put)));
    Txn::new()
        .when(compares)
        .and_then(ops)
        .or_else(vec![TxnOp::get(mutex_prefix, Some(holder_query()))])
}

/// The most keys one transaction of a batched acquire ([`acquire_many_txn`]) creates: etcd's
/// default `--max-txn-ops` (128), which bounds the comparisons, the success operations and the
/// failure operations of a transaction each.
pub const MAX_TXN_KEYS: usize = 128;

/// The batched acquire transaction: for each `(mutex_prefix, lock_key, owner, lease_id)`, the
/// free-lock comparison of [`acquire_txn`] and its put; all puts happen only if every lock is
/// free. If any comparison fails, the transaction reads every lock's holder instead
/// ([`holder_query`]), one range per entry in order, so that the caller learns which keys are
/// held and tries the free ones again. At most [`MAX_TXN_KEYS`] entries.
pub fn acquire_many_txn(entries: &[(&str, &str, &OwnerId, i64)]) -> Txn {
    let compares = entries
        .iter()
        .map(|(prefix, ..)| Compare::create_revision(*prefix, CompareOp::Equal, 0).with_prefix())
        .collect::<Vec<_>>();
    let puts = entries
        .iter()
        .map(|(_, lock_key, owner, lease_id)| {
            TxnOp::put(
                *lock_key,
                encode_owner(owner),
                Some(PutOptions::new().with_lease(*lease_id)),
            )
        })
        .collect::<Vec<_>>();
    let reads = entries
        .iter()
        .map(|(prefix, ..)| TxnOp::get(*prefix, Some(holder_query())))
        .collect::<Vec<_>>();
    Txn::new().when(compares).and_then(puts).or_else(reads)
}

/// The release transaction of a lock key: delete `lock_key` if it still has `token` as its
/// create revision, `owner`'s value and an etcd lease, returning the deleted key (whose etcd
/// lease the caller then revokes if the key was alone on it, see [`alone_on_its_lease`]).
pub fn release_txn(lock_key: &[u8], token: FencingToken, owner: &OwnerId) -> Txn {
    let mut when = vec![
        Compare::create_revision(lock_key.to_vec(), CompareOp::Equal, token.to_i64()),
        Compare::value(lock_key.to_vec(), CompareOp::Equal, encode_owner(owner)),
        Compare::lease(lock_key.to_vec(), CompareOp::NotEqual, 0),
    ];
    // Mutation switch points (false unless a mutant is active).
    if mutation::on("etcd.release.no_owner_compare") {
        when.remove(1);
    }
    if mutation::on("etcd.release.no_token_compare") {
        when.remove(0);
    }
    Txn::new().when(when).and_then(vec![TxnOp::delete(
        lock_key.to_vec(),
        Some(DeleteOptions::new().with_prev_key()),
    )])
}

/// Whether a lock key written by this crate sits alone on an etcd lease of its own: it has a
/// [slot name](SLOT_NAMES), or (keys of earlier versions) its name has no nonce and names the
/// etcd lease it is on. Such an etcd lease was granted for this key by one acquire, which put
/// this key and nothing else on it ([`LeaseSharing::PerGrant`]), so revoking it deletes exactly
/// this key. Keys on a shared etcd lease carry a nonce.
///
/// [`LeaseSharing::PerGrant`]: crate::LeaseSharing::PerGrant
pub fn alone_on_its_lease(lock_key: &[u8], lease_id: i64) -> bool {
    lease_id != 0
        && (slot_of(lock_key).is_some()
            || (nonce_of(lock_key).is_none() && named_lease_of(lock_key) == Some(lease_id)))
}

/// The end of the range of keys that start with `prefix` (its last byte incremented; lock
/// prefixes end in `/`, so there is no carry).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// One page of a batched inspect: from the request's key up to `end` (exclusive), at most
/// [`RANGE_PAGE`] keys, at store revision `revision` (0: the newest; later pages read the
/// revision of the first, so that all pages show one instant).
pub fn inspect_page_query(end: Vec<u8>, revision: i64) -> GetOptions {
    GetOptions::new()
        .with_range(end)
        .with_limit(RANGE_PAGE)
        .with_revision(revision)
}

/// The transaction that deletes a lock key if it still has `create_revision` (the token) and
/// `lease_id` (and `mod_revision`, if given): release, and the sweeper's expiry of a key on a
/// shared etcd lease.
pub fn delete_txn(
    key: &[u8],
    create_revision: i64,
    lease_id: i64,
    mod_revision: Option<i64>,
) -> Txn {
    let mut when = vec![
        Compare::create_revision(key.to_vec(), CompareOp::Equal, create_revision),
        Compare::lease(key.to_vec(), CompareOp::Equal, lease_id),
    ];
    // Mutation switch points (false unless a mutant is active).
    if mutation::on("etcd.delete.no_lease_compare") {
        when.remove(1);
    }
    if mutation::on("etcd.delete.no_revision_compare") {
        when.remove(0);
    }
    if let Some(m) = mod_revision {
        when.push(Compare::mod_revision(key.to_vec(), CompareOp::Equal, m));
    }
    Txn::new()
        .when(when)
        .and_then(vec![TxnOp::delete(key.to_vec(), None)])
}

/// The transaction that moves a lock key onto etcd lease `lease_id`: re-put with the same value
/// (so the same create revision, the same token) if it still has `token` and `owner`'s value.
pub fn move_txn(lock_key: &str, token: FencingToken, owner: &OwnerId, lease_id: i64) -> Txn {
    let value = encode_owner(owner);
    let mut when = vec![
        Compare::create_revision(lock_key, CompareOp::Equal, token.to_i64()),
        Compare::value(lock_key, CompareOp::Equal, value.clone()),
    ];
    // Mutation switch point (false unless a mutant is active).
    if mutation::on("etcd.move.no_token_compare") {
        when.remove(0);
    }
    Txn::new().when(when).and_then(vec![TxnOp::put(
        lock_key,
        value,
        Some(PutOptions::new().with_lease(lease_id)),
    )])
}

/// The fenced write: put `state` into `state_key` if its mod revision is still `mod_revision`
/// (0: the key does not exist), so the high-water check and the write are atomic.
pub fn fence_txn(state_key: &str, mod_revision: i64, state: &ResourceState) -> Txn {
    // Mutation switch point (false unless a mutant is active).
    let when = if mutation::on("etcd.fence.no_revision_compare") {
        vec![]
    } else {
        vec![Compare::mod_revision(
            state_key,
            CompareOp::Equal,
            mod_revision,
        )]
    };
    Txn::new()
        .when(when)
        .and_then(vec![TxnOp::put(state_key, encode_state(state), None)])
}

/// `v1 <high water or 0> <counter> <accepted> <0|1>\n<value bytes>`.
pub fn encode_state(state: &ResourceState) -> Vec<u8> {
    let hw = state.high_water.map_or(0, FencingToken::get);
    let mut out = format!(
        "v1 {hw} {} {} {}\n",
        state.counter,
        state.accepted,
        u8::from(state.value.is_some())
    )
    .into_bytes();
    if let Some(v) = &state.value {
        out.extend_from_slice(v);
    }
    out
}

/// Decodes a state key's value written by [`encode_state`].
///
/// # Errors
/// A corrupt-record [`Error::Backend`](leasehold_core::Error::Backend) naming `key`.
pub fn decode_state(key: &str, bytes: &[u8]) -> Result<ResourceState> {
    let bad = |what: &str| {
        leasehold_core::backend::corrupt(BACKEND, key, format_args!("fenced state: {what}"))
    };
    let nl = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| bad("no header line"))?;
    let (head, rest) = bytes.split_at(nl);
    let head = std::str::from_utf8(head).map_err(|_| bad("header is not UTF-8"))?;
    let fields: Vec<&str> = head.split(' ').collect();
    let [version, hw, counter, accepted, has_value] = fields.as_slice() else {
        return Err(bad("header has the wrong number of fields"));
    };
    if *version != "v1" {
        return Err(bad("unknown version"));
    }
    let hw: u64 = hw.parse().map_err(|_| bad("high water"))?;
    Ok(ResourceState {
        high_water: if hw == 0 {
            None
        } else {
            Some(leasehold_core::backend::decode_token(BACKEND, key, hw)?)
        },
        counter: counter.parse().map_err(|_| bad("counter"))?,
        accepted: accepted.parse().map_err(|_| bad("accepted"))?,
        value: match *has_value {
            "1" => rest.get(1..).map(<[u8]>::to_vec),
            "0" => None,
            _ => return Err(bad("value flag")),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        let state = ResourceState {
            high_water: Some(FencingToken::new(42).unwrap()),
            value: Some(b"a\nb".to_vec()),
            counter: -3,
            accepted: 9,
        };
        assert_eq!(decode_state("k", &encode_state(&state)).unwrap(), state);
        assert_eq!(
            decode_state("k", &encode_state(&ResourceState::default())).unwrap(),
            ResourceState::default()
        );
        let e = decode_state("k", b"v2 1 2 3 0\n").unwrap_err();
        assert!(
            e.to_string().contains("corrupt record for key \"k\""),
            "{e}"
        );
    }

    #[test]
    fn nonces_are_read_from_lock_key_names() {
        assert_eq!(slot_of(b"lease/k/lease-rs.0"), Some(0));
        assert_eq!(slot_of(b"lease/k/lease-rs.1"), Some(1));
        assert_eq!(slot_of(b"lease/k/lease-rs.2"), None);
        assert_eq!(slot_of(b"lease/k/2a"), None);
        assert_eq!(nonce_of(b"lease/k/lease-rs.1"), None);
        assert_eq!(named_lease_of(b"lease/k/lease-rs.1"), None);
        assert!(alone_on_its_lease(b"lease/k/lease-rs.1", 7));
        assert!(!alone_on_its_lease(b"lease/k/lease-rs.1", 0));
        assert!(alone_on_its_lease(b"lease/k/2a", 0x2a));
        assert!(!alone_on_its_lease(b"lease/k/2a", 0x2b));
        assert!(!alone_on_its_lease(b"lease/k/2a-1", 0x2a));
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

    #[test]
    fn owner_values_round_trip() {
        let owner = OwnerId::new("w-1").unwrap();
        assert_eq!(owner_text(encode_owner(&owner).as_bytes()), Some("w-1"));
        assert_eq!(owner_text(b""), None);
    }
}
