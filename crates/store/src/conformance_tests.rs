//! One table per need, each run against both twins, the Redis one on a real
//! `redis-server` (a free port, started by the test kit) and the in-process one:
//!
//! * the fleet token bucket ([`FleetBucket`]): `CASES` below;
//! * culling's disruption budget ([`BudgetStore`]): `BUDGET_CASES`;
//! * the rate limiter's counters ([`CounterStore`]): `COUNTER_CASES`.
//!
//! Each twin is reached through its trait object, as its callers hold it.
//!
//! The token-bucket table: the Redis bucket
//! ([`RedisBucket`](crate::RedisBucket), the Lua arithmetic against a real `redis-server` on a
//! free port) and the in-process one ([`LocalBucket`](crate::LocalBucket), the Rust arithmetic).
//! Both run on real time (the server's clock, the process's clock): the table's
//! periods are long, so that the few milliseconds a case takes change its results
//! by less than the tolerance; one refill case with a short period is polled.
//! The Redis half is skipped (with a note) when `redis-server` is not on PATH.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::unix_ms;
use crate::{BudgetStore, FleetBucket, RedisClient, Store, Take};
use portcullis_policy::cull::{ClaimOutcome, CullParams};
use portcullis_policy::ratelimit::{Batch, Delta, GlobalCounts};

// The kit's launcher (crates/test-kit), the one place that starts `redis-server`.
use portcullis_test_kit::RedisServer;

/// What one take must answer.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Granted, this many tokens left.
    Granted(f64),
    /// Empty, the next token in about this many ms (`u64::MAX`: never).
    Empty(u64),
}

use Expect::{Empty, Granted};

/// Slack on `retry_after_ms` for the time a case takes (tokens refill meanwhile).
const RETRY_SLACK_MS: u64 = 1_000;

struct Case {
    name: &'static str,
    cap: u32,
    period_ms: u64,
    takes: &'static [Expect],
}

const HOUR: u64 = 3_600_000;

const CASES: &[Case] = &[
    Case {
        name: "a full bucket grants its capacity, then waits period / cap",
        cap: 3,
        period_ms: 600_000,
        takes: &[Granted(2.0), Granted(1.0), Granted(0.0), Empty(200_000)],
    },
    Case {
        name: "capacity 1",
        cap: 1,
        period_ms: HOUR,
        takes: &[Granted(0.0), Empty(HOUR), Empty(HOUR)],
    },
    Case {
        name: "capacity 0 never grants",
        cap: 0,
        period_ms: HOUR,
        takes: &[Empty(u64::MAX), Empty(u64::MAX)],
    },
    Case {
        name: "large capacity",
        cap: 10,
        period_ms: 10 * HOUR,
        takes: &[
            Granted(9.0),
            Granted(8.0),
            Granted(7.0),
            Granted(6.0),
            Granted(5.0),
            Granted(4.0),
            Granted(3.0),
            Granted(2.0),
            Granted(1.0),
            Granted(0.0),
            Empty(HOUR),
        ],
    },
];

fn check(twin: &str, case: &Case, i: usize, got: &Take, want: Expect) {
    let what = format!("{twin}: {} (take {i}): {got:?}, want {want:?}", case.name);
    match (got, want) {
        (Take::Granted { tokens_left }, Granted(left)) => {
            // Refill during the case adds a tiny fraction; the Redis reply is in
            // thousandths, rounded down.
            assert!(
                (tokens_left - left).abs() < 0.01,
                "{what}: tokens left differ"
            );
        }
        (Take::Empty { retry_after_ms }, Empty(u64::MAX)) => {
            assert_eq!(*retry_after_ms, u64::MAX, "{what}");
        }
        (Take::Empty { retry_after_ms }, Empty(ms)) => {
            assert!(
                *retry_after_ms <= ms && *retry_after_ms + RETRY_SLACK_MS >= ms,
                "{what}: retry_after_ms out of range"
            );
        }
        _ => panic!("{what}"),
    }
}

/// The twins under test: the in-process bucket, and the Redis one when a server runs.
fn twins(
    redis: Option<&Arc<RedisClient>>,
    name: &str,
) -> Vec<(&'static str, Arc<dyn FleetBucket>)> {
    let mut out = vec![("local", Store::Local.bucket(name))];
    if let Some(client) = redis {
        out.push(("redis", Store::Redis(Arc::clone(client)).bucket(name)));
    }
    out
}

