//! The upstream keep-alive pool (the pingora-core/pingora-pool patch, vendor/README.md):
//! idle connections are reused; one the upstream closed is closed by the proxy, with no
//! socket left in CLOSE_WAIT, and is never used for a request. With several worker threads
//! (2 in these tests) each thread pools its own idle connections and still reuses them.

use portcullis_test_kit as support;

use std::thread;
use support::*;

/// Waits (up to [`DEADLINE`]) until the TCP states of the proxy's sockets to `b` pass `ok`.
fn wait_sockets(b: &Backend, ok: impl Fn(&[u8]) -> bool) {
    eventually(
        DEADLINE,
        || {
            format!(
                "proxy's sockets to the backend: {:?}",
                tcp_states_to(b.port())
            )
        },
        || ok(&tcp_states_to(b.port())),
    );
}

#[test]
fn idle_connections_are_reused_and_closed_once_the_upstream_closes_them() {
    let mut b = Backend::start("a");
    let p = Proxy::start(&one_upstream(&b));
    for _ in 0..20 {
        assert_eq!(p.get("/", &[]).status, 200);
    }
    // Sequential requests share a pooled connection; on a loaded machine a request can
    // arrive before the previous one's connection is back in the pool, so allow a few.
    let opened = b.connections();
    assert!(
        opened <= 5,
        "20 sequential requests opened {opened} connections"
    );
    wait_sockets(&b, |s| count_state(s, TCP_ESTABLISHED) == opened as usize);

    // the upstream closes the idle connections: the proxy closes its side (none left
    // ESTABLISHED or in CLOSE_WAIT; a closed socket may linger in TIME_WAIT without an fd)
    b.stop();
    b.restart();
    wait_sockets(&b, |s| {
        count_state(s, TCP_ESTABLISHED) == 0 && count_state(s, TCP_CLOSE_WAIT) == 0
    });
    assert_eq!(p.get("/", &[]).status, 200);
    assert_eq!(
        b.connections(),
        opened + 1,
        "a new connection, not a closed one"
    );
    assert_eq!(count_state(&tcp_states_to(b.port()), TCP_ESTABLISHED), 1);
}

#[test]
fn pooled_connections_the_upstream_closed_cost_no_request() {
    let mut b = Backend::start("a");
    let p = Proxy::start(&one_upstream(&b));
    // six requests in flight at once leave six idle connections in the pool
    b.set_mode(Mode::Hold);
    let addr = p.addr();
    let held: Vec<_> = (0..6)
        .map(|_| {
            let addr = addr.clone();
            thread::spawn(move || get(&addr, "/", &[]).status)
        })
        .collect();
    eventually(
        DEADLINE,
        || format!("{} held", b.in_flight()),
        || b.in_flight() == 6,
    );
    b.set_mode(Mode::Ok);
    b.release_all();
    for h in held {
        assert_eq!(h.join().expect("client thread"), 200);
    }
    wait_sockets(&b, |s| count_state(s, TCP_ESTABLISHED) == 6);

    // the upstream closes all six; the next requests, sent at once, all succeed
    b.stop();
    b.restart();
    for i in 0..6 {
        let r = p.get("/", &[]);
        assert_eq!(
            r.status, 200,
            "request {i} after the upstream closed the pool"
        );
    }
    wait_sockets(&b, |s| count_state(s, TCP_CLOSE_WAIT) == 0);
}

#[test]
fn keep_alive_clients_on_both_threads_reuse_their_threads_pooled_connections() {
    // The proxy runs 2 worker threads, each a runtime of its own with its own idle pool;
    // 8 client connections land on either thread. 200 requests, one at a time, round the
    // clients: each reuses a connection its thread pooled, so the backend sees a handful
    // of connections, not one per request (which a pool keyed inconsistently between the
    // release and the reuse would give).
    let b = Backend::start("a");
    let p = Proxy::start(&one_upstream(&b));
    let mut clients: Vec<Conn> = (0..8)
        .map(|_| Conn::open(&p.addr()).expect("connect to the proxy"))
        .collect();
    for round in 0..25 {
        for (i, c) in clients.iter_mut().enumerate() {
            let r = c
                .request("GET", "/", &[], b"")
                .unwrap_or_else(|e| panic!("round {round}, client {i}: {e}"));
            assert_eq!(r.status, 200, "round {round}, client {i}");
        }
    }
    let opened = b.connections();
    assert!(
        (1..=8).contains(&opened),
        "200 requests over 8 keep-alive clients opened {opened} upstream connections"
    );
}
