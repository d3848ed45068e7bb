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
#   LEASE_SERVICES    which services to start (default: all of ALL_SERVICES below)
#   BACKEND...        leading backend names (postgres redis etcd k8s sqlite mysql) run only those
#                     backends' crates and start only their services, skipping the workspace-wide
#                     steps: `bash scripts/test.sh redis` runs leasehold-redis's tests on its servers
#   extra arguments   passed to `cargo test` (for example a test name filter)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ALL_SERVICES="certs postgres postgres-tls redis redis-cluster redis-tls redis-tls-cluster redis-sentinel etcd etcd-tls k8s mariadb"
# The services each backend's own tests need.
backend_services() {
  case "$1" in
    postgres) echo "certs postgres postgres-tls" ;;
    redis) echo "certs redis redis-cluster redis-tls redis-tls-cluster redis-sentinel" ;;
    etcd) echo "certs etcd etcd-tls" ;;
    k8s) echo "k8s" ;;
    sqlite) echo "" ;;
    mysql) echo "mariadb" ;;
    *) return 1 ;;
  esac
}
BACKENDS=()
while [ $# -gt 0 ] && backend_services "$1" >/dev/null; do BACKENDS+=("$1"); shift; done
# `cargo test --workspace -p X` ignores -p and runs everything: refuse it instead of running the
# whole workspace while the caller believes one crate ran.
for a in "$@"; do
  case "$a" in
    -p|--package|-p*|--package=*) die "select backends by name (scripts/test.sh redis etcd), not with $a" ;;
  esac
