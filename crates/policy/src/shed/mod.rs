//! Load shedding: one global in-flight count with an RAII guard, and priority
//! classes that may use 100% (critical), 90% (normal) or 75% (low) of the cap.
//! Admission is a compare-and-swap that never over-counts, so a burst of
//! rejections cannot push an admissible request over the limit.
//!
//! With `shedding.adaptive` the cap is not fixed: [`adaptive::GradientLimit`]
//! learns it from upstream latency and the classes apply to the learned cap.
//!
//! A request whose body is still arriving from its client holds its slot without
//! counting against the cap ([`InflightGuard::start_upload`]) until the body is
//! complete: a slow upload is the client's time, not load on the backend, and 24
//! clients trickling bodies would otherwise hold a cap learned low and shed
//! everyone else.

pub mod adaptive;
pub mod spread;

/// A route's load-shedding class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// May use the whole cap.
    Critical,
    /// Shed at 90% of the cap.
    #[default]
    Normal,
    /// Shed first, at 75%.
    Low,
}

impl Priority {
    /// `critical`, `normal` or `low`, as the config writes it (the shadow metric's
    /// `policy` label and the access log's `shed:CLASS`).
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// Position in [`Priority::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Every class, in declaration order.
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Normal, Priority::Low];
}

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct Shedder {
    inflight: AtomicU64,
    /// Of `inflight`, the requests whose body is still arriving: not counted by the cap.
    uploading: AtomicU64,
    /// 0 = no cap. Swapped on reload, or learned (adaptive).
    cap: AtomicU64,
    /// `Some` with `shedding.adaptive`.
    adaptive: std::sync::Mutex<Option<adaptive::GradientLimit>>,
    /// The share of requests shed lately (the spread of `Retry-After`).
    pub share: spread::ShedShare,
}

/// Class limit for a cap: critical 100%, normal 90%, low 75%, at least 1.
pub fn class_limit(cap: u64, priority: Priority) -> u64 {
    let limit = match priority {
        Priority::Critical => cap,
        Priority::Normal => cap * 9 / 10,
        Priority::Low => cap * 3 / 4,
    };
    limit.max(1)
}

/// Holds one in-flight slot until dropped.
#[derive(Debug)]
pub struct InflightGuard {
    shedder: Arc<Shedder>,
    /// Counted in the shedder's `uploading`.
    uploading: bool,
}

impl InflightGuard {
    fn new(shedder: &Arc<Shedder>) -> Self {
        Self {
            shedder: Arc::clone(shedder),
            uploading: false,
        }
    }

