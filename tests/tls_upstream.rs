//! Upstream TLS and HTTP/2 (CONTRACT §6): `tls`, `sni`, `verify`, `ca_file`, `http2` per
//! upstream, against Debian's nginx serving TLS + h2 and h2c. A backend certificate that
//! fails verification is never used and counts as a connect failure.

use portcullis_test_kit as support;

use support::*;

fn upstream(name: &str, addr: &str, extra: &str) -> String {
    format!("[[upstreams]]\nname = \"{name}\"\nbackends = [\"{addr}\"]\n{extra}\n")
}

fn config(upstream_extra: &str, addr: &str) -> String {
    format!(
        "{}[rate_limit]\nenabled = false\n[culling]\nenabled = false\n",
        upstream("app", addr, upstream_extra)
    )
}

#[test]
fn tls_upstream_with_ca_file_and_sni_speaks_h2_or_h1() {
    let nginx = Nginx::start();
    let ca = nginx.cert.cert.display().to_string();
    let h2 = Proxy::start(&config(
        &format!("tls = true\nsni = \"backend.test\"\nca_file = \"{ca}\"\nhttp2 = true\n"),
        &nginx.tls_addr,
    ));
    let r = h2.get("/x", &[]);
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (200, "nginx HTTP/2.0 backend.test\n")
    );

    let h1 = Proxy::start(&config(
        &format!("tls = true\nsni = \"backend.test\"\nca_file = \"{ca}\"\n"),
        &nginx.tls_addr,
    ));
    let r = h1.get("/x", &[]);
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (200, "nginx HTTP/1.1 backend.test\n")
    );
}

#[test]
fn h2c_upstream_uses_prior_knowledge() {
    let nginx = Nginx::start();
    let proxy = Proxy::start(&config("http2 = true\n", &nginx.h2c_addr));
    for _ in 0..3 {
        let r = proxy.get("/y", &[]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "nginx HTTP/2.0\n"));
    }
}

fn errors_in_window(proxy: &Proxy) -> u64 {
    proxy.status_json()["upstreams"][0]["backends"][0]["errors_in_window"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn a_certificate_that_fails_verification_is_never_used() {
    let nginx = Nginx::start();
    let ca = nginx.cert.cert.display().to_string();
    // untrusted (no ca_file: the self-signed certificate is not in the system store)
    let untrusted = Proxy::start(&config(
        "tls = true\nsni = \"backend.test\"\n",
        &nginx.tls_addr,
    ));
    // trusted, but the name does not match
    let wrong_name = Proxy::start(&config(
        &format!("tls = true\nsni = \"other.test\"\nca_file = \"{ca}\"\n"),
        &nginx.tls_addr,
    ));
    for p in [&untrusted, &wrong_name] {
        let r = p.get("/z", &[]);
        assert_eq!(r.status, 503, "{}", r.body_str());
        assert!(r.retry_after().is_some());
        eventually(
            DEADLINE,
            || "connect failure counted against the backend".into(),
            || errors_in_window(p) >= 1,
        );
    }
    assert_eq!(
        nginx.requests(),
        0,
        "no request was sent over an unverified connection"
    );
    // verify = false accepts it
    let unverified = Proxy::start(&config(
        "tls = true\nsni = \"backend.test\"\nverify = false\n",
        &nginx.tls_addr,
    ));
    assert_eq!(unverified.get("/z", &[]).status, 200);
    assert_eq!(nginx.requests(), 1);
}
