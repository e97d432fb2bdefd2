//! Candidate selection with a systemic-failure guard.
//!
//! Rules (per upstream, over the samples of all its backends):
//! 1. A backend *fails* when `errors ≥ threshold` (a threshold of 0 is treated as 1).
//! 2. No failing backend → [`Evaluation::Healthy`].
//! 3. A failing backend *stands out* when its error rate (`errors / requests`) is at
//!    least [`STANDOUT_FACTOR`] × the **upper median** of the error rates of all the
//!    *other* backends of the upstream. With the upper median, a strict majority of
//!    backends failing alike can never stand out (the median of the others is then
//!    one of the failing peers), while half or fewer failing against healthy peers do.
//!    Backends with no requests and no errors in the window (idle, or already culled
//!    and drained) carry no evidence and are left out of the comparison entirely, so
//!    they can neither make a failing peer look exceptional nor count as failing.
//! 4. When every backend with traffic fails, or failing backends exist but none stands out, the
//!    failure is treated as systemic ([`Evaluation::Systemic`]): cull nothing — a
//!    fleet-wide problem (a bad deploy of a shared dependency, a database down) must
//!    not empty the pool. Otherwise the standing-out ones are [`Evaluation::Candidates`]
//!    (the budget then decides how many actually go).

/// Error-rate ratio a failing backend must reach over the median of its peers.
pub const STANDOUT_FACTOR: f64 = 2.0;

/// Windowed counts of one backend. `index` is the caller's identifier (e.g. its
/// position in the upstream's backend list) and is echoed back in the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendSample {
    pub index: usize,
    pub requests: u64,
    pub errors: u64,
}

impl BackendSample {
    /// Error rate in [0, 1]; a backend with errors but no recorded requests counts as 1.
    pub fn error_rate(&self) -> f64 {
        if self.errors == 0 {
            0.0
        } else if self.requests == 0 {
            1.0
        } else {
            (self.errors as f64 / self.requests as f64).min(1.0)
        }
    }
}

/// Outcome of [`evaluate`].
#[derive(Debug, Clone, PartialEq)]
pub enum Evaluation {
    /// No backend reached the threshold.
    Healthy,
    /// Backends (their `index`) that reached the threshold and stand out from their
    /// peers, worst error rate first. `held_back` reached the threshold but do not
    /// stand out (reported only; never culled).
    Candidates {
        indices: Vec<usize>,
        held_back: Vec<usize>,
    },
    /// `failing` of the `total` backends that had traffic reached the threshold,
    /// but alike: cull nothing.
    Systemic { failing: usize, total: usize },
}

impl Evaluation {
    /// The backends to try to cull (empty unless `Candidates`).
    pub fn candidates(&self) -> &[usize] {
        match self {
            Evaluation::Candidates { indices, .. } => indices,
            _ => &[],
        }
    }
}

