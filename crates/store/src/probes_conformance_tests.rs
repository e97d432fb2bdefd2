//! Shared probing's store ([`ProbeStore`]), one table run against both twins: the
//! in-process one and the Redis one on a real `redis-server` (skipped with a note without
//! one).

use std::sync::Arc;
use std::time::Duration;

use crate::{RedisClient, Store};
use portcullis_policy::health::shared::{Publish, SyncRequest, Verdict};
use portcullis_test_kit::RedisServer;

fn req(
    instance: &str,
    lease_ms: u64,
    publish: &[(&str, &str, bool)],
    read: &[&str],
) -> SyncRequest {
    SyncRequest {
        instance: instance.into(),
        lease_ms,
        verdict_ttl_ms: 400,
        publish: publish
            .iter()
            .map(|(u, b, healthy)| Publish {
                upstream: (*u).into(),
                backend: (*b).into(),
                payload: Verdict::payload(*healthy, None),
            })
            .collect(),
        read: read.iter().map(|u| (*u).to_string()).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_verdicts_in_redis_and_in_process() {
    let server = RedisServer::try_start();
    if server.is_none() {
        eprintln!("redis-server not found: only the in-process twin runs");
    }
    let mut stores = vec![("local", Store::Local)];
    if let Some(r) = &server {
        let client = RedisClient::new(&r.url(), "probes-table", Duration::from_millis(500));
        stores.push(("redis", Store::Redis(Arc::new(client.unwrap()))));
    }
    for (twin, store) in stores {
        let s = store.probes();
        let a = s.sync(&req("a", 300, &[], &[])).await.unwrap();
        assert_eq!(a.live, vec!["a".to_string()], "{twin}");
        assert!(a.now_ms > 0);
        // b publishes into two upstreams; a reads one (and one never written)
        let pubs = [("api", "10.0.0.1:80", false), ("web", "10.0.0.2:80", true)];
        s.sync(&req("b", 10_000, &pubs, &[])).await.unwrap();
        let v = s.sync(&req("a", 300, &[], &["api", "none"])).await.unwrap();
        assert_eq!(v.live, vec!["a".to_string(), "b".to_string()], "{twin}");
        assert_eq!(v.verdicts.len(), 2, "{twin}");
        assert_eq!(v.verdicts[1], vec![], "{twin}");
        let (backend, verdict) = &v.verdicts[0][0];
        assert_eq!(
            (backend.as_str(), verdict.instance.as_str(), verdict.healthy),
            ("10.0.0.1:80", "b", false),
            "{twin}"
        );
        assert!(
            verdict.stamp_ms <= v.now_ms && verdict.stamp_ms + 400 > v.now_ms,
            "{twin}"
        );
        // a's lease (300 ms) runs out unless renewed; verdicts expire after their TTL
        tokio::time::sleep(Duration::from_millis(450)).await;
        let v = s.sync(&req("b", 10_000, &[], &["api"])).await.unwrap();
        assert_eq!(v.live, vec!["b".to_string()], "{twin}: a's lease ran out");
        assert_eq!(
            v.verdicts,
            vec![vec![]],
            "{twin}: stale verdicts are pruned"
        );
    }
}
