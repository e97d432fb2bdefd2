//! The process's own metrics: readiness, configuration reloads and self-watchdog breaches.

use super::registered;
use prometheus::{IntCounterVec, IntGauge, Registry};

pub struct LifecycleMetrics {
    /// Copied from the lifecycle at each scrape.
    pub ready: IntGauge,
    /// By `result` = ok | error (counted by `reload`).
    pub config_reloads: IntCounterVec,
    /// By `kind` and the budget's `result` (counted by `watchdog`).
    pub watchdog_breaches: IntCounterVec,
}

impl LifecycleMetrics {
    /// Define the process's series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let config_reloads = super::counter_vec(
            registry,
            "portcullis_config_reloads_total",
            "Config reloads by result",
            &["result"],
        );
        for r in ["ok", "error"] {
            config_reloads.with_label_values(&[r]);
        }
        let watchdog_breaches = super::counter_vec(
            registry,
            "portcullis_watchdog_breaches_total",
            "Self-watchdog breaches by what was breached and the budget's answer",
            &["kind", "result"],
        );
        // Every (kind, result) exists from start at 0, so a dashboard or an
        // alert over it has data before the first breach.
        for kind in ["rss", "error_rate", "stall"] {
            for result in ["granted", "no_token", "no_store", "store_error"] {
                watchdog_breaches.with_label_values(&[kind, result]);
            }
        }
        let ready = registered(
            registry,
            IntGauge::new("portcullis_ready", "1 while /readyz answers 200"),
        );
        Self {
            ready,
            config_reloads,
            watchdog_breaches,
        }
    }
}
