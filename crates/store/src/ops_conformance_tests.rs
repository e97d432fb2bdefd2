//! Manual operations on the disruption budget ([`BudgetStore::put_op`] and the rest), one
//! table run against both twins: the in-process budget and the Redis one on a real
//! `redis-server` (a free port, started by the test kit; skipped with a note without one).
//! Culls and operations share one budget: the table mixes both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{BudgetStore, RedisClient, Store};
use portcullis_policy::cull::ops::{OpKind, OpRecord, OpRefusal, OpRequest};
use portcullis_policy::cull::{ClaimOutcome, CullParams};
use portcullis_test_kit::RedisServer;

fn stores(redis: Option<&RedisServer>, prefix: &str) -> Vec<(&'static str, Store)> {
    let mut out = vec![("local", Store::Local)];
    if let Some(r) = redis {
        let client = RedisClient::new(&r.url(), prefix, Duration::from_millis(500));
        out.push(("redis", Store::Redis(Arc::new(client.expect("redis url")))));
    }
    out
}

fn server() -> Option<RedisServer> {
    let server = RedisServer::try_start();
    if server.is_none() {
        eprintln!("redis-server not found: only the in-process twin runs");
    }
    server
}

fn op(kind: OpKind, force: bool, ttl_ms: Option<u64>) -> OpRequest {
    OpRequest {
        kind,
        by: "ops".into(),
        reason: "deploy\tv2".into(),
        ttl_ms,
        force,
    }
}

const UP: &str = "app";
const FRACTION: f64 = 0.5;

async fn put(b: &dyn BudgetStore, backend: &str, req: OpRequest) -> Result<OpRecord, OpRefusal> {
    b.put_op(UP, backend, 4, FRACTION, &req)
        .await
        .unwrap_or_else(|e| panic!("store error {e}"))
}

async fn cull(b: &dyn BudgetStore, backend: &str) -> ClaimOutcome {
    let p = CullParams::for_tests(10, FRACTION);
    b.claim(UP, backend, 4, &p)
        .await
        .unwrap_or_else(|e| panic!("store error {e}"))
}

fn summary(ops: &[OpRecord]) -> Vec<(String, String, bool)> {
    ops.iter()
        .map(|r| (r.backend.clone(), r.kind.code(), r.force))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_and_culls_share_one_budget_in_redis_and_in_process() {
    let server = server();
    for (twin, store) in stores(server.as_ref(), "ops-table") {
        let b = store.budget();
        let b = b.as_ref();
        let fraction = |out, max_out| {
            Err(OpRefusal::Fraction {
                out,
                max_out,
                total: 4,
            })
        };
        let last = Err(OpRefusal::LastBackend { total: 4 });
        // four backends at 0.5: one cull and one drain fill the budget
        assert!(cull(b, "b1").await.is_held(), "{twin}");
        let drained = put(b, "b2", op(OpKind::Drain, false, None)).await;
        let drained = drained.unwrap_or_else(|e| panic!("{twin}: {e:?}"));
        assert_eq!(
            (drained.by.as_str(), drained.reason.as_str()),
            ("ops", "deploy v2"),
            "{twin}"
        );
        assert_eq!(drained.until_ms, None, "{twin}");
        assert_eq!(
            put(b, "b3", op(OpKind::Drain, false, None))
                .await
                .map(|_| ()),
            fraction(3, 2),
            "{twin}"
        );
        // a weight above 0 takes nothing out; weight 0 does
        assert!(
            put(b, "b3", op(OpKind::Weight(5), false, None))
                .await
                .is_ok(),
            "{twin}"
        );
        assert_eq!(
            put(b, "b3", op(OpKind::Weight(0), false, None))
                .await
                .map(|_| ()),
            fraction(3, 2),
            "{twin}"
        );
        // force passes the fraction, never the last backend
        assert!(
            put(b, "b3", op(OpKind::Maint, true, None)).await.is_ok(),
            "{twin}"
        );
        assert_eq!(
            put(b, "b4", op(OpKind::Drain, true, None))
                .await
                .map(|_| ()),
            last,
            "{twin}"
        );
        // a backend already out may change its operation
        assert!(
            put(b, "b2", op(OpKind::Maint, false, None)).await.is_ok(),
            "{twin}"
        );
        // a cull on a backend an operation took out passes; on another it is over budget
        assert!(cull(b, "b2").await.is_held(), "{twin}");
        assert!(
            matches!(
                cull(b, "b4").await,
                ClaimOutcome::OverBudget {
                    active: 3,
                    max_out: 2
                }
            ),
            "{twin}"
        );
        let (_, ops) = b
            .ops(&[UP, "other"])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            summary(&ops[0]),
            [
                ("b2".to_string(), "maint".to_string(), false),
                ("b3".to_string(), "maint".to_string(), true),
                ("b3".to_string(), "w:5".to_string(), false),
            ],
            "{twin}"
        );
        assert!(ops[1].is_empty(), "{twin}");
        // ready removes every record of the backend, and frees the budget
        assert_eq!(b.clear_ops(UP, "b3").await.ok(), Some(2), "{twin}");
        assert_eq!(b.clear_ops(UP, "b3").await.ok(), Some(0), "{twin}");
        assert_eq!(
            put(b, "b3", op(OpKind::Drain, false, None))
                .await
                .map(|_| ()),
            fraction(3, 2),
            "{twin}"
        );
        assert!(b.release(UP, "b1").await.unwrap_or(false), "{twin}");
        assert!(
            put(b, "b3", op(OpKind::Drain, false, None)).await.is_ok(),
            "{twin}"
        );
    }
}

