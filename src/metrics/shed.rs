//! Load shedding's metrics: requests in flight, the cap in force, and the requests an
//! upstream's bulkhead shed.

use super::registered;
use portcullis_policy::shed::Priority;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Why load shedding refused a request (`portcullis_shed_total`'s `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Its class's share of the cap was full (no queue).
    Cap = 0,
    /// It waited `queue_timeout_ms` (or CoDel shed it: it waited longest while the queue
    /// stood).
    QueueTimeout = 1,
    /// `max_queue` requests were waiting already.
    QueueFull = 2,
}

impl ShedReason {
    pub const ALL: [ShedReason; 3] = [Self::Cap, Self::QueueTimeout, Self::QueueFull];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cap => "cap",
            Self::QueueTimeout => "queue_timeout",
            Self::QueueFull => "queue_full",
        }
    }
}

pub struct ShedMetrics {
    /// Copied from the shedder at each scrape.
    pub inflight: IntGauge,
    /// The load-shedding cap now in force (learned when adaptive; 0 = no cap).
    pub concurrency_limit: IntGauge,
    /// `portcullis_concurrency_limit{upstream}`: the cap an `adaptive = true` upstream
    /// learned (CONTRACT §15), in the same family as the global series (which keeps no
    /// label).
    pub upstream_concurrency_limit: IntGaugeVec,
    /// Requests shed by an upstream's bulkhead (`max_inflight`).
    pub bulkhead_shed: IntCounterVec,
    /// `portcullis_shed_total{class,reason}`, resolved once (class × reason).
    shed_total: [[IntCounter; 3]; 3],
    /// `portcullis_queue_waiting{class}`: copied from the shedder at each scrape.
    pub queue_waiting: IntGaugeVec,
    /// `portcullis_queue_wait_seconds`: how long admitted requests waited for a slot.
    pub queue_wait: Histogram,
    /// `portcullis_queue_abandoned_total`: waiting requests whose client went away.
    pub left_queue: IntCounter,
    /// `portcullis_upstream_queue_waiting{upstream}` (copied at each scrape).
    pub upstream_queue_waiting: IntGaugeVec,
    /// `portcullis_upstream_queue_shed_total{upstream,reason}`.
    pub upstream_queue_shed: IntCounterVec,
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
        let limits = registered(registry, ConcurrencyLimits::new());
        let (concurrency_limit, upstream_concurrency_limit) = (limits.global, limits.upstreams);
        let bulkhead_shed = super::counter_vec(
            registry,
            "portcullis_bulkhead_shed_total",
            "Requests shed (503) because their upstream reached max_inflight",
            &["upstream"],
        );
        let shed = super::counter_vec(
            registry,
            "portcullis_shed_total",
            "Requests shed (503) by load shedding, by class and reason: cap (the \
                     class's share was full), queue_timeout (waited queue_timeout_ms, or \
                     shed by CoDel), queue_full (max_queue were waiting)",
            &["class", "reason"],
        );
        let shed_total = Priority::ALL
            .map(|c| ShedReason::ALL.map(|r| shed.with_label_values(&[c.as_str(), r.as_str()])));
        let queue_waiting = super::gauge_vec(
            registry,
            "portcullis_queue_waiting",
            "Requests waiting for a slot at the cap, by class",
            &["class"],
        );
        for c in Priority::ALL {
            queue_waiting.with_label_values(&[c.as_str()]).set(0);
        }
        let queue_wait = registered(
            registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "portcullis_queue_wait_seconds",
                    "How long requests waited in the queue at the cap before their slot",
                )
                .buckets(super::LATENCY_BUCKETS.to_vec()),
            ),
        );
        let left_queue = registered(
            registry,
            IntCounter::new(
                "portcullis_queue_abandoned_total",
                "Requests whose client went away while they waited in a queue (never sent upstream)",
            ),
        );
        let upstream_queue_waiting = super::gauge_vec(
            registry,
            "portcullis_upstream_queue_waiting",
            "Requests waiting for room in an upstream (max_conn, max_inflight)",
            &["upstream"],
        );
        let upstream_queue_shed = super::counter_vec(
            registry,
            "portcullis_upstream_queue_shed_total",
            "Requests shed (503) after waiting for room in an upstream: \
                     queue_timeout or queue_full",
            &["upstream", "reason"],
        );
        Self {
            inflight,
            concurrency_limit,
            upstream_concurrency_limit,
            bulkhead_shed,
            shed_total,
            queue_waiting,
            queue_wait,
            left_queue,
            upstream_queue_waiting,
            upstream_queue_shed,
        }
    }

    /// Count one request shed.
    #[inline]
    pub fn shed(&self, class: Priority, reason: ShedReason) {
        self.shed_total[class.index()][reason as usize].inc();
    }
}

const LIMIT_NAME: &str = "portcullis_concurrency_limit";
const LIMIT_HELP: &str =
    "Load-shedding cap in force (learned from latency with shedding.adaptive; \
     0 = none); with upstream: the cap an adaptive upstream learned";

/// `portcullis_concurrency_limit` as one family: the global series without labels (as
/// before) and one series per adaptive upstream with `upstream`. A registry refuses two
/// collectors of one name with different labels, so one collector reports both.
#[derive(Clone)]
struct ConcurrencyLimits {
    global: IntGauge,
    upstreams: IntGaugeVec,
    desc: Vec<Desc>,
}

impl ConcurrencyLimits {
    fn new() -> prometheus::Result<Self> {
        let global = IntGauge::new(LIMIT_NAME, LIMIT_HELP)?;
        let upstreams = IntGaugeVec::new(Opts::new(LIMIT_NAME, LIMIT_HELP), &["upstream"])?;
        let desc = global.desc().into_iter().cloned().collect();
        Ok(Self {
            global,
            upstreams,
            desc,
        })
    }
}

impl Collector for ConcurrencyLimits {
    fn desc(&self) -> Vec<&Desc> {
        self.desc.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.global.collect();
        let more: Vec<_> = self
            .upstreams
            .collect()
            .into_iter()
            .flat_map(|mut f| f.take_metric())
            .collect();
        if let Some(f) = families.first_mut() {
            f.mut_metric().extend(more);
        }
        families
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn one_family_with_the_global_series_and_one_per_adaptive_upstream() {
        let registry = Registry::new();
        let m = ShedMetrics::register(&registry);
        m.concurrency_limit.set(1024);
        m.upstream_concurrency_limit
            .with_label_values(&["slow"])
            .set(8);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(
            text.contains("\nportcullis_concurrency_limit 1024\n"),
            "{text}"
        );
        assert!(
            text.contains("portcullis_concurrency_limit{upstream=\"slow\"} 8"),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE portcullis_concurrency_limit ").count(),
            1
        );
    }
}
