#!/usr/bin/env bash
# A profile-guided (PGO) release build of portcullis: the build for production.
#
#   bash scripts/build-pgo.sh                                   # train now -> target/pgo/portcullis
#   PGO_PROFILE=pgo/portcullis.profdata.gz bash scripts/build-pgo.sh  # no training: the committed profile
#   SAVE_PROFILE=1 bash scripts/build-pgo.sh                    # train, and refresh the committed profile
#
# 1. builds portcullis instrumented (-Cprofile-generate, fat LTO) in target/pgo-gen;
# 2. trains it on loopback: the nginx backend and a redis-server of benches/load, every
#    gate on (benches/load/conf/portcullis-gates-on.toml), TRAIN_H1 HTTP/1.1 keep-alive
#    requests and TRAIN_H2 HTTP/2-over-TLS streams from h2load, then stops it with SIGINT
#    so the profile is written at exit;
# 3. merges the profile (llvm-profdata of the LLVM that rustc uses) and builds portcullis
#    again with -Cprofile-use in target/pgo (target/pgo/release/portcullis);
# 4. with BOLT=1 (or BOLT=auto and llvm-bolt installed), instruments that build with
#    BOLT, trains it the same way, and writes it out with its code laid out by the second
#    profile (hot paths together, cold code split off). Off by default: in three A/Bs it
#    saved no CPU over PGO alone (fourteenth pass), and valgrind 3.19 cannot read the
#    debug sections it writes.
# The result is target/pgo/portcullis.
# The code is the same; only the compiler's layout, inlining and branch decisions follow
# the profile. The CPU it saves is measured in benches/history/2026-11-passes.md (issue 16, fourteenth pass).
#
# PGO_PROFILE=FILE skips steps 1 and 2: step 3 uses FILE (an indexed profile, gzipped or
# not), such as the one committed in pgo/ (pgo/README.md), which scripts/run.sh uses too.
# It needs neither llvm-profdata nor the load tools, only rustc's LLVM at least as new as
# the one that wrote FILE. Functions changed since FILE was trained lose their profile
# (LLVM matches each function's control-flow hash) and are optimized as without PGO.
# SAVE_PROFILE=1 writes the merged profile of step 2, sparse (functions never run are left
# out) and gzipped, to pgo/portcullis.profdata.gz, and what it was trained on to
# pgo/profile.env.
#
# Environment: TRAIN_H1 (200000), TRAIN_H2 (100000), PROFDATA (llvm-profdata matching
# `rustc -vV`'s LLVM major; found as llvm-profdata-<major> or llvm-profdata), KEEP_PROFILE=1
# keeps target/pgo-gen/merged.profdata's raw inputs, PGO_PROFILE, SAVE_PROFILE, BOLT
# (0 | 1 | auto), BOLT_BIN and MERGE_FDATA (llvm-bolt-<major>, merge-fdata-<major>),
# CARGO_PROFILE_RELEASE_LTO and CARGO_PROFILE_RELEASE_CODEGEN_UNITS (Cargo.toml's: fat, 1).
# Training needs nginx, redis-server, h2load, openssl, curl (scripts/setup.sh) and
# llvm-profdata (Debian: apt-get install llvm-<major>).
# Every process it starts is stopped by PID on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../benches/load" && pwd)
# shellcheck source-path=SCRIPTDIR source=../benches/load/lib.sh disable=SC1091
. "$HERE/lib.sh"
bench_init build-pgo
TRAIN_H1=${TRAIN_H1:-200000}
TRAIN_H2=${TRAIN_H2:-100000}
# Both builds are `--release`, so both take Cargo.toml's release profile (whole-program LTO
# in one codegen unit: −4% instructions and −3% CPU per request on top of PGO + BOLT,
# fourteenth pass), or the same CARGO_PROFILE_RELEASE_* overrides from the environment; the
# profile always matches the code it is applied to.
GEN_DIR=$REPO/target/pgo-gen
USE_DIR=$REPO/target/pgo
RAW=$GEN_DIR/profraw
MERGED=$GEN_DIR/merged.profdata

