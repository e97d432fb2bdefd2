//! Lock-free sliding window of (requests, errors) per backend: a
//! [`WindowedCounter`] whose first count is requests and second is errors
//! (one CAS on one word per response; no increment is lost to a bucket reset).
//! Per-bucket counts saturate at 2^20 − 1 (over a million per second per backend).

use crate::window::WindowedCounter;

/// Sliding-window error accounting for one backend. `Send + Sync`; share via `Arc`.
#[derive(Debug)]
pub struct ErrorWindow {
    counts: WindowedCounter,
}

impl ErrorWindow {
    /// A window of `window_secs` seconds (0 is treated as 1).
    pub fn new(window_secs: u64) -> Self {
        Self {
            counts: WindowedCounter::new(window_secs),
        }
    }

    /// Length of the window in seconds (rounded up to whole buckets).
    pub fn window_secs(&self) -> u64 {
        self.counts.window_secs()
    }

    /// Count one response at `now_secs` (Unix or any monotonic seconds, as long as
    /// `totals` is called with the same clock). Hot path: one CAS on one word.
    #[inline]
    pub fn record(&self, now_secs: u64, is_error: bool) {
        self.counts.add(now_secs, 1, u64::from(is_error));
    }

    /// `(requests, errors)` over the last `window_secs` seconds ending at `now_secs`
    /// (the current second included). Buckets of older laps are ignored.
    pub fn totals(&self, now_secs: u64) -> (u64, u64) {
        self.counts.totals(now_secs)
    }

    /// Errors in the window ending at `now_secs`.
    pub fn errors(&self, now_secs: u64) -> u64 {
        self.totals(now_secs).1
    }

    /// Forget everything (e.g. when a culled backend is readmitted, so errors from
    /// before the cull do not make it an immediate candidate again).
    pub fn reset(&self) {
        self.counts.reset();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::window::COUNT_MAX;
    use std::sync::Arc;

    #[test]
    fn counts_within_window() {
        let w = ErrorWindow::new(60);
        let t0 = 1_700_000_000;
        for i in 0..10 {
            w.record(t0 + i, i % 2 == 0);
        }
        assert_eq!(w.totals(t0 + 9), (10, 5));
        // Window is (now-60, now]: at t0+60 the first second (t0) has left.
        assert_eq!(w.totals(t0 + 59), (10, 5));
        assert_eq!(w.totals(t0 + 60), (9, 4));
        assert_eq!(w.totals(t0 + 68), (1, 0));
        assert_eq!(w.totals(t0 + 69), (0, 0));
    }

    #[test]
    fn stale_laps_are_ignored_and_reset_lazily() {
        let w = ErrorWindow::new(10);
        let t0 = 1_000_000;
        w.record(t0, true);
        w.record(t0, true);
        // Exactly one ring length later the same bucket is reused.
        let ring = w.counts.ring_len();
        assert_eq!(w.totals(t0 + ring), (0, 0));
        w.record(t0 + ring, false);
        assert_eq!(w.totals(t0 + ring), (1, 0));
        // Far in the future everything is gone.
        assert_eq!(w.totals(t0 + 10 * ring), (0, 0));
    }

    #[test]
    fn coarse_buckets_for_long_windows() {
        let w = ErrorWindow::new(7200);
        assert_eq!(w.counts.granularity(), 2);
        assert_eq!(w.window_secs(), 7200);
        w.record(10_000, true);
        assert_eq!(w.errors(10_000 + 7000), 1);
        assert_eq!(w.errors(10_000 + 7300), 0);
    }

    #[test]
    fn reset_forgets() {
        let w = ErrorWindow::new(60);
        w.record(500, true);
        w.reset();
        assert_eq!(w.totals(500), (0, 0));
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let w = ErrorWindow::new(1);
        for _ in 0..(COUNT_MAX + 10) {
            w.record(5, true);
        }
        assert_eq!(w.totals(5), (COUNT_MAX, COUNT_MAX));
    }

    #[test]
    fn concurrent_records_are_not_lost() {
        let w = Arc::new(ErrorWindow::new(60));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = Arc::clone(&w);
                std::thread::spawn(move || {
                    for i in 0..50_000u64 {
                        // Two seconds, so some threads race on the lazy reset.
                        w.record(1000 + (i % 2), (i + t) % 5 == 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(w.totals(1001), (200_000, 40_000));
    }
}
