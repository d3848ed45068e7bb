#!/usr/bin/env bash
# redis-sentinel.sh start|stop: a master, one replica and three sentinels on free loopback ports
# (from LEASE_REDIS_SENTINEL_PORT, default 6480: master, replica; sentinels from 26480), the master
# monitored as `lease-master` with quorum 2 and a short down-after (1 s) so a failover takes a few
# seconds. Writes $STATE_DIR/redis-sentinel.env exporting
#   LEASE_REDIS_SENTINEL_URL   redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/lease-master
# Idempotent: a group whose sentinels answer is left alone. The failover test promotes the replica
# (SENTINEL FAILOVER), so which server is the master changes; that is fine.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
DIR="$STATE_DIR/redis-sentinel"
NAME=lease-master
sentinel() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }
field() { # field SENTINEL-PORT NAME: a field of SENTINEL MASTER
  sentinel "$1" sentinel master "$NAME" 2>/dev/null | awk -v f="$2" 'prev == f { print; exit } { prev = $0 }'
}
healthy() { # every sentinel knows the master, one replica and the two other sentinels
  local s
  for s in $(cat "$DIR/sentinels"); do
    [ "$(field "$s" num-slaves)" -ge 1 ] 2>/dev/null || return 1
    [ "$(field "$s" num-other-sentinels)" -ge 2 ] 2>/dev/null || return 1
    field "$s" flags | grep -qv 'o_down\|s_down' || return 1
  done
}
data_node() { # data_node PORT [redis-server args...]
  local p=$1; shift
  mkdir -p "$DIR/$p"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no \
    --notify-keyspace-events KEA --dir "$DIR/$p" --pidfile "$DIR/$p/redis.pid" \
    --logfile "$DIR/$p/redis.log" "$@"
  echo "$p" >> "$DIR/started"
}
case "${1:-start}" in
start)
  need_pkgs redis-server redis-tools
  mkdir -p "$DIR"
  if [ -f "$DIR/sentinels" ] && healthy 2>/dev/null; then
    log "Redis Sentinel group already running"
  else
    [ -f "$DIR/started" ] && "$0" stop
    rm -rf "${DIR:?}"/*
    base=${LEASE_REDIS_SENTINEL_PORT:-6480}
    master=$(free_port "$base")
    replica=$(free_port $((master + 1)))
    log "starting master $master and replica $replica"
    data_node "$master"
    data_node "$replica" --replicaof 127.0.0.1 "$master"
    wait_until 20 sentinel "$master" ping || die "master did not start"
    s=$((base + 20000))
    : > "$DIR/sentinels"
    for i in 1 2 3; do
      s=$(free_port "$s")
      mkdir -p "$DIR/s$s"
      cat > "$DIR/s$s/sentinel.conf" <<CONF
port $s
bind 127.0.0.1
daemonize yes
dir $DIR/s$s
pidfile $DIR/s$s/sentinel.pid
logfile $DIR/s$s/sentinel.log
sentinel monitor $NAME 127.0.0.1 $master 2
sentinel down-after-milliseconds $NAME 1000
sentinel failover-timeout $NAME 4000
sentinel parallel-syncs $NAME 1
CONF
      redis-server "$DIR/s$s/sentinel.conf" --sentinel
      echo "$s" >> "$DIR/sentinels"
      echo "$s" >> "$DIR/started"
      s=$((s + 1))
    done
    wait_until 60 healthy || die "the sentinels did not see the replica and each other"
  fi
  url="redis+sentinel://$(for s in $(cat "$DIR/sentinels"); do printf '127.0.0.1:%s,' "$s"; done | sed 's/,$//')/$NAME"
  echo "export LEASE_REDIS_SENTINEL_URL=$url" > "$STATE_DIR/redis-sentinel.env"
  log "Redis Sentinel ready: $url"
  ;;
stop)
  if [ -f "$DIR/started" ]; then
    for p in $(sort -u "$DIR/started"); do redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
    rm -f "$DIR/started"
    log "stopped the Redis Sentinel group"
  fi
  ;;
esac