    /// The request's body is still arriving from its client: until
    /// [`InflightGuard::end_upload`] (or the drop), the slot is not counted by the cap
    /// (still in flight).
    #[inline]
    pub fn start_upload(&mut self) {
        if !self.uploading {
            self.uploading = true;
            self.shedder.uploading.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The body is complete: the slot counts against the cap again.
    #[inline]
    pub fn end_upload(&mut self) {
        if self.uploading {
            self.uploading = false;
            self.shedder.uploading.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        // `uploading` first: between the two, the cap may count one slot too many (never
        // one too few).
        self.end_upload();
        self.shedder.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shedder {
    pub fn new(cap: u64) -> Arc<Self> {
        Arc::new(Self {
            inflight: AtomicU64::new(0),
            uploading: AtomicU64::new(0),
            cap: AtomicU64::new(cap),
            adaptive: std::sync::Mutex::new(None),
            share: spread::ShedShare::default(),
        })
    }

    /// Apply `[shedding]` (start and reload): a fixed cap, or adaptive bounds
    /// (a learned limit survives a reload, clamped to the new bounds).
    pub fn configure(&self, max_concurrency: u64, adaptive: bool, min_concurrency: u64) {
        let Ok(mut slot) = self.adaptive.lock() else {
            self.set_cap(max_concurrency);
            return;
        };
        if !adaptive {
            *slot = None;
            self.set_cap(max_concurrency);
            return;
        }
        let limit = slot
            .get_or_insert_with(|| adaptive::GradientLimit::new(min_concurrency, max_concurrency));
        limit.set_bounds(min_concurrency, max_concurrency);
        self.set_cap(limit.limit());
    }

    /// Feed one proxied request's upstream latency to the adaptive limit (if
    /// any). Never waits: a sample that meets a busy lock is dropped.
    #[inline]
    pub fn on_latency(&self, now: std::time::Instant, rtt: std::time::Duration) {
        let Ok(mut slot) = self.adaptive.try_lock() else {
            return;
        };
        if let Some(limit) = slot.as_mut() {
            if let Some(cap) = limit.on_sample(now, rtt, self.counted()) {
                self.set_cap(cap);
            }
        }
    }

    pub fn set_cap(&self, cap: u64) {
        self.cap.store(cap, Ordering::Release);
    }

    pub fn cap(&self) -> u64 {
        self.cap.load(Ordering::Acquire)
    }

    /// Requests in flight, uploading or not.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Acquire)
    }

    /// Requests in flight that the cap counts: those whose body is complete.
    pub fn counted(&self) -> u64 {
        self.inflight()
            .saturating_sub(self.uploading.load(Ordering::Acquire))
    }

    /// Take a slot whatever the cap (`shedding.shadow`: a request the cap would have shed
    /// is admitted and counted in flight like any other, so in flight may pass the cap).
    #[inline]
    pub fn acquire_over_cap(self: &Arc<Self>) -> InflightGuard {
        self.inflight.fetch_add(1, Ordering::AcqRel);
        InflightGuard::new(self)
    }

    /// Take a slot for a request of `priority`, or `None` when its class is full.
    #[inline]
    pub fn try_acquire(self: &Arc<Self>, priority: Priority) -> Option<InflightGuard> {
        let cap = self.cap();
        if cap == 0 {
            self.inflight.fetch_add(1, Ordering::AcqRel);
            return Some(InflightGuard::new(self));
        }
        let limit = class_limit(cap, priority);
        // Uploads hold slots the cap does not count (read once: one more or fewer racing
        // with this admission is within the cap's own noise).
        let uploading = self.uploading.load(Ordering::Acquire);
        let mut cur = self.inflight.load(Ordering::Acquire);
        loop {
            if cur.saturating_sub(uploading) >= limit {
                return None;
            }
            match self.inflight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(InflightGuard::new(self)),
                Err(actual) => cur = actual,
            }
        }
    }
}

/// `[shedding]`: the settings of the class cap, the adaptive cap and the tunnel cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SheddingSettings {
    /// 0 = no cap.
    pub max_concurrency: u64,
    pub retry_after_secs: u64,
    /// Open upgraded connections (WebSocket etc.); 0 = no cap.
    pub max_tunnels: u64,
    /// Gradient limit learned from upstream latency.
    pub adaptive: bool,
    pub min_concurrency: u64,
    /// Shadow mode: a request the cap (fixed or adaptive) would shed is admitted, and
    /// counted as a shadow refusal.
    pub shadow: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_limits() {
        assert_eq!(class_limit(20, Priority::Critical), 20);
        assert_eq!(class_limit(20, Priority::Normal), 18);
        assert_eq!(class_limit(20, Priority::Low), 15);
        assert_eq!(class_limit(1, Priority::Low), 1);
    }

    #[test]
    fn exactly_cap_admitted_and_released_on_drop() {
        let s = Shedder::new(4);
        let guards: Vec<_> = (0..4)
            .map(|_| s.try_acquire(Priority::Critical).expect("slot"))
            .collect();
        assert!(s.try_acquire(Priority::Critical).is_none());
        assert_eq!(s.inflight(), 4);
        drop(guards);
        assert_eq!(s.inflight(), 0);
        assert!(s.try_acquire(Priority::Critical).is_some());
    }

    #[test]
    fn lower_classes_shed_first() {
        let s = Shedder::new(20);
        let held: Vec<_> = (0..15)
            .map(|_| s.try_acquire(Priority::Critical).expect("slot"))
            .collect();
        assert!(s.try_acquire(Priority::Low).is_none());
        let normal = s.try_acquire(Priority::Normal);
        assert!(normal.is_some());
        drop(normal);
        drop(held);
    }

    #[test]
    fn over_cap_slots_count_in_flight_and_are_released() {
        let s = Shedder::new(1);
        let a = s.try_acquire(Priority::Critical).expect("slot");
        assert!(s.try_acquire(Priority::Critical).is_none());
        let b = s.acquire_over_cap();
        assert_eq!(s.inflight(), 2);
        drop((a, b));
        assert_eq!(s.inflight(), 0);
        assert_eq!(Priority::Low.as_str(), "low");
        assert_eq!(Priority::ALL[Priority::Normal.index()], Priority::Normal);
    }

    #[test]
    fn uploading_slots_are_in_flight_but_not_counted_by_the_cap() {
        let s = Shedder::new(2);
        let mut a = s.try_acquire(Priority::Critical).expect("slot");
        let mut b = s.try_acquire(Priority::Critical).expect("slot");
        assert!(s.try_acquire(Priority::Critical).is_none());
        a.start_upload();
        b.start_upload();
        b.start_upload(); // once only
        assert_eq!((s.inflight(), s.counted()), (2, 0));
        // Two more while those two upload.
        let c = s.try_acquire(Priority::Critical).expect("slot");
        let d = s.try_acquire(Priority::Critical).expect("slot");
        assert!(s.try_acquire(Priority::Critical).is_none());
        assert_eq!((s.inflight(), s.counted()), (4, 2));
        // A body completes: counted again (over the cap for a moment; nothing is admitted).
        a.end_upload();
        a.end_upload();
        assert_eq!(s.counted(), 3);
        assert!(s.try_acquire(Priority::Critical).is_none());
        drop((c, d));
        assert_eq!(s.counted(), 1);
        // Dropped while uploading: both counts released.
        drop(b);
        assert_eq!((s.inflight(), s.counted()), (1, 1));
        drop(a);
        assert_eq!((s.inflight(), s.counted()), (0, 0));
        assert_eq!(s.uploading.load(Ordering::Acquire), 0);
    }

    #[test]
    fn zero_cap_disables_but_still_counts() {
        let s = Shedder::new(0);
        let g: Vec<_> = (0..10_000)
            .map(|_| s.try_acquire(Priority::Low).expect("slot"))
            .collect();
        assert_eq!(s.inflight(), 10_000);
        drop(g);
        assert_eq!(s.inflight(), 0);
    }

    #[test]
    fn concurrent_acquire_never_exceeds_cap() {
        let s = Shedder::new(8);
        let peak = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let s = Arc::clone(&s);
                let peak = Arc::clone(&peak);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Some(g) = s.try_acquire(Priority::Critical) {
                            peak.fetch_max(s.inflight(), Ordering::Relaxed);
                            drop(g);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("join");
        }
        assert!(peak.load(Ordering::Relaxed) <= 8);
        assert_eq!(s.inflight(), 0);
    }
}
