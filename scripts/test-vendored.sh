#!/usr/bin/env bash
# A vendored Pingora crate's own unit tests (its `src/` tests), against the other vendored
# and patched crates, as portcullis builds them (vendor/README.md). A crate outside the
# workspace does not see the workspace's [patch.crates-io], so this makes a throwaway
# workspace around a copy of vendor/CRATE, with the other vendored crates patched in.
# scripts/test.sh runs it on a whole-suite run. The first build of a crate's
# dev-dependencies (reqwest, hyper, tungstenite...) takes ~2 min on 2 cores.
#
#   bash scripts/test-vendored.sh pingora-proxy                  # all of pingora-proxy's unit tests
#   bash scripts/test-vendored.sh pingora-core protocols::http   # a filter, passed to cargo test
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CRATE=${1:?usage: test-vendored.sh CRATE [cargo test arguments]}
shift
[ -d "$ROOT/vendor/$CRATE" ] || { echo "no vendored crate vendor/$CRATE" >&2; exit 2; }
WS=$ROOT/target/vendored-tests/$CRATE
rm -rf "$WS/$CRATE"
mkdir -p "$WS"
cp -r "$ROOT/vendor/$CRATE" "$WS/"
rm -f "$WS/$CRATE/Cargo.lock"
{
  printf '[workspace]\nmembers = ["%s"]\nresolver = "2"\n\n[patch.crates-io]\n' "$CRATE"
  for dir in "$ROOT"/vendor/pingora-*/; do
    other=$(basename "$dir")
    [ "$other" = "$CRATE" ] || printf '%s = { path = "%s" }\n' "$other" "${dir%/}"
  done
} >"$WS/Cargo.toml"
# Start from portcullis's lock file on every run, so the shared dependencies are the
# versions it runs now (cargo adds the crate's dev-dependencies to it).
cp "$ROOT/Cargo.lock" "$WS/Cargo.lock"
cd "$WS"
# One target directory for every crate's workspace: the dependencies they share build once.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/vendored-tests/target}
exec cargo test --lib -p "$CRATE" "$@"
