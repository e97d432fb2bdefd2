//! The queue at the cap: which waiting request gets the next slot, and CoDel with
//! adaptive LIFO.
//!
//! A request over its class's share of the cap waits here (`[shedding]
//! queue_timeout_ms`). Slots go by class (critical, normal, low: the class the request
//! is shed by, a tenant tier's priority where it sets one), then by the route's own
//! class, then oldest first. A class whose share of the cap is full does not hold back a
//! higher one: a critical request may take a slot a waiting low request may not.
//!
//! **CoDel with adaptive LIFO** (`queue_target_ms`, Nichols and Jacobson's CoDel as
//! Facebook runs it in front of its services): the wait of each request leaving the queue
//! is a sojourn time. When the shortest sojourn over a whole [`CODEL_INTERVAL`] stays
//! above the target, the queue is standing (it never drains: a FIFO would serve requests
//! whose clients have given up). It then serves newest first and sheds what has waited
//! more than [`SLOUGH_FACTOR`] × the target, until it is empty once; then it is plain
//! FIFO again. Plain Rust that takes `now`; the driver ([`super::Shedder`]) holds it
//! under a lock.

use super::Priority;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The interval over which the shortest wait must stay above the target.
pub const CODEL_INTERVAL: Duration = Duration::from_millis(100);
/// While CoDel is engaged, a request that has waited this many targets is shed.
pub const SLOUGH_FACTOR: u32 = 2;

/// Where a waiting request stands in line: its class, then its route's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    /// The class its share of the cap is counted by (a tenant tier's priority where set).
    pub class: Priority,
    /// The route's class: orders requests of one class.
    pub route: Priority,
}

impl Rank {
    fn bucket(self) -> u8 {
        (self.class.index() * Priority::ALL.len() + self.route.index()) as u8
    }
}

#[derive(Debug)]
struct Entry<T> {
    at: Instant,
    class: Priority,
    payload: T,
}

/// CoDel's state.
#[derive(Debug, Default, Clone, Copy)]
struct CoDel {
    /// Zero = off.
    target: Duration,
    /// Start of the interval being measured, and the shortest sojourn in it.
    interval: Option<(Instant, Duration)>,
    /// Newest first, shedding what waited past `SLOUGH_FACTOR × target`.
    engaged: bool,
}

/// Waiting requests, each with a payload `T` (the driver's ticket).
#[derive(Debug)]
pub struct WaitQueue<T> {
    /// Key: (bucket, arrival sequence). A bucket's entries are in arrival order.
    entries: BTreeMap<(u8, u64), Entry<T>>,
    seq: u64,
    by_class: [u64; 3],
    codel: CoDel,
}

/// A waiting request's place, to take it out when its client leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place((u8, u64));

impl<T> Default for WaitQueue<T> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            seq: 0,
            by_class: [0; 3],
            codel: CoDel::default(),
        }
    }
}

