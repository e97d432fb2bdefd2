//! Issue 9, items 4, 8 and 10 (config, reload and admin hardening), against the
//! real binary:
//! - a reload keeps the health-check state of backends that stay;
//! - every numeric key has a range, checked by `--check` with key path and line
//!   (a shutdown timeout that overflowed `Instant` used to pass and panic);
//! - overflow and non-UTF-8 errors name the key; a Redis password never appears
//!   in error text (`--check`, `POST /reload`, logs);
//! - `POST` admin endpoints need `server.admin_token` when set, and are refused
//!   on a non-loopback admin listener without one.

use portcullis_test_kit as support;

use std::fs;
use std::process::{Child, Command, Stdio};
use support::*;

/// The state `/status` reports for `backend`.
fn backend_state(p: &Proxy, backend: &Backend) -> String {
    let st = p.status_json();
    st["upstreams"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|u| u["backends"].as_array().into_iter().flatten())
        .find(|b| b["address"] == backend.addr())
        .and_then(|b| b["state"].as_str())
        .unwrap_or("<absent>")
        .to_string()
}

/// Sends 20 requests; returns how many were not answered 200 by `good`.
fn failures_of_20(p: &Proxy, good: &Backend) -> usize {
    (0..20)
        .filter(|_| {
            let r = p.get("/", &[]);
            r.status != 200 || r.header("x-backend") != Some(good.name())
        })
        .count()
}

/// After a reload (`how`), the unhealthy `bad` is still unhealthy and gets no traffic.
fn assert_health_kept(p: &Proxy, good: &Backend, bad: &Backend, how: &str) {
    assert_eq!(
        backend_state(p, bad),
        "unhealthy",
        "{how} reset the health of a backend that stayed"
    );
    assert_eq!(
        failures_of_20(p, good),
        0,
        "after {how} the unhealthy backend got traffic"
    );
}

fn reloads_ok(p: &Proxy) -> f64 {
    p.metric("portcullis_config_reloads_total{result=\"ok\"}")
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------
// Item 4: reload keeps health
// ---------------------------------------------------------------------------------------

#[test]
fn reload_keeps_the_health_of_backends_that_stay() {
    let good = Backend::start("good");
    let bad = Backend::start("bad");
    bad.set_mode(Mode::Fail(503));
    // One check at start, then none for an hour: whatever health a backend has
    // after a reload is what the reload left it.
    let hc = "health_check_path = \"/health\"\nhealth_check_interval_seconds = 3600";
    let cfg = balanced_app(&[&good, &bad], hc);
    let p = Proxy::start(&cfg);
    eventually(
        DEADLINE,
        || format!("bad backend never unhealthy: {}", p.status_json()),
        || backend_state(&p, &bad) == "unhealthy",
    );
    assert_eq!(failures_of_20(&p, &good), 0, "before any reload");

    // POST /reload with the file unchanged.
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "POST /reload: {}", r.body_str());
    assert_health_kept(&p, &good, &bad, "POST /reload");

    // SIGHUP with the file unchanged.
    let before = reloads_ok(&p);
    p.signal("HUP");
    eventually(
        DEADLINE,
        || "SIGHUP reload never counted".into(),
        || reloads_ok(&p) > before,
    );
    assert_health_kept(&p, &good, &bad, "SIGHUP");

    // Checks still run on the kept state: a shorter interval after a reload
    // brings the recovered backend back.
    bad.set_mode(Mode::Ok);
    let hc = "health_check_path = \"/health\"\nhealth_check_interval_seconds = 1";
    p.rewrite_config(&balanced_app(&[&good, &bad], hc));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "POST /reload: {}", r.body_str());
    eventually(
        DEADLINE,
        || format!("recovered backend never up: {}", p.status_json()),
        || backend_state(&p, &bad) == "up",
    );
}

// ---------------------------------------------------------------------------------------
// Item 8: ranges for every numeric key
// ---------------------------------------------------------------------------------------

