# Helpers shared by the scripts of benches/load (sourced, not run). Needs log/die.
# shellcheck shell=bash

# render TEMPLATE OUT KEY=VALUE...: copy a conf/ template to OUT with every
# {{KEY}} replaced by VALUE (a later KEY=... overrides an earlier one); fails
# if a {{UPPER_CASE}} placeholder is left.
render() {
  local src=$1 out=$2 text kv k
  local -A val=()
  shift 2
  [ -f "$src" ] || die "template missing: $src"
  for kv in "$@"; do val[${kv%%=*}]=${kv#*=}; done
  text=$(<"$src")
  for k in "${!val[@]}"; do
    text=${text//"{{$k}}"/"${val[$k]}"}
  done
  if [[ $text =~ \{\{[A-Z_]+\}\} ]]; then
    die "$src: placeholder ${BASH_REMATCH[0]} not filled"
  fi
  printf '%s\n' "$text" >"$out"
}

# free_ports N: N distinct free loopback ports, space-separated.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# The rest serves the per-request counters (callgrind.sh, syscalls.sh, kstat.sh).

# bench_init NAME: REPO, CONF, TARGET_DIR and log/die (lines prefixed [NAME]) of a
# script in benches/load that has set HERE and sourced this file.
bench_init() {
  BENCH=$1
  REPO=$(cd "$HERE/../.." && pwd)
  CONF=$HERE/conf
  TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
  log() { printf '[%s %s] %s\n' "$BENCH" "$(date +%H:%M:%S)" "$*" >&2; }
  die() { log "ERROR: $*"; exit 1; }
}

# need TOOL...: dies unless every TOOL is on PATH (or in /usr/sbin).
need() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || [ -x "/usr/sbin/$t" ] || die "missing $t (scripts/setup.sh)"
  done
}

# bench_tmp NAME: TMP becomes a fresh /tmp/portcullis-NAME.XXXXXX; on exit every
# PID in PIDS is stopped (INT, then KILL) and TMP removed.
bench_tmp() {
  TMP=$(mktemp -d "/tmp/portcullis-$1.XXXXXX")
  PIDS=()
  trap bench_cleanup EXIT INT TERM
}
bench_cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}

