//! HAProxy and portcullis side by side: the real `haproxy` (Debian's package; scripts/setup.sh
//! installs it) on a corpus file, and the real `portcullis` on what `import-haproxy` made of
//! the same file, in front of the same real backends. The same requests must get the same
//! statuses, reach the same backends, and show the same added and removed headers;
//! a rate limit, denies and redirects included. The corpus files take their addresses
//! from the environment (`"${FE_ADDR}"`, `"${BE1}"`...), which HAProxy expands and the
//! importer expands the same way.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use portcullis_test_kit::*;

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/haproxy")
        .join(name)
}

/// The haproxy binary; a missing one fails the test (CI installs it with scripts/setup.sh).
fn haproxy_bin() -> String {
    for p in ["haproxy", "/usr/sbin/haproxy"] {
        if Command::new(p)
            .arg("-v")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return p.to_string();
        }
    }
    panic!("haproxy is not installed: run scripts/setup.sh (apt-get install haproxy)");
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// HAProxy and portcullis on the same corpus file and backends.
struct Pair {
    haproxy: String,
    portcullis: String,
    _procs: Vec<Killed>,
    _dir: tempfile::TempDir,
}

fn start_pair(file: &str, backends: &[(&str, &Backend)]) -> Pair {
    let bin = haproxy_bin();
    let dir = tempfile::tempdir().expect("tempdir");
    let h_addr = format!("127.0.0.1:{}", free_port());
    let p_addr = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let be: Vec<(String, String)> = backends
        .iter()
        .map(|(k, b)| (k.to_string(), b.addr()))
        .collect();
    // portcullis: import with its own front address
    let out = dir.path().join("portcullis.toml");
    let o = Command::new(&*BIN)
        .arg("import-haproxy")
        .arg(corpus(file))
        .arg("--out")
        .arg(&out)
        .env("FE_ADDR", &p_addr)
        .envs(be.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("import-haproxy");
    assert!(
        matches!(o.status.code(), Some(0 | 3)),
        "import failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // the test's own admin port and upgrade socket (the output's defaults are fixed ports)
    let toml = std::fs::read_to_string(&out)
        .expect("read output")
        .replacen(
            "admin_listen = \"127.0.0.1:9090\"",
            &format!(
                "admin_listen = \"{admin}\"\nupgrade_sock = \"{}\"",
                dir.path().join("up.sock").display()
            ),
            1,
        );
    std::fs::write(&out, &toml).expect("write output");
    let plog = std::fs::File::create(dir.path().join("portcullis.log")).expect("log");
    let p = Command::new(&*BIN)
        .arg("-c")
        .arg(&out)
        .stdout(Stdio::from(plog.try_clone().expect("clone")))
        .stderr(Stdio::from(plog))
        .spawn()
        .expect("spawn portcullis");
    let hlog = std::fs::File::create(dir.path().join("haproxy.log")).expect("log");
    let h = Command::new(&bin)
        .arg("-db")
        .arg("-f")
        .arg(corpus(file))
        .env("FE_ADDR", &h_addr)
        .envs(be.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::from(hlog.try_clone().expect("clone")))
        .stderr(Stdio::from(hlog))
        .spawn()
        .expect("spawn haproxy");
    let procs = vec![Killed(p), Killed(h)];
    let ready = |addr: &str| {
        wait_until(Duration::from_secs(20), || {
            try_get(addr, "/__ready", &[]).is_ok()
        })
    };
    let logs = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap_or_default();
    assert!(ready(&h_addr), "haproxy not ready: {}", logs("haproxy.log"));
    assert!(
        ready(&p_addr),
        "portcullis not ready: {}\n{toml}",
        logs("portcullis.log")
    );
    Pair {
        haproxy: h_addr,
        portcullis: p_addr,
        _procs: procs,
        _dir: dir,
    }
}

/// What a request gave: status, the backend that answered, Location, and the headers
/// the test looks at (response side) and those the backend received.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Seen {
    status: u16,
    backend: Option<String>,
    location: Option<String>,
    response: Vec<(String, Option<String>)>,
    received: Vec<(String, Option<String>)>,
}

struct Req<'a> {
    method: &'a str,
    path: &'a str,
    headers: &'a [(&'a str, &'a str)],
}

