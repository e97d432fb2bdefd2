//! One lock-free windowed counter of a pair of counts, shared by the retry
//! budget (`balance::retry_budget`: requests, retries) and the cull error window
//! (`cull::window`: requests, errors). Plain Rust; time is passed in as `now`.
//! Imports nothing from the crate, so every layer can use it.
//!
//! The window is a ring of per-second buckets (coarser for windows longer than
//! [`MAX_BUCKETS`] seconds). Each bucket is ONE `AtomicU64` packing
//! `lap:24 | first:20 | second:20`, where `lap = unit / ring_len` tells which
//! turn of the ring the bucket belongs to. [`WindowedCounter::add`] is a single
//! CAS loop on that word: a bucket that still holds an older lap is reset by the
//! same CAS that adds the new counts, so an increment made by another thread at
//! a bucket boundary is never lost to a reset (a separate "claim the second,
//! then `store(0)`" reset can wipe an increment made between the two steps).
//! Readers treat a bucket of an older lap as zero. Per-bucket counts saturate at
//! [`COUNT_MAX`] (over a million per second).

use std::sync::atomic::{AtomicU64, Ordering};

/// Longest ring; windows longer than this many seconds use coarser buckets.
pub const MAX_BUCKETS: u64 = 3600;
const MIN_RING: u64 = 64;
const COUNT_BITS: u32 = 20;
/// Largest count one bucket holds (per count, per bucket).
pub const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const LAP_SHIFT: u32 = 2 * COUNT_BITS;
const LAP_MASK: u64 = (1 << (64 - LAP_SHIFT)) - 1;
const FIRST_SHIFT: u32 = COUNT_BITS;

/// A sliding window of two counts over the last `window_secs` seconds.
/// `Send + Sync`; share via `Arc` or embed.
#[derive(Debug)]
pub struct WindowedCounter {
    buckets: Box<[AtomicU64]>,
    /// Seconds per bucket.
    granularity: u64,
    /// Buckets summed by `totals`.
    window_units: u64,
    /// `log2(buckets.len())`.
    ring_shift: u32,
}

/// The bucket word after adding `(first, second)` at `lap` to `cur`: counts are
/// added if `cur` belongs to `lap`, otherwise the bucket starts over from the
/// added counts (the lazy reset). Pure, so one CAS publishes reset and add.
#[inline]
fn bump(cur: u64, lap: u64, first: u64, second: u64) -> u64 {
    let (f, s) = if cur >> LAP_SHIFT == lap {
        let f = ((cur >> FIRST_SHIFT) & COUNT_MAX) + first;
        let s = (cur & COUNT_MAX) + second;
        if f <= COUNT_MAX && s <= COUNT_MAX {
            // The common case: no count saturates, so neither carries into the next field.
            return cur + (first << FIRST_SHIFT) + second;
        }
        (f, s)
    } else {
        (first, second)
    };
    (lap << LAP_SHIFT) | (f.min(COUNT_MAX) << FIRST_SHIFT) | s.min(COUNT_MAX)
}

/// The counts of the buckets of `buckets` that belong to `lap`.
#[inline]
fn sum_lap(buckets: &[AtomicU64], lap: u64) -> (u64, u64) {
    buckets.iter().fold((0, 0), |(f, s), b| {
        let v = b.load(Ordering::Relaxed);
        if v >> LAP_SHIFT == lap {
            (f + ((v >> FIRST_SHIFT) & COUNT_MAX), s + (v & COUNT_MAX))
        } else {
            (f, s)
        }
    })
}

impl WindowedCounter {
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

