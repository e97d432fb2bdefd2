//! HTTP/2 downstream (CONTRACT §6): every stream is a request for every gate. Real
//! clients: `curl --http2-prior-knowledge` (h2c on `listen`, `server.h2c = true`) and
//! `curl --http2` over TLS (ALPN), many streams multiplexed on one connection.

use portcullis_test_kit as support;

use std::path::Path;
use std::thread;
use support::*;

/// One finished stream as curl reports it.
#[derive(Debug)]
struct Stream {
    status: u16,
    version: String,
    /// New connections this transfer made (0 = it reused one).
    connects: u32,
    headers: String,
}

/// `n` parallel transfers of `url_of(i)` in one curl process (`-Z`), multiplexed
/// over HTTP/2; `extra(i)` adds per-transfer arguments. Headers are kept per transfer.
fn parallel(
    n: usize,
    dir: &Path,
    proto: &[&str],
    url_of: impl Fn(usize) -> String,
    extra: impl Fn(usize) -> Vec<String>,
) -> Vec<Stream> {
    let mut args: Vec<String> = vec!["-Z".into(), "--parallel-max".into(), "100".into()];
    for i in 0..n {
        if i > 0 {
            args.push("--next".into());
        }
        args.extend(proto.iter().map(|s| s.to_string()));
        args.extend([
            "-sS".into(),
            "-o".into(),
            "/dev/null".into(),
            "-D".into(),
            dir.join(format!("h{i}")).display().to_string(),
            "-w".into(),
            format!("{i} %{{http_code}} %{{http_version}} %{{num_connects}}\\n"),
        ]);
        args.extend(extra(i));
        args.push(url_of(i));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = curl(&refs);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut streams: Vec<(usize, Stream)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let i: usize = f.first()?.parse().ok()?;
            Some((
                i,
                Stream {
                    status: f.get(1)?.parse().ok()?,
                    version: f.get(2)?.to_string(),
                    connects: f.get(3)?.parse().ok()?,
                    headers: std::fs::read_to_string(dir.join(format!("h{i}"))).unwrap_or_default(),
                },
            ))
        })
        .collect();
    assert_eq!(
        streams.len(),
        n,
        "curl reported {} of {n} transfers:\n{text}\n{}",
        streams.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    streams.sort_by_key(|(i, _)| *i);
    streams.into_iter().map(|(_, s)| s).collect()
}

fn header<'a>(s: &'a Stream, name: &str) -> Option<&'a str> {
    s.headers.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn ten_h2c_streams_against_a_cap_of_four_serve_exactly_four() {
    let backend = Backend::start("h2c-app");
    let cfg = format!(
        "{}[[routes]]\npath_prefix = \"/\"\nupstream = \"app\"\npriority = \"critical\"\n\n\
         [shedding]\nmax_concurrency = 4\n\n[rate_limit]\nenabled = false\n",
        one_upstream(&backend)
    );
    let proxy = Proxy::start_with_server("h2c = true\n", &cfg);
    // curl speaks h2c prior knowledge too (one stream; see support::nghttp for why the
    // parallel streams use nghttp)
    let out = curl(&[
        "--http2-prior-knowledge",
        "-o",
        "/dev/null",
        "-w",
        "%{http_version}",
        &format!("http://{}/warm", proxy.addr()),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2");
    backend.set_mode(Mode::Hold);
    backend.reset_counters();
    let addr = proxy.addr();
    let urls: Vec<String> = (0..10).map(|i| format!("http://{addr}/s{i}")).collect();
    let client = thread::spawn(move || nghttp(&urls, &[]));
    // four streams reach the backend and are held there; six are shed at once
    eventually(
        DEADLINE,
        || format!("backend in flight {}", backend.in_flight()),
        || backend.in_flight() == 4,
    );
    eventually(
        DEADLINE,
        || "six streams shed".into(),
        || proxy.metric("portcullis_requests_total{outcome=\"shed\"}") == Some(6.0),
    );
    assert_eq!(proxy.metric("portcullis_inflight_requests"), Some(4.0));
    backend.set_mode(Mode::Ok);
    backend.release_all();
    let streams = client.join().expect("nghttp thread");

    let ok = streams.iter().filter(|s| s.status == 200).count();
    let shed: Vec<&H2Stream> = streams.iter().filter(|s| s.status == 503).collect();
    assert_eq!((ok, shed.len()), (4, 6), "{streams:#?}");
    assert_eq!(
        backend.requests(),
        4,
        "shed streams never reach the backend"
    );
    for s in shed {
        let ra: u64 = s
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("503 without Retry-After: {s:#?}"));
        assert!(ra >= 1);
    }
    assert_eq!(
        proxy.metric("portcullis_requests_total{outcome=\"proxied\"}"),
        Some(5.0)
    );
    // plain HTTP/1.1 still works on the h2c listener
    assert_eq!(proxy.get("/h1", &[]).status, 200);
}

#[test]
fn a_429_on_one_stream_while_the_others_on_the_connection_succeed_over_tls() {
    let backend = Backend::start("h2-app");
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = make_cert(dir.path(), "site", "site.test", &["site.test"]);
    let tls_addr = format!("127.0.0.1:{}", free_port());
    let cfg = format!(
        "{}[rate_limit]\nwindow_seconds = 3600\nlimit = 5\nkey = \"header:x-api-key\"\n\n{}",
        one_upstream(&backend),
        tls_table(&tls_addr, "1.2", &[&cert])
    );
    let proxy = Proxy::start(&cfg);
    let port = tls_addr.rsplit(':').next().expect("port").to_string();
    let cacert = cert.cert.display().to_string();
    let resolve = resolve("site.test", &tls_addr);
    // streams 0..5 use key "a" (limit 5: one of them is refused), 6..8 key "b"
    let streams = parallel(
        9,
        dir.path(),
        &["--http2", "--cacert", &cacert, "--resolve", &resolve],
        |i| format!("https://site.test:{port}/r{i}"),
        |i| {
            let key = if i < 6 { "a" } else { "b" };
            vec!["-H".into(), format!("x-api-key: {key}")]
        },
    );
    assert!(streams.iter().all(|s| s.version == "2"), "{streams:#?}");
    assert_eq!(
        streams.iter().map(|s| s.connects).sum::<u32>(),
        1,
        "{streams:#?}"
    );
    let limited: Vec<&Stream> = streams.iter().filter(|s| s.status == 429).collect();
    assert_eq!(limited.len(), 1, "{streams:#?}");
    assert_eq!(streams.iter().filter(|s| s.status == 200).count(), 8);
    let l = limited[0];
    assert!(header(l, "retry-after")
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|v| v >= 1));
    assert!(
        header(l, "ratelimit-policy").is_some_and(|v| v.contains("q=5")),
        "{l:#?}"
    );
    assert!(
        header(l, "ratelimit").is_some_and(|v| v.contains("r=0")),
        "{l:#?}"
    );
    // admitted streams carry the fields too
    let ok = streams
        .iter()
        .find(|s| s.status == 200)
        .expect("an admitted stream");
    assert!(header(ok, "ratelimit").is_some(), "{ok:#?}");
    assert_eq!(backend.requests(), 8);
    assert_eq!(
        proxy.metric("portcullis_requests_total{outcome=\"rate_limited\"}"),
        Some(1.0)
    );
}

