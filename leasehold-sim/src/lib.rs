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
mod clock;
pub mod protocol;
pub mod run;
pub mod server;
pub mod trace;

pub use client::{ClientFault, NetClient, NetFence, NetStore};
pub use run::{BeliefRule, Coverage, RunReport, Scenario, Search, find_seed, run_seed, run_seeds};
pub use server::{Server, ServerFault};
pub use trace::{Event, EventKind, Trace};
