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
pub mod queue;
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
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
pub struct Shedder {
    /// Requests waiting in [`Shedder::queue`]: read on every release (zero keeps a release
    /// one decrement). SeqCst with `inflight`: an enqueue and a release racing always see
    /// each other's write, so no slot is freed while a request waits unseen.
    waiting: AtomicU64,
    /// `[shedding] queue_timeout_ms`: the requests over their class's share, waiting.
    queue: Mutex<queue::WaitQueue<Arc<Ticket>>>,
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
        self.shedder.release();
    }
}

/// A waiting request's ticket: set by the queue's dispatch, read by its [`QueueWait`].
#[derive(Debug, Default)]
pub struct Ticket {
    state: Mutex<TicketState>,
}

#[derive(Debug, Default)]
enum TicketState {
    /// In line; the waker of the task waiting.
    #[default]
    Waiting,
    Parked(std::task::Waker),
    /// Given a slot (already counted in flight) after this wait.
    Granted(std::time::Duration),
    /// Shed by CoDel (waited past its limit while the queue stood).
    Shed,
    /// Its outcome was taken (or it was withdrawn).
    Done,
}

impl Ticket {
    fn settle(&self, to: TicketState) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if let TicketState::Parked(w) = std::mem::replace(&mut *state, to) {
            w.wake();
        }
    }
}

/// What the status page shows of the queue.
#[derive(Debug, Default, Clone, Copy)]
pub struct QueueView {
    /// By class (`Priority::ALL` order).
    pub waiting: [u64; 3],
    pub oldest_wait: [std::time::Duration; 3],
    /// CoDel is serving newest first.
    pub lifo: bool,
}

/// Why a waiting request leaves the queue without a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueRefusal {
    /// The queue already holds `max_queue` requests.
    Full,
    /// Shed by CoDel: it waited longest while the queue stood.
    Shed,
}

/// What [`Shedder::enqueue`] gives.
#[derive(Debug)]
pub enum Enqueued {
    /// A slot was free for its class (counted in flight).
    Admitted(InflightGuard),
    /// In line: await the [`QueueWait`] (with the driver's timeout).
    Waiting(QueueWait),
    Refused(QueueRefusal),
}

/// A request waiting for a slot. Resolves to the slot and the time waited, or CoDel's
/// refusal. Dropped before that (its client left, its time ran out), it leaves the
/// queue; dropped just after a slot was granted, it gives the slot back.
#[derive(Debug)]
pub struct QueueWait {
    shedder: Arc<Shedder>,
    ticket: Arc<Ticket>,
    place: queue::Place,
}

