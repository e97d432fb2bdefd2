//! Envoy's retry budget over a sliding window: retries stay under `ratio` of
//! the upstream's requests in the last [`WINDOW_SECS`] seconds, with a floor of
//! [`MIN_RETRIES`] so a quiet upstream can still retry at all. Lock-free
//! (one-second buckets of atomics); time is passed in.

use std::sync::atomic::{AtomicU64, Ordering};

pub const WINDOW_SECS: u64 = 10;
/// Retries always allowed per window (Envoy's `min_retry_concurrency` is 3).
pub const MIN_RETRIES: u64 = 3;

#[derive(Debug, Default)]
struct Bucket {
    /// The second this bucket counts (0 = never used).
    sec: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

#[derive(Debug)]
pub struct RetryBudget {
    /// The ratio's bits (`f64`), swapped on reload.
    ratio: AtomicU64,
    buckets: [Bucket; WINDOW_SECS as usize],
}

impl RetryBudget {
    pub fn new(ratio: f64) -> Self {
        Self {
            ratio: AtomicU64::new(ratio.to_bits()),
            buckets: Default::default(),
        }
    }

    pub fn set_ratio(&self, ratio: f64) {
        self.ratio.store(ratio.to_bits(), Ordering::Relaxed);
    }

    fn bucket(&self, now_secs: u64) -> &Bucket {
        let b = &self.buckets[(now_secs % WINDOW_SECS) as usize];
        let old = b.sec.load(Ordering::Acquire);
        if old != now_secs
            && b.sec
                .compare_exchange(old, now_secs, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            b.requests.store(0, Ordering::Release);
            b.retries.store(0, Ordering::Release);
        }
        b
    }

    /// Count one request (first attempts only).
    #[inline]
    pub fn record_request(&self, now_secs: u64) {
        self.bucket(now_secs)
            .requests
            .fetch_add(1, Ordering::Relaxed);
    }

    /// `(requests, retries)` in the window ending at `now_secs`.
    pub fn window(&self, now_secs: u64) -> (u64, u64) {
        let lo = now_secs.saturating_sub(WINDOW_SECS - 1);
        self.buckets
            .iter()
            .filter(|b| (lo..=now_secs).contains(&b.sec.load(Ordering::Acquire)))
            .fold((0, 0), |(q, r), b| {
                (
                    q + b.requests.load(Ordering::Relaxed),
                    r + b.retries.load(Ordering::Relaxed),
                )
            })
    }

    /// Take a retry if the budget allows it (and count it); `false` = exhausted.
    pub fn try_retry(&self, now_secs: u64) -> bool {
        let (requests, retries) = self.window(now_secs);
        let ratio = f64::from_bits(self.ratio.load(Ordering::Relaxed));
        let allowed = ((requests as f64 * ratio) as u64).max(MIN_RETRIES);
        if retries >= allowed {
            return false;
        }
        self.bucket(now_secs)
            .retries
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Count a retry that is not subject to the budget (a failed connect).
    pub fn record_retry(&self, now_secs: u64) {
        self.bucket(now_secs)
            .retries
            .fetch_add(1, Ordering::Relaxed);
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
}
