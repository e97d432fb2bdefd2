//! TLS listeners (CONTRACT §6): SNI picks the certificate (exact, then wildcard, else
//! the first), ALPN serves HTTP/2, certificates are re-read on reload and a broken pair
//! keeps the old ones; bad handshakes are refused without harming the listener.
//! Certificates are made with `openssl`; clients are `openssl s_client` and `curl`.

use portcullis_test_kit as support;

use support::*;

struct Setup {
    _dir: tempfile::TempDir,
    default: CertFiles,
    backend: Backend,
    proxy: Proxy,
    tls_addr: String,
}

fn setup(min_version: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let default = make_cert(dir.path(), "default", "default.test", &["default.test"]);
    let wildcard = make_cert(
        dir.path(),
        "wild",
        "wildcard.example.test",
        &["*.example.test"],
    );
    let exact = make_cert(
        dir.path(),
        "exact",
        "api.example.test",
        &["api.example.test"],
    );
    let backend = Backend::start("tls-app");
    let tls_addr = format!("127.0.0.1:{}", free_port());
    let cfg = format!(
        "{}{}",
        one_upstream(&backend),
        // the wildcard is listed before the exact name: exact must still win
        tls_table(&tls_addr, min_version, &[&default, &wildcard, &exact])
    );
    let proxy = Proxy::start(&cfg);
    Setup {
        _dir: dir,
        default,
        backend,
        proxy,
        tls_addr,
    }
}

fn served_cn(addr: &str, sni: Option<&str>) -> String {
    let (ok, cn, out) = s_client(addr, sni, &[]);
    assert!(ok, "handshake with SNI {sni:?} failed:\n{out}");
    cn.unwrap_or_else(|| panic!("no subject in s_client output:\n{out}"))
}

#[test]
fn sni_selects_exact_then_wildcard_then_the_first_certificate() {
    let s = setup("1.2");
    assert_eq!(
        served_cn(&s.tls_addr, Some("api.example.test")),
        "api.example.test"
    );
    assert_eq!(
        served_cn(&s.tls_addr, Some("www.example.test")),
        "wildcard.example.test"
    );
    assert_eq!(
        served_cn(&s.tls_addr, Some("API.EXAMPLE.TEST")),
        "api.example.test"
    );
    // one label only for a wildcard; unknown and missing SNI get the default
    assert_eq!(
        served_cn(&s.tls_addr, Some("a.b.example.test")),
        "default.test"
    );
    assert_eq!(served_cn(&s.tls_addr, Some("unknown.test")), "default.test");
    assert_eq!(served_cn(&s.tls_addr, None), "default.test");
    // the plain listener still speaks HTTP/1.1
    assert_eq!(s.proxy.get("/plain", &[]).status, 200);
}

