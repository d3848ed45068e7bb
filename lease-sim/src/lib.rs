//! # lease-sim
//!
//! x

pub mod client;
pub mod protocol;
pub mod run;
pub mod server;
pub mod trace;

pub use client::{ClientFault, NetClient, NetFence, NetStore};
pub use run::{BeliefRule, RunReport, Scenario, run_seed, run_seeds};
pub use server::Server;
pub use trace::{Event, EventKind, Trace};
