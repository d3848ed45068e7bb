#!/usr/bin/env bash
# redis-cluster.sh start|stop: make sure a Redis Cluster of 3 masters and 3 replicas answers on
# 127.0.0.1 ports BASE..BASE+5 (default 7101..7106), and write its URL to
# $STATE_DIR/redis-cluster.env as LEASE_TEST_REDIS_CLUSTER_URL (redis+cluster://h:p,h:p,...).
# Idempotent: a cluster that already reports cluster_state:ok is left alone. The failover test
# promotes replicas (CLUSTER FAILOVER), so which node is a master changes; that is fine.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
BASE=${LEASE_REDIS_CLUSTER_PORT:-7101}
PORTS=$(seq "$BASE" $((BASE + 5)))
DIR="$STATE_DIR/redis-cluster"
cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }
node_up() { cli "$1" ping | grep -q PONG; }
cluster_ok() {
  local p
  for p in $PORTS; do cli "$p" cluster info 2>/dev/null | grep -q "cluster_state:ok" || return 1; done
  # every node knows all six
  [ "$(cli "$BASE" cluster nodes | grep -vc fail)" -ge 6 ]
}
case "${1:-start}" in
start)
  need_pkgs redis-server redis-tools
  mkdir -p "$DIR"
  if ! cluster_ok 2>/dev/null; then
    for p in $PORTS; do
      if ! node_up "$p" 2>/dev/null; then
        log "starting cluster node on $p"
        mkdir -p "$DIR/$p"
        # a stale nodes.conf from an earlier cluster would make the node refuse to join a new one
        rm -f "$DIR/$p/nodes.conf" "$DIR/$p/dump.rdb"
        redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --cluster-enabled yes \
          --cluster-config-file nodes.conf --cluster-node-timeout 2000 --save "" --appendonly no \
          --dir "$DIR/$p" --pidfile "$DIR/$p/redis.pid" --logfile "$DIR/$p/redis.log"
        echo "$p" >> "$DIR/started"
      fi
    done
    for p in $PORTS; do wait_until 20 node_up "$p" || die "cluster node $p did not start"; done
    if ! cluster_ok 2>/dev/null; then
      # fresh nodes: reset any half-made cluster, then create it
      for p in $PORTS; do cli "$p" flushall >/dev/null 2>&1 || true; cli "$p" cluster reset hard >/dev/null; done
      log "creating the cluster (3 masters, 3 replicas)"
      # shellcheck disable=SC2046
      redis-cli --cluster create $(for p in $PORTS; do printf '127.0.0.1:%s ' "$p"; done) \
        --cluster-replicas 1 --cluster-yes >"$DIR/create.log" 2>&1 || { cat "$DIR/create.log" >&2; die "redis-cli --cluster create failed"; }
      wait_until 60 cluster_ok || die "the cluster did not reach cluster_state:ok"
    fi
  fi
  echo "export LEASE_TEST_REDIS_CLUSTER_URL=redis+cluster://$(for p in $PORTS; do printf '127.0.0.1:%s,' "$p"; done | sed 's/,$//')" > "$STATE_DIR/redis-cluster.env"
  log "Redis Cluster ready on 127.0.0.1:$BASE..$((BASE + 5))"
  ;;
stop)
  if [ -f "$DIR/started" ]; then
    for p in $(sort -u "$DIR/started"); do cli "$p" shutdown nosave >/dev/null 2>&1 || true; done
    rm -f "$DIR/started"
    log "stopped the Redis Cluster"
  fi
  ;;
esac
