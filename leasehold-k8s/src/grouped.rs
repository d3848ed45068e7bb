//! [`K8sGroupedStore`]: a [`LeaseStore`] for thousands of keys (a shard set) whose renewal costs
//! requests per **owner**, not per key: one membership Lease per owner and TTL, and the keys'
//! assignments in a fixed number of group ConfigMaps.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use leasehold_core::backend::{corrupt, decode_token, granted_lease, validate_acquire_many};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Error, FencingToken, Holder, KeyState, KeyWatch,
    Lease, LeaseKey, LeaseStore, OwnerId, ReleaseOutcome, RenewOutcome, Result,
};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use crate::K8sFencedResource;
use crate::error::{BACKEND, K8sError};
use crate::protocol::{MAX_OBJECT_NAME_LEN, Record, parse_resource_version};
use crate::store::{K8sLeaseStore, expired};

/// The number of group objects a [`K8sGroupedStore`] uses unless told otherwise
/// ([`K8sLeaseStore::grouped`]).
///
/// ```
/// assert_eq!(leasehold_k8s::DEFAULT_GROUPS, 16);
/// ```
pub const DEFAULT_GROUPS: u16 = 16;
/// The most group objects one [`K8sGroupedStore`] may use.
///
/// ```
/// assert_eq!(leasehold_k8s::MAX_GROUPS, 256);
/// ```
pub const MAX_GROUPS: u16 = 256;
/// The longest name of a grouped store's set (a DNS-1123 label of at most this many bytes).
///
/// ```
/// assert_eq!(leasehold_k8s::MAX_SET_LEN, 40);
/// ```
pub const MAX_SET_LEN: usize = 40;
/// The label every group ConfigMap carries, its value the set's name: a grouped store reads
/// many groups with one LIST selected by it.
pub const GROUP_SET_LABEL: &str = "lease.rs/group-set";
/// The annotation of a group ConfigMap naming how many groups its set has.
pub const GROUP_COUNT_ANNOTATION: &str = "lease.rs/groups";

/// How many lost write races on one group object an acquire absorbs before it gives up.
const MAX_RACES: usize = 64;
/// How many group objects one `acquire_many` writes at once.
const GROUPS_IN_FLIGHT: usize = 8;
/// Up to this many groups are read with one GET each; more with one LIST.
const GET_THRESHOLD: usize = 2;
/// How many membership Leases one `inspect_many` reads at once.
const MEMBERS_IN_FLIGHT: usize = 16;
/// How often an owner tries to take its membership Lease while another holds it (a candidate
/// that revoked the owner's previous term holds it for at most [`REVOKE_TTL`]).
const MEMBER_ATTEMPTS: u32 = 12;
/// The TTL of the short grant a candidate takes on a dead owner's membership Lease to end that
/// owner's term; released at once.
const REVOKE_TTL: Duration = Duration::from_secs(1);

/// One key's entry in its group object: the key's last token (kept after release, so that the
/// entry also records the key's generation) and, while assigned, whom to and under which term
/// of which membership Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) token: FencingToken,
    pub(crate) held: Option<Assigned>,
}

/// An assignment: the owner, the token of the owner's membership Lease when the key was granted
/// (the term, "incarnation"), and the TTL in seconds (which membership Lease: one per owner and
/// TTL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Assigned {
    pub(crate) inc: FencingToken,
    pub(crate) secs: u32,
    pub(crate) owner: OwnerId,
}

impl Entry {
    /// `TOKEN` for a free key, `TOKEN INCARNATION SECONDS OWNER` for an assigned one (an owner
    /// id has no whitespace, so the encoding is unambiguous).
    pub(crate) fn encode(&self) -> String {
        match &self.held {
            None => self.token.get().to_string(),
            Some(a) => format!(
                "{} {} {} {}",
                self.token.get(),
                a.inc.get(),
                a.secs,
                a.owner.as_str()
            ),
        }
    }

    /// The entry of `key` in group `group`, or a corrupt-record error naming both.
    pub(crate) fn decode(group: &str, key: &str, text: &str) -> Result<Entry> {
        let bad = |what: &str| corrupt(BACKEND, key, format_args!("group {group:?}: {what}"));
        let parts: Vec<&str> = text.split(' ').collect();
        let token = |s: &str| -> Result<FencingToken> {
            let n: u64 = s.parse().map_err(|_| bad("token is not a number"))?;
            decode_token(BACKEND, key, n)
        };
        match parts.as_slice() {
            [t] => Ok(Entry {
                token: token(t)?,
                held: None,
            }),
            [t, inc, secs, owner] => Ok(Entry {
                token: token(t)?,
                held: Some(Assigned {
                    inc: token(inc)?,
                    secs: secs
                        .parse()
                        .ok()
                        .filter(|s| *s > 0)
                        .ok_or_else(|| bad("TTL is not a positive number of seconds"))?,
                    owner: OwnerId::new(*owner)
                        .map_err(|_| bad("owner is not a legal owner id"))?,
                }),
            }),
            _ => Err(bad("entry is neither `TOKEN` nor `TOKEN INC SECS OWNER`")),
        }
    }
}

/// FNV-1a, 64 bits: a hash that never changes between builds or platforms (the group of a key
/// and the name of an owner's membership Lease must be computed alike by every process).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The group (0..groups) that holds `key`'s entry.
pub(crate) fn group_of(key: &str, groups: u16) -> u16 {
    // The remainder is below `groups`, a u16.
    u16::try_from(fnv1a(key.as_bytes()) % u64::from(groups.max(1))).unwrap_or(0)
}

/// The token of a grant written by a replace conditioned on group version `rv`: above that
/// version (every token issued in the group so far is at most its current version, and the
/// replace writes a version above `rv`) and above the key's recorded token.
pub(crate) fn next_token(rv: u64, previous: Option<FencingToken>) -> Result<FencingToken> {
    let at_least = rv.checked_add(1).ok_or_else(|| {
        Error::store_fault(BACKEND, format!("resourceVersion {rv} overflows"), None)
    })?;
    let floor = previous.map_or(0, |p| p.get().saturating_add(1));
    FencingToken::new(at_least.max(floor))
}

