//! Upstream pools: selection over healthy, not-culled backends by the
//! upstream's balancing policy ([`crate::balance`]), active HTTP health
//! checks, per-backend state shared with the culling gate, and the
//! per-upstream bulkhead and retry budget. [`peer`]: the transport (TLS,
//! HTTP/2) to a backend.

mod blame_names;
mod build;
pub mod peer;
pub mod probe;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::lb::health_check::HealthCheck;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, HealthRegistry, LoadBalancer};
use portcullis_policy::balance::slow_start;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use blame_names::BlameNames;

/// The least cap an `adaptive` upstream learns (or its `max_inflight`, when lower).
pub const ADAPTIVE_FLOOR: u64 = 8;

/// Per-backend state that outlives reloads while the backend stays configured.
#[derive(Debug)]
pub struct BackendState {
    pub upstream: String,
    pub addr: SocketAddr,
    pub addr_str: String,
    /// What a person reads: its `name`, else `addr_str` (a rename makes a new state).
    pub name: String,
    /// Requests and errors over the culling window (the hot-path accounting).
    pub window: portcullis_policy::cull::ErrorWindow,
    /// Latencies over the culling window (recorded only with `[culling] outlier = "latency"`).
    pub latency: portcullis_policy::cull::LatencyWindow,
    /// The cull mark (bit 0: culled) and, above it, the [`cull_epoch`] of the culling
    /// loop's last own change (a fleet read older than that change does not undo it).
    cull: AtomicU64,
    /// Dry run: the budget granted a cull that was not carried out.
    dry_run_cull: AtomicBool,
    /// Responses and errors since start; the culling loop sends the deltas to
    /// the fleet counters.
    total_requests: AtomicU64,
    total_errors: AtomicU64,
    /// Attempts in flight to this backend (least_requests reads it).
    inflight: AtomicU64,
    /// Its `portcullis_upstream_*` series, resolved once.
    pub series: crate::metrics::BackendSeries,
    /// The manual operations in force ([`Manual`]), as the fleet sync last saw them.
    manual: Manual,
    /// Rate, status mix and latency over the last seconds (the status page's).
    pub traffic: portcullis_policy::traffic::TrafficWindow,
    /// Why it stays in rotation while over the error threshold
    /// ([`portcullis_policy::cull::Failing`] as `u8`; 0: it is not), set by the
    /// culling loop each tick.
    failing: AtomicU8,
    /// Its upstream's waiting line for room (`queue_timeout_ms`), told when an attempt
    /// here ends. Set when a pool takes this state.
    room: std::sync::OnceLock<Arc<Room>>,
    /// Slow start: when it came back into rotation (Unix ms; 0: it never left), and
    /// whether it was in rotation at the last look ([`Pool::watch_rotation`]).
    back_at_ms: AtomicU64,
    was_in: AtomicBool,
}

/// Requests waiting for room in an upstream (a backend under its `max_conn`, a bulkhead
/// slot): told whenever an attempt or a bulkhead slot is given back while some wait.
#[derive(Debug, Default)]
pub struct Room {
    waiting: AtomicU64,
    notify: tokio::sync::Notify,
}

/// One request's place in a [`Room`]'s line: counted while held.
pub struct RoomPlace<'a>(&'a Room);

impl Drop for RoomPlace<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Room {
    /// Join the line, unless `max` already wait.
    pub fn join(&self, max: u64) -> Option<RoomPlace<'_>> {
        let mut cur = self.waiting.load(Ordering::SeqCst);
        loop {
            if cur >= max {
                return None;
            }
            match self.waiting.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return Some(RoomPlace(self)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Resolves at the next [`Room::free`] (enable it before looking for room).
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Room was given back: with requests waiting, each looks again.
    #[inline]
    pub fn free(&self) {
        if self.waiting.load(Ordering::SeqCst) != 0 {
            self.notify.notify_waiters();
        }
    }

    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::SeqCst)
    }
}

/// Where a backend stands with the culling gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CullMark {
    /// In rotation.
    In = 0,
    /// Ejected: gets no new requests.
    Culled = 1,
}

impl BackendState {
    pub fn new(upstream: &str, addr: SocketAddr, window_secs: u64) -> Self {
        Self::named(upstream, addr, None, window_secs)
    }