fn req<'a>(method: &'a str, path: &'a str, headers: &'a [(&'a str, &'a str)]) -> Req<'a> {
    Req {
        method,
        path,
        headers,
    }
}

fn send(
    addr: &str,
    r: &Req<'_>,
    backends: &[&Backend],
    resp_headers: &[&str],
    recv_headers: &[&str],
) -> Seen {
    for b in backends {
        b.reset_counters();
    }
    let resp = try_request(addr, r.method, r.path, r.headers, b"")
        .unwrap_or_else(|e| panic!("{} {} via {addr}: {e}", r.method, r.path));
    let backend = resp.header("x-backend").map(String::from);
    let got = backends
        .iter()
        .find(|b| Some(b.name()) == backend.as_deref())
        .and_then(|b| b.last_received());
    Seen {
        status: resp.status,
        backend,
        location: resp.header("location").map(String::from),
        response: resp_headers
            .iter()
            .map(|h| (h.to_string(), resp.header(h).map(String::from)))
            .collect(),
        received: recv_headers
            .iter()
            .map(|h| {
                (
                    h.to_string(),
                    got.as_ref().and_then(|g| g.header(h).map(String::from)),
                )
            })
            .collect(),
    }
}

fn same(
    pair: &Pair,
    r: Req<'_>,
    backends: &[&Backend],
    resp_headers: &[&str],
    recv_headers: &[&str],
) -> Seen {
    let h = send(&pair.haproxy, &r, backends, resp_headers, recv_headers);
    let p = send(&pair.portcullis, &r, backends, resp_headers, recv_headers);
    assert_eq!(
        p, h,
        "{} {} {:?}: portcullis (left) and HAProxy (right) differ",
        r.method, r.path, r.headers
    );
    h
}

#[test]
fn rate_limit_deny_and_header_rules() {
    let api = Backend::start("api1");
    let web = Backend::start("web1");
    let pair = start_pair("rate-limit.cfg", &[("BE1", &api), ("BE2", &web)]);
    let bs = [&api, &web];
    let resp_h = ["x-echo-method", "x-echo-path"];
    let recv_h = ["x-edge", "x-debug"];
    // header rules: X-Edge set, X-Debug removed, X-Echo-Method removed from the answer
    let s = same(
        &pair,
        req("GET", "/", &[("X-Debug", "1"), ("X-Edge", "client")]),
        &bs,
        &resp_h,
        &recv_h,
    );
    assert_eq!(s.status, 200);
    assert_eq!(s.backend.as_deref(), Some("web1"));
    assert_eq!(s.received[0].1.as_deref(), Some("portcullis-test"));
    assert_eq!(s.received[1].1, None);
    assert_eq!(s.response[0].1, None);
    assert_eq!(s.response[1].1.as_deref(), Some("/"));
    // the deny
    let s = same(&pair, req("GET", "/admin/users", &[]), &bs, &[], &[]);
    assert_eq!(s.status, 403);
    // the rate limit: 5 API requests per 10 s per client, the 6th refused with 429
    for i in 0..5 {
        let s = same(
            &pair,
            req("GET", &format!("/api/{i}"), &[]),
            &bs,
            &[],
            &recv_h,
        );
        assert_eq!((s.status, s.backend.as_deref()), (200, Some("api1")));
    }
    let s = same(&pair, req("GET", "/api/6", &[]), &bs, &[], &[]);
    assert_eq!(s.status, 429);
    // other paths are not limited
    let s = same(&pair, req("GET", "/page", &[]), &bs, &[], &[]);
    assert_eq!((s.status, s.backend.as_deref()), (200, Some("web1")));
}

