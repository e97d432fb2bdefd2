//! Every metric in one place. Label values come from closed enums; an API key
//! is never a label. Hot-path handles are resolved once at start-up, so
//! recording is an atomic add, not a label lookup.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

mod labels;
pub use labels::*;

/// Histogram buckets for an edge proxy: 1 ms to 30 s.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Read from elsewhere at scrape time: access-log lines dropped since start.
type Sampler = Box<dyn Fn() -> u64 + Send + Sync>;

/// Exposes `portcullis_access_log_dropped_total`, read from the access-log
/// writer (which owns the count) at each scrape.
struct Sampled {
    source: Arc<OnceLock<Sampler>>,
    dropped: IntCounter,
}

impl Collector for Sampled {
    fn desc(&self) -> Vec<&Desc> {
        self.dropped.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if let Some(read) = self.source.get() {
            let dropped = read();
            self.dropped
                .inc_by(dropped.saturating_sub(self.dropped.get()));
        }
        self.dropped.collect()
    }
}

/// Index of [`code_class`] (and "error" for no answer) in a series cache.
fn class_index(status: Option<u16>) -> usize {
    match status {
        None => 6,
        Some(100..=199) => 0,
        Some(200..=299) => 1,
        Some(300..=399) => 2,
        Some(400..=499) => 3,
        Some(500..=599) => 4,
        Some(_) => 5,
    }
}

/// The `portcullis_requests_total` series of one route label, each resolved
/// on first use and then kept: recording is an atomic add, not a label
/// look-up (hash, lock, clone) per request. A series appears in the
/// exposition exactly when it did with `with_label_values`.
#[derive(Debug)]
pub struct RouteSeries {
    pub label: String,
    requests: [[OnceLock<IntCounter>; 7]; 6],
}

impl RouteSeries {
    pub fn new(label: String) -> Self {
        Self {
            label,
            requests: Default::default(),
        }
    }
}

/// The `portcullis_upstream_*` series of one backend, resolved on first use
/// (see [`RouteSeries`]). The labels of a backend never change: a backend's
/// state is keyed by its upstream's name and its address.
#[derive(Debug, Default)]
pub struct BackendSeries {
    requests: [OnceLock<IntCounter>; 7],
    duration: OnceLock<Histogram>,
}

pub struct Metrics {
    edge_refusals: [IntCounter; EdgeRefusal::ALL.len()],
    /// Client connections open on the proxy listeners.
    pub client_connections: IntGauge,
    pub registry: Registry,
    requests: IntCounterVec,
    /// Per outcome, for the watchdog (the labelled counter is split by route and code).
    outcome_totals: [AtomicU64; 6],
    durations: [Histogram; 6],
    upstream_requests: IntCounterVec,
    upstream_durations: HistogramVec,
    pub tunnels_open: IntGauge,
    /// `portcullis_client_aborts_total`: requests whose client hung up before the
    /// response was complete (mid-header, counted by `edge::stream`; mid-body or while
    /// the backend was answering, from the downstream error Pingora hands to
    /// `fail_to_proxy`). Normal traffic, not an error: logged at debug.
    pub client_aborts: IntCounter,
    sampled: Arc<OnceLock<Sampler>>,
    pub inflight: IntGauge,
    pub backend_culled: IntGaugeVec,
    pub backend_errors: IntCounterVec,
    cull_decisions: IntCounterVec,
    pub cull_tokens_available: IntGauge,
    pub upstream_panic_mode: IntGaugeVec,
    pub ratelimit_store_errors: IntCounter,
    pub ratelimit_store_late_answers: IntCounter,
    pub ratelimit_store_healthy: IntGauge,
    pub ratelimit_tracked_keys: IntGauge,
    /// Per rate-limit policy, by `result` = allowed | limited | refused_by_other (handles
    /// resolved per reload: see [`crate::ratelimit::DecisionCounters`]).
    pub ratelimit_policy_decisions: IntCounterVec,
    pub config_reloads: IntCounterVec,
    pub watchdog_breaches: IntCounterVec,
    pub ready: IntGauge,
    /// The load-shedding cap now in force (learned when adaptive; 0 = no cap).
    pub concurrency_limit: IntGauge,
    /// Retries on another backend, by `result` = sent | budget_exhausted.
    pub retries: IntCounterVec,
    /// Requests shed by an upstream's bulkhead (`max_inflight`).
    pub bulkhead_shed: IntCounterVec,
}

