#!/usr/bin/env bash
# Does an adaptive cap hold under sustained overload? One fresh backend.py slow
# (8 slots x 10 ms) and one fresh portcullis per kind of cap (the per-upstream
# `[[upstreams]] adaptive`, max_inflight 64, and the global `[shedding] adaptive`,
# ceiling 64), the overload part's client (overload.lua: OVL_CONNS connections,
# exponential think time of mean OVL_DELAY_MS) run back to back in SLICE-second
# slices for SLICES slices; after each slice the learned cap
# (`portcullis_concurrency_limit`), the goodput and the p50/p99 of the 2xx.
#
#   OVL_CONNS=1070 SLICES=9 SLICE=10 bash benches/load/overload_drift.sh [OUT.csv]
#
# OVL_CONNS defaults to 3x the backend's capacity (measured first, as run.sh does)
# x OVL_DELAY_MS / 1000. Loopback only; every process started here is stopped by PID.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init drift
need wrk curl python3
SLICES=${SLICES:-9}
SLICE=${SLICE:-10}
OVL_DELAY_MS=${OVL_DELAY_MS:-500}
OVL_FACTOR=${OVL_FACTOR:-3}
PROXY_THREADS=${PROXY_THREADS:-2}
OUT=${1:-$HERE/out/overload_drift.csv}
PC_BIN=${PC_BIN:-$TARGET_DIR/release/portcullis}
[ -x "$PC_BIN" ] || die "no portcullis binary at $PC_BIN"
bench_tmp drift
PY=$(python3 -c 'import sys; print(sys.executable)')

# wrk_result URL CONNS [VAR=VALUE...]: SECONDS of wrk with overload.lua; prints its RESULT line.
wrk_result() {
  local url=$1 conns=$2 secs=$3
  shift 3
  env "$@" timeout $((secs + 30)) wrk -t2 -c"$conns" -d"${secs}s" --timeout 5s \
    -s "$HERE/overload.lua" "$url" 2>&1 | grep '^RESULT' || echo "RESULT requests=0"
}
kv() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }

mkdir -p "$(dirname "$OUT")"
echo "kind,slice,t_end_s,limit_after,offered_rps,ok_rps,ok_p50_ms,ok_p99_ms,n503" >"$OUT"
for kind in upstream global; do
  read -r P_BACK P_PC A_PC < <(free_ports 3)
  "$PY" "$HERE/backend.py" slow "$P_BACK" 8 10 $((SLICES * SLICE + 120)) >"$TMP/backend-$kind.log" 2>&1 &
  PIDS+=($!)
  BPID=$!
  wait_http "http://127.0.0.1:$P_BACK/"
  if [ "$kind" = upstream ]; then
    render "$CONF/portcullis-overload-upstream-adaptive.toml" "$TMP/$kind.toml" TMP="$TMP" NAME="$kind" \
      THREADS="$PROXY_THREADS" PORT="$P_PC" ADMIN_PORT="$A_PC" BACKEND_PORT="$P_BACK" MAX_INFLIGHT=64
    series='^portcullis_concurrency_limit\{upstream="app"\}'
  else
    render "$CONF/portcullis-overload-adaptive.toml" "$TMP/$kind.toml" TMP="$TMP" NAME="$kind" \
      THREADS="$PROXY_THREADS" PORT="$P_PC" ADMIN_PORT="$A_PC" BACKEND_PORT="$P_BACK" MAX_CONCURRENCY=64
    series='^portcullis_concurrency_limit '
  fi
  "$PC_BIN" -c "$TMP/$kind.toml" >"$TMP/pc-$kind.log" 2>&1 &
  PIDS+=($!)
  PCPID=$!
  wait_http "http://127.0.0.1:$A_PC/readyz"
  if [ -z "${OVL_CONNS:-}" ]; then
    line=$(wrk_result "http://127.0.0.1:$P_BACK/" 32 "$SLICE")
    cap=$(awk -v n="$(kv "$line" ok)" -v d="$(kv "$line" duration_us)" 'BEGIN { printf "%.1f", n / (d / 1e6) }')
    conns=$(awk -v f="$OVL_FACTOR" -v c="$cap" -v d="$OVL_DELAY_MS" 'BEGIN { printf "%d", f * c * d / 1000 + 0.5 }')
    log "$kind: capacity $cap rps, $conns connections"
  else
    conns=$OVL_CONNS
  fi
  timeout 10 wrk -t1 -c2 -d2s "http://127.0.0.1:$P_PC/" >/dev/null 2>&1 || true
  t0=$(date +%s)
  for ((i = 1; i <= SLICES; i++)); do
    line=$(wrk_result "http://127.0.0.1:$P_PC/" "$conns" "$SLICE" LB_DELAY_MS="$OVL_DELAY_MS")
    limit=$(curl -s -m 2 "http://127.0.0.1:$A_PC/metrics" | grep -E "$series" | awk '{ print $2 }')
    python3 - "$OUT" "$kind" "$i" "$(($(date +%s) - t0))" "${limit:-?}" "$line" <<'PY'
import sys
out, kind, i, t, limit, line = sys.argv[1:]
kv = dict(x.split("=") for x in line.split()[1:])
secs = int(kv.get("duration_us", 0)) / 1e6 or 1
row = [kind, i, t, limit, round(int(kv.get("requests", 0)) / secs, 1), round(int(kv.get("ok", 0)) / secs, 1),
       int(kv.get("ok_p50_us", 0)) / 1000, int(kv.get("ok_p99_us", 0)) / 1000, kv.get("n503", 0)]
open(out, "a").write(",".join(map(str, row)) + "\n")
print(f"[drift] {kind} slice {i} t={t}s limit={limit} ok_rps={row[5]} p50={row[6]}ms p99={row[7]}ms", file=sys.stderr)
PY
  done
  stop_pid "$PCPID"
  stop_pid "$BPID"
  PIDS=() # both stopped and reaped: the exit trap must not signal their (reusable) PIDs
done
log "wrote $OUT"
