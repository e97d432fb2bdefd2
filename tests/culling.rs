//! Upstream culling end to end (CONTRACT §2 `[culling]`, §4 `/status` and metrics, §5.4):
//! real `redis-server`, real `portcullis` processes, real backends, no mocks.
//!
//! Every test runs with `check_interval_seconds = 1` and a small window/threshold so a
//! cull happens within a few seconds. Client traffic comes from [`Load`] (support kit), one keep-alive
//! client thread per proxy that records every response (status, answering backend,
//! start/end instants) so the tests can count exactly what clients saw before and after
//! an ejection. The ejection instant of a proxy is the moment the test first *observes*
//! `state: "culled"` in that proxy's `/status`: the ejection happened before that, so any
//! request the test starts later must not reach the culled backend.

use portcullis_test_kit as support;

use serde_json::Value;
use std::collections::BTreeMap;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use support::*;

/// `check_interval_seconds` of every test.
const INTERVAL: Duration = Duration::from_secs(1);
/// `error_threshold` of every test.
const THRESHOLD: u64 = 5;
/// User agents of the proxy's own requests to backends (not client traffic).
const PROBE_UA: &str = "portcullis-cull-probe";
const HEALTH_UA: &str = "portcullis-health-check";
/// Extra time allowed on top of a bound for observing it from outside (a `/status` poll
/// every ~10 ms on a loaded 2-core machine).
const OBSERVE_SLACK: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------------------
// configuration
// ---------------------------------------------------------------------------------------

#[derive(Clone)]
struct CullCfg {
    redis: Option<String>,
    key_prefix: String,
    window: u64,
    threshold: u64,
    tokens: u32,
    token_period: u64,
    fraction: f64,
    cooldown: u64,
    dry_run: bool,
    webhook: String,
    health_path: String,
    read_timeout_ms: u64,
}

impl CullCfg {
    fn new(redis: Option<&RedisServer>) -> Self {
        CullCfg {
            redis: redis.map(RedisServer::url),
            key_prefix: "pcull".into(),
            window: 10,
            threshold: THRESHOLD,
            tokens: 10,
            token_period: 600,
            fraction: 0.5,
            cooldown: 30,
            dry_run: false,
            webhook: String::new(),
            health_path: String::new(),
            read_timeout_ms: 30_000,
        }
    }

    /// Lease TTL as the contract's implementation derives it:
    /// `max(3 × interval, cooldown + 2 × interval)`.
    fn lease_ttl(&self) -> Duration {
        let i = INTERVAL.as_secs();
        Duration::from_secs((3 * i).max(self.cooldown + 2 * i))
    }

    fn claims_key(&self, upstream: &str) -> String {
        format!("{p}:cull:{{{p}}}:claims:{upstream}", p = self.key_prefix)
    }

    fn tokens_key(&self) -> String {
        format!("{p}:cull:{{{p}}}:tokens", p = self.key_prefix)
    }

    fn render(&self, backends: &[Backend]) -> String {
        let list: Vec<String> = backends
            .iter()
            .map(|b| format!("\"{}\"", b.addr()))
            .collect();
        let mut s = String::new();
        if let Some(url) = &self.redis {
            s.push_str(&format!(
                "[redis]\nurl = \"{url}\"\nkey_prefix = \"{}\"\n\n",
                self.key_prefix
            ));
        }
        s.push_str(&format!(
            // `retries = 0`: a retried 502 would hide the backend's errors from the
            // clients whose view these tests compare with the cull (CONTRACT §10 retries
            // a GET's 502 by default); a failed connect is still retried.
            "[[upstreams]]\nname = \"app\"\nbackends = [{}]\nconnect_timeout_ms = 500\n\
             read_timeout_ms = {}\nretries = 0\n",
            list.join(", "),
            self.read_timeout_ms
        ));
        if !self.health_path.is_empty() {
            // The active health check runs once at start (backends are fine then) and not
            // again during the test: what is tested here is the cull probe's use of the path.
            s.push_str(&format!(
                "health_check_path = \"{}\"\nhealth_check_interval_seconds = 3600\n",
                self.health_path
            ));
        }
        s.push_str(&format!(
            r#"
[rate_limit]
enabled = false

[culling]
enabled = true
window_seconds = {window}
error_threshold = {threshold}
check_interval_seconds = {interval}
tokens = {tokens}
token_period_seconds = {period}
max_culled_fraction = {fraction:?}
cooldown_seconds = {cooldown}
dry_run = {dry_run}
webhook_url = "{webhook}"
"#,
            window = self.window,
            threshold = self.threshold,
            interval = INTERVAL.as_secs(),
            tokens = self.tokens,
            period = self.token_period,
            fraction = self.fraction,
            cooldown = self.cooldown,
            dry_run = self.dry_run,
            webhook = self.webhook,
        ));
        s
    }
}

fn four_backends() -> Vec<Backend> {
    (0..4).map(|i| Backend::start(&format!("b{i}"))).collect()
}

fn start_proxies(n: usize, conf: &str) -> Vec<Proxy> {
    (0..n).map(|_| Proxy::start(conf)).collect()
}

/// A Redis, [`four_backends`] and `proxies` proxies in front of them, culling with
/// [`CullCfg::new`] through that Redis: the Redis, the backends, the configuration and
/// the proxies.
fn cull_fleet(proxies: usize) -> (RedisServer, Vec<Backend>, CullCfg, Vec<Proxy>) {
    let redis = RedisServer::start();
    let bs = four_backends();
    let cfg = CullCfg::new(Some(&redis));
    let ps = start_proxies(proxies, &cfg.render(&bs));
    (redis, bs, cfg, ps)
}

/// [`Load`] through every proxy of `ps`, once each has answered `ok_each` requests with 2xx.
fn warm_load(ps: &[Proxy], ok_each: usize) -> Load {
    let addrs: Vec<String> = ps.iter().map(Proxy::addr).collect();
    let load = Load::start(&addrs);
    load.wait_ok_after(&vec![Instant::now(); ps.len()], ok_each);
    load
}

// ---------------------------------------------------------------------------------------
// observation helpers
// ---------------------------------------------------------------------------------------

