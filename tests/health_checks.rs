//! Active health checks as HAProxy's (`[upstreams.health_check]`), end to end with the
//! real binary: nginx name-based virtual hosts as backends (the probe's `Host`), real
//! backends that fail, hang or answer the wrong status or body, `rise`/`fall` counted
//! probe by probe, and why a backend is down in `/backends`, `ctl` and the metrics.

use portcullis_test_kit as support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::*;

fn record(p: &Proxy, upstream: &str, addr: &str) -> Value {
    let all: Value = serde_json::from_str(&p.admin_get("/backends").body_str()).unwrap_or_default();
    all.as_array()
        .and_then(|a| {
            a.iter()
                .find(|b| b["upstream"] == upstream && b["address"] == addr)
                .cloned()
        })
        .unwrap_or(Value::Null)
}

fn state(p: &Proxy, upstream: &str, addr: &str) -> String {
    record(p, upstream, addr)["state"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn upstream(name: &str, backends: &[&str], check: &str) -> String {
    let list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
    format!(
        "[[upstreams]]\nname = \"{name}\"\nbackends = [{}]\n[upstreams.health_check]\n{check}\n\n",
        list.join(", ")
    )
}

const OFF: &str = "[rate_limit]\nenabled = false\n[culling]\nenabled = false\n";

/// HAProxy's `option httpchk GET /health` with `http-check send hdr Host
/// api.example.test`: every probe used to say `Host: localhost`, nginx answered 404 and
/// both sites went down.
#[test]
fn probes_send_the_host_the_backend_is_known_by() {
    let nginx = NginxVhosts::start("api.example.test", 2);
    let (a, b) = (nginx.addrs[0].as_str(), nginx.addrs[1].as_str());
    let fast = "interval_ms = 200\nfast_interval_ms = 100\nrise = 1\nfall = 1\n";
    let cfg = format!(
        "{}{}{}{OFF}",
        upstream(
            "named",
            &[a, b],
            &format!("path = \"/health\"\nhost = \"api.example.test\"\n{fast}")
        ),
        upstream("unnamed", &[a, b], &format!("path = \"/health\"\n{fast}")),
        upstream(
            "wrong",
            &[a],
            &format!("path = \"/health\"\nhost = \"www.example.test\"\n{fast}")
        ),
    );
    let p = Proxy::start(&cfg);
    eventually(
        DEADLINE,
        || format!("states: {}", p.admin_get("/backends").body_str()),
        || {
            [a, b].iter().all(|x| {
                record(&p, "named", x)["check"]["result"] == "ok"
                    && state(&p, "unnamed", x) == "unhealthy"
            }) && state(&p, "wrong", a) == "unhealthy"
        },
    );
    for x in [a, b] {
        assert_eq!(state(&p, "named", x), "up");
        let r = record(&p, "unnamed", x);
        assert_eq!(r["check"]["result"], "status 404", "{r}");
        assert_eq!(r["reason"], "health check: status 404", "{r}");
    }
    assert_eq!(record(&p, "wrong", a)["check"]["result"], "status 404");
    // What nginx saw: the configured name, else the backend as written; never localhost.
    let log = nginx.access_log();
    assert!(log.contains("api.example.test GET /health 200"), "{log}");
    assert!(log.contains(&format!("{a} GET /health 404")), "{log}");
    assert!(log.contains("www.example.test GET /health 404"), "{log}");
    assert!(!log.contains("localhost"), "{log}");
    // The old keys get the same default Host.
    let legacy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"old\"\nbackends = [\"{b}\"]\nhealth_check_path = \"/health\"\n\
         health_check_interval_seconds = 1\n{OFF}"
    ));
    eventually(
        DEADLINE,
        || format!("{}", record(&legacy, "old", b)),
        || record(&legacy, "old", b)["check"]["result"] == "status 404",
    );
    assert_eq!(state(&legacy, "old", b), "unhealthy");
    // The page, rendered by a real browser, shows each backend's last check.
    let bin =
        chromium().unwrap_or_else(|| panic!("chromium is not installed: run scripts/setup.sh"));
    let dom = dump_dom(bin, &format!("http://{}/", p.admin_addr()));
    assert!(dom.contains("Last check"), "{dom}");
    assert!(
        dom.contains(">status 404<") && dom.contains(">ok<"),
        "the page shows no check result:\n{dom}"
    );
    // ctl backends shows the check, and the metric counts it.
    let out = std::process::Command::new(&*BIN)
        .args([
            "ctl",
            "--admin",
            &format!("http://{}", p.admin_addr()),
            "backends",
        ])
        .env_remove("PORTCULLIS_ADMIN")
        .output()
        .expect("ctl");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.lines().next().is_some_and(|h| h.ends_with("CHECK")),
        "{table}"
    );
    assert!(table.contains("status 404 in "), "{table}");
    let m = p.metrics();
    assert!(
        m.lines().any(|l| l.starts_with(&format!(
            "portcullis_health_checks_total{{backend=\"{a}\",result=\"status\",upstream=\"unnamed\"}}"
        ))),
        "{m}"
    );
}

