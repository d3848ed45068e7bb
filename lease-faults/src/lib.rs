//! # lease-faults
//!
//! The fault suite. Our claim: with this library, **no stale write is ever accepted and no token
//! ever goes back**, on any backend, under pauses, kills, partitions, lost responses and storms.
//! This crate tries hard to break that claim:
//!
//! - [`scenarios`]: each scenario runs unchanged against PostgreSQL, Redis, etcd and Kubernetes,
//!   through a loopback [`FaultProxy`](lease_testkit::proxy::FaultProxy) and with holders running
//!   as real child processes (`lease-fault-holder`) that the test SIGSTOPs, SIGCONTs and SIGKILLs;
//! - [`report`]: the per-backend table (runs, faults injected, stale writes accepted, token
//!   regressions, smallest safety margin, false expiries, longest takeover);
//! - `tests/faults.rs`: the CI run (a bounded number of storms per backend);
//! - the `soak` binary: `cargo run --release -p lease-faults --bin soak -- --storms 1000`, which
//!   writes `docs/faults.md`.
//!
//! Store restarts (and etcd leader loss, and the Redis replica-promotion race) are exercised by
//! each backend crate's own failure tests, against servers those tests start themselves.

pub mod child;
pub mod controls;
pub mod link;
pub mod report;
pub mod resource;
pub mod scenarios;
pub mod storm;
pub mod target;