/// The `/status` entry of backend `addr` of upstream `app`.
fn backend_entry(p: &Proxy, addr: &str) -> Value {
    let st = p.status_json();
    st["upstreams"]
        .as_array()
        .and_then(|ups| ups.iter().find(|u| u["name"] == "app"))
        .and_then(|u| u["backends"].as_array())
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

/// Addresses `/status` shows as culled.
fn culled_in_status(p: &Proxy) -> Vec<String> {
    let st = p.status_json();
    let mut out = Vec::new();
    for u in st["upstreams"].as_array().into_iter().flatten() {
        for b in u["backends"].as_array().into_iter().flatten() {
            if b["state"] == "culled" {
                out.push(b["address"].as_str().unwrap_or("").to_string());
            }
        }
    }
    out
}

fn decisions(p: &Proxy, result: &str) -> f64 {
    p.metric(&format!(
        "portcullis_cull_decisions_total{{result=\"{result}\"}}"
    ))
    .unwrap_or(0.0)
}

fn culled_gauge(p: &Proxy, addr: &str) -> Option<f64> {
    p.metric(&format!(
        "portcullis_backend_culled{{upstream=\"app\",backend=\"{addr}\"}}"
    ))
}

/// Requests a backend received from clients (the proxy's own probes and health checks
/// excluded).
fn client_requests(b: &Backend) -> usize {
    b.received()
        .iter()
        .filter(|r| {
            let ua = r.header("user-agent").unwrap_or("");
            ua != PROBE_UA && ua != HEALTH_UA
        })
        .count()
}

fn probes(b: &Backend) -> Vec<Received> {
    b.received()
        .into_iter()
        .filter(|r| r.header("user-agent") == Some(PROBE_UA))
        .collect()
}

/// The proxy's structured (JSON, one per line) log events.
fn log_events(p: &Proxy) -> Vec<Value> {
    p.logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// Polls every proxy's `/status` until each shows `addr` culled; returns, per proxy, the
/// instant the test first saw it (the ejection happened before that instant).
fn wait_culled_everywhere(ps: &[Proxy], addr: &str, timeout: Duration) -> Vec<Instant> {
    let mut seen: Vec<Option<Instant>> = vec![None; ps.len()];
    let ok = wait_until(timeout, || {
        for (i, p) in ps.iter().enumerate() {
            if seen[i].is_none() && state_of(p, addr) == "culled" {
                seen[i] = Some(Instant::now());
            }
        }
        seen.iter().all(Option::is_some)
    });
    assert!(
        ok,
        "{addr} not culled on every proxy within {timeout:?} (seen: {seen:?}); statuses: {:?}",
        ps.iter().map(|p| p.status_json()).collect::<Vec<_>>()
    );
    seen.into_iter().flatten().collect()
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// End instant of the `n`-th (1-based) 5xx response from backend `name` through any
/// proxy: when the errors the fleet saw from it reached `n`. (Instances share their
/// per-backend counts, so this is the earliest moment a cull is due; per instance it is
/// later.)
fn nth_error_end(samples: &[Sample], name: &str, n: u64) -> Option<Instant> {
    let mut ends: Vec<Instant> = samples
        .iter()
        .filter(|s| s.backend.as_deref() == Some(name) && s.status.is_some_and(|c| c >= 500))
        .map(|s| s.end)
        .collect();
    ends.sort();
    ends.get(usize::try_from(n).ok()?.checked_sub(1)?).copied()
}

/// Histogram of what clients saw (`"200"`, `"500 from b1"`, `"transport error"`, ...).
fn tally<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for s in samples {
        let k = match (s.status, &s.backend) {
            (Some(c), _) if (200..300).contains(&c) => c.to_string(),
            (Some(c), Some(b)) => format!("{c} from {b}"),
            (Some(c), None) => format!("{c} from the proxy"),
            (None, _) => format!(
                "transport error: {}",
                s.error
                    .as_deref()
                    .unwrap_or("")
                    .chars()
                    .take(40)
                    .collect::<String>()
            ),
        };
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

/// Sets the failing backend going, waits for the cull on every proxy and reports how long
/// detection → ejection took. Returns (fail instant, per-proxy ejection instants).
struct CullRun {
    t_fail: Instant,
    ejected: Vec<Instant>,
    /// When the errors clients saw from the backend (through any instance) reached the
    /// threshold.
    detected: Instant,
}

fn fail_and_wait_cull(ps: &[Proxy], load: &Load, bad: &Backend, mode: Mode) -> CullRun {
    let t_fail = Instant::now();
    bad.set_mode(mode);
    let ejected = wait_culled_everywhere(ps, &bad.addr(), DEADLINE);
    let samples = load.samples();
    let detected = nth_error_end(&samples, bad.name(), THRESHOLD).unwrap_or_else(|| {
        panic!(
            "no proxy saw {THRESHOLD} errors from {} before the cull: {:?}",
            bad.name(),
            tally(samples.iter().filter(|s| s.start >= t_fail))
        )
    });
    CullRun {
        t_fail,
        ejected,
        detected,
    }
}

// ---------------------------------------------------------------------------------------
// 1. culled within two check intervals, fleet-wide
// ---------------------------------------------------------------------------------------

#[test]
fn failing_backend_is_culled_within_two_intervals_on_every_instance() {
    let (redis, bs, cfg, ps) = cull_fleet(2);
    let load = warm_load(&ps, 40);

    let bad = &bs[1];
    let run = fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    let first = *run.ejected.iter().min().expect("ejections");
    let last = *run.ejected.iter().max().expect("ejections");
    let to_first = first.saturating_duration_since(run.detected);
    let to_all = last.saturating_duration_since(run.detected);
    eprintln!(
        "[culling] failing backend: fail→threshold {}, threshold→ejection (first instance) {}, \
         threshold→ejection on both instances {}, per instance after fail: {:?}",
        secs(run.detected - run.t_fail),
        secs(to_first),
        secs(to_all),
        run.ejected
            .iter()
            .map(|e| secs(*e - run.t_fail))
            .collect::<Vec<_>>()
    );
    assert!(
        to_first <= 2 * INTERVAL + OBSERVE_SLACK,
        "ejection took {to_first:?} after the threshold was reached (> 2 check intervals)"
    );

    for (i, p) in ps.iter().enumerate() {
        assert_eq!(
            culled_gauge(p, &bad.addr()),
            Some(1.0),
            "proxy {i}: portcullis_backend_culled for {}",
            bad.addr()
        );
        for good in bs.iter().filter(|b| b.name() != bad.name()) {
            assert_eq!(
                culled_gauge(p, &good.addr()),
                Some(0.0),
                "proxy {i}: {}",
                good.addr()
            );
            assert_eq!(
                state_of(p, &good.addr()),
                "up",
                "proxy {i}: {}",
                good.addr()
            );
        }
        let e = backend_entry(p, &bad.addr());
        assert!(
            e["errors_in_window"].as_u64().is_some_and(|n| n >= 1),
            "proxy {i}: errors_in_window of the culled backend: {e}"
        );
    }
    // Every instance shows when the lease ends, the one following another's cull too
    // (its time left read from the store; the page said only "held by another instance").
    for (i, p) in ps.iter().enumerate() {
        eventually(
            DEADLINE,
            || format!("proxy {i}: {}", backend_entry(p, &bad.addr())["cull_lease"]),
            || {
                let lease = &backend_entry(p, &bad.addr())["cull_lease"];
                let now = p.status_json()["now_ms"].as_u64().unwrap_or(u64::MAX);
                lease["lease_until_ms"].as_u64().is_some_and(|t| t > now)
            },
        );
    }
    // The one following says who culled it and by which rule (the culling instance
    // publishes both beside its claim).
    let leases: Vec<serde_json::Value> = ps
        .iter()
        .map(|p| backend_entry(p, &bad.addr())["cull_lease"].clone())
        .collect();
    if leases.iter().any(|l| l["phase"] == "following") {
        let (i, p) = ps
            .iter()
            .enumerate()
            .find(|(i, _)| leases[*i]["phase"] == "following")
            .unwrap_or_else(|| unreachable!());
        eventually(
            DEADLINE,
            || format!("proxy {i}: {}", backend_entry(p, &bad.addr())["cull_lease"]),
            || {
                let l = &backend_entry(p, &bad.addr())["cull_lease"];
                l["rule"] == "error_threshold"
                    && l["by"]
                        .as_str()
                        .is_some_and(|by| by.ends_with(&format!(":{}", ps[1 - i].pid())))
            },
        );
    }
    // Exactly one fleet token was spent: one instance culled, the other followed (or had
    // its claim answered as already held).
    let culled: f64 = ps.iter().map(|p| decisions(p, "culled")).sum();
    assert_eq!(culled, 1.0, "one cull decision across the fleet");
    let claim = redis.cmd(&["HGET", &cfg.claims_key("app"), &bad.addr()]);
    assert!(
        claim.parse::<u64>().is_ok(),
        "claim of {} in Redis: {claim:?}",
        bad.addr()
    );
    let tokens: f64 = redis
        .cmd(&["HGET", &cfg.tokens_key(), "t"])
        .parse()
        .expect("token bucket in Redis");
    assert!(
        (8.9..9.1).contains(&tokens),
        "one token taken from 10: {tokens}"
    );
    assert_eventually!(
        ps.iter()
            .all(|p| p.status_json()["culling"]["tokens_available"] == 9),
        "tokens_available 9 in /status"
    );
}

// ---------------------------------------------------------------------------------------
// 2. a culled backend gets no requests
// ---------------------------------------------------------------------------------------

#[test]
fn culled_backend_receives_no_requests_from_any_instance() {
    // cooldown 30 s: no probe during the test
    let (_redis, bs, _cfg, ps) = cull_fleet(2);
    let load = warm_load(&ps, 40);

    let bad = &bs[2];
    let run = fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    // Let any request that was already on its way finish, then take the baseline.
    load.wait_ok_after(&run.ejected, 5);
    let baseline = bad.requests();
    let baseline_clients = client_requests(bad);
    let others_before: Vec<u64> = bs.iter().map(Backend::requests).collect();
    load.wait_ok_after(&run.ejected, 300);
    let samples = load.finish();

    assert_eq!(
        client_requests(bad),
        baseline_clients,
        "the culled backend received client requests while traffic went on"
    );
    assert_eq!(bad.requests(), baseline, "no request at all reached it");
    for (i, b) in bs.iter().enumerate() {
        if b.name() != bad.name() {
            assert!(
                b.requests() > others_before[i] + 50,
                "{} kept receiving traffic ({} → {})",
                b.name(),
                others_before[i],
                b.requests()
            );
        }
    }
    for (i, t) in run.ejected.iter().enumerate() {
        let after: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.proxy == i && s.start > *t)
            .collect();
        assert!(after.len() >= 300);
        let wrong: Vec<&&Sample> = after
            .iter()
            .filter(|s| s.backend.as_deref() == Some(bad.name()) || !s.ok())
            .collect();
        assert!(
            wrong.is_empty(),
            "proxy {i}: after the ejection {} requests reached the culled backend or failed: {:?}",
            wrong.len(),
            tally(wrong.iter().map(|s| **s))
        );
    }
    eprintln!(
        "[culling] after ejection: {} requests through 2 instances, 0 reached the culled backend",
        samples
            .iter()
            .filter(|s| s.start > run.ejected[s.proxy])
            .count()
    );
}

// ---------------------------------------------------------------------------------------
// 3. client-visible errors during a cull
// ---------------------------------------------------------------------------------------

#[test]
fn client_visible_errors_during_a_cull_are_only_the_backends_own() {
    let (_redis, bs, _cfg, ps) = cull_fleet(2);
    let load = warm_load(&ps, 40);

    let bad = &bs[3];
    let run = fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    load.wait_ok_after(&run.ejected, 200);
    let samples = load.finish();

    // Before the failure: all fine.
    let warmup: Vec<&Sample> = samples.iter().filter(|s| s.end < run.t_fail).collect();
    assert!(
        warmup.iter().all(|s| s.ok()),
        "warm-up: {:?}",
        tally(warmup.iter().copied())
    );
    // Nothing the proxy made itself, ever: no 502/503/504 and no dropped connection.
    let proxy_made: Vec<&Sample> = samples
        .iter()
        .filter(|s| !(s.ok() || s.is_500_from(bad.name())))
        .collect();
    assert!(
        proxy_made.is_empty(),
        "responses not explained by the failing backend's own 500s: {:?}; e.g. {:?}",
        tally(proxy_made.iter().copied()),
        proxy_made.first()
    );
    let mut total_during = 0;
    for (i, t) in run.ejected.iter().enumerate() {
        let during: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.proxy == i && s.start >= run.t_fail && s.start <= *t)
            .collect();
        let errors = during.iter().filter(|s| !s.ok()).count();
        total_during += errors;
        let after_5xx = samples
            .iter()
            .filter(|s| s.proxy == i && s.start > *t && !s.ok())
            .count();
        eprintln!(
            "[culling] instance {i}: from failure to ejection ({}) clients saw {errors} non-2xx \
             of {} requests ({:?}); after ejection: {after_5xx} non-2xx of {}",
            secs(*t - run.t_fail),
            during.len(),
            tally(during.iter().copied()),
            samples
                .iter()
                .filter(|s| s.proxy == i && s.start > *t)
                .count()
        );
        assert_eq!(after_5xx, 0, "instance {i}: errors after the ejection");
    }
    eprintln!("[culling] client-visible errors during the cull (both instances): {total_during}");
    assert!(
        total_during as u64 >= THRESHOLD,
        "at least the threshold's worth of 500s passed through before the cull"
    );
}

#[test]
fn stopped_backend_is_culled_and_clients_see_no_errors() {
    let (_redis, mut bs, _cfg, ps) = cull_fleet(2);
    let load = warm_load(&ps, 40);

    // The backend goes away between two requests (a request it had already accepted
    // when killed would be a different failure: a reset mid-request, not a refused
    // connect), so the client threads pause while it stops. Its idle keep-alive
    // connections in the proxies' pools are closed with it.
    let mut samples = load.finish();
    let addr = bs[0].addr();
    let t_stop = Instant::now();
    bs[0].stop(); // connects are refused from now on
    let load = Load::start(&[ps[0].addr(), ps[1].addr()]);
    let ejected = wait_culled_everywhere(&ps, &addr, DEADLINE);
    load.wait_ok_after(&ejected, 100);
    samples.extend(load.finish());

    for (i, p) in ps.iter().enumerate() {
        assert_eq!(culled_gauge(p, &addr), Some(1.0), "proxy {i}");
    }
    assert_eq!(
        ps.iter().map(|p| decisions(p, "culled")).sum::<f64>(),
        1.0,
        "one instance culled it"
    );
    // Refused connects count as errors (the instances share their counts, so it is the
    // fleet's sum that reached the threshold).
    let fleet_errors: u64 = ps
        .iter()
        .map(|p| {
            backend_entry(p, &addr)["errors_in_window"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum();
    assert!(
        fleet_errors >= THRESHOLD,
        "refused connects count as errors: {fleet_errors} in the instances' windows"
    );
    let bad: Vec<&Sample> = samples.iter().filter(|s| !s.ok()).collect();
    eprintln!(
        "[culling] stopped backend: ejected {:?} after stop; clients saw {} non-2xx of {} \
         requests ({} during stop→ejection) {:?}",
        ejected
            .iter()
            .map(|e| secs(*e - t_stop))
            .collect::<Vec<_>>(),
        bad.len(),
        samples.len(),
        samples
            .iter()
            .filter(|s| s.start >= t_stop && s.start <= ejected[s.proxy])
            .count(),
        tally(bad.iter().copied())
    );
    assert!(
        bad.is_empty(),
        "a refused connect must be retried on another backend: {:?}; e.g. {:?}",
        tally(bad.iter().copied()),
        bad.first()
    );
    assert!(
        !samples
            .iter()
            .any(|s| s.start > t_stop && s.backend.as_deref() == Some("b0")),
        "nothing answered by the stopped backend"
    );
}

#[test]
fn hanging_backend_times_out_and_is_culled() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.read_timeout_ms = 300; // a timeout is an error too
    let ps = start_proxies(1, &cfg.render(&bs));
    let load = warm_load(&ps, 20);

    let bad = &bs[2];
    let t_hang = Instant::now();
    bad.set_mode(Mode::Hang);
    let ejected = wait_culled_everywhere(&ps, &bad.addr(), DEADLINE);
    load.wait_ok_after(&ejected, 100);
    let samples = load.finish();
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.start >= t_hang && s.start <= ejected[0])
        .collect();
    eprintln!(
        "[culling] hanging backend (read timeout 300 ms): ejected {} after it hung; clients saw \
         {:?} meanwhile",
        secs(ejected[0] - t_hang),
        tally(during.iter().copied())
    );
    let unexplained: Vec<&Sample> = samples
        .iter()
        .filter(|s| !s.ok() && s.status != Some(504))
        .collect();
    assert!(
        unexplained.is_empty(),
        "only the timeouts' 504s: {:?}",
        tally(unexplained.iter().copied())
    );
    assert!(
        during.iter().filter(|s| s.status == Some(504)).count() as u64 >= THRESHOLD,
        "timeouts were answered 504 and counted"
    );
    assert!(
        samples
            .iter()
            .filter(|s| s.start > ejected[0])
            .all(|s| s.ok()),
        "no timeout after the ejection"
    );
    assert_eq!(decisions(&ps[0], "culled"), 1.0);
}

// ---------------------------------------------------------------------------------------
// 4. the fleet token bucket
// ---------------------------------------------------------------------------------------

#[test]
fn without_a_token_a_second_failing_backend_is_not_culled() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.tokens = 1;
    cfg.token_period = 3600;
    cfg.window = 30;
    let ps = start_proxies(2, &cfg.render(&bs));
    let load = warm_load(&ps, 40);

    let first = &bs[0];
    fail_and_wait_cull(&ps, &load, first, Mode::Fail(500));
    let no_token_before: f64 = ps.iter().map(|p| decisions(p, "no_token")).sum();

    let second = &bs[1];
    second.set_mode(Mode::Fail(500));
    let t_second = Instant::now();
    assert_eventually!(
        ps.iter().map(|p| decisions(p, "no_token")).sum::<f64>() >= no_token_before + 3.0,
        "no_token decisions for the second failing backend"
    );
    for (i, p) in ps.iter().enumerate() {
        assert_eq!(state_of(p, &second.addr()), "up", "proxy {i}");
        // kept in rotation, and /status says why (the instance that asked last saw it)
        assert_eventually!(
            backend_entry(p, &second.addr())["failing"] == "no_token",
            "proxy {i}: failing: no_token: {}",
            backend_entry(p, &second.addr())
        );
        assert!(
            backend_entry(p, &first.addr())["failing"].is_null(),
            "culled: no reason"
        );
        assert_eq!(culled_gauge(p, &second.addr()), Some(0.0), "proxy {i}");
        assert_eq!(state_of(p, &first.addr()), "culled", "proxy {i}");
        assert_eq!(
            p.status_json()["culling"]["tokens_available"],
            0,
            "proxy {i}: the only token is spent"
        );
        assert_eq!(
            p.metric("portcullis_cull_tokens_available"),
            Some(0.0),
            "proxy {i}"
        );
    }
    let culled: f64 = ps.iter().map(|p| decisions(p, "culled")).sum();
    assert_eq!(culled, 1.0, "only the first backend was culled");
    assert_eq!(
        redis.cmd(&["HLEN", &cfg.claims_key("app")]),
        "1",
        "one claim in Redis"
    );
    // The second failing backend stays in rotation (its own 500s still reach clients).
    let second_hits = load.count(|s| s.start > t_second && s.backend.as_deref() == Some("b1"));
    assert!(second_hits > 0, "the un-culled backend still gets traffic");
    eprintln!(
        "[culling] tokens = 1: second failing backend kept in rotation, no_token decisions: {}",
        ps.iter().map(|p| decisions(p, "no_token")).sum::<f64>() - no_token_before
    );
}

// ---------------------------------------------------------------------------------------
// 5. upstream budget and the systemic guard
// ---------------------------------------------------------------------------------------

#[test]
fn all_backends_failing_alike_is_systemic_and_nothing_is_culled() {
    // max_culled_fraction 0.5 → at most 2 of 4
    let (redis, bs, cfg, ps) = cull_fleet(1);
    let p = &ps[0];
    let load = warm_load(&ps, 20);

    for b in &bs {
        b.set_mode(Mode::Fail(500));
    }
    let t_fail = Instant::now();
    // Every backend is past the threshold ...
    assert_eventually!(
        bs.iter()
            .all(|b| backend_entry(p, &b.addr())["errors_in_window"]
                .as_u64()
                .is_some_and(|n| n >= THRESHOLD)),
        "all four backends past the threshold"
    );
    // ... for several checks, each of which says "systemic".
    let systemic_then = decisions(p, "systemic");
    assert_eventually!(
        decisions(p, "systemic") >= systemic_then + 3.0,
        "systemic decisions while all four fail alike"
    );
    let culled = culled_in_status(p);
    assert!(culled.len() <= 2, "never more than max_culled_fraction out");
    assert!(
        culled.is_empty(),
        "the systemic guard culls none: {culled:?}"
    );
    for b in &bs {
        assert_eq!(culled_gauge(p, &b.addr()), Some(0.0), "{}", b.addr());
    }
    for r in ["culled", "no_token", "over_budget"] {
        assert_eq!(decisions(p, r), 0.0, "no claim was even tried: {r}");
    }
    assert_eq!(redis.cmd(&["EXISTS", &cfg.claims_key("app")]), "0");
    let line = log_events(p)
        .into_iter()
        .find(|e| e["result"] == "systemic" && e["upstream"] == "app")
        .unwrap_or_else(|| panic!("no systemic log line; logs:\n{}", p.logs()));
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["failing"], 4, "{line}");
    assert_eq!(line["total"], 4, "{line}");
    // Traffic is still served by everybody (no ejection): each backend answers.
    let samples = load.finish();
    for b in &bs {
        assert!(
            samples
                .iter()
                .any(|s| s.start > t_fail && s.backend.as_deref() == Some(b.name())),
            "{} still in rotation",
            b.name()
        );
    }
    eprintln!(
        "[culling] all 4 failing alike: 0 culled, systemic log: {}",
        line["message"]
    );
}

#[test]
fn two_failing_with_fraction_quarter_culls_only_one() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.fraction = 0.25; // floor(0.25 × 4) = 1 backend may be out
    cfg.window = 30;
    let ps = start_proxies(1, &cfg.render(&bs));
    let p = &ps[0];
    let _load = warm_load(&ps, 20);

    bs[1].set_mode(Mode::Fail(500));
    bs[2].set_mode(Mode::Fail(503));
    assert_eventually!(
        culled_in_status(p).len() == 1 && decisions(p, "over_budget") >= 1.0,
        "one culled and one over_budget decision (status {:?}, over_budget {})",
        culled_in_status(p),
        decisions(p, "over_budget")
    );
    let over = decisions(p, "over_budget");
    // The other one keeps being refused, check after check.
    assert_eventually!(
        decisions(p, "over_budget") >= over + 2.0,
        "more over_budget decisions"
    );
    let culled = culled_in_status(p);
    assert_eq!(culled.len(), 1, "still exactly one out: {culled:?}");
    assert!(
        culled[0] == bs[1].addr() || culled[0] == bs[2].addr(),
        "a failing one was culled: {culled:?}"
    );
    assert_eq!(decisions(p, "culled"), 1.0);
    assert_eq!(
        decisions(p, "systemic"),
        0.0,
        "two clearly failing of four is not systemic"
    );
    let kept = if culled[0] == bs[1].addr() {
        &bs[2]
    } else {
        &bs[1]
    };
    assert_eq!(state_of(p, &kept.addr()), "up");
    assert_eq!(culled_gauge(p, &kept.addr()), Some(0.0));
    eprintln!(
        "[culling] 2 of 4 failing, fraction 0.25: culled {culled:?}, over_budget decisions {}",
        decisions(p, "over_budget")
    );
}