impl std::future::Future for QueueWait {
    type Output = Result<(InflightGuard, std::time::Duration), QueueRefusal>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let Ok(mut state) = self.ticket.state.lock() else {
            return Poll::Ready(Err(QueueRefusal::Shed));
        };
        match std::mem::replace(&mut *state, TicketState::Done) {
            TicketState::Granted(waited) => {
                Poll::Ready(Ok((InflightGuard::new(&self.shedder), waited)))
            }
            TicketState::Shed => Poll::Ready(Err(QueueRefusal::Shed)),
            TicketState::Done => Poll::Ready(Err(QueueRefusal::Shed)),
            TicketState::Waiting | TicketState::Parked(_) => {
                *state = TicketState::Parked(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for QueueWait {
    fn drop(&mut self) {
        // The queue's lock first (dispatch's order: queue, then ticket).
        let granted = {
            let mut q = self.shedder.queue.lock().ok();
            let Ok(mut state) = self.ticket.state.lock() else {
                return;
            };
            match std::mem::replace(&mut *state, TicketState::Done) {
                TicketState::Waiting | TicketState::Parked(_) => {
                    if let Some(q) = q.as_mut() {
                        q.remove(self.place);
                        self.shedder.waiting.store(q.len() as u64, Ordering::SeqCst);
                    }
                    false
                }
                TicketState::Granted(_) => true,
                TicketState::Shed | TicketState::Done => false,
            }
        };
        if granted {
            // Granted as it was given up: the slot goes to the next in line.
            self.shedder.release();
        }
    }
}

impl Shedder {
    pub fn new(cap: u64) -> Arc<Self> {
        Arc::new(Self {
            waiting: AtomicU64::new(0),
            queue: Mutex::new(queue::WaitQueue::default()),
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
        let before = self.cap.swap(cap, Ordering::AcqRel);
        if cap != before && self.waiting() != 0 {
            // A larger cap has room for some of those waiting.
            self.dispatch(std::time::Instant::now());
        }
    }

    /// Requests waiting in the queue.
    #[inline]
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::SeqCst)
    }

    /// The queue now: requests waiting and the longest wait, by class.
    pub fn queue_view(&self, now: std::time::Instant) -> QueueView {
        match self.queue.lock() {
            Ok(q) => QueueView {
                waiting: q.waiting_by_class(),
                oldest_wait: q.oldest_wait(now),
                lifo: q.lifo(),
            },
            Err(_) => QueueView::default(),
        }
    }

    /// CoDel's target (`queue_target_ms`; zero = off).
    pub fn set_queue_target(&self, target: std::time::Duration) {
        if let Ok(mut q) = self.queue.lock() {
            q.set_target(target);
        }
    }

    /// Give one slot back; with requests waiting, the next in line may take it.
    #[inline]
    fn release(&self) {
        self.inflight.fetch_sub(1, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) != 0 {
            self.dispatch(std::time::Instant::now());
        }
    }

    /// Take a slot for a class only while it has room (the queue's grant).
    fn take_for(&self, cap: u64, class: Priority) -> bool {
        if cap == 0 {
            self.inflight.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        let limit = class_limit(cap, class);
        let uploading = self.uploading.load(Ordering::Acquire);
        let mut cur = self.inflight.load(Ordering::SeqCst);
        loop {
            if cur.saturating_sub(uploading) >= limit {
                return false;
            }
            match self.inflight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Hand free slots to those waiting, in the queue's order; then shed what CoDel
    /// sloughs.
    fn dispatch(&self, now: std::time::Instant) {
        let Ok(mut q) = self.queue.lock() else {
            return;
        };
        self.dispatch_locked(&mut q, now);
    }

    fn dispatch_locked(&self, q: &mut queue::WaitQueue<Arc<Ticket>>, now: std::time::Instant) {
        let cap = self.cap();
        while let Some((ticket, waited)) = q.pop(now, |class| self.take_for(cap, class)) {
            ticket.settle(TicketState::Granted(waited));
        }
        // Then what CoDel sheds, once every free slot is taken: the queue stays
        // work-conserving (a slot never idles while someone waits, however long).
        for t in q.slough(now) {
            t.settle(TicketState::Shed);
        }
        self.waiting.store(q.len() as u64, Ordering::SeqCst);
    }

    /// A request over its class's share (or arriving while others wait) gets in line:
    /// admitted at once if its turn comes now, refused if `max_queue` wait already.
    pub fn enqueue(
        self: &Arc<Self>,
        rank: queue::Rank,
        max_queue: u64,
        now: std::time::Instant,
    ) -> Enqueued {
        let Ok(mut q) = self.queue.lock() else {
            return Enqueued::Refused(QueueRefusal::Full);
        };
        if q.len() as u64 >= max_queue {
            return Enqueued::Refused(QueueRefusal::Full);
        }
        let ticket = Arc::new(Ticket::default());
        let place = q.push(rank, now, Arc::clone(&ticket));
        self.waiting.store(q.len() as u64, Ordering::SeqCst);
        self.dispatch_locked(&mut q, now);
        drop(q);
        QueueWait {
            shedder: Arc::clone(self),
            ticket,
            place,
        }
        .admitted_now()
    }
}

impl QueueWait {
    /// Granted during its own enqueue: no wait.
    fn admitted_now(self) -> Enqueued {
        let granted = match self.ticket.state.lock() {
            Ok(mut s) if matches!(*s, TicketState::Granted(_)) => {
                *s = TicketState::Done;
                true
            }
            _ => false,
        };
        if granted {
            Enqueued::Admitted(InflightGuard::new(&self.shedder))
        } else {
            Enqueued::Waiting(self)
        }
    }
}

impl Shedder {
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
    /// Above 0: a request over its class's share waits this long for a slot.
    pub queue_timeout: std::time::Duration,
    /// Requests waiting at most (all classes).
    pub max_queue: u64,
    /// Above 0: CoDel's target (the queue turns to newest first when the shortest wait stays
    /// above it for [`queue::CODEL_INTERVAL`]).
    pub queue_target: std::time::Duration,
    /// Above 0: the cap is the fleet's, split by each instance's share of the traffic.
    pub fleet_max_concurrency: u64,
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

    fn rank(class: Priority) -> queue::Rank {
        queue::Rank {
            class,
            route: class,
        }
    }

    fn waiting(e: Enqueued) -> QueueWait {
        match e {
            Enqueued::Waiting(w) => w,
            other => panic!("expected to wait, got {other:?}"),
        }
    }

    fn poll_now(w: &mut QueueWait) -> Option<Result<InflightGuard, QueueRefusal>> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(w).poll(&mut cx) {
            std::task::Poll::Ready(r) => Some(r.map(|(g, _)| g)),
            std::task::Poll::Pending => None,
        }
    }

    use std::future::Future;

    #[test]
    fn a_freed_slot_goes_to_the_first_in_line_by_class() {
        let s = Shedder::new(2);
        let now = std::time::Instant::now();
        let a = s.try_acquire(Priority::Critical).expect("slot");
        let b = s.try_acquire(Priority::Critical).expect("slot");
        let mut low = waiting(s.enqueue(rank(Priority::Low), 10, now));
        let mut normal = waiting(s.enqueue(rank(Priority::Normal), 10, now));
        let mut critical = waiting(s.enqueue(rank(Priority::Critical), 10, now));
        assert_eq!(s.waiting(), 3);
        assert!(poll_now(&mut critical).is_none());
        drop(a);
        // Class limits of a cap of 2 are all 1: one free slot of 2 → the critical one.
        let c = poll_now(&mut critical).expect("granted").expect("slot");
        assert!(poll_now(&mut normal).is_none());
        assert_eq!(s.inflight(), 2);
        drop(b);
        // One in flight: normal's limit (1) is full, low's too.
        assert!(poll_now(&mut normal).is_none());
        drop(c);
        let n = poll_now(&mut normal).expect("granted").expect("slot");
        assert!(poll_now(&mut low).is_none());
        drop(n);
        let l = poll_now(&mut low).expect("granted").expect("slot");
        assert_eq!((s.inflight(), s.waiting()), (1, 0));
        drop(l);
        assert_eq!(s.inflight(), 0);
    }

    #[test]
    fn a_request_that_leaves_the_line_frees_its_place_and_a_grant_it_never_took() {
        let s = Shedder::new(1);
        let now = std::time::Instant::now();
        let a = s.try_acquire(Priority::Critical).expect("slot");
        let w1 = waiting(s.enqueue(rank(Priority::Critical), 2, now));
        let mut w2 = waiting(s.enqueue(rank(Priority::Critical), 2, now));
        assert!(matches!(
            s.enqueue(rank(Priority::Critical), 2, now),
            Enqueued::Refused(QueueRefusal::Full)
        ));
        // The first leaves (its client went away): the second is next.
        drop(w1);
        assert_eq!(s.waiting(), 1);
        drop(a);
        // Granted but given up before it was taken: the slot is released.
        drop(w2.ticket.clone());
        let g = poll_now(&mut w2).expect("granted").expect("slot");
        drop(g);
        let w3 = waiting({
            let held = s.try_acquire(Priority::Critical).expect("slot");
            let e = s.enqueue(rank(Priority::Critical), 2, now);
            drop(held); // grants w3
            e
        });
        assert_eq!(s.inflight(), 1);
        drop(w3); // granted, never polled
        assert_eq!((s.inflight(), s.waiting()), (0, 0));
    }

    #[test]
    fn an_empty_queue_admits_at_once_and_a_cap_raised_lets_waiters_in() {
        let s = Shedder::new(1);
        let now = std::time::Instant::now();
        let g = match s.enqueue(rank(Priority::Normal), 5, now) {
            Enqueued::Admitted(g) => g,
            other => panic!("{other:?}"),
        };
        let mut w = waiting(s.enqueue(rank(Priority::Normal), 5, now));
        s.set_cap(4);
        let second = poll_now(&mut w).expect("granted").expect("slot");
        assert_eq!(s.inflight(), 2);
        drop(g);
        assert_eq!(s.inflight(), 1);
        drop(second);
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
