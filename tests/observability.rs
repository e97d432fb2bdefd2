//! Observability (CONTRACT §8): the JSON access log, W3C trace context, the richer
//! metrics, the HTML status page in a real Chromium, and the shipped Grafana dashboard
//! and alert rules against a real Prometheus scraping the proxy under load.

use portcullis_test_kit as support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Every field the contract names for an access-log line.
const FIELDS: &[&str] = &[
    "ts",
    "request_id",
    "trace_id",
    "client_ip",
    "method",
    "host",
    "path",
    "protocol",
    "status",
    "outcome",
    "route",
    "upstream",
    "backend",
    "bytes_sent",
    "duration_ms",
    "upstream_ms",
];

/// Secrets a request carries in [`SECRET_HEADERS`] and [`SECRET_PATH`]: none may reach an
/// access-log line or a span.
const SECRETS: [&str; 4] = [
    "KEYSECRET-abc123",
    "AUTHSECRET-def456",
    "COOKIESECRET-ghi789",
    "QUERYSECRET-jkl012",
];
/// API key, bearer token and cookie (each holding one of [`SECRETS`]) and [`TRACEPARENT`].
const SECRET_HEADERS: [(&str, &str); 4] = [
    ("x-api-key", "KEYSECRET-abc123"),
    ("authorization", "Bearer AUTHSECRET-def456"),
    ("cookie", "session=COOKIESECRET-ghi789"),
    ("traceparent", TRACEPARENT),
];
/// A path on the `/orders` route with a secret in its query.
const SECRET_PATH: &str = "/orders/42?api_key=QUERYSECRET-jkl012&x=1";

/// Upstream "app" over `a` with the route `/orders`, a rate limit of `limit` per minute
/// per `x-api-key` (a request without one is allowed), the access log to `log`, then
/// `extra`.
fn orders_config(a: &Backend, limit: u64, log: &Path, extra: &str) -> String {
    format!(
        "{}\n[[routes]]\npath_prefix = \"/orders\"\nupstream = \"app\"\n\n\
         [rate_limit]\nkey = \"header:x-api-key\"\nlimit = {limit}\nwindow_seconds = 60\nmissing_key = \"allow\"\n\n\
         {}\n{extra}",
        one_upstream(a),
        access_log_section(log, "")
    )
}

fn access_log_section(path: &Path, extra: &str) -> String {
    format!(
        "[access_log]\nenabled = true\npath = \"{}\"\n{extra}\n",
        path.display()
    )
}

/// The JSON lines of the access log (panics on a line that is not a JSON object).
fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(v.is_object(), "not an object: {l}");
            v
        })
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

#[test]
fn access_log_lines_carry_every_field_and_no_secret() {
    let a = Backend::start("A");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let cfg = orders_config(&a, 2, &log, "");
    let p = Proxy::start(&cfg);

    let (secrets, headers, path) = (SECRETS, SECRET_HEADERS, SECRET_PATH);
    let r1 = p.get(path, &headers);
    assert_eq!(r1.status, 200);
    assert_eq!(p.get(path, &headers).status, 200);
    // the third request of that key is answered by the rate-limit gate
    let r3 = p.get(path, &headers);
    assert_eq!(r3.status, 429);
    // a request without traceparent, to a path outside the route
    assert_eq!(p.get("/other", &[]).status, 200);

    let got = wait_lines(&log, 4);
    assert_eq!(got.len(), 4, "one line per request: {got:?}");
    for l in &got {
        for f in FIELDS {
            assert!(l.get(*f).is_some(), "field {f} missing in {l}");
        }
        let ts = l["ts"].as_str().expect("ts");
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[19] == b'.',
            "RFC 3339 with ms: {ts}"
        );
        assert_eq!(l["client_ip"], "127.0.0.1");
        assert_eq!(l["method"], "GET");
        assert_eq!(l["protocol"], "HTTP/1.1");
        assert_eq!(l["host"], p.addr().as_str());
        assert!(l["duration_ms"].as_f64().is_some_and(|d| d >= 0.0));
        assert_eq!(l["trace_id"].as_str().map(str::len), Some(32));
    }
    // Lines are written once each response is sent: find them by content, not order.
    let find = |f: &dyn Fn(&serde_json::Value) -> bool| {
        got.iter()
            .find(|l| f(l))
            .unwrap_or_else(|| panic!("line not found in {got:?}"))
    };
    let id1 = r1.header("x-request-id").expect("x-request-id").to_string();
    let proxied = find(&|l| l["request_id"] == id1.as_str());
    assert_eq!(proxied["path"], "/orders/42", "no query string");
    assert_eq!(proxied["status"], 200);
    assert_eq!(proxied["outcome"], "proxied");
    assert_eq!(proxied["route"], "/orders");
    assert_eq!(proxied["upstream"], "app");
    assert_eq!(proxied["backend"], a.addr());
    assert_eq!(proxied["bytes_sent"], 1, "the backend's body is its name");
    assert!(proxied["upstream_ms"].as_f64().is_some_and(|ms| ms >= 0.0));
    assert_eq!(
        proxied["trace_id"], TRACE_ID,
        "the client's trace continues"
    );

    let limited = find(&|l| l["status"] == 429);
    assert_eq!(limited["status"], 429);
    assert_eq!(limited["outcome"], "rate_limited");
    assert_eq!(limited["backend"], "");
    assert_eq!(limited["upstream_ms"], serde_json::Value::Null);
    assert_eq!(limited["trace_id"], TRACE_ID);
    assert!(!limited["request_id"].as_str().unwrap_or("").is_empty());

    let other = find(&|l| l["path"] == "/other");
    assert_eq!(other["route"], "default");
    assert_ne!(
        other["trace_id"], TRACE_ID,
        "a new trace without traceparent"
    );

    let text = std::fs::read_to_string(&log).expect("log");
    let stdout_stderr = p.logs();
    for s in secrets {
        assert!(!text.contains(s), "access log contains {s}:\n{text}");
        assert!(!stdout_stderr.contains(s), "process log contains {s}");
    }
    assert!(!text.contains("api_key="), "no query string at all");
}

