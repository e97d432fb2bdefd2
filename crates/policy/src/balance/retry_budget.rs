//! Envoy's retry budget over a sliding window: retries stay under `ratio` of
//! the upstream's requests in the last [`WINDOW_SECS`] seconds, with a floor of
//! [`MIN_RETRIES`] so a quiet upstream can still retry at all. Lock-free
//! (a [`WindowedCounter`]); time is passed in.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::window::WindowedCounter;

pub const WINDOW_SECS: u64 = 10;
/// Retries always allowed per window (Envoy's `min_retry_concurrency` is 3).
pub const MIN_RETRIES: u64 = 3;

#[derive(Debug)]
pub struct RetryBudget {
    /// The ratio's bits (`f64`), swapped on reload.
    ratio: AtomicU64,
    /// (requests, retries) per second: the shared lock-free windowed counter,
    /// whose bucket reset cannot lose an increment at a second boundary.
    counts: WindowedCounter,
}

impl RetryBudget {
    pub fn new(ratio: f64) -> Self {
        Self {
            ratio: AtomicU64::new(ratio.to_bits()),
            counts: WindowedCounter::new(WINDOW_SECS),
        }
    }

    pub fn set_ratio(&self, ratio: f64) {
        self.ratio.store(ratio.to_bits(), Ordering::Relaxed);
    }

    /// Count one request (first attempts only).
    #[inline]
    pub fn record_request(&self, now_secs: u64) {
        self.counts.add(now_secs, 1, 0);
    }

    /// `(requests, retries)` in the window ending at `now_secs`.
    pub fn window(&self, now_secs: u64) -> (u64, u64) {
        self.counts.totals(now_secs)
    }

    /// Take a retry if the budget allows it (and count it); `false` = exhausted.
    pub fn try_retry(&self, now_secs: u64) -> bool {
        let (requests, retries) = self.window(now_secs);
        let ratio = f64::from_bits(self.ratio.load(Ordering::Relaxed));
        let allowed = ((requests as f64 * ratio) as u64).max(MIN_RETRIES);
        if retries >= allowed {
            return false;
        }
        self.counts.add(now_secs, 0, 1);
        true
    }

    /// Count a retry that is not subject to the budget (a failed connect).
    pub fn record_retry(&self, now_secs: u64) {
        self.counts.add(now_secs, 0, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_capped_at_ratio_of_requests() {
        let b = RetryBudget::new(0.2);
        let t = 1_000;
        for _ in 0..100 {
            b.record_request(t);
        }
        let granted = (0..100).filter(|_| b.try_retry(t)).count();
        assert_eq!(granted, 20);
    }

    #[test]
    fn floor_allows_a_few_retries_on_a_quiet_upstream() {
        let b = RetryBudget::new(0.2);
        b.record_request(5);
        let granted = (0..10).filter(|_| b.try_retry(5)).count();
        assert_eq!(granted as u64, MIN_RETRIES);
    }

    #[test]
    fn window_slides() {
        let b = RetryBudget::new(0.5);
        for _ in 0..10 {
            b.record_request(100);
        }
        assert_eq!((0..10).filter(|_| b.try_retry(100)).count(), 5);
        // Still inside the window: spent.
        assert!(!b.try_retry(100 + WINDOW_SECS - 1));
        // The old second has left the window: only the floor remains.
        assert_eq!(b.window(100 + WINDOW_SECS), (0, 0));
        assert!(b.try_retry(100 + WINDOW_SECS));
    }

    /// Threads counting requests at a second boundary (the bucket holds the
    /// previous lap's counts): none is lost to the bucket's reset. The old
    /// reset (claim the second, then `store(0)`) could drop the increments
    /// made between its two steps.
    #[test]
    fn requests_at_a_boundary_are_all_counted() {
        let b = std::sync::Arc::new(RetryBudget::new(0.5));
        for round in 0..20u64 {
            let t = 50_000 + round * 64;
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (b, barrier) = (b.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        for _ in 0..250 {
                            b.record_request(t);
                        }
                    })
                })
                .collect();
            for h in threads {
                assert!(h.join().is_ok());
            }
            assert_eq!(b.window(t), (1000, 0), "round {round}");
        }
    }
}
