//! The outlier rules (CONTRACT §15) through the culling driver, on the test's own clock
//! against the in-process budget: a slow backend among fast peers is ejected as a latency
//! outlier, its probe must answer within the line it crossed, and what is judged needs
//! peers and requests. Only the probe touches the network (a local backend whose delay
//! the test switches).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::driver::{Culling, Memory};
use crate::state::Shared;
use crate::upstream::BackendState;
use portcullis_store::budget::LocalBudget;

/// A backend that answers 200 after the delay (ms) the test sets.
async fn backend(delay_ms: Arc<AtomicU64>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let delay = delay_ms.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let reply = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    addr
}

fn shared(addrs: &[SocketAddr], outlier: &str) -> Arc<Shared> {
    let backends: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let text = format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [{}]\n\
         [culling]\nwindow_seconds = 10\nerror_threshold = 100000\ncheck_interval_seconds = 1\n\
         cooldown_seconds = 30\ntokens = 5\ntoken_period_seconds = 600\n\
         outlier = \"{outlier}\"\noutlier_min_requests = 20\n",
        backends.join(", ")
    );
    let cfg = crate::config::parse("t.toml", &text).unwrap();
    Shared::new(cfg, "t.toml".into())
}

fn addrs(n: u16) -> Vec<SocketAddr> {
    (1..=n)
        .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
        .collect()
}

struct Rig {
    shared: Arc<Shared>,
    driver: Culling,
    memory: Memory,
}

impl Rig {
    fn new(addrs: &[SocketAddr], outlier: &str) -> Self {
        let shared = shared(addrs, outlier);
        let driver = Culling::new(Arc::clone(&shared), Arc::new(LocalBudget::new()));
        Self {
            shared,
            driver,
            memory: Memory::default(),
        }
    }

    fn backend(&self, i: usize) -> Arc<BackendState> {
        Arc::clone(&self.shared.runtime.load().pools[0].backends[i])
    }

    /// `n` answers of `ms` each to backend `i` at `secs` (and, for the success-rate
    /// rule, `errors` of them failed).
    fn answers(&self, i: usize, secs: u64, n: u64, ms: u64, errors: u64) {
        let b = self.backend(i);
        for k in 0..n {
            b.record(secs, k < errors);
            b.latency.record(secs, ms * 1000);
        }
    }

    async fn tick(&mut self, now_ms: u64) {
        self.driver.tick(&mut self.memory, now_ms).await;
    }

    fn culled(&self) -> Vec<usize> {
        let pool = Arc::clone(&self.shared.runtime.load().pools[0]);
        (0..pool.backends.len())
            .filter(|i| pool.backends[*i].is_culled())
            .collect()
    }
}

#[tokio::test]
async fn a_slow_backend_is_ejected_and_readmitted_only_once_it_answers_in_time() {
    let delay = Arc::new(AtomicU64::new(300));
    let slow = backend(Arc::clone(&delay)).await;
    let mut list = addrs(3);
    list.insert(1, slow);
    let mut rig = Rig::new(&list, "latency");
    let t0: u64 = 1_000_000_000_000;
    let secs = t0 / 1000;
    for i in 0..4 {
        rig.answers(i, secs, 40, if i == 1 { 300 } else { 5 }, 0);
    }
    rig.tick(t0).await;
    assert_eq!(rig.culled(), vec![1], "the slow one, and only it");
    // The journal and /status say which rule fired, with the figures.
    let d = &rig.shared.observe.culls.recent()[0];
    assert_eq!((d.result, d.rule), ("culled", Some("latency")));
    let figures = d.figures.clone().unwrap_or_default();
    assert!(figures.starts_with("p90 "), "{figures}");
    let v = rig.shared.observe.culls.outlier("app", &slow.to_string());
    let v = v.expect("an outlier view");
    assert_eq!(v.rule, "latency");
    assert!(v.value > 250.0 && v.limit < 20.0, "{v:?}");

    // After the cooldown the probe answers, but in 300 ms: over the line, it stays out.
    rig.tick(t0 + 31_000).await;
    assert_eq!(rig.culled(), vec![1], "a slow probe keeps it out");
    // Recovered: the next probe after another cooldown readmits it, windows cleared.
    delay.store(0, Ordering::SeqCst);
    rig.tick(t0 + 62_000).await;
    assert!(rig.culled().is_empty(), "a fast probe readmits it");
    assert_eq!(rig.backend(1).latency.summary(t0 / 1000 + 62).samples, 0);
    let d = &rig.shared.observe.culls.recent()[0];
    assert_eq!((d.result, d.rule), ("readmitted", None));
}

#[tokio::test]
async fn a_quarter_failing_backend_is_a_success_rate_outlier() {
    let mut rig = Rig::new(&addrs(4), "success_rate");
    let t0: u64 = 1_100_000_000_000;
    for i in 0..4 {
        rig.answers(i, t0 / 1000, 40, 1, if i == 2 { 10 } else { 0 });
    }
    rig.tick(t0).await;
    assert_eq!(rig.culled(), vec![2]);
    let d = &rig.shared.observe.culls.recent()[0];
    assert_eq!(d.rule, Some("success_rate"));
    assert!(d
        .figures
        .as_deref()
        .is_some_and(|f| f.contains("success rate 0.750")));
}

