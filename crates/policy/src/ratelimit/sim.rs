//! A deterministic simulation of two instances sharing one counter store, on a synthetic
//! clock: the limiter's own tests run it over the in-process store, the Redis store's tests
//! over a real Redis, so both stores are held to the same fleet-wide admission counts.

use super::{CounterStore, Limiter};

/// An epoch-aligned window start far from 0 (window index 1,000 of a 60 s window).
pub const T0: u64 = 1_000 * 60_000;

/// Drives two limiters at 4x `limit` each (evenly spread) over `windows + 1` windows, both
/// flushing every 50 ms (staggered); returns admitted (both together) per fixed window,
/// leaving out the first window, which starts empty.
pub async fn simulate(
    a: &Limiter,
    b: &Limiter,
    store_a: &dyn CounterStore,
    store_b: &dyn CounterStore,
    limit: u64,
    windows: u64,
) -> Vec<u64> {
    let wms = a.window_secs() * 1000;
    let start = T0;
    let per_iw = 4 * limit; // requests per instance per window
    let mut per_window = vec![0u64; windows as usize + 1];
    let mut next_flush = start + 50;
    for k in 0..(windows + 1) * per_iw {
        let t = start + k * wms / per_iw;
        while next_flush <= t {
            let _ = a.flush_once(store_a, next_flush).await;
            let _ = b.flush_once(store_b, next_flush + 7).await;
            next_flush += 50;
        }
        for l in [a, b] {
            if l.check("hot", t).is_allowed() {
                per_window[((t - start) / wms) as usize] += 1;
            }
        }
    }
    per_window.remove(0);
    per_window
}

/// How [`simulate_fleet`] spreads the key's requests over the instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Each request goes to an instance drawn uniformly (a round-robin or random balancer).
    Even,
    /// Instance `i` receives a share proportional to `1 / (i + 1)` (Zipf): at 100
    /// instances the busiest takes 19% of the requests, at 1,000 13%.
    Skewed,
    /// The key reaches the instances one after another through the warm-up window (as when
    /// its clients move onto a fleet, or instances come back from a rolling restart):
    /// at elapsed fraction `f` of that window, a request goes to one of the first
    /// `1 + f * (instances - 1)` instances, drawn uniformly; in the full windows, to any.
    /// The instances reached late make their first contact after the fleet has spent the
    /// limit: the worst case of a first contact.
    Joining,
}

/// One fleet simulation: `instances` limiters of the policy crate sharing one in-process
/// store that reports `instances` live instances, on a synthetic clock, with store answers
/// that come back at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetSim {
    /// Live instances.
    pub instances: u64,
    /// The key's limit per window.
    pub limit: u64,
    /// Window length (s).
    pub window_secs: u64,
    /// Every instance flushes every `flush_ms`, instance `i` at offset
    /// `i * flush_ms / instances` (staggered).
    pub flush_ms: u64,
    /// Requests for the key, the whole fleet, per window, as a multiple of the limit; paced
    /// evenly in time.
    pub load: u64,
    /// Which instance each request goes to.
    pub spread: Spread,
    /// Full windows simulated after the warm-up window (the key is new to the fleet in it).
    pub windows: u64,
    /// Seed of the request placement.
    pub seed: u64,
}

/// Result of [`simulate_fleet`]: admissions per fixed window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetRun {
    /// Admitted in the warm-up window (the key new to every instance).
    pub warmup: u64,
    /// Admitted in each full window after it.
    pub full: Vec<u64>,
}

/// A [`LocalStore`](super::LocalStore) shared by `n` live instances.
struct Shared {
    inner: super::LocalStore,
    n: u64,
}

#[async_trait::async_trait]
impl CounterStore for Shared {
    async fn sync(&self, batch: super::Batch<'_>) -> super::SyncResult {
        self.inner.sync(batch).await
    }
    fn kind(&self) -> &'static str {
        "sim"
    }
    fn instances(&self) -> Option<u64> {
        Some(self.n)
    }
}

/// splitmix64: the placement of the simulated requests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Drives one hot key on `cfg.instances` limiters (the policy crate's own `Limiter`, flush
/// protocol and fleet share) over one warm-up window and `cfg.windows` full windows; every
/// instance has flushed once (an idle probe: it knows the fleet's size) before the first
/// window starts. Returns the admissions per fixed window.
pub async fn simulate_fleet(cfg: &FleetSim) -> FleetRun {
    let n = cfg.instances.max(1) as usize;
    let flush_ms = cfg.flush_ms.max(1);
    let params = super::RateLimitParams {
        window_secs: cfg.window_secs.max(1),
        limit: cfg.limit,
        max_tracked_keys: 1_000,
        ..Default::default()
    };
    let wms = params.window_secs * 1000;
    let store = Shared {
        inner: super::LocalStore::new(),
        n: n as u64,
    };
    let fleet: Vec<Limiter> = (0..n).map(|_| Limiter::new(params.clone())).collect();
    let offset = |i: usize| i as u64 * flush_ms / n as u64;
    // Cumulative weights of the instances (the draw picks the first at or above it).
    let weights: Vec<f64> = (0..n)
        .map(|i| match cfg.spread {
            Spread::Even | Spread::Joining => 1.0,
            Spread::Skewed => 1.0 / (i + 1) as f64,
        })
        .scan(0.0, |acc, w| {
            *acc += w;
            Some(*acc)
        })
        .collect();
    let total_weight = weights.last().copied().unwrap_or(1.0);
    let mut rng = Rng(cfg.seed);

    // Flush rounds: round `m` flushes instance `i` at `base + m * flush_ms + offset(i)`.
    let base = T0 - flush_ms;
    let (mut round, mut next) = (0u64, 0usize);
    let per_window = cfg.load.max(1) * cfg.limit.max(1);
    let mut admitted = vec![0u64; cfg.windows as usize + 1];
    for k in 0..(cfg.windows + 1) * per_window {
        let t = T0 + k * wms / per_window;
        loop {
            let at = base + round * flush_ms + offset(next);
            if at > t {
                break;
            }
            let _ = fleet[next].flush_once(&store, at).await;
            next += 1;
            if next == n {
                next = 0;
                round += 1;
            }
        }
        let i = if cfg.spread == Spread::Joining && t < T0 + wms {
            // Instances reached so far: 1 at the window's start, all of them at its end.
            let reached = 1 + ((n as u64 - 1) * (t - T0) / wms) as usize;
            ((rng.unit() * reached as f64) as usize).min(reached - 1)
        } else {
            let x = rng.unit() * total_weight;
            weights.partition_point(|&c| c <= x).min(n - 1)
        };
        if fleet[i].check("hot", t).is_allowed() {
            admitted[((t - T0) / wms) as usize] += 1;
        }
    }
    let warmup = admitted.remove(0);
    FleetRun {
        warmup,
        full: admitted,
    }
}