// ---------------------------------------------------------------------------------------
// 6. Redis down: no culls, traffic served
// ---------------------------------------------------------------------------------------

#[test]
fn with_redis_down_nothing_is_culled_and_traffic_is_served() {
    let (mut redis, bs, _cfg, ps) = cull_fleet(1);
    let p = &ps[0];
    let load = warm_load(&ps, 20);
    // The budget store answered at least once (the gauge comes from a snapshot).
    assert_eventually!(p.metric("portcullis_cull_tokens_available") == Some(10.0));

    redis.kill();
    let bad = &bs[1];
    bad.set_mode(Mode::Fail(500));
    let t_fail = Instant::now();
    assert_eventually!(
        decisions(p, "store_error") >= 3.0,
        "store_error decisions while Redis is down"
    );
    assert!(
        backend_entry(p, &bad.addr())["errors_in_window"]
            .as_u64()
            .is_some_and(|n| n >= THRESHOLD),
        "the backend is a candidate"
    );
    assert!(culled_in_status(p).is_empty(), "no cull without the store");
    assert_eventually!(
        backend_entry(p, &bad.addr())["failing"] == "store_error",
        "failing: store_error: {}",
        backend_entry(p, &bad.addr())
    );
    assert_eq!(culled_gauge(p, &bad.addr()), Some(0.0));
    assert_eq!(decisions(p, "culled"), 0.0);
    load.wait_ok_after(&[Instant::now()], 100);
    let during: Vec<Sample> = load
        .samples()
        .into_iter()
        .filter(|s| s.start > t_fail)
        .collect();
    let unexplained: Vec<&Sample> = during
        .iter()
        .filter(|s| !(s.ok() || s.is_500_from("b1")))
        .collect();
    eprintln!(
        "[culling] Redis down: {} store_error decisions, {} requests served {:?}",
        decisions(p, "store_error"),
        during.len(),
        tally(&during)
    );
    assert!(
        unexplained.is_empty(),
        "traffic must be served while Redis is down: {:?}",
        tally(unexplained.iter().copied())
    );

    // Redis back: the still-failing backend is culled now.
    redis.restart();
    let ejected = wait_culled_everywhere(&ps, &bad.addr(), DEADLINE);
    assert_eq!(decisions(p, "culled"), 1.0);
    eprintln!(
        "[culling] Redis back: culled {} after the failure began",
        secs(ejected[0] - t_fail)
    );
}

