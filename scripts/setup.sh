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
# Rust itself comes from rustup (README).
#
# The rest, for the tests: redis-server (tests start their own on a free port), the real
# TLS/HTTP/2 parts of the edge tests: openssl (certificates, s_client), curl,
# nghttp2-client (nghttp, h2load), nginx, python3-grpcio (a real gRPC client and server)
# and python3-h2 (a real HPACK decoder); chromium (the status page is rendered in a real
# headless browser) and prometheus with promtool (the shipped dashboard and alert rules
# are checked against a real Prometheus); haproxy (`import-haproxy`'s translations are
# run beside the real HAProxy); patch (scripts/check-vendor.sh applies
# vendor/*.patch to the published crates).
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
