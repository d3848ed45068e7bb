#!/usr/bin/env bash
# redis-tls.sh start|stop: a Redis that speaks only TLS (--port 0) on a free loopback port from
# LEASE_REDIS_TLS_PORT (default 6390), with the test PKI of certs.sh (server.crt, trusting ca.crt
# for client certificates, which are optional: --tls-auth-clients optional) and ACL user
# `lease` (password `lease-pass`); the default user is off, so every client must authenticate.
# Writes $STATE_DIR/redis-tls.env exporting
#   LEASE_REDIS_TLS_URL   rediss://lease:lease-pass@127.0.0.1:<port>/?tls_ca=<pki>/ca.crt
#   LEASE_TLS_DIR         the PKI directory (tests take client.crt/key, other-ca.crt from it)
# Idempotent: a server that answers is left alone.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
DIR="$STATE_DIR/redis-tls"
PKI="$STATE_DIR/pki"
USER_NAME=lease
USER_PASS=lease-pass
cli() {
  redis-cli --tls --cacert "$PKI/ca.crt" -h 127.0.0.1 -p "$1" --user "$USER_NAME" --pass "$USER_PASS" \
    --no-auth-warning "${@:2}"
}
ready() { cli "$1" ping | grep -q PONG; }
case "${1:-start}" in
start)
  need_pkgs redis-server redis-tools
  bash "$(dirname "$0")/certs.sh" start
  mkdir -p "$DIR"
  PORT=""
  [ -f "$DIR/port" ] && ready "$(cat "$DIR/port")" 2>/dev/null && PORT=$(cat "$DIR/port")
  if [ -z "$PORT" ]; then
    PORT=$(free_port "${LEASE_REDIS_TLS_PORT:-6390}")
    log "starting a TLS redis-server on $PORT"
    redis-server --daemonize yes --bind 127.0.0.1 --port 0 --tls-port "$PORT" \
      --tls-cert-file "$PKI/server.crt" --tls-key-file "$PKI/server.key" \
      --tls-ca-cert-file "$PKI/ca.crt" --tls-auth-clients optional \
      --user default off --user "$USER_NAME" on ">$USER_PASS" '~*' '&*' '+@all' \
      --notify-keyspace-events KEA --save "" --appendonly no \
      --dir "$DIR" --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log"
    echo "$PORT" > "$DIR/port"
    touch "$DIR/started"
    wait_until 20 ready "$PORT" || { tail -20 "$DIR/redis.log" >&2; die "the TLS Redis did not become ready"; }
  fi
  {
    echo "export LEASE_REDIS_TLS_URL='rediss://$USER_NAME:$USER_PASS@127.0.0.1:$PORT/?tls_ca=$PKI/ca.crt'"
    echo "export LEASE_TLS_DIR=$PKI"
  } > "$STATE_DIR/redis-tls.env"
  log "TLS Redis ready on 127.0.0.1:$PORT (user $USER_NAME)"
  ;;
stop)
  if [ -f "$DIR/started" ]; then
    cli "$(cat "$DIR/port")" shutdown nosave >/dev/null 2>&1 || true
    rm -f "$DIR/started" "$DIR/port"
    log "stopped the TLS Redis"
  fi
  ;;
esac
