//! One upstream's selector: the policy of [`super::Policy`] over Pingora's
//! backend set. Plain round robin is a ticket counter over the pool's list; a
//! skipped turn (ejected, unhealthy, tried) takes the next ticket, so the
//! eligible backends keep even shares. Pingora's `LoadBalancer::select_with`
//! cloned the `Backend` and its extensions map per pick (3k instructions).
//! Where `pingora-load-balancing` fits it is used as is: Ketama
//! (`KetamaHashing`, whose ring walk gives the next backend when the first is
//! not eligible) and random (`Weighted<Random>`). It did not fit for weighted
//! round robin (its list repeats a backend `weight` times and walks on
//! pseudo-randomly after a skip, so 3:1 is not kept under ejection; ours is
//! smooth) nor least requests (Pingora has only a `TODO: least conn`): those
//! are [`super::select`].

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pingora::lb::selection::consistent::KetamaHashing;
use pingora::lb::selection::{BackendIter, BackendSelection, Random};
use pingora::lb::Backend;

use super::select::{p2c, RandomWords, SmoothWrr};
use super::Policy;

/// A backend's position in its pool's list, carried in `Backend::ext`.
#[derive(Debug, Clone, Copy)]
pub struct Slot(pub usize);

pub enum Selector {
    /// The next pick's position: incremented once per pick.
    RoundRobin(AtomicUsize),
    Smooth(Mutex<SmoothWrr>),
    LeastRequests(RandomWords),
    Ketama(Arc<KetamaHashing>),
    Random(Arc<Random>, RandomWords),
}

impl Selector {
    pub fn build(policy: Policy, weighted: bool, set: &BTreeSet<Backend>) -> Self {
        match policy {
            Policy::RoundRobin if weighted => Selector::Smooth(Mutex::new(SmoothWrr::default())),
            Policy::RoundRobin => Selector::RoundRobin(AtomicUsize::new(0)),
            Policy::LeastRequests => Selector::LeastRequests(RandomWords::default()),
            Policy::ConsistentHash => Selector::Ketama(Arc::new(KetamaHashing::build(set))),
            Policy::Random => {
                Selector::Random(Arc::new(Random::build(set)), RandomWords::default())
            }
        }
    }

    /// An eligible slot, or `None`. `eligible(i)` already includes health,
    /// cull state, tried backends and the shard.
    pub fn pick(
        &self,
        n: usize,
        weights: &[u32],
        key: &[u8],
        eligible: &dyn Fn(usize) -> bool,
        load: &dyn Fn(usize) -> u64,
    ) -> Option<usize> {
        let iterations = n.max(1) * 4 + 16;
        let ok = |b: &Backend| b.ext.get::<Slot>().is_some_and(|s| eligible(s.0));
        let slot = |b: &Backend| b.ext.get::<Slot>().map(|s| s.0);
        match self {
            Selector::RoundRobin(next) => {
                if n == 0 {
                    return None;
                }
                // A skipped turn takes the next ticket rather than the next backend,
                // so the eligible backends keep even shares: a backend after an
                // ejected one does not get its turns too.
                let mut ticket = 0;
                for _ in 0..n {
                    ticket = next.fetch_add(1, Ordering::Relaxed);
                    if eligible(ticket % n) {
                        return Some(ticket % n);
                    }
                }
                // Other pickers took tickets in between: scan the rest in order.
                (1..n)
                    .map(|k| ticket.wrapping_add(k) % n)
                    .find(|&i| eligible(i))
            }
            Selector::Smooth(state) => {
                let mut s = state.lock().ok()?;
                s.pick(weights, eligible)
            }
            Selector::LeastRequests(words) => p2c(n, words.next_word(), eligible, load),
            Selector::Ketama(ring) => {
                walk(ring.iter(key), iterations, ok, slot).or_else(|| (0..n).find(|&i| eligible(i)))
            }
            Selector::Random(r, words) => {
                let word = words.next_word().to_le_bytes();
                walk(r.iter(&word), iterations, ok, slot).or_else(|| (0..n).find(|&i| eligible(i)))
            }
        }
    }
}

fn walk(
    mut it: impl BackendIter,
    iterations: usize,
    ok: impl Fn(&Backend) -> bool,
    slot: impl Fn(&Backend) -> Option<usize>,
) -> Option<usize> {
    for _ in 0..iterations {
        let b = it.next()?;
        if ok(b) {
            return slot(b);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_robin() -> Selector {
        Selector::build(Policy::RoundRobin, false, &BTreeSet::new())
    }

    fn picks(s: &Selector, n: usize, k: usize, eligible: &dyn Fn(usize) -> bool) -> Vec<usize> {
        (0..k)
            .map(|_| s.pick(n, &[], b"", eligible, &|_| 0).unwrap_or(99))
            .collect()
    }

    #[test]
    fn round_robin_goes_in_order() {
        let s = round_robin();
        assert_eq!(picks(&s, 3, 7, &|_| true), [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn round_robin_skips_to_the_next_eligible_backend() {
        let s = round_robin();
        // 1 is out: the other two keep even shares (2 does not take 1's turns)
        let got = picks(&s, 3, 6, &|i| i != 1);
        assert_eq!(got, [0, 2, 0, 2, 0, 2]);
        let s = round_robin();
        assert_eq!(picks(&s, 4, 8, &|i| i == 3), [3; 8]);
        assert_eq!(picks(&s, 3, 2, &|_| false), [99, 99]);
        assert_eq!(picks(&s, 0, 1, &|_| true), [99]);
    }
}
