//! Per-backend error accounting counts only the backend's faults: a client
//! that hangs up mid-request must not push a healthy backend towards a cull.

use portcullis_test_kit as support;

use std::io::Write;
use std::time::Duration;
use support::*;

#[test]
fn client_hang_ups_are_not_backend_errors() {
    let b = Backend::start("app");
    b.set_mode(Mode::Slow(Duration::from_millis(300)));
    let p = Proxy::start(&format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{}\"]\n\n[rate_limit]\nenabled = false\n",
        b.addr()
    ));
    for _ in 0..5 {
        let mut c = std::net::TcpStream::connect(p.addr()).expect("connect");
        c.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        drop(c); // hang up before the answer
    }
    assert!(
        wait_until(Duration::from_secs(20), || b.requests() >= 5
            && b.in_flight() == 0),
        "the backend saw {} requests",
        b.requests()
    );
    assert!(
        wait_until(Duration::from_secs(20), || p
            .metric("portcullis_inflight_requests")
            == Some(0.0)),
        "requests still in flight"
    );
    // A real error still counts: the backend answers 503 once.
    b.set_mode(Mode::Fail(503));
    assert_eq!(get(&p.addr(), "/fail", &[]).status, 503);
    // Accounting runs in the logging phase, just after the response is sent.
    let errors = || p.status_json()["upstreams"][0]["backends"][0]["errors_in_window"].as_u64();
    assert!(
        wait_until(Duration::from_secs(20), || errors().is_some_and(|e| e >= 1)),
        "the 503 was never counted"
    );
    assert_eq!(errors(), Some(1), "only the 503 is the backend's error");
}
