//! The leasehold-testkit suite over TLS against the member of `scripts/services/etcd-tls.sh`, the
//! store authenticated by its client certificate alone (all TLS files in the URL), plus the cases
//! in which TLS or authentication must fail with a typed error. See `tls_support.rs`.

mod tls_support;

fn main() {
    leasehold_testkit::run_with(
        tls_support::EtcdTls(tls_support::Auth::Certificate),
        tls_support::refusals(),
    )
}
