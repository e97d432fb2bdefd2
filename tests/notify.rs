//! The systemd notify protocol end to end (CONTRACT §16): the real binary, started with
//! `NOTIFY_SOCKET` naming a unix datagram socket this test binds, sends `READY=1` once
//! its listeners accept, `RELOADING=1` + `MONOTONIC_USEC` then `READY=1` around a
//! reload, `STOPPING=1` when draining starts, and `WATCHDOG=1` every `WATCHDOG_USEC / 2`.

use portcullis_test_kit as support;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};
use support::*;

/// The service manager's end: a datagram socket the proxy writes to.
struct Manager {
    socket: UnixDatagram,
    /// `NOTIFY_SOCKET` for the proxy.
    env_value: String,
    /// `WATCHDOG=1` pings [`Manager::until`] skipped.
    pings: std::cell::Cell<usize>,
    _dir: tempfile::TempDir,
}

impl Manager {
    fn bind() -> Manager {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind notify socket");
        Manager {
            socket,
            env_value: path.display().to_string(),
            pings: Default::default(),
            _dir: dir,
        }
    }

    /// An abstract socket (`@name`), as systemd may pass.
    fn bind_abstract() -> Manager {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("portcullis-test-{}-{}", std::process::id(), free_port());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("abstract address");
        let socket = UnixDatagram::bind_addr(&addr).expect("bind abstract socket");
        Manager {
            socket,
            env_value: format!("@{name}"),
            pings: Default::default(),
            _dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The next message, waiting until `deadline`; `None` once it passes.
    fn next_until(&self, deadline: Instant) -> Option<String> {
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let wait = left.clamp(Duration::from_millis(1), Duration::from_millis(100));
            self.socket.set_read_timeout(Some(wait)).expect("timeout");
            match self.socket.recv(&mut buf) {
                Ok(n) => return Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("recv: {e}"),
            }
        }
    }

    /// Messages up to and including the first that has the line `line` (within
    /// [`DEADLINE`]). `WATCHDOG=1` pings are skipped unless asked for.
    fn until(&self, line: &str) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut seen = Vec::new();
        while let Some(m) = self.next_until(deadline) {
            let hit = has_line(&m, line);
            if hit || !has_line(&m, "WATCHDOG=1") {
                seen.push(m);
            } else {
                self.pings.set(self.pings.get() + 1);
            }
            if hit {
                return seen;
            }
        }
        panic!("no {line:?} within {DEADLINE:?}; got {seen:?}");
    }

    /// Everything already queued on the socket (no waiting).
    fn drain(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        self.socket.set_nonblocking(true).expect("nonblocking");
        while let Ok(n) = self.socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        self.socket.set_nonblocking(false).expect("blocking");
        out
    }
}

fn has_line(message: &str, line: &str) -> bool {
    message.lines().any(|l| l == line)
}

/// The value of `KEY=` in `message`.
fn value<'a>(message: &'a str, key: &str) -> Option<&'a str> {
    message
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

fn start(manager: &Manager, extra_env: &[(&str, &str)]) -> (Backend, Proxy) {
    let b = Backend::start("b");
    let mut env = vec![("NOTIFY_SOCKET", manager.env_value.as_str())];
    env.extend_from_slice(extra_env);
    let p = Proxy::start_with_env(&one_upstream(&b), &env);
    (b, p)
}

/// A reload must be `RELOADING=1` with a `MONOTONIC_USEC` read during it, then `READY=1`.
fn expect_reload(m: &Manager, trigger: impl FnOnce()) {
    let before = portcullis::lifecycle::notify::monotonic_usec();
    trigger();
    let seen = m.until("RELOADING=1");
    assert_eq!(seen.len(), 1, "something before RELOADING=1: {seen:?}");
    let after = portcullis::lifecycle::notify::monotonic_usec();
    let usec: u64 = value(&seen[0], "MONOTONIC_USEC")
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC in {:?}", seen[0]))
        .parse()
        .expect("MONOTONIC_USEC is a number");
    assert!(
        (before..=after).contains(&usec),
        "MONOTONIC_USEC {usec} not between {before} and {after}"
    );
    let seen = m.until("READY=1");
    assert_eq!(
        seen.len(),
        1,
        "something between RELOADING=1 and READY=1: {seen:?}"
    );
}