/// curl over HTTP/2 (h2c prior knowledge or TLS ALPN) against a backend slower than
/// `client_header_timeout_ms`: the answer must arrive. The HTTP/1 header-block
/// deadline must not cut a multiplexed connection whose first request is still
/// being served (nothing on an h2 connection marks a "header block done").
fn slow_h2_answer(url: &str, extra: &[&str]) -> String {
    let mut args: Vec<&str> = extra.to_vec();
    args.extend([
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_version}",
        url,
    ]);
    let out = curl(&args);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn h2_connections_outlive_the_http1_header_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = make_cert(dir.path(), "edge", "edge.test", &["edge.test"]);
    let backend = Backend::start("slow-h2");
    backend.set_mode(Mode::Slow(std::time::Duration::from_millis(900)));
    let tls_addr = format!("127.0.0.1:{}", free_port());
    let cfg = format!(
        "{}[rate_limit]\nenabled = false\n\n{}",
        one_upstream(&backend),
        tls_table(&tls_addr, "1.2", &[&cert])
    );
    let proxy = Proxy::start_with_server("h2c = true\nclient_header_timeout_ms = 300\n", &cfg);

    let h2c = slow_h2_answer(
        &format!("http://{}/slow-h2c", proxy.addr()),
        &["--http2-prior-knowledge"],
    );
    assert_eq!(h2c, "200 2", "h2c through a 900 ms backend");

    let port = tls_addr.rsplit(':').next().expect("port");
    let tls = slow_h2_answer(
        &format!("https://edge.test:{port}/slow-tls"),
        &[
            "--http2",
            "--cacert",
            cert.cert.to_str().expect("path"),
            "--resolve",
            &resolve("edge.test", &tls_addr),
        ],
    );
    assert_eq!(tls, "200 2", "h2 over TLS through a 900 ms backend");
    let paths: Vec<String> = backend.received().iter().map(|r| r.path.clone()).collect();
    assert!(paths.contains(&"/slow-h2c".to_string()), "{paths:?}");
    assert!(paths.contains(&"/slow-tls".to_string()), "{paths:?}");
    let timeouts = metric_value(
        &proxy.metrics(),
        "portcullis_edge_refusals_total{reason=\"header_timeout\"}",
    )
    .unwrap_or(0.0);
    assert_eq!(timeouts, 0.0, "no header timeout on an h2 connection");
}

