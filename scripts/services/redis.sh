#!/usr/bin/env bash
# redis.sh start|stop: make sure Redis answers on 127.0.0.1:6379. Tests that restart or replicate
# Redis start their own redis-server processes, so the binary must be installed either way; the
# clock-step test runs one under libfaketime (package faketime).
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
PORT=${LEASE_REDIS_PORT:-6379}
ready() { redis-cli -h 127.0.0.1 -p "$PORT" ping | grep -q PONG; }
case "${1:-start}" in
start)
  need_pkgs redis-server redis-tools faketime
  if ! ready; then
    log "starting redis-server on $PORT"
    mkdir -p "$STATE_DIR/redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$PORT" --save "" --appendonly no \
      --dir "$STATE_DIR/redis" --pidfile "$STATE_DIR/redis/redis.pid" --logfile "$STATE_DIR/redis/redis.log"
    echo "$PORT" > "$STATE_DIR/redis.started"
    wait_until 20 ready || die "Redis did not become ready"
  fi
  # keyspace notifications let waiters wake on release and expiry
  redis-cli -h 127.0.0.1 -p "$PORT" config set notify-keyspace-events KEA >/dev/null || true
  echo "export LEASE_REDIS_URL=redis://127.0.0.1:$PORT" > "$STATE_DIR/redis.env"
  log "Redis ready on 127.0.0.1:$PORT"
  ;;
stop)
  if [ -f "$STATE_DIR/redis.started" ]; then
    redis-cli -h 127.0.0.1 -p "$(cat "$STATE_DIR/redis.started")" shutdown nosave >/dev/null 2>&1 || true
    rm -f "$STATE_DIR/redis.started"
    log "stopped Redis"
  fi
  ;;
esac
