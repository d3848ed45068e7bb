//! # leasehold-otel
//!
//! OpenTelemetry metrics and `tracing` spans for the lease library, the same on every backend.
//! Three pieces, all built from one [`LeaseMetrics`] (an `opentelemetry` API [`Meter`], or the
//! global meter provider), so that backends need no code of their own:
//!
//! - [`InstrumentedStore`]: a decorator around any [`LeaseStore`](leasehold_core::LeaseStore): a
//!   span per call, call latency, acquire attempts.
//! - [`InstrumentedResource`]: a decorator around any [`FencedResource`](leasehold_core::FencedResource):
//!   a span per write, stale-token rejections counted and logged.
//! - [`OtelHook`]: a [`Hook`](leasehold_core::supervisor::Hook) for the supervisor and the election:
//!   renewals, the safety margin left at each renewal, time since the last confirmed renewal,
//!   losses by reason, hold times, leases held, leader transitions.
//! - [`ShardMetrics`]: a [`ShardHook`](leasehold_shard::ShardHook) for a
//!   [`ShardSet`](leasehold_shard::ShardSet): shards owned per worker, moves by reason, steals.
//!
//! This crate depends on the `opentelemetry` API only. The application installs the SDK and an
//! exporter (see `examples/metrics.rs` for a stdout exporter); without one every instrument is a
//! no-op.
//!
//! ## Quick start
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leasehold_core::{LeaseKey, MemoryFencedResource, MemoryLeaseStore};
//! use leasehold_core::supervisor::{Acquisition, Supervisor, SupervisorConfig};
//! use leasehold_otel::{LeaseMetrics, OtelConfig};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
//! // After `opentelemetry::global::set_meter_provider(..)`:
//! let metrics = LeaseMetrics::global_with_config(OtelConfig::new().with_key_attribute());
//! let store = metrics.store(MemoryLeaseStore::new());
//! let resource = Arc::new(metrics.resource(MemoryFencedResource::new(), "memory"));
//! let sup = Supervisor::new(store.clone(), SupervisorConfig::new(Duration::from_secs(10)))
//!     .with_hook(store.hook())
//!     .with_fence_on_acquire(resource);
//! if let Acquisition::Acquired(guard) = sup.acquire(&LeaseKey::new("nightly")?).await? {
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## What to watch
//! - `lease.renewal.remaining` falling towards zero: renewals land just in time; the store or
//!   the network is slow relative to the TTL. Raise the TTL or fix the latency before leases are
//!   lost.
//! - `lease.since_last_renewal` approaching the TTL: a holder has not had a renewal confirmed for
//!   a long time; loss is imminent.
//! - `lease.lost` by `lease.loss.reason`: `deadline_reached` (the store did not answer in time),
//!   `renewal_refused` (someone took the key over), `store_error`, `not_held_at_release`,
//!   `renewal_task_ended` (the renewal task stopped early, for example a panicking hook).
//! - `lease.fencing.rejections` above zero: a holder kept writing after it lost its lease and
//!   the resource stopped it. The protocol worked; find out why the holder did not stop.
//!
//! ## Logs and spans
//! Levels are chosen so that a healthy steady state is quiet at INFO:
//! - DEBUG spans `lease.acquire`, `lease.renew`, `lease.release`, `lease.inspect`, `lease.watch`
//!   (fields `backend`, `key`, `owner`, `token`, `outcome`), `lease.renew_many` (fields
//!   `backend`, `count`, `renewed`, `lost`, `failed`, `outcome`; a TRACE event per lease with
//!   `key`, `owner`, `token`), `lease.acquire_many` (fields `backend`, `count`, `acquired`,
//!   `held`, `failed`, `outcome`; a TRACE event per request with `key`, `owner`, `token`,
//!   `outcome`) and `lease.fenced.write`, `lease.fenced.install`,
//!   `lease.fenced.read` (fields `backend`, `key`, `token`, `outcome`).
//! - Grants, releases, refusals and store errors: DEBUG events inside those spans; renewals:
//!   TRACE.
//! - Acquisitions, releases and leadership changes: INFO events from the supervisor and the
//!   election (leasehold-core).
//! - Every health change towards loss is a WARN from the supervisor (leasehold-core) with `backend`,
//!   `key`, `owner`, `token` and, for a loss, `reason`; a stale-token rejection is a WARN from
//!   [`InstrumentedResource`] with `backend`, `key`, `token`, `high_water`.
//!
//! ## Instruments
//! Every data point carries `lease.backend`. With [`OtelConfig::with_key_attribute`] every data
//! point that concerns one key also carries `lease.key` (off by default: keys are unbounded).
//! Durations are seconds (`f64`), counts use OpenTelemetry's `{annotation}` units.
//!
//! | Instrument | Kind | Unit | Attributes | Meaning |
//! |---|---|---|---|---|
//! | `lease.acquire.attempts` | Counter | `{attempt}` | `lease.backend`, `lease.outcome` (`acquired`/`held`/`error`), `error.type` (on `error`) | Acquire calls through [`InstrumentedStore`]; each retry of a waiting supervisor counts. |
//! | `lease.operation.duration` | Histogram | `s` | `lease.backend`, `lease.operation` (`acquire`/`acquire_many`/`renew`/`renew_many`/`release`/`inspect`/`inspect_many`/`holders_many`/`watch`), `lease.outcome`, `error.type` (on `error`) | Latency of every store call through [`InstrumentedStore`]. Outcomes: acquire `acquired`/`held`, renew `renewed`/`lost`, acquire_many and renew_many `completed` (one point per batch, never with `lease.key`), release `released`/`not_held`, inspect `held`/`free`, inspect_many and holders_many `completed` (one point per batch, never with `lease.key`), watch `watching`/`unsupported`, any `error`. |
//! | `lease.acquire.wait` | Histogram | `s` | `lease.backend`, `lease.outcome` (`acquired`/`not_acquired`) | Time a supervised acquisition (each election round too) waited until it was granted or gave up. |
//! | `lease.renewals` | Counter | `{renewal}` | `lease.backend`, `lease.outcome` (`confirmed`/`refused`/`failed`/`timed_out`) | Renewal attempts of the supervisor. |
//! | `lease.renewal.duration` | Histogram | `s` | `lease.backend`, `lease.outcome` (as `lease.renewals`) | Latency of each supervisor renewal attempt (up to its bound when `timed_out`). |
//! | `lease.renewal.remaining` | Histogram | `s` | `lease.backend` | Local validity left when a renewal was confirmed: the safety margin. |
//! | `lease.since_last_renewal` | Gauge | `s` | `lease.backend` | Time since the grant or the last confirmed renewal of supervised leases held now (observable; the largest per attribute set; no data point while none is held). |
//! | `lease.lost` | Counter | `{lease}` | `lease.backend`, `lease.loss.reason` (`renewal_refused`/`deadline_reached`/`store_error`/`not_held_at_release`/`renewal_task_ended`) | Supervised leases lost. |
//! | `lease.hold.duration` | Histogram | `s` | `lease.backend`, `lease.outcome` (`released`/`lost`) | How long a supervised lease was held, recorded when it ended. |
//! | `lease.held` | UpDownCounter | `{lease}` | `lease.backend` | Supervised leases held now. |
//! | `lease.leader.transitions` | Counter | `{transition}` | `lease.backend`, `lease.leader.event` (`elected`/`stepped_down`) | Leadership changes of election candidates. |
//! | `lease.fencing.rejections` | Counter | `{write}` | `lease.backend`, `lease.fencing.operation` (`write`/`install`) | Writes and installs a fenced resource rejected for a stale token ([`InstrumentedResource`]). |
//! | `lease.shard.owned` | UpDownCounter | `{shard}` | `lease.backend`, `lease.shard.set`, `lease.shard.worker` | Shards a worker owns now: up at each assignment, down at each revocation ([`ShardMetrics`]). |
//! | `lease.shard.moves` | Counter | `{shard}` | `lease.backend`, `lease.shard.set`, `lease.shard.worker`, `lease.shard.reason` (`handoff`/`lost`/`leaving`/`other`) | Shard ownerships that ended, counted by the worker that lost them: `handoff` (drained and released to a thief), `lost` (the lease expired or was refused), `leaving` (the worker left or was dropped). |
//! | `lease.shard.steals` | Counter | `{steal}` | `lease.backend`, `lease.shard.set`, `lease.shard.worker` (the thief) | Handover requests a worker left in a more loaded worker's mailbox; a completed steal is also a `lease.shard.moves{lease.shard.reason=handoff}` at the victim. |
//!
//! `error.type` is one of `invalid_input`, `unavailable`, `timeout`, `config`, `backend`,
//! `cancelled` (the caller dropped the call before it finished, e.g. a supervisor timeout) or
//! `other`. The instrument names are also constants in [`names`].
//!
//! ## Overhead
//! The decorators add a few attribute lookups and two clock reads per call. `benches/overhead.rs`
//! measures acquire + release on the in-memory store (the worst case: no network) with and
//! without [`InstrumentedStore`] in the same run and prints the ratio.

mod config;
mod held;
mod hook;
mod metrics;
pub mod names;
mod resource;
mod shard;
mod store;

pub use config::OtelConfig;
pub use hook::OtelHook;
pub use metrics::LeaseMetrics;
pub use opentelemetry::metrics::Meter;
pub use resource::InstrumentedResource;
pub use shard::ShardMetrics;
pub use store::InstrumentedStore;

// The README's example (what crates.io shows) is compiled as a doc test, and run when it needs no
// server, so that it keeps matching the API and the quick start above.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
