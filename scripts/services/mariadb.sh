#!/usr/bin/env bash
# mariadb.sh start|stop: a MariaDB (InnoDB) for the leasehold-mysql tests, on loopback.
#
# Reuses a server that already answers on 127.0.0.1:${LEASE_MYSQL_PORT:-3306} when this script can
# administer it (root over TCP without a password, or root over the default unix socket, which
# Debian's mariadb-server allows to the OS root user); otherwise starts a server of its own under
# $STATE_DIR/mariadb on the first free port from that one (3307, ... when 3306 is taken), with
# mariadb-server installed from apt if missing. Either way it creates the database `test` and the
# user `lease`@127.0.0.1 / `lease`@localhost (password `lease-pw`, every privilege: the tests
# create tables and triggers and kill sessions), and writes $STATE_DIR/mariadb.env exporting
#   LEASE_MYSQL_URL   mysql://lease:lease-pw@127.0.0.1:<port>/test
# Idempotent. `stop` stops only a server this script started.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
DIR="$STATE_DIR/mariadb"
BASE_PORT=${LEASE_MYSQL_PORT:-3306}
USER_NAME=lease
USER_PASS=lease-pw
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
case "${1:-start}" in
start)
  mkdir -p "$DIR"
  PORT=""
  if [ -f "$DIR/port" ] && can_admin "$(cat "$DIR/port")"; then
    PORT=$(cat "$DIR/port")
  elif port_busy "$BASE_PORT" && can_admin "$BASE_PORT"; then
    PORT=$BASE_PORT
    log "reusing the MariaDB/MySQL server on 127.0.0.1:$PORT"
  fi
  if [ -z "$PORT" ]; then
    need_pkgs mariadb-server mariadb-client
    PORT=$(free_port "$BASE_PORT")
    log "starting a MariaDB server of our own on 127.0.0.1:$PORT"
    rm -rf "$DIR/data"
    mkdir -p "$DIR/data"
    RUN_AS=$(id -un)
    if [ "$(id -u)" = 0 ]; then RUN_AS=mysql; chown -R mysql:mysql "$DIR"; fi
    INSTALL_DB=$(command -v mariadb-install-db || command -v mysql_install_db) \
      || die "no mariadb-install-db"
    "$INSTALL_DB" --user="$RUN_AS" --datadir="$DIR/data" --auth-root-authentication-method=normal \
      --skip-test-db >"$DIR/install.log" 2>&1 || { tail -20 "$DIR/install.log" >&2; die "mariadb-install-db failed"; }
    SERVER=$(command -v mariadbd || command -v mysqld || ls /usr/sbin/mariadbd /usr/sbin/mysqld 2>/dev/null | head -n1) \
      || die "no mariadbd"
    echo "$PORT" > "$DIR/port"
    nohup "$SERVER" --no-defaults --user="$RUN_AS" --datadir="$DIR/data" --port="$PORT" \
      --bind-address=127.0.0.1 --socket="$DIR/mysqld.sock" --pid-file="$DIR/mysqld.pid" \
      --log-error="$DIR/error.log" --innodb-buffer-pool-size=64M --skip-name-resolve \
      --max-connections=500 >/dev/null 2>&1 &
    touch "$DIR/started"
    wait_until 60 can_admin "$PORT" || { tail -30 "$DIR/error.log" >&2; die "MariaDB did not become ready"; }
  fi
  admin "$PORT" -e "
    CREATE DATABASE IF NOT EXISTS test;
    CREATE USER IF NOT EXISTS '$USER_NAME'@'127.0.0.1' IDENTIFIED BY '$USER_PASS';
    CREATE USER IF NOT EXISTS '$USER_NAME'@'localhost' IDENTIFIED BY '$USER_PASS';
    GRANT ALL PRIVILEGES ON *.* TO '$USER_NAME'@'127.0.0.1';
    GRANT ALL PRIVILEGES ON *.* TO '$USER_NAME'@'localhost';
    FLUSH PRIVILEGES;" || die "creating the test database and user failed"
  wait_until 10 user_ready "$PORT" || die "user $USER_NAME cannot log in to MariaDB on $PORT"
  echo "export LEASE_MYSQL_URL=mysql://$USER_NAME:$USER_PASS@127.0.0.1:$PORT/test" > "$STATE_DIR/mariadb.env"
  log "MariaDB ready on 127.0.0.1:$PORT (user $USER_NAME, database test)"
  ;;
stop)
  if [ -f "$DIR/started" ]; then
    if [ -f "$DIR/mysqld.pid" ]; then
      pid=$(cat "$DIR/mysqld.pid")
      kill "$pid" 2>/dev/null || true
      wait_until 60 bash -c "! kill -0 $pid" || log "MariaDB $pid did not exit within 60 s"
    fi
    rm -f "$DIR/started" "$DIR/port"
    log "stopped our MariaDB"
  fi
  ;;
esac
