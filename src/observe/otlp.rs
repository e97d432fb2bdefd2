//! OTLP/HTTP span export (`[tracing] otlp_endpoint`, `sample`).
//!
//! One server span per request, built when the request finishes: its trace id
//! is the request's W3C trace id (the access log's `trace_id`), its span id is
//! the parent id the proxy sent upstream in `traceparent`, and its parent is
//! the client's span when the client sent a valid `traceparent`.
//!
//! Attributes: method, route label, status code, outcome, upstream, backend,
//! protocol and request id. Never the path's query string, an API key, or an
//! `Authorization` or `Cookie` value: no header value is read here at all.
//!
//! Export goes through the `opentelemetry_sdk` batch processor (its own thread,
//! a bounded queue) and the `opentelemetry-otlp` HTTP/protobuf exporter; the
//! request path only hands over a finished span. Spans that cannot be
//! exported are dropped and counted in `portcullis_trace_spans_dropped_total`:
//! spans refused because the queue is full (the exporter is slow or the
//! endpoint hangs) and spans whose export failed (the endpoint is down).

use super::access_log::Exchange;
use super::trace::TraceContext;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanEvents, SpanExporter, SpanLinks,
    SpanProcessor,
};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Spans waiting for export, at most (beyond this they are dropped and counted).
const QUEUE_SPANS: usize = 8192;
/// Spans per OTLP request.
const BATCH_SPANS: usize = 512;
/// How long spans wait for a batch to fill before they are sent anyway.
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// An export that takes longer fails (its spans are dropped and counted).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The collector URL spans are posted to: `endpoint` as configured when its
/// path already ends in `/v1/traces`, else with `/v1/traces` appended (as
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is read).
pub fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    }
}

/// What one finished request contributes to its span.
pub struct ServerSpan<'a> {
    pub trace: TraceContext,
    pub exchange: Exchange<'a>,
    pub start: SystemTime,
    pub end: SystemTime,
}

/// Counts what the exporter finishes with and what it fails to send.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    pending: Arc<AtomicUsize>,
    dropped: IntCounter,
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        let _ = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                Some(p.saturating_sub(n))
            });
        match &result {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(event = "otlp", "span export works again");
                }
            }
            Err(e) => {
                self.dropped.inc_by(n as u64);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        event = "otlp",
                        error = %e,
                        "span export failed; spans are dropped and counted in \
                         portcullis_trace_spans_dropped_total until it works again"
                    );
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The span exporter: cheap to call from the request path.
pub struct SpanSink {
    processor: BatchSpanProcessor,
    /// Spans handed to the processor and not yet exported or failed.
    pending: Arc<AtomicUsize>,
    dropped: IntCounter,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for SpanSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanSink")
            .field("pending", &self.pending.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl SpanSink {
    /// Starts the exporter thread for `endpoint` (validated at load).
    /// `dropped` is `portcullis_trace_spans_dropped_total`.
    pub fn start(endpoint: &str, dropped: IntCounter) -> Result<Self, String> {
        let url = traces_url(endpoint);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url.as_str())
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(Default::default())
            .build()
            .map_err(|e| format!("cannot build the OTLP exporter for {url}: {e}"))?;
        let pending = Arc::new(AtomicUsize::new(0));
        let counted = Counted {
            inner: exporter,
            pending: Arc::clone(&pending),
            dropped: dropped.clone(),
            failing: AtomicBool::new(false),
        };
        let mut processor = BatchSpanProcessor::builder(counted)
            .with_batch_config(
                BatchConfigBuilder::default()
                    // Larger than our own bound: the processor never drops silently.
                    .with_max_queue_size(QUEUE_SPANS + BATCH_SPANS)
                    .with_max_export_batch_size(BATCH_SPANS)
                    .with_scheduled_delay(BATCH_DELAY)
                    .build(),
            )
            .build();
        processor.set_resource(
            &Resource::builder_empty()
                .with_service_name("portcullis")
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        );
        let scope = InstrumentationScope::builder("portcullis")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Ok(Self {
            processor,
            pending,
            dropped,
            scope,
        })
    }

    /// Queue one finished request's span; never blocks. Dropped and counted
    /// when `QUEUE_SPANS` spans already wait for export.
    pub fn record(&self, s: &ServerSpan<'_>) {
        let queued = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p < QUEUE_SPANS).then_some(p + 1)
            });
        if queued.is_err() {
            self.dropped.inc();
            return;
        }
        self.processor.on_end(span_data(s, self.scope.clone()));
    }

    /// Spans dropped since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Export what is queued and stop the exporter thread (at exit).
    pub fn shutdown(&self) {
        if let Err(e) = self.processor.shutdown_with_timeout(EXPORT_TIMEOUT) {
            tracing::warn!(event = "otlp", error = %e, "span exporter shutdown");
        }
    }
}

