use super::super::flush::SYNC_EVERY;
use super::super::shard::approx_bytes_per_key;
use super::super::sim::{simulate, simulate_fleet, FleetSim, Spread, T0};
use super::super::slot::estimate_at;
use super::super::store::{Batch, CounterStore, Delta, LocalStore, StoreError, SyncResult};
use super::*;

const W: u64 = 60_000;

fn lim(limit: u64, window_secs: u64) -> Limiter {
    Limiter::new(RateLimitParams {
        window_secs,
        limit,
        ..Default::default()
    })
}

fn admitted(l: &Limiter, key: &str, n: usize, now: u64) -> usize {
    (0..n).filter(|_| l.check(key, now).is_allowed()).count()
}

fn retry(d: Decision) -> u64 {
    match d {
        Decision::Limited {
            retry_after_secs, ..
        } => retry_after_secs,
        Decision::Allowed { .. } => 0,
    }
}

#[test]
fn window_boundaries() {
    let l = lim(10, 60);
    // Start of a window: all 10 go through, then refused.
    assert_eq!(admitted(&l, "a", 15, T0), 10);
    // Still within the window.
    assert_eq!(admitted(&l, "a", 5, T0 + W - 1), 0);
    // Rollover: prev = 10 weighs fully at the very start of the next window.
    assert_eq!(admitted(&l, "a", 5, T0 + W), 0);
    // Mid next window: 10 * 0.5 = 5 -> 5 more.
    assert_eq!(admitted(&l, "a", 20, T0 + W + W / 2), 5);
    // End of that window: prev 10 weighs ~0, cur 5 -> 5 more (5 + 10/60000 + 1 <= 10 up to cur 8).
    assert_eq!(admitted(&l, "a", 20, T0 + 2 * W - 1), 4);
    // Skip of 2+ windows: everything forgotten.
    assert_eq!(admitted(&l, "a", 20, T0 + 5 * W), 10);
}

#[test]
fn remaining_and_reset() {
    let l = lim(10, 60);
    match l.check("r", T0 + 1_000) {
        Decision::Allowed {
            limit,
            remaining,
            reset_secs,
        } => {
            assert_eq!(limit, 10);
            assert_eq!(remaining, 9);
            assert_eq!(reset_secs, 119); // 2 windows - 1 s until fully drained
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn only_admitted_requests_count() {
    let l = lim(10, 60);
    assert_eq!(admitted(&l, "k", 1000, T0), 10);
    let (_, prev, cur, _) = l.slot_counts("k").unwrap();
    assert_eq!((prev, cur), (0, 10));
    // Next window at 60% : prev 10 * 0.4 = 4 -> 6 admitted despite 1000 refused before.
    assert_eq!(admitted(&l, "k", 100, T0 + W + 36_000), 6);
}

#[test]
fn retry_after_is_exact() {
    // Fill patterns: (time of burst within the window, burst size, later burst time)
    for (offset, later) in [
        (0u64, None),
        (12_345, None),
        (59_999, None),
        (0, Some(30_500u64)),
    ] {
        let l = lim(10, 60);
        let now = T0 + offset;
        admitted(&l, "k", 6, now);
        let mut now = now;
        if let Some(t) = later {
            now = T0 + W + t;
        }
        admitted(&l, "k", 100, now);
        let d = l.check("k", now);
        let ra = retry(d);
        assert!(ra >= 1, "{d:?}");
        // One second earlier than promised: still refused; at the promise: admitted.
        let before = now + ra * 1000 - 1000;
        assert!(
            !l.check("k", before).is_allowed(),
            "offset {offset} ra {ra}: admitted 1 s early"
        );
        assert!(
            l.check("k", now + ra * 1000).is_allowed(),
            "offset {offset} ra {ra}: refused at retry-after"
        );
    }
}

#[test]
fn retry_after_known_values() {
    let l = lim(10, 60);
    assert_eq!(admitted(&l, "k", 10, T0), 10);
    // 10 at the window start: next window, 10 * (1 - f) <= 9 -> f >= 0.1 -> 66 s.
    assert_eq!(retry(l.check("k", T0)), 66);
    assert_eq!(retry(l.check("k", T0 + 10_000)), 56);
    assert_eq!(retry(l.check("k", T0 + 65_001)), 1);
    assert!(!l.check("k", T0 + 65_999).is_allowed());
    assert!(l.check("k", T0 + 66_000).is_allowed());

    // limit 1: the single admission must leave both windows.
    let l = lim(1, 60);
    assert!(l.check("one", T0 + 30_000).is_allowed());
    assert_eq!(retry(l.check("one", T0 + 30_000)), 90);
}

#[test]
fn overrides_apply_per_key() {
    let mut overrides = HashMap::new();
    overrides.insert("premium".to_string(), 50);
    overrides.insert("blocked".to_string(), 0);
    let l = Limiter::new(RateLimitParams {
        window_secs: 60,
        limit: 5,
        overrides,
        ..Default::default()
    });
    assert_eq!(admitted(&l, "premium", 100, T0), 50);
    assert_eq!(admitted(&l, "basic", 100, T0), 5);
    assert_eq!(admitted(&l, "blocked", 3, T0), 0);
    assert_eq!(retry(l.check("blocked", T0)), 60);
    assert_eq!(l.limit_for("premium"), 50);
}

#[test]
fn hot_reload_keeps_state() {
    let l = lim(5, 60);
    assert_eq!(admitted(&l, "k", 10, T0), 5);
    let mut overrides = HashMap::new();
    overrides.insert("k".to_string(), 8);
    l.set_params(RateLimitParams {
        window_secs: 60,
        limit: 5,
        overrides,
        ..Default::default()
    });
    // Cached refusal dropped; the 5 already admitted still count.
    assert_eq!(admitted(&l, "k", 10, T0 + 1), 3);
    // Window change restarts counts.
    l.set_params(RateLimitParams {
        window_secs: 10,
        limit: 2,
        ..Default::default()
    });
    assert_eq!(admitted(&l, "k", 10, T0 + 2), 2);
}

#[test]
fn cached_refusal_is_cheap_and_consistent() {
    let l = lim(3, 60);
    assert_eq!(admitted(&l, "k", 3, T0), 3);
    let first = retry(l.check("k", T0 + 1_000));
    // Served from the cache, consistent with the math.
    for s in 1..10u64 {
        let r = retry(l.check("k", T0 + 1_000 + s * 1_000));
        assert_eq!(r, first - s);
    }
}

#[test]
fn eviction_keeps_active_keys_under_flood() {
    let l = Limiter::new(RateLimitParams {
        window_secs: 60,
        limit: 1_000_000,
        max_tracked_keys: 64 * 32, // 2048
        ..Default::default()
    });
    let active: Vec<String> = (0..50).map(|i| format!("active-{i}")).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut now = T0;
    for round in 0..2_000 {
        for k in &active {
            assert!(l.check(k, now).is_allowed());
        }
        for _ in 0..100 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            l.check(&format!("rnd-{x:x}"), now);
        }
        if round % 100 == 0 {
            now += 1;
        }
        assert!(l.tracked_keys() <= 64 * 32);
    }
    // 200k random keys went through a 2k-key table; every active key kept its full count.
    for k in &active {
        let (_, _, cur, _) = l.slot_counts(k).expect("active key evicted");
        assert_eq!(cur, 2_000, "{k}");
    }
    assert!(l.evictions_total() > 150_000);
}

#[test]
fn dead_keys_are_collected() {
    let l = lim(10, 60);
    for i in 0..5_000 {
        l.check(&format!("k{i}"), T0);
    }
    assert_eq!(l.tracked_keys(), 5_000);
    let store = LocalStore::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        l.flush_once(&store, T0 + 10).await.unwrap();
        assert_eq!(l.tracked_keys(), 5_000);
        // Two windows later everything is dead; the collector frees it in a few flushes.
        for i in 0..5 {
            l.flush_once(&store, T0 + 2 * W + i).await.unwrap();
        }
    });
    assert_eq!(l.tracked_keys(), 0);
}

