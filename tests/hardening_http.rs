//! HTTP/1.1 hardening (issue 9 items 1, 3, 9 and the client-abort part of 10;
//! CONTRACT §7): ambiguous framing is refused and closed, keep-alive follows the
//! protocol, pipelined requests are all answered in order, and no log line carries a
//! secret. Raw sockets against the real binary and a backend that records what
//! arrived.

use portcullis_test_kit as support;

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};
use support::*;

fn upstream(b: &Backend) -> String {
    format!(
        r#"
[[upstreams]]
name = "app"
backends = ["{}"]
"#,
        b.addr()
    )
}

/// Reads until EOF (true) or `timeout` (false). Resets count as closed.
fn closed_within(c: &mut Conn, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if c.is_closed_by_peer(Duration::from_millis(200)) {
            return true;
        }
    }
    false
}

/// A marker request sent on a fresh connection after a case: once the backend saw it,
/// anything the case could have smuggled would have arrived before it.
fn flush_marker(p: &Proxy, b: &Backend, marker: &str) {
    let r = p.get(marker, &[]);
    assert_eq!(r.status, 200, "marker {marker}: {}", r.body_str());
    eventually(
        DEADLINE,
        || format!("backend never saw {marker}"),
        || b.received_paths().iter().any(|p| p == marker),
    );
}

#[test]
fn cl_plus_te_is_refused_closed_and_smuggles_nothing() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));
    let mut c = Conn::open(&p.addr()).expect("connect");
    c.write_raw(
        b"POST /front HTTP/1.1\r\nHost: x\r\nContent-Length: 72\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    .expect("write");
    let r = c
        .read_response()
        .expect("a response to the ambiguous request");
    assert_eq!(r.status, 400, "CL + TE must be refused: {}", r.body_str());
    assert_eq!(
        r.header("connection")
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("close"),
        "the refusal must say Connection: close: {:?}",
        r.headers
    );
    // The attack of issue 9: the rest arrives later on the same socket.
    thread::sleep(Duration::from_millis(300));
    let _ = c.write_raw(b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        closed_within(&mut c, Duration::from_secs(5)),
        "the connection must be closed after an ambiguous request"
    );
    flush_marker(&p, &b, "/after-cl-te");
    let paths = b.received_paths();
    assert!(
        !paths.iter().any(|p| p == "/smuggled" || p == "/front"),
        "nothing of the ambiguous request may reach the backend: {paths:?}"
    );
}

