//! Connections that never close (issue 40, items 2–6; CONTRACT §17): idle HTTP/2 and
//! HTTP/1.1 keep-alive connections (`idle_timeout_ms`, GOAWAY NO_ERROR), the header
//! deadline from `accept` on an h2c listener and over HTTP/2 (after the preface, a
//! half-sent header block), the h2c peek (an 18-byte HTTP/1.0 request; a PROXY header
//! and the request in one write), stalled TLS handshakes (`tls_handshake_timeout_ms`,
//! counted against `max_connections`, logged once per interval) and the admin listener
//! (header deadline, `admin_max_connections`). Real binary, raw sockets, `openssl
//! s_client`; every wait is a poll with a deadline.

use portcullis_test_kit as support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn settings() -> Vec<u8> {
    frame(0x4, 0, 0, &[])
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Reads (and drops) what the peer sends until it closes the connection: the time that
/// took and the bytes read, or `None` if it was still open after `timeout`.
fn closed_within(s: &mut TcpStream, timeout: Duration) -> Option<(Duration, Vec<u8>)> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        s.set_read_timeout(Some(left)).expect("timeout");
        match s.read(&mut buf) {
            Ok(0) => return Some((start.elapsed(), got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None
            }
            Err(_) => return Some((start.elapsed(), got)),
        }
    }
}

/// One whole HTTP/2 GET on a raw h2c connection: preface, SETTINGS, HEADERS; reads
/// until the response HEADERS came.
fn h2c_request(addr: &str) -> H2Raw {
    let mut h = H2Raw::connect(addr);
    h.headers(1, &H2Raw::request_block("x", "/", &[]))
        .expect("headers");
    let seen = h.read_until(DEADLINE, |s| !s.responses.is_empty() || s.closed);
    assert_eq!(seen.responses, vec![1], "no response: {seen:?}");
    h
}

/// Whether a fresh plain connection to `addr` gets an HTTP/1.1 response (false: it was
/// closed without one, as a connection beyond `max_connections` is).
fn answered(addr: &str) -> bool {
    let Ok(mut c) = Conn::open_with_timeout(addr, Duration::from_secs(5)) else {
        return false;
    };
    c.request("GET", "/probe", &[], b"")
        .is_ok_and(|r| r.status == 200)
}

/// Waits until no client connection is open on the proxy listeners (the readiness
/// probe's connections would take slots of `max_connections` for a moment).
fn wait_no_connections(p: &Proxy) {
    let open = || p.metric("portcullis_client_connections").unwrap_or(-1.0);
    eventually(DEADLINE, || format!("{} open", open()), || open() == 0.0);
}

#[test]
fn idle_h2c_connections_get_goaway_after_idle_timeout_and_free_max_connections() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server(
        "h2c = true\nmax_connections = 300\nidle_timeout_ms = 500",
        &one_upstream(&b),
    );
    wait_no_connections(&p);
    // 300 connections, each idle after one request: every slot taken.
    let mut idle: Vec<H2Raw> = (0..300).map(|_| h2c_request(&p.addr())).collect();
    // Each is closed with GOAWAY NO_ERROR once nothing was in flight for 500 ms.
    for h in &mut idle {
        let seen = h.read_until(DEADLINE, |s| s.closed);
        assert!(seen.closed, "an idle h2c connection stayed open: {seen:?}");
        assert_eq!(seen.goaway, Some(0), "GOAWAY NO_ERROR first: {seen:?}");
    }
    // The slots are free again: a new client is served.
    eventually(
        DEADLINE,
        || "no slot freed for a new client".into(),
        || answered(&p.addr()),
    );
}

