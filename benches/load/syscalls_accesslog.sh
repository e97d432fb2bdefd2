#!/usr/bin/env bash
# System calls per request of portcullis with the access log off / at sample 1.0 /
# at 0.01: what callgrind_accesslog.sh cannot see (the kernel side: the log
# writer's wake-ups and writes). For each setting: start the proxy (one worker
# thread, the nginx backend of run.sh), warm up, attach `strace -c -f`, send N
# requests over 8 connections, detach; prints syscalls per request, total and
# for futex / write / epoll_wait.
#
#   bash benches/load/syscalls_accesslog.sh                 # target/release/portcullis
#   BIN=/path/to/portcullis N=5000 bash benches/load/syscalls_accesslog.sh
#
# Needs strace, nginx and h2load.
# Every process started here is stopped by PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init syscalls
N=${N:-5000}

need strace nginx h2load curl

accesslog_fixture
CONNS=8
API_KEY= # as before the scripts shared lib.sh: no x-api-key header

printf '%-8s %-7s %10s %10s %10s %10s\n' enabled sample syscalls/req futex/req write/req epoll/req
for s in $SETTINGS; do
  accesslog_conf "$s"
  rm -f "$TMP/pc-access.log"
  "$BIN" -c "$TMP/pc.toml" >"$TMP/pc.log" 2>&1 &
  ppid=$!
  PIDS+=("$ppid")
  wait_http "http://127.0.0.1:$P_ADMIN/readyz"
  requests "$WARM"
  strace -c -f -p "$ppid" -o "$TMP/strace.txt" 2>/dev/null &
  spid=$!
  sleep 1
  requests "$N"
  sleep 0.5
  kill -INT "$spid"
  wait "$spid" 2>/dev/null || true
  python3 - "$TMP/strace.txt" "$N" "$enabled" "$sample" <<'PY'
import sys
path, n, enabled, sample = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
calls = {}
for line in open(path):
    f = line.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] not in ("total",):
        try:
            calls[f[-1]] = int(f[3])
        except ValueError:
            pass
total = sum(calls.values())
print(f"{enabled:<8} {sample:<7} {total / n:10.2f} {calls.get('futex', 0) / n:10.2f} "
      f"{(calls.get('write', 0) + calls.get('writev', 0)) / n:10.2f} "
      f"{calls.get('epoll_wait', 0) / n:10.2f}")
PY
  stop_pid "$ppid"
done
