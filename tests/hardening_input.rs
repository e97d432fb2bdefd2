//! Hostile input, third round (issue 40 items 9–14; CONTRACT §17): ambiguity is refused
//! with 400 and nothing forwarded, the PROXY header alone names the client, files that are
//! not regular never block a reload, route lookup does not grow with the routes, and idle
//! tunnels have their own timeout. Real binary, real sockets, a recording backend.

use portcullis_test_kit as support;

use std::time::Duration;
use support::*;

const LB: &str = "127.0.0.2";

fn upstream(b: &Backend) -> String {
    format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{}\"]\n\n",
        b.addr()
    )
}

fn no_limits(b: &Backend) -> String {
    format!(
        "{}[shedding]\nmax_concurrency = 0\n\n[rate_limit]\nenabled = false\n",
        upstream(b)
    )
}

// ---------------------------------------------------------------------------------------
// Item 10: one key header line holding a list, or a query key repeated with `;`
// ---------------------------------------------------------------------------------------

/// `X-Api-Key: a, b` is two values (RFC 9110 §5.3) and `?key=a;key=b` two parameters for
/// many frameworks: both counted as one new key before. Each is the duplicate-key refusal
/// now (400, the same body and outcome), and never forwarded.
#[test]
fn a_key_list_in_one_line_or_a_semicolon_repeat_is_refused() {
    let b = Backend::start("app");
    let rl =
        |key: &str| format!("[rate_limit]\nwindow_seconds = 3600\nlimit = 3\nkey = \"{key}\"\n");
    let ph = Proxy::start(&format!("{}{}", upstream(&b), rl("header:x-api-key")));
    let pq = Proxy::start(&format!("{}{}", upstream(&b), rl("query:key")));
    let pb = Proxy::start(&format!("{}{}", upstream(&b), rl("bearer")));

    for (i, v) in ["rnd-1, realkey", "a,b", "same, same"].iter().enumerate() {
        let r = ph.get(&format!("/dup-h{i}"), &[("X-Api-Key", v)]);
        assert_eq!(r.status, 400, "X-Api-Key: {v}: {r:?}");
        assert!(r.body_str().contains("API key"), "{:?}", r.body_str());
    }
    for (i, q) in ["key=a;key=b", "x=1;key=a&key=b", "key=a;key=a"]
        .iter()
        .enumerate()
    {
        let r = pq.get(&format!("/dup-q{i}?{q}"), &[]);
        assert_eq!(r.status, 400, "?{q}: {r:?}");
        assert!(r.body_str().contains("API key"), "{:?}", r.body_str());
    }
    let r = pb.get("/dup-b", &[("Authorization", "Bearer a, Bearer b")]);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        ph.metric("portcullis_requests_total{outcome=\"rejected\"}"),
        Some(3.0)
    );
    assert_eq!(b.requests(), 0, "a refused request reached the backend");

    // One value still passes, with `;` separating another parameter.
    assert_eq!(ph.get("/ok", &[("X-Api-Key", "realkey")]).status, 200);
    assert_eq!(pq.get("/ok?x=1;key=realkey", &[]).status, 200);
    assert_eq!(pb.get("/ok", &[("Authorization", "Bearer t")]).status, 200);
    let paths = b.received_paths();
    assert!(
        paths.iter().all(|p| !p.starts_with("/dup")),
        "the backend received a refused request: {paths:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Item 11: with proxy_protocol, X-Forwarded-For is never the client address
// ---------------------------------------------------------------------------------------

fn v2_local() -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
    h
}

