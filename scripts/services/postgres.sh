#!/usr/bin/env bash
# postgres.sh start|stop: make sure PostgreSQL answers on 127.0.0.1:5432 (trust auth, db "test").
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
PORT=${LEASE_PG_PORT:-5432}
ready() { pg_isready -q -h 127.0.0.1 -p "$PORT"; }
case "${1:-start}" in
start)
  need_pkgs postgresql postgresql-client
  if ! ready; then
    ver=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)
    [ -n "$ver" ] || die "no PostgreSQL cluster under /etc/postgresql"
    log "starting PostgreSQL $ver"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || pg_ctlcluster "$ver" main start
    echo "$ver" > "$STATE_DIR/postgres.started"
    wait_until 30 ready || die "PostgreSQL did not become ready"
    # trust auth on loopback and a "test" database, as on the rust-svc machines
    hba=/etc/postgresql/$ver/main/pg_hba.conf
    if ! psql -h 127.0.0.1 -p "$PORT" -U postgres -c 'select 1' >/dev/null 2>&1; then
      sed -i -E 's/^(host\s+all\s+all\s+127\.0\.0\.1\/32\s+)\S+/\1trust/' "$hba"
      sed -i -E 's/^(local\s+all\s+postgres\s+)\S+/\1trust/' "$hba"
      pg_ctlcluster --skip-systemctl-redirect "$ver" main reload || true
    fi
  fi
  psql -h 127.0.0.1 -p "$PORT" -U postgres -tAc "select 1 from pg_database where datname='test'" | grep -q 1 \
    || psql -h 127.0.0.1 -p "$PORT" -U postgres -c 'create database test' >/dev/null
  echo "export LEASE_POSTGRES_URL=postgres://postgres@127.0.0.1:$PORT/test" > "$STATE_DIR/postgres.env"
  log "PostgreSQL ready on 127.0.0.1:$PORT"
  ;;
stop)
  if [ -f "$STATE_DIR/postgres.started" ]; then
    ver=$(cat "$STATE_DIR/postgres.started")
    pg_ctlcluster --skip-systemctl-redirect "$ver" main stop || true
    rm -f "$STATE_DIR/postgres.started"
    log "stopped PostgreSQL"
  fi
  ;;
esac
