//! [`K8sGroupedStore`]: a [`LeaseStore`](leasehold_core::LeaseStore) for thousands of keys (a shard set) whose renewal costs
//! requests per **owner**, not per key: one membership Lease per owner and TTL, and the keys'
//! assignments in a fixed number of group ConfigMaps.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use leasehold_core::{Error, FencingToken, Lease, LeaseKey, OwnerId, Result};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use crate::error::{BACKEND, K8sError};
use crate::protocol::{MAX_OBJECT_NAME_LEN, parse_resource_version};
use crate::store::K8sLeaseStore;
use crate::{K8sFencedResource, K8sOptions};
use entry::{Entry, Term, fnv1a, group_of, validate_set};

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
/// The label every group ConfigMap and every membership Lease carries, its value the set's
/// name: a grouped store reads many groups, or many owners' membership Leases, with one LIST
/// selected by it.
pub const GROUP_SET_LABEL: &str = "lease.rs/group-set";
/// The annotation of a group ConfigMap naming how many groups its set has.
pub const GROUP_COUNT_ANNOTATION: &str = "lease.rs/groups";

/// How many lost write races on one group object an acquire absorbs before it gives up.
const MAX_RACES: usize = 64;
/// Up to this many groups are read with one GET each; more with one LIST.
const GET_THRESHOLD: usize = 2;
/// How many membership Leases one `inspect_many` reads at once.
const MEMBERS_IN_FLIGHT: usize = 16;
/// How often an owner tries to take its membership Lease while another holds it (a candidate
/// that revoked the owner's previous term holds it for at most [`REVOKE_TTL`]).
const MEMBER_ATTEMPTS: u32 = 12;
/// A membership renewal this recent serves an `acquire_many` as its own (and at most a
/// sixteenth of the TTL): batches of one owner at the same time share one renewal.
const MEMBER_FRESH: Duration = Duration::from_secs(1);
/// The TTL of the short grant a candidate takes on a dead owner's membership Lease to end that
/// owner's term; released at once.
const REVOKE_TTL: Duration = Duration::from_secs(1);

mod acquire;
mod coalesce;
pub(crate) mod entry;
mod ops;
mod release;
mod terms;
#[cfg(test)]
mod tests;

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

/// A store's membership Leases by owner and TTL in seconds, each with when its last renewal (or
/// grant) was sent.
type Members = HashMap<(OwnerId, u32), (Lease, Instant)>;

/// The judgements of one call, by (membership Lease name, term): a term found over stays over,
/// so one call revokes a dead owner's term once, however many of its keys it takes.
type Judged = AsyncMutex<HashMap<(String, FencingToken), Term>>;

