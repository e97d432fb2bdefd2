//! The runtime API of CONTRACT §12 end to end: real `portcullis` processes sharing a real
//! `redis-server`, real backends, real HTTP to the admin listener. Drains reach every
//! instance within 2 s with no failed request, drains and culls share one budget, leases
//! lapse by themselves, a restarted instance picks operations up, and bad input gets a
//! clear answer.

use portcullis_test_kit as support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::*;

/// An action reaches every instance within this (CONTRACT §12), plus the time to see it
/// from outside on a loaded machine.
const FLEET_BOUND: Duration = Duration::from_secs(2);
const SLACK: Duration = Duration::from_millis(500);

/// Upstream "app" over `backends`, Redis at `redis` under `prefix`, culling on at
/// `fraction` with a one-second check, the rate limit off; `server` lines go to `[server]`.
fn config(
    backends: &[&Backend],
    redis: Option<&RedisServer>,
    prefix: &str,
    fraction: f64,
) -> String {
    let mut s = String::new();
    if let Some(r) = redis {
        s.push_str(&format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 300\n\n",
            r.url()
        ));
    }
    s.push_str(&upstream_table(
        "app",
        backends,
        "retries = 0\nconnect_timeout_ms = 500\n",
    ));
    s.push_str(&format!(
        "[rate_limit]\nenabled = false\n\n[shedding]\nmax_concurrency = 0\n\n\
         [culling]\nenabled = true\nwindow_seconds = 10\nerror_threshold = 5\n\
         check_interval_seconds = 1\ntokens = 10\ntoken_period_seconds = 600\n\
         max_culled_fraction = {fraction:?}\ncooldown_seconds = 60\n"
    ));
    s
}

fn action(
    p: &Proxy,
    upstream: &str,
    backend: &str,
    act: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Resp {
    let path = format!("/backends/{upstream}/{backend}/{act}");
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    post(&p.admin_addr(), &path, &h, body.as_bytes())
}

fn json(r: &Resp) -> Value {
    serde_json::from_str(&r.body_str())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body_str()))
}

/// `GET /backends`, the entry of `backend`.
fn backend(p: &Proxy, backend: &str) -> Value {
    let r = p.admin_get("/backends");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.header("content-type"), Some("application/json"));
    json(&r)
        .as_array()
        .and_then(|a| a.iter().find(|b| b["address"] == backend).cloned())
        .unwrap_or_else(|| panic!("no {backend} in {}", r.body_str()))
}

