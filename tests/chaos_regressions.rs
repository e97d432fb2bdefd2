//! Regressions the chaos harness found (benches/chaos/run.sh, docs/src/invariants.md), each
//! replayed end to end: a real `portcullis`, a real `redis-server`, real backends, real HTTP.

use portcullis_test_kit as support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::*;

/// Upstream "app" over `backends`, Redis at `redis` under `prefix`, `max_culled_fraction`
/// 0.5, the rate limit off.
fn config(backends: &[&Backend], redis: &RedisServer, prefix: &str) -> String {
    let mut s = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 300\n\n",
        redis.url()
    );
    s.push_str(&upstream_table(
        "app",
        backends,
        "connect_timeout_ms = 500\n",
    ));
    s.push_str(
        "[rate_limit]\nenabled = false\n\n[culling]\nenabled = true\nwindow_seconds = 10\n\
         error_threshold = 5\ncheck_interval_seconds = 1\ntokens = 10\ntoken_period_seconds = 600\n\
         max_culled_fraction = 0.5\ncooldown_seconds = 60\n",
    );
    s
}

fn json(r: &Resp) -> Value {
    serde_json::from_str(&r.body_str())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body_str()))
}

fn post_json(p: &Proxy, path: &str, body: &str) -> Resp {
    post(
        &p.admin_addr(),
        path,
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
}

/// Redis's clock, in ms since the epoch (the clock leases are granted and lapse by).
fn redis_ms(redis: &RedisServer) -> u64 {
    let t = redis.cmd(&["TIME"]);
    let mut it = t.lines().map(|l| l.trim().parse::<u64>().unwrap_or(0));
    let (s, us) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    s * 1000 + us / 1000
}

/// The seed-1 finding: a drain lapsed in the store, and before this instance's next sync
/// (every second) it granted a claim on the store's state, then showed the lapsed drain
/// and the new claim together: 3 of 4 backends out of its rotation, over
/// `max_culled_fraction` (0.5), until that sync. An action now sets the store's state it
/// was granted on.
#[test]
fn a_grant_right_after_a_lease_lapses_never_shows_more_out_than_the_budget() {
    let redis = RedisServer::start();
    let bs: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = bs.iter().collect();
    let p = Proxy::start(&config(&refs, &redis, "chaos-lapse"));
    let addr = |i: usize| bs[i].addr().replace(':', "%3A");
    // Watches the rotation all along, the grants' own answers included.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, admin) = (stop.clone(), p.admin_addr());
        std::thread::spawn(move || -> Vec<String> {
            let mut over = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(r) = try_request(&admin, "GET", "/backends", &[], b"") else {
                    continue;
                };
                let v: Value = serde_json::from_str(&r.body_str()).unwrap_or(Value::Null);
                let out: Vec<String> = v
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter(|b| b["state"] != "up")
                            .map(|b| format!("{}={}", b["address"], b["state"]))
                            .collect()
                    })
                    .unwrap_or_default();
                if out.len() > 2 {
                    over.push(out.join(" "));
                }
            }
            over
        })
    };
    let mut tries = 0;
    loop {
        tries += 1;
        // b0 drained for a second, b1 until further notice.
        let r = post_json(
            &p,
            &format!("/backends/app/{}/drain", addr(0)),
            r#"{"reason": "short", "seconds": 1}"#,
        );
        assert_eq!(r.status, 200, "{}", r.body_str());
        let until = json(&r)["until"]
            .as_u64()
            .unwrap_or_else(|| panic!("no until: {}", r.body_str()));
        let r = post_json(
            &p,
            &format!("/backends/app/{}/drain", addr(1)),
            r#"{"reason": "long"}"#,
        );
        assert_eq!(r.status, 200, "{}", r.body_str());
        // The moment b0's lease lapses in the store, claim b2: the store has b1 out only.
        let deadline = Instant::now() + Duration::from_secs(5);
        while redis_ms(&redis) <= until {
            assert!(
                Instant::now() < deadline,
                "Redis's clock never passed {until}"
            );
        }
        let r = post_json(
            &p,
            "/claims",
            &format!(
                r#"{{"upstream": "app", "backend": "{}", "seconds": 30, "reason": "deploy"}}"#,
                bs[2].addr()
            ),
        );
        assert_eq!(r.status, 201, "{}", r.body_str());
        let id = json(&r)["id"].as_str().unwrap_or_default().to_string();
        let view = json(&p.admin_get("/backends"));
        let out: Vec<String> = view
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|b| b["state"] != "up")
                    .map(|b| format!("{}={}", b["address"], b["state"]))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            out.len() <= 2,
            "right after the grant, {} of 4 backends are out of rotation (max 2): {out:?}",
            out.len()
        );
        // Back to the start: release the claim, b1 ready.
        let r = try_request(
            &p.admin_addr(),
            "DELETE",
            &format!("/claims/{id}"),
            &[],
            b"",
        )
        .unwrap_or_else(|e| panic!("DELETE /claims/{id}: {e}"));
        assert_eq!(r.status, 200, "{}", r.body_str());
        let r = post_json(&p, &format!("/backends/app/{}/ready", addr(1)), "{}");
        assert_eq!(r.status, 200, "{}", r.body_str());
        if tries == 8 {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let over = watcher
        .join()
        .unwrap_or_else(|_| vec!["the watcher panicked".into()]);
    assert!(
        over.is_empty(),
        "more than 2 of 4 backends out of rotation while an action was answered: {over:?}"
    );
}
