#!/usr/bin/env bash
# Build the Debian package (Cargo.toml's [package.metadata.deb], debian/README.md) and
# check it: unpacked with dpkg-deb, its files and conffiles, the unit through
# `systemd-analyze verify` and `security`, the packaged binary's --check on the packaged
# config, and (as root) a smoke run of it as an unprivileged user with the unit's one
# capability and a notify socket.
#
#   scripts/build-deb.sh            # the profile-guided release build (pgo/'s profile)
#   scripts/build-deb.sh --plain    # the plain `cargo build --release` (also PGO=0)
#   SKIP_BUILD=1 scripts/build-deb.sh   # package the binary already built, check
#
# The package lands in target/debian/ (OUT=DIR elsewhere): portcullis_<version>-1_<arch>.deb
# and the debug symbols' portcullis-dbgsym_<version>-1_<arch>.ddeb. Install it with
#   sudo apt install ./target/debian/portcullis_*.deb
#
# The binary is built where scripts/build.sh (scripts/run.sh's build) builds it, with the
# same flags, so one build serves both: target/pgo/release/ when profile-guided,
# target/release/ when plain (CARGO_TARGET_DIR overrides either). cargo deb then packages
# it with --no-build, reading `target/release/` in the asset list as that directory.
# From a clean target the build takes as long as scripts/run.sh's first one (README).
# Needs cargo-deb (`cargo install cargo-deb --locked`), dpkg-deb, and systemd-analyze
# (Debian's systemd package) for the unit's checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# the header comment above, as the help text
usage() { sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
plain=0
for arg in "$@"; do
  case $arg in
    --plain) plain=1 ;;
    -h | --help) usage && exit 0 ;;
    *) echo "build-deb.sh: unknown argument $arg (--plain, --help)" >&2 && exit 2 ;;
  esac
done
[ "${PGO:-1}" != 0 ] || plain=1

say() { echo "build-deb.sh: $*" >&2; }
die() { say "FAIL: $*"; exit 1; }
ok() { say "ok: $*"; }

command -v cargo-deb >/dev/null 2>&1 || die "cargo-deb is missing: cargo install cargo-deb --locked"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is missing (Debian's dpkg package)"

# 1. the binary
if [ "$plain" = 0 ] && profile=$(scripts/pgo-profile.sh); then
  dir=${CARGO_TARGET_DIR:-target/pgo}
  kind="profile-guided (pgo/portcullis.profdata.gz)"
  build() { CARGO_TARGET_DIR=$dir RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$profile" cargo build --release --bin portcullis; }
else
  [ "$plain" = 1 ] || say "the committed profile is unusable with this rustc (above): a plain build"
  dir=${CARGO_TARGET_DIR:-target}
  kind="plain release"
  build() { CARGO_TARGET_DIR=$dir cargo build --release --bin portcullis; }
fi
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  say "SKIP_BUILD=1: packaging $dir/release/portcullis as it is (meant to be the $kind build)"
else
  say "building portcullis: the $kind build in $dir"
  start=$(date +%s)
  build
  say "built in $(($(date +%s) - start)) s"
fi
[ -x "$dir/release/portcullis" ] || die "no $dir/release/portcullis"

# 2. the package
out=${OUT:-target/debian}
mkdir -p "$out"
rm -f "$out"/portcullis_*.deb "$out"/portcullis-dbgsym_*.ddeb
CARGO_TARGET_DIR=$dir cargo deb --no-build --output "$out" >&2
deb=$(ls "$out"/portcullis_*.deb)
[ "$(echo "$deb" | wc -l)" = 1 ] || die "expected one package in $out: $deb"
say "package: $deb ($(du -h "$deb" | cut -f1); the $kind build)"

# 3. unpacked
tmp=$(mktemp -d)
started=() # the smoke run's processes, stopped by PID on any exit
cleanup() {
  local p
  for p in "${started[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${started[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
root=$tmp/root
dpkg-deb -x "$deb" "$root"
dpkg-deb -e "$deb" "$tmp/DEBIAN"
ctl=$tmp/DEBIAN

field() { sed -n "s/^$1: //p" "$ctl/control"; }
[ "$(field Package)" = portcullis ] || die "control: Package is not portcullis"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
case $(field Version) in "$version"*) ;; *) die "control: Version $(field Version) is not Cargo.toml's $version" ;; esac
depends=$(field Depends)
for dep in adduser libssl; do
  case $depends in *"$dep"*) ;; *) die "control: Depends lacks $dep: $depends" ;; esac
done
ok "control: portcullis $(field Version) $(field Architecture), Depends: $depends"

