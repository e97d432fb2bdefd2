//! Edge rules (issue 58, CONTRACT §21, routes): routes matched by `methods` and
//! `client_cidrs`, `deny` and `redirect` answered before every gate, header rules as
//! `request_headers` / `response_headers` tables over HTTP/1.1 and HTTP/2,
//! `rate_limit_policies` per route and `[server] unmatched`. Real binary, real backends
//! (the recording backend shows what arrived, and that a denied request never did).

use portcullis_test_kit as support;

use support::*;

/// A trusted balancer's address (`Conn::open_from`).
const LB: &str = "127.0.0.2";

fn get_from(p: &Proxy, source: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut c = Conn::open_from(&p.addr(), source).expect("connect");
    c.request("GET", path, headers, b"").expect("response")
}

fn request(p: &Proxy, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut c = Conn::open(&p.addr()).expect("connect");
    c.request(method, path, headers, b"").expect("response")
}

fn log_line(log: &std::path::Path, path: &str) -> Option<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .find(|l| l.contains(&format!("\"path\":\"{path}\"")))
        .map(str::to_string)
}

/// Before: `methods`, `client_cidrs` and `action` were unknown keys (the config was
/// refused), so nothing could keep a path, a method or a network away from the backend.
/// Now the denied requests get their status, the recording backend sees none of them,
/// they spend no rate-limit token, and they are logged and counted as `denied`. A route
/// whose method does not match falls back to the shorter prefix's route.
#[test]
fn deny_by_path_method_and_client_cidr_never_reaches_the_backend() {
    let b = Backend::start("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let cfg = format!(
        r#"{}
[[routes]]
path_prefix = "/admin"
action = "deny"

[[routes]]
path_prefix = "/api"
methods = ["DELETE"]
action = "deny"
status = 405

[[routes]]
path_prefix = "/internal"
action = "deny"

[[routes]]
path_prefix = "/internal"
client_cidrs = ["10.0.0.0/8"]
upstream = "app"

[[routes]]
path_prefix = "/"
upstream = "app"

[rate_limit]
key = "header:x-api-key"
limit = 2
window_seconds = 60

[access_log]
enabled = true
path = "{}"
"#,
        one_upstream(&b),
        log.display()
    );
    let p = Proxy::start_with_server("trusted_proxies = [\"127.0.0.2\"]", &cfg);
    let key = [("x-api-key", "k1")];
    for path in ["/admin", "/admin/users", "/admin?x=1"] {
        let r = p.get(path, &key);
        assert_eq!(r.status, 403, "{path}: {}", r.body_str());
    }
    let r = request(&p, "DELETE", "/api/items/1", &key);
    assert_eq!(r.status, 405, "{}", r.body_str());
    // From a trusted balancer, the client named by X-Forwarded-For decides.
    let outside = get_from(
        &p,
        LB,
        "/internal/a",
        &[("x-forwarded-for", "203.0.113.5"), key[0]],
    );
    assert_eq!(outside.status, 403, "{}", outside.body_str());
    // An ordinary client cannot claim an inside address.
    let forged = p.get("/internal/b", &[("x-forwarded-for", "10.1.2.3"), key[0]]);
    assert_eq!(forged.status, 403, "{}", forged.body_str());
    assert!(
        b.received().is_empty(),
        "a denied request reached the backend: {:?}",
        b.received_paths()
    );
    // Denied requests spent no token of the key's 2.
    let inside = get_from(
        &p,
        LB,
        "/internal/c",
        &[("x-forwarded-for", "10.1.2.3"), key[0]],
    );
    assert_eq!(inside.status, 200, "{}", inside.body_str());
    let get = request(&p, "GET", "/api/items/1", &key);
    assert_eq!(
        get.status,
        200,
        "GET falls back to the / route: {}",
        get.body_str()
    );
    assert_eq!(b.received_paths(), ["/internal/c", "/api/items/1"]);
    assert_eq!(p.get("/third", &key).status, 429, "the limit still holds");

    assert_eq!(
        p.metric(r#"portcullis_requests_total{outcome="denied"}"#),
        Some(6.0)
    );
    eventually(
        DEADLINE,
        || {
            format!(
                "no access-log line for /admin/users: {:?}",
                log_line(&log, "/admin/users")
            )
        },
        || log_line(&log, "/admin/users").is_some(),
    );
    let l = log_line(&log, "/admin/users").unwrap_or_default();
    assert!(l.contains("\"outcome\":\"denied\""), "{l}");
    assert!(l.contains("\"status\":403"), "{l}");
}

/// Before: no `client_cidrs`. With PROXY, the PROXY source is the client a route's
/// `client_cidrs` is matched against.
#[test]
fn client_cidrs_match_the_proxy_protocol_source() {
    let b = Backend::start("app");
    let cfg = format!(
        r#"{}
[[routes]]
path_prefix = "/"
client_cidrs = ["203.0.113.0/24"]
upstream = "app"

[[routes]]
path_prefix = "/"
action = "deny"
"#,
        one_upstream(&b)
    );
    let p = Proxy::start_with_server(
        "trusted_proxies = [\"127.0.0.2\"]\nproxy_protocol = true",
        &cfg,
    );
    let send = |src: &str, path: &str| {
        let mut c = Conn::open_from(&p.addr(), LB).expect("connect");
        c.write_raw(format!("PROXY TCP4 {src} 127.0.0.1 40000 80\r\n").as_bytes())
            .expect("write PROXY header");
        c.request("GET", path, &[], b"").expect("response")
    };
    assert_eq!(send("198.51.100.1", "/out").status, 403);
    assert_eq!(send("203.0.113.7", "/in").status, 200);
    assert_eq!(b.received_paths(), ["/in"]);
}

/// Before: no `redirect` action (HAProxy's `http-request redirect scheme https`). Now
/// the redirect keeps the path and the query, reaches no backend and counts as
/// `redirected`.
#[test]
fn redirect_to_https_keeps_the_path_and_query() {
    let b = Backend::start("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let cfg = format!(
        r#"{}
[[routes]]
host = "www.example.test"
path_prefix = "/"
action = "redirect"
status = 301
location = "https://{{host}}{{path_and_query}}"

[[routes]]
path_prefix = "/old"
action = "redirect"
location = "/new{{path}}"

[[routes]]
path_prefix = "/"
upstream = "app"

[access_log]
enabled = true
path = "{}"
"#,
        one_upstream(&b),
        log.display()
    );
    let p = Proxy::start_with_server("h2c = true", &cfg);
    let r = p.get("/a/b?x=1&y=%20z", &[("host", "www.example.test:8080")]);
    assert_eq!(r.status, 301, "{}", r.body_str());
    assert_eq!(
        r.header("location"),
        Some("https://www.example.test/a/b?x=1&y=%20z")
    );
    let r = p.get("/old/page", &[("host", "other.test")]);
    assert_eq!(r.status, 302, "{}", r.body_str());
    assert_eq!(r.header("location"), Some("/new/old/page"));
    // Over HTTP/2 too.
    let out = curl(&[
        "--http2-prior-knowledge",
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-H",
        "host: www.example.test",
        &format!("http://{}/h2?q=1", p.addr()),
    ]);
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/2 301"), "{head}");
    assert!(
        head.contains("\nlocation: https://www.example.test/h2?q=1"),
        "{head}"
    );
    assert!(b.received().is_empty(), "{:?}", b.received_paths());
    assert_eq!(p.get("/", &[("host", "other.test")]).status, 200);
    assert_eq!(
        p.metric(r#"portcullis_requests_total{outcome="redirected"}"#),
        Some(3.0)
    );
    eventually(
        DEADLINE,
        || {
            format!(
                "no access-log line for /old/page: {:?}",
                log_line(&log, "/old/page")
            )
        },
        || log_line(&log, "/old/page").is_some(),
    );
    let l = log_line(&log, "/old/page").unwrap_or_default();
    assert!(l.contains("\"outcome\":\"redirected\""), "{l}");
    assert!(l.contains("\"status\":302"), "{l}");
}

/// A second URL smuggled through the Host or the path never becomes the redirect's
/// target: a Host that is not a plain host name (`@`, `/`, `\`) is refused with 400,
/// and the path's bytes are escaped (`//evil` cannot become a protocol-relative URL,
/// an escaped CRLF stays escaped and starts no header).
#[test]
fn smuggling_through_host_or_path_never_changes_the_redirect_target() {
    let b = Backend::start("app");
    let cfg = format!(
        r#"{}
[[routes]]
path_prefix = "/go"
action = "redirect"
location = "https://{{host}}{{path_and_query}}"

[[routes]]
path_prefix = "/"
action = "redirect"
location = "{{path_and_query}}"
"#,
        one_upstream(&b)
    );
    let p = Proxy::start(&cfg);
    let raw = |bytes: String| send_raw(&p.addr(), bytes.as_bytes());
    for host in [
        "good.test@evil.test",
        "evil.test/x",
        "evil.test\\x",
        "good.test evil.test",
    ] {
        let out = raw(format!("GET /go/x HTTP/1.1\r\nHost: {host}\r\n\r\n"));
        let RawOutcome::Response(r) = out else {
            panic!("Host {host:?}: {out:?}");
        };
        assert_eq!(r.status, 400, "Host {host:?}: {:?}", r.headers);
        assert!(r.header("location").is_none(), "{host:?}");
    }
    // The target's authority is not the Host.
    let out = raw("GET http://evil.test/go/x HTTP/1.1\r\nHost: good.test\r\n\r\n".into());
    if let RawOutcome::Response(r) = out {
        let l = r.header("location").unwrap_or("");
        assert!(!l.contains("evil"), "{} {l}", r.status);
    }
    for (target, want) in [
        ("//evil.test/x", "/%2Fevil.test/x"),
        ("/%0d%0aSet-Cookie:%20a=1", "/%0d%0aSet-Cookie:%20a=1"),
    ] {
        let out = raw(format!("GET {target} HTTP/1.1\r\nHost: good.test\r\n\r\n"));
        let RawOutcome::Response(r) = out else {
            panic!("{target}: {out:?}");
        };
        assert_eq!(r.status, 302, "{target}");
        assert_eq!(r.header("location"), Some(want), "{target}");
        assert!(r.header("set-cookie").is_none());
    }
    let out = raw("GET /go//evil.test/?a=b HTTP/1.1\r\nHost: good.test\r\n\r\n".into());
    let RawOutcome::Response(r) = out else {
        panic!("{out:?}");
    };
    assert_eq!(
        r.header("location"),
        Some("https://good.test/go//evil.test/?a=b"),
        "the authority stays the Host"
    );
    assert!(b.received().is_empty(), "{:?}", b.received_paths());
}

fn header_config(b: &Backend, raw: &str) -> String {
    format!(
        r#"[[upstreams]]
name = "app"
backends = ["{}"]

[[upstreams]]
name = "raw"
backends = ["{raw}"]

[[routes]]
path_prefix = "/"
upstream = "app"
request_headers = {{ set = {{ "x-env" = "prod", "x-forwarded-proto" = "https" }}, add = {{ "x-tag" = "proxy" }}, remove = ["x-debug"] }}
response_headers = {{ set = {{ "x-frame-options" = "DENY" }}, add = {{ "x-extra" = "1" }}, remove = ["x-echo-method"] }}

[[routes]]
path_prefix = "/srv"
upstream = "raw"
response_headers = {{ remove = ["server"] }}
"#,
        b.addr()
    )
}

/// Before: `request_headers` / `response_headers` were unknown keys, and the older rules
/// ran before the proxy set `X-Forwarded-Proto` (HAProxy's `http-request set-header
/// X-Forwarded-Proto https` could not be said). Now set, add and remove apply after the
/// proxy's own fields, on HTTP/1.1 and HTTP/2 alike, and `Server` can be removed.
#[test]
fn header_rules_over_http1_and_http2() {
    let b = Backend::start("app");
    let raw = fixed_response_backend(
        b"HTTP/1.1 200 OK\r\nserver: leaky/1.0\r\nx-kept: k\r\ncontent-length: 2\r\n\r\nok",
    );
    let p = Proxy::start_with_server("h2c = true", &header_config(&b, &raw));

    let r = p.get(
        "/h1",
        &[("x-debug", "1"), ("x-tag", "client"), ("x-env", "dev")],
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(r.header("x-extra"), Some("1"));
    assert!(r.header("x-echo-method").is_none());
    assert_eq!(r.header("x-backend"), Some("app"));

    let out = curl(&[
        "--http2-prior-knowledge",
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-H",
        "x-debug: 1",
        "-H",
        "x-tag: client",
        &format!("http://{}/h2", p.addr()),
    ]);
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/2 200"), "{head}");
    assert!(head.contains("\nx-frame-options: deny"), "{head}");
    assert!(head.contains("\nx-extra: 1"), "{head}");
    assert!(!head.contains("x-echo-method"), "{head}");

    for path in ["/h1", "/h2"] {
        let got = b
            .received()
            .into_iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("backend never saw {path}"));
        assert_eq!(got.header("x-env"), Some("prod"), "{path}");
        assert_eq!(got.header("x-forwarded-proto"), Some("https"), "{path}");
        assert!(got.header("x-debug").is_none(), "{path}");
        assert_eq!(got.header_all("x-tag"), ["client", "proxy"], "{path}");
        assert!(
            got.header("x-request-id").is_some(),
            "{path}: the proxy's own stay"
        );
    }

    let r = p.get("/srv", &[]);
    assert_eq!(r.status, 200);
    assert!(r.header("server").is_none(), "{:?}", r.headers);
    assert_eq!(r.header("x-kept"), Some("k"));
    let out = curl(&[
        "--http2-prior-knowledge",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &format!("http://{}/srv", p.addr()),
    ]);
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/2 200"), "{head}");
    assert!(!head.contains("\nserver:"), "{head}");
    assert!(head.contains("\nx-kept: k"), "{head}");
}

/// Framing and hop-by-hop fields cannot be touched by a rule, unknown policy names and
/// bad redirects are refused, each at its key path.
#[test]
fn bad_rules_are_check_errors_at_their_key_path() {
    let base = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:1\"]\n\n[[rate_limit.policies]]\nname = \"api\"\nkey = \"header:x-api-key\"\nlimit = 5\n\n[[routes]]\npath_prefix = \"/\"\n";
    for (route, key, why) in [
        (
            "upstream = \"app\"\nresponse_headers = { set = { \"Content-Length\" = \"5\" } }",
            "routes[0].response_headers.set.Content-Length",
            "managed by the proxy",
        ),
        (
            "upstream = \"app\"\nrequest_headers = { remove = [\"transfer-encoding\"] }",
            "routes[0].request_headers.remove[0]",
            "managed by the proxy",
        ),
        (
            "upstream = \"app\"\nresponse_headers = { add = { \"connection\" = \"x\" } }",
            "routes[0].response_headers.add.connection",
            "managed by the proxy",
        ),
        (
            "upstream = \"app\"\nrate_limit_policies = [\"nope\"]",
            "routes[0].rate_limit_policies[0]",
            "\"nope\"",
        ),
        (
            "action = \"redirect\"\nlocation = \"//evil.test/\"",
            "routes[0].location",
            "absolute",
        ),
        (
            "action = \"redirect\"\nlocation = \"https://{host}\"\nstatus = 200",
            "routes[0].status",
            "redirect status",
        ),
        (
            "upstream = \"app\"\nmethods = [\"get\"]",
            "routes[0].methods[0]",
            "not a method",
        ),
        (
            "upstream = \"app\"\nclient_cidrs = [\"10.0.0.0/33\"]",
            "routes[0].client_cidrs[0]",
            "CIDR",
        ),
    ] {
        let (code, out, err, _) = check_config(&format!("{base}{route}\n"));
        let text = format!("{out}{err}");
        assert_ne!(code, 0, "{route}: accepted");
        assert!(text.contains(key) && text.contains(why), "{route}: {text}");
    }
    let (code, out, err, _) = check_config(&format!(
        "{base}upstream = \"app\"\nrate_limit_policies = [\"api\"]\nmethods = [\"GET\"]\nresponse_headers = {{ remove = [\"server\"] }}\n"
    ));
    assert_eq!(code, 0, "{out}{err}");
}

/// Before: every policy counted every route. A policy scoped to `api.example.test`
/// counts none of the requests to `www.example.test`.
#[test]
fn a_scoped_policy_counts_only_its_route() {
    let b = Backend::start("app");
    let cfg = format!(
        r#"{}
[[routes]]
host = "api.example.test"
path_prefix = "/"
upstream = "app"
rate_limit_policies = ["api"]

[[routes]]
host = "www.example.test"
path_prefix = "/"
upstream = "app"
rate_limit_policies = ["web"]

[rate_limit]
key = "header:x-api-key"
limit = 1000

[[rate_limit.policies]]
name = "api"
key = "header:x-api-key"
limit = 2
window_seconds = 60

[[rate_limit.policies]]
name = "web"
key = "header:x-api-key"
limit = 100
window_seconds = 60
"#,
        one_upstream(&b)
    );
    let p = Proxy::start(&cfg);
    let on = |host: &str| p.get("/", &[("host", host), ("x-api-key", "k")]).status;
    for _ in 0..4 {
        assert_eq!(on("www.example.test"), 200);
    }
    assert_eq!(on("api.example.test"), 200);
    assert_eq!(on("api.example.test"), 200);
    let r = p.get("/", &[("host", "api.example.test"), ("x-api-key", "k")]);
    assert_eq!(r.status, 429, "{}", r.body_str());
    assert!(
        r.header("ratelimit-policy").unwrap_or("").contains("api"),
        "{:?}",
        r.headers
    );
    assert_eq!(
        on("www.example.test"),
        200,
        "the api policy counts only its route"
    );
}

/// `[server] unmatched`: before, a request no route matched always went to the first
/// upstream; now that is the default, and `404` / `421` answer it without a backend.
#[test]
fn unmatched_with_each_of_its_values() {
    let b = Backend::start("app");
    let routes =
        "[[routes]]\nhost = \"api.example.test\"\npath_prefix = \"/\"\nupstream = \"app\"\n";
    let cfg = format!("{}{routes}", one_upstream(&b));
    for (server, want) in [
        ("", 200),
        ("unmatched = \"404\"", 404),
        ("unmatched = \"421\"", 421),
    ] {
        b.reset_counters();
        let p = Proxy::start_with_server(server, &cfg);
        let r = p.get("/x", &[("host", "other.test")]);
        assert_eq!(r.status, want, "{server:?}: {}", r.body_str());
        assert_eq!(
            b.requests(),
            u64::from(want == 200),
            "{server:?}: the backend's count"
        );
        assert_eq!(
            p.get("/x", &[("host", "api.example.test")]).status,
            200,
            "{server:?}: a matched request"
        );
    }
    // A reload picks a changed value up.
    let p = Proxy::start_with_server("unmatched = \"404\"", &cfg);
    let text = std::fs::read_to_string(p.config_path()).expect("config");
    p.rewrite_config_raw(&text.replace("unmatched = \"404\"", "unmatched = \"421\""));
    p.signal("HUP");
    eventually(
        DEADLINE,
        || "the reload never answered 421".to_string(),
        || p.get("/y", &[("host", "other.test")]).status == 421,
    );
}

/// The proxy's own answers of the edge rules take `[errors]` like every other: a deny
/// and an unmatched 404 are problem details with their own type when asked.
#[test]
fn denies_and_unmatched_answers_are_problem_details_when_asked() {
    let b = Backend::start("app");
    let routes = "[[routes]]\nhost = \"api.example.test\"\npath_prefix = \"/admin\"\naction = \"deny\"\n\
                  [[routes]]\nhost = \"api.example.test\"\npath_prefix = \"/\"\nupstream = \"app\"\n\
                  [errors]\nformat = \"problem_json\"\n";
    let p = Proxy::start_with_server(
        "unmatched = \"404\"",
        &format!("{}{routes}", one_upstream(&b)),
    );
    for (host, path, status, kind) in [
        ("api.example.test", "/admin/x", 403, "denied"),
        ("other.test", "/x", 404, "no-route"),
    ] {
        let r = p.get(path, &[("host", host)]);
        assert_eq!(r.status, status, "{}", r.body_str());
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        let v: serde_json::Value =
            serde_json::from_str(&r.body_str()).unwrap_or_else(|e| panic!("{e}: {}", r.body_str()));
        assert_eq!(v["status"], status, "{v}");
        assert_eq!(v["type"], format!("urn:portcullis:problem:{kind}"), "{v}");
    }
    assert_eq!(b.requests(), 0);
}
