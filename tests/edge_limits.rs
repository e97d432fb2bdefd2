//! Limits at the edge (issue 12, CONTRACT §7): body size (413), a slowloris
//! header (408), a stalled body (408), and the connection cap. Raw sockets
//! against the real binary; the recording backend shows nothing arrived for
//! each refusal; each refusal is counted in `portcullis_edge_refusals_total`.

use portcullis_test_kit as support;

use std::time::{Duration, Instant};
use support::*;

fn refusals(p: &Proxy, reason: &str) -> f64 {
    p.metric(&format!(
        r#"portcullis_edge_refusals_total{{reason="{reason}"}}"#
    ))
    .unwrap_or(0.0)
}

/// Reads until EOF (true) or `timeout` (false).
fn closed_within(c: &mut Conn, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if c.is_closed_by_peer(Duration::from_millis(100)) {
            return true;
        }
    }
    false
}

fn assert_close(r: &Resp) {
    assert!(
        r.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close")),
        "a refusal that leaves a body unread must close: {:?}",
        r.headers
    );
}

#[test]
fn a_body_over_the_limit_is_413_and_never_forwarded() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server("max_request_body_bytes = 1000", &one_upstream(&b));

    // By Content-Length, before a byte of body is sent.
    let mut c = Conn::open(&p.addr()).expect("connect");
    c.write_raw(b"POST /by-length HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        .expect("write");
    let r = c.read_response().expect("413 before the body");
    assert_eq!(r.status, 413, "{}", r.body_str());
    assert_close(&r);
    assert!(closed_within(&mut c, Duration::from_secs(5)));

    // Chunked: the chunk that crosses the limit is not forwarded; the request fails.
    let mut c = Conn::open(&p.addr()).expect("connect");
    let r = c
        .request_chunked("POST", "/chunked", &[], &[&[b'a'; 600], &[b'b'; 600]])
        .expect("a response");
    assert_eq!(r.status, 413, "{}", r.body_str());
    assert!(closed_within(&mut c, Duration::from_secs(5)));

    // Within the limit both ways: forwarded whole.
    let ok = post(&p.addr(), "/small", &[], &[b'c'; 1000]);
    assert_eq!(ok.status, 200);
    assert_eq!(ok.header("x-echo-body-len"), Some("1000"));
    let mut c = Conn::open(&p.addr()).expect("connect");
    let ok = c
        .request_chunked("POST", "/small-chunked", &[], &[&[b'd'; 500], &[b'e'; 500]])
        .expect("response");
    assert_eq!(ok.status, 200);

    let paths = b.received_paths();
    assert!(
        !paths.iter().any(|p| p == "/by-length" || p == "/chunked"),
        "a refused body reached the backend: {paths:?}"
    );
    assert!(
        b.received().iter().all(|r| r.body.len() <= 1000),
        "more than the limit was forwarded"
    );
    assert_eq!(refusals(&p, "body_too_large"), 2.0);
}

#[test]
fn slowloris_headers_get_408_at_the_deadline() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server("client_header_timeout_ms = 1000", &one_upstream(&b));
    let mut c = Conn::open(&p.addr()).expect("connect");
    let start = Instant::now();
    // One byte per 250 ms, a header block that would take ~20 s.
    let slow = b"GET /slow HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let _ = c.write_slowly(slow, Duration::from_millis(250));
    let elapsed = start.elapsed();
    let r = c.read_response().expect("a 408 before the close");
    assert_eq!(r.status, 408, "{}", r.body_str());
    assert_close(&r);
    assert!(
        elapsed < Duration::from_secs(4),
        "the writer should have been cut off near 1 s, took {elapsed:?}"
    );
    assert!(b.received_paths().is_empty(), "{:?}", b.received_paths());
    assert_eq!(refusals(&p, "header_timeout"), 1.0);

    // The deadline is per header block, not per connection: a keep-alive
    // connection may idle past it between requests, and a prompt header is fine.
    let mut c = Conn::open(&p.addr()).expect("connect");
    assert_eq!(
        c.request("GET", "/one", &[], b"").expect("first").status,
        200
    );
    assert!(
        !closed_within(&mut c, Duration::from_millis(1500)),
        "idle keep-alive was cut"
    );
    assert_eq!(
        c.request("GET", "/two", &[], b"").expect("second").status,
        200
    );
    assert_eq!(refusals(&p, "header_timeout"), 1.0);
}

/// A connection that never sends a byte is answered 408 and closed at the header
/// deadline too: the edge stream times the first request from the accept, well before
/// Pingora's own 60 s wait for it would end.
#[test]
fn a_silent_new_connection_is_closed_at_the_header_deadline() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server("client_header_timeout_ms = 1000", &one_upstream(&b));
    let c = Conn::open(&p.addr()).expect("connect");
    let start = Instant::now();
    let sent = bytes_until_closed(&c, Duration::from_secs(10))
        .expect("a silent connection was still open after 10 s");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "closed after {took:?}, the deadline is 1 s"
    );
    let text = String::from_utf8_lossy(&sent);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(refusals(&p, "header_timeout"), 1.0);
}

/// What the peer sent before it closed the connection, or None if it had not closed
/// within `timeout`.
fn bytes_until_closed(c: &Conn, timeout: Duration) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut stream = c.stream();
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while Instant::now() < deadline {
        let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
        match stream.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(got),
        }
    }
    None
}