#[test]
fn routing_checks_redirects_and_negated_conditions() {
    let api1 = Backend::start("api1");
    let api2 = Backend::start("api2");
    let st = Backend::start("pong-static");
    let web1 = Backend::start("web1");
    let web2 = Backend::start("web2");
    let pair = start_pair(
        "backends-checks.cfg",
        &[
            ("BE1", &api1),
            ("BE2", &api2),
            ("BE3", &st),
            ("BE4", &web1),
            ("BE5", &web2),
        ],
    );
    let bs = [&api1, &api2, &st, &web1, &web2];
    let resp_h = ["x-served-by"];
    let recv_h = ["x-forwarded-host", "x-forwarded-for"];
    // host routing and a conditional header
    let s = same(
        &pair,
        req("GET", "/v1/users", &[("Host", "api.example.test")]),
        &bs,
        &resp_h,
        &recv_h,
    );
    assert_eq!(s.backend.as_deref(), Some("api1")); // api2 is the backup
    assert_eq!(s.received[0].1.as_deref(), Some("api"));
    // path routing: static unless a write
    let s = same(
        &pair,
        req("GET", "/assets/a.css", &[]),
        &bs,
        &resp_h,
        &recv_h,
    );
    assert_eq!(s.backend.as_deref(), Some("pong-static"));
    let s = same(
        &pair,
        req("POST", "/static/upload", &[]),
        &bs,
        &resp_h,
        &recv_h,
    );
    assert_eq!(s.status, 200);
    assert!(s.backend.as_deref().is_some_and(|b| b.starts_with("web")));
    // the deny unless internal: the test client is 127.0.0.1, internal
    let s = same(&pair, req("GET", "/private/x", &[]), &bs, &[], &[]);
    assert_eq!(s.status, 200);
    // the redirect of an exact path
    let s = same(&pair, req("GET", "/old.css", &[]), &bs, &[], &[]);
    assert_eq!(
        (s.status, s.location.as_deref()),
        (301, Some("/static/new.css"))
    );
    // round robin over web1 and web2 (web3 is disabled): both reached on both proxies
    let mut reached_h = BTreeSet::new();
    let mut reached_p = BTreeSet::new();
    for _ in 0..6 {
        let r = req("GET", "/home", &[]);
        reached_h.insert(send(&pair.haproxy, &r, &bs, &[], &[]).backend);
        reached_p.insert(send(&pair.portcullis, &r, &bs, &[], &[]).backend);
    }
    assert_eq!(reached_p, reached_h);
    assert_eq!(reached_h.len(), 2, "{reached_h:?}");
}

#[test]
fn named_defaults_or_conditions_and_response_headers() {
    let web = Backend::start("w1");
    let api = Backend::start("a1");
    let pair = start_pair("named-defaults.cfg", &[("BE1", &web), ("BE2", &api)]);
    let bs = [&web, &api];
    let resp_h = ["x-frontend"];
    for (m, path, want) in [
        ("GET", "/", "w1"),
        ("GET", "/v2/items", "a1"),
        ("POST", "/form", "a1"),
        ("GET", "/v2", "w1"),
    ] {
        let s = same(&pair, req(m, path, &[]), &bs, &resp_h, &[]);
        assert_eq!(
            (s.status, s.backend.as_deref()),
            (200, Some(want)),
            "{m} {path}"
        );
        assert_eq!(s.response[0].1.as_deref(), Some("edge"));
    }
}

#[test]
fn debian_default_round_robin() {
    let a = Backend::start("app1");
    let b = Backend::start("app2");
    let pair = start_pair("debian-default.cfg", &[("BE1", &a), ("BE2", &b)]);
    let bs = [&a, &b];
    let mut reached_h = BTreeSet::new();
    let mut reached_p = BTreeSet::new();
    for i in 0..4 {
        let path = format!("/{i}");
        let r = req("GET", &path, &[]);
        let h = send(&pair.haproxy, &r, &bs, &[], &[]);
        let p = send(&pair.portcullis, &r, &bs, &[], &[]);
        assert_eq!((p.status, h.status), (200, 200));
        reached_h.insert(h.backend);
        reached_p.insert(p.backend);
    }
    assert_eq!(reached_p, reached_h);
    assert_eq!(reached_h.len(), 2);
}
