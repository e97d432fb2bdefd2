//! Load shedding's metrics: requests in flight, the cap in force, and the requests an
//! upstream's bulkhead shed.

use super::registered;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

pub struct ShedMetrics {
    /// Copied from the shedder at each scrape.
    pub inflight: IntGauge,
    /// The load-shedding cap now in force (learned when adaptive; 0 = no cap).
    pub concurrency_limit: IntGauge,
    /// Requests shed by an upstream's bulkhead (`max_inflight`).
    pub bulkhead_shed: IntCounterVec,
}

impl ShedMetrics {
    /// Define load shedding's series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let inflight = registered(
            registry,
            IntGauge::new(
                "portcullis_inflight_requests",
                "Requests in flight through the proxy",
            ),
        );
        let concurrency_limit = registered(
            registry,
            IntGauge::new(
                "portcullis_concurrency_limit",
                "Load-shedding cap in force (learned from latency with shedding.adaptive; 0 = none)",
            ),
        );
        let bulkhead_shed = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "portcullis_bulkhead_shed_total",
                    "Requests shed (503) because their upstream reached max_inflight",
                ),
                &["upstream"],
            ),
        );
        Self {
            inflight,
            concurrency_limit,
            bulkhead_shed,
        }
    }
}