#[test]
fn a_connection_at_max_connections_is_refused_until_idle_h2c_ones_time_out() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server(
        "h2c = true\nmax_connections = 20\nidle_timeout_ms = 1500",
        &one_upstream(&b),
    );
    wait_no_connections(&p);
    let _idle: Vec<H2Raw> = (0..20).map(|_| h2c_request(&p.addr())).collect();
    assert!(!answered(&p.addr()), "a 21st connection was served");
    let start = Instant::now();
    eventually(
        DEADLINE,
        || "idle h2c connections kept every slot".into(),
        || answered(&p.addr()),
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn http11_keepalive_is_closed_after_idle_timeout() {
    let b = Backend::start("app");
    // keepalive_timeout_seconds stays at its default (60): the shorter one applies.
    let p = Proxy::start_with_server("idle_timeout_ms = 400", &one_upstream(&b));
    let mut c = Conn::open(&p.addr()).expect("connect");
    let r = c.request("GET", "/ka", &[], b"").expect("response");
    assert_eq!(r.status, 200);
    let start = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || c
            .is_closed_by_peer(Duration::from_millis(100))),
        "an idle keep-alive connection stayed open"
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[test]
fn http2_header_deadline_runs_from_accept_and_over_a_half_sent_header_block() {
    let b = Backend::start("app");
    // idle_timeout is long: what closes these is the header deadline.
    let p = Proxy::start_with_server(
        "h2c = true\nclient_header_timeout_ms = 700\nidle_timeout_ms = 60000",
        &one_upstream(&b),
    );
    let block = H2Raw::request_block("x", "/half", &[]);
    let (head, tail) = block.split_at(block.len() / 2);

    // Idle after the preface: no request within the header deadline.
    let mut s = connect(&p.addr());
    s.write_all(&[PREFACE, &settings()].concat())
        .expect("preface");
    let (took, _) =
        closed_within(&mut s, Duration::from_secs(10)).expect("idle after the preface: still open");
    assert!(
        took >= Duration::from_millis(500),
        "closed too soon: {took:?}"
    );

    // The first header block half sent (HEADERS without END_HEADERS).
    let mut s = connect(&p.addr());
    s.write_all(&[PREFACE, &settings(), &frame(0x1, 0x1, 1, head)].concat())
        .expect("half a header block");
    closed_within(&mut s, Duration::from_secs(10)).expect("half-sent first block: still open");

    // HEADERS with END_HEADERS whose payload is half sent.
    let mut s = connect(&p.addr());
    let whole = frame(0x1, 0x5, 1, &block);
    s.write_all(&[PREFACE, &settings(), &whole[..9 + head.len()]].concat())
        .expect("half a HEADERS frame");
    closed_within(&mut s, Duration::from_secs(10)).expect("half a HEADERS frame: still open");

    // After a whole request: a later header block half sent, then a CONTINUATION that
    // does not end it.
    let mut h = h2c_request(&p.addr());
    h.write_frames(&[frame(0x1, 0x1, 3, head)])
        .expect("half block");
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    h.write_frames(&[frame(0x9, 0, 3, &tail[..1])])
        .expect("a CONTINUATION without END_HEADERS");
    let seen = h.read_until(Duration::from_secs(10), |s| s.closed);
    assert!(seen.closed, "a half-sent header block held the connection");
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "{:?}",
        start.elapsed()
    );

    // A connection that finishes its header blocks in time is served and stays open.
    let mut h = h2c_request(&p.addr());
    h.write_frames(&[frame(0x1, 0x1, 3, head)])
        .expect("half block");
    h.write_frames(&[frame(0x9, 0x4, 3, tail)])
        .expect("the rest");
    let seen = h.read_until(DEADLINE, |s| !s.responses.is_empty() || s.closed);
    assert_eq!(seen.responses, vec![3], "{seen:?}");
    let seen = h.read_until(Duration::from_millis(1500), |s| s.closed);
    assert!(!seen.closed, "closed with no header block open");
}

#[test]
fn h2c_listener_times_out_silent_clients_and_answers_a_short_http10_request() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server(
        "h2c = true\nclient_header_timeout_ms = 600",
        &one_upstream(&b),
    );
    // Silent: closed after the header deadline.
    let mut s = connect(&p.addr());
    let (took, _) = closed_within(&mut s, Duration::from_secs(10))
        .expect("a silent h2c connection stayed open");
    assert!(took >= Duration::from_millis(400), "{took:?}");
    // Part of the preface, then nothing.
    let mut s = connect(&p.addr());
    s.write_all(&PREFACE[..10]).expect("write");
    closed_within(&mut s, Duration::from_secs(10)).expect("a partial preface stayed open");

    // A whole HTTP/1.0 request of 18 bytes, shorter than the preface: answered.
    let mut s = connect(&p.addr());
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
    let (_, got) = closed_within(&mut s, Duration::from_secs(10))
        .expect("an HTTP/1.0 request on an h2c listener was not answered");
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
        "{text}"
    );
    assert_eq!(b.requests(), 1);

    // HTTP/2 with prior knowledge still works there.
    h2c_request(&p.addr());
}

#[test]
fn three_hundred_silent_h2c_connections_lock_nobody_out_after_the_header_deadline() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server(
        "h2c = true\nmax_connections = 300\nclient_header_timeout_ms = 800",
        &one_upstream(&b),
    );
    wait_no_connections(&p);
    let mut silent: Vec<TcpStream> = (0..300).map(|_| connect(&p.addr())).collect();
    let open = || p.metric("portcullis_client_connections").unwrap_or(-1.0);
    eventually(
        Duration::from_secs(5),
        || format!("{} open", open()),
        || open() == 300.0,
    );
    assert!(!answered(&p.addr()), "a 301st connection was served");
    for s in &mut silent {
        closed_within(s, Duration::from_secs(10)).expect("a silent h2c connection stayed open");
    }
    eventually(DEADLINE, || "no slot freed".into(), || answered(&p.addr()));
}