/// What a reader concludes about an owner's term from the owner's membership Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Term {
    /// The Lease names the owner with the term's token and this store has not yet seen it
    /// unchanged for its duration: the keys of the term are held.
    Live { remaining: Duration, ttl: Duration },
    /// The Lease still names the owner with the term's token, but this store has seen it
    /// unchanged for its whole duration: the term may be ended (revoked) by a conditional write.
    Expired,
    /// The Lease is gone, free, or names another holder or token: the term is over for good
    /// (tokens never go back, so that term never returns).
    Over,
}

/// Judges the term `inc` of `owner` from the owner's membership Lease record as this store read
/// it (`None`: no such object) and first saw it (`first_seen`, on this store's monotonic clock),
/// at `now`. Never compares timestamps written by other hosts.
pub(crate) fn judge_term(
    owner: &OwnerId,
    inc: FencingToken,
    read: Option<(&Record, Instant)>,
    now: Instant,
) -> Term {
    let Some((rec, first_seen)) = read else {
        return Term::Over;
    };
    if !rec.is_held_by(owner, inc) {
        return Term::Over;
    }
    if expired(rec, first_seen, now) {
        Term::Expired
    } else {
        Term::Live {
            remaining: (first_seen + rec.duration).saturating_duration_since(now),
            ttl: rec.duration,
        }
    }
}

/// Checks a set name: a DNS-1123 label of at most [`MAX_SET_LEN`] bytes, not `fence` (whose
/// group names could meet the fenced resource's ConfigMaps).
pub(crate) fn validate_set(set: &str) -> Result<()> {
    let ok = !set.is_empty()
        && set.len() <= MAX_SET_LEN
        && set
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !set.starts_with('-')
        && !set.ends_with('-')
        && set != "fence";
    if ok {
        Ok(())
    } else {
        Err(Error::config(
            BACKEND,
            format!(
                "set name {set:?} must be a DNS-1123 label (lowercase letters, digits, '-') of 1 to {MAX_SET_LEN} bytes, and not \"fence\""
            ),
            None,
        ))
    }
}

/// One group object as read: its name, version and entries (`object` is `None` when it does not
/// exist yet).
#[derive(Debug, Clone)]
struct Group {
    name: String,
    object: Option<ConfigMap>,
    rv: u64,
    entries: BTreeMap<String, Entry>,
}

impl Group {
    fn parse(name: String, object: Option<ConfigMap>) -> Result<Group> {
        let Some(cm) = object else {
            return Ok(Group {
                name,
                object: None,
                rv: 0,
                entries: BTreeMap::new(),
            });
        };
        let rv = parse_resource_version(&name, cm.metadata.resource_version.as_deref())?;
        let mut entries = BTreeMap::new();
        for (k, v) in cm.data.iter().flatten() {
            entries.insert(k.clone(), Entry::decode(&name, k, v)?);
        }
        Ok(Group {
            name,
            object: Some(cm),
            rv,
            entries,
        })
    }
}

/// The judgements of one call, by (membership Lease name, term): a term found over stays over,
/// so one call revokes a dead owner's term once, however many of its keys it takes.
type Judged = AsyncMutex<HashMap<(String, FencingToken), Term>>;

