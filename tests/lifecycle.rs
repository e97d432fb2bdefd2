//! Lifecycle end to end (CONTRACT §1 signals, §5.5): graceful shutdown under
//! continuous load, zero-downtime upgrade (`-u` + SIGQUIT) and hot reload
//! (SIGHUP and `POST /reload`). Real binary, real signals, real sockets.
//!
//! Every measured figure is printed with `eprintln!` (run with `--nocapture`, or
//! read nextest's captured output) so it can be reported.

use portcullis_test_kit as support;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use support::*;

// ---------------------------------------------------------------------------------------
// continuous load
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// A new TCP connection per request (the harder case around listener hand-over).
    NewConnection,
    /// One connection reused until the server says `Connection: close`.
    KeepAlive,
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::SeqCst);
        let mut e = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if e.len() < 20 {
            e.push(what);
        }
    }
}

/// Client threads that send GETs until `stop` is set. Every answer other than 200,
/// and every transport error, is a failed request.
struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    handles: Vec<JoinHandle<()>>,
    desc: String,
}

impl Load {
    fn start(addr: &str, new_conn: usize, keep_alive: usize, stop: Arc<AtomicBool>) -> Load {
        let tally = Arc::new(Tally::default());
        let mut handles = Vec::new();
        let styles = std::iter::repeat_n(Style::NewConnection, new_conn)
            .chain(std::iter::repeat_n(Style::KeepAlive, keep_alive));
        for (i, style) in styles.enumerate() {
            let addr = addr.to_string();
            let stop = Arc::clone(&stop);
            let tally = Arc::clone(&tally);
            handles.push(thread::spawn(move || {
                client(&addr, i, style, &stop, &tally)
            }));
        }
        Load {
            stop,
            tally,
            handles,
            desc: format!(
                "{new_conn} new-connection + {keep_alive} keep-alive client threads, ~1 ms pause"
            ),
        }
    }

    fn ok(&self) -> u64 {
        self.tally.ok.load(Ordering::SeqCst)
    }

    fn total(&self) -> u64 {
        self.ok() + self.tally.failed.load(Ordering::SeqCst)
    }

    /// Stops the clients (if not stopped already) and returns (ok, failed, first errors).
    fn finish(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles {
            h.join().expect("load client panicked");
        }
        let errors = self
            .tally
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (
            self.tally.ok.load(Ordering::SeqCst),
            self.tally.failed.load(Ordering::SeqCst),
            errors,
        )
    }
}

fn client(addr: &str, id: usize, style: Style, stop: &AtomicBool, tally: &Tally) {
    let mut conn: Option<Conn> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let path = format!("/load/{id}/{n}");
        let result = match style {
            Style::NewConnection => try_get(addr, &path, &[]),
            Style::KeepAlive => {
                let c = match conn.take() {
                    Some(c) => Ok(c),
                    None => Conn::open(addr),
                };
                c.and_then(|mut c| {
                    let r = c.request("GET", &path, &[], b"")?;
                    let close = r
                        .header("connection")
                        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
                    if !close {
                        conn = Some(c);
                    }
                    Ok(r)
                })
            }
        };
        match result {
            Ok(r) if r.status == 200 => {
                tally.ok.fetch_add(1, Ordering::SeqCst);
            }
            Ok(r) => tally.fail(format!(
                "{style:?} {path}: status {} body {:?}",
                r.status,
                r.body_str()
            )),
            Err(e) => tally.fail(format!("{style:?} {path}: {e}")),
        }
        // pacing, so a 2-core machine keeps room for the processes under test
        thread::sleep(Duration::from_millis(1));
    }
}

/// Polls `/readyz` every ~50 ms; on the first answer other than 200 (or when the
/// admin port stops answering) it sets `stop`. Returns when `stop` is set.
fn readiness_watcher(admin: String, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let ready = matches!(
                Conn::open_with_timeout(&admin, Duration::from_secs(2))
                    .and_then(|mut c| c.request("GET", "/readyz", &[], b"")),
                Ok(r) if r.status == 200
            );
            if !ready {
                stop.store(true, Ordering::SeqCst);
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    })
}

fn readyz(admin: &str) -> Option<u16> {
    Conn::open_with_timeout(admin, Duration::from_secs(2))
        .and_then(|mut c| c.request("GET", "/readyz", &[], b""))
        .ok()
        .map(|r| r.status)
}

