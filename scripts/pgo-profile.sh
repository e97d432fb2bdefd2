#!/usr/bin/env bash
# The profile for a profile-guided build, ready for rustc's -Cprofile-use.
#
#   profile=$(scripts/pgo-profile.sh [FILE])   # FILE: pgo/portcullis.profdata.gz by default
#
# Prints the path of FILE unpacked (if gzipped) under target/pgo-profile/, named by the
# SHA-256 of the profile, so that a different profile is a different -Cprofile-use flag
# and cargo rebuilds (it does not hash the profile's contents itself). Exits 1, with the
# reason on stderr, when there is no such file; when a profile.env beside FILE (as in pgo/)
# says it was written by a newer LLVM than rustc's (an older LLVM cannot read a newer
# profile format; rustc 1.85 is LLVM 19); or when FILE is not an indexed LLVM profile.
# When profile.env names the commit trained (TRAINED_AT) and git knows it, says on stderr
# how many files of src/, vendor/, Cargo.toml and Cargo.lock differ from it, Markdown and
# the vendor/*.patch copies aside (a notice only).
# Used by scripts/build.sh (run.sh, demo.sh) and scripts/build-pgo.sh; CI runs it on the
# committed profile.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
file=${1:-$repo/pgo/portcullis.profdata.gz}
say() { printf 'pgo-profile.sh: %s\n' "$*" >&2; }
[ -f "$file" ] || {
  say "no profile at $file"
  exit 1
}
env_file=$(dirname "$file")/profile.env
if [ -f "$env_file" ]; then
  want=$(sed -n 's/^LLVM_MAJOR=\([0-9]*\)$/\1/p' "$env_file")
  have=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
  if [ -n "$want" ] && { [ -z "$have" ] || [ "$have" -lt "$want" ]; }; then
    say "$file was written by LLVM $want; rustc's LLVM is ${have:-unknown}, too old to read it"
    exit 1
  fi
  # How far the code has moved since the training: a notice, never a failure (a stale
  # profile makes a build less fast, never wrong; pgo/README.md "When the code changes").
  trained=$(sed -n 's/^TRAINED_AT=\([0-9a-f]*\)$/\1/p' "$env_file")
  if [ -n "$trained" ] && git -C "$repo" rev-parse -q --verify "$trained^{commit}" >/dev/null 2>&1; then
    # the binary's inputs; scripts/build-pgo.sh marks a training "+changes" over the same
    moved=$(git -C "$repo" diff --name-only "$trained" -- src vendor Cargo.toml Cargo.lock \
      ':(exclude)*.md' ':(exclude)vendor/*.patch' | wc -l)
    if [ "$moved" -gt 0 ]; then
      say "notice: $moved file(s) of src/, vendor/, Cargo.toml and Cargo.lock changed since the profile was trained at $trained; their changed functions build without it (refresh: SAVE_PROFILE=1 bash scripts/build-pgo.sh)"
    fi
  fi
fi
dir=$repo/target/pgo-profile
mkdir -p "$dir"
tmp=$(mktemp "$dir/unpack.XXXXXX")
trap 'rm -f "$tmp"' EXIT
case $file in
*.gz) gzip -dc "$file" >"$tmp" ;;
*) cat "$file" >"$tmp" ;;
esac
# an indexed LLVM profile starts with the magic \xfflprofi\x81 (not, say, a Git LFS pointer)
if [ "$(head -c 8 "$tmp" | od -An -tx1 | tr -d ' \n')" != ff6c70726f666981 ]; then
  say "$file is not an indexed LLVM profile"
  exit 1
fi
out=$dir/$(sha256sum "$tmp" | cut -c1-16).profdata
if cmp -s "$tmp" "$out"; then rm -f "$tmp"; else mv "$tmp" "$out"; fi
printf '%s\n' "$out"