impl<T> WaitQueue<T> {
    /// CoDel's target; zero turns it off (plain FIFO within a rank).
    pub fn set_target(&mut self, target: Duration) {
        if target != self.codel.target {
            self.codel = CoDel {
                target,
                ..CoDel::default()
            };
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Waiting requests of each class (`Priority::ALL` order).
    pub fn waiting_by_class(&self) -> [u64; 3] {
        self.by_class
    }

    /// Whether CoDel is serving newest first.
    pub fn lifo(&self) -> bool {
        self.codel.engaged
    }

    /// The longest wait now in each class (`Priority::ALL` order; 0 when none waits).
    pub fn oldest_wait(&self, now: Instant) -> [Duration; 3] {
        let mut out = [Duration::ZERO; 3];
        for e in self.entries.values() {
            let w = &mut out[e.class.index()];
            *w = (*w).max(now.saturating_duration_since(e.at));
        }
        out
    }

    pub fn push(&mut self, rank: Rank, now: Instant, payload: T) -> Place {
        self.seq += 1;
        let key = (rank.bucket(), self.seq);
        self.entries.insert(
            key,
            Entry {
                at: now,
                class: rank.class,
                payload,
            },
        );
        self.by_class[rank.class.index()] += 1;
        Place(key)
    }

    /// Take out a request that stopped waiting (its client left, its time ran out).
    pub fn remove(&mut self, place: Place) -> Option<T> {
        let e = self.entries.remove(&place.0)?;
        self.by_class[e.class.index()] -= 1;
        self.after_removal();
        Some(e.payload)
    }

    fn after_removal(&mut self) {
        if self.entries.is_empty() {
            // Drained: CoDel starts over.
            self.codel.engaged = false;
            self.codel.interval = None;
        }
    }

    /// The next request to get a slot, among the classes `admits` lets in: the first
    /// rank in order, its oldest (newest while CoDel is engaged). Its wait counts as a
    /// sojourn for CoDel.
    pub fn pop(
        &mut self,
        now: Instant,
        admits: impl Fn(Priority) -> bool,
    ) -> Option<(T, Duration)> {
        let lifo = self.codel.engaged;
        let mut found = None;
        for class in Priority::ALL {
            if self.by_class[class.index()] == 0 || !admits(class) {
                continue;
            }
            let lo = (class.index() * Priority::ALL.len()) as u8;
            let hi = lo + Priority::ALL.len() as u8;
            // Ranks within a class in order; within a rank, by age.
            let mut best: Option<(u8, u64)> = None;
            for bucket in lo..hi {
                let mut r = self.entries.range((bucket, 0)..(bucket + 1, 0));
                let pick = if lifo { r.next_back() } else { r.next() };
                if let Some((k, _)) = pick {
                    best = Some(*k);
                    break;
                }
            }
            if let Some(k) = best {
                found = Some(k);
                break;
            }
        }
        let key = found?;
        let e = self.entries.remove(&key)?;
        self.by_class[e.class.index()] -= 1;
        let waited = now.saturating_duration_since(e.at);
        self.sojourn(now, waited);
        self.after_removal();
        Some((e.payload, waited))
    }

    /// CoDel: one request left the queue after `waited`.
    fn sojourn(&mut self, now: Instant, waited: Duration) {
        let c = &mut self.codel;
        if c.target.is_zero() || c.engaged {
            return;
        }
        match c.interval {
            None => c.interval = Some((now, waited)),
            Some((start, shortest)) => {
                let shortest = shortest.min(waited);
                if now.saturating_duration_since(start) >= CODEL_INTERVAL {
                    if shortest > c.target {
                        c.engaged = true;
                        c.interval = None;
                    } else {
                        c.interval = Some((now, waited));
                    }
                } else {
                    c.interval = Some((start, shortest));
                }
            }
        }
    }

    /// While CoDel is engaged: take out every request that has waited more than
    /// `SLOUGH_FACTOR × target` (to be shed), oldest first.
    pub fn slough(&mut self, now: Instant) -> Vec<T> {
        if !self.codel.engaged {
            return Vec::new();
        }
        let limit = self.codel.target * SLOUGH_FACTOR;
        let stale: Vec<(u8, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| now.saturating_duration_since(e.at) > limit)
            .map(|(k, _)| *k)
            .collect();
        let mut out = Vec::with_capacity(stale.len());
        let mut aged: Vec<(Instant, T)> = Vec::with_capacity(stale.len());
        for k in stale {
            if let Some(e) = self.entries.remove(&k) {
                self.by_class[e.class.index()] -= 1;
                aged.push((e.at, e.payload));
            }
        }
        aged.sort_by_key(|(at, _)| *at);
        out.extend(aged.into_iter().map(|(_, p)| p));
        self.after_removal();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::*;

    fn rank(class: Priority) -> Rank {
        Rank {
            class,
            route: class,
        }
    }

    #[test]
    fn classes_first_then_route_class_then_age() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        q.push(rank(Low), t0, "low-1");
        q.push(rank(Normal), t0, "normal-1");
        q.push(
            Rank {
                class: Normal,
                route: Low,
            },
            t0,
            "normal-on-low-route",
        );
        q.push(rank(Critical), t0 + Duration::from_millis(5), "critical");
        q.push(rank(Normal), t0 + Duration::from_millis(1), "normal-2");
        assert_eq!(q.waiting_by_class(), [1, 3, 1]);
        let now = t0 + Duration::from_millis(10);
        let order: Vec<_> = std::iter::from_fn(|| q.pop(now, |_| true).map(|(p, _)| p)).collect();
        assert_eq!(
            order,
            [
                "critical",
                "normal-1",
                "normal-2",
                "normal-on-low-route",
                "low-1"
            ]
        );
        assert!(q.is_empty());
        assert_eq!(q.waiting_by_class(), [0, 0, 0]);
    }

    #[test]
    fn a_full_class_does_not_hold_back_a_higher_one() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        q.push(rank(Low), t0, "low");
        q.push(rank(Critical), t0 + Duration::from_millis(1), "critical");
        // Only critical fits (the low share is full).
        let got = q.pop(t0, |c| c == Critical).map(|(p, _)| p);
        assert_eq!(got, Some("critical"));
        assert_eq!(q.pop(t0, |c| c == Critical).map(|(p, _)| p), None);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn removal_takes_a_request_out_of_line() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        let a = q.push(rank(Normal), t0, 1);
        q.push(rank(Normal), t0, 2);
        assert_eq!(q.remove(a), Some(1));
        assert_eq!(q.remove(a), None);
        assert_eq!(q.pop(t0, |_| true).map(|(p, _)| p), Some(2));
    }

    #[test]
    fn codel_turns_to_newest_first_when_waits_stand_above_the_target() {
        let t0 = Instant::now();
        let target = Duration::from_millis(5);
        let mut q = WaitQueue::default();
        q.set_target(target);
        let ms = Duration::from_millis;
        // A standing queue: every request leaves after 20 ms, for over 100 ms.
        let mut next = 0u64;
        for i in 0..30 {
            q.push(rank(Normal), t0 + ms(i * 5), i);
        }
        let mut now = t0 + ms(20);
        while !q.lifo() {
            let (p, waited) = q.pop(now, |_| true).expect("waiting");
            assert_eq!(p, next, "FIFO before CoDel engages");
            assert!(waited >= target);
            next += 1;
            now += ms(5);
            assert!(now < t0 + ms(200), "engages within an interval");
        }
        // Engaged: the newest first, and what waited past 2 × target is shed, oldest first.
        let newest = q.pop(now, |_| true).map(|(p, _)| p);
        assert_eq!(newest, Some(29));
        let shed = q.slough(now);
        assert!(!shed.is_empty());
        assert!(
            shed.windows(2).all(|w| w[0] < w[1]),
            "oldest first: {shed:?}"
        );
        for left in q.entries.values() {
            assert!(now.saturating_duration_since(left.at) <= target * SLOUGH_FACTOR);
        }
        // Drained: FIFO again.
        while q.pop(now, |_| true).is_some() {}
        assert!(!q.lifo());
        q.push(rank(Normal), now, 100);
        q.push(rank(Normal), now, 101);
        assert_eq!(q.pop(now, |_| true).map(|(p, _)| p), Some(100));
    }

    #[test]
    fn codel_stays_off_when_the_queue_drains_in_time() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        q.set_target(Duration::from_millis(5));
        let ms = Duration::from_millis;
        // Waits above the target, but one in each interval below it: a good queue.
        for i in 0..100u64 {
            let at = t0 + ms(i * 10);
            q.push(rank(Normal), at, i);
            let wait = if i % 5 == 0 { ms(1) } else { ms(9) };
            q.pop(at + wait, |_| true);
            assert!(!q.lifo(), "at {i}");
        }
        // Without a target CoDel never engages.
        let mut plain = WaitQueue::default();
        for i in 0..50u64 {
            plain.push(rank(Normal), t0, i);
        }
        for i in 0..50u64 {
            let (p, _) = plain.pop(t0 + ms(1000 + i), |_| true).expect("waiting");
            assert_eq!(p, i);
        }
        assert!(plain.slough(t0 + ms(5000)).is_empty());
    }
}

