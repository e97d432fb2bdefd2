//! The fleet's ramp starts ([`RampStore`]), one table run against both twins: the
//! in-process one and the Redis one on a real `redis-server` (skipped with a note without
//! one).

use std::sync::Arc;
use std::time::Duration;

use crate::{RedisClient, Store};
use portcullis_policy::balance::slow_start::{RampPublish, SAME_COMEBACK_MS};
use portcullis_test_kit::RedisServer;

fn publish(upstream: &str, ttl_ms: u64, backends: &[(&str, u64)]) -> RampPublish {
    RampPublish {
        upstream: upstream.into(),
        ttl_ms,
        backends: backends.iter().map(|(b, a)| ((*b).into(), *a)).collect(),
    }
}

/// `a` is within `slack` ms of `b` (the two exchanges run a few ms apart).
fn near(a: u64, b: u64, slack: u64) -> bool {
    a.abs_diff(b) <= slack
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_agree_on_one_start_per_comeback_in_redis_and_in_process() {
    let server = RedisServer::try_start();
    if server.is_none() {
        eprintln!("redis-server not found: only the in-process twin runs");
    }
    let mut stores = vec![("local", Store::Local)];
    if let Some(r) = &server {
        let client = RedisClient::new(&r.url(), "ramp-table", Duration::from_millis(500));
        stores.push(("redis", Store::Redis(Arc::new(client.unwrap()))));
    }
    let ttl = 60_000;
    let slack = 300;
    for (twin, store) in stores {
        let s = store.ramp();
        assert!(s
            .exchange(&publish("api", ttl, &[]))
            .await
            .unwrap()
            .is_empty());
        // Instance A saw b1 back 2 s ago, b2 just now.
        let a = s
            .exchange(&publish("api", ttl, &[("b1", 2_000), ("b2", 0)]))
            .await
            .unwrap();
        assert!(
            near(a[0], 2_000, slack) && near(a[1], 0, slack),
            "{twin}: {a:?}"
        );
        // Instance B saw b1 back only 500 ms ago: the same comeback, the fleet's start
        // stays A's (2 s ago).
        let b = s
            .exchange(&publish("api", ttl, &[("b1", 500)]))
            .await
            .unwrap();
        assert!(near(b[0], 2_000, slack), "{twin}: {b:?}");
        // Instance C saw b2 back 3 s ago (it saw it before A did): the start moves back.
        let c = s
            .exchange(&publish("api", ttl, &[("b2", 3_000)]))
            .await
            .unwrap();
        assert!(near(c[0], 3_000, slack), "{twin}: {c:?}");
        let a = s
            .exchange(&publish("api", ttl, &[("b2", 0)]))
            .await
            .unwrap();
        assert!(near(a[0], 3_000, slack), "{twin}: {a:?}");
        // Another upstream's backend of the same name is its own.
        let other = s
            .exchange(&publish("web", ttl, &[("b1", 0)]))
            .await
            .unwrap();
        assert!(near(other[0], 0, slack), "{twin}: {other:?}");
        // b3 came back long ago (older than the slack of one comeback), went away and
        // came back again now: a new ramp from now, and an instance still publishing the
        // old sighting does not move it back.
        let old = SAME_COMEBACK_MS + 30_000;
        s.exchange(&publish("api", ttl, &[("b3", old)]))
            .await
            .unwrap();
        let fresh = s
            .exchange(&publish("api", ttl, &[("b3", 0)]))
            .await
            .unwrap();
        let fresh_again = s
            .exchange(&publish("api", ttl, &[("b3", old)]))
            .await
            .unwrap();
        assert!(near(fresh[0], 0, slack), "{twin}: {fresh:?}");
        assert!(near(fresh_again[0], 0, slack), "{twin}: {fresh_again:?}");
        // Starts expire with the key's TTL.
        s.exchange(&publish("gone", 200, &[("b1", 10_000)]))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(350)).await;
        let after = s
            .exchange(&publish("gone", 200, &[("b1", 0)]))
            .await
            .unwrap();
        assert!(near(after[0], 0, slack), "{twin}: {after:?}");
    }
}
