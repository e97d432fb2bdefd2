//! Routing and forwarding (CONTRACT §2 `[[upstreams]]`, `[[routes]]`; §3 "no backend").

use portcullis_test_kit as support;

use std::collections::HashSet;
use support::*;

fn two_upstreams(a: &Backend, b: &Backend) -> String {
    format!(
        r#"{}
[[routes]]
path_prefix = "/api"
upstream = "alpha"

[[routes]]
path_prefix = "/api/v2"
upstream = "beta"

[[routes]]
host = "b.example"
path_prefix = "/"
upstream = "beta"

[[routes]]
path_prefix = "/"
upstream = "alpha"
"#,
        upstreams(&[("alpha", &[a]), ("beta", &[b])])
    )
}

#[test]
fn routes_by_longest_prefix_and_host() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let p = Proxy::start(&two_upstreams(&a, &b));

    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        ("/api", &[], "A"),
        ("/api/users", &[], "A"),
        ("/api/v2", &[], "B"),
        ("/api/v2/items?x=1", &[], "B"),
        ("/other", &[], "A"),
        ("/", &[], "A"),
        ("/other", &[("Host", "b.example")], "B"),
        ("/", &[("Host", "b.example")], "B"),
    ];
    for (path, headers, want) in cases {
        let r = p.get(path, headers);
        assert_eq!(r.status, 200, "GET {path} {headers:?}: {}", r.body_str());
        assert_eq!(
            r.header("x-backend"),
            Some(*want),
            "GET {path} {headers:?} routed to the wrong upstream"
        );
        assert_eq!(
            r.header("x-echo-path"),
            Some(*path),
            "path (with query) forwarded unchanged"
        );
    }
    assert_eq!(a.requests() + b.requests(), cases.len() as u64);
}

#[test]
fn without_routes_everything_goes_to_first_upstream() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let p = Proxy::start(&upstreams(&[("first", &[&a]), ("second", &[&b])]));
    for path in ["/", "/api", "/api/v2/x", "/second"] {
        for host in ["localhost", "b.example"] {
            let r = p.get(path, &[("Host", host)]);
            assert_eq!(r.status, 200);
            assert_eq!(r.header("x-backend"), Some("A"), "GET {path} Host {host}");
        }
    }
    assert_eq!(b.requests(), 0);
}

#[test]
fn round_robin_across_backends_of_one_upstream() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let p = Proxy::start(&upstream_of(&[&a, &b]));
    let n = 40;
    for i in 0..n {
        let r = p.get(&format!("/rr/{i}"), &[]);
        assert_eq!(r.status, 200);
    }
    let (ra, rb) = (a.requests(), b.requests());
    assert_eq!(ra + rb, n);
    assert!(
        (14..=26).contains(&ra) && (14..=26).contains(&rb),
        "round robin should be roughly even: A={ra} B={rb}"
    );
}

#[test]
fn request_bodies_arrive_intact() {
    let a = Backend::start("A");
    let p = Proxy::start(&one_upstream(&a));

    // small Content-Length body, echoed back
    let r = post(
        &p.addr(),
        "/echo",
        &[("x-echo-body", "1"), ("Content-Type", "text/plain")],
        b"hello, portcullis",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), "hello, portcullis");
    assert_eq!(a.last_received().expect("received").method, "POST");

    // ~1 MB body: length and hash must match
    let big: Vec<u8> = (0..1_048_576u32)
        .map(|i| (i.wrapping_mul(31) % 253) as u8)
        .collect();
    let r = post(&p.addr(), "/upload", &[], &big);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-echo-body-len"), Some("1048576"));
    assert_eq!(r.header("x-echo-body-fnv"), Some(fnv1a(&big).as_str()));

    // chunked request body
    let mut c = Conn::open(&p.addr()).expect("connect");
    let r = c
        .request_chunked(
            "POST",
            "/chunked",
            &[("x-echo-body", "1")],
            &[b"first;", b"second;", &[b'x'; 10_000]],
        )
        .expect("chunked post");
    assert_eq!(r.status, 200);
    let mut want = b"first;second;".to_vec();
    want.extend_from_slice(&[b'x'; 10_000]);
    assert_eq!(r.body.len(), want.len());
    assert!(r.body == want, "chunked body altered");

    // the same client connection keeps working (keep-alive through the proxy)
    let r = c
        .request("GET", "/after", &[], b"")
        .expect("keep-alive get");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-echo-path"), Some("/after"));
}

