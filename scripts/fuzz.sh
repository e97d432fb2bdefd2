#!/usr/bin/env bash
# Fuzz one of the parsers portcullis owns (fuzz/, docs/src/development.md "Fuzzing") with AFL++ through
# cargo-afl on the stable toolchain, for SECONDS, from its committed seed corpus
# fuzz/corpus/TARGET/. Exits 1 when afl-fuzz found a crash (a panic: the harnesses also
# assert what each parser promises), after copying the crashing inputs to
# fuzz/crashes/TARGET/ (not committed: fix the defect, then add the input to the corpus
# as its regression case).
#
#   scripts/fuzz.sh TARGET SECONDS   # TARGET: proxy_protocol http1 key config admin jwt tenants haproxy
#   scripts/fuzz.sh all SECONDS      # each target in turn, SECONDS each
#
# The first run installs cargo-afl (crates.io) and builds AFL++ from its bundled sources
# (~3 min), then builds the instrumented harnesses in their own target directory
# ($CARGO_TARGET_DIR/afl, or FUZZ_TARGET_DIR). AFL_OPT_LEVEL (default 1) is the harness
# build's -C opt-level; FUZZ_OUT keeps afl-fuzz's output and log (default: a temporary
# directory, removed after): FUZZ_OUT/afl/default/{queue,crashes,fuzzer_stats}.
set -euo pipefail
cd "$(dirname "$0")/.."
targets="proxy_protocol http1 key config admin jwt tenants haproxy"
usage() { echo "usage: scripts/fuzz.sh {$(echo $targets | tr ' ' '|')|all} SECONDS" >&2; exit 2; }
[ "$#" -eq 2 ] || usage
target=$1
seconds=$2
[[ $seconds =~ ^[0-9]+$ ]] && [ "$seconds" -gt 0 ] || usage
if [ "$target" = all ]; then
  status=0
  for t in $targets; do "$0" "$t" "$seconds" || status=1; done
  exit "$status"
fi
case " $targets " in *" $target "*) ;; *) usage ;; esac

if ! cargo afl --version >/dev/null 2>&1; then
  cargo install cargo-afl --version 0.18.2 --locked
fi
if ! out=$(cargo afl config --build 2>&1); then
  case $out in
    *"already built"*) ;;
    *) echo "$out" >&2; exit 1 ;;
  esac
fi

target_dir=${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/afl}
AFL_OPT_LEVEL=${AFL_OPT_LEVEL:-1} CARGO_TARGET_DIR=$target_dir \
  cargo afl build -q -j2 -p portcullis-fuzz --features afl --bin "$target"
bin=$target_dir/debug/$target

out=${FUZZ_OUT:-}
if [ -z "$out" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
# AFL_NO_AFFINITY: other builds share this machine's cores; AFL_SKIP_CPUFREQ: no governor
# to read in a container; core dumps go to a file (core_pattern), which afl-fuzz accepts.
AFL_NO_UI=1 AFL_QUIET=1 AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_FAST_CAL=1 \
  AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_SKIP_CRASHES=1 \
  cargo afl fuzz -i "fuzz/corpus/$target" -o "$out/afl" -V "$seconds" -t 2000 -- "$bin" \
  >"$out/afl.log" 2>&1 || { tail -30 "$out/afl.log" >&2; exit 1; }

stats=$out/afl/default/fuzzer_stats
stat() { sed -n "s/^$1 *: *//p" "$stats"; }
crashes=$(find "$out/afl/default/crashes" -name 'id:*' | wc -l)
hangs=$(find "$out/afl/default/hangs" -name 'id:*' | wc -l)
echo "fuzz: $target ${seconds}s execs=$(stat execs_done) execs/s=$(stat execs_per_sec)" \
  "corpus=$(stat corpus_count) edges=$(stat edges_found) crashes=$crashes hangs=$hangs"
if [ "$crashes" -gt 0 ]; then
  mkdir -p "fuzz/crashes/$target"
  cp "$out"/afl/default/crashes/id:* "fuzz/crashes/$target/"
  echo "fuzz: $target crashed; inputs in fuzz/crashes/$target/ (replay: $bin < FILE)" >&2
  exit 1
fi