#[test]
fn with_redis_down_an_existing_cull_ends_with_its_lease_on_every_instance() {
    let mut redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.cooldown = 3; // lease = 5 s
    let lease = cfg.lease_ttl();
    let ps = start_proxies(2, &cfg.render(&bs));
    let load = warm_load(&ps, 40);

    let bad = &bs[1];
    fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    let culled_before: f64 = ps.iter().map(|p| decisions(p, "culled")).sum();
    // The store goes away and the backend recovers. Nobody can renew or read the claim
    // now, so it lapses after at most one lease: no instance may keep the (healthy)
    // backend out longer than that.
    redis.kill();
    let t_kill = Instant::now();
    bad.set_mode(Mode::Ok);
    let mut back: Vec<Option<Instant>> = vec![None; ps.len()];
    let bound = lease + 2 * INTERVAL + Duration::from_secs(2);
    let ok = wait_until(bound, || {
        for (i, p) in ps.iter().enumerate() {
            if back[i].is_none() && state_of(p, &bad.addr()) == "up" {
                back[i] = Some(Instant::now());
            }
        }
        back.iter().all(Option::is_some)
    });
    eprintln!(
        "[culling] Redis down after a cull (lease {lease:?}): back in rotation per instance \
         after {:?}",
        back.iter()
            .map(|b| b.map(|t| secs(t - t_kill)))
            .collect::<Vec<_>>()
    );
    assert!(
        ok,
        "with Redis down, an instance kept {} culled longer than the lease ({bound:?}): {back:?}",
        bad.addr()
    );
    assert_eq!(
        ps.iter().map(|p| decisions(p, "culled")).sum::<f64>(),
        culled_before,
        "no new cull while Redis is down"
    );
    for (i, t) in back.iter().flatten().enumerate() {
        let t = *t;
        load.wait_for(
            5,
            &format!("answered by {} via proxy {i}", bad.name()),
            |s| s.proxy == i && s.start > t && s.ok() && s.backend.as_deref() == Some("b1"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// 7. in-flight requests to a culled backend complete
// ---------------------------------------------------------------------------------------

#[test]
fn slow_requests_in_flight_at_ejection_complete_with_200() {
    let (_redis, bs, _cfg, ps) = cull_fleet(1);
    let p = &ps[0];
    let bad = &bs[1];

    // Requests that reach `bad` now take 8 s (the mode is read when a request arrives, so
    // they stay slow whatever happens next).
    bad.set_mode(Mode::Slow(Duration::from_secs(8)));
    let mut slow: Vec<JoinHandle<(Resp, Instant)>> = Vec::new();
    let ok = wait_until(DEADLINE, || {
        if bad.in_flight() >= 3 {
            return true;
        }
        // One more request; round robin sends every fourth one to `bad`.
        let before: u64 = bs.iter().map(Backend::requests).sum();
        let addr = p.addr();
        slow.push(thread::spawn(move || {
            let r = get(&addr, "/slow", &[]);
            (r, Instant::now())
        }));
        wait_until(Duration::from_secs(5), || {
            bs.iter().map(Backend::requests).sum::<u64>() > before
        });
        false
    });
    assert!(
        ok,
        "could not get 3 slow requests in flight to {}",
        bad.name()
    );
    assert!(bad.in_flight() >= 3);

    // Now it fails fast for everything new, and client traffic gets it culled.
    let load = Load::start(&[p.addr()]);
    let run = fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    let in_flight_at_ejection = bad.in_flight();
    assert!(
        in_flight_at_ejection >= 3,
        "the slow requests were still in flight when it was culled ({in_flight_at_ejection})"
    );
    let results: Vec<(Resp, Instant)> = slow
        .into_iter()
        .map(|h| h.join().expect("slow client"))
        .collect();
    let samples = load.finish();
    let mut completed_after = 0;
    for (r, end) in &results {
        assert_eq!(
            r.status,
            200,
            "an in-flight request completes: {} from {:?}",
            r.body_str(),
            r.header("x-backend")
        );
        if r.header("x-backend") == Some(bad.name()) && *end > run.ejected[0] {
            completed_after += 1;
        }
    }
    assert!(
        completed_after >= 3,
        "≥ 3 slow requests answered by the culled backend after its ejection"
    );
    assert!(
        !samples
            .iter()
            .any(|s| s.start > run.ejected[0] && s.backend.as_deref() == Some(bad.name())),
        "no new request reached it"
    );
    eprintln!(
        "[culling] {in_flight_at_ejection} slow requests in flight at ejection ({} after the \
         failure began); {completed_after} completed with 200 after it",
        secs(run.ejected[0] - run.t_fail)
    );
}

// ---------------------------------------------------------------------------------------
// 8. readmission after the cooldown
// ---------------------------------------------------------------------------------------

#[test]
fn recovered_backend_is_readmitted_after_cooldown() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.cooldown = 2;
    let ps = start_proxies(2, &cfg.render(&bs));
    let load = warm_load(&ps, 40);

    let bad = &bs[1];
    let run = fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    bad.set_mode(Mode::Ok);
    let t_ok = Instant::now();
    let mut back: Vec<Option<Instant>> = vec![None; ps.len()];
    assert_eventually!(
        {
            for (i, p) in ps.iter().enumerate() {
                if back[i].is_none() && state_of(p, &bad.addr()) == "up" {
                    back[i] = Some(Instant::now());
                }
            }
            back.iter().all(Option::is_some)
        },
        "readmitted on both instances ({back:?})"
    );
    let back: Vec<Instant> = back.into_iter().flatten().collect();
    let first_back = *back.iter().min().expect("readmissions");
    let since_cull = first_back - *run.ejected.iter().min().expect("ejections");
    assert!(
        since_cull + OBSERVE_SLACK >= Duration::from_secs(cfg.cooldown),
        "not before the cooldown: {since_cull:?}"
    );
    // An instance can read the backend `up` in the fleet's state (another instance
    // readmitted it) a moment before its own readmission is counted: both are awaited.
    for (i, p) in ps.iter().enumerate() {
        assert_eventually!(
            decisions(p, "readmitted") >= 1.0,
            "proxy {i}: readmitted decision"
        );
        assert_eventually!(
            culled_gauge(p, &bad.addr()) == Some(0.0),
            "proxy {i}: culled gauge"
        );
    }
    assert!(!probes(bad).is_empty(), "it was probed before readmission");
    assert!(
        probes(bad).iter().all(|r| r.path == "/"),
        "without health_check_path the probe is GET /"
    );
    assert_eq!(
        redis.cmd(&["HEXISTS", &cfg.claims_key("app"), &bad.addr()]),
        "0"
    );
    // Both instances send it client traffic again.
    for (i, t) in back.iter().enumerate() {
        let t = *t;
        load.wait_for(
            10,
            &format!("answered by {} via proxy {i}", bad.name()),
            |s| s.proxy == i && s.start > t && s.ok() && s.backend.as_deref() == Some("b1"),
        );
    }
    eprintln!(
        "[culling] readmitted {} after the cull (cooldown {} s), {} after recovery",
        secs(since_cull),
        cfg.cooldown,
        secs(first_back.saturating_duration_since(t_ok))
    );
}

#[test]
fn readmission_probe_uses_health_check_path() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.cooldown = 2;
    cfg.health_path = "/health".into();
    let ps = start_proxies(1, &cfg.render(&bs));
    let p = &ps[0];
    let load = warm_load(&ps, 20);

    let bad = &bs[2];
    fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    // 404 is "healthy" for the default probe (below 500) but not for a health check
    // path (wants 2xx): it must stay culled.
    bad.set_mode(Mode::Fail(404));
    assert_eventually!(
        probes(bad).iter().any(|r| r.path == "/health"),
        "probe on /health"
    );
    assert_eventually!(
        log_events(p)
            .iter()
            .any(|e| e["message"] == "probe after cooldown" && e["healthy"] == false),
        "an unhealthy probe result"
    );
    assert_eq!(
        state_of(p, &bad.addr()),
        "culled",
        "a 404 on the health path keeps it out"
    );
    assert_eq!(decisions(p, "readmitted"), 0.0);

    bad.set_mode(Mode::Ok);
    assert_eventually!(
        state_of(p, &bad.addr()) == "up",
        "readmitted once /health answers 2xx"
    );
    assert!(decisions(p, "readmitted") >= 1.0);
    let paths: Vec<String> = probes(bad).into_iter().map(|r| r.path).collect();
    assert!(
        paths.iter().all(|x| x == "/health"),
        "every probe used the health check path: {paths:?}"
    );
    let t = Instant::now();
    load.wait_for(10, "answered by the readmitted backend", |s| {
        s.start > t && s.ok() && s.backend.as_deref() == Some("b2")
    });
    eprintln!("[culling] health-path probes: {paths:?}");
}

// ---------------------------------------------------------------------------------------
// 9. a cull is a lease
// ---------------------------------------------------------------------------------------

#[test]
fn lease_expires_by_itself_when_every_proxy_dies() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.cooldown = 3; // lease = max(3 × 1, 3 + 2 × 1) = 5 s
    let lease = cfg.lease_ttl();
    let mut ps = start_proxies(2, &cfg.render(&bs));
    let load = warm_load(&ps, 40);

    let bad = &bs[0];
    fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    drop(load);
    let key = cfg.claims_key("app");
    let field = bad.addr();

    for p in &mut ps {
        p.kill();
    }
    let t_kill = Instant::now();
    let redis_now_ms = || -> u64 {
        let t = redis.cmd(&["TIME"]);
        let mut it = t.lines().map(|l| l.trim().parse::<u64>().unwrap_or(0));
        let (s, us) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        s * 1000 + us / 1000
    };
    let expiry: u64 = redis
        .cmd(&["HGET", &key, &field])
        .parse()
        .unwrap_or_else(|_| panic!("the claim is still there right after the kill"));
    let remaining = expiry.saturating_sub(redis_now_ms());
    assert!(
        remaining > 0 && remaining <= lease.as_millis() as u64,
        "a live lease of at most {lease:?} ({remaining} ms left)"
    );
    let key_ttl_ms: i64 = redis.cmd(&["PTTL", &key]).parse().expect("PTTL");
    assert!(
        key_ttl_ms > 0 && key_ttl_ms as u128 <= lease.as_millis() + 1000,
        "the claims key has a TTL ({key_ttl_ms} ms)"
    );

    let mut lapsed_at = None;
    let bound = lease + Duration::from_secs(1) + Duration::from_secs(5);
    let gone = wait_until(bound, || {
        if lapsed_at.is_none() && redis_now_ms() >= expiry {
            lapsed_at = Some(Instant::now());
        }
        redis.cmd(&["HEXISTS", &key, &field]) == "0"
    });
    let gone_after = t_kill.elapsed();
    assert!(
        gone,
        "claim of {field} still in Redis {bound:?} after every proxy died: {}",
        redis.cmd(&["HGETALL", &key])
    );
    assert_eq!(
        redis.cmd(&["EXISTS", &key]),
        "0",
        "the key expired as a whole"
    );
    eprintln!(
        "[culling] lease TTL {lease:?}: {remaining} ms left at kill; lease lapsed after {}, \
         claim gone from Redis after {}",
        lapsed_at.map_or("?".into(), |t| secs(t - t_kill)),
        secs(gone_after)
    );
    assert!(
        gone_after <= lease + Duration::from_secs(2),
        "gone within lease + 1 s: {gone_after:?}"
    );
}

#[test]
fn when_the_holder_dies_the_lease_lapses_and_a_survivor_takes_over() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.cooldown = 3; // lease 5 s
    let lease = cfg.lease_ttl();
    let conf = cfg.render(&bs);
    let mut ps = start_proxies(1, &conf);
    let load = warm_load(&ps, 20);

    let bad = &bs[3];
    fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    drop(load);
    // A second instance joins and follows the claim (it never claims it itself).
    ps.push(Proxy::start(&conf));
    wait_culled_everywhere(&ps, &bad.addr(), DEADLINE);
    assert_eq!(
        decisions(&ps[1], "culled") + decisions(&ps[1], "renewed"),
        0.0
    );
    let (holder, survivor) = (0, 1);
    let key = cfg.claims_key("app");
    let old_expiry: u64 = redis
        .cmd(&["HGET", &key, &bad.addr()])
        .parse()
        .expect("claim");
    ps[holder].kill();
    let t_kill = Instant::now();
    let load = Load::start(&[ps[survivor].addr()]);
    let p = &ps[survivor];
    // Nobody renews the dead holder's claim: the survivor follows it until it lapses,
    // readmits, sees the backend still failing and culls it under its own claim.
    let mut readmitted_at = None;
    assert_eventually!(
        {
            if readmitted_at.is_none() && decisions(p, "readmitted") >= 1.0 {
                readmitted_at = Some(Instant::now());
            }
            decisions(p, "culled") >= 1.0 && state_of(p, &bad.addr()) == "culled"
        },
        "the survivor culls it again once the lease lapsed"
    );
    let t_recull = Instant::now();
    let readmitted_at = readmitted_at.expect("readmitted before the new cull");
    let new_expiry: u64 = redis
        .cmd(&["HGET", &key, &bad.addr()])
        .parse()
        .expect("new claim");
    assert!(
        new_expiry > old_expiry,
        "a new lease ({old_expiry} → {new_expiry})"
    );
    let out_for = readmitted_at - t_kill;
    assert!(
        out_for <= lease + 2 * INTERVAL + OBSERVE_SLACK,
        "the dead holder's cull lasted {out_for:?} after its death (lease {lease:?})"
    );
    let samples = load.finish();
    eprintln!(
        "[culling] holder killed: survivor readmitted after {}, re-culled after {}; clients \
         meanwhile {:?}",
        secs(out_for),
        secs(t_recull - t_kill),
        tally(&samples)
    );
}