#[test]
fn traceparent_is_continued_with_a_new_parent_or_replaced() {
    let a = Backend::start("A");
    let p = Proxy::start(&format!(
        "{}\n[access_log]\nenabled = false\n",
        one_upstream(&a)
    ));
    let parse = |h: &str| -> (String, String, String) {
        let parts: Vec<&str> = h.split('-').collect();
        assert_eq!(parts.len(), 4, "traceparent {h}");
        assert_eq!(parts[0], "00");
        assert!(parts[1].len() == 32 && parts[2].len() == 16 && parts[3].len() == 2);
        (parts[1].into(), parts[2].into(), parts[3].into())
    };

    // valid: same trace and flags, new parent id; tracestate passes through
    p.get(
        "/",
        &[("traceparent", TRACEPARENT), ("tracestate", "vendor=1")],
    );
    let got = a.last_received().expect("received");
    let (trace, parent, flags) = parse(got.header("traceparent").expect("traceparent"));
    assert_eq!(trace, TRACE_ID);
    assert_ne!(parent, "00f067aa0ba902b7", "a new parent id");
    assert_ne!(parent, "0000000000000000");
    assert_eq!(flags, "01");
    assert_eq!(got.header("tracestate"), Some("vendor=1"));

    // absent: a new trace
    p.get("/", &[]);
    let got = a.last_received().expect("received");
    let (t1, _, _) = parse(got.header("traceparent").expect("traceparent"));
    assert_ne!(t1, "0".repeat(32));
    p.get("/", &[]);
    let (t2, _, _) = parse(
        a.last_received()
            .expect("received")
            .header("traceparent")
            .expect("traceparent"),
    );
    assert_ne!(t1, t2, "every request without a trace starts its own");

    // invalid (upper case, zero ids, garbage): replaced, and its tracestate dropped
    for bad in [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "not-a-traceparent",
    ] {
        p.get("/", &[("traceparent", bad), ("tracestate", "vendor=1")]);
        let got = a.last_received().expect("received");
        let tp = got.header("traceparent").expect("traceparent");
        let (t, _, _) = parse(tp);
        assert_ne!(tp, bad);
        assert_ne!(t, TRACE_ID.to_ascii_uppercase());
        assert_ne!(t, "0".repeat(32));
        assert_eq!(
            got.header("tracestate"),
            None,
            "tracestate of {bad} dropped"
        );
    }
}

