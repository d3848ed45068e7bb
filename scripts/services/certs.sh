#!/usr/bin/env bash
# certs.sh start|stop: the test PKI that the TLS servers (Redis, etcd, PostgreSQL) and their tests
# share, made with openssl under $STATE_DIR/pki. Nothing runs; `start` only writes files, and keeps
# them when they are already there and still valid for a day.
#
#   ca.crt / ca.key                 the test CA
#   server.crt / server.key         CN localhost, SAN DNS:localhost, IP:127.0.0.1, signed by the CA
#   client.crt / client.key         CN lease-client (the name PostgreSQL maps to its user), by the CA
#   other-ca.crt                    a CA that signed nothing here: a "wrong CA" for the tests
#   expired.crt / expired.key       a server certificate by the CA whose validity ended in the past
#
# start writes $STATE_DIR/certs.env, which exports LEASE_TLS_DIR (the directory above).
# Keys are readable by their owner only, as PostgreSQL requires; a server that runs as another user
# (postgres) gets its own copy from its service script.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
D=$STATE_DIR/pki

sign() { # sign NAME CN SAN DAYS-OR-DATES...: key + certificate signed by the test CA
  local name=$1 cn=$2 san=$3
  shift 3
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "/CN=$cn" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" \
    -extfile "$name.ext" "$@" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
  chmod 600 "$name.key"
}

make_pki() {
  rm -rf "$D"; mkdir -p "$D"
  (
    cd "$D"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=lease-test-ca" 2>/dev/null
    sign server localhost "DNS:localhost,IP:127.0.0.1" -days 3650
    sign client lease-client "DNS:lease-client" -days 3650
    # An expired server certificate: openssl x509 cannot back-date, so `openssl ca` does it.
    openssl req -newkey rsa:2048 -nodes -keyout expired.key -out expired.csr -subj "/CN=localhost" 2>/dev/null
    mkdir -p ca-db && : > ca-db/index.txt && echo 1000 > ca-db/serial
    cat > ca-db/ca.cnf <<CNF
[ca]
default_ca = test
[test]
dir = $D/ca-db
database = \$dir/index.txt
serial = \$dir/serial
new_certs_dir = \$dir
default_md = sha256
policy = any
copy_extensions = none
[any]
commonName = supplied
[ext]
subjectAltName = DNS:localhost,IP:127.0.0.1
extendedKeyUsage = serverAuth,clientAuth
CNF
    openssl ca -batch -config ca-db/ca.cnf -cert ca.crt -keyfile ca.key -in expired.csr \
      -out expired.crt -startdate 20200101000000Z -enddate 20200201000000Z -extensions ext \
      -notext >/dev/null 2>&1
    rm -f expired.csr; chmod 600 expired.key
    openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.crt -days 3650 \
      -subj "/CN=lease-test-other-ca" 2>/dev/null
  )
}

case "${1:-start}" in
start)
  need_pkgs openssl
  if [ -f "$D/ca.crt" ] && [ -f "$D/expired.crt" ] && openssl x509 -checkend 86400 -noout -in "$D/server.crt" >/dev/null 2>&1; then
    log "test PKI already in $D"
  else
    make_pki
    openssl verify -CAfile "$D/ca.crt" "$D/server.crt" "$D/client.crt" >/dev/null || die "test PKI does not verify"
    log "test PKI written to $D"
  fi
  echo "export LEASE_TLS_DIR=$D" > "$STATE_DIR/certs.env"
  ;;
stop) ;; # files only: the next start reuses them
esac