/// Each case must be answered 400 and closed, with nothing forwarded: neither the
/// request itself nor a request hidden in its body.
#[test]
fn ambiguous_or_malformed_framing_is_400_and_closed() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));
    let hidden = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let cases: Vec<(&str, String)> = vec![
        (
            "CL then TE",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "TE then CL",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "CL + TE in odd case",
            format!("POST /case HTTP/1.1\r\nHost: x\r\ncOnTeNt-LeNgTh: 5\r\ntransfer-encoding: CHUNKED\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "differing duplicate CL",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhello{hidden}"),
        ),
        (
            "CL list with differing values",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 40\r\n\r\nhello{hidden}"),
        ),
        (
            "gzip, chunked",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "two TE headers gzip then chunked",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "chunked twice",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "unknown coding",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "identity",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: 0\r\n\r\n{hidden}"),
        ),
        (
            "space before colon",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\nContent-Length: 0\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "vertical tab in TE",
            format!("POST /case HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \x0bchunked\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "TE on HTTP/1.0",
            format!("POST /case HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{hidden}"),
        ),
        (
            "NUL in a header value",
            format!("GET /case HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n{hidden}"),
        ),
        (
            "bare CR in a header value",
            format!("GET /case HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n{hidden}"),
        ),
        (
            "bare CR as line end",
            format!("GET /case HTTP/1.1\r\nHost: x\rX-A: b\r\n\r\n{hidden}"),
        ),
        (
            "space in the request target",
            format!("GET /ca se HTTP/1.1\r\nHost: x\r\n\r\n{hidden}"),
        ),
        (
            "tab in the request target",
            format!("GET /ca\tse HTTP/1.1\r\nHost: x\r\n\r\n{hidden}"),
        ),
        (
            "quote in the request target",
            format!("GET /ca\"se HTTP/1.1\r\nHost: x\r\n\r\n{hidden}"),
        ),
        // The fuzzer's find (issue 46): a target has no fragment (RFC 9112 §3.2), and the
        // URI parser would drop it, so the backend would see another target than sent.
        (
            "fragment in the request target",
            format!("GET /case#x HTTP/1.1\r\nHost: x\r\n\r\n{hidden}"),
        ),
        (
            "fragment after a query",
            format!("GET /case?a=1#frag HTTP/1.1\r\nHost: x\r\n\r\n{hidden}"),
        ),
    ];
    let mut failures = Vec::new();
    for (i, (what, raw)) in cases.iter().enumerate() {
        let mut c = Conn::open(&p.addr()).expect("connect");
        let _ = c.write_raw(raw.as_bytes());
        match c.read_response() {
            Ok(r) if r.status == 400 => {
                if !r
                    .header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close"))
                {
                    failures.push(format!("{what}: 400 without Connection: close"));
                }
            }
            Ok(r) => failures.push(format!("{what}: status {} (want 400)", r.status)),
            Err(e) => failures.push(format!("{what}: no response ({e})")),
        }
        if !closed_within(&mut c, Duration::from_secs(5)) {
            failures.push(format!("{what}: connection left open"));
        }
        let marker = format!("/marker-{i}");
        flush_marker(&p, &b, &marker);
        let paths = b.received_paths();
        if paths
            .iter()
            .any(|p| p.starts_with("/ca") || p == "/smuggled")
        {
            failures.push(format!("{what}: forwarded {paths:?}"));
        }
        b.reset_counters();
    }
    assert!(
        failures.is_empty(),
        "framing failures:\n{}",
        failures.join("\n")
    );
}

#[test]
fn http10_without_keepalive_is_answered_close_and_closed() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));

    let mut c = Conn::open(&p.addr()).expect("connect");
    c.write_raw(b"GET /ten HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("write");
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("connection")
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("close"),
        "{:?}",
        r.headers
    );
    assert!(
        closed_within(&mut c, Duration::from_secs(5)),
        "an HTTP/1.0 request without keep-alive must see the connection closed"
    );

    // With an explicit `Connection: keep-alive` the connection is reused.
    let mut c = Conn::open(&p.addr()).expect("connect");
    for path in ["/ka1", "/ka2"] {
        c.write_raw(
            format!("GET {path} HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n").as_bytes(),
        )
        .expect("write");
        let r = c.read_response().expect("response");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-echo-path"), Some(path));
    }
}

/// An HTTP/1.0 request without `Host` (a load balancer's health check, `openssl
/// s_time`) reaches a real nginx and is answered 200, as through HAProxy. Pingora sends
/// every upstream request as HTTP/1.1, which requires `Host`; nginx answers such a
/// request 400. With a `Host` it goes up as HTTP/1.1, as before.
#[test]
fn http10_without_host_is_forwarded_as_http10_not_refused_upstream() {
    let nginx = Nginx::start();
    let conf = format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{}\"]\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        nginx.http_addr
    );
    let p = Proxy::start(&conf);
    let cases: [(&[u8], &str); 4] = [
        (
            b"GET /h HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            "nginx HTTP/1.0 host=[]\n",
        ),
        (b"GET /a HTTP/1.0\r\n\r\n", "nginx HTTP/1.0 host=[]\n"),
        (
            b"GET /b HTTP/1.0\r\nHost: x\r\n\r\n",
            "nginx HTTP/1.1 host=[x]\n",
        ),
        (
            b"GET /c HTTP/1.1\r\nHost: y\r\n\r\n",
            "nginx HTTP/1.1 host=[y]\n",
        ),
    ];
    // Twice: the second round runs over whatever upstream connections the first left.
    for round in 0..2 {
        for (request, body) in cases {
            match send_raw(&p.addr(), request) {
                RawOutcome::Response(r) => assert_eq!(
                    (r.status, r.body_str().as_str()),
                    (200, body),
                    "round {round}: {}",
                    String::from_utf8_lossy(request)
                ),
                other => panic!("round {round}: no response: {other:?}"),
            }
        }
    }
}