const MIN_UPSTREAM: &str = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\n";

/// `(table header, key as written, value, key path expected in the error)`.
#[rustfmt::skip] // one row a line
const OUT_OF_RANGE: &[(&str, &str, &str, &str)] = &[
    ("[server]", "threads", "0", "server.threads"),
    ("[server]", "threads", "1025", "server.threads"),
    ("[server]", "drain_seconds", "3601", "server.drain_seconds"),
    ("[server]", "drain_seconds", "-1", "server.drain_seconds"),
    ("[server]", "shutdown_timeout_seconds", "9223372036854775807", "server.shutdown_timeout_seconds"),
    ("[server]", "shutdown_timeout_seconds", "3601", "server.shutdown_timeout_seconds"),
    ("[server]", "keepalive_timeout_seconds", "9223372036854775807", "server.keepalive_timeout_seconds"),
    ("[server]", "max_request_header_bytes", "100", "server.max_request_header_bytes"),
    ("[server]", "max_request_header_bytes", "9223372036854775807", "server.max_request_header_bytes"),
    // issue 40, item 8
    ("[server]", "h2_max_glitches", "0", "server.h2_max_glitches"),
    ("[server]", "h2_max_glitches", "1000001", "server.h2_max_glitches"),
    ("[server]", "h2_max_glitches", "4294967296", "server.h2_max_glitches"),
    ("[redis]", "flush_interval_ms", "0", "redis.flush_interval_ms"),
    ("[redis]", "flush_interval_ms", "9223372036854775807", "redis.flush_interval_ms"),
    ("[redis]", "timeout_ms", "0", "redis.timeout_ms"),
    ("[redis]", "timeout_ms", "9223372036854775807", "redis.timeout_ms"),
    ("[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]", "health_check_interval_seconds", "0", "upstreams[0].health_check_interval_seconds"),
    ("[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]", "health_check_interval_seconds", "9223372036854775807", "upstreams[0].health_check_interval_seconds"),
    ("[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]", "connect_timeout_ms", "9223372036854775807", "upstreams[0].connect_timeout_ms"),
    ("[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]", "read_timeout_ms", "0", "upstreams[0].read_timeout_ms"),
    ("[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]", "read_timeout_ms", "9223372036854775807", "upstreams[0].read_timeout_ms"),
    ("[shedding]", "max_concurrency", "9223372036854775807", "shedding.max_concurrency"),
    ("[shedding]", "retry_after_seconds", "0", "shedding.retry_after_seconds"),
    ("[shedding]", "retry_after_seconds", "9223372036854775807", "shedding.retry_after_seconds"),
    ("[rate_limit]", "window_seconds", "0", "rate_limit.window_seconds"),
    ("[rate_limit]", "window_seconds", "9223372036854775807", "rate_limit.window_seconds"),
    ("[rate_limit]", "limit", "0", "rate_limit.limit"),
    ("[rate_limit]", "limit", "9223372036854775807", "rate_limit.limit"),
    ("[rate_limit]", "max_key_bytes", "0", "rate_limit.max_key_bytes"),
    ("[rate_limit]", "max_key_bytes", "8193", "rate_limit.max_key_bytes"),
    ("[rate_limit]", "max_tracked_keys", "15", "rate_limit.max_tracked_keys"),
    ("[rate_limit]", "max_tracked_keys", "9223372036854775807", "rate_limit.max_tracked_keys"),
    ("[rate_limit.keys]", "\"premium\"", "0", "rate_limit.keys.premium"),
    ("[rate_limit.keys]", "\"premium\"", "9223372036854775807", "rate_limit.keys.premium"),
    ("[culling]", "window_seconds", "9223372036854775807", "culling.window_seconds"),
    ("[culling]", "error_threshold", "0", "culling.error_threshold"),
    ("[culling]", "error_threshold", "9223372036854775807", "culling.error_threshold"),
    ("[culling]", "check_interval_seconds", "9223372036854775807", "culling.check_interval_seconds"),
    ("[culling]", "tokens", "4294967295", "culling.tokens"),
    ("[culling]", "tokens", "4294967296", "culling.tokens"),
    ("[culling]", "token_period_seconds", "9223372036854775807", "culling.token_period_seconds"),
    ("[culling]", "cooldown_seconds", "0", "culling.cooldown_seconds"),
    ("[culling]", "cooldown_seconds", "9223372036854775807", "culling.cooldown_seconds"),
    ("[culling]", "max_culled_fraction", "1.5", "culling.max_culled_fraction"),
    ("[culling]", "max_culled_fraction", "nan", "culling.max_culled_fraction"),
    ("[watchdog]", "max_rss_mb", "9223372036854775807", "watchdog.max_rss_mb"),
    ("[watchdog]", "max_error_rate", "-0.1", "watchdog.max_error_rate"),
    ("[watchdog]", "max_stall_ms", "0", "watchdog.max_stall_ms"),
    ("[watchdog]", "max_stall_ms", "9223372036854775807", "watchdog.max_stall_ms"),
    ("[watchdog]", "min_requests", "0", "watchdog.min_requests"),
    ("[watchdog]", "check_interval_seconds", "9223372036854775807", "watchdog.check_interval_seconds"),
    ("[watchdog]", "tokens", "4294967295", "watchdog.tokens"),
    ("[watchdog]", "token_period_seconds", "0", "watchdog.token_period_seconds"),
    ("[watchdog]", "token_period_seconds", "9223372036854775807", "watchdog.token_period_seconds"),
    // Too large even for the parser (> i64): the key path comes from the position.
    ("[server]", "shutdown_timeout_seconds", "99999999999999999999", "server.shutdown_timeout_seconds"),
    ("[rate_limit.keys]", "\"premium\"", "99999999999999999999", "rate_limit.keys.premium"),
];

