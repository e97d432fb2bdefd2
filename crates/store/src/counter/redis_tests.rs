//! Integration tests against a real `redis-server` started by the test on a free port.
//! Skipped (with a message) when `redis-server` is not on PATH.

use std::time::Duration;

use super::*;
use crate::{RedisClient, StoreError};
use portcullis_policy::ratelimit::hash::stable_hash;
use portcullis_policy::ratelimit::{simulate, SIM_T0 as T0};
use portcullis_policy::ratelimit::{Limiter, RateLimitParams};

// The kit's launcher (crates/test-kit), the one place that starts `redis-server`.
use portcullis_test_kit::RedisServer;

/// A `redis-server` that allows `DEBUG SLEEP`, or `None` (skip) when none is installed.
fn start() -> Option<RedisServer> {
    RedisServer::available()
        .then(|| RedisServer::start_with_args(&["--enable-debug-command", "yes"]))
}

async fn conn(port: u16) -> ::redis::RedisResult<::redis::aio::MultiplexedConnection> {
    let c = ::redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    c.get_multiplexed_async_connection().await
}

fn store(port: u16, prefix: &str) -> RedisStore {
    client(port, prefix, 200)
}

/// A store on its own [`RedisClient`] (`timeout_ms` on connect and every call).
fn client(port: u16, prefix: &str, timeout_ms: u64) -> RedisStore {
    let c = RedisClient::new(
        &format!("redis://127.0.0.1:{port}/"),
        prefix,
        Duration::from_millis(timeout_ms),
    )
    .unwrap();
    RedisStore::new(std::sync::Arc::new(c))
}

/// The keys matching `pattern`: at least one, each with a TTL.
async fn keys_with_ttl(port: u16, pattern: &str) -> Vec<String> {
    let mut c = conn(port).await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!keys.is_empty(), "no key matches {pattern}");
    for k in &keys {
        let ttl: i64 = ::redis::cmd("TTL")
            .arg(k)
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(ttl > 0, "{k} ttl {ttl}");
    }
    keys
}

/// The server's `INFO section` text.
async fn info(port: u16, section: &str) -> String {
    let mut c = conn(port).await.unwrap();
    ::redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .unwrap()
}

async fn evalsha_calls(port: u16) -> u64 {
    let info = info(port, "commandstats").await;
    let mut total = 0;
    for line in info.lines() {
        if line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:") {
            if let Some(n) = line
                .split(',')
                .next()
                .and_then(|f| f.split("calls=").nth(1))
            {
                total += n.parse::<u64>().unwrap();
            }
        }
    }
    total
}

