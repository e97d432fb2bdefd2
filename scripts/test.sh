#!/usr/bin/env bash
# Run the whole test suite: unit tests, Redis integration tests and end-to-end
# tests against the real binary, real redis-server processes and real backends.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --bins --tests
status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "$@" || status=$?
else
  cargo test --no-fail-fast "$@" || status=$?
fi
# The vendored pingora-pool's own unit tests, with the patch's (vendor/README.md); a crate
# outside the workspace is tested through its own manifest. Only on a whole-suite run: a
# run given a filter or other arguments is asking for part of the workspace's tests.
if [ "$#" -eq 0 ]; then
  CARGO_TARGET_DIR=target/vendor-tests cargo test --manifest-path vendor/pingora-pool/Cargo.toml || status=$?
  # pingora-proxy's and pingora-http's own unit tests, and pingora-core's HTTP ones, over the
  # patched pingora crates (~2 min for the first build of their dev-dependencies, shared).
  scripts/test-vendored.sh pingora-proxy || status=$?
  scripts/test-vendored.sh pingora-http || status=$?
  scripts/test-vendored.sh pingora-core -- protocols::http apps:: || status=$?
fi
exit "$status"