# stop_pid PID: SIGINT, up to 10 s to exit, then SIGKILL; reaps it.
stop_pid() {
  local pid=$1
  kill -INT "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# wait_port PORT: until 127.0.0.1:PORT accepts a connection (2 min at most).
wait_port() {
  for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.2; done
  die "port $1 never opened"
}

# wait_http URL: until URL answers over HTTP (2 min at most).
wait_http() {
  local url=$1 i
  for ((i = 0; i < 600; i++)); do
    curl -s -o /dev/null -m 2 "$url" && return 0
    sleep 0.2
  done
  die "$url did not answer"
}

# start_backend PORT: the nginx backend of run.sh on PORT, config in $TMP.
start_backend() {
  mkdir -p "$TMP/nginx-tmp"
  render "$CONF/backend.nginx.conf" "$TMP/backend.conf" TMP="$TMP" BACKEND_PORT="$1"
  /usr/sbin/nginx -p "$TMP" -c "$TMP/backend.conf" -e "$TMP/backend.err" &
  PIDS+=($!)
  wait_port "$1"
}

# start_redis PORT: a throw-away redis-server on PORT (no persistence).
start_redis() {
  redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" >/dev/null &
  PIDS+=($!)
  wait_port "$1"
}

# set_header_case FILE true|false: server.preserve_header_case in a rendered config
# (the pc_lc and pc_case targets).
set_header_case() {
  sed -i "s/^\\[server\\]\$/[server]\\npreserve_header_case = $2/" "$1"
  grep -q "^preserve_header_case = $2\$" "$1" || die "$1: no [server] table to set preserve_header_case in"
}

# start_cmd TARGET: the command line of the proxy under test (config rendered into
# $TMP). Uses MODE (h1 | h1close | h2tls), PROXY_THREADS, P_PROXY, P_BACKEND, P_REDIS,
# P_ADMIN, PC_BIN, BARE_BIN, PC_PREV_BIN (pc_on_prev); h2tls needs $TMP/cert.pem, key.pem, haproxy.pem.
start_cmd() {
  local t=$1
  local common=(TMP="$TMP" THREADS="$PROXY_THREADS" BACKEND_PORT="$P_BACKEND" REDIS_PORT="$P_REDIS" ADMIN_PORT="$P_ADMIN" NAME="$t")
  case $t in
    haproxy)
      # fe503 (run.sh's shed scenario) is not measured here: any free port
      render "$CONF/haproxy.cfg" "$TMP/haproxy.cfg" "${common[@]}" PORT="$P_PROXY" PORT503="$(free_ports 1)"
      if [ "$MODE" = h2tls ]; then
        sed -i "s|bind 127.0.0.1:$P_PROXY|bind 127.0.0.1:$P_PROXY ssl crt $TMP/haproxy.pem alpn h2,http/1.1|" "$TMP/haproxy.cfg"
      fi
      echo "haproxy -f $TMP/haproxy.cfg -db" ;;
    bare)
      [ "$MODE" != h2tls ] || die "bare Pingora has no TLS listener here"
      echo "$BARE_BIN 127.0.0.1:$P_PROXY 127.0.0.1:$P_BACKEND $PROXY_THREADS" ;;
    pc_off | pc_on | pc_lc | pc_case | pc_on_prev)
      # pc_lc: gates on, server.preserve_header_case = false (the default, set explicitly);
      # pc_case: gates on, server.preserve_header_case = true;
      # pc_on_prev: gates on, run by PC_PREV_BIN (another build, e.g. before a change)
      local tpl=portcullis-gates-off.toml bin=$PC_BIN
      if [ "$t" = pc_on_prev ]; then
        [ -x "${PC_PREV_BIN:-}" ] || die "target pc_on_prev needs PC_PREV_BIN (a portcullis binary)"
        bin=$PC_PREV_BIN
      fi
      [ "$t" != pc_off ] && tpl=portcullis-gates-on.toml
      if [ "$MODE" = h2tls ]; then
        # plain listener on a spare port; the TLS listener is the one measured
        local spare
        spare=$(free_ports 1)
        render "$CONF/$tpl" "$TMP/$t.toml" "${common[@]}" PORT="$spare"
        printf '\n[tls]\nlisten = ["127.0.0.1:%s"]\n[[tls.certificates]]\ncert = "%s"\nkey = "%s"\n' \
          "$P_PROXY" "$TMP/cert.pem" "$TMP/key.pem" >>"$TMP/$t.toml"
      else
        render "$CONF/$tpl" "$TMP/$t.toml" "${common[@]}" PORT="$P_PROXY"
      fi
      case $t in
        pc_lc) set_header_case "$TMP/$t.toml" false ;;
        pc_case) set_header_case "$TMP/$t.toml" true ;;
      esac
      # ROUTES=N: N more routes (`/r0/` … to the same upstream), none of which the
      # measured requests (`/`) match: the cost of route lookup with many routes
      if [ "${ROUTES:-0}" -gt 0 ]; then
        python3 -c 'import sys
