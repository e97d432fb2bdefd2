#!/usr/bin/env bash
# vendor/<crate> is the published crates.io source of that Pingora crate plus
# vendor/<crate>.patch, and nothing else (vendor/README.md): the patch is what is carried,
# explained and drafted for upstream, so an edit to vendor/ that is not in it would be
# carried unexplained. This checks it: for each vendored crate, the published .crate
# (cargo's cache, else static.crates.io; its SHA-256 pinned below, the crates.io index's
# `cksum`) with the patch applied must equal vendor/<crate>, but for cargo's unpacking
# metadata.
#
#   bash scripts/check-vendor.sh
#
# Exits 1, with the difference, when a patch does not apply or the result differs;
# 0 when every crate matches. A crate that cannot be downloaded is reported and skipped
# (exit 0): a network failure is not a drift. CI runs it (.ci/run).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=0.9.1
declare -A sha256=(
  [pingora-core]=a535f47f65fdcb003f9e1df04cd18e614c128dfe9388acce3f211ae38ac14d68
  [pingora-http]=3f38e9e519d53fab09eb320f7be2cd27ef9e66f755eba3bd84cc68852108d841
  [pingora-pool]=ecda093a10bad5e887d73286f052dd0fc78ad0d6c7654235e507ed0f85b64af1
  [pingora-proxy]=8e3d5670490740405ecc8c6f75c3fcbce4d24f7adaffb355ca44550e7918e358
)
say() { printf 'check-vendor.sh: %s\n' "$*" >&2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for dir in "$repo"/vendor/*/; do
  crate=$(basename "$dir")
  want=${sha256[$crate]:-}
  if [ -z "$want" ]; then
    say "vendor/$crate has no pinned checksum here: add its crates.io cksum to this script"
    status=1
    continue
  fi
  file=$tmp/$crate-$version.crate
  cached=$(compgen -G "${CARGO_HOME:-$HOME/.cargo}/registry/cache/*/$crate-$version.crate" | head -1 || true)
  if [ -n "$cached" ]; then
    cp "$cached" "$file"
  elif ! curl -sfL --retry 3 -o "$file" "https://static.crates.io/crates/$crate/$crate-$version.crate"; then
    say "notice: could not download $crate $version; vendor/$crate not checked"
    continue
  fi
  if ! echo "$want  $file" | sha256sum -c --quiet >/dev/null 2>&1; then
    say "$crate-$version.crate does not have crates.io's checksum"
    status=1
    continue
  fi
  tar xzf "$file" -C "$tmp"
  src=$tmp/$crate-$version
  # the patch names the published file `<crate>-<version>/...` and the vendored one
  # `vendor/<crate>/...`
  if ! sed -e "s#^--- $crate-$version/#--- a/#" -e "s#^+++ vendor/$crate/#+++ b/#" \
    "$repo/vendor/$crate.patch" | (cd "$src" && patch -p1 -s --no-backup-if-mismatch); then
    say "vendor/$crate.patch does not apply to $crate $version"
    status=1
    continue
  fi
  if ! diff -r -u -x .cargo_vcs_info.json -x .cargo-ok "$src" "$repo/vendor/$crate" >"$tmp/$crate.diff"; then
    say "vendor/$crate differs from $crate $version with vendor/$crate.patch applied; regenerate the patch (vendor/README.md):"
    head -40 "$tmp/$crate.diff" >&2
    status=1
    continue
  fi
  say "vendor/$crate = $crate $version + vendor/$crate.patch"
done
exit $status
