//! `portcullis import-haproxy` on the corpus of tests/haproxy/: each file's report (its
//! counts and specific lines), its output, and `portcullis --check` on the output; a
//! syntax error exits 2 naming the line, an unknown directive exits 3 naming it.

use std::path::{Path, PathBuf};
use std::process::Command;

use portcullis_test_kit::*;

struct Run {
    code: i32,
    stderr: String,
    toml: String,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Run {
    fn line(&self, n: usize) -> &str {
        let p = format!("{n}: ");
        self.stderr
            .lines()
            .find(|l| l.starts_with(&p))
            .unwrap_or_else(|| panic!("no report line {n} in:\n{}", self.stderr))
    }
    fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for l in self.stderr.lines() {
            if l.ends_with(": translated") {
                c.0 += 1;
            } else if l.contains(": approximated: ") {
                c.1 += 1;
            } else if l.contains(": unsupported: ") {
                c.2 += 1;
            }
        }
        c
    }
}

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/haproxy")
        .join(name)
}

fn import(name: &str, env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("portcullis.toml");
    let o = Command::new(&*BIN)
        .arg("import-haproxy")
        .arg(corpus(name))
        .arg("--out")
        .arg(&out)
        .env_remove("FE_ADDR")
        .envs(env.iter().copied())
        .output()
        .expect("run import-haproxy");
    Run {
        code: o.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        toml: std::fs::read_to_string(&out).unwrap_or_default(),
        out,
        _dir: dir,
    }
}

/// Every non-blank, non-comment line of a section body is reported exactly once.
fn every_directive_reported(name: &str, r: &Run) {
    let text = std::fs::read_to_string(corpus(name)).expect("read corpus");
    let headers = [
        "global",
        "defaults",
        "frontend",
        "backend",
        "listen",
        "resolvers",
        "userlist",
    ];
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let kw = t.split_whitespace().next().unwrap_or("");
        let n = i + 1;
        let hits = r
            .stderr
            .lines()
            .filter(|x| x.starts_with(&format!("{n}: ")))
            .count();
        if headers.contains(&kw) && !matches!(kw, "resolvers" | "userlist") {
            assert!(hits <= 1, "{name}:{n} reported {hits} times");
        } else {
            assert_eq!(
                hits, 1,
                "{name}:{n} ({t}) reported {hits} times:\n{}",
                r.stderr
            );
        }
    }
}

fn checks(r: &Run) {
    let (code, out, err) = check_config_file(&r.out);
    assert_eq!(code, 0, "--check failed: {out}{err}\n{}", r.toml);
}

#[test]
fn debian_default() {
    let r = import("debian-default.cfg", &[]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    every_directive_reported("debian-default.cfg", &r);
    assert!(r.line(4).contains("log: approximated"), "{}", r.line(4));
    assert!(r.line(20).ends_with("ssl-default-bind-options: approximated: ssl-min-ver is [tls] min_version; other options keep OpenSSL's defaults"));
    assert!(r.line(27).ends_with("timeout connect: translated"));
    assert!(r
        .line(33)
        .contains("errorfile: unsupported: portcullis writes no 500"));
    assert!(r.line(34).contains("errorfile: approximated"));
    assert!(r.line(43).ends_with("balance: translated"));
    assert_eq!(r.counts(), (11, 22, 1), "{}", r.stderr);
    assert!(r.toml.contains("connect_timeout_ms = 5000"), "{}", r.toml);
    assert!(r.toml.contains("read_timeout_ms = 50000"));
    assert!(r.toml.contains("[errors.pages]"));
    assert!(r.toml.contains("# backend app, lines"));
    // the page body is written without HAProxy's status line
    let page = r
        .out
        .parent()
        .map(|d| d.join("errors/503.html"))
        .expect("dir");
    let body = std::fs::read_to_string(&page).unwrap_or_default();
    assert!(
        body.contains("503 Service Unavailable") && !body.starts_with("HTTP/1.0"),
        "{body}"
    );
    checks(&r);
}

#[test]
fn stats_listener_with_auth() {
    let r = import("stats-auth.cfg", &[]);
    assert_eq!(r.code, 3);
    every_directive_reported("stats-auth.cfg", &r);
    assert!(r.line(3).ends_with("maxconn: translated"));
    assert!(r.line(4).ends_with("nbthread: translated"));
    assert!(r
        .line(16)
        .contains("stats uri: approximated: the status page is /status"));
    assert!(r.line(18).contains("stats auth: unsupported"));
    assert!(r.line(28).ends_with("server: translated"));
    assert_eq!(r.counts(), (17, 4, 1), "{}", r.stderr);
    assert!(
        r.toml.contains("admin_listen = \"127.0.0.1:8404\""),
        "{}",
        r.toml
    );
    assert!(r.toml.contains("max_connections = 4096"));
    assert!(r.toml.contains("threads = 2"));
    assert!(r.toml.contains("client_header_timeout_ms = 10000"));
    assert!(r.toml.contains("interval_ms = 3000"));
    assert!(r.toml.contains("expect_status = \"200\""));
    checks(&r);
}

#[test]
fn tls_frontends_with_redirects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = make_cert(
        dir.path(),
        "site",
        "www.example.test",
        &["www.example.test"],
    );
    let (cert, key) = (c.cert, c.key);
    let pem = dir.path().join("combined.pem");
    let both = format!(
        "{}{}",
        std::fs::read_to_string(&cert).expect("cert"),
        std::fs::read_to_string(&key).expect("key")
    );
    std::fs::write(&pem, both).expect("pem");
    let r = import(
        "tls-redirects.cfg",
        &[("CRT", pem.to_str().expect("utf-8"))],
    );
    assert_eq!(r.code, 3);
    every_directive_reported("tls-redirects.cfg", &r);
    assert!(r.line(15).contains("http-request redirect: unsupported: portcullis's routes apply to cleartext and TLS listeners alike"));
    assert!(
        r.line(18)
            .ends_with("bind: approximated: bind option 'alpn' is not translated")
            || r.line(18).ends_with("bind: translated"),
        "{}",
        r.line(18)
    );
    assert!(r.line(21).ends_with("http-request redirect: translated"));
    assert!(r.line(22).ends_with("http-request redirect: translated"));
    assert!(r.line(23).ends_with("http-response set-header: translated"));
    assert!(
        r.toml
            .contains("location = \"https://www.example.test{path_and_query}\""),
        "{}",
        r.toml
    );
    assert!(r.toml.contains("location = \"/news/\""));
    assert!(r.toml.contains("min_version = \"1.2\""));
    assert!(r.toml.contains("listen = [\"0.0.0.0:443\"]"));
    assert!(r
        .toml
        .contains("\"strict-transport-security\" = \"max-age=63072000\""));
    assert_eq!(r.counts(), (16, 2, 1), "{}", r.stderr);
    checks(&r);
}

