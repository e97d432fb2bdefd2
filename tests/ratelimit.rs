//! Rate limiting with the in-process store (no `[redis]`): CONTRACT §2 `[rate_limit]`,
//! §3 (429 / 401 / 400 and their fields), §4 (metrics), §5.2 and §5.6.
//!
//! Timing-sensitive tests use a 2 s window and compute what they expect from the wall clock
//! (windows are aligned to the Unix epoch), never from fixed sleeps. Counting tests use a
//! one-hour window so that no window boundary can change the outcome.

use portcullis_test_kit as support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use support::*;

// ---------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------

/// A config with one upstream, culling off, and the given `[rate_limit]` section(s).
fn config(b: &Backend, rate_limit: &str) -> String {
    format!(
        r#"
[[upstreams]]
name = "app"
backends = ["{}"]

[culling]
enabled = false

{rate_limit}
"#,
        b.addr()
    )
}

/// A proxy limiting to `limit` requests per `window_seconds`, plus `extra` `[rate_limit]` keys.
fn limited(b: &Backend, window_seconds: u64, limit: u64, extra: &str) -> Proxy {
    Proxy::start(&config(
        b,
        &format!("[rate_limit]\nwindow_seconds = {window_seconds}\nlimit = {limit}\n{extra}\n"),
    ))
}

/// A parsed structured-field item `"<name>";k=v;k=v`.
#[derive(Debug)]
struct SfItem {
    name: String,
    params: HashMap<String, String>,
}

impl SfItem {
    fn parse(v: &str) -> SfItem {
        let mut parts = v.split(';');
        let name = parts.next().unwrap_or("").trim();
        assert!(
            name.len() >= 2 && name.starts_with('"') && name.ends_with('"'),
            "field value does not start with an sf-string: {v:?}"
        );
        let params = parts
            .map(|p| {
                let (k, val) = p
                    .trim()
                    .split_once('=')
                    .unwrap_or_else(|| panic!("parameter without value in {v:?}"));
                (k.trim().to_string(), val.trim().to_string())
            })
            .collect();
        SfItem {
            name: name[1..name.len() - 1].to_string(),
            params,
        }
    }

    fn int(&self, k: &str) -> u64 {
        let v = self
            .params
            .get(k)
            .unwrap_or_else(|| panic!("parameter {k} missing in {self:?}"));
        v.parse()
            .unwrap_or_else(|_| panic!("parameter {k}={v:?} is not a non-negative integer"))
    }
}

fn policy(r: &Resp) -> SfItem {
    SfItem::parse(
        r.header("ratelimit-policy")
            .unwrap_or_else(|| panic!("no RateLimit-Policy field: {r:?}")),
    )
}

fn ratelimit(r: &Resp) -> SfItem {
    SfItem::parse(
        r.header("ratelimit")
            .unwrap_or_else(|| panic!("no RateLimit field: {r:?}")),
    )
}

/// Asserts a complete 429 of the rate limiter: status, integer `Retry-After` >= 1, both
/// RateLimit fields (`q`, `w`, `r=0`, `t`), a short plain body. Returns Retry-After.
fn assert_limited(r: &Resp, name: Option<&str>, limit: u64, window: u64) -> u64 {
    assert_eq!(r.status, 429, "expected 429: {r:?}");
    let ra = r
        .retry_after()
        .unwrap_or_else(|| panic!("429 without an integer Retry-After: {r:?}"));
    assert!(ra >= 1, "Retry-After must be >= 1: {r:?}");
    assert!(
        ra <= 2 * window,
        "Retry-After {ra} is more than two windows ({window} s each)"
    );
    let p = policy(r);
    let rl = ratelimit(r);
    if let Some(n) = name {
        assert_eq!(p.name, n, "RateLimit-Policy name");
        assert_eq!(rl.name, n, "RateLimit name");
    }
    assert_eq!(p.name, rl.name, "both fields name the same policy");
    assert_eq!(p.int("q"), limit, "RateLimit-Policy q");
    assert_eq!(p.int("w"), window, "RateLimit-Policy w");
    assert_eq!(rl.int("r"), 0, "RateLimit r on a 429");
    assert_eq!(
        rl.int("t"),
        ra,
        "RateLimit t on a 429 = seconds until r >= 1 again = Retry-After"
    );
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain")),
        "429 body is plain text: {r:?}"
    );
    assert!(
        r.body.len() < 200 && r.body_str().to_ascii_lowercase().contains("rate"),
        "429 body is short and names the rate limiter: {:?}",
        r.body_str()
    );
    ra
}