/// Sends `request` on a fresh connection and reads until the proxy closes it:
/// (status line and fields, lower-cased; body). Fails if it is not closed in time.
fn exchange_until_closed(addr: &str, request: &[u8]) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(request).expect("write");
    let mut all = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut all).unwrap_or_else(|e| {
        panic!(
            "not closed after the response ({e}); got {:?}",
            String::from_utf8_lossy(&all)
        )
    });
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header block: {:?}", String::from_utf8_lossy(&all)));
    let head = String::from_utf8_lossy(&all[..end]).to_ascii_lowercase();
    (head, all[end + 4..].to_vec())
}

/// An HTTP/1.0 client never gets `Transfer-Encoding` (RFC 9112 §6.1): it would read
/// the chunk sizes as body. Pingora makes a close-delimited upstream body chunked, and
/// passes a chunked one on, for any client. Both now reach an HTTP/1.0 client decoded
/// and delimited by the close, whether or not it asked for keep-alive; an HTTP/1.1
/// client still gets them chunked on a kept connection.
#[test]
fn http10_clients_never_get_a_chunked_response() {
    let chunked = fixed_response_backend(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    );
    let closing = closing_response_backend(b"HTTP/1.0 200 OK\r\nX-Kind: close\r\n\r\nhello world");
    let gzip = fixed_response_backend(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    let conf = format!(
        "[[upstreams]]\nname = \"chunked\"\nbackends = [\"{chunked}\"]\n\
         [[upstreams]]\nname = \"closing\"\nbackends = [\"{closing}\"]\n\
         [[upstreams]]\nname = \"gzip\"\nbackends = [\"{gzip}\"]\n\
         [[routes]]\npath_prefix = \"/chunked\"\nupstream = \"chunked\"\n\
         [[routes]]\npath_prefix = \"/closing\"\nupstream = \"closing\"\n\
         [[routes]]\npath_prefix = \"/gzip\"\nupstream = \"gzip\"\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n"
    );
    let p = Proxy::start(&conf);
    for path in ["/chunked", "/closing"] {
        for extra in ["", "Connection: keep-alive\r\n", "Host: x\r\n"] {
            let request = format!("GET {path} HTTP/1.0\r\n{extra}\r\n");
            let (head, body) = exchange_until_closed(&p.addr(), request.as_bytes());
            assert!(head.starts_with("http/1.1 200 "), "{request:?}: {head}");
            assert!(
                !head.contains("transfer-encoding"),
                "{request:?} got {head}"
            );
            assert!(
                head.contains("\r\nconnection: close"),
                "{request:?}: {head}"
            );
            assert_eq!(body, b"hello world", "{request:?}: {head}");
        }
        // HTTP/1.1: chunked, and the connection is kept for a second request.
        let mut c = Conn::open(&p.addr()).expect("connect");
        for _ in 0..2 {
            c.write_raw(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .expect("write");
            let r = c.read_response().expect("response");
            assert_eq!((r.status, r.body_str().as_str()), (200, "hello world"));
            assert_eq!(r.header("transfer-encoding"), Some("chunked"), "{path}");
        }
    }
    // A coding besides chunked cannot reach an HTTP/1.0 client undeclared: 502, as
    // HAProxy answers it. An HTTP/1.1 client gets it as the upstream sent it.
    let (head, _) = exchange_until_closed(&p.addr(), b"GET /gzip HTTP/1.0\r\n\r\n");
    assert!(head.starts_with("http/1.1 502 "), "{head}");
    let r = p.get("/gzip", &[]);
    assert_eq!(
        (r.status, r.header("transfer-encoding")),
        (200, Some("gzip, chunked"))
    );
    // A HEAD answer has no body: the connection an HTTP/1.0 client asked to keep stays,
    // and the GET after it is answered on it.
    let mut s = TcpStream::connect(p.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"HEAD /chunked HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = std::io::Read::read(&mut s, &mut byte).expect("read the HEAD answer");
        assert_eq!(
            n,
            1,
            "closed after HEAD: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200 "), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    s.write_all(b"GET /chunked HTTP/1.0\r\n\r\n")
        .expect("write");
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut rest).expect("the GET answered, then closed");
    assert!(
        rest.ends_with(b"\r\n\r\nhello world"),
        "{:?}",
        String::from_utf8_lossy(&rest)
    );
}

/// A 204 carries neither `Content-Length` nor `Transfer-Encoding` (RFC 9110 §8.6,
/// RFC 9112 §6.1), whatever the upstream sent, and the connection stays usable. Over
/// HTTP/2 a stray `Content-Length: 5` with no DATA was a stream error for the client.
#[test]
fn a_204_reaches_the_client_without_length_fields() {
    let raw = fixed_response_backend(
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\nX-Kind: empty\r\n\r\n",
    );
    let p = Proxy::start_with_server(
        "h2c = true\n",
        &format!(
            "[[upstreams]]\nname = \"app\"\nbackends = [\"{raw}\"]\n\
             [rate_limit]\nenabled = false\n[culling]\nenabled = false\n"
        ),
    );
    let url = format!("http://{}/empty", p.addr());
    let out = curl(&[
        "--http2-prior-knowledge",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_version}",
        &url,
    ]);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "204 2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = Conn::open(&p.addr()).expect("connect");
    for _ in 0..2 {
        c.write_raw(b"GET /empty HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let r = c.read_response().expect("response");
        assert_eq!((r.status, r.header("x-kind")), (204, Some("empty")));
        assert!(r.header("content-length").is_none(), "{:?}", r.headers);
        assert!(r.header("transfer-encoding").is_none(), "{:?}", r.headers);
    }
}

/// A 101 answers only a request that asked to upgrade: to any other it is an upstream
/// error (502, as HAProxy answers it), not a switch the client never asked for.
#[test]
fn an_unsolicited_101_is_a_502() {
    let raw = fixed_response_backend(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    );
    let p = Proxy::start(&format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{raw}\"]\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n"
    ));
    let r = p.get("/plain", &[]);
    assert_eq!(r.status, 502, "{:?}", r.headers);
}

#[test]
fn shed_503_to_http10_closes() {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start(&format!(
        r#"
{}
[[routes]]
path_prefix = "/"
upstream = "app"
priority = "critical"

[shedding]
max_concurrency = 1
"#,
        upstream(&b)
    ));
    let addr = p.addr();
    let held = thread::spawn(move || try_get(&addr, "/held", &[]).map(|r| r.status));
    eventually(
        DEADLINE,
        || "request not held".into(),
        || b.in_flight() == 1,
    );

    let mut c = Conn::open(&p.addr()).expect("connect");
    c.write_raw(b"GET /shed HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("write");
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert_eq!(
        r.header("connection")
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("close")
    );
    assert!(
        closed_within(&mut c, Duration::from_secs(5)),
        "a shed HTTP/1.0 request must see the connection closed"
    );
    b.release_all();
    assert_eq!(held.join().expect("join").expect("held request"), 200);
}

#[test]
fn pipelined_requests_are_all_answered_in_order() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));
    let mut c = Conn::open(&p.addr()).expect("connect");
    c.write_raw(
        b"GET /p1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /p2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /p3 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .expect("write");
    for path in ["/p1", "/p2", "/p3"] {
        let r = c
            .read_response()
            .unwrap_or_else(|e| panic!("no response for {path}: {e}"));
        assert_eq!(r.status, 200, "{path}: {}", r.body_str());
        assert_eq!(
            r.header("x-echo-path"),
            Some(path),
            "responses out of order"
        );
    }
    assert_eq!(b.received_paths(), vec!["/p1", "/p2", "/p3"]);
    assert_eq!(b.received()[1].body, b"hello");
    // the connection stays usable
    let r = c.request("GET", "/p4", &[], b"").expect("p4");
    assert_eq!(r.header("x-echo-path"), Some("/p4"));
}

