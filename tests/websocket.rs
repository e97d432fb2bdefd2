//! WebSocket / `Upgrade` tunnels (CONTRACT §6): passed through to a real echo server;
//! after the `101` a tunnel is not an in-flight request; `max_tunnels` caps open tunnels
//! (503 beyond) and `portcullis_tunnels_open` reports them; on shutdown tunnels are
//! closed at `shutdown_timeout_seconds`.

use portcullis_test_kit as support;

use std::time::{Duration, Instant};
use support::*;

fn ws_upstream(echo: &WsEchoServer) -> String {
    format!(
        "[[upstreams]]\nname = \"ws\"\nbackends = [\"{}\"]\n\n\
         [[routes]]\npath_prefix = \"/\"\nupstream = \"ws\"\npriority = \"critical\"\n\n",
        echo.addr()
    )
}

/// A proxy in front of `echo` with `shedding` (one `key = value` line) as its
/// `[shedding]` table and no rate limit.
fn ws_proxy(echo: &WsEchoServer, shedding: &str) -> Proxy {
    Proxy::start(&format!(
        "{}[shedding]\n{shedding}\n\n[rate_limit]\nenabled = false\n",
        ws_upstream(echo)
    ))
}

#[test]
fn echo_through_a_tunnel_that_is_not_an_inflight_request() {
    let echo = WsEchoServer::start();
    // a cap of one in-flight request: an open tunnel must not hold it
    let proxy = ws_proxy(&echo, "max_concurrency = 1");
    let mut ws = WsClient::open(&proxy.addr(), "/chat");
    assert_eq!(ws.echo("hello"), "hello");
    let big = "x".repeat(70_000);
    assert_eq!(ws.echo(&big), big);
    assert_eq!(proxy.metric("portcullis_tunnels_open"), Some(1.0));
    assert_eq!(proxy.metric("portcullis_inflight_requests"), Some(0.0));
    // ordinary requests still pass the cap of one while the tunnel is open
    for _ in 0..3 {
        let r = proxy.get("/plain", &[]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "plain"));
    }
    let mut second = WsClient::open(&proxy.addr(), "/chat2");
    assert_eq!(second.echo("two"), "two");
    assert_eq!(proxy.metric("portcullis_tunnels_open"), Some(2.0));
    assert_eq!(ws.echo("still here"), "still here");
    ws.close();
    second.close();
    eventually(
        DEADLINE,
        || "tunnels_open back to 0".into(),
        || proxy.metric("portcullis_tunnels_open") == Some(0.0),
    );
    eventually(
        DEADLINE,
        || "echo server connections closed".into(),
        || echo.open() == 0,
    );
    assert_eq!(
        proxy.metric("portcullis_requests_total{outcome=\"proxied\"}"),
        Some(5.0)
    );
}

#[test]
fn max_tunnels_refuses_beyond_the_cap_with_503() {
    let echo = WsEchoServer::start();
    let proxy = ws_proxy(&echo, "max_tunnels = 2");
    let mut a = WsClient::open(&proxy.addr(), "/a");
    let b = WsClient::open(&proxy.addr(), "/b");
    match WsClient::connect(&proxy.addr(), "/c") {
        WsOpen::Open(_) => panic!("a third tunnel was opened with max_tunnels = 2"),
        WsOpen::Refused(status, head) => {
            assert_eq!(status, 503, "{head}");
            assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
        }
    }
    assert_eq!(
        echo.upgrades(),
        2,
        "the refused upgrade never reached the backend"
    );
    assert_eq!(proxy.metric("portcullis_tunnels_open"), Some(2.0));
    // counted when the refused request is logged, just after its answer went out
    eventually(
        DEADLINE,
        || "the refused upgrade counted as shed".into(),
        || proxy.metric("portcullis_requests_total{outcome=\"shed\"}") == Some(1.0),
    );
    // a plain request is not a tunnel: not capped
    assert_eq!(proxy.get("/plain", &[]).status, 200);
    b.close();
    eventually(
        DEADLINE,
        || "slot freed".into(),
        || proxy.metric("portcullis_tunnels_open") == Some(1.0),
    );
    let mut c = WsClient::open(&proxy.addr(), "/c");
    assert_eq!(c.echo("c"), "c");
    assert_eq!(a.echo("a"), "a");
}

#[test]
fn tunnels_are_closed_at_shutdown_timeout() {
    let echo = WsEchoServer::start();
    let cfg = format!("{}[rate_limit]\nenabled = false\n", ws_upstream(&echo));
    let mut proxy =
        Proxy::start_with_server("drain_seconds = 1\nshutdown_timeout_seconds = 2\n", &cfg);
    let mut ws = WsClient::open(&proxy.addr(), "/live");
    assert_eq!(ws.echo("before"), "before");
    let t0 = Instant::now();
    proxy.signal("TERM");
    // the tunnel keeps working during the drain
    assert_eq!(ws.echo("draining"), "draining");
    assert!(
        ws.is_closed_within(Duration::from_secs(15)),
        "tunnel still open 15 s after SIGTERM"
    );
    let took = t0.elapsed();
    proxy.expect_exit(DEADLINE, "proxy with an open tunnel");
    // drain (1 s) + shutdown timeout (2 s): not before, and not much after
    assert!(took >= Duration::from_secs(2), "closed after {took:?}");
    assert!(took < Duration::from_secs(12), "closed after {took:?}");
}

