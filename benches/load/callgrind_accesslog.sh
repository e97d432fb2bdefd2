#!/usr/bin/env bash
# Instructions per request of portcullis with the access log off / at sample 1.0 /
# at 0.01, counted by callgrind (noise-immune, unlike CPU time on a shared machine).
# For each setting: start the proxy under callgrind (one worker thread, the nginx
# backend of run.sh), warm up, zero the counters, send N1 requests and dump, send
# N2 requests and dump; instructions per request = (I(N2) - I(N1)) / (N2 - N1),
# which cancels what does not scale with requests. All threads are counted (the
# log's writer thread included); kernel time is not (callgrind sees user space).
#
#   bash benches/load/callgrind_accesslog.sh                # target/release/portcullis
#   BIN=/path/to/portcullis N1=500 N2=2500 bash benches/load/callgrind_accesslog.sh
#   SETTINGS="off:1.0 on:1.0 on:0.01"                        # enabled:sample pairs
#
# Needs valgrind, nginx and h2load (Debian: valgrind nginx-light nghttp2-client).
# Every process started here is stopped by PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init callgrind
N1=${N1:-500}
N2=${N2:-2500}

need valgrind callgrind_control nginx h2load curl

accesslog_fixture
CONNS=1
API_KEY= # as before the scripts shared lib.sh: no x-api-key header

# Total instructions of the newest dump (the counters are zeroed at each dump).
dump_ir() {
  local pid=$1 before after f
  before=$(ls "$TMP"/callgrind.out.* 2>/dev/null | wc -l)
  callgrind_control -d "$pid" >/dev/null
  for ((i = 0; i < 100; i++)); do
    after=$(ls "$TMP"/callgrind.out.* 2>/dev/null | wc -l)
    [ "$after" -gt "$before" ] && break
    sleep 0.1
  done
  f=$(ls -t "$TMP"/callgrind.out.* | head -1)
  awk '/^(summary|totals):/ { print $2; exit }' "$f"
}

printf '%-8s %-7s %14s %14s %10s\n' enabled sample "Ir(N1=$N1)" "Ir(N2=$N2)" Ir/req
for s in $SETTINGS; do
  accesslog_conf "$s"
  rm -f "$TMP"/callgrind.out.* "$TMP/pc-access.log"
  (cd "$TMP" && exec valgrind --tool=callgrind --callgrind-out-file="$TMP/callgrind.out.%p.%n" \
    "$BIN" -c "$TMP/pc.toml" >"$TMP/pc.log" 2>&1) &
  vpid=$!
  PIDS+=("$vpid")
  wait_http "http://127.0.0.1:$P_ADMIN/readyz"
  requests "$WARM"
  sleep 1
  dump_ir "$vpid" >/dev/null # zero
  requests "$N1"
  sleep 1 # let the log writer drain what it lingers on
  i1=$(dump_ir "$vpid")
  requests "$N2"
  sleep 1
  i2=$(dump_ir "$vpid")
  per=$(( (i2 - i1) / (N2 - N1) ))
  printf '%-8s %-7s %14s %14s %10s\n' "$enabled" "$sample" "$i1" "$i2" "$per"
  stop_pid "$vpid"
  lines=$( [ -f "$TMP/pc-access.log" ] && wc -l <"$TMP/pc-access.log" || echo 0)
  log "enabled=$enabled sample=$sample: $lines access-log lines"
done
