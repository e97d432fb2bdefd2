//! Shadow mode (CONTRACT §13), with the real binary: a rate-limit policy or the load-shedding
//! cap in shadow mode decides and counts but never refuses. A shadow refusal admits the
//! request, is counted in `portcullis_shadow_refusals_total{gate,policy}`, and the request's
//! access-log line says `"shadow": ["rate_limit:NAME" | "shed:CLASS", …]`.

use portcullis_test_kit as support;

use std::path::Path;
use std::thread::{self, JoinHandle};
use std::time::Duration;
use support::*;

const DEADLINE: Duration = Duration::from_secs(10);

fn access_log(path: &Path) -> String {
    format!(
        "[access_log]\nenabled = true\npath = \"{}\"\nsample = 1.0\n",
        path.display()
    )
}

/// The JSON lines of the access log.
fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn wait_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let mut got = Vec::new();
    let ok = wait_until(DEADLINE, || {
        got = lines(path);
        got.len() >= n
    });
    assert!(
        ok,
        "expected {n} access-log lines, got {}: {got:?}",
        got.len()
    );
    got
}

/// The access-log lines of requests whose path starts with `prefix`, in order.
fn lines_under<'a>(all: &'a [serde_json::Value], prefix: &str) -> Vec<&'a serde_json::Value> {
    all.iter()
        .filter(|l| l["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
        .collect()
}

fn shadow_refusals(p: &Proxy, gate: &str, policy: &str) -> f64 {
    p.metric(&format!(
        "portcullis_shadow_refusals_total{{gate=\"{gate}\",policy=\"{policy}\"}}"
    ))
    .unwrap_or(0.0)
}

fn decisions(p: &Proxy, policy: &str, result: &str) -> f64 {
    p.metric(&format!(
        "portcullis_ratelimit_policy_decisions_total{{policy=\"{policy}\",result=\"{result}\"}}"
    ))
    .unwrap_or(0.0)
}

/// `[rate_limit]` (20 per 300 s per API key) enforcing, "trial" (5 per 300 s per API key)
/// in shadow mode on every path, "strict" (3 per 300 s) enforcing on `/strict`.
fn policies(b: &Backend, log: &Path) -> String {
    format!(
        r#"{}
[shedding]
max_concurrency = 0

[culling]
enabled = false

[rate_limit]
window_seconds = 300
limit = 20

[[rate_limit.policies]]
name = "trial"
limit = 5
window_seconds = 300
path_prefix = "/"
shadow = true

[[rate_limit.policies]]
name = "strict"
limit = 3
window_seconds = 300
path_prefix = "/strict"

{}"#,
        one_upstream(b),
        access_log(log)
    )
}

#[test]
fn a_shadow_policy_at_limit_5_admits_12_and_counts_7_while_an_enforcing_one_refuses() {
    let b = Backend::start("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let p = Proxy::start(&policies(&b, &log));

    // Twelve requests of one key: "trial" would admit 5 and refuse 7; it admits all 12.
    for i in 0..12 {
        let r = p.get(&format!("/t/{i}"), &[("x-api-key", "k1")]);
        assert_eq!(r.status, 200, "request {i}: a shadow policy never refuses");
        // The client sees only the enforcing policies' fields.
        let policy = r.header("ratelimit-policy").unwrap_or("");
        assert_eq!(policy, "\"default\";q=20;w=300", "request {i}");
    }
    assert_eq!(b.requests(), 12);
    assert_eq!(shadow_refusals(&p, "rate_limit", "trial"), 7.0);
    // Counted as enforcing would: 5 admissions, 7 refusals.
    assert_eq!(decisions(&p, "trial", "allowed"), 5.0);
    assert_eq!(decisions(&p, "trial", "limited"), 7.0);
    assert_eq!(decisions(&p, "default", "allowed"), 12.0);

    // The enforcing policy beside it still refuses (another key, fresh for "trial").
    let statuses: Vec<u16> = (0..5)
        .map(|i| {
            p.get(&format!("/strict/{i}"), &[("x-api-key", "k2")])
                .status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let r = p.get("/strict/last", &[("x-api-key", "k2")]);
    assert_eq!(r.status, 429);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"strict\";q=3;w=300"),
        "the 429 names the enforcing policy"
    );
    // "trial" counted k2's 3 admitted requests; the refused ones count against no policy
    // and are no shadow refusals.
    assert_eq!(decisions(&p, "trial", "allowed"), 8.0);
    assert_eq!(decisions(&p, "trial", "refused_by_other"), 3.0);
    assert_eq!(shadow_refusals(&p, "rate_limit", "trial"), 7.0);
    assert_eq!(
        p.metric(r#"portcullis_requests_total{outcome="rate_limited"}"#),
        Some(3.0)
    );

    // The access log: the last 7 of the twelve carry the shadow field, the rest none.
    let all = wait_lines(&log, 18);
    let mut twelve = lines_under(&all, "/t/");
    // In the order they were sent (`/t/N`): a line is written after its response, so the
    // next request's line can come first (two worker threads).
    twelve.sort_by_key(|l| {
        l["path"]
            .as_str()
            .and_then(|p| p.strip_prefix("/t/"))
            .and_then(|n| n.parse::<u32>().ok())
    });
    assert_eq!(twelve.len(), 12);
    for (i, l) in twelve.iter().enumerate() {
        if i < 5 {
            assert!(l.get("shadow").is_none(), "request {i}: {l}");
        } else {
            assert_eq!(
                l["shadow"],
                serde_json::json!(["rate_limit:trial"]),
                "request {i}: {l}"
            );
        }
    }
    for l in lines_under(&all, "/strict/") {
        assert!(l.get("shadow").is_none(), "{l}");
    }
}

#[test]
fn rate_limit_shadow_alone_admits_everything_without_ratelimit_fields() {
    let b = Backend::start("app");
    let p = Proxy::start(&format!(
        "{}[shedding]\nmax_concurrency = 0\n[rate_limit]\nlimit = 5\nwindow_seconds = 300\nshadow = true\nmissing_key = \"reject\"\n",
        one_upstream(&b)
    ));
    for i in 0..12 {
        let r = p.get(&format!("/{i}"), &[("x-api-key", "k1")]);
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(r.header("ratelimit"), None, "request {i}");
    }
    // A missing key with missing_key = "reject" is admitted too, and counted.
    assert_eq!(p.get("/nokey", &[]).status, 200);
    assert_eq!(shadow_refusals(&p, "rate_limit", "default"), 8.0);
    assert_eq!(decisions(&p, "default", "allowed"), 5.0);
    assert_eq!(b.requests(), 13);
}

fn spawn_get(addr: &str, path: &str) -> JoinHandle<u16> {
    let (addr, path) = (addr.to_string(), path.to_string());
    thread::spawn(move || get(&addr, &path, &[]).status)
}

/// Load shedding in shadow mode at `max_concurrency = 2` (`extra`: more `[shedding]` keys):
/// normal requests (shed at 90%: one in flight) are all admitted, the ones over the cap
/// counted and logged as `shed:normal`.
fn shed_in_shadow(extra: &str) {
    let b = Backend::start("app");
    b.set_mode(Mode::Hold);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let p = Proxy::start(&format!(
        "{}[shedding]\nmax_concurrency = 2\nshadow = true\n{extra}\n[rate_limit]\nenabled = false\n{}",
        one_upstream(&b),
        access_log(&log)
    ));
    let held: Vec<_> = (0..4)
        .map(|i| spawn_get(&p.addr(), &format!("/held/{i}")))
        .collect();
    assert_eventually!(
        b.in_flight() == 4,
        "all 4 reach the backend over a cap of 2 (in flight {})",
        b.in_flight()
    );
    // One normal request fits (90% of 2); the other three were admitted over the cap.
    assert_eq!(shadow_refusals(&p, "shed", "normal"), 3.0);
    assert_eq!(p.metric("portcullis_inflight_requests"), Some(4.0));
    b.release_all();
    for h in held {
        assert_eq!(h.join().expect("join"), 200);
    }
    assert_eq!(
        p.metric(r#"portcullis_requests_total{outcome="shed"}"#)
            .unwrap_or(0.0),
        0.0
    );
    let all = wait_lines(&log, 4);
    let shadowed = all
        .iter()
        .filter(|l| l["shadow"] == serde_json::json!(["shed:normal"]))
        .count();
    assert_eq!(shadowed, 3, "{all:?}");
    assert!(all.iter().all(|l| l["status"] == 200), "{all:?}");
}

#[test]
fn shedding_in_shadow_admits_over_the_fixed_cap_and_counts() {
    shed_in_shadow("");
}

#[test]
fn shedding_in_shadow_admits_over_the_adaptive_cap_and_counts() {
    // The adaptive cap starts at max_concurrency and learns only from answered requests.
    shed_in_shadow("adaptive = true\nmin_concurrency = 1");
}