for i in range(int(sys.argv[1])):
    print(f"[[routes]]\npath_prefix = \"/r{i}/\"\nupstream = \"app\"")' "$ROUTES" >>"$TMP/$t.toml"
      fi
      # RULE=route: one route matching the measured requests (`/`), without rules;
      # RULE=set: the same route with one header rule (request_headers.set): the cost of
      # an edge rule on the matched route (compare the two)
      case ${RULE:-} in
        "") ;;
        route) printf '\n[[routes]]\npath_prefix = "/"\nupstream = "app"\n' >>"$TMP/$t.toml" ;;
        set) printf '\n[[routes]]\npath_prefix = "/"\nupstream = "app"\nrequest_headers = { set = { "x-forwarded-proto" = "https" } }\n' >>"$TMP/$t.toml" ;;
        *) die "RULE=$RULE: route or set" ;;
      esac
      # LIMITS=1: the backend as a table with max_conn (never reached) and a second,
      # backup backend (the same address's twin on another port is not needed: a backup
      # is never chosen while the primary has room): the cost of max_conn/backup selection
      if [ "${LIMITS:-0}" = 1 ]; then
        sed -i "s|^backends = \[\"127.0.0.1:$P_BACKEND\"\]|backends = [{ address = \"127.0.0.1:$P_BACKEND\", max_conn = 1000000 }, { address = \"127.0.0.1:1\", backup = true }]|" "$TMP/$t.toml"
        grep -q "max_conn = 1000000" "$TMP/$t.toml" || die "LIMITS=1: no backends line to rewrite in $TMP/$t.toml"
      fi
      # TENANTS=N: N tenants in a tenants file, the last holding the requests' key (k1),
      # on a tier with limits that never bind: the cost of the tenant gate (CONTRACT §14)
      if [ "${TENANTS:-0}" -gt 0 ]; then
        python3 - "$TENANTS" "$TMP/$t-tenants.toml" "${API_KEY-k1}" <<'PY'
import hashlib, sys
n, path, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(path, "w") as f:
    for i in range(n):
        k = key if i == n - 1 else f"other-{i}"
        h = hashlib.sha256(k.encode()).hexdigest()
        f.write(f'[[tenant]]\nname = "t{i}"\ntier = "bench"\nkeys = ["sha256:{h}"]\n')
PY
        printf '\n[tenants]\nfile = "%s"\n\n[tiers.bench]\nlimit = 1000000000\nconcurrency = 100000\n' \
          "$TMP/$t-tenants.toml" >>"$TMP/$t.toml"
      fi
      echo "$bin -c $TMP/$t.toml" ;;
    pc_log_off | pc_log_all | pc_log_1pct)
      # gates off with the access log as the only variable (conf/portcullis-accesslog.toml,
      # as run.sh's `accesslog` part): off, every request (sample 1.0), 1 in 100 (0.01);
      # the log goes to $TMP/TARGET-access.log. The targets of ACCESS_LOG=1 (access_log_option).
      [ "$MODE" != h2tls ] || die "$t is measured on plain HTTP/1.1 only"
      local enabled=true sample=1.0
      case $t in
        pc_log_off) enabled=false ;;
        pc_log_1pct) sample=0.01 ;;
      esac
      render "$CONF/portcullis-accesslog.toml" "$TMP/$t.toml" "${common[@]}" PORT="$P_PROXY" \
        LOG_ENABLED="$enabled" LOG_SAMPLE="$sample"
      echo "$PC_BIN -c $TMP/$t.toml" ;;
    pc_shed)
      # cap 1, held by one request parked on HANG_PORT (see hold_shed_slot)
      [ "$MODE" != h2tls ] || die "pc_shed is measured on HTTP/1.1 only"
      render "$CONF/portcullis-shed.toml" "$TMP/$t.toml" "${common[@]}" PORT="$P_PROXY" HANG_PORT="$P_HANG"
      echo "$PC_BIN -c $TMP/$t.toml" ;;
    *) die "unknown target $t" ;;
  esac
}

