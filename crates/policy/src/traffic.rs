//! What the status page shows of one backend or route, HAProxy-stats style:
//! requests per second, the status-class mix and p50/p99 latency over the
//! last [`WINDOW_SECS`] whole seconds. Bounded and lock-free: a fixed ring of
//! per-second slots, each a fixed set of counters (one per status class and
//! one per latency bucket), so memory never grows with traffic
//! ([`TrafficWindow::BYTES`] per backend or route) and recording is two
//! single-word CAS loops, never an allocation.
//!
//! Each counter word packs `lap:32 | count:32`, where `lap = second / RING`
//! says which turn of the ring the count belongs to (as [`crate::window`]
//! does): a counter left from an older lap restarts from the new count in the
//! same CAS that adds it, so no reset pass runs and no increment is lost to
//! one. Readers take a word of another lap as zero. Time is passed in (`now`,
//! Unix seconds), so the arithmetic is tested on given times.
//!
//! Latency buckets are logarithmic with four linear sub-buckets per octave of
//! microseconds, from 32 µs to 64 s ([`bucket_of`], [`bucket_bounds`]); a
//! quantile is reported as the middle of the bucket that holds it, so it is
//! within 12.5 % of the true sample quantile for latencies in that range.

use std::sync::atomic::{AtomicU64, Ordering};

/// Whole seconds the figures cover (the current, unfinished second is not counted).
pub const WINDOW_SECS: u64 = 10;
/// Slots in the ring: the window plus the current second, plus one for a writer
/// whose clock read is a second behind.
const RING: u64 = WINDOW_SECS + 2;

/// Status classes counted: `1xx`…`5xx` and `error` (no status: the backend did
/// not answer, or the client was sent nothing).
pub const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// Class index of a status in [`CLASSES`] (`None`, 0 or out of range: `error`).
#[inline]
pub fn class_of(status: Option<u16>) -> usize {
    match status {
        Some(s @ 100..=599) => usize::from(s / 100 - 1),
        _ => 5,
    }
}

const SUB_BITS: u32 = 2;
const SUBS: u32 = 1 << SUB_BITS;
/// Below 2^MIN_OCTAVE µs (32 µs): bucket 0.
const MIN_OCTAVE: u32 = 5;
/// From 2^(MAX_OCTAVE+1) µs (≈ 67 s) on: the last bucket.
const MAX_OCTAVE: u32 = 25;
/// Latency buckets.
pub const BUCKETS: usize = 1 + ((MAX_OCTAVE - MIN_OCTAVE + 1) * SUBS) as usize;

/// The latency bucket of `us` microseconds.
#[inline]
pub fn bucket_of(us: u64) -> usize {
    if us < 1 << MIN_OCTAVE {
        return 0;
    }
    let octave = 63 - us.leading_zeros();
    if octave > MAX_OCTAVE {
        return BUCKETS - 1;
    }
    let sub = (us >> (octave - SUB_BITS)) & u64::from(SUBS - 1);
    1 + ((octave - MIN_OCTAVE) * SUBS) as usize + sub as usize
}

/// `[low, high)` microseconds of bucket `i` (the last one also holds everything above).
pub fn bucket_bounds(i: usize) -> (u64, u64) {
    if i == 0 {
        return (0, 1 << MIN_OCTAVE);
    }
    let i = (i.min(BUCKETS - 1) - 1) as u32;
    let octave = MIN_OCTAVE + i / SUBS;
    let sub = u64::from(i % SUBS);
    let step = 1u64 << (octave - SUB_BITS);
    (
        (u64::from(SUBS) + sub) * step,
        (u64::from(SUBS) + sub + 1) * step,
    )
}