/// The config with `key = value` on its own line under `header`, and that line's number.
fn config_with(header: &str, key: &str, value: &str) -> (String, usize) {
    let line = header.lines().count() + 1;
    let mut text = format!("{header}\n{key} = {value}\n");
    if !header.starts_with("[[upstreams]]") {
        text.push_str(MIN_UPSTREAM);
    }
    (text, line)
}

#[test]
fn check_rejects_every_numeric_key_out_of_range_with_path_and_line() {
    let mut problems = Vec::new();
    for &(header, key, value, path) in OUT_OF_RANGE {
        let (text, line) = config_with(header, key, value);
        let (code, stdout, stderr, file) = check_config(&text);
        let at = format!("{file}:{line}:");
        if code != 2 || stdout.contains("OK") || !stderr.contains(path) || !stderr.contains(&at) {
            problems.push(format!(
                "{path} = {value}: exit {code}, want 2 and `{at}` and `{path}`; stderr: {}",
                stderr.trim()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The limits themselves are accepted.
    for (header, key, value) in [
        ("[server]", "shutdown_timeout_seconds", "3600"),
        ("[server]", "drain_seconds", "0"),
        ("[rate_limit]", "window_seconds", "86400"),
        ("[rate_limit]", "limit", "1000000000"),
        ("[culling]", "tokens", "0"),
        ("[shedding]", "max_concurrency", "0"),
    ] {
        let (text, _) = config_with(header, key, value);
        let (code, stdout, stderr, _) = check_config(&text);
        assert_eq!(code, 0, "{key} = {value} must pass: {stdout}{stderr}");
    }
}

#[test]
fn sigterm_at_the_largest_shutdown_timeout_exits_without_panic() {
    let b = Backend::start("b");
    let mut p = Proxy::start_with_server(
        "drain_seconds = 0\nshutdown_timeout_seconds = 3600",
        &one_upstream(&b),
    );
    assert_eq!(p.get("/", &[]).status, 200);
    p.signal("TERM");
    let st = p.wait_exit(DEADLINE);
    let logs = p.logs();
    assert!(st.is_some(), "no exit after SIGTERM; logs:\n{logs}");
    assert!(
        st.is_some_and(|s| s.success()),
        "exit {st:?}; logs:\n{logs}"
    );
    assert!(!logs.contains("panicked"), "panic at shutdown:\n{logs}");
}

// ---------------------------------------------------------------------------------------
// Item 10 (a, b): error text
// ---------------------------------------------------------------------------------------

const PASSWORD: &str = "hunter2-s3cr3t";

fn redis_with_password_but_bad_port() -> String {
    format!("[redis]\nurl = \"redis://portcullis:{PASSWORD}@127.0.0.1:notaport\"\n")
}

#[test]
fn redis_password_never_appears_in_check_or_reload_errors() {
    let text = format!("{MIN_UPSTREAM}{}", redis_with_password_but_bad_port());
    let (code, _, stderr, _) = check_config(&text);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("redis.url"), "{stderr}");
    assert!(
        !stderr.contains(PASSWORD),
        "--check printed the password: {stderr}"
    );
    assert!(stderr.contains("portcullis:***@"), "{stderr}");

    let b = Backend::start("b");
    let p = Proxy::start(&one_upstream(&b));
    p.rewrite_config(&format!(
        "{}{}",
        one_upstream(&b),
        redis_with_password_but_bad_port()
    ));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 400, "{}", r.body_str());
    assert!(r.body_str().contains("redis.url"), "{}", r.body_str());
    assert!(
        !r.body_str().contains(PASSWORD),
        "POST /reload answered the password: {}",
        r.body_str()
    );
    let errors_before = p
        .metric("portcullis_config_reloads_total{result=\"error\"}")
        .unwrap_or(0.0);
    p.signal("HUP");
    eventually(
        DEADLINE,
        || "SIGHUP reload error never counted".into(),
        || {
            p.metric("portcullis_config_reloads_total{result=\"error\"}")
                .unwrap_or(0.0)
                > errors_before
        },
    );
    let logs = p.logs();
    assert!(
        logs.contains("redis.url"),
        "reload error not logged:\n{logs}"
    );
    assert!(
        !logs.contains(PASSWORD),
        "a log line has the password:\n{logs}"
    );
}

#[test]
fn overflow_and_non_utf8_errors_name_the_key() {
    // An integer past i64: a parse error, with the path from its position.
    let (text, line) = config_with("[server]", "drain_seconds", "99999999999999999999");
    let (code, _, stderr, file) = check_config(&text);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("server.drain_seconds"), "{stderr}");
    assert!(stderr.contains(&format!("{file}:{line}:")), "{stderr}");

    // A byte that is not UTF-8 inside a value.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("latin1.toml");
    let mut bytes = b"[server]\nthreads = 2\nupgrade_sock = \"/tmp/caf".to_vec();
    bytes.push(0xe9); // 'é' in Latin-1
    bytes.extend_from_slice(b".sock\"\n");
    bytes.extend_from_slice(MIN_UPSTREAM.as_bytes());
    fs::write(&path, &bytes).expect("write");
    let (code, _, stderr) = check_config_file(&path);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("server.upgrade_sock"), "{stderr}");
    assert!(stderr.contains("latin1.toml:3:"), "{stderr}");
    assert!(stderr.contains("UTF-8"), "{stderr}");
}

