//! Slow start (`[[upstreams]] slow_start_seconds`): a backend back in rotation takes a
//! share growing from a tenth of its weight to all of it, counted at the backends, on two
//! instances at once.

use portcullis_test_kit as support;

use std::time::{Duration, Instant};
use support::*;

const WINDOW_SECS: u64 = 6;

fn config(a: &Backend, b: &Backend) -> String {
    format!(
        r#"[[upstreams]]
name = "app"
backends = ["{}", "{}"]
slow_start_seconds = {WINDOW_SECS}
retries = 0

[upstreams.health_check]
path = "/health"
interval_ms = 200
fast_interval_ms = 100
timeout_ms = 500
rise = 1
fall = 1

[shedding]
max_concurrency = 0

[rate_limit]
enabled = false

[culling]
enabled = false
"#,
        a.addr(),
        b.addr()
    )
}

fn state_of(p: &Proxy, addr: &str) -> serde_json::Value {
    let s = p.status_json();
    s["upstreams"][0]["backends"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["address"] == addr).cloned())
        .unwrap_or_default()
}

/// `n` requests from each proxy in turn; the share that reached `b`.
fn share_at(proxies: &[&Proxy], b: &Backend, n: usize) -> f64 {
    let before = b.requests();
    for i in 0..n {
        for p in proxies {
            let r = get(&p.addr(), &format!("/r{i}"), &[]);
            assert_eq!(r.status, 200, "{}", r.body_str());
        }
    }
    (b.requests() - before) as f64 / (n * proxies.len()) as f64
}

#[test]
fn a_backend_back_in_rotation_ramps_from_a_tenth_to_its_full_share() {
    let a = Backend::start("a");
    let b = Backend::start("b");
    let cfg = config(&a, &b);
    let p1 = Proxy::start(&cfg);
    let p2 = Proxy::start(&cfg);
    // Both start with the two in rotation: no ramp at start (HAProxy's rule).
    let even = share_at(&[&p1, &p2], &b, 40);
    assert!((0.35..=0.65).contains(&even), "even split before: {even}");

    // b fails its checks, then comes back.
    b.set_mode(Mode::Fail(500));
    for p in [&p1, &p2] {
        assert_eventually!(
            state_of(p, &b.addr())["check"]["healthy"] == false,
            "b down on {}",
            p.addr()
        );
    }
    b.set_mode(Mode::Ok);
    for p in [&p1, &p2] {
        assert_eventually!(
            state_of(p, &b.addr())["slow_start"]["share"].is_number(),
            "b ramping on {}: {}",
            p.addr(),
            state_of(p, &b.addr())
        );
    }
    let back = Instant::now();
    // The first stretch: about a tenth of its share (its weight's half of the traffic).
    let early = share_at(&[&p1, &p2], &b, 50);
    let early_took = back.elapsed();
    assert!(
        early < 0.25,
        "b takes a small share at first: {early} (in {early_took:?})"
    );
    // After the window: its whole share again.
    let deadline = back + Duration::from_secs(WINDOW_SECS);
    if let Some(d) = deadline.checked_duration_since(Instant::now()) {
        std::thread::sleep(d); // the ramp's own length, which this test measures
    }
    for p in [&p1, &p2] {
        assert_eventually!(
            state_of(p, &b.addr())["slow_start"].is_null(),
            "ramp over on {}",
            p.addr()
        );
    }
    let late = share_at(&[&p1, &p2], &b, 40);
    assert!((0.35..=0.65).contains(&late), "full share after: {late}");
    eprintln!("slow start: share {even:.2} before, {early:.2} in the first {early_took:?}, {late:.2} after");
}

/// The share `p` gives `addr` while it ramps (`None` when it does not ramp there).
fn ramp_share(p: &Proxy, addr: &str) -> Option<f64> {
    state_of(p, addr)["slow_start"]["share"].as_f64()
}

#[test]
fn instances_ramp_a_backend_together_from_the_start_the_store_records() {
    let redis = RedisServer::start();
    let a = Backend::start("a");
    let b = Backend::start("b");
    let cfg = format!(
        "{}\n[redis]\nurl = \"{}\"\nkey_prefix = \"ramp-fleet\"\ntimeout_ms = 200\n",
        config(&a, &b),
        redis.url()
    );
    let p1 = Proxy::start(&cfg);
    let p2 = Proxy::start(&cfg);
    b.set_mode(Mode::Fail(500));
    for p in [&p1, &p2] {
        assert_eventually!(
            state_of(p, &b.addr())["check"]["healthy"] == false,
            "b down on {}",
            p.addr()
        );
    }
    // p2 is frozen while b comes back: it sees b back two seconds after p1 does, and on
    // its own would ramp from there (a tenth while p1 gives b near half).
    p2.signal("STOP");
    b.set_mode(Mode::Ok);
    assert_eventually!(ramp_share(&p1, &b.addr()).is_some(), "b ramping on p1");
    let p1_saw = Instant::now();
    std::thread::sleep(Duration::from_secs(2)); // the freeze is the scenario
    p2.signal("CONT");
    assert_eventually!(
        ramp_share(&p2, &b.addr()).is_some(),
        "b ramping on p2: {}",
        state_of(&p2, &b.addr())
    );
    // Within a sync or two both give b the same share: the ramp from p1's sighting.
    let mut seen = Vec::new();
    assert_eventually!(
        {
            let (s1, s2) = (ramp_share(&p1, &b.addr()), ramp_share(&p2, &b.addr()));
            seen.push((p1_saw.elapsed().as_millis(), s1, s2));
            matches!((s1, s2), (Some(s1), Some(s2)) if (s1 - s2).abs() <= 0.1 && s2 >= 0.3)
        },
        "p2 ramps b from the fleet's start (ms since p1 saw b, p1's share, p2's): {seen:?}"
    );
    if let Some((ms, s1, s2)) = seen.last() {
        eprintln!("fleet ramp: {ms} ms after p1 saw b back, p1 gives it {s1:?}, p2 {s2:?}");
    }
}
