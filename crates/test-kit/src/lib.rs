//! End-to-end test support: real processes, real sockets, no mocks. One module per concern,
//! all re-exported here so a test writes `use portcullis_test_kit as support;` and
//! `use support::*;`. The kit does not depend on the portcullis library, so the library's
//! own unit tests use it too (a dev-dependency, no cycle).
//!
//! * `redis` — [`RedisServer`]: a real `redis-server` on a free port (never 6379) that a
//!   test can kill and restart; the one place that starts `redis-server`.
//! * `backend` — [`Backend`]: a real HTTP/1.1 server whose behaviour ([`Mode`]) can be
//!   changed at run time; it counts requests, tracks concurrency and echoes what it received.
//! * `proxy` — [`Proxy`]: the real `portcullis` binary on free ports with a generated
//!   `[server]` table, ready once its admin `/readyz` answers 200; `[[upstreams]]` builders
//!   ([`one_upstream`], [`upstreams`]) and `--check` runs ([`check_config`]).
//! * `client` — a small blocking HTTP/1.1 client ([`get`], [`post`], [`send_raw`], [`Conn`]).
//! * `metrics` — a Prometheus text matcher ([`metric_value`]).
//! * `tls` — certificates made with `openssl` ([`make_cert`], [`tls_table`]) and the real
//!   clients `openssl s_client` ([`s_client`]) and `curl` ([`curl`]).
//! * `grpc` — [`GrpcServer`] and [`grpc_call`]: a real gRPC server and client
//!   (`py/grpc_peer.py` on Debian's python3-grpcio).
//! * `nginx` — [`Nginx`]: Debian's nginx as a TLS + HTTP/2 and h2c backend.
//! * `websocket` — [`WsEchoServer`] (a real RFC 6455 echo server) and [`WsClient`].
//! * `h2raw` — [`H2Raw`]: hand-written HTTP/2 frames for attacks (rapid reset, too many
//!   streams, oversized header blocks).
//! * `py/h2_fields.py` — how the proxy's HTTP/2 response fields are HPACK-encoded, read by
//!   Debian's python3-h2 (tests/h2_gates.rs); `py/h2_stall.py`, an HTTP/2 client that
//!   stalls (tests/hardening_h2.rs). [`py_helper`] finds them.
//! * `browser` — headless Chromium: [`dump_dom`], [`screenshot`].
//! * `otlp` — [`OtlpReceiver`]: a real OTLP/HTTP trace receiver decoding the protobuf
//!   bodies with `opentelemetry-proto`.
//! * `prometheus` — [`Prometheus`]: a real Prometheus scraping a proxy, with a PromQL client.
//! * `load` — client load ([`Load`], [`concurrently`]) and epoch-aligned window timing
//!   ([`now_ms`], [`wait_window_phase`]).
//! * here — the binary under test ([`BIN`]), polling helpers ([`wait_until`],
//!   [`eventually`], [`assert_eventually!`]).
//!
//! Everything is std-only (threads, blocking sockets) so tests need no async runtime.
//! Every blocking read has a timeout so a broken proxy fails a test instead of hanging it.

mod backend;
mod browser;
mod client;
mod grpc;
mod h2raw;
mod load;
mod metrics;
mod nginx;
mod otlp;
mod prometheus;
mod proxy;
mod redis;
mod tls;
mod websocket;

pub use self::prometheus::{url_encode, Prometheus};
pub use self::redis::{
    command_delta, free_port, key_hash, RedisCluster, RedisSentinels, RedisServer,
    CLUSTER_NODE_TIMEOUT_MS,
};
pub use backend::{
    closing_response_backend, count_state, established_to, fixed_response_backend, tcp_states_to,
    Backend, Mode, Received, TCP_CLOSE_WAIT, TCP_ESTABLISHED,
};
pub use browser::{chromium, dump_dom, screenshot};
pub use client::{get, post, send_raw, try_get, try_request, Conn, RawOutcome, Resp};
pub use grpc::{grpc_call, GrpcReply, GrpcServer};
pub use h2raw::{
    hpack_block, H2Raw, H2Seen, ENHANCE_YOUR_CALM, GOAWAY, HEADERS, REFUSED_STREAM, RST_STREAM,
};
pub use load::{
    admitted_in_window, concurrently, now_ms, wait_until_ms, wait_window_phase, KeyedLoad,
    KeyedSample, Load, Sample,
};
pub use metrics::{has_metric, metric_samples, metric_value, Labels};
pub use nginx::{Nginx, NginxVhosts};
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use proxy::{
    balanced_app, check_config, check_config_file, fleet_config, one_upstream, upstream_of,
    upstream_table, upstreams, Proxy,
};
pub use tls::{
    curl, make_ca, make_cert, make_signed_cert, nghttp, resolve, s_client, tls_exchange, tls_table,
    CertFiles, H2Stream,
};
pub use websocket::{ws_accept, WsClient, WsEchoServer, WsOpen};

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Path of the binary under test: the `portcullis` that cargo built beside the test
/// executable, or the one `PORTCULLIS_TEST_BIN` names (to run the suite against another
/// build of the same source, such as `scripts/build-pgo.sh`'s `target/pgo/portcullis`).
pub static BIN: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| match std::env::var("PORTCULLIS_TEST_BIN") {
        Ok(path) if !path.is_empty() => {
            let path = std::fs::canonicalize(&path)
                .unwrap_or_else(|e| panic!("PORTCULLIS_TEST_BIN={path}: {e}"));
            path.display().to_string()
        }
        _ => cargo_bin("portcullis").display().to_string(),
    });