/// The OTLP span for one request.
pub fn span_data(s: &ServerSpan<'_>, scope: InstrumentationScope) -> SpanData {
    let (tc, x) = (&s.trace, &s.exchange);
    let context = SpanContext::new(
        TraceId::from(tc.trace_id),
        SpanId::from(tc.span_id),
        TraceFlags::new(tc.flags).with_sampled(true),
        false,
        TraceState::NONE,
    );
    let name: Cow<'static, str> = if x.route.is_empty() {
        Cow::Owned(x.method.to_string())
    } else {
        Cow::Owned(format!("{} {}", x.method, x.route))
    };
    let status = if x.status >= 500 || x.status == 0 {
        Status::error("")
    } else {
        Status::Unset
    };
    let mut attributes = vec![
        KeyValue::new("http.request.method", x.method.to_string()),
        KeyValue::new("http.route", x.route.to_string()),
        KeyValue::new("http.response.status_code", i64::from(x.status)),
        KeyValue::new("network.protocol.name", "http"),
        KeyValue::new("portcullis.protocol", x.protocol.to_string()),
        KeyValue::new("portcullis.outcome", x.outcome.to_string()),
        KeyValue::new("portcullis.request_id", x.request_id.to_string()),
    ];
    if !x.upstream.is_empty() {
        attributes.push(KeyValue::new("portcullis.upstream", x.upstream.to_string()));
    }
    if !x.backend.is_empty() {
        attributes.push(KeyValue::new("portcullis.backend", x.backend.to_string()));
    }
    SpanData {
        span_context: context,
        parent_span_id: SpanId::from(tc.parent_id),
        parent_span_is_remote: tc.parent_id != 0,
        span_kind: SpanKind::Server,
        name,
        start_time: s.start,
        end_time: s.end,
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_appended_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("https://c/otlp/v1/traces"),
            "https://c/otlp/v1/traces"
        );
    }

    #[test]
    fn the_span_carries_the_propagated_ids() {
        let tc = TraceContext {
            trace_id: 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736,
            span_id: 0x1122_3344_5566_7788,
            parent_id: 0x00f0_67aa_0ba9_02b7,
            flags: 1,
            continued: true,
        };
        let now = SystemTime::now();
        let d = span_data(
            &ServerSpan {
                trace: tc,
                exchange: Exchange {
                    request_id: "r1",
                    method: "GET",
                    protocol: "HTTP/1.1",
                    status: 502,
                    outcome: "upstream_error",
                    route: "/api",
                    upstream: "app",
                    backend: "127.0.0.1:9",
                },
                start: now - Duration::from_millis(3),
                end: now,
            },
            InstrumentationScope::builder("t").build(),
        );
        assert_eq!(
            d.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(d.span_context.span_id().to_string(), "1122334455667788");
        assert_eq!(d.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(d.parent_span_is_remote);
        assert_eq!(d.span_kind, SpanKind::Server);
        assert_eq!(d.name, "GET /api");
        assert!(matches!(d.status, Status::Error { .. }));
        let code = d
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "http.response.status_code")
            .map(|kv| kv.value.to_string());
        assert_eq!(code.as_deref(), Some("502"));
    }
}