/// A `LOCAL` (v2), `UNSPEC` (v2 PROXY with no address family) or `UNKNOWN` (v1) header
/// names no client: the connection's peer (the balancer) is the client, not the
/// client's own `X-Forwarded-For` (6.6.6.6 in the issue). Limit 1 per client address: the
/// second request, whatever X-Forwarded-For it claims, is the same client's.
#[test]
fn local_or_unknown_proxy_headers_make_the_peer_the_client_not_xff() {
    let b = Backend::start("app");
    let cfg = format!(
        "{}[rate_limit]\nkey = \"header:x-api-key\"\nlimit = 1\nwindow_seconds = 3600\nmissing_key = \"client_ip\"\n",
        upstream(&b)
    );
    let mut unspec = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    unspec.extend_from_slice(&[0x21, 0x00, 0x00, 0x00]);
    let headers: [(&str, Vec<u8>); 3] = [
        ("v2-local", v2_local()),
        ("v2-unspec", unspec),
        ("v1-unknown", b"PROXY UNKNOWN\r\n".to_vec()),
    ];
    for (name, header) in headers {
        let p = Proxy::start_with_server(
            "trusted_proxies = [\"127.0.0.2\"]\nproxy_protocol = true",
            &cfg,
        );
        let send = |path: &str, xff: &str| {
            let mut c = Conn::open_from(&p.addr(), LB).expect("connect");
            c.write_raw(&header).expect("PROXY header");
            c.request("GET", path, &[("X-Forwarded-For", xff)], b"")
                .expect("response")
        };
        let first = send(&format!("/{name}-1"), "6.6.6.6");
        assert_eq!(first.status, 200, "{name}: {}", first.body_str());
        let second = send(&format!("/{name}-2"), "7.7.7.7");
        assert_eq!(
            second.status, 429,
            "{name}: X-Forwarded-For named another client behind a {name} header"
        );
        // What the backend sees appended is the connection's source, the balancer.
        let got = b
            .received()
            .into_iter()
            .find(|r| r.path == format!("/{name}-1"))
            .and_then(|r| r.header("x-forwarded-for").map(str::to_string));
        assert_eq!(got.as_deref(), Some("6.6.6.6, 127.0.0.2"), "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Item 9: malformed HTTP/2 and ambiguous fields
// ---------------------------------------------------------------------------------------

/// A raw h2c connection that records every frame the proxy sends.
struct RawH2 {
    s: std::net::TcpStream,
    buf: Vec<u8>,
}

/// A frame the proxy sent: (type, flags, stream, payload).
type Frame = (u8, u8, u32, Vec<u8>);

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("small frame");
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

impl RawH2 {
    fn connect(addr: &str) -> RawH2 {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .expect("preface");
        s.write_all(&h2_frame(0x4, 0, 0, &[])).expect("settings");
        RawH2 { s, buf: Vec::new() }
    }

    fn send(&mut self, frames: &[Vec<u8>]) {
        use std::io::Write;
        self.s.write_all(&frames.concat()).expect("write frames");
    }

    /// Frames of `stream` until it ends (END_STREAM or RST_STREAM), the connection
    /// closes or `timeout` passes; SETTINGS and PING are acknowledged.
    fn until_stream_ends(&mut self, stream: u32, timeout: Duration) -> Vec<Frame> {
        use std::io::{Read, Write};
        let deadline = std::time::Instant::now() + timeout;
        let mut got = Vec::new();
        let mut tmp = [0u8; 16384];
        loop {
            while self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (self.buf[3], self.buf[4]);
                let id = u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]])
                    & 0x7fff_ffff;
                let payload = self.buf[9..9 + len].to_vec();
                self.buf.drain(..9 + len);
                match kind {
                    0x4 if flags & 1 == 0 => {
                        let _ = self.s.write_all(&h2_frame(0x4, 1, 0, &[]));
                    }
                    0x6 if flags & 1 == 0 => {
                        let _ = self.s.write_all(&h2_frame(0x6, 1, 0, &payload));
                    }
                    _ => {}
                }
                let ends = id == stream && (kind == 0x3 || (kind <= 0x1 && flags & 1 == 1));
                got.push((kind, flags, id, payload));
                if ends || kind == 0x7 {
                    return got;
                }
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return got;
            }
            self.s.set_read_timeout(Some(left)).expect("timeout");
            match self.s.read(&mut tmp) {
                Ok(0) | Err(_) => return got,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
            }
        }
    }
}

/// The stream was refused: a 400 (`:status` 400 is HPACK static index 12, sent as the
/// one byte 0x8c) or a reset.
fn refused(frames: &[Frame], stream: u32) -> bool {
    frames.iter().any(|(kind, _, id, payload)| {
        *id == stream && (*kind == 0x3 || (*kind == 0x1 && payload.first() == Some(&0x8c)))
    })
}

/// A response HEADERS frame on `stream` whose `:status` is the HPACK static index byte
/// `status` (0x88 is 200, 0x8c is 400).
fn answered(frames: &[Frame], stream: u32, status: u8) -> bool {
    frames.iter().any(|(kind, _, id, payload)| {
        *kind == 0x1 && *id == stream && payload.first() == Some(&status)
    })
}

/// The request head `method path` for authority `x`, then `extra` fields.
fn request_block(method: &str, path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut fields = vec![
        (":method", method),
        (":scheme", "http"),
        (":authority", "x"),
        (":path", path),
    ];
    fields.extend_from_slice(extra);
    hpack_block(&fields)
}

