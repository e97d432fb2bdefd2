#!/usr/bin/env bash
# Install what a fresh Debian machine lacks to build and test portcullis:
# cmake (Pingora's zlib-ng build), libssl-dev + pkg-config (Pingora's openssl feature,
# linked against the system libssl: see .cargo/config.toml), redis-server (tests start
# their own on a free port), the real TLS/HTTP/2 parts of the edge tests: openssl
# (certificates, s_client), curl, nghttp2-client (nghttp, h2load), nginx, python3-grpcio
# (a real gRPC client and server) and python3-h2 (a real HPACK decoder); chromium
# (the status page is rendered in a real headless browser) and prometheus with promtool
# (the shipped dashboard and alert rules are checked against a real Prometheus); patch
# (scripts/check-vendor.sh applies vendor/*.patch to the published crates).
# Needs root, or run the printed command yourself.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || need+=(libssl-dev)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v patch >/dev/null 2>&1 || need+=(patch)  # scripts/check-vendor.sh
command -v nghttp >/dev/null 2>&1 || need+=(nghttp2-client)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
/usr/bin/python3 -c 'import grpc' >/dev/null 2>&1 || need+=(python3-grpcio)
/usr/bin/python3 -c 'import h2' >/dev/null 2>&1 || need+=(python3-h2)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${need[*]}; run: sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "installing: ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
