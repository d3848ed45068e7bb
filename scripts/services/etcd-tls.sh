#!/usr/bin/env bash
# etcd-tls.sh start|stop: a single etcd member that speaks TLS only and requires a client
# certificate signed by the test CA, with authentication enabled, on free loopback ports; and a
# second throwaway member whose server certificate has expired. Uses the test PKI of certs.sh
# (started here if needed). The plain member of etcd.sh is never touched.
#
#   users: root (password "lease-root-secret"); lease-client (no password: a client certificate
#   with CN lease-client authenticates as it); lease-pw (password "lease-pw-secret"). Both
#   lease users have role lease-rw: read and write on every key.
#
# start writes $STATE_DIR/etcd-tls.env, which exports
#   LEASE_ETCD_TLS_ENDPOINTS          host:port of the TLS member
#   LEASE_ETCD_TLS_EXPIRED_ENDPOINTS  host:port of the member with the expired certificate
#   LEASE_ETCD_TLS_USER / LEASE_ETCD_TLS_PASSWORD   the password user
#   LEASE_ETCD_TLS_DIR                the PKI (ca.crt, client.crt/key, other-ca.crt, ...)
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
D=$STATE_DIR/etcd-tls
PKI=$STATE_DIR/pki
ROOT_PASSWORD=lease-root-secret
PASSWORD=lease-pw-secret
alive() { [ -f "$D/$1.pid" ] && kill -0 "$(cat "$D/$1.pid")" 2>/dev/null; }

# member NAME CERT KEY CLIENT-PORT PEER-PORT: starts one member in the background.
member() {
  local name=$1 cert=$2 key=$3 cport=$4 pport=$5
  mkdir -p "$D/$name"
  setsid nohup /usr/bin/etcd --name "$name" --data-dir "$D/$name/data" \
    --listen-client-urls "https://127.0.0.1:$cport" --advertise-client-urls "https://127.0.0.1:$cport" \
    --cert-file "$cert" --key-file "$key" --client-cert-auth --trusted-ca-file "$PKI/ca.crt" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "$name=http://127.0.0.1:$pport" \
    --heartbeat-interval 50 --election-timeout 500 \
    >"$D/$name/etcd.log" 2>&1 </dev/null &
  echo $! > "$D/$name.pid"
}

ctl() {
  ETCDCTL_API=3 /usr/bin/etcdctl --endpoints "https://127.0.0.1:$CPORT" --cacert "$PKI/ca.crt" \
    --cert "$PKI/client.crt" --key "$PKI/client.key" "$@"
}

case "${1:-start}" in
start)
  need_pkgs etcd-server etcd-client curl
  if alive main && alive expired && [ -f "$STATE_DIR/etcd-tls.env" ]; then log "etcd-tls already running"; exit 0; fi
  bash "$(dirname "$0")/certs.sh" start
  for m in main expired; do alive "$m" && kill "$(cat "$D/$m.pid")" || true; done
  rm -rf "$D"; mkdir -p "$D"
  CPORT=$(free_port "${LEASE_ETCD_TLS_PORT:-23890}")
  PPORT=$(free_port $((CPORT + 1)))
  XPORT=$(free_port $((PPORT + 1)))
  XPPORT=$(free_port $((XPORT + 1)))
  log "starting TLS etcd on 127.0.0.1:$CPORT (expired certificate on 127.0.0.1:$XPORT)"
  member main "$PKI/server.crt" "$PKI/server.key" "$CPORT" "$PPORT"
  member expired "$PKI/expired.crt" "$PKI/expired.key" "$XPORT" "$XPPORT"
  touch "$STATE_DIR/etcd-tls.started"
  wait_until 30 sh -c "curl -sf --cacert '$PKI/ca.crt' --cert '$PKI/client.crt' --key '$PKI/client.key' https://127.0.0.1:$CPORT/health | grep -q true" \
    || { tail -n 20 "$D/main/etcd.log" >&2; die "TLS etcd did not become healthy"; }
  # The expired member cannot pass a verifying health check: wait until it listens.
  wait_until 30 sh -c "curl -sfk --cert '$PKI/client.crt' --key '$PKI/client.key' https://127.0.0.1:$XPORT/health | grep -q true" \
    || { tail -n 20 "$D/expired/etcd.log" >&2; die "the expired-certificate etcd did not start"; }
  ctl user add "root:$ROOT_PASSWORD" >/dev/null
  ctl user grant-role root root >/dev/null
  ctl role add lease-rw >/dev/null
  ctl role grant-permission lease-rw readwrite --from-key '' >/dev/null
  ctl user add lease-client --no-password >/dev/null
  ctl user add "lease-pw:$PASSWORD" >/dev/null
  ctl user grant-role lease-client lease-rw >/dev/null
  ctl user grant-role lease-pw lease-rw >/dev/null
  ctl auth enable >/dev/null
  ctl --user "lease-pw:$PASSWORD" put lease-tls-check ok >/dev/null || die "the password user cannot write"
  ctl put lease-tls-check ok >/dev/null || die "the certificate user cannot write"
  ! ctl --user "lease-pw:wrong" get lease-tls-check >/dev/null 2>&1 || die "auth is not enabled"
  cat > "$STATE_DIR/etcd-tls.env" <<EOF
export LEASE_ETCD_TLS_ENDPOINTS=127.0.0.1:$CPORT
export LEASE_ETCD_TLS_EXPIRED_ENDPOINTS=127.0.0.1:$XPORT
export LEASE_ETCD_TLS_USER=lease-pw
export LEASE_ETCD_TLS_PASSWORD=$PASSWORD
export LEASE_ETCD_TLS_DIR=$PKI
EOF
  log "TLS etcd ready on 127.0.0.1:$CPORT (auth enabled)"
  ;;
stop)
  # stop only what this script started
  [ -f "$STATE_DIR/etcd-tls.started" ] || exit 0
  rm -f "$STATE_DIR/etcd-tls.started"
  for m in main expired; do
    if alive "$m"; then
      pid=$(cat "$D/$m.pid"); kill "$pid"
      wait_until 20 sh -c "! kill -0 $pid" || kill -9 "$pid" || true
    fi
    rm -f "$D/$m.pid"
  done
  rm -f "$STATE_DIR/etcd-tls.env"
  log "stopped TLS etcd"
  ;;
esac
