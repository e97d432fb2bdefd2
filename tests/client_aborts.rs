//! Client aborts in the header phase (issue 41 item 5): counted by the edge stream,
//! which sees the client leave after part of a request header, not from Pingora's log
//! text. A client that leaves between requests, or before its first byte, is not an
//! abort; one that leaves mid-header is, once, and its line is not an ERROR.

use portcullis_test_kit as support;

use support::*;

fn aborts(p: &Proxy) -> f64 {
    p.metric("portcullis_client_aborts_total")
        .unwrap_or_else(|| panic!("portcullis_client_aborts_total missing:\n{}", p.metrics()))
}

/// Waits until the proxy has closed every client connection (so whatever their ends
/// count has been counted).
fn all_closed(p: &Proxy) {
    eventually(
        DEADLINE,
        || format!("connections still open:\n{}", p.metrics()),
        || p.metric("portcullis_client_connections") == Some(0.0),
    );
}

#[test]
fn only_a_client_that_leaves_mid_header_is_a_header_phase_abort() {
    let b = Backend::start("app");
    let p = Proxy::start(&one_upstream(&b));
    let addr = p.addr();

    // Not aborts: a keep-alive client that leaves between requests (no body, so
    // nothing is read while the request is in flight), and one that leaves
    // without sending a byte.
    {
        let mut c = Conn::open(&addr).expect("connect");
        assert_eq!(c.request("GET", "/one", &[], b"").expect("one").status, 200);
        assert_eq!(c.request("GET", "/two", &[], b"").expect("two").status, 200);
    }
    drop(Conn::open(&addr).expect("connect"));
    all_closed(&p);
    assert_eq!(aborts(&p), 0.0, "a clean leave counted as an abort");

    // An abort: the second request on a keep-alive connection, cut mid-header.
    {
        let mut c = Conn::open(&addr).expect("connect");
        assert_eq!(
            c.request("GET", "/three", &[], b"").expect("three").status,
            200
        );
        c.write_raw(b"GET /four HTTP/1.1\r\nHost: x\r\nX-A: b")
            .expect("partial header");
    }
    eventually(
        DEADLINE,
        || format!("mid-header abort not counted: {}", aborts(&p)),
        || aborts(&p) >= 1.0,
    );
    // And on a fresh connection, cut in the request line.
    {
        let mut c = Conn::open(&addr).expect("connect");
        c.write_raw(b"GET /fi").expect("partial request line");
    }
    eventually(
        DEADLINE,
        || format!("request-line abort not counted: {}", aborts(&p)),
        || aborts(&p) >= 2.0,
    );
    all_closed(&p);
    assert_eq!(p.get("/ok", &[]).status, 200);
    all_closed(&p);
    assert_eq!(aborts(&p), 2.0, "each abort counted once");
    assert!(
        b.requests() >= 4,
        "the backend served the complete requests"
    );
    let logs = p.logs();
    assert!(
        !logs
            .lines()
            .any(|l| l.contains("\"level\":\"ERROR\"") && l.contains("request headers")),
        "a header-phase abort logged as an error:\n{logs}"
    );
}
