//! The fleet's traffic counts ([`TrafficStore`]), one table run against both twins: the
//! in-process one and the Redis one on a real `redis-server` (skipped with a note without
//! one).

use std::sync::Arc;
use std::time::Duration;

use crate::{RedisClient, Store};
use portcullis_policy::fleet_cap::{TrafficPublish, SCOPE_ALL};
use portcullis_test_kit::RedisServer;

/// Every exchange's TTL (the fleet uses one for all).
const TTL: u64 = 1_000;

fn publish(instance: &str, ttl_ms: u64, counts: &[(&str, u64)]) -> TrafficPublish {
    TrafficPublish {
        instance: instance.into(),
        ttl_ms,
        counts: counts.iter().map(|(s, n)| ((*s).into(), *n)).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_are_published_summed_and_pruned_in_redis_and_in_process() {
    let server = RedisServer::try_start();
    if server.is_none() {
        eprintln!("redis-server not found: only the in-process twin runs");
    }
    let mut stores = vec![("local", Store::Local)];
    if let Some(r) = &server {
        let client = RedisClient::new(&r.url(), "traffic-table", Duration::from_millis(500));
        stores.push(("redis", Store::Redis(Arc::new(client.unwrap()))));
    }
    for (twin, store) in stores {
        let s = store.traffic();
        let v = s
            .exchange(&publish("a", TTL, &[(SCOPE_ALL, 30), ("api", 10)]))
            .await
            .unwrap();
        assert!(v.now_ms > 0, "{twin}");
        assert_eq!(v.instances.len(), 1, "{twin}");
        let v = s
            .exchange(&publish("b", TTL, &[(SCOPE_ALL, 90)]))
            .await
            .unwrap();
        let all = v.share("b", SCOPE_ALL);
        assert_eq!((all.own, all.fleet, all.instances), (90, 120, 2), "{twin}");
        let api = v.share("b", "api");
        assert_eq!((api.own, api.fleet), (0, 10), "{twin}");
        // Publishing again replaces an instance's counts, never adds to them.
        let v = s
            .exchange(&publish("b", TTL, &[(SCOPE_ALL, 50)]))
            .await
            .unwrap();
        assert_eq!(v.share("b", SCOPE_ALL).fleet, 80, "{twin}");
        // a's counts are pruned once older than the TTL (b publishes again: its own stay).
        tokio::time::sleep(Duration::from_millis(TTL + 150)).await;
        let v = s
            .exchange(&publish("b", TTL, &[(SCOPE_ALL, 50)]))
            .await
            .unwrap();
        let all = v.share("b", SCOPE_ALL);
        assert_eq!((all.own, all.fleet, all.instances), (50, 50, 1), "{twin}");
    }
}
