//! Admin endpoints (CONTRACT §4).

use portcullis_test_kit as support;

use support::*;

const METRICS: &[&str] = &[
    "portcullis_requests_total",
    "portcullis_inflight_requests",
    "portcullis_request_duration_seconds",
    "portcullis_backend_culled",
    "portcullis_cull_decisions_total",
    "portcullis_ratelimit_store_errors_total",
    "portcullis_ratelimit_store_healthy",
];

fn config(a: &Backend, b: &Backend) -> String {
    upstreams(&[("app", &[a, b]), ("other", &[a])])
}

/// Backends A and B, and a proxy with [`config`] in front of them.
fn started() -> (Backend, Backend, Proxy) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let p = Proxy::start(&config(&a, &b));
    (a, b, p)
}

/// `GET path` on the admin listener: a 200 whose `Content-Type` starts with `content_type`.
fn admin_get_typed(p: &Proxy, path: &str, content_type: &str) -> Resp {
    let r = p.admin_get(path);
    assert_eq!(r.status, 200, "{path}: {r:?}");
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with(content_type)),
        "{path}: content-type {:?}, want {content_type}",
        r.header("content-type")
    );
    r
}

#[test]
fn healthz_and_readyz() {
    let (a, b, p) = started();
    assert_eq!(p.admin_get("/healthz").status, 200);
    assert_eq!(p.admin_get("/readyz").status, 200);
    // admin endpoints are not proxied
    assert_eq!(a.requests() + b.requests(), 0);
}

/// `/readyz` 200 means "send me traffic": the proxy listener must already accept by then.
#[test]
fn readyz_implies_the_proxy_listener_accepts() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    for _ in 0..3 {
        let mut p = Proxy::spawn_with_server("", &config(&a, &b));
        let admin = p.admin_addr();
        assert_eventually!(
            {
                assert!(p.is_running(), "proxy exited; logs:\n{}", p.logs());
                matches!(
                    Conn::open_with_timeout(&admin, std::time::Duration::from_secs(2))
                        .and_then(|mut c| c.request("GET", "/readyz", &[], b"")),
                    Ok(r) if r.status == 200
                )
            },
            "never ready"
        );
        // the very first moment readiness says 200, traffic must be served
        let r = try_get(&p.addr(), "/first", &[]);
        assert!(
            matches!(&r, Ok(r) if r.status == 200),
            "readyz was 200 but the proxy listener did not serve: {r:?}"
        );
    }
}

#[test]
fn status_json_shape() {
    let (a, b, p) = started();
    admin_get_typed(&p, "/status", "application/json");
    let s = p.status_json();
    assert_eq!(s["state"], "ready", "{s}");
    assert!(s["inflight"].is_u64(), "inflight: {s}");
    assert_eq!(
        s["rate_limit"]["store"], "local",
        "no [redis] => local: {s}"
    );
    assert_eq!(s["rate_limit"]["store_healthy"], true, "{s}");
    assert!(
        s["culling"]["tokens_available"].is_number(),
        "culling.tokens_available: {s}"
    );
    let ups = s["upstreams"].as_array().expect("upstreams array");
    assert_eq!(ups.len(), 2, "{s}");
    assert_eq!(ups[0]["name"], "app");
    assert_eq!(ups[1]["name"], "other");
    let backends = ups[0]["backends"].as_array().expect("backends array");
    let addrs: Vec<&str> = backends
        .iter()
        .map(|b| b["address"].as_str().expect("address string"))
        .collect();
    assert_eq!(addrs, vec![a.addr().as_str(), b.addr().as_str()]);
    for be in backends {
        assert_eq!(be["state"], "up", "{be}");
        assert_eq!(be["errors_in_window"].as_u64(), Some(0), "{be}");
    }
}

#[test]
fn status_with_redis_store() {
    let redis = RedisServer::start();
    let a = Backend::start("A");
    let p = Proxy::start(&format!(
        r#"
[redis]
url = "{}"

[[upstreams]]
name = "app"
backends = ["{}"]
"#,
        redis.url(),
        a.addr()
    ));
    let s = p.status_json();
    assert_eq!(s["rate_limit"]["store"], "redis", "{s}");
    assert_eventually!(
        p.status_json()["rate_limit"]["store_healthy"] == true,
        "store_healthy never true: {}",
        p.status_json()
    );
    assert_eventually!(
        p.metric("portcullis_ratelimit_store_healthy") == Some(1.0),
        "portcullis_ratelimit_store_healthy: {:?}",
        p.metric("portcullis_ratelimit_store_healthy")
    );
}

#[test]
fn metrics_exposes_every_contract_metric() {
    let (a, _b, p) = started();
    let r = admin_get_typed(&p, "/metrics", "text/plain");
    let text = r.body_str();
    let missing: Vec<&&str> = METRICS.iter().filter(|m| !has_metric(&text, m)).collect();
    assert!(
        missing.is_empty(),
        "missing metrics {missing:?} in:\n{text}"
    );
    // the per-backend cull gauge exists for each backend, at 0
    assert_eq!(
        metric_value(
            &text,
            &format!(
                r#"portcullis_backend_culled{{upstream="app",backend="{}"}}"#,
                a.addr()
            )
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "portcullis_ratelimit_store_healthy"),
        Some(1.0)
    );
}

#[test]
fn metrics_count_traffic() {
    let (_a, _b, p) = started();
    let n = 15;
    for i in 0..n {
        assert_eq!(p.get(&format!("/m/{i}"), &[]).status, 200);
    }
    assert_eventually!(
        p.metric(r#"portcullis_requests_total{outcome="proxied"}"#)
            .unwrap_or(0.0)
            >= n as f64,
        "proxied counter < {n}:\n{}",
        p.metrics()
    );
    let text = p.metrics();
    let count = metric_value(
        &text,
        r#"portcullis_request_duration_seconds_count{outcome="proxied"}"#,
    )
    .unwrap_or_else(|| panic!("no duration _count for proxied:\n{text}"));
    assert!(count >= n as f64, "duration count {count} < {n}");
    assert!(
        metric_value(
            &text,
            r#"portcullis_request_duration_seconds_bucket{outcome="proxied",le="+Inf"}"#
        )
        .is_some_and(|v| v >= n as f64),
        "histogram +Inf bucket:\n{text}"
    );
    assert_eq!(
        metric_value(&text, "portcullis_inflight_requests"),
        Some(0.0)
    );
    // an API key is never a label, and labels stay bounded
    for (name, labels, _) in metric_samples(&text) {
        for (k, _) in &labels {
            assert!(
                !k.to_ascii_lowercase().contains("key"),
                "{name} has a key-like label {k}"
            );
        }
    }
}

#[test]
fn unknown_admin_path_is_404() {
    let (_a, _b, p) = started();
    assert_eq!(p.admin_get("/nope").status, 404);
}
