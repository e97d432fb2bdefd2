//! Every metric, one struct per module it measures ([`EdgeMetrics`], [`ShedMetrics`],
//! [`ProxyMetrics`], [`RateLimitMetrics`], [`CullMetrics`], [`LifecycleMetrics`],
//! [`AccessLogMetrics`]), each defining and registering its own series; [`Metrics`] is
//! their composition around one registry. Label values come from closed enums; an API key
//! is never a label. Hot-path handles are resolved once at start-up, so recording is an
//! atomic add, not a label lookup.
//!
//! The structs live here, not in the modules they measure: those modules reach the
//! metrics through `state::Shared`, so the metrics must not depend on them.

use prometheus::core::Collector;
use prometheus::{Encoder, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

mod access_log;
mod admin;
mod cull;
mod edge;
mod labels;
mod lifecycle;
pub mod process;
mod proxy;
mod ratelimit;
mod shadow;
mod shed;
mod tenants;
pub use access_log::AccessLogMetrics;
pub use admin::AdminMetrics;
pub use cull::CullMetrics;
pub use edge::EdgeMetrics;
pub use labels::{code_class, CullResult, EdgeRefusal};
pub use lifecycle::LifecycleMetrics;
pub use proxy::{
    BackendSeries, ProxyMetrics, RouteSeries, RouteSeriesBudget, RouteStats, ROUTE_SERIES_MAX,
};
pub use ratelimit::RateLimitMetrics;
pub use shadow::ShadowMetrics;
pub use shed::{ShedMetrics, ShedReason};
pub use tenants::TenantMetrics;

/// Histogram buckets for an edge proxy: 1 ms to 30 s.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

pub struct Metrics {
    pub registry: Registry,
    pub edge: EdgeMetrics,
    pub shed: ShedMetrics,
    pub proxy: ProxyMetrics,
    pub ratelimit: RateLimitMetrics,
    pub cull: CullMetrics,
    pub admin: AdminMetrics,
    pub lifecycle: LifecycleMetrics,
    pub access_log: AccessLogMetrics,
    pub shadow: ShadowMetrics,
    pub tenants: TenantMetrics,
}

fn must<T>(r: prometheus::Result<T>) -> T {
    match r {
        Ok(v) => v,
        // Names and label sets are static: a failure here is a programming error
        // caught by the unit test `all_contract_metrics_exist`.
        Err(e) => panic!("metric definition error: {e}"),
    }
}

/// Register `metric` in `registry` and hand back a handle on the same series.
fn registered<C: Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<C>,
) -> C {
    let metric = must(metric);
    must(registry.register(Box::new(metric.clone())));
    metric
}

/// A counter by `labels`, registered.
fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

/// A gauge by `labels`, registered.
fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}

impl Metrics {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let registry = Registry::new();
        process::register(&registry);
        Self {
            edge: EdgeMetrics::register(&registry),
            shed: ShedMetrics::register(&registry),
            proxy: ProxyMetrics::register(&registry),
            ratelimit: RateLimitMetrics::register(&registry),
            cull: CullMetrics::register(&registry),
            admin: AdminMetrics::register(&registry),
            lifecycle: LifecycleMetrics::register(&registry),
            access_log: AccessLogMetrics::register(&registry),
            shadow: ShadowMetrics::register(&registry),
            tenants: TenantMetrics::register(&registry),
            registry,
        }
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_contract_metrics_exist() {
        let m = Metrics::new();
        m.proxy
            .record(portcullis_policy::verdict::Outcome::Proxied, "/", 200, 0.01);
        m.proxy
            .record_upstream("app", "127.0.0.1:1", Some(200), Some(0.004));
        m.access_log.set_sampler(|| 7);
        m.edge.client_connections.set(3);
        m.cull
            .backend_culled
            .with_label_values(&["app", "127.0.0.1:1"])
            .set(0);
        m.shadow.rate_limit("burst").inc();
        let text = String::from_utf8(m.render()).expect("utf8");
        assert!(text
            .contains("portcullis_shadow_refusals_total{gate=\"rate_limit\",policy=\"burst\"} 1"));
        for name in [
            "portcullis_requests_total",
            "portcullis_inflight_requests",
            "portcullis_request_duration_seconds",
            "portcullis_backend_culled",
            "portcullis_cull_decisions_total",
            "portcullis_ratelimit_store_errors_total",
            "portcullis_ratelimit_store_late_answers_total",
            "portcullis_ratelimit_store_healthy",
            "portcullis_client_aborts_total",
            "portcullis_concurrency_limit",
            "portcullis_edge_refusals_total",
            "portcullis_upstream_requests_total",
            "portcullis_upstream_duration_seconds",
            "portcullis_tunnels_open",
            "portcullis_access_log_dropped_total",
            "portcullis_client_connections",
        ] {
            assert!(text.contains(name), "missing {name}");
        }
        assert!(text
            .contains("portcullis_requests_total{code=\"2xx\",outcome=\"proxied\",route=\"/\"} 1"));
        assert!(text.contains("portcullis_client_connections 3"));
        m.proxy.init_routes(["default"]);
        let text = String::from_utf8(m.render()).expect("utf8");
        assert!(text.contains(
            "portcullis_requests_total{code=\"5xx\",outcome=\"shed\",route=\"default\"} 0"
        ));
        assert!(text.contains("portcullis_access_log_dropped_total 7"));
        assert!(text.contains(
            "portcullis_upstream_requests_total{backend=\"127.0.0.1:1\",code=\"2xx\",upstream=\"app\"} 1"
        ));
        assert!(text.contains(
            "portcullis_upstream_duration_seconds_bucket{upstream=\"app\",le=\"0.005\"} 1"
        ));
        assert!(!text.contains("le=\"0.0005\""), "buckets start at 1 ms");
        assert_eq!(
            m.proxy
                .requests_total(portcullis_policy::verdict::Outcome::Proxied),
            1
        );
    }
}
