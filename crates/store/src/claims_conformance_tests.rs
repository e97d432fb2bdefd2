//! Claims on the disruption budget ([`BudgetStore::fleet_state`], `commit_claim`,
//! `release_claim` and the claim loop), run against both twins: the in-process budget
//! and the Redis one on a real `redis-server` (skipped with a note without one).

use std::sync::Arc;
use std::time::Duration;

use crate::budget::claim;
use crate::{BudgetStore, RedisClient, Store};
use portcullis_policy::cull::claims::{BudgetPolicy, ClaimAsk, ClaimRefusal};
use portcullis_policy::cull::ops::{OpKind, OpRequest};
use portcullis_policy::cull::{ClaimCommit, ClaimToCommit, CullParams};
use portcullis_test_kit::RedisServer;

fn stores(redis: Option<&RedisServer>, prefix: &str) -> Vec<(&'static str, Store)> {
    let mut out = vec![("local", Store::Local)];
    if let Some(r) = redis {
        let client = RedisClient::new(&r.url(), prefix, Duration::from_millis(2000));
        out.push(("redis", Store::Redis(Arc::new(client.expect("redis url")))));
    }
    out
}

fn req(id: u64, emergency: bool) -> OpRequest {
    OpRequest {
        kind: OpKind::Claim { id, emergency },
        by: "deploy".into(),
        reason: "rolling deploy".into(),
        ttl_ms: Some(600_000),
        force: false,
    }
}

fn zones(_: &str, b: &str) -> Vec<String> {
    if b.starts_with('a') {
        vec!["zone-a".into()]
    } else {
        vec!["zone-b".into()]
    }
}

fn ask<'a>(backend: &'a str, total: u32) -> ClaimAsk<'a> {
    ClaimAsk {
        upstream: "app",
        backend,
        total,
        fraction: 0.5,
        emergency: false,
        named_groups: &zones,
        peers_failing: false,
    }
}

const UPS: &[&str] = &["app", "other"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_commit_on_their_version_and_release_in_redis_and_in_process() {
    let server = RedisServer::try_start();
    for (twin, store) in stores(server.as_ref(), "claims-table") {
        let b = store.budget();
        let p = CullParams::for_tests(2, 0.5);
        let st = b
            .fleet_state(UPS, &p)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((st.tokens, st.ops.len()), (2.0, 0), "{twin}");
        let groups = vec!["global".to_string(), "zone-a".to_string()];
        // a stale version is a conflict and writes nothing
        let op = req(1, false);
        let stale = ClaimToCommit {
            version: st.version + 7,
            upstream: "app",
            backend: "a1",
            req: &op,
            groups: &groups,
            take_token: true,
        };
        let conflict = b.commit_claim(&stale, &p).await;
        assert_eq!(conflict.ok(), Some(ClaimCommit::Conflict), "{twin}");
        let current = ClaimToCommit {
            version: st.version,
            ..stale
        };
        let c = b.commit_claim(&current, &p).await;
        let Ok(ClaimCommit::Committed(rec)) = c else {
            panic!("{twin}: {c:?}")
        };
        assert_eq!(rec.until_ms.map(|u| u - rec.at_ms), Some(600_000), "{twin}");
        let st2 = b
            .fleet_state(UPS, &p)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(st2.version > st.version, "{twin}");
        assert_eq!(st2.claims().count(), 1, "{twin}");
        assert!((st2.tokens - 1.0).abs() < 0.01, "{twin}: {}", st2.tokens);
        assert_eq!(
            st2.groups.get("zone-a").map(|g| g.0),
            Some(rec.at_ms),
            "{twin}"
        );
        // the claim counts in the budget a drain asks
        let drain = OpRequest {
            kind: OpKind::Drain,
            ttl_ms: None,
            ..req(0, false)
        };
        let refused = b
            .put_op("app", "a2", 4, 0.5, &drain)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(refused.is_ok(), "{twin}: 2 of 4 out is within 0.5");
        let refused = b
            .put_op("app", "a3", 4, 0.5, &drain)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            refused.is_err(),
            "{twin}: a claim and a drain fill 0.5 of 4"
        );
        // release: the wrong id does nothing; the right one stamps the group's end
        assert_eq!(
            b.release_claim("app", "a1", 2, &groups).await.ok(),
            Some(false),
            "{twin}"
        );
        assert_eq!(
            b.release_claim("app", "a1", 1, &groups).await.ok(),
            Some(true),
            "{twin}"
        );
        assert_eq!(
            b.release_claim("app", "a1", 1, &groups).await.ok(),
            Some(false),
            "{twin}"
        );
        let st3 = b
            .fleet_state(UPS, &p)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(st3.claims().count(), 0, "{twin}");
        assert!(
            st3.groups.get("zone-a").is_some_and(|g| g.1 >= rec.at_ms),
            "{twin}"
        );
        // the loop: tokens run out (2 per period, one spent), with a reason and a retry
        b.clear_ops("app", "a2")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let policy = BudgetPolicy::default();
        let ok = claim(b.as_ref(), UPS, &ask("b1", 4), &policy, &p, &req(3, false)).await;
        assert!(matches!(ok, Ok(Ok(_))), "{twin}: {ok:?}");
        b.release_claim("app", "b1", 3, &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let none = claim(b.as_ref(), UPS, &ask("b2", 4), &policy, &p, &req(4, false)).await;
        match none {
            Ok(Err(ClaimRefusal::Tokens { retry_ms })) => assert!(retry_ms > 0, "{twin}"),
            other => panic!("{twin}: {other:?}"),
        }
        // an emergency claim needs no token
        let mut e = ask("b2", 4);
        e.emergency = true;
        let ok = claim(b.as_ref(), UPS, &e, &policy, &p, &req(5, true)).await;
        assert!(matches!(ok, Ok(Ok(_))), "{twin}: {ok:?}");
    }
}

/// Twenty claims at once from three instances (three clients of one server) with
/// `max_concurrent = 3`: exactly three are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_from_three_instances_never_pass_max_concurrent() {
    let Some(server) = RedisServer::try_start() else {
        eprintln!("redis-server not found: skipped");
        return;
    };
    let budgets: Vec<Arc<dyn BudgetStore>> = (0..3)
        .map(|_| {
            let c = RedisClient::new(&server.url(), "claims-race", Duration::from_millis(2000));
            Store::Redis(Arc::new(c.expect("redis url"))).budget()
        })
        .collect();
    let mut tasks = Vec::new();
    for i in 0..20u64 {
        let b = Arc::clone(&budgets[(i % 3) as usize]);
        tasks.push(tokio::spawn(async move {
            let backend = format!("b{i}");
            let mut a = ask(&backend, 40);
            a.named_groups = &|_, _| Vec::new();
            let policy = BudgetPolicy {
                max_concurrent: 3,
                ..BudgetPolicy::default()
            };
            let p = CullParams::for_tests(100, 1.0);
            claim(b.as_ref(), UPS, &a, &policy, &p, &req(100 + i, false)).await
        }));
    }
    let (mut granted, mut refused) = (0, 0);
    for t in tasks {
        match t.await.expect("task") {
            Ok(Ok(_)) => granted += 1,
            Ok(Err(ClaimRefusal::MaxConcurrent { max: 3, .. })) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((granted, refused), (3, 17));
}
