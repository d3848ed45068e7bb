//! # leasehold-etcd
//!
//! The etcd backend of the lease library: [`EtcdLeaseStore`] (a [`LeaseStore`]) and
//! [`EtcdFencedResource`] (a [`FencedResource`]), on `etcd-client` and the etcd v3 API.
//!
//! ## Quick start
//! ```no_run
//! use std::time::Duration;
//! use leasehold_core::{AcquireOutcome, AcquireRequest, FencedResource, LeaseKey, LeaseStore, OwnerId, WriteOp};
//! use leasehold_etcd::EtcdLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = EtcdLeaseStore::connect("etcd://127.0.0.1:2379").await?;
//! let resource = store.fenced_resource();
//! let key = LeaseKey::new("tenant-42")?;
//! let req = AcquireRequest::new(key.clone(), OwnerId::with_label("worker-a"), Duration::from_secs(10));
//! match store.acquire(&req).await? {
//!     AcquireOutcome::Acquired(lease) => {
//!         resource.write(&key, lease.token(), WriteOp::Put(b"done".to_vec())).await?;
//!         let _ = store.release(&lease).await?;
//!     }
//!     AcquireOutcome::Held(holder) => println!("{} holds it for {:?}", holder.owner, holder.remaining),
//! }
//! # Ok(()) }
//! ```
//!
//! ## Compatible with etcd's own lock
//! A lease on key `k` **is** the etcd lock named `<prefix>k` ([`EtcdOptions::lock_name`], prefix
//! `lease/` by default), in the protocol of `etcdctl lock` and Go's `concurrency.Mutex`: each
//! contender creates a key under `<prefix>k/` attached to its etcd lease (`etcdctl` and Go name
//! it after the lease id in hex; this crate `lease-rs.0` or `lease-rs.1`, or, on a shared etcd
//! lease, `<lease id hex>-<nonce hex>`), and the holder is the key with the lowest create
//! revision under `<prefix>k/`. This store only ever creates its key
//! when the prefix is empty (a transaction comparing `create_revision` over the whole prefix), so
//! its key is always the lowest; it never queues. So `etcdctl lock lease/k` blocks while this crate
//! holds `k`, and this crate reports [`AcquireOutcome::Held`](leasehold_core::AcquireOutcome::Held)
//! (owner `etcd-lock:<key>`) while `etcdctl` holds it. Our keys carry the owner id as their value;
//! keys of other lock clients have an empty value. The `etcd-lock:` prefix is reserved: every
//! operation given such an owner (acquire, renew, `renew_many`, release, a resumed lease) fails
//! with [`Error::InvalidOwner`](leasehold_core::Error::InvalidOwner) and changes nothing, so nobody
//! can renew or release an `etcdctl lock` holder's key by resuming as its stand-in owner.
//!
//! ## Fencing tokens: the create revision
//! The token of a grant is the etcd revision of the transaction that created the lock key (the
//! key's `create_revision`). etcd's revision is one cluster-wide counter that every write
//! increments, so:
//! - a later grant of the same key is a later write and gets a **greater** revision, whatever
//!   happened in between (release deletes the key, expiry deletes it, the same owner re-acquiring
//!   deletes and re-creates it: the counter never moves back on delete);
//! - the revision is part of the replicated, fsynced raft state machine: a **restarted** member
//!   recovers it from its WAL and snapshot; after a **leader change** the new leader has every
//!   committed entry (raft's leader completeness), so it continues from the highest committed
//!   revision. Compaction drops old versions, never the current revision.
//!
//! What breaks it: restoring a cluster from an older snapshot (`etcdctl snapshot restore`)
//! without bumping revisions, or wiping the data directory. Then tokens can repeat; treat that as
//! a new cluster and reinstall generations in the resources.
//!
//! Tokens are not dense: they jump by the number of writes elsewhere in the cluster. The
//! decision and its limits: `docs/adr/0031-etcd-lock-protocol-and-revision-tokens.md`.
//!
//! ## TTLs
//! etcd leases have whole-second TTLs and a server minimum (derived from the election timeout,
//! about 2 s by default). The store learns the minimum on [`EtcdLeaseStore::connect`] and reports
//! it as [`Capabilities::min_ttl`](leasehold_core::Capabilities::min_ttl) with a one-second
//! granularity. A shorter TTL is [`Error::InvalidTtl`](leasehold_core::Error::InvalidTtl) before
//! anything is sent; other TTLs are rounded **up** to whole seconds and the lease reports the
//! granted TTL, so the caller never believes in a shorter lease than etcd grants it. If etcd ever
//! grants more than asked (its minimum changed), the etcd lease is revoked and the acquire fails
//! with `InvalidTtl`. Expiry is decided by etcd (the leader's clock): it deletes the key when the
//! lease runs out. On a leader change etcd extends every lease by about an election timeout, so
//! a waiter's worst case is TTL plus election time plus that extension.
//!
//! ## Renewal
//! A renew sends one keepalive for its etcd lease and **then** checks that the lock key still
//! exists with the lease's token, owner and etcd lease (a resumed lease, which does not name its
//! etcd lease, is checked before the keepalive too): a keepalive that succeeds for an etcd lease
//! whose key was deleted or replaced is reported as
//! [`RenewOutcome::Lost`](leasehold_core::RenewOutcome::Lost), not as a renewal.
//!
//! [`LeaseStore::renew_many`] does the same for a whole batch in few requests: one keepalive per
//! distinct etcd lease, then the batch's lock keys read back with range requests over their span
//! (5,000 keys a page), each lease judged as a single renew would judge it. On one shared etcd
//! lease ([`LeaseSharing`]) 10,000 leases of one TTL renew in about three requests.
//!
//! ## One etcd lease per grant, or one per TTL
//! With [`LeaseSharing::PerGrant`] each grant has its own etcd lease: per-key TTLs are
//! enforced by etcd alone and a release revokes just that lease, but a process holding thousands
//! of keys renews thousands of etcd leases. With [`LeaseSharing::PerTtl`] all keys a store grants
//! with the same TTL share one etcd lease, renewals within a tenth of the TTL share one
//! keepalive, and a background sweeper deletes keys whose holders stopped renewing (and keys of
//! acquires whose outcome was never learned, including puts that commit after the sweeper first
//! looked: it reads the keys of the etcd lease until it finds them or the lease is gone); a lease renewed through another store has its key
//! moved onto that store's etcd lease. A store with [`LeaseSharing::PerGrant`] refuses
//! (`InvalidInput`) to renew a key that lives on a shared etcd lease. The trade-offs are in
//! `docs/adr/0030-etcd-lease-sharing.md`.
//!
//! **The default, [`LeaseSharing::ReservedPerTtl`], is both, by key**: a key a caller names
//! ([`LeaseKey::new`](leasehold_core::LeaseKey::new): a single lease, an election's key) gets an
//! etcd lease of its own, as with `PerGrant` (the lock `etcdctl lock` sees, expiry by etcd
//! alone); a key of the library's [reserved](leasehold_core::LeaseKey::reserved) namespace (a
//! `leasehold-shard` set's shards, membership slots and mailboxes, a semaphore's permits, an
//! election's presence and handover keys) goes on the store's shared etcd lease for its TTL, as
//! with `PerTtl` ([`LeaseSharing::shares_etcd_lease`]). So a shard worker over a default store
//! puts all its shards on one etcd lease and renews them with a few requests, with nothing to
//! configure. Measured by `leasehold-bench` on a 2-core host with a 3-member etcd (2026-12-04):
//! with one etcd lease per shard, 10,000 shards over 10 workers did not settle within 200 s
//! (about 10,000 keepalives per renewal interval); with shared etcd leases they split in about a
//! minute and a dead worker's shards were owned again within TTL + one interval. Choose
//! `PerTtl` for a process that holds thousands of keys it names itself; `PerGrant` to keep
//! every key, reserved ones too, on an etcd lease of its own.
//!
//! ## Requests
//! The common path costs what the minimal etcd lease costs (a lease grant, a transaction guarded
//! by `create_revision == 0`, a lease revoke), counted by etcd itself in `tests/etcd/release.rs`:
//! - **acquire** of a free key: a lease grant, then one transaction that creates the lock key if
//!   nothing is under the lock prefix and otherwise reads the holder (the lowest key by create
//!   revision): 2 requests. Refused: the same two, plus the holder's remaining TTL and the
//!   revocation of the unused grant (sent together): 4. The same owner re-acquiring its key: a
//!   second transaction replaces the key, and the old etcd lease is revoked: 4.
//! - **release** of a lease this store granted: one lease revoke, which deletes the lock key in
//!   the same write (the etcd lease was granted for this key and carries nothing else). The
//!   lease's handle carries a tag (HMAC-SHA-256 under a random key of the store) that vouches
//!   for this; any other lease (resumed, forged, granted by another store, or on a shared etcd
//!   lease) is released by one transaction comparing the key's create revision and owner (after
//!   a read of the lock's holder if the lease has no handle), then a revoke of the key's etcd
//!   lease only if the key sat alone on it. A shared etcd lease is never revoked by a release.
//! - On a shared etcd lease ([`LeaseSharing::PerTtl`], and the reserved keys by default) an
//!   acquire is one transaction (plus a keepalive of the shared etcd lease at most once a tenth
//!   of the TTL) and a release one transaction.
//!
//! A release by revocation reports [`ReleaseOutcome::NotHeld`](leasehold_core::ReleaseOutcome::NotHeld)
//! when etcd no longer knows the etcd lease (expired, released or replaced before). If the lock
//! key was deleted by hand while its etcd lease lived, the revoke deletes nothing and the release
//! reports `Released`: a wrong report, never a wrong effect.
//!
//! [`LeaseStore::inspect_many`] reads the holders of a whole batch of keys in range requests of
//! 5,000 keys at one revision, then one TTL request per distinct etcd lease of a holder.
//!
//! ## Waiting
//! [`LeaseStore::watch`] watches deletions under the lock prefix (release, expiry, revocation)
//! and fires at once, so a waiter re-tries the acquire the moment the holder's key goes.
//!
//! ## Connecting: URLs, TLS and authentication
//! [`EtcdLeaseStore::connect`] takes one URL naming every endpoint of the cluster:
//! - `etcd://host:port,host:port` plain HTTP/2; `etcds://host:port,...` TLS (rustls with ring;
//!   the server certificate is verified against the CA file given, else the system's trust
//!   store, and must name the host as written in the URL);
//! - `etcd[s]://user:password@host:port,...` authenticates as an etcd user (percent-encode
//!   `@`, `:` and `%` in either part); the store gets a new token when the old one expires;
//! - `etcds://host:port?tls_ca=/path/ca.crt&tls_cert=/path/client.crt&tls_key=/path/client.key`
//!   names the CA file and the client certificate and key (PEM; paths percent-encoded;
//!   `tls_cert` and `tls_key` together). With authentication enabled and no user, etcd takes the
//!   client certificate's common name as the user.
//!
//! The same settings exist as [`EtcdOptions::with_tls_ca`], [`EtcdOptions::with_tls_client_cert`]
//! and [`EtcdOptions::with_user`]; a URL's values win over the options'. An unknown or repeated
//! query parameter, TLS files on a plain `etcd://` URL, a user without a password, and a TLS file
//! that is missing or holds no certificate (or key) are [`Error::Config`](leasehold_core::Error::Config)
//! naming the cause, before any connection. So are a server certificate the CA does not vouch for
//! or that has expired (the handshake's reason is in the message) and credentials etcd refuses.
//! Passwords never appear in errors or `Debug` output.
//!
//! ```no_run
//! use leasehold_etcd::{EtcdLeaseStore, EtcdOptions};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let options = EtcdOptions::default()
//!     .with_tls_ca("/etc/etcd/ca.crt")
//!     .with_tls_client_cert("/etc/etcd/client.crt", "/etc/etcd/client.key")
//!     .with_user("app", "s3cret");
//! let store = EtcdLeaseStore::connect_with("etcds://10.0.0.1:2379,10.0.0.2:2379", options).await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! ## Options in the URL
//! Every [`EtcdOptions`] setting can be given in the URL's query, on top of the options passed
//! in code ([`EtcdOptions::with_url`], [`URL_OPTIONS`]), so that a URL alone (`lease run --store
//! ...`, an environment variable) configures the store; the user is the URL's `user:password@`.
//! **Any other parameter is an [`Error::Config`](leasehold_core::Error::Config)** naming it, so a
//! misspelt one is never ignored. Durations take a unit: `250ms`, `2s`, `5m`, `1h`.
//!
//! | parameter | sets | example |
//! |---|---|---|
//! | `prefix` | [`EtcdOptions::with_prefix`] (the lock-name prefix) | `prefix=jobs/` |
//! | `fence_prefix` | [`EtcdOptions::with_fence_prefix`] | `fence_prefix=fence/` |
//! | `connect_timeout` | [`EtcdOptions::with_connect_timeout`] | `connect_timeout=1s` |
//! | `request_timeout` | [`EtcdOptions::with_request_timeout`] | `request_timeout=3s` |
//! | `lease_sharing` | [`EtcdOptions::with_lease_sharing`]: `per_grant`, `per_ttl` or `reserved_per_ttl` (the default) | `lease_sharing=per_ttl` |
//! | `tls_ca`, `tls_cert`, `tls_key` | [`EtcdOptions::with_tls_ca`], [`EtcdOptions::with_tls_client_cert`] | `tls_ca=/etc/etcd/ca.crt` |
//!
//! ```no_run
//! use leasehold_etcd::EtcdLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = EtcdLeaseStore::connect(
//!     "etcd://10.0.0.1:2379,10.0.0.2:2379?prefix=jobs/&request_timeout=3s&lease_sharing=per_ttl",
//! )
//! .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! ## Errors
//! Refused connections and etcd's "unavailable" answers are
//! [`Error::Unavailable`](leasehold_core::Error::Unavailable); requests that exceed
//! [`EtcdOptions::with_request_timeout`] are [`Error::Timeout`](leasehold_core::Error::Timeout);
//! malformed URLs, unusable TLS settings, refused TLS handshakes and refused credentials
//! (`PermissionDenied`, `Unauthenticated`) are [`Error::Config`](leasehold_core::Error::Config), not
//! retryable; anything else etcd answers unexpectedly is
//! [`Error::Backend`](leasehold_core::Error::Backend).

//!
//! ## Layout
//! [`EtcdOptions`] (`config.rs`) holds every knob; [`EtcdLeaseStore`] (`store.rs`) connects with
//! [`EtcdLeaseStore::connect`] / [`EtcdLeaseStore::connect_with`]; [`EtcdFencedResource`]
//! (`fenced.rs`) comes from [`EtcdLeaseStore::fenced_resource`]; [`protocol`] holds every key
//! layout, value format and transaction shape this backend sends.

mod batch;
mod config;
mod error;
mod fenced;
mod handle;
mod inspect;
pub mod protocol;
mod renew;
mod rpc;
mod shared;
mod store;
mod tls;
mod watch;

pub use config::{EtcdOptions, LeaseSharing, URL_OPTIONS};
pub use fenced::EtcdFencedResource;
pub use protocol::{DEFAULT_FENCE_PREFIX, DEFAULT_PREFIX};
pub use store::EtcdLeaseStore;

#[doc(no_inline)]
pub use leasehold_core::{FencedResource, LeaseStore};

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
