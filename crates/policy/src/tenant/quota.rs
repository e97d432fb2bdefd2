//! Cost quotas: each tenant may spend `quota` cost units per UTC calendar period (an
//! hour, a day, a month). A request is charged after its response (the backend's cost
//! header, or 1), so the quota is checked against what was spent before it: a request
//! admitted just under the quota may overshoot it by its own cost, and the fleet by what
//! each instance admitted before it heard of the others' spending (one flush interval).
//!
//! The counts ride in the rate limiter's batches ([`crate::ratelimit::flush_with`]): each
//! tenant's spending of a period is one [`Delta`] whose window is the period's index, so
//! the store keeps it as it keeps a window's count, and no round trip is added.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::calendar::{civil_from_days, days_from_civil};
use crate::ratelimit::{stable_hash_in, Delta, FlushExtra, GlobalCounts};

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;

/// A quota period: a UTC calendar hour, day or month.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    Hour,
    Day,
    Month,
}

impl Period {
    pub fn parse(s: &str) -> Option<Period> {
        match s {
            "hour" => Some(Period::Hour),
            "day" => Some(Period::Day),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The index of the period holding `now_ms` (Unix ms): hours, days or months since
    /// the epoch (Unix time has no leap seconds, so UTC hours and days are exact).
    pub fn index(self, now_ms: u64) -> u64 {
        match self {
            Period::Hour => now_ms / HOUR_MS,
            Period::Day => now_ms / DAY_MS,
            Period::Month => {
                let (y, m, _) = civil_from_days((now_ms / DAY_MS) as i64);
                ((y - 1970) * 12 + i64::from(m) - 1).max(0) as u64
            }
        }
    }

    /// Unix ms at which period `index` starts.
    pub fn start_ms(self, index: u64) -> u64 {
        match self {
            Period::Hour => index.saturating_mul(HOUR_MS),
            Period::Day => index.saturating_mul(DAY_MS),
            Period::Month => {
                let y = 1970 + (index / 12) as i64;
                let m = (index % 12) as u32 + 1;
                (days_from_civil(y, m, 1).max(0) as u64).saturating_mul(DAY_MS)
            }
        }
    }

    /// Whole seconds (at least 1) from `now_ms` until the period holding it ends.
    pub fn secs_to_end(self, now_ms: u64) -> u64 {
        let end = self.start_ms(self.index(now_ms) + 1);
        end.saturating_sub(now_ms).div_ceil(1000).max(1)
    }

    /// The longest the period can be, in seconds: the store keeps a count two of these.
    pub fn max_secs(self) -> u64 {
        match self {
            Period::Hour => 3_600,
            Period::Day => 86_400,
            Period::Month => 31 * 86_400,
        }
    }

    /// The period's length as the `w` of a `RateLimit-Policy` field: the longest it can be.
    pub fn window_secs(self) -> u64 {
        self.max_secs()
    }
}

/// A refusal for the quota: the period's spending reached it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub used: u64,
    /// Seconds until the period ends (the `Retry-After`).
    pub retry_after_secs: u64,
}

/// One tenant's spending in its current period.
#[derive(Debug, Clone, Copy)]
struct Entry {
    period: Period,
    index: u64,
    /// The fleet's total as the store last answered (our own sent charges included).
    known: u64,
    /// Charged here, not sent yet.
    unsent: u64,
    /// Sent in a batch the store has not answered yet.
    pending: u64,
}

impl Entry {
    fn new(period: Period, now_ms: u64) -> Entry {
        Entry {
            period,
            index: period.index(now_ms),
            known: 0,
            unsent: 0,
            pending: 0,
        }
    }

    fn used(&self) -> u64 {
        self.known
            .saturating_add(self.unsent)
            .saturating_add(self.pending)
    }