    /// A backend called `name` (`None`: its address).
    pub fn named(upstream: &str, addr: SocketAddr, name: Option<&str>, window_secs: u64) -> Self {
        Self {
            upstream: upstream.to_string(),
            addr,
            addr_str: addr.to_string(),
            name: name.map_or_else(|| addr.to_string(), str::to_string),
            window: portcullis_policy::cull::ErrorWindow::new(window_secs),
            latency: portcullis_policy::cull::LatencyWindow::new(window_secs),
            cull: AtomicU64::new(CullMark::In as u64),
            dry_run_cull: AtomicBool::new(false),
            total_requests: AtomicU64::new(0),
            total_errors: AtomicU64::new(0),
            inflight: AtomicU64::new(0),
            series: Default::default(),
            manual: Manual::default(),
            traffic: Default::default(),
            failing: AtomicU8::new(0),
            room: std::sync::OnceLock::new(),
            back_at_ms: AtomicU64::new(0),
            was_in: AtomicBool::new(true),
        }
    }

    /// It came back into rotation at `now_ms`: slow start ramps it from there.
    pub fn came_back(&self, now_ms: u64) {
        self.back_at_ms.store(now_ms.max(1), Ordering::Relaxed);
    }

    /// Slow start across the fleet: its ramp starts at `fleet_ms` instead, unless it came
    /// back again since this instance read `seen_ms` (that newer comeback stands).
    pub fn adopt_ramp_start(&self, seen_ms: u64, fleet_ms: u64) {
        let _ = self.back_at_ms.compare_exchange(
            seen_ms,
            fleet_ms.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// When it last came back (0: never left).
    #[inline]
    pub fn back_at_ms(&self) -> u64 {
        self.back_at_ms.load(Ordering::Relaxed)
    }

    /// The share of its weight and `max_conn` slow start gives it at `now_ms`. Back in
    /// rotation before the rotation watch noticed (it runs every 250 ms): the floor.
    #[inline]
    pub fn ramp(&self, now_ms: u64, window: Duration) -> f64 {
        if !self.was_in.load(Ordering::Relaxed) {
            return slow_start::FLOOR;
        }
        slow_start::ramp(self.back_at_ms(), now_ms, window)
    }

    /// Tell `room` when an attempt here ends (the first pool to take this state sets it;
    /// a reload keeps the upstream's room).
    pub fn join_room(&self, room: &Arc<Room>) {
        let _ = self.room.set(Arc::clone(room));
    }

    /// Not in rotation for new requests: culled, or taken out by a manual operation
    /// (drain, maint, weight 0). In-flight requests finish either way.
    #[inline]
    pub fn is_out(&self) -> bool {
        self.is_culled() || self.manual.mark.load(Ordering::Acquire) != MANUAL_IN
    }

    /// The manual operations on this backend (drain, maint, weight), as last synced.
    pub fn manual(&self) -> &Manual {
        &self.manual
    }

    /// Why the culling loop left it in rotation while it fails, if it does.
    pub fn failing(&self) -> Option<portcullis_policy::cull::Failing> {
        portcullis_policy::cull::Failing::from_u8(self.failing.load(Ordering::Relaxed))
    }

    pub fn set_failing(&self, reason: Option<portcullis_policy::cull::Failing>) {
        self.failing
            .store(reason.map_or(0, |r| r as u8), Ordering::Relaxed);
    }

    /// Account one response (hot path): the sliding window plus the totals.
    #[inline]
    pub fn record(&self, now_secs: u64, is_error: bool) {
        self.window.record(now_secs, is_error);
        self.total_requests.fetch_add(1, Ordering::Relaxed);
        if is_error {
            self.total_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Attempts in flight to this backend.
    #[inline]
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// `(requests, errors)` since start.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.total_requests.load(Ordering::Relaxed),
            self.total_errors.load(Ordering::Relaxed),
        )
    }

    #[inline]
    pub fn is_culled(&self) -> bool {
        self.cull.load(Ordering::Acquire) & 1 == CullMark::Culled as u64
    }

    pub fn is_dry_run_culled(&self) -> bool {
        self.dry_run_cull.load(Ordering::Acquire)
    }

    pub fn set_dry_run_cull(&self, v: bool) {
        self.dry_run_cull.store(v, Ordering::Release);
    }

    /// The culling loop's own change: its grant (when the read after it failed) or a
    /// readmission. A fleet read that started before it does not undo it.
    pub fn set_culled(&self, culled: bool) {
        let v = if culled {
            CullMark::Culled
        } else {
            CullMark::In
        };
        self.cull
            .store((cull_epoch() << 1) | v as u64, Ordering::Release);
    }

    /// Set the mark from a fleet read that started at `read_epoch` (a [`cull_epoch`]): the
    /// culls every instance holds, read with the operations, so the instance's view of what
    /// is out is one snapshot. Skipped when the culling loop changed the mark since that
    /// read started (its change is newer). Returns whether it was set.
    pub fn follow_cull(&self, culled: bool, read_epoch: u64) -> bool {
        self.cull
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                ((cur >> 1) <= read_epoch).then_some((cur & !1) | u64::from(culled))
            })
            .is_ok()
    }
}