/// The `q` quantile (0 < q ≤ 1) of the samples counted in `buckets`, in
/// microseconds: the middle of the bucket holding the sample of rank
/// `ceil(q × n)`. `None` without samples.
pub fn quantile_us(buckets: &[u64], q: f64) -> Option<u64> {
    let n: u64 = buckets.iter().sum();
    if n == 0 {
        return None;
    }
    // `rank` in [1, n]: the float product is exact enough for any real count.
    let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0;
    for (i, c) in buckets.iter().enumerate() {
        seen += c;
        if seen >= rank {
            let (lo, hi) = bucket_bounds(i);
            return Some(lo + (hi - lo) / 2);
        }
    }
    None
}

const LAP_SHIFT: u32 = 32;
const COUNT_MASK: u64 = (1 << LAP_SHIFT) - 1;

/// One per-second slot: a counter per class, then one per latency bucket.
#[derive(Debug)]
struct Slot {
    words: [AtomicU64; CLASSES.len() + BUCKETS],
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The count `word` holds for `lap` (0 when it holds another lap's).
#[inline]
pub(crate) fn count_at(word: &AtomicU64, lap: u64) -> u64 {
    let v = word.load(Ordering::Relaxed);
    if v >> LAP_SHIFT == lap {
        v & COUNT_MASK
    } else {
        0
    }
}

/// Add one to `word` for `lap`. A word of an older lap restarts at 1; a record for a
/// lap older than the word's (a clock read far behind) is dropped.
#[inline]
pub(crate) fn bump(word: &AtomicU64, lap: u64) {
    let mut cur = word.load(Ordering::Relaxed);
    loop {
        let cur_lap = cur >> LAP_SHIFT;
        let next = if cur_lap == lap {
            if cur & COUNT_MASK == COUNT_MASK {
                return; // saturated
            }
            cur + 1
        } else if cur_lap < lap {
            (lap << LAP_SHIFT) | 1
        } else {
            return;
        };
        match word.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

/// Requests by class and latency over the last [`WINDOW_SECS`] seconds.
#[derive(Debug)]
pub struct TrafficWindow {
    slots: Box<[Slot]>,
}

impl Default for TrafficWindow {
    fn default() -> Self {
        Self::new()
    }
}

/// What a [`TrafficWindow`] says at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficSnapshot {
    /// Seconds covered.
    pub window_secs: u64,
    /// Requests counted (the sum of `classes`).
    pub requests: u64,
    /// Requests per [`CLASSES`] entry.
    pub classes: [u64; CLASSES.len()],
    /// `requests / window_secs`.
    pub per_second: f64,
    /// Latency quantiles (µs) of the requests that had a latency; `None` without any.
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
}

impl TrafficWindow {
    /// Memory of one window (its slots; the ring is allocated once).
    pub const BYTES: usize = RING as usize * std::mem::size_of::<Slot>();

    pub fn new() -> Self {
        Self {
            slots: (0..RING).map(|_| Slot::default()).collect(),
        }
    }

    /// Count one request finished at `now_secs` with status class `class`
    /// ([`class_of`]) and, when it has one, its latency in microseconds.
    /// Hot path: one CAS loop on the class's word, one on the latency bucket's.
    #[inline]
    pub fn record(&self, now_secs: u64, class: usize, latency_us: Option<u64>) {
        let slot = &self.slots[(now_secs % RING) as usize];
        let lap = now_secs / RING;
        bump(&slot.words[class.min(CLASSES.len() - 1)], lap);
        if let Some(us) = latency_us {
            bump(&slot.words[CLASSES.len() + bucket_of(us)], lap);
        }
    }

    /// The figures over the [`WINDOW_SECS`] whole seconds before `now_secs`.
    pub fn snapshot(&self, now_secs: u64) -> TrafficSnapshot {
        let mut classes = [0u64; CLASSES.len()];
        let mut buckets = [0u64; BUCKETS];
        for sec in now_secs.saturating_sub(WINDOW_SECS)..now_secs {
            let slot = &self.slots[(sec % RING) as usize];
            let lap = sec / RING;
            let count = |w: &AtomicU64| {
                let v = w.load(Ordering::Relaxed);
                if v >> LAP_SHIFT == lap {
                    v & COUNT_MASK
                } else {
                    0
                }
            };
            let (c, b) = slot.words.split_at(CLASSES.len());
            for (sum, w) in classes.iter_mut().zip(c) {
                *sum += count(w);
            }
            for (sum, w) in buckets.iter_mut().zip(b) {
                *sum += count(w);
            }
        }
        let requests = classes.iter().sum();
        TrafficSnapshot {
            window_secs: WINDOW_SECS,
            requests,
            classes,
            per_second: requests as f64 / WINDOW_SECS as f64,
            p50_us: quantile_us(&buckets, 0.50),
            p99_us: quantile_us(&buckets, 0.99),
        }
    }
}

/// One route's traffic: its window and the requests on it now. Kept across
/// reloads while the route's label stays.
#[derive(Debug, Default)]
pub struct RouteTraffic {
    pub window: TrafficWindow,
    inflight: std::sync::atomic::AtomicU64,
}

impl RouteTraffic {
    /// A request was routed here (one atomic add).
    #[inline]
    pub fn enter(&self) {
        self.inflight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A request routed here ended (one atomic sub).
    #[inline]
    pub fn exit(&self) {
        self.inflight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn inflight(&self) -> u64 {
        self.inflight.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const T0: u64 = 1_700_000_000;

    #[test]
    fn classes_by_hundreds() {
        assert_eq!(class_of(Some(101)), 0);
        assert_eq!(class_of(Some(200)), 1);
        assert_eq!(class_of(Some(302)), 2);
        assert_eq!(class_of(Some(404)), 3);
        assert_eq!(class_of(Some(599)), 4);
        assert_eq!(class_of(Some(600)), 5);
        assert_eq!(class_of(Some(0)), 5);
        assert_eq!(class_of(None), 5);
    }

    #[test]
    fn buckets_are_contiguous_and_hold_their_values() {
        assert_eq!(bucket_bounds(0), (0, 32));
        let mut prev_hi = 0;
        for i in 0..BUCKETS {
            let (lo, hi) = bucket_bounds(i);
            assert_eq!(
                lo,
                prev_hi,
                "bucket {i} starts where {} ended",
                i.max(1) - 1
            );
            assert!(hi > lo);
            if i > 0 {
                // four linear steps per octave: no bucket wider than a quarter octave
                assert!((hi - lo) * 4 <= lo, "bucket {i}: {lo}..{hi}");
            }
            assert_eq!(bucket_of(lo), i);
            assert_eq!(bucket_of(hi - 1), i);
            prev_hi = hi;
        }
        assert_eq!(prev_hi, 1 << (MAX_OCTAVE + 1));
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1_000), bucket_of(1_023));
        assert_ne!(bucket_of(1_000), bucket_of(1_024));
    }

    #[test]
    fn quantile_is_within_an_eighth_of_the_value() {
        for us in [
            40u64, 100, 999, 1_000, 12_345, 150_000, 2_000_000, 60_000_000,
        ] {
            let mut b = [0u64; BUCKETS];
            b[bucket_of(us)] = 1;
            let q = quantile_us(&b, 0.5).unwrap();
            let err = q.abs_diff(us) as f64 / us as f64;
            assert!(err <= 0.125, "{us} µs reported as {q} ({err})");
        }
    }

    #[test]
    fn quantiles_take_the_rank_ceil_q_n() {
        let mut b = [0u64; BUCKETS];
        assert_eq!(quantile_us(&b, 0.5), None);
        // 98 at 1 ms, 2 at 200 ms: p50 is 1 ms, p99 (rank 99) is 200 ms
        b[bucket_of(1_000)] = 98;
        b[bucket_of(200_000)] = 2;
        let mid = |us| {
            let (lo, hi) = bucket_bounds(bucket_of(us));
            lo + (hi - lo) / 2
        };
        assert_eq!(quantile_us(&b, 0.5), Some(mid(1_000)));
        assert_eq!(quantile_us(&b, 0.98), Some(mid(1_000)));
        assert_eq!(quantile_us(&b, 0.99), Some(mid(200_000)));
        // one slow of 100: rank 99 is still a fast one
        b[bucket_of(1_000)] = 99;
        b[bucket_of(200_000)] = 1;
        assert_eq!(quantile_us(&b, 0.99), Some(mid(1_000)));
        assert_eq!(quantile_us(&b, 1.0), Some(mid(200_000)));
    }

    #[test]
    fn window_counts_whole_seconds_before_now() {
        let w = TrafficWindow::new();
        for _ in 0..3 {
            w.record(T0, class_of(Some(200)), Some(1_000));
        }
        w.record(T0, class_of(Some(404)), Some(1_000));
        w.record(T0 + 1, class_of(Some(500)), Some(2_000));
        w.record(T0 + 1, class_of(None), None);
        // the current second is not counted yet
        assert_eq!(w.snapshot(T0).requests, 0);
        let s = w.snapshot(T0 + 1);
        assert_eq!((s.requests, s.classes), (4, [0, 3, 0, 1, 0, 0]));
        let s = w.snapshot(T0 + 2);
        assert_eq!(s.requests, 6);
        assert_eq!(s.classes, [0, 3, 0, 1, 1, 1]);
        assert!((s.per_second - 0.6).abs() < 1e-9);
        // five latencies: 1,1,1,1,2 ms → p50 1 ms, p99 2 ms (within a bucket)
        let (p50, p99) = (s.p50_us.unwrap(), s.p99_us.unwrap());
        assert!(
            p50.abs_diff(1_000) <= 125 && p99.abs_diff(2_000) <= 250,
            "{s:?}"
        );
        // T0 leaves the window at T0 + 11; T0 + 1 at T0 + 12
        assert_eq!(w.snapshot(T0 + WINDOW_SECS).requests, 6);
        assert_eq!(w.snapshot(T0 + WINDOW_SECS + 1).requests, 2);
        assert_eq!(w.snapshot(T0 + WINDOW_SECS + 2).requests, 0);
        assert_eq!(w.snapshot(T0 + WINDOW_SECS + 2).p50_us, None);
    }

    #[test]
    fn a_reused_slot_starts_over_and_late_records_are_dropped() {
        let w = TrafficWindow::new();
        w.record(T0, 1, Some(100));
        w.record(T0, 1, Some(100));
        // the same slot one ring later: counts start over, the old lap is gone
        w.record(T0 + RING, 3, Some(100));
        let s = w.snapshot(T0 + RING + 1);
        assert_eq!((s.requests, s.classes[1], s.classes[3]), (1, 0, 1));
        // a record for the old lap arriving late does not wipe the new one
        w.record(T0, 1, Some(100));
        let s = w.snapshot(T0 + RING + 1);
        assert_eq!((s.requests, s.classes[3]), (1, 1));
    }

    #[test]
    fn idle_time_reads_as_nothing() {
        let w = TrafficWindow::new();
        w.record(T0, 1, Some(100));
        // many laps later, stale slots never count
        assert_eq!(w.snapshot(T0 + 1_000 * RING + 3).requests, 0);
    }

    #[test]
    fn concurrent_records_are_all_counted() {
        let w = Arc::new(TrafficWindow::new());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = Arc::clone(&w);
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        // two seconds, and a slot reused across a lap boundary
                        let sec = T0 + (i % 2) * RING;
                        w.record(sec, t % 2, Some(i));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = w.snapshot(T0 + RING + 1);
        assert_eq!(s.requests, 20_000, "{s:?}");
        assert_eq!(s.classes[0] + s.classes[1], 20_000);
    }

    #[test]
    fn memory_is_fixed() {
        assert_eq!(TrafficWindow::BYTES, 12 * (6 + 85) * 8);
    }
}
