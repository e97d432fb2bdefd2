//! Outliers by comparison with peers (CONTRACT §15): a backend that answers, but
//! much slower than the other backends of its upstream, or fails a share of requests
//! where they fail none, is a cull candidate like one over `error_threshold`.
//!
//! # Rules
//!
//! Only backends with at least `outlier_min_requests` requests in the window are
//! *judged*; each judged backend is compared with its **peers**, the *other* judged
//! backends of the upstream. A backend needs at least [`MIN_PEERS`] peers to be judged
//! at all (Envoy's `success_rate_minimum_hosts` idea: with one peer there is nothing
//! to call normal), so an upstream of one or two backends never has an outlier.
//!
//! * `success_rate` (Envoy's rule, compared with the peers rather than with a mean
//!   that includes the backend itself): with `m` and `s` the mean and (population)
//!   standard deviation of the peers' success rates, a backend whose success rate is
//!   below `m − outlier_stdev_factor × σ` is an outlier, where
//!   `σ = max(√(s² + m(1−m)/n), 0.01)`: the peers' spread plus the binomial noise of
//!   the backend's own `n` requests, and never under one percentage point, so peers
//!   that all succeed do not make a backend with one unlucky error an outlier.
//! * `latency`: a backend whose p90 is over `latency_factor` × the upper median of its
//!   peers' p90 is an outlier. The baseline is at least [`LATENCY_FLOOR_US`] (2 ms),
//!   so differences between backends that all answer within a few milliseconds never
//!   count.
//! * Systemic guard: when half or more of the judged backends would be outliers, they
//!   are alike, not outliers: [`OutlierVerdict::Systemic`], nothing is culled. (With the
//!   upper median of the peers, a majority that is alike slow can never stand out in the
//!   first place.)
//!
//! # The latency window ([`LatencyWindow`])
//!
//! Bounded and lock-free: a ring of [`SLICES`] time slices of
//! `ceil(window_seconds / 6)` seconds each; a slice is a fixed log-scale histogram
//! ([`crate::traffic::bucket_of`]: 4 linear sub-buckets per octave from 32 µs to 64 s,
//! 85 counters, quantiles within 12.5 %). A read sums the current slice and the six
//! before it (the window, plus the unfinished slice). Each counter word packs
//! `lap:32 | count:32` as in [`crate::traffic`]: a slice of an older lap restarts in the
//! same CAS that records into it, and a record for a lap older than the word's (a clock
//! read far behind, a clock jump backwards) is dropped. Memory is fixed:
//! [`LatencyWindow::BYTES`] (5 440 bytes) per backend, whatever the traffic. Recording
//! is one division, one `leading_zeros` and one CAS loop on one word.

use crate::traffic::{bucket_of, bump, count_at, quantile_us, BUCKETS};
use std::sync::atomic::{AtomicU64, Ordering};

/// Peers a backend needs (other backends with enough requests) to be judged.
pub const MIN_PEERS: usize = 2;
/// Least spread of success rates a comparison uses (one percentage point).
pub const STDEV_FLOOR: f64 = 0.01;
/// Least baseline p90 of the latency rule, µs.
pub const LATENCY_FLOOR_US: u64 = 2_000;
/// Slices in the latency window's ring.
pub const SLICES: u64 = 8;
/// Slices a read covers: the current one and the six before.
const READ_SLICES: u64 = 7;

/// `[culling] outlier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutlierRule {
    #[default]
    None,
    SuccessRate,
    Latency,
}

impl OutlierRule {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Self::None,
            "success_rate" => Self::SuccessRate,
            "latency" => Self::Latency,
            _ => return None,
        })
    }

    /// The config value, and the `rule` of a journal entry.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::SuccessRate => "success_rate",
            Self::Latency => "latency",
        }
    }
}