#[tokio::test]
async fn local_store_single_instance_is_identical() {
    let l = lim(10, 60);
    let store = LocalStore::new();
    assert_eq!(admitted(&l, "k", 4, T0), 4);
    l.flush_once(&store, T0 + 1).await.unwrap();
    assert_eq!(admitted(&l, "k", 4, T0 + 2), 4);
    l.flush_once(&store, T0 + 3).await.unwrap();
    l.flush_once(&store, T0 + 4).await.unwrap();
    assert_eq!(admitted(&l, "k", 10, T0 + 5), 2);
    let (_, prev, cur, g_cur) = l.slot_counts("k").unwrap();
    assert_eq!((prev, cur), (0, 10));
    assert_eq!(g_cur, 8);
    // Rollover with flushes in between behaves as without a store.
    l.flush_once(&store, T0 + W + 30_000).await.unwrap();
    assert_eq!(admitted(&l, "k", 10, T0 + W + 30_000), 5);
}

#[tokio::test]
async fn two_limiters_share_local_store() {
    // Two "instances" on one LocalStore (stand-in for Redis): 4x the limit each, 3 windows.
    let store = LocalStore::new();
    let a = lim(600, 60);
    let b = lim(600, 60);
    let per_window = simulate(&a, &b, &store, &store, 600, 3).await;
    eprintln!("local-store 2 instances, admitted per window (limit 600): {per_window:?}");
    for (i, n) in per_window.iter().enumerate() {
        let r = *n as f64 / 600.0;
        assert!((0.95..=1.03).contains(&r), "window {i}: {n} admitted ({r})");
    }
}

/// A LocalStore standing in for a shared store with `n` live instances; fails on demand.
struct Fleet {
    inner: LocalStore,
    n: u64,
    fail: std::sync::atomic::AtomicBool,
}

