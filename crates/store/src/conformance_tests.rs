//! One table of token-bucket cases run against both twins: the Redis bucket
//! ([`RedisBucket`](crate::RedisBucket), the Lua arithmetic against a real `redis-server` on a
//! free port) and the in-process one ([`LocalBucket`](crate::LocalBucket), the Rust arithmetic).
//! Both run on real time (the server's clock, the process's clock): the table's
//! periods are long, so that the few milliseconds a case takes change its results
//! by less than the tolerance; one refill case with a short period is polled.
//! The Redis half is skipped (with a note) when `redis-server` is not on PATH.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{FleetBucket, RedisClient, Store, Take};

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
    Arc::new(RedisClient::new(&r.url(), "conf", Duration::from_millis(500)).expect("redis url"))
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
