#!/usr/bin/env bash
# lean.sh: what users compile stays what they use.
#
#   1. cargo machete: no crate of the workspace declares a dependency its code never names (a
#      justified exception is listed in that crate's `[package.metadata.cargo-machete] ignored`,
#      with the reason beside it).
#   2. cargo hack check -p leasehold --each-feature --no-dev-deps: the facade builds with no
#      feature, with each feature alone, and with all of them, so no backend relies on a
#      dependency or feature that only another backend brings in.
#
# Installs cargo-machete and cargo-hack (pinned versions, `cargo install --locked`, into
# ~/.cargo/bin, which a CI cache keeps) when they are missing or at another version. Building both
# from source takes some 2-4 minutes on two cores; the checks themselves take about a second
# (machete) and a few minutes (hack, mostly the backends' dependencies when not built yet).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

MACHETE_VERSION=0.9.2
HACK_VERSION=0.6.46

# need_tool BIN CRATE VERSION: cargo-install CRATE@VERSION unless `cargo BIN --version` names it.
need_tool() {
  local sub=${1#cargo-}
  if ! cargo "$sub" --version 2>/dev/null | grep -qF "$3"; then
    log "cargo install --locked $2@$3"
    cargo install --locked "$2@$3"
  fi
}
need_tool cargo-machete cargo-machete "$MACHETE_VERSION"
need_tool cargo-hack cargo-hack "$HACK_VERSION"

log "cargo machete"
cargo machete

# k8s-openapi refuses to build without a Kubernetes API version, which a library must not pick
# (an application does, through a `k8s-openapi/v1_xx` feature): the `k8s` feature alone builds
# with the version given the way cargo package is given it in scripts/test.sh.
# --no-dev-deps: cargo-hack removes the [dev-dependencies] of leasehold/Cargo.toml while it runs
# and restores the file when it ends (also on Ctrl-C), so nobody should edit that file meanwhile.
log "cargo hack check -p leasehold --each-feature --no-dev-deps"
K8S_OPENAPI_ENABLED_VERSION=1.33 cargo hack check -p leasehold --each-feature --no-dev-deps
