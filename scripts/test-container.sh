#!/usr/bin/env bash
# The container image, built from the repository's Dockerfile and run, with podman. Docker
# Hub is out of reach here, so the two base images are made from Debian's packages
# (mmdebstrap) and passed as the Dockerfile's build arguments:
#   BUILDER_IMAGE  Debian bookworm with a C toolchain and git, and this machine's Rust
#                  toolchain copied in (the rust:<version>-bookworm image's layout:
#                  /usr/local/cargo/bin on PATH); the Dockerfile installs cmake etc. itself
#   RUNTIME_IMAGE  Debian bookworm minbase, as debian:bookworm-slim
# Then the image is run (--read-only, a network namespace of its own, reached from the host
# with nsenter) and checked: /readyz,
# a proxied request to the demo backend (mounted and started in the container), the
# process's user (10001, not root), that nothing in the root file system is writable,
# portcullis_build_info's commit, and SIGTERM (podman stop): /readyz 503 at once, requests
# served while draining, exit 0.
#
#   scripts/test-container.sh          # build (the release build: long) and run
#   IMAGE=portcullis:test SKIP_BUILD=1 scripts/test-container.sh   # run an image built
#
# Needs root, podman (with runc: crun refuses this machine's hybrid cgroups), mmdebstrap,
# Debian's mirror and crates.io (the build runs apt-get and cargo with --network host).
# The build is the Dockerfile's profile-guided, fat-LTO release build of every crate: 91
# minutes measured on 2 cores shared with other builds (base images another 7), which is
# why .ci/run runs this only with CI_CONTAINER=1. The build's cache mounts and podman's
# layer cache stay, so a rebuild after a source change recompiles only the changed crates
# (still the fat-LTO link; not measured yet); the checks alone (SKIP_BUILD=1) take about
# 20 s. Logs: target/container/.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "test-container.sh: $*" >&2; }
die() { say "FAIL: $*"; exit 1; }
ok() { say "ok: $*"; }

[ "$(id -u)" = 0 ] || die "needs root (podman)"
for t in podman mmdebstrap nsenter curl; do command -v "$t" >/dev/null || die "$t is missing: apt-get install $t"; done
runtime=()
command -v runc >/dev/null && runtime=(--runtime runc)
BASE=localhost/portcullis-test/debian:bookworm
BUILDER=localhost/portcullis-test/rust:bookworm
IMAGE=${IMAGE:-localhost/portcullis:test}
tmp=$(mktemp -d)
# the build logs stay (a failed build's cause is near the end of build.log)
logs=${CONTAINER_LOGS:-${CARGO_TARGET_DIR:-target}/container}
mkdir -p "$logs"
name=portcullis-container-$$
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # 1. the runtime base: Debian bookworm minbase (debian:bookworm-slim's content)
  if ! podman image exists "$BASE"; then
    say "building $BASE with mmdebstrap (~2 min)"
    mmdebstrap --variant=minbase --include=ca-certificates bookworm "$tmp/base.tar" \
      >"$tmp/mmdebstrap.log" 2>&1 || { tail -20 "$tmp/mmdebstrap.log" >&2; die "mmdebstrap"; }
    podman import "$tmp/base.tar" "$BASE" >/dev/null
    rm -f "$tmp/base.tar"
  fi
  # 2. the builder base: that, a C toolchain and git, and this machine's rustc
  if ! podman image exists "$BUILDER"; then
    say "building $BUILDER"
    rustc_version=$(rustc --version | cut -d' ' -f2)
    sysroot=$(rustc --print sysroot)
    mkdir -p "$tmp/builder/rust"
    # the toolchain without its documentation (rust-docs: hundreds of MB of HTML)
    tar -C "$sysroot" --exclude=./share/doc -cf - . | tar -C "$tmp/builder/rust" -xf -
    # This machine's CA bundle, for cargo: where HTTPS goes through an intercepting
    # proxy, its CA is in the host's bundle only (cargo's "SSL certificate problem:
    # self-signed certificate in certificate chain" otherwise)
    cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$tmp/builder/host-ca.crt"
    cat >"$tmp/builder/Containerfile" <<EOF
