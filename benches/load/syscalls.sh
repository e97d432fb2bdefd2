#!/usr/bin/env bash
# System calls per request: each proxy runs natively in front of the same nginx
# backend; after a warm-up, `strace -c -f -p PID` is attached while exactly N
# requests are sent with h2load (CONNS keep-alive connections), then detached.
# Prints the calls per request by name (the table of issue 16).
#
#   bash benches/load/syscalls.sh                     # HTTP/1.1 keep-alive, 1 thread
#   PROXY_THREADS=2 TARGETS="haproxy pc_off" bash benches/load/syscalls.sh
#   MODE=h2tls TARGETS="haproxy pc_on" bash benches/load/syscalls.sh   # HTTP/2 over TLS
#   ACCESS_LOG=1 bash benches/load/syscalls.sh         # access log off / sample 1.0 / 0.01
#
# Environment: TARGETS ("haproxy bare pc_off pc_on"; MODE=h2tls: "haproxy pc_on"; the
# targets are callgrind.sh's), MODE (h1 | h1close: a new connection per request, CONNS at a
# time | h2tls: ALPN h2 with STREAMS, 10, concurrent streams per connection), N (20000),
# CONNS (32), WARM (warm-up requests, 2000), PROXY_THREADS (1), OUT
# (benches/load/out/syscalls, ignored by git), SKIP_BUILD=1, PC_BIN and BARE_BIN
# (binaries to measure instead of target/release/...).
# ACCESS_LOG=1: the access log's kernel side (the writer's wake-ups and writes, which
# callgrind.sh cannot see): TARGETS defaults to "pc_log_off pc_log_all pc_log_1pct", N to
# 5000, CONNS to 8, WARM to 200, requests carry no x-api-key, and strace stays attached
# 0.5 s after the last request while the log writer drains.
# Output on stdout: CSV rows target,threads,syscall,calls_per_req (and a total row);
# with MODE=h2tls the target is named TARGET.h2tls.
# Every process this script starts is stopped by PID on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init syscalls
MODE=${MODE:-h1}
if counter_defaults "haproxy pc_on"; then
  N=${N:-5000}
  CONNS=${CONNS:-8}
  WARM=${WARM:-200}
fi
N=${N:-20000}
CONNS=${CONNS:-32}
WARM=${WARM:-2000}

need strace h2load nginx haproxy redis-server openssl
proxy_fixture
client_mode

for t in $TARGETS; do
  start_target "$t" "$WARM" # after a warm-up of WARM requests
  pid=$TARGET_PID
  label=$t
  [ "$MODE" = h1 ] || label=$t.$MODE
  strace -c -f -p "$pid" -o "$OUT/$label.strace.txt" &
  spid=$!
  sleep 1 # strace attaches to every thread
  requests "$N"
  log_settle "$t" 0.5 # an access-log target: its writer's last write is counted too
  kill -INT "$spid"
  wait "$spid" 2>/dev/null || true
  stop_pid "$pid"
  awk -v t="$label" -v th="$PROXY_THREADS" -v n="$N" '
    $1 ~ /^[0-9.]+$/ && NF >= 5 { name = $NF; calls = $4; if (calls !~ /^[0-9]+$/) next
      if (calls / n >= 0.01) printf "%s,%s,%s,%.2f\n", t, th, name, calls / n }' "$OUT/$label.strace.txt"
  log "$t done ($OUT/$label.strace.txt)"
done
