#!/usr/bin/env bash
# The Debian package under a real systemd: a systemd-booted container (podman, a Debian
# bookworm root made from Debian's packages by mmdebstrap), the .deb installed with dpkg,
# then, checked one by one:
#   start      Type=notify: `systemctl start` returns once READY=1 came; /readyz, a
#              proxied request (to the demo backend), the access log in
#              /var/log/portcullis (portcullis:adm 0640)
#   logrotate  `logrotate -f /etc/logrotate.d/portcullis`: rotated, SIGUSR1 reopens, the
#              next line lands in the new file
#   reload     a good edit: `systemctl reload` exits 0 and the change applies; a bad one:
#              it exits 1, `systemctl status` shows the error, the old config serves on
#   journal    `journalctl -p err` has the refusal, `-p warning` lacks the info lines
#   security   `systemd-analyze security portcullis` (exposure under 2.0)
#   upgrade    the binary upgrade of debian/README.md: a new process joins the cgroup, takes
#              the listeners over (-u), systemd follows MAINPID, no request fails
#   stop       `systemctl stop`: /readyz 503 at once, requests served while draining, exit 0
#
#   scripts/test-systemd.sh              # package the debug build (cargo build first)
#   DEB=target/debian/portcullis_*.deb scripts/test-systemd.sh   # a package already built
#
# Needs root, podman with runc (crun refuses this machine's hybrid cgroups), mmdebstrap
# and Debian's mirror (the base image is built once and kept as
# localhost/portcullis-test/systemd:bookworm), cargo-deb unless DEB is given. About 2
# minutes once the image exists. Opt-in in .ci/run (CI_SYSTEMD=1): see there.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "test-systemd.sh: $*" >&2; }
die() { say "FAIL: $*"; exit 1; }
ok() { say "ok: $*"; }

[ "$(id -u)" = 0 ] || die "needs root (podman, a systemd container)"
for t in podman mmdebstrap; do command -v "$t" >/dev/null || die "$t is missing: apt-get install $t"; done
runtime=()
command -v runc >/dev/null && runtime=(--runtime runc)
IMAGE=localhost/portcullis-test/systemd:bookworm
target=${CARGO_TARGET_DIR:-target}
tmp=$(mktemp -d)
name=portcullis-systemd-$$
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# 1. the package: the one given, or cargo deb over the debug build's binary
if [ -n "${DEB:-}" ]; then
  deb=$DEB
else
  command -v cargo-deb >/dev/null || die "cargo-deb is missing: cargo install cargo-deb --locked (or DEB=...)"
  [ -x "$target/debug/portcullis" ] || die "no $target/debug/portcullis: cargo build first"
  mkdir -p "$tmp/target/release"
  cp "$target/debug/portcullis" "$tmp/target/release/portcullis"
  # the debug build, stripped (no dbgsym package)
  CARGO_TARGET_DIR=$tmp/target cargo deb --no-build --strip --no-dbgsym --output "$tmp/deb" >/dev/null 2>"$tmp/cargo-deb.log" ||
    { cat "$tmp/cargo-deb.log" >&2; die "cargo deb"; }
  deb=$(ls "$tmp"/deb/portcullis_*.deb)
fi
ok "package: $deb"
backend=$target/debug/demo_backend
[ -x "$backend" ] || die "no $backend: cargo build --bin demo_backend"

# 2. the base image: Debian bookworm with systemd, from Debian's packages
if ! podman image exists "$IMAGE"; then
  say "building $IMAGE with mmdebstrap (once; ~2 min)"
  mmdebstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,adduser,curl,ca-certificates,libssl3,logrotate,procps,util-linux \
    bookworm "$tmp/root.tar" >"$tmp/mmdebstrap.log" 2>&1 || { tail -20 "$tmp/mmdebstrap.log" >&2; die "mmdebstrap"; }
  podman import --change 'CMD ["/lib/systemd/systemd"]' "$tmp/root.tar" "$IMAGE" >/dev/null
  rm -f "$tmp/root.tar"
fi

# 3. boot it: systemd as PID 1, its own network namespace (loopback only: port 80 and
# 9090 are the container's), the limits this machine lets a container set (no
# CAP_SYS_RESOURCE here: no rlimit above the current hard one)
podman "${runtime[@]}" run -d --name "$name" --systemd=always --network none \
  --ulimit nofile="$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096 "$IMAGE" /lib/systemd/systemd >/dev/null ||
  die "cannot start a systemd container"
ct() { podman exec "$name" "$@"; }
booted() { case $(ct systemctl is-system-running 2>/dev/null) in running | degraded) return 0 ;; esac; return 1; }
for _ in $(seq 100); do booted && break; sleep 0.2; done
booted || die "systemd did not boot: $(ct systemctl is-system-running 2>&1)"
ok "systemd $(ct systemctl --version | head -1 | cut -d' ' -f2) is PID 1 in the container ($(ct systemctl is-system-running))"