done
if [ ${#BACKENDS[@]} -gt 0 ]; then
  wanted=""
  for b in "${BACKENDS[@]}"; do wanted="$wanted $(backend_services "$b")"; done
  # One start per service, in the order of the full list.
  SERVICES=""
  for s in $ALL_SERVICES; do case " $wanted " in *" $s "*) SERVICES="$SERVICES $s" ;; esac; done
  SERVICES=${LEASE_SERVICES:-$SERVICES}
else
  SERVICES=${LEASE_SERVICES:-$ALL_SERVICES}
fi
STARTED=()
cleanup() {
  local s
  # A run that fails before the tests leaves no apiserver build behind.
  [ -z "${K8S_BUILD_PID:-}" ] || kill "$K8S_BUILD_PID" 2>/dev/null || true
  for s in "${STARTED[@]}"; do bash "scripts/services/$s.sh" stop || true; done
}
trap cleanup EXIT

# iproute2: `ss`, with which scripts/lib.sh tells a free port from one taken by a connection.
need_pkgs build-essential pkg-config protobuf-compiler curl ca-certificates iproute2
# leasehold-cli/tests/generate.rs: each completion script is syntax-checked by its shell, each man
# page rendered by groff.
need_pkgs zsh fish groff-base
# leasehold-faults: holders under libfaketime (skewed and stepped wall clocks), the resource's
# record read back with psql, sqlite3, the mariadb client and redis-cli (Redis's replication stream).
need_pkgs faketime postgresql-client sqlite3 redis-tools mariadb-client
command -v cargo >/dev/null || die "cargo is not installed"
start_service() {
  [ -f "scripts/services/$1.sh" ] || die "no service script scripts/services/$1.sh"
  STARTED+=("$1")
  bash "scripts/services/$1.sh" start
  if [ -f "$STATE_DIR/$1.env" ]; then
    # shellcheck disable=SC1090
    . "$STATE_DIR/$1.env"
  fi
}
# On a full run, the kube-apiserver's compile (about 11 minutes on a machine without the cached
# binary) runs in the background while the other services start and the hygiene steps below
# build; its apt work is done first, while nothing else installs packages. The apiserver starts
# right before the tests.
K8S_BUILD_PID=""
if [ ${#BACKENDS[@]} -eq 0 ] && [[ " $SERVICES " == *" k8s "* ]]; then
  bash scripts/services/k8s.sh prepare
  log "kube-apiserver build in the background (log: $STATE_DIR/k8s-build.log)"
  mkdir -p "$STATE_DIR"
  bash scripts/services/k8s.sh build > "$STATE_DIR/k8s-build.log" 2>&1 &
  K8S_BUILD_PID=$!
fi
for s in $SERVICES; do
  [ "$s" = k8s ] && [ -n "$K8S_BUILD_PID" ] && continue
  start_service "$s"
done
# k8s_up: waits for the background build, then starts the apiserver.
k8s_up() {
  [ -n "$K8S_BUILD_PID" ] || return 0
  log "waiting for the kube-apiserver build"
  wait "$K8S_BUILD_PID" || { tail -n 40 "$STATE_DIR/k8s-build.log" >&2; die "the kube-apiserver build failed"; }
  K8S_BUILD_PID=""
  start_service k8s
}

export LEASE_TEST_REQUIRE=1
export RUST_BACKTRACE=1
if [ ${#BACKENDS[@]} -gt 0 ]; then
  for b in "${BACKENDS[@]}"; do
    log "cargo test -p leasehold-$b --all-targets --all-features $*"
    cargo test -p "leasehold-$b" --all-targets --all-features "$@"
  done
  exit 0
fi
# A full run builds some 10 GB under target/: say up front when the disk cannot hold it (one CI
# run died linking, out of space), instead of failing in the middle of a link.
mkdir -p "${CARGO_TARGET_DIR:-target}"
free_kb=$(df -Pk "${CARGO_TARGET_DIR:-target}" | awk 'NR==2 {print $4}')
log "free disk where target/ lives: $((free_kb / 1024 / 1024)) GiB"
[ "$free_kb" -ge $((12 * 1024 * 1024)) ] || die "less than 12 GiB free for target/: free space or set CARGO_TARGET_DIR"
# Hygiene first: formatting, lints and docs fail the run before any test does.
log "cargo fmt --all --check"
cargo fmt --all --check
log "cargo clippy --workspace --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings
# No unused dependency, and the facade builds with each feature alone (scripts/lean.sh).
log "bash scripts/lean.sh"
bash scripts/lean.sh
log "cargo doc --workspace --all-features --no-deps (RUSTDOCFLAGS=-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps
# Every publishable crate packages and builds from its .crate file alone. The crates depend on
# each other by path+version and are not on crates.io: `--workspace` packages them against a
# local overlay registry of each other. leasehold-k8s's own build needs a Kubernetes API version for
# k8s-openapi (a library must not pick one; an application does). --allow-dirty: a local run with
# uncommitted edits checks what is in the working tree.
log "cargo package --workspace (publishable crates)"
# A previous run's unpacked .crate sources would be reused as they are (cargo does not re-extract
# a registry source it already unpacked), so packaging always starts from an empty directory.
rm -rf "${CARGO_TARGET_DIR:-target}/package"
# ...and cargo unpacks the overlay's .crate files under $CARGO_HOME/registry/src/-<hash>/ (a
# directory named after the overlay, not crates.io), also without re-extracting an unchanged
# version: a local rerun would verify against an earlier run's sources of our own crates.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/lease*-0.*
# Cargo also treats registry crates as immutable and reuses their compiled artifacts, so drop
# every artifact built from the overlay's sources (named in the dep-info files).
for d in "${CARGO_TARGET_DIR:-target}"/debug/deps/*.d; do
  [ -e "$d" ] && grep -q '/registry/src/-[^/]*/lease' "$d" || continue
  h=$(basename "$d" .d); h=${h##*-}
  rm -rf "${CARGO_TARGET_DIR:-target}"/debug/deps/*-"$h".* "${CARGO_TARGET_DIR:-target}"/debug/.fingerprint/*-"$h"
done
K8S_OPENAPI_ENABLED_VERSION=1.33 cargo package --workspace --locked --allow-dirty \
  --exclude leasehold-examples --exclude leasehold-bench --exclude leasehold-faults --exclude leasehold-model --exclude leasehold-sim --exclude leasehold-mutants
# The MSRV the manifests state (workspace rust-version) builds what users build.
MSRV=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$MSRV" ] || die "no rust-version in Cargo.toml"
command -v rustup >/dev/null || die "rustup is needed for the MSRV check (toolchain $MSRV)"
# The promise is to users: the publishable crates' libraries and the `lease` binary, with every
# feature. Tests, benches and the unpublished tooling crates build with the stable toolchain
# only: a user never compiles them, and checking each of their targets again was a second check
# of the whole workspace in every run.
log "MSRV $MSRV: cargo +$MSRV check --lib --bins --all-features (publishable crates)"
rustup toolchain install "$MSRV" --profile minimal >/dev/null
cargo +"$MSRV" check --workspace --lib --bins --all-features --locked \
  --exclude leasehold-examples --exclude leasehold-bench --exclude leasehold-faults --exclude leasehold-model --exclude leasehold-sim --exclude leasehold-mutants
k8s_up
log "cargo test --workspace --all-targets $*"
cargo test --workspace --all-targets --exclude leasehold-examples "$@"
# The examples crate with every backend feature, so each example runs against each backend it names.
log "cargo test -p leasehold-examples --all-features"
cargo test -p leasehold-examples --all-features --all-targets "$@"
log "cargo test --workspace --doc"
cargo test --workspace --doc "$@"
# The deterministic simulation's many seeds, in an optimised build (profile `sim`, target/sim).
# `--cfg tokio_unstable` lets turmoil seed each host's tokio runtime, so the choice a `select!`
# makes among ready branches comes from the seed too and a failing seed replays exactly (without
# it, about 3 in 100 seeds replay differently).
log "RUSTFLAGS='--cfg tokio_unstable' LEASE_SIM_SEEDS=5000 cargo test --profile sim -p leasehold-sim --test sim -- seeds"
RUSTFLAGS="--cfg tokio_unstable" LEASE_SIM_SEEDS=5000 cargo test --profile sim -p leasehold-sim --test sim -- seeds
# A rotating sample of the protocol mutants (the full run writes docs/mutants.md): two mutants
# chosen by the commit hash, each run through its backend's test targets against the real server,
# after the control and the unmutated suites of the sampled backends. The run fails if a sampled
# mutant survives without an explanation or its switch point is not reached.
log "cargo run -p leasehold-mutants -- --sample 2 --no-faults"
cargo run -p leasehold-mutants -- --sample 2 --no-faults