#[test]
fn forwarding_headers() {
    let a = Backend::start("A");
    let p = Proxy::start(&one_upstream(&a));

    let r = p.get("/h", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-echo-xff"), Some("127.0.0.1"), "X-Forwarded-For");
    assert_eq!(r.header("x-echo-proto"), Some("http"), "X-Forwarded-Proto");
    let id1 = r
        .header("x-echo-request-id")
        .expect("X-Request-Id generated when absent")
        .to_string();
    assert!(!id1.trim().is_empty());

    let r2 = p.get("/h", &[]);
    let id2 = r2
        .header("x-echo-request-id")
        .expect("X-Request-Id generated")
        .to_string();
    assert_ne!(id1, id2, "generated request ids are unique");

    let r3 = p.get("/h", &[("X-Request-Id", "client-chosen-id-42")]);
    assert_eq!(
        r3.header("x-echo-request-id"),
        Some("client-chosen-id-42"),
        "X-Request-Id preserved when present"
    );
    let rec = a.last_received().expect("received");
    assert_eq!(
        rec.header_all("x-request-id").len(),
        1,
        "exactly one X-Request-Id forwarded: {:?}",
        rec.headers
    );
}

/// Upstream "app" on `addrs` (some of which may be dead) with `connect_timeout_ms`.
fn app_with_timeout(addrs: &[&str], connect_timeout_ms: u64) -> String {
    let list: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [{}]\nconnect_timeout_ms = {connect_timeout_ms}\n",
        list.join(", ")
    )
}

/// `n` GETs on `/{prefix}/{i}`, each answered 200 by backend `name` (retried there).
fn expect_all_from(p: &Proxy, prefix: &str, n: usize, name: &str) {
    for i in 0..n {
        let r = p.get(&format!("/{prefix}/{i}"), &[]);
        assert_eq!(
            r.status,
            200,
            "request {i} must be retried on {name}: {}",
            r.body_str()
        );
        assert_eq!(r.header("x-backend"), Some(name));
    }
}

#[test]
fn connect_failure_is_retried_on_another_backend() {
    let live = Backend::start("live");
    let dead = format!("127.0.0.1:{}", free_port()); // nothing listens here
    let p = Proxy::start(&app_with_timeout(&[&dead, &live.addr()], 1000));
    expect_all_from(&p, "r", 12, "live");
    assert_eq!(live.requests(), 12);
}

#[test]
fn stopped_backend_after_traffic_is_retried_on_the_other() {
    let mut a = Backend::start("A");
    let b = Backend::start("B");
    let p = Proxy::start(&upstream_of(&[&a, &b]));
    for i in 0..6 {
        assert_eq!(p.get(&format!("/warm/{i}"), &[]).status, 200);
    }
    assert!(a.requests() > 0 && b.requests() > 0);
    a.stop();
    expect_all_from(&p, "after-stop", 12, "B");
}

#[test]
fn no_backend_reachable_is_503_with_retry_after() {
    let d1 = format!("127.0.0.1:{}", free_port());
    let d2 = format!("127.0.0.1:{}", free_port());
    let p = Proxy::start(&app_with_timeout(&[&d1, &d2], 500));
    let mut seen = HashSet::new();
    for i in 0..3 {
        let r = p.get(&format!("/nothing/{i}"), &[]);
        assert_eq!(r.status, 503, "body: {}", r.body_str());
        let ra = r.retry_after();
        assert!(
            ra.is_some_and(|s| s >= 1),
            "Retry-After must be an integer >= 1, got {:?}",
            r.header("retry-after")
        );
        seen.insert(r.status);
    }
    // the proxy is still healthy
    assert_eq!(p.admin_get("/healthz").status, 200);
}
