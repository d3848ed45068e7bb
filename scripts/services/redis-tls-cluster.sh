#!/usr/bin/env bash
# redis-tls-cluster.sh start|stop: a Redis Cluster of 3 masters and 3 replicas that speaks only
# TLS (clients, the cluster bus and replication: --tls-cluster yes, --tls-replication yes) on
# 127.0.0.1 ports BASE..BASE+5 (LEASE_REDIS_TLS_CLUSTER_PORT, default 7201), with the test PKI of
# certs.sh (client certificates optional). Writes $STATE_DIR/redis-tls-cluster.env exporting
#   LEASE_REDIS_TLS_CLUSTER_URL  rediss+cluster://127.0.0.1:p1,...,127.0.0.1:p6?tls_ca=<pki>/ca.crt
#   LEASE_TLS_DIR                the PKI directory
# Idempotent: a cluster that already reports cluster_state:ok is left alone.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
BASE=${LEASE_REDIS_TLS_CLUSTER_PORT:-7201}
PORTS=$(seq "$BASE" $((BASE + 5)))
DIR="$STATE_DIR/redis-tls-cluster"
PKI="$STATE_DIR/pki"
cli() { redis-cli --tls --cacert "$PKI/ca.crt" -h 127.0.0.1 -p "$1" "${@:2}"; }
node_up() { cli "$1" ping | grep -q PONG; }
cluster_ok() {
  local p
  for p in $PORTS; do cli "$p" cluster info 2>/dev/null | grep -q "cluster_state:ok" || return 1; done
  [ "$(cli "$BASE" cluster nodes | grep -vc fail)" -ge 6 ]
}
case "${1:-start}" in
start)
  need_pkgs redis-server redis-tools
  bash "$(dirname "$0")/certs.sh" start
  mkdir -p "$DIR"
  if ! cluster_ok 2>/dev/null; then
    for p in $PORTS; do
      if ! node_up "$p" 2>/dev/null; then
        log "starting TLS cluster node on $p"
        mkdir -p "$DIR/$p"
        rm -f "$DIR/$p/nodes.conf" "$DIR/$p/dump.rdb"
        redis-server --daemonize yes --bind 127.0.0.1 --port 0 --tls-port "$p" \
          --tls-cert-file "$PKI/server.crt" --tls-key-file "$PKI/server.key" \
          --tls-ca-cert-file "$PKI/ca.crt" --tls-auth-clients optional \
          --tls-cluster yes --tls-replication yes \
          --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
          --save "" --appendonly no \
          --dir "$DIR/$p" --pidfile "$DIR/$p/redis.pid" --logfile "$DIR/$p/redis.log"
        echo "$p" >> "$DIR/started"
      fi
    done
    for p in $PORTS; do wait_until 20 node_up "$p" || die "TLS cluster node $p did not start"; done
    if ! cluster_ok 2>/dev/null; then
      for p in $PORTS; do cli "$p" flushall >/dev/null 2>&1 || true; cli "$p" cluster reset hard >/dev/null; done
      log "creating the TLS cluster (3 masters, 3 replicas)"
      # shellcheck disable=SC2046
      redis-cli --tls --cacert "$PKI/ca.crt" --cluster create \
        $(for p in $PORTS; do printf '127.0.0.1:%s ' "$p"; done) \
        --cluster-replicas 1 --cluster-yes >"$DIR/create.log" 2>&1 || { cat "$DIR/create.log" >&2; die "redis-cli --cluster create failed"; }
      wait_until 60 cluster_ok || die "the TLS cluster did not reach cluster_state:ok"
    fi
  fi
  {
    echo "export LEASE_REDIS_TLS_CLUSTER_URL='rediss+cluster://$(for p in $PORTS; do printf '127.0.0.1:%s,' "$p"; done | sed 's/,$//')?tls_ca=$PKI/ca.crt'"
    echo "export LEASE_TLS_DIR=$PKI"
  } > "$STATE_DIR/redis-tls-cluster.env"
  log "TLS Redis Cluster ready on 127.0.0.1:$BASE..$((BASE + 5))"
  ;;
stop)
  if [ -f "$DIR/started" ]; then
    for p in $(sort -u "$DIR/started"); do cli "$p" shutdown nosave >/dev/null 2>&1 || true; done
    rm -f "$DIR/started"
    log "stopped the TLS Redis Cluster"
  fi
  ;;
esac
