//! The leasehold-testkit suite over TLS against the member of `scripts/services/etcd-tls.sh`, the
//! store authenticated as a user with a password (TLS files and credentials through
//! `EtcdOptions`). See `tls_support.rs`.

#![allow(dead_code)] // the refusal cases run in the `etcd_tls` target

mod tls_support;

fn main() {
    leasehold_testkit::run(tls_support::EtcdTls(tls_support::Auth::Password))
}
