//! Lock-free sliding window of (requests, errors) per backend.
//!
//! The window is a ring of per-second buckets (coarser for windows longer than
//! [`MAX_BUCKETS`] seconds). Each bucket is ONE `AtomicU64` packing
//! `lap:24 | requests:20 | errors:20`, where `lap = unit / ring_len` tells which
//! turn of the ring the bucket belongs to. `record` is a single CAS loop on one
//! word (no lock, no allocation): if the bucket still holds an older lap it is
//! reset lazily by the same CAS, so no increment is ever lost to a reset race.
//! Per-bucket counts saturate at 2^20 − 1 (over a million per second per backend).

use std::sync::atomic::{AtomicU64, Ordering};

/// Longest ring; windows longer than this many seconds use coarser buckets.
pub const MAX_BUCKETS: u64 = 3600;
const MIN_RING: u64 = 64;
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const LAP_SHIFT: u32 = 2 * COUNT_BITS;
const LAP_MASK: u64 = (1 << (64 - LAP_SHIFT)) - 1;
const REQ_SHIFT: u32 = COUNT_BITS;

/// Sliding-window error accounting for one backend. `Send + Sync`; share via `Arc`.
#[derive(Debug)]
pub struct ErrorWindow {
    buckets: Box<[AtomicU64]>,
    /// Seconds per bucket.
    granularity: u64,
    /// Buckets summed by `totals`.
    window_units: u64,
    /// `log2(buckets.len())`.
    ring_shift: u32,
}

impl ErrorWindow {
    /// A window of `window_secs` seconds (0 is treated as 1).
    pub fn new(window_secs: u64) -> Self {
        let window_secs = window_secs.max(1);
        let granularity = window_secs.div_ceil(MAX_BUCKETS);
        let window_units = window_secs.div_ceil(granularity);
        let ring = window_units.max(MIN_RING).next_power_of_two();
        let ring_shift = ring.trailing_zeros();
        let buckets = (0..ring).map(|_| AtomicU64::new(0)).collect();
        Self {
            buckets,
            granularity,
            window_units,
            ring_shift,
        }
    }

    /// Length of the window in seconds (rounded up to whole buckets).
    pub fn window_secs(&self) -> u64 {
        self.window_units * self.granularity
    }

    #[inline]
    fn locate(&self, unit: u64) -> (usize, u64) {
        let idx = (unit & ((1u64 << self.ring_shift) - 1)) as usize;
        let lap = (unit >> self.ring_shift) & LAP_MASK;
        (idx, lap)
    }

    #[inline]
    fn unit(&self, now_secs: u64) -> u64 {
        if self.granularity == 1 {
            now_secs
        } else {
            now_secs / self.granularity
        }
    }

    /// Count one response at `now_secs` (Unix or any monotonic seconds, as long as
    /// `totals` is called with the same clock). Hot path: one CAS on one word.
    #[inline]
    pub fn record(&self, now_secs: u64, is_error: bool) {
        let (idx, lap) = self.locate(self.unit(now_secs));
        let Some(bucket) = self.buckets.get(idx) else {
            return;
        };
        let err = u64::from(is_error);
        let mut cur = bucket.load(Ordering::Relaxed);
        loop {
            let next = if cur >> LAP_SHIFT == lap {
                let req = ((cur >> REQ_SHIFT) & COUNT_MAX) + 1;
                let errs = (cur & COUNT_MAX) + err;
                (lap << LAP_SHIFT) | (req.min(COUNT_MAX) << REQ_SHIFT) | errs.min(COUNT_MAX)
            } else {
                (lap << LAP_SHIFT) | (1 << REQ_SHIFT) | err
            };
            match bucket.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// `(requests, errors)` over the last `window_secs` seconds ending at `now_secs`
    /// (the current second included). Buckets of older laps are ignored.
    pub fn totals(&self, now_secs: u64) -> (u64, u64) {
        let cur = self.unit(now_secs);
        let first = cur.saturating_sub(self.window_units - 1);
        let (mut requests, mut errors) = (0u64, 0u64);
        for unit in first..=cur {
            let (idx, lap) = self.locate(unit);
            let Some(bucket) = self.buckets.get(idx) else {
                continue;
            };
            let v = bucket.load(Ordering::Relaxed);
            if v >> LAP_SHIFT == lap {
                requests += (v >> REQ_SHIFT) & COUNT_MAX;
                errors += v & COUNT_MAX;
            }
        }
        (requests, errors)
    }

    /// Errors in the window ending at `now_secs`.
    pub fn errors(&self, now_secs: u64) -> u64 {
        self.totals(now_secs).1
    }

    /// Forget everything (e.g. when a culled backend is readmitted, so errors from
    /// before the cull do not make it an immediate candidate again).
    pub fn reset(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
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
        let ring = 1u64 << w.ring_shift;
        assert_eq!(w.totals(t0 + ring), (0, 0));
        w.record(t0 + ring, false);
        assert_eq!(w.totals(t0 + ring), (1, 0));
        // Far in the future everything is gone.
        assert_eq!(w.totals(t0 + 10 * ring), (0, 0));
    }

    #[test]
    fn coarse_buckets_for_long_windows() {
        let w = ErrorWindow::new(7200);
        assert_eq!(w.granularity, 2);
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
