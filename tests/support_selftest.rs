//! Tests of the test support itself (no proxy needed): the backend, the client, the Redis
//! wrapper and the metrics matcher must be right before any proxy test can be trusted.

use portcullis_test_kit as support;

use std::time::{Duration, Instant};
use support::*;

#[test]
fn backend_answers_and_echoes() {
    let b = Backend::start("alpha");
    let r = get(
        &b.addr(),
        "/x/y?z=1",
        &[("X-Forwarded-For", "1.2.3.4"), ("x-request-id", "abc")],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), "alpha");
    assert_eq!(r.header("X-Backend"), Some("alpha"));
    assert_eq!(r.header("x-echo-path"), Some("/x/y?z=1"));
    assert_eq!(r.header("x-echo-xff"), Some("1.2.3.4"));
    assert_eq!(r.header("x-echo-request-id"), Some("abc"));
    assert_eq!(r.header("x-echo-proto"), None);
    assert_eq!(b.requests(), 1);
    assert_eq!(b.received_paths(), vec!["/x/y?z=1".to_string()]);
}

#[test]
fn backend_keep_alive_and_bodies() {
    let b = Backend::start("beta");
    let mut c = Conn::open(&b.addr()).expect("connect");
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let r = c.request("POST", "/p", &[], &big).expect("post");
    assert_eq!(r.header("x-echo-body-len"), Some("1000000"));
    assert_eq!(r.header("x-echo-body-fnv"), Some(fnv1a(&big).as_str()));
    let r = c
        .request_chunked(
            "POST",
            "/c",
            &[("x-echo-body", "1")],
            &[b"hello ", b"chunked ", b"world"],
        )
        .expect("chunked");
    assert_eq!(r.body_str(), "hello chunked world");
    let r = c.request("GET", "/g", &[], b"").expect("get");
    assert_eq!(r.status, 200);
    assert_eq!(b.connections(), 1, "keep-alive reused the connection");
    assert_eq!(b.requests(), 3);
    assert_eq!(b.last_received().expect("received").path, "/g");
}

#[test]
fn backend_modes() {
    let mut b = Backend::start("gamma");
    b.set_mode(Mode::Fail(502));
    assert_eq!(get(&b.addr(), "/", &[]).status, 502);

    b.set_mode(Mode::Hold);
    let addr = b.addr();
    let hs: Vec<_> = (0..3)
        .map(|_| {
            let a = addr.clone();
            std::thread::spawn(move || get(&a, "/held", &[]).status)
        })
        .collect();
    assert_eventually!(b.in_flight() == 3, "in_flight={}", b.in_flight());
    b.release_all();
    for h in hs {
        assert_eq!(h.join().expect("join"), 200);
    }
    assert_eq!(b.max_in_flight(), 3);
    assert_eventually!(b.in_flight() == 0);

    b.set_mode(Mode::Close);
    assert!(try_get(&b.addr(), "/", &[]).is_err());

    b.set_mode(Mode::Hang);
    let mut c = Conn::open_with_timeout(&b.addr(), Duration::from_millis(300)).expect("connect");
    assert!(
        c.request("GET", "/hang", &[], b"").is_err(),
        "hang times out"
    );

    b.set_mode(Mode::Ok);
    b.stop();
    assert!(try_get(&b.addr(), "/", &[]).is_err(), "stopped refuses");
    b.restart();
    assert_eq!(get(&b.addr(), "/", &[]).status, 200);
}

#[test]
fn send_raw_reports_close() {
    let b = Backend::start("delta");
    match send_raw(&b.addr(), b"GARBAGE\x01\r\n\r\n") {
        RawOutcome::Response(r) => assert_eq!(r.status, 400),
        RawOutcome::Closed { error, .. } => panic!("expected a 400, got close: {error}"),
    }
    assert_eq!(b.requests(), 0);
}

#[test]
fn redis_server_lifecycle() {
    let mut r = RedisServer::start();
    assert_ne!(r.port(), 6379);
    assert_eq!(r.cmd(&["SET", "k", "v"]), "OK");
    assert_eq!(r.cmd(&["GET", "k"]), "v");
    assert_eq!(r.keys("*"), vec!["k".to_string()]);
    r.kill();
    assert!(r.try_cmd(&["PING"]).map(|s| s != "PONG").unwrap_or(true));
    r.restart();
    assert_eq!(r.cmd(&["PING"]), "PONG");
    assert_eq!(r.cmd(&["GET", "k"]), "", "restart starts empty");
}