#[test]
fn sample_applies_to_successes_only() {
    let ok = Backend::start("OK");
    let bad = Backend::start("BAD");
    bad.set_mode(Mode::Fail(503));
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let cfg = format!(
        "{}\n[[routes]]\npath_prefix = \"/bad\"\nupstream = \"bad\"\n\n\
         [culling]\nenabled = false\n\n{}",
        upstreams(&[("app", &[&ok]), ("bad", &[&bad])]),
        access_log_section(&log, "sample = 0.0")
    );
    let p = Proxy::start(&cfg);
    for _ in 0..20 {
        assert_eq!(p.get("/fine", &[]).status, 200);
    }
    for _ in 0..3 {
        assert_eq!(p.get("/bad", &[]).status, 503);
    }
    // a header block over the limit: answered 431 by the proxy before routing
    let big = "x".repeat(70 * 1024);
    assert_eq!(p.get("/fine", &[("x-big", big.as_str())]).status, 431);

    // A last logged request: the writer keeps order, so once its line is there every
    // earlier line that was going to be written is there too.
    assert_eq!(p.get("/bad/marker", &[]).status, 503);
    eventually(
        DEADLINE,
        || "marker and 431 lines".into(),
        || {
            let l = lines(&log);
            l.iter().any(|l| l["path"] == "/bad/marker") && l.iter().any(|l| l["status"] == 431)
        },
    );
    let got_now = lines(&log);
    assert_eq!(got_now.len(), 5, "only the 4xx/5xx lines: {got_now:?}");
    assert_eq!(
        got_now.iter().filter(|l| l["status"] == 503).count(),
        4,
        "{got_now:?}"
    );
    assert!(got_now.iter().all(|l| l["status"] != 200));
    let rejected = got_now
        .iter()
        .find(|l| l["status"] == 431)
        .expect("the 431");
    assert_eq!(rejected["outcome"], "rejected");
    assert_eq!(rejected["route"], "none", "refused before routing");
}

#[test]
fn sigusr1_reopens_the_log_file() {
    let a = Backend::start("A");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let p = Proxy::start(&format!(
        "{}\n{}",
        one_upstream(&a),
        access_log_section(&log, "")
    ));
    p.get("/before", &[]);
    wait_lines(&log, 1);
    std::fs::rename(&log, &rotated).expect("rotate");
    // still written to the renamed file until the signal
    p.get("/between", &[]);
    eventually(
        DEADLINE,
        || "line after the rename".into(),
        || lines(&rotated).len() == 2,
    );
    assert!(!log.exists());
    p.signal("USR1");
    eventually(
        DEADLINE,
        || "new file after SIGUSR1".into(),
        || log.exists(),
    );
    p.get("/after", &[]);
    let new = wait_lines(&log, 1);
    assert_eq!(new.len(), 1);
    assert_eq!(new[0]["path"], "/after");
    let old = lines(&rotated);
    assert_eq!(old.len(), 2, "{old:?}");
    assert!(p.logs().contains("reopening the access log"));
}

