#!/usr/bin/env bash
# Memory under slow readers: N clients download a large object (a sparse file served by a
# real nginx on loopback, as fast as it can send) through one proxy, each reading at RATE
# (curl --limit-rate) for DURATION seconds; the proxy's resident memory (VmRSS) is sampled every
# 100 ms. Prints one CSV row per N on stdout:
#   target,clients,object_bytes,rate,seconds,rss_before_kib,rss_peak_kib,rss_end_kib
#
#   PC_BIN=target/release/portcullis bash benches/load/slow_readers.sh
#   CLIENTS="1 10 100" SIZE=1073741824 RATE=100k DURATION=10 PC_BIN=... bash benches/load/slow_readers.sh
#   TARGET=haproxy bash benches/load/slow_readers.sh      # the same in front of HAProxy
#
# Environment: PC_BIN (the portcullis binary; required for TARGET=portcullis), TARGET
# (portcullis | haproxy), CLIENTS ("1 10 100"), SIZE (1 GiB), RATE (per client: a curl
# --limit-rate such as 100k, the default; `full`: as fast as curl reads; `none`: a client
# that sends the request and reads nothing),
# DURATION (seconds, 10), EXTRA (more `[server]` lines for portcullis, e.g.
# "max_response_buffer_bytes = 1073741824"). Every process it starts is stopped by PID.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init slow_readers
TARGET=${TARGET:-portcullis}
CLIENTS=${CLIENTS:-1 10 100}
SIZE=${SIZE:-1073741824}
RATE=${RATE:-100k}
SECONDS_EACH=${DURATION:-10}
EXTRA=${EXTRA:-}
need nginx curl python3
[ "$TARGET" != haproxy ] || need haproxy
[ "$TARGET" != portcullis ] || [ -x "${PC_BIN:-}" ] || die "PC_BIN must name a portcullis binary"
bench_tmp slow_readers
read -r P_NGINX P_PROXY P_ADMIN < <(free_ports 3)

mkdir -p "$TMP/www"
truncate -s "$SIZE" "$TMP/www/big.bin"
cat >"$TMP/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $TMP/nginx.pid;
error_log $TMP/nginx.error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $TMP/body;
  proxy_temp_path $TMP/proxy;
  fastcgi_temp_path $TMP/fastcgi;
  uwsgi_temp_path $TMP/uwsgi;
  scgi_temp_path $TMP/scgi;
  server { listen 127.0.0.1:$P_NGINX; location / { root $TMP/www; } }
}
EOF
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
"$nginx_bin" -p "$TMP" -e "$TMP/nginx.error.log" -c "$TMP/nginx.conf" &
PIDS+=($!)
wait_port "$P_NGINX"

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

start_proxy() {
  if [ "$TARGET" = haproxy ]; then
    cat >"$TMP/haproxy.cfg" <<EOF
global
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 120s
  timeout server 120s
frontend fe
  bind 127.0.0.1:$P_PROXY
  default_backend be
backend be
  server s1 127.0.0.1:$P_NGINX
EOF
    haproxy -f "$TMP/haproxy.cfg" -db >"$TMP/proxy.log" 2>&1 &
  else
    cat >"$TMP/portcullis.toml" <<EOF
[server]
listen = ["127.0.0.1:$P_PROXY"]
admin_listen = "127.0.0.1:$P_ADMIN"
threads = 2
upgrade_sock = "$TMP/upgrade.sock"
$EXTRA

[[upstreams]]
name = "app"
backends = ["127.0.0.1:$P_NGINX"]
read_timeout_ms = 120000

[rate_limit]
enabled = false

[culling]
enabled = false
EOF
    "$PC_BIN" -c "$TMP/portcullis.toml" >"$TMP/proxy.log" 2>&1 &
  fi
  PROXY_PID=$!
  PIDS+=("$PROXY_PID")
  wait_port "$P_PROXY"
  curl -s -o /dev/null "http://127.0.0.1:$P_PROXY/" || true # warm-up (a 404)
}

for n in $CLIENTS; do
  start_proxy
  before=$(rss_kib "$PROXY_PID")
  clients=()
  for _ in $(seq 1 "$n"); do
    case $RATE in
      none) # sends the request, then reads nothing until it closes
        python3 -c 'import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: b\r\n\r\n")
time.sleep(float(sys.argv[2]))' "$P_PROXY" "$SECONDS_EACH" &
        ;;
      full) curl -s -o /dev/null --max-time "$SECONDS_EACH" "http://127.0.0.1:$P_PROXY/big.bin" & ;;
      *)
        curl -s -o /dev/null --limit-rate "$RATE" --max-time "$SECONDS_EACH" \
          "http://127.0.0.1:$P_PROXY/big.bin" &
        ;;
    esac
    clients+=($!)
  done
  PIDS+=("${clients[@]}")
  peak=$before
  end=$(($(date +%s) + SECONDS_EACH))
  while [ "$(date +%s)" -lt "$end" ]; do
    r=$(rss_kib "$PROXY_PID")
    [ "$r" -gt "$peak" ] && peak=$r
    sleep 0.1
  done
  for c in "${clients[@]}"; do wait "$c" 2>/dev/null || true; done
  last=$(rss_kib "$PROXY_PID")
  [ "$last" -gt "$peak" ] && peak=$last
  log "$TARGET, $n client(s) at $RATE: RSS $before KiB before, peak $peak KiB, $last KiB at the end"
  echo "$TARGET,$n,$SIZE,$RATE,$SECONDS_EACH,$before,$peak,$last"
  stop_pid "$PROXY_PID"
done