/// Backends `fast` and `held` (holding its requests), and a proxy (drain 1 s, shutdown
/// timeout 30 s) in front of them, with one request to `held` in flight: its thread.
fn proxy_with_a_held_request() -> (Backend, Backend, Proxy, JoinHandle<std::io::Result<Resp>>) {
    let fast = Backend::start("fast");
    let held = Backend::start("held");
    held.set_mode(Mode::Hold);
    let p = Proxy::start_with_server(
        "drain_seconds = 1\nshutdown_timeout_seconds = 30\n",
        &two_upstreams(&fast, &held),
    );
    let req = spawn_get(&p.addr(), "/slow/held");
    eventually(
        DEADLINE,
        || "request never reached the held backend".into(),
        || held.in_flight() == 1,
    );
    (fast, held, p, req)
}

fn spawn_get(addr: &str, path: &str) -> JoinHandle<std::io::Result<Resp>> {
    let addr = addr.to_string();
    let path = path.to_string();
    thread::spawn(move || try_get(&addr, &path, &[]))
}

/// Upstream keys for load tests: a starved 2-core machine can take longer than the
/// default 1 s to complete a loopback connect to the test backend.
const STARVED: &str = "connect_timeout_ms = 5000\n";

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// `[[upstreams]] app` (fast) and `slow`, with `/slow` routed to `slow`.
fn two_upstreams(fast: &Backend, slow: &Backend) -> String {
    format!(
        "[rate_limit]\nenabled = false\n\n{}{}{}",
        upstream_table("app", &[fast], "connect_timeout_ms = 5000"),
        upstream_table(
            "slow",
            &[slow],
            "connect_timeout_ms = 5000\nread_timeout_ms = 20000"
        ),
        "[[routes]]\npath_prefix = \"/\"\nupstream = \"app\"\n\n\
         [[routes]]\npath_prefix = \"/slow\"\nupstream = \"slow\"\n"
    )
}

// ---------------------------------------------------------------------------------------
// SIGTERM
// ---------------------------------------------------------------------------------------