bin=$root/usr/bin/portcullis
conf=$root/etc/portcullis/portcullis.toml
unit=$root/usr/lib/systemd/system/portcullis.service
[ -x "$bin" ] || die "no executable /usr/bin/portcullis"
file -b "$bin" | grep -q '^ELF 64-bit.*executable' || die "/usr/bin/portcullis is not an ELF executable: $(file -b "$bin")"
cmp -s "$conf" conf/server.toml || die "/etc/portcullis/portcullis.toml is not conf/server.toml"
cmp -s "$unit" debian/portcullis.service || die "/usr/lib/systemd/system/portcullis.service is not debian/portcullis.service"
[ -f "$root/usr/share/doc/portcullis/copyright" ] || die "no /usr/share/doc/portcullis/copyright"
if ldd "$bin" | grep -q 'not found'; then die "unresolved libraries: $(ldd "$bin" | grep 'not found')"; fi
# MemoryDenyWriteExecute=yes: an executable stack (an object without .note.GNU-stack) would
# make glibc map thread stacks PROT_EXEC, which the unit refuses
for lib in "$bin" $(ldd "$bin" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p'); do
  readelf -lW "$lib" | grep GNU_STACK | grep -q 'RW ' || die "$lib asks for an executable stack"
done
ok "files: /usr/bin/portcullis ($(du -h "$bin" | cut -f1), $(file -b "$bin" | grep -o 'stripped\|not stripped')), /etc/portcullis/portcullis.toml = conf/server.toml, /usr/lib/systemd/system/portcullis.service = debian/portcullis.service"
say "contents:"
dpkg-deb -c "$deb" | awk '{print "  " $1, $6}' >&2

# Every file under /etc is a conffile (Debian policy, cargo-deb): the config, and the JSON
# Schema its `#:schema` line names for editors (never edited, so upgraded silently).
cmp -s "$root/etc/portcullis/portcullis.schema.json" conf/portcullis.schema.json ||
  die "/etc/portcullis/portcullis.schema.json is not conf/portcullis.schema.json"
want=$(printf '%s\n' /etc/portcullis/portcullis.toml /etc/portcullis/portcullis.schema.json /etc/logrotate.d/portcullis | sort)
[ "$(sort "$ctl/conffiles")" = "$want" ] ||
  die "conffiles are not exactly the config, its schema and the logrotate file: $(cat "$ctl/conffiles")"
cmp -s "$root/etc/logrotate.d/portcullis" debian/portcullis.logrotate ||
  die "/etc/logrotate.d/portcullis is not debian/portcullis.logrotate"
if command -v logrotate >/dev/null 2>&1; then
  logrotate -d "$root/etc/logrotate.d/portcullis" >/dev/null 2>&1 ||
    die "logrotate -d refuses /etc/logrotate.d/portcullis: $(logrotate -d "$root/etc/logrotate.d/portcullis" 2>&1 | tail -3)"
fi
ok "conffiles: $(tr '\n' ' ' <"$ctl/conffiles")"

# maintainer scripts: the user before the unit starts; cargo-deb's systemd fragments in
grep -q 'adduser --system --group --no-create-home' "$ctl/postinst" || die "postinst does not create the portcullis user"
grep -q 'deb-systemd-helper.*enable\|deb-systemd-helper unmask' "$ctl/postinst" || die "postinst does not enable the unit"
[ "$(grep -n 'adduser --system' "$ctl/postinst" | cut -d: -f1)" -lt "$(grep -n 'deb-systemd-invoke' "$ctl/postinst" | head -1 | cut -d: -f1)" ] ||
  die "postinst starts the unit before creating its user"
grep -q 'purge' "$ctl/postrm" || die "postrm has no purge handling"
for s in "$ctl"/postinst "$ctl"/postrm "$ctl"/prerm; do
  [ -f "$s" ] || continue
  sh -n "$s" || die "$(basename "$s") is not valid sh"
done
ok "maintainer scripts: $(cd "$ctl" && ls -- *inst *rm 2>/dev/null | tr '\n' ' ')(user, enable, start, purge)"

# the unit against the packaged config: TimeoutStopSec over drain + shutdown
key() { sed -n "s/^$1 *= *\([0-9]*\).*/\1/p" "$conf" | head -1; }
drain=$(key drain_seconds)
shutdown=$(key shutdown_timeout_seconds)
stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)$/\1/p' "$unit")
[ -n "$drain" ] && [ -n "$shutdown" ] && [ -n "$stop" ] || die "cannot read drain_seconds, shutdown_timeout_seconds or TimeoutStopSec"
[ "$stop" -gt $((drain + shutdown)) ] || die "TimeoutStopSec=$stop is not over drain_seconds + shutdown_timeout_seconds = $((drain + shutdown))"
for line in Type=notify NotifyAccess=all User=portcullis KillSignal=SIGTERM \
  'ExecStart=/usr/bin/portcullis -c /etc/portcullis/portcullis.toml' 'ExecReload=/usr/bin/portcullis ctl --conf /etc/portcullis/portcullis.toml reload' \
  UMask=0027 ReadWritePaths=-/var/log/portcullis \
  RuntimeDirectory=portcullis; do
  grep -qxF "$line" "$unit" || die "the unit lacks $line"
done
sock=$(sed -n 's/^upgrade_sock *= *"\(.*\)".*/\1/p' "$conf")
[ "$(dirname "$sock")" = /run/portcullis ] || die "upgrade_sock $sock is not in the unit's RuntimeDirectory /run/portcullis"
ok "unit: TimeoutStopSec=$stop > drain $drain + shutdown $shutdown; upgrade_sock in RuntimeDirectory"

