//! HTTP/2 hardening (issue 40 items 7 and 8; CONTRACT §17), on an h2c listener (the same
//! code serves h2 over TLS):
//! - a stream whose request body stalls gets 408 within `client_body_timeout_ms`, is the
//!   client's fault (outcome `rejected`, `body_timeout` refusal, no error in the backend's
//!   window) and gives its in-flight slot back;
//! - a client that resets stream after stream once the proxy has taken them (rapid reset
//!   after accept) gets GOAWAY `ENHANCE_YOUR_CALM` after about `h2_max_glitches` of them,
//!   and its connection is closed; a client that makes many streams, and cancels a few,
//!   is not.
//!
//! Stalled bodies are spoken by Debian's python3-h2 (the kit's `py/h2_stall.py`, which decodes
//! the statuses); resets by [`H2Raw`].

use portcullis_test_kit as support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// The body timeout of the item 7 tests: long enough that a request made while the
/// stalled streams hold their slots arrives before they time out, on a loaded machine.
const BODY_TIMEOUT: Duration = Duration::from_millis(1500);
/// How late after the body timeout a stalled stream may be answered (a loaded machine).
const MARGIN: Duration = Duration::from_secs(4);

/// One stream as `h2_stall.py` reports it.
#[derive(serde::Deserialize, Debug)]
struct Stalled {
    stream: u32,
    status: Option<u16>,
    /// RST_STREAM after the 408 (h2 ends the request half so: NO_ERROR)
    reset: Option<u32>,
    ms: Option<u64>,
}

fn metric(p: &Proxy, selector: &str) -> f64 {
    p.metric(selector).unwrap_or(0.0)
}

fn errors_in_window(p: &Proxy) -> Option<u64> {
    p.status_json()["upstreams"][0]["backends"][0]["errors_in_window"].as_u64()
}

/// Waits (up to [`DEADLINE`]) until the metric `selector` reads `value`.
fn wait_metric(p: &Proxy, selector: &str, value: f64) {
    eventually(
        DEADLINE,
        || format!("{selector} != {value}; metrics:\n{}", p.metrics()),
        || metric(p, selector) == value,
    );
}

