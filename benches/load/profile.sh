#!/usr/bin/env bash
# CPU profile of portcullis (gates off, gates on) and bare Pingora under the
# same wrk load as run.sh and the same conf/ templates, with
# `perf record -e cpu-clock` (software clock: works in VMs without hardware
# counters). Writes the per-target dumps (top symbols, DSOs, inclusive frames,
# malloc callers, attribution) to benches/load/out/profile/ (ignored by git)
# and a short summary of them to benches/load/results/profile.md (committed;
# benches/history/2026-11-passes.md "Where the time goes" cites it).
#
#   bash benches/load/profile.sh          # after run.sh has built the binaries
#   DURATION=10 FREQ=999 CALLGRAPH=1 bash benches/load/profile.sh
#   OUT=dir SUMMARY=file                  # elsewhere (SUMMARY=- : stdout only)
#
# Needs `perf` (Debian: linux-perf; installed when missing). Loopback only;
# every process started here is stopped by PID on exit.
set -euo pipefail
# report pipelines end in `head`; a SIGPIPE upstream is expected there
set +o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-10}
FREQ=${FREQ:-999}
CALLGRAPH=${CALLGRAPH:-1}
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
OUT=${OUT:-$HERE/out/profile}
SUMMARY=${SUMMARY:-$HERE/results/profile.md}
PROXY_THREADS=${PROXY_THREADS:-2}
TARGETS=${TARGETS:-"pc_off bare pc_on"}
export LB_KEYS=8

