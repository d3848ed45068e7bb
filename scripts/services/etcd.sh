#!/usr/bin/env bash
# etcd.sh start|stop: a single etcd member on free loopback ports, data under the state dir.
# Tests that need restarts or a three-member cluster start their own members with the same binary.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
D=$STATE_DIR/etcd
alive() { [ -f "$D/pid" ] && kill -0 "$(cat "$D/pid")" 2>/dev/null; }
case "${1:-start}" in
start)
  need_pkgs etcd-server etcd-client protobuf-compiler curl
  if alive && [ -f "$STATE_DIR/etcd.env" ]; then log "etcd already running"; exit 0; fi
  rm -rf "$D"; mkdir -p "$D"
  CPORT=$(free_port "${LEASE_ETCD_PORT:-23790}")
  PPORT=$(free_port $((CPORT + 1)))
  log "starting etcd on 127.0.0.1:$CPORT"
  nohup /usr/bin/etcd --name lease-test --data-dir "$D/data" \
    --listen-client-urls "http://127.0.0.1:$CPORT" --advertise-client-urls "http://127.0.0.1:$CPORT" \
    --listen-peer-urls "http://127.0.0.1:$PPORT" --initial-advertise-peer-urls "http://127.0.0.1:$PPORT" \
    --initial-cluster "lease-test=http://127.0.0.1:$PPORT" \
    --heartbeat-interval 50 --election-timeout 500 \
    >"$D/etcd.log" 2>&1 </dev/null &
  echo $! > "$D/pid"
  touch "$STATE_DIR/etcd.started"
  wait_until 30 sh -c "curl -sf http://127.0.0.1:$CPORT/health | grep -q true" \
    || { tail -n 20 "$D/etcd.log" >&2; die "etcd did not become healthy"; }
  echo "export LEASE_ETCD_ENDPOINTS=http://127.0.0.1:$CPORT" > "$STATE_DIR/etcd.env"
  log "etcd ready on 127.0.0.1:$CPORT"
  ;;
stop)
  # stop only what this script started (not a member that was already running)
  [ -f "$STATE_DIR/etcd.started" ] || exit 0
  rm -f "$STATE_DIR/etcd.started"
  if alive; then kill "$(cat "$D/pid")"; wait_until 20 sh -c "! kill -0 $(cat "$D/pid")" || kill -9 "$(cat "$D/pid")" || true; log "stopped etcd"; fi
  rm -f "$D/pid" "$STATE_DIR/etcd.env"
  ;;
esac
