# Shared by the scripts in scripts/: paths, ports and package installation.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.local"
PG_PORT="${RAILHOOK_PG_PORT:-54329}"
KAFKA_PORT="${RAILHOOK_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${RAILHOOK_KAFKA_CONTROLLER_PORT:-19093}"
PG_DIR="$STATE/pg"
PG_DATA="$PG_DIR/data"
PG_LOG="$PG_DIR/postgres.log"
KAFKA_DIR="$STATE/kafka"
KAFKA_LIBS="$KAFKA_DIR/libs"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_LOG="$KAFKA_DIR/kafka.log"
KAFKA_PID="$KAFKA_DIR/kafka.pid"

export RAILHOOK_DATABASE_URL="${RAILHOOK_DATABASE_URL:-postgres://railhook@127.0.0.1:$PG_PORT/railhook}"
export RAILHOOK_KAFKA_BROKERS="${RAILHOOK_KAFKA_BROKERS:-127.0.0.1:$KAFKA_PORT}"

log() { printf '\033[1m[%s]\033[0m %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# apt-get install for whatever of the named packages is missing; `apt-get update` only once.
APT_UPDATED=0
ensure_apt() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  if [ "$APT_UPDATED" -eq 0 ]; then
    log "apt-get update"
    $sudo apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
  fi
  command -v cargo >/dev/null 2>&1 || die "cargo is not installed: install Rust with rustup (https://rustup.rs) and rerun"
}

# What the fault-injection suite (crates/railhook-chaos; its quick mode runs in scripts/test)
# needs beside Postgres and Kafka: Toxiproxy, the fault-injecting TCP proxy between the
# processes and the servers (a Go module, built with `go install` from the Go module proxy
# into .local/toxiproxy/bin; Go from Debian when the machine has none).
TOXIPROXY_VERSION="v2.5.0"
TOXIPROXY_BIN="$STATE/toxiproxy/bin/toxiproxy-server"
ensure_chaos_tools() {
  if [ ! -x "$TOXIPROXY_BIN" ]; then
    if ! command -v go >/dev/null 2>&1; then
      [ -x /usr/local/go/bin/go ] && export PATH="/usr/local/go/bin:$PATH"
    fi
    command -v go >/dev/null 2>&1 || ensure_apt golang-go
    log "installing toxiproxy-server $TOXIPROXY_VERSION (go install github.com/Shopify/toxiproxy/v2/cmd/server)"
    local gobin
    gobin="$(mktemp -d)"
    GOBIN="$gobin" go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >&2
    mkdir -p "$(dirname "$TOXIPROXY_BIN")"
    mv "$gobin/server" "$TOXIPROXY_BIN"
    rm -rf "$gobin"
  fi
  export RAILHOOK_TOXIPROXY_BIN="$TOXIPROXY_BIN"
}

