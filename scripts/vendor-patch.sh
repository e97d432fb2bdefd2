#!/usr/bin/env bash
# Refresh one patch of the queue vendor/patches/ from the vendored trees, after editing
# vendor/<crate>/ (vendor/README.md, "Workflow"), or start a new patch at the end of it.
#
#   bash scripts/vendor-patch.sh 0007-filled-header-not-a-copy   # refresh a patch
#   bash scripts/vendor-patch.sh 0024-new-concern                 # a new one, last in series
#
# The patch becomes the difference between
# - before: the published crates plus the patches before it in vendor/patches/series, and
# - after: vendor/<crate>/ with the patches after it taken back out (reverse-applied, last
#   first),
# over every file of the vendored crates: so an edit in vendor/ lands in the named patch,
# and the later patches still apply on top of it. Its header (the text before its first
# `--- ` line) is kept; a new patch gets a header to fill in and is appended to the series.
# Fails, changing nothing, when a later patch no longer reverse-applies (the edit touches
# lines a later patch changes: put it in that patch, or refresh that one first) or a
# published crate cannot be downloaded. Then run scripts/check-vendor.sh.
set -euo pipefail
# shellcheck source=scripts/check-vendor.sh
source "$(dirname "${BASH_SOURCE[0]}")/check-vendor.sh"
name=${1:?usage: vendor-patch.sh NNNN-short-name}
name=${name%.patch}.patch
say() { printf 'vendor-patch.sh: %s\n' "$*" >&2; }
case $name in
  [0-9][0-9][0-9][0-9]-*.patch) ;;
  *)
    say "a patch is named NNNN-short-name (four digits, its place in the series)"
    exit 1
    ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mapfile -t queue < <(series)
new=1
for n in "${queue[@]}"; do [ "$n" != "$name" ] || new=0; done
[ $new -eq 0 ] || queue+=("$name")

mkdir -p "$tmp/before" "$tmp/after"
for crate in $(vendored_crates); do
  rc=0
  fetch_crate "$crate" "$tmp/before" || rc=$?
  if [ $rc -ne 0 ]; then
    say "cannot get the published $crate $version (download or checksum failed)"
    exit 1
  fi
  mkdir -p "$tmp/after/$crate"
  (cd "$repo/vendor/$crate" && tar cf - --exclude=.cargo_vcs_info.json --exclude=.cargo-ok .) |
    tar xf - -C "$tmp/after/$crate"
done

# before: the published crates and the patches before this one
before=1
for n in "${queue[@]}"; do
  [ "$n" != "$name" ] || break
  for crate in $(vendored_crates); do
    apply_part "$crate" "$patches/$n" "$tmp/before" ||
      { say "vendor/patches/$n does not apply to the crates with the patches before it; run scripts/check-vendor.sh"; exit 1; }
  done
done
# after: the vendored trees without the patches after this one, last first
later=()
seen=0
for n in "${queue[@]}"; do
  [ $seen -eq 0 ] || later=("$n" "${later[@]}")
  [ "$n" != "$name" ] || seen=1
done
for n in "${later[@]}"; do
  for crate in $(vendored_crates); do
    apply_part "$crate" "$patches/$n" "$tmp/after" -R ||
      { say "vendor/patches/$n no longer reverse-applies over vendor/$crate: the edit touches its lines; put the edit in it, or refresh it first"; exit 1; }
  done
done

out=$tmp/out.patch
if [ $new -eq 0 ]; then
  header "$patches/$name" >"$out"
else
  cat >"$out" <<'EOF'
Subject: (what this patch changes, in one line)

(What it changes and why, the measured gain and how it was measured, its tests.)

Crates: (the crates it changes)
Gain: (the measured gain, or "a bug fix")
Drop when: (or "Send upstream as: ..."; the upstream issue or PR text)

EOF
fi
before_ok=$(cd "$tmp/before" && find . -type f | sed 's#^\./##')
after_ok=$(cd "$tmp/after" && find . -type f | sed 's#^\./##')
files=$(printf '%s\n%s\n' "$before_ok" "$after_ok" | sed '/^$/d' | LC_ALL=C sort -u)
changed=0
for f in $files; do
  a=$tmp/before/$f b=$tmp/after/$f la=a/$f lb=b/$f
  [ -f "$a" ] || { a=/dev/null la=/dev/null; }
  [ -f "$b" ] || { b=/dev/null lb=/dev/null; }
  if ! cmp -s "$a" "$b"; then
    diff -u --label "$la" --label "$lb" "$a" "$b" >>"$out" || true
    changed=$((changed + 1))
  fi
done
[ $changed -gt 0 ] || say "warning: $name changes nothing"
cp "$out" "$patches/$name"
if [ $new -eq 1 ]; then
  echo "$name" >>"$patches/series"
  say "vendor/patches/$name: new, appended to vendor/patches/series; fill in its header"
fi
say "vendor/patches/$name: $changed files, $(wc -l <"$out") lines"
