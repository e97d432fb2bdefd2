//! Load shedding's metrics: requests in flight, the cap in force, and the requests an
//! upstream's bulkhead shed.

use super::registered;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

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
            upstream_concurrency_limit,
            bulkhead_shed,
        }
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