const SECRETS: [&str; 5] = [
    "QKEYq8f3secret",
    "?api_key=",
    "AUTHZs3cr3tvalue",
    "COOKIEs3cr3tvalue",
    "XKEYs3cr3tvalue",
];

fn secret_lines(logs: &str) -> Vec<String> {
    logs.lines()
        .filter(|l| SECRETS.iter().any(|s| l.contains(s)))
        .map(|l| l.chars().take(300).collect())
        .collect()
}

/// Sends `bytes`, waits for `wait`, then drops the socket.
fn abort_after(addr: &str, bytes: &[u8], wait: impl FnOnce()) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(bytes).expect("write");
    wait();
    drop(s);
}

fn secret_request(path: &str) -> String {
    format!(
        "GET {path}?api_key=QKEYq8f3secret&x=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer AUTHZs3cr3tvalue\r\nCookie: sid=COOKIEs3cr3tvalue\r\nX-Api-Key: XKEYs3cr3tvalue\r\n\r\n"
    )
}

/// Drives upstream errors (refused, reset, timeout), a client abort while the backend
/// holds, aborts mid-body and mid-header, and a malformed request, all carrying secrets.
fn provoke_everything(p: &Proxy, b: &Backend, dead: &str) {
    let addr = p.addr();
    // upstream errors: backend closes without answering
    b.set_mode(Mode::Close);
    let out = send_raw(&addr, secret_request("/close").as_bytes());
    assert!(out.status().is_some_and(|s| s >= 500), "{out:?}");
    // a connect failure (the second upstream points at a closed port)
    let out = send_raw(&addr, secret_request("/dead").as_bytes());
    assert!(out.status().is_some_and(|s| s >= 500), "{out:?} via {dead}");
    // client abort while the backend holds the request
    b.set_mode(Mode::Hold);
    let before = b.requests();
    abort_after(&addr, secret_request("/held").as_bytes(), || {
        eventually(
            DEADLINE,
            || "held request never arrived".into(),
            || b.requests() > before,
        )
    });
    // abort mid-body
    let head = "POST /body?api_key=QKEYq8f3secret HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer AUTHZs3cr3tvalue\r\nCookie: sid=COOKIEs3cr3tvalue\r\nContent-Length: 1000\r\n\r\n0123456789";
    b.set_mode(Mode::Ok);
    abort_after(&addr, head.as_bytes(), || {
        thread::sleep(Duration::from_millis(200));
    });
    // abort mid-header
    abort_after(
        &addr,
        b"GET /hdr?api_key=QKEYq8f3secret HTTP/1.1\r\nAuthorization: Bearer AUTHZs3cr3tvalue\r\nCookie: sid=COOKIEs3cr3tvalue\r\n",
        || thread::sleep(Duration::from_millis(200)),
    );
    // malformed request carrying secrets (Pingora's parse error holds the raw buffer)
    let out = send_raw(
        &addr,
        b"GET /bad?api_key=QKEYq8f3secret HTTP/1.1\r\nAuthorization: Bearer AUTHZs3cr3tvalue\r\nCookie: sid=COOKIEs3cr3tvalue\r\nBad Header: x\r\n\r\n",
    );
    assert_eq!(out.status(), Some(400), "{out:?}");
    b.release_all();
    b.set_mode(Mode::Ok);
}