#[test]
fn stick_table_rate_limits() {
    let r = import("rate-limit.cfg", &[]);
    every_directive_reported("rate-limit.cfg", &r);
    assert!(r.line(13).ends_with("stick-table: translated"));
    assert!(r.line(15).ends_with("http-request track-sc0: translated"));
    assert!(r
        .line(16)
        .contains("http-request deny: approximated: a refused request does not count"));
    assert!(r.line(25).contains("balance: approximated: least requests"));
    assert!(r.toml.contains("[[rate_limit.policies]]"), "{}", r.toml);
    assert!(r
        .toml
        .contains("limit = 5\nwindow_seconds = 10\npath_prefix = \"/api\""));
    assert!(r.toml.contains("max_conn = 100"));
    assert_eq!(r.counts(), (18, 3, 0), "{}", r.stderr);
    assert_eq!(r.code, 3);
    checks(&r);
}

#[test]
fn several_backends_with_checks() {
    let r = import("backends-checks.cfg", &[]);
    every_directive_reported("backends-checks.cfg", &r);
    assert!(r.line(21).ends_with("http-request deny: translated"));
    assert!(r
        .line(22)
        .contains("http-request redirect: approximated: an exact path is matched as a prefix"));
    assert!(
        r.line(30).ends_with("balance: translated"),
        "{}",
        r.line(30)
    );
    assert!(r.line(33).ends_with("http-check send: translated"));
    assert!(r.line(46).ends_with("option httpchk: translated"));
    assert!(r.line(49).contains("disabled server is left out"));
    assert!(
        r.toml.contains("host = \"api.example.test\"\nheaders")
            || r.toml.contains("host = \"api.example.test\""),
        "{}",
        r.toml
    );
    assert!(r.toml.contains("expect_body = \"pong\""));
    assert!(r.toml.contains("fast_interval_ms = 1000"));
    assert!(r.toml.contains("backup = true"));
    assert!(r
        .toml
        .contains("balance = \"consistent_hash\"\nhash_key = \"client_ip\""));
    assert!(r.toml.contains("hash_key = \"path\""));
    assert!(r
        .toml
        .contains("client_cidrs = [\"10.0.0.0/8\", \"127.0.0.0/8\"]"));
    assert_eq!(r.counts(), (35, 6, 0), "{}", r.stderr);
    assert_eq!(r.code, 3);
    checks(&r);
}

#[test]
fn tcp_sections_are_unsupported() {
    let r = import("tcp-mode.cfg", &[]);
    assert_eq!(r.code, 3);
    every_directive_reported("tcp-mode.cfg", &r);
    for n in [8, 9, 10, 11, 13, 14, 15, 16, 17, 19, 20, 21, 22] {
        assert!(r.line(n).contains("unsupported"), "{}", r.line(n));
    }
    assert!(r.line(14).contains("mode tcp"));
    assert!(!r.toml.contains("mysql"));
    assert!(r.toml.contains("upstream = \"site\""));
    assert_eq!(r.counts(), (8, 1, 13), "{}", r.stderr);
    checks(&r);
}

