//! Every metric in one place. Label values come from closed enums; an API key
//! is never a label. Hot-path handles are resolved once at start-up, so
//! recording is an atomic add, not a label lookup.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// How the proxy finished a request (`portcullis_requests_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Proxied = 0,
    Shed,
    RateLimited,
    Rejected,
    NoBackend,
    UpstreamError,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Proxied,
        Outcome::Shed,
        Outcome::RateLimited,
        Outcome::Rejected,
        Outcome::NoBackend,
        Outcome::UpstreamError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Proxied => "proxied",
            Outcome::Shed => "shed",
            Outcome::RateLimited => "rate_limited",
            Outcome::Rejected => "rejected",
            Outcome::NoBackend => "no_backend",
            Outcome::UpstreamError => "upstream_error",
        }
    }
}

/// Result of one cull decision (`portcullis_cull_decisions_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CullResult {
    Culled,
    NoToken,
    OverBudget,
    StoreError,
    DryRun,
    Systemic,
    Renewed,
    Readmitted,
}

impl CullResult {
    pub const ALL: [CullResult; 8] = [
        CullResult::Culled,
        CullResult::NoToken,
        CullResult::OverBudget,
        CullResult::StoreError,
        CullResult::DryRun,
        CullResult::Systemic,
        CullResult::Renewed,
        CullResult::Readmitted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CullResult::Culled => "culled",
            CullResult::NoToken => "no_token",
            CullResult::OverBudget => "over_budget",
            CullResult::StoreError => "store_error",
            CullResult::DryRun => "dry_run",
            CullResult::Systemic => "systemic",
            CullResult::Renewed => "renewed",
            CullResult::Readmitted => "readmitted",
        }
    }
}

/// `portcullis_client_aborts_total`: requests whose client hung up before the
/// response was complete (mid-header, mid-body, or while the backend was
/// answering). Normal traffic, not an error: counted here, logged at debug.
///
/// Process-global because one source is Pingora's own log line for a client
/// that hangs up mid-header (see [`crate::logging`]), which is seen before any
/// [`Metrics`] exists; every [`Metrics`] registry exposes this one counter.
pub fn client_aborts() -> &'static IntCounter {
    static CLIENT_ABORTS: std::sync::LazyLock<IntCounter> = std::sync::LazyLock::new(|| {
        must(IntCounter::new(
            "portcullis_client_aborts_total",
            "Requests the client abandoned before the response was complete",
        ))
    });
    &CLIENT_ABORTS
}

/// What the edge refused (`portcullis_edge_refusals_total{reason}`): limits
/// and identity checks that answer before any gate (CONTRACT §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeRefusal {
    /// A connection beyond `max_connections`, closed at once.
    ConnectionLimit = 0,
    /// A PROXY-protocol listener's connection from an untrusted peer.
    ProxyUntrusted,
    /// A missing or malformed PROXY header.
    ProxyInvalid,
    /// A header block slower than `client_header_timeout_ms` (408).
    HeaderTimeout,
    /// A body pause longer than `client_body_timeout_ms` (408).
    BodyTimeout,
    /// A body over `max_request_body_bytes` (413).
    BodyTooLarge,
}

impl EdgeRefusal {
    pub const ALL: [EdgeRefusal; 6] = [
        EdgeRefusal::ConnectionLimit,
        EdgeRefusal::ProxyUntrusted,
        EdgeRefusal::ProxyInvalid,
        EdgeRefusal::HeaderTimeout,
        EdgeRefusal::BodyTimeout,
        EdgeRefusal::BodyTooLarge,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EdgeRefusal::ConnectionLimit => "connection_limit",
            EdgeRefusal::ProxyUntrusted => "proxy_untrusted",
            EdgeRefusal::ProxyInvalid => "proxy_invalid",
            EdgeRefusal::HeaderTimeout => "header_timeout",
            EdgeRefusal::BodyTimeout => "body_timeout",
            EdgeRefusal::BodyTooLarge => "body_too_large",
        }
    }
}

pub struct Metrics {
    edge_refusals: [IntCounter; 6],
    /// Client connections open on the proxy listeners.
    pub client_connections: IntGauge,
    pub registry: Registry,
    requests: [IntCounter; 6],
    durations: [Histogram; 6],
    pub inflight: IntGauge,
    pub backend_culled: IntGaugeVec,
    pub backend_errors: IntCounterVec,
    cull_decisions: IntCounterVec,
    pub cull_tokens_available: IntGauge,
    pub upstream_panic_mode: IntGaugeVec,
    pub ratelimit_store_errors: IntCounter,
    pub ratelimit_store_healthy: IntGauge,
    pub ratelimit_tracked_keys: IntGauge,
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
                "Requests by how the proxy finished them",
            ),
            &["outcome"],
        ));
        let durations_vec = must(HistogramVec::new(
            HistogramOpts::new(
                "portcullis_request_duration_seconds",
                "Time from request headers to the end of the response",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
            &["outcome"],
        ));
        let requests = Outcome::ALL.map(|o| requests_vec.with_label_values(&[o.as_str()]));
        let durations = Outcome::ALL.map(|o| durations_vec.with_label_values(&[o.as_str()]));
        reg(Box::new(requests_vec));
        reg(Box::new(durations_vec));

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
        reg(Box::new(watchdog_breaches.clone()));
        let ready = must(IntGauge::new(
            "portcullis_ready",
            "1 while /readyz answers 200",
        ));
        reg(Box::new(ready.clone()));
        reg(Box::new(client_aborts().clone()));
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
            requests,
            durations,
            inflight,
            backend_culled,
            backend_errors,
            cull_decisions,
            cull_tokens_available,
            upstream_panic_mode,
            ratelimit_store_errors,
            ratelimit_store_healthy,
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

    #[inline]
    pub fn record(&self, outcome: Outcome, seconds: f64) {
        let i = outcome as usize;
        self.requests[i].inc();
        self.durations[i].observe(seconds);
    }

    pub fn edge_refusal(&self, r: EdgeRefusal) {
        self.edge_refusals[r as usize].inc();
    }

    /// The counter itself, for a connection that counts on its own.
    pub fn edge_refusal_counter(&self, r: EdgeRefusal) -> IntCounter {
        self.edge_refusals[r as usize].clone()
    }

    pub fn cull_decision(&self, r: CullResult) {
        self.cull_decisions.with_label_values(&[r.as_str()]).inc();
    }

    pub fn requests_total(&self, outcome: Outcome) -> u64 {
        self.requests[outcome as usize].get()
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
        m.record(Outcome::Proxied, 0.01);
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
            "portcullis_ratelimit_store_healthy",
            "portcullis_client_aborts_total",
            "portcullis_concurrency_limit",
            "portcullis_edge_refusals_total",
            "portcullis_client_connections",
        ] {
            assert!(text.contains(name), "missing {name}");
        }
        assert!(text.contains("portcullis_requests_total{outcome=\"proxied\"} 1"));
    }
}