/// An operation with `seconds` is a lease: it lapses by itself and frees the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_with_seconds_lapses_in_redis_and_in_process() {
    let server = server();
    for (twin, store) in stores(server.as_ref(), "ops-lease") {
        let b = store.budget();
        let b = b.as_ref();
        let r = put(b, "b1", op(OpKind::Drain, false, Some(300))).await;
        let r = r.unwrap_or_else(|e| panic!("{twin}: {e:?}"));
        assert_eq!(r.until_ms.map(|u| u - r.at_ms), Some(300), "{twin}");
        assert!(
            put(b, "b2", op(OpKind::Drain, false, Some(300)))
                .await
                .is_ok(),
            "{twin}"
        );
        assert!(
            put(b, "b3", op(OpKind::Drain, false, None)).await.is_err(),
            "{twin}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, ops) = b.ops(&[UP]).await.unwrap_or_else(|e| panic!("{e}"));
            if ops[0].is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{twin}: leases never lapsed: {ops:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            put(b, "b3", op(OpKind::Drain, false, None)).await.is_ok(),
            "{twin}"
        );
    }
}

/// Three instances (three clients of one server) putting 20 drains at once on ten
/// backends at 0.3: never more than three out, and a new instance sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_from_three_instances_never_pass_the_fraction() {
    let Some(server) = server() else { return };
    let budgets: Vec<Arc<dyn BudgetStore>> = (0..3)
        .map(|_| {
            let c = RedisClient::new(&server.url(), "ops-race", Duration::from_millis(2000));
            Store::Redis(Arc::new(c.expect("redis url"))).budget()
        })
        .collect();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let b = Arc::clone(&budgets[i % 3]);
        tasks.push(tokio::spawn(async move {
            let req = op(OpKind::Drain, false, None);
            b.put_op(UP, &format!("b{}", i % 10), 10, 0.3, &req).await
        }));
    }
    let mut granted = std::collections::HashSet::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(Ok(r)) => {
                granted.insert(r.backend);
            }
            Ok(Err(OpRefusal::Fraction { max_out: 3, .. })) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(granted.len(), 3, "{granted:?}");
    let c = RedisClient::new(&server.url(), "ops-race", Duration::from_millis(500));
    let fresh = Store::Redis(Arc::new(c.expect("redis url"))).budget();
    let (_, ops) = fresh.ops(&[UP]).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ops[0].len(),
        3,
        "a restarted instance sees the operations: {ops:?}"
    );
}
