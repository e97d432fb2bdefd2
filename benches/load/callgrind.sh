#!/usr/bin/env bash
# Instructions per request under callgrind: noise-immune on a shared machine.
# Each proxy runs under `valgrind --tool=callgrind` in front of the same nginx
# backend; after a warm-up, counters are zeroed, N1 requests are sent and the
# counters dumped, then N2 requests and dumped again (a dump resets them). The
# fixed costs (connection set-up, idle timers) cancel out of
#     instructions/request = (I2 - I1) / (N2 - N1)
# and the same difference of the malloc-family call counts gives allocations
# per request. The N2 dump of each target is annotated per function
# (inclusive), divided by N2.
#
#   bash benches/load/callgrind.sh                      # HTTP/1.1 keep-alive, 1 thread
#   MODE=h2tls bash benches/load/callgrind.sh           # HTTP/2 over TLS (ALPN h2)
#   TARGETS="bare pc_off" N1=500 N2=2500 bash benches/load/callgrind.sh
#   ACCESS_LOG=1 bash benches/load/callgrind.sh         # access log off / sample 1.0 / 0.01
#
# Environment: TARGETS ("haproxy bare pc_off pc_on"; MODE=h2tls: "haproxy pc_off";
# pc_lc: pc_on with server.preserve_header_case = false (the default) set explicitly;
# pc_case: pc_on with server.preserve_header_case = true;
# pc_shed: every request answered 503 by the shedder, cap 1 held by a parked request;
# pc_log_off, pc_log_all, pc_log_1pct: gates off with the access log off, at sample 1.0,
# at 0.01, written to a file),
# RULE=route|set: the pc_* targets with one route matching the requests, without or with
# one header rule (request_headers.set): an edge rule's cost,
# LIMITS=1: the pc_* targets with the backend's max_conn set and a backup backend,
# TENANTS=N: the pc_* targets with N tenants (the last holding the requests' key) on a
# tier that never binds: the tenant gate's cost (compare with TENANTS unset),
# MODE (h1 | h1close: a new connection per request | h2tls), N1 (500), N2 (2500), CONNS (4 client connections),
# STREAMS (h2: concurrent streams per connection, 10), PROXY_THREADS (1), HEADER (one more
# request field, e.g. "connection: keep-alive" as browsers send), WARM (warm-up requests, 200),
# OUT (benches/load/out/callgrind, ignored by git), SKIP_BUILD=1, PC_BIN and
# BARE_BIN (binaries to measure instead of target/release/...).
# ACCESS_LOG=1: what the access log costs in user space (the writer thread included,
# since callgrind counts every thread): TARGETS defaults to "pc_log_off pc_log_all
# pc_log_1pct", CONNS to 1, requests carry no x-api-key, and before each dump the script
# waits 1 s for the log writer to drain. Its kernel side: ACCESS_LOG=1 syscalls.sh.
# Prints one CSV row per target on stdout:
#   target,mode,threads,instr_per_req,allocs_per_req,frees_per_req,n1,n2
# Every process this script starts is stopped by PID on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init callgrind
MODE=${MODE:-h1}
if counter_defaults "haproxy pc_off"; then CONNS=${CONNS:-1}; fi
N1=${N1:-500}
N2=${N2:-2500}
CONNS=${CONNS:-4}
WARM=${WARM:-200}
STREAMS=${STREAMS:-10}

need valgrind callgrind_control callgrind_annotate h2load nginx haproxy redis-server curl
proxy_fixture
# A port apart from the fixture's: its proxy and admin ports are not bound yet,
# so a second free_ports may hand one of them out again.
P_HANG=$(free_ports 1)
while [ "$P_HANG" = "$P_PROXY" ] || [ "$P_HANG" = "$P_ADMIN" ]; do P_HANG=$(free_ports 1); done

# hold_shed_slot: park one request on a backend that never answers, so the
# pc_shed target's only slot is taken and every other request is shed (503).
hold_shed_slot() {
  python3 "$HERE/backend.py" hang "$P_HANG" 3600 >"$TMP/hang.log" 2>&1 &
  PIDS+=($!)
  wait_port "$P_HANG"
  local code="" hold=""
  for _ in $(seq 1 100); do
    # (re)send the parked request if it is not running (it may have been answered)
    if [ -z "$hold" ] || ! kill -0 "$hold" 2>/dev/null; then
      curl -s -o /dev/null -w '%{http_code}' -m 3600 "http://127.0.0.1:$P_PROXY/hold/forever" \
        >>"$TMP/hold.status" 2>&1 &
      hold=$!
      PIDS+=("$hold")
      sleep 0.2
    fi
    code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "http://127.0.0.1:$P_PROXY/" || true)
    [ "$code" = 503 ] && return 0
    sleep 0.1
  done
  die "pc_shed: the slot was not held (last status $code; parked requests answered: $(cat "$TMP/hold.status" 2>/dev/null))"
}