log() { printf '[profile %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"

if ! command -v perf >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || die "perf missing: sudo apt-get install -y linux-perf"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null
fi
perf stat -e cpu-clock true >/dev/null 2>&1 || die "perf cannot count cpu-clock here (perf_event_paranoid?)"
if [ ! -x "$TARGET_DIR/release/portcullis" ] || [ ! -x "$TARGET_DIR/release/examples/bare_pingora" ]; then
  die "build first: cargo build --release --bin portcullis --example bare_pingora"
fi

TMP=$(mktemp -d /tmp/portcullis-prof.XXXXXX)
declare -a PIDS=()
cleanup() {
  local rc=$? p
  set +e
  for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cp "$TARGET_DIR/release/portcullis" "$TMP/portcullis"
cp "$TARGET_DIR/release/examples/bare_pingora" "$TMP/bare_pingora"
read -r P_BACK P_OFF A_OFF P_ON A_ON P_BARE P_REDIS < <(free_ports 7)
mkdir -p "$TMP/nginx-tmp"
common=(TMP="$TMP" THREADS="$PROXY_THREADS" BACKEND_PORT="$P_BACK" REDIS_PORT="$P_REDIS")
render "$HERE/conf/backend.nginx.conf" "$TMP/backend.conf" "${common[@]}"
render "$HERE/conf/bare_pingora.args" "$TMP/bare.args" "${common[@]}" PORT="$P_BARE"
read -r -a BARE_ARGS < <(grep -v '^#' "$TMP/bare.args")
pc() { # pc NAME TEMPLATE PORT ADMIN
  render "$HERE/conf/portcullis-$2.toml" "$TMP/$1.toml" "${common[@]}" NAME="$1" PORT="$3" ADMIN_PORT="$4"
  "$TMP/portcullis" -c "$TMP/$1.toml" --check >/dev/null || die "bad config $1"
}
pc pc_off gates-off "$P_OFF" "$A_OFF"
pc pc_on gates-on "$P_ON" "$A_ON"

start() { local n=$1; shift; "$@" >"$TMP/$n.log" 2>&1 & PIDS+=("$!"); eval "PID_$n=$!"; }
start backend nginx -p "$TMP" -c "$TMP/backend.conf" -e "$TMP/backend.err"
start redis redis-server --port "$P_REDIS" --bind 127.0.0.1 --save "" --appendonly no
start pc_off "$TMP/portcullis" -c "$TMP/pc_off.toml"
start pc_on "$TMP/portcullis" -c "$TMP/pc_on.toml"
start bare "$TMP/bare_pingora" "${BARE_ARGS[@]}"
for u in "http://127.0.0.1:$P_BACK/" "http://127.0.0.1:$A_OFF/readyz" "http://127.0.0.1:$A_ON/readyz" "http://127.0.0.1:$P_BARE/"; do
  for _ in $(seq 1 100); do curl -s -o /dev/null -m 1 "$u" && break; sleep 0.1; done
done
declare -A URL=([pc_off]="http://127.0.0.1:$P_OFF/" [pc_on]="http://127.0.0.1:$P_ON/" [bare]="http://127.0.0.1:$P_BARE/")

mkdir -p "$OUT"
for t in $TARGETS; do
  pid_var=PID_$t
  pid=${!pid_var}
  log "$t (pid $pid): warm-up, then perf record ${DURATION}s at ${FREQ} Hz"
  timeout 20 wrk -t2 -c64 -d2s -s "$HERE/keys.lua" "${URL[$t]}" >/dev/null 2>&1 || true
  timeout $((DURATION + 20)) wrk -t2 -c64 -d$((DURATION + 2))s -s "$HERE/keys.lua" "${URL[$t]}" >"$OUT/$t.wrk.txt" 2>&1 &
  wrk_pid=$!
  PIDS+=("$wrk_pid")
  sleep 1
  perf record -q -e cpu-clock -F "$FREQ" -p "$pid" -o "$TMP/$t.data" -- sleep "$DURATION" 2>/dev/null
  wait "$wrk_pid" || true
  perf report -i "$TMP/$t.data" --no-children --sort symbol --stdio 2>/dev/null |
    grep -v '^#' | grep -v '^$' | sed 's/[[:space:]-]*$//' | head -n 60 >"$OUT/$t.symbols.txt"
  perf report -i "$TMP/$t.data" --no-children --sort dso --stdio 2>/dev/null |
    grep -v '^#' | grep -v '^$' | sed 's/[[:space:]-]*$//' | head -n 20 >"$OUT/$t.dso.txt"
  if [ "$CALLGRAPH" = 1 ]; then
    # inclusive view: a shorter DWARF-unwound sample (frame pointers are off)
    timeout 30 wrk -t2 -c64 -d9s -s "$HERE/keys.lua" "${URL[$t]}" >/dev/null 2>&1 &
    wrk_pid=$!
    PIDS+=("$wrk_pid")
    sleep 1
    perf record -q -e cpu-clock -F "${CG_FREQ:-399}" --call-graph dwarf,32768 -p "$pid" -o "$TMP/$t.cg.data" -- sleep 6 2>/dev/null
    wait "$wrk_pid" || true
    # inclusive time of the frames that matter (the full list is mostly inlined async glue)
    perf report -i "$TMP/$t.cg.data" --children --sort symbol --stdio -g none 2>/dev/null |
      grep -v '^#' | grep -v '^$' | sed 's/[[:space:]-]*$//' |
      grep -E 'portcullis::|ProxyHttp|proxy_trait|HttpPeer|register_timer|TimerManager|prometheus|tracing|arc_swap|libc_malloc|__libc_free|cfree|realloc|malloc_consolidate|fmt::|format|insert_header|append_header|write_response_header|read_request|proxy_handle_upstream|proxy_handle_downstream|upstream_peer|get_http_session|release_http_session|sendto|recvfrom|epoll_wait|futex|sched_yield|schedule' |
      head -n 150 >"$OUT/$t.inclusive.txt"
    # who calls malloc (caller graph, folded stacks, top 40)
    perf report -i "$TMP/$t.cg.data" --no-children --sort symbol --stdio -G -g folded,0.5,caller,function,percent \
      --symbols=malloc,_int_malloc,realloc,_int_realloc,cfree@GLIBC_2.2.5,_int_free,malloc_consolidate 2>/dev/null |
      grep -v '^#' | grep -v '^$' | sed 's/[[:space:]-]*$//' | head -n 200 >"$OUT/$t.malloc_callers.txt"
    # portcullis hooks and allocator callers, attributed per sample
    perf script -i "$TMP/$t.cg.data" -F comm,tid,ip,sym 2>/dev/null | python3 "$HERE/perf_attr.py" >"$OUT/$t.attr.txt"
    [ -n "${PERF_KEEP:-}" ] && mkdir -p "$PERF_KEEP" && cp "$TMP/$t.data" "$TMP/$t.cg.data" "$PERF_KEEP/"
  fi
done
PROFILE_NOTE="Profiled $(date -u +%Y-%m-%dT%H:%M:%SZ), portcullis at \`$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')\`, PROXY_THREADS=$PROXY_THREADS."
export PROFILE_NOTE
# shellcheck disable=SC2086 # a list of names
python3 "$HERE/profile_summary.py" "$OUT" $TARGETS >"$TMP/summary.md"
if [ "$SUMMARY" = - ]; then
  cat "$TMP/summary.md"
else
  cp "$TMP/summary.md" "$SUMMARY"
fi
log "done: dumps in $OUT, summary in $SUMMARY"