/// `proxy_protocol` expects the PROXY header on plain listeners; on a TLS listener the
/// handshake comes first, so the peer address is the client and TLS requests are served.
#[test]
fn a_tls_listener_serves_without_a_proxy_header_when_proxy_protocol_is_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = make_cert(dir.path(), "edge", "edge.test", &["edge.test"]);
    let backend = Backend::start("pp-tls");
    let tls_addr = format!("127.0.0.1:{}", free_port());
    let cfg = format!(
        "{}[rate_limit]\nenabled = false\n\n{}",
        one_upstream(&backend),
        tls_table(&tls_addr, "1.2", &[&cert])
    );
    let proxy = Proxy::start_with_server(
        "proxy_protocol = true\ntrusted_proxies = [\"127.0.0.1\"]\n",
        &cfg,
    );
    let port = tls_addr.rsplit(':').next().expect("port");
    for version in ["--http1.1", "--http2"] {
        let out = slow_h2_answer(
            &format!("https://edge.test:{port}/pp-tls"),
            &[
                version,
                "--cacert",
                cert.cert.to_str().expect("path"),
                "--resolve",
                &resolve("edge.test", &tls_addr),
            ],
        );
        assert!(out.starts_with("200 "), "{version}: {out}");
    }
    // the plain listener still insists on a PROXY header
    let r = send_raw(&proxy.addr(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status(), None, "{r:?}");
}

/// One response's header block as `h2_fields.py` decoded it.
#[derive(serde::Deserialize, Debug)]
struct Block {
    block_len: usize,
    /// name, value, sent as an HPACK literal "never indexed"
    fields: Vec<(String, String, bool)>,
}

/// Values unique to one response (the request id, the `RateLimit` remaining count) go out
/// as HPACK literals never indexed, so they do not fill the connection's dynamic table:
/// the fields that repeat stay indexed, and no later response's header block has to send
/// them again. Read by a real HPACK decoder (Debian's python3-h2 stack).
#[test]
fn per_response_values_stay_out_of_the_hpack_table() {
    let backend = Backend::start("hpack-app");
    // The test backend echoes the request id it got: a unique value of the backend's own,
    // which the proxy forwards as the backend sent it (indexed). Removed here, so that the
    // block sizes show the proxy's encoding alone.
    let cfg = format!(
        "{}[[routes]]\npath_prefix = \"/\"\nupstream = \"app\"\n\
         response_headers_remove = [\"x-echo-request-id\"]\n\n\
         [rate_limit]\nwindow_seconds = 3600\nlimit = 1000\nkey = \"header:x-api-key\"\n",
        one_upstream(&backend)
    );
    let proxy = Proxy::start_with_server("h2c = true\n", &cfg);
    let script = support::py_helper("h2_fields.py");
    let out = std::process::Command::new("/usr/bin/python3")
        .args([&script, &proxy.addr(), "/hpack", "80", "x-api-key:k1"])
        .output()
        .expect("run h2_fields.py (needs python3-h2)");
    let text = String::from_utf8_lossy(&out.stdout);
    let blocks: Vec<Block> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(
        blocks.len(),
        80,
        "{text}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |b: &Block, name: &str| {
        b.fields
            .iter()
            .find(|f| f.0 == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {b:?}"))
    };
    let mut ids = std::collections::BTreeSet::new();
    for b in &blocks {
        assert_eq!(field(b, ":status").1, "200", "{b:?}");
        let id = field(b, "x-request-id");
        assert!(id.2, "x-request-id indexed: {b:?}");
        ids.insert(id.1);
        assert!(field(b, "ratelimit").2, "ratelimit indexed: {b:?}");
        // the fields that repeat are left to the table
        assert!(!field(b, "ratelimit-policy").2, "{b:?}");
        assert!(!field(b, "x-backend").2, "{b:?}");
    }
    assert_eq!(ids.len(), 80, "request ids repeat");
    // The same fields each time; the unique values' Huffman codes vary by a byte or two.
    // Indexed, the request ids filled the 4 KB table and evicted the fields that repeat, so
    // every 27th block sent them all again: 249 bytes among blocks of 58.
    // One field repeats but changes by itself: `Date`, once a second. The block where it
    // changes sends the new date once (a literal of at most 1 + 29 bytes; 23 seen), after
    // which it is indexed again; the 80 responses cross a second about one run in ten.
    let date = |b: &Block| b.fields.iter().find(|f| f.0 == "date").map(|f| f.1.clone());
    let smallest = blocks[1..].iter().map(|b| b.block_len).min().unwrap_or(0);
    for (i, pair) in blocks.windows(2).enumerate() {
        let (prev, b) = (&pair[0], &pair[1]);
        let new_date = if date(b) != date(prev) { 30 } else { 0 };
        assert!(
            b.block_len <= smallest + 4 + new_date,
            "header block {} of {} bytes among blocks of {smallest}{}: {:?}",
            i + 1,
            b.block_len,
            if new_date > 0 { " (a new date)" } else { "" },
            blocks.iter().map(|b| b.block_len).collect::<Vec<_>>()
        );
    }
}
