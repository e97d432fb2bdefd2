//! Observability beside the request path: the JSON access log
//! ([`access_log`]), W3C trace context ([`trace`]), the admin HTML status page
//! ([`status_page`]), the journal of recent cull decisions it shows
//! ([`journal`]), OTLP/HTTP span export ([`otlp`]) and the per-route and
//! per-backend traffic figures of `/status` ([`traffic`]). Metrics live in
//! [`crate::metrics`].

pub mod access_log;
pub mod journal;
pub mod otlp;
pub mod status_page;
pub mod syslog;
pub mod time;
pub mod trace;
pub mod traffic;

pub use access_log::{AccessLog, AccessRecord};
pub use journal::CullJournal;
pub use trace::TraceContext;

/// The observability state a [`crate::state::Shared`] holds.
pub struct Observe {
    pub access_log: AccessLog,
    pub culls: CullJournal,
    /// `None` without `[tracing] otlp_endpoint` (or when it cannot start).
    pub spans: Option<otlp::SpanSink>,
    /// `portcullis_trace_spans_dropped_total` (registered by [`Self::register`]).
    spans_dropped: prometheus::IntCounter,
}

impl Observe {
    pub fn new(
        access_log: &crate::config::AccessLogSettings,
        tracing: &crate::config::TracingSettings,
    ) -> Self {
        let spans_dropped = prometheus::IntCounter::new(
            "portcullis_trace_spans_dropped_total",
            "Trace spans dropped: the export queue was full or the OTLP endpoint failed",
        )
        .unwrap_or_else(|e| panic!("metric definition error: {e}"));
        let spans = tracing.otlp_endpoint.as_deref().and_then(|endpoint| {
            otlp::SpanSink::start(endpoint, spans_dropped.clone())
                .inspect_err(|e| {
                    tracing::error!(event = "otlp", error = %e, "span export is off");
                })
                .ok()
        });
        if let (Some(_), Some(endpoint)) = (&spans, &tracing.otlp_endpoint) {
            tracing::info!(event = "otlp", endpoint = %endpoint, "exporting spans over OTLP/HTTP");
        }
        Self {
            access_log: AccessLog::new(access_log),
            culls: CullJournal::default(),
            spans,
            spans_dropped,
        }
    }

    /// Expose this module's own counters in `registry`.
    pub fn register(&self, registry: &prometheus::Registry) {
        if let Err(e) = registry.register(Box::new(self.spans_dropped.clone())) {
            tracing::error!(error = %e, "cannot register portcullis_trace_spans_dropped_total");
        }
    }

    /// The share of new traces to sample: the config's `[tracing] sample`
    /// when spans are exported, else 0 (nothing records them).
    pub fn new_trace_sample(&self, tracing: &crate::config::TracingSettings) -> f64 {
        if self.spans.is_some() {
            tracing.sample
        } else {
            0.0
        }
    }

    /// Flush the access log and queued spans (at exit).
    pub fn close(&self) {
        self.access_log.close();
        if let Some(s) = &self.spans {
            s.shutdown();
        }
    }
}

/// The `route` label and log field: the route's host and path prefix as
/// configured (bounded by the config, never a request value).
pub fn route_label(route: &crate::config::Route) -> std::borrow::Cow<'_, str> {
    match (&route.host, route.path_prefix.as_str()) {
        (None, "") => "default".into(),
        (None, p) => p.into(),
        (Some(h), p) => format!("{h}{p}").into(),
    }
}