fn assert_no_ratelimit_fields(r: &Resp) {
    assert!(
        r.header("ratelimit").is_none() && r.header("ratelimit-policy").is_none(),
        "unexpected RateLimit fields: {r:?}"
    );
}

/// Sends `n` GETs with `headers` on one keep-alive connection; returns the statuses.
fn statuses(addr: &str, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut c = Conn::open(addr).expect("connect to proxy");
    (0..n)
        .map(|_| {
            c.request("GET", path, headers, b"")
                .expect("request")
                .status
        })
        .collect()
}

fn count(v: &[u16], s: u16) -> usize {
    v.iter().filter(|&&x| x == s).count()
}

fn key_hdr(k: &str) -> [(&str, &str); 1] {
    [("x-api-key", k)]
}

/// Timestamped request on a connection: (send ms, response, receive ms).
fn timed(c: &mut Conn, headers: &[(&str, &str)]) -> (u64, Resp, u64) {
    let s = now_ms();
    let r = c.request("GET", "/", headers, b"").expect("request");
    (s, r, now_ms())
}

// ---------------------------------------------------------------------------------------
// §3: the 429 and its fields, RateLimit on admitted responses
// ---------------------------------------------------------------------------------------

/// limit 3 / window 2 s. A fresh key gets 3 requests at the start of window W; the fourth is
/// refused. By the contract's window math the key is admitted again at the first instant of
/// W+1 where `3 × (1 − elapsed/2000) + 1 ≤ 3`, i.e. elapsed ≥ 666.67 ms: A = start(W+1) +
/// 667 ms. Retry-After must be the whole seconds (rounded up) from the refusal to A; polling
/// confirms the key is refused until A and admitted from then on.
#[test]
fn limited_response_fields_and_exact_retry_after() {
    let b = Backend::start("app");
    let p = limited(&b, 2, 3, "policy_name = \"edge\"");
    const W: u64 = 2000;
    for attempt in 0..3 {
        let key = format!("retry-key-{attempt}");
        let h = key_hdr(&key);
        let win = wait_window_phase(W, 20, 300);
        let mut c = Conn::open(&p.addr()).expect("connect");
        let admitted: Vec<(u64, Resp, u64)> = (0..3).map(|_| timed(&mut c, &h)).collect();
        let (s429, r429, t429) = timed(&mut c, &h);
        if admitted[0].0 / W != win || t429 / W != win {
            eprintln!("attempt {attempt}: the burst crossed a window boundary; again");
            continue;
        }

        // Admitted responses: 200, both fields, r decreasing 2, 1, 0.
        let mut rs = Vec::new();
        for (_, r, _) in &admitted {
            assert_eq!(r.status, 200, "admitted: {r:?}");
            let pol = policy(r);
            assert_eq!(pol.name, "edge");
            assert_eq!((pol.int("q"), pol.int("w")), (3, 2), "policy {pol:?}");
            let rl = ratelimit(r);
            assert_eq!(rl.name, "edge");
            let t = rl.int("t");
            assert!((1..=4).contains(&t), "t on an admitted response: {rl:?}");
            rs.push(rl.int("r"));
        }
        assert_eq!(rs, vec![2, 1, 0], "remaining r on admitted responses");

        // The 429.
        let ra = assert_limited(&r429, Some("edge"), 3, 2);
        let a = (win + 1) * W + 667;
        let ra_hi = (a - s429).div_ceil(1000);
        let ra_lo = (a - t429).div_ceil(1000);
        eprintln!(
            "429 at elapsed {} ms of its window: Retry-After {ra} (expected {ra_lo}..={ra_hi}); \
             admission expected {} ms after it",
            s429 % W,
            a - t429
        );
        assert!(
            (ra_lo..=ra_hi).contains(&ra),
            "Retry-After {ra}: expected the whole seconds from the refusal to the next \
             admission ({ra_lo}..={ra_hi})"
        );

        // Poll until admitted; refused (429, fields intact) until then. The key became
        // admissible at some instant after the last refused poll was sent and before the
        // admitted one was answered: that bracket must hold A, and meet Retry-After ± 1 s.
        let deadline = Instant::now() + Duration::from_secs(ra + 5);
        let mut last_ra = ra;
        let mut last_refused_send = s429;
        let ok_recv = loop {
            assert!(Instant::now() < deadline, "never admitted again");
            let (s, r, t) = timed(&mut c, &h);
            if r.status == 200 {
                break t;
            }
            let ra_now = assert_limited(&r, Some("edge"), 3, 2);
            assert!(
                ra_now <= last_ra,
                "Retry-After grew while waiting: {last_ra} -> {ra_now}"
            );
            last_ra = ra_now;
            last_refused_send = s;
            thread::sleep(Duration::from_millis(10));
        };
        eprintln!(
            "admissible again between {} and {} ms after the 429 (Retry-After {ra}; the window \
             math says {} ms)",
            last_refused_send.saturating_sub(t429),
            ok_recv - t429,
            a - t429
        );
        assert!(
            ok_recv >= a,
            "admitted {} ms before the sliding window allows it",
            a - ok_recv
        );
        assert!(
            last_refused_send < a + 2,
            "refused {} ms after the sliding window allows the key again",
            last_refused_send - a
        );
        assert!(
            ok_recv - s429 >= ra.saturating_sub(1) * 1000,
            "admitted {} ms after a Retry-After of {ra} s",
            ok_recv - s429
        );
        assert!(
            last_refused_send.saturating_sub(t429) <= (ra + 1) * 1000,
            "still refused {} ms after a Retry-After of {ra} s",
            last_refused_send - t429
        );
        assert_eq!(
            b.requests(),
            4,
            "only the 4 admitted requests reached the backend"
        );
        return;
    }
    panic!("could not fit 4 requests into one 2 s window in 3 attempts");
}