#[test]
fn metrics_parser() {
    let text = r#"# HELP portcullis_requests_total Requests
# TYPE portcullis_requests_total counter
portcullis_requests_total{outcome="proxied"} 12
portcullis_requests_total{outcome="shed"} 3
portcullis_inflight_requests 0
portcullis_request_duration_seconds_bucket{outcome="proxied",le="0.005"} 4
portcullis_request_duration_seconds_bucket{outcome="proxied",le="+Inf"} 12
portcullis_request_duration_seconds_count{outcome="proxied"} 12
portcullis_backend_culled{upstream="app",backend="127.0.0.1:1"} 1
"#;
    assert_eq!(
        metric_value(text, r#"portcullis_requests_total{outcome="proxied"}"#),
        Some(12.0)
    );
    assert_eq!(metric_value(text, "portcullis_requests_total"), Some(15.0));
    assert_eq!(
        metric_value(text, "portcullis_inflight_requests"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(
            text,
            r#"portcullis_request_duration_seconds_bucket{le="+Inf"}"#
        ),
        Some(12.0)
    );
    assert_eq!(
        metric_value(
            text,
            r#"portcullis_backend_culled{backend="127.0.0.1:1", upstream="app"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(text, r#"portcullis_requests_total{outcome="x"}"#),
        None
    );
    assert!(has_metric(text, "portcullis_request_duration_seconds"));
    assert!(has_metric(text, "portcullis_backend_culled"));
    assert!(!has_metric(text, "portcullis_cull_decisions_total"));
}

#[test]
fn concurrently_runs_in_parallel() {
    let b = Backend::start("eps");
    b.set_mode(Mode::Slow(Duration::from_millis(300)));
    let addr = b.addr();
    let out = concurrently(8, move |_| get(&addr, "/", &[]).status);
    assert!(out.iter().all(|s| *s == 200));
    assert!(
        b.max_in_flight() >= 2,
        "max_in_flight={}",
        b.max_in_flight()
    );
}

/// Extra `redis-server` arguments survive a restart (a test that enables `DEBUG` and
/// restarts the server can still use it).
#[test]
fn redis_restart_keeps_extra_arguments() {
    let mut r = RedisServer::start_with_args(&["--enable-debug-command", "local"]);
    assert_eq!(r.cmd(&["DEBUG", "SLEEP", "0"]), "OK");
    r.restart();
    assert_eq!(r.cmd(&["DEBUG", "SLEEP", "0"]), "OK", "DEBUG still enabled");
}

/// The `[[upstreams]]` builders render what the proxy routes by.
#[test]
fn upstream_tables_render_names_and_backends_in_order() {
    let (a, b) = (Backend::start("A"), Backend::start("B"));
    let text = upstreams(&[("app", &[&a, &b]), ("other", &[&a])]);
    let want = format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{a}\", \"{b}\"]\n\n\
         [[upstreams]]\nname = \"other\"\nbackends = [\"{a}\"]\n\n",
        a = a.addr(),
        b = b.addr()
    );
    assert_eq!(text, want);
    assert_eq!(one_upstream(&a), upstreams(&[("app", &[&a])]));
}

/// `Load` records every response with its proxy index and answering backend, and
/// `wait_ok_after` returns once each address has that many successes.
#[test]
fn load_records_samples_per_address() {
    let (a, b) = (Backend::start("A"), Backend::start("B"));
    let load = Load::start(&[a.addr(), b.addr()]);
    let t = Instant::now();
    load.wait_ok_after(&[t, t], 5);
    let samples = load.finish();
    for (i, name) in [(0, "A"), (1, "B")] {
        let mine: Vec<&Sample> = samples.iter().filter(|s| s.proxy == i).collect();
        assert!(mine.len() >= 5, "address {i}: {} samples", mine.len());
        assert!(mine.iter().all(|s| s.ok() && s.end >= s.start));
        assert!(mine.iter().all(|s| s.backend.as_deref() == Some(name)));
    }
}

/// `wait_window_phase` returns the index of a window whose phase `[lo, hi]` was open
/// during the call: not one that ended before it, not one that had not opened yet.
#[test]
fn window_phase_is_reached() {
    for _ in 0..5 {
        let before = now_ms();
        let w = wait_window_phase(200, 50, 80);
        let after = now_ms();
        assert!(w * 200 + 80 >= before, "a phase that ended before the call");
        assert!(after >= w * 200 + 50, "returned before the phase opened");
    }
}

/// The cluster launcher: 3 masters + 3 replicas answer with MOVED-following `redis-cli -c`;
/// killing a master gets its replica promoted and the data it held stays readable.
#[test]
fn redis_cluster_forms_and_fails_over() {
    let mut c = RedisCluster::start(3, 1);
    assert_eq!(c.nodes().len(), 6);
    assert_eq!(c.masters().len(), 3);
    assert_eq!(c.keyslot("foo"), 12182, "CRC16 slot of a known key");
    assert_eq!(c.cmd(&["SET", "{a}k", "1"]), "OK");
    let slot = c.keyslot("{a}k");
    let owner = c
        .masters()
        .iter()
        .rposition(|&(_, first)| first <= slot)
        .expect("an owner");
    // The replica has the write before its master dies: its acknowledged offset reached
    // the master's (WAIT would need the writing connection).
    let port = c.masters()[owner].0;
    let m = c.server(port);
    assert!(
        wait_until(DEADLINE, || {
            let info = m.try_cmd(&["INFO", "replication"]).unwrap_or_default();
            let field = |prefix: &str| {
                info.lines()
                    .find_map(|l| l.trim().strip_prefix(prefix).map(str::to_string))
            };
            let master = field("master_repl_offset:");
            let replica = field("slave0:").and_then(|l| {
                l.split(',')
                    .find_map(|kv| kv.strip_prefix("offset=").map(str::to_string))
            });
            master.is_some() && master == replica
        }),
        "replica never caught up"
    );
    let killed = c.kill_master(owner);
    c.wait_ok();
    assert!(c.masters().iter().all(|&(p, _)| p != killed));
    assert_eq!(c.masters().len(), 3, "the replica took over");
    assert_eq!(c.cmd(&["GET", "{a}k"]), "1");
}

/// The sentinel launcher: a SENTINEL FAILOVER promotes the replica.
#[test]
fn redis_sentinels_fail_over() {
    let s = RedisSentinels::start("selftest", Some("pw-1"));
    let old = s.master_port();
    assert_eq!(s.master().cmd(&["SET", "k", "v"]), "OK");
    let new = s.failover();
    assert_ne!(old, new);
    assert_eq!(s.server(new).cmd(&["GET", "k"]), "v");
    assert_eq!(s.sentinel_addrs().len(), 3);
}
