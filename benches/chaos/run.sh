#!/usr/bin/env bash
# The chaos harness and its checker (issue 63; docs/src/invariants.md states what is checked).
#
#   bash benches/chaos/run.sh SEED SECONDS
#   PC_BIN=target/release/portcullis CHAOS_INSTANCES=5 bash benches/chaos/run.sh 7 300
#
# Starts CHAOS_INSTANCES (3-5; default 3 + SEED % 3) portcullis instances, the store, four
# backends (benches/chaos/backend.py, each logging every request it gets) and TCP relays
# (benches/chaos/relay.py: pass, blackhole or refuse: the partitions; a relay cuts every
# instance off or one instance only, which it tells by the pid owning the connection), all
# on 127.0.0.1. The store (CHAOS_STORE; default cluster for even seeds, redis for odd ones):
# `redis`, one private redis-server on a free port (never the machine's 6379) with a relay
# in front of it for each instance; `cluster`, a Redis Cluster of 3 masters and 3 replicas
# (real redis-server nodes in cluster mode, node timeout 1.5 s), each node behind a relay whose
# port it announces. After a 15 s warm-up, faults drawn from SEED, up to two at once, every
# 4-12 s until the last 20 s: one instance cut off from Redis (Cluster: from every node;
# blackhole or refuse, 3-15 s); Cluster: one instance cut off from one node (3-15 s);
# a backend cut off from every instance (4-15 s); a backend cut off from one instance while
# the others reach it (4-15 s); one instance's clock skewed by -30, -2,
# +2 or +30 s for 10-30 s (libfaketime, re-read each second: the `faketime` package); one
# instance SIGSTOPped for 1-20 s; Redis SIGSTOPped for 1-8 s (Cluster: one node, master or
# replica: a master paused over about 2-3 s is failed over); a backend answering 500 for
# 5-20 s. Meanwhile a load client (limit 50 per 10 s; hot-a at 5x its limit, hot-b at 1.5x,
# 20 cold keys; about 36 requests/s in all, to random instances, each request with an id
# the backends log)
# and an operations client on three instances at once (claims, some followed by a deploy:
# 2.5 s after the grant the backend is stopped and started again, then the claim released or
# left to expire; one claim in eight an emergency claim; drains; readies; dry runs) record
# every answer. Every instance's /backends,
# /claims and /status are read every 100 ms (a cycle of the three).
# Then benches/chaos/check.py checks the invariants and prints each violation with the seed,
# the instant and the records around it. Exit 0 when every invariant held, 1 otherwise.
#
# Settings: PC_BIN (default: build and use the debug binary), CHAOS_INSTANCES, CHAOS_STORE,
# CHAOS_OUT (the records; default a new directory under ${TMPDIR:-/tmp}, kept and printed;
# an earlier run's records there are replaced).
# Needs redis-server, python3 and libfaketime (scripts/setup.sh); without libfaketime the
# skew faults change nothing and the summary says faketime=false.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 2 ]; then
  echo "usage: benches/chaos/run.sh SEED SECONDS" >&2
  exit 2
fi
seed=$1 seconds=$2
if [ "$seconds" -lt 60 ]; then
  echo "chaos: SECONDS must be at least 60 (15 s warm-up, 20 s quiet end)" >&2
  exit 2
fi
if [ -z "${PC_BIN:-}" ]; then
  cargo build -q --bin portcullis
  PC_BIN="${CARGO_TARGET_DIR:-target}/debug/portcullis"
fi
PC_BIN=$(realpath "$PC_BIN")
export PC_BIN
command -v redis-server >/dev/null || { echo "chaos: needs redis-server (scripts/setup.sh)" >&2; exit 2; }
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || echo "chaos: no libfaketime (apt-get install faketime): clock skew faults are no-ops" >&2
out=${CHAOS_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/portcullis-chaos-$seed-XXXX")}
if [ -e "$out/meta.json" ]; then
  rm -f "$out"/*.jsonl "$out"/*.log "$out"/*.toml "$out"/*.ctl "$out"/*.faketime "$out"/meta.json "$out"/summary.json
  rm -rf "$out"/node[0-9]*
elif [ -d "$out" ] && [ -n "$(ls -A "$out")" ]; then
  echo "chaos: $out is not empty and holds no earlier run (meta.json): pick another CHAOS_OUT" >&2
  exit 2
fi
mkdir -p "$out"
echo "chaos: seed $seed, $seconds s, records in $out" >&2
python3 benches/chaos/harness.py "$seed" "$seconds" "$out"
exec python3 benches/chaos/check.py "$out"