/// `headers = false`: admitted responses carry no RateLimit fields; a 429 still carries both
/// (§3 "must carry").
#[test]
fn headers_false_omits_fields_on_admitted_responses_only() {
    let b = Backend::start("app");
    let p = limited(&b, 3600, 2, "headers = false");
    let mut c = Conn::open(&p.addr()).expect("connect");
    for _ in 0..2 {
        let r = c.request("GET", "/", &key_hdr("k"), b"").expect("request");
        assert_eq!(r.status, 200);
        assert_no_ratelimit_fields(&r);
    }
    let r = c.request("GET", "/", &key_hdr("k"), b"").expect("request");
    assert_limited(&r, None, 2, 3600);
    assert_eq!(b.requests(), 2);
    // §4: without [redis] the store is the in-process one, always healthy.
    let st = p.status_json();
    assert_eq!(st["rate_limit"]["store"], "local", "/status {st}");
    assert_eq!(st["rate_limit"]["store_healthy"], true, "/status {st}");
    assert_eq!(p.metric("portcullis_ratelimit_store_healthy"), Some(1.0));
}

// ---------------------------------------------------------------------------------------
// §2 [rate_limit.keys]
// ---------------------------------------------------------------------------------------

#[test]
fn per_key_overrides() {
    let b = Backend::start("app");
    let p = limited(&b, 3600, 3, "[rate_limit.keys]\n\"vip\" = 7\n\"tiny\" = 1");
    let addr = p.addr();
    let vip = statuses(&addr, "/", &key_hdr("vip"), 10);
    let tiny = statuses(&addr, "/", &key_hdr("tiny"), 4);
    let regular = statuses(&addr, "/", &key_hdr("regular"), 10);
    let other = statuses(&addr, "/", &key_hdr("VIP"), 10); // keys are case-sensitive
    assert_eq!(vip, [[200; 7].as_slice(), &[429; 3]].concat(), "vip");
    assert_eq!(tiny, vec![200, 429, 429, 429], "tiny");
    assert_eq!(
        regular,
        [[200; 3].as_slice(), &[429; 7]].concat(),
        "regular"
    );
    assert_eq!(count(&other, 200), 3, "VIP (not an override key)");
    assert_eq!(b.requests(), 7 + 1 + 3 + 3);

    // The fields carry each key's own limit.
    let r = get(&addr, "/", &key_hdr("vip"));
    assert_limited(&r, None, 7, 3600);
    let r = get(&addr, "/", &key_hdr("fresh"));
    assert_eq!(r.status, 200);
    assert_eq!(policy(&r).int("q"), 3);
    assert_eq!(ratelimit(&r).int("r"), 2);
}

