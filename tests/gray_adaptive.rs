//! Per-upstream adaptive caps (CONTRACT §15, `[[upstreams]] adaptive = true`): each
//! upstream learns its own cap from its own latency, so an upstream that turns slow sheds
//! its own excess while another beside it, under the same load, serves everything.
//! `portcullis_concurrency_limit{upstream}` reports each learned cap; the global series
//! (no label) stays the `[shedding]` cap. Real proxy, real backends, 24 keep-alive
//! client connections per upstream.

use portcullis_test_kit as support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use support::*;

/// The answers so far (a poisoned lock still holds them).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

const CONNS: usize = 24;
const CEILING: u64 = 64;

fn config(fast: &Backend, slow: &Backend) -> String {
    format!(
        r#"[[upstreams]]
name = "fast"
backends = ["{fast}"]
retries = 0
adaptive = true
max_inflight = {CEILING}

[[upstreams]]
name = "slow"
backends = ["{slow}"]
retries = 0
adaptive = true
max_inflight = {CEILING}

[[routes]]
path_prefix = "/fast"
upstream = "fast"

[[routes]]
path_prefix = "/slow"
upstream = "slow"

[rate_limit]
enabled = false
"#,
        fast = fast.addr(),
        slow = slow.addr()
    )
}

/// One answer: when it started, its status (0: transport error), its `Retry-After`.
type Answer = (Instant, u16, Option<u64>);

/// `CONNS` keep-alive clients on `path`, each sending the next request when the last is
/// answered (a closed loop, as real clients under a concurrency cap).
struct Clients {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    handles: Vec<JoinHandle<()>>,
}

impl Clients {
    fn start(addr: &str, path: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let handles = (0..CONNS)
            .map(|_| {
                let (stop, answers, addr) = (stop.clone(), answers.clone(), addr.to_string());
                thread::spawn(move || {
                    let mut conn: Option<Conn> = None;
                    while !stop.load(Ordering::SeqCst) {
                        let t = Instant::now();
                        let res = match conn.as_mut() {
                            Some(c) => Ok(c),
                            None => Conn::open(&addr).map(|c| conn.insert(c)),
                        }
                        .and_then(|c| c.request("GET", path, &[], b""));
                        let answer = match res {
                            Ok(r) => {
                                if r.header("connection").is_some_and(|v| v == "close") {
                                    conn = None;
                                }
                                (t, r.status, r.retry_after())
                            }
                            Err(_) => {
                                conn = None;
                                (t, 0, None)
                            }
                        };
                        let shed = answer.1 == 503;
                        lock(&answers).push(answer);
                        if shed {
                            // A shed client waits a moment before trying again (not the
                            // full Retry-After: the test wants steady pressure).
                            thread::sleep(Duration::from_millis(20));
                        }
                    }
                })
            })
            .collect();
        Clients {
            stop,
            answers,
            handles,
        }
    }

    /// Status counts of the answers to requests started at or after `since`.
    fn tally(&self, since: Instant) -> BTreeMap<u16, usize> {
        let mut m = BTreeMap::new();
        for (t, status, _) in lock(&self.answers).iter() {
            if *t >= since {
                *m.entry(*status).or_insert(0) += 1;
            }
        }
        m
    }

    fn retry_afters(&self) -> Vec<u64> {
        lock(&self.answers)
            .iter()
            .filter_map(|(_, _, ra)| *ra)
            .collect()
    }

    fn finish(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn limit(p: &Proxy, upstream: &str) -> f64 {
    p.metric(&format!(
        "portcullis_concurrency_limit{{upstream=\"{upstream}\"}}"
    ))
    .unwrap_or(-1.0)
}

#[test]
fn a_slow_upstream_sheds_its_own_excess_while_a_fast_one_beside_it_serves_everything() {
    let fast = Backend::start("fast");
    let slow = Backend::start("slow");
    // Both answer in 50 ms to begin with: each upstream learns that as its baseline (50 ms
    // rather than less, so a loaded machine's jitter stays well inside the 25 % tolerance).
    fast.set_mode(Mode::Slow(Duration::from_millis(50)));
    slow.set_mode(Mode::Slow(Duration::from_millis(50)));
    let p = Proxy::start(&config(&fast, &slow));
    let fast_clients = Clients::start(&p.addr(), "/fast/x");
    let slow_clients = Clients::start(&p.addr(), "/slow/x");
    let t0 = Instant::now();
    eventually(
        DEADLINE,
        || "both upstreams warm (300 answers each)".into(),
        || {
            fast_clients.tally(t0).get(&200).copied().unwrap_or(0) >= 300
                && slow_clients.tally(t0).get(&200).copied().unwrap_or(0) >= 300
        },
    );
    for u in ["fast", "slow"] {
        assert!(limit(&p, u) >= CONNS as f64, "{u}: {}", limit(&p, u));
    }

    // The slow upstream's backend turns 20× slower.
    slow.set_mode(Mode::Slow(Duration::from_millis(1000)));
    let t_slow = Instant::now();
    eventually(
        DEADLINE,
        || {
            format!(
                "the slow upstream's cap under {CONNS} and 30 of its requests shed: limit {}, {:?}",
                limit(&p, "slow"),
                slow_clients.tally(t_slow)
            )
        },
        || {
            limit(&p, "slow") < CONNS as f64
                && slow_clients.tally(t_slow).get(&503).copied().unwrap_or(0) >= 30
        },
    );
    let t_shedding = Instant::now();
    // While it sheds, the fast one's clients keep getting answers.
    let fast_before = fast_clients.tally(t_shedding).values().sum::<usize>();
    eventually(
        DEADLINE,
        || "200 more fast answers".into(),
        || fast_clients.tally(t_shedding).values().sum::<usize>() >= fast_before + 200,
    );
    let slow_tally = slow_clients.tally(t_slow);
    let fast_tally = fast_clients.tally(t_slow);
    eprintln!(
        "after the slowdown: slow {slow_tally:?} (limit {}), fast {fast_tally:?} (limit {})",
        limit(&p, "slow"),
        limit(&p, "fast")
    );
    assert!(
        limit(&p, "slow") >= 8.0,
        "never under the floor of 8: {}",
        limit(&p, "slow")
    );
    assert_eq!(
        fast_tally.keys().copied().collect::<Vec<_>>(),
        vec![200],
        "the fast upstream served everything: {fast_tally:?}"
    );
    assert!(
        limit(&p, "fast") >= CONNS as f64,
        "the fast cap kept room for its {CONNS} clients: {}",
        limit(&p, "fast")
    );
    assert_eq!(
        p.metric("portcullis_bulkhead_shed_total{upstream=\"fast\"}")
            .unwrap_or(0.0),
        0.0
    );
    assert!(
        p.metric("portcullis_bulkhead_shed_total{upstream=\"slow\"}")
            .unwrap_or(0.0)
            >= 30.0
    );
    // The global cap's series is still there, without a label, and untouched.
    let text = p.metrics();
    assert!(
        text.lines()
            .any(|l| l == "portcullis_concurrency_limit 1024"),
        "{text}"
    );
    // The slow upstream's sheds spread their Retry-After (base 1).
    let ras = slow_clients.retry_afters();
    assert!(ras.iter().all(|v| (1..=10).contains(v)), "{ras:?}");
    let distinct: std::collections::BTreeSet<_> = ras.iter().collect();
    assert!(distinct.len() >= 2, "spread: {distinct:?}");
    fast_clients.finish();
    slow_clients.finish();
}