/// A point in the order of cull-mark changes and fleet reads (increasing, process-wide).
pub fn cull_epoch() -> u64 {
    static EPOCH: AtomicU64 = AtomicU64::new(0);
    EPOCH.fetch_add(1, Ordering::AcqRel) + 1
}

const MANUAL_IN: u8 = 0;
const MANUAL_DRAIN: u8 = 1;
const MANUAL_MAINT: u8 = 2;
const MANUAL_WEIGHT_ZERO: u8 = 3;
const MANUAL_CLAIMED: u8 = 4;
const NO_WEIGHT: u32 = u32::MAX;

/// A backend's manual operations (CONTRACT §12): the records (for `GET /backends` and
/// the status page), the mark the request path reads (one atomic load), and the weight
/// the pool is built with. Written by the fleet sync and the admin API, never per request.
#[derive(Debug)]
pub struct Manual {
    mark: std::sync::atomic::AtomicU8,
    weight: std::sync::atomic::AtomicU32,
    records: std::sync::Mutex<Vec<portcullis_policy::cull::ops::OpRecord>>,
}

impl Default for Manual {
    fn default() -> Self {
        Self {
            mark: std::sync::atomic::AtomicU8::new(MANUAL_IN),
            weight: std::sync::atomic::AtomicU32::new(NO_WEIGHT),
            records: std::sync::Mutex::new(Vec::new()),
        }
    }
}

/// What takes a backend out by hand, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManualState {
    In,
    Draining,
    Maint,
    /// Claimed on the disruption budget (`POST /claims`).
    Claimed,
    /// Weight 0: no new requests.
    WeightZero,
}

impl Manual {
    /// Replace the records with `records` (those in force on this backend). Returns
    /// whether the weight changed (the pool is then rebuilt with it).
    pub fn set(&self, records: Vec<portcullis_policy::cull::ops::OpRecord>) -> bool {
        use portcullis_policy::cull::ops::OpKind;
        // maint, then a claim, then a drain, then weight 0 says what the backend is.
        let state = records.iter().fold(None, |acc, r| match (acc, r.kind) {
            (_, OpKind::Maint) => Some(MANUAL_MAINT),
            (Some(MANUAL_MAINT), _) => acc,
            (_, OpKind::Claim { .. }) => Some(MANUAL_CLAIMED),
            (Some(MANUAL_CLAIMED), _) => acc,
            (_, OpKind::Drain) => Some(MANUAL_DRAIN),
            (Some(MANUAL_DRAIN), _) => acc,
            (_, OpKind::Weight(0)) => Some(MANUAL_WEIGHT_ZERO),
            _ => acc,
        });
        let weight = records
            .iter()
            .find_map(|r| match r.kind {
                OpKind::Weight(w) => Some(w),
                _ => None,
            })
            .unwrap_or(NO_WEIGHT);
        self.mark
            .store(state.unwrap_or(MANUAL_IN), Ordering::Release);
        let before = self.weight.swap(weight, Ordering::AcqRel);
        *self.records.lock().unwrap_or_else(|p| p.into_inner()) = records;
        before != weight
    }

    pub fn state(&self) -> ManualState {
        match self.mark.load(Ordering::Acquire) {
            MANUAL_DRAIN => ManualState::Draining,
            MANUAL_MAINT => ManualState::Maint,
            MANUAL_WEIGHT_ZERO => ManualState::WeightZero,
            MANUAL_CLAIMED => ManualState::Claimed,
            _ => ManualState::In,
        }
    }

