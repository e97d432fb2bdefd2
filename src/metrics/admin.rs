//! The runtime API's metric (CONTRACT §12): `portcullis_admin_actions_total{action,result}`.

use super::registered;
use prometheus::{IntCounterVec, Opts, Registry};

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
}

impl AdminMetrics {
    /// Define the series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let actions = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "portcullis_admin_actions_total",
                    "Runtime API actions on backends by action and result",
                ),
                &["action", "result"],
            ),
        );
        for a in ACTIONS {
            for r in RESULTS {
                actions.with_label_values(&[a, r]);
            }
        }
        Self { actions }
    }

    /// Count one action (`action` and `result` from [`ACTIONS`] and [`RESULTS`]).
    pub fn count(&self, action: &str, result: &str) {
        self.actions.with_label_values(&[action, result]).inc();
    }
}