// ---------------------------------------------------------------------------------------
// §2 missing_key
// ---------------------------------------------------------------------------------------

#[test]
fn missing_key_client_ip_limits_by_address() {
    let b = Backend::start("app");
    let p = limited(&b, 3600, 3, "missing_key = \"client_ip\"");
    let addr = p.addr();
    // Requests without a key share the client address's quota, across connections.
    let mut st = statuses(&addr, "/", &[], 2);
    st.extend(statuses(&addr, "/", &[], 3));
    st.push(get(&addr, "/", &[("x-api-key", "")]).status); // empty key = missing
    assert_eq!(st, vec![200, 200, 200, 429, 429, 429], "keyless requests");
    let r = get(&addr, "/", &[]);
    assert_limited(&r, None, 3, 3600);
    // A keyed request from the same address has its own quota.
    let keyed = statuses(&addr, "/", &key_hdr("k1"), 4);
    assert_eq!(keyed, vec![200, 200, 200, 429], "keyed requests");
    assert_eq!(b.requests(), 6);
}

#[test]
fn missing_key_reject_answers_401_without_reaching_the_backend() {
    let b = Backend::start("app");
    let p = limited(&b, 3600, 3, "missing_key = \"reject\"");
    let addr = p.addr();
    let before = p
        .metric("portcullis_requests_total{outcome=\"rejected\"}")
        .unwrap_or(0.0);
    for headers in [
        vec![],
        vec![("x-api-key", "")],
        vec![("x-api-key", "   ")],
        vec![("authorization", "Bearer abc")], // another source than the configured one
    ] {
        for _ in 0..2 {
            let r = get(&addr, "/", &headers);
            assert_eq!(r.status, 401, "headers {headers:?}: {r:?}");
            assert!(r.body.len() < 200, "short body");
        }
    }
    assert_eq!(b.requests(), 0, "rejected requests never reach the backend");
    assert_eventually!(
        p.metric("portcullis_requests_total{outcome=\"rejected\"}")
            .unwrap_or(0.0)
            - before
            >= 8.0,
        "8 rejections counted"
    );
    // With a key: limited as usual.
    assert_eq!(
        statuses(&addr, "/", &key_hdr("k"), 4),
        vec![200, 200, 200, 429]
    );
    assert_eq!(b.requests(), 3);
}

#[test]
fn missing_key_allow_never_limits_keyless_requests() {
    let b = Backend::start("app");
    let p = limited(&b, 3600, 2, "missing_key = \"allow\"");
    let addr = p.addr();
    let mut c = Conn::open(&addr).expect("connect");
    for i in 0..20 {
        let r = c.request("GET", "/", &[], b"").expect("request");
        assert_eq!(r.status, 200, "keyless request {i}");
        assert_no_ratelimit_fields(&r);
    }
    assert_eq!(b.requests(), 20);
    assert_eq!(
        statuses(&addr, "/", &key_hdr("k"), 3),
        vec![200, 200, 429],
        "keyed requests are still limited"
    );
    assert_eq!(get(&addr, "/", &[]).status, 200, "keyless still admitted");
}

// ---------------------------------------------------------------------------------------
// §2 key sources
// ---------------------------------------------------------------------------------------