/// `keepalive_timeout_seconds`: a keep-alive connection idle that long between requests
/// is closed without a response (no 408: no request was begun), as Pingora's own
/// keep-alive timeout did; each request starts the wait again, so a client that keeps
/// coming back within the timeout keeps its connection however long it lives. The edge
/// stream times this wait (one timer per connection) instead of Pingora (a timer
/// registered per wait).
#[test]
fn an_idle_keep_alive_connection_is_closed_quietly_at_the_timeout() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server("keepalive_timeout_seconds = 1", &one_upstream(&b));
    let mut c = Conn::open(&p.addr()).expect("connect");
    // Requests 0.6 s apart: 2.4 s in all on one connection, never 1 s idle.
    for i in 0..4 {
        let r = c
            .request("GET", &format!("/ka/{i}"), &[], b"")
            .expect("response");
        assert_eq!(r.status, 200, "request {i} on the kept connection");
        assert!(
            !closed_within(&mut c, Duration::from_millis(600)),
            "closed after request {i}, idle for less than the timeout"
        );
    }
    // Then idle: closed soon after 1 s (0.6 s of it already gone), with nothing sent.
    let start = Instant::now();
    let sent = bytes_until_closed(&c, Duration::from_secs(10)).expect("closed when idle");
    assert!(
        sent.is_empty(),
        "the idle close sent {:?}",
        String::from_utf8_lossy(&sent)
    );
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "closed {:?} into the wait, before the timeout",
        start.elapsed()
    );
    assert_eq!(
        refusals(&p, "header_timeout"),
        0.0,
        "an idle wait is not a slow header"
    );
    assert_eq!(b.received_paths().len(), 4, "{:?}", b.received_paths());

    // A header begun just before the idle timeout is under the header deadline
    // instead (10 s by default), and is answered.
    let mut c = Conn::open(&p.addr()).expect("connect");
    assert_eq!(
        c.request("GET", "/first", &[], b"").expect("first").status,
        200
    );
    assert!(!closed_within(&mut c, Duration::from_millis(700)));
    c.write_raw(b"GET /late HTTP/1.1\r\n").expect("write");
    assert!(
        !closed_within(&mut c, Duration::from_millis(800)),
        "a begun header was cut by the idle timeout"
    );
    c.write_raw(b"Host: x\r\n\r\n").expect("write");
    let r = c.read_response().expect("the late request's response");
    assert_eq!(r.status, 200, "{}", r.body_str());
}

#[test]
fn a_stalled_body_gets_408_and_the_request_fails() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server("client_body_timeout_ms = 800", &one_upstream(&b));
    let mut c = Conn::open(&p.addr()).expect("connect");
    c.write_raw(b"POST /stalled HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        .expect("write");
    let start = Instant::now();
    let r = c.read_response().expect("408 after the pause");
    assert_eq!(r.status, 408, "{}", r.body_str());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(closed_within(&mut c, Duration::from_secs(5)));
    assert!(
        !b.received_paths().iter().any(|p| p == "/stalled"),
        "a stalled request was completed upstream"
    );
    eventually(
        DEADLINE,
        || "body timeout not counted".into(),
        || refusals(&p, "body_timeout") == 1.0,
    );
    // a body that keeps coming, slower in total than the timeout, is fine
    let mut c = Conn::open(&p.addr()).expect("connect");
    c.write_raw(b"POST /steady HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n")
        .expect("write");
    c.write_slowly(b"abcdef", Duration::from_millis(250))
        .expect("write");
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 200, "{}", r.body_str());
}

#[test]
fn connections_beyond_the_cap_are_closed_at_once_and_counted() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server("max_connections = 20", &one_upstream(&b));
    let before = refusals(&p, "connection_limit");
    let mut conns: Vec<Conn> = (0..30)
        .map(|_| Conn::open(&p.addr()).expect("connect"))
        .collect();
    eventually(
        DEADLINE,
        || format!("want 10 refused, metrics:\n{}", p.metrics()),
        || refusals(&p, "connection_limit") == before + 10.0,
    );
    // Exactly the ten over the cap were closed; twenty stay open and usable.
    let closed: Vec<usize> = (0..conns.len())
        .filter(|&i| conns[i].is_closed_by_peer(Duration::from_millis(300)))
        .collect();
    assert_eq!(closed.len(), 10, "closed: {closed:?}");
    assert!(b.received_paths().is_empty());
    // The admin listener is not starved.
    let m = p.admin_get("/metrics");
    assert_eq!(m.status, 200);
    assert_eq!(p.metric("portcullis_client_connections"), Some(20.0));
    let open: Vec<usize> = (0..conns.len()).filter(|i| !closed.contains(i)).collect();
    let r = conns[open[0]]
        .request("GET", "/held", &[], b"")
        .expect("served");
    assert_eq!(r.status, 200);
    // Freeing connections makes room again.
    for i in open.iter().take(5).rev() {
        conns.remove(*i);
    }
    eventually(
        DEADLINE,
        || "a new connection after others closed".into(),
        || try_get(&p.addr(), "/fresh", &[]).is_ok_and(|r| r.status == 200),
    );
}