/// SIGTERM under continuous load: readiness fails within a second, clients that stop
/// when it fails see zero failed requests, in-flight slow requests complete, and the
/// process exits 0 right after the drain period.
#[test]
fn sigterm_drains_under_load_without_failures() {
    const DRAIN: u64 = 2;
    let fast = Backend::start("fast");
    let slow = Backend::start("slow");
    slow.set_mode(Mode::Slow(Duration::from_millis(1500)));
    let mut p = Proxy::start_with_server(
        &format!("drain_seconds = {DRAIN}\nshutdown_timeout_seconds = 10\n"),
        &two_upstreams(&fast, &slow),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let watcher = readiness_watcher(p.admin_addr(), Arc::clone(&stop));
    let load = Load::start(&p.addr(), 3, 3, Arc::clone(&stop));
    eventually(
        DEADLINE,
        || format!("load never got going: {} ok", load.ok()),
        || load.ok() >= 1000,
    );

    // slow requests in flight just before SIGTERM
    let slow_reqs: Vec<_> = (0..4)
        .map(|i| spawn_get(&p.addr(), &format!("/slow/{i}")))
        .collect();
    eventually(
        DEADLINE,
        || format!("slow backend in flight: {}", slow.in_flight()),
        || slow.in_flight() == 4,
    );

    let t0 = Instant::now();
    p.signal("TERM");
    eventually(
        Duration::from_secs(5),
        || "readyz never failed after SIGTERM".into(),
        || readyz(&p.admin_addr()) != Some(200),
    );
    let to_503 = t0.elapsed();
    assert_eq!(readyz(&p.admin_addr()), Some(503), "readyz while draining");

    // still proxied while draining, and told to close keep-alive connections
    let during = get(&p.addr(), "/during-drain", &[]);
    let during_at = t0.elapsed();
    assert_eq!(
        during.status,
        200,
        "proxied during drain: {}",
        during.body_str()
    );
    assert_eq!(
        during.header("connection").map(str::to_ascii_lowercase),
        Some("close".into()),
        "Connection: close while draining"
    );

    let status = p.expect_exit(Duration::from_secs(DRAIN + 15), "the proxy");
    let to_exit = t0.elapsed();
    assert!(
        status.success(),
        "exit status {status}; logs:\n{}",
        p.logs()
    );

    for (i, h) in slow_reqs.into_iter().enumerate() {
        let r = h.join().expect("slow client");
        match r {
            Ok(r) => assert_eq!(r.status, 200, "slow request {i}: {}", r.body_str()),
            Err(e) => panic!("slow request {i} failed: {e}; logs:\n{}", p.logs()),
        }
    }
    watcher.join().expect("watcher");
    let desc = load.desc.clone();
    let (ok, failed, errors) = load.finish();

    eprintln!(
        "[lifecycle] sigterm: SIGTERM -> readyz 503: {} ms",
        ms(to_503)
    );
    eprintln!(
        "[lifecycle] sigterm: request proxied {} ms after SIGTERM (drain {DRAIN} s)",
        ms(during_at)
    );
    eprintln!(
        "[lifecycle] sigterm: SIGTERM -> exit: {} ms (drain_seconds = {DRAIN}, 4 slow requests of 1.5 s in flight at SIGTERM), status {status}",
        ms(to_exit)
    );
    eprintln!(
        "[lifecycle] sigterm: load ({desc}, stop on readyz 503): {failed} failed / {} total",
        ok + failed
    );
    assert_eq!(failed, 0, "failed requests: {errors:#?}");
    assert!(ok > 0);
    assert!(
        to_503 <= Duration::from_secs(1),
        "readyz took {to_503:?} to fail"
    );
    assert!(
        to_exit >= Duration::from_secs(DRAIN),
        "exited before the drain period ended: {to_exit:?}"
    );
    assert!(
        to_exit <= Duration::from_millis(DRAIN * 1000 + 3000),
        "exit took {to_exit:?}, drain is {DRAIN} s"
    );
}

/// A request still in flight when the drain period ends keeps the process alive
/// (listeners closed, nothing new accepted) and the process exits as soon as it
/// completes — not after `shutdown_timeout_seconds`.
#[test]
fn inflight_request_outlives_the_listeners_then_exit_is_prompt() {
    let (_fast, held, mut p, req) = proxy_with_a_held_request();
    let t0 = Instant::now();
    p.signal("TERM");
    eventually(
        Duration::from_secs(5),
        || "readyz never failed".into(),
        || readyz(&p.admin_addr()) == Some(503),
    );
    // after the drain period the proxy stops taking requests...
    let listen: SocketAddr = p.addr().parse().expect("addr");
    let mut how = String::new();
    eventually(
        Duration::from_secs(15),
        || "the proxy still serves new requests long after the drain period".into(),
        || match TcpStream::connect_timeout(&listen, Duration::from_millis(500)) {
            Err(e) => {
                how = format!("connect fails ({e})");
                true
            }
            Ok(_) => match Conn::open_with_timeout(&p.addr(), Duration::from_millis(500))
                .and_then(|mut c| c.request("GET", "/after", &[], b""))
            {
                Ok(r) if r.status == 200 => false,
                other => {
                    how = format!("connect succeeds, request gets {other:?}");
                    true
                }
            },
        },
    );
    let closed_at = t0.elapsed();
    // ...but stays up for the request in flight
    assert!(
        p.is_running(),
        "exited with a request in flight; logs:\n{}",
        p.logs()
    );
    assert!(!req.is_finished(), "held request finished early");
    let released = Instant::now();
    held.release_all();
    let r = req.join().expect("client").expect("held request");
    assert_eq!(r.status, 200, "held request: {}", r.body_str());
    let status = p.expect_exit(
        Duration::from_secs(10),
        "the proxy (after the last request)",
    );
    let release_to_exit = released.elapsed();
    assert!(status.success(), "exit status {status}");
    eprintln!(
        "[lifecycle] inflight: SIGTERM -> proxy stopped serving new requests: {} ms (drain 1 s); {how}",
        ms(closed_at)
    );
    eprintln!(
        "[lifecycle] inflight: last request released -> exit: {} ms (shutdown_timeout_seconds = 30)",
        ms(release_to_exit)
    );
    assert!(
        release_to_exit < Duration::from_secs(5),
        "exit took {release_to_exit:?} after the last request"
    );
}

/// Idle: the process exits right after the drain period; no fixed grace sleep
/// (Pingora's default is 300 s) and no `shutdown_timeout_seconds` wait.
#[test]
fn idle_proxy_exits_right_after_drain() {
    let fast = Backend::start("fast");
    let mut p = Proxy::start_with_server(
        "drain_seconds = 1\nshutdown_timeout_seconds = 60\n",
        &format!(
            "[rate_limit]\nenabled = false\n[[upstreams]]\nname = \"app\"\nbackends = [\"{}\"]\n",
            fast.addr()
        ),
    );
    // an idle keep-alive connection must not hold the process either
    let mut idle = Conn::open(&p.addr()).expect("connect");
    assert_eq!(
        idle.request("GET", "/x", &[], b"").expect("get").status,
        200
    );
    let t0 = Instant::now();
    p.signal("TERM");
    let status = p.expect_exit(Duration::from_secs(20), "the proxy");
    let took = t0.elapsed();
    eprintln!(
        "[lifecycle] idle: SIGTERM -> exit: {} ms (drain_seconds = 1, shutdown_timeout_seconds = 60, one idle keep-alive connection)",
        ms(took)
    );
    assert!(status.success(), "exit status {status}");
    assert!(
        took >= Duration::from_secs(1),
        "exited before drain: {took:?}"
    );
    assert!(took < Duration::from_secs(4), "idle exit took {took:?}");
    assert!(
        p.logs().contains("nothing in flight"),
        "log names the prompt exit:\n{}",
        p.logs()
    );
}

/// SIGINT: fast exit, no drain period.
#[test]
fn sigint_exits_fast() {
    let fast = Backend::start("fast");
    let mut p = Proxy::start_with_server(
        "drain_seconds = 10\nshutdown_timeout_seconds = 60\n",
        &one_upstream(&fast),
    );
    let t0 = Instant::now();
    p.signal("INT");
    let status = p.expect_exit(Duration::from_secs(8), "SIGINT");
    eprintln!(
        "[lifecycle] sigint: SIGINT -> exit: {} ms (drain_seconds = 10)",
        ms(t0.elapsed())
    );
    assert!(t0.elapsed() < Duration::from_secs(8));
    let _ = status;
}

// ---------------------------------------------------------------------------------------
// upgrade
// ---------------------------------------------------------------------------------------

/// Zero-downtime upgrade under continuous load: start the new process with `-u`,
/// wait until it listens on `upgrade_sock`, SIGQUIT the old one. No request fails,
/// the old process exits 0 and the new one serves.
#[test]
fn upgrade_under_load_drops_nothing() {
    let a = Backend::start("A");
    let mut old = Proxy::start_with_server(
        "drain_seconds = 1\nshutdown_timeout_seconds = 10\n",
        &format!(
            "[rate_limit]\nenabled = false\n[[upstreams]]\nname = \"app\"\nbackends = [\"{}\"]\n{STARVED}",
            a.addr()
        ),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let load = Load::start(&old.addr(), 4, 2, Arc::clone(&stop));
    eventually(
        DEADLINE,
        || format!("load never got going: {} ok", load.ok()),
        || load.ok() >= 200,
    );

    let t_start = Instant::now();
    let mut new = old.spawn_upgrade_listening();
    let sock_after = t_start.elapsed();
    let before_quit = load.total();
    let t_quit = Instant::now();
    old.signal("QUIT");

    let old_status = old.expect_exit(Duration::from_secs(30), "old process");
    let old_exit = t_quit.elapsed();
    assert!(old_status.success(), "old exit status {old_status}");
    assert!(new.is_running(), "new process died; logs:\n{}", new.logs());

    // the new process serves alone now; keep the load on it for a while
    let served_before = load.total();
    eventually(
        DEADLINE,
        || "load stalled after the old process exited".into(),
        || load.total() >= served_before + 300,
    );
    let desc = load.desc.clone();
    let (ok, failed, errors) = load.finish();

    assert_eq!(readyz(&new.admin_addr()), Some(200), "new process ready");
    let r = new.get("/after-upgrade", &[]);
    assert_eq!(r.status, 200);
    let s = new.status_json();
    assert_eq!(s["state"], "ready", "{s}");

    eprintln!(
        "[lifecycle] upgrade: -u start -> upgrade_sock listening: {} ms",
        ms(sock_after)
    );
    eprintln!(
        "[lifecycle] upgrade: SIGQUIT -> old exit: {} ms (Pingora hands over then keeps accepting 5 s), status {old_status}",
        ms(old_exit)
    );
    eprintln!(
        "[lifecycle] upgrade: load ({desc}, never stops): {failed} failed / {} total ({} before SIGQUIT)",
        ok + failed,
        before_quit
    );
    assert_eq!(
        failed,
        0,
        "failed requests during upgrade: {errors:#?}\nold logs:\n{}",
        old.logs()
    );
    new.signal("TERM");
    let st = new.wait_exit(Duration::from_secs(20));
    assert!(st.is_some_and(|s| s.success()), "new process exit {st:?}");
}

/// Upgrade while a request is in flight on the old process: it completes (the old
/// process does not exit under it), and the new process gets the new requests.
#[test]
fn upgrade_keeps_inflight_request_of_old_process() {
    let (_fast, held, mut old, req) = proxy_with_a_held_request();
    let mut new = old.spawn_upgrade_listening();
    let t_quit = Instant::now();
    old.signal("QUIT");
    // the new process takes over readiness and traffic
    new.wait_ready();
    // past Pingora's 5 s close timeout the old one has stopped accepting; it must
    // still be alive for its in-flight request
    eventually(
        Duration::from_secs(20),
        || format!("old process never stopped accepting; logs:\n{}", old.logs()),
        || old.logs().contains("listeners closed"),
    );
    assert!(
        old.is_running(),
        "old process exited with a request in flight; logs:\n{}",
        old.logs()
    );
    for i in 0..20 {
        let r = new.get(&format!("/n/{i}"), &[]);
        assert_eq!(r.status, 200);
    }
    let released = Instant::now();
    held.release_all();
    let r = req.join().expect("client").expect("held request");
    assert_eq!(r.status, 200, "{}", r.body_str());
    let st = old.expect_exit(Duration::from_secs(10), "old");
    assert!(st.success());
    eprintln!(
        "[lifecycle] upgrade+inflight: SIGQUIT -> release {} ms; release -> old exit {} ms",
        ms(released - t_quit),
        ms(released.elapsed())
    );
    assert!(new.is_running());
}

/// SIGQUIT with no new process listening on `upgrade_sock`: stock Pingora would
/// shut down anyway (a full outage); portcullis logs why and stays up and ready.
/// A later, proper upgrade still works.
#[test]
fn sigquit_without_new_process_stays_up() {
    let a = Backend::start("A");
    let mut old = Proxy::start(&one_upstream(&a));
    old.signal("QUIT");
    eventually(
        DEADLINE,
        || format!("no log about the missing new process:\n{}", old.logs()),
        || {
            old.logs()
                .contains("no new process listens on upgrade_sock")
        },
    );
    assert!(old.is_running(), "exited; logs:\n{}", old.logs());
    assert_eq!(readyz(&old.admin_addr()), Some(200), "still ready");
    assert_eq!(old.get("/still", &[]).status, 200);

    let mut new = old.spawn_upgrade_listening();
    old.signal("QUIT");
    let st = old.expect_exit(Duration::from_secs(30), "old");
    assert!(st.success());
    new.wait_ready();
    assert_eq!(new.get("/new", &[]).status, 200);
}

/// Pingora's systemd recipe signals first and starts the new process second: the
/// old process waits for it (up to 5 s) and then hands over.
#[test]
fn sigquit_then_new_process_hands_over() {
    let a = Backend::start("A");
    let mut old = Proxy::start(&one_upstream(&a));
    old.signal("QUIT");
    let mut new = old.spawn_upgrade();
    let st = old.expect_exit(Duration::from_secs(30), "old");
    assert!(st.success());
    assert!(
        !old.logs().contains("no new process listens"),
        "{}",
        old.logs()
    );
    new.wait_ready();
    assert_eq!(new.get("/new", &[]).status, 200);
}

// ---------------------------------------------------------------------------------------
// reload
// ---------------------------------------------------------------------------------------

fn reloads(p: &Proxy, result: &str) -> f64 {
    p.metric(&format!(
        r#"portcullis_config_reloads_total{{result="{result}"}}"#
    ))
    .unwrap_or(0.0)
}

fn rl_config(a: &Backend, limit: u64, extra: &str) -> String {
    format!(
        r#"
[rate_limit]
key = "header:x-api-key"
window_seconds = 60
limit = {limit}
missing_key = "allow"
{extra}

[[upstreams]]
name = "app"
backends = ["{}"]
"#,
        a.addr()
    )
}

/// Sends `n` GETs with `key`; returns the statuses.
fn statuses(p: &Proxy, key: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| p.get(&format!("/k/{i}"), &[("x-api-key", key)]).status)
        .collect()
}

/// (a) A new rate limit applies after SIGHUP, and after `POST /reload`.
#[test]
fn reload_applies_new_rate_limit_by_sighup_and_post() {
    let a = Backend::start("A");
    let p = Proxy::start(&rl_config(&a, 1000, ""));
    assert!(statuses(&p, "alpha", 10).iter().all(|s| *s == 200));
    // The RateLimit-Policy value is made once per config: a reload must make it anew.
    let policy_field = |key: &str| {
        p.get("/k", &[("x-api-key", key)])
            .header("ratelimit-policy")
            .map(String::from)
    };
    assert_eq!(
        policy_field("omega").as_deref(),
        Some("\"default\";q=1000;w=60")
    );

    // SIGHUP: limit 1000 -> 2
    p.rewrite_config(&rl_config(&a, 2, ""));
    let before = reloads(&p, "ok");
    let t0 = Instant::now();
    p.signal("HUP");
    eventually(
        DEADLINE,
        || format!("SIGHUP reload never counted; logs:\n{}", p.logs()),
        || reloads(&p, "ok") > before,
    );
    let hup_ms = ms(t0.elapsed());
    assert_eq!(
        statuses(&p, "beta", 3),
        vec![200, 200, 429],
        "limit 2 after SIGHUP"
    );
    // the key that had 10 requests is over the new limit at once
    assert_eq!(p.get("/k", &[("x-api-key", "alpha")]).status, 429);
    assert_eq!(
        policy_field("epsilon").as_deref(),
        Some("\"default\";q=2;w=60")
    );

    // POST /reload: a per-key override of 4 for "gamma"
    p.rewrite_config(&rl_config(&a, 2, "[rate_limit.keys]\n\"gamma\" = 4\n"));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "POST /reload: {}", r.body_str());
    assert_eq!(
        statuses(&p, "gamma", 5),
        vec![200, 200, 200, 200, 429],
        "override 4 after POST /reload"
    );
    assert_eq!(statuses(&p, "delta", 3), vec![200, 200, 429]);
    // an admitted request of the override key carries its own limit, the others the policy's
    assert_eq!(
        policy_field("gamma2").as_deref(),
        Some("\"default\";q=2;w=60")
    );
    p.rewrite_config(&rl_config(
        &a,
        2,
        "[rate_limit.keys]\n\"gamma\" = 4\n\"zeta\" = 9\n",
    ));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "POST /reload: {}", r.body_str());
    assert_eq!(
        policy_field("zeta").as_deref(),
        Some("\"default\";q=9;w=60")
    );
    eprintln!("[lifecycle] reload: SIGHUP -> reload counted: {hup_ms} ms");
}