/// The writer is stuck (a pipe nobody reads): requests are still answered at once, and
/// the lines that do not fit the queue are dropped and counted.
#[test]
fn a_stuck_writer_drops_lines_without_delaying_requests() {
    let a = Backend::start("A");
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("access.fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(st.success());
    // Open both ends here so the proxy's open does not wait for a reader; never read
    // until the end.
    let hold = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .expect("open fifo");
    let p = Proxy::start(&format!(
        "{}\n[rate_limit]\nenabled = false\n{}",
        one_upstream(&a),
        access_log_section(&fifo, "queue_lines = 8")
    ));
    let n = 1500;
    let mut slowest = Duration::ZERO;
    let mut conn = Conn::open(&p.addr()).expect("connect");
    for i in 0..n {
        let t = Instant::now();
        let r = conn
            .request("GET", &format!("/fill/{i}/{}", "x".repeat(200)), &[], b"")
            .expect("request");
        assert_eq!(r.status, 200);
        slowest = slowest.max(t.elapsed());
    }
    let dropped = p
        .metric("portcullis_access_log_dropped_total")
        .expect("metric");
    assert!(
        dropped > 0.0,
        "a 64 KiB pipe cannot hold {n} lines: some must be dropped"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a request waited for the log writer: {slowest:?}"
    );
    drop(hold);
}

#[test]
fn metrics_by_route_code_upstream_and_connections() {
    let ok = Backend::start("OK");
    let bad = Backend::start("BAD");
    bad.set_mode(Mode::Fail(500));
    let cfg = format!(
        "{}\n[[routes]]\npath_prefix = \"/api\"\nupstream = \"app\"\n\n\
         [[routes]]\npath_prefix = \"/bad\"\nupstream = \"bad\"\n\n\
         [culling]\nenabled = false\n[access_log]\nenabled = false\n",
        upstreams(&[("app", &[&ok]), ("bad", &[&bad])]),
    );
    let p = Proxy::start(&cfg);
    for _ in 0..3 {
        assert_eq!(p.get("/api/x?secret=1", &[]).status, 200);
    }
    for _ in 0..2 {
        assert_eq!(p.get("/bad/y", &[]).status, 500);
    }
    let upstream_ok = format!(
        r#"portcullis_upstream_requests_total{{upstream="app",backend="{}",code="2xx"}}"#,
        ok.addr()
    );
    let upstream_bad = format!(
        r#"portcullis_upstream_requests_total{{upstream="bad",backend="{}",code="5xx"}}"#,
        bad.addr()
    );
    let expected: Vec<(&str, f64)> = vec![
        (
            r#"portcullis_requests_total{route="/api",code="2xx",outcome="proxied"}"#,
            3.0,
        ),
        (
            r#"portcullis_requests_total{route="/bad",code="5xx",outcome="proxied"}"#,
            2.0,
        ),
        (&upstream_ok, 3.0),
        (&upstream_bad, 2.0),
        (
            r#"portcullis_upstream_duration_seconds_count{upstream="app"}"#,
            3.0,
        ),
        (
            r#"portcullis_upstream_duration_seconds_bucket{upstream="app",le="30"}"#,
            3.0,
        ),
    ];
    // Metrics are recorded once the response is sent: poll for the last ones.
    let mut m = String::new();
    let all = |m: &str| {
        expected
            .iter()
            .all(|(sel, want)| metric_value(m, sel) == Some(*want))
    };
    let reached = wait_until(DEADLINE, || {
        m = p.metrics();
        all(&m)
    });
    assert!(reached, "expected {expected:?} in:\n{m}");
    let v = |sel: &str| metric_value(&m, sel).unwrap_or(0.0);
    assert!(!m.contains("le=\"0.0005\""), "buckets start at 1 ms");
    assert!(has_metric(&m, "portcullis_tunnels_open"));
    assert_eq!(v("portcullis_access_log_dropped_total"), 0.0);
    // no label value comes from the request
    assert!(!m.contains("secret") && !m.contains("/api/x") && !m.contains("/bad/y"));

    // client connections: idle keep-alive connections are counted while open
    let before = p.metric("portcullis_client_connections").expect("gauge");
    let mut conns: Vec<Conn> = (0..3)
        .map(|_| {
            let mut c = Conn::open(&p.addr()).expect("connect");
            assert_eq!(
                c.request("GET", "/api/z", &[], b"").expect("req").status,
                200
            );
            c
        })
        .collect();
    eventually(
        DEADLINE,
        || "3 more client connections".into(),
        || {
            p.metric("portcullis_client_connections")
                .is_some_and(|n| n >= before + 3.0)
        },
    );
    conns.clear();
    eventually(
        DEADLINE,
        || "connections closed".into(),
        || {
            p.metric("portcullis_client_connections")
                .is_some_and(|n| n <= before)
        },
    );
}

/// A proxy with one backend culled, so every part of the page has something to show.
fn proxy_with_a_cull() -> (Proxy, Backend, Backend, Backend) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    c.set_mode(Mode::Fail(502));
    let cfg = format!(
        "{}\n[shedding]\nmax_concurrency = 100\n\n\
         [culling]\nerror_threshold = 3\nwindow_seconds = 30\ncheck_interval_seconds = 1\n\
         cooldown_seconds = 600\nmax_culled_fraction = 0.5\n\n[access_log]\nenabled = false\n",
        upstream_of(&[&a, &b, &c])
    );
    let p = Proxy::start(&cfg);
    let culled = format!(r#"portcullis_backend_culled{{backend="{}"}}"#, c.addr());
    eventually(
        DEADLINE,
        || "backend C culled".into(),
        || {
            for _ in 0..6 {
                let _ = try_get(&p.addr(), "/", &[]);
            }
            p.metric(&culled) == Some(1.0)
        },
    );
    (p, a, b, c)
}

#[test]
fn status_json_has_classes_leases_and_recent_decisions() {
    let (p, _a, _b, c) = proxy_with_a_cull();
    let s = p.status_json();
    let classes = s["shedding"]["classes"].as_array().expect("classes");
    let limit = |name: &str| {
        classes
            .iter()
            .find(|x| x["class"] == name)
            .map(|x| x["limit"].clone())
    };
    assert_eq!(limit("critical"), Some(100.into()));
    assert_eq!(limit("normal"), Some(90.into()));
    assert_eq!(limit("low"), Some(75.into()));
    let backends = s["upstreams"][0]["backends"].as_array().expect("backends");
    let bc = backends
        .iter()
        .find(|b| b["address"] == c.addr().as_str())
        .expect("C");
    assert_eq!(bc["state"], "culled");
    let lease_until = bc["cull_lease"]["lease_until_ms"].as_u64().expect("lease");
    let now = s["now_ms"].as_u64().expect("now_ms");
    assert!(lease_until > now, "the lease has time left");
    let decisions = s["culling"]["recent_decisions"]
        .as_array()
        .expect("decisions");
    assert!(
        decisions
            .iter()
            .any(|d| d["result"] == "culled" && d["backend"] == c.addr().as_str()),
        "{decisions:?}"
    );
}

/// Where the status-page screenshot goes (kept for a person to look at).
fn screenshot_path() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    dir.join("status-page.png")
}

