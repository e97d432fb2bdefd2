//! One upstream's selector: the policy of [`super::Policy`] over Pingora's
//! backend set. Plain round robin is a counter over the pool's list (the next
//! eligible backend in order after a skip, as HAProxy's `roundrobin`): Pingora's
//! `LoadBalancer::select_with` clones the `Backend` and its extensions map per
//! pick, a tenth of a proxied request's instructions beyond bare Pingora.
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

use super::select::{p2c, random_word, SmoothWrr};
use super::Policy;

/// A backend's position in its pool's list, carried in `Backend::ext`.
#[derive(Debug, Clone, Copy)]
pub struct Slot(pub usize);

pub enum Selector {
    /// The next pick's position: incremented once per pick.
    RoundRobin(AtomicUsize),
    Smooth(Mutex<SmoothWrr>),
    LeastRequests,
    Ketama(Arc<KetamaHashing>),
    Random(Arc<Random>),
}

impl Selector {
    pub fn build(policy: Policy, weighted: bool, set: &BTreeSet<Backend>) -> Self {
        match policy {
            Policy::RoundRobin if weighted => Selector::Smooth(Mutex::new(SmoothWrr::default())),
            Policy::RoundRobin => Selector::RoundRobin(AtomicUsize::new(0)),
            Policy::LeastRequests => Selector::LeastRequests,
            Policy::ConsistentHash => Selector::Ketama(Arc::new(KetamaHashing::build(set))),
            Policy::Random => Selector::Random(Arc::new(Random::build(set))),
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
                let start = next.fetch_add(1, Ordering::Relaxed);
                (0..n)
                    .map(|k| start.wrapping_add(k) % n)
                    .find(|&i| eligible(i))
            }
            Selector::Smooth(state) => {
                let mut s = state.lock().ok()?;
                s.pick(weights, eligible)
            }
            Selector::LeastRequests => p2c(n, random_word(), eligible, load),
            Selector::Ketama(ring) => {
                walk(ring.iter(key), iterations, ok, slot).or_else(|| (0..n).find(|&i| eligible(i)))
            }
            Selector::Random(r) => {
                let word = random_word().to_le_bytes();
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