fn client(r: &RedisServer) -> Arc<RedisClient> {
    prefixed(r, "conf")
}

/// A client of its own under `prefix` (a keyspace of its own on the shared server).
fn prefixed(r: &RedisServer, prefix: &str) -> Arc<RedisClient> {
    Arc::new(RedisClient::new(&r.url(), prefix, Duration::from_millis(500)).expect("redis url"))
}

/// The server of a test, or `None` (with a note: only the in-process twin runs).
fn server() -> Option<RedisServer> {
    let server = RedisServer::try_start();
    if server.is_none() {
        eprintln!("redis-server not found: only the in-process twin runs");
    }
    server
}

/// Both twins of a store, named: `Store::Local`, and `Store::Redis` when a server runs
/// (its own key prefix `prefix`, so that every case starts from an empty store).
fn stores(redis: Option<&RedisServer>, prefix: &str) -> Vec<(&'static str, Store)> {
    let mut out = vec![("local", Store::Local)];
    if let Some(r) = redis {
        out.push(("redis", Store::Redis(prefixed(r, prefix))));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_cases_agree_in_redis_and_in_process() {
    let server = RedisServer::try_start();
    if server.is_none() {
        eprintln!("redis-server not found: only the in-process twin runs");
    }
    let redis = server.as_ref().map(client);
    for (k, case) in CASES.iter().enumerate() {
        for (twin, bucket) in twins(redis.as_ref(), &format!("case{k}")) {
            for (i, want) in case.takes.iter().enumerate() {
                let got = bucket
                    .take(case.cap, case.period_ms)
                    .await
                    .unwrap_or_else(|e| panic!("{twin}: {}: {e}", case.name));
                check(twin, case, i, &got, *want);
            }
        }
    }
}

/// Refill: capacity 2 per second. Emptied, a bucket says 500 ms, and grants again
/// once about that long has passed (polled, with a tolerance for a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_refill_agrees_in_redis_and_in_process() {
    let server = RedisServer::try_start();
    let redis = server.as_ref().map(client);
    for (twin, bucket) in twins(redis.as_ref(), "refill") {
        for _ in 0..2 {
            let got = bucket.take(2, 1_000).await.expect(twin);
            assert!(matches!(got, Take::Granted { .. }), "{twin}: {got:?}");
        }
        let emptied = Instant::now();
        let got = bucket.take(2, 1_000).await.expect(twin);
        let Take::Empty { retry_after_ms } = got else {
            panic!("{twin}: {got:?} from an emptied bucket");
        };
        assert!(
            (400..=500).contains(&retry_after_ms),
            "{twin}: retry_after_ms {retry_after_ms}"
        );
        let deadline = emptied + Duration::from_secs(5);
        loop {
            let got = bucket.take(2, 1_000).await.expect(twin);
            if matches!(got, Take::Granted { .. }) {
                break;
            }
            assert!(Instant::now() < deadline, "{twin}: never refilled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let waited = emptied.elapsed();
        eprintln!("{twin}: refilled after {waited:?} (said {retry_after_ms} ms)");
        assert!(
            waited >= Duration::from_millis(retry_after_ms.saturating_sub(20)),
            "{twin}: granted after {waited:?}, before the {retry_after_ms} ms it said"
        );
        assert!(
            waited <= Duration::from_millis(retry_after_ms + 400),
            "{twin}: granted only after {waited:?} ({retry_after_ms} ms said)"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The disruption budget: one table of claim sequences, run against `LocalBudget` and
// `RedisBudget` (through `Store::budget`), each case on an empty budget. Real time: the
// periods are long enough for the few milliseconds a case takes not to show.

/// One call on a budget and what it must answer.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// `claim(upstream, backend, total)` grants, leaving about this many tokens.
    Grant(&'static str, &'static str, u32, f64),
    /// `claim` renews the backend's own active claim.
    Renewed(&'static str, &'static str, u32),
    /// `claim` finds no token; the next in about this many ms.
    NoToken(&'static str, &'static str, u32, u64),
    /// `claim` is over budget: `(active, max_out)`.
    Over(&'static str, &'static str, u32, u32, u32),
    /// `renew(upstream, backend, lease)` answers this.
    Renew(&'static str, &'static str, bool),
    /// `release(upstream, backend)` answers this.
    Release(&'static str, &'static str, bool),
    /// `tokens_available` is about this.
    Tokens(f64),
    /// `active_claims(upstream)` lists these backends.
    Active(&'static str, &'static [&'static str]),
    /// `snapshot(upstreams)`: about this many tokens, these backends per upstream.
    Snapshot(
        &'static [&'static str],
        f64,
        &'static [&'static [&'static str]],
    ),
}

use Step::{Active, Grant, NoToken, Over, Release, Renew, Renewed, Snapshot, Tokens};

struct BudgetCase {
    name: &'static str,
    tokens: u32,
    token_period_secs: u64,
    fraction: f64,
    dry_run: bool,
    steps: &'static [Step],
}

const BUDGET_CASES: &[BudgetCase] = &[
    BudgetCase {
        name: "grants `tokens` culls, then no token until the refill",
        tokens: 2,
        token_period_secs: 600,
        fraction: 1.0,
        dry_run: false,
        steps: &[
            Tokens(2.0),
            Grant("app", "a", 10, 1.0),
            Grant("app", "b", 10, 0.0),
            NoToken("app", "c", 10, 300_000),
            NoToken("api", "x", 10, 300_000),
            Tokens(0.0),
            Active("app", &["a", "b"]),
            Active("api", &[]),
        ],
    },
    BudgetCase {
        name: "a renewal is free, never the last backend, a release refunds nothing",
        tokens: 2,
        token_period_secs: 600,
        fraction: 1.0,
        dry_run: false,
        steps: &[
            Grant("app", "a", 2, 1.0),
            Renew("app", "a", true),
            Renewed("app", "a", 2),
            Renewed("app", "a", 2),
            Tokens(1.0),
            Over("app", "b", 2, 1, 1),
            Over("solo", "x", 1, 0, 0),
            Renew("app", "zzz", false),
            Release("app", "a", true),
            Release("app", "a", false),
            Active("app", &[]),
            Tokens(1.0),
            Grant("app", "b", 2, 0.0),
            NoToken("other", "c", 2, 300_000),
        ],
    },
    BudgetCase {
        name: "the fraction caps each upstream; over-budget claims spend no token",
        tokens: 10,
        token_period_secs: 100_000_000,
        fraction: 0.5,
        dry_run: false,
        steps: &[
            Grant("app", "a", 4, 9.0),
            Grant("app", "b", 4, 8.0),
            Over("app", "c", 4, 2, 2),
            Over("app", "d", 4, 2, 2),
            Grant("api", "x", 4, 7.0),
            Tokens(7.0),
            Active("app", &["a", "b"]),
            Snapshot(&["app", "none", "api"], 7.0, &[&["a", "b"], &[], &["x"]]),
        ],
    },
    BudgetCase {
        name: "a dry run commits nothing",
        tokens: 1,
        token_period_secs: 600,
        fraction: 0.5,
        dry_run: true,
        steps: &[
            Grant("app", "a", 4, 0.0),
            Grant("app", "a", 4, 0.0),
            Grant("app", "b", 4, 0.0),
            Active("app", &[]),
            Renew("app", "a", false),
            Tokens(1.0),
        ],
    },
];

fn budget_params(case: &BudgetCase) -> CullParams {
    CullParams {
        token_period_secs: case.token_period_secs,
        dry_run: case.dry_run,
        ..CullParams::for_tests(case.tokens, case.fraction)
    }
}

fn tokens_near(what: &str, got: f64, want: f64) {
    // The Redis replies are in thousandths, rounded down; refill adds a tiny fraction.
    assert!(
        (got - want).abs() < 0.01,
        "{what}: {got} tokens, want {want}"
    );
}

fn backends(claims: &[portcullis_policy::cull::ActiveClaim]) -> Vec<&str> {
    claims.iter().map(|c| c.backend.as_str()).collect()
}

async fn run_step(twin: &str, case: &BudgetCase, b: &dyn BudgetStore, p: &CullParams, step: Step) {
    let what = format!("{twin}: {}: {step:?}", case.name);
    let lease = p.lease_ttl_ms();
    let what = &what;
    let claim = |u: &'static str, k: &'static str, t: u32| async move {
        b.claim(u, k, t, p).await.expect(what)
    };
    match step {
        Grant(u, k, t, left) => match claim(u, k, t).await {
            ClaimOutcome::Granted {
                tokens_left,
                expires_ms,
                dry_run,
            } => {
                tokens_near(what, tokens_left, left);
                assert_eq!(dry_run, case.dry_run, "{what}");
                let until = expires_ms.saturating_sub(unix_ms());
                assert!(
                    until <= lease && until + 2_000 >= lease,
                    "{what}: lease ends in {until} ms, want {lease}"
                );
            }
            other => panic!("{what}: {other:?}"),
        },
        Renewed(u, k, t) => {
            let got = claim(u, k, t).await;
            assert!(
                matches!(got, ClaimOutcome::Renewed { .. }),
                "{what}: {got:?}"
            );
        }
        NoToken(u, k, t, ms) => match claim(u, k, t).await {
            ClaimOutcome::NoToken { retry_after_ms } => assert!(
                retry_after_ms <= ms && retry_after_ms + RETRY_SLACK_MS >= ms,
                "{what}: retry after {retry_after_ms} ms"
            ),
            other => panic!("{what}: {other:?}"),
        },
        Over(u, k, t, active, max_out) => {
            assert_eq!(
                claim(u, k, t).await,
                ClaimOutcome::OverBudget { active, max_out },
                "{what}"
            );
        }
        Renew(u, k, want) => {
            assert_eq!(b.renew(u, k, lease).await.expect(what), want, "{what}");
        }
        Release(u, k, want) => {
            assert_eq!(b.release(u, k).await.expect(what), want, "{what}");
        }
        Tokens(want) => tokens_near(what, b.tokens_available(p).await.expect(what), want),
        Active(u, want) => {
            let got = b.active_claims(u).await.expect(what);
            assert_eq!(backends(&got), want, "{what}");
            assert!(
                got.iter().all(|c| c.remaining_ms <= lease),
                "{what}: {got:?}"
            );
        }
        Snapshot(ups, tokens, want) => {
            let s = b.snapshot(ups, p).await.expect(what);
            tokens_near(what, s.tokens_available, tokens);
            let got: Vec<Vec<&str>> = s.claims.iter().map(|c| backends(c)).collect();
            assert_eq!(got, want, "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_cases_agree_in_redis_and_in_process() {
    let server = server();
    for (k, case) in BUDGET_CASES.iter().enumerate() {
        for (twin, store) in stores(server.as_ref(), &format!("budget{k}")) {
            let budget = store.budget();
            assert_eq!(budget.kind(), twin);
            let p = budget_params(case);
            for step in case.steps {
                run_step(twin, case, budget.as_ref(), &p, *step).await;
            }
        }
    }
}

/// A lease shortened to 300 ms lapses by itself and frees the slot (polled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_lease_expiry_agrees_in_redis_and_in_process() {
    let server = server();
    for (twin, store) in stores(server.as_ref(), "lease") {
        let b = store.budget();
        let p = CullParams::for_tests(10, 0.5);
        assert!(
            b.claim("app", "a", 2, &p).await.expect(twin).is_held(),
            "{twin}"
        );
        let over = b.claim("app", "b", 2, &p).await.expect(twin);
        assert!(
            matches!(over, ClaimOutcome::OverBudget { .. }),
            "{twin}: {over:?}"
        );
        assert!(b.renew("app", "a", 300).await.expect(twin), "{twin}");
        let shortened = Instant::now();
        let deadline = shortened + Duration::from_secs(5);
        while !b.active_claims("app").await.expect(twin).is_empty() {
            assert!(Instant::now() < deadline, "{twin}: the lease never lapsed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            shortened.elapsed() >= Duration::from_millis(250),
            "{twin}: lapsed after {:?}, before its 300 ms",
            shortened.elapsed()
        );
        assert!(
            !b.renew("app", "a", 1000).await.expect(twin),
            "{twin}: expired"
        );
        let got = b.claim("app", "b", 2, &p).await.expect(twin);
        assert!(
            matches!(got, ClaimOutcome::Granted { .. }),
            "{twin}: {got:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The rate limiter's counters: one table of flush sequences, run against `LocalStore` and
// `RedisStore` (through `Store::counter_store`), each case on an empty store. Every batch
// has a fresh id (a retried id is the Redis store's concern: `counter/redis_tests.rs`).

/// One delta: (key, window, cur, prev, need_prev, floor_cur, floor_prev), 60 s windows.
type D = (u128, u64, u64, u64, bool, u64, u64);
/// What the store answers for it: (cur, prev, restored); prev is checked only when the
/// delta needs it.
type W = (u64, u64, bool);

struct CounterCase {
    name: &'static str,
    /// Flushes in order: the batch's deltas and the totals each must get back.
    flushes: &'static [(&'static [D], &'static [W])],
}

const COUNTER_CASES: &[CounterCase] = &[
    CounterCase {
        name: "deltas add up in their window, key by key",
        flushes: &[
            (&[(1, 5, 3, 0, true, 0, 0)], &[(3, 0, false)]),
            (&[(1, 5, 2, 0, true, 3, 0)], &[(5, 0, false)]),
            (
                &[(1, 5, 1, 0, true, 0, 0), (2, 5, 4, 0, true, 0, 0)],
                &[(6, 0, false), (4, 0, false)],
            ),
        ],
    },
    CounterCase {
        name: "the next window starts empty and sees the last one as prev; stragglers count",
        flushes: &[
            (&[(7, 5, 3, 0, true, 0, 0)], &[(3, 0, false)]),
            (&[(7, 6, 1, 1, true, 0, 3)], &[(1, 4, false)]),
            // Another instance's late delta for window 5.
            (&[(7, 5, 1, 0, true, 0, 0)], &[(5, 0, false)]),
            (&[(7, 6, 0, 0, true, 1, 5)], &[(1, 5, false)]),
        ],
    },
    CounterCase {
        name: "after a gap of windows nothing old is counted",
        flushes: &[
            (&[(9, 5, 3, 0, true, 0, 0)], &[(3, 0, false)]),
            (&[(9, 8, 1, 0, true, 0, 0)], &[(1, 0, false)]),
        ],
    },
    CounterCase {
        name: "a lost counter is restored from the caller's floor, once",
        flushes: &[
            (&[(3, 5, 1, 0, true, 10, 0)], &[(11, 0, true)]),
            (&[(3, 5, 1, 0, true, 11, 0)], &[(12, 0, false)]),
            (&[(3, 5, 0, 0, true, 12, 7)], &[(12, 7, true)]),
            (&[(3, 5, 0, 0, true, 12, 7)], &[(12, 7, false)]),
        ],
    },
    CounterCase {
        name: "a delta that needs no prev still adds to its window",
        flushes: &[
            (&[(4, 6, 2, 0, false, 0, 0)], &[(2, 0, false)]),
            (&[(4, 6, 3, 0, false, 2, 0)], &[(5, 0, false)]),
        ],
    },
    CounterCase {
        name: "an empty batch is a probe and answers nothing",
        flushes: &[(&[], &[])],
    },
];

fn delta(&(key, window, cur, prev, need_prev, floor_cur, floor_prev): &D) -> Delta {
    Delta {
        key_hash: key.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
        window_secs: 60,
        window,
        cur,
        prev,
        need_prev,
        floor_cur,
        floor_prev,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_cases_agree_in_redis_and_in_process() {
    let server = server();
    for (k, case) in COUNTER_CASES.iter().enumerate() {
        for (twin, store) in stores(server.as_ref(), &format!("counter{k}")) {
            let counters = store.counter_store();
            assert_eq!(counters.kind(), twin);
            for (i, (ds, want)) in case.flushes.iter().enumerate() {
                let what = format!("{twin}: {} (flush {i})", case.name);
                let deltas: Vec<Delta> = ds.iter().map(delta).collect();
                let now_ms = deltas.iter().map(|d| d.window * 60_000).max().unwrap_or(0);
                let got: Vec<GlobalCounts> = counters
                    .sync(Batch {
                        id: (1u128 << 64) | ((k as u128) << 16) | i as u128,
                        deltas: &deltas,
                        now_ms,
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(got.len(), want.len(), "{what}: {got:?}");
                for ((d, g), &(cur, prev, restored)) in deltas.iter().zip(&got).zip(*want) {
                    assert_eq!(g.cur, cur, "{what}: {g:?}");
                    assert_eq!(g.restored, restored, "{what}: {g:?}");
                    if d.need_prev {
                        assert_eq!(g.prev, prev, "{what}: {g:?}");
                    }
                }
            }
        }
    }
}
