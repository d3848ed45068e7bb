#!/usr/bin/env bash
# lean.sh: what users compile stays what they use.
#
#   1. cargo machete: no crate of the workspace declares a dependency its code never names (a
#      justified exception is listed in that crate's `[package.metadata.cargo-machete] ignored`,
#      with the reason beside it).
#   2. cargo check -p leasehold --lib: the facade builds with no feature, with each feature alone
#      and with all of them, so no backend relies on a dependency or feature that only another
#      backend brings in. `-p` resolves features for the facade alone (resolver 2), and a `--lib`
#      check builds no dev-dependency, so nothing else of the workspace lends it a feature.
#
# Installs cargo-machete (a pinned version, `cargo install --locked`, into ~/.cargo/bin) when it
# is missing or at another version: about a minute from source on two cores. The checks take
# about a second (machete) and a few minutes (the backends' dependencies when not built yet).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

MACHETE_VERSION=0.9.2

# need_tool BIN CRATE VERSION: cargo-install CRATE@VERSION unless `cargo BIN --version` names it.
need_tool() {
  local sub=${1#cargo-}
  if ! cargo "$sub" --version 2>/dev/null | grep -qF "$3"; then
    log "cargo install --locked $2@$3"
    cargo install --locked "$2@$3"
  fi
}
need_tool cargo-machete cargo-machete "$MACHETE_VERSION"

log "cargo machete"
cargo machete

# k8s-openapi refuses to build without a Kubernetes API version, which a library must not pick
# (an application does, through a `k8s-openapi/v1_xx` feature): the `k8s` feature alone builds
# with the version given the way cargo package is given it in scripts/test.sh.
export K8S_OPENAPI_ENABLED_VERSION=1.33
features=$(sed -n '/^\[features\]/,/^\[/s/^\([a-z][a-z0-9_-]*\) = .*/\1/p' leasehold/Cargo.toml | grep -v '^default$')
[ -n "$features" ] || die "no features found in leasehold/Cargo.toml"
log "cargo check -p leasehold --lib: no feature, each of: $(echo $features), all"
cargo check -q -p leasehold --lib --no-default-features
for f in $features; do
  cargo check -q -p leasehold --lib --no-default-features --features "$f"
done
cargo check -q -p leasehold --lib --all-features
