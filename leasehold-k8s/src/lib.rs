//! # leasehold-k8s
//!
//! Leases with fencing tokens on Kubernetes `coordination.k8s.io/v1` **Lease** objects,
//! interoperable with client-go's `LeaseLock`, so that a Go controller and a Rust one can contend
//! for the same Lease (during a migration, say) and never both lead while both follow their rules.
//!
//! - [`K8sLeaseStore`] implements [`leasehold_core::LeaseStore`]: use it directly, or through
//!   `leasehold_core`'s supervisor and leader election. [`K8sLeaseStore::connect`] takes the
//!   `lease` facade's `k8s://NAMESPACE` URL; [`K8sOptions`] holds every knob.
//! - [`K8sFencedResource`] ([`K8sLeaseStore::fenced_resource`]) implements
//!   [`leasehold_core::FencedResource`] on ConfigMaps, and shows how a controller carries its term
//!   into the objects it writes.
//! - [`K8sGroupedStore`] ([`K8sLeaseStore::grouped`]) implements the same contract for thousands
//!   of keys held by few owners (a shard set), with a renewal cost per owner instead of per key.
//! - [`protocol`] holds the exact objects and annotations this backend writes.
//!
//! ## Quick start
//! ```no_run
//! use std::time::Duration;
//! use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId, RenewOutcome};
//! use leasehold_k8s::K8sLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! // KUBECONFIG, ~/.kube/config or in-cluster; Leases in namespace "payments".
//! let store = K8sLeaseStore::connect("k8s://payments").await?;
//! let key = LeaseKey::new("invoice-controller")?;
//! let req = AcquireRequest::new(key, OwnerId::with_label("pod-7"), Duration::from_secs(15));
//! if let AcquireOutcome::Acquired(lease) = store.acquire(&req).await? {
//!     // Attach lease.token() to every protected write; renew well before lease.deadline().
//!     if let RenewOutcome::Lost = store.renew(&lease).await? {
//!         // Someone else wrote the Lease: stop leading at once.
//!     }
//! }
//! # Ok(()) }
//! ```
//! `k8s-openapi` needs exactly one `v1_xx` feature in the final build. This library does not pick
//! one; your binary does (`k8s-openapi = { version = "0.29", features = ["v1_33"] }`). The Lease
//! v1 wire format is the same on every server since 1.14 (tested against kube-apiserver 1.20).
//!
//! ## Options in the URL
//! Every [`K8sOptions`] setting can be given in the URL's query, on top of the options passed in
//! code ([`K8sOptions::with_url`]), so that a URL alone (`lease run --store ...`, an environment
//! variable) configures the store. **Any other parameter is an
//! [`Error::Config`](leasehold_core::Error::Config)** naming it, as is a value that does not parse.
//! Durations take a unit: `250ms`, `2s`, `5m`, `1h`.
//!
//! | parameter | sets | example |
//! |---|---|---|
//! | `namespace` | [`K8sOptions::with_namespace`] (or name it in the path: `k8s://NAMESPACE`) | `namespace=payments` |
//! | `name_prefix` | [`K8sOptions::with_name_prefix`] | `name_prefix=lease-` |
//! | `request_timeout` | [`K8sOptions::with_request_timeout`] | `request_timeout=5s` |
//! | `kubeconfig` | [`K8sOptions::with_kubeconfig`]: a file instead of the ambient configuration (percent-encoded path) | `kubeconfig=/etc/lease/kubeconfig` |
//! | `group_set` | [`K8sOptions::with_grouped`]: the grouped mode and its set ([`K8sGroupedStore::connect`]; [`K8sLeaseStore::connect`] refuses it) | `group_set=invoices` |
//! | `groups` | [`K8sOptions::with_grouped`]: the grouped mode's group count, default [`DEFAULT_GROUPS`] (only with `group_set`) | `groups=32` |
//!
//! ```no_run
//! use leasehold_k8s::K8sLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! // Leases named lease-KEY in namespace payments, through the given kubeconfig.
//! let store = K8sLeaseStore::connect(
//!     "k8s://payments?name_prefix=lease-&request_timeout=5s&kubeconfig=/etc/lease/kubeconfig",
//! )
//! .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! ## Keys and objects
//! Key `k` is the Lease named `<prefix>k` in the store's namespace (no prefix by default, see
//! [`K8sOptions::with_name_prefix`]). Keys are DNS-1123 subdomains of at most 200 bytes, so
//! they are legal object names unchanged and two keys never share an object. Its fenced state
//! ([`K8sFencedResource`]) is the ConfigMap `fence.<prefix>k`, so stores with different prefixes
//! in one namespace keep separate Leases *and* separate high-water marks; with a prefix, a key
//! longer than `247 - prefix length` bytes has a Lease but no legal fence name, and the fenced
//! resource refuses it with [`Error::InvalidInput`](leasehold_core::Error::InvalidInput).
//!
//! ## Every change is conditional
//! A grant is a `create` (409 `AlreadyExists`: another candidate won) followed by a `replace`
//! conditioned on the created version that writes the token, or a `replace` carrying the
//! `metadata.resourceVersion` that was read (409 `Conflict`: someone else wrote first). Renewals
//! and releases are conditional replaces too. Nothing is ever patched unconditionally, so two
//! writers can never both believe their write decided the holder. A renewal is conditioned on the
//! **last version this store wrote** for the Lease: if anyone else wrote the object since (a
//! takeover, a deletion, even a label), the renewal is a 409 and the lease is
//! [`RenewOutcome::Lost`](leasehold_core::RenewOutcome::Lost) at once. (A renewal whose answer was
//! lost, to a timeout, a dropped connection or a dropped future, may have been applied; the next
//! renewal recognises that write as its own by its exact content and continues.)
//! Our writes keep every field they do not own (labels, other annotations, newer spec fields).
//!
//! ## Many leases at once
//! The Kubernetes API has no batch write: [`renew_many`](leasehold_core::LeaseStore::renew_many)
//! sends one conditional replace per lease, [`RENEW_MANY_IN_FLIGHT`] at once (kube-client speaks
//! HTTP/1.1, so each request in flight holds one pooled connection), and reports each lease's
//! outcome or error in its own slot. One process holding N leases therefore sends N requests per
//! renewal interval. [`inspect_many`](leasehold_core::LeaseStore::inspect_many) (and so
//! `holders_many`, the shard set's scan) reads up to 16 keys with one GET each, concurrently, and
//! more with one paged LIST of the namespace (500 objects a page); every object listed counts as
//! an observation for expiry, exactly as a GET.
//!
//! ## Thousands of keys: the grouped mode
//! For many keys held by few owners (a shard set of 10,000 shards over 10 workers), one Lease per
//! key costs one request per key and renewal interval. [`K8sLeaseStore::grouped`] returns a
//! [`K8sGroupedStore`]: one membership Lease per owner (and TTL) whose token is the owner's term,
//! and the keys' assignments in a fixed number of group ConfigMaps, each key still with its own
//! token that never goes back. Renewing all of an owner's keys costs two requests (a read of the
//! groups and the membership Lease's conditional replace), whatever the number of keys; a batch
//! acquire writes each group it touches once. Expiry is then per owner, not per key, and the keys
//! are not visible to client-go: see [`K8sGroupedStore`] for the layout, costs, guarantees and
//! assumptions. The default mode above is unchanged.
//!
//! ## The client-go rules (LeaseLock interoperability)
//! | field | meaning (client-go and this crate) |
//! |---|---|
//! | `holderIdentity` | the holder; empty or absent = free |
//! | `leaseDurationSeconds` | how long candidates wait after last *seeing a change* |
//! | `acquireTime` | when the current holder acquired (kept while the same identity re-acquires or renews) |
//! | `renewTime` | when the holder last renewed (informational: never compared with a local clock) |
//! | `leaseTransitions` | incremented whenever the holder identity changes; kept on renew and release |
//!
//! The rules both sides follow:
//! 1. A candidate takes a Lease when `holderIdentity` is empty, or when it has observed the same
//!    record unchanged for `leaseDurationSeconds` on its own monotonic clock.
//! 2. Every write is conditioned on the resourceVersion read (client-go's `Update` does this).
//! 3. A holder renews (new `renewTime`, hence a new resourceVersion) well within the duration,
//!    and stops acting as leader before its own deadline.
//! 4. Release writes what client-go's `ReleaseOnCancel` writes: empty `holderIdentity`,
//!    `leaseDurationSeconds: 1`, `acquireTime` and `renewTime` now, `leaseTransitions` unchanged.
//!
//! In a mixed deployment, configure the Go side's `LeaseDuration` equal to (or longer than) the
//! TTL the Rust side requests: client-go judges expiry with its *configured* duration, while this
//! crate uses the `leaseDurationSeconds` written by the holder. A `holderIdentity` that is not a
//! legal [`OwnerId`](leasehold_core::OwnerId) (spaces, over 128 bytes) is reported with illegal
//! characters replaced by `_`.
//!
//! ## Expiry without a server clock
//! The Lease API has no server-side expiry, and the timestamps in a record come from another
//! host's wall clock. So, as client-go does, a candidate treats a Lease as expired only after it
//! has seen the **same record** (same resourceVersion) unchanged for its `leaseDurationSeconds`,
//! measured on its own monotonic clock from the moment it first saw that version. Each store keeps
//! these observations (Lease name -> resourceVersion and first-seen instant); keep **one store per
//! process** and share it, or a fresh store starts its observations over (which is only slower,
//! never unsafe). The holder's own deadline is computed from when its grant or renewal was
//! *sent* ([`Lease::deadline`](leasehold_core::Lease::deadline)), minus the drift margin.
//!
//! **Clock-rate assumption.** A candidate's first observation of a version happens after the write
//! that created it, which happened after the holder sent it. So the holder gives up first as long
//! as the candidate's monotonic clock does not run faster than the holder's by more than the drift
//! margin over one duration (2% by default, see
//! [`AcquireRequest::drift_margin`](leasehold_core::AcquireRequest::drift_margin)). Clock *offsets*
//! between hosts do not matter at all. Consequently [`Holder::remaining`](leasehold_core::Holder) is
//! an estimate from this store's first observation: another process may see more or less time left.
//!
//! TTLs are whole seconds (`leaseDurationSeconds` is an integer): requests are rounded **up**, the
//! granted TTL is reported in [`Lease::ttl`](leasehold_core::Lease::ttl), and
//! [`Capabilities`](leasehold_core::Capabilities) says `min_ttl = ttl_granularity = 1 s`.
//!
//! ## Fencing tokens
//! A grant's token comes from the etcd revision of the write that decides it
//! (`docs/adr/0040-k8s-fencing-token.md`): a grant that replaces the record read at version `X`
//! gets token `X + 1` (the replace is conditioned on `X` and writes a version above it); a grant
//! that creates the Lease gets the created object's resourceVersion, written into the token
//! annotation ([`protocol::TOKEN_ANNOTATION`]) by one replace conditioned on that version before the grant is
//! reported (so a first grant costs a `create` and a `replace`). Revisions are cluster-wide and
//! only increase, so tokens never go back, even when the Lease is deleted and recreated or the
//! apiserver restarts, and two holders never share a term. This assumes what every etcd3-backed
//! apiserver does (resourceVersions are numeric etcd revisions) although the API calls them
//! opaque; a non-numeric resourceVersion is an [`Error::Backend`](leasehold_core::Error::Backend). A
//! holder that did not acquire through this crate (a Go controller) has no token of ours;
//! [`Holder::token`](leasehold_core::Holder) then reports the record's resourceVersion (so its term
//! grows with each of its renewals, and the Rust grant that follows it is above all of them), and
//! [`KeyState::last_token`](leasehold_core::KeyState) still reports the last token this crate issued.
//!
//! ## Waiting
//! [`LeaseStore::watch`](leasehold_core::LeaseStore::watch) opens a watch on the one Lease
//! (field selector `metadata.name=<name>`) from a freshly listed revision; every change or
//! deletion is a hint. When the watch breaks (410 Gone, a disconnect, an apiserver restart) the
//! watcher is hinted, and the watch is reopened from a fresh list after a back-off that grows from
//! 100 ms to at most 2 s; while the apiserver stays away, a waiter is hinted at that bounded
//! interval (fallback polling).
//!
//! ## Carrying the term into the objects you write
//! Fencing happens where the writes land. On Kubernetes, record the token in an annotation of the
//! object you write and refuse, in the same conditional `replace`, a write whose token is below
//! the annotation. [`K8sFencedResource`] does exactly this with [`protocol::HIGH_WATER_ANNOTATION`] on
//! ConfigMaps; an admission webhook or the controller's own update path can do the same for any
//! kind.
//!
//! ## Authentication
//! The client authenticates as its kubeconfig (or the in-cluster service account) says; this
//! crate adds nothing. The tests run against a real kube-apiserver with a **static bearer token**
//! and with a **client certificate** signed by the CA of its `--client-ca-file`, and check the
//! failures: a kubeconfig whose CA did not sign the apiserver's certificate, and a server whose
//! certificate has expired, are each an [`Error::Config`](leasehold_core::Error::Config) that says
//! which (not retryable, returned at the first request, never a hang; the expired certificate is
//! tested against a TLS server with one, standing in for an apiserver); an unknown token or an untrusted client
//! certificate is the apiserver's `401`, an [`Error::Backend`](leasehold_core::Error::Backend).
//!
//! ## RBAC
//! The minimal Role for [`K8sLeaseStore`] (`list` and `watch` are needed for
//! [`LeaseStore::watch`](leasehold_core::LeaseStore::watch)):
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata: {name: leasehold-k8s, namespace: payments}
//! rules:
//! - apiGroups: ["coordination.k8s.io"]
//!   resources: ["leases"]
//!   verbs: ["get", "list", "watch", "create", "update"]
//! # only for K8sFencedResource:
//! - apiGroups: [""]
//!   resources: ["configmaps"]
//!   verbs: ["get", "create", "update"]
//! ```
//!
//! ## Errors
//! Outcomes (held, lost, not held, stale token) are never errors. Failures map by kind: connection
//! failures, 429 and 5xx are [`Error::Unavailable`](leasehold_core::Error::Unavailable) (retryable;
//! a 429, like an `acquire` that lost every write race, was certainly not applied, so its
//! [`outcome_unknown`](leasehold_core::Error::outcome_unknown) is false); a
//! request exceeding [`K8sOptions::with_request_timeout`] is
//! [`Error::Timeout`](leasehold_core::Error::Timeout); a missing or unusable kubeconfig, an illegal
//! namespace or prefix, a namespace that does not exist, and a TLS handshake that refused a
//! certificate (the kubeconfig's CA did not sign the apiserver's certificate, that certificate
//! has expired, is not valid yet or does not name the server, or the apiserver refused the
//! client certificate; told apart by the rustls error's type) are
//! [`Error::Config`](leasehold_core::Error::Config), not retryable; 401/403, invalid objects and malformed records
//! are [`Error::Backend`](leasehold_core::Error::Backend).

mod config;
mod error;
mod fenced;
mod grouped;
mod inspect;
pub mod protocol;
mod store;
mod watch;

pub use config::{
    DEFAULT_REQUEST_TIMEOUT, K8sOptions, MAX_PREFIX_LEN, URL_OPTIONS, client_from_kubeconfig,
    infer_client,
};
#[doc(hidden)]
pub use config::{TestHook, TestPoint};
pub use fenced::K8sFencedResource;
pub use grouped::{
    DEFAULT_GROUPS, GROUP_COUNT_ANNOTATION, GROUP_SET_LABEL, K8sGroupedStore, MAX_GROUPS,
    MAX_SET_LEN,
};
pub use store::{K8sLeaseStore, RENEW_MANY_IN_FLIGHT};

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