/// (b) An invalid file keeps the old config: the proxy keeps serving under the old
/// limits, `config_reloads_total{result="error"}` increments, and the log and the
/// `POST /reload` answer name the key path.
#[test]
fn reload_with_invalid_file_keeps_old_config() {
    let a = Backend::start("A");
    let p = Proxy::start(&rl_config(&a, 3, ""));
    let bad = rl_config(&a, 3, "").replace("window_seconds = 60", "window_seconds = 0");
    p.rewrite_config(&bad);
    let errors = reloads(&p, "error");
    p.signal("HUP");
    eventually(
        DEADLINE,
        || format!("error reload never counted; logs:\n{}", p.logs()),
        || reloads(&p, "error") > errors,
    );
    eventually(
        DEADLINE,
        || format!("log does not name the key path:\n{}", p.logs()),
        || p.logs().contains("rate_limit.window_seconds"),
    );
    // still serving, old limit 3 still applies
    assert_eq!(statuses(&p, "k", 4), vec![200, 200, 200, 429]);
    assert_eq!(p.admin_get("/readyz").status, 200);

    // POST /reload says why, too (an unknown key this time)
    p.rewrite_config(&rl_config(&a, 3, "").replace("limit = 3", "limit = 3\nlimt = 5"));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 400, "{}", r.body_str());
    assert!(r.body_str().contains("rate_limit.limt"), "{}", r.body_str());
    assert_eq!(reloads(&p, "error"), errors + 2.0);
    assert_eq!(reloads(&p, "ok"), 0.0);
    assert_eq!(p.get("/still", &[("x-api-key", "other")]).status, 200);
}