    /// The weight set at runtime, if any.
    pub fn weight(&self) -> Option<u32> {
        let w = self.weight.load(Ordering::Acquire);
        (w != NO_WEIGHT).then_some(w)
    }

    /// Put `record` in place of the one of its field (an action of this instance, before
    /// the next sync reads it back).
    pub fn put(&self, record: portcullis_policy::cull::ops::OpRecord) -> bool {
        let mut records = self.records();
        records.retain(|x| x.field() != record.field());
        records.push(record);
        self.set(records)
    }

    /// Drop the record stored under `field`.
    pub fn remove(&self, field: &str) -> bool {
        let mut records = self.records();
        records.retain(|x| x.field() != field);
        self.set(records)
    }

    pub fn records(&self) -> Vec<portcullis_policy::cull::ops::OpRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// One attempt in flight to a backend: counted while held.
#[derive(Debug)]
pub struct Attempt(Arc<BackendState>);

impl Attempt {
    pub fn new(b: &Arc<BackendState>) -> Self {
        b.inflight.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(b))
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        // SeqCst with the room's count (a locked instruction either way on x86): a waiter
        // that joined the line sees this slot free, or is told of it.
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
        if let Some(room) = self.0.room.get() {
            room.free();
        }
    }
}

/// What an upstream shares across reloads: its bulkhead count and its retry
/// budget (a reload must not reset either).
#[derive(Debug)]
pub struct UpstreamShared {
    inflight: AtomicU64,
    pub budget: crate::balance::retry_budget::RetryBudget,
    /// The learned cap of an `adaptive` upstream (its own gradient limit, in-flight
    /// count and shed share); unused otherwise.
    pub limit: Arc<crate::shed::Shedder>,
    /// `blame_tenants`: errors by key, and the keys limited now (CONTRACT §15).
    pub blame_ledger: portcullis_policy::cull::BlameLedger,
    pub blamed: portcullis_policy::cull::BlameList,
    pub blame_names: BlameNames,
    /// `blame_tenants` with `outlier = "latency"`: answers over `slow_line_us` by key.
    pub slow_ledger: portcullis_policy::cull::SlowLedger,
    /// The latency rule's line (µs) as the check loop last drew it: an answer slower is
    /// recorded in `slow_ledger`. Until the first check, the least line the rule can draw.
    pub slow_line_us: AtomicU64,
    /// Keys per client address in failing and slow requests (key rotation).
    pub key_spread: portcullis_policy::cull::KeySpread,
    /// Requests waiting for room (`queue_timeout_ms`).
    pub room: Arc<Room>,
    /// `fleet_max_inflight`: this instance's share of the fleet's cap (kept across
    /// reloads, recomputed by the background exchange).
    pub fleet_cap: crate::fleet_caps::FleetSlot,
}

/// The bulkhead's answer for one request.
#[derive(Debug)]
pub enum Bulkhead {
    /// No `max_inflight`.
    Unlimited,
    /// Holds one of the upstream's slots until dropped.
    Entered(BulkheadGuard),
    /// The upstream is at `max_inflight`: shed.
    Full,
}

#[derive(Debug)]
pub struct BulkheadGuard {
    slot: Slot,
    /// Dropped after `slot`.
    _told: Told,
}

impl BulkheadGuard {
    /// Whether this is a slot of an `adaptive` upstream's learned cap.
    #[inline]
    pub fn is_adaptive(&self) -> bool {
        matches!(self.slot, Slot::Adaptive(_))
    }

    /// The request's body is still arriving: an adaptive upstream's cap does not count
    /// the slot until [`BulkheadGuard::end_upload`] (a fixed `max_inflight` always does).
    #[inline]
    pub fn start_upload(&mut self) {
        if let Slot::Adaptive(g) = &mut self.slot {
            g.start_upload();
        }
    }

    #[inline]
    pub fn end_upload(&mut self) {
        if let Slot::Adaptive(g) = &mut self.slot {
            g.end_upload();
        }
    }
}

