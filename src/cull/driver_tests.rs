//! The culling driver on the test's own clock, against the in-process budget:
//! eject, probe after the cooldown, stay out while the probe fails, readmit
//! when it passes. Only the probe touches the network (a local backend whose
//! answer the test switches).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::driver::{Culling, Memory};
use crate::state::Shared;
use portcullis_store::budget::LocalBudget;

/// A backend whose every answer has the status the test sets.
async fn backend(status: Arc<AtomicU16>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let status = status.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    addr
}

fn shared(addrs: &[SocketAddr]) -> Arc<Shared> {
    let backends: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let text = format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [{}]\n\
         [culling]\nwindow_seconds = 10\nerror_threshold = 5\ncheck_interval_seconds = 1\n\
         cooldown_seconds = 30\ntokens = 5\ntoken_period_seconds = 600\n",
        backends.join(", ")
    );
    let cfg = crate::config::parse("t.toml", &text).unwrap();
    Shared::new(cfg, "t.toml".into())
}

#[tokio::test]
async fn a_failing_backend_is_ejected_probed_and_readmitted_on_the_tests_clock() {
    let status = Arc::new(AtomicU16::new(500));
    let bad = backend(Arc::clone(&status)).await;
    let good: Vec<SocketAddr> = ["127.0.0.1:1", "127.0.0.1:2"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let shared = shared(&[bad, good[0], good[1]]);
    let driver = Culling::new(Arc::clone(&shared), Arc::new(LocalBudget::new()));
    let mut memory = Memory::default();
    let pool = Arc::clone(&shared.runtime.load().pools[0]);
    let state = |addr: SocketAddr| {
        Arc::clone(
            pool.backends
                .iter()
                .find(|b| b.addr == addr)
                .expect("backend"),
        )
    };
    let t0: u64 = 1_000_000_000_000;
    let secs = t0 / 1000;
    for _ in 0..20 {
        state(bad).record(secs, true);
        state(good[0]).record(secs, false);
        state(good[1]).record(secs, false);
    }

    driver.tick(&mut memory, t0).await;
    assert!(state(bad).is_culled(), "over the threshold: ejected");
    assert!(!state(good[0]).is_culled() && !state(good[1]).is_culled());

    // Before the cooldown nothing changes, whatever the backend does.
    driver.tick(&mut memory, t0 + 10_000).await;
    assert!(state(bad).is_culled());

    // After the cooldown the probe still sees a 500: it stays out for another cooldown.
    driver.tick(&mut memory, t0 + 31_000).await;
    assert!(state(bad).is_culled(), "a failed probe keeps it out");

    // Recovered: the next probe after the new cooldown readmits it.
    status.store(200, Ordering::SeqCst);
    driver.tick(&mut memory, t0 + 45_000).await;
    assert!(state(bad).is_culled(), "the second cooldown has not passed");
    driver.tick(&mut memory, t0 + 62_000).await;
    assert!(!state(bad).is_culled(), "a passing probe readmits it");
    assert_eq!(state(bad).window.totals(t0 / 1000 + 62), (0, 0));
}

#[tokio::test]
async fn backends_failing_alike_are_never_ejected() {
    let addrs: Vec<SocketAddr> = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let shared = shared(&addrs);
    let driver = Culling::new(Arc::clone(&shared), Arc::new(LocalBudget::new()));
    let mut memory = Memory::default();
    let pool = Arc::clone(&shared.runtime.load().pools[0]);
    let t0: u64 = 2_000_000_000_000;
    for b in &pool.backends {
        for _ in 0..20 {
            b.record(t0 / 1000, true);
        }
    }
    for step in 0..3 {
        driver.tick(&mut memory, t0 + step * 1000).await;
    }
    assert!(pool.backends.iter().all(|b| !b.is_culled()));
}