fn secret_config(b: &Backend, dead: &str) -> String {
    format!(
        r#"
[[upstreams]]
name = "app"
backends = ["{}"]
read_timeout_ms = 2000

[[upstreams]]
name = "dead"
backends = ["{dead}"]
connect_timeout_ms = 300

[[routes]]
path_prefix = "/dead"
upstream = "dead"

[[routes]]
path_prefix = "/"
upstream = "app"

[rate_limit]
key = "query:api_key"
limit = 1000
"#,
        b.addr()
    )
}

#[test]
fn no_log_line_carries_a_secret_at_any_level_or_filter() {
    let dead = format!("127.0.0.1:{}", free_port());
    for filter in [
        "trace",
        "info,pingora_proxy::proxy_h1=trace,pingora_core=trace",
        "info,pingora_proxy=trace,pingora_core::protocols::http::v1::server=trace,pingora=trace",
    ] {
        let b = Backend::start("app");
        let p = Proxy::start_with_env(&secret_config(&b, &dead), &[("RUST_LOG", filter)]);
        provoke_everything(&p, &b, &dead);
        // every provoked request has been logged once the counters moved
        eventually(
            DEADLINE,
            || format!("requests not accounted:\n{}", p.metrics()),
            || {
                p.metric(r#"portcullis_requests_total{outcome="upstream_error"}"#)
                    .unwrap_or(0.0)
                    + p.metric(r#"portcullis_requests_total{outcome="no_backend"}"#)
                        .unwrap_or(0.0)
                    >= 2.0
            },
        );
        let logs = p.logs();
        assert!(
            logs.lines().count() > 5,
            "RUST_LOG={filter}: expected some log output, got:\n{logs}"
        );
        let bad = secret_lines(&logs);
        assert!(
            bad.is_empty(),
            "RUST_LOG={filter}: {} log lines carry a secret, e.g.:\n{}",
            bad.len(),
            bad.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
        );
    }
}

fn error_or_warn_lines(logs: &str) -> Vec<String> {
    logs.lines()
        .filter(|l| l.contains("\"level\":\"ERROR\"") || l.contains("\"level\":\"WARN\""))
        .map(str::to_string)
        .collect()
}

#[test]
fn client_aborts_are_counted_not_logged_as_errors() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));
    let addr = p.addr();
    let aborts = || {
        p.metric("portcullis_client_aborts_total")
            .unwrap_or_else(|| panic!("portcullis_client_aborts_total missing:\n{}", p.metrics()))
    };
    assert_eq!(aborts(), 0.0);

    // 1. while the backend holds the request
    b.set_mode(Mode::Hold);
    abort_after(&addr, b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n", || {
        eventually(
            DEADLINE,
            || "held request never arrived".into(),
            || b.in_flight() == 1,
        )
    });
    eventually(
        DEADLINE,
        || format!("abort 1 not counted: {}", aborts()),
        || aborts() >= 1.0,
    );
    b.release_all();
    b.set_mode(Mode::Ok);

    // 2. mid-body
    abort_after(
        &addr,
        b"POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789",
        || {
            eventually(
                DEADLINE,
                || "body request never arrived".into(),
                || b.requests() >= 2,
            )
        },
    );
    eventually(
        DEADLINE,
        || format!("abort 2 not counted: {}", aborts()),
        || aborts() >= 2.0,
    );

    // 3. mid-header
    abort_after(&addr, b"GET /hdr HTTP/1.1\r\nHost: x\r\nX-A: b", || {
        thread::sleep(Duration::from_millis(100))
    });
    eventually(
        DEADLINE,
        || format!("abort 3 not counted: {}", aborts()),
        || aborts() >= 3.0,
    );

    // the proxy still serves, and nothing above was an ERROR or WARN
    assert_eq!(p.get("/ok", &[]).status, 200);
    let bad = error_or_warn_lines(&p.logs());
    assert!(
        bad.is_empty(),
        "client aborts logged as errors:\n{}",
        bad.join("\n")
    );
}

