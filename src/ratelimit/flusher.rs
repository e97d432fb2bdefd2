//! Background flush loop.

use std::sync::Arc;
use std::time::Duration;

use portcullis_policy::ratelimit::flush_with;
use portcullis_policy::ratelimit::Limiter;
use portcullis_policy::ratelimit::{CounterStore, FlushExtra};

/// Wall-clock Unix time in milliseconds (the `now_ms` the proxy passes to `check`).
pub use portcullis_store::clock::unix_ms as now_ms;

/// Fleet-wide store round trips per second the flush interval is stretched to stay under:
/// every instance sends about one batch per flush while a key is near its limit, so `n`
/// instances make about `n / flush_interval` calls per second on one Redis, whose script
/// costs about 50 us of its CPU each (benches/load/fleet.sh,
/// benches/history/2026-11-passes.md "Fleet size"): 5,000 calls/s is about a quarter of
/// its one core. Below 250 instances (at the default 50 ms) nothing changes.
pub const FLEET_CALLS_PER_SEC: u64 = 5_000;

/// The flush interval for a fleet of `instances`: `base`, stretched to
/// `instances / FLEET_CALLS_PER_SEC` seconds when that is longer (250 instances: 50 ms,
/// 1,000: 200 ms). The fleet share bounds what each instance admits between two syncs
/// whatever their interval, so a longer one does not loosen the limit (see the module
/// doc of [`super`]); it only makes a burst converge in fewer, later steps.
pub fn flush_interval_for(base: Duration, instances: u64) -> Duration {
    let floor = Duration::from_micros(instances.saturating_mul(1_000_000) / FLEET_CALLS_PER_SEC);
    base.max(floor).max(Duration::from_millis(1))
}

