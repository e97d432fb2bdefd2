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

/// A deploy claim on `backend` for `seconds`, asked of `p`.
fn claim(p: &Proxy, backend: &Backend, seconds: u64) -> Resp {
    post_json(
        p,
        "/claims",
        &format!(
            r#"{{"upstream": "app", "backend": "{}", "seconds": {seconds}, "reason": "deploy"}}"#,
            backend.addr()
        ),
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
        let r = claim(&p, &bs[2], 30);
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

/// Culling on beside the drains: `interval` is this instance's `check_interval_seconds`,
/// a cull's probe after `cooldown` seconds.
fn cull_config(backends: &[&Backend], redis: &RedisServer, prefix: &str, interval: u64) -> String {
    format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 300\n\n{}\
         [rate_limit]\nenabled = false\n\n[culling]\nenabled = true\nwindow_seconds = 10\n\
         error_threshold = 5\ncheck_interval_seconds = {interval}\ntokens = 10\n\
         token_period_seconds = 600\nmax_culled_fraction = 0.5\ncooldown_seconds = 2\n",
        redis.url(),
        upstream_table("app", backends, "connect_timeout_ms = 500\n"),
    )
}

/// `address=state` of every backend out of rotation, by the admin API at `admin`.
fn out_of_rotation(admin: &str) -> Vec<String> {
    let Ok(r) = try_request(admin, "GET", "/backends", &[], b"") else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&r.body_str()).unwrap_or(Value::Null);
    v.as_array()
        .map(|a| {
            a.iter()
                .filter(|b| b["state"] != "up" && b["state"] != "unhealthy")
                .map(|b| format!("{}={}", b["address"].as_str().unwrap_or(""), b["state"]))
                .collect()
        })
        .unwrap_or_default()
}

