//! Fail-open (Envoy's panic mode): when active health checks leave an upstream
//! with no eligible backend, traffic goes to all of them instead of a 503, and
//! `portcullis_upstream_panic_mode` says so.

use portcullis_test_kit as support;

use std::time::Duration;
use support::*;

fn states(p: &Proxy) -> Vec<String> {
    p.status_json()["upstreams"][0]["backends"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| b["state"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn no_healthy_backend_fails_open_and_is_reported() {
    let a = Backend::start("a");
    let b = Backend::start("b");
    // Every path answers 404: health checks (2xx wanted) fail, but the
    // backends still answer requests.
    a.set_mode(Mode::Fail(404));
    b.set_mode(Mode::Fail(404));
    let p = Proxy::start(&format!(
        r#"
[[upstreams]]
name = "app"
backends = ["{}", "{}"]
health_check_path = "/health"
health_check_interval_seconds = 1

[rate_limit]
enabled = false
"#,
        a.addr(),
        b.addr()
    ));
    assert!(
        wait_until(Duration::from_secs(20), || states(&p)
            .iter()
            .all(|s| s == "unhealthy")),
        "health checks never marked both unhealthy: {:?}",
        states(&p)
    );
    for _ in 0..6 {
        let r = get(&p.addr(), "/x", &[]);
        assert_eq!(r.status, 404, "the backend's answer, not a proxy 503");
        assert!(r.header("x-backend").is_some(), "reached a backend");
    }
    assert_eq!(
        p.metric(r#"portcullis_upstream_panic_mode{upstream="app"}"#),
        Some(1.0)
    );
    assert!(p.logs().contains("panic mode"), "a log line reports it");

    // Healthy again: panic mode ends with the next request.
    a.set_mode(Mode::Ok);
    b.set_mode(Mode::Ok);
    assert!(
        wait_until(Duration::from_secs(20), || states(&p)
            .iter()
            .all(|s| s == "up")),
        "backends never came back up: {:?}",
        states(&p)
    );
    assert_eq!(get(&p.addr(), "/x", &[]).status, 200);
    assert_eq!(
        p.metric(r#"portcullis_upstream_panic_mode{upstream="app"}"#),
        Some(0.0)
    );
}

/// The chaos harness's finding: one backend drained while it passes its checks, the others
/// failing theirs. The healthy one is out of rotation, so nothing healthy is in it: the
/// instance fails open to the backends in rotation rather than answering 503 (it answered
/// 503 because a healthy backend existed, though out).
#[test]
fn a_drained_healthy_backend_does_not_keep_the_failing_ones_from_failing_open() {
    let bs: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("b{i}"))).collect();
    let p = Proxy::start(&format!(
        r#"
[[upstreams]]
name = "app"
backends = ["{}", "{}", "{}"]
health_check_path = "/health"
health_check_interval_seconds = 1

[rate_limit]
enabled = false
"#,
        bs[0].addr(),
        bs[1].addr(),
        bs[2].addr()
    ));
    let r = post(
        &p.admin_addr(),
        &format!("/backends/app/{}/drain", bs[0].addr().replace(':', "%3A")),
        &[("content-type", "application/json")],
        br#"{"reason": "deploy"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    bs[1].set_mode(Mode::Fail(404));
    bs[2].set_mode(Mode::Fail(404));
    assert!(
        wait_until(Duration::from_secs(20), || states(&p)
            == ["draining", "unhealthy", "unhealthy"]),
        "never drained + unhealthy: {:?}",
        states(&p)
    );
    for _ in 0..6 {
        let r = get(&p.addr(), "/x", &[]);
        assert_eq!(r.status, 404, "a failing backend's answer, not a proxy 503");
        assert_ne!(
            r.header("x-backend"),
            Some("b0"),
            "the drained backend got it"
        );
    }
}
