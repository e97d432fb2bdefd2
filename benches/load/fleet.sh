#!/usr/bin/env bash
# Fleet-size study (issue 14): 2, 4, 8, 16 real portcullis processes (release build, one
# worker thread each) sharing one Redis (or, with CLUSTER=1, a 3-master Redis Cluster: needs
# the cluster support of `[redis] mode = "cluster"`), one hot API key driven at DEMAND x its
# limit, spread evenly over the instances by a paced client (fleet_client.py). Per fleet
# size it reports:
#   * admitted / limit per full window (the first window, when the key is new to the whole
#     fleet, is reported apart as warm-up);
#   * Redis round trips (EVALSHA) and all commands (those the script runs included, from
#     INFO commandstats) per second, and per second per instance;
#   * Redis CPU (INFO cpu, used_cpu_sys + used_cpu_user) as % of one core, and per round
#     trip (us).
#
#   bash benches/load/fleet.sh             # ~2.5 min after the build; writes results/fleet.csv
#   QUICK=1 bash benches/load/fleet.sh     # sizes 2 4, 2 windows; writes out/quick/ only
#   CLUSTER=1 bash benches/load/fleet.sh   # the same against a 3-master cluster (fleet-cluster.csv)
#
# Environment: SIZES="2 4 8 16" WINDOW=5 (s) LIMIT=1000 DEMAND=4 WINDOWS=3 (full windows
# measured after the warm-up one) FLUSH_MS=50 SKIP_BUILD=1 RESULTS=dir KEEP_TMP=1.
# Only loopback is used; every process started here is stopped by PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
QUICK=${QUICK:-0}
CLUSTER=${CLUSTER:-0}
if [ "$QUICK" = 1 ]; then
  SIZES=${SIZES:-"2 4"}
  WINDOWS=${WINDOWS:-2}
  RESULTS=${RESULTS:-$HERE/out/quick}
else
  SIZES=${SIZES:-"2 4 8 16"}
  WINDOWS=${WINDOWS:-3}
  RESULTS=${RESULTS:-$HERE/results}
fi
WINDOW=${WINDOW:-5}
LIMIT=${LIMIT:-1000}
DEMAND=${DEMAND:-4}
FLUSH_MS=${FLUSH_MS:-50}
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
CSV=$RESULTS/fleet.csv
[ "$CLUSTER" = 1 ] && CSV=$RESULTS/fleet-cluster.csv
mkdir -p "$RESULTS"