    /// Moves to the period of `now_ms`; a new period starts from nothing (a pending
    /// batch's charges belong to the old one).
    fn roll(&mut self, now_ms: u64) {
        let index = self.period.index(now_ms);
        if index > self.index {
            *self = Entry {
                period: self.period,
                index,
                known: 0,
                unsent: 0,
                pending: 0,
            };
        }
    }
}

/// Every tenant's spending, by the store hash of its name and period; shared by the
/// request path (check and charge: one short lock) and the flusher (take and answered).
/// Bounded by the registry: one entry per tenant with a quota that has been seen.
#[derive(Debug, Default)]
pub struct QuotaBook {
    entries: Mutex<HashMap<u128, Entry>>,
}

impl QuotaBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// The store hash of `tenant`'s spending under `period` (apart from every rate-limit
    /// key: its own namespace).
    pub fn key(tenant: &str, period: Period) -> u128 {
        let mut k = Vec::with_capacity(tenant.len() + 8);
        k.extend_from_slice(tenant.as_bytes());
        k.push(0);
        k.extend_from_slice(period.as_str().as_bytes());
        stable_hash_in(b"quota\0", &k)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u128, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `key`'s tenant has spent in the period holding `now_ms`, as known here.
    pub fn used(&self, key: u128, period: Period, now_ms: u64) -> u64 {
        let mut m = self.lock();
        match m.get_mut(&key) {
            Some(e) if e.period == period => {
                e.roll(now_ms);
                e.used()
            }
            _ => 0,
        }
    }

    /// Whether a request of the tenant may start: refused once its spending reached
    /// `quota` (until the period ends). A tenant first seen here starts being read from
    /// the store at the coming flushes (the fleet's spending matters to the instances
    /// its requests reach).
    pub fn check(
        &self,
        key: u128,
        period: Period,
        quota: u64,
        now_ms: u64,
    ) -> Result<(), QuotaExceeded> {
        let used = {
            let mut m = self.lock();
            let e = m.entry(key).or_insert_with(|| Entry::new(period, now_ms));
            if e.period != period {
                *e = Entry::new(period, now_ms);
            }
            e.roll(now_ms);
            e.used()
        };
        if quota > 0 && used >= quota {
            return Err(QuotaExceeded {
                used,
                retry_after_secs: period.secs_to_end(now_ms),
            });
        }
        Ok(())
    }

    /// Charges `cost` units to the tenant in the period holding `now_ms`.
    pub fn charge(&self, key: u128, period: Period, cost: u64, now_ms: u64) {
        let mut m = self.lock();
        let index = period.index(now_ms);
        let e = m.entry(key).or_insert_with(|| Entry::new(period, now_ms));
        if e.period != period {
            // The tenant's tier changed its period (a reload): a new count.
            *e = Entry::new(period, now_ms);
        }
        e.roll(now_ms);
        if e.index == index {
            // Never more than the largest quota in one flush: the store takes every delta
            // (and counts it exactly), and past any quota more changes nothing.
            e.unsent = e.unsent.saturating_add(cost).min(super::MAX_QUOTA);
        }
    }

    /// Drops the entries of tenants no longer in `keep` (a reload removed them).
    pub fn retain(&self, keep: impl Fn(u128) -> bool) {
        self.lock().retain(|k, _| keep(*k));
    }

    /// Tenants tracked (for tests and `/status`).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FlushExtra for QuotaBook {
    fn take(&self, now_ms: u64, all: bool, out: &mut Vec<Delta>) {
        let mut m = self.lock();
        // Entries of a period over for good (two periods old) are forgotten.
        m.retain(|_, e| e.period.index(now_ms) <= e.index.saturating_add(1));
        for (key, e) in m.iter_mut() {
            e.roll(now_ms);
            if e.unsent == 0 && !all {
                continue;
            }
            if e.pending > 0 {
                continue; // its batch is being retried; the next take sends the rest
            }
            e.pending = e.unsent;
            e.unsent = 0;
            out.push(Delta {
                key_hash: *key,
                window_secs: e.period.max_secs(),
                window: e.index,
                cur: e.pending,
                prev: 0,
                need_prev: false,
                floor_cur: e.known,
                floor_prev: 0,
            });
        }
    }

    fn answered(&self, deltas: &[Delta], counts: &[GlobalCounts]) {
        let mut m = self.lock();
        for (d, c) in deltas.iter().zip(counts) {
            let Some(e) = m.get_mut(&d.key_hash) else {
                continue;
            };
            if e.index != d.window {
                continue; // the period ended meanwhile
            }
            e.pending = e.pending.saturating_sub(d.cur);
            // The store's total holds what was just sent; counts only grow.
            e.known = e.known.max(c.cur);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// 2026-11-27T18:30:00Z
    const NOW: u64 = 1_795_804_200_000;

    #[test]
    fn calendar_periods_in_utc() {
        // 2026-11-27 18:30 UTC: the hour ends at 19:00, the day at midnight, the month
        // on December 1st.
        assert_eq!(Period::Hour.secs_to_end(NOW), 30 * 60);
        assert_eq!(Period::Day.secs_to_end(NOW), 5 * 3_600 + 30 * 60);
        assert_eq!(
            Period::Month.secs_to_end(NOW),
            3 * 86_400 + 5 * 3_600 + 30 * 60
        );
        // Month indexes and starts agree with the calendar.
        let dec = Period::Month.index(NOW) + 1;
        assert_eq!(Period::Month.start_ms(dec), 1_796_083_200_000); // 2026-12-01
        assert_eq!(Period::Month.index(0), 0);
        assert_eq!(Period::Month.start_ms(1), 31 * DAY_MS); // 1970-02-01
                                                            // 2028 is a leap year: February has 29 days.
        let feb28 = days_from_civil(2028, 2, 28) as u64 * DAY_MS;
        assert_eq!(Period::Month.secs_to_end(feb28), 2 * 86_400);
        for d in [0i64, 59, 365, 10_957, 20_000, 21_000] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
    }

    #[test]
    fn quota_refuses_until_the_period_ends_then_starts_afresh() {
        let book = QuotaBook::new();
        let k = QuotaBook::key("acme", Period::Hour);
        assert!(book.check(k, Period::Hour, 10, NOW).is_ok());
        book.charge(k, Period::Hour, 7, NOW);
        assert!(book.check(k, Period::Hour, 10, NOW).is_ok());
        book.charge(k, Period::Hour, 3, NOW + 1);
        let refused = book.check(k, Period::Hour, 10, NOW + 1_000).unwrap_err();
        assert_eq!(refused.used, 10);
        assert_eq!(refused.retry_after_secs, 30 * 60 - 1);
        // The next hour: nothing spent.
        assert!(book.check(k, Period::Hour, 10, NOW + 30 * 60_000).is_ok());
        assert_eq!(book.used(k, Period::Hour, NOW + 30 * 60_000), 0);
    }

    #[test]
    fn charges_are_sent_once_and_the_fleet_total_comes_back() {
        let book = QuotaBook::new();
        let k = QuotaBook::key("acme", Period::Day);
        book.charge(k, Period::Day, 5, NOW);
        let mut out = Vec::new();
        book.take(NOW, false, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].cur, 5);
        assert_eq!(out[0].window, Period::Day.index(NOW));
        // While the batch is out, the charges still count; a second take sends nothing.
        assert_eq!(book.used(k, Period::Day, NOW), 5);
        let mut again = Vec::new();
        book.charge(k, Period::Day, 2, NOW);
        book.take(NOW, true, &mut again);
        assert!(again.is_empty());
        // The store's total: another instance spent 30 meanwhile.
        book.answered(
            &out,
            &[GlobalCounts {
                cur: 35,
                prev: 0,
                restored: false,
            }],
        );
        assert_eq!(book.used(k, Period::Day, NOW), 37);
        // A refresh with nothing to send still reads the total.
        let mut refresh = Vec::new();
        book.take(NOW, false, &mut refresh);
        assert_eq!(refresh.len(), 1);
        assert_eq!(refresh[0].cur, 2);
        assert_eq!(refresh[0].floor_cur, 35);
    }

    #[test]
    fn a_flush_never_carries_more_than_the_largest_quota() {
        let book = QuotaBook::new();
        let k = QuotaBook::key("acme", Period::Day);
        for _ in 0..3 {
            book.charge(k, Period::Day, u64::MAX, NOW);
        }
        let mut out = Vec::new();
        book.take(NOW, false, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].cur, super::super::MAX_QUOTA);
    }

    #[test]
    fn tenants_have_keys_apart_from_each_other_and_their_periods() {
        let a = QuotaBook::key("acme", Period::Day);
        assert_ne!(a, QuotaBook::key("acme", Period::Month));
        assert_ne!(a, QuotaBook::key("acm", Period::Day));
        assert_ne!(a, QuotaBook::key("acme\0day", Period::Day));
    }

    /// A store that counts its round trips.
    struct Counting {
        inner: crate::ratelimit::LocalStore,
        calls: std::sync::atomic::AtomicU64,
    }

    #[async_trait::async_trait]
    impl crate::ratelimit::CounterStore for Counting {
        async fn sync(&self, batch: crate::ratelimit::Batch<'_>) -> crate::ratelimit::SyncResult {
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.sync(batch).await
        }
        fn kind(&self) -> &'static str {
            "local"
        }
    }