// ---------------------------------------------------------------------------------------
// Item 10 (c): admin exposure and admin_token
// ---------------------------------------------------------------------------------------

const TOKEN: &str = "adm1n-t0ken-7f3a";

#[test]
fn admin_post_needs_the_token_when_one_is_set() {
    let b = Backend::start("b");
    let p = Proxy::start_with_server(&format!("admin_token = \"{TOKEN}\""), &one_upstream(&b));
    let admin = p.admin_addr();
    let r = post(&admin, "/reload", &[], b"");
    assert_eq!(r.status, 401, "no Authorization: {}", r.body_str());
    assert!(
        r.header("www-authenticate")
            .is_some_and(|v| v.starts_with("Bearer")),
        "{:?}",
        r.headers
    );
    let wrong = format!("Bearer {TOKEN}x");
    let r = post(&admin, "/reload", &[("Authorization", &wrong)], b"");
    assert_eq!(r.status, 401, "wrong token: {}", r.body_str());
    let r = post(
        &admin,
        "/reload",
        &[("Authorization", "Basic YWRtaW46YWRtaW4=")],
        b"",
    );
    assert_eq!(r.status, 401, "other scheme: {}", r.body_str());
    assert_eq!(reloads_ok(&p), 0.0, "a refused POST reloaded");

    let right = format!("Bearer {TOKEN}");
    let r = post(&admin, "/reload", &[("Authorization", &right)], b"");
    assert_eq!(r.status, 200, "right token: {}", r.body_str());
    assert_eq!(reloads_ok(&p), 1.0);

    // GETs stay open for probes and scrapers, and never show the token.
    for path in ["/healthz", "/readyz", "/metrics", "/status"] {
        let r = p.admin_get(path);
        assert_eq!(r.status, 200, "GET {path}");
        assert!(!r.body_str().contains(TOKEN), "GET {path} shows the token");
    }
    assert!(!p.logs().contains(TOKEN), "the token is in the logs");
}

