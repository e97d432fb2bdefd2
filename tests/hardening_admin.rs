//! The admin API against a browser and against its own clients' mistakes (hardening,
//! fourth round), with the real binary, real backends, headless Chromium and `ctl`:
//!
//! - a page on another site cannot change anything: a `text/plain` form and a `no-cors`
//!   fetch (which drained a backend for an hour and made a 24-hour emergency claim
//!   before) are refused, and a `Host` that does not name the listener (DNS rebinding)
//!   gets 421;
//! - an admin body that never arrives is answered 408 after `client_body_timeout_ms`
//!   (it held a slot for 60 s before), and `/healthz` answers while every slot is held;
//! - `force` cannot take out the last backend that can take traffic;
//! - `ctl` pointed at the proxy port fails instead of printing "claim granted";
//! - every runtime-API answer has a `Content-Length` (keep-alive clients hung before);
//! - a newline in a JSON field name cannot forge a log line, and bidi characters in a
//!   reason reach neither the journal nor `ctl`'s table.
//!
//! HAProxy's `stats admin` page (opt-in) answers the same cross-site form: it has no
//! `Origin`, `Sec-Fetch-Site` or `Host` check.

use portcullis_test_kit as support;

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// Upstream "app" over `backends`, culling on (in-process store), rate limit off.
fn config(backends: &[&Backend], upstream_keys: &str) -> String {
    format!(
        "{}[rate_limit]\nenabled = false\n\n[shedding]\nmax_concurrency = 0\n\n\
         [culling]\nenabled = true\nwindow_seconds = 10\nerror_threshold = 5\n\
         check_interval_seconds = 1\ntokens = 10\ntoken_period_seconds = 600\n\
         max_culled_fraction = 0.5\ncooldown_seconds = 60\n",
        upstream_table("app", backends, upstream_keys)
    )
}

