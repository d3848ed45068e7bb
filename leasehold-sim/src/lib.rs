#![doc = include_str!("../README.md")]
//!
//! ## Modules
//! - [`run`]: one seeded run ([`run_seed`]), many ([`run_seeds`]), the [`Scenario`] and the checks.
//! - [`server`]: the simulated store and fenced resource behind a turmoil TCP listener.
//! - [`client`]: [`NetStore`] (a [`leasehold_core::LeaseStore`]) and [`NetFence`] (a
//!   [`leasehold_core::FencedResource`]) over the wire, with the deliberately broken [`ClientFault`]s.
//! - [`protocol`]: the request/response lines.
//! - [`trace`]: the event trace compared by the determinism test.

pub mod client;
pub mod protocol;
pub mod run;
pub mod server;
pub mod trace;

pub use client::{ClientFault, NetClient, NetFence, NetStore};
pub use run::{BeliefRule, RunReport, Scenario, run_seed, run_seeds};
pub use server::Server;
pub use trace::{Event, EventKind, Trace};