/// An upstream failure is still logged (at ERROR/WARN) — the suppression above is for
/// client aborts only — and the line names the error, not the request's secrets.
#[test]
fn upstream_errors_are_still_logged_without_secrets() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));
    b.set_mode(Mode::Close);
    let out = send_raw(&p.addr(), secret_request("/close").as_bytes());
    assert!(out.status().is_some_and(|s| s >= 500), "{out:?}");
    eventually(
        DEADLINE,
        || format!("no error line for the upstream failure:\n{}", p.logs()),
        || !error_or_warn_lines(&p.logs()).is_empty(),
    );
    let logs = p.logs();
    assert!(secret_lines(&logs).is_empty(), "{logs}");
}

/// A target the client percent-encoded itself is forwarded as sent; the same target
/// sent with a raw space (which Pingora would rewrite to the same `%20`) is refused,
/// even right after the encoded one on the same connection.
#[test]
fn encoded_target_passes_raw_space_does_not() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));
    let mut c = Conn::open(&p.addr()).expect("connect");
    let r = c.request("GET", "/x%20y?q=%22", &[], b"").expect("encoded");
    assert_eq!(r.status, 200);
    assert_eq!(b.received_paths(), vec!["/x%20y?q=%22"]);
    c.write_raw(b"GET /x y?q=\" HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let r = c.read_response().expect("response");
    assert_eq!(r.status, 400, "{}", r.body_str());
    assert!(closed_within(&mut c, Duration::from_secs(5)));
    assert_eq!(b.received_paths(), vec!["/x%20y?q=%22"]);
}

