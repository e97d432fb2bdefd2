#!/usr/bin/env bash
# The soak (issue 46): three portcullis instances on one private redis-server (a free
# port, never the machine's 6379), four culled backends and a bulkhead one
# (benches/soak/backend.py: switched to fail / hang / slow through a control file), mixed
# clients, and faults from a seeded schedule, several at once at times. Loopback only;
# everything it starts is ended by its PID when it exits (also on Ctrl-C).
#
#   bash benches/soak.sh                          # 20 minutes, a random seed (printed)
#   SOAK_SECONDS=120 SOAK_SEED=7 bash benches/soak.sh
#   SOAK_STORE=cluster SOAK_SECONDS=180 bash benches/soak.sh   # on a Redis Cluster
#
# Settings:
#   SOAK_SECONDS  run length (default 1200); the first max(20, min(60, 1/6)) s are a warm-up
#                 without faults, the last max(40, min(90, 1/8)) s a quiet end (load on, no
#                 new fault: culled backends come back, the leak figures are read)
#   SOAK_SEED     the seed of the fault schedule, the faults' targets and durations and the
#                 clients' keys (the same seed, the same plan; timings stay real)
#   PC_BIN        the binary (default: build the debug one, cargo build --bin portcullis)
#   SOAK_RESULTS  the CSV a row is appended to (default benches/soak/results/soak.csv)
#   SOAK_KEEP=1   keep the scratch directory (configs, every process's log); SOAK_VERBOSE=1
#   SOAK_STORE    standalone (default): one redis-server, `[redis] url`; cluster: a private
#                 Redis Cluster instead, 6 redis-server nodes on free loopback ports
#                 (--cluster-enabled, each its own nodes.conf and directory in the scratch
#                 directory, --cluster-node-timeout 2000, no persistence) made 3 masters with
#                 a replica each by `redis-cli --cluster create`, ready when every node says
#                 cluster_state:ok; the instances get `[redis] mode = "cluster"` and every
#                 node as a seed in `nodes`. Anything else: exit 2. Needs redis-cli too.
#
# Load (about 85 requests/s): 3 HTTP/1.1 keep-alive clients (20-80 requests a connection),
# one opening a connection per request, one HTTP/2-over-TLS client (ALPN h2, 4 concurrent
# streams), 2 WebSocket tunnel clients (5-15 s of echoed frames each), bursts of 5 at an
# upstream with max_inflight = 2 (the intended 503s). Keys: 2 hot keys at 2x their limit
# (100 per 10 s window), 20 cold ones at 20%, a new key once a second (churn).
# Clients open new connections only to instances a load balancer would call ready (not
# after a SIGTERM until the restart is ready); a keep-alive request that got no answer on a
# reused connection is retried once (RFC 9112 9.3.1), as are the streams a GOAWAY left
# unprocessed (RFC 9113 6.8), both counted.
#
# Faults, every 10-30 s, 1-3 at once: Redis SIGKILLed and restarted empty after 3-12 s
# (SOAK_STORE=cluster: instead, the same draws, a master failover `cluster_master`: one
# current master (CLUSTER NODES) SIGKILLed, its replica's promotion awaited (every node ok,
# the killed one no longer serving slots), 3-12 s later the killed node restarted on its port
# with its nodes.conf (it rejoins as a replica); the fault ends when every node is ok again
# and every replica in sync; a cluster run has one at its first fault moment); a
# backend failing (500s), hanging (never answers; read_timeout_ms 2000) or slow (300 ms)
# for 8-30 s; a reload (SIGHUP) with a real change (max_concurrency, a route, a culling
# threshold; checked applied on /metrics); a binary upgrade (-u, upgrade_sock, SIGQUIT: the
# old process must exit 0); a certificate reload (a new key; checked by a new handshake);
# SIGTERM of an instance (it must exit 0) and its restart. Instance 0 is never restarted
# or upgraded: one process lives the whole run, the leak check's witness.
#
# Checks (any failure: exit 1, and `soak: FAIL ...`):
# - requests: every outcome other than 2xx, a 429 of a hot key or a bulkhead 503 is a
#   failure unless caused: a 500 from a backend set to fail; a 500/502/503/504 while a
#   backend fails or hangs (within read_timeout + 1 s; a WebSocket upgrade too: until the
#   101, read_timeout_ms applies); a request whose connection was cut
#   or refused by the instance that was SIGTERMed at that time (from the signal until its
#   restart is ready); a WebSocket tunnel cut on an instance being upgraded (the old process
#   closes its tunnels at shutdown_timeout_seconds). Failed and caused are counted by cause.
#   A 502/503/504 while one of the soak's own backends logged that it was not scheduled for
#   over 1 s (a loaded machine: backend.py's tick) is counted apart, env_backend_not_scheduled.
# - rate limit: a key's admitted requests in each fixed window (the limiter's windows are
#   epoch-aligned; a request whose send and answer fall in two windows counts in both)
#   stay within 1.05 x the limit (docs/src/configuration/rate-limiting.md), and within 3 x 1.05 (each of the 3 instances
#   alone) in windows within 20 s of a Redis outage or of a master failover (the keys of the
#   killed master's slots lose their counters until the promotion).
# - culling: at most max_culled_fraction (0.5) of the 4 backends culled on any instance at
#   any time (never the last), read each second from portcullis_backend_culled; a backend
#   whose fault ended is no longer culled within cooldown + 3 checks + 12 s; none at the end.
# - leaks: each process alive at the end, from max(its start + warm-up, a quarter of the run)
#   (the first faults included: RSS steps up ~2-3 MB at each of the first certificate reloads,
#   then stays flat; the drift from the warm-up is printed too) to the end: VmRSS, open
#   fds (/proc) and portcullis_ratelimit_tracked_keys, means of 1 s samples over 30 s there
#   and over the last 30 s, within 10% (tracked keys move ±15% within a window).
# - logs: every ERROR line of every process falls within 20 s after an injected fault (a
#   store ERROR: after a Redis restart or a master failover).
# - cluster: a replica is promoted within 30 s of a master's kill; every node is ok again
#   within 60 s of the killed node's restart. Printed, not checked: the promotion time and
#   each instance's store healthy again after it (portcullis_ratelimit_store_healthy).
#
# Prints one line `soak: PASS|FAIL store=... seed=... failed=N ...` and appends a row to the
# CSV (its last columns, faults_cluster_master and store, are absent in rows written before
# them: read those as 0 and standalone).
# Needs redis-server, openssl, python3 with python3-h2 (scripts/setup.sh); redis-cli for a cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
SOAK_STORE=${SOAK_STORE:-standalone}
case "$SOAK_STORE" in
  standalone | cluster) ;;
  *) echo "soak: SOAK_STORE must be standalone or cluster, not '$SOAK_STORE'" >&2; exit 2 ;;
esac
export SOAK_STORE
if [ -z "${PC_BIN:-}" ]; then
  cargo build -q --bin portcullis
  PC_BIN="${CARGO_TARGET_DIR:-target}/debug/portcullis"
fi
PC_BIN=$(realpath "$PC_BIN")
export PC_BIN
tools="redis-server openssl"
[ "$SOAK_STORE" = cluster ] && tools="$tools redis-cli"
for t in $tools; do
  command -v "$t" >/dev/null || { echo "soak: needs $t (scripts/setup.sh)" >&2; exit 2; }
done
/usr/bin/python3 -c 'import h2' 2>/dev/null || { echo "soak: needs python3-h2 (scripts/setup.sh)" >&2; exit 2; }
exec /usr/bin/python3 benches/soak/soak.py
