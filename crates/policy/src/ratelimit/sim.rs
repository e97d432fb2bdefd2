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
