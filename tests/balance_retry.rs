//! Retries on another backend and the retry budget (CONTRACT §10 `retries`,
//! `retry_budget_ratio`; §11 `portcullis_retries_total`).

mod support;

use support::*;

fn config(backends: &[&Backend], extra: &str) -> String {
    let addrs: Vec<String> = backends
        .iter()
        .map(|b| format!("\"{}\"", b.addr()))
        .collect();
    format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [{}]\n{extra}\n\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        addrs.join(", ")
    )
}

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
    let p = Proxy::start(&config(
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
    let p = Proxy::start(&config(
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
