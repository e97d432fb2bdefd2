#!/usr/bin/env bash
# vendor/<crate> is the published crates.io source of that Pingora crate plus the patch
# queue vendor/patches/ (applied in the order of vendor/patches/series), and nothing else
# (vendor/README.md): the queue is what is carried, one patch per concern, each explained
# and drafted for upstream in its header, so an edit to vendor/ that is not in it would be
# carried unexplained. This checks it:
# - vendor/patches/series names every vendor/patches/*.patch once, and each exists;
# - each patch has a header (the text before its first `--- ` line, which `patch`
#   ignores) with a `Gain:` line and a `Send upstream as:` or a `Drop when:` line, and
#   touches only vendored crates (paths `a/<crate>/...`, `b/<crate>/...`);
# - for each vendored crate, the published .crate (cargo's cache, else static.crates.io;
#   its SHA-256 pinned below, the crates.io index's `cksum`) with the series applied in
#   order (each patch's part for that crate; no fuzz and no offset allowed: a patch that
#   needs either is stale) equals vendor/<crate>, but for cargo's unpacking metadata.
#
#   bash scripts/check-vendor.sh
#
# Exits 1, with the difference, when the series or a header is wrong, a patch does not
# apply cleanly, or a result differs; 0 when every crate matches. A crate that cannot be
# downloaded is reported and skipped (exit 0): a network failure is not a drift. CI runs
# it (.ci/run). scripts/vendor-patch.sh sources this file for its functions.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
patches=$repo/vendor/patches
version=0.9.1
declare -A sha256=(
  [pingora-core]=a535f47f65fdcb003f9e1df04cd18e614c128dfe9388acce3f211ae38ac14d68
  [pingora-http]=3f38e9e519d53fab09eb320f7be2cd27ef9e66f755eba3bd84cc68852108d841
  [pingora-pool]=ecda093a10bad5e887d73286f052dd0fc78ad0d6c7654235e507ed0f85b64af1
  [pingora-proxy]=8e3d5670490740405ecc8c6f75c3fcbce4d24f7adaffb355ca44550e7918e358
)

# The vendored crates: the directories of vendor/ but patches/.
vendored_crates() {
  local d
  for d in "$repo"/vendor/*/; do
    d=$(basename "$d")
    [ "$d" = patches ] || echo "$d"
  done
}

# The series, one patch file name a line (blank lines and `#` comments skipped).
series() {
  sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$patches/series"
}

# fetch_crate CRATE DIR: unpack the published CRATE into DIR/CRATE. Returns 2 when it
# cannot be downloaded, 1 when its checksum is not crates.io's.
fetch_crate() {
  local crate=$1 dir=$2 file cached want=${sha256[$1]:-}
  [ -n "$want" ] || return 1
  file=$dir/$crate-$version.crate
  cached=$(compgen -G "${CARGO_HOME:-$HOME/.cargo}/registry/cache/*/$crate-$version.crate" | head -1 || true)
  if [ -n "$cached" ]; then
    cp "$cached" "$file"
  elif ! curl -sfL --retry 3 -o "$file" "https://static.crates.io/crates/$crate/$crate-$version.crate"; then
    return 2
  fi
  echo "$want  $file" | sha256sum -c --quiet >/dev/null 2>&1 || return 1
  tar xzf "$file" -C "$dir"
  rm -f "$file" "$dir/$crate-$version/.cargo_vcs_info.json" "$dir/$crate-$version/.cargo-ok"
  mv "$dir/$crate-$version" "$dir/$crate"
}

# header PATCH: the patch's header, the lines before its first `--- ` line.
header() {
  sed -n '/^--- /q;p' "$1"
}

