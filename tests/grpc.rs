//! gRPC passthrough (CONTRACT §6) over HTTP/2 both ways: trailers reach the client
//! unchanged, and a failed call (`grpc-status` 14 in the trailers of an HTTP 200) counts
//! as a backend error for culling while a successful one does not.
//!
//! Two pairs of real parts: a real gRPC server and client ([`GrpcServer`], [`grpc_call`]:
//! the gRPC C core through Debian's python3-grpcio), and nginx answering like a gRPC
//! server (`application/grpc`, HTTP 200, `grpc-status` in trailers via `add_trailer`)
//! with `nghttp` (h2c) as the client.

use portcullis_test_kit as support;

use support::*;

fn errors_in_window(proxy: &Proxy) -> u64 {
    proxy.status_json()["upstreams"][0]["backends"][0]["errors_in_window"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn grpc_trailers_pass_through_and_grpc_status_drives_culling() {
    let nginx = Nginx::start();
    let cfg = format!(
        "[[upstreams]]\nname = \"grpc\"\nbackends = [\"{}\"]\nhttp2 = true\n\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        nginx.h2c_addr
    );
    let proxy = Proxy::start_with_server("h2c = true\n", &cfg);
    let base = format!("http://{}", proxy.addr());

    let ok = nghttp(
        &[format!("{base}/grpc-ok")],
        &[("content-type", "application/grpc"), ("te", "trailers")],
    );
    assert_eq!(ok[0].status, 200, "{ok:#?}");
    assert_eq!(
        ok[0].header("grpc-status"),
        Some("0"),
        "trailers passed through: {ok:#?}"
    );
    assert_eq!(errors_in_window(&proxy), 0);

    let failed = nghttp(
        &[format!("{base}/grpc-fail/1"), format!("{base}/grpc-fail/2")],
        &[("content-type", "application/grpc"), ("te", "trailers")],
    );
    for s in &failed {
        assert_eq!(s.status, 200, "{failed:#?}");
        assert_eq!(s.header("grpc-status"), Some("14"), "{failed:#?}");
        assert_eq!(s.header("grpc-message"), Some("unavailable"), "{failed:#?}");
    }
    eventually(
        DEADLINE,
        || format!("errors_in_window {}", errors_in_window(&proxy)),
        || errors_in_window(&proxy) == 2,
    );
    // the HTTP status of those calls was 200: proxied, not upstream_error
    assert_eq!(
        proxy.metric("portcullis_requests_total{outcome=\"proxied\"}"),
        Some(3.0)
    );
}

#[test]
fn a_real_grpc_client_and_server_through_the_proxy() {
    let server = GrpcServer::start();
    let cfg = format!(
        "[[upstreams]]\nname = \"grpc\"\nbackends = [\"{}\"]\nhttp2 = true\n\n\
         [rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        server.addr
    );
    let proxy = Proxy::start_with_server("h2c = true\n", &cfg);
    let addr = proxy.addr();

    let ok = grpc_call(&addr, "hello");
    assert_eq!(ok.code, "OK", "{ok:?}");
    assert_eq!(ok.reply, "echo:hello", "{ok:?}");
    assert_eq!(
        ok.trailers.get("x-peer-trailer").map(String::as_str),
        Some("served"),
        "trailers reach the client: {ok:?}"
    );

    // UNAVAILABLE is the backend's failure: counted for culling
    for i in 0..2 {
        let r = grpc_call(&addr, &format!("unavailable:{i}"));
        assert_eq!(r.code, "UNAVAILABLE", "{r:?}");
        assert_eq!(r.details, "backend unavailable", "{r:?}");
        assert_eq!(
            r.trailers.get("x-peer-trailer").map(String::as_str),
            Some("served"),
            "{r:?}"
        );
    }
    eventually(
        DEADLINE,
        || format!("errors_in_window {}", errors_in_window(&proxy)),
        || errors_in_window(&proxy) == 2,
    );

    // INVALID_ARGUMENT is the caller's error: not the backend's
    for i in 0..2 {
        let r = grpc_call(&addr, &format!("invalid:{i}"));
        assert_eq!(r.code, "INVALID_ARGUMENT", "{r:?}");
    }
    eventually(
        DEADLINE,
        || {
            format!(
                "{:?}",
                proxy.metric("portcullis_requests_total{outcome=\"proxied\"}")
            )
        },
        || proxy.metric("portcullis_requests_total{outcome=\"proxied\"}") == Some(5.0),
    );
    assert_eq!(
        errors_in_window(&proxy),
        2,
        "INVALID_ARGUMENT is not a backend error"
    );
}
