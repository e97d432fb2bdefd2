//! The store's callers on a real 3-master Redis Cluster (started by the kit's launcher):
//! a rate-limit flush whose keys span many hash slots, retried with the same batch id;
//! the culling claim script, the fleet token bucket and shared probing's script on their slot. Skipped (with a
//! message) when `redis-server` is not on PATH.

use std::sync::Arc;
use std::time::Duration;

use crate::{BudgetStore, FleetBucket, RedisBucket, RedisBudget, RedisClient, Take};
use crate::{CounterStore, Endpoint, Mode, RedisStore};
use portcullis_policy::cull::{ClaimOutcome, CullParams};
use portcullis_policy::ratelimit::{Batch, Delta, GlobalCounts};

// The kit's launcher (crates/test-kit), the one place that starts `redis-server`.
use portcullis_test_kit::{RedisCluster, RedisServer};

fn cluster_client(c: &RedisCluster, prefix: &str) -> Arc<RedisClient> {
    let ep = Endpoint {
        mode: Mode::Cluster { nodes: c.nodes() },
        password: String::new(),
        tls: false,
        ca_pem: None,
    };
    Arc::new(RedisClient::with_endpoint(&ep, prefix, Duration::from_millis(1000)).unwrap())
}

fn delta(i: u128, cur: u64) -> Delta {
    Delta {
        key_hash: i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
        window_secs: 60,
        window: 1_000,
        cur,
        prev: 0,
        need_prev: true,
        floor_cur: 0,
        floor_prev: 0,
    }
}

/// Flushes `deltas` as batch `id` (at a fixed now); the flush must succeed.
async fn sync(store: &RedisStore, id: u128, deltas: &[Delta]) -> Vec<GlobalCounts> {
    store
        .sync(Batch {
            id,
            deltas,
            now_ms: 1_000_000,
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_across_slots_counts_once_and_budget_runs_on_its_slot() {
    if !RedisServer::available() {
        return;
    }
    let cluster = RedisCluster::start(3, 0);
    let client = cluster_client(&cluster, "ct");
    assert!(client.is_cluster());
    let store = RedisStore::new(Arc::clone(&client));

    // 200 keys: spread over ~200 slots on all three masters.
    let batch: Vec<Delta> = (0..200).map(|i| delta(i, 1 + (i as u64 % 3))).collect();
    let id = (7u128 << 64) | 1;
    let got = sync(&store, id, &batch).await;
    assert_eq!(got.len(), batch.len());
    for (d, g) in batch.iter().zip(&got) {
        assert_eq!(g.cur, d.cur, "one flush, one count per key");
    }
    // The same batch again (a retry after a timeout): markers make it read-only.
    let again = sync(&store, id, &batch).await;
    assert_eq!(again, got, "a retried batch is not counted twice");
    // A new batch adds.
    let more = sync(&store, id + 1, &batch).await;
    for (d, g) in batch.iter().zip(&more) {
        assert_eq!(g.cur, 2 * d.cur);
    }
    assert_eq!(store.instances(), Some(1), "heartbeat on its own slot");
    // Counters live on every master.
    for (port, _) in cluster.masters() {
        let n = cluster.server(port).keys("ct:rl:{*").len();
        assert!(n > 10, "master {port} holds {n} counters");
    }

    // Culling: the claim script's keys share the `{prefix}` tag, one slot.
    let budget = RedisBudget::new(Arc::clone(&client));
    let params = CullParams {
        tokens: 1,
        ..CullParams::default()
    };
    let first = budget.claim("app", "b1:80", 4, &params).await.unwrap();
    assert!(matches!(first, ClaimOutcome::Granted { .. }), "{first:?}");
    let second = budget.claim("app", "b2:80", 4, &params).await.unwrap();
    assert!(matches!(second, ClaimOutcome::NoToken { .. }), "{second:?}");
    assert_eq!(budget.active_claims("app").await.unwrap().len(), 1);

    let bucket = RedisBucket::new(Arc::clone(&client), "self");
    assert!(matches!(
        bucket.take(1, 60_000).await.unwrap(),
        Take::Granted { .. }
    ));
    assert!(matches!(
        bucket.take(1, 60_000).await.unwrap(),
        Take::Empty { .. }
    ));

    // Shared probing: the lease hash and two upstreams' verdict hashes share the
    // `{prefix}` tag, so the one script runs on their slot.
    use crate::ProbeStore;
    use portcullis_policy::health::shared::{Publish, SyncRequest, Verdict};
    let probes = crate::RedisProbes::new(Arc::clone(&client));
    let publish = ["app", "web"]
        .iter()
        .map(|u| Publish {
            upstream: (*u).into(),
            backend: "b1:80".into(),
            payload: Verdict::payload(false, None),
        })
        .collect();
    let view = probes
        .sync(&SyncRequest {
            instance: "i1".into(),
            lease_ms: 5_000,
            verdict_ttl_ms: 5_000,
            publish,
            read: vec!["app".into(), "web".into()],
        })
        .await
        .unwrap();
    assert_eq!(view.live, vec!["i1".to_string()]);
    assert_eq!(
        view.verdicts.iter().map(Vec::len).collect::<Vec<_>>(),
        [1, 1]
    );

    // The fleet's traffic counts: one hash under the `{prefix}` tag.
    use portcullis_policy::fleet_cap::{TrafficPublish, TrafficStore};
    let traffic = crate::RedisTraffic::new(Arc::clone(&client));
    let view = traffic
        .exchange(&TrafficPublish {
            instance: "i1".into(),
            ttl_ms: 5_000,
            counts: vec![("*".into(), 12)],
        })
        .await
        .unwrap();
    assert_eq!(view.share("i1", "*").own, 12);
}