fn app_config(backends: &[&Backend], extra: &str) -> String {
    format!(
        "[rate_limit]\nenabled = false\n{extra}\n\n{}",
        upstream_table("app", backends, "read_timeout_ms = 20000")
    )
}

/// (c) A backend removed by a reload finishes its in-flight request (200), and new
/// requests go only to the remaining backend.
#[test]
fn reload_removed_backend_finishes_inflight() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    a.set_mode(Mode::Hold);
    let p = Proxy::start(&app_config(&[&a, &b], ""));
    // round robin: within two requests one is in flight on A
    let mut on_a = None;
    let mut others = Vec::new();
    for i in 0..4 {
        let h = spawn_get(&p.addr(), &format!("/r/{i}"));
        let landed = wait_until(DEADLINE, || a.in_flight() == 1 || h.is_finished());
        if landed && a.in_flight() == 1 {
            on_a = Some(h);
            break;
        }
        others.push(h);
    }
    let on_a = on_a.expect("no request reached A");
    p.rewrite_config(&app_config(&[&b], ""));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(
        a.in_flight(),
        1,
        "A's request still in flight after the reload"
    );
    let a_before = a.requests();
    for i in 0..20 {
        let r = p.get(&format!("/after/{i}"), &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-backend"), Some("B"), "new requests only to B");
    }
    a.release_all();
    let r = on_a
        .join()
        .expect("client")
        .expect("in-flight request to A");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.header("x-backend"), Some("A"));
    assert_eq!(a.requests(), a_before, "A got no new request");
    for h in others {
        assert_eq!(h.join().expect("client").expect("request").status, 200);
    }
    let s = p.status_json();
    let addrs: Vec<String> = s["upstreams"][0]["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| b["address"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(addrs, vec![b.addr()], "{s}");
}