fn h2c_proxy(b: &Backend) -> Proxy {
    Proxy::start_with_server("h2c = true\n", &no_limits(b))
}

/// The case: HEADERS (`content-length: 0`, no END_STREAM) and a DATA frame in one
/// write. The GET reached the backend as a complete request; now the stream is refused
/// and nothing is forwarded. The connection keeps serving.
#[test]
fn h2_data_past_content_length_zero_is_refused_and_not_forwarded() {
    let b = Backend::start("app");
    let p = h2c_proxy(&b);
    let mut c = RawH2::connect(&p.addr());
    let block = request_block("GET", "/cl0-data", &[("content-length", "0")]);
    c.send(&[
        h2_frame(0x1, 0x4, 1, &block),
        h2_frame(0x0, 0x1, 1, b"smuggled"),
    ]);
    let frames = c.until_stream_ends(1, DEADLINE);
    assert!(refused(&frames, 1), "stream 1 not refused: {frames:?}");
    // A well-formed request on the same connection still goes through.
    let ok = request_block("GET", "/after", &[]);
    c.send(&[h2_frame(0x1, 0x5, 3, &ok)]);
    let frames = c.until_stream_ends(3, DEADLINE);
    assert!(answered(&frames, 3, 0x88), "no 200 on stream 3: {frames:?}");
    let paths = b.received_paths();
    assert_eq!(paths, vec!["/after".to_string()], "forwarded: {paths:?}");
}

