//! The adaptive concurrency limit (CONTRACT §10 `shedding.adaptive`,
//! `min_concurrency`; §11 `portcullis_concurrency_limit`) against a real
//! backend whose latency goes 10 ms -> 400 ms -> 10 ms under load.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use support::*;

struct Hit {
    at: Instant,
    status: u16,
    took: Duration,
}

/// `n` closed-loop clients until `stop`; a shed client waits 20 ms (as a
/// client honouring back-pressure would) before its next request.
fn load(
    addr: String,
    n: usize,
    stop: Arc<AtomicBool>,
    hits: Arc<Mutex<Vec<Hit>>>,
) -> Vec<thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (addr, stop, hits) = (addr.clone(), stop.clone(), hits.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let t0 = Instant::now();
                    let status = try_get(&addr, "/a", &[]).map_or(0, |r| r.status);
                    let took = t0.elapsed();
                    hits.lock().unwrap_or_else(|p| p.into_inner()).push(Hit {
                        at: t0,
                        status,
                        took,
                    });
                    if status != 200 {
                        thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect()
}

#[test]
fn the_limit_shrinks_when_latency_rises_sheds_instead_of_queueing_and_grows_back() {
    let b = Backend::start("app");
    b.set_mode(Mode::Slow(Duration::from_millis(10)));
    let cfg = format!(
        "{}[shedding]\nmax_concurrency = 40\nadaptive = true\nmin_concurrency = 4\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        one_upstream(&b)
    );
    let p = Proxy::start(&cfg);
    let limit = || p.metric("portcullis_concurrency_limit").unwrap_or(-1.0);
    assert_eq!(limit(), 40.0, "starts at max_concurrency");

    let stop = Arc::new(AtomicBool::new(false));
    let hits = Arc::new(Mutex::new(Vec::new()));
    let clients = load(p.addr(), 40, stop.clone(), hits.clone());
    let count = |from: Instant, f: &dyn Fn(&Hit) -> bool| {
        hits.lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|h| h.at >= from && f(h))
            .count()
    };

    // Fast backend: the limit stays at (or returns to) the ceiling.
    let t_fast = Instant::now();
    eventually(
        DEADLINE,
        || format!("fast: limit {}", limit()),
        || count(t_fast, &|h| h.status == 200) > 500 && limit() >= 36.0,
    );

    // 10 ms -> 400 ms: the limit shrinks toward min_concurrency.
    b.set_mode(Mode::Slow(Duration::from_millis(400)));
    eventually(
        DEADLINE,
        || format!("slow: limit {}", limit()),
        || limit() <= 12.0,
    );
    assert!(limit() >= 4.0, "below min_concurrency: {}", limit());

    // Excess is shed at once instead of queueing at the backend.
    b.reset_counters();
    let t_slow = Instant::now();
    eventually(
        DEADLINE,
        || "sheds while slow".into(),
        || count(t_slow, &|h| h.status == 503) >= 100 && t_slow.elapsed() > Duration::from_secs(2),
    );
    assert!(
        b.max_in_flight() <= 16,
        "{} requests queued at the slow backend (40 clients)",
        b.max_in_flight()
    );
    let mut shed_took: Vec<Duration> = hits
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|h| h.at >= t_slow && h.status == 503)
        .map(|h| h.took)
        .collect();
    shed_took.sort();
    let p90 = shed_took[shed_took.len() * 9 / 10];
    assert!(
        p90 < Duration::from_millis(100),
        "shed answers took {p90:?} (p90)"
    );
    assert!(
        p.metric("portcullis_requests_total{outcome=\"shed\"}")
            .unwrap_or(0.0)
            >= 100.0
    );

    // Recovery: the limit grows back.
    b.set_mode(Mode::Slow(Duration::from_millis(10)));
    // The baseline is the lowest recent latency: on a busy machine the proxy's
    // own latency may have risen meanwhile; the baseline forgets that within
    // two epochs (20 s).
    eventually(
        Duration::from_secs(45),
        || format!("recovered: limit {}", limit()),
        || limit() >= 36.0,
    );

    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
    assert_eq!(count(t_fast, &|h| h.status == 0), 0, "transport errors");
}
