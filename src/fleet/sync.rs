//! The fleet sync: every [`INTERVAL`], the whole budget (the operations and claims in force
//! on every upstream, the culls, tokens and group times), read from the store in one round
//! trip, is kept as the instance's [`FleetView`] and set on this instance's backends: the
//! operations (the mark the request path reads, the records `GET /backends` shows) and the
//! culls every instance holds, from the same read, so what this instance takes out of
//! rotation is one snapshot of the store (never a cull of one read beside the operations
//! of another: that showed 3 of 4 backends out where the store held 2). A changed weight
//! rebuilds the pools the way a reload does (backends keep their state). With the store
//! unreachable, the last state read stays in force (as the rate limiter keeps its last
//! counts), a followed cull only until its lease has certainly lapsed, and a warning is
//! logged once per outage.
//!
//! A pause of the process (`SIGSTOP`, a frozen VM, a starved machine) is told by a
//! heartbeat every [`HEARTBEAT`]: when it comes [`PAUSE`] late, the view is stale (drains
//! and claims may have been granted meanwhile), so the store is read again at once, and
//! requests wait up to [`WAKE_WAIT`] for that read before they pick a backend
//! ([`FleetView::fresh_after_pause`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::{background_service, BackgroundService, GenBackgroundService};
use portcullis_policy::cull::claims::FleetState;
use portcullis_policy::cull::ops::OpRecord;
use portcullis_policy::cull::BudgetStore;
use portcullis_policy::StoreError;

use crate::state::{Runtime, Shared};

/// How often the operations are read: an action reaches every instance within 2 s.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The heartbeat that tells a pause of the process.
pub const HEARTBEAT: Duration = Duration::from_millis(100);

/// A heartbeat this late means the process did not run meanwhile.
pub const PAUSE: Duration = Duration::from_secs(1);

/// After a pause, requests wait at most this long for the store's state before they pick
/// a backend (the store unreachable: they are served on the view read before the pause).
pub const WAKE_WAIT: Duration = Duration::from_secs(1);

/// Retry period of the read after a pause (the store client's backoff decides the rest).
const WAKE_RETRY: Duration = Duration::from_millis(50);

/// Milliseconds on the monotonic clock since the first call, plus 1 (0: never).
fn mono_ms() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The fleet's budget as the last sync read it: dry runs and the feasibility audit are
/// answered from it, without a store round trip. Also the pause detector and the order
/// of reads (an older read never overwrites a newer one).
#[derive(Debug, Default)]
pub struct FleetView {
    state: arc_swap::ArcSwapOption<FleetState>,
    /// The [`cull_epoch`](crate::upstream::cull_epoch) of the read last set on the
    /// backends (held while setting).
    applied: Mutex<u64>,
    /// Monotonic ms of the last heartbeat (0: none yet).
    beat: AtomicU64,
    /// Monotonic ms at which the last pause was told (0: none).
    woke: AtomicU64,
    /// Monotonic ms at which the last read set on the backends started.
    synced: AtomicU64,
    /// A read was set on the backends.
    synced_note: tokio::sync::Notify,
    /// A pause was told: read now.
    resync: tokio::sync::Notify,
}

impl FleetView {
    pub fn load(&self) -> Option<Arc<FleetState>> {
        self.state.load_full()
    }

    pub fn store(&self, state: FleetState) {
        self.state.store(Some(Arc::new(state)));
    }

    /// Set `state`, read from the store from `epoch` (a
    /// [`cull_epoch`](crate::upstream::cull_epoch) taken before the read) at monotonic
    /// `started`, on the backends of `rt` and keep it; nothing when a read that started
    /// later was set already.
    pub fn set(&self, rt: &Runtime, state: FleetState, epoch: u64, started: u64) {
        {
            let Ok(mut applied) = self.applied.lock() else {
                return;
            };
            if *applied > epoch {
                return;
            }
            *applied = epoch;
            apply(rt, &state, epoch);
            self.store(state);
        }
        self.synced.fetch_max(started, Ordering::AcqRel);
        self.synced_note.notify_waiters();
    }

