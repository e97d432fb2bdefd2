//! The operator's view (issue 42 item 5): `/status` and the HTML status page show, per
//! backend and per route, requests per second, the 2xx/4xx/5xx mix, p50/p99 latency and
//! what is open now, and a failing backend kept in rotation says why. Real binary, real
//! backends, real requests; the page in a real headless Chromium.

use portcullis_test_kit as support;

use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use serde_json::Value;
use support::*;

/// Seconds the traffic figures cover (`/status` says so in `window_seconds`).
const WINDOW: u64 = 10;

fn route<'a>(s: &'a Value, label: &str) -> &'a Value {
    s["routes"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["route"] == label))
        .unwrap_or_else(|| panic!("route {label} in {s}"))
}

fn backend<'a>(s: &'a Value, upstream: &str, addr: &str) -> &'a Value {
    s["upstreams"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == upstream))
        .and_then(|u| u["backends"].as_array())
        .and_then(|b| b.iter().find(|b| b["address"] == addr))
        .unwrap_or_else(|| panic!("backend {addr} of {upstream} in {s}"))
}

/// Polls `/status` (after `each`) until `cond` holds; panics with the last answer at the
/// deadline.
fn status_until(
    p: &Proxy,
    timeout: Duration,
    what: &str,
    mut each: impl FnMut(),
    cond: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    let met = wait_until(timeout, || {
        each();
        last = p.status_json();
        cond(&last)
    });
    assert!(met, "{what} within {timeout:?}: {last}");
    last
}

fn ms(v: &Value) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("a latency in ms, got {v}"))
}

/// Requests each backend received in one phase of `n` requests to `path`.
fn phase(p: &Proxy, path: &str, n: usize, a: &Backend, b: &Backend) -> (u64, u64) {
    a.reset_counters();
    b.reset_counters();
    for _ in 0..n {
        let r = p.get(path, &[]);
        assert!(r.status > 0);
    }
    (a.requests(), b.requests())
}

/// Every figure of a backend or route against what was sent: `(2xx, 4xx, 5xx)` and how
/// many of them took [`SLOW`].
fn check_traffic(what: &str, t: &Value, sent: (u64, u64, u64), slow: u64) {
    let total = sent.0 + sent.1 + sent.2;
    assert_eq!(t["window_seconds"], WINDOW, "{what}: {t}");
    assert_eq!(t["requests"], total, "{what}: {t}");
    let c = &t["codes"];
    assert_eq!(
        (&c["2xx"], &c["4xx"], &c["5xx"], &c["error"]),
        (
            &Value::from(sent.0),
            &Value::from(sent.1),
            &Value::from(sent.2),
            &Value::from(0)
        ),
        "{what}: {t}"
    );
    let rps = t["per_second"].as_f64().expect("per_second");
    assert!(
        (rps - total as f64 / WINDOW as f64).abs() < 1e-9,
        "{what}: {rps} req/s for {total} in {WINDOW} s"
    );
    // Fewer than half are slow: the median is a fast request (loopback: well under 50 ms).
    let p50 = ms(&t["p50_ms"]);
    assert!(p50 < 50.0, "{what}: p50 {p50} ms: {t}");
    // p99 is the request of rank ceil(0.99 n): with n ≤ 100 the slowest, so the slow one
    // when there is one. Buckets are within 12.5 %; the proxy adds a little.
    let p99 = ms(&t["p99_ms"]);
    let slow_ms = SLOW.as_secs_f64() * 1000.0;
    if slow > 0 {
        assert!(
            p99 >= slow_ms * 0.875 && p99 <= slow_ms * 1.125 + 50.0,
            "{what}: p99 {p99} ms with {slow} of {total} taking {slow_ms} ms: {t}"
        );
    } else {
        assert!(p99 < 50.0, "{what}: p99 {p99} ms: {t}");
    }
}

const SLOW: Duration = Duration::from_millis(200);