/// None of it was the backend's fault: no request counted as `upstream_error`, no
/// error in the backend's window.
fn assert_backend_blameless(p: &Proxy) {
    assert_eq!(
        metric(p, r#"portcullis_requests_total{outcome="upstream_error"}"#),
        0.0,
        "{}",
        p.metrics()
    );
    assert_eq!(errors_in_window(p), Some(0), "{}", p.status_json());
}

/// The streams `h2_stall.py` reported in its output `text`.
fn stalled_streams(text: &str) -> Vec<Stalled> {
    text.lines()
        .filter(|l| l.contains("\"stream\""))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// The `[server]` part of the stall tests: h2c, and the body timeout [`BODY_TIMEOUT`].
fn body_timeout_server() -> String {
    format!(
        "h2c = true\nclient_body_timeout_ms = {}\n",
        BODY_TIMEOUT.as_millis()
    )
}

#[test]
fn stalled_h2_bodies_get_408_count_against_the_client_and_free_their_slots() {
    let backend = Backend::start("app");
    // A cap of 10: the normal class may hold 9 (CONTRACT §2), which the stalled streams
    // fill. The backend's own read timeout is far away: only the body timeout can answer.
    let cfg = format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{}\"]\nread_timeout_ms = 30000\n\n\
         [shedding]\nmax_concurrency = 10\n\n[rate_limit]\nenabled = false\n",
        backend.addr()
    );
    let proxy = Proxy::start_with_server(&body_timeout_server(), &cfg);
    assert_eq!(proxy.get("/warm", &[]).status, 200);

    let script = support::py_helper("h2_stall.py");
    let mut child = Command::new("/usr/bin/python3")
        .args([&script, &proxy.addr(), "/stalled", "9", "15"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run h2_stall.py (needs python3-h2)");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("ready line");
    assert_eq!(line.trim(), "ready", "h2_stall.py did not start: {line:?}");
    let sent = Instant::now();

    // While they stall, the nine hold the normal class's nine slots: the next normal
    // request is shed (this shows the slots are the stalled streams'). The body timeout
    // may already have freed them on a slow machine: then the check is skipped.
    let full = wait_until(BODY_TIMEOUT / 3, || {
        metric(&proxy, "portcullis_inflight_requests") >= 9.0
    });
    let during = full && sent.elapsed() < BODY_TIMEOUT / 3;
    if during {
        let shed = proxy.get("/during", &[]);
        assert_eq!(shed.status, 503, "the cap was full: {}", shed.body_str());
    }

    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("h2_stall.py output");
    let status = child.wait().expect("h2_stall.py exit");
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    assert!(status.success(), "h2_stall.py: {status}\n{rest}\n{stderr}");
    let streams = stalled_streams(&rest);
    assert_eq!(streams.len(), 9, "{rest}");
    eprintln!("cap full while stalled: {during}\n{rest}");
    for s in &streams {
        assert_eq!(
            s.status,
            Some(408),
            "every stalled stream gets 408: {s:?}\n{rest}"
        );
        assert!(
            s.reset.is_none_or(|code| code == 0),
            "a 408, not an error: {s:?}"
        );
        let ms = s.ms.unwrap_or(u64::MAX);
        assert!(
            u128::from(ms) < (BODY_TIMEOUT + MARGIN).as_millis(),
            "stream {} answered after {ms} ms (timeout {BODY_TIMEOUT:?})",
            s.stream
        );
        assert!(
            u128::from(ms) >= BODY_TIMEOUT.as_millis() * 9 / 10,
            "stream {} answered before its body timed out: {s:?}",
            s.stream
        );
    }
    assert!(
        rest.contains("\"goaway\": null"),
        "the connection itself is not closed: {rest}"
    );

    // The slots are back: a normal request is served, not shed.
    wait_metric(&proxy, "portcullis_inflight_requests", 0.0);
    assert_eq!(proxy.get("/after", &[]).status, 200);

    // The client's fault, counted as the HTTP/1.1 body timeout is: never the backend's.
    wait_metric(
        &proxy,
        r#"portcullis_edge_refusals_total{reason="body_timeout"}"#,
        9.0,
    );
    assert_eq!(
        metric(
            &proxy,
            r#"portcullis_requests_total{outcome="rejected",code="4xx"}"#
        ),
        9.0,
        "{}",
        proxy.metrics()
    );
    assert_backend_blameless(&proxy);
    assert!(
        !proxy.logs().contains("upstream_error") && !proxy.logs().contains("proxy_error"),
        "{}",
        proxy.logs()
    );
}

/// Runs `h2_stall.py` with `n` streams of `path` to completion: the streams, and the
/// script's whole output.
fn stall(proxy: &Proxy, path: &str, n: u32, seconds: u32) -> (Vec<Stalled>, String) {
    let script = support::py_helper("h2_stall.py");
    let out = Command::new("/usr/bin/python3")
        .args([
            &script,
            &proxy.addr(),
            path,
            &n.to_string(),
            &seconds.to_string(),
        ])
        .output()
        .expect("run h2_stall.py (needs python3-h2)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "h2_stall.py: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (stalled_streams(&text), text)
}

/// Once the response has started there is no 408 to send: the stalled stream is reset,
/// and it is still the client's fault.
#[test]
fn a_stalled_h2_body_after_the_response_started_gets_rst_stream() {
    // answers as soon as it has the request head, without reading the body, and never
    // ends its chunked response
    let addr = fixed_response_backend(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    );
    let cfg = format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{addr}\"]\nread_timeout_ms = 30000\n\n\
         [rate_limit]\nenabled = false\n"
    );
    let proxy = Proxy::start_with_server(&body_timeout_server(), &cfg);
    let (streams, text) = stall(&proxy, "/early", 1, 8);
    let s = &streams[0];
    assert_eq!(s.status, Some(200), "the response had started: {text}");
    assert!(
        s.reset.is_some_and(|code| code != 0),
        "the stream is reset, not ended: {text}"
    );
    let ms = s.ms.unwrap_or(u64::MAX);
    assert!(
        u128::from(ms) < (BODY_TIMEOUT + MARGIN).as_millis()
            && u128::from(ms) >= BODY_TIMEOUT.as_millis() * 9 / 10,
        "reset after {ms} ms (timeout {BODY_TIMEOUT:?}): {text}"
    );
    wait_metric(
        &proxy,
        r#"portcullis_edge_refusals_total{reason="body_timeout"}"#,
        1.0,
    );
    assert_backend_blameless(&proxy);
}

fn glitch_proxy(backend: &Backend, max_glitches: u32) -> Proxy {
    let cfg = format!(
        "{}[shedding]\nmax_concurrency = 0\n\n[rate_limit]\nenabled = false\n",
        one_upstream(backend)
    );
    Proxy::start_with_server(
        &format!("h2c = true\nh2_max_glitches = {max_glitches}\n"),
        &cfg,
    )
}

/// Streams `first`, `first + 2`, … each sent as HEADERS (END_STREAM), and once the
/// backend has the request (the proxy took the stream), reset with CANCEL; at most `n`
/// of them, until the server sends GOAWAY or closes. Returns what it saw and how many
/// streams it sent.
fn accept_then_reset(c: &mut H2Raw, backend: &Backend, first: u32, n: u32) -> (H2Seen, u32) {
    let block = H2Raw::request_block("x", "/reset", &[]);
    let mut seen = H2Seen::default();
    let mut sent = 0;
    for i in 0..n {
        let id = first + 2 * i;
        let before = backend.requests();
        if c.headers(id, &block).is_err() {
            seen.closed = true;
            break;
        }
        sent += 1;
        // the pause: until the proxy has passed the request on (bounded)
        let accepted = wait_until(Duration::from_secs(5), || backend.requests() > before);
        if c.rst(id, 0x8).is_err() {
            seen.closed = true;
            break;
        }
        let now = c.read_until(Duration::from_millis(5), |s| s.goaway.is_some() || s.closed);
        seen.goaway = seen.goaway.or(now.goaway);
        seen.closed |= now.closed;
        seen.responses.extend(now.responses);
        seen.resets.extend(now.resets);
        if !accepted || seen.goaway.is_some() || seen.closed {
            break;
        }
    }
    (seen, sent)
}

#[test]
fn rapid_reset_after_accept_gets_goaway_enhance_your_calm() {
    const MAX: u32 = 20;
    let backend = Backend::start("rr");
    // held: the proxy is still waiting for each response when its stream is reset
    backend.set_mode(Mode::Hold);
    let proxy = glitch_proxy(&backend, MAX);
    let before = backend.requests();
    let start = Instant::now();
    let mut c = H2Raw::connect(&proxy.addr());
    let (mut seen, sent) = accept_then_reset(&mut c, &backend, 1, 10 * MAX);
    if seen.goaway.is_none() && !seen.closed {
        // the last glitch may be counted just after its reset: a bounded wait
        let more = c.read_until(Duration::from_secs(5), |s| s.goaway.is_some() || s.closed);
        seen.goaway = more.goaway;
        seen.closed = more.closed;
    }
    let reached = backend.requests() - before;
    assert_eq!(
        seen.goaway,
        Some(ENHANCE_YOUR_CALM),
        "sent {sent} accepted-then-reset streams in {:?}, backend saw {reached}: {seen:?}",
        start.elapsed()
    );
    assert!(
        sent > MAX && sent <= MAX + 10,
        "GOAWAY after {sent} resets, want about {MAX}"
    );
    assert!(
        reached <= u64::from(MAX) + 10,
        "the backend saw {reached} requests of {sent} reset streams"
    );
    // ... and the connection is closed, not just told to go away.
    let end = c.read_until(DEADLINE, |s| s.closed);
    assert!(
        end.closed,
        "the connection stays open after GOAWAY: {end:?}"
    );
    wait_metric(
        &proxy,
        r#"portcullis_edge_refusals_total{reason="h2_glitches"}"#,
        1.0,
    );
    // Nothing of it is the backend's fault, and other clients are served.
    backend.set_mode(Mode::Ok);
    assert_eq!(errors_in_window(&proxy), Some(0), "{}", proxy.status_json());
    let s = nghttp(&[format!("http://{}/after", proxy.addr())], &[]);
    assert_eq!(s[0].status, 200, "{s:#?}");
}

#[test]
fn many_streams_and_a_few_cancels_are_not_glitches_enough() {
    const MAX: u32 = 20;
    let backend = Backend::start("ok");
    let proxy = glitch_proxy(&backend, MAX);

    // 300 streams on one connection (nghttp multiplexes them): every one is served.
    let urls: Vec<String> = (0..300)
        .map(|i| format!("http://{}/many{i}", proxy.addr()))
        .collect();
    let streams = nghttp(&urls, &[]);
    assert_eq!(streams.len(), 300, "{streams:#?}");
    assert!(streams.iter().all(|s| s.status == 200), "{streams:#?}");

    // A client that cancels fewer than the budget, then goes on: not closed.
    backend.set_mode(Mode::Hold);
    let mut c = H2Raw::connect(&proxy.addr());
    let (seen, sent) = accept_then_reset(&mut c, &backend, 1, MAX - 5);
    assert_eq!(sent, MAX - 5, "{seen:?}");
    assert_eq!(seen.goaway, None, "{seen:?}");
    backend.set_mode(Mode::Ok);
    backend.release_all();
    let block = H2Raw::request_block("x", "/after-cancels", &[]);
    let first = 1 + 2 * (MAX - 5);
    for i in 0..50 {
        c.headers(first + 2 * i, &block).expect("send headers");
    }
    let seen = c.read_until(DEADLINE, |s| s.responses.len() >= 50 || s.closed);
    assert_eq!(seen.responses.len(), 50, "{seen:?}");
    assert_eq!(seen.goaway, None, "{seen:?}");
    assert!(!seen.closed, "{seen:?}");
    assert_eq!(
        metric(
            &proxy,
            r#"portcullis_edge_refusals_total{reason="h2_glitches"}"#
        ),
        0.0
    );
}

/// Streams that break the protocol are glitches too: past the budget, GOAWAY
/// `ENHANCE_YOUR_CALM` (before: each was reset, and Pingora dropped the connection
/// without a GOAWAY only after 32 of them).
#[test]
fn malformed_streams_past_the_budget_get_goaway_enhance_your_calm() {
    const MAX: u32 = 10;
    let backend = Backend::start("mal");
    let proxy = glitch_proxy(&backend, MAX);
    let mut c = H2Raw::connect(&proxy.addr());
    let block = H2Raw::request_block("x", "/a\r\nx-injected: 1", &[]);
    let mut seen = H2Seen::default();
    for i in 0..(2 * MAX) {
        if c.headers(1 + 2 * i, &block).is_err() {
            break;
        }
        let now = c.read_until(Duration::from_millis(20), |s| {
            s.goaway.is_some() || s.closed
        });
        seen.goaway = seen.goaway.or(now.goaway);
        seen.closed |= now.closed;
        seen.resets.extend(now.resets);
        if seen.goaway.is_some() || seen.closed {
            break;
        }
    }
    if seen.goaway.is_none() && !seen.closed {
        let more = c.read_until(Duration::from_secs(5), |s| s.goaway.is_some() || s.closed);
        seen.goaway = more.goaway;
    }
    assert_eq!(seen.goaway, Some(ENHANCE_YOUR_CALM), "{seen:?}");
    assert_eq!(backend.requests(), 0, "nothing malformed is forwarded");
    let s = nghttp(&[format!("http://{}/after", proxy.addr())], &[]);
    assert_eq!(s[0].status, 200, "{s:#?}");
}
