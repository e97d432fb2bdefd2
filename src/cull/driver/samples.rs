//! Each backend's sample for a check: this instance's window and the fleet's counters
//! (this instance's deltas added first), the larger of the two.

use super::{Culling, StateKey, Tracked};
use crate::upstream::Pool;
use portcullis_policy::cull::{BackendSample, Buckets, FleetDelta};
use std::collections::HashMap;

impl Culling {
    /// Each backend's `(requests, errors)` over the window: the larger of this
    /// instance's window and the fleet's counters (after adding our deltas).
    pub(super) async fn samples(
        &self,
        pool: &Pool,
        states: &mut HashMap<StateKey, Tracked>,
        now_secs: u64,
        buckets: Buckets,
    ) -> Vec<BackendSample> {
        let mut totals = Vec::with_capacity(pool.backends.len());
        let mut deltas = Vec::with_capacity(pool.backends.len());
        for b in &pool.backends {
            let t = states.entry((pool.name.clone(), b.addr)).or_default();
            let (r, e) = b.totals();
            totals.push((r, e));
            deltas.push(FleetDelta {
                backend: b.addr_str.clone(),
                requests: r.saturating_sub(t.pushed.0),
                errors: e.saturating_sub(t.pushed.1),
                since_secs: t.since_secs,
            });
        }
        let fleet = match self
            .budget
            .exchange_errors(&pool.name, &deltas, now_secs, buckets)
            .await
        {
            Some(Ok(f)) => Some(f),
            Some(Err(e)) => {
                // Deltas stay unsent and go with the next successful exchange.
                tracing::debug!(error = %e, "fleet error counts unavailable; using local counts");
                None
            }
            None => None,
        };
        let delivered = fleet.is_some() || self.budget.kind() == "local";
        pool.backends
            .iter()
            .enumerate()
            .map(|(index, b)| {
                if delivered {
                    if let Some(t) = states.get_mut(&(pool.name.clone(), b.addr)) {
                        t.pushed = totals[index];
                    }
                }
                let (mut requests, mut errors) = b.window.totals(now_secs);
                if let Some((fr, fe)) = fleet.as_ref().and_then(|f| f.get(index)) {
                    requests = requests.max(*fr);
                    errors = errors.max(*fe);
                }
                BackendSample {
                    index,
                    requests,
                    errors,
                }
            })
            .collect()
    }
}
