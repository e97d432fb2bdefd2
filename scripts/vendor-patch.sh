#!/usr/bin/env bash
# Regenerate vendor/<crate>.patch from vendor/<crate> (vendor/README.md): the `diff -u` of
# every file that differs from the published crates.io source, in the form
# scripts/check-vendor.sh applies. Run it after changing a vendored crate.
#
#   bash scripts/vendor-patch.sh pingora-proxy
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
crate=${1:?usage: vendor-patch.sh <crate>}
version=0.9.1
[ -d "$repo/vendor/$crate" ] || { echo "vendor-patch.sh: no vendor/$crate" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
file=$tmp/$crate-$version.crate
cached=$(compgen -G "${CARGO_HOME:-$HOME/.cargo}/registry/cache/*/$crate-$version.crate" | head -1 || true)
if [ -n "$cached" ]; then
  cp "$cached" "$file"
else
  curl -sfL --retry 3 -o "$file" "https://static.crates.io/crates/$crate/$crate-$version.crate"
fi
tar xzf "$file" -C "$tmp"
src=$tmp/$crate-$version
out=$tmp/out.patch
: >"$out"
(cd "$repo/vendor/$crate" && find . -type f ! -name .cargo_vcs_info.json ! -name .cargo-ok | sed 's#^\./##' | LC_ALL=C sort) |
  while read -r f; do
    if [ ! -f "$src/$f" ]; then
      diff -u --label "$crate-$version/$f (crates.io)" --label "vendor/$crate/$f" /dev/null "$repo/vendor/$crate/$f" >>"$out" || true
    elif ! cmp -s "$src/$f" "$repo/vendor/$crate/$f"; then
      diff -u --label "$crate-$version/$f (crates.io)" --label "vendor/$crate/$f" "$src/$f" "$repo/vendor/$crate/$f" >>"$out" || true
    fi
  done
cp "$out" "$repo/vendor/$crate.patch"
echo "vendor-patch.sh: vendor/$crate.patch: $(grep -c '^+++ ' "$out") files" >&2
