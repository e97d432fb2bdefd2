//! The proxy's metrics: requests by outcome, route and status class, their durations, the
//! requests sent to each backend, retries and client aborts. The request path records
//! through handles resolved once (per outcome, per route, per backend): an atomic add,
//! not a label look-up.

use super::{code_class, registered, LATENCY_BUCKETS};
use portcullis_policy::verdict::Outcome;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Registry};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The `code` label of each [`class_index`].
const CLASS_LABELS: [&str; 7] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none", "error"];

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

/// A route's figures as a request records them: its `route` label (the access log's
/// and spans'), and its [`RouteStats`] (reached through `Deref`: `series.traffic`), its
/// own or, past [`ROUTE_SERIES_MAX`], those every such route shares. A route has one
/// only once a request was routed to it (`state::Runtime::route_series`): a configured
/// route that never saw a request costs neither series nor traffic window.
#[derive(Debug)]
pub struct RouteSeries {
    pub label: String,
    stats: Arc<RouteStats>,
    /// The budget this series holds a place of, given back when it goes.
    budget: Option<Arc<RouteSeriesBudget>>,
}

/// The `portcullis_requests_total` series of one route label, each resolved
/// on first use and then kept: recording is an atomic add, not a label
/// look-up (hash, lock, clone) per request. A series appears in the
/// exposition exactly when it did with `with_label_values`.
#[derive(Debug)]
pub struct RouteStats {
    /// The `route` label of the series: the route's, or "other".
    label: String,
    requests: [[OnceLock<IntCounter>; 7]; Outcome::ALL.len()],
    /// The route's rate, mix, latency and in-flight for `/status` (shared by
    /// the runtimes of successive reloads while the label stays).
    pub traffic: portcullis_policy::traffic::RouteTraffic,
    /// A reload removed the route ([`ProxyMetrics::forget_route`]): a request still
    /// finishing on the old table must not put its label set back in the registry.
    retired: std::sync::atomic::AtomicBool,
}

impl RouteStats {
    fn new(label: String) -> Arc<Self> {
        Arc::new(Self {
            label,
            requests: Default::default(),
            traffic: Default::default(),
            retired: Default::default(),
        })
    }
}

impl RouteSeries {
    /// A series of its own, outside any [`RouteSeriesBudget`] (the default route's, "none").
    pub fn new(label: String) -> Self {
        Self {
            stats: RouteStats::new(label.clone()),
            label,
            budget: None,
        }
    }
}

impl std::ops::Deref for RouteSeries {
    type Target = RouteStats;

    #[inline]
    fn deref(&self) -> &RouteStats {
        &self.stats
    }
}