fn source_proxy(b: &Backend, key: &str) -> Proxy {
    Proxy::start(&config(
        b,
        &format!(
            r#"
[rate_limit]
key = "{key}"
window_seconds = 3600
limit = 2
missing_key = "reject"
max_key_bytes = 32
"#
        ),
    ))
}

/// One request of a key-source table: path, headers, the status it must get, and why.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16, &'a str);

/// Sends each case in order (they share the key's quota) and checks its status; returns
/// the backend's request count for the caller to check.
fn run_cases(p: &Proxy, b: &Backend, cases: &[Case<'_>]) -> u64 {
    let a = p.addr();
    for (path, headers, want, why) in cases {
        let r = get(&a, path, headers);
        assert_eq!(r.status, *want, "{path} {headers:?}: {why}");
    }
    b.requests()
}

#[test]
fn key_source_header() {
    let b = Backend::start("app");
    let p = source_proxy(&b, "header:x-token");
    let long = "t".repeat(33);
    let alpha = vec![("x-token", "alpha")];
    let cases: Vec<Case<'_>> = vec![
        ("/", alpha.clone(), 200, "1st of 2"),
        ("/", alpha.clone(), 200, "2nd of 2"),
        ("/", alpha, 429, "3rd over the limit"),
        (
            "/",
            vec![("X-Token", "alpha")],
            429,
            "name is case-insensitive",
        ),
        ("/", vec![("x-token", "beta")], 200, "other key"),
        ("/", vec![("x-api-key", "alpha")], 401, "not the source"),
        ("/", vec![("x-token", &long)], 400, "over-long key"),
        ("/", vec![("x-token", &long[..32])], 200, "32 bytes fit"),
    ];
    assert_eq!(run_cases(&p, &b, &cases), 4);
}

#[test]
fn key_source_query() {
    let b = Backend::start("app");
    let p = source_proxy(&b, "query:api_key");
    let long = "q".repeat(33);
    let long_path = format!("/?api_key={long}");
    let cases: Vec<Case<'_>> = vec![
        ("/?api_key=alpha", vec![], 200, "1st of 2"),
        ("/?api_key=alpha", vec![], 200, "2nd of 2"),
        (
            "/other/path?x=1&api_key=alpha&y=2",
            vec![],
            429,
            "same key in another position, on another path: same quota",
        ),
        ("/?api_key=beta", vec![], 200, "other key"),
        ("/?apikey=alpha", vec![], 401, "other parameter"),
        ("/?api_key=", vec![], 401, "empty key"),
        ("/", vec![("x-api-key", "alpha")], 401, "not the source"),
        (&long_path, vec![], 400, "over-long"),
    ];
    assert_eq!(run_cases(&p, &b, &cases), 3);
    let got: Vec<String> = b.received_paths();
    assert!(
        got.iter().all(|p| !p.contains(&long)),
        "the over-long key never reached the backend"
    );
}

#[test]
fn key_source_bearer() {
    let b = Backend::start("app");
    let p = source_proxy(&b, "bearer");
    let long = format!("Bearer {}", "b".repeat(33));
    let alpha = vec![("authorization", "Bearer alpha")];
    let cases: Vec<Case<'_>> = vec![
        ("/", alpha.clone(), 200, "1st of 2"),
        ("/", alpha, 200, "2nd of 2"),
        (
            "/",
            vec![("Authorization", "bearer alpha")],
            429,
            "scheme is case-insensitive; same token, same quota",
        ),
        (
            "/",
            vec![("authorization", "Bearer beta")],
            200,
            "other token",
        ),
        (
            "/",
            vec![("authorization", "Basic YWxwaGE=")],
            401,
            "not bearer",
        ),
        ("/", vec![("authorization", "Bearer ")], 401, "empty token"),
        ("/", vec![("x-api-key", "alpha")], 401, "not the source"),
        (
            "/",
            vec![("authorization", long.as_str())],
            400,
            "over-long",
        ),
    ];
    assert_eq!(run_cases(&p, &b, &cases), 3);
}