/// The outlier part of `[culling]`.
#[derive(Debug, Clone, PartialEq)]
pub struct OutlierParams {
    pub rule: OutlierRule,
    /// Requests (latency: answered requests) a backend needs in the window to be judged.
    pub min_requests: u64,
    /// success_rate: below the peers' mean − factor × their spread.
    pub stdev_factor: f64,
    /// latency: p90 over factor × the median of the peers' p90.
    pub latency_factor: f64,
}

impl Default for OutlierParams {
    fn default() -> Self {
        Self {
            rule: OutlierRule::None,
            min_requests: 50,
            stdev_factor: 1.9,
            latency_factor: 3.0,
        }
    }
}

/// What one backend's windows say, for [`evaluate_outliers`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PeerSample {
    /// The caller's identifier, echoed back.
    pub index: usize,
    pub requests: u64,
    pub errors: u64,
    /// Latency samples in the window and their p90 (µs).
    pub latency: LatencySummary,
}

impl PeerSample {
    fn success_rate(&self) -> f64 {
        if self.requests == 0 {
            return 1.0;
        }
        1.0 - (self.errors as f64 / self.requests as f64).min(1.0)
    }
}

/// One outlier and the figures that made it one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outlier {
    pub index: usize,
    pub rule: OutlierRule,
    /// Its success rate (0..1), or its p90 in µs.
    pub value: f64,
    /// The peers' mean success rate, or the upper median of their p90 (µs, floored).
    pub baseline: f64,
    /// The line it crossed: `mean − factor × σ`, or `factor × baseline`.
    pub limit: f64,
    /// Peers it was compared with.
    pub peers: usize,
}

impl Outlier {
    /// How far past the line (> 1), to rank outliers worst first.
    fn severity(&self) -> f64 {
        match self.rule {
            OutlierRule::Latency => self.value / self.limit.max(1.0),
            _ => (1.0 - self.value) / (1.0 - self.limit).max(1e-9),
        }
    }

    /// The figures in words, for logs and the journal.
    pub fn describe(&self) -> String {
        match self.rule {
            OutlierRule::Latency => format!(
                "p90 {:.1} ms over {:.1} ms ({:.1} ms × factor; median p90 of {} peers)",
                self.value / 1000.0,
                self.limit / 1000.0,
                self.baseline / 1000.0,
                self.peers
            ),
            _ => format!(
                "success rate {:.3} under {:.3} (mean of {} peers {:.3})",
                self.value, self.limit, self.peers, self.baseline
            ),
        }
    }
}

/// Outcome of [`evaluate_outliers`].
#[derive(Debug, Clone, PartialEq)]
pub enum OutlierVerdict {
    /// `outlier = "none"`.
    Off,
    /// Fewer than `MIN_PEERS + 1` backends had enough requests: nobody is judged.
    TooFew { judged: usize },
    /// The outliers, worst first (possibly none).
    Judged {
        judged: usize,
        outliers: Vec<Outlier>,
    },
    /// Half or more of the judged backends would be outliers: they are alike.
    Systemic { judged: usize, outliers: usize },
}

impl OutlierVerdict {
    /// The outliers to try to cull (empty unless `Judged`).
    pub fn outliers(&self) -> &[Outlier] {
        match self {
            OutlierVerdict::Judged { outliers, .. } => outliers,
            _ => &[],
        }
    }

    pub fn find(&self, index: usize) -> Option<&Outlier> {
        self.outliers().iter().find(|o| o.index == index)
    }
}