// ---------------------------------------------------------------------------------------
// 10. dry run
// ---------------------------------------------------------------------------------------

#[test]
fn dry_run_reports_but_keeps_the_backend_in_rotation() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.dry_run = true;
    cfg.window = 4; // so that the report clears soon after recovery
    let ps = start_proxies(1, &cfg.render(&bs));
    let p = &ps[0];
    let load = warm_load(&ps, 20);

    let bad = &bs[3];
    bad.set_mode(Mode::Fail(500));
    assert_eventually!(decisions(p, "dry_run") >= 1.0, "a dry_run decision");
    assert_eventually!(
        backend_entry(p, &bad.addr())["dry_run_culled"] == true,
        "dry_run_culled in /status"
    );
    let t = Instant::now();
    let before = client_requests(bad);
    assert_eventually!(decisions(p, "dry_run") >= 3.0, "decided again each check");
    load.wait_for(20, "answered by the dry-run-culled backend", |s| {
        s.start > t && s.backend.as_deref() == Some("b3")
    });
    assert!(
        client_requests(bad) >= before + 20,
        "it still receives traffic"
    );
    let e = backend_entry(p, &bad.addr());
    assert_eq!(e["state"], "up", "{e}");
    assert_eq!(e["dry_run_culled"], true, "{e}");
    assert_eq!(e["failing"], "dry_run", "{e}");
    assert_eq!(p.status_json()["culling"]["dry_run"], true);
    assert_eq!(culled_gauge(p, &bad.addr()), Some(0.0));
    assert_eq!(decisions(p, "culled"), 0.0);
    assert_eq!(
        redis.cmd(&["EXISTS", &cfg.claims_key("app")]),
        "0",
        "dry run writes no claim"
    );
    assert_eq!(
        p.metric("portcullis_cull_tokens_available"),
        Some(10.0),
        "and spends no token"
    );

    // Recovered: once its errors have left the window, the dry-run report clears
    // (it says what culling would do now, not what it once would have done).
    bad.set_mode(Mode::Ok);
    let t_ok = Instant::now();
    assert_eventually!(
        backend_entry(p, &bad.addr())["dry_run_culled"] == false,
        "dry_run_culled cleared after recovery: {}",
        backend_entry(p, &bad.addr())
    );
    assert_eventually!(
        backend_entry(p, &bad.addr())["failing"].is_null(),
        "failing cleared after recovery: {}",
        backend_entry(p, &bad.addr())
    );
    eprintln!(
        "[culling] dry run: report cleared {} after recovery (window {} s)",
        secs(t_ok.elapsed()),
        cfg.window
    );
}

