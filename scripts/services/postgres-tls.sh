#!/usr/bin/env bash
# postgres-tls.sh start|stop: a throwaway PostgreSQL server that accepts TLS connections only, on
# a free loopback port, with the test PKI of certs.sh (started here if needed). The shared server
# on 5432 is never touched.
#
#   hostssl, user "lease-client":  client-certificate authentication (the certificate's CN)
#   hostssl, user lease_pw:        password (scram-sha-256), password "lease-pw-secret"
#   anything without TLS:          rejected
#
# start writes $STATE_DIR/postgres-tls.env, which exports
#   LEASE_POSTGRES_TLS_URL       postgres://lease_pw:...@localhost:PORT/test?sslmode=verify-full&sslrootcert=CA
#   LEASE_POSTGRES_TLS_CERT_URL  postgres://lease-client@localhost:PORT/test?sslmode=verify-full&sslrootcert=CA&sslcert=..&sslkey=..
#   LEASE_POSTGRES_TLS_EXPIRED_URL  as the first, to a second server whose certificate has expired
#   LEASE_POSTGRES_TLS_PORT      the port
# The server runs as user postgres (initdb refuses root), from the newest /usr/lib/postgresql/*/bin;
# data, socket and log stay under $STATE_DIR/postgres-tls.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
D=$STATE_DIR/postgres-tls
PASSWORD=lease-pw-secret

bin_dir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  [ -n "$d" ] && [ -x "$d/initdb" ] || return 1
  echo "$d"
}
as_pg() { runuser -u postgres -- "$@"; }
running() { [ -f "$D/data/postmaster.pid" ] && [ -f "$D/port" ] && [ -f "$D/expired.port" ] && as_pg "$BIN/pg_isready" -q -h "$D" -p "$(cat "$D/port")"; }

BIN=$(bin_dir) || { need_pkgs postgresql postgresql-client; BIN=$(bin_dir) || die "no PostgreSQL server binaries under /usr/lib/postgresql"; }

# start_server DIR CERT FIRST-PORT: initdb $D/DIR, serve CERT.crt/key of the test PKI with TLS
# only, on the first free port at or above FIRST-PORT; prints the port.
start_server() {
  local dir=$D/$1 cert=$2 port
  port=$(free_port "$3")
  as_pg "$BIN/initdb" --no-sync -D "$dir" -U postgres --auth=trust -E UTF8 --no-locale >"$D/$1.initdb.log" 2>&1 \
    || { cat "$D/$1.initdb.log" >&2; die "initdb failed"; }
  # The server reads its key as user postgres and refuses one others can read.
  install -o postgres -g postgres -m 600 "$LEASE_TLS_DIR/$cert.key" "$dir/server.key"
  install -o postgres -g postgres -m 644 "$LEASE_TLS_DIR/$cert.crt" "$dir/server.crt"
  install -o postgres -g postgres -m 644 "$LEASE_TLS_DIR/ca.crt" "$dir/ca.crt"
  cat >>"$dir/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$D'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_ca_file = 'ca.crt'
password_encryption = 'scram-sha-256'
fsync = off
logging_collector = off
CONF
  cat >"$dir/pg_hba.conf" <<HBA
local   all          postgres                   trust
hostssl all          lease-client  127.0.0.1/32 cert
hostssl all          lease_pw      127.0.0.1/32 scram-sha-256
host    all          all           127.0.0.1/32 reject
HBA
  as_pg "$BIN/pg_ctl" -D "$dir" -l "$D/$1.log" -w -t 60 start >/dev/null \
    || { tail -n 20 "$D/$1.log" >&2; die "PostgreSQL (TLS, $1) did not start"; }
  echo "$port"
}

write_env() {
  local port=$1 pki=$2 q
  q="sslmode=verify-full&sslrootcert=$pki/ca.crt"
  cat > "$STATE_DIR/postgres-tls.env" <<ENV
export LEASE_POSTGRES_TLS_PORT=$port
export LEASE_POSTGRES_TLS_URL='postgres://lease_pw:$PASSWORD@localhost:$port/test?$q'
export LEASE_POSTGRES_TLS_EXPIRED_URL='postgres://lease_pw:$PASSWORD@localhost:$(cat "$D/expired.port")/test?$q'
export LEASE_POSTGRES_TLS_CERT_URL='postgres://lease-client@localhost:$port/test?$q&sslcert=$pki/client.crt&sslkey=$pki/client.key'
ENV
}

case "${1:-start}" in
start)
  bash "$(dirname "$0")/certs.sh" start
  . "$STATE_DIR/certs.env"
  if running; then
    write_env "$(cat "$D/port")" "$LEASE_TLS_DIR"
    log "PostgreSQL (TLS only) already running on 127.0.0.1:$(cat "$D/port")"
    exit 0
  fi
  rm -rf "$D"; mkdir -p "$D"; chown postgres: "$D"; chmod 700 "$D"
  port=$(start_server data server 25532)
  echo "$port" > "$D/port"
  as_pg "$BIN/psql" -h "$D" -p "$port" -U postgres -qv ON_ERROR_STOP=1 >/dev/null <<SQL
CREATE DATABASE test;
CREATE ROLE "lease-client" LOGIN;
CREATE ROLE lease_pw LOGIN PASSWORD '$PASSWORD';
\c test
GRANT ALL ON SCHEMA public TO "lease-client", lease_pw;
GRANT CREATE ON DATABASE test TO "lease-client", lease_pw;
SQL
  # A second server that presents an expired certificate (signed by the same CA): nothing is
  # created in it, a client must refuse it during the handshake.
  start_server expired expired $((port + 1)) > "$D/expired.port"
  touch "$STATE_DIR/postgres-tls.started"
  write_env "$port" "$LEASE_TLS_DIR"
  log "PostgreSQL (TLS only) ready on 127.0.0.1:$port"
  ;;
stop)
  [ -f "$STATE_DIR/postgres-tls.started" ] || exit 0
  rm -f "$STATE_DIR/postgres-tls.started" "$STATE_DIR/postgres-tls.env"
  for dir in data expired; do
    if [ -f "$D/$dir/postmaster.pid" ]; then
      as_pg "$BIN/pg_ctl" -D "$D/$dir" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    fi
  done
  case "$D" in /|"") ;; *) rm -rf "$D" ;; esac
  log "stopped PostgreSQL (TLS)"
  ;;
esac