# crate_part CRATE < PATCH: the file sections of PATCH for CRATE's files (hunk lines are
# counted, so a removed line that starts with `-- ` is not taken for a file header).
crate_part() {
  awk -v crate="$1" '
    function path(s) { sub(/^(---|\+\+\+) /, "", s); sub(/\t.*/, "", s); return s }
    old > 0 || new > 0 {
      if ($0 ~ /^-/) old--; else if ($0 ~ /^\+/) new--; else if ($0 !~ /^\\/) { old--; new-- }
      if (keep) print; next
    }
    /^--- / { minus = $0; next }
    /^\+\+\+ / {
      p = path($0); if (p == "/dev/null") p = path(minus)
      sub(/^[ab]\//, "", p); split(p, part, "/")
      keep = (part[1] == crate)
      if (keep) { print minus; print }
      next
    }
    /^@@ / {
      match($0, /^@@ -[0-9]+(,[0-9]+)? \+[0-9]+(,[0-9]+)? @@/)
      h = substr($0, 4, RLENGTH - 6); split(h, r, " ")
      o = r[1]; n = r[2]; sub(/^-/, "", o); sub(/^\+/, "", n)
      old = (o ~ /,/) ? substr(o, index(o, ",") + 1) + 0 : 1
      new = (n ~ /,/) ? substr(n, index(n, ",") + 1) + 0 : 1
      if (keep) print
      next
    }
  '
}

# crates_of PATCH: the crates a patch touches, one a line.
crates_of() {
  sed -n -e 's#^+++ b/\([^/]*\)/.*#\1#p' -e 's#^--- a/\([^/]*\)/.*#\1#p' "$1" | sort -u
}

# apply_part CRATE PATCH ROOT [-R]: apply PATCH's part for CRATE under ROOT (which holds
# ROOT/CRATE), with no fuzz and no offset. Prints patch's complaints; fails on any.
apply_part() {
  local crate=$1 patch=$2 root=$3 reverse=${4:-} part out
  part=$(crate_part "$crate" <"$patch")
  [ -n "$part" ] || return 0
  if ! out=$(printf '%s\n' "$part" | patch -p1 -d "$root" --fuzz=0 --no-backup-if-mismatch -f $reverse 2>&1); then
    printf '%s\n' "$out" | grep -v '^patching file' >&2 || true
    return 1
  fi
  if printf '%s\n' "$out" | grep -qiE 'offset|fuzz'; then
    printf '%s\n' "$out" | grep -v '^patching file' >&2
    return 1
  fi
}

check_vendor_main() {
  say() { printf 'check-vendor.sh: %s\n' "$*" >&2; }
  local tmp status=0 p crate name
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if [ ! -f "$patches/series" ]; then
    say "vendor/patches/series is missing"
    exit 1
  fi
  local -a queue
  mapfile -t queue < <(series)
  local -A in_series=()
  local -A crates=()
  for crate in $(vendored_crates); do crates[$crate]=1; done
  for name in "${queue[@]}"; do
    if [ -n "${in_series[$name]:-}" ]; then
      say "vendor/patches/series names $name twice"
      status=1
    fi
    in_series[$name]=1
    p=$patches/$name
    if [ ! -f "$p" ]; then
      say "vendor/patches/series names $name, which is not in vendor/patches/"
      status=1
      continue
    fi
    if ! header "$p" | grep -q '^Gain:' ||
      ! header "$p" | grep -qE '^(Send upstream as|Drop when):'; then
      say "vendor/patches/$name has no header with a 'Gain:' line and a 'Send upstream as:' or 'Drop when:' line"
      status=1
    fi
    if ! grep -q '^+++ ' "$p"; then
      say "vendor/patches/$name changes nothing"
      status=1
    fi
    for crate in $(crates_of "$p"); do
      if [ -z "${crates[$crate]:-}" ]; then
        say "vendor/patches/$name changes $crate, which is not a vendored crate"
        status=1
      fi
    done
  done
  for p in "$patches"/*.patch; do
    [ -e "$p" ] || continue
    name=$(basename "$p")
    if [ -z "${in_series[$name]:-}" ]; then
      say "vendor/patches/$name is not in vendor/patches/series"
      status=1
    fi
  done
  [ $status -eq 0 ] || exit 1

  for crate in $(vendored_crates); do
    if [ -z "${sha256[$crate]:-}" ]; then
      say "vendor/$crate has no pinned checksum here: add its crates.io cksum to this script"
      status=1
      continue
    fi
    local root=$tmp/$crate rc=0
    mkdir -p "$root"
    fetch_crate "$crate" "$root" || rc=$?
    if [ $rc -eq 2 ]; then
      say "notice: could not download $crate $version; vendor/$crate not checked"
      continue
    elif [ $rc -ne 0 ]; then
      say "$crate-$version.crate does not have crates.io's checksum"
      status=1
      continue
    fi
    local applied=0 failed=
    for name in "${queue[@]}"; do
      if ! apply_part "$crate" "$patches/$name" "$root"; then
        failed=$name
        break
      fi
      [ -z "$(crate_part "$crate" <"$patches/$name")" ] || applied=$((applied + 1))
    done
    if [ -n "$failed" ]; then
      say "vendor/patches/$failed does not apply cleanly (no fuzz, no offset) to $crate $version with the patches before it"
      status=1
      continue
    fi
    if ! diff -r -u "$root/$crate" "$repo/vendor/$crate" -x .cargo_vcs_info.json -x .cargo-ok >"$tmp/$crate.diff"; then
      say "vendor/$crate differs from $crate $version with vendor/patches/series applied; refresh the patch that owns the change (vendor/README.md, scripts/vendor-patch.sh):"
      head -40 "$tmp/$crate.diff" >&2
      status=1
      continue
    fi
    say "vendor/$crate = $crate $version + $applied patches of vendor/patches/series"
  done
  exit $status
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  check_vendor_main "$@"
fi