# requests N [CONNS]: N requests to the proxy on P_PROXY over CONNS (default
# $CONNS) keep-alive connections, h2load with H2LOAD_ARGS (default --h1) and
# SCHEME (default http), with `x-api-key: $API_KEY` (default k1; none if API_KEY
# is set empty); dies unless all N answer 2xx (5xx with EXPECT=5xx).
requests() {
  local n=$1 c=${2:-$CONNS} out ok args=(--h1) col=3
  [ "${EXPECT:-2xx}" = 5xx ] && col=9
  [ -n "${H2LOAD_ARGS+x}" ] && args=("${H2LOAD_ARGS[@]}")
  local key=${API_KEY-k1}
  [ -n "$key" ] && args+=(-H "x-api-key: $key")
  # HEADER: one more request field, e.g. "connection: keep-alive" as browsers send
  [ -n "${HEADER:-}" ] && args+=(-H "$HEADER")
  if [ "${MODE:-h1}" = h1close ]; then
    # A connection per request: batches of CONNS connections of one request each (so at
    # most CONNS are open at once, as with keep-alive), every request saying
    # `Connection: close` (the proxy closes after its response).
    local left=$n b got total=0
    while [ "$left" -gt 0 ]; do
      b=$((left < c ? left : c))
      out=$(h2load "${args[@]}" -H "connection: close" -n "$b" -c "$b" \
        "${SCHEME:-http}://127.0.0.1:$P_PROXY/" 2>&1)
      got=$(echo "$out" | awk -v c="$col" '/^status codes:/{print $c}')
      total=$((total + ${got:-0}))
      left=$((left - b))
    done
    ok=$total
  else
    out=$(h2load "${args[@]}" -n "$n" -c "$c" "${SCHEME:-http}://127.0.0.1:$P_PROXY/" 2>&1)
    ok=$(echo "$out" | awk -v c="$col" '/^status codes:/{print $c}')
  fi
  [ "${ok:-0}" = "$n" ] || die "expected $n ${EXPECT:-2xx}, got ${ok:-0}: $(echo "$out" | grep -E '^(requests|status)')"
}

# build_release: cargo build --release of portcullis and bare_pingora unless SKIP_BUILD=1.
build_release() {
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    (cd "$REPO" && cargo build --release --bin portcullis --example bare_pingora) >&2
  fi
}

# stale_check BIN...: with SKIP_BUILD=1, stop when a Rust source or manifest it is built
# from (vendor/, Cargo.toml, Cargo.lock, and src/ for portcullis or examples/ for
# bare_pingora) is newer than a binary about to be measured, so a
# figure of an old build is never reported as the current one. (Issue 16's tenth pass did
# that: its bare Pingora had been built before two of the vendored patches, and measured
# 71.9k instructions per request where the current build runs 60.0k.) ALLOW_STALE=1
# measures it anyway. A binary given by path (PC_BIN=, PC_PREV_BIN=) is not checked.
stale_check() {
  [ "${SKIP_BUILD:-0}" = 1 ] && [ "${ALLOW_STALE:-0}" != 1 ] || return 0
  local bin own newer
  for bin in "$@"; do
    [ -e "$bin" ] || die "no $bin: build it, or run without SKIP_BUILD=1"
    own=src
    [ "$(basename "$bin")" = bare_pingora ] && own=examples
    newer=$(cd "$REPO" && find "$own" vendor Cargo.toml Cargo.lock -type f \
      \( -name '*.rs' -o -name Cargo.toml -o -name Cargo.lock \) -newer "$bin" -print -quit)
    [ -z "$newer" ] || die "SKIP_BUILD=1 but $bin is older than $newer: rebuild (cargo build --release --bin portcullis --example bare_pingora), or ALLOW_STALE=1"
  done
}