# 4. the packaged binary checks the packaged config
"$bin" --version >&2
checked=$("$bin" -c "$conf" --check) || die "portcullis --check refuses the packaged config"
[ "$checked" = OK ] || die "portcullis --check said: $checked"
ok "/usr/bin/portcullis -c /etc/portcullis/portcullis.toml --check: $checked"

# 5. systemd-analyze: the unit with the unpacked paths (the packaged ones are not installed here)
if command -v systemd-analyze >/dev/null 2>&1; then
  vunit=$tmp/units/portcullis.service
  mkdir -p "$tmp/units"
  sed -e "s|/usr/bin/portcullis|$bin|; s|/etc/portcullis/portcullis.toml|$conf|" "$unit" >"$vunit"
  # --man=no: Documentation= names the installed README, absent here
  if ! verify=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$vunit" 2>&1); then
    echo "$verify" >&2
    die "systemd-analyze verify"
  fi
  [ -z "$verify" ] || { echo "$verify" >&2; die "systemd-analyze verify warned"; }
  ok "systemd-analyze verify: no warnings"
  # the exposure score (0 = locked down, 10 = unprotected; systemd calls under 2 OK);
  # --threshold counts tenths: above 2.0 fails
  if security=$(systemd-analyze security --offline=yes --threshold=20 "$vunit" 2>&1); then
    echo "$security" | grep -E '^→|Overall' >&2
    ok "systemd-analyze security --offline=yes: $(echo "$security" | sed -n 's/.*exposure level for .*: \(.*\)/\1/p')"
  else
    echo "$security" | grep -E '^✗|Overall' >&2
    die "systemd-analyze security: exposure above 2"
  fi
else
  say "systemd-analyze not found (apt-get install systemd): the unit was not verified"
fi

# 6. a smoke run as the unit runs it, the sandbox aside: the packaged binary on the packaged
# config (its admin listener moved to a free port), as an unprivileged user holding only
# CAP_NET_BIND_SERVICE, with NOTIFY_SOCKET: it binds port 80, says READY=1 when /readyz
# turns 200, and on SIGTERM says STOPPING=1 and exits 0 within TimeoutStopSec. Needs root
# (to change user), python3 (the notify socket) and port 80 free; skipped otherwise.
smoke() {
  local admin dir pid npid code status
  admin=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  dir=$tmp/smoke
  mkdir -p "$dir"
  chmod 755 "$tmp" "$dir"
  sed "s/^admin_listen = .*/admin_listen = \"127.0.0.1:$admin\"/" "$conf" >"$dir/portcullis.toml"
  chmod 644 "$dir/portcullis.toml"
  python3 - "$dir/notify.sock" "$dir/notify.log" <<'PY' &
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o777)
deadline = time.monotonic() + 120
with open(sys.argv[2], "w") as out:
    while time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            break
        out.write(" ".join(msg.split()) + "\n")
        out.flush()
        if "STOPPING=1" in msg:
            break
PY
  npid=$!
  started+=("$npid")
  for _ in $(seq 50); do [ -S "$dir/notify.sock" ] && break; sleep 0.1; done
  NOTIFY_SOCKET=$dir/notify.sock setpriv --reuid=nobody --regid=nogroup --clear-groups \
    --inh-caps=-all,+net_bind_service --ambient-caps=-all,+net_bind_service \
    --bounding-set=-all,+net_bind_service --no-new-privs \
    "$bin" -c "$dir/portcullis.toml" >"$dir/stdout" 2>"$dir/stderr" &
  pid=$!
  started+=("$pid")
  code=000
  for _ in $(seq 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin/readyz" || true)
    [ "$code" = 200 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ "$code" != 200 ]; then
    tail -5 "$dir/stderr" >&2
    die "smoke run: /readyz never answered 200"
  fi
  curl -s -o /dev/null "http://127.0.0.1:80/" || die "smoke run: nothing answers on port 80"
  grep -qx 'READY=1' "$dir/notify.log" || die "smoke run: no READY=1 on NOTIFY_SOCKET"
  kill -TERM "$pid"
  status=0
  wait "$pid" || status=$?
  wait "$npid" || true
  started=()
  [ "$status" = 0 ] || die "smoke run: exit status $status after SIGTERM"
  grep -qx 'STOPPING=1' "$dir/notify.log" || die "smoke run: no STOPPING=1 on NOTIFY_SOCKET"
  ok "smoke run as nobody with CAP_NET_BIND_SERVICE only: port 80 bound, notify $(tr '\n' ' ' <"$dir/notify.log")then exit 0 on SIGTERM"
}
if [ "$(id -u)" = 0 ] && command -v python3 >/dev/null && command -v setpriv >/dev/null &&
  command -v curl >/dev/null && ! (exec 3<>/dev/tcp/127.0.0.1/80) 2>/dev/null; then
  smoke
else
  say "smoke run skipped (needs root, python3, setpriv, curl and port 80 free)"
fi

say "done: $deb"
echo "$deb"