fn must<T>(r: prometheus::Result<T>) -> T {
    match r {
        Ok(v) => v,
        // Names and label sets below are static: a failure here is a programming error
        // caught by the unit test `all_contract_metrics_exist`.
        Err(e) => panic!("metric definition error: {e}"),
    }
}

impl Metrics {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let registry = Registry::new();
        let reg = |c: Box<dyn prometheus::core::Collector>| must(registry.register(c));

        let requests_vec = must(IntCounterVec::new(
            Opts::new(
                "portcullis_requests_total",
                "Requests by how the proxy finished them, route and status class",
            ),
            &["outcome", "route", "code"],
        ));
        let durations_vec = must(HistogramVec::new(
            HistogramOpts::new(
                "portcullis_request_duration_seconds",
                "Time from request headers to the end of the response",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["outcome"],
        ));
        let durations = Outcome::ALL.map(|o| durations_vec.with_label_values(&[o.as_str()]));
        reg(Box::new(requests_vec.clone()));
        reg(Box::new(durations_vec));
        let upstream_requests = must(IntCounterVec::new(
            Opts::new(
                "portcullis_upstream_requests_total",
                "Requests sent to a backend, by the status class it answered (error: no answer)",
            ),
            &["upstream", "backend", "code"],
        ));
        reg(Box::new(upstream_requests.clone()));
        let upstream_durations = must(HistogramVec::new(
            HistogramOpts::new(
                "portcullis_upstream_duration_seconds",
                "Time from choosing a backend to its response header",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["upstream"],
        ));
        reg(Box::new(upstream_durations.clone()));
        // Moved by the tunnel slots of `edge::tunnel::Tunnels` (owned by `state::Shared`).
        let tunnels_open = must(IntGauge::new(
            "portcullis_tunnels_open",
            "Upgraded connections (WebSocket etc.) currently open",
        ));
        reg(Box::new(tunnels_open.clone()));
        let sampled: Arc<OnceLock<Sampler>> = Arc::new(OnceLock::new());
        reg(Box::new(Sampled {
            source: Arc::clone(&sampled),
            dropped: must(IntCounter::new(
                "portcullis_access_log_dropped_total",
                "Access-log lines dropped because the writer fell behind",
            )),
        }));

        let inflight = must(IntGauge::new(
            "portcullis_inflight_requests",
            "Requests in flight through the proxy",
        ));
        reg(Box::new(inflight.clone()));
        let backend_culled = must(IntGaugeVec::new(
            Opts::new("portcullis_backend_culled", "1 while a backend is culled"),
            &["upstream", "backend"],
        ));
        reg(Box::new(backend_culled.clone()));
        let backend_errors = must(IntCounterVec::new(
            Opts::new(
                "portcullis_backend_errors_total",
                "Errors (5xx, failed connects, timeouts) seen per backend",
            ),
            &["upstream", "backend"],
        ));
        reg(Box::new(backend_errors.clone()));
        let cull_decisions = must(IntCounterVec::new(
            Opts::new(
                "portcullis_cull_decisions_total",
                "Cull decisions by result",
            ),
            &["result"],
        ));
        for r in CullResult::ALL {
            cull_decisions.with_label_values(&[r.as_str()]);
        }
        reg(Box::new(cull_decisions.clone()));
        let cull_tokens_available = must(IntGauge::new(
            "portcullis_cull_tokens_available",
            "Fleet-wide cull tokens available at the last check",
        ));
        reg(Box::new(cull_tokens_available.clone()));
        let upstream_panic_mode = must(IntGaugeVec::new(
            Opts::new(
                "portcullis_upstream_panic_mode",
                "1 while an upstream has no eligible backend and routes to all (fail-open)",
            ),
            &["upstream"],
        ));
        reg(Box::new(upstream_panic_mode.clone()));
        let ratelimit_store_errors = must(IntCounter::new(
            "portcullis_ratelimit_store_errors_total",
            "Failed or timed-out rate-limit store round trips",
        ));
        reg(Box::new(ratelimit_store_errors.clone()));
        let ratelimit_store_late_answers = must(IntCounter::new(
            "portcullis_ratelimit_store_late_answers_total",
            "Rate-limit store answers that came back a flush interval or more after their batch was sent (the fleet share may then admit past the limit)",
        ));
        reg(Box::new(ratelimit_store_late_answers.clone()));
        let ratelimit_store_healthy = must(IntGauge::new(
            "portcullis_ratelimit_store_healthy",
            "1 while the last rate-limit store round trip succeeded",
        ));
        ratelimit_store_healthy.set(1);
        reg(Box::new(ratelimit_store_healthy.clone()));
        let ratelimit_tracked_keys = must(IntGauge::new(
            "portcullis_ratelimit_tracked_keys",
            "API keys tracked in memory",
        ));
        reg(Box::new(ratelimit_tracked_keys.clone()));
        let ratelimit_policy_decisions = must(IntCounterVec::new(
            Opts::new(
                "portcullis_ratelimit_policy_decisions_total",
                "Rate-limit decisions per policy: allowed (admitted by every policy and counted), limited (refused by this policy), refused_by_other (admitted here, refused by another policy; not counted)",
            ),
            &["policy", "result"],
        ));
        reg(Box::new(ratelimit_policy_decisions.clone()));
        let config_reloads = must(IntCounterVec::new(
            Opts::new(
                "portcullis_config_reloads_total",
                "Config reloads by result",
            ),
            &["result"],
        ));
        for r in ["ok", "error"] {
            config_reloads.with_label_values(&[r]);
        }
        reg(Box::new(config_reloads.clone()));
        let watchdog_breaches = must(IntCounterVec::new(
            Opts::new(
                "portcullis_watchdog_breaches_total",
                "Self-watchdog breaches by what was breached and the budget's answer",
            ),
            &["kind", "result"],
        ));
        // Every (kind, result) exists from start at 0, so a dashboard or an
        // alert over it has data before the first breach.
        for kind in ["rss", "error_rate", "stall"] {
            for result in ["granted", "no_token", "no_store", "store_error"] {
                watchdog_breaches.with_label_values(&[kind, result]);
            }
        }
        reg(Box::new(watchdog_breaches.clone()));
        let ready = must(IntGauge::new(
            "portcullis_ready",
            "1 while /readyz answers 200",
        ));
        reg(Box::new(ready.clone()));
        let client_aborts = must(IntCounter::new(
            "portcullis_client_aborts_total",
            "Requests the client abandoned before the response was complete",
        ));
        reg(Box::new(client_aborts.clone()));
        let concurrency_limit = must(IntGauge::new(
            "portcullis_concurrency_limit",
            "Load-shedding cap in force (learned from latency with shedding.adaptive; 0 = none)",
        ));
        reg(Box::new(concurrency_limit.clone()));
        let retries = must(IntCounterVec::new(
            Opts::new(
                "portcullis_retries_total",
                "Retries on another backend by upstream and result (sent, budget_exhausted)",
            ),
            &["upstream", "result"],
        ));
        reg(Box::new(retries.clone()));
        let bulkhead_shed = must(IntCounterVec::new(
            Opts::new(
                "portcullis_bulkhead_shed_total",
                "Requests shed (503) because their upstream reached max_inflight",
            ),
            &["upstream"],
        ));
        reg(Box::new(bulkhead_shed.clone()));
        let edge_vec = must(IntCounterVec::new(
            Opts::new(
                "portcullis_edge_refusals_total",
                "Connections and requests the edge refused before any gate, by reason",
            ),
            &["reason"],
        ));
        let edge_refusals = EdgeRefusal::ALL.map(|r| edge_vec.with_label_values(&[r.as_str()]));
        reg(Box::new(edge_vec));
        let client_connections = must(IntGauge::new(
            "portcullis_client_connections",
            "Client connections open on the proxy listeners",
        ));
        reg(Box::new(client_connections.clone()));

        Self {
            edge_refusals,
            client_connections,
            registry,
            requests: requests_vec,
            outcome_totals: Default::default(),
            durations,
            upstream_requests,
            upstream_durations,
            tunnels_open,
            client_aborts,
            sampled,
            inflight,
            backend_culled,
            backend_errors,
            cull_decisions,
            cull_tokens_available,
            upstream_panic_mode,
            ratelimit_store_errors,
            ratelimit_store_late_answers,
            ratelimit_store_healthy,
            ratelimit_policy_decisions,
            ratelimit_tracked_keys,
            config_reloads,
            watchdog_breaches,
            ready,
            concurrency_limit,
            retries,
            bulkhead_shed,
        }
    }

    /// Count a retry decision for `upstream` (`sent` or `budget_exhausted`).
    pub fn retry(&self, upstream: &str, sent: bool) {
        let result = if sent { "sent" } else { "budget_exhausted" };
        self.retries.with_label_values(&[upstream, result]).inc();
    }

    /// One finished request. `route` comes from the config (bounded), never
    /// from a request value.
    #[inline]
    pub fn record(&self, outcome: Outcome, route: &str, status: u16, seconds: f64) {
        let i = outcome as usize;
        self.requests
            .with_label_values(&[outcome.as_str(), route, code_class(status)])
            .inc();
        self.outcome_totals[i].fetch_add(1, Ordering::Relaxed);
        self.durations[i].observe(seconds);
    }

    /// [`Metrics::record`] through the route's cached series.
    pub fn record_route(&self, series: &RouteSeries, outcome: Outcome, status: u16, seconds: f64) {
        let i = outcome as usize;
        series.requests[i][class_index(Some(status))]
            .get_or_init(|| {
                self.requests.with_label_values(&[
                    outcome.as_str(),
                    &series.label,
                    code_class(status),
                ])
            })
            .inc();
        self.outcome_totals[i].fetch_add(1, Ordering::Relaxed);
        self.durations[i].observe(seconds);
    }

    /// [`Metrics::record_upstream`] through the backend's cached series.
    pub fn record_backend(
        &self,
        series: &BackendSeries,
        upstream: &str,
        backend: &str,
        status: Option<u16>,
        seconds: Option<f64>,
    ) {
        series.requests[class_index(status)]
            .get_or_init(|| {
                let code = status.map_or("error", code_class);
                self.upstream_requests
                    .with_label_values(&[upstream, backend, code])
            })
            .inc();
        if let Some(s) = seconds {
            series
                .duration
                .get_or_init(|| self.upstream_durations.with_label_values(&[upstream]))
                .observe(s);
        }
    }

    pub fn edge_refusal(&self, r: EdgeRefusal) {
        self.edge_refusals[r as usize].inc();
    }

    /// The counter itself, for a connection that counts on its own.
    pub fn edge_refusal_counter(&self, r: EdgeRefusal) -> IntCounter {
        self.edge_refusals[r as usize].clone()
    }

    /// Create the `portcullis_requests_total` series each outcome usually
    /// takes on each of `routes` at 0, so that dashboards and alerts see every
    /// gate before its first request (series are otherwise created lazily).
    pub fn init_routes<'a>(&self, routes: impl IntoIterator<Item = &'a str>) {
        for route in routes {
            for (outcome, code) in [
                (Outcome::Proxied, "2xx"),
                (Outcome::Shed, "5xx"),
                (Outcome::RateLimited, "4xx"),
                (Outcome::Rejected, "4xx"),
                (Outcome::NoBackend, "5xx"),
                (Outcome::UpstreamError, "5xx"),
            ] {
                self.requests
                    .with_label_values(&[outcome.as_str(), route, code]);
            }
        }
    }

