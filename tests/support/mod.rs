//! End-to-end test support: real processes, real sockets, no mocks. One module per concern,
//! all re-exported here so a test writes `use support::*;`:
//!
//! * `redis` — [`RedisServer`]: a real `redis-server` on a free port (never 6379) that a
//!   test can kill and restart. Self-contained: the crate's unit tests mount it too, so it
//!   is the one place that starts `redis-server`.
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
//!   (`grpc_peer.py` on Debian's python3-grpcio).
//! * `nginx` — [`Nginx`]: Debian's nginx as a TLS + HTTP/2 and h2c backend.
//! * `websocket` — [`WsEchoServer`] (a real RFC 6455 echo server) and [`WsClient`].
//! * `h2raw` — [`H2Raw`]: hand-written HTTP/2 frames for attacks (rapid reset, too many
//!   streams, oversized header blocks).
//! * `h2_fields.py` — how the proxy's HTTP/2 response fields are HPACK-encoded, read by
//!   Debian's python3-h2 (tests/h2_gates.rs).
//! * `browser` — headless Chromium: [`dump_dom`], [`screenshot`].
//! * `otlp` — [`OtlpReceiver`]: a real OTLP/HTTP trace receiver decoding the protobuf
//!   bodies with `opentelemetry-proto`.
//! * `prometheus` — [`Prometheus`]: a real Prometheus scraping a proxy, with a PromQL client.
//! * `load` — client load ([`Load`], [`concurrently`]) and epoch-aligned window timing
//!   ([`now_ms`], [`wait_window_phase`]).
//! * here — polling helpers ([`wait_until`], [`eventually`], `assert_eventually!`).
//!
//! Everything is std-only (threads, blocking sockets) so tests need no async runtime.
//! Every blocking read has a timeout so a broken proxy fails a test instead of hanging it.
#![allow(dead_code)]

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

// Each test crate uses a part of the kit; the rest is unused there.
#[allow(unused_imports)]
pub use self::prometheus::*;
#[allow(unused_imports)]
pub use self::redis::*;
#[allow(unused_imports)]
pub use backend::*;
#[allow(unused_imports)]
pub use browser::*;
#[allow(unused_imports)]
pub use client::*;
#[allow(unused_imports)]
pub use grpc::*;
#[allow(unused_imports)]
pub use h2raw::*;
#[allow(unused_imports)]
pub use load::*;
#[allow(unused_imports)]
pub use metrics::*;
#[allow(unused_imports)]
pub use nginx::*;
#[allow(unused_imports)]
pub use otlp::*;
#[allow(unused_imports)]
pub use proxy::*;
#[allow(unused_imports)]
pub use tls::*;
#[allow(unused_imports)]
pub use websocket::*;

use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Path of the binary under test: the one cargo built for the tests, or the one
/// `PORTCULLIS_TEST_BIN` names (to run the suite against another build of the same
/// source, such as `scripts/build-pgo.sh`'s `target/pgo/portcullis`).
pub static BIN: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| match std::env::var("PORTCULLIS_TEST_BIN") {
        Ok(path) if !path.is_empty() => {
            let path = std::fs::canonicalize(&path)
                .unwrap_or_else(|e| panic!("PORTCULLIS_TEST_BIN={path}: {e}"));
            path.display().to_string()
        }
        _ => env!("CARGO_BIN_EXE_portcullis").to_string(),
    });

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
        if !$crate::support::wait_until($t, || $cond) {
            panic!("assert_eventually failed after {:?}: {}", $t, stringify!($cond));
        }
    };
    (timeout = $t:expr, $cond:expr, $($arg:tt)+) => {
        if !$crate::support::wait_until($t, || $cond) {
            panic!("assert_eventually failed after {:?}: {}: {}", $t, stringify!($cond), format!($($arg)+));
        }
    };
    ($cond:expr $(,)?) => {
        $crate::assert_eventually!(timeout = $crate::support::DEADLINE, $cond)
    };
    ($cond:expr, $($arg:tt)+) => {
        $crate::assert_eventually!(timeout = $crate::support::DEADLINE, $cond, $($arg)+)
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