log() { printf '[fleet %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"

TMP=$(mktemp -d /tmp/portcullis-fleet.XXXXXX)
declare -a PIDS=()
cleanup() {
  local rc=$? p
  set +e
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -INT "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  if [ "${KEEP_TMP:-0}" = 1 ] || [ "$rc" != 0 ]; then log "temp dir kept: $TMP"; else rm -rf "$TMP"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
bg() { # bg LOG CMD...: start in the background, remember the PID in $LAST
  local out=$1
  shift
  "$@" >"$out" 2>&1 &
  LAST=$!
  PIDS+=("$LAST")
}

for b in redis-server redis-cli python3 curl; do
  command -v "$b" >/dev/null || die "$b not installed (scripts/setup.sh)"
done
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  log "building portcullis (release)"
  (cd "$REPO" && cargo build --release --bin portcullis >&2)
fi
BIN=$TARGET_DIR/release/portcullis
[ -x "$BIN" ] || die "no $BIN"

# ------------------------------------------------------------------ Redis
declare -a RPORTS=()
if [ "$CLUSTER" = 1 ]; then
  read -r -a RPORTS <<<"$(free_ports 3)"
  # Each node's bus port is a free port of its own: port + 10000 overflows for high ports.
  read -r -a BUSPORTS <<<"$(free_ports 3)"
  for i in 0 1 2; do
    p=${RPORTS[$i]}
    mkdir -p "$TMP/redis-$p"
    bg "$TMP/redis-$p.log" redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no \
      --cluster-enabled yes --cluster-port "${BUSPORTS[$i]}" \
      --cluster-config-file "$TMP/redis-$p/nodes.conf" --dir "$TMP/redis-$p"
  done
  for p in "${RPORTS[@]}"; do
    for _ in $(seq 1 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  redis-cli --cluster create "${RPORTS[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$TMP/cluster.log" 2>&1 ||
    die "cluster create failed: $(tail -n 5 "$TMP/cluster.log")"
  for _ in $(seq 1 100); do
    redis-cli -p "${RPORTS[0]}" cluster info | grep -q 'cluster_state:ok' && break
    sleep 0.1
  done
  nodes=$(printf '"127.0.0.1:%s", ' "${RPORTS[@]}")
  REDIS_TOML="mode = \"cluster\"
nodes = [${nodes%, }]"
  MODE=cluster3
else
  RPORTS=("$(free_ports 1)")
  bg "$TMP/redis.log" redis-server --port "${RPORTS[0]}" --bind 127.0.0.1 --save "" --appendonly no
  for _ in $(seq 1 50); do redis-cli -p "${RPORTS[0]}" ping >/dev/null 2>&1 && break; sleep 0.1; done
  REDIS_TOML="url = \"redis://127.0.0.1:${RPORTS[0]}\""
  MODE=single
fi

# Sum over the Redis nodes: "evalsha_calls all_calls cpu_seconds".
redis_stats() {
  local p
  for p in "${RPORTS[@]}"; do
    redis-cli -p "$p" INFO commandstats | tr -d '\r'
    redis-cli -p "$p" INFO cpu | tr -d '\r'
  done | python3 -c '
import sys
ev = allc = 0
cpu = 0.0
for line in sys.stdin:
    line = line.strip()
    if line.startswith("cmdstat_"):
        name, _, fields = line[len("cmdstat_"):].partition(":")
        calls = int(dict(f.split("=") for f in fields.split(","))["calls"])
        if name in ("info",):
            continue
        allc += calls
        if name in ("evalsha", "eval"):
            ev += calls
    elif line.startswith(("used_cpu_sys:", "used_cpu_user:")):
        cpu += float(line.split(":")[1])
print(ev, allc, cpu)'
}

# ------------------------------------------------------------------ backend
P_BACK=$(free_ports 1)
mkdir -p "$TMP/nginx-tmp"
render "$HERE/conf/backend.nginx.conf" "$TMP/backend.conf" TMP="$TMP" BACKEND_PORT="$P_BACK"
bg "$TMP/backend.log" nginx -p "$TMP" -c "$TMP/backend.conf" -e "$TMP/backend.err"
for _ in $(seq 1 50); do curl -s -o /dev/null "http://127.0.0.1:$P_BACK/" && break; sleep 0.1; done

proxy_conf() { # proxy_conf FILE PORT ADMIN
  cat >"$1" <<EOF
[server]
listen = ["127.0.0.1:$2"]
admin_listen = "127.0.0.1:$3"
threads = 1
drain_seconds = 0
shutdown_timeout_seconds = 2
upgrade_sock = "$TMP/up-$2.sock"

[redis]
$REDIS_TOML
key_prefix = "fleet"
flush_interval_ms = $FLUSH_MS

[[upstreams]]
name = "app"
backends = ["127.0.0.1:$P_BACK"]

[shedding]
max_concurrency = 0

[rate_limit]
key = "header:x-api-key"
limit = $LIMIT
window_seconds = $WINDOW

[culling]
enabled = false

[access_log]
enabled = false
EOF
}

RATE=$((LIMIT * DEMAND / WINDOW))
echo "mode,instances,limit,window_s,demand_rps,full_windows,admitted_ratio_mean,admitted_ratio_min,admitted_ratio_max,warmup_ratio,client_errors,evalsha_per_s,evalsha_per_s_per_instance,cmds_per_s,cmds_per_s_per_instance,redis_cpu_pct,redis_cpu_us_per_evalsha,flush_ms" >"$CSV"
for N in $SIZES; do
  read -r -a ports <<<"$(free_ports $((2 * N)))"
  declare -a mine=()
  for ((i = 0; i < N; i++)); do
    port=${ports[i]} admin=${ports[N + i]}
    proxy_conf "$TMP/p$i.toml" "$port" "$admin"
    "$BIN" -c "$TMP/p$i.toml" --check >/dev/null 2>"$TMP/p$i.check" || die "config rejected: $(cat "$TMP/p$i.check")"
    bg "$TMP/p$N-$i.log" "$BIN" -c "$TMP/p$i.toml"
    mine+=("$LAST")
  done
  for ((i = 0; i < N; i++)); do
    for _ in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:${ports[N + i]}/readyz" && break; sleep 0.1; done
  done
  key="hot-$N-$RANDOM"
  # Start the load at a window boundary: window 0 is the warm-up, then WINDOWS full ones.
  python3 -c "import time; w=$WINDOW; t=time.time(); time.sleep(w - t % w + 0.01)"
  read -r e0 a0 c0 <<<"$(redis_stats)"
  t0=$(date +%s.%N)
  python3 "$HERE/fleet_client.py" "$RATE" $(((WINDOWS + 1) * WINDOW)) $((WINDOW * 1000)) "$key" "${ports[@]:0:N}" >"$TMP/client-$N.json"
  t1=$(date +%s.%N)
  read -r e1 a1 c1 <<<"$(redis_stats)"
  for p in "${mine[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${mine[@]}"; do wait "$p" 2>/dev/null || true; done
  python3 - "$TMP/client-$N.json" "$MODE" "$N" "$LIMIT" "$WINDOW" "$RATE" "$WINDOWS" "$t0" "$t1" \
    "$e0" "$e1" "$a0" "$a1" "$c0" "$c1" "$FLUSH_MS" >>"$CSV" <<'PY'
import json, sys
f, mode, n, limit, window, rate, windows, t0, t1, e0, e1, a0, a1, c0, c1, flush = sys.argv[1:]
d = json.load(open(f))
n, limit, windows = int(n), int(limit), int(windows)
wins = sorted(d["windows"].items(), key=lambda kv: int(kv[0]))
start = min(int(k) for k, _ in wins)  # the window the load started in
ratio = {int(k) - start: v[0] / limit for k, v in wins}
full = [ratio[i] for i in range(1, windows + 1) if i in ratio]
errors = sum(v[2] for _, v in wins)
dt = float(t1) - float(t0)
ev = (int(e1) - int(e0)) / dt
allc = (int(a1) - int(a0)) / dt
cpu = (float(c1) - float(c0)) / dt
print(",".join(str(x) for x in [
    mode, n, limit, window, rate, len(full),
    round(sum(full) / len(full), 4) if full else "", round(min(full), 4) if full else "",
    round(max(full), 4) if full else "", round(ratio.get(0, 0), 4), errors,
    round(ev, 1), round(ev / n, 2), round(allc, 1), round(allc / n, 2),
    round(cpu * 100, 2), round(cpu / ev * 1e6, 1) if ev else "", flush]))
PY
  log "N=$N: $(tail -n 1 "$CSV")"
done
column -s, -t <"$CSV" >&2
