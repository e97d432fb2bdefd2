#!/usr/bin/env bash
# Differential target (issue 46, docs/src/development.md "Fuzzing"): random raw HTTP/1.1 requests, the same
# bytes through portcullis and through HAProxy to one recording backend; every request one
# forwards and the other refuses (either way), or that reaches the backend differently, is
# grouped by the mutations that made it and written to a markdown report for a person to
# judge (fuzz/differential/FINDINGS.md holds the verdicts of the last look).
#
#   scripts/fuzz-differential.sh [SECONDS] [SEED]    # defaults: 300 s, seed 1
#
# Environment: PORTCULLIS_BIN (default $CARGO_TARGET_DIR/debug/portcullis, else
# target/debug/portcullis: build it first), HAPROXY_BIN (default haproxy on PATH),
# DIFF_MAX_REQUESTS (default 20000: whichever of it and SECONDS comes first), DIFF_REPORT
# (default /tmp/portcullis-differential-SEED.md).
#
# Prints `differential: requests=N agree=A disagree=D groups=G`. Exits 0 whatever the
# proxies disagree on; 1 when the harness fails (a proxy or the backend died: the request
# that did it is printed), 2 on bad arguments. Every port is a free loopback port; only
# the processes it started are stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
seed=${2:-1}
[[ $seconds =~ ^[0-9]+$ && $seed =~ ^[0-9]+$ && $seconds -gt 0 ]] || {
  echo "usage: scripts/fuzz-differential.sh [SECONDS] [SEED]" >&2
  exit 2
}
bin=${PORTCULLIS_BIN:-${CARGO_TARGET_DIR:-target}/debug/portcullis}
[ -x "$bin" ] || { echo "no portcullis binary at $bin (cargo build, or set PORTCULLIS_BIN)" >&2; exit 2; }
command -v "${HAPROXY_BIN:-haproxy}" >/dev/null || { echo "haproxy not found (apt-get install haproxy, or set HAPROXY_BIN)" >&2; exit 2; }
"${HAPROXY_BIN:-haproxy}" -v | sed -n 1p
exec python3 fuzz/differential/run.py --seconds "$seconds" --seed "$seed" \
  --max-requests "${DIFF_MAX_REQUESTS:-20000}" --portcullis "$bin" \
  --haproxy "${HAPROXY_BIN:-haproxy}" \
  --report "${DIFF_REPORT:-/tmp/portcullis-differential-$seed.md}"
