//! Retries on another backend and the retry budget (CONTRACT §10 `retries`,
//! `retry_budget_ratio`; §11 `portcullis_retries_total`).

use portcullis_test_kit as support;

use support::*;

fn retries(p: &Proxy, result: &str) -> f64 {
    p.metric(&format!(
        "portcullis_retries_total{{upstream=\"app\",result=\"{result}\"}}"
    ))
    .unwrap_or(0.0)
}

#[test]
fn get_is_retried_on_503_and_post_is_not() {
    let bad = Backend::start("bad");
    let good = Backend::start("good");
    bad.set_mode(Mode::Fail(503));
    let p = Proxy::start(&balanced_app(
        &[&bad, &good],
        "retries = 1\nretry_budget_ratio = 1.0",
    ));

    for i in 0..20 {
        let r = p.get(&format!("/g/{i}"), &[]);
        assert_eq!(r.status, 200, "GET {i}: {}", r.body_str());
        assert_eq!(r.header("x-backend"), Some("good"));
    }
    let bad_gets = bad.requests();
    assert!(
        bad_gets >= 8,
        "round robin sent {bad_gets} GETs to bad first"
    );
    assert_eq!(retries(&p, "sent"), bad_gets as f64);
    assert_eq!(good.requests(), 20);

    let mut post_503 = 0;
    for i in 0..20 {
        let r = post(&p.addr(), &format!("/p/{i}"), &[], b"payload");
        match r.status {
            200 => assert_eq!(r.header("x-backend"), Some("good")),
            503 => {
                // The backend's own answer, passed through (not the proxy's).
                assert_eq!(r.header("x-backend"), Some("bad"));
                post_503 += 1;
            }
            s => panic!("POST {i}: unexpected {s}"),
        }
    }
    assert!(post_503 >= 8, "POSTs that hit bad: {post_503}");
    assert_eq!(
        bad.requests() - bad_gets,
        post_503,
        "a POST went to bad twice"
    );
    assert_eq!(retries(&p, "sent"), bad_gets as f64, "a POST was retried");
}

#[test]
fn the_budget_caps_retries_and_counts_the_exhausted() {
    let bad = Backend::start("bad");
    let good = Backend::start("good");
    bad.set_mode(Mode::Fail(503));
    let p = Proxy::start(&balanced_app(
        &[&bad, &good],
        "retries = 1\nretry_budget_ratio = 0.1",
    ));

    let mut client_503 = 0u32;
    for i in 0..200 {
        let r = p.get(&format!("/b/{i}"), &[]);
        if r.status == 503 {
            client_503 += 1;
        }
    }
    let sent = retries(&p, "sent");
    let exhausted = retries(&p, "budget_exhausted");
    // Every first attempt on bad wants a retry; the budget allows 10 % of the
    // window's requests (200 in under 10 s), with a floor of 3.
    assert_eq!(sent + exhausted, bad.requests() as f64);
    assert!(sent <= 23.0, "retries sent {sent}");
    assert!(sent >= 3.0, "retries sent {sent}");
    assert!(exhausted >= 70.0, "exhausted {exhausted}");
    assert_eq!(
        f64::from(client_503),
        exhausted,
        "each refused retry is the backend's 503"
    );
    assert_eq!((good.requests() + bad.requests()) as f64, 200.0 + sent);
}

/// CONTRACT §10, "a failed connect always": nothing was sent, so a failed connect goes to
/// an untried backend whatever the method, `retries` and the budget say. It stays inside
/// every account: each failed connect is an error in the dead backend's culling window
/// and an upstream error, a `sent` retry that the budget counts, and the request is one
/// request to the gates (counted once, its shedding slot released once).
#[test]
fn a_failed_connect_is_always_retried_and_stays_accounted() {
    let good = Backend::start("good");
    let dead = format!("127.0.0.1:{}", free_port());
    let p = Proxy::start(&format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{dead}\", \"{}\"]\n\
         retries = 0\nretry_budget_ratio = 0.0\n\n[shedding]\nmax_concurrency = 8\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        good.addr()
    ));

    for i in 0..20 {
        for r in [
            p.get(&format!("/g/{i}"), &[]),
            post(&p.addr(), &format!("/p/{i}"), &[], b"body"),
        ] {
            assert_eq!(r.status, 200, "request {i}: {}", r.body_str());
            assert_eq!(r.header("x-backend"), Some("good"));
        }
    }
    let sent = retries(&p, "sent");
    assert!(sent >= 1.0, "no connect ever failed over: sent {sent}");
    assert_eq!(retries(&p, "budget_exhausted"), 0.0);
    assert_eq!((good.requests()) as f64, 40.0);
    let dead_errors = p
        .metric(&format!(
            "portcullis_upstream_requests_total{{upstream=\"app\",backend=\"{dead}\",code=\"error\"}}"
        ))
        .unwrap_or(0.0);
    assert_eq!(
        dead_errors, sent,
        "every failed connect is an upstream error"
    );
    let st = p.status_json();
    let in_window = st["upstreams"][0]["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["address"] == dead.as_str())
        .and_then(|b| b["errors_in_window"].as_f64());
    assert_eq!(
        in_window,
        Some(sent),
        "culling window of the dead backend: {st}"
    );
    assert_eq!(
        p.metric("portcullis_requests_total{outcome=\"proxied\"}"),
        Some(40.0),
        "each request counted once, whatever its attempts"
    );
    eventually(
        DEADLINE,
        || format!("a shedding slot leaked: {}", p.status_json()),
        || p.status_json()["inflight"] == 0,
    );
}
