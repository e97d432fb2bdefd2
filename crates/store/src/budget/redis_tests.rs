//! Tests of the Redis budget against a real `redis-server` started on a free port
//! (skipped with a note when `redis-server` is not on PATH). Only the child this
//! test started is ever killed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::{RedisClient, StoreError};
use portcullis_policy::cull::{Buckets, ClaimOutcome, CullParams, FleetDelta};

// The kit's launcher (crates/test-kit), the one place that starts `redis-server`.
use portcullis_test_kit::RedisServer;

/// A budget on its own [`RedisClient`] (an instance of its own).
fn redis_budget(url: &str, prefix: &str, timeout: Duration) -> RedisBudget {
    RedisBudget::new(Arc::new(RedisClient::new(url, prefix, timeout).unwrap()))
}

fn budget(r: &RedisServer, prefix: &str) -> RedisBudget {
    redis_budget(&r.url(), prefix, Duration::from_millis(500))
}

fn params(tokens: u32, fraction: f64) -> CullParams {
    CullParams::for_tests(tokens, fraction)
}

/// `n` concurrent tasks, each its own "instance" (own connection), claiming
/// backend `b{i % 10}` of a 10-backend upstream. Returns (granted, renewed, other).
async fn race(r: &RedisServer, prefix: &str, n: usize, p: &CullParams) -> (usize, usize, usize) {
    let p = Arc::new(p.clone());
    let start = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let b = budget(r, prefix);
        let p = Arc::clone(&p);
        let start = Arc::clone(&start);
        tasks.push(tokio::spawn(async move {
            // Connect first so the claims really race. 60 simultaneous connects to
            // a fresh server can lose one ("broken pipe"); a read is safe to retry.
            let mut tries = 0;
            while let Err(e) = b.tokens_available(&p).await {
                tries += 1;
                assert!(tries < 5, "cannot connect: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            start.wait().await;
            b.claim("app", &format!("b{}", i % 10), 10, &p)
                .await
                .unwrap()
        }));
    }
    let (mut g, mut rn, mut o) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            ClaimOutcome::Granted { .. } => g += 1,
            ClaimOutcome::Renewed { .. } => rn += 1,
            _ => o += 1,
        }
    }
    (g, rn, o)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_respect_token_bucket() {
    let Some(r) = RedisServer::try_start() else {
        return;
    };
    let p = params(3, 1.0);
    let (granted, _renewed, _other) = race(&r, "t1", 60, &p).await;
    assert_eq!(granted, 3, "exactly `tokens` culls granted fleet-wide");
    let b = budget(&r, "t1");
    assert_eq!(b.active_claims("app").await.unwrap().len(), 3);
    let left = b.tokens_available(&p).await.unwrap();
    assert!(left < 0.1, "bucket empty, got {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_respect_fraction() {
    let Some(r) = RedisServer::try_start() else {
        return;
    };
    // A refill too slow to show within the test, so the token count is exact.
    let p = CullParams {
        token_period_secs: 100_000_000,
        ..params(1000, 0.5)
    };
    let (granted, _renewed, _other) = race(&r, "t2", 60, &p).await;
    assert_eq!(granted, 5, "at most half of 10 backends out");
    let b = budget(&r, "t2");
    let active = b.active_claims("app").await.unwrap();
    assert_eq!(active.len(), 5);
    assert!(active.iter().all(|c| c.remaining_ms > 70_000));
    // Over-budget claims spent no token.
    let left = b.tokens_available(&p).await.unwrap();
    assert!((995.0..=995.1).contains(&left), "tokens left {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_costs_no_token_and_last_backend_stays() {
    let Some(r) = RedisServer::try_start() else {
        return;
    };
    let b = budget(&r, "t3");
    let p = params(2, 1.0);
    let ClaimOutcome::Granted {
        tokens_left,
        dry_run: false,
        ..
    } = b.claim("app", "a", 2, &p).await.unwrap()
    else {
        panic!("first claim must be granted");
    };
    assert!((1.0..1.01).contains(&tokens_left), "{tokens_left}");
    for _ in 0..20 {
        assert!(b.renew("app", "a", p.lease_ttl_ms()).await.unwrap());
        assert!(matches!(
            b.claim("app", "a", 2, &p).await.unwrap(),
            ClaimOutcome::Renewed { .. }
        ));
    }
    let left = b.tokens_available(&p).await.unwrap();
    assert!((1.0..1.01).contains(&left), "renewals spent tokens: {left}");
    // Never the last of two, even with fraction 1.0 and tokens left.
    assert_eq!(
        b.claim("app", "b", 2, &p).await.unwrap(),
        ClaimOutcome::OverBudget {
            active: 1,
            max_out: 1
        }
    );
    // Never the only one.
    assert!(matches!(
        b.claim("solo", "x", 1, &p).await.unwrap(),
        ClaimOutcome::OverBudget { max_out: 0, .. }
    ));
    // Not held → renew fails; release frees the slot (no refund).
    assert!(!b.renew("app", "zzz", 1000).await.unwrap());
    assert!(b.release("app", "a").await.unwrap());
    assert!(!b.release("app", "a").await.unwrap());
    assert!(matches!(
        b.claim("app", "b", 2, &p).await.unwrap(),
        ClaimOutcome::Granted { .. }
    ));
    assert!(matches!(
        b.claim("other", "c", 2, &p).await.unwrap(),
        ClaimOutcome::NoToken { retry_after_ms } if retry_after_ms > 290_000 && retry_after_ms <= 300_000
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_frees_the_slot() {
    let Some(r) = RedisServer::try_start() else {
        return;
    };
    let b = budget(&r, "t4");
    let p = params(10, 0.5);
    assert!(b.claim("app", "a", 2, &p).await.unwrap().is_held());
    assert!(matches!(
        b.claim("app", "b", 2, &p).await.unwrap(),
        ClaimOutcome::OverBudget { .. }
    ));
    // Shorten the lease to 300 ms and wait for it to lapse (bounded poll).
    assert!(b.renew("app", "a", 300).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if b.active_claims("app").await.unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "lease did not expire");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!b.renew("app", "a", 1000).await.unwrap(), "expired lease");
    assert!(matches!(
        b.claim("app", "b", 2, &p).await.unwrap(),
        ClaimOutcome::Granted { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_prefixed_tagged_and_expire() {
    let Some(r) = RedisServer::try_start() else {
        return;
    };
    let b = budget(&r, "pfx");
    let p = params(10, 0.5);
    assert!(b.claim("app", "a", 4, &p).await.unwrap().is_held());
    assert!(b.claim("api", "x", 4, &p).await.unwrap().is_held());
    let mut c = ::redis::Client::open(r.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "pfx:cull:{pfx}:claims:api",
            "pfx:cull:{pfx}:claims:app",
            "pfx:cull:{pfx}:tokens",
            "pfx:cull:{pfx}:version"
        ]
    );
    for k in &keys {
        let ttl: i64 = ::redis::cmd("PTTL").arg(k).query(&mut c).unwrap();
        assert!(ttl > 0, "{k} has no TTL");
    }
    let s = b.snapshot(&["app", "none", "api"], &p).await.unwrap();
    assert!((8.0..8.01).contains(&s.tokens_available));
    assert_eq!(s.claims[0][0].backend, "a");
    assert!(s.claims[1].is_empty());
    assert_eq!(s.claims[2][0].backend, "x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_commits_nothing() {
    let Some(r) = RedisServer::try_start() else {
        return;
    };
    let b = budget(&r, "t6");
    let mut p = params(1, 0.5);
    p.dry_run = true;
    for _ in 0..3 {
        assert!(matches!(
            b.claim("app", "a", 4, &p).await.unwrap(),
            ClaimOutcome::Granted { dry_run: true, .. }
        ));
    }
    assert!(b.active_claims("app").await.unwrap().is_empty());
    assert_eq!(b.tokens_available(&p).await.unwrap(), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_errors_quickly_then_recovers() {
    let Some(mut r) = RedisServer::try_start() else {
        return;
    };
    let timeout = Duration::from_millis(200);
    let b = redis_budget(&r.url(), "t7", timeout);
    let p = params(10, 0.5);
    assert!(b.claim("app", "a", 4, &p).await.unwrap().is_held());
    r.kill();
    for _ in 0..3 {
        let t = Instant::now();
        let res = b.claim("app", "b", 4, &p).await;
        assert!(res.is_err(), "{res:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        let t = Instant::now();
        assert!(b.snapshot(&["app"], &p).await.is_err());
        assert!(t.elapsed() < Duration::from_secs(1));
    }
    // A black-holed address (accepts nothing, answers nothing) is bounded too.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_url = format!("redis://{}/", hole.local_addr().unwrap());
    let hb = redis_budget(&hole_url, "t7", timeout);
    let t = Instant::now();
    assert!(matches!(
        hb.claim("app", "b", 4, &p).await,
        Err(StoreError::Timeout)
    ));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // Redis back (empty): the same budget reconnects by itself.
    r.restart();
    assert!(b.claim("app", "b", 4, &p).await.unwrap().is_held());
}

/// Claims/second the Lua script sustains against a local redis-server.
/// `cargo test --release -- --ignored --nocapture claim_throughput`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn claim_throughput() {
    let Some(r) = RedisServer::try_start() else {
        return;
    };
    let b = Arc::new(budget(&r, "bench"));
    let p = params(1_000_000, 1.0);
    let n = 20_000usize;
    // Sequential, renew path (backend already held → lease renewal, no token).
    assert!(b.claim("app", "held", 1000, &p).await.unwrap().is_held());
    let t = Instant::now();
    for _ in 0..n {
        b.claim("app", "held", 1000, &p).await.unwrap();
    }
    let seq = n as f64 / t.elapsed().as_secs_f64();
    // Concurrent (64 in flight on one multiplexed connection), grant path over
    // 64 upstreams of 1000 backends, then releases.
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..64 {
        let b = Arc::clone(&b);
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..(n / 64) {
                let up = format!("u{w}");
                let o = b.claim(&up, &format!("b{i}"), 1000, &p).await.unwrap();
                assert!(o.is_held() || matches!(o, ClaimOutcome::OverBudget { .. }));
                b.release(&up, &format!("b{i}")).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let conc = (n / 64 * 64) as f64 / t.elapsed().as_secs_f64();
    eprintln!(
        "claim throughput: sequential renew path {seq:.0}/s; 64-way concurrent claim+release {conc:.0} pairs/s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_error_counts_add_up_across_instances() {
    let Some(r) = RedisServer::try_start() else {
        return;
    };
    let a = budget(&r, "fl");
    let b = budget(&r, "fl");
    let buckets = Buckets::new(60, 10);
    let now = 1_700_000_005;
    let d = |backend: &str, requests, errors, since_secs| FleetDelta {
        backend: backend.into(),
        requests,
        errors,
        since_secs,
    };
    // instance A sees 3 errors of 10 on x; instance B 4 of 10 on x and none on y
    let fa = a
        .exchange_errors("app", &[d("x", 10, 3, 0), d("y", 5, 0, 0)], now, buckets)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fa, vec![(10, 3), (5, 0)]);
    let fb = b
        .exchange_errors(
            "app",
            &[d("x", 10, 4, 0), d("y", 0, 0, 0)],
            now + 12,
            buckets,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        fb,
        vec![(20, 7), (5, 0)],
        "the fleet's totals over the window"
    );
    // a readmission forgives the buckets before it
    let forgiven = a
        .exchange_errors("app", &[d("x", 0, 0, now + 12)], now + 13, buckets)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(forgiven, vec![(0, 0)]);
    // every bucket key is prefixed and expires
    let mut c = ::redis::Client::open(r.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("fl:cull:*err*")
        .query(&mut c)
        .unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");
    for k in &keys {
        let ttl: i64 = ::redis::cmd("TTL").arg(k).query(&mut c).unwrap();
        assert!(ttl > 0, "{k} has no TTL");
    }
    // the in-process budget has no fleet counters: the local window is the fleet
    assert!(LocalBudget::new()
        .exchange_errors("app", &[d("x", 1, 1, 0)], now, buckets)
        .await
        .is_none());
}