/// A fixed bulkhead's slot, or one of an adaptive upstream's learned cap.
#[derive(Debug)]
enum Slot {
    /// Held for its `Drop`.
    Fixed(#[allow(dead_code)] FixedSlot),
    Adaptive(crate::shed::InflightGuard),
}

/// One of a fixed bulkhead's slots, given back when dropped.
#[derive(Debug)]
struct FixedSlot(Arc<UpstreamShared>);

impl Drop for FixedSlot {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tells an upstream's [`Room`] when dropped: after the slot (fields drop in order).
#[derive(Debug)]
struct Told(Arc<Room>);

impl Drop for Told {
    fn drop(&mut self) {
        self.0.free();
    }
}

/// Backends a request already tried, without a heap allocation for the
/// first four.
#[derive(Debug, Default)]
pub struct Tried {
    inline: [Option<SocketAddr>; 4],
    more: Vec<SocketAddr>,
}

impl Tried {
    pub fn push(&mut self, addr: SocketAddr) {
        match self.inline.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(addr),
            None => self.more.push(addr),
        }
    }

    /// Allow `addr` again (a stale pooled connection is not the backend's fault).
    pub fn forget(&mut self, addr: &SocketAddr) {
        for slot in &mut self.inline {
            if slot.as_ref() == Some(addr) {
                *slot = None;
            }
        }
        self.more.retain(|a| a != addr);
    }

    #[inline]
    pub fn contains(&self, addr: &SocketAddr) -> bool {
        self.inline.iter().any(|s| s.as_ref() == Some(addr)) || self.more.contains(addr)
    }
}

/// The active health state of one upstream, kept across reloads: each
/// rebuilt pool registers its backend view with the same registry, so a
/// backend that stays keeps its health (as it keeps its cull state) instead of
/// starting "up" again until its next check.
#[derive(Clone)]
pub struct PoolHealth {
    registry: Arc<HealthRegistry>,
    check: SwappableCheck,
    /// What each backend's probes found (kept with the registry).
    pub tracks: Arc<probe::Tracks>,
}

impl PoolHealth {
    fn new(check: probe::Probe, tracks: Arc<probe::Tracks>) -> Self {
        let check = SwappableCheck(Arc::new(ArcSwap::from_pointee(check)));
        let registry = Arc::new(HealthRegistry::new());
        // A fresh registry has no check yet, so this cannot panic.
        registry.set_health_check(Box::new(check.clone()));
        Self {
            registry,
            check,
            tracks,
        }
    }
}

/// The registry takes its check once; a reload that changes the check swaps what this
/// wrapper delegates to.
#[derive(Clone)]
struct SwappableCheck(Arc<ArcSwap<probe::Probe>>);

#[async_trait]
impl HealthCheck for SwappableCheck {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let current = self.0.load_full();
        current.check(target).await
    }

    fn backend_summary(&self, target: &Backend) -> String {
        format!("backend {}", target.addr)
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.0.load().health_threshold(success)
    }
}

pub struct Pool {
    pub name: String,
    pub lb: LoadBalancer<RoundRobin>,
    pub backends: Vec<Arc<BackendState>>,
    /// `backends` as Pingora sees them (same order), for health lookups.
    members: Vec<Backend>,
    /// Stable hashes of the backends' addresses (shuffle shards).
    ids: Vec<u64>,
    pub balance: crate::balance::BalanceSettings,
    /// `weights` as configured (empty: none).
    configured_weights: Vec<u32>,
    /// The runtime weights (`POST …/weight`) the pool was built with, per backend.
    manual_weights: Vec<Option<u32>>,
    selector: crate::balance::selector::Selector,
    pub shared: Arc<UpstreamShared>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub health_check_interval: Option<Duration>,
    pub health_check_path: String,
    /// The backends as written (`Upstream::hosts`), aligned with `backends`.
    pub hosts: Vec<String>,
    /// Each backend's `max_conn` (0: none) and `backup`, aligned with `backends`.
    max_conn: Vec<u64>,
    backup: Vec<bool>,
    /// Some backend has a `max_conn` or is a backup (else selection skips both checks).
    limited: bool,
    /// TLS / HTTP/2 to the backends (CONTRACT §6).
    pub transport: crate::config::UpstreamTransport,
    /// Set while no backend is eligible and traffic goes to all of them.
    pub panic_mode: AtomicBool,
    /// `None` without active checks (every backend counts as healthy).
    health: Option<PoolHealth>,
}

impl Pool {
    /// The configured weight of the `i`th backend (`None`: no `weights`, all 1).
    pub fn configured_weight(&self, i: usize) -> Option<u32> {
        self.configured_weights.get(i).copied()
    }