fn upper_median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Judge the backends of one upstream by `p.rule`. See the module doc.
pub fn evaluate_outliers(samples: &[PeerSample], p: &OutlierParams) -> OutlierVerdict {
    let min = p.min_requests.max(1);
    let judged: Vec<&PeerSample> = match p.rule {
        OutlierRule::None => return OutlierVerdict::Off,
        OutlierRule::SuccessRate => samples.iter().filter(|s| s.requests >= min).collect(),
        OutlierRule::Latency => samples
            .iter()
            .filter(|s| s.latency.samples >= min && s.latency.p90_us.is_some())
            .collect(),
    };
    let n = judged.len();
    if n < MIN_PEERS + 1 {
        return OutlierVerdict::TooFew { judged: n };
    }
    let mut outliers = Vec::new();
    let mut peers: Vec<f64> = Vec::with_capacity(n);
    for (i, b) in judged.iter().enumerate() {
        peers.clear();
        let others = judged
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, s)| *s);
        let found = match p.rule {
            OutlierRule::SuccessRate => {
                peers.extend(others.map(PeerSample::success_rate));
                success_rate_outlier(b, &peers, p.stdev_factor)
            }
            OutlierRule::Latency => {
                peers.extend(others.filter_map(|s| s.latency.p90_us).map(|v| v as f64));
                latency_outlier(b, &mut peers, p.latency_factor)
            }
            OutlierRule::None => None,
        };
        outliers.extend(found);
    }
    if outliers.len() * 2 >= n {
        return OutlierVerdict::Systemic {
            judged: n,
            outliers: outliers.len(),
        };
    }
    outliers.sort_by(|a, b| {
        b.severity()
            .total_cmp(&a.severity())
            .then(a.index.cmp(&b.index))
    });
    OutlierVerdict::Judged {
        judged: n,
        outliers,
    }
}

fn success_rate_outlier(b: &PeerSample, peers: &[f64], factor: f64) -> Option<Outlier> {
    let k = peers.len() as f64;
    let mean = peers.iter().sum::<f64>() / k;
    let var = peers.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / k;
    let noise = mean * (1.0 - mean) / b.requests.max(1) as f64;
    let sigma = (var + noise).sqrt().max(STDEV_FLOOR);
    let limit = mean - factor * sigma;
    let rate = b.success_rate();
    (rate < limit).then_some(Outlier {
        index: b.index,
        rule: OutlierRule::SuccessRate,
        value: rate,
        baseline: mean,
        limit,
        peers: peers.len(),
    })
}

fn latency_outlier(b: &PeerSample, peers: &mut [f64], factor: f64) -> Option<Outlier> {
    let p90 = b.latency.p90_us? as f64;
    let baseline = upper_median(peers).max(LATENCY_FLOOR_US as f64);
    let limit = factor * baseline;
    (p90 > limit).then_some(Outlier {
        index: b.index,
        rule: OutlierRule::Latency,
        value: p90,
        baseline,
        limit,
        peers: peers.len(),
    })
}

/// What a [`LatencyWindow`] holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencySummary {
    pub samples: u64,
    pub p90_us: Option<u64>,
}

/// A window's histogram ([`LatencyWindow::buckets`]), read by `blame_tenants`: how many
/// answers were slower than a line, and the summary without the slowest `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyBuckets(pub [u64; BUCKETS]);

impl LatencyBuckets {
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            samples: self.0.iter().sum(),
            p90_us: quantile_us(&self.0, 0.90),
        }
    }

    /// Answers surely slower than `line_us`: those in buckets above the line's own.
    pub fn count_over(&self, line_us: u64) -> u64 {
        self.0[(bucket_of(line_us) + 1).min(BUCKETS)..].iter().sum()
    }

    /// Take the `n` slowest answers out (answers a key is found to have made slow: they
    /// are over the line, so which of the answers over it go does not change how many of
    /// the rest are, nor so whether the p90 is over it).
    pub fn trim_top(&mut self, mut n: u64) {
        for c in self.0.iter_mut().rev() {
            if n == 0 {
                return;
            }
            let take = n.min(*c);
            *c -= take;
            n -= take;
        }
    }
}