#[test]
fn status_page_renders_in_chromium() {
    let page = {
        let a = Backend::start("A");
        let p = Proxy::start(&one_upstream(&a));
        let r = p.admin_get("/");
        assert_eq!(r.status, 200);
        assert!(r
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/html")));
        r.body_str()
    };
    for external in ["src=\"http", "href=\"http", "<link", "@import"] {
        assert!(!page.contains(external), "external asset {external}");
    }
    let Some(bin) = chromium() else {
        panic!("chromium is not installed: run scripts/setup.sh");
    };
    let (p, a, _b, c) = proxy_with_a_cull();
    let url = format!("http://{}/", p.admin_addr());
    let dom = dump_dom(bin, &url);
    assert!(
        dom.contains("data-rendered=\"1\""),
        "the script rendered /status:\n{dom}"
    );
    for needle in [
        ">ready<",
        "id=\"class-critical\"",
        "id=\"class-normal\"",
        "id=\"class-low\"",
        ">0 / 90<",
        "local",
        ">healthy<",
        &format!("data-backend=\"{}\"", a.addr()),
        &format!("data-backend=\"{}\"", c.addr()),
        ">culled<",
        "data-upstream=\"app\"",
    ] {
        assert!(
            dom.contains(needle),
            "rendered DOM lacks {needle:?}:\n{dom}"
        );
    }
    // the culled backend's row shows its lease and time left; the decision is listed
    let row_start = dom
        .find(&format!("data-backend=\"{}\"", c.addr()))
        .expect("row");
    let row = &dom[row_start..row_start + dom[row_start..].find("</tr>").expect("row end")];
    assert!(
        row.contains(">culled<") && row.contains(" min "),
        "lease time left: {row}"
    );
    let decisions = &dom[dom.find("id=\"decisions\"").expect("decisions")..];
    assert!(
        decisions.contains(">culled<") && decisions.contains(&c.addr()),
        "{decisions}"
    );

    let shot = screenshot_path();
    let _ = std::fs::remove_file(&shot);
    screenshot(bin, &url, &shot, 1280, 1000);
    let png = std::fs::read(&shot).expect("screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "a real picture"
    );
    eprintln!("status page screenshot: {}", shot.display());
}

/// PromQL expressions of the dashboard, with Grafana's variables filled in.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/grafana/portcullis.json");
    let text = std::fs::read_to_string(&path).expect("dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut out = Vec::new();
    for panel in d["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("expr");
            let title = panel["title"].as_str().unwrap_or("").to_string();
            out.push((
                title,
                expr.replace("$__rate_interval", "1m")
                    .replace("$instance", ".*"),
            ));
        }
    }
    for a in d["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(expr) = a["expr"].as_str() {
            out.push(("annotation".into(), expr.to_string()));
        }
    }
    out
}

/// Metric names (`portcullis_*`, `up`) an expression reads.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(pos) = expr[i..].find("portcullis_") {
        let start = i + pos;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        names.push(expr[start..end].to_string());
        i = end;
    }
    if expr.contains("up{") {
        names.push("up".into());
    }
    names.sort();
    names.dedup();
    names
}

