//! Malformed and oversized input (CONTRACT §3: 400 malformed, 431 headers too large).
//! None of it may reach a backend or take the proxy down.

use portcullis_test_kit as support;

use support::*;

fn start() -> (Backend, Proxy) {
    let b = Backend::start("app");
    let p = Proxy::start(&one_upstream(&b));
    (b, p)
}

/// A malformed request is answered 400; a bare close is tolerated, any other answer is not.
fn assert_rejected_as_malformed(out: &RawOutcome, what: &str) {
    match out {
        RawOutcome::Response(r) => assert_eq!(
            r.status,
            400,
            "{what}: expected 400, got {} {}",
            r.status,
            r.body_str()
        ),
        RawOutcome::Closed { received, error } => {
            assert!(
                received.is_empty() || !received.starts_with(b"HTTP/1.1 2"),
                "{what}: partial 2xx answer {:?}",
                String::from_utf8_lossy(received)
            );
            eprintln!("note: {what}: connection closed without a 400 ({error})");
        }
    }
}

fn assert_still_serves(p: &Proxy, b: &Backend) {
    let before = b.requests();
    let r = p.get("/still-alive", &[]);
    assert_eq!(r.status, 200, "proxy must still serve: {}", r.body_str());
    assert!(b.requests() > before);
    assert_eq!(p.admin_get("/healthz").status, 200);
}

#[test]
fn garbage_request_line_is_400() {
    let (b, mut p) = start();
    let out = send_raw(&p.addr(), b"GARBAGE\r\n\r\n");
    assert_rejected_as_malformed(&out, "GARBAGE request line");
    assert_eq!(
        out.status(),
        Some(400),
        "contract §3: a malformed request is answered 400 ({out:?})"
    );
    assert_eq!(b.requests(), 0, "a malformed request reached the backend");
    assert!(p.is_running(), "proxy died; logs:\n{}", p.logs());
    assert_still_serves(&p, &b);
}

#[test]
fn invalid_header_bytes_are_400() {
    let (b, mut p) = start();
    let cases: &[(&str, &[u8])] = &[
        (
            "space in header name",
            b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n",
        ),
        (
            "control byte in header value",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
        ),
        (
            "header line without colon",
            b"GET / HTTP/1.1\r\nHost: x\r\nnocolonhere\r\n\r\n",
        ),
        ("bad HTTP version", b"GET / HTTP/9.Q\r\nHost: x\r\n\r\n"),
        (
            "non-numeric content-length",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\nhello",
        ),
    ];
    for (what, bytes) in cases {
        let out = send_raw(&p.addr(), bytes);
        assert_rejected_as_malformed(&out, what);
        assert_eq!(b.requests(), 0, "{what}: reached the backend");
        assert!(
            p.is_running(),
            "proxy died after {what}; logs:\n{}",
            p.logs()
        );
    }
    assert_still_serves(&p, &b);
}

#[test]
fn oversized_headers_are_rejected_before_the_backend() {
    let (b, mut p) = start();
    let cookie = "c=".to_string() + &"x".repeat(100 * 1024);
    let req = format!("GET /big HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n\r\n");
    let out = send_raw(&p.addr(), req.as_bytes());
    match &out {
        RawOutcome::Response(r) => assert!(
            r.status == 431 || r.status == 400,
            "100 KB header: expected 431 (or 400), got {} {}",
            r.status,
            r.body_str()
        ),
        RawOutcome::Closed { error, .. } => {
            panic!("100 KB header: expected 431, connection closed without answer: {error}")
        }
    }
    assert_eq!(b.requests(), 0, "an oversized request reached the backend");

    // many medium headers adding up to > 64 KiB
    let mut req = String::from("GET /many HTTP/1.1\r\nHost: x\r\n");
    for i in 0..80 {
        req.push_str(&format!("X-Filler-{i}: {}\r\n", "y".repeat(1000)));
    }
    req.push_str("\r\n");
    let out = send_raw(&p.addr(), req.as_bytes());
    assert!(
        matches!(out.status(), Some(431) | Some(400)),
        "80 KB of headers: expected 431 (or 400), got {out:?}"
    );
    assert_eq!(b.requests(), 0, "an oversized request reached the backend");
    assert!(p.is_running(), "proxy died; logs:\n{}", p.logs());
    assert_still_serves(&p, &b);
}

#[test]
fn normal_sized_headers_pass() {
    let (b, p) = start();
    // 8 KB cookie is ordinary and must be proxied
    let cookie = "c=".to_string() + &"x".repeat(8 * 1024);
    let r = p.get("/cookie", &[("Cookie", &cookie)]);
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(
        b.last_received().expect("received").header("cookie"),
        Some(cookie.as_str())
    );
}

#[test]
fn absurd_api_key_does_not_crash() {
    let (b, mut p) = start();
    let key = "k".repeat(10 * 1024);
    let r = p.get("/key", &[("x-api-key", &key)]);
    assert!(
        r.status < 500,
        "10 KB api key: got {} {}",
        r.status,
        r.body_str()
    );
    assert!(p.is_running(), "proxy died; logs:\n{}", p.logs());
    assert!(
        !p.logs().contains(&key[..300]),
        "the API key must never be logged in clear"
    );
    assert_still_serves(&p, &b);
}

#[test]
fn client_closing_mid_request_does_not_hurt() {
    let (b, mut p) = start();
    // head promised a body that never comes; client vanishes
    {
        let mut c = Conn::open(&p.addr()).expect("connect");
        c.write_raw(b"POST /partial HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
            .expect("write");
    }
    // half a request line, then close
    {
        let mut c = Conn::open(&p.addr()).expect("connect");
        c.write_raw(b"GET /half").expect("write");
    }
    assert!(p.is_running(), "proxy died; logs:\n{}", p.logs());
    assert_still_serves(&p, &b);
    assert_eventually!(
        p.metric("portcullis_inflight_requests") == Some(0.0),
        "in-flight gauge leaked: {:?}",
        p.metric("portcullis_inflight_requests")
    );
}
