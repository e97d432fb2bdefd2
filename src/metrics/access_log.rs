//! The access log's metric, `portcullis_access_log_dropped_total`: the writer owns the
//! count; the registry reads it at each scrape. (The trace exporter registers its own
//! series: `observe::Observe::register`.)

use super::must;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, Registry};
use std::sync::{Arc, OnceLock};

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

pub struct AccessLogMetrics {
    sampled: Arc<OnceLock<Sampler>>,
}

impl AccessLogMetrics {
    /// Define the access log's series and register it in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let sampled: Arc<OnceLock<Sampler>> = Arc::new(OnceLock::new());
        must(registry.register(Box::new(Sampled {
            source: Arc::clone(&sampled),
            dropped: must(IntCounter::new(
                "portcullis_access_log_dropped_total",
                "Access-log lines dropped because the writer fell behind",
            )),
        })));
        Self { sampled }
    }

    /// Where `portcullis_access_log_dropped_total` is read from (set once, at start).
    pub fn set_sampler(&self, read: impl Fn() -> u64 + Send + Sync + 'static) {
        let _ = self.sampled.set(Box::new(read));
    }
}
