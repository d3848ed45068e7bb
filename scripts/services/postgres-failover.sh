#!/usr/bin/env bash
# postgres-failover.sh: a throwaway PostgreSQL primary plus an asynchronous streaming standby on
# loopback, for the failover tests of lease-postgres (tests/failover.rs runs this script itself).
# The shared server on 5432 is never touched.
#
#   postgres-failover.sh setup DIR      initdb a primary in DIR/primary on a free port, start it,
#                                       pg_basebackup a streaming standby into DIR/standby on
#                                       another free port, start it, wait until it streams; prints
#                                       PRIMARY_PORT=.. and STANDBY_PORT=.. on stdout
#   postgres-failover.sh stop DIR NODE [MODE]   pg_ctl stop (MODE fast|immediate, default fast)
#   postgres-failover.sh start DIR NODE         pg_ctl start
#   postgres-failover.sh promote DIR            pg_ctl promote the standby (waits)
#   postgres-failover.sh teardown DIR           stop both (immediate) and delete DIR
#
# NODE is primary or standby. The servers run as user postgres (initdb refuses root), from the
# newest /usr/lib/postgresql/*/bin. Data, logs and sockets stay under DIR.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

bin_dir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  [ -n "$d" ] && [ -x "$d/initdb" ] || return 1
  echo "$d"
}
as_pg() { runuser -u postgres -- "$@"; }
ensure_bin() {
  BIN=$(bin_dir) || { need_pkgs postgresql postgresql-client; BIN=$(bin_dir) || die "no PostgreSQL server binaries under /usr/lib/postgresql"; }
}
pgctl() { as_pg "$BIN/pg_ctl" "$@"; }
ready() { "$BIN/pg_isready" -q -h 127.0.0.1 -p "$1"; }

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: $0 setup|start|stop|promote|teardown DIR [NODE [MODE]]"
ensure_bin

case "$cmd" in
setup)
  mkdir -p "$dir"
  chown postgres: "$dir"
  chmod 700 "$dir"
  pport=$(free_port 25432)
  sport=$(free_port $((pport + 1)))
  as_pg "$BIN/initdb" --no-sync -D "$dir/primary" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || as_pg "$BIN/initdb" --no-sync -D "$dir/primary" -U postgres --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  cat >>"$dir/primary/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $pport
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 4
hot_standby = on
fsync = off
synchronous_commit = local
logging_collector = off
CONF
  echo "host replication all 127.0.0.1/32 trust" >>"$dir/primary/pg_hba.conf"
  pgctl -D "$dir/primary" -l "$dir/primary.log" -w -t 60 start >/dev/null || { cat "$dir/primary.log" >&2; die "primary did not start"; }
  as_pg "$BIN/psql" -h 127.0.0.1 -p "$pport" -U postgres -qc 'CREATE DATABASE test' >/dev/null
  as_pg "$BIN/pg_basebackup" -h 127.0.0.1 -p "$pport" -U postgres -D "$dir/standby" -R -X stream --checkpoint=fast --no-sync >"$dir/basebackup.log" 2>&1 \
    || { cat "$dir/basebackup.log" >&2; die "pg_basebackup failed"; }
  sed -i -E "s/^port = .*/port = $sport/" "$dir/standby/postgresql.conf"
  pgctl -D "$dir/standby" -l "$dir/standby.log" -w -t 60 start >/dev/null || { cat "$dir/standby.log" >&2; die "standby did not start"; }
  streaming() { [ "$(as_pg "$BIN/psql" -h 127.0.0.1 -p "$pport" -U postgres -tAc "select count(*) from pg_stat_replication where state = 'streaming'")" = 1 ]; }
  wait_until 60 streaming || die "the standby does not stream"
  log "PostgreSQL primary on 127.0.0.1:$pport, streaming standby on 127.0.0.1:$sport ($dir)"
  echo "PRIMARY_PORT=$pport"
  echo "STANDBY_PORT=$sport"
  ;;
start)
  node=${3:?NODE}
  pgctl -D "$dir/$node" -l "$dir/$node.log" -w -t 60 start >/dev/null || { tail -n 20 "$dir/$node.log" >&2; die "$node did not start"; }
  ;;
stop)
  node=${3:?NODE}; mode=${4:-fast}
  pgctl -D "$dir/$node" -m "$mode" -w -t 60 stop >/dev/null
  ;;
promote)
  pgctl -D "$dir/standby" -w -t 60 promote >/dev/null || { tail -n 20 "$dir/standby.log" >&2; die "promotion failed"; }
  ;;
teardown)
  for node in standby primary; do
    if [ -f "$dir/$node/postmaster.pid" ]; then
      pgctl -D "$dir/$node" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    fi
  done
  case "$dir" in
  /|"") die "refusing to delete $dir" ;;
  esac
  rm -rf "$dir"
  ;;
*) die "unknown command $cmd" ;;
esac