#[test]
fn server_templates() {
    let r = import("server-template.cfg", &[]);
    assert_eq!(r.code, 3);
    every_directive_reported("server-template.cfg", &r);
    assert!(r
        .line(2)
        .contains("resolvers: unsupported: 'resolvers' sections"));
    assert!(r.line(3).contains("unsupported: 'resolvers' sections"));
    assert!(
        r.line(19).contains("server-template: approximated:")
            && r.line(19).contains("one backend on app.service.test:8080"),
        "{}",
        r.line(19)
    );
    assert!(r.toml.contains("port = 8081"), "{}", r.toml);
    assert_eq!(r.counts(), (9, 2, 3), "{}", r.stderr);
    assert!(
        r.toml
            .contains("{ name = \"app\", address = \"app.service.test:8080\" }"),
        "{}",
        r.toml
    );
}

#[test]
fn named_defaults_and_from() {
    let r = import("named-defaults.cfg", &[]);
    every_directive_reported("named-defaults.cfg", &r);
    assert!(r.line(16).ends_with("use_backend: translated"));
    assert!(r.line(11).contains("balance: approximated"));
    // api takes api-defaults (timeout server 5s), web web-defaults (20s)
    let api = r.toml.find("name = \"api\"").expect("api upstream");
    let web = r.toml.find("name = \"web\"").expect("web upstream");
    assert!(
        r.toml[api..].contains("read_timeout_ms = 5000"),
        "{}",
        r.toml
    );
    assert!(r.toml[web..].contains("read_timeout_ms = 20000"));
    assert!(r.toml[api..].contains("balance = \"least_requests\""));
    assert!(r.toml.contains("methods = [\"POST\"]"));
    assert_eq!(r.counts(), (14, 2, 0), "{}", r.stderr);
    checks(&r);
}

#[test]
fn a_syntax_error_exits_2_naming_the_line() {
    let r = import("syntax-error.cfg", &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("line 6: unmatched quote"), "{}", r.stderr);
    assert!(r.toml.is_empty());
}

#[test]
fn an_unknown_directive_exits_3_naming_it() {
    let r = import("unknown-directive.cfg", &[]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains("9: frobnicate-requests: unsupported: unknown or untranslated directive in a 'frontend' section"),
        "{}",
        r.stderr
    );
    checks(&r);
}

#[test]
fn an_unreadable_file_exits_2() {
    let o = Command::new(&*BIN)
        .args(["import-haproxy", "/nonexistent/haproxy.cfg"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/haproxy.cfg"));
}

#[test]
fn a_fully_translated_file_exits_0_and_prints_to_stdout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("h.cfg");
    std::fs::write(
        &f,
        "defaults\n  mode http\n  timeout connect 1s\n  timeout server 2s\nfrontend f\n  bind 127.0.0.1:18080\n  default_backend b\nbackend b\n  server s1 127.0.0.1:9001\n",
    )
    .expect("write");
    let o = Command::new(&*BIN)
        .arg("import-haproxy")
        .arg(&f)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("8 translated, 0 approximated, 0 unsupported"),
        "{err}"
    );
    let toml = String::from_utf8_lossy(&o.stdout).into_owned();
    let (code, out, e) = check_config(&toml).into_tuple3();
    assert_eq!(code, 0, "{out}{e}\n{toml}");
}

trait Tuple3 {
    fn into_tuple3(self) -> (i32, String, String);
}
impl Tuple3 for (i32, String, String, String) {
    fn into_tuple3(self) -> (i32, String, String) {
        (self.0, self.1, self.2)
    }
}

#[test]
fn queueing_and_slow_start() {
    let r = import("queue-slowstart.cfg", &[]);
    every_directive_reported("queue-slowstart.cfg", &r);
    assert!(
        r.line(8).ends_with("timeout queue: translated"),
        "{}",
        r.stderr
    );
    assert!(r.line(17).contains("server: approximated: maxqueue"));
    assert!(r
        .line(22)
        .contains("the first server's slowstart is used for all"));
    let app = r.toml.find("name = \"app\"").expect("app upstream");
    let batch = r.toml.find("name = \"batch\"").expect("batch upstream");
    let (app, batch) = (&r.toml[app..batch], &r.toml[batch..]);
    assert!(app.contains("queue_timeout_ms = 5000"), "{}", r.toml);
    assert!(app.contains("max_queue = 200"));
    assert!(app.contains("slow_start_seconds = 30"));
    assert!(app.contains("max_conn = 32"));
    assert!(batch.contains("queue_timeout_ms = 5000"));
    assert!(batch.contains("slow_start_seconds = 10"));
    assert!(!batch.contains("max_queue"));
    assert_eq!(r.code, 3);
    checks(&r);
}