#[test]
fn status_shows_rate_mix_latency_and_open_requests_per_backend_and_route() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let cfg = format!(
        "{}\n[[routes]]\npath_prefix = \"/api\"\nupstream = \"app\"\n\n\
         [culling]\nenabled = false\n\n[access_log]\nenabled = false\n",
        upstream_of(&[&a, &b])
    );
    let p = Proxy::start(&cfg);

    // 40 × 200, 20 × 404, 10 × 500, then 2 slow 200s: 72 requests in about a second.
    let ok = phase(&p, "/api/ok", 40, &a, &b);
    a.set_mode(Mode::Fail(404));
    b.set_mode(Mode::Fail(404));
    let not_found = phase(&p, "/api/missing", 20, &a, &b);
    a.set_mode(Mode::Fail(500));
    b.set_mode(Mode::Fail(500));
    let failed = phase(&p, "/api/broken", 10, &a, &b);
    a.set_mode(Mode::Slow(SLOW));
    b.set_mode(Mode::Slow(SLOW));
    let slow = phase(&p, "/api/slow", 2, &a, &b);
    a.set_mode(Mode::Ok);
    b.set_mode(Mode::Ok);

    // The figures cover whole seconds: wait for the last one to end (never past the
    // window, which began less than two seconds ago).

    let s = status_until(
        &p,
        Duration::from_secs(5),
        "all 72 requests counted",
        || {},
        |s| route(s, "/api")["traffic"]["requests"] == 72,
    );
    let r = route(&s, "/api");
    assert_eq!(r["upstream"], "app");
    assert_eq!(r["path_prefix"], "/api");
    check_traffic("route /api", &r["traffic"], (42, 20, 10), 2);
    for (be, pick) in [(&a, 0), (&b, 1)] {
        let n = |x: (u64, u64)| if pick == 0 { x.0 } else { x.1 };
        let t = &backend(&s, "app", &be.addr())["traffic"];
        check_traffic(
            &format!("backend {}", be.name()),
            t,
            (n(ok) + n(slow), n(not_found), n(failed)),
            n(slow),
        );
    }
    // Nothing on the default route; culling is off, so nobody is failing "for a reason".
    assert_eq!(route(&s, "default")["traffic"]["requests"], 0);
    assert!(backend(&s, "app", &a.addr())["failing"].is_null());

    // Open requests: three held at the backends show on the route and on each backend.
    a.set_mode(Mode::Hold);
    b.set_mode(Mode::Hold);
    let addr = p.addr();
    let held: Vec<_> = (0..3)
        .map(|_| {
            let addr = addr.clone();
            thread::spawn(move || get(&addr, "/api/held", &[]).status)
        })
        .collect();
    eventually(
        DEADLINE,
        || "three requests held".into(),
        || a.in_flight() + b.in_flight() == 3,
    );
    status_until(
        &p,
        DEADLINE,
        "three open in /status",
        || {},
        |s| {
            let open = |be: &Backend| backend(s, "app", &be.addr())["inflight"].clone();
            route(s, "/api")["inflight"] == 3
                && open(&a) == a.in_flight() as u64
                && open(&b) == b.in_flight() as u64
        },
    );
    a.set_mode(Mode::Ok);
    b.set_mode(Mode::Ok);
    a.release_all();
    b.release_all();
    for h in held {
        assert_eq!(h.join().expect("client"), 200);
    }
    status_until(
        &p,
        DEADLINE,
        "nothing open once answered",
        || {},
        |s| {
            route(s, "/api")["inflight"] == 0
                && backend(s, "app", &a.addr())["inflight"] == 0
                && backend(s, "app", &b.addr())["inflight"] == 0
        },
    );
}

/// Send `n` requests (their answers do not matter).
fn send(p: &Proxy, n: usize) {
    for _ in 0..n {
        let _ = try_get(&p.addr(), "/", &[]);
    }
}