fn backend_state(p: &Proxy, addr: &str) -> String {
    let all: Value = serde_json::from_str(&p.admin_get("/backends").body_str()).unwrap_or_default();
    all.as_array()
        .and_then(|a| a.iter().find(|b| b["address"] == addr))
        .map(|b| b["state"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

fn claims(p: &Proxy) -> Vec<Value> {
    serde_json::from_str::<Value>(&p.admin_get("/claims").body_str())
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// A page at `http://evil.example:PORT/` (Chromium resolves the name to 127.0.0.1) that
/// posts a `text/plain` form to drain `drain` and a `no-cors` fetch to claim `claim`,
/// both on the admin listener at `admin`.
fn attacker_page(admin: &str, drain: &str, claim: &str) -> String {
    // A text/plain form sends `name=value`: this name and value make it valid JSON.
    let page = format!(
        r#"<!doctype html><html><head><title>cute cats</title></head><body>
<iframe name="sink"></iframe>
<form id="f" method="POST" enctype="text/plain" target="sink"
      action="http://{admin}/backends/app/{drain}/drain">
<input type="hidden" name='{{"seconds":3600,"force":true,"reason":"csrf' value='"}}'>
</form>
<script>
fetch("http://{admin}/claims", {{method: "POST", mode: "no-cors",
  body: JSON.stringify({{upstream: "app", backend: "{claim}", seconds: 86400,
                         reason: "csrf", emergency: true}})}})
  .then(() => document.title = "fetch sent", () => document.title = "fetch failed");
document.getElementById("f").submit();
</script></body></html>"#
    );
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n{page}",
        page.len()
    );
    fixed_response_backend(Box::leak(response.into_bytes().into_boxed_slice()))
}

fn refused_lines(p: &Proxy, status: u16) -> usize {
    p.logs()
        .lines()
        .filter(|l| l.contains("admin request refused") && l.contains(&format!("{status}")))
        .count()
}

#[test]
fn a_page_on_another_site_cannot_drain_or_claim() {
    let bin =
        chromium().unwrap_or_else(|| panic!("chromium is not installed: run scripts/setup.sh"));
    let (b1, b2, b3) = (
        Backend::start("b1"),
        Backend::start("b2"),
        Backend::start("b3"),
    );
    let p = Proxy::start(&config(&[&b1, &b2, &b3], ""));
    let page = attacker_page(&p.admin_addr(), &b1.addr(), &b2.addr());
    let port = page.rsplit(':').next().unwrap_or_default();
    let profile = tempfile::tempdir().expect("profile dir");
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--host-resolver-rules=MAP evil.example 127.0.0.1",
            "--virtual-time-budget=4000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("http://evil.example:{port}/"))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains("cute cats") || dom.contains("fetch"), "{dom}");
    // Both requests reached the admin listener and were refused as cross-site (403).
    eventually(
        DEADLINE,
        || format!("two cross-site refusals expected; logs:\n{}", p.logs()),
        || refused_lines(&p, 403) >= 2,
    );
    assert_eq!(backend_state(&p, &b1.addr()), "up", "the form drained b1");
    assert_eq!(backend_state(&p, &b2.addr()), "up", "the fetch claimed b2");
    assert!(claims(&p).is_empty(), "{:?}", claims(&p));
    let m = p.metrics();
    assert!(
        !m.lines()
            .any(|l| l.starts_with("portcullis_admin_actions_total")
                && (l.contains("applied") || l.contains("emergency"))
                && !l.ends_with(" 0")),
        "{m}"
    );
}

#[test]
fn the_listener_answers_only_to_its_own_host_and_same_origin_json() {
    let (b1, b2, b3) = (
        Backend::start("b1"),
        Backend::start("b2"),
        Backend::start("b3"),
    );
    let p = Proxy::start_with_server(
        "admin_hosts = [\"portcullis.internal\"]",
        &config(&[&b1, &b2, &b3], ""),
    );
    let admin = p.admin_addr();
    let port = admin.rsplit(':').next().unwrap_or_default().to_string();
    let get = |host: &str, path: &str| {
        try_request(&admin, "GET", path, &[("Host", host)], b"")
            .unwrap_or_else(|e| panic!("GET {path} Host {host}: {e}"))
    };
    // DNS rebinding: the page's own name, with the listener's port
    let rebound = get(&format!("attacker.example:{port}"), "/status");
    assert_eq!(rebound.status, 421, "{}", rebound.body_str());
    assert_eq!(get("attacker.example", "/metrics").status, 421);
    // probes answer whatever the Host
    assert_eq!(get("attacker.example", "/healthz").status, 200);
    assert_eq!(get("attacker.example", "/readyz").status, 200);
    for ok in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("portcullis.internal:{port}"),
        "PORTCULLIS.INTERNAL".to_string(),
    ] {
        assert_eq!(get(&ok, "/status").status, 200, "{ok}");
    }
    let path = format!("/backends/app/{}/drain", b1.addr());
    let json = br#"{"reason": "x", "seconds": 60}"#;
    let post = |headers: &[(&str, &str)], body: &[u8]| {
        try_request(&admin, "POST", &path, headers, body).unwrap_or_else(|e| panic!("{e}"))
    };
    let ct = ("Content-Type", "application/json");
    let r = post(&[ct, ("Origin", "http://evil.example")], json);
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert_eq!(post(&[ct, ("Origin", "null")], json).status, 403);
    assert_eq!(
        post(&[ct, ("Sec-Fetch-Site", "cross-site")], json).status,
        403
    );
    assert_eq!(
        post(&[ct, ("Sec-Fetch-Site", "same-site")], json).status,
        403
    );
    let r = post(&[("Content-Type", "text/plain")], json);
    assert_eq!(r.status, 415, "{}", r.body_str());
    assert_eq!(post(&[], json).status, 415, "a body without a type");
    assert_eq!(
        post(
            &[("Content-Type", "application/x-www-form-urlencoded")],
            json
        )
        .status,
        415
    );
    assert_eq!(backend_state(&p, &b1.addr()), "up");
    // The admin page itself (same origin), and a script (no Origin): applied.
    let same = format!("http://127.0.0.1:{port}");
    let r = post(
        &[
            ct,
            ("Origin", same.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        json,
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(backend_state(&p, &b1.addr()), "draining");
    let ready = format!("/backends/app/{}/ready", b1.addr());
    let r = try_request(&admin, "POST", &ready, &[], b"").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.status,
        200,
        "an empty body needs no type: {}",
        r.body_str()
    );
    // Every answer says it is the admin API's and how long it is.
    for r in [rebound, r, p.admin_get("/claims"), p.admin_get("/backends")] {
        assert_eq!(r.header("x-portcullis-admin"), Some("1"));
        assert_eq!(
            r.header("content-length").and_then(|v| v.parse().ok()),
            Some(r.body.len()),
            "{}",
            r.body_str()
        );
    }
}

/// `h2load --h1` failed all 2,000 requests to `/claims` before: the answers had no
/// `Content-Length` on a keep-alive connection, so a client could not tell where one
/// ended. Many requests on one connection now each read to their end.
#[test]
fn runtime_api_answers_can_be_read_on_one_keep_alive_connection() {
    let b = Backend::start("b");
    let p = Proxy::start(&config(&[&b], ""));
    let mut c = Conn::open(&p.admin_addr()).expect("connect");
    for path in [
        "/claims",
        "/backends",
        "/claims/feasible?upstream=app",
        "/claims",
    ] {
        let r = c
            .request("GET", path, &[], b"")
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("content-length").is_some(), "{path}");
    }
    if let Ok(out) = Command::new("h2load")
        .args(["--h1", "-n", "200", "-c", "2"])
        .arg(format!("http://{}/claims", p.admin_addr()))
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("200 succeeded, 0 failed"),
            "h2load --h1 on /claims:\n{text}"
        );
    }
}

#[test]
fn an_admin_body_that_never_arrives_is_408_and_the_probes_keep_answering() {
    let b = Backend::start("b");
    let p = Proxy::start_with_server(
        "admin_max_connections = 4\nclient_body_timeout_ms = 1500",
        &config(&[&b], ""),
    );
    let admin = p.admin_addr();
    // Four POSTs announce a body and never send it: every slot is held.
    let mut held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(&admin).expect("connect");
            write!(
                s,
                "POST /claims HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/json\r\n\
                 Content-Length: 100\r\n\r\n{{"
            )
            .expect("write");
            s
        })
        .collect();
    let started = Instant::now();
    let get = |path: &str| {
        Conn::open_with_timeout(&admin, Duration::from_secs(5))
            .and_then(|mut c| c.request("GET", path, &[], b""))
            .map(|r| r.status)
            .ok()
    };
    assert_eq!(
        get("/healthz"),
        Some(200),
        "a probe while every slot is held"
    );
    assert_eq!(get("/readyz"), Some(200));
    // Each held POST is answered 408 and closed within the body timeout.
    let mut answers = Vec::new();
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_secs(20))).ok();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer).into_owned();
        // 503: the last may have come while a connection of the proxy's start was closing
        assert!(
            text.starts_with("HTTP/1.1 408") || text.starts_with("HTTP/1.1 503"),
            "{text}"
        );
        answers.push(text);
    }
    assert!(
        answers
            .iter()
            .filter(|t| t.starts_with("HTTP/1.1 408"))
            .count()
            >= 3,
        "{answers:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the bodies were waited for {:?} (client_body_timeout_ms = 1500)",
        started.elapsed()
    );
    eventually(
        DEADLINE,
        || "slots not freed".into(),
        || get("/status") == Some(200),
    );
}