fn lim(limit: u64, window_secs: u64) -> Limiter {
    Limiter::new(RateLimitParams {
        window_secs,
        limit,
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_converge_on_one_limit() {
    let Some(srv) = start() else { return };
    let sa = store(srv.port(), "t1");
    let sb = store(srv.port(), "t1");
    // 60 s window, limit 30,000: each instance at 4x = 2,000 req/s, 3 windows (+1 warm-up).
    let (a, b) = (lim(30_000, 60), lim(30_000, 60));
    let before = evalsha_calls(srv.port()).await;
    let per_window = simulate(&a, &b, &sa, &sb, 30_000, 3).await;
    let cmds = evalsha_calls(srv.port()).await - before;
    let requests = 2 * 4 * 30_000 * 4;
    let ratios: Vec<f64> = per_window.iter().map(|n| *n as f64 / 30_000.0).collect();
    eprintln!(
        "redis 2 instances @2000 req/s each: admitted per window {per_window:?} ratios {ratios:?}; \
         {cmds} script calls for {requests} requests = {:.4} per request",
        cmds as f64 / requests as f64
    );
    for r in &ratios {
        assert!((0.95..=1.03).contains(r), "ratio {r}");
    }
    assert!((cmds as f64 / requests as f64) <= 0.05);

    // Contract defaults (limit 600 per 60 s), 4x each; then a 1 s window, where the 50 ms
    // flush is 5% of the window, so the overshoot bound is looser.
    for (window_secs, prefix, most) in [(60, "t2", 1.03), (1, "t3", 1.10)] {
        let (a, b) = (lim(600, window_secs), lim(600, window_secs));
        let (sa, sb) = (store(srv.port(), prefix), store(srv.port(), prefix));
        let per_window = simulate(&a, &b, &sa, &sb, 600, 3).await;
        eprintln!(
            "redis 2 instances, limit 600/{window_secs} s: admitted per window {per_window:?}"
        );
        for n in &per_window {
            let r = *n as f64 / 600.0;
            assert!((0.95..=most).contains(&r), "ratio {r}");
        }
    }

    // Everything written starts with the prefix, has a TTL and never holds the raw key.
    let keys = keys_with_ttl(srv.port(), "*").await;
    for k in &keys {
        assert!(
            ["t1:rl:", "t2:rl:", "t3:rl:"]
                .iter()
                .any(|p| k.starts_with(p)),
            "{k}"
        );
        assert!(!k.contains("hot"), "{k}");
    }
    let h = portcullis_policy::ratelimit::hash::hash_hex(stable_hash("hot"));
    assert!(keys.iter().any(|k| k.contains(&h)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_keeps_deltas_and_delivers_them() {
    let Some(mut srv) = start() else { return };
    let port = srv.port();
    let st = store(port, "out");
    let l = lim(1_000, 3600);
    let now = T0;
    for _ in 0..10 {
        assert!(l.check("k", now).is_allowed());
    }
    l.flush_once(&st, now + 1).await.unwrap();
    assert!(l.store_healthy());
    let key = st.redis_key(stable_hash("k"), now / 3_600_000);

    // Kill the server we started (by its PID).
    srv.kill();
    for i in 0..25 {
        assert!(l.check("k", now + 2 + i).is_allowed());
    }
    let t = std::time::Instant::now();
    assert!(l.flush_once(&st, now + 100).await.is_err());
    assert!(t.elapsed() < Duration::from_millis(1_000));
    assert!(!l.store_healthy());
    assert!(l.store_errors_total() >= 1);
    assert_eq!(l.unsent_admissions(), 25);
    // Counts stay enforced locally: 10 known globally + 25 local.
    let (_, _, cur, g) = l.slot_counts_for_tests("k");
    assert_eq!((cur, g), (35, 10));

    // Back on the same port (empty, no persistence): the outage's 25 arrive, and the 10 the
    // restarted Redis lost are restored from what this instance knew (not trusted as 0).
    srv.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if l.flush_once(&st, now + 200).await.is_ok() && l.unsent_admissions() == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(l.store_healthy());
    let mut c = conn(srv.port()).await.unwrap();
    let v: i64 = ::redis::cmd("GET")
        .arg(&key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(v, 10 + 25);
}

/// `FLUSHALL` (or a restart without persistence) under a key at its limit: the instances
/// that knew the count write it back at their next sync instead of granting a fresh quota,
/// and two instances that both knew it restore it once, not twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_counts_are_restored_once() {
    let Some(srv) = start() else { return };
    let (sa, sb) = (store(srv.port(), "ls"), store(srv.port(), "ls"));
    let (a, b) = (lim(100, 3600), lim(100, 3600));
    let t = T0 + 1_000;
    assert_eq!(
        (0..150).filter(|_| a.check("k", t).is_allowed()).count(),
        100
    );
    a.flush_once(&sa, t + 1).await.unwrap();
    // `b` learns the key (its first admissions, then its sync) and `a` syncs again: both
    // know the same total.
    b.flush_once(&sb, t + 2).await.unwrap();
    b.check("k", t + 3);
    b.check("k", t + 4);
    b.flush_once(&sb, t + 5).await.unwrap();
    a.check("k", t + 6);
    a.flush_once(&sa, t + 7).await.unwrap();
    let key = sa.redis_key(stable_hash("k"), t / 3_600_000);
    let mut c = conn(srv.port()).await.unwrap();
    let get = |c: &mut ::redis::aio::MultiplexedConnection| {
        let key = key.clone();
        let mut c = c.clone();
        async move {
            let v: Option<i64> = ::redis::cmd("GET")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
            v
        }
    };
    let known = get(&mut c).await;
    assert!(known.is_some_and(|v| v >= 100), "{known:?}");
    let _: String = ::redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    assert_eq!(get(&mut c).await, None);
    // Both keep refusing, sync (the refusals queue the key), and restore 100 between them.
    for (i, (l, st)) in [(&a, &sa), (&b, &sb)].into_iter().enumerate() {
        let now = t + 10 + i as u64;
        assert!(!l.check("k", now).is_allowed());
        l.flush_once(st, now).await.unwrap();
    }
    assert_eq!(
        get(&mut c).await,
        known,
        "restored once, not once per instance"
    );
    let ttl: i64 = ::redis::cmd("TTL")
        .arg(&key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(ttl > 0, "restored counter without TTL: {ttl}");
    for (l, st) in [(&a, &sa), (&b, &sb)] {
        l.flush_once(st, t + 100).await.unwrap();
        assert_eq!(
            (0..20)
                .filter(|_| l.check("k", t + 101).is_allowed())
                .count(),
            0
        );
    }
    assert_eq!(get(&mut c).await, known);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_listener_times_out() {
    // Accepts connections and never answers (no redis-server needed).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut socks = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            socks.push(s);
        }
    });
    let st = client(port, "x", 100);
    let l = lim(10, 60);
    assert!(l.check("k", T0).is_allowed());
    let t = std::time::Instant::now();
    let r = l.flush_once(&st, T0 + 1).await;
    assert!(r.is_err(), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_millis(600),
        "{:?}",
        t.elapsed()
    );
    assert!(!l.store_healthy());
    // Decisions are unaffected.
    assert!(l.check("k", T0 + 2).is_allowed());
    // During the backoff the next flush fails fast without the network.
    let t = std::time::Instant::now();
    assert_eq!(l.flush_once(&st, T0 + 3).await, Err(StoreError::Backoff));
    // Well under the 200 ms call timeout: no network was involved.
    assert!(
        t.elapsed() < Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(l.unsent_admissions(), 2);
    hold.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_times_out_then_recovers() {
    let Some(srv) = start() else { return };
    let st = store(srv.port(), "slp");
    let l = lim(10, 60);
    assert!(l.check("k", T0).is_allowed());
    l.flush_once(&st, T0 + 1).await.unwrap();
    let port = srv.port();
    let sleeper = tokio::spawn(async move {
        let mut c = conn(port).await.unwrap();
        let _: ::redis::RedisResult<String> = ::redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1")
            .query_async(&mut c)
            .await;
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(l.check("k", T0 + 2).is_allowed());
    let t = std::time::Instant::now();
    assert_eq!(l.flush_once(&st, T0 + 3).await, Err(StoreError::Timeout));
    assert!(t.elapsed() < Duration::from_millis(500));
    assert!(!l.store_healthy());
    sleeper.await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(l.flush_once(&st, T0 + 4).await.is_ok() && l.unsent_admissions() == 0) {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(l.store_healthy());
    let mut c = conn(srv.port()).await.unwrap();
    let v: i64 = ::redis::cmd("GET")
        .arg(st.redis_key(stable_hash("k"), T0 / 60_000))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(v, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_size_is_learned_and_a_new_key_is_shared() {
    let Some(srv) = start() else { return };
    let (sa, sb) = (store(srv.port(), "fl"), store(srv.port(), "fl"));
    let (a, b) = (lim(200, 60), lim(200, 60));
    // Idle probes carry the heartbeat: one script call each, both learn n = 2.
    a.flush_once(&sa, T0).await.unwrap();
    // (The first call also loads the script.)
    let before = evalsha_calls(srv.port()).await;
    b.flush_once(&sb, T0 + 1).await.unwrap();
    a.flush_once(&sa, T0 + 1_002).await.unwrap();
    assert_eq!(evalsha_calls(srv.port()).await - before, 2);
    assert_eq!((a.instances(), b.instances()), (2, 2));
    // A burst on a key neither has seen, through both, over several flushes.
    let mut total = 0;
    for ms in 0..300u64 {
        let t = T0 + 1_100 + ms;
        total += (0..4).filter(|_| a.check("fresh", t).is_allowed()).count();
        total += (0..4).filter(|_| b.check("fresh", t).is_allowed()).count();
        if t % 50 == 0 {
            a.flush_once(&sa, t).await.unwrap();
        }
        if t % 50 == 20 {
            b.flush_once(&sb, t).await.unwrap();
        }
    }
    a.flush_once(&sa, T0 + 1_500).await.unwrap();
    b.flush_once(&sb, T0 + 1_500).await.unwrap();
    let mut c = conn(srv.port()).await.unwrap();
    let in_redis: i64 = ::redis::cmd("GET")
        .arg(sa.redis_key(stable_hash("fresh"), T0 / 60_000))
        .query_async(&mut c)
        .await
        .unwrap();
    eprintln!(
        "redis, 2 instances, burst on a new key: {total} admitted (limit 200), {in_redis} in Redis"
    );
    assert_eq!(in_redis as usize, total);
    assert!((190..=201).contains(&total), "{total}");

    // Heartbeat keys: prefixed, hash-tagged, with a TTL.
    keys_with_ttl(srv.port(), "fl:rl:{instances}:*").await;

    // `b` stops: after two heartbeat buckets `a` is alone again and gets the whole limit.
    let later = T0 + 1_500 + 2 * HEARTBEAT_BUCKET_MS + 1;
    a.flush_once(&sa, later).await.unwrap();
    assert_eq!(a.instances(), 1);
    let alone = (0..300)
        .filter(|_| a.check("other", later + 1).is_allowed())
        .count();
    assert_eq!(alone, 200);
}

/// `total_commands_processed` of the server (counts the commands a script runs too).
async fn total_commands(port: u16) -> u64 {
    info(port, "stats")
        .await
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .map(|v| v.trim().parse::<u64>().unwrap())
        .unwrap()
}

/// One limiter, 8 keys, a limit that never binds, `rate` requests/s spread over the keys,
/// a flush every 50 ms, 10 simulated seconds. Returns (Redis commands, script calls,
/// requests).
async fn measure_commands(port: u16, prefix: &str, rate: u64) -> (u64, u64, u64) {
    let l = lim(1_000_000_000, 60);
    let st = store(port, prefix);
    // 5 s before the end of a window: the run crosses one window boundary.
    let start = T0 + 55_000;
    l.flush_once(&st, start).await.unwrap();
    // (each read below is one command itself: subtract them)
    let c0 = total_commands(port).await;
    let e0 = evalsha_calls(port).await;
    let secs = 10;
    let total = rate * secs;
    let mut next_flush = start + 50;
    for k in 0..total {
        let t = start + k * 1_000 / rate;
        while next_flush <= t {
            l.flush_once(&st, next_flush).await.unwrap();
            next_flush += 50;
        }
        assert!(l.check(&format!("api-key-{}", k % 8), t).is_allowed());
    }
    while next_flush <= start + secs * 1_000 {
        l.flush_once(&st, next_flush).await.unwrap();
        next_flush += 50;
    }
    let c1 = total_commands(port).await;
    let e1 = evalsha_calls(port).await;
    // INFO stats, INFO commandstats (x2) between the two reads of the counter.
    (c1 - c0 - 3, e1 - e0, total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_commands_per_request() {
    let Some(srv) = start() else { return };
    for (rate, prefix) in [(9_000u64, "m9"), (2_000, "m2")] {
        let (cmds, calls, requests) = measure_commands(srv.port(), prefix, rate).await;
        let per = cmds as f64 / requests as f64;
        eprintln!(
            "1 instance, 8 keys @ {rate} req/s, 50 ms flushes, 10 s: {cmds} Redis commands \
             ({per:.4} per request), {calls} script calls ({:.4} per request)",
            calls as f64 / requests as f64
        );
        if rate == 2_000 {
            assert!(per <= 0.05, "{per} commands per request at {rate} req/s");
        }
    }
}
