#!/usr/bin/env bash
# Where a proxy's kernel time goes, per request: each proxy runs natively in front
# of the same nginx backend; after a warm-up, `perf stat -p PID` (software events and
# tracepoints, no hardware counters needed) is attached while exactly N requests are
# sent with h2load (CONNS keep-alive connections), and utime/stime are read from
# /proc/PID/stat around the same N requests. Prints per request: user and system CPU
# (µs), context switches, CPU migrations, page faults, epoll_wait calls, packets the
# proxy put on the loopback device and softirqs run in its context.
#
#   bash benches/load/kstat.sh                        # HTTP/1.1 keep-alive, 1 thread
#   PROXY_THREADS=2 TARGETS="haproxy pc_off" bash benches/load/kstat.sh
#
# Environment: TARGETS ("haproxy bare pc_off pc_on"), N (100000), CONNS (32),
# PROXY_THREADS (1), OUT (benches/load/out/kstat, ignored by git), SKIP_BUILD=1,
# PC_BIN and BARE_BIN (binaries to measure instead of target/release/...).
# Output on stdout: CSV rows target,threads,event,per_req.
# Every process this script starts is stopped by PID on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init kstat
MODE=h1
TARGETS=${TARGETS:-haproxy bare pc_off pc_on}
N=${N:-100000}
CONNS=${CONNS:-32}
PROXY_THREADS=${PROXY_THREADS:-1}
OUT=${OUT:-$HERE/out/kstat}
EVENTS=context-switches,cpu-migrations,page-faults,syscalls:sys_enter_epoll_wait,net:net_dev_xmit,irq:softirq_entry
mkdir -p "$OUT"

need perf h2load nginx haproxy redis-server
proxy_fixture
HZ=$(getconf CLK_TCK)
ticks() { awk '{ sub(/^.*\) /, ""); print $12, $13 }' "/proc/$1/stat"; }

echo "target,threads,event,per_req"
for t in $TARGETS; do
  cmd=$(start_cmd "$t")
  # shellcheck disable=SC2086
  $cmd >"$TMP/$t.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_port "$P_PROXY"
  requests 5000 # warm-up
  perf stat -x, -e "$EVENTS" -p "$pid" -o "$OUT/$t.perf.txt" &
  ppid=$!
  sleep 1 # perf attaches to every thread
  read -r u0 s0 < <(ticks "$pid")
  requests "$N"
  read -r u1 s1 < <(ticks "$pid")
  kill -INT "$ppid"
  wait "$ppid" 2>/dev/null || true
  stop_pid "$pid"
  awk -v t="$t" -v th="$PROXY_THREADS" -v n="$N" -v hz="$HZ" \
    -v u=$((u1 - u0)) -v s=$((s1 - s0)) -F, '
    BEGIN { printf "%s,%s,user_us,%.2f\n%s,%s,sys_us,%.2f\n", t, th, u * 1e6 / hz / n, t, th, s * 1e6 / hz / n }
    $1 ~ /^[0-9]+$/ { printf "%s,%s,%s,%.3f\n", t, th, $3, $1 / n }' "$OUT/$t.perf.txt"
  log "$t done ($OUT/$t.perf.txt)"
done