FROM $BASE
COPY host-ca.crt /etc/ssl/host-ca.crt
ENV CARGO_HTTP_CAINFO=/etc/ssl/host-ca.crt
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ libc6-dev make git curl gzip \
 && rm -rf /var/lib/apt/lists/*
COPY rust /usr/local/cargo
ENV CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN rustc --version | grep -q "$rustc_version"
EOF
    podman build "${runtime[@]}" --network host --ulimit nofile="$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096 \
      -t "$BUILDER" "$tmp/builder" >"$logs/builder.log" 2>&1 || { tail -30 "$logs/builder.log" >&2; die "the builder image ($logs/builder.log)"; }
    rm -rf "$tmp/builder"
  fi
  # 3. the image, from the repository's Dockerfile and build context
  commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  say "building $IMAGE from the Dockerfile (the release build: long)"
  start=$(date +%s)
  podman build "${runtime[@]}" --network host --ulimit nofile="$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096 \
    --build-arg BUILDER_IMAGE="$BUILDER" --build-arg RUNTIME_IMAGE="$BASE" \
    --build-arg PORTCULLIS_COMMIT="$commit" \
    -t "$IMAGE" . >"$logs/build.log" 2>&1 || { tail -40 "$logs/build.log" >&2; die "podman build ($logs/build.log)"; }
  ok "built $IMAGE in $(($(date +%s) - start)) s ($(podman image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
fi

# 4. run it, read-only, in a network namespace of its own (its ports 8080 and 9090 are
# its own, whatever the host runs); the image's config (conf/portcullis.toml) proxies to
# 127.0.0.1:9001 and 9002: the demo backend, mounted read-only and started inside
backend=${CARGO_TARGET_DIR:-target}/debug/demo_backend
[ -x "$backend" ] || die "no $backend: cargo build --bin demo_backend"
podman "${runtime[@]}" run -d --name "$name" --network none --read-only \
  -v "$(realpath "$backend"):/usr/local/bin/demo_backend:ro" \
  --ulimit nofile="$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096 "$IMAGE" >/dev/null || die "podman run"
for port in 9001 9002; do
  podman exec -d "$name" /usr/local/bin/demo_backend "127.0.0.1:$port" >/dev/null || die "the demo backend"
done
# HTTP from the host inside the container's network namespace: podman refuses `exec` into
# a container it is stopping, so the drain can only be watched from outside
cpid=$(podman inspect -f '{{.State.Pid}}' "$name")
[ "${cpid:-0}" -gt 0 ] || die "no PID for $name"
get() { nsenter -t "$cpid" -n curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@" || true; }
for _ in $(seq 100); do [ "$(get http://127.0.0.1:9090/readyz)" = 200 ] && break; sleep 0.2; done
[ "$(get http://127.0.0.1:9090/readyz)" = 200 ] || { podman logs "$name" 2>&1 | tail -20 >&2; die "/readyz never 200"; }
body=
for _ in $(seq 50); do
  body=$(podman exec "$name" curl -s --max-time 5 http://127.0.0.1:8080/ || true)
  case $body in *"hello from demo backend"*) break ;; esac
  sleep 0.2
done
case $body in *"hello from demo backend"*) ;; *) die "a proxied request got: $body" ;; esac
ok "running: /readyz 200, a request proxied to the demo backend"

# the proxy is the container's PID 1 (ENTRYPOINT in exec form): its real, effective, saved
# and file-system ids, from the kernel
pid1_comm=$(podman exec "$name" cat /proc/1/comm)
[ "$pid1_comm" = portcullis ] || die "PID 1 is $pid1_comm, not portcullis"
ids=$(podman exec "$name" sed -n 's/^\(Uid\|Gid\):[[:space:]]*//p' /proc/1/status | tr -s ' \t\n' ' ')
[ "$ids" = "10001 10001 10001 10001 10001 10001 10001 10001 " ] || die "the proxy's uid and gid are $ids, not 10001"
pid1_user=$(podman top "$name" user | sed -n 2p | tr -d ' ')
[ "$pid1_user" = portcullis ] || die "the proxy runs as $pid1_user"
# read-only for root too (the proxy's user could not write there anyway): each write
# must fail with EROFS, not EACCES
for f in /x /etc/x /usr/local/bin/x /var/x; do
  err=$(podman exec --user 0 "$name" touch "$f" 2>&1) && die "root wrote $f: the root file system is writable"
  case $err in *"Read-only file system"*) ;; *) die "touch $f failed, but not read-only: $err" ;; esac
done
[ "$(podman inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$name")" = true ] || die "not run read-only"
commit_label=$(podman exec "$name" curl -s http://127.0.0.1:9090/metrics | sed -n 's/^portcullis_build_info{.*commit="\([^"]*\)".*/\1/p')
[ -n "$commit_label" ] || die "no portcullis_build_info"
[ -z "${commit:-}" ] || [ "$commit_label" = "$commit" ] || die "portcullis_build_info commit=$commit_label, built from $commit"
ok "user $pid1_user (uid 10001), read-only root file system, portcullis_build_info commit=$commit_label"

# 5. SIGTERM: readiness fails at once, traffic served for drain_seconds, exit 0
stop_start=$(date +%s.%N)
podman stop -t 60 "$name" >"$tmp/stop.log" 2>&1 &
stopper=$!
for _ in $(seq 50); do [ "$(get http://127.0.0.1:9090/readyz)" = 503 ] && break; sleep 0.1; done
[ "$(get http://127.0.0.1:9090/readyz)" = 503 ] || die "/readyz is not 503 after SIGTERM"
[ "$(get http://127.0.0.1:8080/)" = 200 ] || die "not served while draining"
wait "$stopper" || die "podman stop: $(cat "$tmp/stop.log")"
stop_secs=$(awk -v a="$stop_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
# drain_seconds = 5 in the image's config: an exit before it did not drain
awk -v s="$stop_secs" 'BEGIN { exit !(s >= 5) }' || die "stopped after $stop_secs s, before drain_seconds (5 s)"
code=$(podman inspect -f '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { podman logs "$name" 2>&1 | tail -10 >&2; die "exit code $code after SIGTERM"; }
podman logs "$name" >"$tmp/proxy.log" 2>&1
grep 'still proxying during drain' "$tmp/proxy.log" | grep -q '"mode":"graceful"' || die "no graceful drain in the proxy's log"
ok "SIGTERM: /readyz 503 at once, served while draining, exit 0 after $stop_secs s"
say "all checks passed"