PGO_PROFILE=${PGO_PROFILE:-}
SAVE_PROFILE=${SAVE_PROFILE:-0}
[ -z "$PGO_PROFILE" ] || [ "$SAVE_PROFILE" = 0 ] ||
  die "SAVE_PROFILE=1 stores a profile trained now; it does not go with PGO_PROFILE"
llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
[ -n "$llvm_major" ] || die "cannot read rustc's LLVM version (rustc -vV)"
if [ -z "$PGO_PROFILE" ]; then
  need nginx redis-server h2load openssl curl
  if [ -z "${PROFDATA:-}" ]; then
    for p in "llvm-profdata-$llvm_major" llvm-profdata; do
      if command -v "$p" >/dev/null && "$p" --version 2>/dev/null | grep -q "version $llvm_major\."; then
        PROFDATA=$p
        break
      fi
    done
  fi
  [ -n "${PROFDATA:-}" ] || die "no llvm-profdata of LLVM $llvm_major (rustc's): apt-get install llvm-$llvm_major, or set PROFDATA"
fi
BOLT=${BOLT:-0}
BOLT_BIN=${BOLT_BIN:-llvm-bolt-$llvm_major}
MERGE_FDATA=${MERGE_FDATA:-merge-fdata-$llvm_major}
if [ "$BOLT" = auto ]; then
  if command -v "$BOLT_BIN" >/dev/null && command -v "$MERGE_FDATA" >/dev/null; then BOLT=1; else BOLT=0; fi
fi
[ "$BOLT" = 0 ] || need "$BOLT_BIN" "$MERGE_FDATA" nginx redis-server h2load openssl curl

# train BIN: runs BIN on every gate (pc_on) under HTTP/1.1 then HTTP/2-over-TLS load, and
# stops it with SIGINT each time, so that its profile is written at exit.
train() {
  PC_BIN=$1
  bench_tmp pgo
  read -r P_BACKEND P_PROXY P_ADMIN P_REDIS < <(free_ports 4)
  start_backend "$P_BACKEND"
  start_redis "$P_REDIS"
  PROXY_THREADS=${PROXY_THREADS:-2}
  CONNS=32
  for MODE in h1 h2tls; do
    client_mode
    start_target pc_on 200
    if [ "$MODE" = h1 ]; then requests "$TRAIN_H1"; else requests "$TRAIN_H2" 8; fi
    # the admin side too: what operators scrape
    for path in metrics healthz readyz; do curl -s -o /dev/null "http://127.0.0.1:$P_ADMIN/$path"; done
    stop_pid "$TARGET_PID"
  done
  bench_cleanup
  trap - EXIT INT TERM
}

if [ -n "$PGO_PROFILE" ]; then
  MERGED=$("$REPO/scripts/pgo-profile.sh" "$PGO_PROFILE") || die "cannot use PGO_PROFILE=$PGO_PROFILE"
  log "1-2/4 no training: the profile is $PGO_PROFILE"