fn state_of(p: &Proxy, addr: &str) -> String {
    let v = json(&p.admin_get("/backends"));
    v.as_array()
        .and_then(|a| a.iter().find(|b| b["address"] == addr))
        .map(|b| b["state"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// The seeds-2/4/10 finding: an instance followed another's cull from its cull loop's read
/// (every `check_interval_seconds`) and the drains from the fleet sync's (every second).
/// The cull released in the store, two drains granted on its budget reached it before its
/// next cull check: 3 of 4 backends out of its rotation (max 2) for as long as that check
/// took. The culls now come with the drains, from one read.
#[test]
fn a_cull_released_elsewhere_leaves_the_rotation_with_the_drains_granted_after_it() {
    let redis = RedisServer::start();
    let bs: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = bs.iter().collect();
    // p1 culls; p2 checks seldom (its cull loop reads the store every 30 s).
    let p1 = Proxy::start(&cull_config(&refs, &redis, "chaos-follow", 1));
    let p2 = Proxy::start(&cull_config(&refs, &redis, "chaos-follow", 30));
    let a0 = bs[0].addr();
    bs[0].set_mode(Mode::Fail(500));
    assert!(
        wait_until(Duration::from_secs(30), || {
            for _ in 0..8 {
                let _ = try_request(&p1.addr(), "GET", "/x", &[], b"");
            }
            state_of(&p1, &a0) == "culled"
        }),
        "p1 never culled b0: {}",
        p1.admin_get("/backends").body_str()
    );
    assert!(
        wait_until(Duration::from_secs(45), || state_of(&p2, &a0) == "culled"),
        "p2 never followed the cull of b0: {}",
        p2.admin_get("/backends").body_str()
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let p2_admin = p2.admin_addr();
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || -> Vec<String> {
            let mut over = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let out = out_of_rotation(&p2_admin);
                if out.len() > 2 {
                    over.push(out.join(" "));
                }
            }
            over
        })
    };
    // b0 recovers: p1's probe releases the cull; at once, b1 and b2 drained on p1.
    bs[0].set_mode(Mode::Ok);
    assert!(
        wait_until(Duration::from_secs(20), || state_of(&p1, &a0) == "up"),
        "p1 never readmitted b0"
    );
    for b in &bs[1..3] {
        let r = post_json(
            &p1,
            &format!("/backends/app/{}/drain", b.addr().replace(':', "%3A")),
            r#"{"reason": "deploy"}"#,
        );
        assert_eq!(r.status, 200, "{}", r.body_str());
    }
    // p2 catches up: b0 back, b1 and b2 draining.
    let caught_up = wait_until(Duration::from_secs(45), || {
        state_of(&p2, &a0) == "up"
            && state_of(&p2, &bs[1].addr()) == "draining"
            && state_of(&p2, &bs[2].addr()) == "draining"
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let over = watcher
        .join()
        .unwrap_or_else(|_| vec!["the watcher panicked".into()]);
    assert!(caught_up, "p2 never showed b0 up and b1, b2 draining");
    assert!(
        over.is_empty(),
        "p2 showed more than 2 of 4 backends out ({} snapshots), e.g. {:?}",
        over.len(),
        over.first()
    );
}

/// The seeds-1/2/3 finding: an instance woken from a SIGSTOP served the requests waiting
/// for it on the view it had before the pause, sending them to a backend claimed (and
/// stopped for a deploy) while it slept. It now tells the pause and reads the store's
/// state before it routes.
#[test]
fn an_instance_woken_from_a_pause_routes_nothing_to_a_backend_claimed_while_it_slept() {
    let redis = RedisServer::start();
    let bs: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = bs.iter().collect();
    let p1 = Proxy::start(&cull_config(&refs, &redis, "chaos-wake", 1));
    let p2 = Proxy::start(&cull_config(&refs, &redis, "chaos-wake", 1));
    for _ in 0..6 {
        assert_eq!(get(&p2.addr(), "/warm", &[]).status, 200);
    }
    p2.signal("STOP");
    let r = claim(&p1, &bs[0], 60);
    assert_eq!(r.status, 201, "{}", r.body_str());
    let before = bs[0].requests();
    // Requests wait for the frozen instance (in its listen backlog).
    let addr = p2.addr();
    let clients: Vec<_> = (0..12)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                (0..3)
                    .map(|j| {
                        try_request(&addr, "GET", &format!("/w{i}-{j}"), &[], b"")
                            .map(|r| r.status)
                            .unwrap_or(0)
                    })
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    // The pause: 3 s (the fault itself, not a wait for a condition).
    std::thread::sleep(Duration::from_secs(3));
    p2.signal("CONT");
    let statuses: Vec<u16> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap_or_default())
        .collect();
    assert_eq!(statuses.len(), 36, "a client thread failed");
    assert!(
        statuses.iter().all(|s| *s == 200),
        "requests failed: {statuses:?}"
    );
    assert_eq!(
        bs[0].requests(),
        before,
        "the woken instance sent requests to the backend claimed while it slept"
    );
}

/// Four backends behind one proxy (its store key prefix `prefix`) with two of them drained:
/// the budget's 2 of 4 (`max_culled_fraction` 0.5) in use.
fn budget_full(prefix: &str) -> (RedisServer, Vec<Backend>, Proxy) {
    let redis = RedisServer::start();
    let bs: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = bs.iter().collect();
    let p = Proxy::start(&config(&refs, &redis, prefix));
    for b in &bs[..2] {
        let r = post_json(
            &p,
            &format!("/backends/app/{}/drain", b.addr().replace(':', "%3A")),
            r#"{"reason": "within the budget"}"#,
        );
        assert_eq!(r.status, 200, "{}", r.body_str());
    }
    (redis, bs, p)
}

/// The seed-7 finding of the second series: two backends drained (the budget's 2 of 4),
/// an emergency claim on a third (past the budget, by design), then a drain of that third
/// backend was granted: it was "out already", so the fraction was not checked. When the
/// emergency claim was released the drain kept it out: 3 of 4 out, over
/// `max_culled_fraction`, with no emergency in force. A backend out only past the budget
/// (an emergency claim, a forced operation) now counts as one more.
#[test]
fn an_operation_on_a_backend_out_only_by_an_emergency_claim_is_held_to_the_budget() {
    let (_redis, bs, p) = budget_full("chaos-emergency");
    let addr = |i: usize| bs[i].addr().replace(':', "%3A");
    let r = post_json(
        &p,
        "/claims",
        &format!(
            r#"{{"upstream": "app", "backend": "{}", "seconds": 60, "reason": "incident", "emergency": true}}"#,
            bs[2].addr()
        ),
    );
    assert_eq!(r.status, 201, "{}", r.body_str());
    let id = json(&r)["id"].as_str().unwrap_or_default().to_string();
    // A drain of the emergency-claimed backend would keep it out after the claim: refused.
    let r = post_json(
        &p,
        &format!("/backends/app/{}/drain", addr(2)),
        r#"{"reason": "on top of the emergency", "seconds": 60}"#,
    );
    assert_eq!(
        r.status,
        409,
        "a drain on top of an emergency claim was granted past the budget: {}",
        r.body_str()
    );
    assert_eq!(json(&r)["policy"], "fraction", "{}", r.body_str());
    // Released: the fleet is back within the budget.
    let r = try_request(
        &p.admin_addr(),
        "DELETE",
        &format!("/claims/{id}"),
        &[],
        b"",
    )
    .unwrap_or_else(|e| panic!("DELETE /claims/{id}: {e}"));
    assert!(r.status < 300, "release: {} {}", r.status, r.body_str());
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut released_at = None;
    loop {
        let out = out_of_rotation(&p.admin_addr());
        if !out.iter().any(|b| b.contains("claimed")) {
            // the release applied: from now on (a sync included), within the budget
            released_at.get_or_insert_with(Instant::now);
            assert!(
                out.len() <= 2,
                "after the emergency claim's release, {} of 4 backends are out (max 2): {out:?}",
                out.len()
            );
        }
        if released_at.is_some_and(|t| t.elapsed() > Duration::from_millis(1500)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the release never showed: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Within the budget again, a drain of that backend still counts as one more.
    let r = post_json(
        &p,
        &format!("/backends/app/{}/drain", addr(2)),
        r#"{"reason": "a third drain", "seconds": 60}"#,
    );
    assert_eq!(r.status, 409, "{}", r.body_str());
}

/// The claim path counts as the stores do: a backend out only by a forced drain (past the
/// budget) is not out already, so a claim on it, which would keep it out once the forced
/// drain ends, answers to the fraction. Before, the claim was granted on "already out" and
/// 3 of 4 backends stayed out when the forced drain was readied.
#[test]
fn a_claim_on_a_backend_out_only_by_a_forced_drain_is_held_to_the_budget() {
    let (_redis, bs, p) = budget_full("chaos-forced");
    let addr = |i: usize| bs[i].addr().replace(':', "%3A");
    let r = post_json(
        &p,
        &format!("/backends/app/{}/drain", addr(2)),
        r#"{"reason": "past the budget", "force": true, "seconds": 60}"#,
    );
    assert_eq!(r.status, 200, "a forced drain: {}", r.body_str());
    let r = claim(&p, &bs[2], 60);
    assert_eq!(
        r.status,
        409,
        "a claim on a force-drained backend was granted past the budget: {}",
        r.body_str()
    );
    assert_eq!(json(&r)["policy"], "fraction", "{}", r.body_str());
    // With room in the budget (one drain readied), the same claim is granted.
    let r = post_json(
        &p,
        &format!("/backends/app/{}/ready", addr(0)),
        r#"{"reason": "done"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    let r = claim(&p, &bs[2], 60);
    assert_eq!(r.status, 201, "{}", r.body_str());
}