/// The line over which an answer counts as slow for `blame_tenants`: the latency rule's
/// line for a backend among these (`factor ×` the upper median of the judged backends'
/// p90, at least `factor ×` [`LATENCY_FLOOR_US`]). With fewer than [`MIN_PEERS`]` + 1`
/// backends judged, the least line the rule can draw (`factor × LATENCY_FLOOR_US`).
pub fn slow_line_us(summaries: &[LatencySummary], p: &OutlierParams) -> u64 {
    let min = p.min_requests.max(1);
    let mut p90s: Vec<f64> = summaries
        .iter()
        .filter(|s| s.samples >= min)
        .filter_map(|s| s.p90_us)
        .map(|v| v as f64)
        .collect();
    let baseline = if p90s.len() > MIN_PEERS {
        upper_median(&mut p90s).max(LATENCY_FLOOR_US as f64)
    } else {
        LATENCY_FLOOR_US as f64
    };
    let line = p.latency_factor.max(1.0) * baseline;
    if line.is_finite() {
        line as u64
    } else {
        u64::MAX
    }
}

/// Seconds per slice of a [`LatencyWindow`] of `window_secs` (and of the slow answers'
/// ledger, [`crate::cull::SlowLedger`], which reads the same slices).
pub fn latency_slice_secs(window_secs: u64) -> u64 {
    window_secs.max(1).div_ceil(READ_SLICES - 1).max(1)
}

/// The slices a read at `now_secs` covers: `[first, last]` slice units (the current one
/// and the six before it).
pub fn read_units(now_secs: u64, slice_secs: u64) -> (u64, u64) {
    let unit = now_secs / slice_secs.max(1);
    (unit.saturating_sub(READ_SLICES - 1), unit)
}

/// One backend's latencies over the culling window. See the module doc.
#[derive(Debug)]
pub struct LatencyWindow {
    slice_secs: u64,
    /// `SLICES` × `BUCKETS` counter words.
    words: Box<[AtomicU64]>,
}

impl LatencyWindow {
    /// Memory of one window's counters.
    pub const BYTES: usize = (SLICES as usize) * BUCKETS * 8;