else
  log "1/4 instrumented build ($GEN_DIR)"
  rm -f "$MERGED"
  (cd "$REPO" && CARGO_TARGET_DIR=$GEN_DIR RUSTFLAGS="-Cprofile-generate=$RAW" \
    cargo build --release --bin portcullis) >&2
  # RUSTFLAGS instruments the build scripts and proc macros too, and they write their
  # profiles here as they run: emptied after the build, so only the proxy's run is training
  rm -rf "$RAW"
  mkdir -p "$RAW"

  log "2/4 training: $TRAIN_H1 HTTP/1.1 requests, $TRAIN_H2 HTTP/2-over-TLS streams"
  LLVM_PROFILE_FILE="$RAW/portcullis-%p-%m.profraw" train "$GEN_DIR/release/portcullis"
  ls "$RAW"/*.profraw >/dev/null 2>&1 || die "no profile written in $RAW (did portcullis exit cleanly on SIGINT?)"
  # sparse: the functions that never ran are left out (1.3 MB instead of 8.9 MB, 0.26 MB
  # gzipped), and LLVM optimizes them as it would without a profile; the same profile as
  # SAVE_PROFILE stores, so the build made here is the one a stored profile gives
  "$PROFDATA" merge --sparse -o "$MERGED" "$RAW"/*.profraw
  [ "${KEEP_PROFILE:-0}" = 1 ] || rm -rf "$RAW"
  if [ "$SAVE_PROFILE" = 1 ]; then
    mkdir -p "$REPO/pgo"
    gzip -9n -c "$MERGED" >"$REPO/pgo/portcullis.profdata.gz"
    trained_at=$(cd "$REPO" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    # the binary's inputs, as scripts/pgo-profile.sh's staleness notice counts them
    (cd "$REPO" && git diff --quiet HEAD -- src vendor Cargo.toml Cargo.lock \
      ':(exclude)*.md' ':(exclude)vendor/*.patch' 2>/dev/null) ||
      trained_at="$trained_at+changes"
    cat >"$REPO/pgo/profile.env" <<EOF
# written by SAVE_PROFILE=1 scripts/build-pgo.sh; read by scripts/pgo-profile.sh
LLVM_MAJOR=$llvm_major
RUSTC=$(rustc -V | cut -d' ' -f2)
TRAINED_AT=$trained_at
TRAIN_H1=$TRAIN_H1
TRAIN_H2=$TRAIN_H2
PROXY_THREADS=$PROXY_THREADS
EOF
    log "saved the profile: pgo/portcullis.profdata.gz and pgo/profile.env (commit both)"
  fi
fi

log "3/4 optimized build with the profile ($USE_DIR)"
# BOLT needs the relocations kept: --emit-relocs on the final link only (the dependencies
# are built the same either way)
relocs=()
[ "$BOLT" = 0 ] || relocs=(-Clink-arg=-Wl,--emit-relocs)
(cd "$REPO" && CARGO_TARGET_DIR=$USE_DIR RUSTFLAGS="-Cprofile-use=$MERGED" \
  cargo rustc --release --bin portcullis -- "${relocs[@]}") >&2
FINAL=$USE_DIR/portcullis
if [ "$BOLT" = 0 ]; then
  cp "$USE_DIR/release/portcullis" "$FINAL"
  log "built $FINAL (PGO; BOLT=0)"
  exit 0
fi

log "4/4 BOLT: instrument, train again, lay the code out by the profile"
bdir=$GEN_DIR/bolt
rm -rf "$bdir"
mkdir -p "$bdir"
"$BOLT_BIN" "$USE_DIR/release/portcullis" -instrument -instrumentation-file="$bdir/prof" \
  -instrumentation-file-append-pid -o "$bdir/portcullis.inst" >"$bdir/instrument.log" 2>&1 ||
  die "llvm-bolt -instrument failed: $bdir/instrument.log"
train "$bdir/portcullis.inst"
ls "$bdir"/prof.*.fdata >/dev/null 2>&1 || die "no BOLT profile written in $bdir"
"$MERGE_FDATA" "$bdir"/prof.*.fdata >"$bdir/merged.fdata" 2>"$bdir/merge.log" ||
  die "merge-fdata failed: $bdir/merge.log"
"$BOLT_BIN" "$USE_DIR/release/portcullis" -o "$FINAL.tmp" -data="$bdir/merged.fdata" \
  -reorder-blocks=ext-tsp -reorder-functions=cdsort -split-functions -split-all-cold \
  -split-eh -icf=all -use-gnu-stack -update-debug-sections -dyno-stats >"$bdir/optimize.log" 2>&1 ||
  die "llvm-bolt failed: $bdir/optimize.log"
mv "$FINAL.tmp" "$FINAL"
"$FINAL" --version >/dev/null
log "built $FINAL (PGO + BOLT; the PGO-only build is $USE_DIR/release/portcullis)"
