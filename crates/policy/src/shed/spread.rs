//! `Retry-After` that spreads retries (CONTRACT §15 / issue 44): a shed 503 says
//! `Retry-After: base + j`, with `j` drawn uniformly from `0..=width` and
//!
//! ```text
//!   width = ceil(base × s / (1 − s)),   s = the share of requests shed (capped at 0.9)
//! ```
//!
//! so the retries of the requests shed over one `base` period come back spread over
//! `base / (1 − s)` seconds: the shed `s × L × base` requests return at `s × C` per
//! second at most (`C = (1 − s) × L`, the rate admitted), never above what is being
//! admitted, instead of all at once `base` seconds later. Little is shed → (almost)
//! `base`; half shed → `base..=2·base`; 90 % or more → `base..=10·base`.
//!
//! The share is measured by [`ShedShare`] over the last two seconds. To keep the admit
//! path free while nothing is shed, admissions are counted only while sheds were seen in
//! that time (one relaxed load otherwise); so just after the first shed of an episode
//! the share reads high for a moment (a wider spread, which errs on the safe side).

use crate::window::WindowedCounter;
use std::sync::atomic::{AtomicU64, Ordering};

/// Seconds the share is measured over.
pub const SHARE_WINDOW_SECS: u64 = 2;
/// Largest share the spread uses (a width of 9 × base).
pub const MAX_SHARE: f64 = 0.9;

/// The share of requests shed lately: (requests, shed) over [`SHARE_WINDOW_SECS`].
#[derive(Debug)]
pub struct ShedShare {
    counts: WindowedCounter,
    /// Unix second of the last shed (0: never).
    last_shed: AtomicU64,
}

impl Default for ShedShare {
    fn default() -> Self {
        Self {
            counts: WindowedCounter::new(SHARE_WINDOW_SECS),
            last_shed: AtomicU64::new(0),
        }
    }
}

impl ShedShare {
    /// A request was admitted at `now_secs`: counted only while sheds are recent.
    #[inline]
    pub fn on_admit(&self, now_secs: u64) {
        let last = self.last_shed.load(Ordering::Relaxed);
        if last != 0 && now_secs <= last + SHARE_WINDOW_SECS {
            self.counts.add(now_secs, 1, 0);
        }
    }

    /// A request was shed at `now_secs`.
    #[inline]
    pub fn on_shed(&self, now_secs: u64) {
        if self.last_shed.load(Ordering::Relaxed) != now_secs {
            self.last_shed.store(now_secs, Ordering::Relaxed);
        }
        self.counts.add(now_secs, 1, 1);
    }

    /// A request is refused at `now_secs`: counts it as shed and gives its
    /// `Retry-After`, `base` spread by the share shed lately ([`spread_retry_after`];
    /// `random`: any uniformly drawn `u64`). The one place every shed 503 (the cap, its
    /// queue, an adaptive upstream and its queue) takes its value from.
    pub fn refuse(&self, base: u64, now_secs: u64, random: u64) -> u64 {
        self.on_shed(now_secs);
        spread_retry_after(base, self.share(now_secs), random)
    }

    /// Share of the requests of the last [`SHARE_WINDOW_SECS`] seconds that were shed.
    pub fn share(&self, now_secs: u64) -> f64 {
        let (requests, shed) = self.counts.totals(now_secs);
        if requests == 0 {
            0.0
        } else {
            shed as f64 / requests as f64
        }
    }
}

/// The spread's width for `base` at shed share `share`: `ceil(base × s / (1 − s))`.
pub fn spread_width(base: u64, share: f64) -> u64 {
    let s = if share.is_finite() {
        share.clamp(0.0, MAX_SHARE)
    } else {
        MAX_SHARE
    };
    // The epsilon keeps e.g. 1 × 0.9 / 0.1 = 9.000000000000002 at 9.
    (base as f64 * s / (1.0 - s) - 1e-9).ceil().max(0.0) as u64
}

/// `Retry-After` for one shed request: `base + random % (width + 1)` (`random`: any
/// uniformly drawn `u64`).
pub fn spread_retry_after(base: u64, share: f64, random: u64) -> u64 {
    let width = spread_width(base, share);
    base.saturating_add(random % width.saturating_add(1))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_counts_and_spreads_by_the_share_it_makes() {
        let share = ShedShare::default();
        // The first refusal of an episode: all of the recent requests were shed.
        assert_eq!(share.refuse(2, 100, 0), 2);
        assert!((share.share(100) - 1.0).abs() < 1e-9);
        // Capped at 0.9: base..=10 × base.
        let hi = (0..1000u64)
            .map(|r| share.refuse(2, 100, r.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .max()
            .unwrap();
        assert_eq!(hi, 20);
        // Then admissions: with one shed and three admitted, the refusal itself is the
        // second shed of five (0.4): width ceil(2 × 0.4 / 0.6) = 2, so 2..=4.
        let mut seen = std::collections::BTreeSet::new();
        for r in 0..200u64 {
            let share = ShedShare::default();
            share.on_shed(200);
            for _ in 0..3 {
                share.on_admit(200);
            }
            seen.insert(share.refuse(2, 200, r.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            assert!((share.share(200) - 0.4).abs() < 1e-9);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![2, 3, 4]);
    }

    #[test]
    fn width_follows_the_shed_share() {
        assert_eq!(spread_width(1, 0.0), 0);
        assert_eq!(spread_width(1, 0.05), 1);
        assert_eq!(spread_width(2, 0.5), 2);
        assert_eq!(spread_width(4, 0.75), 12);
        assert_eq!(spread_width(1, 0.9), 9);
        assert_eq!(spread_width(1, 1.0), 9, "capped at 0.9");
        assert_eq!(spread_width(1, f64::NAN), 9);
        assert_eq!(spread_width(10, -1.0), 0);
    }

    #[test]
    fn values_cover_base_to_base_plus_width_evenly() {
        let mut seen = [0u32; 11];
        for r in 0..10_000u64 {
            let v = spread_retry_after(1, 0.9, r.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            assert!((1..=10).contains(&v), "{v}");
            seen[v as usize] += 1;
        }
        // Ten values, each about a tenth.
        for (v, n) in seen.iter().enumerate().skip(1) {
            assert!((800..1200).contains(n), "{v}: {n}");
        }
        // Nothing shed to speak of: the base itself.
        assert_eq!(spread_retry_after(3, 0.0, 12345), 3);
        assert_eq!(spread_retry_after(u64::MAX, 0.9, 7), u64::MAX);
    }

    #[test]
    fn share_over_the_last_two_seconds() {
        let s = ShedShare::default();
        let t = 1_700_000_000;
        // Admissions before any shed are not counted (the admit path stays free).
        for _ in 0..10 {
            s.on_admit(t);
        }
        assert_eq!(s.share(t), 0.0);
        s.on_shed(t);
        for _ in 0..3 {
            s.on_admit(t);
        }
        assert_eq!(s.share(t), 0.25);
        s.on_shed(t + 1);
        assert_eq!(s.share(t + 1), 0.4);
        // Two seconds after the last shed the window is empty and admissions stop counting.
        assert_eq!(s.share(t + 3), 0.0);
        s.on_admit(t + 4);
        assert_eq!(s.share(t + 4), 0.0);
    }
}
