//! Hostile input, third round (issue 40 items 9–14; CONTRACT §17): ambiguity is refused
//! with 400 and nothing forwarded, the PROXY header alone names the client, files that are
//! not regular never block a reload, route lookup does not grow with the routes, and idle
//! tunnels have their own timeout. Real binary, real sockets, a recording backend.

mod support;

use std::time::Duration;
use support::*;

const LB: &str = "127.0.0.2";

fn upstream(b: &Backend) -> String {
    format!(
        "[[upstreams]]\nname = \"app\"\nbackends = [\"{}\"]\n\n",
        b.addr()
    )
}

fn no_limits(b: &Backend) -> String {
    format!(
        "{}[shedding]\nmax_concurrency = 0\n\n[rate_limit]\nenabled = false\n",
        upstream(b)
    )
}

// ---------------------------------------------------------------------------------------
// Item 10: one key header line holding a list, or a query key repeated with `;`
// ---------------------------------------------------------------------------------------

/// `X-Api-Key: a, b` is two values (RFC 9110 §5.3) and `?key=a;key=b` two parameters for
/// many frameworks: both counted as one new key before. Each is the duplicate-key refusal
/// now (400, the same body and outcome), and never forwarded.
#[test]
fn a_key_list_in_one_line_or_a_semicolon_repeat_is_refused() {
    let b = Backend::start("app");
    let rl =
        |key: &str| format!("[rate_limit]\nwindow_seconds = 3600\nlimit = 3\nkey = \"{key}\"\n");
    let ph = Proxy::start(&format!("{}{}", upstream(&b), rl("header:x-api-key")));
    let pq = Proxy::start(&format!("{}{}", upstream(&b), rl("query:key")));
    let pb = Proxy::start(&format!("{}{}", upstream(&b), rl("bearer")));

    for (i, v) in ["rnd-1, realkey", "a,b", "same, same"].iter().enumerate() {
        let r = ph.get(&format!("/dup-h{i}"), &[("X-Api-Key", v)]);
        assert_eq!(r.status, 400, "X-Api-Key: {v}: {r:?}");
        assert!(r.body_str().contains("API key"), "{:?}", r.body_str());
    }
    for (i, q) in ["key=a;key=b", "x=1;key=a&key=b", "key=a;key=a"]
        .iter()
        .enumerate()
    {
        let r = pq.get(&format!("/dup-q{i}?{q}"), &[]);
        assert_eq!(r.status, 400, "?{q}: {r:?}");
        assert!(r.body_str().contains("API key"), "{:?}", r.body_str());
    }
    let r = pb.get("/dup-b", &[("Authorization", "Bearer a, Bearer b")]);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        ph.metric("portcullis_requests_total{outcome=\"rejected\"}"),
        Some(3.0)
    );
    assert_eq!(b.requests(), 0, "a refused request reached the backend");

    // One value still passes, with `;` separating another parameter.
    assert_eq!(ph.get("/ok", &[("X-Api-Key", "realkey")]).status, 200);
    assert_eq!(pq.get("/ok?x=1;key=realkey", &[]).status, 200);
    assert_eq!(pb.get("/ok", &[("Authorization", "Bearer t")]).status, 200);
    let paths = b.received_paths();
    assert!(
        paths.iter().all(|p| !p.starts_with("/dup")),
        "the backend received a refused request: {paths:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Item 11: with proxy_protocol, X-Forwarded-For is never the client address
// ---------------------------------------------------------------------------------------

fn v2_local() -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
    h
}

/// A `LOCAL` (v2), `UNSPEC` (v2 PROXY with no address family) or `UNKNOWN` (v1) header
/// names no client: the connection's peer (the balancer) is the client, not the
/// client's own `X-Forwarded-For` (6.6.6.6 in the issue). Limit 1 per client address: the
/// second request, whatever X-Forwarded-For it claims, is the same client's.
#[test]
fn local_or_unknown_proxy_headers_make_the_peer_the_client_not_xff() {
    let b = Backend::start("app");
    let cfg = format!(
        "{}[rate_limit]\nkey = \"header:x-api-key\"\nlimit = 1\nwindow_seconds = 3600\nmissing_key = \"client_ip\"\n",
        upstream(&b)
    );
    let mut unspec = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    unspec.extend_from_slice(&[0x21, 0x00, 0x00, 0x00]);
    let headers: [(&str, Vec<u8>); 3] = [
        ("v2-local", v2_local()),
        ("v2-unspec", unspec),
        ("v1-unknown", b"PROXY UNKNOWN\r\n".to_vec()),
    ];
    for (name, header) in headers {
        let p = Proxy::start_with_server(
            "trusted_proxies = [\"127.0.0.2\"]\nproxy_protocol = true",
            &cfg,
        );
        let send = |path: &str, xff: &str| {
            let mut c = Conn::open_from(&p.addr(), LB).expect("connect");
            c.write_raw(&header).expect("PROXY header");
            c.request("GET", path, &[("X-Forwarded-For", xff)], b"")
                .expect("response")
        };
        let first = send(&format!("/{name}-1"), "6.6.6.6");
        assert_eq!(first.status, 200, "{name}: {}", first.body_str());
        let second = send(&format!("/{name}-2"), "7.7.7.7");
        assert_eq!(
            second.status, 429,
            "{name}: X-Forwarded-For named another client behind a {name} header"
        );
        // What the backend sees appended is the connection's source, the balancer.
        let got = b
            .received()
            .into_iter()
            .find(|r| r.path == format!("/{name}-1"))
            .and_then(|r| r.header("x-forwarded-for").map(str::to_string));
        assert_eq!(got.as_deref(), Some("6.6.6.6, 127.0.0.2"), "{name}");
    }
}
