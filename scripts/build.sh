#!/usr/bin/env bash
# The release build that scripts/run.sh and scripts/demo.sh run: portcullis and the demo
# backend. Prints the directory holding both binaries on stdout.
#
# It is profile-guided, with the profile committed in pgo/ (pgo/README.md), in target/pgo,
# when rustc's LLVM can read that profile (scripts/pgo-profile.sh); otherwise, or with
# PGO=0, it is the plain `cargo build --release` in target/. CARGO_TARGET_DIR overrides
# either directory.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${PGO:-1}" != 0 ] && profile=$(scripts/pgo-profile.sh); then
  dir=${CARGO_TARGET_DIR:-target/pgo}
  echo "build.sh: a profile-guided release build with pgo/portcullis.profdata.gz in $dir (PGO=0: a plain one)" >&2
  CARGO_TARGET_DIR=$dir RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$profile" \
    cargo build --release --bin portcullis --bin demo_backend >&2
else
  dir=${CARGO_TARGET_DIR:-target}
  echo "build.sh: a plain release build in $dir" >&2
  cargo build --release --bin portcullis --bin demo_backend >&2
fi
printf '%s/release\n' "$dir"
