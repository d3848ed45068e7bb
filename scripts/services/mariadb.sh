#!/usr/bin/env bash
# mariadb.sh start|stop: a MariaDB (InnoDB) for the leasehold-mysql tests, on loopback, serving
# plain connections and TLS on the same port, with the test PKI of certs.sh (started here if
# needed).
#
# Reuses a server that already answers on 127.0.0.1:${LEASE_MYSQL_PORT:-3306} when this script can
# administer it (root over TCP without a password, or root over the default unix socket, which
# Debian's mariadb-server allows to the OS root user) and it serves TLS with the test CA;
# otherwise starts a server of its own under $STATE_DIR/mariadb on the first free port from that
# one (3307, ... when 3306 is taken), with mariadb-server installed from apt if missing. A server
# of its own that runs without TLS (started by an earlier version of this script) is restarted
# with TLS, keeping its data. Either way it creates the database `test` and the users (every
# privilege: the tests create tables and triggers and kill sessions)
#   lease@127.0.0.1 / lease@localhost                password lease-pw, with or without TLS
#   lease_tls@127.0.0.1 / lease_tls@localhost        password lease-tls-pw, TLS required
#   lease-client@127.0.0.1 / lease-client@localhost  no password, a client certificate with
#                                                    subject /CN=lease-client by the test CA required
# and writes $STATE_DIR/mariadb.env exporting
#   LEASE_MYSQL_URL           mysql://lease:lease-pw@127.0.0.1:<port>/test
#   LEASE_MYSQL_TLS_URL       mysql://lease_tls:...@localhost:<port>/test?ssl-mode=verify-identity&ssl-ca=CA
#   LEASE_MYSQL_TLS_CERT_URL  mysql://lease-client@localhost:<port>/test?ssl-mode=verify-identity&ssl-ca=CA&ssl-cert=..&ssl-key=..
# Idempotent. `stop` stops only a server this script started.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
DIR="$STATE_DIR/mariadb"
BASE_PORT=${LEASE_MYSQL_PORT:-3306}
USER_NAME=lease
USER_PASS=lease-pw
TLS_USER=lease_tls
TLS_PASS=lease-tls-pw
CERT_USER=lease-client
# The client binary: `mariadb` on current Debian, `mysql` on older releases.
client() { if command -v mariadb >/dev/null 2>&1; then mariadb "$@"; else mysql "$@"; fi; }
# admin PORT ARGS...: run the client as an administrator of the server on PORT, whichever way
# works (our own server's socket, root over TCP, root over the default socket for 3306).
admin() {
  local port=$1; shift
  if [ -S "$DIR/mysqld.sock" ] && [ "$(cat "$DIR/port" 2>/dev/null)" = "$port" ]; then
    client --protocol=socket --socket="$DIR/mysqld.sock" -uroot "$@"
  elif client --protocol=tcp -h 127.0.0.1 -P "$port" -uroot -e 'select 1' >/dev/null 2>&1; then
    client --protocol=tcp -h 127.0.0.1 -P "$port" -uroot "$@"
  else
    client --protocol=socket -uroot "$@"
  fi
}
# can_admin PORT: admin works, and reaches the server that listens on PORT (the default socket
# may belong to another server).
can_admin() { [ "$(admin "$1" -N -B -e 'select @@port' 2>/dev/null)" = "$1" ]; }
user_ready() {
  client --protocol=tcp -h 127.0.0.1 -P "$1" -u"$USER_NAME" -p"$USER_PASS" test -e 'select 1' >/dev/null 2>&1
}
# tls_ready PORT: the TLS users log in over TLS that verifies the server against the test CA.
tls_ready() {
  local tls=(--protocol=tcp -h localhost -P "$1" --ssl --ssl-ca="$LEASE_TLS_DIR/ca.crt" --ssl-verify-server-cert)
  client "${tls[@]}" -u"$TLS_USER" -p"$TLS_PASS" test -e 'select 1' >/dev/null 2>&1 &&
    client "${tls[@]}" --ssl-cert="$LEASE_TLS_DIR/client.crt" --ssl-key="$LEASE_TLS_DIR/client.key" \
      -u"$CERT_USER" test -e 'select 1' >/dev/null 2>&1
}
# serves_test_tls PORT: the server on PORT has TLS on, with the test CA as its CA.
serves_test_tls() {
  local ssl ca
  ssl=$(admin "$1" -N -B -e 'select @@have_ssl' 2>/dev/null) || return 1
  [ "$ssl" = YES ] || return 1
  ca=$(admin "$1" -N -B -e 'select @@ssl_ca' 2>/dev/null) || return 1
  [ -f "$ca" ] && cmp -s "$ca" "$LEASE_TLS_DIR/ca.crt"
}
# stop_own: stops the server this script started (its pid file), waiting up to 60 s.
stop_own() {
  if [ -f "$DIR/mysqld.pid" ]; then
    local pid
    pid=$(cat "$DIR/mysqld.pid")
    kill "$pid" 2>/dev/null || true
    wait_until 60 bash -c "! kill -0 $pid" || log "MariaDB $pid did not exit within 60 s"
  fi
}
# start_own PORT: runs our server on PORT with TLS, on the data directory under $DIR (created
# when missing), and waits until it answers.
start_own() {
  local port=$1 run_as server install_db
  run_as=$(id -un)
  if [ "$(id -u)" = 0 ]; then run_as=mysql; fi
  # The server reads its key as its own user: copies it may read, and no one else.
  mkdir -p "$DIR/tls"
  install -m 644 "$LEASE_TLS_DIR/ca.crt" "$DIR/tls/ca.crt"
  install -m 644 "$LEASE_TLS_DIR/server.crt" "$DIR/tls/server.crt"
  install -m 600 "$LEASE_TLS_DIR/server.key" "$DIR/tls/server.key"
  if [ ! -d "$DIR/data/mysql" ]; then
    rm -rf "$DIR/data"
    mkdir -p "$DIR/data"
    if [ "$run_as" = mysql ]; then chown -R mysql:mysql "$DIR"; fi
    install_db=$(command -v mariadb-install-db || command -v mysql_install_db) \
      || die "no mariadb-install-db"
    "$install_db" --user="$run_as" --datadir="$DIR/data" --auth-root-authentication-method=normal \
      --skip-test-db >"$DIR/install.log" 2>&1 || { tail -20 "$DIR/install.log" >&2; die "mariadb-install-db failed"; }
  fi
  if [ "$run_as" = mysql ]; then chown -R mysql:mysql "$DIR"; fi
  server=$(command -v mariadbd || command -v mysqld || ls /usr/sbin/mariadbd /usr/sbin/mysqld 2>/dev/null | head -n1) \
    || die "no mariadbd"
  echo "$port" > "$DIR/port"
  nohup "$server" --no-defaults --user="$run_as" --datadir="$DIR/data" --port="$port" \
    --bind-address=127.0.0.1 --socket="$DIR/mysqld.sock" --pid-file="$DIR/mysqld.pid" \
    --log-error="$DIR/error.log" --innodb-buffer-pool-size=64M --skip-name-resolve \
    --max-connections=500 \
    --ssl-ca="$DIR/tls/ca.crt" --ssl-cert="$DIR/tls/server.crt" --ssl-key="$DIR/tls/server.key" \
    >/dev/null 2>&1 &
  touch "$DIR/started"
  wait_until 60 can_admin "$port" || { tail -30 "$DIR/error.log" >&2; die "MariaDB did not become ready"; }
}
case "${1:-start}" in
start)
  bash "$(dirname "$0")/certs.sh" start
  . "$STATE_DIR/certs.env"
  mkdir -p "$DIR"
  PORT=""
  if [ -f "$DIR/port" ] && can_admin "$(cat "$DIR/port")"; then
    PORT=$(cat "$DIR/port")
    if ! serves_test_tls "$PORT"; then
      log "our MariaDB on 127.0.0.1:$PORT runs without TLS: restarting it with TLS"
      stop_own
      start_own "$PORT"
    fi
  elif port_busy "$BASE_PORT" && can_admin "$BASE_PORT"; then
    if serves_test_tls "$BASE_PORT"; then
      PORT=$BASE_PORT
      log "reusing the MariaDB/MySQL server on 127.0.0.1:$PORT"
    else
      log "the MariaDB/MySQL server on 127.0.0.1:$BASE_PORT does not serve TLS with the test CA: starting our own"
    fi
  fi
  if [ -z "$PORT" ]; then
    need_pkgs mariadb-server mariadb-client
    PORT=$(free_port "$BASE_PORT")
    log "starting a MariaDB server of our own on 127.0.0.1:$PORT"
    rm -rf "$DIR/data"
    start_own "$PORT"
  fi
  admin "$PORT" -e "
    CREATE DATABASE IF NOT EXISTS test;
    CREATE USER IF NOT EXISTS '$USER_NAME'@'127.0.0.1' IDENTIFIED BY '$USER_PASS';
    CREATE USER IF NOT EXISTS '$USER_NAME'@'localhost' IDENTIFIED BY '$USER_PASS';
    GRANT ALL PRIVILEGES ON *.* TO '$USER_NAME'@'127.0.0.1';
    GRANT ALL PRIVILEGES ON *.* TO '$USER_NAME'@'localhost';
    CREATE USER IF NOT EXISTS '$TLS_USER'@'127.0.0.1' IDENTIFIED BY '$TLS_PASS';
    CREATE USER IF NOT EXISTS '$TLS_USER'@'localhost' IDENTIFIED BY '$TLS_PASS';
    ALTER USER '$TLS_USER'@'127.0.0.1' REQUIRE SSL;
    ALTER USER '$TLS_USER'@'localhost' REQUIRE SSL;
    GRANT ALL PRIVILEGES ON *.* TO '$TLS_USER'@'127.0.0.1';
    GRANT ALL PRIVILEGES ON *.* TO '$TLS_USER'@'localhost';
    CREATE USER IF NOT EXISTS '$CERT_USER'@'127.0.0.1';
    CREATE USER IF NOT EXISTS '$CERT_USER'@'localhost';
    ALTER USER '$CERT_USER'@'127.0.0.1' REQUIRE SUBJECT '/CN=lease-client' AND ISSUER '/CN=lease-test-ca';
    ALTER USER '$CERT_USER'@'localhost' REQUIRE SUBJECT '/CN=lease-client' AND ISSUER '/CN=lease-test-ca';
    GRANT ALL PRIVILEGES ON *.* TO '$CERT_USER'@'127.0.0.1';
    GRANT ALL PRIVILEGES ON *.* TO '$CERT_USER'@'localhost';
    FLUSH PRIVILEGES;" || die "creating the test database and users failed"
  wait_until 10 user_ready "$PORT" || die "user $USER_NAME cannot log in to MariaDB on $PORT"
  wait_until 10 tls_ready "$PORT" || die "users $TLS_USER and $CERT_USER cannot log in to MariaDB on $PORT over verified TLS"
  TLS_Q="ssl-mode=verify-identity&ssl-ca=$LEASE_TLS_DIR/ca.crt"
  cat > "$STATE_DIR/mariadb.env" <<ENV
export LEASE_MYSQL_URL=mysql://$USER_NAME:$USER_PASS@127.0.0.1:$PORT/test
export LEASE_MYSQL_TLS_URL='mysql://$TLS_USER:$TLS_PASS@localhost:$PORT/test?$TLS_Q'
export LEASE_MYSQL_TLS_CERT_URL='mysql://$CERT_USER@localhost:$PORT/test?$TLS_Q&ssl-cert=$LEASE_TLS_DIR/client.crt&ssl-key=$LEASE_TLS_DIR/client.key'
ENV
  log "MariaDB ready on 127.0.0.1:$PORT, plain and TLS (users $USER_NAME, $TLS_USER, $CERT_USER; database test)"
  ;;
stop)
  if [ -f "$DIR/started" ]; then
    stop_own
    rm -f "$DIR/started" "$DIR/port"
    log "stopped our MariaDB"
  fi
  ;;
esac
