//! Load shedding (CONTRACT §2 `[shedding]`, §3 load shed 503, §5.1).

use portcullis_test_kit as support;

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use support::*;

fn config(b: &Backend, cap: u32) -> String {
    format!(
        r#"{}
[[routes]]
path_prefix = "/critical"
upstream = "app"
priority = "critical"

[[routes]]
path_prefix = "/normal"
upstream = "app"
priority = "normal"

[[routes]]
path_prefix = "/low"
upstream = "app"
priority = "low"

[shedding]
max_concurrency = {cap}
retry_after_seconds = 1

[rate_limit]
enabled = false
"#,
        one_upstream(b)
    )
}

/// Starts a GET in a thread; returns (status, elapsed, retry-after).
fn spawn_get(addr: &str, path: &str) -> JoinHandle<(u16, Duration, Option<String>)> {
    let addr = addr.to_string();
    let path = path.to_string();
    thread::spawn(move || {
        let t0 = Instant::now();
        let r = get(&addr, &path, &[]);
        (
            r.status,
            t0.elapsed(),
            r.header("retry-after").map(String::from),
        )
    })
}

fn assert_shed(r: &Resp, what: &str) {
    assert_eq!(
        r.status,
        503,
        "{what}: expected shed, body {}",
        r.body_str()
    );
    assert!(
        r.retry_after().is_some_and(|s| s >= 1),
        "{what}: Retry-After must be an integer >= 1, got {:?}",
        r.header("retry-after")
    );
}

/// Sends held requests to `path` until the backend has exactly `n` in flight.
fn fill(
    p: &Proxy,
    b: &Backend,
    path: &str,
    n: usize,
    held: &mut Vec<JoinHandle<(u16, Duration, Option<String>)>>,
) {
    let start = b.in_flight();
    for _ in start..n {
        held.push(spawn_get(&p.addr(), path));
    }
    assert_eventually!(
        b.in_flight() == n,
        "backend in_flight={} want {n}",
        b.in_flight()
    );
}

/// A backend holding its requests, and a proxy with `max_concurrency = cap` before it.
fn holding(cap: u32) -> (Backend, Proxy) {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start(&config(&b, cap));
    (b, p)
}

#[test]
fn cap_reached_sheds_extra_requests_at_once() {
    let (b, p) = holding(4);
    let shed_before = p
        .metric(r#"portcullis_requests_total{outcome="shed"}"#)
        .unwrap_or(0.0);

    let mut held = Vec::new();
    fill(&p, &b, "/critical/a", 4, &mut held);

    // three more: all shed, quickly, without reaching the backend
    let extra: Vec<_> = (0..3)
        .map(|_| spawn_get(&p.addr(), "/critical/b"))
        .collect();
    for h in extra {
        let (status, took, ra) = h.join().expect("join");
        assert_eq!(status, 503, "request over the cap must be shed");
        assert!(
            ra.as_deref()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .is_some_and(|s| s >= 1),
            "Retry-After >= 1, got {ra:?}"
        );
        assert!(
            took < Duration::from_secs(3),
            "shed must answer at once, took {took:?}"
        );
    }
    assert_eq!(b.in_flight(), 4);
    assert_eq!(b.requests(), 4, "shed requests never reach the backend");

    b.release_all();
    for h in held {
        assert_eq!(h.join().expect("join").0, 200);
    }
    assert_eventually!(
        p.metric(r#"portcullis_requests_total{outcome="shed"}"#)
            .unwrap_or(0.0)
            >= shed_before + 3.0,
        "shed counter did not increase by 3:\n{}",
        p.metrics()
    );
    // capacity is free again
    b.set_mode(Mode::Ok);
    assert_eq!(p.get("/critical/c", &[]).status, 200);
}

#[test]
fn priority_classes_shed_at_their_thresholds() {
    // cap 20: low is shed at 15 in flight (75%), normal at 18 (90%), critical at 20.
    let (b, p) = holding(20);
    let mut held = Vec::new();

    fill(&p, &b, "/critical/fill", 14, &mut held);
    // 14 in flight: a low request is still admitted (becomes the 15th)
    fill(&p, &b, "/low/admitted", 15, &mut held);
    // 15 in flight: low is shed, normal admitted
    assert_shed(&p.get("/low/shed", &[]), "low at 15/20");
    fill(&p, &b, "/normal/admitted", 18, &mut held);
    // 18 in flight: normal shed, low shed, critical admitted
    assert_shed(&p.get("/normal/shed", &[]), "normal at 18/20");
    assert_shed(&p.get("/low/shed2", &[]), "low at 18/20");
    fill(&p, &b, "/critical/admitted", 20, &mut held);
    // 20 in flight: everything is shed
    assert_shed(&p.get("/critical/shed", &[]), "critical at 20/20");
    assert_shed(&p.get("/normal/shed2", &[]), "normal at 20/20");

    assert_eq!(b.requests(), 20, "shed requests never reach the backend");
    let paths = b.received_paths();
    assert!(
        !paths
            .iter()
            .any(|p| p.ends_with("/shed") || p.ends_with("shed2")),
        "a shed request reached the backend: {paths:?}"
    );

    b.release_all();
    for h in held {
        assert_eq!(h.join().expect("join").0, 200);
    }
}

#[test]
fn backend_never_sees_more_than_the_cap() {
    let cap = 6;
    let b = Backend::start("app");
    b.set_mode(Mode::Slow(Duration::from_millis(150)));
    let p = Proxy::start(&config(&b, cap));
    let addr = p.addr();
    let statuses = concurrently(50, move |i| {
        get(&addr, &format!("/critical/{i}"), &[]).status
    });
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let shed = statuses.iter().filter(|s| **s == 503).count();
    assert_eq!(ok + shed, 50, "only 200 and 503 expected, got {statuses:?}");
    assert!(ok >= cap as usize, "at least the cap is served, ok={ok}");
    assert!(shed > 0, "a burst of 50 over cap {cap} must shed some");
    assert!(
        b.max_in_flight() <= cap as usize,
        "backend saw {} concurrent requests, cap {cap}",
        b.max_in_flight()
    );
    assert_eq!(b.requests() as usize, ok);
}

#[test]
fn zero_disables_the_cap() {
    let (b, p) = holding(0);
    let mut held = Vec::new();
    fill(&p, &b, "/low/x", 40, &mut held);
    b.release_all();
    for h in held {
        assert_eq!(h.join().expect("join").0, 200);
    }
    assert_eq!(
        p.metric(r#"portcullis_requests_total{outcome="shed"}"#)
            .unwrap_or(0.0),
        0.0
    );
}

#[test]
fn inflight_gauge_follows_held_requests() {
    let (b, p) = holding(10);
    let mut held = Vec::new();
    fill(&p, &b, "/normal/g", 3, &mut held);
    assert_eventually!(
        p.metric("portcullis_inflight_requests") == Some(3.0),
        "portcullis_inflight_requests = {:?}",
        p.metric("portcullis_inflight_requests")
    );
    assert_eq!(p.status_json()["inflight"].as_f64(), Some(3.0));
    b.release_all();
    for h in held {
        assert_eq!(h.join().expect("join").0, 200);
    }
    assert_eventually!(p.metric("portcullis_inflight_requests") == Some(0.0));
}
