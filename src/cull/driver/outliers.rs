//! The outlier rules' pass of a check (CONTRACT §15): success rates from the fleet's
//! counts, latencies from this instance's windows, and with `blame_tenants` the slow
//! answers of a key that is slow where others are fast taken out first.

use super::Culling;
use crate::upstream::Pool;
use portcullis_policy::cull::{
    self, evaluate_outliers, BackendSample, CullParams, LatencyBuckets, OutlierRule,
    OutlierVerdict, PeerSample,
};
use std::collections::{HashMap, HashSet};

impl Culling {
    /// The outlier rule's verdict on `pool` (CONTRACT §15): success rates from the same
    /// samples as the error rule (fleet-wide counts), latencies from this instance's
    /// windows (each instance judges what it saw; the cull itself spends a fleet token).
    ///
    /// `excuse` (with `blame_tenants`): the slow answers of an identity that is slow where
    /// other identities are fast are taken out of each backend's latencies first
    /// ([`Self::excuse_slow`]).
    pub(super) fn outliers(
        &self,
        pool: &Pool,
        samples: &[BackendSample],
        params: &CullParams,
        now_secs: u64,
        excuse: Option<&mut HashMap<String, HashSet<u64>>>,
    ) -> OutlierVerdict {
        if params.outlier.rule == OutlierRule::None {
            return OutlierVerdict::Off;
        }
        let latency = params.outlier.rule == OutlierRule::Latency;
        let mut windows: Vec<LatencyBuckets> = if latency {
            pool.backends
                .iter()
                .map(|b| LatencyBuckets(b.latency.buckets(now_secs)))
                .collect()
        } else {
            Vec::new()
        };
        if let (true, Some(excused)) = (latency, excuse) {
            self.excuse_slow(pool, &mut windows, params, now_secs, excused);
        }
        // `samples` and `windows` are in the order of `pool.backends`.
        let peers: Vec<PeerSample> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| PeerSample {
                index: s.index,
                requests: s.requests,
                errors: s.errors,
                latency: windows
                    .get(i)
                    .map(LatencyBuckets::summary)
                    .unwrap_or_default(),
            })
            .collect();
        let verdict = evaluate_outliers(&peers, &params.outlier);
        if let OutlierVerdict::Systemic { judged, outliers } = verdict {
            tracing::debug!(event = "cull", upstream = %pool.name, judged, outliers, "outliers alike; culling none");
        }
        verdict
    }

    /// `blame_tenants` with the latency rule: draw the line over which an answer is slow,
    /// publish it for the request path (which records slow answers by identity), find the
    /// identities that are slow where others are fast ([`cull::attributed_slow`]: at least
    /// a tenth of `outlier_min_requests` slow answers, the fewest that can move a judged
    /// backend's p90) and take their slow answers out of `windows`. Nobody is limited for
    /// being slow; the excuse is logged once per episode.
    fn excuse_slow(
        &self,
        pool: &Pool,
        windows: &mut [LatencyBuckets],
        params: &CullParams,
        now_secs: u64,
        excused: &mut HashMap<String, HashSet<u64>>,
    ) {
        let summaries: Vec<_> = windows.iter().map(LatencyBuckets::summary).collect();
        let line = cull::slow_line_us(&summaries, &params.outlier);
        let counts: Vec<cull::SlowCounts> = pool
            .backends
            .iter()
            .zip(windows.iter())
            .zip(&summaries)
            .map(|((b, w), s)| cull::SlowCounts {
                addr: b.addr,
                answers: s.samples,
                slow: w.count_over(line),
            })
            .collect();
        // The slices the latency windows read (a reload that changed `window_seconds`
        // rebuilds no window: the backends' own slice).
        let slice = pool.backends.first().map_or_else(
            || cull::latency_slice_secs(params.window_secs),
            |b| b.latency.slice_secs(),
        );
        let ledger = pool.shared.slow_ledger.snapshot(now_secs, slice);
        let min_slow = (params.outlier.min_requests / 10).max(1);
        let found = cull::attributed_slow(&ledger, &counts, min_slow);
        for f in &found {
            for (addr, n) in &f.backends {
                if let Some(i) = pool.backends.iter().position(|b| b.addr == *addr) {
                    windows[i].trim_top(*n);
                }
            }
        }
        pool.shared
            .slow_line_us
            .store(line, std::sync::atomic::Ordering::Relaxed);
        let now: HashSet<u64> = found.iter().map(|f| f.key).collect();
        let before = excused.entry(pool.name.clone()).or_default();
        for f in found.iter().filter(|f| !before.contains(&f.key)) {
            let backends: Vec<String> = f.backends.iter().map(|(a, _)| a.to_string()).collect();
            let figures = format!(
                "key {} made {} answers over {:.1} ms on {} backends where other keys are fast; not counted against them",
                crate::cull::blame::tag(f.key),
                f.errors(),
                line as f64 / 1000.0,
                f.backends.len()
            );
            tracing::info!(event = "cull", result = "excused", upstream = %pool.name, backends = %backends.join(","), figures = %figures, "a key's slow answers are its own");
        }
        *before = now;
    }
}