#[tokio::test]
async fn nothing_to_compare_nothing_culled() {
    let t0: u64 = 1_200_000_000_000;
    // One backend: no peers.
    let mut rig = Rig::new(&addrs(1), "latency");
    rig.answers(0, t0 / 1000, 100, 900, 0);
    rig.tick(t0).await;
    assert!(rig.culled().is_empty());
    // Two backends: one peer is no baseline.
    let mut rig = Rig::new(&addrs(2), "latency");
    rig.answers(0, t0 / 1000, 100, 900, 0);
    rig.answers(1, t0 / 1000, 100, 1, 0);
    rig.tick(t0).await;
    assert!(rig.culled().is_empty());
    // Four, but the slow one has too few requests (19 < 20).
    let mut rig = Rig::new(&addrs(4), "latency");
    for i in 0..4 {
        let (n, ms) = if i == 3 { (19, 900) } else { (40, 1) };
        rig.answers(i, t0 / 1000, n, ms, 0);
    }
    rig.tick(t0).await;
    assert!(rig.culled().is_empty());
    // All equally slow.
    let mut rig = Rig::new(&addrs(4), "latency");
    for i in 0..4 {
        rig.answers(i, t0 / 1000, 40, 400 + 10 * i as u64, 0);
    }
    rig.tick(t0).await;
    assert!(rig.culled().is_empty());
    // Outliers off: the same slow backend stays.
    let mut rig = Rig::new(&addrs(4), "none");
    for i in 0..4 {
        rig.answers(i, t0 / 1000, 40, if i == 0 { 900 } else { 1 }, 0);
    }
    rig.tick(t0).await;
    assert!(rig.culled().is_empty());
}

#[tokio::test]
async fn clock_jumps_forget_old_latencies() {
    let t0: u64 = 1_300_000_000_000;
    let mut rig = Rig::new(&addrs(4), "latency");
    for i in 0..4 {
        rig.answers(i, t0 / 1000, 40, if i == 0 { 900 } else { 1 }, 0);
    }
    // The clock jumps an hour ahead before the first check: what was seen is out of the
    // window, nothing is judged.
    rig.tick(t0 + 3_600_000).await;
    assert!(rig.culled().is_empty());
    // And back: samples recorded at the later time do not count at the earlier one.
    let mut rig = Rig::new(&addrs(4), "latency");
    for i in 0..4 {
        rig.answers(i, t0 / 1000 + 3_600, 40, if i == 0 { 900 } else { 1 }, 0);
    }
    rig.tick(t0).await;
    assert!(rig.culled().is_empty());
}

/// `blame_tenants` with the latency rule: a key's slow answers on a backend where the
/// other keys are fast are taken out before the rule judges it; a backend slow for the
/// other keys too is culled all the same. The line the check drew is published for the
/// request path.
#[tokio::test]
async fn a_keys_slow_answers_are_its_own_but_a_backend_slow_for_all_is_culled() {
    let t0: u64 = 1_400_000_000_000;
    let secs = t0 / 1000;
    let key = 0xfeed_u64;
    for others_slow in [false, true] {
        let list = addrs(4);
        let text = format!(
            "[[upstreams]]\nname = \"app\"\nbackends = [{}]\n\
             [culling]\nwindow_seconds = 10\nerror_threshold = 100000\ncheck_interval_seconds = 1\n\
             cooldown_seconds = 30\noutlier = \"latency\"\noutlier_min_requests = 20\nblame_tenants = true\n",
            list.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
        );
        let shared = Shared::new(
            crate::config::parse("t.toml", &text).unwrap(),
            "t.toml".into(),
        );
        let mut rig = Rig {
            driver: Culling::new(Arc::clone(&shared), Arc::new(LocalBudget::new())),
            shared,
            memory: Memory::default(),
        };
        for i in 0..4 {
            rig.answers(i, secs, 60, 2, 0);
        }
        // Backend 1: 30 answers of 400 ms, all the key's (recorded as the request path
        // does); with `others_slow`, 20 more of other keys.
        rig.answers(1, secs, 30, 400, 0);
        let pool = Arc::clone(&rig.shared.runtime.load().pools[0]);
        for _ in 0..30 {
            let slice = rig.backend(1).latency.slice_secs();
            pool.shared.slow_ledger.record(secs, slice, key, list[1]);
        }
        if others_slow {
            rig.answers(1, secs, 20, 400, 0);
        }
        rig.tick(t0).await;
        if others_slow {
            assert_eq!(rig.culled(), vec![1], "slow for the other keys too");
        } else {
            assert!(rig.culled().is_empty(), "the key's slowness is its own");
        }
        let line = pool.shared.slow_line_us.load(Ordering::Relaxed);
        assert!(
            (6_000..=8_000).contains(&line),
            "3 × the peers' p90: {line}"
        );
    }
}