impl Fleet {
    fn new(n: u64) -> Self {
        Self {
            inner: LocalStore::new(),
            n,
            fail: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

#[async_trait::async_trait]
impl CounterStore for Fleet {
    async fn sync(&self, batch: Batch<'_>) -> SyncResult {
        if self.fail.load(Ordering::Relaxed) {
            return Err(StoreError::Connect("refused".into()));
        }
        self.inner.sync(batch).await
    }
    fn kind(&self) -> &'static str {
        "test"
    }
    fn instances(&self) -> Option<u64> {
        Some(self.n)
    }
}

/// A limiter of 200 per 60 s that has flushed once to `store` at `t` (so it knows the
/// fleet's instance count).
async fn fleet_member(store: &Fleet, t: u64) -> Limiter {
    let l = lim(200, 60);
    l.flush_once(store, t).await.unwrap();
    l
}

#[tokio::test]
async fn fleet_share_splits_a_new_key() {
    let store = Fleet::new(2);
    let (a, b) = (lim(200, 60), lim(200, 60));
    assert_eq!(a.instances(), 1);
    // Idle probes: both learn n = 2.
    a.flush_once(&store, T0).await.unwrap();
    b.flush_once(&store, T0 + 1).await.unwrap();
    assert_eq!((a.instances(), b.instances()), (2, 2));
    // A key neither has synced, hit on both: each admits half the limit.
    assert_eq!(admitted(&a, "new", 300, T0 + 10), 100);
    assert_eq!(admitted(&b, "new", 300, T0 + 11), 100);
    // Refused for the share only: retry after the next syncs, 1 s.
    assert_eq!(retry(a.check("new", T0 + 12)), 1);
    // After syncing, both see the limit reached: nothing more, and the retry comes from the
    // window math as on a single instance (200 at the window start: 61 s at 110 ms).
    for (t, l) in [(50, &a), (57, &b), (100, &a), (107, &b)] {
        l.flush_once(&store, T0 + t).await.unwrap();
    }
    assert_eq!(admitted(&a, "new", 100, T0 + 110), 0);
    assert_eq!(admitted(&b, "new", 100, T0 + 110), 0);
    // (`a` had not checked the key since its sync at 50 ms, so it was not refreshed at
    // 100 ms: its first refusal above was for the share. Checked keys are synced.)
    a.flush_once(&store, T0 + 150).await.unwrap();
    b.flush_once(&store, T0 + 157).await.unwrap();
    assert_eq!(retry(a.check("new", T0 + 160)), 61);
    assert_eq!(retry(b.check("new", T0 + 160)), 61);
    let single = lim(200, 60);
    assert_eq!(admitted(&single, "new", 200, T0), 200);
    assert_eq!(retry(single.check("new", T0 + 160)), 61);
    assert_eq!(store.inner.counts(stable_hash("new"), T0 / W).cur, 200);
}

#[tokio::test]
async fn a_late_first_contact_in_a_large_fleet_does_not_reopen_a_spent_key() {
    // 100 instances (limit 200). Ten of them spend the key's limit and sync; then the 90
    // others see it for the first time, each 30 times, before their next flush. Each held
    // `limit / n` before its first sync (an expected 2: 180 more, 1.9x the limit in the
    // window); now `limit x 4 / n²` (0.08 each: 3.6% of the limit for all 90), and one
    // refused for it is synced at the next flush, where it learns the key is spent.
    let store = Fleet::new(100);
    let mut fleet = Vec::new();
    for i in 0..100 {
        fleet.push(fleet_member(&store, T0 + i).await);
    }
    // The ten take their shares of what is left, a sync apart (each a hundredth of it, as
    // the other 90 might be using theirs), until the key is spent.
    let mut spent = 0;
    let mut t = T0 + 200;
    while spent < 196 && t < T0 + 20_000 {
        for (i, l) in fleet.iter().enumerate().take(10) {
            spent += admitted(l, "k", 40, t + i as u64);
        }
        for (i, l) in fleet.iter().enumerate().take(10) {
            l.flush_once(&store, t + 50 + i as u64).await.unwrap();
        }
        t += 100;
    }
    assert!(
        (196..=200).contains(&spent),
        "the first ten admitted {spent}"
    );
    let mut late = 0;
    for (i, l) in fleet.iter().enumerate().skip(10) {
        late += admitted(l, "k", 30, T0 + 30_000 + i as u64);
    }
    // Binomial(90, 0.08): mean 7.2, standard deviation 2.6; 20 is 5 of them above (the
    // draws are random per process). The plain share would have admitted about 180.
    assert!(
        late <= 20,
        "90 first contacts admitted {late} of a spent key"
    );
    // Each late instance was refused (the share) and is synced at its next flush: then
    // it refuses on the known counts, with the window's own Retry-After.
    for (i, l) in fleet.iter().enumerate().skip(10) {
        l.flush_once(&store, T0 + 30_050 + i as u64).await.unwrap();
    }
    for l in fleet.iter().skip(10) {
        assert_eq!(admitted(l, "k", 5, T0 + 30_200), 0);
    }
    let total = store.inner.counts(stable_hash("k"), T0 / W).cur;
    assert_eq!(total, (spent + late) as u64);
    if total >= 200 {
        // Spent in the store's view, as the last to sync saw it: the window's own wait,
        // not the share's second.
        assert!(retry(fleet[99].check("k", T0 + 30_200)) > 1);
    }
}

#[tokio::test]
async fn fleet_share_single_instance_unchanged() {
    let store = Fleet::new(1);
    let a = fleet_member(&store, T0).await;
    assert_eq!(a.instances(), 1);
    assert_eq!(admitted(&a, "new", 300, T0 + 10), 200);
    a.flush_once(&store, T0 + 50).await.unwrap();
    assert_eq!(admitted(&a, "new", 10, T0 + 60), 0);
}

#[tokio::test]
async fn fleet_share_converges_when_one_instance_takes_the_load() {
    // Two live instances, all traffic on `a`: half of what is left per sync, converging on
    // the limit within a second, never above it.
    let store = Fleet::new(2);
    let a = fleet_member(&store, T0).await;
    let b = fleet_member(&store, T0 + 1).await;
    let mut total = 0;
    let mut per_interval = Vec::new();
    for k in 1..=20u64 {
        let t = T0 + 50 * k;
        let n = admitted(&a, "solo", 1_000, t);
        per_interval.push(n);
        total += n;
        assert!(total <= 200, "{per_interval:?}");
        a.flush_once(&store, t + 10).await.unwrap();
        b.flush_once(&store, t + 20).await.unwrap();
    }
    eprintln!("one busy instance of 2, admitted per 50 ms sync interval: {per_interval:?}");
    assert_eq!(per_interval[0], 100);
    assert!(total >= 190, "{total}: {per_interval:?}");
}

#[tokio::test]
async fn fleet_share_bursts_on_both_stay_at_the_limit() {
    // Both instances hammer a new key for 10 sync intervals (staggered flushes); whatever
    // the phase, the two together admit the limit, not more.
    for stagger in [1u64, 7, 25, 43, 49] {
        let store = Fleet::new(2);
        let a = fleet_member(&store, T0).await;
        let b = fleet_member(&store, T0 + stagger).await;
        let mut total = 0;
        for ms in 0..500u64 {
            let t = T0 + 100 + ms;
            total += admitted(&a, "burst", 2, t);
            total += admitted(&b, "burst", 2, t);
            if t % 50 == 0 {
                a.flush_once(&store, t).await.unwrap();
            }
            if t % 50 == stagger {
                b.flush_once(&store, t).await.unwrap();
            }
        }
        eprintln!("burst on 2 instances, flushes {stagger} ms apart: {total} admitted (limit 200)");
        // (At most n - 1 over: both instances may draw the remainder of an odd share.)
        assert!((190..=201).contains(&total), "stagger {stagger}: {total}");
    }
}

#[tokio::test]
async fn fleet_share_suspended_while_store_unreachable() {
    let store = Fleet::new(2);
    let a = fleet_member(&store, T0).await;
    assert_eq!(admitted(&a, "k1", 300, T0 + 1), 100);
    // Store down: the last known n is kept, but each instance enforces the known counts plus
    // its own (contract §5.3).
    store.fail.store(true, Ordering::Relaxed);
    assert!(a.flush_once(&store, T0 + 50).await.is_err());
    assert_eq!(a.instances(), 2);
    assert_eq!(admitted(&a, "k1", 300, T0 + 60), 100);
    assert_eq!(admitted(&a, "k2", 300, T0 + 60), 200);
    // Back: the share applies again.
    store.fail.store(false, Ordering::Relaxed);
    a.flush_once(&store, T0 + 100).await.unwrap();
    assert_eq!(admitted(&a, "k3", 300, T0 + 110), 100);
}

#[tokio::test]
async fn fleet_share_window_accuracy() {
    // As `two_limiters_share_local_store`, with both limiters knowing n = 2.
    let store = Fleet::new(2);
    let (a, b) = (lim(600, 60), lim(600, 60));
    let per_window = simulate(&a, &b, &store, &store, 600, 3).await;
    eprintln!("fleet share, 2 instances, admitted per window (limit 600): {per_window:?}");
    for (i, n) in per_window.iter().enumerate() {
        let r = *n as f64 / 600.0;
        assert!((0.95..=1.03).contains(&r), "window {i}: {n} admitted ({r})");
    }
    let store = Fleet::new(2);
    let (a, b) = (lim(600, 1), lim(600, 1));
    let per_window = simulate(&a, &b, &store, &store, 600, 3).await;
    eprintln!("fleet share, 2 instances, admitted per window (limit 600 / 1 s): {per_window:?}");
    for (i, n) in per_window.iter().enumerate() {
        let r = *n as f64 / 600.0;
        assert!((0.95..=1.10).contains(&r), "window {i}: {n} admitted ({r})");
    }
}

#[tokio::test]
async fn fleet_of_100_stays_within_5_percent_of_the_limit() {
    // 100 instances, the default 600 per 60 s, 50 ms staggered flushes, one key at 100x its
    // limit spread evenly and skewed. Rounding every share up (`ceil(R / n)`) let the fleet
    // admit 1.065 and 1.125 x the limit in a full window here (`fleet_sim`, BENCHMARKS.md);
    // granting the remainder at random keeps every full window within 5%, above and below.
    for spread in [Spread::Even, Spread::Skewed, Spread::Joining] {
        let run = simulate_fleet(&FleetSim {
            instances: 100,
            limit: 600,
            window_secs: 60,
            flush_ms: 50,
            load: 100,
            spread,
            windows: 1,
            seed: 7,
        })
        .await;
        eprintln!("100 instances, {spread:?}: {run:?} (limit 600)");
        assert_eq!(run.full.len(), 1);
        // The window in which the key is new to the fleet stays within 5% too (1.07 even,
        // 1.09 skewed and 1.67 joining before first contacts took the smaller share and
        // the estimate of the others counted their news: `fleet_sim`, BENCHMARKS.md).
        let w = run.warmup as f64 / 600.0;
        assert!(
            w <= 1.05,
            "{spread:?}, warm-up window: {} ({w})",
            run.warmup
        );
        for (i, &n) in run.full.iter().enumerate() {
            let r = n as f64 / 600.0;
            assert!(
                (0.95..=1.05).contains(&r),
                "{spread:?}, window {i}: {n} ({r})"
            );
        }
    }
}

#[test]
fn bytes_per_key() {
    let b = approx_bytes_per_key();
    eprintln!("approx bytes per key: {b}");
    assert!(b < 200);
}

/// `cargo test --release -- --ignored check_speed --nocapture`
#[test]
#[ignore]
fn check_speed() {
    let n: usize = std::env::var("RL_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let l = Limiter::new(RateLimitParams {
        window_secs: 60,
        limit: 1_000_000,
        max_tracked_keys: 2 * n,
        ..Default::default()
    });
    let keys: Vec<String> = (0..n).map(|i| format!("api-key-{i:016x}-abcdef")).collect();
    for k in &keys {
        l.check(k, T0);
    }
    eprintln!("tracked {}", l.tracked_keys());
    let rounds = 3_000_000usize;
    // Harness cost alone: fetch + hash the key.
    let rs = RandomState::new();
    let t = std::time::Instant::now();
    let mut acc = 0u64;
    for i in 0..rounds {
        let k = &keys[(i.wrapping_mul(7919)) % n];
        acc ^= rs.hash_one(k.as_str());
    }
    let per = t.elapsed().as_nanos() as f64 / rounds as f64;
    eprintln!("harness (fetch + hash key only): {per:.1} ns ({acc:x})");
    // Random lookups in a plain HashMap<u64, u64> of n entries.
    let m: std::collections::HashMap<u64, u64> = (0..n as u64)
        .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i))
        .collect();
    let t = std::time::Instant::now();
    for i in 0..rounds {
        let k = ((i.wrapping_mul(7919)) % n) as u64;
        acc ^= m
            .get(&k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .copied()
            .unwrap_or(0);
    }
    let per = t.elapsed().as_nanos() as f64 / rounds as f64;
    eprintln!("plain HashMap<u64,u64> random get: {per:.1} ns ({acc:x})");
    let t = std::time::Instant::now();
    let mut ok = 0usize;
    for i in 0..rounds {
        let k = &keys[(i.wrapping_mul(7919)) % n];
        if l.check(k, T0 + 1 + (i as u64 >> 10)).is_allowed() {
            ok += 1;
        }
    }
    let per = t.elapsed().as_nanos() as f64 / rounds as f64;
    eprintln!("random key over 1M tracked: {per:.1} ns/check ({ok} allowed)");
    // Hot abusive key (cached refusal).
    let l2 = lim(10, 60);
    let t = std::time::Instant::now();
    for i in 0..rounds {
        l2.check("abuser", T0 + (i as u64 >> 12));
    }
    let per = t.elapsed().as_nanos() as f64 / rounds as f64;
    eprintln!("hot limited key: {per:.1} ns/check");
    // Two threads, random keys.
    let l = std::sync::Arc::new(l);
    let keys = std::sync::Arc::new(keys);
    let t = std::time::Instant::now();
    let hs: Vec<_> = (0..2)
        .map(|th| {
            let l = l.clone();
            let keys = keys.clone();
            std::thread::spawn(move || {
                for i in 0..rounds {
                    let k = &keys[(i.wrapping_mul(7919) + th * 12345) % n];
                    l.check(k, T0 + 2);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let per = t.elapsed().as_nanos() as f64 / (2 * rounds) as f64;
    eprintln!("2 threads, random keys: {per:.1} ns/check wall per decision");
}

/// LocalStore recording every batch it receives.
struct Recorder {
    inner: LocalStore,
    batches: Mutex<Vec<Vec<Delta>>>,
}

impl Recorder {
    fn new() -> Self {
        Self {
            inner: LocalStore::new(),
            batches: Mutex::new(Vec::new()),
        }
    }

    /// Batches received so far (and forgets them).
    fn take(&self) -> Vec<Vec<Delta>> {
        std::mem::take(&mut *self.batches.lock().unwrap())
    }
}

#[async_trait::async_trait]
impl CounterStore for Recorder {
    async fn sync(&self, batch: Batch<'_>) -> SyncResult {
        self.batches.lock().unwrap().push(batch.deltas.to_vec());
        self.inner.sync(batch).await
    }
    fn kind(&self) -> &'static str {
        "test"
    }
}

fn sent(batches: &[Vec<Delta>], key: &str) -> u64 {
    let h = stable_hash(key);
    batches
        .iter()
        .flatten()
        .filter(|d| d.key_hash == h)
        .map(|d| d.cur + d.prev)
        .sum()
}

#[tokio::test]
async fn adaptive_sync_defers_far_keys_at_most_sync_every_flushes() {
    let store = Recorder::new();
    let l = lim(10_000, 60);
    let mut t = T0 + 1_000;
    // Warm-up: every flush sends everything.
    for _ in 0..SYNC_EVERY {
        assert_eq!(admitted(&l, "far", 1, t), 1);
        l.flush_once(&store, t).await.unwrap();
        t += 50;
    }
    assert_eq!(sent(&store.take(), "far"), SYNC_EVERY);
    // "near" is at 60% of its limit: synced at every flush; "far" (a few per flush, far
    // below its limit) only every SYNC_EVERY-th flush, all deferred keys together.
    assert_eq!(admitted(&l, "near", 6_000, t), 6_000);
    let mut calls_with_far = 0;
    let mut last_far = 0u64;
    for k in 0..(4 * SYNC_EVERY) {
        assert_eq!(admitted(&l, "far", 3, t), 3);
        assert_eq!(admitted(&l, "near", 1, t), 1);
        l.flush_once(&store, t).await.unwrap();
        let b = store.take();
        assert_eq!(b.len(), 1, "near is sent at every flush");
        assert!(sent(&b, "near") >= 1);
        if sent(&b, "far") > 0 {
            calls_with_far += 1;
            // Never more than SYNC_EVERY flushes' worth of deltas held back.
            assert!(sent(&b, "far") <= 3 * SYNC_EVERY, "flush {k}");
            assert!(k - last_far <= SYNC_EVERY || last_far == 0, "flush {k}");
            last_far = k;
        }
        t += 50;
    }
    assert_eq!(calls_with_far, 4);
    let g = store.inner.counts(stable_hash("far"), t / W).cur;
    assert!(g >= SYNC_EVERY + 3 * 3 * SYNC_EVERY, "{g}");
    // Nothing else queued: idle flushes make no store call until every deferred key is in.
    let mut calls = 0;
    for _ in 0..SYNC_EVERY {
        if l.flush_once(&store, t).await.unwrap().called_store {
            calls += 1;
        }
        t += 50;
    }
    assert!(calls <= 1, "{calls}");
    assert_eq!(l.unsent_admissions(), 0);
    assert_eq!(
        store.inner.counts(stable_hash("far"), t / W).cur,
        SYNC_EVERY + 3 * 4 * SYNC_EVERY
    );
}

#[tokio::test]
async fn adaptive_sync_sends_at_once_near_the_limit_or_on_a_large_delta() {
    let store = Recorder::new();
    let l = lim(1_000, 60);
    let mut t = T0 + 1_000;
    // Warm-up, then one more: the next flush is not an every-SYNC_EVERY one.
    for _ in 0..=SYNC_EVERY {
        l.flush_once(&store, t).await.unwrap();
        t += 50;
    }
    store.take();
    // Small deltas far from the limit: deferred.
    assert_eq!(admitted(&l, "k", 5, t), 5);
    l.flush_once(&store, t + 1).await.unwrap();
    assert_eq!(sent(&store.take(), "k"), 0);
    // A delta of >= 10% of what is left: sent at the next flush (with the deferred ones).
    assert_eq!(admitted(&l, "k", 100, t + 50), 100);
    l.flush_once(&store, t + 51).await.unwrap();
    assert_eq!(sent(&store.take(), "k"), 105);
    // Crossing 50% of the limit in small steps: from then on at every flush.
    let mut total = 105;
    let mut t = t + 100;
    while total < 600 {
        let n = admitted(&l, "k", 60, t) as u64;
        total += n;
        l.flush_once(&store, t + 1).await.unwrap();
        let s = sent(&store.take(), "k");
        if total >= 500 {
            assert_eq!(s, n, "at {total}");
        }
        t += 50;
    }
    assert_eq!(store.inner.counts(stable_hash("k"), t / W).cur, total);
}

#[tokio::test]
async fn shutdown_flush_sends_deferred_keys() {
    let store = Recorder::new();
    let l = lim(1_000_000, 60);
    let mut t = T0 + 1_000;
    // Warm-up, then one more: the next flush is not an every-SYNC_EVERY one.
    for _ in 0..=SYNC_EVERY {
        l.flush_once(&store, t).await.unwrap();
        t += 50;
    }
    assert_eq!(admitted(&l, "k", 3, t), 3);
    assert!(!l.flush_once(&store, t).await.unwrap().called_store);
    assert_eq!(l.unsent_admissions(), 3);
    let o = l.flush_all(&store, t + 1).await.unwrap();
    assert_eq!((o.keys, o.admissions), (1, 3));
    assert_eq!(l.unsent_admissions(), 0);
}

#[tokio::test]
async fn previous_window_is_read_until_final() {
    let store = Recorder::new();
    let l = lim(100, 10);
    let w = 10_000;
    let t0 = 100 * w;
    assert_eq!(admitted(&l, "k", 60, t0), 60);
    l.flush_once(&store, t0 + 1).await.unwrap();
    store.take();
    // Next window: another instance's late delta for the previous one.
    let d = Delta {
        key_hash: stable_hash("k"),
        window_secs: 10,
        window: 100,
        cur: 10,
        prev: 0,
        need_prev: true,
        floor_cur: 0,
        floor_prev: 0,
    };
    let deltas = [d];
    let b = Batch {
        id: 0,
        deltas: &deltas,
        now_ms: t0 + w,
    };
    store.inner.sync(b).await.unwrap();
    let mut need_prev = Vec::new();
    for e in [100, 150, 2_500, 2_550, 2_600] {
        assert_eq!(admitted(&l, "k", 1, t0 + w + e), 1);
        l.flush_once(&store, t0 + w + e).await.unwrap();
        let b = store.take();
        assert_eq!(b.len(), 1);
        need_prev.push(b[0][0].need_prev);
    }
    // Read until read late enough into the window (2 s, and 16 flush intervals: the long
    // gap before 2.5 s defers it to the next flush), then known final.
    assert_eq!(need_prev, [true, true, true, true, false]);
    let (win, prev, cur, _) = l.slot_counts("k").unwrap();
    assert_eq!((win, prev, cur), (101, 70, 5));
}

// ---------------------------------------------------------------------------------------
// Hardening (issue 9): keys are bytes, lost store data, eviction, local-only keys
// ---------------------------------------------------------------------------------------

#[test]
fn keys_are_compared_as_bytes() {
    let l = lim(3, 60);
    let n = |k: &[u8]| (0..5).filter(|_| l.check(k, T0).is_allowed()).count();
    assert_eq!(n(b"a\xff"), 3);
    // Not the same key, although both are "a\u{fffd}" when converted lossily.
    assert_eq!(n(b"a\xfe"), 3);
    assert_eq!(n("a\u{fffd}".as_bytes()), 3);
    assert_eq!(l.tracked_keys(), 3);
}

/// A LocalStore that can lose everything (`FLUSHALL`, a restart without persistence).
/// With `honor_floors` false it also ignores the floors (a store that cannot restore).
struct Lossy {
    inner: ArcSwap<LocalStore>,
    honor_floors: bool,
    /// Live instances it reports (`None`: not shared).
    instances: Option<u64>,
    /// Unreachable while set.
    down: std::sync::atomic::AtomicBool,
}

impl Lossy {
    fn new(honor_floors: bool) -> Self {
        Self {
            inner: ArcSwap::from_pointee(LocalStore::new()),
            honor_floors,
            instances: None,
            down: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A store shared by `n` instances that honours the floors.
    fn shared(n: u64) -> Self {
        Self {
            instances: Some(n),
            ..Self::new(true)
        }
    }

    fn wipe(&self) {
        self.inner.store(std::sync::Arc::new(LocalStore::new()));
    }
}

#[async_trait::async_trait]
impl CounterStore for Lossy {
    async fn sync(&self, batch: Batch<'_>) -> SyncResult {
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::Connect("refused".into()));
        }
        let mut b = batch.deltas.to_vec();
        if !self.honor_floors {
            for d in &mut b {
                d.floor_cur = 0;
                d.floor_prev = 0;
            }
        }
        let inner = self.inner.load_full();
        inner
            .sync(Batch {
                deltas: &b,
                ..batch
            })
            .await
    }
    fn kind(&self) -> &'static str {
        "test"
    }
    fn instances(&self) -> Option<u64> {
        self.instances
    }
}

/// Two instances, limit 20, and a loss while `a`'s view is one flush old: `a` knows 10
/// and refuses on its estimate of `b`'s unsynced admissions (not on the known counts); `b`
/// knows the real 20. `a` syncs first after the loss and restores its own 10: that answer
/// is no news about `b` and must not reopen the key (it used to drop the estimate and
/// admit half of the 10 "left"). `a` stays refused until `b` writes back its 20.
#[tokio::test]
async fn a_restored_total_does_not_reopen_a_key_refused_on_its_estimate() {
    let store = Lossy::shared(2);
    let (a, b) = (lim(20, 3600), lim(20, 3600));
    let t = T0 + 1_000;
    let (key, w) = (stable_hash("k"), t / 3_600_000);
    // Both learn the fleet size.
    a.flush_once(&store, t).await.unwrap();
    b.flush_once(&store, t).await.unwrap();
    assert_eq!((a.instances(), b.instances()), (2, 2));
    assert_eq!(admitted(&a, "k", 20, t + 1), 10); // its share of 20
    a.flush_once(&store, t + 2).await.unwrap(); // 10 known, 10 estimated for b
    assert_eq!(admitted(&b, "k", 20, t + 3), 10); // never synced: its share of 20
    b.flush_once(&store, t + 4).await.unwrap();
    assert_eq!(store.inner.load().counts(key, w).cur, 20);
    assert_eq!(admitted(&a, "k", 20, t + 5), 0, "a refuses on its estimate");
    assert_eq!(admitted(&b, "k", 20, t + 5), 0, "b refuses on the counts");
    assert_eq!(
        a.slot_counts("k").map(|c| c.2),
        Some(10),
        "a's view is one flush old"
    );

    store.wipe();
    // a syncs first, twice (no news: b has not written back yet).
    for k in 0..3 {
        a.flush_once(&store, t + 10 + k).await.unwrap();
        assert_eq!(admitted(&a, "k", 20, t + 20 + k), 0, "a after its sync {k}");
    }
    assert_eq!(store.inner.load().counts(key, w).cur, 10);
    // A store outage suspends the share; the estimate still counts (a Redis restart).
    store.down.store(true, Ordering::Relaxed);
    assert!(a.flush_once(&store, t + 25).await.is_err());
    assert_eq!(admitted(&a, "k", 20, t + 26), 0, "a during an outage");
    store.down.store(false, Ordering::Relaxed);
    // b writes back what it knew; a learns it.
    assert_eq!(admitted(&b, "k", 20, t + 30), 0);
    b.flush_once(&store, t + 31).await.unwrap();
    a.flush_once(&store, t + 32).await.unwrap();
    assert_eq!(store.inner.load().counts(key, w).cur, 20);
    assert_eq!(a.slot_counts("k").map(|c| c.2), Some(20));
    assert_eq!(admitted(&a, "k", 20, t + 33), 0);
    assert_eq!(admitted(&b, "k", 20, t + 33), 0);
}

/// 100 per hour, tracking at most `max_tracked_keys` keys.
fn hour_limiter(max_tracked_keys: usize) -> Limiter {
    Limiter::new(RateLimitParams {
        window_secs: 3600,
        limit: 100,
        max_tracked_keys,
        ..Default::default()
    })
}

#[test]
fn a_key_near_its_limit_outlives_a_flood() {
    // 1 h window, 4 slots per shard, 200k one-shot keys through them.
    let l = hour_limiter(64 * 4);
    let t = T0;
    assert_eq!(admitted(&l, "victim", 150, t), 100);
    assert_eq!(admitted(&l, "near", 60, t), 60);
    for i in 0..200_000u64 {
        l.check(&format!("flood-{i}"), t + 1 + i / 1_000);
        assert!(l.tracked_keys() <= 64 * 4);
    }
    assert!(l.evictions_total() > 190_000);
    assert_eq!(l.slot_counts("victim").map(|c| c.2), Some(100), "evicted");
    assert_eq!(l.slot_counts("near").map(|c| c.2), Some(60), "evicted");
    assert_eq!(admitted(&l, "victim", 100, t + 300), 0);
    assert_eq!(admitted(&l, "near", 100, t + 300), 40);
}

#[test]
fn an_evicted_key_comes_back_with_its_counts() {
    // One slot per shard (max_tracked_keys = 64): every new key evicts, even a key at its
    // limit; its ghost brings its counts back.
    let l = hour_limiter(64);
    assert_eq!(admitted(&l, "victim", 150, T0), 100);
    for i in 0..10_000u64 {
        l.check(&format!("flood-{i}"), T0 + 1);
    }
    assert!(
        l.slot_counts("victim").is_none(),
        "the flood did not evict it"
    );
    assert_eq!(admitted(&l, "victim", 100, T0 + 2), 0);
    assert_eq!(l.slot_counts("victim").map(|c| c.2), Some(100));
}

#[tokio::test]
async fn a_forgotten_key_waits_for_its_first_sync() {
    let store = LocalStore::new();
    let l = hour_limiter(64);
    assert_eq!(admitted(&l, "victim", 150, T0), 100);
    l.flush_once(&store, T0 + 1).await.unwrap();
    for i in 0..10_000u64 {
        l.check(&format!("flood-{i}"), T0 + 2);
    }
    // Its ghost lost as well (as if displaced by a larger one).
    for m in l.shards.iter() {
        lock(m).ghosts.clear();
    }
    assert!(l.slot_counts("victim").is_none());
    // Back, unknown: at most what a local-only key may hold, then refused until it syncs.
    let first = admitted(&l, "victim", 50, T0 + 3) as u64;
    assert!(
        first <= LOCAL_ONLY_MAX,
        "{first} admitted before its first sync"
    );
    assert_eq!(retry(l.check("victim", T0 + 3)), 1);
    l.flush_once(&store, T0 + 4).await.unwrap();
    assert_eq!(admitted(&l, "victim", 50, T0 + 5), 0);
    assert!(retry(l.check("victim", T0 + 5)) > 1);
}

#[tokio::test]
async fn keys_seen_once_stay_local() {
    let store = Recorder::new();
    let l = lim(100, 60);
    for i in 0..5_000 {
        assert!(l.check(&format!("once-{i}"), T0 + 1).is_allowed());
    }
    assert_eq!(admitted(&l, "twice", 2, T0 + 1), 2);
    for k in 0..=SYNC_EVERY {
        l.flush_once(&store, T0 + 50 * (k + 1)).await.unwrap();
    }
    l.flush_all(&store, T0 + 1_000).await.unwrap();
    let batches = store.take();
    let sent_keys: std::collections::HashSet<u128> =
        batches.iter().flatten().map(|d| d.key_hash).collect();
    assert_eq!(
        sent_keys.len(),
        1,
        "only the key seen twice reaches the store"
    );
    assert_eq!(sent(&batches, "twice"), 2);
    // Still tracked and counted locally.
    assert_eq!(l.tracked_keys(), 5_001);
    assert_eq!(l.slot_counts("once-7").map(|c| c.2), Some(1));
    // A local-only key refused (limit 1) matters at once.
    let l = lim(1, 60);
    assert_eq!(admitted(&l, "one", 3, T0), 1);
    l.flush_once(&store, T0 + 1).await.unwrap();
    assert_eq!(sent(&store.take(), "one"), 1);
}

#[test]
fn near_limit_and_estimates() {
    let wms = 10_000;
    // Rolled forward like the window math: previous window weighs (1 - e / w).
    assert_eq!(estimate_at(5, 10, 20, 5, wms, 0), 30);
    assert_eq!(estimate_at(5, 10, 20, 5, wms, 5_000), 25);
    assert_eq!(estimate_at(5, 10, 20, 6, wms, 5_000), 10);
    assert_eq!(estimate_at(5, 10, 20, 7, wms, 0), 0);
    // A clock behind the key's window: as of its start.
    assert_eq!(estimate_at(6, 10, 20, 5, wms, 9_000), 30);
}

/// A shared store (n = 2) whose answers come back only when `open[instance]`: the script
/// runs on arrival, its answer is applied later (a slow round trip), while both instances
/// go on deciding.
struct SlowFleet {
    inner: Fleet,
    open: [std::sync::atomic::AtomicBool; 2],
}

/// Instance `.1`'s connection to a [`SlowFleet`].
struct SlowLink<'a>(&'a SlowFleet, usize);

#[async_trait::async_trait]
impl CounterStore for SlowLink<'_> {
    async fn sync(&self, batch: Batch<'_>) -> SyncResult {
        let r = self.0.inner.sync(batch).await;
        let open = &self.0.open[self.1];
        std::future::poll_fn(|_| {
            if open.load(Ordering::Relaxed) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        r
    }
    fn kind(&self) -> &'static str {
        "test"
    }
    fn instances(&self) -> Option<u64> {
        self.0.inner.instances()
    }
}

/// Polls `f` once (the test drives time itself); true when it completed.
async fn poll_once<F: std::future::Future + ?Sized>(f: std::pin::Pin<&mut F>) -> bool {
    let mut f = Some(f);
    std::future::poll_fn(|cx| {
        let done = f.as_mut().is_some_and(|f| f.as_mut().poll(cx).is_ready());
        std::task::Poll::Ready(done)
    })
    .await
}

/// The xorshift generator of the slow-fleet runs: every timing of a run comes from its seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d))
    }

    /// A number below `m`.
    fn next(&mut self, m: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % m
    }
}