#[test]
fn force_cannot_take_out_the_last_backend_that_serves() {
    let (b1, b2, b3) = (
        Backend::start("b1"),
        Backend::start("b2"),
        Backend::start("b3"),
    );
    let p = Proxy::start(&config(
        &[&b1, &b2, &b3],
        "health_check_path = \"/health\"\nhealth_check_interval_seconds = 1\n",
    ));
    b1.set_mode(Mode::Fail(500));
    b2.set_mode(Mode::Fail(500));
    eventually(
        DEADLINE,
        || "b1 and b2 not down by their health check".into(),
        || {
            backend_state(&p, &b1.addr()) == "unhealthy"
                && backend_state(&p, &b2.addr()) == "unhealthy"
        },
    );
    let path = format!("/backends/app/{}/drain", b3.addr());
    let r = post(
        &p.admin_addr(),
        &path,
        &[("Content-Type", "application/json")],
        br#"{"reason": "deploy", "force": true}"#,
    );
    assert_eq!(r.status, 409, "{}", r.body_str());
    let v: Value = serde_json::from_str(&r.body_str()).unwrap_or_default();
    assert_eq!(v["policy"], "last_backend", "{v}");
    let r = post(
        &p.admin_addr(),
        "/claims",
        &[("Content-Type", "application/json")],
        format!(
            r#"{{"upstream": "app", "backend": "{}", "seconds": 60, "reason": "r", "emergency": true}}"#,
            b3.addr()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 409, "an emergency claim: {}", r.body_str());
    assert_eq!(backend_state(&p, &b3.addr()), "up");
    assert_eq!(get(&p.addr(), "/", &[]).status, 200);
    // With a peer back in service, the forced drain goes through.
    b1.set_mode(Mode::Ok);
    eventually(
        DEADLINE,
        || "b1 not healthy again".into(),
        || backend_state(&p, &b1.addr()) == "up",
    );
    let r = post(
        &p.admin_addr(),
        &path,
        &[("Content-Type", "application/json")],
        br#"{"reason": "deploy", "force": true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
}

fn ctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(&*BIN)
        .arg("ctl")
        .args(args)
        .env_remove("PORTCULLIS_ADMIN")
        .env_remove("PORTCULLIS_TOKEN_FILE")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .output()
        .expect("run ctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ctl_pointed_at_the_proxy_port_fails_and_reads_only_small_regular_token_files() {
    let b = Backend::start("b");
    let p = Proxy::start(&config(&[&b], ""));
    let proxy = format!("http://{}", p.addr());
    let (code, stdout, stderr) = ctl(&[
        "--admin",
        &proxy,
        "claim",
        "app",
        &b.addr(),
        "--seconds",
        "60",
        "--reason",
        "r",
    ]);
    assert_eq!(code, 1, "stdout {stdout}\nstderr {stderr}");
    assert!(!stdout.contains("granted"), "{stdout}");
    assert!(stderr.contains("not a portcullis admin API"), "{stderr}");
    let admin = format!("http://{}", p.admin_addr());
    let (code, stdout, stderr) = ctl(&["--admin", &admin, "backends"]);
    assert_eq!(code, 0, "stdout {stdout}\nstderr {stderr}");
    // A FIFO never blocks ctl, and a huge file is not read whole.
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let started = Instant::now();
    let (code, _, stderr) = ctl(&[
        "--admin",
        &admin,
        "--token-file",
        &fifo.display().to_string(),
        "backends",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'a'; 1 << 20]).expect("write");
    let (code, _, stderr) = ctl(&[
        "--admin",
        &admin,
        "--token-file",
        &big.display().to_string(),
        "backends",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("larger than"), "{stderr}");
}

#[test]
fn request_text_cannot_forge_log_lines_or_reorder_a_table() {
    let (b1, b2, b3) = (
        Backend::start("b1"),
        Backend::start("b2"),
        Backend::start("b3"),
    );
    let p = Proxy::start(&format!(
        "{}\n[log]\nformat = \"text\"\n",
        config(&[&b1, &b2, &b3], "")
    ));
    let path = format!("/backends/app/{}/drain", b1.addr());
    let ct = [("Content-Type", "application/json")];
    // An unknown field whose name holds a newline and a forged line.
    let forged = br#"{"reason": "x", "a\nINFO forged: admin_action by=root": 1}"#;
    let r = post(&p.admin_addr(), &path, &ct, forged);
    assert_eq!(r.status, 400, "{}", r.body_str());
    eventually(
        DEADLINE,
        || format!("no invalid-action line; logs:\n{}", p.logs()),
        || p.logs().contains("result=\"invalid\"") || p.logs().contains("result=invalid"),
    );
    let logs = p.logs();
    assert!(
        !logs
            .lines()
            .any(|l| l.trim_start().starts_with("INFO forged")),
        "a forged line:\n{logs}"
    );
    // Bidi and line-separator characters in a reason become spaces.
    let r = post(
        &p.admin_addr(),
        &path,
        &ct,
        "{\"reason\": \"ok \u{202E}lived\u{202C} \u{2028}x\"}".as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    let listed = p.admin_get("/backends").body_str();
    assert!(
        listed.contains("ok  lived  x") || listed.contains("ok  lived   x"),
        "{listed}"
    );
    assert!(!listed.contains('\u{202E}') && !listed.contains('\u{2028}'));
    let status = p.admin_get("/status").body_str();
    assert!(
        !status.contains('\u{202E}'),
        "the journal kept a bidi character"
    );
    let admin = format!("http://{}", p.admin_addr());
    let (code, stdout, stderr) = ctl(&["--admin", &admin, "backends"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.contains('\u{202E}') && !stdout.contains('\u{2028}'),
        "{stdout}"
    );
}
