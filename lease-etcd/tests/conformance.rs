//! The lease-testkit suite, plus etcd's own cases, against a real etcd, with one etcd lease per
//! grant ([`LeaseSharing::PerGrant`], the default).
//!
//! `LEASE_ETCD_ENDPOINTS` (comma-separated, default `http://127.0.0.1:23790`) names the shared
//! member. The failure cases start their own members with `/usr/bin/etcd` (or `LEASE_ETCD_BIN`)
//! on free loopback ports; the interop cases run `/usr/bin/etcdctl` (or `LEASE_ETCDCTL_BIN`).

#[allow(dead_code)] // shared with conformance_shared.rs, which uses other parts
mod etcd;

use lease_etcd::LeaseSharing;

fn main() {
    let sharing = LeaseSharing::PerGrant;
    lease_testkit::run_with(etcd::Etcd::new(sharing), etcd::cases(sharing));
}
