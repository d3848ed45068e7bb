#!/usr/bin/env bash
# k8s.sh start|stop|restart-apiserver|prepare|build: a real kube-apiserver (1.20.2, built from Debian's
# `kubernetes` source package) over its own etcd, on free loopback ports, state under
# $STATE_DIR/k8s. No Docker, no image registry: only Debian's archive.
#
# The binary is built once per machine and cached at
# ${XDG_CACHE_HOME:-$HOME/.cache}/lease-k8s/kube-apiserver (about 11 minutes on 2 cores, 1.3 GB
# RAM, 1.8 GB of build tree that is deleted afterwards). kubectl 1.20 is extracted from Debian's
# kubernetes-client package next to it. `prepare` (apt: packages and the source tree) then
# `build` (the compile alone) make the binary without starting anything, so that a caller can
# run the long compile in the background while it does other work (scripts/test.sh does).
#
# start writes $STATE_DIR/k8s/kubeconfig and $STATE_DIR/k8s.env, which exports:
#   KUBECONFIG                 the kubeconfig (static token of group system:masters)
#   LEASE_K8S_NAMESPACE        default
#   LEASE_K8S_KUBECTL          the cached kubectl (may be empty if extraction failed)
#   LEASE_K8S_RESTART          a command that restarts the apiserver (same ports, same etcd)
#   LEASE_K8S_CERT_KUBECONFIG  a kubeconfig authenticating with a client certificate
#                              (CN lease-test-cert-user, O system:masters; the apiserver trusts its
#                              CA with --client-ca-file)
#   LEASE_K8S_WRONG_CA         a CA certificate that did not sign the apiserver's certificate
# restart-apiserver stops the apiserver it started (never etcd) and starts it again, waiting for
# /readyz. stop stops exactly the processes whose pid files this script wrote.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
D=$STATE_DIR/k8s
BIN_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/lease-k8s
APISERVER=$BIN_DIR/kube-apiserver
PKI=$D/pki

alive() { [ -f "$D/$1.pid" ] && kill -0 "$(cat "$D/$1.pid")" 2>/dev/null; }

# fetch_source: the packages the build needs and Debian's kubernetes source tree under
# $BIN_DIR/build (apt: run it while nothing else installs packages).
fetch_source() {
  need_pkgs golang-go dpkg-dev rsync jq make
  if ! apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes'; then
    log "adding deb-src entries derived from the machine's own apt sources"
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
        > /etc/apt/sources.list.d/lease-k8s-debsrc.sources
    elif [ -f /etc/apt/sources.list ]; then
      sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/lease-k8s-debsrc.list
    fi
    APT_UPDATED=0; apt_update_once
  fi
  local build=$BIN_DIR/build
  rm -rf "$build"; mkdir -p "$build"
  log "apt-get source kubernetes -> $build"
  (cd "$build" && apt-get source -qq kubernetes >/dev/null 2>"$build/apt-source.err") \
    || { cat "$build/apt-source.err" >&2; die "apt-get source kubernetes failed"; }
}

# make_apiserver: builds kube-apiserver from the tree fetch_source left (no apt, so it may run in
# the background while other services install theirs) and caches the binary.
make_apiserver() {
  local build=$BIN_DIR/build src
  src=$(find "$build" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | head -n1)
  [ -n "$src" ] && [ -d "$src/vendor" ] || die "no source tree with vendor/ in $build (run prepare)"
  log "building kube-apiserver (make WHAT=cmd/kube-apiserver; about 11 minutes on 2 cores)"
  # 1.20 builds in GOPATH mode and runs its code generators first: a plain `go build` fails.
  (cd "$src" && env -u GOFLAGS -u GOPATH -u GOCACHE -u GOROOT -u GOBIN \
      PATH="/usr/lib/go/bin:$PATH" HOME="${HOME:-/root}" \
      make WHAT=cmd/kube-apiserver >"$BIN_DIR/build.log" 2>&1) \
    || { tail -n 40 "$BIN_DIR/build.log" >&2; die "build failed (log: $BIN_DIR/build.log)"; }
  cp "$src/_output/bin/kube-apiserver" "$APISERVER.tmp" && mv "$APISERVER.tmp" "$APISERVER"
  basename "$src" > "$BIN_DIR/kube-apiserver.source"
  rm -rf "$build"
  log "built $("$APISERVER" --version)"
}

have_apiserver() {
  [ -x "$APISERVER" ] && "$APISERVER" --version 2>/dev/null | grep -q '^Kubernetes v1\.'
}

