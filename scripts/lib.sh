# Shared helpers for the service scripts. Source it; do not run it.
log() { echo "[lease-test $(date -u +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=${APT_UPDATED:-0}
apt_update_once() { [ "$APT_UPDATED" = 1 ] || { log "apt-get update"; apt-get update -qq >/dev/null; APT_UPDATED=1; }; }
# need_pkgs PKG...: install the Debian packages that are not installed yet.
need_pkgs() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    apt_update_once
    log "apt-get install ${missing[*]}"
    apt-get install -y -qq "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
  fi
}
# port_busy PORT: some TCP socket holds PORT on this host. A port can be taken without listening:
# the local end of an outgoing connection (ports 32768-60999 here) refuses connections but cannot
# be bound, so `ss` (iproute2) is asked first; the connect check is the fallback without it.
port_busy() {
  if command -v ss >/dev/null 2>&1; then
    [ -n "$(ss -Htan "sport = :$1" 2>/dev/null)" ]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}
# free_port START: the first free loopback port at or above START.
free_port() {
  local p=$1
  while port_busy "$p"; do p=$((p + 1)); done
  echo "$p"
}
# wait_until SECONDS CMD...: run CMD every 100 ms until it succeeds or SECONDS pass.
wait_until() {
  local secs=$1; shift
  local i
  for i in $(seq 1 $((secs * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
STATE_DIR=${LEASE_STATE_DIR:-/tmp/lease-test}
mkdir -p "$STATE_DIR"