#[cfg(test)]
mod sim {
    use super::*;

    /// Discrete simulation: `slots` servers of `service`, arrivals every `gap`, for `run`.
    /// Returns (admitted, shed, timed out, admitted waits).
    fn simulate(
        target: Duration,
        slots: usize,
        service: Duration,
        gap: Duration,
        run: Duration,
        timeout: Duration,
    ) -> (usize, usize, usize, Vec<Duration>) {
        let t0 = Instant::now();
        let mut q: WaitQueue<Instant> = WaitQueue::default();
        q.set_target(target);
        let mut busy: Vec<Instant> = Vec::new(); // finish times
        let (mut admitted, mut shed, mut timed_out) = (0, 0, 0);
        let mut waits = Vec::new();
        let step = Duration::from_micros(100);
        let mut now = t0;
        let mut next_arrival = t0;
        let rank = Rank {
            class: Priority::Normal,
            route: Priority::Normal,
        };
        while now < t0 + run {
            busy.retain(|f| *f > now);
            if now >= next_arrival {
                q.push(rank, now, now);
                next_arrival += gap;
            }
            // timeouts
            let expired: Vec<_> = q
                .entries
                .iter()
                .filter(|(_, e)| now.duration_since(e.at) >= timeout)
                .map(|(k, _)| *k)
                .collect();
            for k in expired {
                q.remove(Place(k));
                timed_out += 1;
            }
            while busy.len() < slots {
                let Some((_, w)) = q.pop(now, |_| true) else {
                    break;
                };
                admitted += 1;
                waits.push(w);
                busy.push(now + service);
            }
            shed += q.slough(now).len();
            now += step;
        }
        (admitted, shed, timed_out, waits)
    }

    #[test]
    fn codel_keeps_goodput_and_short_waits_at_three_times_capacity() {
        let ms = Duration::from_millis;
        let (fa, fs, ft, fw) = simulate(
            Duration::ZERO,
            4,
            ms(20),
            Duration::from_micros(1667),
            ms(3000),
            ms(2000),
        );
        let (ca, cs, ct, cw) = simulate(
            ms(5),
            4,
            ms(20),
            Duration::from_micros(1667),
            ms(3000),
            ms(2000),
        );
        let quick =
            |w: &[Duration]| w.iter().filter(|d| **d <= ms(50)).count() as f64 / w.len() as f64;
        eprintln!("fifo {fa} admitted {fs} shed {ft} timed out, quick {:.2}; codel {ca} admitted {cs} shed {ct} timed out, quick {:.2}", quick(&fw), quick(&cw));
        assert!(ca as f64 >= 0.95 * fa as f64, "goodput kept: {ca} vs {fa}");
        assert!(quick(&cw) > 0.9, "{}", quick(&cw));
    }
}
