#!/usr/bin/env bash
# The instruction guard: user-space instructions per proxied request under callgrind
# (benches/load/callgrind.sh, 1 thread), for each case of benches/perf-baseline.csv,
# against that committed baseline. Fails when a case costs more than 3% over its baseline.
# Instruction counts do not move with machine load, so this can run anywhere valgrind does.
#
#   bash scripts/perf-guard.sh                 # builds the plain release binary, then checks
#   PC_BIN=path/to/portcullis bash scripts/perf-guard.sh
#   UPDATE=1 bash scripts/perf-guard.sh        # measure and rewrite the baseline (say why in
#                                              #   the commit: the baseline only moves on purpose)
#
# Cases (one row each in the baseline): HTTP/1.1 keep-alive with the gates on (`pc_on`) and
# off (`pc_off`), a shed 503 (`pc_shed`), HTTP/2 over TLS (`pc_off`, MODE=h2tls).
# Environment: TOLERANCE (percent, 3), PC_BIN (skip the build), N1/N2 (500/2500 requests).
# `scripts/test.sh --perf` runs it after the test suite. It measures the plain release
# build (not the profile-guided one: a stale profile would move the figures for reasons
# that are not the change's).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
baseline=benches/perf-baseline.csv
tolerance=${TOLERANCE:-3}
say() { printf 'perf-guard: %s\n' "$*" >&2; }

missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v h2load >/dev/null || missing+=(nghttp2-client)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    say "missing: ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -z "${PC_BIN:-}" ]; then
  say "building the plain release binary (cargo build --release)"
  cargo build --release --bin portcullis >&2
  PC_BIN=$repo/${CARGO_TARGET_DIR:-target}/release/portcullis
fi
export PC_BIN SKIP_BUILD=1 PROXY_THREADS=1

measured=$(mktemp)
trap 'rm -f "$measured"' EXIT
TARGETS="pc_off pc_on pc_shed" MODE=h1 bash benches/load/callgrind.sh >>"$measured"
TARGETS="pc_off" MODE=h2tls bash benches/load/callgrind.sh >>"$measured"

if [ "${UPDATE:-0}" = 1 ]; then
  {
    echo "target,mode,threads,instr_per_req,allocs_per_req,frees_per_req,n1,n2"
    cat "$measured"
  } >"$baseline"
  say "wrote $baseline:"
  cat "$baseline" >&2
  exit 0
fi

python3 - "$baseline" "$measured" "$tolerance" <<'PY'
import csv, sys
base_path, measured_path, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
fields = ["target", "mode", "threads", "instr_per_req", "allocs_per_req", "frees_per_req", "n1", "n2"]
base = {(r["target"], r["mode"]): r for r in csv.DictReader(open(base_path))}
now = {(r["target"], r["mode"]): r for r in csv.DictReader(open(measured_path), fieldnames=fields)}
failed = False
print(f"{'case':<16} {'baseline':>10} {'now':>10} {'change':>8}   allocations")
for key, b in base.items():
    if key not in now:
        print(f"{key[0] + '/' + key[1]:<16} not measured")
        failed = True
        continue
    n = now[key]
    bi, ni = int(b["instr_per_req"]), int(n["instr_per_req"])
    change = (ni - bi) / bi * 100
    flag = "  FAIL" if change > tol else ""
    failed |= change > tol
    print(f"{key[0] + '/' + key[1]:<16} {bi:>10} {ni:>10} {change:>+7.2f}%   "
          f"{b['allocs_per_req']} -> {n['allocs_per_req']}{flag}")
if failed:
    print(f"perf-guard: a case costs more than {tol}% over benches/perf-baseline.csv", file=sys.stderr)
    sys.exit(1)
print(f"perf-guard: every case within {tol}% of its baseline", file=sys.stderr)
PY