fn upper_median(rates: &mut [f64]) -> f64 {
    if rates.is_empty() {
        return 0.0;
    }
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Decide which backends of one upstream are cull candidates. See the module doc.
pub fn evaluate(stats: &[BackendSample], threshold: u64) -> Evaluation {
    let threshold = threshold.max(1);
    let seen: Vec<&BackendSample> = stats
        .iter()
        .filter(|s| s.requests > 0 || s.errors > 0)
        .collect();
    let total = seen.len();
    let failing: Vec<&BackendSample> = seen
        .iter()
        .copied()
        .filter(|s| s.errors >= threshold)
        .collect();
    if failing.is_empty() {
        return Evaluation::Healthy;
    }
    if failing.len() == total {
        return Evaluation::Systemic {
            failing: failing.len(),
            total,
        };
    }
    let mut standing_out: Vec<(f64, usize)> = Vec::new();
    let mut held_back = Vec::new();
    let mut others: Vec<f64> = Vec::with_capacity(total);
    for f in &failing {
        others.clear();
        others.extend(
            seen.iter()
                .copied()
                .filter(|s| !std::ptr::eq(*s, *f))
                .map(BackendSample::error_rate),
        );
        let baseline = upper_median(&mut others);
        let rate = f.error_rate();
        if rate > 0.0 && rate >= STANDOUT_FACTOR * baseline {
            standing_out.push((rate, f.index));
        } else {
            held_back.push(f.index);
        }
    }
    if standing_out.is_empty() {
        return Evaluation::Systemic {
            failing: failing.len(),
            total,
        };
    }
    standing_out.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    Evaluation::Candidates {
        indices: standing_out.into_iter().map(|(_, i)| i).collect(),
        held_back,
    }
}

/// [`evaluate`] for an upstream with shuffle shards of `shard_size` backends.
///
/// One hash-key value (a poison request, a failing tenant) reaches only its
/// shard, so up to `shard_size` backends can fail alike while the rest are
/// fine. When `shard_size` is over half the backends, the plain rule would
/// call that majority "systemic". Here, failing backends that fit in one
/// shard (at most `shard_size` of them, and not all backends with traffic)
/// are compared with the *healthy* backends only: each that stands out from
/// those is a candidate. More failing backends than one shard holds, or all
/// of them, stay systemic, so a real fleet-wide failure is never mistaken
/// for a shard's.
pub fn evaluate_sharded(stats: &[BackendSample], threshold: u64, shard_size: usize) -> Evaluation {
    let base = evaluate(stats, threshold);
    let Evaluation::Systemic { failing, total } = base else {
        return base;
    };
    if shard_size == 0 || failing > shard_size || failing >= total {
        return base;
    }
    let threshold = threshold.max(1);
    let seen = stats.iter().filter(|s| s.requests > 0 || s.errors > 0);
    let (bad, good): (Vec<&BackendSample>, Vec<&BackendSample>) =
        seen.partition(|s| s.errors >= threshold);
    let mut healthy: Vec<f64> = good.iter().map(|s| s.error_rate()).collect();
    let baseline = upper_median(&mut healthy);
    let mut out: Vec<(f64, usize)> = Vec::with_capacity(bad.len());
    for b in &bad {
        let rate = b.error_rate();
        if !(rate > 0.0 && rate >= STANDOUT_FACTOR * baseline) {
            return base;
        }
        out.push((rate, b.index));
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    Evaluation::Candidates {
        indices: out.into_iter().map(|(_, i)| i).collect(),
        held_back: Vec::new(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(index: usize, requests: u64, errors: u64) -> BackendSample {
        BackendSample {
            index,
            requests,
            errors,
        }
    }

    #[test]
    fn healthy_when_nobody_reaches_threshold() {
        let v = [s(0, 100, 1), s(1, 100, 4), s(2, 100, 0)];
        assert_eq!(evaluate(&v, 5), Evaluation::Healthy);
        assert_eq!(evaluate(&[], 5), Evaluation::Healthy);
    }

    #[test]
    fn one_bad_among_healthy_is_a_candidate() {
        let v = [s(0, 100, 0), s(1, 100, 40), s(2, 100, 1), s(3, 100, 0)];
        assert_eq!(
            evaluate(&v, 5),
            Evaluation::Candidates {
                indices: vec![1],
                held_back: vec![]
            }
        );
    }

    #[test]
    fn all_four_failing_alike_is_systemic() {
        let v = [s(0, 100, 50), s(1, 100, 48), s(2, 100, 52), s(3, 100, 49)];
        assert_eq!(
            evaluate(&v, 5),
            Evaluation::Systemic {
                failing: 4,
                total: 4
            }
        );
    }

    #[test]
    fn all_failing_even_if_one_is_worse_is_systemic() {
        let v = [s(0, 100, 10), s(1, 100, 10), s(2, 100, 90), s(3, 100, 10)];
        assert!(matches!(evaluate(&v, 5), Evaluation::Systemic { .. }));
    }

    #[test]
    fn two_of_four_failing_clearly_are_both_candidates() {
        let v = [s(0, 100, 60), s(1, 100, 0), s(2, 100, 80), s(3, 100, 1)];
        assert_eq!(
            evaluate(&v, 5),
            Evaluation::Candidates {
                indices: vec![2, 0],
                held_back: vec![]
            }
        );
    }

    #[test]
    fn majority_failing_alike_is_systemic() {
        let v = [s(0, 100, 50), s(1, 100, 50), s(2, 100, 50), s(3, 100, 0)];
        assert_eq!(
            evaluate(&v, 5),
            Evaluation::Systemic {
                failing: 3,
                total: 4
            }
        );
        // 2 of 3 is a majority too.
        let v = [s(0, 100, 50), s(1, 100, 50), s(2, 100, 0)];
        assert!(matches!(evaluate(&v, 5), Evaluation::Systemic { .. }));
    }

    #[test]
    fn elevated_everywhere_but_one_crossing_threshold_is_held_back() {
        // Everyone at ~5 % errors; backend 0 crosses the count threshold only
        // because it served more traffic.
        let v = [s(0, 200, 10), s(1, 80, 4), s(2, 90, 4), s(3, 70, 3)];
        assert_eq!(
            evaluate(&v, 5),
            Evaluation::Systemic {
                failing: 1,
                total: 4
            }
        );
    }

    #[test]
    fn mixed_stand_out_and_held_back() {
        // 0 is clearly bad; 1 crosses the threshold at a rate like its peers'.
        let v = [
            s(0, 100, 90),
            s(1, 1000, 20),
            s(2, 100, 2),
            s(3, 100, 2),
            s(4, 100, 2),
        ];
        assert_eq!(
            evaluate(&v, 5),
            Evaluation::Candidates {
                indices: vec![0],
                held_back: vec![1]
            }
        );
    }

    #[test]
    fn single_backend_failing_is_systemic() {
        assert!(matches!(
            evaluate(&[s(0, 10, 10)], 5),
            Evaluation::Systemic { .. }
        ));
    }

    #[test]
    fn no_traffic_peers_and_connect_failures() {
        // Connect failures: errors == requests (or errors without requests).
        let v = [
            s(0, 50, 0),
            s(1, 7, 7),
            s(2, 0, 6),
            s(3, 60, 0),
            s(4, 40, 1),
        ];
        assert_eq!(evaluate(&v, 5).candidates(), &[1, 2]);
    }

    #[test]
    fn idle_backends_are_not_peers() {
        // Two idle (e.g. already culled and drained) backends must not make two
        // backends failing alike look exceptional.
        let v = [s(0, 0, 0), s(1, 100, 50), s(2, 100, 50), s(3, 0, 0)];
        assert_eq!(
            evaluate(&v, 5),
            Evaluation::Systemic {
                failing: 2,
                total: 2
            }
        );
        // ... while one failing against one healthy peer with traffic still stands out.
        let v = [s(0, 0, 0), s(1, 100, 50), s(2, 100, 0), s(3, 0, 0)];
        assert_eq!(evaluate(&v, 5).candidates(), &[1]);
    }

    #[test]
    fn one_shard_failing_is_not_systemic() {
        // 4 backends, shards of 3: one poison key fails on its 3 backends.
        let v = [s(0, 100, 40), s(1, 100, 45), s(2, 100, 0), s(3, 100, 42)];
        assert!(matches!(evaluate(&v, 5), Evaluation::Systemic { .. }));
        assert_eq!(evaluate_sharded(&v, 5, 3).candidates(), &[1, 3, 0]);
        // Without shards the plain rule holds.
        assert!(matches!(
            evaluate_sharded(&v, 5, 0),
            Evaluation::Systemic { .. }
        ));
    }

    #[test]
    fn sharded_real_systemic_failure_is_still_systemic() {
        // Every backend failing alike.
        let v = [s(0, 100, 40), s(1, 100, 45), s(2, 100, 41), s(3, 100, 42)];
        assert!(matches!(
            evaluate_sharded(&v, 5, 2),
            Evaluation::Systemic { .. }
        ));
        // More backends failing than one shard holds.
        let v = [
            s(0, 100, 40),
            s(1, 100, 45),
            s(2, 100, 41),
            s(3, 100, 0),
            s(4, 100, 0),
        ];
        assert!(matches!(
            evaluate_sharded(&v, 5, 2),
            Evaluation::Systemic { .. }
        ));
        // Elevated everywhere (the healthy ones too): nothing stands out.
        let v = [s(0, 200, 10), s(1, 80, 4), s(2, 90, 4), s(3, 70, 3)];
        assert!(matches!(
            evaluate_sharded(&v, 5, 2),
            Evaluation::Systemic { .. }
        ));
    }
}