# proxy_fixture: for callgrind.sh/syscalls.sh: builds (build_release), sets PC_BIN
# and BARE_BIN, TMP (bench_tmp), the ports P_BACKEND P_PROXY P_ADMIN P_REDIS, and
# starts the nginx backend and redis.
proxy_fixture() {
  build_release
  # only the binaries the run measures (TARGETS is set by every caller)
  case " $TARGETS " in *" pc_"*) [ -n "${PC_BIN:-}" ] || stale_check "$TARGET_DIR/release/portcullis" ;; esac
  case " $TARGETS " in *" bare "*) [ -n "${BARE_BIN:-}" ] || stale_check "$TARGET_DIR/release/examples/bare_pingora" ;; esac
  PC_BIN=${PC_BIN:-$TARGET_DIR/release/portcullis}
  BARE_BIN=${BARE_BIN:-$TARGET_DIR/release/examples/bare_pingora}
  bench_tmp "$BENCH"
  read -r P_BACKEND P_PROXY P_ADMIN P_REDIS < <(free_ports 4)
  start_backend "$P_BACKEND"
  start_redis "$P_REDIS"
}

# start_target T WARM: starts target T (start_cmd) in the background, its output in
# $TMP/T.log, waits for its port and sends WARM requests; its PID goes in PIDS and
# TARGET_PID.
start_target() {
  local cmd
  cmd=$(start_cmd "$1")
  # shellcheck disable=SC2086
  $cmd >"$TMP/$1.log" 2>&1 &
  TARGET_PID=$!
  PIDS+=("$TARGET_PID")
  wait_port "$P_PROXY"
  requests "$2"
}

# client_mode: h2load's SCHEME and H2LOAD_ARGS for MODE: HTTP/1.1 keep-alive (h1), HTTP/1.1
# with a new connection per request (h1close, see `requests`), or
# HTTP/2 over TLS with STREAMS (10) concurrent streams per connection (h2tls), for which
# it also writes the proxies' self-signed certificate ($TMP/cert.pem, key.pem,
# haproxy.pem).
client_mode() {
  SCHEME=http
  H2LOAD_ARGS=(--h1)
  if [ "$MODE" = h2tls ]; then
    SCHEME=https
    H2LOAD_ARGS=(-m "${STREAMS:-10}")
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
      -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null
    cat "$TMP/cert.pem" "$TMP/key.pem" >"$TMP/haproxy.pem"
  fi
}

# access_log_option: true when ACCESS_LOG is 1 or true (callgrind.sh, syscalls.sh): the
# access-log comparison, which measures targets pc_log_off pc_log_all pc_log_1pct (start_cmd)
# unless TARGETS names others, sends no x-api-key (unless API_KEY is set) and lets each
# script use its own defaults for that comparison. False for 0, false or unset.
access_log_option() {
  case ${ACCESS_LOG:-0} in
    1 | true) return 0 ;;
    0 | false) return 1 ;;
    *) die "ACCESS_LOG is 1 (or true) or 0 (or false), not '$ACCESS_LOG'" ;;
  esac
}

# counter_defaults H2TLS_TARGETS: the settings callgrind.sh and syscalls.sh share, each
# kept when already set. With ACCESS_LOG (access_log_option): TARGETS the three
# access-log targets and API_KEY empty. Then TARGETS H2TLS_TARGETS with MODE=h2tls, else
# "haproxy bare pc_off pc_on"; PROXY_THREADS 1; OUT benches/load/out/BENCH (created).
# True when ACCESS_LOG is on, so the caller can set its own defaults for it.
counter_defaults() {
  local log=1
  if access_log_option; then
    log=0
    TARGETS=${TARGETS:-pc_log_off pc_log_all pc_log_1pct}
    API_KEY=${API_KEY-}
  fi
  if [ "$MODE" = h2tls ]; then TARGETS=${TARGETS:-$1}; else TARGETS=${TARGETS:-haproxy bare pc_off pc_on}; fi
  PROXY_THREADS=${PROXY_THREADS:-1}
  OUT=${OUT:-$HERE/out/$BENCH}
  mkdir -p "$OUT" || die "cannot create $OUT"
  return "$log"
}

# log_settle TARGET SECONDS: for an access-log target (pc_log_*), wait SECONDS so its log
# writer, which lingers 50 ms before a write, has written what the last requests logged.
log_settle() {
  case $1 in pc_log_*) sleep "$2" ;; esac
}
