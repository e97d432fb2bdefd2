//! `Retry-After` that spreads retries (issue 44): a shed 503's `Retry-After` is
//! `retry_after_seconds + j`, `j` uniform in `0..=ceil(base × s / (1 − s))` with `s` the
//! share of requests shed over the last two seconds (at most 0.9). Real proxy, real
//! backend holding its requests so everything over the cap is shed.

use portcullis_test_kit as support;

use std::collections::BTreeMap;
use std::thread;
use support::*;

fn config(b: &Backend, base: u64) -> String {
    format!(
        "{}\n[shedding]\nmax_concurrency = 4\nretry_after_seconds = {base}\n\n[rate_limit]\nenabled = false\n",
        one_upstream(b)
    )
}

/// Fills the cap with held requests, then sends `n` more, one after another: all shed.
/// Returns how many 503s said each `Retry-After`.
fn shed_retry_afters(base: u64, n: usize) -> BTreeMap<u64, usize> {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let p = Proxy::start(&config(&b, base));
    let held: Vec<_> = (0..3)
        .map(|_| {
            let addr = p.addr();
            thread::spawn(move || get(&addr, "/held", &[]).status)
        })
        .collect();
    assert_eventually!(b.in_flight() == 3, "in flight {}", b.in_flight());
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let r = get(&p.addr(), "/over", &[]);
        assert_eq!(r.status, 503, "over the cap (normal class: 3 of 4)");
        let ra = r.retry_after().expect("a shed 503 has Retry-After");
        *seen.entry(ra).or_insert(0) += 1;
    }
    b.set_mode(Mode::Ok);
    for h in held {
        assert_eq!(h.join().expect("join"), 200);
    }
    seen
}

#[test]
fn retry_after_of_shed_requests_is_spread_by_the_share_shed() {
    // Everything over the cap shed (s capped at 0.9): 1..=10 s for a base of 1,
    // about evenly.
    let seen = shed_retry_afters(1, 400);
    eprintln!("Retry-After spread, base 1, all shed: {seen:?}");
    assert!(seen.keys().all(|v| (1..=10).contains(v)), "{seen:?}");
    assert!(seen.len() >= 8, "spread over the range: {seen:?}");
    let most = seen.values().copied().max().unwrap_or(0);
    assert!(most <= 100, "no one value takes a quarter of 400: {seen:?}");
    let mean = seen.iter().map(|(v, n)| v * *n as u64).sum::<u64>() as f64 / 400.0;
    assert!(
        (4.0..=7.0).contains(&mean),
        "mean {mean} near 5.5: {seen:?}"
    );

    // The base scales the range: base 3 → 3..=30.
    let seen = shed_retry_afters(3, 200);
    eprintln!("Retry-After spread, base 3, all shed: {seen:?}");
    assert!(seen.keys().all(|v| (3..=30).contains(v)), "{seen:?}");
    assert!(seen.len() >= 10, "{seen:?}");
}
