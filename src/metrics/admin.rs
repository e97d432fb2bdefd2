//! The runtime API's metrics (CONTRACT §12, §18): `portcullis_admin_actions_total{action,result}`
//! and `portcullis_backend_state{upstream,backend,state}`.

use prometheus::{IntCounterVec, IntGaugeVec, Registry};

/// A backend's states, as `GET /backends` names them.
pub const STATES: [&str; 6] = ["up", "draining", "maint", "claimed", "culled", "unhealthy"];

/// The actions of the runtime API and their results, each series present from the start.
pub const ACTIONS: [&str; 6] = ["drain", "maint", "ready", "weight", "claim", "release"];
pub const RESULTS: [&str; 6] = [
    "applied",
    "refused",
    "invalid",
    "store_error",
    "dry_run",
    "emergency",
];

pub struct AdminMetrics {
    actions: IntCounterVec,
    /// 1 for the state each backend is in, 0 for the others; set at each scrape.
    backend_state: IntGaugeVec,
}

impl AdminMetrics {
    /// Define the series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let actions = super::counter_vec(
            registry,
            "portcullis_admin_actions_total",
            "Runtime API actions on backends by action and result",
            &["action", "result"],
        );
        for a in ACTIONS {
            for r in RESULTS {
                actions.with_label_values(&[a, r]);
            }
        }
        let backend_state = super::gauge_vec(
            registry,
            "portcullis_backend_state",
            "1 for the state a backend is in (up, draining, maint, claimed, culled, unhealthy), 0 for the others",
            &["upstream", "backend", "state"],
        );
        Self {
            actions,
            backend_state,
        }
    }

    /// Set a backend's state series: 1 for `state`, 0 for the others.
    pub fn set_backend_state(&self, upstream: &str, backend: &str, state: &str) {
        for s in STATES {
            self.backend_state
                .with_label_values(&[upstream, backend, s])
                .set(i64::from(s == state));
        }
    }

    /// Count one action (`action` and `result` from [`ACTIONS`] and [`RESULTS`]).
    pub fn count(&self, action: &str, result: &str) {
        self.actions.with_label_values(&[action, result]).inc();
    }
}