#[test]
fn proxy_header_and_request_in_one_write_on_h2c_is_http11() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server(
        "h2c = true\ntrusted_proxies = [\"127.0.0.2\"]\nproxy_protocol = true",
        &one_upstream(&b),
    );
    let mut c = Conn::open_from(&p.addr(), "127.0.0.2").expect("connect");
    c.write_raw(
        b"PROXY TCP4 203.0.113.9 127.0.0.1 40000 80\r\nGET /one-write HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .expect("write");
    let r = c.read_response().expect("an HTTP/1.1 response");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(b.requests(), 1);

    // The same with an h2c preface behind the PROXY header is HTTP/2.
    let mut h = H2Raw::connect_from(
        &p.addr(),
        "127.0.0.2",
        b"PROXY TCP4 203.0.113.9 127.0.0.1 40001 80\r\n",
    );
    h.headers(1, &H2Raw::request_block("x", "/h2", &[]))
        .expect("headers");
    let seen = h.read_until(DEADLINE, |s| !s.responses.is_empty() || s.closed);
    assert_eq!(seen.responses, vec![1], "{seen:?}");
}

/// A TLS connection that sent part of a ClientHello and then nothing.
fn half_client_hello(addr: &str) -> TcpStream {
    let mut s = connect(addr);
    // a handshake record announcing 512 bytes, with only the first few
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01])
        .expect("write");
    s
}

/// A proxy in front of one backend, also listening with TLS (a certificate for
/// `tls.test`) on `tls_addr`.
struct TlsProxy {
    proxy: Proxy,
    tls_addr: String,
    _backend: Backend,
    _cert_dir: tempfile::TempDir,
}

/// A [`TlsProxy`] with `server` as its `[server]` settings.
fn tls_proxy(server: &str) -> TlsProxy {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = make_cert(dir.path(), "c", "tls.test", &["tls.test"]);
    let backend = Backend::start("app");
    let tls_addr = format!("127.0.0.1:{}", free_port());
    let config = one_upstream(&backend) + &tls_table(&tls_addr, "1.2", &[&cert]);
    TlsProxy {
        proxy: Proxy::start_with_server(server, &config),
        tls_addr,
        _backend: backend,
        _cert_dir: dir,
    }
}

#[test]
fn stalled_tls_handshakes_count_against_max_connections_and_time_out() {
    let t = tls_proxy("max_connections = 4\ntls_handshake_timeout_ms = 1000");
    let (p, tls_addr) = (&t.proxy, &t.tls_addr);
    wait_no_connections(p);
    let open = || p.metric("portcullis_client_connections").unwrap_or(-1.0);
    let mut stalled: Vec<TcpStream> = (0..4).map(|_| half_client_hello(tls_addr)).collect();
    // Counted from accept: every slot is taken, the plain listener refuses.
    eventually(
        Duration::from_secs(5),
        || format!("handshakes in progress did not count ({} open)", open()),
        || open() == 4.0,
    );
    assert!(!answered(&p.addr()), "a 5th connection was served");
    let start = Instant::now();
    for s in &mut stalled {
        let (took, _) = closed_within(s, Duration::from_secs(10))
            .expect("a stalled handshake was held past tls_handshake_timeout_ms");
        assert!(took < Duration::from_secs(10));
    }
    assert!(start.elapsed() < Duration::from_secs(10));
    eventually(DEADLINE, || "no slot freed".into(), || answered(&p.addr()));
    // A real handshake still works.
    let out = tls_exchange(
        tls_addr,
        "tls.test",
        b"GET /tls HTTP/1.1\r\nHost: tls.test\r\nConnection: close\r\n\r\n",
    );
    assert!(out.contains("HTTP/1.1 200"), "{out}");

    // Four failures, one log line (logged once per interval, not once each), and none
    // of Pingora's per-connection ERROR lines.
    eventually(
        DEADLINE,
        || p.logs(),
        || p.logs().contains("tls_handshake_failed"),
    );
    let logs = p.logs();
    assert_eq!(logs.matches("tls_handshake_failed").count(), 1, "{logs}");
    assert!(!logs.contains("Downstream handshake"), "{logs}");
}

