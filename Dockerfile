# syntax=docker/dockerfile:1
# Multi-stage build: a Rust builder with cmake (Pingora's zlib-ng), then a slim
# non-root runtime.
# Base images pinned by digest (unverified here: no container engine; see docs/src/guide/deploying.md).
# The builder's rustc must read the committed PGO profile (pgo/profile.env: RUSTC, LLVM_MAJOR):
# rust 1.95.0 is LLVM 22, as the profile's. tests/container_image.rs checks the two agree.
# The base images are build arguments only so that a machine without Docker Hub can build
# from images of its own making (scripts/test-container.sh: Debian packages, mmdebstrap);
# the defaults are the pinned images every other build uses.
ARG BUILDER_IMAGE=rust:1.95.0-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1
ARG RUNTIME_IMAGE=debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251
FROM ${BUILDER_IMAGE} AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
# Pingora's openssl links the system libssl instead of building OpenSSL (.cargo/config.toml).
ENV OPENSSL_NO_VENDOR=1
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY .cargo ./.cargo
# the workspace's members: cargo reads every one's manifest before it builds any
COPY crates ./crates
COPY fuzz ./fuzz
COPY src ./src
COPY benches ./benches
COPY vendor ./vendor
COPY examples ./examples
COPY conf ./conf
COPY pgo ./pgo
COPY scripts/pgo-profile.sh ./scripts/
# portcullis_build_info{commit}: the build context has no .git (`--build-arg
# PORTCULLIS_COMMIT=$(git rev-parse --short=12 HEAD)`); "unknown" without it.
ARG PORTCULLIS_COMMIT=
ENV PORTCULLIS_COMMIT=${PORTCULLIS_COMMIT}
# Profile-guided with the committed profile (pgo/README.md), as scripts/run.sh builds it:
# ~22% fewer instructions per request than the plain build. pgo-profile.sh fails the
# build if this rustc cannot read the profile, rather than ship the plain build silently.
# The registry and target/ are cache mounts (BuildKit, buildah): a rebuild after a source
# change compiles only what changed instead of every dependency again; the binary is
# copied out of the cache in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    profile=$(bash scripts/pgo-profile.sh) \
 && RUSTFLAGS="-Cprofile-use=$profile" cargo build --release --locked --bin portcullis \
 && ./target/release/portcullis -c conf/portcullis.toml --check \
 && install -m 755 target/release/portcullis /usr/local/bin/portcullis

FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin portcullis
COPY --from=builder /usr/local/bin/portcullis /usr/local/bin/portcullis
# The shipped default listens on loopback; in a container listen on all interfaces.
# That includes the admin listener (9090), so that orchestrator probes and
# Prometheus can reach it. It has no TLS and its GET endpoints (/healthz,
# /readyz, /metrics, /status) need no credentials: publish it only on a private
# network (e.g. `-p 127.0.0.1:9090:9090`), never to the internet. Its POST
# endpoints (/reload) are refused with 403 on a non-loopback listener until
# `server.admin_token` is set; then they need `Authorization: Bearer <token>`.
# The proxy logs a warning at start-up while the listener is exposed without a
# token. SIGHUP reloads without any token (`docker kill -s HUP`).
COPY conf/portcullis.toml /etc/portcullis/portcullis.toml
RUN sed -i \
      -e 's/^listen = \["127.0.0.1:8080"\]/listen = ["0.0.0.0:8080"]/' \
      -e 's/^admin_listen = "127.0.0.1:9090"/admin_listen = "0.0.0.0:9090"/' \
      -e 's#^upgrade_sock = .*#upgrade_sock = "/tmp/portcullis-upgrade.sock"#' \
      /etc/portcullis/portcullis.toml \
 && /usr/local/bin/portcullis -c /etc/portcullis/portcullis.toml --check
USER 10001:10001
EXPOSE 8080 9090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=2s CMD curl -fsS http://127.0.0.1:9090/healthz || exit 1
ENTRYPOINT ["/usr/local/bin/portcullis"]
CMD ["-c", "/etc/portcullis/portcullis.toml"]
