#!/usr/bin/env bash
# Instructions per proxied request of each balancing mode, through the real release
# binary under callgrind (CONTRACT §10 `balance`, `weights`, `shard_size`).
#
#   cargo build --release --bin portcullis
#   bash benches/balance_callgrind.sh                 # every mode
#   MODES="round_robin random" N1=200 N2=1200 bash benches/balance_callgrind.sh
#
# For each mode the proxy (1 worker thread, rate limit, culling and health checks off)
# runs twice under `valgrind --tool=callgrind`: once for N1 requests, once for N2, each
# time from start to a SIGTERM exit. Start-up and shutdown cost the same in both runs,
# so (I2 - I1) / (N2 - N1) is the cost of one request, whatever the machine's load
# (instruction counts do not depend on timing). Requests go over one keep-alive
# connection (curl's URL globbing) with a different path each, which is also the
# `hash_key` of the keyed modes; 8 backends are one nginx with 8 listeners.
# Prints one line per mode: I1, I2, instructions per request and its ratio to round
# robin, and the part of it spent choosing the backend: inclusive instructions of
# `Pool::select` and `balance::key::hash_bytes` (the keyed modes' key), by the same
# two-run difference. The whole-request figure also holds the background services'
# timer ticks over each run's wall time (a few hundred instructions a request), so
# differences between modes below ~5% of it are noise; the selection figure is not.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$REPO/target/release/portcullis}
N1=${N1:-200}
N2=${N2:-1200}
MODES=${MODES:-round_robin weighted least_requests random consistent_hash shard_2_of_8}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release --bin portcullis" >&2; exit 2; }
for tool in valgrind callgrind_annotate nginx curl; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y $tool)" >&2; exit 2; }
done

TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Eight backends: one nginx, one worker, eight listeners.
mkdir -p "$TMP/nginx"
BACKENDS=()
LISTEN=""
for _ in 1 2 3 4 5 6 7 8; do
  port=$(free_port)
  BACKENDS+=("\"127.0.0.1:$port\"")
  LISTEN+="    listen 127.0.0.1:$port;"$'\n'
done
cat >"$TMP/nginx.conf" <<EOF
worker_processes 1;
pid $TMP/nginx.pid;
error_log $TMP/nginx.err warn;
daemon off;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx/cb; proxy_temp_path $TMP/nginx/p;
  fastcgi_temp_path $TMP/nginx/f; uwsgi_temp_path $TMP/nginx/u; scgi_temp_path $TMP/nginx/s;
  keepalive_requests 10000000;
  server {
$LISTEN    location / { default_type text/plain; return 200 "hello from the backend\n"; }
  }
}
EOF
nginx -c "$TMP/nginx.conf" -p "$TMP" &
PIDS+=($!)

mode_keys() {
  case $1 in
    round_robin) echo '' ;;
    weighted) echo 'weights = [3, 1, 1, 1, 1, 1, 1, 1]' ;;
    least_requests) echo 'balance = "least_requests"' ;;
    random) echo 'balance = "random"' ;;
    consistent_hash) printf 'balance = "consistent_hash"\nhash_key = "path"' ;;
    shard_2_of_8) printf 'shard_size = 2\nhash_key = "path"' ;;
    *) echo "unknown mode $1" >&2; exit 2 ;;
  esac
}

# run MODE N: "total selection" instructions of one proxy life serving N requests.
run() {
  local mode=$1 n=$2 port admin out pid i
  port=$(free_port)
  admin=$(free_port)
  cat >"$TMP/$mode.toml" <<EOF
[server]
listen = ["127.0.0.1:$port"]
admin_listen = "127.0.0.1:$admin"
threads = 1
drain_seconds = 0
shutdown_timeout_seconds = 5
upgrade_sock = "$TMP/$mode.sock"

[[upstreams]]
name = "app"
backends = [$(IFS=,; echo "${BACKENDS[*]}")]
$(mode_keys "$mode")

[rate_limit]
enabled = false

[culling]
enabled = false

[access_log]
enabled = false
EOF
  out="$TMP/cg.$mode.$n"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" -c "$TMP/$mode.toml" \
    >"$TMP/$mode.$n.log" 2>&1 &
  pid=$!
  for ((i = 0; i < 600; i++)); do
    curl -fs -o /dev/null "http://127.0.0.1:$admin/readyz" && break
    sleep 0.2
  done
  curl -fs "http://127.0.0.1:$port/r/[1-$n]" >/dev/null ||
    { echo "requests failed ($mode, $n); log:" >&2; tail -20 "$TMP/$mode.$n.log" >&2; exit 1; }
  kill -TERM "$pid"
  wait "$pid" || true
  local total sel
  total=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
  sel=$(callgrind_annotate --inclusive=yes --threshold=100 "$out" 2>/dev/null |
    awk '!/=>/ && /portcullis::upstream::Pool::select |portcullis::balance::key::hash_bytes / {
           gsub(",", "", $1); s += $1 } END { print s + 0 }')
  echo "$total $sel"
}

echo "mode I1(N1=$N1) I2(N2=$N2) instructions/request vs_round_robin selection/request"
base=""
for mode in $MODES; do
  read -r i1 s1 < <(run "$mode" "$N1")
  read -r i2 s2 < <(run "$mode" "$N2")
  per=$(((i2 - i1) / (N2 - N1)))
  sel=$(awk -v a="$s1" -v b="$s2" -v n="$((N2 - N1))" 'BEGIN { printf "%.0f", (b - a) / n }')
  [ "$mode" = round_robin ] && base=$per
  if [ -n "$base" ]; then
    ratio=$(awk -v a="$per" -v b="$base" 'BEGIN { printf "%.3f", a / b }')
  else
    ratio="-"
  fi
  echo "$mode $i1 $i2 $per $ratio $sel"
done