    /// The epoch of the read last set (0: none).
    fn applied_epoch(&self) -> u64 {
        self.applied.lock().map_or(0, |a| *a)
    }

    /// One heartbeat at monotonic `now`; true when it tells a pause (then a read is due).
    fn beat_at(&self, now: u64) -> bool {
        let last = self.beat.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) > ms(PAUSE) {
            return self.paused(last, now);
        }
        self.beat.fetch_max(now, Ordering::AcqRel);
        false
    }

    /// The heartbeat at `last` came late at `now`: the wake is noted, and the first to see
    /// it asks for a read.
    fn paused(&self, last: u64, now: u64) -> bool {
        self.woke.fetch_max(now, Ordering::AcqRel);
        if self
            .beat
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.resync.notify_one();
        true
    }

    /// Within [`WAKE_WAIT`] of a pause and no read set since it.
    fn stale_at(&self, now: u64) -> bool {
        let woke = self.woke.load(Ordering::Acquire);
        woke != 0
            && self.synced.load(Ordering::Acquire) < woke
            && now < woke.saturating_add(ms(WAKE_WAIT))
    }

    /// The request path, before it picks a backend: after a pause of the process (told by
    /// the late heartbeat, here or by the heartbeat itself), wait until the store's state
    /// read since the wake is set, at most until [`WAKE_WAIT`] after it. At once otherwise.
    pub async fn fresh_after_pause(&self) {
        let now = mono_ms();
        let last = self.beat.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) > ms(PAUSE) {
            self.paused(last, now);
        }
        if self.stale_at(now) {
            self.wait_fresh().await;
        }
    }

    async fn wait_fresh(&self) {
        loop {
            let note = self.synced_note.notified();
            tokio::pin!(note);
            note.as_mut().enable();
            let now = mono_ms();
            if !self.stale_at(now) {
                return;
            }
            let until = self
                .woke
                .load(Ordering::Acquire)
                .saturating_add(ms(WAKE_WAIT));
            let left = Duration::from_millis(until.saturating_sub(now).max(1));
            if tokio::time::timeout(left, note).await.is_err() {
                return;
            }
        }
    }
}

/// Read the whole budget and set it on the backends (the fleet sync, and the refresh
/// right after a change made here).
pub async fn read_and_apply(
    rt: &Runtime,
    budget: &dyn BudgetStore,
    view: &FleetView,
) -> Result<(), StoreError> {
    let names: Vec<&str> = rt.pools.iter().map(|p| p.name.as_str()).collect();
    let epoch = crate::upstream::cull_epoch();
    let started = mono_ms();
    let state = budget
        .fleet_state(&names, &rt.config.culling.params)
        .await?;
    view.set(rt, state, epoch, started);
    Ok(())
}

pub struct FleetSync {
    shared: Arc<Shared>,
    budget: Arc<dyn BudgetStore>,
    view: Arc<FleetView>,
    /// The store failed at the last read (the warning is logged once).
    failing: AtomicBool,
    /// Monotonic ms of the last successful read, and whether the followed culls were
    /// dropped since (their leases lapsed while the store was unreachable).
    last_ok: AtomicU64,
    culls_dropped: AtomicBool,
}

/// The background service over `budget` (the culls' budget store), keeping `view`.
pub fn service(
    shared: Arc<Shared>,
    budget: Arc<dyn BudgetStore>,
    view: Arc<FleetView>,
) -> GenBackgroundService<FleetSync> {
    background_service(
        "fleet sync",
        FleetSync {
            shared,
            budget,
            view,
            failing: AtomicBool::new(false),
            last_ok: AtomicU64::new(0),
            culls_dropped: AtomicBool::new(false),
        },
    )
}

