//! Culling's metrics: per-backend errors and cull state, the decisions, the fleet's tokens
//! and each upstream's panic mode.

use super::{registered, CullResult};
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};

pub struct CullMetrics {
    /// Copied from the backends at each scrape.
    pub backend_culled: IntGaugeVec,
    /// Copied from the backends' error windows at each scrape.
    pub backend_errors: IntCounterVec,
    decisions: IntCounterVec,
    pub tokens_available: IntGauge,
    pub upstream_panic_mode: IntGaugeVec,
    /// `portcullis_blamed_total{tenant}`: keys blamed for their upstream's errors and
    /// limited (CONTRACT §15). `tenant` is a bounded name, never a raw key.
    pub blamed: IntCounterVec,
    /// `portcullis_health_checks_total{upstream,backend,result}`: active probes by
    /// result, copied from the probes' counts at each scrape.
    pub health_checks: IntCounterVec,
}

impl CullMetrics {
    /// Define culling's series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let backend_culled = super::gauge_vec(
            registry,
            "portcullis_backend_culled",
            "1 while a backend is culled",
            &["upstream", "backend"],
        );
        let backend_errors = super::counter_vec(
            registry,
            "portcullis_backend_errors_total",
            "Errors (5xx, failed connects, timeouts) seen per backend",
            &["upstream", "backend"],
        );
        let decisions = super::counter_vec(
            registry,
            "portcullis_cull_decisions_total",
            "Cull decisions by result",
            &["result"],
        );
        for r in CullResult::ALL {
            decisions.with_label_values(&[r.as_str()]);
        }
        let tokens_available = registered(
            registry,
            IntGauge::new(
                "portcullis_cull_tokens_available",
                "Fleet-wide cull tokens available at the last check",
            ),
        );
        let upstream_panic_mode = super::gauge_vec(
            registry,
            "portcullis_upstream_panic_mode",
            "1 while an upstream has no eligible backend and routes to all (fail-open)",
            &["upstream"],
        );
        let blamed = super::counter_vec(
            registry,
            "portcullis_blamed_total",
            "Tenants (keys) blamed for most of their upstream's errors and limited for cooldown_seconds",
            &["tenant"],
        );
        let health_checks = super::counter_vec(
            registry,
            "portcullis_health_checks_total",
            "Active health-check probes by result (ok, connect, timeout, status, body, protocol)",
            &["upstream", "backend", "result"],
        );
        Self {
            health_checks,
            backend_culled,
            backend_errors,
            decisions,
            tokens_available,
            upstream_panic_mode,
            blamed,
        }
    }

    pub fn decision(&self, r: CullResult) {
        self.decisions.with_label_values(&[r.as_str()]).inc();
    }
}