// ---------------------------------------------------------------------------------------
// §2 max_key_bytes, §1 logs, §4 metrics
// ---------------------------------------------------------------------------------------

/// Sends over-long and valid keys through `p`; checks the 400s and that neither key shows
/// in /metrics, /status or the logs.
fn check_keys_do_not_leak(p: &Proxy, b: &Backend) {
    let a = p.addr();
    let long_key = format!("LEAKCHECK{}", "z".repeat(40)); // 49 bytes
    let valid_key = "VALIDSECRET0123456789abcdefghijk"; // 32 bytes
    assert_eq!(valid_key.len(), 32);
    let before = p
        .metric("portcullis_requests_total{outcome=\"rejected\"}")
        .unwrap_or(0.0);
    for _ in 0..3 {
        let r = get(&a, "/", &key_hdr(&long_key));
        assert_eq!(r.status, 400, "over-long key: {r:?}");
        assert!(r.body.len() < 200);
        assert!(!r.body_str().contains("LEAKCHECK"), "body echoes the key");
    }
    assert_eq!(b.requests(), 0, "the backend never sees an over-long key");
    assert_eq!(
        statuses(&a, "/", &key_hdr(valid_key), 3),
        vec![200, 200, 429],
        "a key of exactly max_key_bytes is accepted"
    );
    assert_eq!(b.requests(), 2);
    assert_eventually!(
        p.metric("portcullis_requests_total{outcome=\"rejected\"}")
            .unwrap_or(0.0)
            - before
            >= 3.0
    );

    let metrics = p.metrics();
    let status = p.admin_get("/status").body_str();
    let logs = p.logs();
    for (what, text) in [
        ("/metrics", &metrics),
        ("/status", &status),
        ("logs", &logs),
    ] {
        for (kind, k) in [
            ("the over-long key", "LEAKCHECK"),
            ("a valid API key", "VALIDSECRET"),
        ] {
            if let Some(i) = text.find(k) {
                let from = text[..i].rfind('\n').map_or(0, |j| j + 1);
                let to = text[i..].find('\n').map_or(text.len(), |j| i + j);
                let line: String = text[from..to].chars().take(400).collect();
                panic!("{what} contains {kind} in clear: {line}");
            }
        }
    }
}

const LEAK_CFG: &str = r#"
[rate_limit]
window_seconds = 3600
limit = 2
max_key_bytes = 32
"#;

/// An over-long key gets 400 and never reaches the backend; no key (neither the refused
/// one nor a valid one) appears in the logs, in /metrics or in /status.
#[test]
fn over_long_key_is_refused_and_no_key_leaks() {
    let b = Backend::start("app");
    let p = Proxy::start(&config(&b, LEAK_CFG));
    check_keys_do_not_leak(&p, &b);
}

/// §1 "Logs ... never contain an API key in clear" holds at every log level: an operator
/// debugging with `RUST_LOG=debug` must not get API keys written to the logs.
#[test]
fn api_keys_never_appear_in_debug_logs() {
    let b = Backend::start("app");
    let p = Proxy::start_with_env(&config(&b, LEAK_CFG), &[("RUST_LOG", "debug")]);
    check_keys_do_not_leak(&p, &b);
    // portcullis logs one debug line per request: the level really was debug.
    assert!(
        p.logs().contains("DEBUG"),
        "RUST_LOG=debug produced no debug lines"
    );
}