// ---------------------------------------------------------------------------------------
// 11. webhook
// ---------------------------------------------------------------------------------------

#[test]
fn webhook_receives_a_post_on_cull() {
    let redis = RedisServer::start();
    let bs = four_backends();
    let hook = Backend::start("hook");
    let mut cfg = CullCfg::new(Some(&redis));
    cfg.webhook = format!("http://{}/hooks/cull", hook.addr());
    let ps = start_proxies(1, &cfg.render(&bs));
    let load = warm_load(&ps, 20);

    let bad = &bs[0];
    fail_and_wait_cull(&ps, &load, bad, Mode::Fail(502));
    assert_eventually!(!hook.received().is_empty(), "webhook called");
    let calls = hook.received();
    assert_eq!(calls.len(), 1, "one call for one cull: {calls:?}");
    let call = &calls[0];
    assert_eq!(call.method, "POST");
    assert_eq!(call.path, "/hooks/cull");
    assert!(
        call.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{:?}",
        call.headers
    );
    let body: Value = serde_json::from_slice(&call.body).unwrap_or_else(|e| {
        panic!(
            "webhook body is not JSON ({e}): {}",
            String::from_utf8_lossy(&call.body)
        )
    });
    assert_eq!(body["upstream"], "app", "{body}");
    assert_eq!(body["backend"], bad.addr().as_str(), "{body}");
    assert!(
        body["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{body}"
    );
    assert!(
        body["errors"].as_u64().is_some_and(|n| n >= THRESHOLD),
        "{body}"
    );
    eprintln!("[culling] webhook body: {body}");
}

// ---------------------------------------------------------------------------------------
// 12. single instance, in-process budget
// ---------------------------------------------------------------------------------------

#[test]
fn without_redis_a_failing_backend_is_culled_too() {
    let bs = four_backends();
    let cfg = CullCfg::new(None);
    let ps = start_proxies(1, &cfg.render(&bs));
    let p = &ps[0];
    let load = warm_load(&ps, 20);

    let bad = &bs[2];
    let run = fail_and_wait_cull(&ps, &load, bad, Mode::Fail(500));
    let took = run.ejected[0].saturating_duration_since(run.detected);
    assert!(
        took <= 2 * INTERVAL + OBSERVE_SLACK,
        "in-process budget: ejection {took:?} after the threshold"
    );
    assert_eq!(culled_gauge(p, &bad.addr()), Some(1.0));
    assert_eq!(decisions(p, "culled"), 1.0);
    assert_eq!(culled_in_status(p), vec![bad.addr()]);
    assert_eventually!(
        p.status_json()["culling"]["tokens_available"] == 9,
        "a token was taken from the in-process bucket"
    );
    load.wait_ok_after(&run.ejected, 50);
    let samples = load.finish();
    assert!(
        !samples
            .iter()
            .any(|s| s.start > run.ejected[0] && (s.backend.as_deref() == Some("b2") || !s.ok())),
        "after the cull only the healthy backends answer"
    );
    eprintln!("[culling] without Redis: threshold→ejection {}", secs(took));
}
