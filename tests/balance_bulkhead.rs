//! Per-upstream bulkheads (CONTRACT §10 `max_inflight`).

use portcullis_test_kit as support;

use std::thread;
use std::time::Duration;
use support::*;

#[test]
fn a_full_bulkhead_sheds_its_upstream_while_another_is_unaffected() {
    let slow = Backend::start("slow");
    let fast = Backend::start("fast");
    slow.set_mode(Mode::Hold);
    let cfg = format!(
        "[[upstreams]]\nname = \"slowup\"\nbackends = [\"{}\"]\nmax_inflight = 2\n\n\
         [[upstreams]]\nname = \"fastup\"\nbackends = [\"{}\"]\n\n\
         [[routes]]\npath_prefix = \"/slow\"\nupstream = \"slowup\"\n\
         [[routes]]\npath_prefix = \"/fast\"\nupstream = \"fastup\"\n\
         [shedding]\nmax_concurrency = 100\nretry_after_seconds = 2\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        slow.addr(),
        fast.addr()
    );
    let p = Proxy::start(&cfg);
    let addr = p.addr();
    let held: Vec<_> = (0..2)
        .map(|i| {
            let addr = addr.clone();
            thread::spawn(move || get(&addr, &format!("/slow/{i}"), &[]).status)
        })
        .collect();
    eventually(
        DEADLINE,
        || "two held at slow".into(),
        || slow.in_flight() == 2,
    );

    for i in 0..5 {
        let r = p.get(&format!("/slow/more{i}"), &[]);
        assert_eq!(r.status, 503, "{}", r.body_str());
        assert_eq!(r.retry_after(), Some(2));
        assert!(r.body_str().contains("shed"), "{}", r.body_str());
    }
    assert_eq!(slow.requests(), 2, "a shed request reached the backend");
    for i in 0..20 {
        assert_eq!(p.get(&format!("/fast/{i}"), &[]).status, 200);
    }
    assert_eq!(
        p.metric("portcullis_bulkhead_shed_total{upstream=\"slowup\"}"),
        Some(5.0)
    );
    assert_eq!(
        p.metric("portcullis_requests_total{outcome=\"shed\"}"),
        Some(5.0)
    );

    slow.release_all();
    for h in held {
        assert_eq!(h.join().expect("join"), 200);
    }
    slow.set_mode(Mode::Ok);
    // Slots are given back: the upstream takes requests again.
    eventually(
        Duration::from_secs(5),
        || "slow upstream admits again".into(),
        || p.get("/slow/again", &[]).status == 200,
    );
}
