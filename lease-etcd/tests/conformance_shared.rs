//! The lease-testkit suite, plus etcd's renewal, waiting, interop and sharing cases, with one
//! etcd lease per (store, TTL) ([`LeaseSharing::PerTtl`]). Environment as in `conformance.rs`.

#[allow(dead_code)] // shared with conformance.rs, which uses other parts
mod etcd;

use lease_etcd::LeaseSharing;

fn main() {
    let sharing = LeaseSharing::PerTtl;
    lease_testkit::run_with(etcd::Etcd::new(sharing), etcd::cases(sharing));
}
