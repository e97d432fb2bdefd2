//! Gray failure, outliers by comparison with peers (CONTRACT §15): real `portcullis`
//! processes, real backends told to be slow or to fail a share of requests, a real
//! `redis-server` holding the fleet's culling tokens and claims. No mocks.
//!
//! Every test sets `error_threshold` far out of reach, so only the outlier rule under
//! test can make a candidate, and checks once a second over a 10 s window.

use portcullis_test_kit as support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::*;

const PROBE_UA: &str = "portcullis-cull-probe";
const HEALTH_UA: &str = "portcullis-health-check";
/// Long enough for a judgement (30 answers per backend) and a fleet-wide cull.
const CULL_DEADLINE: Duration = Duration::from_secs(40);

struct Gray {
    outlier: &'static str,
    min_requests: u64,
    tokens: u32,
    fraction: f64,
    cooldown: u64,
}

impl Gray {
    fn new(outlier: &'static str) -> Self {
        Gray {
            outlier,
            min_requests: 30,
            tokens: 10,
            fraction: 0.5,
            cooldown: 4,
        }
    }

    fn render(&self, redis: &RedisServer, prefix: &str, backends: &[Backend]) -> String {
        let list: Vec<String> = backends
            .iter()
            .map(|b| format!("\"{}\"", b.addr()))
            .collect();
        format!(
            r#"[redis]
url = "{url}"
key_prefix = "{prefix}"

[[upstreams]]
name = "app"
backends = [{list}]
connect_timeout_ms = 500
read_timeout_ms = 30000
retries = 0

[rate_limit]
enabled = false

[culling]
enabled = true
window_seconds = 10
error_threshold = 1000000
check_interval_seconds = 1
tokens = {tokens}
token_period_seconds = 600
max_culled_fraction = {fraction:?}
cooldown_seconds = {cooldown}
outlier = "{outlier}"
outlier_min_requests = {min}
"#,
            url = redis.url(),
            list = list.join(", "),
            tokens = self.tokens,
            fraction = self.fraction,
            cooldown = self.cooldown,
            outlier = self.outlier,
            min = self.min_requests,
        )
    }
}

fn backends(n: usize) -> Vec<Backend> {
    (0..n).map(|i| Backend::start(&format!("b{i}"))).collect()
}

/// [`Load`] with `threads` client threads through each proxy.
fn load(ps: &[Proxy], threads: usize) -> Load {
    let addrs: Vec<String> = ps
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.addr(), threads))
        .collect();
    Load::start(&addrs)
}

fn backend_entry(p: &Proxy, addr: &str) -> Value {
    let st = p.status_json();
    st["upstreams"][0]["backends"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["address"] == addr))
        .cloned()
        .unwrap_or_else(|| panic!("backend {addr} missing from /status: {st}"))
}

fn state_of(p: &Proxy, addr: &str) -> String {
    backend_entry(p, addr)["state"]
        .as_str()
        .unwrap_or("<none>")
        .to_string()
}