/// Two limiters `ls` on a [`SlowFleet`], on paused time from `T0 + 100`, 1 ms a step: each
/// flushes every 50 ms (its own phase) unless its last flush is still waiting for its
/// answer, which takes up to `lat` ms. Each step, after the flushes, `request(t, i, rng)`
/// is asked until it returns `None` which instance (0 or 1) takes the next request for
/// `key` (`i`: requests so far); `n` requests in all. Returns the admissions.
async fn slow_fleet_run(
    rng: &mut Rng,
    lat: u64,
    ls: &[Limiter; 2],
    key: &str,
    n: u64,
    mut request: impl FnMut(u64, u64, &mut Rng) -> Option<usize>,
) -> u64 {
    use std::future::Future;
    use std::pin::Pin;
    type Flush<'a> =
        Pin<Box<dyn Future<Output = Result<crate::ratelimit::FlushOutcome, StoreError>> + 'a>>;
    let store = SlowFleet {
        inner: Fleet::new(2),
        open: Default::default(),
    };
    let links = [SlowLink(&store, 0), SlowLink(&store, 1)];
    for (k, open) in store.open.iter().enumerate() {
        open.store(true, Ordering::Relaxed);
        ls[k].flush_once(&links[k], T0 + k as u64).await.unwrap();
    }
    let lat_max = 1 + rng.next(lat);
    let phase = [rng.next(50), rng.next(50)];
    let mut t = T0 + 100;
    let now = std::sync::atomic::AtomicU64::new(t);
    let clock = || now.load(Ordering::Relaxed);
    let mut inflight: [Option<(u64, Flush<'_>)>; 2] = [None, None];
    let (mut total, mut i) = (0, 0);
    while i < n {
        now.store(t, Ordering::Relaxed);
        for k in 0..2 {
            if let Some((done, f)) = inflight[k].as_mut() {
                store.open[k].store(t >= *done, Ordering::Relaxed);
                if poll_once(f.as_mut()).await {
                    inflight[k] = None;
                }
            }
            if inflight[k].is_none() && t % 50 == phase[k] {
                store.open[k].store(false, Ordering::Relaxed);
                let done = t + rng.next(lat_max);
                let mut f: Flush<'_> = Box::pin(ls[k].flush_once_clocked(&links[k], &clock));
                if !poll_once(f.as_mut()).await {
                    inflight[k] = Some((done, f));
                }
            }
        }
        while i < n {
            let Some(k) = request(t, i, rng) else { break };
            if ls[k].check(key, t).is_allowed() {
                total += 1;
            }
            i += 1;
        }
        t += 1;
    }
    total
}

/// One run of [`fleet_share_alternating_requests_with_slow_answers`]: 60 requests for one
/// key (limit 20 per 10 s) alternating between two instances, a random gap of 1 to
/// `gap_max` ms apart, on [`slow_fleet_run`]'s flushes with answers up to `lat` ms late.
/// Returns the admissions.
async fn alternating_run(seed: u64, lat: u64) -> u64 {
    let mut rng = Rng::new(seed);
    let gap_max = 1 + rng.next(12);
    let mut next_req = T0 + 100;
    let request = |t: u64, i: u64, rng: &mut Rng| {
        (t == next_req).then(|| {
            next_req = t + 1 + rng.next(gap_max);
            (i % 2) as usize
        })
    };
    slow_fleet_run(&mut rng, lat, &[lim(20, 10), lim(20, 10)], "k", 60, request).await
}

#[tokio::test]
async fn fleet_share_alternating_requests_with_slow_answers() {
    // The e2e policies test's burst (60 requests alternating between two instances, limit
    // 20, 50 ms flushes), on paused time, 2,000 random timings per answer latency bound.
    // While answers come back within the flush interval, the two admit at most the limit
    // plus n - 1 (both may draw the remainder of a share). An answer later than the interval
    // is older than the other instance's next sync, and the estimate of its unsynced admissions misses
    // them: a few runs admit 2 or 3 more. Measured at answers of 50 to 60 ms: 7 to 9 of
    // 2,000 runs over 21 (6 to 8 at 22, 1 at 23) with the remainder of a share drawn (the
    // draws are random per run); 12 (11 at 22, 1 at 23) when every share was rounded up;
    // 15 (12 at 22, 3 at 23) before a late answer kept the estimate (`slot::apply`). The rest: an answer to a flush that sent nothing
    // estimates the others at nothing, though they may have synced after the script ran.
    for lat in [5u64, 20, 49, 60] {
        let mut hist = std::collections::BTreeMap::new();
        for seed in 0..2_000u64 {
            *hist.entry(alternating_run(seed, lat).await).or_insert(0u32) += 1;
        }
        eprintln!("answers within {lat} ms: admitted (runs) {hist:?}");
        let worst = hist.keys().max().copied().unwrap_or(0);
        // Answers just inside the interval (49 ms of 50) can arrive after the other
        // instance's staggered sync: with drawn remainders 1 run in about 2,000 admitted
        // 22 there (CI, 2026-11-27), as late answers do.
        let bound = match lat {
            0..=20 => 21,
            21..=49 => 22,
            _ => 23,
        };
        assert!(
            worst <= bound,
            "answers within {lat} ms: {worst} admitted: {hist:?}"
        );
        assert!(hist.keys().min().is_some_and(|&m| m >= 15), "{hist:?}");
    }
}

#[tokio::test]
async fn a_late_answer_does_not_lower_the_estimate_of_the_others() {
    // One instance of two (limit 20): 6 admissions synced at 50 ms (estimate of the
    // other's unsynced admissions: 6), then 4 more, sent at 100 ms. Their answer says 10.
    // On time, the estimate becomes 4 (what was just sent): 20 - 14 leaves a share of 3.
    // Back at 160 ms, later than the 50 ms flush interval, the other instance may have
    // synced meanwhile: the estimate stays 6, and 20 - 16 leaves a share of 2.
    for (answer_at, share) in [(T0 + 100, 3), (T0 + 160, 2)] {
        let store = Fleet::new(2);
        let a = lim(20, 10);
        a.flush_once(&store, T0).await.unwrap();
        assert_eq!(admitted(&a, "k", 6, T0 + 10), 6);
        a.flush_once(&store, T0 + 50).await.unwrap();
        assert_eq!(admitted(&a, "k", 10, T0 + 60), 4);
        let calls = std::sync::atomic::AtomicU64::new(0);
        let clock = || match calls.fetch_add(1, Ordering::Relaxed) {
            0 => T0 + 100,
            _ => answer_at,
        };
        a.flush_once_clocked(&store, &clock).await.unwrap();
        assert_eq!(
            admitted(&a, "k", 10, answer_at + 1),
            share,
            "answer at {} ms",
            answer_at - T0
        );
    }
}

/// One run of [`burst_on_a_new_key_with_slow_answers`]: limit 200 per 60 s, two instances
/// that know each other, 800 requests for a key neither has seen, 1 to `per_ms` per ms to
/// either instance at random, on [`slow_fleet_run`]'s flushes with answers up to `lat` ms
/// late. Returns the admissions and the late answers counted by the two.
async fn burst_run(seed: u64, lat: u64, per_ms: u64) -> (u64, u64) {
    let mut rng = Rng::new(seed);
    let ls = [lim(200, 60), lim(200, 60)];
    // (the step, requests it still has to send)
    let mut this_ms = (0, 0);
    let request = |t: u64, _: u64, rng: &mut Rng| {
        if this_ms.0 != t {
            this_ms = (t, 1 + rng.next(per_ms));
        }
        (this_ms.1 > 0).then(|| {
            this_ms.1 -= 1;
            rng.next(2) as usize
        })
    };
    let total = slow_fleet_run(&mut rng, lat, &ls, "new", 800, request).await;
    let late = ls.iter().map(Limiter::late_answers_total).sum();
    (total, late)
}

#[tokio::test]
async fn burst_on_a_new_key_with_slow_answers() {
    // The e2e burst of `ratelimit_redis` (800 requests for a new key through two instances,
    // limit 200, 50 ms flushes), on paused time, 500 random timings per answer latency
    // bound. Answers within the flush interval: at most 1.05 x the limit (measured: 202
    // at most). Later answers (here up to 200 ms) let the shares overlap: measured up to
    // 244, over 210 in 81 of 500 runs (up to 249 at 400 ms); each such answer is counted
    // (`portcullis_ratelimit_store_late_answers_total`), and an operator sees why.
    for (lat, bound) in [(5u64, 210u64), (49, 210), (200, 250)] {
        let mut hist = std::collections::BTreeMap::new();
        let mut late = 0;
        for seed in 0..500u64 {
            let (admitted, l) = burst_run(seed, lat, 4).await;
            *hist.entry(admitted).or_insert(0u32) += 1;
            late += l;
        }
        let (min, max) = (hist.keys().min().copied(), hist.keys().max().copied());
        eprintln!("answers within {lat} ms: admitted {min:?}..={max:?}, {late} late answers");
        assert!(max.is_some_and(|m| m <= bound), "within {lat} ms: {hist:?}");
        assert!(min.is_some_and(|m| m >= 150), "within {lat} ms: {hist:?}");
        if lat < 50 {
            assert_eq!(late, 0, "answers within the interval are not late");
        } else {
            assert!(late > 0, "answers up to {lat} ms: none counted late");
        }
    }
}
