//! The queue at the cap (`[shedding] queue_timeout_ms`, `max_queue`, `queue_target_ms`)
//! and the upstream's queue (`max_conn`, `max_inflight` with the upstream's
//! `queue_timeout_ms`), end to end: the real binary, real backends that hold or slow
//! their answers and count what reaches them, real clients.

use portcullis_test_kit as support;

use std::io::Write;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use support::*;

fn config(b: &Backend, cap: u32, shedding: &str) -> String {
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
{shedding}

[rate_limit]
enabled = false

[culling]
enabled = false
"#,
        one_upstream(b)
    )
}

fn spawn_get(addr: &str, path: &str) -> JoinHandle<u16> {
    let addr = addr.to_string();
    let path = path.to_string();
    thread::spawn(move || get(&addr, &path, &[]).status)
}

fn waiting(p: &Proxy, class: &str) -> f64 {
    p.metric(&format!(r#"portcullis_queue_waiting{{class="{class}"}}"#))
        .unwrap_or(0.0)
}

fn shed(p: &Proxy, reason: &str) -> f64 {
    let text = p.metrics();
    metric_samples(&text)
        .into_iter()
        .filter(|(name, labels, _)| {
            name == "portcullis_shed_total"
                && labels.iter().any(|(k, v)| k == "reason" && v == reason)
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// A burst of `n` requests at once; their statuses.
fn burst(p: &Proxy, n: usize) -> Vec<u16> {
    let handles: Vec<_> = (0..n)
        .map(|i| spawn_get(&p.addr(), &format!("/critical/{i}")))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect()
}

#[test]
fn a_burst_at_twice_the_cap_waits_for_slots_instead_of_503() {
    let b = Backend::start("app");
    b.set_mode(Mode::Slow(Duration::from_millis(150)));
    // A generous timeout: the machine running the suite may be loaded.
    let p = Proxy::start(&config(&b, 8, "queue_timeout_ms = 5000"));
    let statuses = burst(&p, 16);
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every request of the burst is served: {statuses:?}"
    );
    assert!(
        b.max_in_flight() <= 8,
        "the cap holds at the backend: {}",
        b.max_in_flight()
    );
    let waited = p
        .metric("portcullis_queue_wait_seconds_count")
        .unwrap_or(0.0);
    let sum = p.metric("portcullis_queue_wait_seconds_sum").unwrap_or(0.0);
    assert!(waited >= 8.0, "the waits are in the histogram: {waited}");
    assert!(sum > 0.05, "some waited at least one answer's time: {sum}");
    assert_eq!(shed(&p, "queue_timeout") + shed(&p, "queue_full"), 0.0);

    // The same burst without a queue: today's immediate 503s.
    let b2 = Backend::start("app");
    b2.set_mode(Mode::Slow(Duration::from_millis(300)));
    let p2 = Proxy::start(&config(&b2, 8, ""));
    let statuses = burst(&p2, 16);
    let shed_now = statuses.iter().filter(|s| **s == 503).count();
    assert!(
        shed_now > 0,
        "without a queue the burst is shed: {statuses:?}"
    );
    assert_eq!(shed(&p2, "cap") as usize, shed_now);
}

#[test]
fn slots_go_to_critical_then_normal_then_low() {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start(&config(&b, 1, "queue_timeout_ms = 30000"));
    let first = spawn_get(&p.addr(), "/critical/first");
    assert_eventually!(b.in_flight() == 1, "first held");
    // Join the line in reverse order of class.
    let mut waiters = Vec::new();
    for (path, class) in [
        ("/low/l", "low"),
        ("/normal/n", "normal"),
        ("/critical/c", "critical"),
    ] {
        waiters.push(spawn_get(&p.addr(), path));
        assert_eventually!(waiting(&p, class) == 1.0, "{class} waiting");
    }
    assert_eq!(b.requests(), 1);
    // Each answer frees the one slot: the next in line is the highest class. (The
    // backend records a held request when it answers.)
    let order = ["/critical/first", "/critical/c", "/normal/n", "/low/l"];
    for k in 1..order.len() {
        b.release_all();
        assert_eventually!(b.requests() == k as u64 + 1, "next admitted");
        assert_eventually!(b.received_paths().len() == k, "answered");
        assert_eq!(b.received_paths(), order[..k]);
    }
    b.release_all();
    b.set_mode(Mode::Ok);
    b.release_all();
    assert_eq!(first.join().expect("join"), 200);
    for w in waiters {
        assert_eq!(w.join().expect("join"), 200);
    }
}

#[test]
fn a_client_that_leaves_the_queue_is_never_sent_upstream() {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start(&config(&b, 1, "queue_timeout_ms = 30000"));
    let first = spawn_get(&p.addr(), "/critical/first");
    assert_eventually!(b.in_flight() == 1, "first held");
    let mut c = Conn::open(&p.addr()).expect("connect");
    c.write_raw(b"GET /critical/gone HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    assert_eventually!(waiting(&p, "critical") == 1.0, "queued");
    drop(c);
    assert_eventually!(
        p.metric("portcullis_queue_abandoned_total") == Some(1.0),
        "the proxy saw the client leave"
    );
    assert_eq!(waiting(&p, "critical"), 0.0);
    // A request queued behind it is the next served; the one that left never is.
    let next = spawn_get(&p.addr(), "/critical/next");
    assert_eventually!(waiting(&p, "critical") == 1.0, "next queued");
    b.set_mode(Mode::Ok);
    b.release_all();
    assert_eq!(first.join().expect("join"), 200);
    assert_eq!(next.join().expect("join"), 200);
    assert!(
        !b.received_paths().iter().any(|p| p == "/critical/gone"),
        "{:?}",
        b.received_paths()
    );
}

#[test]
fn an_http2_stream_reset_while_queued_is_never_sent_upstream() {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start_with_server("h2c = true", &config(&b, 1, "queue_timeout_ms = 30000"));
    let first = spawn_get(&p.addr(), "/critical/first");
    assert_eventually!(b.in_flight() == 1, "first held");
    let mut c = H2Raw::connect(&p.addr());
    c.headers(1, &H2Raw::request_block("x", "/critical/reset", &[]))
        .expect("headers");
    c.headers(3, &H2Raw::request_block("x", "/critical/kept", &[]))
        .expect("headers");
    assert_eventually!(waiting(&p, "critical") == 2.0, "both streams queued");
    // The client gives up on stream 1 only: it leaves the line, stream 3 stays.
    c.rst(1, 0x8).expect("rst");
    assert_eventually!(
        p.metric("portcullis_queue_abandoned_total") == Some(1.0),
        "the proxy saw the reset"
    );
    assert_eq!(waiting(&p, "critical"), 1.0);
    b.set_mode(Mode::Ok);
    b.release_all();
    assert_eq!(first.join().expect("join"), 200);
    assert_eventually!(b.requests() == 2, "the kept stream is served");
    assert!(
        !b.received_paths().iter().any(|p| p == "/critical/reset"),
        "{:?}",
        b.received_paths()
    );
}

#[test]
fn a_full_queue_and_a_timeout_answer_503_with_retry_after() {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start(&config(&b, 1, "queue_timeout_ms = 300\nmax_queue = 1"));
    let first = spawn_get(&p.addr(), "/critical/first");
    assert_eventually!(b.in_flight() == 1, "first held");
    let t0 = Instant::now();
    let waiter = thread::spawn({
        let addr = p.addr();
        move || get(&addr, "/critical/waits", &[])
    });
    assert_eventually!(waiting(&p, "critical") == 1.0, "one waits");
    let full = get(&p.addr(), "/critical/full", &[]);
    assert_eq!(full.status, 503);
    assert!(full.retry_after().is_some_and(|s| s >= 1));
    let timed_out = waiter.join().expect("join");
    assert_eq!(timed_out.status, 503);
    assert!(timed_out.retry_after().is_some_and(|s| s >= 1));
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert_eq!(shed(&p, "queue_full"), 1.0);
    assert_eq!(shed(&p, "queue_timeout"), 1.0);
    b.set_mode(Mode::Ok);
    b.release_all();
    assert_eq!(first.join().expect("join"), 200);
    assert_eq!(b.received_paths(), ["/critical/first"]);
}

/// Admitted requests' waits: the share at most `le` seconds, from the histogram.
fn share_waited_at_most(p: &Proxy, le: &str) -> f64 {
    let under = p
        .metric(&format!(
            r#"portcullis_queue_wait_seconds_bucket{{le="{le}"}}"#
        ))
        .unwrap_or(0.0);
    let all = p
        .metric("portcullis_queue_wait_seconds_count")
        .unwrap_or(0.0);
    assert!(all > 0.0, "some requests waited");
    under / all
}

/// Open-loop load at `rate` per second for `secs`, each request in its own thread.
fn open_loop(addr: &str, rate: u64, secs: u64) -> Vec<u16> {
    let gap = Duration::from_micros(1_000_000 / rate);
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..rate * secs {
        let due = start + gap * i as u32;
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            thread::sleep(d); // pacing the load, not waiting for an outcome
        }
        handles.push(spawn_get(addr, &format!("/critical/{i}")));
    }
    handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect()
}

#[test]
fn codel_keeps_admitted_waits_short_under_sustained_overload() {
    // Capacity: 2 slots of 50 ms = 40/s; offered 120/s for 4 s (3×). A low rate keeps the
    // client and the proxies' own work small on a loaded machine: the goodput and the
    // p99 are measured by the overload bench, and the policy's by its simulation.
    let run = |target: &str| {
        let b = Backend::start("app");
        b.set_mode(Mode::Slow(Duration::from_millis(50)));
        let p = Proxy::start(&config(
            &b,
            2,
            &format!("queue_timeout_ms = 2000\nmax_queue = 4096\n{target}"),
        ));
        let statuses = open_loop(&p.addr(), 120, 4);
        let ok = statuses.iter().filter(|x| **x == 200).count();
        eprintln!(
            "{target:?}: {ok} ok of {}, backend saw {} (max in flight {})",
            statuses.len(),
            b.requests(),
            b.max_in_flight()
        );
        p
    };
    let fifo = run("");
    let codel = run("queue_target_ms = 5");
    // FIFO: the queue stands, admitted requests waited long. CoDel: newest first once the
    // queue stands; what waited longest is shed.
    let fifo_quick = share_waited_at_most(&fifo, "0.05");
    let codel_quick = share_waited_at_most(&codel, "0.05");
    eprintln!(
        "admitted within 50 ms: fifo {:.0}%, codel {:.0}%",
        fifo_quick * 100.0,
        codel_quick * 100.0
    );
    assert!(
        codel_quick > fifo_quick + 0.2,
        "CoDel admits fresher requests: {codel_quick} vs FIFO {fifo_quick}"
    );
    assert!(shed(&codel, "queue_timeout") > 0.0);
}

#[test]
fn max_conn_holds_per_backend_and_full_backends_queue_then_503() {
    let slow = Backend::start("slow");
    slow.set_mode(Mode::Slow(Duration::from_millis(200)));
    let fast = Backend::start("fast");
    fast.set_mode(Mode::Slow(Duration::from_millis(200)));
    let cfg = format!(
        r#"[[upstreams]]
name = "app"
backends = [
  {{ name = "slow", address = "{}", max_conn = 2 }},
  {{ name = "fast", address = "{}", max_conn = 3 }},
]
queue_timeout_ms = 5000
retries = 0

[shedding]
max_concurrency = 0

[rate_limit]
enabled = false

[culling]
enabled = false
"#,
        slow.addr(),
        fast.addr()
    );
    let p = Proxy::start(&cfg);
    // 15 at once on 5 connections' worth of room: they wait their turn, none fails.
    let statuses = burst(&p, 15);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(slow.max_in_flight() <= 2, "slow: {}", slow.max_in_flight());
    assert!(fast.max_in_flight() <= 3, "fast: {}", fast.max_in_flight());
    assert_eq!(slow.requests() + fast.requests(), 15);

    // Every backend full and a short queue: requests wait, then 503.
    slow.set_mode(Mode::Hold);
    fast.set_mode(Mode::Hold);
    let held: Vec<_> = (0..5)
        .map(|i| spawn_get(&p.addr(), &format!("/h{i}")))
        .collect();
    assert_eventually!(slow.in_flight() + fast.in_flight() == 5, "both full");
    assert_eventually!(
        p.metric(r#"portcullis_upstream_queue_waiting{upstream="app"}"#)
            .is_some(),
        "gauge"
    );
    let cfg_short = cfg.replace("queue_timeout_ms = 5000", "queue_timeout_ms = 200");
    p.rewrite_config(&cfg_short);
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "reload: {}", r.body_str());
    let t0 = Instant::now();
    let r = get(&p.addr(), "/over", &[]);
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert!(r.retry_after().is_some_and(|s| s >= 1));
    assert!(t0.elapsed() >= Duration::from_millis(200));
    assert!(
        p.metric(r#"portcullis_upstream_queue_shed_total{reason="queue_timeout",upstream="app"}"#)
            .unwrap_or(0.0)
            >= 1.0
    );
    slow.set_mode(Mode::Ok);
    fast.set_mode(Mode::Ok);
    slow.release_all();
    fast.release_all();
    for h in held {
        assert_eq!(h.join().expect("join"), 200);
    }
}

#[test]
fn a_full_bulkhead_waits_with_the_upstreams_queue() {
    let b = Backend::start("app");
    b.set_mode(Mode::Slow(Duration::from_millis(150)));
    let p = Proxy::start(&balanced_app(
        &[&b],
        "max_inflight = 3\nqueue_timeout_ms = 5000",
    ));
    let statuses = burst(&p, 9);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(b.max_in_flight() <= 3, "{}", b.max_in_flight());
    assert_eq!(
        p.metric(r#"portcullis_bulkhead_shed_total{upstream="app"}"#)
            .unwrap_or(0.0),
        0.0
    );
    let _ = std::io::stderr().flush();
}

#[test]
fn a_tiers_priority_orders_the_queue_within_a_route() {
    use sha2::{Digest, Sha256};
    let b = Backend::start("b");
    b.set_mode(Mode::Hold);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tenants.toml");
    let hash = |k: &str| format!("sha256:{}", hex::encode(Sha256::digest(k.as_bytes())));
    std::fs::write(
        &file,
        format!(
            "[[tenant]]\nname = \"payer\"\ntier = \"gold\"\nkeys = [\"{}\"]\n\n\
             [[tenant]]\nname = \"freeloader\"\ntier = \"free\"\nkeys = [\"{}\"]\n",
            hash("gold-key"),
            hash("free-key")
        ),
    )
    .expect("write tenants");
    // One route (normal); the tiers set the class each tenant's requests wait in.
    let cfg = format!(
        "{}[shedding]\nmax_concurrency = 1\nqueue_timeout_ms = 30000\n\n\
         [rate_limit]\nlimit = 1000\n\n[tenants]\nfile = \"{}\"\n\n\
         [tiers.gold]\nlimit = 1000\npriority = \"critical\"\n\n\
         [tiers.free]\nlimit = 1000\npriority = \"low\"\n\n[culling]\nenabled = false\n",
        one_upstream(&b),
        file.display()
    );
    let p = Proxy::start(&cfg);
    let as_key = |path: &'static str, key: &'static str| {
        let addr = p.addr();
        thread::spawn(move || get(&addr, path, &[("x-api-key", key)]).status)
    };
    let first = as_key("/first", "free-key");
    assert_eventually!(b.in_flight() == 1, "first held");
    let free = as_key("/free", "free-key");
    assert_eventually!(waiting(&p, "low") == 1.0, "free waits (low)");
    let gold = as_key("/gold", "gold-key");
    assert_eventually!(waiting(&p, "critical") == 1.0, "gold waits (critical)");
    b.release_all();
    assert_eventually!(b.requests() == 2, "next admitted");
    b.release_all();
    assert_eventually!(b.received_paths().len() == 2, "answered");
    assert_eq!(b.received_paths()[1], "/gold", "the higher tier goes first");
    b.set_mode(Mode::Ok);
    b.release_all();
    for h in [first, free, gold] {
        assert_eq!(h.join().expect("join"), 200);
    }
}
