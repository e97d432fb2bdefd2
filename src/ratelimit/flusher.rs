//! Background flush loop.

use std::sync::Arc;
use std::time::Duration;

use super::limiter::Limiter;
use super::store::CounterStore;

/// Wall-clock Unix time in milliseconds (the `now_ms` the proxy passes to `check`).
pub use crate::store::clock::unix_ms as now_ms;

/// Flushes `limiter` to `store` every `flush_interval` until `shutdown` becomes true (or its
/// sender is dropped), then flushes once more. Each flush is bounded by the store's own
/// timeout, so a hung store only delays this task. Health and error counters are kept on
/// the limiter.
pub async fn run_flusher(
    limiter: Arc<Limiter>,
    store: Arc<dyn CounterStore>,
    flush_interval: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(flush_interval.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = limiter.flush_once(store.as_ref(), now_ms()).await {
                    tracing::debug!(target: "portcullis::ratelimit", error = %e, "rate-limit flush failed");
                }
            }
            changed = shutdown.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    match limiter.flush_all(store.as_ref(), now_ms()).await {
        Ok(o) => {
            tracing::debug!(target: "portcullis::ratelimit", keys = o.keys, "final rate-limit flush")
        }
        Err(e) => {
            tracing::warn!(target: "portcullis::ratelimit", error = %e, "final rate-limit flush failed")
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::store::{Delta, GlobalCounts, LocalStore, StoreError};
    use super::super::RateLimitParams;
    use super::*;
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// LocalStore that fails (or hangs) on demand.
    struct Flaky {
        inner: LocalStore,
        fail: AtomicBool,
        hang: AtomicBool,
        calls: AtomicU64,
    }

    #[async_trait]
    impl CounterStore for Flaky {
        async fn sync(
            &self,
            batch_id: u128,
            batch: &[Delta],
            window_secs: u64,
            now_ms: u64,
        ) -> Result<Vec<GlobalCounts>, StoreError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.hang.load(Ordering::Relaxed) {
                // Bounded like a real store with a 200 ms timeout.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Err(StoreError::Timeout);
            }
            if self.fail.load(Ordering::Relaxed) {
                return Err(StoreError::Connect("refused".into()));
            }
            self.inner.sync(batch_id, batch, window_secs, now_ms).await
        }
        fn kind(&self) -> &'static str {
            "local"
        }
    }

    fn params(limit: u64) -> RateLimitParams {
        RateLimitParams {
            window_secs: 3600,
            limit,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn deltas_survive_failures_and_arrive_after_recovery() {
        let lim = Arc::new(Limiter::new(params(1000)));
        let store = Arc::new(Flaky {
            inner: LocalStore::new(),
            fail: AtomicBool::new(true),
            hang: AtomicBool::new(false),
            calls: AtomicU64::new(0),
        });
        let (tx, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(run_flusher(
            lim.clone(),
            store.clone() as Arc<dyn CounterStore>,
            Duration::from_millis(50),
            rx,
        ));
        let now = now_ms();
        for _ in 0..7 {
            assert!(lim.check("k", now).is_allowed());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!lim.store_healthy());
        assert!(lim.store_errors_total() >= 1);
        assert_eq!(lim.unsent_admissions(), 7);
        // Decisions continue from local counts.
        assert!(lim.check("k", now).is_allowed());

        store.fail.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(lim.store_healthy());
        assert_eq!(lim.unsent_admissions(), 0);
        let h = super::super::hash::stable_hash("k");
        let w = now_ms() / 3_600_000;
        let c = store.inner.counts(h, w);
        assert_eq!(c.cur + c.prev, 8);

        // Shutdown flushes the last admissions.
        assert!(lim.check("k", now_ms()).is_allowed());
        tx.send(true).unwrap();
        task.await.unwrap();
        let c = store.inner.counts(h, now_ms() / 3_600_000);
        assert_eq!(c.cur + c.prev, 9);
    }

    #[tokio::test(start_paused = true)]
    async fn hanging_store_does_not_block_decisions() {
        let lim = Arc::new(Limiter::new(params(5)));
        let store = Arc::new(Flaky {
            inner: LocalStore::new(),
            fail: AtomicBool::new(false),
            hang: AtomicBool::new(true),
            calls: AtomicU64::new(0),
        });
        let (tx, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(run_flusher(
            lim.clone(),
            store.clone() as Arc<dyn CounterStore>,
            Duration::from_millis(50),
            rx,
        ));
        let now = now_ms();
        let mut admitted = 0;
        for _ in 0..20 {
            if lim.check("k", now).is_allowed() {
                admitted += 1;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        assert_eq!(admitted, 5);
        assert!(!lim.store_healthy());
        assert!(store.calls.load(Ordering::Relaxed) >= 2);
        store.hang.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(lim.store_healthy());
        tx.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn idle_probe_restores_health() {
        let lim = Arc::new(Limiter::new(params(5)));
        let store = Flaky {
            inner: LocalStore::new(),
            fail: AtomicBool::new(true),
            hang: AtomicBool::new(false),
            calls: AtomicU64::new(0),
        };
        // No keys at all: the first flush probes the store (never called before).
        assert!(lim.flush_once(&store, 10_000).await.is_err());
        assert!(!lim.store_healthy());
        store.fail.store(false, Ordering::Relaxed);
        let o = lim.flush_once(&store, 10_050).await.unwrap();
        assert!(o.called_store);
        assert!(lim.store_healthy());
        // Healthy and idle: no call until the probe interval passes.
        let o = lim.flush_once(&store, 10_100).await.unwrap();
        assert!(!o.called_store);
        let o = lim.flush_once(&store, 11_100).await.unwrap();
        assert!(o.called_store);
    }
}
