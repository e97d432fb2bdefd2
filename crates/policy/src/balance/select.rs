//! Backend choice over a pool's backend list, by index: smooth weighted round
//! robin and power of two choices. Callers say which indices are eligible
//! (healthy, not culled, not tried yet, inside the shard).

use std::sync::atomic::{AtomicU64, Ordering};

/// Smooth weighted round robin (nginx's): with weights 3:1 the order is
/// A A B A, never A A A B, and the split over any run is as even as it can be.
/// Pingora's `Weighted<RoundRobin>` repeats each backend `weight` times in a
/// list (bursts) and walks on pseudo-randomly after an ineligible pick, so the
/// split is not kept once a backend is skipped; hence this.
#[derive(Debug, Default)]
pub struct SmoothWrr {
    current: Vec<i64>,
}

impl SmoothWrr {
    /// Next index among the eligible ones, or `None` when none is.
    pub fn pick(&mut self, weights: &[u32], eligible: impl Fn(usize) -> bool) -> Option<usize> {
        if self.current.len() != weights.len() {
            self.current = vec![0; weights.len()];
        }
        let mut total: i64 = 0;
        let mut best: Option<usize> = None;
        for (i, w) in weights.iter().enumerate() {
            if !eligible(i) {
                continue;
            }
            let w = i64::from((*w).max(1));
            self.current[i] += w;
            total += w;
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        self.current[b] -= total;
        Some(b)
    }
}

/// Power of two choices: two random eligible indices, the one with fewer
/// requests in flight wins (ties go to the first draw). `r` is a random word.
pub fn p2c(
    n: usize,
    r: u64,
    eligible: impl Fn(usize) -> bool,
    load: impl Fn(usize) -> u64,
) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let a = probe(n, (r as usize) % n, &eligible, None)?;
    let b = probe(n, ((r >> 32) as usize) % n, &eligible, Some(a));
    match b {
        Some(b) if load(b) < load(a) => Some(b),
        _ => Some(a),
    }
}

/// First eligible index from `start` on (wrapping), other than `not`.
fn probe(
    n: usize,
    start: usize,
    eligible: &impl Fn(usize) -> bool,
    not: Option<usize>,
) -> Option<usize> {
    (0..n)
        .map(|k| (start + k) % n)
        .find(|&i| Some(i) != not && eligible(i))
}

/// A cheap source of random words (a Weyl sequence through a mixer): good
/// enough to spread choices, no syscall, no lock. Owned by the selector that
/// uses it; each starts at its own point (std's per-instance random hash keys).
#[derive(Debug)]
pub struct RandomWords(AtomicU64);

impl Default for RandomWords {
    fn default() -> Self {
        use std::hash::BuildHasher;
        let seed =
            std::collections::hash_map::RandomState::new().hash_one(0x853c_49e6_748f_ea9b_u64);
        Self(AtomicU64::new(seed))
    }
}

impl RandomWords {
    /// The next word.
    #[inline]
    pub fn next_word(&self) -> u64 {
        super::mix(self.0.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_wrr_three_to_one_is_interleaved() {
        let mut s = SmoothWrr::default();
        let picks: Vec<usize> = (0..8)
            .map(|_| s.pick(&[3, 1], |_| true).unwrap_or(9))
            .collect();
        assert_eq!(picks, vec![0, 0, 1, 0, 0, 0, 1, 0]);
        assert_eq!(picks.iter().filter(|&&i| i == 0).count(), 6);
    }

    #[test]
    fn smooth_wrr_skips_ineligible_and_keeps_ratio_of_the_rest() {
        let mut s = SmoothWrr::default();
        let mut counts = [0u32; 3];
        for _ in 0..600 {
            let i = s.pick(&[1, 5, 2], |i| i != 1).unwrap_or(1);
            counts[i] += 1;
        }
        assert_eq!(counts, [200, 0, 400]);
        assert_eq!(s.pick(&[1, 1], |_| false), None);
    }

    #[test]
    fn p2c_prefers_the_less_loaded() {
        let loads = [10u64, 0, 10, 10];
        let mut hits = [0u32; 4];
        for k in 0..1000u64 {
            let i = p2c(4, super::super::mix(k), |_| true, |i| loads[i]).unwrap_or(9);
            hits[i] += 1;
        }
        // Backend 1 wins every draw it is part of: about 1 - (3/4)^2 ≈ 44 %.
        assert!(hits[1] > 350, "{hits:?}");
        assert!(hits[1] > hits[0] * 2, "{hits:?}");
    }

    #[test]
    fn p2c_only_eligible() {
        for k in 0..100u64 {
            let i = p2c(5, super::super::mix(k), |i| i == 3, |_| 0);
            assert_eq!(i, Some(3));
        }
        assert_eq!(p2c(3, 7, |_| false, |_| 0), None);
        assert_eq!(p2c(0, 7, |_| true, |_| 0), None);
    }

    #[test]
    fn random_words_differ_between_sources_and_draws() {
        let (a, b) = (RandomWords::default(), RandomWords::default());
        let xs: Vec<u64> = (0..64).map(|_| a.next_word()).collect();
        let mut sorted = xs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), xs.len(), "no repeats within one source");
        assert_ne!(b.next_word(), xs[0], "each source starts at its own point");
        // Both halves of the choice space are hit (it spreads choices).
        let high = xs.iter().filter(|&&x| x >> 63 == 1).count();
        assert!((8..=56).contains(&high), "{high} of 64 high");
    }
}
