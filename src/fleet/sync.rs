//! The fleet sync: every [`INTERVAL`], the whole budget (the operations and claims in force
//! on every upstream, the culls, tokens and group times), read from the store in one round
//! trip, is kept as the instance's [`FleetView`] and its operations are set on this
//! instance's backends (the mark
//! the request path reads, the records `GET /backends` shows). A changed weight rebuilds
//! the pools the way a reload does (backends keep their state). With the store
//! unreachable, the last state read stays in force (as the rate limiter keeps its last
//! counts), and a warning is logged once per outage.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::{background_service, BackgroundService, GenBackgroundService};
use portcullis_policy::cull::claims::FleetState;
use portcullis_policy::cull::ops::OpRecord;
use portcullis_policy::cull::BudgetStore;

use crate::state::{Runtime, Shared};

/// How often the operations are read: an action reaches every instance within 2 s.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The fleet's budget as the last sync read it: dry runs and the feasibility audit are
/// answered from it, without a store round trip.
#[derive(Debug, Default)]
pub struct FleetView(arc_swap::ArcSwapOption<FleetState>);

impl FleetView {
    pub fn load(&self) -> Option<Arc<FleetState>> {
        self.0.load_full()
    }

    pub fn store(&self, state: FleetState) {
        self.0.store(Some(Arc::new(state)));
    }
}

pub struct FleetSync {
    shared: Arc<Shared>,
    budget: Arc<dyn BudgetStore>,
    view: Arc<FleetView>,
    /// The store failed at the last read (the warning is logged once).
    failing: AtomicBool,
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
        },
    )
}

#[async_trait]
impl BackgroundService for FleetSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            self.sync_once().await;
            tokio::select! {
                _ = tokio::time::sleep(INTERVAL) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

impl FleetSync {
    /// One read and apply.
    pub async fn sync_once(&self) {
        let rt = self.shared.runtime.load_full();
        let names: Vec<&str> = rt.pools.iter().map(|p| p.name.as_str()).collect();
        let params = &rt.config.culling.params;
        match self.budget.fleet_state(&names, params).await {
            Ok(state) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        event = "fleet_sync",
                        "store reachable again; operations in sync"
                    );
                }
                apply(&rt, &state);
                self.view.store(state);
                rebuild_if_weights_changed(&self.shared);
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(event = "fleet_sync", error = %e, "store unreachable; the last operations read stay in force");
                }
            }
        }
    }
}

/// Set each backend's records from the operations in force in `state`.
pub fn apply(rt: &Runtime, state: &FleetState) {
    for pool in &rt.pools {
        for b in &pool.backends {
            let mine: Vec<OpRecord> = state
                .ops
                .iter()
                .filter(|(u, r)| *u == pool.name && r.backend == b.addr_str)
                .map(|(_, r)| r.clone())
                .collect();
            b.manual().set(mine);
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
