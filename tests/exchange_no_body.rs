//! A request with no body (most GETs) is proxied in order, in its own task: header up,
//! response down (vendor/pingora-proxy, `proxy_1to1_sequential`). These tests hold it to
//! what the duplex path did for such a request:
//! - a client that leaves while the backend holds its request aborts it, over HTTP/1.1
//!   and over HTTP/2, and the upstream connection is closed rather than left waiting;
//! - a response is streamed as it comes, not gathered: its header and first chunk reach
//!   the client while the backend still holds the rest.

use portcullis_test_kit as support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::*;

fn config(upstream: &str) -> String {
    format!("{upstream}[shedding]\nmax_concurrency = 0\n\n[rate_limit]\nenabled = false\n")
}

fn aborts(p: &Proxy) -> f64 {
    p.metric("portcullis_client_aborts_total")
        .unwrap_or_else(|| panic!("portcullis_client_aborts_total missing:\n{}", p.metrics()))
}

/// Hold a request at the backend, let `leave` make the client go, then check that the
/// proxy gave up the upstream connection while the backend still held the request, that
/// it counted a client abort, and that it still serves.
fn held_request_is_abandoned(p: &Proxy, b: &Backend, leave: impl FnOnce()) {
    eventually(
        DEADLINE,
        || {
            format!(
                "held request never reached the backend: in flight {}, upstream {}",
                b.in_flight(),
                established_to(b.port())
            )
        },
        || b.in_flight() == 1 && established_to(b.port()) == 1,
    );
    leave();
    eventually(
        DEADLINE,
        || {
            format!(
                "the proxy kept its upstream connection after the client left ({} open)",
                established_to(b.port())
            )
        },
        || established_to(b.port()) == 0,
    );
    // the backend is still holding it: the proxy left first
    assert_eq!(b.in_flight(), 1, "the backend let go before the proxy did");
    eventually(
        DEADLINE,
        || format!("abort not counted: {}", aborts(p)),
        || aborts(p) >= 1.0,
    );
    b.release_all();
    b.set_mode(Mode::Ok);
    eventually(
        DEADLINE,
        || "the backend never finished the held request".into(),
        || b.in_flight() == 0,
    );
}

#[test]
fn a_client_leaving_a_held_get_closes_its_upstream_connection() {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start(&config(&one_upstream(&b)));
    assert_eq!(aborts(&p), 0.0);
    let mut c = TcpStream::connect(p.addr()).expect("connect");
    c.write_all(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    held_request_is_abandoned(&p, &b, || drop(c));
    assert_eq!(p.get("/after", &[]).status, 200);
}

#[test]
fn an_h2_stream_reset_while_held_closes_its_upstream_connection() {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start_with_server("h2c = true\n", &config(&one_upstream(&b)));
    assert_eq!(aborts(&p), 0.0);
    let mut c = H2Raw::connect(&p.addr());
    c.headers(1, &H2Raw::request_block("x", "/held", &[]))
        .expect("headers");
    held_request_is_abandoned(&p, &b, || c.rst(1, 0x8).expect("rst"));
    // the connection outlives its reset stream
    c.headers(3, &H2Raw::request_block("x", "/after", &[]))
        .expect("headers");
    let seen = c.read_until(DEADLINE, |s| s.responses.contains(&3) || s.closed);
    assert!(seen.responses.contains(&3), "{seen:?}");
    assert!(!seen.resets.contains_key(&3), "{seen:?}");
}

/// A backend that answers one request with a chunked header and first chunk, then waits
/// for `go` before it sends the last chunk.
fn two_part_backend(go: mpsc::Receiver<()>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => req.extend_from_slice(&buf[..n]),
            }
        }
        let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
        if s.write_all(head).is_err() || go.recv_timeout(DEADLINE).is_err() {
            return;
        }
        let _ = s.write_all(b"4\r\nlast\r\n0\r\n\r\n");
        // keep the connection until the proxy closes it
        let _ = s.read(&mut buf);
    });
    addr
}

/// Read from `c` until `want` is in what was read, or the deadline passes.
fn read_until_seen(c: &mut TcpStream, got: &mut Vec<u8>, want: &[u8]) -> bool {
    let end = Instant::now() + DEADLINE;
    c.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        if got.windows(want.len()).any(|w| w == want) {
            return true;
        }
        match c.read(&mut buf) {
            Ok(0) => return got.windows(want.len()).any(|w| w == want),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return false,
        }
    }
    false
}

#[test]
fn a_response_is_streamed_as_it_comes() {
    let (go, wait) = mpsc::channel();
    let backend = two_part_backend(wait);
    let upstream = format!("[[upstreams]]\nname = \"app\"\nbackends = [\"{backend}\"]\n\n");
    let p = Proxy::start(&config(&upstream));
    let mut c = TcpStream::connect(p.addr()).expect("connect");
    c.write_all(b"GET /two-part HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut got = Vec::new();
    assert!(
        read_until_seen(&mut c, &mut got, b"first"),
        "the header and first chunk did not come before the rest: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        !got.windows(4).any(|w| w == b"last"),
        "the last chunk came before the backend sent it"
    );
    go.send(()).expect("go");
    assert!(
        read_until_seen(&mut c, &mut got, b"0\r\n\r\n"),
        "the response never ended: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(got.windows(4).any(|w| w == b"last"));
}