    /// One request sent to a backend: `status` is its answer, `None` when it
    /// gave none (connect failure, timeout, reset).
    pub fn record_upstream(
        &self,
        upstream: &str,
        backend: &str,
        status: Option<u16>,
        seconds: Option<f64>,
    ) {
        let code = status.map_or("error", code_class);
        self.upstream_requests
            .with_label_values(&[upstream, backend, code])
            .inc();
        if let Some(s) = seconds {
            self.upstream_durations
                .with_label_values(&[upstream])
                .observe(s);
        }
    }

    /// Where `portcullis_access_log_dropped_total` is read from (set once, at start).
    pub fn set_sampler(&self, read: impl Fn() -> u64 + Send + Sync + 'static) {
        let _ = self.sampled.set(Box::new(read));
    }

    pub fn cull_decision(&self, r: CullResult) {
        self.cull_decisions.with_label_values(&[r.as_str()]).inc();
    }

    pub fn requests_total(&self, outcome: Outcome) -> u64 {
        self.outcome_totals[outcome as usize].load(Ordering::Relaxed)
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
        m.record(Outcome::Proxied, "/", 200, 0.01);
        m.record_upstream("app", "127.0.0.1:1", Some(200), Some(0.004));
        m.set_sampler(|| 7);
        m.client_connections.set(3);
        m.backend_culled
            .with_label_values(&["app", "127.0.0.1:1"])
            .set(0);
        let text = String::from_utf8(m.render()).expect("utf8");
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
        m.init_routes(["default"]);
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
        assert_eq!(m.requests_total(Outcome::Proxied), 1);
    }
}
