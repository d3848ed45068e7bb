#!/usr/bin/env bash
# test.sh: the one command that runs every test of the workspace against real services.
#
# Installs what a fresh Debian machine lacks (apt packages), starts every service the tests need
# on loopback when it is not already running (PostgreSQL, Redis, etcd, kube-apiserver), exports
# their addresses, checks formatting, clippy (-D warnings) and rustdoc (-D warnings), runs the tests
# with LEASE_TEST_REQUIRE=1 (a missing backend fails loudly), and
# stops what it started.
#
#   LEASE_STATE_DIR   where service data, logs and env files go (default /tmp/lease-test)
#   LEASE_SERVICES    which services to start (default "postgres redis etcd k8s")
#   extra arguments   passed to `cargo test` (for example `-p lease-redis`)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SERVICES=${LEASE_SERVICES:-postgres redis etcd k8s}
STARTED=()
cleanup() {
  local s
  for s in "${STARTED[@]}"; do bash "scripts/services/$s.sh" stop || true; done
}
trap cleanup EXIT

need_pkgs build-essential pkg-config protobuf-compiler curl ca-certificates
command -v cargo >/dev/null || die "cargo is not installed"
for s in $SERVICES; do
  [ -f "scripts/services/$s.sh" ] || die "no service script scripts/services/$s.sh"
  STARTED+=("$s")
  bash "scripts/services/$s.sh" start
  # shellcheck disable=SC1090
  [ -f "$STATE_DIR/$s.env" ] && . "$STATE_DIR/$s.env"
done

export LEASE_TEST_REQUIRE=1
export RUST_BACKTRACE=1
# Hygiene first: formatting, lints and docs fail the run before any test does.
log "cargo fmt --all --check"
cargo fmt --all --check
log "cargo clippy --workspace --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings
log "cargo doc --workspace --all-features --no-deps (RUSTDOCFLAGS=-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps
log "cargo test --workspace --all-targets $*"
cargo test --workspace --all-targets --exclude lease-examples "$@"
# The examples crate with every backend feature, so each example runs against each backend it names.
log "cargo test -p lease-examples --all-features"
cargo test -p lease-examples --all-features --all-targets "$@"
log "cargo test --workspace --doc"
cargo test --workspace --doc "$@"