fn culled(p: &Proxy) -> Vec<String> {
    let st = p.status_json();
    st["upstreams"][0]["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["state"] == "culled")
        .map(|b| b["address"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The `/status` decisions of `p` about `addr` with `result`.
fn decisions(p: &Proxy, addr: &str, result: &str) -> Vec<Value> {
    p.status_json()["culling"]["recent_decisions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["backend"] == addr && d["result"] == result)
        .cloned()
        .collect()
}

fn culls_counted(ps: &[Proxy]) -> f64 {
    ps.iter()
        .map(|p| {
            p.metric("portcullis_cull_decisions_total{result=\"culled\"}")
                .unwrap_or(0.0)
        })
        .sum()
}

fn client_requests(b: &Backend) -> usize {
    b.received()
        .iter()
        .filter(|r| {
            let ua = r.header("user-agent").unwrap_or("");
            ua != PROBE_UA && ua != HEALTH_UA
        })
        .count()
}

fn probes(b: &Backend) -> usize {
    b.received()
        .iter()
        .filter(|r| r.header("user-agent") == Some(PROBE_UA))
        .count()
}

fn wait_culled_everywhere(ps: &[Proxy], addr: &str) {
    eventually(
        CULL_DEADLINE,
        || {
            format!(
                "{addr} culled on every proxy; statuses: {:?}",
                ps.iter().map(Proxy::status_json).collect::<Vec<_>>()
            )
        },
        || ps.iter().all(|p| state_of(p, addr) == "culled"),
    );
}

/// The decision that culled `addr`, from whichever proxy took the fleet's token.
fn the_cull(ps: &[Proxy], addr: &str) -> Value {
    let all: Vec<Value> = ps
        .iter()
        .flat_map(|p| decisions(p, addr, "culled"))
        .collect();
    assert_eq!(
        all.len(),
        1,
        "one instance culls, the others follow: {all:?}"
    );
    all[0].clone()
}

#[test]
fn a_slow_backend_is_culled_fleet_wide_kept_out_while_slow_and_readmitted_after_recovery() {
    let redis = RedisServer::start();
    let bs = backends(4);
    let slow = &bs[2];
    slow.set_mode(Mode::Slow(Duration::from_millis(150)));
    let cfg = Gray::new("latency");
    let conf = cfg.render(&redis, "gray1", &bs);
    let ps = vec![Proxy::start(&conf), Proxy::start(&conf)];
    let _load = load(&ps, 3);

    wait_culled_everywhere(&ps, &slow.addr());
    for p in &ps {
        assert_eq!(culled(p), vec![slow.addr()], "only the slow one");
    }
    // One token spent for the fleet, and the decision says which rule and the figures.
    assert_eq!(culls_counted(&ps), 1.0);
    let d = the_cull(&ps, &slow.addr());
    assert_eq!(d["rule"], "latency", "{d}");
    let figures = d["figures"].as_str().unwrap_or("");
    assert!(figures.starts_with("p90 "), "{d}");
    // The instance that judged it shows the figures in /status.
    let views: Vec<Value> = ps
        .iter()
        .map(|p| backend_entry(p, &slow.addr())["outlier"].clone())
        .filter(|v| !v.is_null())
        .collect();
    assert!(!views.is_empty(), "an outlier view in /status");
    let v = &views[0];
    assert_eq!(v["rule"], "latency");
    let (value, limit) = (
        v["value"].as_f64().expect("value"),
        v["limit"].as_f64().expect("limit"),
    );
    assert!(
        value >= 120.0 && limit < value,
        "p90 {value} ms over {limit} ms: {v}"
    );

    // Still slow: the probe after the cooldown answers, but late, so it stays out.
    eventually(
        Duration::from_secs(cfg.cooldown + 10),
        || format!("a probe of {}", slow.addr()),
        || probes(slow) >= 1,
    );
    let still_out = wait_until(Duration::from_secs(2), || {
        ps.iter().any(|p| state_of(p, &slow.addr()) != "culled")
    });
    assert!(
        !still_out,
        "a probe answering in 150 ms must not readmit it"
    );

    // Recovered: readmitted everywhere, and clients reach it again.
    slow.set_mode(Mode::Ok);
    let t = Instant::now();
    eventually(
        Duration::from_secs(2 * cfg.cooldown + 10),
        || "readmitted on every proxy".into(),
        || ps.iter().all(|p| state_of(p, &slow.addr()) == "up"),
    );
    eprintln!("readmitted {:?} after recovery", t.elapsed());
    let before = client_requests(slow);
    eventually(
        DEADLINE,
        || "clients reach the readmitted backend".into(),
        || client_requests(slow) >= before + 20,
    );
    assert!(ps
        .iter()
        .any(|p| !decisions(p, &slow.addr(), "readmitted").is_empty()));
    // Fast again: not culled a second time.
    assert!(ps.iter().all(|p| culled(p).is_empty()));
}

#[test]
fn a_backend_failing_a_quarter_of_requests_is_culled_by_success_rate() {
    let redis = RedisServer::start();
    let bs = backends(4);
    let bad = &bs[1];
    bad.set_mode(Mode::FailEvery(4, 500));
    let cfg = Gray::new("success_rate");
    let conf = cfg.render(&redis, "gray2", &bs);
    let ps = vec![Proxy::start(&conf), Proxy::start(&conf)];
    let _load = load(&ps, 2);

    wait_culled_everywhere(&ps, &bad.addr());
    for p in &ps {
        assert_eq!(culled(p), vec![bad.addr()]);
    }
    assert_eq!(culls_counted(&ps), 1.0);
    let d = the_cull(&ps, &bad.addr());
    assert_eq!(d["rule"], "success_rate", "{d}");
    assert!(
        d["figures"]
            .as_str()
            .is_some_and(|f| f.starts_with("success rate 0.")),
        "{d}"
    );
    // Its errors never reached error_threshold: only the comparison culled it.
    let errs = backend_entry(&ps[0], &bad.addr())["errors_in_window"]
        .as_u64()
        .unwrap_or(0);
    assert!(errs < 1_000_000);
}

#[test]
fn backends_all_equally_slow_are_not_culled() {
    let redis = RedisServer::start();
    let bs = backends(4);
    for b in &bs {
        b.set_mode(Mode::Slow(Duration::from_millis(80)));
    }
    let cfg = Gray::new("latency");
    let conf = cfg.render(&redis, "gray3", &bs);
    let p = Proxy::start(&conf);
    let _load = load(std::slice::from_ref(&p), 4);
    // Every backend judged: well over min_requests answers each in the window.
    eventually(
        CULL_DEADLINE,
        || "every backend has answers enough to be judged".into(),
        || {
            bs.iter()
                .all(|b| client_requests(b) >= 2 * cfg.min_requests as usize)
        },
    );
    // Several checks later, still nobody culled and nobody an outlier.
    let any = wait_until(Duration::from_secs(4), || {
        let st = p.status_json();
        st["upstreams"][0]["backends"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|b| b["state"] == "culled" || !b["outlier"].is_null())
    });
    assert!(!any, "alike slow is not an outlier: {}", p.status_json());
    assert_eq!(
        p.metric("portcullis_cull_decisions_total{result=\"culled\"}")
            .unwrap_or(0.0),
        0.0
    );
}

/// Two slow backends of five: both are outliers, but the fleet's single token culls one;
/// the other says why it stays (`no_token`). With tokens to spare, `max_culled_fraction`
/// (0.2 of 5: one) holds the second back (`over_fraction`).
#[test]
fn the_token_and_the_fraction_still_hold_outliers_back() {
    for (tokens, fraction, reason, prefix) in [
        (1, 0.5, "no_token", "gray4"),
        (10, 0.2, "over_fraction", "gray5"),
    ] {
        let redis = RedisServer::start();
        let bs = backends(5);
        for b in &bs[3..] {
            b.set_mode(Mode::Slow(Duration::from_millis(150)));
        }
        let cfg = Gray {
            tokens,
            fraction,
            cooldown: 600,
            ..Gray::new("latency")
        };
        let p = Proxy::start(&cfg.render(&redis, prefix, &bs));
        let _load = load(std::slice::from_ref(&p), 4);
        let slow: Vec<String> = bs[3..].iter().map(Backend::addr).collect();
        eventually(
            CULL_DEADLINE,
            || {
                format!(
                    "one slow culled, the other held back ({reason}): {}",
                    p.status_json()
                )
            },
            || {
                let c = culled(&p);
                c.len() == 1
                    && slow.contains(&c[0])
                    && slow
                        .iter()
                        .filter(|a| **a != c[0])
                        .all(|a| backend_entry(&p, a)["failing"] == reason)
            },
        );
        let held = slow
            .iter()
            .find(|a| state_of(&p, a) == "up")
            .cloned()
            .unwrap_or_default();
        let still = wait_until(Duration::from_secs(3), || culled(&p).len() > 1);
        assert!(!still, "{held} stays in ({reason})");
        assert_eq!(backend_entry(&p, &held)["outlier"]["rule"], "latency");
    }
}