/// `:path *` is for OPTIONS only (RFC 9113 §8.3.1): a GET with it was forwarded as
/// `GET *`. Now 400, over HTTP/2 and HTTP/1.1 alike; `OPTIONS *` still passes.
#[test]
fn asterisk_target_on_anything_but_options_is_400() {
    let b = Backend::start("app");
    let p = h2c_proxy(&b);
    let mut c = RawH2::connect(&p.addr());
    for (i, method) in ["GET", "POST", "DELETE"].iter().enumerate() {
        let id = 1 + 2 * u32::try_from(i).expect("few");
        let block = request_block(method, "*", &[]);
        c.send(&[h2_frame(0x1, 0x5, id, &block)]);
        let frames = c.until_stream_ends(id, DEADLINE);
        assert!(
            answered(&frames, id, 0x8c),
            "{method} * over h2: no 400: {frames:?}"
        );
    }
    let r = send_raw(&p.addr(), b"GET * HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status(), Some(400), "{r:?}");
    assert!(
        b.received().iter().all(|r| r.path != "*"),
        "forwarded: {:?}",
        b.received_paths()
    );
    let mut conn = Conn::open(&p.addr()).expect("connect");
    let r = conn.request("OPTIONS", "*", &[], b"").expect("response");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(b
        .received()
        .iter()
        .any(|r| r.path == "*" && r.method == "OPTIONS"));
}

/// HTTP/2 cookie crumbs (one `cookie` field per cookie) reach an HTTP/1.1 backend as one
/// `Cookie` field joined with "; " (RFC 9113 §8.2.3), not as several lines.
#[test]
fn h2_cookie_crumbs_are_joined_into_one_field() {
    let b = Backend::start("app");
    let p = h2c_proxy(&b);
    let mut c = RawH2::connect(&p.addr());
    let crumbs = [("cookie", "a=1"), ("cookie", "b=2"), ("cookie", "c=3")];
    let block = request_block("GET", "/crumbs", &crumbs);
    c.send(&[h2_frame(0x1, 0x5, 1, &block)]);
    let frames = c.until_stream_ends(1, DEADLINE);
    assert!(answered(&frames, 1, 0x88), "no 200: {frames:?}");
    let got = b.last_received().expect("forwarded");
    let cookies = got.header_all("cookie");
    assert_eq!(cookies, vec!["a=1; b=2; c=3"], "{:?}", got.headers);
}

/// `Content-Length: 5, 5` (a list of equal values, which Pingora accepts) went upstream
/// unchanged; now as one value. A list or lines that differ stay refused.
#[test]
fn a_content_length_list_goes_upstream_as_one_value() {
    let b = Backend::start("app");
    let p = Proxy::start(&no_limits(&b));
    for (i, fields) in [
        "Content-Length: 5, 5\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
    ]
    .iter()
    .enumerate()
    {
        let mut c = Conn::open(&p.addr()).expect("connect");
        c.write_raw(
            format!("POST /cl-list-{i} HTTP/1.1\r\nHost: x\r\n{fields}\r\nhello").as_bytes(),
        )
        .expect("write");
        let r = c.read_response().expect("response");
        assert_eq!(r.status, 200, "{fields:?}: {r:?}");
        let got = b.last_received().expect("forwarded");
        assert_eq!(got.path, format!("/cl-list-{i}"));
        let lengths = got.header_all("content-length");
        assert_eq!(lengths, vec!["5"], "{fields:?}: {:?}", got.headers);
        assert_eq!(got.body, b"hello");
    }
    let r = send_raw(
        &p.addr(),
        b"POST /cl-differ HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!",
    );
    assert_eq!(r.status(), Some(400), "{r:?}");
    assert!(!b.received_paths().iter().any(|p| p == "/cl-differ"));
}

// ---------------------------------------------------------------------------------------
// Item 12: a certificate or key that is not a regular file
// ---------------------------------------------------------------------------------------

fn mkfifo(path: &std::path::Path) {
    let out = std::process::Command::new("mkfifo")
        .arg(path)
        .output()
        .expect("run mkfifo");
    assert!(out.status.success(), "mkfifo: {out:?}");
}

/// `--check` with a deadline: (exit code, stderr), or `None` if it did not finish (the
/// child is killed then).
fn check_within(path: &std::path::Path, timeout: Duration) -> Option<(i32, String)> {
    use std::io::Read;
    let mut child = std::process::Command::new(&*BIN)
        .arg("-c")
        .arg(path)
        .arg("--check")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn --check");
    let mut status = None;
    wait_until(timeout, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    Some((status.code().unwrap_or(-1), err))
}

/// A FIFO as a key (or certificate) file blocked the reload in `open()` on the admin
/// listener's thread: the admin listener was dead until restart. It is refused at once
/// now, naming the file, by `--check`, by `POST /reload` and by SIGHUP, and the admin
/// listener keeps answering; the old certificates keep serving.
#[test]
fn a_fifo_as_key_or_cert_is_refused_and_never_blocks_the_admin_listener() {
    let b = Backend::start("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let good = make_cert(dir.path(), "good", "good.test", &["good.test"]);
    let fifo = dir.path().join("fifo.key");
    mkfifo(&fifo);
    let tls_addr = format!("127.0.0.1:{}", free_port());
    let cfg = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "{}{}",
            no_limits(&b),
            tls_table(
                &tls_addr,
                "1.2",
                &[&CertFiles {
                    cert: cert.to_path_buf(),
                    key: key.to_path_buf(),
                }]
            )
        )
    };
    let p = Proxy::start(&cfg(&good.cert, &good.key));

    // --check: refused at once, naming the file.
    for (what, text) in [
        ("key", cfg(&good.cert, &fifo)),
        ("cert", cfg(&fifo, &good.key)),
    ] {
        let path = dir.path().join(format!("check-{what}.toml"));
        std::fs::write(&path, text).expect("write config");
        let (code, err) = check_within(&path, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("--check with a FIFO as the {what} blocked"));
        assert_ne!(code, 0, "{what}: {err}");
        assert!(
            err.contains(&fifo.display().to_string()) && err.contains("not a regular file"),
            "{what}: {err}"
        );
    }

    // POST /reload and SIGHUP: refused at once, the admin listener keeps answering.
    p.rewrite_config(&cfg(&good.cert, &fifo));
    let admin = p.admin_addr();
    let started = std::time::Instant::now();
    let r = try_request(&admin, "POST", "/reload", &[], b"")
        .expect("POST /reload answered (the admin listener is alive)");
    assert_eq!(r.status, 400, "{}", r.body_str());
    assert!(
        r.body_str().contains(&fifo.display().to_string())
            && r.body_str().contains("not a regular file"),
        "{}",
        r.body_str()
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    p.signal("HUP");
    eventually(
        DEADLINE,
        || format!("SIGHUP reload not refused: {}", p.metrics()),
        || p.metric("portcullis_config_reloads_total{result=\"error\"}") == Some(2.0),
    );
    for _ in 0..3 {
        assert_eq!(p.admin_get("/healthz").status, 200);
    }
    // The old certificate still serves, and the proxy still proxies.
    let out = tls_exchange(
        &tls_addr,
        "good.test",
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(out.contains("200"), "{out}");
    // Fixed file: the reload goes through.
    p.rewrite_config(&cfg(&good.cert, &good.key));
    let r = try_request(&admin, "POST", "/reload", &[], b"").expect("POST /reload");
    assert_eq!(r.status, 200, "{}", r.body_str());
}