fn culling(threshold: u32, fraction: f64) -> String {
    format!(
        "[culling]\nerror_threshold = {threshold}\nwindow_seconds = 30\ncheck_interval_seconds = 1\n\
         cooldown_seconds = 600\nmax_culled_fraction = {fraction}\n\n[access_log]\nenabled = false\n"
    )
}

/// Where the page's screenshot goes (kept for a person to look at).
fn screenshot_path() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("operator-view.png")
}

#[test]
fn a_sole_backend_answering_errors_says_failing_last_backend_not_up() {
    let a = Backend::start("A");
    a.set_mode(Mode::Fail(500));
    // An upstream name with markup: the page shows it as text.
    let name = "<b>app</b>";
    let cfg = format!("{}\n{}", upstream_table(name, &[&a], ""), culling(5, 0.5));
    let p = Proxy::start(&cfg);
    send(&p, 60);

    let s = status_until(
        &p,
        DEADLINE,
        "failing: last_backend in /status",
        || {},
        |s| backend(s, name, &a.addr())["failing"] == "last_backend",
    );
    let row = backend(&s, name, &a.addr());
    assert_eq!(row["state"], "up", "kept in rotation: {row}");
    assert_eq!(row["traffic"]["codes"]["5xx"], row["traffic"]["requests"]);

    let Some(bin) = chromium() else {
        panic!("chromium is not installed: run scripts/setup.sh");
    };
    let url = format!("http://{}/", p.admin_addr());
    let dom = dump_dom(bin, &url);
    assert!(dom.contains("data-rendered=\"1\""), "rendered:\n{dom}");
    let start = dom
        .find(&format!("data-backend=\"{}\"", a.addr()))
        .expect("the backend's row");
    let row = &dom[start..start + dom[start..].find("</tr>").expect("row end")];
    assert!(
        row.contains(">failing: last backend<") && row.contains("badge bad"),
        "the row says why it is kept: {row}"
    );
    assert!(!row.contains("badge ok"), "no green badge: {row}");
    // the upstream's name is text, not markup
    assert!(
        dom.contains("&lt;b&gt;app&lt;/b&gt;"),
        "escaped name:\n{dom}"
    );
    assert!(
        !dom.contains("<b>app</b>"),
        "markup from the config:\n{dom}"
    );
    // the route table lists the default route with its traffic
    let routes = &dom[dom.find("id=\"routes\"").expect("routes")..];
    assert!(routes.contains("data-route=\"default\""), "{routes}");

    let shot = screenshot_path();
    let _ = std::fs::remove_file(&shot);
    screenshot(bin, &url, &shot, 1400, 1000);
    eprintln!("operator view screenshot: {}", shot.display());
}

#[test]
fn failing_backends_kept_in_rotation_say_over_fraction_then_systemic() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    c.set_mode(Mode::Fail(500));
    // 0.2 of three backends is none: C stands out but the fraction keeps it in.
    let cfg = format!("{}\n{}", upstream_of(&[&a, &b, &c]), culling(5, 0.2));
    let p = Proxy::start(&cfg);

    let s = status_until(
        &p,
        DEADLINE,
        "C failing: over_fraction",
        || {
            send(&p, 9);
        },
        |s| backend(s, "app", &c.addr())["failing"] == "over_fraction",
    );
    assert!(backend(&s, "app", &a.addr())["failing"].is_null(), "{s}");
    assert_eq!(backend(&s, "app", &c.addr())["state"], "up");
    // Now every backend fails alike: the systemic-failure guard keeps them all.
    a.set_mode(Mode::Fail(500));
    b.set_mode(Mode::Fail(500));
    status_until(
        &p,
        DEADLINE,
        "all failing: systemic",
        || {
            send(&p, 30);
        },
        |s| {
            [&a, &b, &c]
                .iter()
                .all(|x| backend(s, "app", &x.addr())["failing"] == "systemic")
        },
    );
}

