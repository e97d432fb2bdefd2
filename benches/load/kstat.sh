#!/usr/bin/env bash
# Where a proxy's kernel time goes, per request: each proxy runs natively in front
# of the same nginx backend; after a warm-up, `perf stat -p PID` (software events and
# tracepoints, no hardware counters needed) is attached while exactly N requests are
# sent with h2load (CONNS keep-alive connections), and utime/stime are read from
# /proc/PID/stat around the same N requests. Prints per request: user and system CPU
# (µs), context switches, CPU migrations, page faults, epoll_wait calls, packets the
# proxy put on the loopback device, softirqs run in its context, and the tasks it woke
# (sched_waking: a peer, client or backend, that was asleep) with the inter-processor
# interrupts it sent to do so (ipi_send_cpu, csd_queue_cpu).
#
# KIND=record instead samples the proxy's CPU (`perf record -e cpu-clock`, a timer, no
# hardware counters) over the same N requests and prints where its time goes, per
# request: microseconds in each kernel and user-space symbol (the TOP largest), from
# samples × sampling period ÷ N, then the utime and stime of the same requests from /proc.
# CALLGRAPH=1 records call chains too (read them with `perf report -G` on OUT/TARGET.perf.data).
#
# KIND=cpu attaches nothing and prints only the user and system CPU from /proc: the
# tracepoints of KIND=stat add kernel time of their own, the same few microseconds to
# every proxy, which narrows ratios. Use it with RATE for CPU ratios at an equal load.
#
#   bash benches/load/kstat.sh                        # HTTP/1.1 keep-alive, 1 thread
#   PROXY_THREADS=2 TARGETS="haproxy pc_off" bash benches/load/kstat.sh
#   KIND=record TARGETS="haproxy bare" bash benches/load/kstat.sh
#   MODE=h2tls bash benches/load/kstat.sh            # HTTP/2 over TLS, 10 streams/conn
#   RATE=20000 bash benches/load/kstat.sh             # open loop: the same 20,000 requests/s offered to every proxy
#   KIND=cpu RATE=20000 PC_PREV_BIN=old/portcullis TARGETS="haproxy pc_on pc_on_prev" bash benches/load/kstat.sh
#
# Environment: TARGETS ("haproxy bare pc_off pc_on"), N (100000), CONNS (32),
# PROXY_THREADS (1), MODE (h1 | h2tls: "haproxy pc_off pc_on", bare Pingora has no TLS
# listener here), STREAMS (h2tls: 10), KIND (stat | record | cpu), FREQ (record: samples/s, 10000), TOP (40),
# OUT (benches/load/out/kstat, ignored by git), SKIP_BUILD=1,
# PC_BIN and BARE_BIN (binaries to measure instead of target/release/...), PC_PREV_BIN
# (target pc_on_prev: gates on, run by that binary, e.g. a build before a change),
# RATE (total requests per second, spread over the CONNS clients with h2load --rps; unset:
# a closed loop, each client sends its next request when the last is answered).
# Output on stdout: CSV rows target,threads,event,per_req (stat) or
# target,threads,ring,symbol,us_per_req (record; ring is k for kernel, u for user).
# Every process this script starts is stopped by PID on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init kstat
MODE=${MODE:-h1}
[ "$MODE" != h2tls ] || [ -n "${TARGETS:-}" ] || TARGETS="haproxy pc_off pc_on"
TARGETS=${TARGETS:-haproxy bare pc_off pc_on}
N=${N:-100000}
CONNS=${CONNS:-32}
PROXY_THREADS=${PROXY_THREADS:-1}
OUT=${OUT:-$HERE/out/kstat}
KIND=${KIND:-stat}
FREQ=${FREQ:-10000}
# REC_EVENT: a tracepoint to record every occurrence of instead of sampling the CPU
# (read it with `perf script -i OUT/TARGET.perf.data`); the summary below then counts
# occurrences, not microseconds.
REC_EVENT=${REC_EVENT:-cpu-clock}
REC_RATE="-F $FREQ"
[ "$REC_EVENT" = cpu-clock ] || REC_RATE="-c 1"
TOP=${TOP:-40}
EVENTS=context-switches,cpu-migrations,page-faults,syscalls:sys_enter_epoll_wait,net:net_dev_xmit,irq:softirq_entry,sched:sched_waking,ipi:ipi_send_cpu,sched:sched_wake_idle_without_ipi,csd:csd_queue_cpu
mkdir -p "$OUT"

