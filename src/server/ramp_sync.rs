//! Slow start across the fleet: every [`TICK`], for each upstream with
//! `slow_start_seconds` and a backend ramping here, this instance publishes when it saw
//! each such backend come back and takes the fleet's start of its ramp from the store
//! (`portcullis_policy::balance::slow_start::fleet_start`), so every instance ramps it
//! together. Never on the request path; one round trip per upstream ramping, bounded by
//! the store's timeout. Without a store, or while it does not answer, each instance ramps
//! from its own sighting (up to one health-check interval and rise, or one fleet sync,
//! apart).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use portcullis_policy::balance::slow_start::{ramp_ttl_ms, RampPublish, RampStore};

use super::every::{Outage, Ticks};
use crate::state::Shared;
use crate::upstream::Pool;
use portcullis_policy::StoreError;
use portcullis_store::Store;

/// How often ramping backends' starts are exchanged.
pub const TICK: Duration = Duration::from_millis(500);

pub struct RampSync {
    shared: Arc<Shared>,
    store: Option<Arc<dyn RampStore>>,
}

impl RampSync {
    pub fn new(shared: Arc<Shared>, store: &Store) -> Self {
        let store = match store {
            Store::Redis(_) => Some(store.ramp()),
            Store::Local => None,
        };
        Self { shared, store }
    }
}

#[async_trait]
impl BackgroundService for RampSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(store) = &self.store else {
            return;
        };
        let mut ticks = Ticks::every(TICK);
        // One store for every upstream: an outage is the store's, said once, over when a
        // round of exchanges all answer.
        let outage = Outage::new("slow_start_sync");
        while ticks.next(&mut shutdown).await {
            let rt = self.shared.runtime.load_full();
            let mut failed = None;
            let mut answered = false;
            for pool in &rt.pools {
                match exchange(&**store, pool).await {
                    Ok(true) => answered = true,
                    Ok(false) => {}
                    Err(e) => failed = Some(e),
                }
            }
            match failed {
                Some(e) => {
                    outage.failed(
                        &e,
                        "the store did not answer: slow-start ramps follow this instance's own sightings",
                    );
                }
                None if answered => {
                    outage.answered("slow-start ramps follow the fleet's starts again");
                }
                None => {}
            }
        }
    }
}

/// Publish when this instance saw each of `pool`'s ramping backends come back, and adopt
/// the fleet's start of each ramp. `Ok(false)`: nothing ramping, nothing asked.
async fn exchange(store: &dyn RampStore, pool: &Pool) -> Result<bool, StoreError> {
    let now_ms = crate::state::unix_ms();
    let ramping = pool.ramping(now_ms);
    if ramping.is_empty() {
        return Ok(false);
    }
    let req = RampPublish {
        upstream: pool.name.clone(),
        ttl_ms: ramp_ttl_ms(pool.balance.slow_start),
        backends: ramping
            .iter()
            .map(|(b, back)| (b.addr_str.clone(), now_ms.saturating_sub(*back)))
            .collect(),
    };
    let ages = store.exchange(&req).await?;
    // The ages are as of the exchange: read the clock after it.
    let now_ms = crate::state::unix_ms();
    for ((b, back), age) in ramping.iter().zip(ages) {
        b.adopt_ramp_start(*back, now_ms.saturating_sub(age));
    }
    Ok(true)
}
