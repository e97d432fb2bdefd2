//! The fleet sync: every [`INTERVAL`], the manual operations in force on every upstream,
//! read from the store in one round trip, are set on this instance's backends (the mark
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
use portcullis_policy::cull::ops::OpRecord;
use portcullis_policy::cull::BudgetStore;

use crate::state::{Runtime, Shared};

/// How often the operations are read: an action reaches every instance within 2 s.
pub const INTERVAL: Duration = Duration::from_secs(1);

pub struct FleetSync {
    shared: Arc<Shared>,
    budget: Arc<dyn BudgetStore>,
    /// The store failed at the last read (the warning is logged once).
    failing: AtomicBool,
}

/// The background service over `budget` (the culls' budget store).
pub fn service(
    shared: Arc<Shared>,
    budget: Arc<dyn BudgetStore>,
) -> GenBackgroundService<FleetSync> {
    background_service(
        "fleet sync",
        FleetSync {
            shared,
            budget,
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
        match self.budget.ops(&names).await {
            Ok((_, ops)) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        event = "fleet_sync",
                        "store reachable again; operations in sync"
                    );
                }
                apply(&rt, &ops);
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

/// Set each backend's records from `ops` (per upstream, in the order of `rt.pools`).
pub fn apply(rt: &Runtime, ops: &[Vec<OpRecord>]) {
    for (pool, records) in rt.pools.iter().zip(ops) {
        for b in &pool.backends {
            let mine: Vec<OpRecord> = records
                .iter()
                .filter(|r| r.backend == b.addr_str)
                .cloned()
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
