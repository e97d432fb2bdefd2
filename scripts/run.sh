#!/usr/bin/env bash
# Build and run portcullis on conf/portcullis.toml (in-process store, no Redis), or on
# the config given as the first argument.
#
# On the default config, when nothing listens on its backends (127.0.0.1:9001 and
# 127.0.0.1:9002), two demo backends are started there first, so that
# `curl localhost:8080/` answers 200 at once. They are stopped (by their own PIDs)
# when the proxy exits. With your own config nothing but the proxy is started.
set -euo pipefail
cd "$(dirname "$0")/.."
# What building needs (a C toolchain, cmake, libssl-dev): installed, or named when not root.
# Only that: the test suite's tools are `scripts/setup.sh` without --build. Redis is not
# needed to run.
scripts/setup.sh --build
conf=${1:-conf/portcullis.toml}
# profile-guided with pgo/'s profile when rustc can read it (scripts/build.sh; PGO=0: plain)
bin=$(scripts/build.sh)

backends=()
cleanup() {
  local pid
  for pid in "${backends[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${backends[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [ "$conf" = conf/portcullis.toml ]; then
  started=()
  for port in 9001 9002; do
    if ! listening "$port"; then
      "$bin/demo_backend" "127.0.0.1:$port" &
      backends+=($!)
      started+=("127.0.0.1:$port (pid $!)")
    fi
  done
  if [ ${#started[@]} -gt 0 ]; then
    for port in 9001 9002; do
      for _ in $(seq 50); do listening "$port" && break; sleep 0.1; done
    done
    cat >&2 <<EOF
run.sh: nothing listened on the default config's backends, so it started demo backends:
run.sh:   ${started[*]}
run.sh: they answer 200 "hello from demo backend ..." and stop when the proxy exits.
run.sh: try:  curl -i localhost:8080/     (then scripts/demo.sh for the guided tour)
run.sh: to proxy your own services instead, set [[upstreams]] backends in a copy of
run.sh: conf/portcullis.toml and run: scripts/run.sh my.toml (no demo backends then).
EOF
  fi
fi

"$bin/portcullis" -c "$conf" &
proxy=$!
echo "run.sh: portcullis pid $proxy (SIGHUP reloads, SIGTERM drains and stops, Ctrl-C stops)" >&2
# A background job of a script ignores SIGINT, so pass Ctrl-C and SIGTERM on.
trap 'kill -INT "$proxy" 2>/dev/null || true' INT
trap 'kill -TERM "$proxy" 2>/dev/null || true' TERM
status=0
while kill -0 "$proxy" 2>/dev/null; do
  wait "$proxy" && status=0 || status=$?
done
exit "$status"