#[test]
fn a_flood_of_half_sent_client_hellos_is_capped_timed_out_and_logged_once() {
    let t = tls_proxy("max_connections = 100\ntls_handshake_timeout_ms = 1500");
    let (p, tls_addr) = (&t.proxy, &t.tls_addr);
    wait_no_connections(p);
    let mut flood: Vec<TcpStream> = (0..400).map(|_| half_client_hello(tls_addr)).collect();
    let open = || p.metric("portcullis_client_connections").unwrap_or(-1.0);
    // 100 held, the other 300 closed at once (before their handshake).
    eventually(
        Duration::from_secs(5),
        || format!("{} open", open()),
        || open() == 100.0,
    );
    // The admin listener is separate: /healthz answers during the flood.
    assert_eq!(p.admin_get("/healthz").status, 200);
    // Every flood connection is closed, the held ones after the handshake timeout.
    for s in &mut flood {
        closed_within(s, Duration::from_secs(10)).expect("a flood connection stayed open");
    }
    eventually(DEADLINE, || "no slot freed".into(), || answered(&p.addr()));
    let logs = p.logs();
    assert!(logs.matches("tls_handshake_failed").count() <= 2, "{logs}");
    assert!(!logs.contains("Downstream handshake"), "{logs}");
    assert!(
        p.metric(r#"portcullis_edge_refusals_total{reason="connection_limit"}"#)
            .unwrap_or(0.0)
            >= 300.0
    );
}

#[test]
fn an_idle_http2_connection_over_tls_is_closed_after_the_header_deadline() {
    // openssl s_client negotiates h2 and sends the preface and SETTINGS, then no
    // request; it exits when the proxy closes the connection.
    let t = tls_proxy("client_header_timeout_ms = 800\nidle_timeout_ms = 60000");
    let tls_addr = &t.tls_addr;
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-alpn",
            "h2",
            "-servername",
            "tls.test",
            "-connect",
        ])
        .arg(tls_addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(&[PREFACE, &settings()].concat())
        .expect("preface over TLS");
    let start = Instant::now();
    let exited = wait_until(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(stdin);
    assert!(exited, "an idle HTTP/2 connection over TLS stayed open");
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn admin_slowloris_is_closed_after_the_header_deadline() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server("client_header_timeout_ms = 600", &one_upstream(&b));
    let mut s = connect(&p.admin_addr());
    s.write_all(b"GET /healthz HTTP/1.1\r\nHo").expect("write");
    let start = Instant::now();
    let (_, got) = closed_within(&mut s, Duration::from_secs(10))
        .expect("an admin slowloris was held past the header deadline");
    assert!(start.elapsed() >= Duration::from_millis(400));
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 408"));
    // Silent too.
    let mut s = connect(&p.admin_addr());
    closed_within(&mut s, Duration::from_secs(10)).expect("a silent admin connection stayed open");
    // A keep-alive client idle between scrapes is not sent a 408 (it is closed after
    // the idle timeout, quietly) and its second request is answered.
    let mut c = Conn::open(&p.admin_addr()).expect("connect");
    assert_eq!(
        c.request("GET", "/healthz", &[], b"")
            .expect("first")
            .status,
        200
    );
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(
        c.request("GET", "/healthz", &[], b"")
            .expect("second")
            .status,
        200
    );
}

#[test]
fn admin_max_connections_is_enforced() {
    let b = Backend::start("app");
    let p = Proxy::start_with_server("admin_max_connections = 3", &one_upstream(&b));
    let mut held: Vec<TcpStream> = (0..3).map(|_| connect(&p.admin_addr())).collect();
    let get = |addr: &str, path: &str| {
        Conn::open_with_timeout(addr, Duration::from_secs(5))
            .and_then(|mut c| c.request("GET", path, &[], b""))
            .map(|r| r.status)
            .ok()
    };
    // At the cap, a few more connections are let in, for the probes only.
    eventually(
        Duration::from_secs(5),
        || "a 4th admin connection was served /status".into(),
        || get(&p.admin_addr(), "/status") == Some(503),
    );
    assert_eq!(get(&p.admin_addr(), "/healthz"), Some(200));
    assert_eq!(get(&p.admin_addr(), "/readyz"), Some(200));
    // Past the reserve, new connections are closed at once.
    held.extend((0..4).map(|_| connect(&p.admin_addr())));
    eventually(
        Duration::from_secs(5),
        || "an admin connection past the probes' reserve was served".into(),
        || get(&p.admin_addr(), "/healthz").is_none(),
    );
    // The proxy listener is not affected.
    assert!(answered(&p.addr()));
    drop(held);
    eventually(
        DEADLINE,
        || "admin slots not freed".into(),
        || get(&p.admin_addr(), "/status") == Some(200),
    );
}

#[test]
fn the_new_keys_are_validated() {
    for (key, bad) in [
        ("idle_timeout_ms", "0"),
        ("tls_handshake_timeout_ms", "0"),
        ("admin_max_connections", "0"),
    ] {
        let (code, _, stderr, _) = check_config(&format!(
            "[server]\n{key} = {bad}\n[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:1\"]\n"
        ));
        assert_ne!(code, 0, "{key} = {bad} accepted");
        assert!(stderr.contains(&format!("server.{key}")), "{stderr}");
    }
}