/// A binary of the workspace that cargo built for the running test: a library cannot use
/// `env!("CARGO_BIN_EXE_<name>")` (cargo sets it for integration tests only), so it is
/// found where cargo puts it, as `assert_cmd`'s `cargo_bin` does: beside the test
/// executable, whose own directory is `target/<profile>/deps`. Panics, saying so, when the
/// binary is not there.
pub fn cargo_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test executable");
    let path = bin_beside(&exe, name);
    assert!(
        path.is_file(),
        "the binary under test {} is missing (built for {}): run the tests through \
         `cargo test`/`cargo nextest run` of the portcullis package, which build it, or \
         name a binary with PORTCULLIS_TEST_BIN",
        path.display(),
        exe.display(),
    );
    path
}

/// `target/<profile>/<name>` for a test executable `target/<profile>/deps/<test>-<hash>`
/// (or `target/<profile>/<test>`, as `cargo run --example` places one).
fn bin_beside(exe: &Path, name: &str) -> PathBuf {
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// Path of one of the kit's python helpers (`py/<name>`, e.g. `h2_stall.py`).
pub fn py_helper(name: &str) -> String {
    format!("{}/py/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Default deadline for "this should happen soon" on a loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Default socket read/write timeout of the test client.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);

// Polling

/// Polls `f` (every ~10 ms) until it returns true or `timeout` passes. Returns the last result.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Like [`wait_until`] but panics with `what` (evaluated lazily) when the deadline passes.
pub fn eventually(timeout: Duration, what: impl FnOnce() -> String, f: impl FnMut() -> bool) {
    if !wait_until(timeout, f) {
        panic!("condition not reached within {timeout:?}: {}", what());
    }
}

/// `assert_eventually!(cond)` / `assert_eventually!(cond, "fmt", args..)` /
/// `assert_eventually!(timeout = d, cond, ...)`: polls `cond` until true or panics.
#[macro_export]
macro_rules! assert_eventually {
    (timeout = $t:expr, $cond:expr $(,)?) => {
        if !$crate::wait_until($t, || $cond) {
            panic!("assert_eventually failed after {:?}: {}", $t, stringify!($cond));
        }
    };
    (timeout = $t:expr, $cond:expr, $($arg:tt)+) => {
        if !$crate::wait_until($t, || $cond) {
            panic!("assert_eventually failed after {:?}: {}: {}", $t, stringify!($cond), format!($($arg)+));
        }
    };
    ($cond:expr $(,)?) => {
        $crate::assert_eventually!(timeout = $crate::DEADLINE, $cond)
    };
    ($cond:expr, $($arg:tt)+) => {
        $crate::assert_eventually!(timeout = $crate::DEADLINE, $cond, $($arg)+)
    };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// 64-bit FNV-1a, used by the backend to prove a body arrived intact without echoing it.
pub fn fnv1a(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bin_beside_finds_the_binary_above_deps() {
        let exe = Path::new("/w/target/debug/deps/routing-0123abcd");
        let want = format!("/w/target/debug/portcullis{}", std::env::consts::EXE_SUFFIX);
        assert_eq!(bin_beside(exe, "portcullis"), PathBuf::from(want));
    }

    #[test]
    fn bin_beside_keeps_a_directory_that_is_not_deps() {
        let exe = Path::new("/w/target/release/examples/probe");
        let want = format!(
            "/w/target/release/examples/demo_backend{}",
            std::env::consts::EXE_SUFFIX
        );
        assert_eq!(bin_beside(exe, "demo_backend"), PathBuf::from(want));
    }

    #[test]
    fn cargo_bin_names_a_missing_binary() {
        let err = std::panic::catch_unwind(|| cargo_bin("no-such-binary-of-portcullis"))
            .expect_err("a missing binary must panic");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("no-such-binary-of-portcullis"), "{msg}");
        assert!(msg.contains("PORTCULLIS_TEST_BIN"), "{msg}");
    }

    #[test]
    fn py_helpers_are_where_the_kit_looks() {
        for name in ["grpc_peer.py", "h2_fields.py", "h2_stall.py"] {
            let path = py_helper(name);
            assert!(Path::new(&path).is_file(), "{path} is missing");
        }
    }
}
