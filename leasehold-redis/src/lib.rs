//! # leasehold-redis
//!
//! Leases with fencing tokens on Redis (7.0 or newer): [`RedisLeaseStore`] implements
//! [`LeaseStore`](leasehold_core::LeaseStore) and, for the protected side,
//! [`fenced_resource`](RedisLeaseStore::fenced_resource) gives a
//! [`FencedResource`](leasehold_core::FencedResource).
//!
//! | file | what |
//! |------|------|
//! | `config.rs` | [`RedisOptions`]: every knob |
//! | `store.rs` | [`RedisLeaseStore`]: [`connect`](RedisLeaseStore::connect), [`connect_with`](RedisLeaseStore::connect_with), the lease operations |
//! | `fenced.rs` | [`RedisFencedResource`] |
//! | `protocol.rs` | [`protocol`]: every Lua script and the key layout |
//! | `watch.rs`, `connection.rs`, `error.rs` | waking waiters, the connection, error mapping |
//!
//! ## Quick start
//! ```no_run
//! use std::time::Duration;
//! use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseKey, LeaseStore, OwnerId};
//! use leasehold_redis::{RedisLeaseStore, RedisOptions};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let options = RedisOptions::default().with_prefix("jobs");
//! let locks = RedisLeaseStore::connect_with("redis://127.0.0.1:6379", options).await?;
//! let key = LeaseKey::new("nightly-report")?;
//! let req = AcquireRequest::new(key.clone(), OwnerId::with_label("worker-a"), Duration::from_secs(10));
//! if let AcquireOutcome::Acquired(lease) = locks.acquire(&req).await? {
//!     // ... work, renewing before lease.deadline() ...
//!     let _ = locks.release(&lease).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## Connecting: URLs, TLS and authentication
//! | URL | what |
//! |-----|------|
//! | `redis://[user:password@]host:port[/db]` | one server |
//! | `rediss://[user:password@]host:port[/db][?tls_ca=..&tls_cert=..&tls_key=..]` | one server over TLS |
//! | `redis+unix:///path/to/socket` | one server on a Unix socket |
//! | `redis+cluster://[user:password@]h1:p1,h2:p2,...` | Redis Cluster (seed nodes) |
//! | `rediss+cluster://[user:password@]h1:p1,...[?tls_ca=..]` | Redis Cluster over TLS |
//! | `redis+sentinel://[user:password@]s1:p1,s2:p2,.../mastername[/db]` | the master that Redis Sentinel names |
//!
//! **Sentinel.** The store asks the listed sentinels (the first that answers) for the master of
//! `mastername`, checks with `ROLE` that it is one, and connects to it; `user:password` and `db`
//! apply to the master, not to the sentinels (which are reached without authentication or TLS;
//! `rediss+sentinel://` is not supported). It follows a failover two ways: a background task
//! subscribes to the sentinels' `+switch-master` announcements and moves to the announced master
//! at once, and a command that fails in a way that says the master may have moved (`READONLY`
//! from a demoted master, a dropped, refused or timed-out connection) makes the store ask the
//! sentinels again. The failed command's error is returned as usual (retryable); the next one
//! goes to the new master. A failover is asynchronous replication's failover: a grant that the
//! replica had not received, or that the old master made after the switch and before the
//! sentinels demoted it, is lost, and the key can be granted twice. So fence with a resource
//! outside this Redis (see below).
//!
//! Tested against a master, a replica and three sentinels (`scripts/services/redis-sentinel.sh`):
//! the whole conformance suite (the `redis-sentinel` target), and `SENTINEL FAILOVER` under a
//! holder whose grant the replica acknowledged (`redis-sentinel-failover`): the store follows the
//! new master by itself, the holder's renewal is granted there and a contender refused; a key
//! granted right after the switch was lost with the old master in the runs so far, granted again
//! with a greater token, and an outside fenced resource rejected the first owner's late write.
//! With the following disabled, the holder's renewal came back `Lost` from the demoted master.
//!
//! `user:password` authenticates with `AUTH` (an ACL user; the password alone for the `default`
//! user); percent-encode special characters. A failed authentication (`WRONGPASS`, `NOAUTH`) is
//! [`Error::Config`](leasehold_core::Error::Config).
//!
//! **TLS** uses rustls with ring (no OpenSSL). Without further options the server's certificate
//! must chain to the built-in web roots (Mozilla's, from `webpki-roots`). The query parameters,
//! or the equivalent [`RedisOptions`] methods, change that:
//!
//! | parameter | option | what |
//! |-----------|--------|------|
//! | `tls_ca=<path>` | [`RedisOptions::with_tls_ca_file`] | trust the CA certificate(s) in this PEM file instead |
//! | `tls_cert=<path>&tls_key=<path>` | [`RedisOptions::with_tls_client_cert`] | present this client certificate and key (mutual TLS) |
//!
//! The driver's own `protocol` parameter is passed on; any other parameter, a file given both in
//! the URL and in the options, a certificate without its key, TLS files with a plain `redis://`
//! URL and an unreadable file are each an [`Error::Config`](leasehold_core::Error::Config) before
//! anything is sent. A certificate the client refuses (an untrusted CA, an expired certificate, a
//! name that does not match) or one the server refuses or requires is an
//! [`Error::Config`](leasehold_core::Error::Config) naming the cause, returned within the
//! [operation deadline](RedisLeaseStore::op_deadline). If the application has not installed a
//! process-wide rustls `CryptoProvider`, connecting to a TLS URL installs ring's.
//!
//! ```no_run
//! use leasehold_redis::{RedisLeaseStore, RedisOptions};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! // Mutual TLS with a private CA and an ACL user, all in the URL...
//! let a = RedisLeaseStore::connect(
//!     "rediss://locks:s3cret@redis.internal:6380/?tls_ca=/etc/redis/ca.crt\
//!      &tls_cert=/etc/lease/client.crt&tls_key=/etc/lease/client.key",
//! ).await?;
//! // ...or in the options.
//! let options = RedisOptions::default()
//!     .with_tls_ca_file("/etc/redis/ca.crt")
//!     .with_tls_client_cert("/etc/lease/client.crt", "/etc/lease/client.key");
//! let b = RedisLeaseStore::connect_with("rediss://locks:s3cret@redis.internal:6380", options).await?;
//! # let _ = (a, b); Ok(()) }
//! ```
//!
//! Tested against a TLS-only `redis-server` with an ACL user (`scripts/services/redis-tls.sh`):
//! the whole conformance suite, mutual TLS (a server that requires client certificates), and the
//! typed errors for a wrong CA, an expired server certificate, a missing client certificate, a
//! wrong password and unknown parameters (the `redis-tls` test target). On a Redis Cluster the
//! certificates go to every node the cluster client discovers: the whole conformance suite passes
//! against a TLS-only 3-master, 3-replica cluster (`scripts/services/redis-tls-cluster.sh`,
//! `--tls-cluster yes`; the `redis-tls-cluster` target).
//!
//! ## Options in the URL
//! Every [`RedisOptions`] setting can be given in the URL's query, on top of the options passed
//! in code ([`RedisOptions::with_url`], [`URL_OPTIONS`]), with every scheme above, so that a URL
//! alone (`lease run --store ...`, an environment variable) configures the store. The driver's
//! own parameters ([`DRIVER_URL_PARAMETERS`]: `protocol=resp3`, and `db`, `user`, `pass` of a
//! `redis+unix://` URL) pass through; **any other parameter is an
//! [`Error::Config`](leasehold_core::Error::Config)** naming it, so a misspelt one is never ignored.
//! Durations take a unit: `250ms`, `2s`, `5m`, `1h`.
//!
//! | parameter | sets | example |
//! |---|---|---|
//! | `prefix` | [`RedisOptions::with_prefix`] | `prefix=jobs` |
//! | `response_timeout` | [`RedisOptions::with_response_timeout`] | `response_timeout=2s` |
//! | `connect_timeout` | [`RedisOptions::with_connect_timeout`] | `connect_timeout=1s` |
//! | `connect_retries` | [`RedisOptions::with_connect_retries`] | `connect_retries=3` |
//! | `wait_for_replicas`, `wait_timeout` | [`RedisOptions::with_wait_for_replicas`] (both, unless set in code) | `wait_for_replicas=1&wait_timeout=200ms` |
//! | `watch_poll_interval` | [`RedisOptions::with_watch_poll_interval`] | `watch_poll_interval=100ms` |
//! | `allow_eviction` | [`RedisOptions::allow_eviction`] | `allow_eviction=true` |
//! | `tls_ca`, `tls_cert`, `tls_key` | the TLS files (see "TLS" above) | `tls_ca=/etc/redis/ca.crt` |
//! | `protocol`, `db`, `user`, `pass` | the driver | `protocol=resp3` |
//!
//! ```no_run
//! use leasehold_redis::RedisLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = RedisLeaseStore::connect(
//!     "redis+cluster://10.0.0.1:7000,10.0.0.2:7000?prefix=jobs&response_timeout=2s",
//! )
//! .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! ## How it works
//! - **One script per operation, with the fewest commands.** Acquire sets the holder's record
//!   (one string, `"<token> <owner> <ttl>"`) with a server-side TTL (`PX`) only if the key is
//!   free, expired or held by the same owner, and issues the next token: on the common path
//!   `TIME`, `SET .. NX GET PX` and `SET counter .. GET`, three commands, where the minimal
//!   `SET NX PX` + `INCR` lease runs two. Renew extends only for the same owner *and* token
//!   (`GET`, `SET .. PX`); release deletes only for the same owner and token (a plain `DEL`
//!   would remove a successor's lease) and publishes on the key's release channel (`GET`, `DEL`,
//!   `PUBLISH`). Expiry is judged by the Redis server's clock, never the client's.
//!   [`renew_many`](leasehold_core::LeaseStore::renew_many) renews any number of leases in **one**
//!   script (one round trip), with the same per-lease check, so a supervisor with renewal
//!   batching renews thousands of leases in a handful of round trips. On Redis Cluster it sends
//!   one script per hash slot, all at once, so the scripts for one master share a round trip on
//!   that master's multiplexed connection.
//!   [`inspect_many`](leasehold_core::LeaseStore::inspect_many) reads any number of keys the same
//!   way: one script per 256 keys (per hash slot on a cluster), all sent at once.
//! - **Key layout** (see [`KeyLayout`](protocol::KeyLayout)): `prefix:{key}:lease`, `prefix:{key}:gen`,
//!   `prefix:{key}:fence` and the channel `prefix:{key}:released`. The `{key}` hash tag keeps a
//!   lease, its counter and its fenced resource in one Redis Cluster slot; a prefix containing `{`
//!   or `}` is refused with [`Error::Config`](leasehold_core::Error::Config).
//! - **Redis Cluster.** Connect with `redis+cluster://h1:p1,h2:p2,...` (`rediss+cluster://`
//!   for TLS): the store then uses the `redis` crate's async cluster client, which routes each
//!   script to the master of its key's slot and follows `MOVED`/`ASK` and topology changes. Every
//!   script touches only keys with the same `{key}` hash tag, so it stays in one slot. A watch
//!   subscribes to the release channel on the first reachable node (a `PUBLISH` reaches the
//!   whole cluster) and polls for expiry every
//!   [poll interval](RedisOptions::with_watch_poll_interval) (keyspace events are node-local).
//!   Tested against a real 3-master, 3-replica cluster (`scripts/services/redis-cluster.sh`):
//!   the whole conformance suite, and a coordinated failover (`CLUSTER FAILOVER` on the
//!   replica) of the master serving a held key, after which the holder's renewal is granted, a
//!   contender is refused and the fenced resource still knows the holder's token. A master that
//!   dies with writes its replica has not received can lose a grant, exactly as with one
//!   primary and its replica (below): replication is asynchronous in a cluster too.
//! - **Waiting.** [`watch`](leasehold_core::LeaseStore::watch) opens a dedicated pub/sub connection and
//!   subscribes to the release channel (always available) and, if the server publishes keyspace
//!   notifications (`notify-keyspace-events` with `K` and `x` or `A`), to the lease record's
//!   keyspace events, which also report expiry. Without them the watch also signals every
//!   [poll interval](RedisOptions::with_watch_poll_interval), so an expiry is noticed within
//!   that bound. An open watch pings its connection every response timeout; an unanswered ping
//!   or a closed connection ends the watch with a retryable error (the waiter falls back to
//!   polling), so a black-holed connection is noticed within twice the response timeout.
//! - **Every wait is bounded.** Each operation, [`watch`](leasehold_core::LeaseStore::watch) set-up
//!   and the fenced resource's writes and reads included, fails with
//!   [`Error::Timeout`](leasehold_core::Error::Timeout) (retryable) after the store's
//!   [operation deadline](RedisLeaseStore::op_deadline) (connect timeout + 2 × response timeout),
//!   however many reconnection retries are configured. Tests: a watch through a black-holing
//!   TCP proxy, operations while every connection is reset.
//!
//! ## What Redis can promise, and what it cannot
//! **It can promise** mutual exclusion on one healthy server: the scripts are atomic, expiry is
//! the server's, and only the holder's own token can renew or release.
//!
//! **Tokens never go back, under a stated clock assumption.** Redis without persistence, a
//! restart, or a failover to a replica that missed the last writes can lose the token counter.
//! So the next token is `max(counter + 1, server TIME in unix microseconds)`: after a loss, the
//! next token is at least the server's current time in microseconds, which is greater than every
//! token issued before, **as long as the clock of the server that issues it does not run behind
//! the clock of the server that issued the earlier tokens by more than the time that passed since
//! then** (one NTP-synchronised machine or fleet: yes; a server with its clock set back by hours:
//! no). This is [`TokenDurability::ClockFloored`](leasehold_core::TokenDurability::ClockFloored).
//! Tokens are therefore large numbers (about 1.8 × 10^15 in 2026) and stay below 2^53, which the
//! scripts' Lua numbers represent exactly, until the year 2255.
//!
//! **Expiry is judged by the server's wall clock.** `PX` deadlines are absolute times on the
//! Redis server's `CLOCK_REALTIME`, so **a forward step of the server clock expires leases
//! early**: the store grants the key to the next owner while the holder, which measures its
//! lease on its own monotonic clock, still believes it holds it (for up to the size of the step).
//! Run the server's clock slewed (chrony or ntpd slewing, no `makestep` after start-up, no
//! `date -s`), not stepped. A backward step makes leases last longer and, while the counter is
//! intact, does not make tokens go back (the `+ 1`). The test
//! `redis::a_forward_clock_step_expires_a_lease_early_and_fencing_holds` runs a server under
//! libfaketime, steps its clock an hour forward while a ten-minute lease is held, and shows the
//! early grant happen, with a greater token that the fenced resource then uses to reject the old
//! holder. See `docs/adr/0020-redis-clock-floored-tokens.md`.
//!
//! **Eviction: the server must run `maxmemory-policy noeviction`.** A lease record carries a TTL,
//! so under any other policy (`volatile-*` evicts keys with a TTL, `allkeys-*` any key; many
//! managed services default to `volatile-lru`) a server that reaches `maxmemory` may delete a
//! held lease and grant the key to the next owner. So [`connect`](RedisLeaseStore::connect) reads
//! `CONFIG GET maxmemory-policy` (on a cluster, from every master) and refuses any other policy
//! with [`Error::Config`](leasehold_core::Error::Config) naming it and the fix, unless
//! [`RedisOptions::allow_eviction`] is set (then it logs a warning through `tracing`). Where the
//! server does not let the client read its configuration (`CONFIG` renamed or denied by an ACL,
//! as on many managed services) the store **connects and logs a warning**: refusing would make
//! those services unusable, and their policy is set in the provider's console, where the
//! operator must choose `noeviction`. The policy is read once: a later `CONFIG SET` is not
//! noticed. Tests `redis::an_evicting_server_is_refused_at_connect`,
//! `redis::with_eviction_allowed_a_held_lease_can_be_evicted_and_granted_again` (a real
//! `volatile-ttl` server with 2 MB evicts a held record; a second owner is granted, with a greater
//! token) and `redis::a_server_that_hides_its_policy_is_accepted`.
//!
//! **It cannot promise** that two owners never *believe* they hold the same key. Replication is
//! asynchronous: if the primary grants a lease and fails before the grant reaches the replica
//! that is promoted, the new primary grants the key again. [`RedisOptions::with_wait_for_replicas`]
//! (`WAIT`) narrows that window but does not close it. Nor can any lease stop a holder that
//! pauses (GC, VM suspend) past its TTL and then writes.
//!
//! ## Safe anyway: fencing
//! Both failures are made harmless by the resource: every write carries the lease's token, and
//! the resource rejects tokens below the highest one it has accepted. Because the promoted
//! replica's token is floored by its clock, the new owner's token is greater than the old one's,
//! so the old owner is rejected as soon as the new one writes (or installs its generation). The
//! crate's failover test runs exactly this against real primary and replica processes.
//!
//! **The resource must not fail over with the lock.** This holds only for a resource that keeps
//! its high-water mark *outside* the failing-over Redis (another Redis, the database the work
//! writes to). The [`RedisFencedResource`] of a [`RedisLeaseStore`] keeps
//! the mark in the store's own Redis: paired with the lock store's Redis it shares its failover,
//! and a failover to a replica that missed the last fenced write loses the mark with it. Then
//! **a lower token is accepted after a higher one**: split brain is not fenced. The test
//! `redis::split_brain_lets_the_same_redis_accept_a_lower_token` shows this miss against a real
//! primary and replica (and the same writes rejected by a resource outside them). See
//! `docs/adr/0021-redis-failover-wait-and-fencing.md`.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold_core::{AcquireRequest, FencedResource, LeaseKey, LeaseStore, OwnerId, WriteOp, WriteOutcome};
//! use leasehold_redis::RedisLeaseStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let old_primary = RedisLeaseStore::connect("redis://10.0.0.1:6379").await?;
//! let promoted = RedisLeaseStore::connect("redis://10.0.0.2:6379").await?; // missed A's grant
//! let resource = RedisLeaseStore::connect("redis://10.0.0.9:6379").await?.fenced_resource(); // the protected data
//! let key = LeaseKey::new("ledger")?;
//! let ttl = Duration::from_secs(10);
//! let a = old_primary.acquire(&AcquireRequest::new(key.clone(), OwnerId::random(), ttl)).await?.lease().unwrap();
//! let b = promoted.acquire(&AcquireRequest::new(key.clone(), OwnerId::random(), ttl)).await?.lease().unwrap();
//! assert!(b.token() > a.token()); // the clock floor
//! assert!(resource.write(&key, b.token(), WriteOp::Add(1)).await?.is_accepted());
//! let late = resource.write(&key, a.token(), WriteOp::Add(1)).await?;
//! assert_eq!(late, WriteOutcome::Rejected { presented: a.token(), high_water: b.token() });
//! # Ok(()) }
//! ```
//!
//! ## Errors
//! Driver errors are mapped by kind: refused, dropped or failed connections and a server that
//! cannot serve right now (loading, read-only, cluster down) are
//! [`Error::Unavailable`](leasehold_core::Error::Unavailable); response timeouts are
//! [`Error::Timeout`](leasehold_core::Error::Timeout), and so is an operation that outlives the
//! [operation deadline](RedisLeaseStore::op_deadline); an unparsable URL, a bad prefix, a zero
//! timeout, failed authentication, a refused TLS certificate, a master name the sentinels do
//! not know or a server that may evict leases are
//! [`Error::Config`](leasehold_core::Error::Config); anything
//! else is [`Error::Backend`](leasehold_core::Error::Backend).

mod batch;
mod config;
mod connection;
mod error;
mod eviction;
mod fenced;
mod inspect;
pub mod protocol;
mod sentinel;
mod store;
mod tls;
mod watch;

pub use config::{DRIVER_URL_PARAMETERS, RedisOptions, ReplicaWait, URL_OPTIONS};
pub use connection::RedisConnection;
pub use fenced::RedisFencedResource;
pub use store::{MIN_TTL, RedisLeaseStore};

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