#[async_trait]
impl BackgroundService for FleetSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // The heartbeat runs apart: a read waiting on an unreachable store is no pause.
        let view = Arc::clone(&self.view);
        let heart = tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEARTBEAT);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if view.beat_at(mono_ms()) {
                    tracing::warn!(
                        event = "fleet_sync",
                        "the process was paused; reading the fleet's operations again before serving"
                    );
                }
            }
        });
        loop {
            self.sync_once().await;
            // After a pause, read again soon until a read started since it is set
            // (requests wait for it).
            let wait = if self.view.stale_at(mono_ms()) {
                WAKE_RETRY
            } else {
                INTERVAL
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.view.resync.notified() => {}
                _ = shutdown.changed() => break,
            }
        }
        heart.abort();
    }
}

impl FleetSync {
    /// One read and apply; false when the store did not answer.
    pub async fn sync_once(&self) -> bool {
        let rt = self.shared.runtime.load_full();
        let applied = self.view.applied_epoch();
        match read_and_apply(&rt, &*self.budget, &self.view).await {
            Ok(()) => {
                self.last_ok.store(mono_ms(), Ordering::Release);
                self.culls_dropped.store(false, Ordering::Release);
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        event = "fleet_sync",
                        "store reachable again; operations in sync"
                    );
                }
                rebuild_if_weights_changed(&self.shared);
                true
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(event = "fleet_sync", error = %e, "store unreachable; the last operations read stay in force");
                }
                self.drop_lapsed_culls(&rt, applied);
                false
            }
        }
    }

    /// With the store unreachable since the last read (set at `applied`), the culls it
    /// showed are followed until their leases have certainly lapsed (nobody can renew
    /// them meanwhile: the last read, plus a lease, plus a check interval), as the cull
    /// state machine follows them.
    fn drop_lapsed_culls(&self, rt: &Runtime, applied: u64) {
        let last = self.last_ok.load(Ordering::Acquire);
        let p = &rt.config.culling.params;
        let lapse = p
            .lease_ttl_ms()
            .saturating_add(p.check_interval_secs.max(1).saturating_mul(1000))
            .saturating_add(ms(INTERVAL));
        if last == 0
            || mono_ms().saturating_sub(last) < lapse
            || self.culls_dropped.swap(true, Ordering::AcqRel)
        {
            return;
        }
        for pool in &rt.pools {
            for b in &pool.backends {
                b.follow_cull(false, applied);
            }
        }
    }
}

/// Set each backend's records from the operations in force in `state`, and its cull mark
/// from the culls in `state` (read from `epoch`) unless culling is off or in dry run (the
/// culling loop then readmits everything itself).
pub fn apply(rt: &Runtime, state: &FleetState, epoch: u64) {
    let culls = &rt.config.culling;
    let follow = culls.enabled && !culls.params.dry_run;
    for pool in &rt.pools {
        for b in &pool.backends {
            let mine: Vec<OpRecord> = state
                .ops
                .iter()
                .filter(|(u, r)| *u == pool.name && r.backend == b.addr_str)
                .map(|(_, r)| r.clone())
                .collect();
            b.manual().set(mine);
            if follow {
                let culled = state
                    .culls
                    .iter()
                    .any(|(u, c)| *u == pool.name && *c == b.addr_str);
                b.follow_cull(culled, epoch);
            }
        }
    }
}

/// Rebuild the pools when a backend's runtime weight differs from the one its pool was
/// built with. Skipped while a reload runs (it rebuilds with the new weights itself).
pub fn rebuild_if_weights_changed(shared: &Shared) {
    let stale = shared
        .runtime
        .load()
        .pools
        .iter()
        .any(|p| p.weights_stale());
    if !stale {
        return;
    }
    let Ok(_one) = shared.reloading.try_lock() else {
        return;
    };
    let config = shared.runtime.load().config.clone();
    shared.apply(config);
    tracing::info!(
        event = "fleet_sync",
        "runtime weights changed; pools rebuilt"
    );
}