client_mode

# counters FILE: "<instructions> <allocs> <frees>" of one callgrind dump.
counters() {
  python3 - "$1" <<'PY'
import re, sys
ALLOC = {"malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign",
         "_rjem_malloc", "_rjem_mallocx", "_rjem_calloc", "_rjem_realloc", "_rjem_rallocx",
         "_rjem_posix_memalign", "_rjem_aligned_alloc"}
FREE = {"free", "cfree", "_rjem_free", "_rjem_sdallocx", "_rjem_dallocx"}
names, fn, cfn, total, summary = {}, None, None, 0, None
allocs = frees = 0
def name(tok):
    m = re.match(r"\((\d+)\)(?: (.*))?", tok)
    if not m:
        return tok
    if m.group(2) is not None:
        names[m.group(1)] = m.group(2)
    return names.get(m.group(1), "?")
def base(n):
    return n.split("'")[0]
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("fn="):
        fn = base(name(line[3:].strip()))
    elif line.startswith("cfn="):
        cfn = base(name(line[4:].strip()))
    elif line.startswith("calls="):
        n = int(line[6:].split()[0])
        # calls into the allocator from outside it (not realloc -> malloc inside)
        if fn not in ALLOC and fn not in FREE:
            if cfn in ALLOC:
                allocs += n
            elif cfn in FREE:
                frees += n
    elif line.startswith("summary:"):
        summary = int(line.split()[1])
    elif line.startswith("totals:"):
        total = int(line.split()[1])
# `summary:` is what was counted since the zero. The first dump's cost lines (and so its
# `totals:`) can also hold costs from before the zero: 13.2M instructions more in an h2-over-
# TLS run (3.6M for HAProxy; ~3k over HTTP/1.1), which made (I2 - I1) / (N2 - N1) too low
# by that much divided by N2 - N1 (-6.6k per stream at N 500/2500, -13.2k at 300/1300).
print(summary if summary is not None else total, allocs, frees)
PY
}

for t in $TARGETS; do
  cmd=$(start_cmd "$t")
  log "$t: starting under callgrind ($MODE, $PROXY_THREADS thread(s))"
  rm -f "$OUT/$t.$MODE".*
  # shellcheck disable=SC2086
  valgrind --tool=callgrind --callgrind-out-file="$OUT/$t.$MODE.%p" --dump-instr=no \
    --collect-atstart=yes --vgdb=yes $cmd >"$TMP/$t.log" 2>&1 &
  vpid=$!
  PIDS+=("$vpid")
  wait_port "$P_PROXY"
  EXPECT=2xx
  if [ "$t" = pc_shed ]; then
    hold_shed_slot
    EXPECT=5xx # every request below is answered by the shedder
  fi
  requests "$WARM" # warm-up: connections to the backend, lazily built state
  log_settle "$t" 1 # an access-log target: its writer has written the warm-up's lines
  callgrind_control -z "$vpid" >/dev/null
  requests "$N1"
  log_settle "$t" 1
  callgrind_control --dump=n1 "$vpid" >/dev/null
  requests "$N2"
  log_settle "$t" 1
  callgrind_control --dump=n2 "$vpid" >/dev/null
  f1=$(ls "$OUT/$t.$MODE.$vpid".1 2>/dev/null || true)
  f2=$(ls "$OUT/$t.$MODE.$vpid".2 2>/dev/null || true)
  [ -n "$f1" ] && [ -n "$f2" ] || die "$t: dumps missing in $OUT"
  read -r i1 a1 d1 < <(counters "$f1")
  read -r i2 a2 d2 < <(counters "$f2")
  stop_pid "$vpid"
  dn=$((N2 - N1))
  ipr=$(((i2 - i1) / dn))
  apr=$(awk -v a="$a1" -v b="$a2" -v n="$dn" 'BEGIN{printf "%.1f", (b-a)/n}')
  fpr=$(awk -v a="$d1" -v b="$d2" -v n="$dn" 'BEGIN{printf "%.1f", (b-a)/n}')
  callgrind_annotate --inclusive=yes --threshold=99.5 "$f2" >"$OUT/$t.$MODE.inclusive.txt" 2>/dev/null || true
  callgrind_annotate --threshold=99 "$f2" >"$OUT/$t.$MODE.self.txt" 2>/dev/null || true
  log "$t: $ipr instructions/request, $apr allocations/request, $fpr frees/request (I1=$i1 I2=$i2)"
  case $t in
    pc_log_*) log "$t: $([ -f "$TMP/$t-access.log" ] && wc -l <"$TMP/$t-access.log" || echo 0) access-log lines" ;;
  esac
  echo "$t,$MODE,$PROXY_THREADS,$ipr,$apr,$fpr,$N1,$N2"
done