#[test]
fn https_request_over_h2_alpn_is_proxied_with_forwarded_proto_https() {
    let s = setup("1.2");
    let out = curl(&[
        "--http2",
        "--cacert",
        s.default.cert.to_str().expect("path"),
        "--resolve",
        &resolve("default.test", &s.tls_addr),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_version}",
        &format!(
            "https://default.test:{}/over-tls",
            s.tls_addr.rsplit(':').next().expect("port")
        ),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        text,
        "200 2",
        "curl: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let got = s.backend.last_received().expect("backend got the request");
    assert_eq!(got.path, "/over-tls");
    assert_eq!(got.header("x-forwarded-proto"), Some("https"));
    // the certificate chain verified against the CA curl was given: the proxy served
    // the default certificate for the name default.test
}

#[test]
fn reload_serves_new_certificates_and_keeps_old_ones_on_a_broken_pair() {
    let s = setup("1.2");
    let dir = s.default.cert.parent().expect("dir").to_path_buf();
    assert_eq!(served_cn(&s.tls_addr, None), "default.test");

    // rotate the default certificate in place, then SIGHUP
    make_cert(&dir, "default", "rotated.test", &["default.test"]);
    s.proxy.signal("HUP");
    eventually(
        DEADLINE,
        || "new handshakes still get the old certificate after SIGHUP".into(),
        || served_cn(&s.tls_addr, None) == "rotated.test",
    );
    let errors_before = s
        .proxy
        .metric("portcullis_config_reloads_total{result=\"error\"}")
        .unwrap_or(0.0);

    // a key that does not match the certificate: the reload fails, old certificates stay
    let other = make_cert(&dir, "other", "other.test", &["other.test"]);
    std::fs::copy(&other.key, &s.default.key).expect("overwrite key");
    let r = post(&s.proxy.admin_addr(), "/reload", &[], b"");
    assert_ne!(
        r.status,
        200,
        "reload with a mismatched pair must fail: {}",
        r.body_str()
    );
    assert!(
        r.body_str().contains("tls.certificates[0].key"),
        "the error names the entry: {}",
        r.body_str()
    );
    assert_eq!(
        s.proxy
            .metric("portcullis_config_reloads_total{result=\"error\"}")
            .unwrap_or(0.0),
        errors_before + 1.0
    );
    assert_eq!(served_cn(&s.tls_addr, None), "rotated.test");

    // an unreadable certificate file: same
    std::fs::remove_file(&s.default.cert).expect("remove cert");
    s.proxy.signal("HUP");
    eventually(
        DEADLINE,
        || "the failed SIGHUP reload was not counted".into(),
        || {
            s.proxy
                .metric("portcullis_config_reloads_total{result=\"error\"}")
                .unwrap_or(0.0)
                >= errors_before + 2.0
        },
    );
    assert_eq!(
        served_cn(&s.tls_addr, Some("api.example.test")),
        "api.example.test"
    );
    assert_eq!(served_cn(&s.tls_addr, None), "rotated.test");
    assert!(s.proxy.logs().contains("tls.certificates[0].cert"));
}

#[test]
fn bad_handshakes_are_refused_and_the_listener_keeps_serving() {
    let s = setup("1.3");
    // plaintext HTTP to the TLS port: no HTTP answer, the connection is closed
    match send_raw(&s.tls_addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") {
        RawOutcome::Response(r) => panic!("plaintext to the TLS port got HTTP {}", r.status),
        other => assert!(other.status().is_none(), "{other:?}"),
    }
    // TLS 1.2 against min_version 1.3, and TLS 1.0: refused in the handshake
    let (ok, _, out) = s_client(&s.tls_addr, Some("api.example.test"), &["-tls1_2"]);
    assert!(!ok, "a TLS 1.2 client got through min_version 1.3:\n{out}");
    let (ok, _, out) = s_client(
        &s.tls_addr,
        Some("api.example.test"),
        &["-tls1", "-cipher", "DEFAULT@SECLEVEL=0"],
    );
    assert!(!ok, "a TLS 1.0 client got through:\n{out}");
    // a handshake without a ClientHello at all
    let c = std::net::TcpStream::connect(&s.tls_addr).expect("connect");
    drop(c);
    // still serving, and the process is alive
    assert_eq!(
        served_cn(&s.tls_addr, Some("api.example.test")),
        "api.example.test"
    );
    let logs = s.proxy.logs();
    assert!(!logs.contains("panicked"), "{logs}");
}

#[test]
fn check_names_the_broken_tls_key_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = make_cert(dir.path(), "a", "a.test", &["a.test"]);
    let b = make_cert(dir.path(), "b", "b.test", &["b.test"]);
    let base = "[server]\nlisten = [\"127.0.0.1:18080\"]\nadmin_listen = \"127.0.0.1:19090\"\n\
                [[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:9001\"]\n";
    let good = format!("{base}{}", tls_table("127.0.0.1:18443", "1.2", &[&a, &b]));
    let (code, out, err, _) = check_config(&good);
    assert_eq!((code, out.trim()), (0, "OK"), "{err}");

    let mismatched = CertFiles {
        cert: b.cert.clone(),
        key: a.key.clone(),
    };
    let bad = format!(
        "{base}{}",
        tls_table("127.0.0.1:18443", "1.2", &[&a, &mismatched])
    );
    let (code, _, err, _) = check_config(&bad);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tls.certificates[1].key"), "{err}");
    assert!(err.contains("does not match"), "{err}");

    let old = format!("{base}{}", tls_table("127.0.0.1:18443", "1.1", &[&a]));
    let (code, _, err, _) = check_config(&old);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tls.min_version"), "{err}");
}

/// Over TLS as over plain TCP (`hardening_http`), a target Pingora would percent-encode (a
/// raw space) is refused with 400 and never reaches the backend; the same target sent
/// encoded passes as sent.
#[test]
fn a_raw_space_in_the_target_is_refused_over_tls_too() {
    let s = setup("1.2");
    let out = tls_exchange(
        &s.tls_addr,
        "api.example.test",
        b"GET /x y HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("invalid byte in request target"), "{out}");
    let out = tls_exchange(
        &s.tls_addr,
        "api.example.test",
        b"GET /x%20y HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(s.backend.received_paths(), vec!["/x%20y"]);
}
