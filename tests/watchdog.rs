//! The self-watchdog (`[watchdog]`): a breached proxy restarts itself only when the
//! fleet-wide "self" token bucket in Redis grants it a token; otherwise it stays up,
//! logs and counts `portcullis_watchdog_breaches_total{kind,result}`.

use portcullis_test_kit as support;

use std::time::Instant;
use support::*;

fn breaches(p: &Proxy, kind: &str, result: &str) -> f64 {
    p.metric(&format!(
        r#"portcullis_watchdog_breaches_total{{kind="{kind}",result="{result}"}}"#
    ))
    .unwrap_or(0.0)
}

/// `[watchdog]` with `max_rss_mb = 1` (always breached), 1 s checks, one token per
/// 10 minutes; other kinds effectively off so the counts are exact.
fn config(redis: Option<&RedisServer>, backend: &Backend, watchdog_extra: &str) -> String {
    let redis = redis
        .map(|r| format!("[redis]\nurl = \"{}\"\n", r.url()))
        .unwrap_or_default();
    let mut watchdog = String::new();
    for line in [
        "enabled = true",
        "check_interval_seconds = 1",
        "tokens = 1",
        "token_period_seconds = 600",
        "max_stall_ms = 60000",
        "max_error_rate = 1.0",
    ] {
        let key = line.split('=').next().unwrap_or("").trim();
        let overridden = watchdog_extra
            .lines()
            .any(|l| l.split('=').next().is_some_and(|k| k.trim() == key));
        if !overridden {
            watchdog.push_str(line);
            watchdog.push('\n');
        }
    }
    format!(
        r#"
{redis}
[rate_limit]
enabled = false

[watchdog]
{watchdog}{watchdog_extra}

[[upstreams]]
name = "app"
backends = ["{}"]
"#,
        backend.addr()
    )
}

const RSS_1MB: &str = "max_rss_mb = 1";

/// With Redis and a token: readiness fails, traffic is still served during the
/// drain, and the process exits 0. A second proxy on the same bucket is breached
/// too but gets no token: it stays ready and counts `no_token`.
#[test]
fn breach_with_token_restarts_gracefully_and_the_next_gets_none() {
    let redis = RedisServer::start();
    let a = Backend::start("A");
    let cfg = config(Some(&redis), &a, RSS_1MB);
    let server = "drain_seconds = 3\nshutdown_timeout_seconds = 10\n";

    let mut first = Proxy::start_with_server(server, &cfg);
    let t0 = Instant::now();
    eventually(
        DEADLINE,
        || {
            format!(
                "first proxy never started draining; logs:\n{}",
                first.logs()
            )
        },
        || first.status_json()["state"] == "draining",
    );
    let to_draining = t0.elapsed();
    assert_eq!(first.admin_get("/readyz").status, 503);
    assert_eq!(breaches(&first, "rss", "granted"), 1.0);
    // the graceful path: still proxied while draining
    let r = first.get("/during-drain", &[]);
    assert_eq!(r.status, 200, "{}", r.body_str());
    let status = first
        .wait_exit(DEADLINE)
        .unwrap_or_else(|| panic!("first proxy never exited; logs:\n{}", first.logs()));
    let to_exit = t0.elapsed();
    assert!(
        status.success(),
        "exit status {status}; logs:\n{}",
        first.logs()
    );
    let logs = first.logs();
    assert!(
        logs.contains("\"event\":\"watchdog\"") && logs.contains("granted"),
        "the grant is logged:\n{logs}"
    );

    // the bucket lives under its own prefix, every key with a TTL
    let keys = redis.keys("*");
    assert!(
        keys.iter().any(|k| k.starts_with("portcullis-self:")),
        "self bucket keys: {keys:?}"
    );
    for k in keys.iter().filter(|k| k.starts_with("portcullis-self")) {
        let ttl: i64 = redis.cmd(&["PTTL", k]).parse().unwrap_or(-3);
        // -1 = no TTL (the failure); -2 = it expired since KEYS listed it, so it had one.
        assert!(ttl > 0 || ttl == -2, "{k} has no TTL ({ttl})");
    }

    // second proxy, same bucket, breached too: no token
    let second = Proxy::start_with_server(server, &cfg);
    eventually(
        DEADLINE,
        || format!("second proxy never counted no_token:\n{}", second.metrics()),
        || breaches(&second, "rss", "no_token") >= 3.0,
    );
    assert_eq!(second.admin_get("/readyz").status, 200, "stays ready");
    assert_eq!(second.status_json()["state"], "ready");
    assert_eq!(second.get("/still", &[]).status, 200);
    assert_eq!(breaches(&second, "rss", "granted"), 0.0);
    assert!(
        second.logs().contains("no token"),
        "logs:\n{}",
        second.logs()
    );
    eprintln!(
        "[watchdog] granted: start -> draining {} ms, start -> exit {} ms (check 1 s, drain 3 s); second proxy: {} no_token breaches, still ready",
        to_draining.as_millis(),
        to_exit.as_millis(),
        breaches(&second, "rss", "no_token")
    );
}

