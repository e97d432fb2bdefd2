#!/usr/bin/env bash
# pingora-proxy's own unit tests (its `src/` tests, 58 of them) against the vendored and
# patched pingora-proxy, pingora-core, pingora-http and pingora-pool together, as
# portcullis builds them (vendor/README.md). A crate outside the workspace does not see
# the workspace's [patch.crates-io], so this makes a throwaway workspace around a copy of
# vendor/pingora-proxy with the same patches. scripts/test.sh runs it on a whole-suite run;
# its first build (pingora-proxy's dev-dependencies: reqwest, hyper, tungstenite...) takes
# ~2 min on 2 cores.
#
#   bash scripts/test-vendored-proxy.sh            # all of pingora-proxy's unit tests
#   bash scripts/test-vendored-proxy.sh proxy_h1   # a filter, passed to cargo test
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WS=$ROOT/target/vendored-proxy-tests
rm -rf "$WS/pingora-proxy"
mkdir -p "$WS"
cp -r "$ROOT/vendor/pingora-proxy" "$WS/"
rm -f "$WS/pingora-proxy/Cargo.lock"
cat >"$WS/Cargo.toml" <<TOML
[workspace]
members = ["pingora-proxy"]
resolver = "2"

[patch.crates-io]
pingora-http = { path = "$ROOT/vendor/pingora-http" }
pingora-core = { path = "$ROOT/vendor/pingora-core" }
pingora-pool = { path = "$ROOT/vendor/pingora-pool" }
TOML
# Start from portcullis's lock file on every run, so the shared dependencies are the
# versions it runs now (cargo adds pingora-proxy's dev-dependencies to it).
cp "$ROOT/Cargo.lock" "$WS/Cargo.lock"
cd "$WS"
exec cargo test --lib -p pingora-proxy "$@"
