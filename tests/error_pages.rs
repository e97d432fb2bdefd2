//! `[errors]` (CONTRACT §21): the bodies of the answers the proxy writes itself as RFC
//! 9457 problem details or as an operator's page per status, over HTTP/1.1 and HTTP/2,
//! with `Retry-After` and the RateLimit fields kept; pages read at start and on reload,
//! never from a FIFO or past 64 KiB.

use portcullis_test_kit as support;

use std::fs;
use std::path::Path;
use std::thread;
use support::*;

/// The problem details of `r`, checked against the status and content type it came with.
fn problem(r: &Resp, status: u16) -> serde_json::Value {
    assert_eq!(r.status, status, "{:?} {}", r.headers, r.body_str());
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{status}: {:?}",
        r.headers
    );
    let v: serde_json::Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {}", r.body_str()));
    assert_eq!(v["status"], status, "{v}");
    assert!(v["type"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    assert!(v["title"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    assert!(v["detail"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    v
}

/// `request_id` of a problem the proxy made an id for: 32 lowercase hex digits.
fn generated_id(v: &serde_json::Value) -> String {
    let id = v["request_id"].as_str().unwrap_or_default().to_string();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "a generated request id: {v}"
    );
    id
}

/// Before `[errors]` every answer here was `text/plain` ("portcullis: …"), and the
/// header timeout's 408 a fixed text: each `problem` check failed on its content type.
/// Shed 503, 401, 429 (with the client's id), 431, 413, 503 from a dead backend, 502 from
/// one that hangs up, 504 from a hanging one, a 408 header timeout: all parse as problem details, keeping
/// `Retry-After` and the RateLimit fields; the id a body shows is the access log's.
#[test]
fn every_answer_the_proxy_writes_is_problem_json() {
    let app = Backend::start("app");
    let hang = Backend::start("hang");
    hang.set_mode(Mode::Hang);
    let mut dead = Backend::start("dead");
    dead.stop();
    let closing = Backend::start("close");
    closing.set_mode(Mode::Close);
    let log = tempfile::NamedTempFile::new().expect("log file");
    let cfg = format!(
        "{}{}{}{}\
         [[routes]]\npath_prefix = \"/\"\nupstream = \"app\"\npriority = \"critical\"\n\
         [[routes]]\npath_prefix = \"/close\"\nupstream = \"close\"\npriority = \"critical\"\n\
         [[routes]]\npath_prefix = \"/dead\"\nupstream = \"dead\"\npriority = \"critical\"\n\
         [[routes]]\npath_prefix = \"/hang\"\nupstream = \"hang\"\npriority = \"critical\"\n\
         [shedding]\nmax_concurrency = 2\n\
         [rate_limit]\nkey = \"header:x-api-key\"\nlimit = 2\nwindow_seconds = 3600\n\
         missing_key = \"reject\"\n\
         [culling]\nenabled = false\n\
         [access_log]\nenabled = true\npath = \"{}\"\n\
         [errors]\nformat = \"problem_json\"\n",
        upstream_table("app", &[&app], ""),
        upstream_table("dead", &[&dead], "retries = 0"),
        upstream_table("close", &[&closing], "retries = 0"),
        upstream_table("hang", &[&hang], "read_timeout_ms = 300\nretries = 0"),
        log.path().display()
    );
    let p = Proxy::start_with_server(
        "max_request_header_bytes = 4096\nmax_request_body_bytes = 1000\n\
         client_header_timeout_ms = 500",
        &cfg,
    );
    let addr = p.addr();
    let key = |k: &'static str| vec![("x-api-key", k)];

    // shed: two held, the third refused
    app.set_mode(Mode::Hold);
    let held: Vec<_> = ["k-h1", "k-h2"]
        .into_iter()
        .map(|k| {
            let addr = addr.clone();
            thread::spawn(move || try_get(&addr, "/held", &[("x-api-key", k)]).map(|r| r.status))
        })
        .collect();
    eventually(DEADLINE, || "two held".into(), || app.in_flight() == 2);
    let r = p.get("/shed", &key("k-shed"));
    let v = problem(&r, 503);
    assert_eq!(v["type"], "urn:portcullis:problem:shed", "{v}");
    let retry = r.retry_after().expect("Retry-After on a shed 503");
    assert_eq!(v["retry_after"], retry, "{v}");
    let shed_id = generated_id(&v);
    app.release_all();
    app.set_mode(Mode::Ok);
    for h in held {
        assert_eq!(h.join().expect("join").expect("held request"), 200);
    }

    // 401 without a key
    let v = problem(&p.get("/", &[]), 401);
    assert!(
        v.get("retry_after").is_none(),
        "no Retry-After, no field: {v}"
    );
    generated_id(&v);

    // 429 with the client's id, beside Retry-After and the RateLimit fields
    for _ in 0..2 {
        assert_eq!(p.get("/", &key("k-429")).status, 200);
    }
    let r = p.get(
        "/",
        &[("x-api-key", "k-429"), ("x-request-id", "client-id-7")],
    );
    let v = problem(&r, 429);
    assert_eq!(v["request_id"], "client-id-7", "{v}");
    assert_eq!(
        Some(v["retry_after"].as_u64().expect("retry_after")),
        r.retry_after()
    );
    assert!(r.header("ratelimit-policy").is_some(), "{:?}", r.headers);
    assert!(r.header("ratelimit").is_some(), "{:?}", r.headers);

    // 431: a header block over 4096 bytes
    let big = "a".repeat(5000);
    let r = get(&addr, "/", &[("x-api-key", "k-431"), ("x-big", &big)]);
    problem(&r, 431);

    // 413: a declared body over 1000 bytes
    let mut c = Conn::open(&addr).expect("connect");
    c.write_raw(
        b"POST /up HTTP/1.1\r\nHost: x\r\nx-api-key: k-413\r\nContent-Length: 5000\r\n\r\n",
    )
    .expect("write");
    problem(&c.read_response().expect("413"), 413);

    // 503: the only backend refuses connections; 502: it closes without an answer;
    // 504: it never answers
    let r = p.get("/dead", &key("k-503"));
    let v = problem(&r, 503);
    assert_eq!(v["type"], "urn:portcullis:problem:no-backend", "{v}");
    assert_eq!(
        Some(v["retry_after"].as_u64().expect("retry_after")),
        r.retry_after()
    );
    let v = problem(&p.get("/close", &key("k-502")), 502);
    assert_eq!(v["type"], "urn:portcullis:problem:upstream-error", "{v}");
    let v = problem(&p.get("/hang", &key("k-504")), 504);
    assert_eq!(v["type"], "urn:portcullis:problem:upstream-timeout", "{v}");

    // 408: a header that never completes, answered by the client stream itself
    let mut c = Conn::open(&addr).expect("connect");
    c.write_raw(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    let v = problem(&c.read_response().expect("408"), 408);
    assert!(v.get("request_id").is_none(), "no request yet, no id: {v}");

    // The shed request's id is the one its access log line has.
    eventually(
        DEADLINE,
        || format!("no log line with {shed_id}"),
        || {
            fs::read_to_string(log.path())
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    l.contains(&format!("\"request_id\":\"{shed_id}\"")) && l.contains("/shed")
                })
        },
    );
}

/// A page and its config: `429` from `page`, `format = "problem_json"` for the rest, a
/// limit of one request per key and hour, h2c on the listener.
fn page_proxy(backend: &Backend, dir: &Path, page: &str) -> (Proxy, std::path::PathBuf) {
    let file = dir.join("429.html");
    fs::write(&file, page).expect("write page");
    let cfg = format!(
        "{}[rate_limit]\nkey = \"header:x-api-key\"\nlimit = 1\nwindow_seconds = 3600\n\
         missing_key = \"reject\"\n\
         [errors]\nformat = \"problem_json\"\n\
         [errors.pages]\n\"429\" = {{ file = \"{}\", content_type = \"text/html; charset=utf-8\" }}\n",
        one_upstream(backend),
        file.display()
    );
    (Proxy::start_with_server("h2c = true", &cfg), file)
}

/// HTTP/2 GET of `path` with `headers` by curl (prior knowledge): status, headers, body.
fn h2_get(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let head = dir.path().join("head");
    let mut args = vec![
        "--http2-prior-knowledge".to_string(),
        "-D".into(),
        head.display().to_string(),
        "-w".into(),
        "\n%{http_version} %{http_code}".into(),
    ];
    for (k, v) in headers {
        args.extend(["-H".into(), format!("{k}: {v}")]);
    }
    args.push(format!("http://{addr}{path}"));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = curl(&refs);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, tail) = text.rsplit_once('\n').expect("curl's -w line");
    assert!(tail.starts_with("2 "), "not HTTP/2: {tail}");
    let status = tail[2..].trim().parse().expect("status");
    let head = fs::read_to_string(head).unwrap_or_default();
    (status, head, body.to_string())
}

fn field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Before `[errors.pages]` a 429 was always the proxy's text. The page's `{status}`,
/// `{retry_after}` and `{request_id}` are filled in over HTTP/1.1 and HTTP/2, with its
/// content type, `Retry-After` and both RateLimit fields kept; the page wins over
/// `format` for its status only (a 401 is still problem details).
#[test]
fn a_custom_429_page_over_http1_and_http2() {
    let b = Backend::start("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let (p, _) = page_proxy(
        &b,
        dir.path(),
        "<h1>{status}</h1><p>again in {retry_after} s</p><!-- {request_id} -->\n",
    );
    assert_eq!(p.get("/", &[("x-api-key", "one")]).status, 200);
    let r = p.get("/", &[("x-api-key", "one"), ("x-request-id", "rid-1")]);
    assert_eq!(r.status, 429, "{}", r.body_str());
    let retry = r.retry_after().expect("Retry-After");
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(
        r.body_str(),
        format!("<h1>429</h1><p>again in {retry} s</p><!-- rid-1 -->\n")
    );
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert!(r.header("ratelimit-policy").is_some(), "{:?}", r.headers);
    assert!(r.header("ratelimit").is_some(), "{:?}", r.headers);

    // HTTP/2: the same key, limited too
    let (status, head, body) = h2_get(
        &p.addr(),
        "/",
        &[("x-api-key", "one"), ("x-request-id", "rid-2")],
    );
    assert_eq!(status, 429, "{head}{body}");
    let retry: u64 = field(&head, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After over HTTP/2");
    assert_eq!(
        body,
        format!("<h1>429</h1><p>again in {retry} s</p><!-- rid-2 -->\n")
    );
    assert_eq!(
        field(&head, "content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(field(&head, "ratelimit-policy").is_some(), "{head}");
    assert!(field(&head, "ratelimit").is_some(), "{head}");

    // no page for 401: problem details, over HTTP/2 too
    problem(&p.get("/", &[]), 401);
    let (status, head, body) = h2_get(&p.addr(), "/", &[]);
    assert_eq!(status, 401);
    assert_eq!(
        field(&head, "content-type"),
        Some("application/problem+json")
    );
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON over HTTP/2");
    assert_eq!(v["status"], 401);
}

/// A page is read at start and on reload only: a changed file is served after SIGHUP
/// and after POST /reload, not before (before `[errors.pages]` there was no page to
/// change), and a page that turns invalid (a FIFO) fails the reload: the old one stays.
#[test]
fn a_reload_picks_a_changed_page_up() {
    let b = Backend::start("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let (p, file) = page_proxy(&b, dir.path(), "first {status}");
    assert_eq!(p.get("/", &[("x-api-key", "k")]).status, 200);
    assert_eq!(p.get("/", &[("x-api-key", "k")]).body_str(), "first 429");

    // The file changes; nothing reads it until the reload.
    fs::write(&file, "second {status}").expect("rewrite page");
    assert_eq!(p.get("/", &[("x-api-key", "k")]).body_str(), "first 429");
    p.signal("HUP");
    eventually(
        DEADLINE,
        || "the changed page is served".into(),
        || p.get("/", &[("x-api-key", "k")]).body_str() == "second 429",
    );

    // POST /reload (a JSON client's, with no body) picks the next change up at once.
    fs::write(&file, "third {status}").expect("rewrite page");
    let reload = || {
        post(
            &p.admin_addr(),
            "/reload",
            &[("content-type", "application/json")],
            b"",
        )
    };
    let r = reload();
    assert_eq!(r.status, 200, "POST /reload: {}", r.body_str());
    assert_eq!(p.get("/", &[("x-api-key", "k")]).body_str(), "third 429");

    // A FIFO in its place: the reload fails naming the key, the page stays.
    fs::remove_file(&file).expect("remove page");
    mkfifo(&file);
    let r = reload();
    assert_ne!(r.status, 200, "a reload onto a FIFO page: {}", r.body_str());
    assert!(
        r.body_str().contains("errors.pages.429.file"),
        "{}",
        r.body_str()
    );
    assert_eq!(p.get("/", &[("x-api-key", "k")]).body_str(), "third 429");
}

fn mkfifo(path: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(st.success(), "mkfifo {}", path.display());
}

/// A page over 64 KiB, a FIFO (which would block the read), a missing file and a key
/// that is no status are `--check` errors naming the key and its line.
#[test]
fn check_refuses_a_2mb_page_a_fifo_and_a_missing_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big.html");
    fs::write(&big, vec![b'x'; 2 << 20]).expect("write big page");
    let fifo = dir.path().join("fifo.html");
    mkfifo(&fifo);
    let missing = dir.path().join("missing.html");
    let ok = dir.path().join("ok.html");
    fs::write(&ok, "ok").expect("write page");
    let cfg = |key: &str, file: &Path| {
        format!(
            "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:1\"]\n\n\
             [errors]\nformat = \"text\"\n\n[errors.pages]\n\"{key}\" = {{ file = \"{}\" }}\n",
            file.display()
        )
    };
    for (file, why) in [
        (&big, "larger than 64 KiB"),
        (&fifo, "FIFO"),
        (&missing, "No such file"),
    ] {
        let (code, _, err, path) = check_config(&cfg("429", file));
        assert_ne!(code, 0, "{} passed --check", file.display());
        assert!(
            err.contains(&format!("{path}:9:")) && err.contains("errors.pages.429.file"),
            "the key and its line: {err}"
        );
        assert!(err.contains(why), "{why}: {err}");
    }
    let (code, _, err, _) = check_config(&cfg("299", &ok));
    assert_ne!(code, 0);
    assert!(err.contains("errors.pages.299"), "{err}");
    let bad_type = cfg("503", &ok).replace(" }", ", content_type = \"text/html\\r\\nx: y\" }");
    let (code, _, err, _) = check_config(&bad_type);
    assert_ne!(code, 0, "{bad_type}");
    assert!(err.contains("errors.pages.503.content_type"), "{err}");
    let (code, out, err, _) = check_config(&cfg("503", &ok));
    assert_eq!(code, 0, "{out}{err}");
    // --check never waited on the FIFO: it is still there, unopened.
    assert!(fifo.exists());
}
