#!/usr/bin/env bash
# Install what a fresh Debian machine lacks to build portcullis, and to test it.
#
#   scripts/setup.sh --build   # building and running only (scripts/run.sh uses this)
#   scripts/setup.sh           # that and the test suite's tools (.ci/run, scripts/test.sh)
#
# --build: a C toolchain (gcc, make: jemalloc and zstd are built from C), cmake (Pingora's
# zlib-ng build), libssl-dev + pkg-config (Pingora's openssl feature, linked against the
# system libssl: see .cargo/config.toml).
# Redis is not needed to run: without a [redis] section the proxy uses in-process stores.
# Rust itself comes from rustup (docs/src/quick-start.md).
#
# The rest, for the tests: redis-server (tests start their own on a free port), the real
# TLS/HTTP/2 parts of the edge tests: openssl (certificates, s_client), curl,
# nghttp2-client (nghttp, h2load), nginx, python3-grpcio (a real gRPC client and server)
# and python3-h2 (a real HPACK decoder); chromium (the status page is rendered in a real
# headless browser) and prometheus with promtool (the shipped dashboard and alert rules
# are checked against a real Prometheus); haproxy (`import-haproxy`'s translations are
# run beside the real HAProxy); patch (scripts/check-vendor.sh applies
# vendor/*.patch to the published crates); man-db (the man pages in docs/man/ are rendered
# with `man --warnings`) and mdbook (the book in docs/ is built, tests/docs.rs); rsyslog
# (the access log's syslog output is received by a real rsyslogd, started by the test on
# its own socket and ports); faketime (libfaketime, the clock skew of the chaos harness,
# benches/chaos/run.sh).
# Needs root, or run the printed command yourself.
set -euo pipefail
case ${1:-} in
  --build) tests=0 ;;
  "") tests=1 ;;
  *) echo "setup.sh: unknown argument $1 (--build, or nothing for everything)" >&2; exit 2 ;;
esac
need=()
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || need+=(make)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || need+=(libssl-dev)
if [ "$tests" = 1 ]; then
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  command -v curl >/dev/null 2>&1 || need+=(curl)
  command -v patch >/dev/null 2>&1 || need+=(patch) # scripts/check-vendor.sh
  command -v nghttp >/dev/null 2>&1 || need+=(nghttp2-client)
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
  /usr/bin/python3 -c 'import grpc' >/dev/null 2>&1 || need+=(python3-grpcio)
  /usr/bin/python3 -c 'import h2' >/dev/null 2>&1 || need+=(python3-h2)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  { command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
  command -v man >/dev/null 2>&1 || need+=(man-db) # the man pages render without warnings
  [ -x /usr/sbin/rsyslogd ] || need+=(rsyslog) # tests/syslog.rs: a real syslog receiver
  # libfaketime: the chaos harness skews one instance's clock (benches/chaos/run.sh)
  [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || need+=(faketime)
  # tests/haproxy_side_by_side.rs runs the real HAProxy beside portcullis on the same
  # configurations (the importer's end-to-end test)
  command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${need[*]}; run: sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "installing: ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# mdbook, from crates.io at a pinned version, once per machine (~/.cargo/bin): the book in
# docs/ is built with it and its links checked (tests/docs.rs). Without its `serve` and
# `watch` features (a web server and a file watcher no test uses): 2.5 min of CPU (user)
# to build, 12 min of wall time on 2 cores shared with four other builds (2026-11-28).
MDBOOK_VERSION=0.5.4
if [ "$tests" = 1 ] && ! mdbook --version 2>/dev/null | grep -qx "mdbook v$MDBOOK_VERSION"; then
  echo "installing: mdbook $MDBOOK_VERSION (cargo install)" >&2
  cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features --features search
fi