    /// Seconds per bucket (1 unless the window is longer than [`MAX_BUCKETS`]).
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// Buckets in the ring: the same bucket is reused this many units later.
    pub fn ring_len(&self) -> u64 {
        1 << self.ring_shift
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

    /// Add `first` and `second` at `now_secs` (Unix or any monotonic seconds, as
    /// long as `totals` is called with the same clock). One CAS on one word.
    #[inline]
    pub fn add(&self, now_secs: u64, first: u64, second: u64) {
        let (idx, lap) = self.locate(self.unit(now_secs));
        let Some(bucket) = self.buckets.get(idx) else {
            return;
        };
        let mut cur = bucket.load(Ordering::Relaxed);
        loop {
            let next = bump(cur, lap, first, second);
            match bucket.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// `(first, second)` summed over the window ending at `now_secs` (the
    /// current second included). Buckets of older laps count as zero.
    pub fn totals(&self, now_secs: u64) -> (u64, u64) {
        let cur = self.unit(now_secs);
        let (idx, lap) = self.locate(cur);
        // `n` units back from `cur` (never more than the ring): the buckets up to
        // `idx`, then, if the window wraps past bucket 0, the ring's tail a lap earlier.
        let n = self.window_units.min(cur + 1) as usize;
        let ring = self.buckets.len();
        let here = self.buckets.get((idx + 1).saturating_sub(n)..=idx);
        let (mut first, mut second) = sum_lap(here.unwrap_or(&[]), lap);
        if n > idx + 1 {
            let tail = self.buckets.get(ring.saturating_sub(n - idx - 1)..);
            let (f, s) = sum_lap(tail.unwrap_or(&[]), lap.wrapping_sub(1) & LAP_MASK);
            first += f;
            second += s;
        }
        (first, second)
    }

    /// Forget everything (not for the hot path: a racing `add` may survive).
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
    use std::sync::{Arc, Barrier};

    #[test]
    fn sums_the_window_and_expires_old_seconds() {
        let w = WindowedCounter::new(10);
        let t0 = 1_700_000_000;
        for i in 0..10 {
            w.add(t0 + i, 1, i % 2);
        }
        assert_eq!(w.totals(t0 + 9), (10, 5));
        // The window is (now-10, now]: at t0+10 second t0 has left.
        assert_eq!(w.totals(t0 + 10), (9, 5));
        assert_eq!(w.totals(t0 + 18), (1, 1));
        assert_eq!(w.totals(t0 + 19), (0, 0));
        // Looking back in time is fine too (the same clock, earlier now).
        assert_eq!(w.totals(t0 + 4), (5, 2));
    }

    /// A window that wraps past the ring's bucket 0 sums the tail of the
    /// previous lap and the head of the current one, for every position.
    #[test]
    fn windows_across_the_ring_start() {
        let w = WindowedCounter::new(10);
        let ring = w.ring_len();
        let t0 = 7 * ring;
        for t in t0 - 20..t0 + 20 {
            w.add(t, 1, t % 3);
        }
        for now in t0 - 10..t0 + 20 {
            let want = (now - 9..=now).fold((0, 0), |(f, s), t| (f + 1, s + t % 3));
            assert_eq!(w.totals(now), want, "now {now}");
        }
        // Early clocks: fewer units than the window exist.
        let e = WindowedCounter::new(10);
        e.add(0, 1, 0);
        e.add(3, 1, 1);
        assert_eq!(e.totals(3), (2, 1));
        assert_eq!(e.totals(0), (1, 0));
    }

    #[test]
    fn a_reused_bucket_starts_from_zero() {
        let w = WindowedCounter::new(10);
        let t0 = 1_000_000;
        w.add(t0, 7, 3);
        let ring = w.ring_len();
        // Same bucket, next lap: the stale counts read as zero...
        assert_eq!(w.totals(t0 + ring), (0, 0));
        // ...and the first add of the new lap replaces them.
        w.add(t0 + ring, 1, 0);
        assert_eq!(w.totals(t0 + ring), (1, 0));
        assert_eq!(w.totals(t0 + 10 * ring), (0, 0));
    }

    #[test]
    fn coarse_buckets_for_long_windows() {
        let w = WindowedCounter::new(7200);
        assert_eq!(w.granularity(), 2);
        assert_eq!(w.window_secs(), 7200);
        w.add(10_000, 0, 1);
        assert_eq!(w.totals(10_000 + 7000).1, 1);
        assert_eq!(w.totals(10_000 + 7300).1, 0);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let w = WindowedCounter::new(1);
        w.add(5, COUNT_MAX - 1, 0);
        w.add(5, 10, 10);
        assert_eq!(w.totals(5), (COUNT_MAX, 10));
    }

    /// The old reset, step by step (as `RetryBudget::bucket` did it): a thread
    /// that sees a stale bucket claims the new second with a CAS and then zeroes
    /// the count with a separate store. Another thread that sees the claimed
    /// second between the two steps adds to the count, and the store wipes it.
    #[test]
    fn the_old_two_step_reset_loses_an_increment() {
        let sec = AtomicU64::new(100);
        let count = AtomicU64::new(5);
        // Thread A, step 1: the bucket is stale (100), claim second 110.
        assert!(sec
            .compare_exchange(100, 110, Ordering::AcqRel, Ordering::Acquire)
            .is_ok());
        // Thread B: sees 110, nothing to reset, counts its request.
        assert_eq!(sec.load(Ordering::Acquire), 110);
        count.fetch_add(1, Ordering::Relaxed);
        // Thread A, step 2: zero the count, then count its own request.
        count.store(0, Ordering::Release);
        count.fetch_add(1, Ordering::Relaxed);
        // Two requests in second 110, one counted.
        assert_eq!(count.load(Ordering::Relaxed), 1);
    }

    /// The same interleaving against the new bucket word: A reads the stale
    /// word and computes its reset-and-add, B's add lands first, so A's CAS
    /// fails and A recomputes from B's word. Both requests are counted.
    #[test]
    fn the_one_word_reset_keeps_a_racing_increment() {
        let w = WindowedCounter::new(10);
        let t0 = 1_000;
        w.add(t0, 5, 0);
        let t1 = t0 + w.ring_len();
        let (idx, lap) = w.locate(w.unit(t1));
        let bucket = &w.buckets[idx];
        // A: reads the stale word and prepares its reset-and-add.
        let seen = bucket.load(Ordering::Relaxed);
        let a_next = bump(seen, lap, 1, 0);
        // B: adds through the real path (resets the stale lap itself).
        w.add(t1, 1, 0);
        // A: its CAS on the stale word fails; the retry adds on top of B.
        let actual = bucket
            .compare_exchange(seen, a_next, Ordering::Relaxed, Ordering::Relaxed)
            .unwrap_err();
        assert!(bucket
            .compare_exchange(
                actual,
                bump(actual, lap, 1, 0),
                Ordering::Relaxed,
                Ordering::Relaxed
            )
            .is_ok());
        assert_eq!(w.totals(t1), (2, 0));
    }

    /// Many threads released together on a stale bucket at a boundary: every
    /// add is counted (bounded: 8 threads × 5,000 adds over 50 boundaries).
    #[test]
    fn threads_racing_at_boundaries_lose_nothing() {
        let w = Arc::new(WindowedCounter::new(10));
        let threads = 8;
        let ring = w.ring_len();
        for round in 0..50u64 {
            // Each round's second reuses a bucket that holds older counts.
            let t = 10_000 + round * ring;
            w.add(t.saturating_sub(ring), 9, 9);
            let barrier = Arc::new(Barrier::new(threads));
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    let (w, barrier) = (Arc::clone(&w), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        barrier.wait();
                        for _ in 0..100 {
                            w.add(t, 1, 1);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            assert_eq!(w.totals(t), (800, 800), "round {round}");
        }
    }
}