/// A [`LeaseStore`] for **many keys held by few owners** (a shard set of thousands of shards over
/// tens of workers), whose renewal costs requests per owner, not per key. Made by
/// [`K8sLeaseStore::grouped`]; the default [`K8sLeaseStore`] (one Lease per key, interoperable
/// with client-go) is unchanged.
///
/// # Layout
/// - **One membership Lease per owner and TTL** (`coordination.k8s.io/v1`, named
///   `<prefix><set>.m-<hash of the owner>-<seconds>`), granted, renewed and judged exactly as a
///   [`K8sLeaseStore`] key (conditional writes, expiry observed on the local monotonic clock, a
///   token that never goes back). Its token is the owner's **term**.
/// - **A fixed number of group ConfigMaps** (`<prefix><set>.g<G>-<i>`, labelled
///   [`GROUP_SET_LABEL`]`=<set>`); a key's entry lives in group `fnv1a(key) mod G`, under the key,
///   as `TOKEN` (free) or `TOKEN TERM SECONDS OWNER` (assigned).
///
/// A key is **held** while its entry names an owner whose membership Lease still carries the
/// entry's term and has not been seen unchanged for its duration. So:
/// - [`renew_many`](LeaseStore::renew_many) of all of an owner's keys is **one** conditional
///   replace of its membership Lease plus one read of the groups (a GET for one or two groups,
///   one LIST for more) that confirms each key's entry: two requests per owner and TTL, whatever
///   the number of keys. [`renew`](LeaseStore::renew) costs the same for one key, and extends
///   every key of the owner's term (as an etcd lease shared by many keys does).
/// - [`acquire_many`](LeaseStore::acquire_many) renews (or takes) the owner's membership Lease,
///   then writes each group it touches once: a GET and a replace conditioned on the version read,
///   granting all of the batch's free keys in that group at once. A first grant in a set creates
///   the group object (one more request). [`acquire`](LeaseStore::acquire) is a batch of one.
/// - Taking a key from an owner whose term this store has seen expire first **revokes** the term:
///   a conditional write on that owner's membership Lease (a grant to the taker with a 1 s TTL,
///   released at once), so the dead owner's next renewal is a conflict and it learns it lost
///   everything. Then the group write. One revocation per dead owner, not per key.
/// - [`release`](LeaseStore::release) writes the group (the entry keeps the token).
/// - [`inspect_many`](LeaseStore::inspect_many) reads the groups (one LIST) and the membership
///   Leases they name (one GET each: as many as owners).
///
/// # Guarantees
/// - Each key's token is above every token issued for it before: a grant conditioned on group
///   version `X` gets `X + 1` (or the entry's token + 1 if higher); versions are etcd revisions,
///   cluster-wide and increasing, so this holds after the group object is deleted and recreated
///   too. Fencing ([`fenced_resource`](Self::fenced_resource)) therefore rejects an older token.
/// - Two owners never both hold a key: a grant is a conditional write of the key's group, made
///   only when the previous holder's term is over or revoked by a conditional write of its
///   membership Lease, which that holder's renewal is conditioned on.
/// - The conformance suite of `leasehold-testkit` passes against a real kube-apiserver (its test
///   target `k8s_grouped`).
///
/// # Assumptions and limits
/// - **Expiry is judged per owner, not per key**: renewing one key renews all the keys the owner
///   holds with that TTL; a key whose renewal stops while its owner renews others stays held
///   until it is released. Let each owner renew all its keys at once (`renew_many`), as a shard
///   set does.
/// - **One store per owner id at a time**: the store remembers its owners' membership Leases; a
///   second process acquiring with the same owner id starts a new term, which ends the first
///   process's term (its renewals are lost), as a restarted process taking its keys back should.
/// - A key must be used in one mode only: a [`K8sLeaseStore`] and a grouped store keep separate
///   records for the same key. So must the set's group count: a store with another `groups` for
///   the same set uses other objects and does not see the first store's assignments.
/// - The same clock-rate assumption as [`K8sLeaseStore`] (the crate docs): no host's monotonic
///   clock runs faster than another's by more than the drift margin over one TTL.
/// - A group ConfigMap holds at most 1 MiB: about 10,000 entries of 60-byte keys and owners;
///   choose `groups` so that `keys / groups` stays well below that (16 groups for 10,000 keys use
///   about 70 KiB each). Entries of released keys stay (they keep the key's token).
/// - Not interoperable with client-go's `LeaseLock`: a Go controller sees only the membership
///   Leases, not the keys.
/// - [`watch`](LeaseStore::watch) watches the key's group object: a change to any key of the
///   group is a hint, and the end of an owner's term by expiry (nothing written) is not.
///
/// # RBAC
/// Those of [`K8sLeaseStore`], plus `get`, `list`, `watch`, `create` and `update` on
/// `configmaps` (the group objects).
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_core::{AcquireRequest, LeaseKey, LeaseStore, OwnerId};
/// use leasehold_k8s::K8sLeaseStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let store = K8sLeaseStore::connect("k8s://payments").await?.grouped("shards", 16)?;
/// let me = OwnerId::with_label("worker-3");
/// let reqs: Vec<AcquireRequest> = (0..1000)
///     .map(|i| Ok(AcquireRequest::new(LeaseKey::new(format!("shard-{i}"))?, me.clone(), Duration::from_secs(15))))
///     .collect::<leasehold_core::Result<_>>()?;
/// // One membership write and one GET and replace per group touched (16 at most).
/// let granted: Vec<_> = store
///     .acquire_many(&reqs)
///     .await?
///     .into_iter()
///     .filter_map(|o| o.ok().and_then(|o| o.lease()))
///     .collect();
/// // One membership write and one LIST of the groups, for all 1,000 keys.
/// let before = store.requests_sent();
/// let renewed = store.renew_many(&granted).await?;
/// assert!(store.requests_sent() - before <= 2);
/// # let _ = renewed; Ok(()) }
/// ```
#[derive(Clone)]
pub struct K8sGroupedStore {
    inner: K8sLeaseStore,
    maps: Api<ConfigMap>,
    set: String,
    groups: u16,
    /// This store's membership Leases, by owner and TTL in seconds.
    members: Arc<AsyncMutex<HashMap<(OwnerId, u32), Lease>>>,
}

impl fmt::Debug for K8sGroupedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("K8sGroupedStore")
            .field("namespace", &self.inner.namespace())
            .field("prefix", &self.inner.prefix)
            .field("set", &self.set)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

impl K8sLeaseStore {
    /// A [`K8sGroupedStore`] over this store's client, namespace, name prefix and request
    /// timeout: the mode for thousands of keys held by few owners (a shard set), whose renewal
    /// costs requests per owner, not per key. `set` names its objects (every process of one shard
    /// set must use the same `set` and `groups`); `groups` is the number of group ConfigMaps
    /// ([`DEFAULT_GROUPS`] suits up to some 50,000 keys). Sends nothing. This store is unchanged
    /// and can still be used for single keys (other keys than the grouped store's).
    ///
    /// ```no_run
    /// use leasehold_k8s::{DEFAULT_GROUPS, K8sLeaseStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let shards = K8sLeaseStore::connect("k8s://payments").await?.grouped("invoices", DEFAULT_GROUPS)?;
    /// assert_eq!(shards.set(), "invoices");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] for a set name that is not a DNS-1123 label of at most
    /// [`MAX_SET_LEN`] bytes (or is `fence`), for `groups` outside `1..=`[`MAX_GROUPS`], or when
    /// the objects' names would exceed 253 bytes with this store's prefix.
    pub fn grouped(&self, set: &str, groups: u16) -> Result<K8sGroupedStore> {
        validate_set(set)?;
        if groups == 0 || groups > MAX_GROUPS {
            return Err(Error::config(
                BACKEND,
                format!("groups must be between 1 and {MAX_GROUPS}, got {groups}"),
                None,
            ));
        }
        let store = K8sGroupedStore {
            maps: Api::namespaced(self.client.clone(), self.namespace()),
            inner: self.clone(),
            set: set.to_string(),
            groups,
            members: Arc::default(),
        };
        let longest = store
            .group_name(groups - 1)
            .len()
            .max(store.inner.prefix.len() + set.len() + ".m-0123456789abcdef-86400".len());
        if longest > MAX_OBJECT_NAME_LEN {
            return Err(Error::config(
                BACKEND,
                format!(
                    "set {set:?} with name prefix {:?} makes object names longer than {MAX_OBJECT_NAME_LEN} bytes",
                    store.inner.prefix
                ),
                None,
            ));
        }
        Ok(store)
    }
}

impl K8sGroupedStore {
    /// The set's name.
    pub fn set(&self) -> &str {
        &self.set
    }

    /// The number of group objects.
    pub fn groups(&self) -> u16 {
        self.groups
    }