/// Refused requests never reach the backend and are counted as `rate_limited`; admitted
/// ones as `proxied`. Concurrent requests on one key admit exactly `limit`.
#[test]
fn refused_requests_never_reach_the_backend_and_are_counted() {
    let b = Backend::start("app");
    let p = limited(&b, 3600, 5, "");
    let sel_rl = "portcullis_requests_total{outcome=\"rate_limited\"}";
    let sel_px = "portcullis_requests_total{outcome=\"proxied\"}";
    let m = p.metrics();
    let (rl0, px0) = (
        metric_value(&m, sel_rl).unwrap_or(0.0),
        metric_value(&m, sel_px).unwrap_or(0.0),
    );
    let addr = p.addr();
    let results = concurrently(8, move |_| statuses(&addr, "/", &key_hdr("shared"), 5));
    let all: Vec<u16> = results.into_iter().flatten().collect();
    assert_eq!(
        count(&all, 200),
        5,
        "exactly the limit is admitted: {all:?}"
    );
    assert_eq!(count(&all, 429), 35, "the rest is refused: {all:?}");
    assert_eq!(b.requests(), 5, "429s never reach the backend");
    assert_eventually!(
        {
            let m = p.metrics();
            metric_value(&m, sel_rl).unwrap_or(0.0) - rl0 == 35.0
                && metric_value(&m, sel_px).unwrap_or(0.0) - px0 == 5.0
        },
        "rate_limited +35 and proxied +5; metrics:\n{}",
        p.metrics()
    );
    assert_eq!(b.requests(), 5);
}

// ---------------------------------------------------------------------------------------
// §5.2 only admitted requests count
// ---------------------------------------------------------------------------------------

/// A refused client that keeps hammering (4 connections, no pause) is admitted again once
/// Retry-After has passed: refused requests do not extend the refusal.
#[test]
fn hammering_while_refused_does_not_extend_the_refusal() {
    let b = Backend::start("app");
    let p = limited(&b, 2, 3, "");
    let addr = p.addr();
    assert_eq!(statuses(&addr, "/", &key_hdr("hammer"), 3), vec![200; 3]);
    let mut c = Conn::open(&addr).expect("connect");
    let (s429, first, t429) = timed(&mut c, &key_hdr("hammer"));
    let ra = assert_limited(&first, None, 3, 2);

    // 4 connections hammer without pause until one is admitted: (send, receive, status).
    let done = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let (addr, done) = (addr.clone(), done.clone());
            thread::spawn(move || {
                let mut c = Conn::open(&addr).expect("connect");
                let deadline = Instant::now() + Duration::from_secs(ra + 5);
                let mut out = Vec::new();
                while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
                    let (s, r, t) = timed(&mut c, &key_hdr("hammer"));
                    assert!(r.status == 200 || r.status == 429, "status {}", r.status);
                    if r.status == 200 {
                        done.store(true, Ordering::SeqCst);
                    }
                    out.push((s, t, r.status));
                }
                out
            })
        })
        .collect();
    let mut all: Vec<(u64, u64, u16)> = hs
        .into_iter()
        .flat_map(|h| h.join().expect("hammer thread"))
        .collect();
    all.sort();
    let refused = all.iter().filter(|x| x.2 == 429).count();
    let Some(&(ok_send, ok_recv, _)) = all.iter().find(|x| x.2 == 200) else {
        panic!("never admitted again within Retry-After + 5 s ({refused} refused requests)")
    };
    // Longest pause in the hammering before the admission (a stalled client, not the proxy).
    let mut sends: Vec<u64> = all.iter().map(|x| x.0).filter(|&s| s <= ok_send).collect();
    sends.insert(0, t429);
    let max_gap = sends.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    eprintln!(
        "Retry-After {ra}; {refused} refused while hammering; first admitted request sent {} \
         ms and answered {} ms after the 429 (longest client pause {max_gap} ms)",
        ok_send - t429,
        ok_recv - t429
    );
    assert!(refused >= 20, "the client did hammer ({refused} requests)");
    assert!(
        ok_recv - s429 >= ra.saturating_sub(1) * 1000,
        "admitted {} ms after a Retry-After of {ra} s: too early",
        ok_recv - s429
    );
    assert!(
        ok_send - t429 <= (ra + 1) * 1000 + max_gap,
        "admitted only {} ms after a Retry-After of {ra} s: the refused requests counted",
        ok_send - t429
    );
    // Only the admitted requests reached the backend: 3 + the one(s) admitted at the end.
    let n = b.requests();
    assert!((4..=7).contains(&n), "backend saw {n} requests");
}

// ---------------------------------------------------------------------------------------
// §5.6 bounded memory without wholesale eviction
// ---------------------------------------------------------------------------------------