/// Flushes the limiters `limiters()` returns (the `[rate_limit]` policy's first, then one
/// per `[[rate_limit.policies]]` entry, as of each flush: reloads may add or remove
/// policies) to `store` every `flush_interval`, all in one batch, until `shutdown` becomes
/// true (or its sender is dropped), then flushes once more. Each flush is bounded by the
/// store's own timeout, so a hung store only delays this task. Health and error counters
/// are kept on the first limiter (and health on every one).
///
/// `extra`'s counts (the tenants' quotas) ride in the same batches; `after` runs after
/// each flush (the tenants' concurrency shares follow the counts just synced).
pub async fn run_flusher<F, A>(
    limiters: F,
    extra: Option<Arc<dyn FlushExtra>>,
    after: A,
    store: Arc<dyn CounterStore>,
    flush_interval: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) where
    F: Fn() -> Vec<Arc<Limiter>> + Send + Sync,
    A: Fn() + Send + Sync,
{
    let once = |force: bool| {
        let set = limiters();
        let store = Arc::clone(&store);
        let extra = extra.clone();
        async move {
            let refs: Vec<&Limiter> = set.iter().map(|l| &**l).collect();
            flush_with(&refs, extra.as_deref(), store.as_ref(), &now_ms, force).await
        }
    };
    let every = |n: u64| flush_interval_for(flush_interval, n);
    let mut current = every(1);
    let mut tick = tokio::time::interval(current);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if *shutdown.borrow() {
            break;
        }
        // The fleet size the store reported at the last sync sets the interval.
        let n = limiters().first().map_or(1, |l| l.instances());
        if every(n) != current {
            current = every(n);
            tracing::info!(target: "portcullis::ratelimit", instances = n, interval_ms = current.as_millis() as u64, "rate-limit flush interval for the fleet size");
            tick = tokio::time::interval_at(tokio::time::Instant::now() + current, current);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = once(false).await {
                    tracing::debug!(target: "portcullis::ratelimit", error = %e, "rate-limit flush failed");
                }
                after();
            }
            changed = shutdown.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    match once(true).await {
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
    use super::*;
    use async_trait::async_trait;
    use portcullis_policy::ratelimit::RateLimitParams;
    use portcullis_policy::ratelimit::{Batch, LocalStore, StoreError, SyncResult};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// LocalStore that fails (or hangs) on demand.
    struct Flaky {
        inner: LocalStore,
        fail: AtomicBool,
        hang: AtomicBool,
        calls: AtomicU64,
        /// Live instances it reports (0: not shared).
        fleet: AtomicU64,
    }

    impl Flaky {
        fn new(fail: bool, hang: bool, fleet: u64) -> Self {
            Self {
                inner: LocalStore::new(),
                fail: AtomicBool::new(fail),
                hang: AtomicBool::new(hang),
                calls: AtomicU64::new(0),
                fleet: AtomicU64::new(fleet),
            }
        }
    }

    #[async_trait]
    impl CounterStore for Flaky {
        async fn sync(&self, batch: Batch<'_>) -> SyncResult {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.hang.load(Ordering::Relaxed) {
                // Bounded like a real store with a 200 ms timeout.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Err(StoreError::Timeout);
            }
            if self.fail.load(Ordering::Relaxed) {
                return Err(StoreError::Connect("refused".into()));
            }
            self.inner.sync(batch).await
        }
        fn kind(&self) -> &'static str {
            "local"
        }
        fn instances(&self) -> Option<u64> {
            Some(self.fleet.load(Ordering::Relaxed)).filter(|&n| n > 0)
        }
    }

    /// The flusher of `lim` alone on `store`, every 50 ms; stopped by sending `true`.
    fn spawn(
        lim: &Arc<Limiter>,
        store: &Arc<Flaky>,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let l = Arc::clone(lim);
        let task = tokio::spawn(run_flusher(
            move || vec![l.clone()],
            None,
            || {},
            Arc::clone(store) as Arc<dyn CounterStore>,
            Duration::from_millis(50),
            rx,
        ));
        (tx, task)
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
        let store = Arc::new(Flaky::new(true, false, 0));
        let (tx, task) = spawn(&lim, &store);
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
        let h = portcullis_policy::ratelimit::hash::stable_hash("k");
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
        let store = Arc::new(Flaky::new(false, true, 0));
        let (tx, task) = spawn(&lim, &store);
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
        let store = Flaky::new(true, false, 0);
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

    #[test]
    fn flush_interval_scales_with_the_fleet_beyond_the_call_budget() {
        let base = Duration::from_millis(50);
        assert_eq!(flush_interval_for(base, 1), base);
        assert_eq!(flush_interval_for(base, 100), base);
        assert_eq!(flush_interval_for(base, 250), base);
        assert_eq!(flush_interval_for(base, 500), Duration::from_millis(100));
        assert_eq!(flush_interval_for(base, 1_000), Duration::from_millis(200));
        assert_eq!(
            flush_interval_for(Duration::from_millis(500), 1_000),
            Duration::from_millis(500)
        );
        assert_eq!(
            flush_interval_for(Duration::ZERO, 0),
            Duration::from_millis(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_fleet_flushes_less_often() {
        let lim = Arc::new(Limiter::new(params(2_000)));
        let store = Arc::new(Flaky::new(false, false, 1_000));
        let (tx, task) = spawn(&lim, &store);
        // A key over its fleet share (2,000 / 1,000 instances) is sent at every flush:
        // keep one busy for 10 s.
        let t0 = now_ms();
        let start = tokio::time::Instant::now();
        let mut k = 0u64;
        while start.elapsed() < Duration::from_secs(10) {
            for _ in 0..10 {
                let _ = lim.check("hot", t0 + k);
                k += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let calls = store.calls.load(Ordering::Relaxed);
        // 1,000 instances: one call per 200 ms (about 50 in 10 s), not per 50 ms (200).
        assert!((40..=60).contains(&calls), "{calls} calls in 10 s");
        assert_eq!(lim.instances(), 1_000);
        tx.send(true).unwrap();
        task.await.unwrap();
    }
}
