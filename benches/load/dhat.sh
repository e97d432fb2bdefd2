#!/usr/bin/env bash
# Where each allocation per request comes from: the proxy runs under
# `valgrind --tool=dhat` twice, with the same warm-up, then N1 requests in the first run
# and N2 in the second, and exits on SIGINT (DHAT writes its profile at exit). Each
# allocation site is the allocation's call stack; a site's blocks per request are
#     (blocks in run 2 - blocks in run 1) / (N2 - N1)
# so start-up, the warm-up and shutdown cancel out, as in callgrind.sh. Each site is
# attributed to the first frame of its stack, from the allocator up, that is not in
# Rust's standard library: its crate (portcullis's own code, the vendored Pingora crates,
# or a registry crate: h2, tokio, http, ...), function and line.
#
#   bash benches/load/dhat.sh                       # HTTP/1.1 keep-alive, gates on
#   MODE=h2tls TARGET=pc_on bash benches/load/dhat.sh
#   PC_BIN=target/debug/portcullis TARGET=pc_shed bash benches/load/dhat.sh
#
# Environment: TARGET (one of callgrind.sh's pc_* targets, default pc_on), MODE (h1 |
# h1close | h2tls), N1 (200), N2 (1200), CONNS (4), WARM (200), PROXY_THREADS (1), PC_BIN
# (a build with the `system-alloc` feature: jemalloc's entry points are not malloc, which
# DHAT intercepts; default: the debug build with `--features system-alloc`, copied to
# target/dhat/portcullis, made unless SKIP_BUILD=1; the count of allocations per request
# is a debug build's, which BENCHMARKS.md checks against callgrind.sh's on the release
# build), OUT
# (benches/load/out/dhat), TOP (sites listed, 40).
# Writes OUT/TARGET.MODE.sites.csv (owner,crate,kind,allocs_per_req,bytes_per_req,site,stack) and
# prints the per-owner totals and the top sites. The total agrees with callgrind.sh's
# allocations per request (both count calls into malloc, calloc, realloc and friends).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init dhat
MODE=${MODE:-h1}
TARGET=${TARGET:-pc_on}
TARGETS=$TARGET
N1=${N1:-200}
N2=${N2:-1200}
CONNS=${CONNS:-4}
WARM=${WARM:-200}
STREAMS=${STREAMS:-10}
PROXY_THREADS=${PROXY_THREADS:-1}
TOP=${TOP:-40}
OUT=${OUT:-$HERE/out/dhat}
mkdir -p "$OUT"
[ "$TARGET" != pc_shed ] || die "pc_shed needs callgrind.sh's parked request; not supported here yet"
case $TARGET in pc_*) ;; *) die "TARGET is one of callgrind.sh's pc_* targets, not $TARGET" ;; esac

need valgrind h2load nginx redis-server curl
if [ -z "${PC_BIN:-}" ]; then
  PC_BIN=$TARGET_DIR/dhat/portcullis
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    (cd "$REPO" && cargo build --bin portcullis --features system-alloc) >&2
    mkdir -p "$TARGET_DIR/dhat"
    cp "$TARGET_DIR/debug/portcullis" "$PC_BIN"
  fi
fi
export SKIP_BUILD=1
proxy_fixture
client_mode

run_once() { # run_once N FILE
  local n=$1 file=$2 cmd vpid
  cmd=$(start_cmd "$TARGET")
  # shellcheck disable=SC2086
  valgrind --tool=dhat --dhat-out-file="$file" --num-callers=40 --read-inline-info=yes \
    --fullpath-after= $cmd >"$TMP/$TARGET.$n.log" 2>&1 &
  vpid=$!
  PIDS+=("$vpid")
  wait_port "$P_PROXY"
  requests "$WARM"
  requests "$n"
  stop_pid "$vpid"
  [ -s "$file" ] || die "$TARGET: no DHAT profile in $file (log: $(tail -3 "$TMP/$TARGET.$n.log"))"
}

f1=$OUT/$TARGET.$MODE.n1.json
f2=$OUT/$TARGET.$MODE.n2.json
log "$TARGET ($MODE): run 1, $N1 requests after $WARM"
run_once "$N1" "$f1"
log "$TARGET ($MODE): run 2, $N2 requests after $WARM"
run_once "$N2" "$f2"
python3 "$HERE/dhat_sites.py" "$f1" "$f2" "$((N2 - N1))" "$TOP" "$OUT/$TARGET.$MODE.sites.csv"