/// Without `[redis]` there is no fleet view: a breached proxy stays up and counts
/// `no_store`.
/// Unbreached kinds count nothing, and a disabled watchdog (the default) counts nothing.
#[test]
fn breach_without_redis_stays_up() {
    let a = Backend::start("A");
    // started first, so it has run at least as long as `p` below
    let off = Proxy::start(&format!(
        "[watchdog]\nmax_rss_mb = 1\ncheck_interval_seconds = 1\n[[upstreams]]\nname = \"app\"\nbackends = [\"{}\"]\n",
        a.addr()
    ));
    let p = Proxy::start(&config(None, &a, RSS_1MB));
    eventually(
        DEADLINE,
        || format!("never counted no_store:\n{}", p.metrics()),
        || breaches(&p, "rss", "no_store") >= 3.0,
    );
    assert_eq!(p.admin_get("/readyz").status, 200);
    assert_eq!(p.status_json()["state"], "ready");
    assert_eq!(p.get("/x", &[]).status, 200);
    assert!(p.logs().contains("no [redis]"), "logs:\n{}", p.logs());
    let total = |text: &str| -> f64 {
        metric_samples(text)
            .into_iter()
            .filter(|(n, _, _)| n == "portcullis_watchdog_breaches_total")
            .map(|(_, _, v)| v)
            .sum()
    };
    let text = p.metrics();
    assert_eq!(
        total(&text),
        breaches(&p, "rss", "no_store"),
        "only rss is breached:\n{text}"
    );
    assert_eq!(total(&off.metrics()), 0.0, "enabled = false counts nothing");
    assert_eq!(off.admin_get("/readyz").status, 200);
}

/// Redis configured but unreachable: `store_error`, and the proxy stays up.
#[test]
fn breach_with_redis_down_stays_up() {
    let a = Backend::start("A");
    let mut redis = RedisServer::start();
    let cfg = config(Some(&redis), &a, RSS_1MB);
    redis.kill();
    let p = Proxy::start(&cfg);
    eventually(
        DEADLINE,
        || format!("never counted store_error:\n{}", p.metrics()),
        || breaches(&p, "rss", "store_error") >= 2.0,
    );
    assert_eq!(p.admin_get("/readyz").status, 200);
    assert_eq!(p.get("/x", &[]).status, 200);
}

/// The error-rate signal: a backend that closes connections makes the proxy answer
/// 502 itself; over `min_requests` in an interval that breaches `max_error_rate`.
#[test]
fn proxy_made_errors_breach_error_rate() {
    let a = Backend::start("A");
    a.set_mode(Mode::Close);
    let p = Proxy::start(&config(None, &a, "max_error_rate = 0.5\nmin_requests = 10"));
    eventually(
        DEADLINE,
        || format!("never counted error_rate:\n{}", p.metrics()),
        || {
            for i in 0..15 {
                let r = p.get(&format!("/e/{i}"), &[]);
                assert!(r.status >= 500, "status {}", r.status);
            }
            breaches(&p, "error_rate", "no_store") >= 1.0
        },
    );
    assert!(
        p.metric(r#"portcullis_requests_total{outcome="upstream_error"}"#)
            .unwrap_or(0.0)
            >= 10.0
    );
    assert_eq!(p.admin_get("/readyz").status, 200);
}

/// The watchdog keys are validated like every other key.
#[test]
fn watchdog_keys_are_validated() {
    for (bad, key) in [
        ("max_error_rate = 1.5", "watchdog.max_error_rate"),
        ("min_requests = 0", "watchdog.min_requests"),
        (
            "check_interval_seconds = 0",
            "watchdog.check_interval_seconds",
        ),
        ("max_stall_ms = 0", "watchdog.max_stall_ms"),
        ("token_period_seconds = 0", "watchdog.token_period_seconds"),
        ("max_rss = 5", "watchdog.max_rss"),
    ] {
        let (code, _out, err, _) = check_config(&format!(
            "[watchdog]\n{bad}\n[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:1\"]\n"
        ));
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains(key), "{bad}: stderr names {key}: {err}");
    }
    let (code, out, err, _) = check_config(
        "[watchdog]\nenabled = true\nmax_rss_mb = 512\nmax_error_rate = 0.2\nmin_requests = 50\nmax_stall_ms = 500\ncheck_interval_seconds = 10\ntokens = 2\ntoken_period_seconds = 600\n[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:1\"]\n",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "OK");
}