ensure_binaries() {
  need_pkgs curl openssl ca-certificates etcd-server
  mkdir -p "$BIN_DIR"
  exec 9>"$BIN_DIR/.lock"; flock 9   # one builder per machine
  if ! have_apiserver; then
    fetch_source
    make_apiserver
  fi
  if [ ! -x "$BIN_DIR/kubectl" ]; then
    log "extracting kubectl from kubernetes-client.deb"
    local tmp; tmp=$(mktemp -d "$BIN_DIR/deb.XXXX")
    if (cd "$tmp" && { apt-get download -qq kubernetes-client >/dev/null 2>&1 \
        || { apt_update_once; apt-get download -qq kubernetes-client >/dev/null 2>&1; }; }); then
      dpkg-deb -x "$tmp"/kubernetes-client_*.deb "$tmp/x" && cp "$tmp/x/usr/bin/kubectl" "$BIN_DIR/kubectl"
    else
      log "could not download kubernetes-client; continuing without kubectl"
    fi
    rm -rf "$tmp"
  fi
  flock -u 9; exec 9>&-
}

make_pki() {
  mkdir -p "$PKI"; (
    cd "$PKI"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=lease-k8s-test-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" "basicConstraints=CA:FALSE" \
      "keyUsage=digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" > ext.cnf
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out apiserver.crt -days 3650 -extfile ext.cnf 2>/dev/null
    echo "$(openssl rand -hex 20),lease-test-admin,lease-test-admin-uid,system:masters" > tokens.csv
  )
}

# ensure_client_pki: a client certificate signed by the cluster CA (trusted by --client-ca-file),
# a CA that signed nothing, and the client-certificate kubeconfig. Idempotent: state written by an
# older version of this script gains them on the next start or restart-apiserver.
ensure_client_pki() {
  [ -f "$PKI/client.crt" ] && [ -f "$PKI/wrong-ca.crt" ] || (
    cd "$PKI"
    openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr \
      -subj "/O=system:masters/CN=lease-test-cert-user" 2>/dev/null
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
      "extendedKeyUsage=clientAuth" > client-ext.cnf
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out client.crt -days 3650 -extfile client-ext.cnf 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -keyout wrong-ca.key -out wrong-ca.crt -days 3650 \
      -subj "/CN=lease-k8s-wrong-ca" 2>/dev/null
  )
}

write_cert_kubeconfig() {
  cat > "$D/kubeconfig-client-cert" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lease-test
  cluster:
    server: https://127.0.0.1:$(cat "$D/api.port")
    certificate-authority: $PKI/ca.crt
users:
- name: lease-test-cert-user
  user:
    client-certificate: $PKI/client.crt
    client-key: $PKI/client.key
contexts:
- name: lease-test
  context: {cluster: lease-test, user: lease-test-cert-user, namespace: default}
current-context: lease-test
EOF
}

readyz() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$PKI/ca.crt" \
      -H "Authorization: Bearer $(cut -d, -f1 "$PKI/tokens.csv")" \
      "https://127.0.0.1:$(cat "$D/api.port")/readyz")" = 200 ]
}

# Starts the apiserver from the state dir (ports and pki written by `start`), waits for /readyz.
start_apiserver() {
  local port; port=$(cat "$D/api.port")
  ensure_client_pki
  setsid nohup "$APISERVER" \
    --etcd-servers="http://127.0.0.1:$(cat "$D/etcd.port")" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" \
    --endpoint-reconciler-type=none \
    --cert-dir="$D/certs" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --token-auth-file="$PKI/tokens.csv" --client-ca-file="$PKI/ca.crt" --authorization-mode=AlwaysAllow \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-cluster-ip-range=10.96.0.0/16 \
    >>"$D/apiserver.log" 2>&1 </dev/null &
  echo $! > "$D/apiserver.pid"
  local i
  for i in $(seq 1 1200); do
    alive apiserver || break
    readyz && { log "kube-apiserver ready on https://127.0.0.1:$port"; return 0; }
    sleep 0.1
  done
  tail -n 30 "$D/apiserver.log" >&2
  return 1
}

# stop_one NAME MARKER: stops the process in $D/NAME.pid if its command line contains MARKER.
stop_one() {
  local f=$D/$1.pid pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2"; then
    kill -TERM "$pid"
    for i in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { log "$1 ($pid) still alive after 20 s, SIGKILL"; kill -KILL "$pid"; }
    log "stopped $1 ($pid)"
  fi
  rm -f "$f"
}

