//! # leasehold-faults
//!
//! The fault suite. Our claim: with this library, **no stale write is ever accepted and no token
//! ever goes back**, on any backend, under pauses, kills, partitions, lost responses and storms;
//! and a holder stops acting before the store can grant its lease to anyone else. This crate
//! tries hard to break that claim, and proves that it can:
//!
//! - [`scenarios`]: each scenario runs unchanged against PostgreSQL, MySQL/MariaDB, Redis, etcd,
//!   Kubernetes (through a loopback [`FaultProxy`](proxy::FaultProxy)) and SQLite (through an
//!   in-process fault wrapper, [`link`]), with holders running as real child processes
//!   (`lease-fault-holder`) that the test SIGSTOPs, SIGCONTs and SIGKILLs;
//! - [`storm`]: the randomized storm, the same code for every backend: holders keep the lease
//!   across several renewal intervals while faults strike during renewals and releases, and write
//!   through the backend's own fenced resource over a faulty link of its own; the recorded history
//!   is checked by [`leasehold_testkit::history`];
//! - [`failover`]: restarts and failovers inside storms, on servers of their own ([`servers`],
//!   reached through a switchable [`front::Front`]): PostgreSQL restart and standby promotion,
//!   Redis restart and replica promotion, etcd leader kill, kube-apiserver restart, and SQLite
//!   holder processes killed and paused ([`procstorm`]); `tests/failover.rs` runs each once;
//! - [`record`] and [`tail`]: the resource's own record of the writes it accepted (triggers on
//!   PostgreSQL, MySQL and SQLite; Redis's replication stream, etcd's revisions and the Kubernetes
//!   watch), checked against the grants after every process storm;
//! - [`controls`]: negative controls, deliberately broken stores, resources and configurations
//!   that the same storms must catch, each with the violation kind it must produce;
//! - [`report`]: the per-backend tables, counted from the typed verdicts;
//! - `tests/faults.rs` (every scenario and a sample of storms per backend, `LEASE_FAULTS_STORMS`,
//!   default 20) and `tests/controls.rs` (every control) run in CI;
//! - the `soak` binary: `cargo run --release -p leasehold-faults --bin soak -- --storms 1000 --out
//!   docs/faults.md` writes `docs/faults.md`.
//!
//! Every run yields a typed result ([`scenarios::Measured`]): violations by
//! [`ViolationKind`](leasehold_testkit::history::ViolationKind); an `Err` means the test itself could
//! not be carried out.

pub mod child;
pub mod controls;
pub mod failover;
pub mod front;
pub mod link;
pub mod procstorm;
pub mod proxy;
pub mod record;
pub mod report;
pub mod resource;
pub mod scenarios;
pub mod servers;
pub mod stall;
pub mod storm;
pub mod tail;
pub mod target;