/// 5,000 one-shot random keys against `max_tracked_keys = 1000`: a key at its limit that
/// keeps being used stays limited throughout, a steadily used key keeps its count, and the
/// number of tracked keys stays bounded.
#[test]
fn random_key_flood_does_not_evict_active_keys() {
    let b = Backend::start("app");
    let p = limited(
        &b,
        3600,
        5,
        "max_tracked_keys = 1000\n[rate_limit.keys]\n\"steady\" = 100000",
    );
    let addr = p.addr();
    let w0 = now_ms() / 3_600_000;
    // The victim reaches its limit; the steady key is used well below its own.
    let v = statuses(&addr, "/", &key_hdr("victim"), 8);
    assert_eq!(v, vec![200, 200, 200, 200, 200, 429, 429, 429]);
    let steady_sent = Arc::new(AtomicU64::new(0));
    assert_eq!(statuses(&addr, "/", &key_hdr("steady"), 10), vec![200; 10]);
    steady_sent.fetch_add(10, Ordering::SeqCst);

    const THREADS: usize = 4;
    const PER_THREAD: usize = 1250;
    let victim_admitted = Arc::new(AtomicU64::new(0));
    let victim_checks = Arc::new(AtomicU64::new(0));
    let flood_ok = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    {
        let (addr, victim_admitted, victim_checks, flood_ok, steady_sent) = (
            addr.clone(),
            victim_admitted.clone(),
            victim_checks.clone(),
            flood_ok.clone(),
            steady_sent.clone(),
        );
        concurrently(THREADS, move |t| {
            let mut c = Conn::open(&addr).expect("connect");
            for i in 0..PER_THREAD {
                let k = format!("flood-{t}-{i}-{:x}", (t * 7919 + i) * 104_729);
                let r = c
                    .request("GET", "/", &key_hdr(&k), b"")
                    .expect("flood request");
                if r.status == 200 {
                    flood_ok.fetch_add(1, Ordering::Relaxed);
                }
                if i % 25 == 24 {
                    let r = c
                        .request("GET", "/", &key_hdr("victim"), b"")
                        .expect("victim request");
                    victim_checks.fetch_add(1, Ordering::Relaxed);
                    if r.status != 429 {
                        victim_admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if i % 50 == 49 {
                    let r = c
                        .request("GET", "/", &key_hdr("steady"), b"")
                        .expect("steady request");
                    assert_eq!(r.status, 200, "the steady key stays admitted");
                    steady_sent.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    let flood_time = t0.elapsed();
    let tracked = p.status_json()["rate_limit"]["tracked_keys"].as_u64();
    eprintln!(
        "flood: {} keys in {flood_time:?}, {} admitted; victim checked {} times, admitted {} \
         times; tracked keys {tracked:?}; evictions keep memory bounded",
        THREADS * PER_THREAD,
        flood_ok.load(Ordering::Relaxed),
        victim_checks.load(Ordering::Relaxed),
        victim_admitted.load(Ordering::Relaxed),
    );
    assert_eq!(
        flood_ok.load(Ordering::Relaxed),
        (THREADS * PER_THREAD) as u64,
        "every fresh flood key is admitted once"
    );
    assert_eq!(
        victim_admitted.load(Ordering::Relaxed),
        0,
        "the limited key was admitted during the flood: its state was evicted"
    );
    // After the flood.
    let r = get(&addr, "/", &key_hdr("victim"));
    assert_limited(&r, None, 5, 3600);
    let r = get(&addr, "/", &key_hdr("steady"));
    assert_eq!(r.status, 200);
    let n = steady_sent.load(Ordering::SeqCst) + 1;
    let rem = ratelimit(&r).int("r");
    if now_ms() / 3_600_000 == w0 {
        assert_eq!(
            rem,
            100_000 - n,
            "the steady key kept its exact count ({n} sent)"
        );
    } else {
        // An hour boundary passed: the previous window decays a little.
        assert!(rem >= 100_000 - n, "r {rem} after {n} requests");
    }
    if let Some(tracked) = tracked {
        assert!(
            tracked <= 1100,
            "tracked keys {tracked} far above max_tracked_keys = 1000"
        );
    }
}