/// Serve `page` at `/` and `status` at `/status` (HTTP/1.1, one request per
/// connection) for as long as the test process lives; returns the address.
fn serve_page(page: String, status: String) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // the rest of the head
            let mut h = String::new();
            while reader.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            let (ctype, body) = if line.starts_with("GET /status") {
                ("application/json", status.as_str())
            } else {
                ("text/html; charset=utf-8", page.as_str())
            };
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// The runtime API (issue 42 item 1) will add `source`, `by` and `reason` to each backend
/// of `/status`: the page shows them when present (as text), and nothing when absent.
#[test]
fn the_page_shows_a_manual_state_with_who_and_why_as_text() {
    let Some(bin) = chromium() else {
        panic!("chromium is not installed: run scripts/setup.sh");
    };
    // A real /status, with one backend given a manual state by hand.
    let a = Backend::start("A");
    let b = Backend::start("B");
    let p = Proxy::start(&format!(
        "{}\n[access_log]\nenabled = false\n",
        upstream_of(&[&a, &b])
    ));
    let page = p.admin_get("/").body_str();
    let mut s = p.status_json();
    let drained = &mut s["upstreams"][0]["backends"][0];
    drained["state"] = "draining".into();
    drained["source"] = "manual".into();
    drained["by"] = "alice".into();
    drained["reason"] = "deploy <img src=x onerror=alert(1)> & swap".into();
    let addr = serve_page(page, s.to_string());
    let dom = dump_dom(bin, &format!("http://{addr}/"));
    assert!(dom.contains("data-rendered=\"1\""), "rendered:\n{dom}");
    let row_of = |addr: &str| {
        let start = dom
            .find(&format!("data-backend=\"{addr}\""))
            .expect("the backend's row");
        dom[start..start + dom[start..].find("</tr>").expect("row end")].to_string()
    };
    let row = row_of(&a.addr());
    for needle in [
        ">draining<",
        ">manual<",
        ">alice<",
        "deploy &lt;img src=x onerror=alert(1)&gt; &amp; swap",
    ] {
        assert!(row.contains(needle), "{needle:?} in {row}");
    }
    assert!(
        !dom.contains("<img"),
        "the reason is text, not markup:\n{row}"
    );
    // the other backend has no manual state: nothing but a dash
    let other = row_of(&b.addr());
    assert!(
        other.contains("class=\"manual\"><span class=\"dim\">–</span></td>"),
        "{other}"
    );
    assert!(
        !other.contains(">manual<") && !other.contains("class=\"by\""),
        "{other}"
    );
}

/// An attempt given up for a retry counts on its backend: a backend answering 503s that
/// are retried on another shows them in its mix (and the route shows what clients got).
#[test]
fn retried_attempts_count_on_the_backend_that_failed_them() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    a.set_mode(Mode::Fail(503));
    let p = Proxy::start(&balanced_app(
        &[&a, &b],
        "retries = 1\nretry_budget_ratio = 1.0",
    ));
    for _ in 0..20 {
        assert_eq!(p.get("/", &[]).status, 200, "retried on B");
    }
    let (to_a, to_b) = (a.requests(), b.requests());
    assert!(to_a > 0, "A was tried");
    let s = status_until(
        &p,
        Duration::from_secs(5),
        "every attempt counted",
        || {},
        |s| {
            let n = |be: &Backend| backend(s, "app", &be.addr())["traffic"]["requests"].clone();
            n(&a) == to_a && n(&b) == to_b
        },
    );
    let ta = &backend(&s, "app", &a.addr())["traffic"];
    assert_eq!(ta["codes"]["5xx"], to_a, "{ta}");
    let tb = &backend(&s, "app", &b.addr())["traffic"];
    assert_eq!(tb["codes"]["2xx"], to_b, "{tb}");
    let r = &s["routes"][0]["traffic"];
    assert_eq!(
        (&r["requests"], &r["codes"]["2xx"]),
        (&20.into(), &20.into()),
        "{r}"
    );
}