#[test]
fn ready_reloading_ready_then_stopping() {
    let m = Manager::bind();
    let (_b, mut p) = start(&m, &[]);
    // Proxy::start returned once /readyz said 200: READY=1 was sent with it.
    let seen = m.until("READY=1");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(value(&seen[0], "MAINPID"), None, "{seen:?}");
    assert_eq!(p.get("/", &[]).status, 200);

    // SIGHUP, valid file.
    expect_reload(&m, || p.signal("HUP"));
    // POST /reload.
    expect_reload(&m, || {
        let r = post(&p.admin_addr(), "/reload", &[], b"");
        assert_eq!(r.status, 200, "{}", r.body_str());
    });
    // An invalid file is refused and the proxy stays ready: READY=1 all the same.
    p.rewrite_config_raw("[server]\nthreads = \"many\"\n");
    expect_reload(&m, || p.signal("HUP"));
    assert_eventually!(
        p.metric("portcullis_config_reloads_total{result=\"error\"}") == Some(1.0),
        "the refused reload is counted"
    );

    p.signal("TERM");
    let seen = m.until("STOPPING=1");
    assert_eq!(seen.len(), 1, "{seen:?}");
    p.expect_exit(DEADLINE, "exit after SIGTERM");
    let after: Vec<_> = m
        .drain()
        .into_iter()
        .filter(|x| !has_line(x, "WATCHDOG=1"))
        .collect();
    assert!(after.is_empty(), "after STOPPING=1: {after:?}");
}

#[test]
fn abstract_socket_gets_ready() {
    let m = Manager::bind_abstract();
    let (_b, mut p) = start(&m, &[]);
    let seen = m.until("READY=1");
    assert_eq!(seen.len(), 1, "{seen:?}");
    p.signal("TERM");
    m.until("STOPPING=1");
    p.expect_exit(DEADLINE, "exit after SIGTERM");
}

#[test]
fn watchdog_pings_every_half_watchdog_usec() {
    let m = Manager::bind();
    // 400 ms: a ping every 200 ms.
    let (_b, p) = start(&m, &[("WATCHDOG_USEC", "400000")]);
    let deadline = Instant::now() + DEADLINE;
    let mut pings = Vec::new();
    while pings.len() < 4 {
        let msg = m.next_until(deadline).unwrap_or_else(|| {
            panic!("only {} WATCHDOG=1 pings; logs:\n{}", pings.len(), p.logs())
        });
        if has_line(&msg, "WATCHDOG=1") {
            pings.push(Instant::now());
        }
    }
    // Not a flood: three intervals after the first ping take about 600 ms.
    let span = pings[3] - pings[0];
    assert!(
        span >= Duration::from_millis(450),
        "pings too close together: 4 within {span:?}"
    );
}

#[test]
fn watchdog_of_another_pid_is_not_pinged() {
    let m = Manager::bind();
    // WATCHDOG_PID names another process: this one must not ping, however short the
    // interval (10 ms would have sent dozens by the time a reload went round).
    let (_b, p) = start(&m, &[("WATCHDOG_USEC", "20000"), ("WATCHDOG_PID", "1")]);
    m.until("READY=1");
    expect_reload(&m, || p.signal("HUP"));
    let queued = m.drain();
    assert_eq!(m.pings.get(), 0, "pinged for another pid");
    assert!(
        !queued.iter().any(|x| has_line(x, "WATCHDOG=1")),
        "pinged for another pid: {queued:?}"
    );
}

#[test]
fn upgrade_hands_over_without_stopping_and_names_the_new_main_pid() {
    let m = Manager::bind();
    let (_b, mut old) = start(&m, &[]);
    m.until("READY=1");
    let mut new = old.spawn_upgrade_listening();
    old.signal("QUIT");
    let seen = m.until("READY=1");
    let ready = seen.last().expect("READY=1");
    assert_eq!(
        value(ready, "MAINPID"),
        Some(new.pid().to_string().as_str()),
        "{seen:?}"
    );
    old.expect_exit(DEADLINE, "the old process exits after the hand-over");
    let mut all = seen;
    all.extend(m.drain());
    assert!(
        !all.iter().any(|x| has_line(x, "STOPPING=1")),
        "a hand-over is not a stop: {all:?}"
    );
    new.wait_ready();
    new.signal("TERM");
    m.until("STOPPING=1");
    new.expect_exit(DEADLINE, "exit after SIGTERM");
}
