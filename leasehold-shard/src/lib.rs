//! # leasehold-shard
//!
//! Shard ownership across a fleet: N workers split K shards (tenants, queue partitions, index
//! ranges) so that every shard has at most one **fenced** owner at a time, on any
//! [`LeaseStore`](leasehold_core::LeaseStore) (memory, PostgreSQL, Redis, etcd, Kubernetes, SQLite), through its public
//! contract only.
//!
//! - A worker [joins](ShardSet::join) with an id. It announces itself with a **membership
//!   lease** (one of [`ShardSetConfig::with_max_workers`] slot keys) and computes its **fair
//!   share** from the live members: `K / N`, plus one for the first `K % N` members in id order.
//! - Each interval it reads every slot and shard in two batched reads in flight together (the
//!   slots with [`LeaseStore::inspect_many`](leasehold_core::LeaseStore::inspect_many), for the
//!   time each member's slot has left, and the shards with
//!   [`LeaseStore::holders_many`](leasehold_core::LeaseStore::holders_many): each one statement,
//!   script, range read or list on the real backends), takes **free or expired** shards first,
//!   then **steals** from the members most above their share, at most
//!   [`ShardSetConfig::with_max_steals`] shards in flight.
//! - The free shards are **handed out without contest**: every member computes the same blocks
//!   from the same scan (the free shards in order, one block per member in id order, as long as
//!   what it lacks of its share as the scan shows it), and each takes its own, never past its
//!   share counting its acquisitions in flight. A shard seen free on two scans in a row (its
//!   block's member did not take it) is taken by whoever sees it while still below its share.
//!   Ten workers started together over 10,000 shards split them with at most 1.05 acquisitions
//!   per shard, even when their takes outlast an interval.
//! - A steal is a **graceful handover**: the thief leaves a request for `n` shards in the
//!   victim's mailbox key and waits for the `n` shards it ranks first; the victim, if still above
//!   its share, picks the same shards by the same rank, cancels their work, waits for the
//!   application to drop their [`ShardGuard`]s (bounded by the drain timeout), then releases
//!   them, and the thief takes them on the release wake-up (a watch on one shard it awaits), not
//!   on expiry, in batched acquires of all the shards it still awaits.
//! - A **graceful leave** ([`Worker::leave`]) is a handover too: the leaver gives up its
//!   membership, leaves a note in every other member's mailbox, then drains and releases its
//!   shards. The members, woken by the note, rescan at once; a shard held by a worker that is no
//!   longer a member is handed out like a free one, and its new owner waits on it with the store's
//!   watch, so it takes the shard on the release wake-up, not at its next rebalance.
//! - A **death** (a membership that expired with shards free or still held) is seen when the
//!   dead worker's slot expires: a member whose scan finds another's slot closer to expiry than
//!   its next rebalance (the member stopped renewing) rescans right after that expiry, so every
//!   member sees the death within a scan of it, told or not. The first to see it also leaves a
//!   note in every other member's mailbox, which wakes them at once on a store with a watch.
//!   Every shard has a live owner again within TTL of the death (the dead worker's last
//!   renewal came before it), plus the scan and the acquisitions themselves; at worst, if the
//!   rescan fails, within TTL plus one interval.
//! - A worker that just joined waits an eighth of an interval (at most a second) before its first
//!   scan, so that workers started together count each other instead of each taking every shard,
//!   and it takes or steals only on a membership that two scans an eighth of an interval apart
//!   agree on: while members keep joining (a rollout) it rescans as often, at most eight times
//!   in a row, so that each shard is taken once on the final membership rather than taken on an
//!   early one and handed over as the later workers arrive. A departure is acted on at once. Free shards are tried once each,
//!   at most [`ShardSetConfig::with_acquire_concurrency`] at a time.
//! - Every held shard is a supervised lease ([`Supervisor`](leasehold_core::supervisor::Supervisor)) with its own fencing token and its
//!   own cancellation. All of a worker's leases (shards and membership) share one supervisor with
//!   renewal batching, so they renew through `renew_many` in O(1) round trips per interval.
//! - The application sees a stream of [`ShardEvent::Assigned`] and [`ShardEvent::Revoked`] and
//!   the current [assignment](Worker::assignment).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leasehold_core::MemoryLeaseStore;
//! use leasehold_shard::{ShardEvent, ShardSet, ShardSetConfig};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! let store = Arc::new(MemoryLeaseStore::new());
//! let shards: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
//! let set = ShardSet::new(store, "orders", &shards, ShardSetConfig::new(Duration::from_secs(3)))?;
//! let mut worker = set.join("worker-a")?;
//! // Alone, the worker owns every shard; each comes with its own fencing token.
//! let mut owned = 0;
//! while owned < shards.len() {
//!     match worker.next_event().await {
//!         Some(ShardEvent::Assigned { shard, token, guard }) => {
//!             // carry `token` into every write for `shard`; stop when `guard.cancellation()` fires
//!             assert!(guard.may_act());
//!             owned += 1;
//!         }
//!         _ => unreachable!("alone, nothing is revoked"),
//!     }
//! }
//! assert_eq!(worker.assignment().len(), 8);
//! worker.leave().await;
//! # Ok(()) }
//! ```
//!
//! # Workers with one id
//! A worker holds every lease (its shards, its membership slot, the requests and notes it leaves
//! in mailboxes) under its own [instance](leasehold_core::OwnerId::instance) of its id (`ID#` and 16 random hex
//! digits; [`Worker::owner`]). Two workers joined with one id (two processes started with one
//! fixed id, a restarted pod whose predecessor still runs) are two owners to the store: the
//! store never grants one shard to both, neither renews or releases the other's leases, and
//! neither takes a shard the other holds as its own. The other members count them as one
//! member, by id: one fair share, which the two split between them, and one mailbox.
//! [`ShardSet::try_join`] reads the membership first and refuses an id that is already live;
//! two joins at the same instant can both pass that read, and are then two owners as above.
//!
//! # Keys
//! A set named `NAME` uses the [reserved](leasehold_core::LeaseKey::reserved) keys `NAME.lease--s.SHARD` per
//! shard, `NAME.lease--m.I` per membership slot and `NAME.lease--x.WORKER` per mailbox.
//! [`LeaseKey::new`](leasehold_core::LeaseKey::new) refuses `--`, so no lease a user names, in this set's store or any other,
//! can have one of the set's keys: an unrelated lease never collides with a set, and two sets
//! with different names never share a key. `NAME` must be a legal [`LeaseKey`](leasehold_core::LeaseKey), and shard
//! names and worker ids legal key labels without `--` ([`ShardSet::new`] and
//! [`ShardSet::join`] refuse others with [`Error::InvalidKey`](leasehold_core::Error::InvalidKey)).
//!
//! ```
//! use leasehold_core::LeaseKey;
//! let orders = LeaseKey::new("orders")?;
//! assert_eq!(orders.reserved("s.p0")?.as_str(), "orders.lease--s.p0");
//! assert!(LeaseKey::new("orders.lease--s.p0").is_err());
//! # Ok::<(), leasehold_core::Error>(())
//! ```
//!
//! # Layout
//! - `plan.rs`: the pure plan. Given a scan or an event, what a worker takes, inherits, steals,
//!   hands over and drains, and when it rescans; unit-tested without a store.
//! - `driver.rs`: the worker's background task, a thin loop over timers, the mailbox's watch and
//!   its acquisitions' outcomes, which steps the plan and carries out what it decides.
//! - `membership.rs`: membership slots and the batched scan; `mailbox.rs`: steal requests and
//!   notes.
//! - `set.rs`: [`ShardSet`] and [`Worker`]; `events.rs`: what the application sees
//!   ([`ShardEvent`], [`ShardGuard`], [`ShardHook`], [`Snapshot`], [`fair_share`]);
//!   `config.rs`: [`ShardSetConfig`].

mod config;
mod driver;
mod events;
mod mailbox;
mod membership;
mod plan;
#[cfg(test)]
mod plan_model;
mod set;
mod steal;

pub use config::{MAX_WORKERS, ShardSetConfig};
pub use events::{RevokeReason, ShardEvent, ShardGuard, ShardHook, Snapshot, fair_share};
pub use set::{ShardSet, Worker};

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