/// (d) A backend added by a reload joins the rotation.
#[test]
fn reload_added_backend_joins_rotation() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let p = Proxy::start(&app_config(&[&a], ""));
    for _ in 0..5 {
        assert_eq!(p.get("/x", &[]).header("x-backend"), Some("A"));
    }
    p.rewrite_config(&app_config(&[&a, &b], ""));
    let before = reloads(&p, "ok");
    p.signal("HUP");
    eventually(
        DEADLINE,
        || "reload never counted".into(),
        || reloads(&p, "ok") > before,
    );
    let mut seen_b = 0;
    for i in 0..20 {
        let r = p.get(&format!("/y/{i}"), &[]);
        assert_eq!(r.status, 200);
        if r.header("x-backend") == Some("B") {
            seen_b += 1;
        }
    }
    assert!(seen_b >= 5, "B served {seen_b} of 20 after joining");
}

/// (e) A new shedding cap applies to the next request (lowered and raised).
#[test]
fn reload_changes_shedding_cap() {
    let a = Backend::start("A");
    a.set_mode(Mode::Hold);
    let p = Proxy::start(&app_config(&[&a], "[shedding]\nmax_concurrency = 100\n"));
    let held: Vec<_> = (0..3)
        .map(|i| spawn_get(&p.addr(), &format!("/h/{i}")))
        .collect();
    eventually(
        DEADLINE,
        || format!("held {}", a.in_flight()),
        || a.in_flight() == 3,
    );

    // cap 4: the normal class gets 90% = 3, all taken
    p.rewrite_config(&app_config(&[&a], "[shedding]\nmax_concurrency = 4\n"));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body_str());
    let r = p.get("/shed-me", &[]);
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert!(r.retry_after().is_some_and(|s| s >= 1));
    assert_eq!(p.status_json()["max_concurrency"], 4);

    // raised again: admitted
    p.rewrite_config(&app_config(&[&a], "[shedding]\nmax_concurrency = 100\n"));
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body_str());
    let admitted = spawn_get(&p.addr(), "/admitted");
    eventually(
        DEADLINE,
        || format!("held {}", a.in_flight()),
        || a.in_flight() == 4,
    );
    a.set_mode(Mode::Ok);
    for h in held {
        assert_eq!(h.join().expect("client").expect("held").status, 200);
    }
    assert_eq!(
        admitted.join().expect("client").expect("admitted").status,
        200
    );
}