need perf h2load nginx haproxy redis-server openssl
proxy_fixture
client_mode
# RATE: an open loop instead of a closed one: h2load paces each of the CONNS clients at
# RATE/CONNS requests per second (--rps), so every proxy serves the same offered load.
if [ -n "${RATE:-}" ]; then H2LOAD_ARGS+=("--rps=$(( (RATE + CONNS - 1) / CONNS ))"); fi
HZ=$(getconf CLK_TCK)
ticks() { awk '{ sub(/^.*\) /, ""); print $12, $13 }' "/proc/$1/stat"; }

case $KIND in
  stat | cpu) echo "target,threads,event,per_req" ;;
  record) echo "target,threads,ring,symbol,us_per_req" ;;
  *) die "KIND is stat, record or cpu, not $KIND" ;;
esac
for t in $TARGETS; do
  start_target "$t" 5000 # after a warm-up of 5000 requests
  pid=$TARGET_PID
  ppid="" # perf's PID; KIND=cpu attaches nothing
  if [ "$KIND" = stat ]; then
    perf stat -x, -e "$EVENTS" -p "$pid" -o "$OUT/$t.perf.txt" &
    ppid=$!
  elif [ "$KIND" = record ]; then
    perf record -q -e "$REC_EVENT" $REC_RATE ${CALLGRAPH:+-g} -p "$pid" -o "$OUT/$t.perf.data" 2>"$OUT/$t.record.log" &
    ppid=$!
  fi
  [ -z "$ppid" ] || sleep 1 # perf attaches to every thread
  read -r u0 s0 < <(ticks "$pid")
  requests "$N"
  read -r u1 s1 < <(ticks "$pid")
  if [ -n "$ppid" ]; then
    kill -INT "$ppid"
    wait "$ppid" 2>/dev/null || true
  fi
  stop_pid "$pid"
  if [ "$KIND" != record ]; then
    awk -v t="$t" -v th="$PROXY_THREADS" -v n="$N" -v hz="$HZ" -v u=$((u1 - u0)) -v s=$((s1 - s0)) \
      'BEGIN { printf "%s,%s,user_us,%.2f\n%s,%s,sys_us,%.2f\n", t, th, u * 1e6 / hz / n, t, th, s * 1e6 / hz / n }'
    if [ "$KIND" = stat ]; then
      awk -v t="$t" -v th="$PROXY_THREADS" -v n="$N" -F, \
        '$1 ~ /^[0-9]+$/ { printf "%s,%s,%s,%.3f\n", t, th, $3, $1 / n }' "$OUT/$t.perf.txt"
    fi
  else
    # One line per symbol: samples, [k] or [.], name. The idle second before the
    # requests holds no samples (a cpu-clock sample needs the task on a CPU).
    perf report -i "$OUT/$t.perf.data" --stdio -q -n --no-children -g none --sort sym 2>/dev/null |
      awk -v t="$t" -v th="$PROXY_THREADS" -v n="$N" -v f="$FREQ" -v top="$TOP" '
        $2 ~ /^[0-9]+$/ && ($3 == "[k]" || $3 == "[.]") {
          ring = ($3 == "[k]") ? "k" : "u"; name = $4
          for (i = 5; i <= NF; i++) name = name " " $i
          gsub(/,/, ";", name)
          tot[ring] += $2
          if (++rows <= top) printf "%s,%s,%s,%s,%.3f\n", t, th, ring, name, $2 / f * 1e6 / n
        }
        END { for (r in tot) printf "%s,%s,%s,(all),%.3f\n", t, th, r, tot[r] / f * 1e6 / n }'
    # The same requests' CPU from /proc (sampling adds its own interrupts to the above)
    awk -v t="$t" -v th="$PROXY_THREADS" -v n="$N" -v hz="$HZ" -v u=$((u1 - u0)) -v s=$((s1 - s0)) \
      'BEGIN { printf "%s,%s,u,(proc utime),%.3f\n%s,%s,k,(proc stime),%.3f\n", t, th, u * 1e6 / hz / n, t, th, s * 1e6 / hz / n }'
  fi
  log "$t done ($OUT/$t.perf.*)"
done
