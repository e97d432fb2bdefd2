#!/usr/bin/env bash
# Install what a fresh Debian machine lacks to build and test portcullis:
# cmake (Pingora's zlib-ng build), redis-server (tests start their own on a
# free port), chromium (the status page is rendered in a real headless browser)
# and prometheus with promtool (the shipped dashboard and alert rules are
# checked against a real Prometheus). Needs root, or run the printed command
# yourself.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
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