write_env() {
  local kubectl=""; [ -x "$BIN_DIR/kubectl" ] && kubectl=$BIN_DIR/kubectl
  cat > "$STATE_DIR/k8s.env" <<EOF
export KUBECONFIG=$D/kubeconfig
export LEASE_K8S_NAMESPACE=default
export LEASE_K8S_KUBECTL=$kubectl
export LEASE_K8S_RESTART="bash $SELF restart-apiserver"
export LEASE_K8S_CERT_KUBECONFIG=$D/kubeconfig-client-cert
export LEASE_K8S_WRONG_CA=$PKI/wrong-ca.crt
EOF
}

case "${1:-start}" in
prepare)
  # What the apiserver's build needs from apt (packages, the source tree), so that `build` can
  # run in the background beside other apt users; only the packages when the binary is cached.
  need_pkgs curl openssl ca-certificates etcd-server
  mkdir -p "$BIN_DIR"
  exec 9>"$BIN_DIR/.lock"; flock 9
  have_apiserver || fetch_source
  flock -u 9; exec 9>&-
  ;;
build)
  # The apiserver's build alone (after prepare; no apt); nothing when it is cached.
  mkdir -p "$BIN_DIR"
  exec 9>"$BIN_DIR/.lock"; flock 9
  have_apiserver || make_apiserver
  flock -u 9; exec 9>&-
  ;;
start)
  ensure_binaries
  if alive etcd && alive apiserver && [ -f "$STATE_DIR/k8s.env" ] && readyz; then
    if grep -q LEASE_K8S_CERT_KUBECONFIG "$STATE_DIR/k8s.env"; then
      log "kube-apiserver already running"; exit 0
    fi
    # Started by an older version of this script: restart it with --client-ca-file.
    log "restarting kube-apiserver to trust client certificates"
    stop_one apiserver "$PKI/tokens.csv"
    start_apiserver || die "kube-apiserver did not come back"
    write_cert_kubeconfig; write_env; exit 0
  fi
  stop_one apiserver "$PKI/tokens.csv"; stop_one etcd "$D/etcd-data"
  rm -rf "$D"; mkdir -p "$D"
  make_pki
  EPORT=$(free_port "${LEASE_K8S_ETCD_PORT:-32479}")
  PPORT=$(free_port $((EPORT + 1)))
  APORT=$(free_port "${LEASE_K8S_API_PORT:-36543}")
  echo "$EPORT" > "$D/etcd.port"; echo "$APORT" > "$D/api.port"
  log "starting etcd on 127.0.0.1:$EPORT"
  setsid nohup /usr/bin/etcd --name lease-k8s --data-dir "$D/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$EPORT" --advertise-client-urls "http://127.0.0.1:$EPORT" \
    --listen-peer-urls "http://127.0.0.1:$PPORT" --initial-advertise-peer-urls "http://127.0.0.1:$PPORT" \
    --initial-cluster "lease-k8s=http://127.0.0.1:$PPORT" \
    >"$D/etcd.log" 2>&1 </dev/null &
  echo $! > "$D/etcd.pid"
  wait_until 30 sh -c "curl -sf http://127.0.0.1:$EPORT/health | grep -q true" \
    || { tail -n 20 "$D/etcd.log" >&2; stop_one etcd "$D/etcd-data"; die "etcd did not become healthy"; }
  log "starting kube-apiserver on 127.0.0.1:$APORT"
  start_apiserver || { stop_one apiserver "$PKI/tokens.csv"; stop_one etcd "$D/etcd-data"; die "kube-apiserver not ready"; }
  cat > "$D/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lease-test
  cluster:
    server: https://127.0.0.1:$APORT
    certificate-authority: $PKI/ca.crt
users:
- name: lease-test-admin
  user:
    token: $(cut -d, -f1 "$PKI/tokens.csv")
contexts:
- name: lease-test
  context: {cluster: lease-test, user: lease-test-admin, namespace: default}
current-context: lease-test
EOF
  write_cert_kubeconfig
  touch "$STATE_DIR/k8s.started"
  write_env
  ;;
restart-apiserver)
  [ -f "$D/api.port" ] && alive etcd || die "no kube-apiserver state in $D (run start first)"
  stop_one apiserver "$PKI/tokens.csv"
  start_apiserver || die "kube-apiserver did not come back"
  write_cert_kubeconfig
  [ -f "$STATE_DIR/k8s.env" ] && write_env
  ;;
stop)
  # stop only what this script started (not an apiserver that was already running)
  [ -f "$STATE_DIR/k8s.started" ] || exit 0
  rm -f "$STATE_DIR/k8s.started"
  stop_one apiserver "$PKI/tokens.csv"
  stop_one etcd "$D/etcd-data"
  rm -f "$STATE_DIR/k8s.env"
  ;;
*) die "usage: $0 start|stop|restart-apiserver|prepare|build" ;;
esac