podman cp "$deb" "$name:/tmp/portcullis.deb"
podman cp "$backend" "$name:/usr/local/bin/demo_backend"
# the packaged config's backend, 127.0.0.1:8081
ct systemd-run --unit demo-backend /usr/local/bin/demo_backend 127.0.0.1:8081 >/dev/null
# 4. install: postinst makes the user and the log directory, enables and starts the unit;
# systemctl start returns only after READY=1 (Type=notify)
ct dpkg -i /tmp/portcullis.deb >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; die "dpkg -i"; }
state=$(ct systemctl is-active portcullis || true)
[ "$state" = active ] || { ct journalctl -u portcullis --no-pager | tail -30 >&2; die "portcullis is $state after install"; }
ct systemctl is-enabled portcullis >/dev/null || die "the unit is not enabled"
pid=$(ct systemctl show -P MainPID portcullis)
[ "$(ct systemctl show -P Type portcullis)" = notify ] || die "Type is not notify"
ok "installed and started (Type=notify, MainPID $pid, user $(ct ps -o user= -p "$pid"))"

get() { ct curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(get http://127.0.0.1:9090/readyz)" = 200 ] || die "/readyz is not 200"
body=$(ct curl -s http://127.0.0.1/hello-1)
case $body in *"hello from demo backend"*) ;; *) die "a proxied request got: $body" ;; esac
ok "/readyz 200; GET / proxied to the demo backend"

# 5. the access log: portcullis:adm 0640 in the setgid directory
log=/var/log/portcullis/access.log
for _ in $(seq 50); do ct grep -q '/hello-1' "$log" 2>/dev/null && break; sleep 0.1; done
ct grep -q '"path":"/hello-1"' "$log" || die "the request is not in $log"
[ "$(ct stat -c '%U:%G %a' /var/log/portcullis)" = "portcullis:adm 2750" ] || die "/var/log/portcullis is $(ct stat -c '%U:%G %a' /var/log/portcullis)"
[ "$(ct stat -c '%U:%G %a' "$log")" = "portcullis:adm 640" ] || die "$log is $(ct stat -c '%U:%G %a' "$log")"
ct setpriv --reuid=nobody --regid=adm --clear-groups head -c 1 "$log" >/dev/null || die "the adm group cannot read $log"
ok "$log: portcullis:adm 640 (the adm group reads it), in portcullis:adm 2750"

# 6. logrotate: rotated; SIGUSR1 reopens; the next line goes to the new file
ct logrotate -f /etc/logrotate.d/portcullis || die "logrotate -f"
ct test -f "$log.1" || die "no $log.1 after logrotate"
ct curl -s -o /dev/null http://127.0.0.1/after-rotate
for _ in $(seq 50); do ct grep -q after-rotate "$log" 2>/dev/null && break; sleep 0.1; done
ct grep -q after-rotate "$log" || die "after rotation the line is not in the new $log"
ct grep -q after-rotate "$log.1" && die "after rotation the line went to the old file"
ok "logrotate -f: $log.1 kept, SIGUSR1 reopened, the next line in the new $log"

# 7. reload, good: a second backend and a changed limit apply; systemctl reload exits 0
conf=/etc/portcullis/portcullis.toml
ct sed -i 's/^limit = 600 /limit = 599 /' "$conf"
ct systemctl reload portcullis || die "systemctl reload of a good file failed"
[ "$(ct systemctl show -P MainPID portcullis)" = "$pid" ] || die "the reload restarted the process"
ct curl -s -i http://127.0.0.1/x | tr -d '\r' | grep -qi '^ratelimit-policy:.*q=599' || die "the reloaded limit (599) is not in force"
ok "systemctl reload (good file): exit 0, applied (limit 599), same process"

# 8. reload, bad: systemctl reload exits non-zero, status shows why, the old config serves
ct sed -i 's/^limit = 599 /limit = 0 /' "$conf"
if out=$(ct systemctl reload portcullis 2>&1); then die "systemctl reload of a bad file succeeded"; fi
say "systemctl reload said: $(echo "$out" | head -2 | tr '\n' ' ')"
status=$(ct systemctl status portcullis --no-pager -n 20 2>&1 || true)
echo "$status" | grep -q 'reload refused, the running configuration stays: .*rate_limit.limit' ||
  { echo "$status" >&2; die "systemctl status does not show the refusal"; }
say "systemctl status: $(echo "$status" | grep -m1 'reload refused' | sed 's/^.*portcullis\[[0-9]*\]: //')"
[ "$(ct systemctl is-active portcullis)" = active ] || die "the service is not active after a refused reload"
ct curl -s -i http://127.0.0.1/y | tr -d '\r' | grep -qi '^ratelimit-policy:.*q=599' || die "the old config (599) no longer serves"
ok "systemctl reload (bad file): exit non-zero, 'reload refused ... rate_limit.limit' in systemctl status, still active on limit 599"

# 9. journal priorities: the refusal is an error; info lines are not warnings
ct journalctl -u portcullis -p err --no-pager -o cat | grep -q 'invalid configuration' ||
  die "journalctl -p err lacks the refused reload"
ct journalctl -u portcullis -p warning --no-pager -o cat | grep -q '"level":"INFO"' &&
  die "journalctl -p warning shows info lines (no <N> prefix?)"
ct journalctl -u portcullis -p info --no-pager -o cat | grep -q '"level":"INFO"' ||
  die "journalctl -p info lacks the info lines"
ok "journalctl -p err has the refusal; -p warning has no info line"
ct sed -i 's/^limit = 0 /limit = 600 /' "$conf"
ct systemctl reload portcullis || die "reload back"

# 10. systemd-analyze security
sec=$(ct systemd-analyze security portcullis --no-pager 2>&1 | tail -1)
say "systemd-analyze security portcullis: $sec"
score=$(echo "$sec" | sed -n 's/.*exposure level for portcullis.service: \([0-9.]*\).*/\1/p')
[ -n "$score" ] && awk -v s="$score" 'BEGIN { exit !(s < 2.0) }' || die "exposure $score is not under 2.0"
ok "systemd-analyze security: $score"

# 11. the binary upgrade (debian/README.md): the new process joins the service's cgroup,
# takes the listeners over, and systemd follows its MAINPID; requests keep succeeding
ct sh -c 'while :; do c=$(curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1/up); echo "$c" >>/tmp/codes; sleep 0.05; done' 2>/dev/null &
loader=$!
sleep 0.5
cg=$(ct systemctl show -P ControlGroup portcullis)
ct sh -c "cgdir=/sys/fs/cgroup/systemd$cg; [ -d \$cgdir ] || cgdir=/sys/fs/cgroup$cg; \
  nohup sh -c 'echo \$\$ >\"\$1/cgroup.procs\" && exec setpriv --reuid=portcullis --regid=portcullis --init-groups \
  env NOTIFY_SOCKET=/run/systemd/notify /usr/bin/portcullis -c /etc/portcullis/portcullis.toml -u' sh \"\$cgdir\" >/tmp/upgrade.log 2>&1 &"
for _ in $(seq 100); do ct test -S /run/portcullis/upgrade.sock && break; sleep 0.1; done
ct test -S /run/portcullis/upgrade.sock || { ct cat /tmp/upgrade.log >&2; die "the new process never listened on the upgrade socket"; }
ct systemctl kill --kill-whom=main --signal=SIGQUIT portcullis
newpid=
for _ in $(seq 200); do
  newpid=$(ct systemctl show -P MainPID portcullis)
  [ "$newpid" != "$pid" ] && [ "$newpid" != 0 ] && break
  sleep 0.1
done
[ "$newpid" != "$pid" ] && [ "$newpid" != 0 ] || { ct journalctl -u portcullis --no-pager | tail -20 >&2; die "systemd did not follow the new MAINPID"; }
for _ in $(seq 200); do ct test -d "/proc/$pid" || break; sleep 0.1; done
ct test -d "/proc/$pid" && die "the old process $pid did not exit"
sleep 0.5
kill "$loader" 2>/dev/null || true
wait "$loader" 2>/dev/null || true
codes=$(ct sort /tmp/codes | uniq -c | tr '\n' ' ')
ct grep -qv '^200$' /tmp/codes && die "requests failed during the upgrade: $codes"
[ "$(ct systemctl is-active portcullis)" = active ] || die "the service is not active after the upgrade"
ok "binary upgrade: MAINPID $pid -> $newpid, the old process exited, every request 200 ($codes)"
pid=$newpid

# 12. stop: /readyz fails at once, requests are served while draining, then exit 0
ct sh -c 'systemctl stop portcullis >/tmp/stop.log 2>&1; echo $? >/tmp/stop.rc' &
stopper=$!
for _ in $(seq 50); do [ "$(get http://127.0.0.1:9090/readyz)" = 503 ] && break; sleep 0.1; done
[ "$(get http://127.0.0.1:9090/readyz)" = 503 ] || die "/readyz is not 503 once stopping"
[ "$(get http://127.0.0.1/draining)" = 200 ] || die "a request while draining was not served"
wait "$stopper" || true
[ "$(ct cat /tmp/stop.rc)" = 0 ] || die "systemctl stop: $(ct cat /tmp/stop.log)"
result=$(ct systemctl show -P Result portcullis)
[ "$result" = success ] || die "the service stopped with Result=$result"
ct journalctl -u portcullis --no-pager -o cat | grep -q 'drain' || true
ok "systemctl stop: /readyz 503 at once, served while draining, Result=$result"
say "all checks passed"