    #[tokio::test]
    async fn quota_counts_ride_in_the_rate_limit_batch_with_no_round_trip_of_their_own() {
        use crate::ratelimit::{flush_with, Limiter, RateLimitParams};
        let store = Counting {
            inner: crate::ratelimit::LocalStore::new(),
            calls: Default::default(),
        };
        let limiter = Limiter::new(RateLimitParams::default());
        let book = QuotaBook::new();
        let k = QuotaBook::key("acme", Period::Month);
        // Two instances' worth of spending through one store: ours, then another's.
        for t in 0..5 {
            assert!(limiter.check("\0tenant\0acme", NOW + t).is_allowed());
        }
        book.charge(k, Period::Month, 40, NOW);
        let set = [&limiter];
        flush_with(&set, Some(&book), &store, &|| NOW + 10, true)
            .await
            .unwrap();
        assert_eq!(store.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
        let other = QuotaBook::new();
        other.charge(k, Period::Month, 25, NOW);
        let other_limiter = Limiter::new(RateLimitParams::default());
        flush_with(&[&other_limiter], Some(&other), &store, &|| NOW + 20, true)
            .await
            .unwrap();
        assert_eq!(other.used(k, Period::Month, NOW + 20), 65);
        // Our next flush (a refresh, nothing new) learns the fleet's total.
        flush_with(&set, Some(&book), &store, &|| NOW + 30, true)
            .await
            .unwrap();
        assert_eq!(book.used(k, Period::Month, NOW + 30), 65);
        assert!(book.check(k, Period::Month, 65, NOW + 30).is_err());
        assert!(book.check(k, Period::Month, 66, NOW + 30).is_ok());
        // The limiter's key was synced in the same batches: a fleet view exists.
        assert_eq!(limiter.fleet_estimate("\0tenant\0acme", NOW + 30), Some(5));
        assert_eq!(limiter.fleet_estimate("never-seen", NOW + 30), None);
    }
}
