//! Header rules at the edge (issue 12, CONTRACT §7): per-route set/remove on
//! the upstream request and the response, hop-by-hop fields never forwarded,
//! `Connection: <name>` cannot strip the API-key header a gate read, and
//! `X-Request-Id` hygiene. The recording backend shows what arrived.

use portcullis_test_kit as support;

use support::*;

fn config(b: &Backend) -> String {
    format!(
        r#"{}
[[routes]]
path_prefix = "/"
upstream = "app"
request_headers_set = {{ "x-env" = "prod", "x-internal" = "from-proxy" }}
request_headers_remove = ["x-debug"]
response_headers_set = {{ "x-frame-options" = "DENY" }}
response_headers_remove = ["x-echo-method"]

[rate_limit]
key = "header:x-api-key"
limit = 1000
"#,
        one_upstream(b)
    )
}

fn received(b: &Backend, path: &str) -> Received {
    b.received()
        .into_iter()
        .find(|r| r.path == path)
        .unwrap_or_else(|| panic!("backend never saw {path}: {:?}", b.received_paths()))
}

#[test]
fn route_rules_apply_to_the_request_and_the_response() {
    let b = Backend::start("app");
    let p = Proxy::start(&config(&b));
    let r = p.get(
        "/rules",
        &[
            ("x-debug", "1"),
            ("x-internal", "forged"),
            ("x-api-key", "k"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    let got = received(&b, "/rules");
    assert_eq!(got.header("x-env"), Some("prod"));
    assert_eq!(
        got.header("x-internal"),
        Some("from-proxy"),
        "a set replaces the client's"
    );
    assert!(got.header("x-debug").is_none());
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert!(r.header("x-echo-method").is_none());
    assert_eq!(
        r.header("x-backend"),
        Some("app"),
        "other response headers stay"
    );
}

#[test]
fn hop_by_hop_fields_are_never_forwarded_and_cannot_strip_the_key() {
    let b = Backend::start("app");
    let p = Proxy::start(&config(&b));
    let r = p.get(
        "/hop",
        &[
            ("connection", "x-api-key, x-drop-me"),
            ("x-api-key", "the-key"),
            ("x-drop-me", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    let got = received(&b, "/hop");
    assert_eq!(
        got.header("x-api-key"),
        Some("the-key"),
        "Connection: x-api-key stripped the header the rate limiter read"
    );
    for hop in ["x-drop-me", "keep-alive", "proxy-connection", "te"] {
        assert!(
            got.header(hop).is_none(),
            "{hop} was forwarded: {:?}",
            got.headers
        );
    }
    let conn = got.header("connection").unwrap_or("").to_ascii_lowercase();
    assert!(
        !conn.contains("x-api-key") && !conn.contains("x-drop-me"),
        "{conn}"
    );

    // And hop-by-hop fields of a response do not reach the client.
    let raw = fixed_response_backend(
        b"HTTP/1.1 200 OK\r\nconnection: x-secret\r\nx-secret: s\r\nkeep-alive: timeout=5\r\nproxy-connection: keep-alive\r\nx-fine: f\r\ncontent-length: 2\r\n\r\nok",
    );
    let p2 = Proxy::start(&format!(
        "[[upstreams]]\nname = \"raw\"\nbackends = [\"{raw}\"]\n"
    ));
    let r = p2.get("/resp", &[]);
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.header("x-fine"), Some("f"));
    for hop in ["x-secret", "keep-alive", "proxy-connection"] {
        assert!(
            r.header(hop).is_none(),
            "{hop} reached the client: {:?}",
            r.headers
        );
    }
}

/// Each hop-by-hop field the proxy strips is stripped when it is the only one in the
/// request: the proxy looks for them in one pass and removes them only when one is there
/// (vendor/pingora-proxy, `sanitize_h1_upstream_request`).
#[test]
fn each_hop_by_hop_field_is_stripped_when_it_comes_alone() {
    let b = Backend::start("app");
    let p = Proxy::start(&config(&b));
    for (i, (name, value)) in [
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("proxy-authenticate", "Basic"),
        ("proxy-authorization", "Basic c2VjcmV0"),
        ("te", "trailers"),
        ("trailer", "x-checksum"),
        ("upgrade", "h2c"),
        ("http2-settings", "AAMAAABkAAQAoAAAAAIAAAAA"),
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!("/alone-{i}");
        let r = p.get(&path, &[(name, value), ("x-kept", "1")]);
        assert_eq!(r.status, 200, "{name}: {}", r.body_str());
        let got = received(&b, &path);
        assert!(
            got.header(name).is_none(),
            "{name} was forwarded: {:?}",
            got.headers
        );
        assert_eq!(got.header("x-kept"), Some("1"), "{name}: {:?}", got.headers);
    }
}

#[test]
fn request_ids_are_kept_only_when_valid_and_never_echoed_otherwise() {
    let b = Backend::start("app");
    let p = Proxy::start(&config(&b));
    let r = p.get("/id-ok", &[("x-request-id", "abc-123_XYZ.~")]);
    assert_eq!(r.header("x-request-id"), Some("abc-123_XYZ.~"));
    assert_eq!(
        received(&b, "/id-ok").header("x-request-id"),
        Some("abc-123_XYZ.~")
    );
    let long = "a".repeat(129);
    let max = "b".repeat(128);
    assert_eq!(
        p.get("/id-max", &[("x-request-id", &max)])
            .header("x-request-id"),
        Some(max.as_str())
    );
    for (i, bad) in ["has space", long.as_str(), "tab\there", "caf\u{e9}"]
        .iter()
        .enumerate()
    {
        let path = format!("/id-bad-{i}");
        let r = p.get(&path, &[("x-request-id", bad)]);
        assert_eq!(r.status, 200, "{bad:?}: {}", r.body_str());
        let echoed = r.header("x-request-id").unwrap_or_default().to_string();
        let upstream = received(&b, &path)
            .header("x-request-id")
            .unwrap_or_default()
            .to_string();
        assert_ne!(echoed, *bad, "invalid id echoed");
        assert_ne!(upstream, *bad, "invalid id forwarded");
        assert_eq!(echoed, upstream, "one replacement id for both sides");
        assert!(
            (1..=128).contains(&echoed.len()) && echoed.bytes().all(|c| c.is_ascii_graphic()),
            "replacement {echoed:?} is itself invalid"
        );
    }
}

/// `server.preserve_header_case`: by default HTTP/1 header names are written in canonical
/// case, as HAProxy and Envoy write them: the few names Pingora title-cases (`Host`,
/// `Content-Type`, `Server`, ...) that way, all others in lower case. `true` passes them on
/// in the case they were sent in (Pingora's behaviour). Both directions, on every request of
/// a keep-alive connection.
#[test]
fn header_names_are_canonical_unless_preserve_header_case_is_true() {
    let b = Backend::start("app");
    let raw = fixed_response_backend(
        b"HTTP/1.1 200 OK\r\ncontent-LENGTH: 2\r\nX-MiXeD-Resp: r\r\nsERVER: s\r\n\r\nok",
    );
    let cfg = format!(
        "{}\n[[upstreams]]\nname = \"raw\"\nbackends = [\"{raw}\"]\n\n\
         [[routes]]\npath_prefix = \"/resp\"\nupstream = \"raw\"\n\n\
         [[routes]]\npath_prefix = \"/\"\nupstream = \"app\"\n",
        one_upstream(&b)
    );
    // The names in `hs` that match one of `wanted` but for case, in `wanted`'s order.
    let names = |hs: &[(String, String)], wanted: &[&str]| -> Vec<String> {
        wanted
            .iter()
            .flat_map(|w| hs.iter().filter(|(k, _)| k.eq_ignore_ascii_case(w)))
            .map(|(k, _)| k.clone())
            .collect()
    };
    let canonical = (["x-mixed-req", "Host"], ["x-mixed-resp", "Server"]);
    let as_sent = (["X-MiXeD-Req", "hoST"], ["X-MiXeD-Resp", "sERVER"]);
    for (extra, (want_req, want_resp)) in [
        ("", canonical),
        ("preserve_header_case = false", canonical),
        ("preserve_header_case = true", as_sent),
    ] {
        let p = Proxy::start_with_server(extra, &cfg);
        let mut c = Conn::open(&p.addr()).expect("connect");
        for round in 0..2 {
            let path = format!("/case/{}/{round}", extra.len());
            let r = c
                .request(
                    "GET",
                    &path,
                    &[("hoST", "example.test"), ("X-MiXeD-Req", "q")],
                    b"",
                )
                .expect("request");
            assert_eq!(r.status, 200, "{extra:?}: {}", r.body_str());
            let got = received(&b, &path);
            let seen = names(&got.headers, &want_req);
            assert_eq!(seen, want_req, "{extra:?} round {round}: {:?}", got.headers);

            let r = c.request("GET", "/resp", &[], b"").expect("request");
            assert_eq!(r.status, 200, "{extra:?}: {}", r.body_str());
            let seen = names(&r.headers, &want_resp);
            assert_eq!(seen, want_resp, "{extra:?} round {round}: {:?}", r.headers);
        }
    }
}