/// Issue 40 item 14: idle tunnels were cut at the upstream's `read_timeout_ms` (and the
/// client's `client_body_timeout_ms`). A tunnel now has `tunnel_idle_timeout_seconds`:
/// with both of those at 300 ms and a tunnel timeout of 2 s, an active tunnel lives on
/// and an idle one is closed at 2 s, not before.
#[test]
fn tunnels_have_their_own_idle_timeout() {
    let echo = WsEchoServer::start();
    let proxy = proxy_with_short_timeouts(&echo);
    // Active, with pauses longer than both short timeouts, for longer than the tunnel's.
    let mut active = WsClient::open(&proxy.addr(), "/active");
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < Duration::from_millis(2_500) {
        assert_eq!(active.echo("ping"), "ping", "after {:?}", t0.elapsed());
        n += 1;
        // pacing between messages, not a wait for an outcome
        std::thread::sleep(Duration::from_millis(600));
    }
    assert!(n >= 4);
    active.close();

    let mut idle = WsClient::open(&proxy.addr(), "/idle");
    let opened = Instant::now();
    assert_eq!(idle.echo("once"), "once");
    assert!(
        !idle.is_closed_within(Duration::from_millis(1_200)),
        "an idle tunnel was closed before tunnel_idle_timeout_seconds"
    );
    assert!(
        idle.is_closed_within(Duration::from_secs(15)),
        "an idle tunnel was still open 15 s after tunnel_idle_timeout_seconds"
    );
    let took = opened.elapsed();
    assert!(
        took >= Duration::from_millis(1_900),
        "closed after {took:?}"
    );
    all_tunnels_closed(&proxy);
}

/// CONTRACT §17: a tunnel is idle when no byte goes *either* way. A backend that only
/// pushes (the client silent) and a client that only sends (the backend silent) keep
/// their tunnels open past `tunnel_idle_timeout_seconds`; once the talking side stops,
/// the tunnel is closed that long after its last byte. (A timeout per direction closed
/// both at 2 s.)
#[test]
fn a_tunnel_that_talks_one_way_is_not_idle() {
    let echo = WsEchoServer::start();
    let proxy = proxy_with_short_timeouts(&echo);

    // The backend pushes for 4 s; the client never sends a byte.
    let mut push = WsClient::open(&proxy.addr(), "/push");
    let opened = Instant::now();
    assert!(
        !push.is_closed_within(Duration::from_millis(3_500)),
        "a tunnel the backend pushed on was closed after {:?}",
        opened.elapsed()
    );
    // Then both sides are silent: closed about 2 s after the last push (at ~4 s).
    assert!(
        push.is_closed_within(Duration::from_secs(15)),
        "a tunnel silent both ways was never closed"
    );
    let took = opened.elapsed();
    assert!(
        took >= Duration::from_millis(5_500),
        "closed after {took:?}"
    );

    // The client sends every 500 ms for 3 s; the backend never answers.
    let mut sink = WsClient::open(&proxy.addr(), "/sink");
    let t0 = Instant::now();
    let mut last = t0;
    while t0.elapsed() < Duration::from_secs(3) {
        sink.send("one way");
        last = Instant::now();
        // pacing between messages, not a wait for an outcome
        std::thread::sleep(Duration::from_millis(500));
    }
    let quiet_for = Duration::from_millis(1_500).saturating_sub(last.elapsed());
    assert!(
        !sink.is_closed_within(quiet_for),
        "a tunnel the client sent on was closed {:?} after its last byte",
        last.elapsed()
    );
    assert!(
        sink.is_closed_within(Duration::from_secs(15)),
        "a tunnel silent both ways was never closed"
    );
    all_tunnels_closed(&proxy);
}

/// Until the backend answers an upgrade, its `read_timeout_ms` applies as to any
/// request (HAProxy's `timeout server` before `timeout tunnel`): a backend that never
/// answers gets the client a 504 after it, not after `tunnel_idle_timeout_seconds`.
#[test]
fn an_upgrade_the_backend_never_answers_gets_a_504_after_the_read_timeout() {
    let b = Backend::start("hang");
    b.set_mode(Mode::Hang);
    let cfg = format!(
        "[[upstreams]]\nname = \"ws\"\nbackends = [\"{}\"]\nread_timeout_ms = 300\n\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        b.addr()
    );
    let proxy = Proxy::start_with_server("tunnel_idle_timeout_seconds = 60\n", &cfg);
    let mut s = std::net::TcpStream::connect(proxy.addr()).expect("connect");
    std::io::Write::write_all(
        &mut s,
        b"GET /ws HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .expect("send upgrade");
    let sent = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    // the response head, however the bytes arrive
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let took = sent.elapsed();
    let head = String::from_utf8_lossy(&got);
    assert!(head.starts_with("HTTP/1.1 504"), "after {took:?}: {head:?}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(10),
        "answered after {took:?}: {head:?}"
    );
    all_tunnels_closed(&proxy);
}

/// A proxy in front of `echo` whose body and upstream read timeouts (300 ms) are far
/// shorter than its tunnel idle timeout (2 s).
fn proxy_with_short_timeouts(echo: &WsEchoServer) -> Proxy {
    let cfg = format!(
        "[[upstreams]]\nname = \"ws\"\nbackends = [\"{}\"]\nread_timeout_ms = 300\n\n\
         [rate_limit]\nenabled = false\n",
        echo.addr()
    );
    Proxy::start_with_server(
        "client_body_timeout_ms = 300\ntunnel_idle_timeout_seconds = 2\n",
        &cfg,
    )
}

/// Every tunnel of `proxy` is closed and its gauge back to 0.
fn all_tunnels_closed(proxy: &Proxy) {
    eventually(
        DEADLINE,
        || "tunnels_open back to 0".into(),
        || proxy.metric("portcullis_tunnels_open") == Some(0.0),
    );
}