/// One probe as `/backends` showed it: when it started, its result, and the health the
/// probe's track gave the backend after it.
#[derive(Debug)]
struct Seen {
    at: u64,
    result: String,
    healthy: bool,
}

/// The distinct probes of `addr` (polled every 10 ms; probes are 200 ms or more apart)
/// until `until` holds for the latest.
fn watch(p: &Proxy, addr: &str, until: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
    let mut seen: Vec<Seen> = Vec::new();
    let start = Instant::now();
    loop {
        let c = &record(p, "app", addr)["check"];
        if let (Some(at), Some(result)) = (c["at"].as_u64(), c["result"].as_str()) {
            if seen.last().is_none_or(|s| s.at != at) {
                seen.push(Seen {
                    at,
                    result: result.to_string(),
                    healthy: c["healthy"].as_bool().unwrap_or(false),
                });
            }
        }
        if until(&seen) {
            return seen;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not reached: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The probes at the end of `seen` with the same pass/fail as the last one.
fn tail_run(seen: &[Seen]) -> &[Seen] {
    let last_ok = seen.last().is_some_and(|s| s.result == "ok");
    let n = seen
        .iter()
        .rev()
        .take_while(|s| (s.result == "ok") == last_ok)
        .count();
    &seen[seen.len() - n..]
}

#[test]
fn rise_and_fall_count_consecutive_probes_at_the_fast_interval() {
    let b = Backend::start("b1");
    let p = Proxy::start(&format!(
        "{}{OFF}",
        upstream(
            "app",
            &[&b.addr()],
            "path = \"/health\"\ninterval_ms = 600\nfast_interval_ms = 200\nrise = 2\nfall = 3\n"
        )
    ));
    // One probe in three fails: with fall = 3 the backend never goes down.
    b.set_mode(Mode::FailEvery(3, 500));
    let seen = watch(&p, &b.addr(), |s| {
        s.iter().filter(|x| x.result == "status 500").count() >= 3
    });
    assert!(
        seen.iter().all(|s| s.healthy),
        "flipped on isolated failures: {seen:?}"
    );
    assert!(!p.logs().contains("backend health changed"), "{}", p.logs());
    assert_eq!(state(&p, "app", &b.addr()), "up");
    // It fails for good: down after exactly three failures in a row, probed at the fast
    // interval once the first failed.
    b.set_mode(Mode::Fail(500));
    let seen = watch(&p, &b.addr(), |s| s.last().is_some_and(|x| !x.healthy));
    let run = tail_run(&seen);
    assert_eq!(run.len(), 3, "{seen:?}");
    assert!(
        run[0].healthy && run[1].healthy && !run[2].healthy,
        "{run:?}"
    );
    for pair in run.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap < 550,
            "{gap} ms between failing probes (fast_interval_ms = 200): {run:?}"
        );
    }
    eventually(
        DEADLINE,
        || "not unhealthy".into(),
        || state(&p, "app", &b.addr()) == "unhealthy",
    );
    // No backend passes: a request fails open to it (panic mode).
    assert_eq!(
        get(&p.addr(), "/", &[]).status,
        500,
        "proxied to the failing backend"
    );
    assert_eq!(
        p.metric("portcullis_upstream_panic_mode{upstream=\"app\"}"),
        Some(1.0)
    );
    // Back: up after exactly two passes.
    b.set_mode(Mode::Ok);
    let seen = watch(&p, &b.addr(), |s| s.last().is_some_and(|x| x.healthy));
    let run = tail_run(&seen);
    assert_eq!(run.len(), 2, "{seen:?}");
    assert!(!run[0].healthy && run[1].healthy, "{run:?}");
    eventually(
        DEADLINE,
        || "not up".into(),
        || state(&p, "app", &b.addr()) == "up",
    );
    // Panic mode ends with the check that brought it back, not at the next request.
    eventually(
        DEADLINE,
        || "panic mode still on with a healthy backend and no request".into(),
        || p.metric("portcullis_upstream_panic_mode{upstream=\"app\"}") == Some(0.0),
    );
}

#[test]
fn expect_status_body_method_port_and_timeout() {
    let (ok, moved, hang, side) = (
        Backend::start("b-ok"),
        Backend::start("b-moved"),
        Backend::start("b-hang"),
        Backend::start("b-side"),
    );
    moved.set_mode(Mode::Fail(302));
    hang.set_mode(Mode::Hang);
    let fast = "interval_ms = 200\nfast_interval_ms = 100\nrise = 1\nfall = 1\n";
    let cfg = [
        upstream("body-ok", &[&ok.addr()], &format!("path = \"/h\"\nexpect_body = \"b-ok\"\n{fast}")),
        upstream("body-bad", &[&ok.addr()], &format!("path = \"/h\"\nexpect_body = \"ready\"\n{fast}")),
        upstream("s-default", &[&moved.addr()], &format!("path = \"/h\"\nexpect_status = \"200-299\"\n{fast}")),
        upstream("s-listed", &[&moved.addr()], &format!("path = \"/h\"\nexpect_status = \"200,302\"\n{fast}")),
        upstream("head", &[&ok.addr()], &format!("path = \"/head\"\nmethod = \"HEAD\"\nheaders = {{ \"x-probe\" = \"yes\" }}\n{fast}")),
        upstream(
            "port",
            &[&hang.addr()],
            &format!("path = \"/side\"\nport = {}\n{fast}", side.port()),
        ),
        upstream("hang", &[&hang.addr()], &format!("path = \"/h\"\ntimeout_ms = 300\n{fast}")),
    ]
    .concat();
    let p = Proxy::start(&format!("{cfg}{OFF}"));
    let result = |up: &str, addr: &str| {
        record(&p, up, addr)["check"]["result"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    eventually(
        DEADLINE,
        || p.admin_get("/backends").body_str(),
        || {
            result("body-ok", &ok.addr()) == "ok"
                && result("body-bad", &ok.addr()) == "body"
                && result("s-default", &moved.addr()) == "status 302"
                && result("s-listed", &moved.addr()) == "ok"
                && result("head", &ok.addr()) == "ok"
                && result("port", &hang.addr()) == "ok"
                && result("hang", &hang.addr()) == "timeout"
        },
    );
    assert_eq!(state(&p, "body-bad", &ok.addr()), "unhealthy");
    assert_eq!(state(&p, "s-listed", &moved.addr()), "up");
    let timed = record(&p, "hang", &hang.addr())["check"]["duration_ms"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        (250..2000).contains(&timed),
        "a 300 ms timeout took {timed} ms"
    );
    let heads: Vec<_> = ok
        .received()
        .into_iter()
        .filter(|r| r.path == "/head")
        .collect();
    assert!(!heads.is_empty());
    assert!(
        heads
            .iter()
            .all(|r| r.method == "HEAD" && r.header("x-probe") == Some("yes")),
        "{heads:?}"
    );
    assert!(
        side.received_paths().iter().any(|p| p == "/side"),
        "port: probed elsewhere"
    );
    assert!(!hang.received_paths().iter().any(|p| p == "/side"));
}

#[test]
fn bad_health_checks_are_check_errors_with_key_path_and_line() {
    let base = "[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:1\"]\n";
    for (extra, key, why) in [
        (
            "[upstreams.health_check]\nexpect_status = \"2xx\"\n",
            "upstreams[0].health_check.expect_status",
            "not a status code",
        ),
        (
            "[upstreams.health_check]\nexpect_status = \"399-200\"\n",
            "upstreams[0].health_check.expect_status",
            "backwards",
        ),
        (
            "[upstreams.health_check]\nmethod = \"POST\"\n",
            "upstreams[0].health_check.method",
            "GET, HEAD or OPTIONS",
        ),
        (
            "[upstreams.health_check]\nheaders = { \"Host\" = \"x\" }\n",
            "upstreams[0].health_check.headers.Host",
            "use `host`",
        ),
        (
            "[upstreams.health_check]\nrise = 0\n",
            "upstreams[0].health_check.rise",
            "out of range",
        ),
        (
            "[upstreams.health_check]\nshared = true\nprobers = 65\n",
            "upstreams[0].health_check.probers",
            "out of range",
        ),
        (
            "[upstreams.health_check]\npath = \"health\"\n",
            "upstreams[0].health_check.path",
            "start with '/'",
        ),
        (
            "health_check_path = \"/h\"\n[upstreams.health_check]\n",
            "upstreams[0].health_check_path",
            "remove health_check_path",
        ),
    ] {
        let (code, _, stderr, _) = check_config(&format!("{base}{extra}"));
        assert_ne!(code, 0, "{extra} accepted");
        assert!(stderr.contains(key), "{extra}: {stderr}");
        assert!(stderr.contains(why), "{extra}: {stderr}");
        assert!(
            stderr.contains(".toml:"),
            "the file and line: {extra}: {stderr}"
        );
    }
}