/// A proxy whose admin listener is on all interfaces (the container setup),
/// which [`Proxy`] cannot express: it always puts admin on 127.0.0.1.
struct WildcardAdmin {
    child: Child,
    _dir: tempfile::TempDir,
    log: std::path::PathBuf,
    /// Where to reach the admin listener.
    admin: String,
}

impl WildcardAdmin {
    fn start(server_extra: &str, cfg: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let text = format!(
            "[server]\nlisten = [\"127.0.0.1:{}\"]\nadmin_listen = \"0.0.0.0:{port}\"\n\
             upgrade_sock = \"{}\"\ndrain_seconds = 0\n{server_extra}\n{cfg}",
            free_port(),
            dir.path().join("upgrade.sock").display()
        );
        let config = dir.path().join("portcullis.toml");
        fs::write(&config, text).expect("write config");
        let log = dir.path().join("proxy.log");
        let out = fs::File::create(&log).expect("log");
        let child = Command::new(&*BIN)
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().expect("clone")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("spawn portcullis");
        let p = Self {
            child,
            _dir: dir,
            log,
            admin: format!("127.0.0.1:{port}"),
        };
        eventually(
            DEADLINE,
            || format!("admin never ready; logs:\n{}", p.logs()),
            || try_get(&p.admin, "/readyz", &[]).is_ok_and(|r| r.status == 200),
        );
        p
    }

    fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for WildcardAdmin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn admin_post_is_off_on_a_non_loopback_listener_without_token() {
    let b = Backend::start("b");
    let p = WildcardAdmin::start("", &one_upstream(&b));
    // Probes still work.
    assert_eq!(get(&p.admin, "/healthz", &[]).status, 200);
    assert_eq!(get(&p.admin, "/readyz", &[]).status, 200);
    let r = post(&p.admin, "/reload", &[], b"");
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert!(r.body_str().contains("admin_token"), "{}", r.body_str());
    let logs = p.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("WARN") && l.contains("admin_token")),
        "no start-up warning about the exposed admin listener:\n{logs}"
    );

    // With a token the same listener takes authorised POSTs.
    let p = WildcardAdmin::start(&format!("admin_token = \"{TOKEN}\""), &one_upstream(&b));
    assert_eq!(post(&p.admin, "/reload", &[], b"").status, 401);
    let right = format!("Bearer {TOKEN}");
    let r = post(&p.admin, "/reload", &[("Authorization", &right)], b"");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert!(
        !p.logs()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("admin_token")),
        "warned although a token is set"
    );
}
