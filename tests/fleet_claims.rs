//! Claims on the disruption budget end to end (CONTRACT §12): real `portcullis` processes
//! sharing a real `redis-server`, real backends, real HTTP to the admin API. Grants, dry
//! runs, leases, release, a restarted instance, the safety policy (grace periods, one zone
//! at a time, emergencies, max_concurrent under concurrent claims from three instances),
//! the feasibility audit, and the store down.

use portcullis_test_kit as support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::*;

const FLEET_BOUND: Duration = Duration::from_secs(2);
const SLACK: Duration = Duration::from_millis(500);

fn config(
    backends: &[&Backend],
    redis: &RedisServer,
    prefix: &str,
    fraction: f64,
    extra: &str,
) -> String {
    let mut s = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 500\n\n",
        redis.url()
    );
    s.push_str(&upstream_table("app", backends, extra));
    s.push_str(&format!(
        "[rate_limit]\nenabled = false\n\n[shedding]\nmax_concurrency = 0\n\n\
         [culling]\nenabled = true\nwindow_seconds = 10\nerror_threshold = 5\n\
         check_interval_seconds = 1\ntokens = 50\ntoken_period_seconds = 600\n\
         max_culled_fraction = {fraction:?}\ncooldown_seconds = 60\n"
    ));
    s
}

fn with_budget(cfg: String, budget: &str) -> String {
    format!("{cfg}\n[budget]\n{budget}\n")
}

fn claim(p: &Proxy, backend: &str, seconds: u64, extra: Value) -> (u16, Value) {
    let mut body =
        json!({"upstream": "app", "backend": backend, "seconds": seconds, "reason": "deploy v7"});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = post(
        &p.admin_addr(),
        "/claims",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    );
    let v = serde_json::from_str(&r.body_str()).unwrap_or(Value::Null);
    (r.status, v)
}