/// Found by the differential target (fuzz/differential/FINDINGS.md): a request target in
/// none of the forms of RFC 9112 §3.2 (`?q`, `` `/a``, `{/a`, `%00/a`, `x`) went upstream
/// as it came, for the backend to read as it liked (`/?q`, `/a`, …); HAProxy answers 400.
/// The four forms still pass.
#[test]
fn a_target_in_no_request_target_form_is_refused() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));
    for target in ["?q", "`/put", "{/t", "%00/up", "x"] {
        let mut c = Conn::open(&p.addr()).expect("connect");
        c.write_raw(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .expect("write");
        let r = c.read_response().expect("response");
        assert_eq!(r.status, 400, "{target}: {}", r.body_str());
    }
    for (request, path) in [
        (
            &b"GET /origin?q HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            "/origin?q",
        ),
        (
            b"GET http://x/absolute HTTP/1.1\r\nHost: x\r\n\r\n",
            "/absolute",
        ),
        (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", "*"),
    ] {
        let mut c = Conn::open(&p.addr()).expect("connect");
        c.write_raw(request).expect("write");
        let r = c.read_response().expect("response");
        assert_eq!(r.status, 200, "{path}: {}", r.body_str());
        eventually(
            DEADLINE,
            || format!("backend never saw {path}: {:?}", b.received_paths()),
            || b.received_paths().iter().any(|p| p.ends_with(path)),
        );
    }
    flush_marker(&p, &b, "/after-forms");
    let paths = b.received_paths();
    assert!(
        paths
            .iter()
            .all(|p| ["/origin?q", "*", "/after-forms"].contains(&p.as_str())
                || p.ends_with("/absolute")),
        "nothing in no form may reach the backend: {paths:?}"
    );
}

/// Found by the differential target (fuzz/differential/FINDINGS.md; vendor patch 0025): a
/// chunk-size line without a hex digit (`\r\n` where the size belongs) was read as the last
/// chunk, and the request went upstream with an empty body while a hop that skips the
/// stray line reads `hello`. RFC 9112 §7.1: chunk-size = 1*HEXDIG. HAProxy answers 400.
#[test]
fn a_chunk_size_without_a_digit_is_refused() {
    let b = Backend::start("app");
    let p = Proxy::start(&upstream(&b));
    for body in [
        &b"\r\n5\r\nhello\r\n0\r\n\r\n"[..],
        b";x\r\n5\r\nhello\r\n0\r\n\r\n",
    ] {
        let mut c = Conn::open(&p.addr()).expect("connect");
        let mut req =
            b"POST /nodigit HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        req.extend_from_slice(body);
        c.write_raw(&req).expect("write");
        let r = c.read_response().expect("response");
        assert_eq!(
            r.status,
            400,
            "{:?}: {}",
            String::from_utf8_lossy(body),
            r.body_str()
        );
        assert!(closed_within(&mut c, Duration::from_secs(5)));
    }
    let r = post(&p.addr(), "/digits", &[], b"hello");
    assert_eq!(r.status, 200, "{}", r.body_str());
    flush_marker(&p, &b, "/after-nodigit");
    assert!(
        !b.received_paths().iter().any(|p| p == "/nodigit"),
        "no /nodigit request may reach the backend as a complete one: {:?}",
        b.received_paths()
    );
}