/// A [`LeaseStore`](leasehold_core::LeaseStore) for **many keys held by few owners** (a shard set of thousands of shards over
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
/// - [`renew_many`](leasehold_core::LeaseStore::renew_many) of all of an owner's keys is one read of the groups
///   (a GET for one or two groups, one LIST for more) that checks each key's entry, and **one**
///   conditional replace of the owner's membership Lease: two requests per owner and TTL,
///   whatever the number of keys. [`renew`](leasehold_core::LeaseStore::renew) costs the same for one key, and extends
///   every key of the owner's term (as an etcd lease shared by many keys does).
/// - [`acquire_many`](leasehold_core::LeaseStore::acquire_many) renews (or takes) the owner's membership Lease,
///   then writes each group it touches once: a GET and a replace conditioned on the version read,
///   granting all of the batch's free keys in that group at once. A first grant in a set creates
///   the group object (one more request). [`acquire`](leasehold_core::LeaseStore::acquire) is a batch of one.
/// - Taking a key from an owner whose term this store has seen expire first **revokes** the term:
///   a conditional write on that owner's membership Lease (a grant to the taker with a 1 s TTL,
///   released at once), so the dead owner's next renewal is a conflict and it learns it lost
///   everything. Then the group write. One revocation per dead owner, not per key.
/// - [`release`](leasehold_core::LeaseStore::release) writes the group (the entry keeps the token),
///   one write for every release of that group this store has queued meanwhile, made by a task
///   of its own.
/// - [`inspect_many`](leasehold_core::LeaseStore::inspect_many) reads the groups (one LIST) and the membership
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
/// - **The term belongs to the owner id, not to the process**: stores with the same owner id (two
///   clients, or a process restarted with a stable id) share the owner's live term, each renewing
///   it on top of the other's writes (one extra GET when the other wrote last). A key granted
///   again to the same owner gets a greater token, so the earlier grant's renewals are lost; but
///   keys of a crashed process that its successor with the same owner id does not take again
///   stay held while the successor renews the term (they are its owner's). Give each process its
///   own owner id (as [`OwnerId::with_label`] does) unless it should inherit them.
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
/// - [`watch`](leasehold_core::LeaseStore::watch) watches the key's group object: a change to any key of the
///   group is a hint, and the end of an owner's term by expiry (nothing written) is not.
///
/// # Cancel safety
/// As the contract says for each operation: `acquire` and `acquire_many` are not cancel safe (a
/// dropped call may have granted keys; a grant stays held until its owner's term ends or the
/// owner takes the key again); `release` is cancel safe in effect (a dropped release is still
/// written by its task); `renew` and `renew_many` are cancel safe
/// in the contract's sense (a dropped renewal may or may not have extended the owner's term, and
/// the previous deadlines stay correct: a renewal whose answer was lost is recognised as the
/// store's own by the next one); `inspect`, `inspect_many`, `holders_many` and `watch` are cancel
/// safe. A dropped call never leaves the store's lock of its membership Leases held.
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
    /// This store's membership Leases, by owner and TTL in seconds, with when their last
    /// renewal (or grant) was sent.
    members: Arc<AsyncMutex<Members>>,
    /// One lock per group: this store's (and its clones') writes to one group object go one at
    /// a time, so that they do not lose conditional-write races to each other. Writes of other
    /// processes still race and are retried.
    writers: Arc<Vec<AsyncMutex<()>>>,
    /// One queue of releases per group, written together ([`release`]).
    queues: Arc<Vec<coalesce::Queue<release::Pending>>>,
    /// One queue of grants per group, written together ([`acquire`]).
    grants: Arc<Vec<coalesce::Queue<acquire::Asked>>>,
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
        let mut inner = self.clone();
        inner.claim_labels = Some(Arc::new(BTreeMap::from([(
            GROUP_SET_LABEL.to_string(),
            set.to_string(),
        )])));
        let store = K8sGroupedStore {
            maps: Api::namespaced(self.client.clone(), self.namespace()),
            inner,
            set: set.to_string(),
            groups,
            members: Arc::default(),
            writers: Arc::new((0..groups).map(|_| AsyncMutex::new(())).collect()),
            queues: Arc::new((0..groups).map(|_| coalesce::Queue::default()).collect()),
            grants: Arc::new((0..groups).map(|_| coalesce::Queue::default()).collect()),
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

/// Checks a grouped store's set name (for [`K8sOptions`]'s URL parameter `group_set`).
pub(crate) fn check_set(set: &str) -> Result<()> {
    validate_set(set)
}

impl K8sGroupedStore {
    /// Connects a grouped store as `url` and its query say: the `k8s://` URL of
    /// [`K8sLeaseStore::connect`] with `group_set=SET` (and optionally `groups=N`, default
    /// [`DEFAULT_GROUPS`]) in its query; [`K8sLeaseStore::grouped`] on the store it names.
    ///
    /// ```no_run
    /// use leasehold_k8s::K8sGroupedStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let store = K8sGroupedStore::connect("k8s://payments?group_set=invoices&groups=32").await?;
    /// assert_eq!((store.set(), store.groups()), ("invoices", 32));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`K8sLeaseStore::connect`] and [`K8sLeaseStore::grouped`]; [`Error::Config`] also for a
    /// URL without `group_set`.
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is sent to the cluster.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, K8sOptions::default()).await
    }

    /// As [`connect`](Self::connect), with `options` under the URL's query: the grouped mode's
    /// set and group count come from the URL or [`K8sOptions::with_grouped`].
    ///
    /// ```no_run
    /// use leasehold_k8s::{K8sGroupedStore, K8sOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
    /// let options = K8sOptions::default().with_grouped("invoices", 16);
    /// let store = K8sGroupedStore::connect_with("k8s://payments", options).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::Config`] when neither the URL nor the options
    /// select the grouped mode.
    ///
    /// # Cancellation safety
    /// Cancel safe: nothing is sent to the cluster.
    pub async fn connect_with(url: &str, options: K8sOptions) -> Result<Self> {
        let (base, mut options) = options.with_url(url)?;
        let Some((set, groups)) = options.grouped.take() else {
            return Err(Error::config(
                BACKEND,
                format!(
                    "{base:?}: a grouped store needs its set (group_set=NAME in the URL, or \
                     K8sOptions::with_grouped)"
                ),
                None,
            ));
        };
        K8sLeaseStore::connect_with(&base, options)
            .await?
            .grouped(&set, groups)
    }

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

    /// This store's write lock on group `index` (held for a whole read-modify-write, retries
    /// included).
    pub(super) async fn writer(&self, index: u16) -> tokio::sync::MutexGuard<'_, ()> {
        self.writers[usize::from(index) % self.writers.len().max(1)]
            .lock()
            .await
    }

    /// The refusal of a write to group `index` that lost [`MAX_RACES`] races in a row.
    fn races_lost(&self, index: u16) -> Error {
        Error::refused(
            BACKEND,
            format!(
                "lost {MAX_RACES} consecutive write races on group {:?}",
                self.group_name(index)
            ),
            None,
        )
    }

    /// The term a lease names in its handle (set by this store's grants and renewals).
    fn term_of(lease: &Lease) -> Option<FencingToken> {
        lease
            .handle()
            .and_then(|h| h.parse::<u64>().ok())
            .and_then(|t| FencingToken::new(t).ok())
    }
}