/// The alert rules Prometheus loaded, each as (name, its expression without
/// the final threshold comparison).
fn alert_queries(prom: &Prometheus) -> Vec<(String, String)> {
    let v = prom.api("/api/v1/rules");
    let mut out = Vec::new();
    for g in v["data"]["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let name = r["name"].as_str().unwrap_or("").to_string();
            let q = r["query"].as_str().unwrap_or("");
            let cut = [" == ", " != ", " >= ", " <= ", " > ", " < "]
                .iter()
                .filter_map(|op| q.rfind(op))
                .max()
                .unwrap_or_else(|| panic!("alert {name} has no threshold: {q}"));
            out.push((name, q[..cut].to_string()));
        }
    }
    out
}

#[test]
fn prometheus_scrapes_the_proxy_for_the_dashboard_and_the_alerts() {
    assert!(
        Prometheus::available(),
        "prometheus is not installed: run scripts/setup.sh"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = root.join("conf/prometheus/alerts.yml");
    let check = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool");
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    // Every gate sees traffic: a failing backend gets culled (C), a slow low-priority
    // route is shed, one API key is rate limited, over-long keys are rejected.
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let slow = Backend::start("SLOW");
    slow.set_mode(Mode::Slow(Duration::from_millis(300)));
    let cfg = format!(
        "{}\n[[routes]]\npath_prefix = \"/slow\"\nupstream = \"slow\"\npriority = \"low\"\n\n\
         [shedding]\nmax_concurrency = 4\n\n\
         [rate_limit]\nlimit = 20\nwindow_seconds = 60\nmissing_key = \"allow\"\n\n\
         [culling]\nerror_threshold = 3\nwindow_seconds = 30\ncheck_interval_seconds = 1\n\
         cooldown_seconds = 600\n\n[access_log]\nenabled = false\n",
        upstreams(&[("app", &[&a, &b, &c]), ("slow", &[&slow])])
    );
    let p = Proxy::start(&cfg);
    let addr = p.addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for worker in 0..4 {
        let addr = addr.clone();
        let stop = stop.clone();
        load.push(thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let _ = match worker {
                    0 => try_get(&addr, "/", &[]),
                    1 => try_get(&addr, "/", &[("x-api-key", "busy-key")]),
                    _ => try_get(&addr, "/slow", &[]),
                };
                if worker == 0 && n.is_multiple_of(10) {
                    // longer than rate_limit.max_key_bytes: 400, outcome rejected
                    let long = "k".repeat(300);
                    let _ = try_get(&addr, "/", &[("x-api-key", long.as_str())]);
                }
                thread::sleep(Duration::from_millis(5));
            }
        }));
    }

    let prom = Prometheus::start(&p.admin_addr(), &rules);
    // C starts failing once Prometheus has scraped, so that its cull is an increase
    // Prometheus sees (a counter's first sample is not one).
    eventually(
        DEADLINE,
        || "first scrape".into(),
        || {
            !prom
                .query(r#"portcullis_cull_decisions_total{result="culled"}"#)
                .is_empty()
        },
    );
    c.set_mode(Mode::Fail(500));
    let mut queries = dashboard_queries();
    assert!(queries.len() >= 20, "the dashboard has its panels");
    // Each alert expression without its threshold must return data too (with
    // it, a healthy proxy rightly gives none): the rules Prometheus loaded.
    let alerts = alert_queries(&prom);
    assert_eq!(
        alerts.len(),
        10,
        "every rule of alerts.yml is loaded: {alerts:?}"
    );
    queries.extend(alerts);
    let mut empty: Vec<(String, String)> = Vec::new();
    let ok = wait_until(Duration::from_secs(60), || {
        empty = queries
            .iter()
            .filter(|(_, q)| prom.query(q).is_empty())
            .cloned()
            .collect();
        empty.is_empty()
    });
    assert!(
        ok,
        "dashboard queries without data: {empty:#?}\n{}",
        prom.logs()
    );

    // every metric an alert reads exists in the scrape (or is Prometheus's own `up`)
    let text = std::fs::read_to_string(&rules).expect("rules");
    let scrape = p.metrics();
    let mut alert_metrics = Vec::new();
    for line in text.lines() {
        alert_metrics.extend(metric_names(line));
    }
    alert_metrics.sort();
    alert_metrics.dedup();
    assert!(alert_metrics.len() >= 6, "{alert_metrics:?}");
    for m in &alert_metrics {
        if m == "up" {
            assert!(!prom.query(r#"up{job="portcullis"}"#).is_empty());
        } else {
            assert!(has_metric(&scrape, m), "alert metric {m} is not exposed");
            assert!(!prom.query(m).is_empty(), "Prometheus has no {m}");
        }
    }
    // the cull of C fires its alert
    eventually(
        Duration::from_secs(60),
        || format!("PortcullisBackendCulled not firing: {:?}", prom.firing()),
        || prom.firing().iter().any(|a| a == "PortcullisBackendCulled"),
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in load {
        let _ = t.join();
    }
    drop(slow);
}

#[test]
fn access_log_and_tracing_keys_are_checked() {
    let up = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\n";
    let ok = format!(
        "{up}[access_log]\npath = \"/tmp/a.log\"\nsample = 0.01\n[tracing]\nsample = 0.5\n\
         otlp_endpoint = \"http://127.0.0.1:4318\"\n"
    );
    let (code, out, err, _) = check_config(&ok);
    assert_eq!((code, out.trim()), (0, "OK"), "{err}");
    for (bad, key) in [
        ("[access_log]\nsample = 1.5\n", "access_log.sample"),
        ("[access_log]\nqueue_lines = 0\n", "access_log.queue_lines"),
        ("[access_log]\nformat = \"json\"\n", "format"),
        ("[tracing]\nsample = -0.1\n", "tracing.sample"),
        (
            "[tracing]\notlp_endpoint = \"127.0.0.1:4318\"\n",
            "tracing.otlp_endpoint",
        ),
        (
            "[tracing]\notlp_endpoint = \"grpc://collector:4317\"\n",
            "tracing.otlp_endpoint",
        ),
        (
            "[tracing]\notlp_endpoint = \"http://c:4318/?k=v\"\n",
            "tracing.otlp_endpoint",
        ),
    ] {
        let (code, _, err, _) = check_config(&format!("{up}{bad}"));
        assert_eq!(code, 2, "{bad} must be refused");
        assert!(err.contains(key), "{bad}: error names {key}: {err}");
    }
}

/// `(trace id, parent id, flags)` of a `traceparent` value.
fn traceparent_parts(h: &str) -> (String, String, String) {
    let parts: Vec<&str> = h.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {h}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

/// One server span per request to a real OTLP/HTTP receiver: the trace id is the
/// access log's and the backend's, the span id is the parent id the backend received,
/// the client's sampled flag is respected, and no secret reaches the collector.
#[test]
fn spans_are_exported_over_otlp_http_with_the_propagated_ids() {
    let a = Backend::start("A");
    let otlp = OtlpReceiver::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let cfg = orders_config(
        &a,
        1,
        &log,
        &format!(
            "[tracing]\notlp_endpoint = \"{}\"\nsample = 1.0\n",
            otlp.endpoint()
        ),
    );
    let p = Proxy::start(&cfg);
    let (secrets, headers, path) = (SECRETS, SECRET_HEADERS, SECRET_PATH);

    // 1: the client's sampled trace, proxied
    let r1 = p.get(path, &headers);
    assert_eq!(r1.status, 200);
    let got1 = a.last_received().expect("received");
    let (t1, sent_parent1, flags1) =
        traceparent_parts(got1.header("traceparent").expect("traceparent"));
    assert_eq!((t1.as_str(), flags1.as_str()), (TRACE_ID, "01"));
    // 2: the same key again: answered by the rate-limit gate, still a span
    assert_eq!(p.get(path, &headers).status, 429);
    // 3: the client's trace is not sampled: no span even at sample = 1.0
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    assert_eq!(p.get("/u", &[("traceparent", unsampled)]).status, 200);
    let (_, _, flags3) = traceparent_parts(
        a.last_received()
            .expect("received")
            .header("traceparent")
            .expect("traceparent"),
    );
    assert_eq!(flags3, "00", "the client's decision is passed on");
    // 4: no traceparent: a new trace, sampled at 1.0, and the backend is told so
    let r4 = p.get("/new", &[]);
    assert_eq!(r4.status, 200);
    let got4 = a.last_received().expect("received");
    let (t4, sent_parent4, flags4) =
        traceparent_parts(got4.header("traceparent").expect("traceparent"));
    assert_eq!(flags4, "01");

    let mut spans = Vec::new();
    let ok = wait_until(DEADLINE, || {
        spans = otlp.spans();
        spans.len() >= 3
    });
    assert!(ok, "3 spans expected, got {spans:?}");
    assert!(otlp.bad_requests().is_empty(), "{:?}", otlp.bad_requests());
    assert_eq!(spans.len(), 3, "no span for the unsampled trace: {spans:?}");
    assert!(spans
        .iter()
        .all(|s| s.trace_id != "0af7651916cd43dd8448eb211c80319c"));
    for s in &spans {
        assert_eq!(s.kind, 2, "a server span: {s:?}");
        assert_eq!(s.service, "portcullis");
    }

    let lines = wait_lines(&log, 4);
    let id1 = r1.header("x-request-id").expect("x-request-id");
    let line1 = lines
        .iter()
        .find(|l| l["request_id"] == id1)
        .expect("line of request 1");
    let s1 = spans
        .iter()
        .find(|s| s.attr("portcullis.request_id") == Some(id1))
        .unwrap_or_else(|| panic!("span of request 1 in {spans:?}"));
    assert_eq!(s1.trace_id, TRACE_ID);
    assert_eq!(line1["trace_id"], s1.trace_id.as_str(), "access log = span");
    assert_eq!(s1.span_id, sent_parent1, "the span is the backend's parent");
    assert_eq!(s1.parent_span_id, "00f067aa0ba902b7", "the client's span");
    assert_eq!(s1.attr("http.route"), Some("/orders"));
    assert_eq!(s1.attr("http.response.status_code"), Some("200"));
    assert_eq!(s1.attr("http.request.method"), Some("GET"));
    assert_eq!(s1.attr("portcullis.upstream"), Some("app"));
    assert_eq!(s1.attr("portcullis.backend"), Some(a.addr().as_str()));
    assert_eq!(s1.name, "GET /orders");

    let limited = spans
        .iter()
        .find(|s| s.attr("http.response.status_code") == Some("429"))
        .unwrap_or_else(|| panic!("span of the 429 in {spans:?}"));
    assert_eq!(limited.trace_id, TRACE_ID);
    assert_eq!(limited.attr("portcullis.outcome"), Some("rate_limited"));
    assert_eq!(limited.attr("portcullis.backend"), None);

    let s4 = spans
        .iter()
        .find(|s| s.trace_id == t4)
        .unwrap_or_else(|| panic!("span of the new trace {t4} in {spans:?}"));
    assert_eq!(s4.span_id, sent_parent4);
    assert_eq!(s4.parent_span_id, "", "a root span");
    assert_eq!(s4.attr("http.route"), Some("default"));
    let line4 = lines
        .iter()
        .find(|l| l["path"] == "/new")
        .expect("line of request 4");
    assert_eq!(line4["trace_id"], t4.as_str());

    let raw = otlp.raw();
    for s in secrets.iter().chain(&["api_key"]) {
        assert!(
            !raw.windows(s.len()).any(|w| w == s.as_bytes()),
            "{s} was sent to the collector"
        );
    }
    assert_eq!(p.metric("portcullis_trace_spans_dropped_total"), Some(0.0));
}

/// The collector is down (connection refused): requests are answered as fast as ever,
/// and every span is dropped and counted.
#[test]
fn an_unreachable_otlp_endpoint_neither_slows_nor_fails_requests() {
    let a = Backend::start("A");
    // a port nobody listens on
    let port = free_port();
    let p = Proxy::start(&format!(
        "{}\n[rate_limit]\nenabled = false\n[access_log]\nenabled = false\n\
         [tracing]\notlp_endpoint = \"http://127.0.0.1:{port}\"\nsample = 1.0\n",
        one_upstream(&a)
    ));
    let n = 400;
    let mut slowest = Duration::ZERO;
    let mut conn = Conn::open(&p.addr()).expect("connect");
    for i in 0..n {
        let t = Instant::now();
        let r = conn
            .request("GET", &format!("/r/{i}"), &[], b"")
            .expect("request");
        assert_eq!(r.status, 200);
        slowest = slowest.max(t.elapsed());
    }
    assert!(
        slowest < Duration::from_secs(2),
        "a request waited for the span exporter: {slowest:?}"
    );
    eventually(
        DEADLINE,
        || {
            format!(
                "dropped spans: {:?}",
                p.metric("portcullis_trace_spans_dropped_total")
            )
        },
        || p.metric("portcullis_trace_spans_dropped_total") == Some(f64::from(n)),
    );
    assert!(
        p.logs().contains("span export failed"),
        "the failure is logged once"
    );
}
