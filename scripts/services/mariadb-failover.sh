#!/usr/bin/env bash
# mariadb-failover.sh setup DIR | kill-primary DIR | stop DIR: a throwaway MariaDB primary and an
# asynchronous replica (GTID replication, binary logs in ROW format) on free loopback ports, for
# leasehold-mysql's failover test. `setup` prints PRIMARY_PORT=<port> and REPLICA_PORT=<port>;
# root logs in over TCP without a password on both, and the database `test` exists.
# `kill-primary` SIGKILLs the primary; `stop` stops both and deletes DIR. Never touches the shared
# server of mariadb.sh.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
cmd=${1:?usage: $0 setup|kill-primary|stop DIR}
DIR=${2:?usage: $0 setup|kill-primary|stop DIR}
client() { if command -v mariadb >/dev/null 2>&1; then mariadb "$@"; else mysql "$@"; fi; }
sock_sql() { client --protocol=socket --socket="$DIR/$1.sock" -uroot -N -B -e "$2"; }
case "$cmd" in
setup)
  need_pkgs mariadb-server mariadb-client
  mkdir -p "$DIR"
  RUN_AS=$(id -un)
  if [ "$(id -u)" = 0 ]; then RUN_AS=mysql; fi
  INSTALL_DB=$(command -v mariadb-install-db || command -v mysql_install_db) || die "no mariadb-install-db"
  SERVER=$(command -v mariadbd || command -v mysqld || ls /usr/sbin/mariadbd /usr/sbin/mysqld 2>/dev/null | head -n1) \
    || die "no mariadbd"
  port=$(free_port 3410)
  id=1
  for role in primary replica; do
    mkdir -p "$DIR/$role"
    [ "$RUN_AS" = mysql ] && chown -R mysql:mysql "$DIR"
    "$INSTALL_DB" --user="$RUN_AS" --datadir="$DIR/$role" --auth-root-authentication-method=normal \
      --skip-test-db >"$DIR/$role-install.log" 2>&1 || { tail -20 "$DIR/$role-install.log" >&2; die "install-db failed"; }
    echo "$port" > "$DIR/$role.port"
    nohup "$SERVER" --no-defaults --user="$RUN_AS" --datadir="$DIR/$role" --port="$port" \
      --bind-address=127.0.0.1 --socket="$DIR/$role.sock" --pid-file="$DIR/$role.pid" \
      --log-error="$DIR/$role.err" --server-id="$id" --log-bin="$role-bin" --binlog-format=ROW \
      --innodb-buffer-pool-size=32M --skip-name-resolve >/dev/null 2>&1 &
    id=$((id + 1))
    port=$(free_port $((port + 1)))
  done
  for role in primary replica; do
    wait_until 60 sock_sql "$role" 'select 1' || { tail -20 "$DIR/$role.err" >&2; die "$role did not start"; }
  done
  P=$(cat "$DIR/primary.port")
  sock_sql primary "CREATE USER 'repl'@'127.0.0.1' IDENTIFIED BY 'repl';
    GRANT REPLICATION SLAVE ON *.* TO 'repl'@'127.0.0.1'; CREATE DATABASE test;"
  sock_sql replica "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$P, MASTER_USER='repl',
    MASTER_PASSWORD='repl', MASTER_USE_GTID=slave_pos; START SLAVE;"
  replicated() { [ "$(sock_sql replica "select count(*) from information_schema.schemata where schema_name='test'")" = 1 ]; }
  wait_until 30 replicated || die "the replica did not replicate"
  echo "PRIMARY_PORT=$P"
  echo "REPLICA_PORT=$(cat "$DIR/replica.port")"
  ;;
kill-primary)
  [ -f "$DIR/primary.pid" ] && kill -9 "$(cat "$DIR/primary.pid")" 2>/dev/null || true
  ;;
stop)
  for role in primary replica; do
    if [ -f "$DIR/$role.pid" ]; then
      pid=$(cat "$DIR/$role.pid")
      kill -9 "$pid" 2>/dev/null || true
      wait_until 30 bash -c "! kill -0 $pid" || true
    fi
  done
  rm -rf "$DIR"
  ;;
esac
