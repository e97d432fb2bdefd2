#!/usr/bin/env bash
# Run the whole test suite: unit tests, Redis integration tests and end-to-end
# tests against the real binary, real redis-server processes and real backends.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --bins --tests
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "$@"
else
  cargo test --no-fail-fast "$@"
fi
