#!/usr/bin/env bash
# Build and run portcullis on its embedded default config (in-process store, no Redis).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo run --release --bin portcullis -- -c "${1:-conf/portcullis.toml}"