fn state(p: &Proxy, b: &str) -> String {
    let r = p.admin_get("/backends");
    let all: Value = serde_json::from_str(&r.body_str()).unwrap_or(Value::Null);
    all.as_array()
        .and_then(|a| a.iter().find(|x| x["address"] == b))
        .and_then(|x| x["state"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn delete(p: &Proxy, id: &str) -> u16 {
    try_request(
        &p.admin_addr(),
        "DELETE",
        &format!("/claims/{id}"),
        &[],
        b"",
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .status
}

fn backends(n: usize) -> Vec<Backend> {
    (1..=n).map(|i| Backend::start(&format!("b{i}"))).collect()
}

#[test]
fn a_claim_drains_the_fleet_and_is_released_early_or_lapses() {
    let redis = RedisServer::start();
    let bs = backends(4);
    let refs: Vec<&Backend> = bs.iter().collect();
    let cfg = config(&refs, &redis, "fc-grant", 0.5, "");
    let (a, b) = (Proxy::start(&cfg), Proxy::start(&cfg));
    // a dry run answers as it would and changes nothing
    let (code, v) = claim(&a, &bs[0].addr(), 600, json!({"dry_run": true}));
    assert_eq!(
        (code, &v["granted"], &v["dry_run"]),
        (200, &json!(true), &json!(true)),
        "{v}"
    );
    assert_eq!(state(&a, &bs[0].addr()), "up");
    // granted: 201 with an id and an expiry, drained on every instance
    let (code, v) = claim(&a, &bs[0].addr(), 600, json!({}));
    assert_eq!(code, 201, "{v}");
    let id = v["id"].as_str().unwrap_or_default().to_string();
    assert_eq!(id.len(), 16, "{v}");
    assert!(v["expires_at"].as_u64().is_some(), "{v}");
    eventually(
        FLEET_BOUND + SLACK,
        || "B never saw the claim".into(),
        || state(&b, &bs[0].addr()) == "claimed",
    );
    for _ in 0..6 {
        assert_ne!(b.get("/x", &[]).header("x-backend"), Some("b1"));
    }
    // listed on every instance; a second claim on it is refused
    let list: Value =
        serde_json::from_str(&b.admin_get("/claims").body_str()).unwrap_or(Value::Null);
    assert!(
        list.as_array().is_some_and(|l| l
            .iter()
            .any(|c| c["id"] == id.as_str() && c["by"] == "admin")),
        "{list}"
    );
    let (code, v) = claim(&b, &bs[0].addr(), 600, json!({}));
    assert_eq!((code, v["policy"].as_str()), (409, Some("claimed")), "{v}");
    // a restarted instance picks it up from the store
    let c = Proxy::start(&cfg);
    eventually(
        FLEET_BOUND + SLACK,
        || "the new instance missed the claim".into(),
        || state(&c, &bs[0].addr()) == "claimed",
    );
    // released early, from another instance
    assert_eq!(delete(&b, &id), 200);
    assert_eq!(delete(&b, &id), 404);
    eventually(
        FLEET_BOUND + SLACK,
        || "A never readmitted b1".into(),
        || state(&a, &bs[0].addr()) == "up",
    );
    // a one-second claim lapses by itself
    let (code, v) = claim(&a, &bs[1].addr(), 1, json!({}));
    assert_eq!(code, 201, "{v}");
    eventually(
        Duration::from_secs(1) + FLEET_BOUND + SLACK,
        || "the lease never lapsed".into(),
        || state(&a, &bs[1].addr()) == "up" && state(&b, &bs[1].addr()) == "up",
    );
    assert!(
        a.metric(r#"portcullis_admin_actions_total{action="claim",result="applied"}"#) >= Some(2.0)
    );
    assert_eq!(
        b.metric(r#"portcullis_admin_actions_total{action="release",result="applied"}"#),
        Some(1.0)
    );
}

#[test]
fn the_safety_policy_grace_periods_one_zone_and_emergencies() {
    let redis = RedisServer::start();
    let bs = backends(4);
    let refs: Vec<&Backend> = bs.iter().collect();
    let zones = format!(
        "groups = {{ zone-a = [\"{}\", \"{}\"], zone-b = [\"{}\", \"{}\"] }}\n",
        bs[0].addr(),
        bs[1].addr(),
        bs[2].addr(),
        bs[3].addr()
    );
    // grace period: 2 s between claims in a group (the upstream's group holds them all)
    let cfg = with_budget(
        config(&refs, &redis, "fc-grace", 0.75, &zones),
        "min_seconds_between_claims = 2",
    );
    let p = Proxy::start(&cfg);
    assert_eq!(claim(&p, &bs[0].addr(), 600, json!({})).0, 201);
    let (code, v) = claim(&p, &bs[1].addr(), 600, json!({}));
    assert_eq!(
        (code, v["policy"].as_str()),
        (409, Some("grace_period")),
        "{v}"
    );
    let retry = v["retry_after_seconds"].as_u64().unwrap_or(0);
    assert!((1..=2).contains(&retry), "{v}");
    let start = Instant::now();
    eventually(
        Duration::from_secs(4),
        || "never granted after the grace period".into(),
        || claim(&p, &bs[1].addr(), 600, json!({})).0 == 201,
    );
    assert!(start.elapsed() + SLACK >= Duration::from_secs(retry.saturating_sub(1)));
    drop(p);

    // one zone at a time
    let cfg = with_budget(
        config(&refs, &redis, "fc-zone", 0.75, &zones),
        "one_group_at_a_time = true",
    );
    let p = Proxy::start(&cfg);
    assert_eq!(claim(&p, &bs[0].addr(), 600, json!({})).0, 201);
    let (code, v) = claim(&p, &bs[2].addr(), 600, json!({}));
    assert_eq!(
        (code, v["policy"].as_str()),
        (409, Some("one_group")),
        "{v}"
    );
    assert!(
        v["reason"].as_str().is_some_and(|r| r.contains("zone-a")),
        "{v}"
    );
    assert_eq!(
        claim(&p, &bs[1].addr(), 600, json!({})).0,
        201,
        "the same zone is fine"
    );
    // the audit says the same, from the in-memory view
    eventually(
        FLEET_BOUND + SLACK,
        || "the audit never saw the claims".into(),
        || {
            let r = p.admin_get("/claims/feasible?upstream=app");
            let v: Value = serde_json::from_str(&r.body_str()).unwrap_or(Value::Null);
            let row = |i: usize| {
                v["backends"]
                    .as_array()
                    .and_then(|rows| rows.iter().find(|x| x["address"] == bs[i].addr()).cloned())
            };
            row(2).is_some_and(|x| x["policy"] == "one_group")
                && row(3).is_some_and(|x| x["granted"] == false)
        },
    );
    drop(p);

    // emergencies pass every limit but the last backend, and block the rest
    let cfg = config(&refs, &redis, "fc-emergency", 0.25, "");
    let p = Proxy::start(&cfg);
    assert_eq!(claim(&p, &bs[0].addr(), 600, json!({})).0, 201);
    assert_eq!(
        claim(&p, &bs[1].addr(), 600, json!({})).1["policy"],
        "fraction"
    );
    let (code, v) = claim(&p, &bs[1].addr(), 600, json!({"emergency": true}));
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["emergency"], true);
    assert_eq!(
        claim(&p, &bs[2].addr(), 600, json!({})).1["policy"],
        "emergency"
    );
    assert_eq!(
        claim(&p, &bs[2].addr(), 600, json!({"emergency": true})).0,
        201
    );
    assert_eq!(
        claim(&p, &bs[3].addr(), 600, json!({"emergency": true})).1["policy"],
        "last_backend"
    );
    assert_eq!(
        p.metric(r#"portcullis_admin_actions_total{action="claim",result="emergency"}"#),
        Some(2.0)
    );
    for _ in 0..4 {
        assert_eq!(p.get("/x", &[]).header("x-backend"), Some("b4"));
    }
}

#[test]
fn twenty_concurrent_claims_from_three_instances_never_pass_max_concurrent() {
    let redis = RedisServer::start();
    let bs = backends(10);
    let refs: Vec<&Backend> = bs.iter().collect();
    let cfg = with_budget(
        config(&refs, &redis, "fc-race", 1.0, ""),
        "max_concurrent = 3",
    );
    let fleet: Vec<Proxy> = (0..3).map(|_| Proxy::start(&cfg)).collect();
    let admins: Vec<String> = fleet.iter().map(Proxy::admin_addr).collect();
    let addrs: Vec<String> = bs.iter().map(Backend::addr).collect();
    let results = concurrently(20, move |i| {
        let body =
            json!({"upstream": "app", "backend": addrs[i % 10], "seconds": 600, "reason": "race"});
        let r = post(
            &admins[i % 3],
            "/claims",
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        );
        (r.status, r.body_str())
    });
    let granted = results.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(granted, 3, "{results:?}");
    assert!(
        results.iter().all(|(s, b)| *s == 201
            || (*s == 409 && (b.contains("max_concurrent") || b.contains("claimed")))),
        "{results:?}"
    );
    let list: Value =
        serde_json::from_str(&fleet[2].admin_get("/claims").body_str()).unwrap_or(Value::Null);
    assert_eq!(list.as_array().map(Vec::len), Some(3), "{list}");
}

#[test]
fn a_failing_upstream_refuses_voluntary_claims_and_the_store_down_is_503() {
    let mut redis = RedisServer::start();
    let bs = backends(4);
    let refs: Vec<&Backend> = bs.iter().collect();
    let p = Proxy::start(&config(&refs, &redis, "fc-health", 0.25, "retries = 0\n"));
    // b1 and b2 fail: one is culled (the fraction allows one of four), the other stays in
    // rotation, failing: the health policy refuses a voluntary claim on their peers.
    bs[0].set_mode(Mode::Fail(500));
    bs[1].set_mode(Mode::Fail(500));
    eventually(
        Duration::from_secs(20),
        || "never one culled and one failing".into(),
        || {
            for _ in 0..4 {
                let _ = try_get(&p.addr(), "/x", &[]);
            }
            let s = p.status_json();
            let rows = s["upstreams"][0]["backends"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            rows.iter().any(|b| b["state"] == "culled")
                && rows
                    .iter()
                    .any(|b| b["state"] == "up" && b["failing"].is_string())
        },
    );
    let (code, v) = claim(&p, &bs[2].addr(), 60, json!({}));
    assert_eq!((code, v["policy"].as_str()), (409, Some("failing")), "{v}");
    // malformed bodies name the field
    let r = post(
        &p.admin_addr(),
        "/claims",
        &[("content-type", "application/json")],
        br#"{"upstream": "app", "backend": "x", "seconds": 5}"#,
    );
    assert_eq!(r.status, 400);
    assert!(r.body_str().contains("reason"), "{}", r.body_str());
    let r = post(
        &p.admin_addr(),
        "/claims",
        &[("content-type", "application/json")],
        br#"{"upstream": "app", "backend": "1.2.3.4:5", "seconds": 5, "reason": "x"}"#,
    );
    assert_eq!(r.status, 404);
    // the store down: 503, and traffic flows (the failing backends recovered first)
    bs[0].set_mode(Mode::Ok);
    bs[1].set_mode(Mode::Ok);
    redis.kill();
    let (code, v) = claim(&p, &bs[2].addr(), 60, json!({}));
    assert_eq!(code, 503, "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("nothing was claimed")),
        "{v}"
    );
    assert_eq!(p.get("/y", &[]).status, 200);
}