    /// A window of about `window_secs` seconds (0 is treated as 1).
    pub fn new(window_secs: u64) -> Self {
        let slice_secs = latency_slice_secs(window_secs);
        Self {
            slice_secs,
            words: (0..SLICES as usize * BUCKETS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Seconds per slice.
    pub fn slice_secs(&self) -> u64 {
        self.slice_secs
    }

    /// Count one answer of `latency_us` at `now_secs`. Hot path: one CAS on one word.
    #[inline]
    pub fn record(&self, now_secs: u64, latency_us: u64) {
        let unit = now_secs / self.slice_secs;
        let slot = (unit % SLICES) as usize;
        bump(
            &self.words[slot * BUCKETS + bucket_of(latency_us)],
            unit / SLICES,
        );
    }

    /// Samples and p90 over the current slice and the six before it.
    pub fn summary(&self, now_secs: u64) -> LatencySummary {
        LatencyBuckets(self.buckets(now_secs)).summary()
    }

    /// The histogram of the current slice and the six before it (what [`Self::summary`]
    /// reads), for a caller that takes samples out first ([`LatencyBuckets::trim_top`]).
    pub fn buckets(&self, now_secs: u64) -> [u64; BUCKETS] {
        let mut buckets = [0u64; BUCKETS];
        let (first, last) = read_units(now_secs, self.slice_secs);
        for u in first..=last {
            let slot = (u % SLICES) as usize;
            let words = &self.words[slot * BUCKETS..(slot + 1) * BUCKETS];
            for (sum, w) in buckets.iter_mut().zip(words) {
                *sum += count_at(w, u / SLICES);
            }
        }
        buckets
    }

    /// Forget everything (a readmitted backend starts over).
    pub fn reset(&self) {
        for w in self.words.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000;

    fn rate(index: usize, requests: u64, errors: u64) -> PeerSample {
        PeerSample {
            index,
            requests,
            errors,
            latency: LatencySummary::default(),
        }
    }

    fn slow(index: usize, samples: u64, p90_ms: u64) -> PeerSample {
        PeerSample {
            index,
            requests: samples,
            errors: 0,
            latency: LatencySummary {
                samples,
                p90_us: Some(p90_ms * 1000),
            },
        }
    }

    fn params(rule: OutlierRule) -> OutlierParams {
        OutlierParams {
            rule,
            ..OutlierParams::default()
        }
    }

    #[test]
    fn off_judges_nothing() {
        let v = [rate(0, 100, 90), rate(1, 100, 0), rate(2, 100, 0)];
        assert_eq!(
            evaluate_outliers(&v, &params(OutlierRule::None)),
            OutlierVerdict::Off
        );
    }

    #[test]
    fn a_quarter_failing_among_clean_peers_is_an_outlier() {
        let v = [
            rate(0, 100, 0),
            rate(1, 100, 25),
            rate(2, 100, 0),
            rate(3, 100, 1),
        ];
        let got = evaluate_outliers(&v, &params(OutlierRule::SuccessRate));
        let o = got.outliers();
        assert_eq!(o.len(), 1, "{got:?}");
        assert_eq!(o[0].index, 1);
        assert!((o[0].value - 0.75).abs() < 1e-9);
        assert!(o[0].limit > 0.9 && o[0].baseline > 0.99, "{o:?}");
        assert_eq!(o[0].peers, 3);
        assert!(o[0].describe().contains("success rate 0.750"));
    }

    #[test]
    fn ten_percent_where_peers_fail_none_is_an_outlier_but_one_error_is_not() {
        let v = [rate(0, 200, 20), rate(1, 200, 0), rate(2, 200, 0)];
        let got = evaluate_outliers(&v, &params(OutlierRule::SuccessRate));
        assert_eq!(got.outliers().len(), 1);
        // One unlucky error in 200 against perfect peers: within the floor.
        let v = [rate(0, 200, 1), rate(1, 200, 0), rate(2, 200, 0)];
        let got = evaluate_outliers(&v, &params(OutlierRule::SuccessRate));
        assert!(got.outliers().is_empty(), "{got:?}");
    }

    #[test]
    fn all_failing_alike_is_not_an_outlier() {
        // Every backend at about 25 % errors, with sampling noise.
        let v = [
            rate(0, 60, 15),
            rate(1, 60, 19),
            rate(2, 60, 12),
            rate(3, 60, 16),
        ];
        let got = evaluate_outliers(&v, &params(OutlierRule::SuccessRate));
        assert!(got.outliers().is_empty(), "{got:?}");
    }

    #[test]
    fn too_few_requests_or_backends_are_not_judged() {
        let p = params(OutlierRule::SuccessRate);
        // The failing one has 49 requests: below min_requests, so only two are judged.
        let v = [rate(0, 49, 40), rate(1, 100, 0), rate(2, 100, 0)];
        assert_eq!(
            evaluate_outliers(&v, &p),
            OutlierVerdict::TooFew { judged: 2 }
        );
        // One backend: nothing to compare with.
        assert_eq!(
            evaluate_outliers(&[rate(0, 1000, 900)], &p),
            OutlierVerdict::TooFew { judged: 1 }
        );
        // Two: one peer is no baseline.
        let v = [rate(0, 100, 90), rate(1, 100, 0)];
        assert_eq!(
            evaluate_outliers(&v, &p),
            OutlierVerdict::TooFew { judged: 2 }
        );
        // Nothing at all.
        assert_eq!(
            evaluate_outliers(&[], &params(OutlierRule::Latency)),
            OutlierVerdict::TooFew { judged: 0 }
        );
    }

    #[test]
    fn a_slow_backend_among_fast_peers_is_an_outlier() {
        let v = [
            slow(0, 100, 10),
            slow(1, 100, 12),
            slow(2, 100, 200),
            slow(3, 100, 11),
        ];
        let got = evaluate_outliers(&v, &params(OutlierRule::Latency));
        let o = got.outliers();
        assert_eq!(o.len(), 1, "{got:?}");
        assert_eq!(o[0].index, 2);
        assert_eq!(o[0].baseline, 11_000.0, "the median of 10, 11, 12 ms");
        assert_eq!(o[0].limit, 33_000.0);
        assert!(o[0].describe().starts_with("p90 200.0 ms over 33.0 ms"));
        // Just under the factor: not an outlier.
        let v = [slow(0, 100, 10), slow(1, 100, 10), slow(2, 100, 29)];
        assert!(evaluate_outliers(&v, &params(OutlierRule::Latency))
            .outliers()
            .is_empty());
    }

    #[test]
    fn all_equally_slow_is_not_an_outlier() {
        let v = [
            slow(0, 100, 200),
            slow(1, 100, 210),
            slow(2, 100, 190),
            slow(3, 100, 205),
        ];
        let got = evaluate_outliers(&v, &params(OutlierRule::Latency));
        assert_eq!(
            got,
            OutlierVerdict::Judged {
                judged: 4,
                outliers: vec![]
            }
        );
        // Half slow: the upper median of a slow one's peers is a slow one.
        let v = [
            slow(0, 100, 200),
            slow(1, 100, 10),
            slow(2, 100, 200),
            slow(3, 100, 10),
        ];
        assert!(evaluate_outliers(&v, &params(OutlierRule::Latency))
            .outliers()
            .is_empty());
    }

    #[test]
    fn fast_backends_within_the_floor_are_alike() {
        // 0.2 ms against 0.9 ms: 4.5×, but both far under the 2 ms floor.
        let mut v = [slow(0, 100, 1), slow(1, 100, 1), slow(2, 100, 1)];
        v[0].latency.p90_us = Some(200);
        v[1].latency.p90_us = Some(200);
        v[2].latency.p90_us = Some(900);
        assert!(evaluate_outliers(&v, &params(OutlierRule::Latency))
            .outliers()
            .is_empty());
    }

    #[test]
    fn latency_needs_latency_samples() {
        let mut v = [slow(0, 100, 10), slow(1, 100, 10), slow(2, 100, 500)];
        v[2].latency.samples = 10;
        assert_eq!(
            evaluate_outliers(&v, &params(OutlierRule::Latency)),
            OutlierVerdict::TooFew { judged: 2 }
        );
    }

    #[test]
    fn half_or_more_outliers_is_systemic() {
        // A contrived spread where two of four fall under the line: alike, not outliers.
        let p = OutlierParams {
            stdev_factor: 0.1,
            ..params(OutlierRule::SuccessRate)
        };
        let v = [
            rate(0, 1000, 0),
            rate(1, 1000, 0),
            rate(2, 1000, 300),
            rate(3, 1000, 310),
        ];
        assert!(matches!(
            evaluate_outliers(&v, &p),
            OutlierVerdict::Systemic { judged: 4, .. }
        ));
    }

    #[test]
    fn outliers_worst_first() {
        let v = [
            slow(0, 100, 10),
            slow(1, 100, 100),
            slow(2, 100, 10),
            slow(3, 100, 500),
            slow(4, 100, 10),
            slow(5, 100, 10),
            slow(6, 100, 10),
        ];
        let got = evaluate_outliers(&v, &params(OutlierRule::Latency));
        let idx: Vec<usize> = got.outliers().iter().map(|o| o.index).collect();
        assert_eq!(idx, vec![3, 1]);
        assert!(got.find(1).is_some() && got.find(0).is_none());
    }

    #[test]
    fn window_p90_and_expiry() {
        let w = LatencyWindow::new(60);
        assert_eq!(w.slice_secs(), 10);
        for i in 0..90 {
            w.record(T0 + (i % 5), 1_000);
        }
        for _ in 0..10 {
            w.record(T0 + 3, 100_000);
        }
        let s = w.summary(T0 + 5);
        assert_eq!(s.samples, 100);
        // rank 90 of 100 is the last 1 ms sample
        assert!(s.p90_us.unwrap().abs_diff(1_000) <= 125, "{s:?}");
        w.record(T0 + 5, 100_000);
        let s = w.summary(T0 + 5);
        assert!(s.p90_us.unwrap().abs_diff(100_000) <= 12_500, "{s:?}");
        // T0's slice leaves after six more slices.
        let unit0 = T0 / 10;
        assert_eq!(w.summary((unit0 + 6) * 10).samples, 101);
        assert_eq!(w.summary((unit0 + 7) * 10).samples, 0);
        assert_eq!(w.summary((unit0 + 7) * 10).p90_us, None);
    }

    #[test]
    fn clock_jumps() {
        let w = LatencyWindow::new(60);
        for _ in 0..10 {
            w.record(T0, 5_000);
        }
        // Far forward: old laps read as nothing, and new records start clean.
        let later = T0 + 1_000_000;
        assert_eq!(w.summary(later).samples, 0);
        w.record(later, 1_000);
        assert_eq!(w.summary(later).samples, 1);
        // Back again (both times fall in slice slot 0): a record for an older lap than
        // the word holds is dropped, and each read sees only its own laps.
        assert_eq!((T0 / 10) % SLICES, (later / 10) % SLICES);
        w.record(T0, 1_000);
        assert_eq!(w.summary(later).samples, 1);
        assert_eq!(w.summary(T0).samples, 10);
        // The clock far behind (e.g. 0): no panic, no underflow.
        w.record(0, 1);
        assert_eq!(w.summary(0).samples, 1);
        // A window of 0 seconds is one of 1.
        let w = LatencyWindow::new(0);
        assert_eq!(w.slice_secs(), 1);
        w.record(T0, 1_000);
        assert_eq!(w.summary(T0).samples, 1);
    }

    #[test]
    fn reset_forgets_and_memory_is_fixed() {
        let w = LatencyWindow::new(30);
        w.record(T0, 1_000);
        w.reset();
        assert_eq!(w.summary(T0).samples, 0);
        assert_eq!(LatencyWindow::BYTES, 8 * 85 * 8);
    }

    #[test]
    fn buckets_count_over_a_line_and_trim_the_slowest() {
        let w = LatencyWindow::new(10);
        for _ in 0..80 {
            w.record(T0, 1_000);
        }
        for _ in 0..20 {
            w.record(T0, 400_000);
        }
        let mut b = LatencyBuckets(w.buckets(T0));
        assert_eq!(b.summary(), w.summary(T0));
        assert_eq!(b.count_over(6_000), 20);
        assert_eq!(
            b.count_over(1_000),
            20,
            "the line's own bucket is not counted"
        );
        assert!(b.summary().p90_us.unwrap() > 300_000);
        // The 15 slowest out: 5 of 85 left over the line, the p90 is fast again.
        b.trim_top(15);
        assert_eq!(b.summary().samples, 85);
        assert_eq!(b.count_over(6_000), 5);
        assert!(b.summary().p90_us.unwrap() < 2_000);
        // More than there are: empty, no underflow.
        b.trim_top(1_000);
        assert_eq!(b.summary(), LatencySummary::default());
    }

    #[test]
    fn the_slow_line_is_the_rules_line() {
        let p = params(OutlierRule::Latency);
        let s = |n, ms: u64| LatencySummary {
            samples: n,
            p90_us: Some(ms * 1000),
        };
        // 3 × the upper median of 10, 12, 400 ms.
        assert_eq!(
            slow_line_us(&[s(100, 10), s(100, 12), s(100, 400)], &p),
            36_000
        );
        // Fast backends: the floor.
        assert_eq!(slow_line_us(&[s(100, 1), s(100, 1), s(100, 1)], &p), 6_000);
        // Too few judged (one has 10 answers): the least line.
        assert_eq!(
            slow_line_us(&[s(100, 50), s(10, 50), s(100, 50)], &p),
            6_000
        );
        assert_eq!(slow_line_us(&[], &p), 6_000);
    }

    #[test]
    fn rules_parse() {
        for r in [
            OutlierRule::None,
            OutlierRule::SuccessRate,
            OutlierRule::Latency,
        ] {
            assert_eq!(OutlierRule::parse(r.as_str()), Some(r));
        }
        assert_eq!(OutlierRule::parse("p99"), None);
    }
}