    /// A backend's runtime weight changed since the pool was built (rebuild it).
    pub fn weights_stale(&self) -> bool {
        self.backends
            .iter()
            .zip(&self.manual_weights)
            .any(|(b, w)| b.manual().weight() != *w)
    }

    /// Next backend by the upstream's policy: healthy, not culled, not tried
    /// yet by this request and, with `shard_size`, inside the key's shard.
    /// When health checks leave nothing eligible, fail open to every backend
    /// that is not culled (Envoy's panic mode), still inside the shard.
    pub fn select(&self, tried: &Tried, key: &[u8]) -> Option<Arc<BackendState>> {
        let n = self.backends.len();
        let mut shard = Vec::new();
        if self.balance.shard_size > 0 {
            let h = crate::balance::stable_hash(&[key]);
            crate::balance::shard::shard_of(h, &self.ids, self.balance.shard_size, &mut shard);
        }
        let in_shard = |i: usize| shard.is_empty() || shard.contains(&i);
        let open = |i: usize| {
            let s = &self.backends[i];
            in_shard(i) && !s.is_out() && !tried.contains(&s.addr)
        };
        // Without active checks nothing marks a backend down: skip Pingora's
        // readiness look-up (a hash of the `Backend` per candidate).
        let checked = self.health.is_some();
        let healthy = |i: usize| !checked || self.lb.backends().ready(&self.members[i]);
        let load = |i: usize| self.backends[i].inflight();
        let weights = &self.balance.weights;
        let picked = if self.limited {
            // `max_conn`: a backend at its limit is not selected; `backup`: used only when
            // no other backend can be. Slow start: a backend back lately has a ramped
            // `max_conn` and is a candidate in proportion to its ramp.
            let slow = self.balance.slow_start;
            let now_ms = if slow.is_zero() {
                0
            } else {
                crate::store::clock::unix_ms()
            };
            let ramp = |i: usize| {
                if slow.is_zero() {
                    1.0
                } else {
                    self.backends[i].ramp(now_ms, slow)
                }
            };
            let room = |i: usize| {
                let max = slow_start::ramped_max_conn(self.max_conn[i], ramp(i));
                max == 0 || load(i) < max
            };
            let usable = |i: usize| open(i) && healthy(i) && room(i);
            let lucky = |i: usize| slow_start::admits(ramp(i), fastrand::f64());
            let pick = |backup: bool, ramped: bool| {
                self.selector.pick(
                    n,
                    weights,
                    key,
                    &|i| self.backup[i] == backup && usable(i) && (!ramped || lucky(i)),
                    &load,
                )
            };
            // A ramping backend that loses its draw leaves the pick to the others; when
            // none is left, it is picked all the same.
            pick(false, true)
                .or_else(|| pick(false, false))
                .or_else(|| pick(true, true))
                .or_else(|| pick(true, false))
        } else {
            self.selector
                .pick(n, weights, key, &|i| open(i) && healthy(i), &load)
        };
        if let Some(i) = picked {
            if self.panic_mode.swap(false, Ordering::Relaxed) {
                tracing::info!(upstream = %self.name, "healthy backends back; panic mode off");
            }
            return Some(Arc::clone(&self.backends[i]));
        }
        if (0..n).any(|i| in_shard(i) && healthy(i) && !self.backends[i].is_out()) {
            // Healthy backends in rotation exist but were tried or are full: not a panic.
            // (Healthy ones that are all out, drained or culled, are: the ones in rotation
            // serve though their checks fail, rather than none.)
            return None;
        }
        if (0..n).all(|i| !in_shard(i) || self.backends[i].is_out()) {
            // Nothing in rotation by this instance's view (a cull beside operations the
            // store never held together): never the last backend, the budget's floor. The
            // culled ones serve (the operations are a person's; the store holds them within
            // the budget).
            let culled_only = |i: usize| {
                let s = &self.backends[i];
                in_shard(i) && !tried.contains(&s.addr) && s.manual.state() == ManualState::In
            };
            return self
                .selector
                .pick(n, weights, key, &culled_only, &load)
                .map(|i| Arc::clone(&self.backends[i]));
        }
        let fallback = self.selector.pick(n, weights, key, &open, &load);
        if fallback.is_some() && !self.panic_mode.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                upstream = %self.name,
                "no backend passes health checks; failing open to all (panic mode)"
            );
        }
        fallback.map(|i| Arc::clone(&self.backends[i]))
    }

    /// The upstream's line of requests waiting for room.
    pub fn room(&self) -> &Arc<Room> {
        &self.shared.room
    }

    /// `Retry-After` of a request this upstream sheds at `now_secs` (its bulkhead full,
    /// its queue's time out or full): an adaptive upstream's learned cap spreads the
    /// retries by its own shed share, as the cap's sheds are; a fixed `max_inflight` or
    /// `max_conn` answers `base`.
    pub fn shed_retry_after(&self, base: u64, now_secs: u64) -> u64 {
        if self.balance.adaptive {
            self.shared
                .limit
                .share
                .refuse(base, now_secs, fastrand::u64(..))
        } else {
            base
        }
    }

    /// Requests that may wait for room at once: `max_queue`, else 10 × the sum of the
    /// backends' `max_conn` (or of `max_inflight`), else 1024.
    pub fn max_queue(&self) -> u64 {
        if self.balance.max_queue > 0 {
            return self.balance.max_queue;
        }
        let conns: u64 = self.max_conn.iter().sum();
        let base = if conns > 0 {
            conns
        } else {
            self.balance.max_inflight
        };
        if base > 0 {
            base.saturating_mul(10)
        } else {
            1024
        }
    }

    /// Slow start: note each backend that came back into rotation since the last look
    /// (its health check passes again, readmitted after a cull, a drain or maintenance
    /// released). Run by the health-check loop every tick; nothing without slow start.
    pub fn watch_rotation(&self, now_ms: u64) {
        if self.balance.slow_start.is_zero() {
            return;
        }
        let checked = self.health.is_some();
        for (i, b) in self.backends.iter().enumerate() {
            let healthy = !checked || self.lb.backends().ready(&self.members[i]);
            let is_in = healthy && !b.is_out();
            if is_in && !b.was_in.swap(true, Ordering::Relaxed) {
                b.came_back(now_ms);
                tracing::info!(
                    event = "slow_start",
                    upstream = %self.name,
                    backend = %b.name,
                    seconds = self.balance.slow_start.as_secs(),
                    "backend back in rotation; its share ramps up"
                );
            } else if !is_in {
                b.was_in.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Slow start across the fleet: each backend ramping here (in rotation, back less
    /// than the window ago), with when it came back (ms), for the store's exchange of
    /// ramp starts. Empty without slow start.
    pub fn ramping(&self, now_ms: u64) -> Vec<(&Arc<BackendState>, u64)> {
        let window = u64::try_from(self.balance.slow_start.as_millis()).unwrap_or(u64::MAX);
        if window == 0 {
            return Vec::new();
        }
        self.backends
            .iter()
            .filter_map(|b| {
                let back = b.back_at_ms();
                let ramping = back != 0
                    && b.was_in.load(Ordering::Relaxed)
                    && now_ms.saturating_sub(back) < window;
                ramping.then_some((b, back))
            })
            .collect()
    }

    /// Whether a backend this request could use is only held back by its `max_conn`
    /// (so waiting may find it room).
    pub fn full_by_max_conn(&self, tried: &Tried) -> bool {
        self.limited
            && self.backends.iter().enumerate().any(|(i, b)| {
                self.max_conn[i] > 0
                    && !b.is_out()
                    && !tried.contains(&b.addr)
                    && b.inflight() >= self.max_conn[i]
            })
    }

    /// Whether any backend this request may still try exists (for retries).
    pub fn has_untried(&self, tried: &Tried) -> bool {
        self.backends
            .iter()
            .any(|b| !b.is_out() && !tried.contains(&b.addr))
    }

    /// The bulkhead (`max_inflight`, or the learned cap when `adaptive`): take a slot or
    /// be shed.
    #[inline]
    pub fn enter(&self) -> Bulkhead {
        if self.balance.adaptive {
            return match self
                .shared
                .limit
                .try_acquire(crate::shed::Priority::Critical)
            {
                Some(g) => Bulkhead::Entered(BulkheadGuard {
                    slot: Slot::Adaptive(g),
                    _told: Told(Arc::clone(&self.shared.room)),
                }),
                None => Bulkhead::Full,
            };
        }
        let cap = match self.balance.fleet_max_inflight {
            0 => self.balance.max_inflight,
            _ => self.shared.fleet_cap.cap_or(self.balance.max_inflight),
        };
        if cap == 0 {
            return Bulkhead::Unlimited;
        }
        let sh = &self.shared;
        let mut cur = sh.inflight.load(Ordering::Acquire);
        loop {
            if cur >= cap {
                return Bulkhead::Full;
            }
            match sh.inflight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Bulkhead::Entered(BulkheadGuard {
                        slot: Slot::Fixed(FixedSlot(Arc::clone(sh))),
                        _told: Told(Arc::clone(&sh.room)),
                    })
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Feed one answered request's latency to an `adaptive` upstream's own cap.
    #[inline]
    pub fn on_latency(&self, now: std::time::Instant, rtt: Duration) {
        if self.balance.adaptive {
            self.shared.limit.on_latency(now, rtt);
        }
    }

    /// What `s`'s probes found (`None`: no active check, or not probed yet).
    pub fn health_track(&self, s: &BackendState) -> Option<portcullis_policy::health::Track> {
        self.health.as_ref()?.tracks.get(&s.addr)
    }

    /// Shared probing of this pool: its tracks, `probers` and thresholds (`None` without
    /// a check with `shared = true`).
    pub fn shared_probing(
        &self,
    ) -> Option<(
        Arc<probe::Tracks>,
        u32,
        portcullis_policy::health::Thresholds,
    )> {
        let h = self.health.as_ref()?;
        let check = h.check.0.load();
        let probers = check.shared_probers()?;
        Some((Arc::clone(&h.tracks), probers, check.thresholds()))
    }

    /// Where `s`'s state came from at its last check (shared probing).
    pub fn health_source(&self, s: &BackendState) -> Option<probe::Source> {
        self.health.as_ref()?.tracks.source(&s.addr)
    }

    /// Each backend's probe counts by result (empty without an active check).
    pub fn health_counts(&self) -> Vec<(SocketAddr, probe::Counts)> {
        self.health
            .as_ref()
            .map(|h| h.tracks.counts())
            .unwrap_or_default()
    }

    /// `rise`, `fall` and the intervals of the active check.
    pub fn health_thresholds(&self) -> Option<portcullis_policy::health::Thresholds> {
        self.health.as_ref().map(|h| h.check.0.load().thresholds())
    }

    /// The `Host` the active check sends to `s` (its address without a check).
    pub fn probe_host(&self, s: &BackendState) -> String {
        match &self.health {
            Some(h) => h.check.0.load().host_of(s.addr),
            None => s.addr_str.clone(),
        }
    }

    /// Whether `status` passes the active check (2xx without one).
    pub fn probe_passes(&self, status: u16) -> bool {
        match &self.health {
            Some(h) => h.check.0.load().passes(status),
            None => (200..300).contains(&status),
        }
    }

    /// The `max_conn` (0: none) and `backup` of `s`.
    pub fn limits_of(&self, s: &BackendState) -> (u64, bool) {
        match self.backends.iter().position(|b| b.addr == s.addr) {
            Some(i) => (self.max_conn[i], self.backup[i]),
            None => (0, false),
        }
    }

    /// The backend called `name` (or written so), if any.
    pub fn by_name(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| b.name == name)
    }

    pub fn is_healthy(&self, s: &BackendState) -> bool {
        match self.backends.iter().position(|b| b.addr == s.addr) {
            Some(i) => self.lb.backends().ready(&self.members[i]),
            None => false,
        }
    }

    pub async fn run_health_check(&self) {
        if self.health_check_interval.is_some() {
            self.lb.backends().run_health_check(true).await;
            self.refresh_panic();
        }
    }

    /// Panic mode ends as soon as a backend in rotation passes its checks again, not at
    /// the next request (the page and `portcullis_upstream_panic_mode` showed it on
    /// until then).
    fn refresh_panic(&self) {
        if !self.panic_mode.load(Ordering::Relaxed) {
            return;
        }
        let back = (0..self.backends.len())
            .any(|i| !self.backends[i].is_out() && self.lb.backends().ready(&self.members[i]));
        if back && self.panic_mode.swap(false, Ordering::Relaxed) {
            tracing::info!(upstream = %self.name, "healthy backends back; panic mode off");
        }
    }
}