fn state(p: &Proxy, b: &str) -> String {
    backend(p, b)["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_drain_on_one_instance_stops_the_fleet_within_two_seconds_without_a_failed_request() {
    let redis = RedisServer::start();
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    let cfg = config(&[&b1, &b2], Some(&redis), "fops-drain", 0.5);
    let (a, b) = (Proxy::start(&cfg), Proxy::start(&cfg));
    let load = Load::start(&[a.addr(), b.addr()]);
    load.wait_for(10, "b1 serves both instances", |s| {
        s.backend.as_deref() == Some("b1")
    });

    let r = action(
        &a,
        "app",
        &b1.addr(),
        "drain",
        r#"{"reason": "deploy v2", "seconds": 600}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    let drained_at = Instant::now();
    let view = json(&r);
    assert_eq!(view["state"], "draining");
    assert_eq!(
        (view["source"].as_str(), view["by"].as_str()),
        (Some("manual"), Some("admin"))
    );
    assert_eq!(view["reason"], "deploy v2");
    assert!(view["until"].as_u64().is_some(), "{view}");

    // The other instance follows within the bound.
    eventually(
        FLEET_BOUND + SLACK,
        || format!("B never drained b1: {}", backend(&b, &b1.addr())),
        || state(&b, &b1.addr()) == "draining",
    );
    assert!(drained_at.elapsed() <= FLEET_BOUND + SLACK);
    let cutoff = drained_at + FLEET_BOUND;
    // Requests started after the bound go to b2 only, on both instances.
    load.wait_for(20, "requests after the drain", |s| s.start > cutoff);
    let samples_after = |f: &dyn Fn(&Sample) -> bool| load.count(|s| s.start > cutoff && f(s));
    assert_eq!(
        samples_after(&|s| s.backend.as_deref() == Some("b1")),
        0,
        "b1 got new requests after the drain"
    );
    assert!(samples_after(&|s| s.proxy == 1 && s.ok()) > 0);
    // No request failed at any time.
    assert_eq!(
        load.count(|s| !s.ok()),
        0,
        "failed requests during the drain"
    );

    // /status journals it, the metric counts it.
    let journal = a.status_json()["culling"]["recent_decisions"].clone();
    assert!(
        journal.as_array().is_some_and(|j| j
            .iter()
            .any(|e| e["action"] == "drain" && e["by"] == "admin" && e["reason"] == "deploy v2")),
        "{journal}"
    );
    assert_eq!(
        a.metric(r#"portcullis_admin_actions_total{action="drain",result="applied"}"#),
        Some(1.0)
    );
    assert!(a
        .logs()
        .lines()
        .any(|l| l.contains("\"admin_action\"") && l.contains("deploy v2")));
    let series = |state: &str| {
        format!(
            "portcullis_backend_state{{backend=\"{}\",state=\"{state}\",upstream=\"app\"}}",
            b1.addr()
        )
    };
    let text = a.metrics();
    assert!(
        text.contains(&format!("{} 1", series("draining"))),
        "{text}"
    );
    assert!(text.contains(&format!("{} 0", series("up"))), "{text}");

    // ready: back in rotation everywhere.
    let r = action(&b, "app", &b1.addr(), "ready", "", &[]);
    assert_eq!(r.status, 200, "{}", r.body_str());
    eventually(
        FLEET_BOUND + SLACK,
        || "A never readmitted b1".into(),
        || state(&a, &b1.addr()) == "up",
    );
    let back = Instant::now();
    load.wait_for(5, "b1 serves again", |s| {
        s.start > back && s.backend.as_deref() == Some("b1")
    });
    assert_eq!(load.count(|s| !s.ok()), 0);
}

#[test]
fn drains_and_culls_share_one_budget_and_the_last_backend_never_goes() {
    let redis = RedisServer::start();
    let bs: Vec<Backend> = (1..=4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = bs.iter().collect();
    let p = Proxy::start(&config(&refs, Some(&redis), "fops-budget", 0.5));
    // b1 fails: the automatic cull takes one of the two places.
    bs[0].set_mode(Mode::Fail(500));
    eventually(
        Duration::from_secs(20),
        || format!("b1 never culled: {}", backend(&p, &bs[0].addr())),
        || {
            let _ = try_get(&p.addr(), "/x", &[]);
            state(&p, &bs[0].addr()) == "culled"
        },
    );
    assert_eq!(backend(&p, &bs[0].addr())["source"], "auto");
    // a manual drain takes the other
    let r = action(
        &p,
        "app",
        &bs[1].addr(),
        "drain",
        r#"{"reason": "disk swap"}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(json(&r)["until"], Value::Null, "no seconds: until ready");
    // a third is refused with the policy and a reason a person can act on
    let r = action(
        &p,
        "app",
        &bs[2].addr(),
        "maint",
        r#"{"reason": "kernel"}"#,
        &[],
    );
    assert_eq!(r.status, 409, "{}", r.body_str());
    let refusal = json(&r);
    assert_eq!(
        (refusal["granted"].as_bool(), refusal["policy"].as_str()),
        (Some(false), Some("fraction"))
    );
    assert!(
        refusal["reason"]
            .as_str()
            .is_some_and(|s| s.contains("max_culled_fraction")),
        "{refusal}"
    );
    // force passes the fraction, and is recorded
    let r = action(
        &p,
        "app",
        &bs[2].addr(),
        "maint",
        r#"{"reason": "kernel", "force": true}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(json(&r)["force"], true);
    assert_eq!(json(&r)["state"], "maint");
    // never the last backend, forced or not; weight 0 counts as out
    for (act, body) in [
        ("drain", r#"{"reason": "x", "force": true}"#),
        ("weight", r#"{"weight": 0, "force": true}"#),
    ] {
        let r = action(&p, "app", &bs[3].addr(), act, body, &[]);
        assert_eq!(r.status, 409, "{act}: {}", r.body_str());
        assert_eq!(json(&r)["policy"], "last_backend");
    }
    // traffic still flows, to b4 alone
    for _ in 0..5 {
        let r = p.get("/y", &[]);
        assert_eq!((r.status, r.header("x-backend")), (200, Some("b4")));
    }
    assert_eq!(
        p.metric(r#"portcullis_admin_actions_total{action="maint",result="refused"}"#),
        Some(1.0)
    );
    // a weight above zero is not an outage: granted
    let r = action(&p, "app", &bs[3].addr(), "weight", r#"{"weight": 7}"#, &[]);
    assert_eq!((r.status, json(&r)["weight"].as_u64()), (200, Some(7)));
}

#[test]
fn leases_lapse_and_a_restarted_instance_picks_operations_up() {
    let redis = RedisServer::start();
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    let cfg = config(&[&b1, &b2], Some(&redis), "fops-lease", 0.5);
    let a = Proxy::start(&cfg);
    let r = action(
        &a,
        "app",
        &b2.addr(),
        "maint",
        r#"{"reason": "rack move"}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    // A new instance reads it from the store at start.
    let c = Proxy::start(&cfg);
    eventually(
        FLEET_BOUND + SLACK,
        || "the new instance missed the maint".into(),
        || state(&c, &b2.addr()) == "maint",
    );
    for _ in 0..4 {
        assert_eq!(c.get("/z", &[]).header("x-backend"), Some("b1"));
    }
    // A drain with seconds lapses by itself.
    let r = action(&c, "app", &b2.addr(), "ready", "", &[]);
    assert_eq!(r.status, 200);
    let r = action(
        &c,
        "app",
        &b1.addr(),
        "drain",
        r#"{"reason": "short", "seconds": 1}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    eventually(
        FLEET_BOUND + SLACK,
        || "A never saw the drain".into(),
        || state(&a, &b1.addr()) == "draining",
    );
    eventually(
        Duration::from_secs(1) + FLEET_BOUND + SLACK,
        || "the lease never lapsed".into(),
        || state(&a, &b1.addr()) == "up" && state(&c, &b1.addr()) == "up",
    );
}

#[test]
fn with_the_store_down_actions_answer_503_and_traffic_flows() {
    let mut redis = RedisServer::start();
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    let p = Proxy::start(&config(&[&b1, &b2], Some(&redis), "fops-down", 0.5));
    redis.kill();
    let r = action(
        &p,
        "app",
        &b1.addr(),
        "drain",
        r#"{"reason": "deploy"}"#,
        &[],
    );
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert!(
        json(&r)["error"]
            .as_str()
            .is_some_and(|e| e.contains("not applied")),
        "{}",
        r.body_str()
    );
    for _ in 0..4 {
        assert_eq!(p.get("/ok", &[]).status, 200);
    }
    assert_eq!(state(&p, &b1.addr()), "up");
    assert_eq!(
        p.metric(r#"portcullis_admin_actions_total{action="drain",result="store_error"}"#),
        Some(1.0)
    );
}

#[test]
fn bad_input_gets_a_clear_answer_and_names_never_break_the_log() {
    let (b1, b2) = (Backend::start("b1"), Backend::start("b2"));
    // In-process store: the action applies to this instance only.
    let cfg = config(&[&b1, &b2], None, "", 0.5);
    let p = Proxy::start_with_server(
        "admin_token = \"root-tok-1\"\nadmin_tokens = { deployer = \"deploy-tok-2\" }",
        &cfg,
    );
    let auth = [("authorization", "Bearer deploy-tok-2")];
    let status = |r: Resp| (r.status, r.body_str());
    // no token, a wrong one
    assert_eq!(
        action(&p, "app", &b1.addr(), "drain", r#"{"reason": "x"}"#, &[]).status,
        401
    );
    assert_eq!(
        action(
            &p,
            "app",
            &b1.addr(),
            "drain",
            r#"{"reason": "x"}"#,
            &[("authorization", "Bearer nope")]
        )
        .status,
        401
    );
    // unknown upstream or backend
    assert_eq!(
        action(&p, "nope", &b1.addr(), "drain", r#"{"reason": "x"}"#, &auth).status,
        404
    );
    assert_eq!(
        action(
            &p,
            "app",
            "10.9.9.9:1",
            "drain",
            r#"{"reason": "x"}"#,
            &auth
        )
        .status,
        404
    );
    assert_eq!(
        action(&p, "app", &b1.addr(), "explode", "{}", &auth).status,
        404
    );
    // malformed bodies name the field
    for (body, field) in [
        ("{", "body"),
        (r#"{"reason": 5}"#, "reason"),
        (r#"{"reason": "x", "seconds": "soon"}"#, "seconds"),
        (r#"{"reason": "x", "colour": "red"}"#, "colour"),
        ("{}", "reason"),
    ] {
        let (code, text) = status(action(&p, "app", &b1.addr(), "drain", body, &auth));
        assert_eq!(code, 400, "{body}: {text}");
        assert!(text.contains(field), "{body}: {text}");
    }
    let long = format!(r#"{{"reason": "{}"}}"#, "x".repeat(10 * 1024));
    let (code, text) = status(action(&p, "app", &b1.addr(), "drain", &long, &auth));
    assert_eq!(code, 400, "{text}");
    // a huge body is refused before it is parsed
    let huge = format!(r#"{{"reason": "{}"}}"#, "x".repeat(64 * 1024));
    assert_eq!(
        action(&p, "app", &b1.addr(), "drain", &huge, &auth).status,
        413
    );
    // the percent-encoded address; control characters and markup are kept as text
    let addr = b1.addr().replace(':', "%3A");
    let body = r#"{"reason": "line one\nline two\u0007 <script>alert(1)</script>"}"#;
    let r = action(&p, "app", &addr, "drain", body, &auth);
    assert_eq!(r.status, 200, "{}", r.body_str());
    let view = json(&r);
    assert_eq!(view["by"], "deployer", "the token's name");
    assert_eq!(
        view["reason"],
        "line one line two  <script>alert(1)</script>"
    );
    let logs = p.logs();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("admin_action"))
        .map(str::trim)
        .collect();
    let line = lines
        .iter()
        .find(|l| l.contains("deployer") && l.contains("applied"))
        .unwrap_or_else(|| panic!("no log line: {lines:?}"));
    let parsed: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not one JSON line ({e}): {line}"));
    assert!(parsed.to_string().contains("line one line two"), "{parsed}");
    // The status page shows the drain with who and why, the markup as text.
    let bin =
        chromium().unwrap_or_else(|| panic!("chromium is not installed: run scripts/setup.sh"));
    let dom = dump_dom(bin, &format!("http://{}/", p.admin_addr()));
    let start = dom
        .find(&format!("data-backend=\"{}\"", b1.addr()))
        .unwrap_or_else(|| panic!("no row for b1:\n{dom}"));
    let row = &dom[start..start + dom[start..].find("</tr>").unwrap_or(0)];
    assert!(
        row.contains(">draining<") && row.contains(">deployer<"),
        "{row}"
    );
    assert!(
        row.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{row}"
    );
    assert!(
        !dom.contains("<script>alert(1)"),
        "markup from a reason:\n{dom}"
    );
    // GET stays open, other methods need the token
    assert_eq!(p.admin_get("/backends").status, 200);
    let r = try_request(&p.admin_addr(), "DELETE", "/backends", &[], b"")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 401);
}

#[test]
fn drains_answer_to_the_budget_policy_unless_forced() {
    let redis = RedisServer::start();
    let bs: Vec<Backend> = (1..=3).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = bs.iter().collect();
    let cfg = format!(
        "{}\n[budget]\nmax_concurrent = 1\n",
        config(&refs, Some(&redis), "fops-policy", 1.0)
    );
    let p = Proxy::start(&cfg);
    let r = action(
        &p,
        "app",
        &bs[0].addr(),
        "drain",
        r#"{"reason": "one"}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    let r = action(
        &p,
        "app",
        &bs[1].addr(),
        "maint",
        r#"{"reason": "two"}"#,
        &[],
    );
    assert_eq!(r.status, 409, "{}", r.body_str());
    assert_eq!(json(&r)["policy"], "max_concurrent");
    let r = action(
        &p,
        "app",
        &bs[1].addr(),
        "maint",
        r#"{"reason": "two", "force": true}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    // never the last backend
    let r = action(
        &p,
        "app",
        &bs[2].addr(),
        "drain",
        r#"{"reason": "three", "force": true}"#,
        &[],
    );
    assert_eq!(json(&r)["policy"], "last_backend");
}

#[test]
fn max_concurrent_holds_an_automatic_cull_back_until_a_drain_ends() {
    let redis = RedisServer::start();
    let bs: Vec<Backend> = (1..=4).map(|i| Backend::start(&format!("b{i}"))).collect();
    let refs: Vec<&Backend> = bs.iter().collect();
    let cfg = format!(
        "{}\n[budget]\nmax_concurrent = 1\n",
        config(&refs, Some(&redis), "fops-cullcap", 0.5)
    );
    let p = Proxy::start(&cfg);
    let r = action(
        &p,
        "app",
        &bs[0].addr(),
        "drain",
        r#"{"reason": "deploy"}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    bs[1].set_mode(Mode::Fail(500));
    // b2 fails, but one operation is out fleet-wide already: it stays in rotation, failing
    eventually(
        Duration::from_secs(20),
        || "b2 never reported failing".into(),
        || {
            for _ in 0..4 {
                let _ = try_get(&p.addr(), "/x", &[]);
            }
            let s = p.status_json();
            let rows = s["upstreams"][0]["backends"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            rows.iter()
                .any(|b| b["address"] == bs[1].addr() && b["failing"].is_string())
        },
    );
    assert_eq!(state(&p, &bs[1].addr()), "up");
    assert!(p.logs().contains("cull held back by [budget]"));
    // the drain ends: the cull goes through
    assert_eq!(
        action(&p, "app", &bs[0].addr(), "ready", "", &[]).status,
        200
    );
    eventually(
        Duration::from_secs(20),
        || "b2 never culled".into(),
        || {
            let _ = try_get(&p.addr(), "/x", &[]);
            state(&p, &bs[1].addr()) == "culled"
        },
    );
}
