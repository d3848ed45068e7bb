//! The leasehold-testkit suite plus the etcd case files' cases for shared etcd leases: one etcd
//! lease per (store, TTL) ([`LeaseSharing::PerTtl`]). Environment as in `main.rs`.

#![allow(dead_code)] // the helpers are shared by both targets, which use different parts

mod abandoned;
mod batch;
mod cluster;
mod failover;
mod guards;
mod input;
mod interop;
mod options;
mod release;
mod renewal;
mod shards;
mod sharing;
mod support;

use leasehold_etcd::LeaseSharing;
pub(crate) use support::{endpoints, etcd_url, options, url, wait_and_acquire};

fn main() {
    support::run(LeaseSharing::PerTtl)
}
