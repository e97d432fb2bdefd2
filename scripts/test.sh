#!/usr/bin/env bash
# Run the whole test suite: unit tests, Redis integration tests and end-to-end
# tests against the real binary, real redis-server processes and real backends.
#
#   scripts/test.sh              # the whole suite (what CI runs)
#   scripts/test.sh --perf       # then the instruction guard (scripts/perf-guard.sh): run it
#                                #   before each commit that touches the request path
#   scripts/test.sh --test NAME  # anything else is passed to cargo nextest / cargo test
set -euo pipefail
cd "$(dirname "$0")/.."
perf=0
if [ "${1:-}" = --perf ]; then
  perf=1
  shift
fi
scripts/setup.sh
cargo build --workspace --bins --tests
status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@" || status=$?
else
  cargo test --workspace --no-fail-fast "$@" || status=$?
fi
# The vendored Pingora crates' own unit tests, with their patches' (vendor/README.md), each
# over the other patched crates: pingora-pool's, pingora-proxy's, pingora-http's and
# pingora-core's HTTP, app, listener, service and L4 stream ones (~2 min for the first
# build of their dev-dependencies, shared). Only on a whole-suite run: a run given a
# filter or other arguments is asking for part of the workspace's tests.
if [ "$#" -eq 0 ]; then
  scripts/test-vendored.sh pingora-pool || status=$?
  scripts/test-vendored.sh pingora-proxy || status=$?
  scripts/test-vendored.sh pingora-http || status=$?
  # Skipped: pingora-core's own two `test_rx_timestamp*` tests (RX timestamps, a feature
  # portcullis does not use, in code no patch touches). Each waits 100 us for an
  # asynchronous setsockopt to take effect, and one failed on this 2-core machine while a
  # build ran beside it.
  scripts/test-vendored.sh pingora-core -- protocols::http apps:: listeners:: services:: \
    protocols::l4 --skip test_rx_timestamp || status=$?
fi
if [ "$perf" = 1 ]; then
  scripts/perf-guard.sh || status=$?
fi
exit "$status"