# The `cargo` target directory, shared by every checkout of this machine when
# CARGO_TARGET_DIR is set; ./target otherwise.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The receiver kit's example receivers (examples/receiver-python, examples/receiver-node),
# which crates/railhook/tests/receivers_process.rs starts against a running Railhook: their
# pinned packages, installed beside them (gitignored) and again only when the pins change.
# Python: a venv with examples/receiver-python/requirements.txt (standardwebhooks, psycopg).
# Node: `npm ci` from examples/receiver-node/package-lock.json (standardwebhooks, pg).
ensure_receiver_examples() {
  local py="$ROOT/examples/receiver-python" node="$ROOT/examples/receiver-node"
  command -v python3 >/dev/null 2>&1 || ensure_apt python3
  python3 -c 'import venv, ensurepip' 2>/dev/null || ensure_apt python3-venv
  if ! cmp -s "$py/requirements.txt" "$py/.venv/installed-requirements.txt"; then
    log "installing the Python example receiver's packages (examples/receiver-python/.venv)"
    rm -rf "$py/.venv"
    python3 -m venv "$py/.venv"
    "$py/.venv/bin/pip" install -q --disable-pip-version-check -r "$py/requirements.txt"
    cp "$py/requirements.txt" "$py/.venv/installed-requirements.txt"
  fi
  command -v node >/dev/null 2>&1 || ensure_apt nodejs
  command -v npm >/dev/null 2>&1 || ensure_apt npm
  if ! cmp -s "$node/package-lock.json" "$node/node_modules/installed-package-lock.json"; then
    log "installing the Node example receiver's packages (examples/receiver-node/node_modules)"
    (cd "$node" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$node/package-lock.json" "$node/node_modules/installed-package-lock.json"
  fi
}

# ---------------------------------------------------------------------------------------
# helm, for the chart in deploy/helm/railhook (scripts/test lints and renders it; tests/helm.rs
# reads the rendered YAML). Built with `go install` from the Go module proxy into
# .local/helm/bin, like toxiproxy above; no download from helm.sh. Beside it
# railhook-chart-validate (deploy/helm/validate, Go 1.26): decodes the rendered objects strictly
# into the Kubernetes API types, in place of kubeconform, which fetches its JSON schemas from
# GitHub at run time (docs/OPERATIONS.md). Rebuilt each time; Go's build cache makes that quick.
HELM_VERSION="v4.3.2"
HELM_BIN="$STATE/helm/bin/helm"
ensure_helm() {
  if ! command -v go >/dev/null 2>&1; then
    [ -x /usr/local/go/bin/go ] && export PATH="/usr/local/go/bin:$PATH"
  fi
  command -v go >/dev/null 2>&1 || ensure_apt golang-go
  # `go install` leaves the patch version out of `helm version`; the file beside it says which.
  if [ ! -x "$HELM_BIN" ] || [ "$(cat "$STATE/helm/version" 2>/dev/null)" != "$HELM_VERSION" ]; then
    log "installing helm $HELM_VERSION (go install helm.sh/helm/v4/cmd/helm)"
    mkdir -p "$(dirname "$HELM_BIN")"
    GOBIN="$(dirname "$HELM_BIN")" go install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
    echo "$HELM_VERSION" >"$STATE/helm/version"
  fi
  (cd "$ROOT/deploy/helm/validate" && go build -o "$STATE/helm/bin/railhook-chart-validate" .) >&2
  export RAILHOOK_HELM="$HELM_BIN"
  export RAILHOOK_CHART_VALIDATE="$STATE/helm/bin/railhook-chart-validate"
}

# ---------------------------------------------------------------------------------------
# Jaeger, the trace collector of the OpenTelemetry test (crates/railhook/tests/tracing.rs,
# docs/TRACING.md): receives OTLP over HTTP and answers its query API. Built from the Go
# module proxy into .local/jaeger/bin, like helm above (no container, no download from
# GitHub releases). `RAILHOOK_JAEGER` tells the test where it is; without it the test skips.
JAEGER_VERSION="v1.75.0"
JAEGER_BIN="$STATE/jaeger/bin/jaeger"
ensure_jaeger() {
  if ! command -v go >/dev/null 2>&1; then
    [ -x /usr/local/go/bin/go ] && export PATH="/usr/local/go/bin:$PATH"
  fi
  command -v go >/dev/null 2>&1 || ensure_apt golang-go
  if [ ! -x "$JAEGER_BIN" ] || [ "$(cat "$STATE/jaeger/version" 2>/dev/null)" != "$JAEGER_VERSION" ]; then
    # Jaeger's go.mod has replace directives, which `go install pkg@version` refuses: a
    # module of our own requires it as a tool (`go get -tool`) and builds that.
    log "building jaeger $JAEGER_VERSION (go get -tool github.com/jaegertracing/jaeger/cmd/jaeger)"
    local mod="$STATE/jaeger/mod"
    rm -rf "$mod" && mkdir -p "$mod" "$(dirname "$JAEGER_BIN")"
    (cd "$mod" && go mod init railhook.local/jaeger >/dev/null 2>&1 \
      && go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION" \
      && go build -o "$JAEGER_BIN" github.com/jaegertracing/jaeger/cmd/jaeger) >&2 || return 1
    echo "$JAEGER_VERSION" >"$STATE/jaeger/version"
  fi
  export RAILHOOK_JAEGER="$JAEGER_BIN"
}
