//! The etcd backend's tests: the leasehold-testkit suite plus etcd's own cases (one file each,
//! registering its cases with `cases(sharing)`), against a real etcd, with one etcd lease per
//! grant ([`LeaseSharing::PerGrant`], the default). `per_ttl.rs` runs the same files with shared
//! etcd leases.
//!
//! `LEASE_ETCD_ENDPOINTS` (comma-separated, default `http://127.0.0.1:23790`) names the shared
//! member. The failure cases start their own members with `/usr/bin/etcd` (or `LEASE_ETCD_BIN`)
//! on free loopback ports; the interop cases run `/usr/bin/etcdctl` (or `LEASE_ETCDCTL_BIN`).

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
    support::run(LeaseSharing::PerGrant)
}
