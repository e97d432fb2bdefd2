//! Upstream pools: selection over healthy, not-culled backends by the
//! upstream's balancing policy ([`crate::balance`]), active HTTP health
//! checks, per-backend state shared with the culling gate, and the
//! per-upstream bulkhead and retry budget. [`peer`]: the transport (TLS,
//! HTTP/2) to a backend.

mod blame_names;
mod build;
mod bulkhead;
mod health;
mod manual;
pub mod peer;
pub mod probe;
mod room;
mod tried;

use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, LoadBalancer};
use portcullis_policy::balance::slow_start;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use blame_names::BlameNames;
pub use bulkhead::{Bulkhead, BulkheadGuard};
pub use health::PoolHealth;
use manual::MANUAL_IN;
pub use manual::{Manual, ManualState};
pub use room::{Room, RoomPlace};
pub use tried::Tried;

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
    pub limit: Arc<portcullis_policy::shed::Shedder>,
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

/// What one selection may pick from: the key's shard (empty: every backend), the
/// backends this request tried, and whether health checks run.
struct Candidates<'a> {
    pool: &'a Pool,
    tried: &'a Tried,
    shard: &'a [usize],
    /// Without active checks nothing marks a backend down: Pingora's readiness look-up
    /// (a hash of the `Backend` per candidate) is skipped.
    checked: bool,
}

impl Candidates<'_> {
    #[inline]
    fn in_shard(&self, i: usize) -> bool {
        self.shard.is_empty() || self.shard.contains(&i)
    }

    /// In the shard, in rotation and not tried yet.
    #[inline]
    fn open(&self, i: usize) -> bool {
        let s = &self.pool.backends[i];
        self.in_shard(i) && !s.is_out() && !self.tried.contains(&s.addr)
    }

    #[inline]
    fn healthy(&self, i: usize) -> bool {
        !self.checked || self.pool.lb.backends().ready(&self.pool.members[i])
    }

    #[inline]
    fn load(&self, i: usize) -> u64 {
        self.pool.backends[i].inflight()
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
        let c = Candidates {
            pool: self,
            tried,
            shard: &shard,
            checked: self.health.is_some(),
        };
        let (open, healthy, load) = (|i| c.open(i), |i| c.healthy(i), |i| c.load(i));
        let weights = &self.balance.weights;
        let picked = if self.limited {
            // `max_conn`: a backend at its limit is not selected; `backup`: used only when
            // no other backend can be. Slow start: a backend back lately has a ramped
            // `max_conn` and is a candidate in proportion to its ramp.
            let slow = self.balance.slow_start;
            let now_ms = if slow.is_zero() {
                0
            } else {
                portcullis_store::clock::unix_ms()
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
        self.none_eligible(&c, key)
    }

    /// No backend eligible by the usual rules for this request: healthy ones in rotation
    /// that were tried or are full answer `None`; with none in rotation, the culled ones
    /// serve (never the last backend); with none healthy, every one in rotation serves
    /// (panic mode).
    #[cold]
    fn none_eligible(&self, c: &Candidates<'_>, key: &[u8]) -> Option<Arc<BackendState>> {
        let n = self.backends.len();
        let tried = c.tried;
        let (in_shard, open) = (|i| c.in_shard(i), |i| c.open(i));
        let (healthy, load) = (|i| c.healthy(i), |i| c.load(i));
        let weights = &self.balance.weights;
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