    /// The namespace of the objects.
    pub fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    /// API requests sent so far by this store and by the [`K8sLeaseStore`] it was made from
    /// (one counter: see [`K8sLeaseStore::requests_sent`]).
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests_sent()
    }

    /// The name of the group ConfigMap that holds `key`'s entry.
    ///
    /// ```no_run
    /// # async fn f(store: leasehold_k8s::K8sGroupedStore) -> leasehold_core::Result<()> {
    /// let name = store.group_object_name(&leasehold_core::LeaseKey::new("shard-7")?);
    /// assert!(name.starts_with(&format!("{}.g{}-", store.set(), store.groups())));
    /// # Ok(()) }
    /// ```
    pub fn group_object_name(&self, key: &LeaseKey) -> String {
        self.group_name(group_of(key.as_str(), self.groups))
    }

    /// The name of the membership Lease of `owner` for leases of `ttl` (rounded up to whole
    /// seconds, as granted).
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] for a TTL the store does not grant.
    pub fn membership_object_name(&self, owner: &OwnerId, ttl: Duration) -> Result<String> {
        let secs = self.inner.grantable_ttl(ttl)?.get();
        Ok(self.inner.object_name(&self.member_key(owner, secs)?))
    }

    /// The fenced resource next to this store: that of [`K8sLeaseStore::fenced_resource`]
    /// (ConfigMaps `fence.<prefix><key>`), which rejects any token below the highest it accepted.
    pub fn fenced_resource(&self) -> K8sFencedResource {
        self.inner.fenced_resource()
    }

    fn group_name(&self, index: u16) -> String {
        format!("{}{}.g{}-{index}", self.inner.prefix, self.set, self.groups)
    }

    fn member_key(&self, owner: &OwnerId, secs: u32) -> Result<LeaseKey> {
        LeaseKey::new(format!(
            "{}.m-{:016x}-{secs}",
            self.set,
            fnv1a(owner.as_str().as_bytes())
        ))
    }

    async fn read_group(&self, index: u16) -> Result<Group> {
        let name = self.group_name(index);
        let obj = self
            .inner
            .timed("get", self.maps.get_opt(&name))
            .await
            .map_err(|e| e.into_error("get"))?;
        Group::parse(name, obj)
    }

    /// The groups `indices` (distinct): one GET each for a few, else one LIST selected by the
    /// set's label.
    async fn read_groups(&self, indices: &[u16]) -> Result<HashMap<u16, Group>> {
        if indices.len() <= GET_THRESHOLD {
            let reads: Vec<_> = indices.iter().map(|&i| self.read_group(i)).collect();
            let groups: Vec<Group> = stream::iter(reads)
                .buffered(GET_THRESHOLD)
                .try_collect()
                .await?;
            return Ok(indices.iter().copied().zip(groups).collect());
        }
        let lp = ListParams::default().labels(&format!("{GROUP_SET_LABEL}={}", self.set));
        let list = self
            .inner
            .timed("list", self.maps.list(&lp))
            .await
            .map_err(|e| e.into_error("list"))?;
        let mut by_name: HashMap<String, ConfigMap> = list
            .items
            .into_iter()
            .filter_map(|cm| cm.metadata.name.clone().map(|n| (n, cm)))
            .collect();
        indices
            .iter()
            .map(|&i| {
                let name = self.group_name(i);
                let obj = by_name.remove(&name);
                Ok((i, Group::parse(name, obj)?))
            })
            .collect()
    }

    /// Creates the empty group object (a lost race to create it is fine).
    async fn create_group(&self, index: u16) -> Result<()> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.group_name(index)),
                labels: Some(BTreeMap::from([(
                    GROUP_SET_LABEL.to_string(),
                    self.set.clone(),
                )])),
                annotations: Some(BTreeMap::from([(
                    GROUP_COUNT_ANNOTATION.to_string(),
                    self.groups.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        match self
            .inner
            .timed("create", self.maps.create(&PostParams::default(), &cm))
            .await
        {
            Ok(_) | Err(K8sError::AlreadyExists) => Ok(()),
            Err(K8sError::NotFound(message)) => Err(Error::config(
                BACKEND,
                format!(
                    "cannot create ConfigMap {:?} in namespace {:?}: {message}",
                    self.group_name(index),
                    self.namespace()
                ),
                None,
            )),
            Err(e) => Err(e.into_error("create")),
        }
    }

    /// Replaces `group` with `entries`, conditioned on the version read.
    async fn write_group(
        &self,
        group: &Group,
        entries: &BTreeMap<String, Entry>,
    ) -> std::result::Result<(), K8sError> {
        let Some(mut cm) = group.object.clone() else {
            return Err(K8sError::NotFound(group.name.clone()));
        };
        cm.data = Some(
            entries
                .iter()
                .map(|(k, e)| (k.clone(), e.encode()))
                .collect(),
        );
        self.inner
            .timed(
                "replace",
                self.maps.replace(&group.name, &PostParams::default(), &cm),
            )
            .await
            .map(|_| ())
    }

    /// Renews `owner`'s membership Lease for `secs`, or takes it (a new term) when this store
    /// holds none that is still valid. Returns the term and when the deciding write was sent (a
    /// lower bound: the grants of the term are valid until `sent + ttl - drift`).
    async fn ensure_member(
        &self,
        owner: &OwnerId,
        secs: u32,
        ttl: Duration,
    ) -> Result<(FencingToken, Instant)> {
        let mut members = self.members.lock().await;
        let slot = (owner.clone(), secs);
        if let Some(m) = members.get(&slot).filter(|m| m.is_valid()).cloned() {
            let sent = Instant::now();
            if let RenewOutcome::Renewed(next) = self.inner.renew(&m).await? {
                let term = next.token();
                members.insert(slot, next);
                return Ok((term, sent));
            }
        }
        members.remove(&slot);
        let req = AcquireRequest::new(self.member_key(owner, secs)?, owner.clone(), ttl);
        for attempt in 1..=MEMBER_ATTEMPTS {
            let sent = Instant::now();
            match self.inner.acquire(&req).await? {
                AcquireOutcome::Acquired(m) => {
                    let term = m.token();
                    tracing::debug!(backend = BACKEND, set = %self.set, owner = %owner, term = %term, "membership term started");
                    members.insert(slot, m);
                    return Ok((term, sent));
                }
                // Another candidate holds it for a moment to end our previous term (a REVOKE_TTL
                // grant it releases at once): wait for it.
                AcquireOutcome::Held(_) => {
                    tokio::time::sleep(Duration::from_millis(50) * attempt).await;
                }
            }
        }
        Err(Error::refused(
            BACKEND,
            format!(
                "membership Lease {:?} stayed held by another owner",
                self.inner.object_name(&req.key)
            ),
            None,
        ))
    }

    /// Whether the term of `held` is live, as this store judges it; a term seen expired is
    /// revoked (by `taker`) so that its owner cannot renew it any more.
    async fn judge(&self, held: &Assigned, taker: &OwnerId, judged: &Judged) -> Result<Term> {
        let key = self.member_key(&held.owner, held.secs)?;
        let name = self.inner.object_name(&key);
        let mut judged = judged.lock().await;
        if let Some(t) = judged.get(&(name.clone(), held.inc)) {
            return Ok(t.clone());
        }
        let read = self.inner.read(&name).await?;
        let term = match judge_term(
            &held.owner,
            held.inc,
            read.as_ref().map(|(_, rec, seen)| (rec, *seen)),
            Instant::now(),
        ) {
            Term::Expired => {
                // A conditional write on the dead owner's membership Lease (the single-Lease
                // acquire: conditioned on the version seen expired) ends the term: its owner's
                // next renewal is a conflict. Released at once; the term never returns.
                let req = AcquireRequest::new(key, taker.clone(), REVOKE_TTL);
                match self.inner.acquire(&req).await? {
                    AcquireOutcome::Acquired(l) => {
                        tracing::debug!(backend = BACKEND, set = %self.set, owner = %held.owner, term = %held.inc, "expired membership term revoked");
                        if let Err(e) = self.inner.release(&l).await {
                            tracing::debug!(backend = BACKEND, error = %e, "release after revocation failed; it expires in 1 s");
                        }
                        Term::Over
                    }
                    AcquireOutcome::Held(h) if h.owner == held.owner && h.token == held.inc => {
                        Term::Live {
                            remaining: h.remaining,
                            ttl: h.ttl,
                        }
                    }
                    AcquireOutcome::Held(_) => Term::Over,
                }
            }
            other => other,
        };
        judged.insert((name, held.inc), term.clone());
        Ok(term)
    }

    /// Grants what it can of `idxs` (requests whose keys live in group `index`) with one
    /// conditional replace, retrying lost races.
    async fn acquire_in_group(
        &self,
        index: u16,
        idxs: Vec<usize>,
        reqs: &[AcquireRequest],
        terms: &HashMap<(OwnerId, u32), (FencingToken, Instant, Duration)>,
        judged: &Judged,
    ) -> Result<Vec<(usize, AcquireOutcome)>> {
        for _ in 0..MAX_RACES {
            let group = self.read_group(index).await?;
            if group.object.is_none() {
                self.create_group(index).await?;
                continue;
            }
            let mut out = Vec::with_capacity(idxs.len());
            let mut entries = group.entries.clone();
            let mut grants = Vec::new();
            for &i in &idxs {
                let req = &reqs[i];
                let previous = group.entries.get(req.key.as_str());
                if let Some(Entry {
                    token,
                    held: Some(held),
                }) = previous
                    && held.owner != req.owner
                    && let Term::Live { remaining, ttl } =
                        self.judge(held, &req.owner, judged).await?
                {
                    out.push((
                        i,
                        AcquireOutcome::Held(Holder {
                            owner: held.owner.clone(),
                            token: *token,
                            remaining,
                            ttl,
                        }),
                    ));
                    continue;
                }
                let secs = self.inner.grantable_ttl(req.ttl)?.get();
                let Some(&(inc, _, _)) = terms.get(&(req.owner.clone(), secs)) else {
                    continue;
                };
                let token = next_token(group.rv, previous.map(|e| e.token))?;
                entries.insert(
                    req.key.as_str().to_string(),
                    Entry {
                        token,
                        held: Some(Assigned {
                            inc,
                            secs,
                            owner: req.owner.clone(),
                        }),
                    },
                );
                grants.push((i, token, secs));
            }
            if grants.is_empty() {
                return Ok(out);
            }
            match self.write_group(&group, &entries).await {
                Ok(()) => {
                    for (i, token, secs) in grants {
                        let req = &reqs[i];
                        let (inc, sent, ttl) = terms[&(req.owner.clone(), secs)];
                        tracing::debug!(backend = BACKEND, key = %req.key, owner = %req.owner, token = %token, term = %inc, "grouped lease acquired");
                        let lease = granted_lease(
                            req.key.clone(),
                            req.owner.clone(),
                            token,
                            ttl,
                            req.drift_margin(),
                            sent,
                        )
                        .with_handle(inc.get().to_string());
                        out.push((i, AcquireOutcome::Acquired(lease)));
                    }
                    return Ok(out);
                }
                Err(K8sError::Conflict | K8sError::NotFound(_)) => continue,
                Err(e) => return Err(e.into_error("replace")),
            }
        }
        Err(Error::refused(
            BACKEND,
            format!(
                "lost {MAX_RACES} consecutive write races on group {:?}",
                self.group_name(index)
            ),
            None,
        ))
    }

    /// The term a lease names in its handle (set by this store's grants and renewals).
    fn term_of(lease: &Lease) -> Option<FencingToken> {
        lease
            .handle()
            .and_then(|h| h.parse::<u64>().ok())
            .and_then(|t| FencingToken::new(t).ok())
    }

    /// Renews the membership Lease of `owner` for `secs` whose term is `term` (the lease's
    /// handle; `None`: whatever term this store holds, else the one the Lease carries). Returns
    /// the term renewed and when the renewal was sent, or `None` if that term is over.
    async fn renew_member(
        &self,
        owner: &OwnerId,
        secs: u32,
        ttl: Duration,
        term: Option<FencingToken>,
    ) -> Result<Option<(FencingToken, Instant)>> {
        let mut members = self.members.lock().await;
        let slot = (owner.clone(), secs);
        let key = self.member_key(owner, secs)?;
        let local = members.get(&slot).cloned();
        let lease = match (local, term) {
            (Some(m), Some(t)) if m.token() == t => m,
            (Some(m), None) => m,
            (_, Some(t)) => Lease::resume(key, owner.clone(), t, ttl),
            (None, None) => match self.inner.inspect(&key).await?.holder {
                Some(h) if &h.owner == owner => Lease::resume(key, owner.clone(), h.token, ttl),
                _ => return Ok(None),
            },
        };
        let sent = Instant::now();
        match self.inner.renew(&lease).await? {
            RenewOutcome::Renewed(next) => {
                let t = next.token();
                members.insert(slot, next);
                Ok(Some((t, sent)))
            }
            RenewOutcome::Lost => {
                if members.get(&slot).map(Lease::token) == Some(lease.token()) {
                    members.remove(&slot);
                }
                Ok(None)
            }
        }
    }

    /// Reads the membership Leases named by the assigned entries among `entries` and judges
    /// each term (without revoking anything).
    async fn terms_of<'a>(
        &self,
        entries: impl Iterator<Item = &'a Entry>,
    ) -> Result<HashMap<(OwnerId, u32, FencingToken), Term>> {
        let mut wanted: HashSet<(OwnerId, u32)> = HashSet::new();
        let mut terms: HashSet<(OwnerId, u32, FencingToken)> = HashSet::new();
        for e in entries {
            if let Some(a) = &e.held {
                wanted.insert((a.owner.clone(), a.secs));
                terms.insert((a.owner.clone(), a.secs, a.inc));
            }
        }
        let reads: Vec<_> = wanted
            .into_iter()
            .map(|(owner, secs)| async move {
                let name = self.inner.object_name(&self.member_key(&owner, secs)?);
                let read = self.inner.read(&name).await?;
                Ok::<_, Error>(((owner, secs), read))
            })
            .collect();
        let read: HashMap<_, _> = stream::iter(reads)
            .buffer_unordered(MEMBERS_IN_FLIGHT)
            .try_collect()
            .await?;
        let now = Instant::now();
        Ok(terms
            .into_iter()
            .map(|(owner, secs, inc)| {
                let rec = read
                    .get(&(owner.clone(), secs))
                    .and_then(|r| r.as_ref())
                    .map(|(_, rec, seen)| (rec, *seen));
                let term = judge_term(&owner, inc, rec, now);
                ((owner, secs, inc), term)
            })
            .collect())
    }
}

#[async_trait]
impl LeaseStore for K8sGroupedStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Those of [`K8sLeaseStore`]: durable tokens, expiry observed locally, whole-second TTLs
    /// of at least 1 s, and watch.
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// A batch of one ([`acquire_many`](LeaseStore::acquire_many)): a membership renewal (or a
    /// new term), a GET and a replace of the key's group.
    ///
    /// Not cancel safe: a dropped acquire may have granted the key (it is then held until the
    /// owner's term ends or the owner acquires it again).
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let mut out = self.acquire_many(std::slice::from_ref(req)).await?;
        out.pop().unwrap_or_else(|| {
            Err(Error::store_fault(
                BACKEND,
                "acquire_many returned no outcome",
                None,
            ))
        })
    }

    /// A batch of one ([`renew_many`](LeaseStore::renew_many)): the owner's membership Lease
    /// and a GET of the key's group.
    ///
    /// Cancel safe in the sense of [`LeaseStore::renew`]: a dropped renewal may or may not have
    /// extended the owner's term, and the previous deadline stays correct either way.
    async fn renew(&self, lease: &Lease) -> Result<RenewOutcome> {
        let mut out = self.renew_many(std::slice::from_ref(lease)).await?;
        out.pop().unwrap_or_else(|| {
            Err(Error::store_fault(
                BACKEND,
                "renew_many returned no outcome",
                None,
            ))
        })
    }

    /// Frees the key if `lease` holds it: a GET of its group and a replace conditioned on it
    /// (plus a GET of the owner's membership Lease when this store does not hold a valid one).
    /// The entry keeps the key's token.
    ///
    /// Not cancel safe: a dropped release may or may not have freed the key.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome> {
        let index = group_of(lease.key().as_str(), self.groups);
        let wanted_term = Self::term_of(lease);
        for _ in 0..MAX_RACES {
            let group = self.read_group(index).await?;
            let Some(entry) = group.entries.get(lease.key().as_str()) else {
                return Ok(ReleaseOutcome::NotHeld);
            };
            let Some(held) = &entry.held else {
                return Ok(ReleaseOutcome::NotHeld);
            };
            if &held.owner != lease.owner()
                || entry.token != lease.token()
                || wanted_term.is_some_and(|t| t != held.inc)
            {
                return Ok(ReleaseOutcome::NotHeld);
            }
            let local_live = self
                .members
                .lock()
                .await
                .get(&(held.owner.clone(), held.secs))
                .is_some_and(|m| m.token() == held.inc && m.is_valid());
            if !local_live {
                let name = self
                    .inner
                    .object_name(&self.member_key(&held.owner, held.secs)?);
                let read = self.inner.read(&name).await?;
                let term = judge_term(
                    &held.owner,
                    held.inc,
                    read.as_ref().map(|(_, rec, seen)| (rec, *seen)),
                    Instant::now(),
                );
                if !matches!(term, Term::Live { .. }) {
                    return Ok(ReleaseOutcome::NotHeld);
                }
            }
            let mut entries = group.entries.clone();
            entries.insert(
                lease.key().as_str().to_string(),
                Entry {
                    token: entry.token,
                    held: None,
                },
            );
            match self.write_group(&group, &entries).await {
                Ok(()) => {
                    tracing::debug!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "grouped lease released");
                    return Ok(ReleaseOutcome::Released);
                }
                Err(K8sError::Conflict) => continue,
                Err(K8sError::NotFound(_)) => return Ok(ReleaseOutcome::NotHeld),
                Err(e) => return Err(e.into_error("replace")),
            }
        }
        Err(Error::refused(
            BACKEND,
            format!(
                "lost {MAX_RACES} consecutive write races on group {:?}",
                self.group_name(index)
            ),
            None,
        ))
    }

    /// A GET of the key's group and, if the key is assigned, of its owner's membership Lease.
    ///
    /// Cancel safe (read only).
    async fn inspect(&self, key: &LeaseKey) -> Result<KeyState> {
        let mut out = self.inspect_many(std::slice::from_ref(key)).await?;
        out.pop()
            .ok_or_else(|| Error::store_fault(BACKEND, "inspect_many returned no state", None))
    }

    /// One membership write per distinct owner and TTL among `leases`, then one read of the
    /// groups they touch (a GET each for one or two groups, else one LIST of the set): a lease
    /// is renewed when its owner's term was renewed and its entry still names it with its token
    /// and that term. Outcomes in input order; an invalid TTL is reported in its slot.
    ///
    /// Cancel safe in the sense of [`LeaseStore::renew`]: a dropped batch may or may not have
    /// extended the owners' terms; the previous deadlines stay correct either way.
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<RenewOutcome>>> {
        let mut out: Vec<Option<Result<RenewOutcome>>> = (0..leases.len()).map(|_| None).collect();
        // Per membership Lease (owner, seconds) and the term each lease names.
        let mut by_term: BTreeMap<(OwnerId, u32, Option<FencingToken>), Vec<usize>> =
            BTreeMap::new();
        let mut granted = vec![Duration::ZERO; leases.len()];
        for (i, lease) in leases.iter().enumerate() {
            match self.inner.grantable_ttl(lease.ttl()) {
                Ok(r) => {
                    granted[i] = r.granted();
                    by_term
                        .entry((lease.owner().clone(), r.get(), Self::term_of(lease)))
                        .or_default()
                        .push(i);
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let mut renewed: Vec<(usize, FencingToken, Instant)> = Vec::new();
        for ((owner, secs, term), idxs) in by_term {
            let ttl = granted[idxs[0]];
            match self.renew_member(&owner, secs, ttl, term).await? {
                Some((inc, sent)) => renewed.extend(idxs.into_iter().map(|i| (i, inc, sent))),
                None => {
                    for i in idxs {
                        out[i] = Some(Ok(RenewOutcome::Lost));
                    }
                }
            }
        }
        if !renewed.is_empty() {
            // Read after the membership writes: an entry that still names the lease then was
            // held at that moment, by a term renewed before it.
            let mut indices: Vec<u16> = renewed
                .iter()
                .map(|(i, _, _)| group_of(leases[*i].key().as_str(), self.groups))
                .collect();
            indices.sort_unstable();
            indices.dedup();
            let groups = self.read_groups(&indices).await?;
            for (i, inc, sent) in renewed {
                let lease = &leases[i];
                let group = &groups[&group_of(lease.key().as_str(), self.groups)];
                let held = group.entries.get(lease.key().as_str()).is_some_and(|e| {
                    e.token == lease.token()
                        && e.held
                            .as_ref()
                            .is_some_and(|a| &a.owner == lease.owner() && a.inc == inc)
                });
                out[i] = Some(Ok(if held {
                    RenewOutcome::Renewed(
                        lease
                            .renewed(granted[i], sent)
                            .with_handle(inc.get().to_string()),
                    )
                } else {
                    tracing::info!(backend = BACKEND, key = %lease.key(), owner = %lease.owner(), token = %lease.token(), "grouped renewal lost: the key's entry changed or the owner's term ended");
                    RenewOutcome::Lost
                }));
            }
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Error::store_fault(BACKEND, "renewal without outcome", None))
                })
            })
            .collect())
    }

    /// The groups the keys live in (a GET each for one or two, else one LIST of the set) and
    /// the membership Leases their entries name (a GET each, at most 16 at once).
    ///
    /// Cancel safe (read only).
    async fn inspect_many(&self, keys: &[LeaseKey]) -> Result<Vec<KeyState>> {
        let mut indices: Vec<u16> = keys
            .iter()
            .map(|k| group_of(k.as_str(), self.groups))
            .collect();
        indices.sort_unstable();
        indices.dedup();
        let groups = self.read_groups(&indices).await?;
        let entries: Vec<Option<&Entry>> = keys
            .iter()
            .map(|k| {
                groups[&group_of(k.as_str(), self.groups)]
                    .entries
                    .get(k.as_str())
            })
            .collect();
        let terms = self.terms_of(entries.iter().flatten().copied()).await?;
        Ok(keys
            .iter()
            .zip(entries)
            .map(|(key, entry)| {
                let holder = entry.and_then(|e| {
                    let a = e.held.as_ref()?;
                    match terms.get(&(a.owner.clone(), a.secs, a.inc)) {
                        Some(Term::Live { remaining, ttl }) => Some(Holder {
                            owner: a.owner.clone(),
                            token: e.token,
                            remaining: *remaining,
                            ttl: *ttl,
                        }),
                        _ => None,
                    }
                });
                KeyState {
                    key: key.clone(),
                    holder,
                    last_token: entry.map(|e| e.token),
                }
            })
            .collect())
    }

    /// Validates the batch, renews (or takes) each distinct owner's membership Lease once, then
    /// writes each group touched with one conditional replace granting all its free keys (at
    /// most 8 groups at once), retrying lost races per group.
    ///
    /// Not cancel safe: a dropped batch may have granted any of its keys.
    async fn acquire_many(&self, reqs: &[AcquireRequest]) -> Result<Vec<Result<AcquireOutcome>>> {
        validate_acquire_many(reqs)?;
        let mut out: Vec<Option<Result<AcquireOutcome>>> = (0..reqs.len()).map(|_| None).collect();
        let mut members: BTreeMap<(OwnerId, u32), Duration> = BTreeMap::new();
        let mut by_group: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, req) in reqs.iter().enumerate() {
            match self.inner.grantable_ttl(req.ttl) {
                Ok(r) => {
                    members.insert((req.owner.clone(), r.get()), r.granted());
                    by_group
                        .entry(group_of(req.key.as_str(), self.groups))
                        .or_default()
                        .push(i);
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let mut terms = HashMap::with_capacity(members.len());
        for ((owner, secs), ttl) in members {
            let (inc, sent) = self.ensure_member(&owner, secs, ttl).await?;
            terms.insert((owner, secs), (inc, sent, ttl));
        }
        let judged = Judged::default();
        let calls: Vec<_> = by_group
            .into_iter()
            .map(|(index, idxs)| self.acquire_in_group(index, idxs, reqs, &terms, &judged))
            .collect();
        let results: Vec<Result<Vec<(usize, AcquireOutcome)>>> = stream::iter(calls)
            .buffer_unordered(GROUPS_IN_FLIGHT)
            .collect()
            .await;
        for r in results {
            for (i, outcome) in r? {
                out[i] = Some(Ok(outcome));
            }
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Error::store_fault(BACKEND, "acquire without outcome", None))
                })
            })
            .collect())
    }

    /// Watches the key's group object: any change of the group is a hint.
    ///
    /// Cancel safe: nothing is held until the watch is returned.
    async fn watch(&self, key: &LeaseKey) -> Result<Option<KeyWatch>> {
        crate::watch::start_on(
            self.maps.clone(),
            &self.group_object_name(key),
            self.inner.request_timeout(),
        )
        .await
        .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn token(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    #[test]
    fn entries_round_trip_free_and_assigned() {
        let free = Entry {
            token: token(42),
            held: None,
        };
        assert_eq!(free.encode(), "42");
        assert_eq!(Entry::decode("g", "k", "42").unwrap(), free);
        let held = Entry {
            token: token(9001),
            held: Some(Assigned {
                inc: token(77),
                secs: 15,
                owner: OwnerId::new("worker-3:ab12").unwrap(),
            }),
        };
        assert_eq!(held.encode(), "9001 77 15 worker-3:ab12");
        assert_eq!(Entry::decode("g", "k", &held.encode()).unwrap(), held);
    }

    #[test]
    fn malformed_entries_are_typed_errors_not_panics() {
        for bad in [
            "",
            "x",
            "0",
            "-1",
            "1 2",
            "1 2 3",
            "1 2 0 owner",
            "1 2 x owner",
            "1 0 3 owner",
            "1 2 3 owner extra",
            "1 2 3 ",
            "18446744073709551616",
        ] {
            let err = Entry::decode("grp", "key", bad).unwrap_err();
            assert!(matches!(err, Error::Backend { .. }), "{bad:?}: {err}");
            assert!(err.to_string().contains("key"), "{err}");
        }
    }

    #[test]
    fn the_group_of_a_key_is_stable_and_in_range() {
        // Pinned: every process (and every version of this crate) must agree.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(group_of("a", 16), 0xc);
        assert_eq!(group_of("anything", 1), 0);
        let mut counts = [0usize; 16];
        for i in 0..10_000 {
            counts[usize::from(group_of(&format!("shard-{i}"), 16))] += 1;
        }
        // Spread: no group gets more than twice its share.
        assert!(counts.iter().all(|&c| c > 300 && c < 1250), "{counts:?}");
    }

    #[test]
    fn tokens_are_above_the_version_and_the_recorded_token() {
        assert_eq!(next_token(10, None).unwrap(), token(11));
        assert_eq!(next_token(10, Some(token(5))).unwrap(), token(11));
        assert_eq!(next_token(10, Some(token(20))).unwrap(), token(21));
        assert!(next_token(u64::MAX, None).is_err());
    }

    #[test]
    fn set_names_are_checked() {
        for ok in ["shards", "a", "shard-set-1"] {
            assert!(validate_set(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Shards", "-a", "a-", "a.b", "fence", &"x".repeat(41)] {
            assert!(
                matches!(validate_set(bad), Err(Error::Config { .. })),
                "{bad}"
            );
        }
    }

    fn record(holder: Option<&str>, token: Option<u64>, secs: u64) -> Record {
        Record {
            rv: 100,
            holder: holder.map(str::to_string),
            duration: Duration::from_secs(secs),
            token: token.map(|t| FencingToken::new(t).unwrap()),
            token_holder: holder.map(str::to_string),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn terms_are_judged_by_local_elapsed_time_since_first_seen() {
        let owner = OwnerId::new("w1").unwrap();
        let seen = Instant::now();
        let rec = record(Some("w1"), Some(7), 10);
        let at = |secs: u64| seen + Duration::from_secs(secs);
        assert_eq!(
            judge_term(&owner, token(7), Some((&rec, seen)), at(4)),
            Term::Live {
                remaining: Duration::from_secs(6),
                ttl: Duration::from_secs(10)
            }
        );
        assert_eq!(
            judge_term(&owner, token(7), Some((&rec, seen)), at(10)),
            Term::Expired
        );
        // Another term of the same owner, another holder, a free or missing Lease: over.
        assert_eq!(
            judge_term(&owner, token(6), Some((&rec, seen)), at(0)),
            Term::Over
        );
        let other = record(Some("w2"), Some(7), 10);
        assert_eq!(
            judge_term(&owner, token(7), Some((&other, seen)), at(0)),
            Term::Over
        );
        let free = record(None, Some(7), 10);
        assert_eq!(
            judge_term(&owner, token(7), Some((&free, seen)), at(0)),
            Term::Over
        );
        assert_eq!(judge_term(&owner, token(7), None, at(0)), Term::Over);
    }

    /// The greatest token ([`FencingToken`] stays within `i64`).
    const MAX_TOKEN: u64 = i64::MAX as u64;

    proptest! {
        #[test]
        fn any_entry_round_trips(t in 1u64..=MAX_TOKEN, inc in 1u64..=MAX_TOKEN, secs in 1u32..=86_400, owner in "[a-z0-9:._-]{1,40}") {
            let e = Entry { token: token(t), held: Some(Assigned { inc: token(inc), secs, owner: OwnerId::new(owner).unwrap() }) };
            prop_assert_eq!(Entry::decode("g", "k", &e.encode()).unwrap(), e);
        }

        #[test]
        fn decoding_never_panics(s in "\\PC{0,60}") {
            let _ = Entry::decode("g", "k", &s);
        }
    }
}