impl Drop for RouteSeries {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.live.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Routes that may have series and a traffic window of their own at once
/// ([`RouteSeriesBudget`]): about 90 MB of windows at most, however many routes a
/// client reaches.
pub const ROUTE_SERIES_MAX: usize = 10_000;

/// The bound on routes with series of their own: past `max`, a route's first request
/// gives it the figures every such route shares (series labelled "other", one window;
/// its access-log lines still name it), so a client requesting every one of 100,000
/// routes does not make 100,000 windows. A place is given back when a reload drops a
/// route's series.
#[derive(Debug)]
pub struct RouteSeriesBudget {
    live: AtomicUsize,
    max: usize,
    other: Arc<RouteStats>,
}

impl RouteSeriesBudget {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            live: AtomicUsize::new(0),
            max,
            other: RouteStats::new("other".to_string()),
        })
    }

    /// The series of a route labelled `label`: figures of its own, or the shared ones
    /// when `max` routes have theirs.
    pub fn series(self: &Arc<Self>, label: String) -> Arc<RouteSeries> {
        let taken = self
            .live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            });
        Arc::new(match taken {
            Ok(_) => RouteSeries {
                stats: RouteStats::new(label.clone()),
                label,
                budget: Some(Arc::clone(self)),
            },
            Err(_) => RouteSeries {
                label,
                stats: Arc::clone(&self.other),
                budget: None,
            },
        })
    }

    /// Whether `s` has the shared figures.
    pub fn is_other(&self, s: &RouteSeries) -> bool {
        Arc::ptr_eq(&s.stats, &self.other)
    }

    /// The figures the routes past the bound share.
    pub fn other(&self) -> &RouteStats {
        &self.other
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
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

pub struct ProxyMetrics {
    requests: IntCounterVec,
    /// Per outcome, for the watchdog (the labelled counter is split by route and code).
    outcome_totals: [AtomicU64; Outcome::ALL.len()],
    durations: [Histogram; Outcome::ALL.len()],
    upstream_requests: IntCounterVec,
    upstream_durations: HistogramVec,
    /// `portcullis_client_aborts_total`: requests whose client hung up before the
    /// response was complete (mid-header, counted by `edge::stream`; mid-body or while
    /// the backend was answering, from the downstream error Pingora hands to
    /// `fail_to_proxy`). Normal traffic, not an error: logged at debug.
    pub client_aborts: IntCounter,
    /// Retries on another backend, by `result` = sent | budget_exhausted.
    retries: IntCounterVec,
    /// The bound on routes with series of their own (shared by every runtime).
    pub route_budget: Arc<RouteSeriesBudget>,
}

impl ProxyMetrics {
    /// Define the proxy's series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let requests = super::counter_vec(
            registry,
            "portcullis_requests_total",
            "Requests by how the proxy finished them, route and status class",
            &["outcome", "route", "code"],
        );
        let durations_vec = registered(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "portcullis_request_duration_seconds",
                    "Time from request headers to the end of the response",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["outcome"],
            ),
        );
        let durations = Outcome::ALL.map(|o| durations_vec.with_label_values(&[o.as_str()]));
        let (upstream_requests, upstream_durations) = register_upstream(registry);
        let client_aborts = registered(
            registry,
            IntCounter::new(
                "portcullis_client_aborts_total",
                "Requests the client abandoned before the response was complete",
            ),
        );
        let retries = super::counter_vec(
            registry,
            "portcullis_retries_total",
            "Retries on another backend by upstream and result (sent, budget_exhausted)",
            &["upstream", "result"],
        );
        Self {
            requests,
            outcome_totals: Default::default(),
            durations,
            upstream_requests,
            upstream_durations,
            client_aborts,
            retries,
            route_budget: RouteSeriesBudget::new(ROUTE_SERIES_MAX),
        }
    }

    /// Create the series of `upstream` and its `backends` that appear with their first
    /// event, at 0 (a family present from start, CONTRACT §23): the retries by result,
    /// the upstream's latency histogram, and each backend's 2xx responses. Called at each
    /// scrape for the upstreams in force (a lookup once they exist).
    pub fn init_upstream<'a>(&self, upstream: &str, backends: impl IntoIterator<Item = &'a str>) {
        for result in ["sent", "budget_exhausted"] {
            self.retries.with_label_values(&[upstream, result]);
        }
        self.upstream_durations.with_label_values(&[upstream]);
        for backend in backends {
            self.upstream_requests
                .with_label_values(&[upstream, backend, "2xx"]);
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

    /// [`ProxyMetrics::record`] through the route's cached series.
    pub fn record_route(&self, series: &RouteSeries, outcome: Outcome, status: u16, seconds: f64) {
        let i = outcome as usize;
        let stats = &series.stats;
        stats.requests[i][class_index(Some(status))]
            .get_or_init(|| {
                let labels = [outcome.as_str(), &stats.label, code_class(status)];
                if stats.retired.load(Ordering::Relaxed) {
                    // counted, never exposed
                    if let Ok(c) = IntCounter::new("portcullis_requests_total", "retired") {
                        return c;
                    }
                }
                self.requests.with_label_values(&labels)
            })
            .inc();
        self.outcome_totals[i].fetch_add(1, Ordering::Relaxed);
        self.durations[i].observe(seconds);
    }

    /// [`ProxyMetrics::record_upstream`] through the backend's cached series.
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

    /// Drop the `portcullis_requests_total` series `series` created (a reload removed
    /// its route): the registry no longer keeps its label set. A request still finishing
    /// on the old table counts on the handles it holds, no longer exposed.
    pub fn forget_route(&self, series: &RouteSeries) {
        let stats = &series.stats;
        stats.retired.store(true, Ordering::Relaxed);
        for (outcome, classes) in Outcome::ALL.iter().zip(&stats.requests) {
            for (i, cell) in classes.iter().enumerate() {
                if cell.get().is_some() {
                    let _ = self.requests.remove_label_values(&[
                        outcome.as_str(),
                        &stats.label,
                        CLASS_LABELS[i],
                    ]);
                }
            }
        }
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

    /// Requests finished since start, whatever their outcome (the fleet caps' traffic).
    pub fn requests_seen(&self) -> u64 {
        self.outcome_totals
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    pub fn requests_total(&self, outcome: Outcome) -> u64 {
        self.outcome_totals[outcome as usize].load(Ordering::Relaxed)
    }
}

/// `portcullis_upstream_requests_total` and `portcullis_upstream_duration_seconds`.
fn register_upstream(registry: &Registry) -> (IntCounterVec, HistogramVec) {
    let requests = super::counter_vec(
        registry,
        "portcullis_upstream_requests_total",
        "Requests sent to a backend, by the status class it answered (error: no answer)",
        &["upstream", "backend", "code"],
    );
    let durations = registered(
        registry,
        HistogramVec::new(
            HistogramOpts::new(
                "portcullis_upstream_duration_seconds",
                "Time from choosing a backend to its response header",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["upstream"],
        ),
    );
    (requests, durations)
}
