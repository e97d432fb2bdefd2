//! [`Backend`]: a real HTTP/1.1 server whose behaviour ([`Mode`]) can be changed at run
//! time; it counts requests, tracks concurrency and echoes what it received.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::client::{header_all_of, header_of, is_chunked, Buffered};
use super::*;

/// How a [`Backend`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200 at once.
    Ok,
    /// This status at once.
    Fail(u16),
    /// 200 after this delay.
    Slow(Duration),
    /// Never answer (until stopped); the connection stays open.
    Hang,
    /// Wait until `release_all()` (or a mode change away from Hold), then 200.
    Hold,
    /// Close the connection without answering.
    Close,
    /// Every n-th request (by the backend's request count) answers this status, the
    /// others 200 at once: `FailEvery(4, 503)` fails a quarter.
    FailEvery(u64, u16),
    /// Requests whose header (first field, case-insensitive) has this value answer
    /// this status, the others 200 at once: a poison key.
    FailFor(&'static str, &'static str, u16),
}

/// What the backend received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        header_of(&self.headers, name)
    }

    /// All values of header `name` (case-insensitive), in the order received.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        header_all_of(&self.headers, name)
    }
}

struct BackendState {
    name: String,
    port: u16,
    mode: Mutex<Mode>,
    /// bumped by release_all / set_mode / stop; held requests wait for a change.
    generation: Mutex<u64>,
    cv: Condvar,
    stopped: AtomicBool,
    requests: AtomicU64,
    connections: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    received: Mutex<Vec<Received>>,
    conns: Mutex<HashMap<u64, TcpStream>>,
}

/// A real HTTP/1.1 server (std threads, one per connection).
///
/// Responses carry body = name (unless the request has `x-echo-body: 1`, then the request
/// body is echoed) and headers `x-backend: <name>`, `x-echo-path`, `x-echo-method`,
/// `x-echo-host`, `x-echo-xff`, `x-echo-proto`, `x-echo-request-id` (each only when the
/// request had the header), `x-echo-body-len`, `x-echo-body-fnv` ([`fnv1a`]).
pub struct Backend {
    st: Arc<BackendState>,
    accept: Option<JoinHandle<()>>,
}

impl Backend {
    pub fn start(name: &str) -> Backend {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind backend");
        let port = l.local_addr().expect("addr").port();
        let st = Arc::new(BackendState {
            name: name.to_string(),
            port,
            mode: Mutex::new(Mode::Ok),
            generation: Mutex::new(0),
            cv: Condvar::new(),
            stopped: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            received: Mutex::new(Vec::new()),
            conns: Mutex::new(HashMap::new()),
        });
        let accept = Some(spawn_accept(l, st.clone()));
        Backend { st, accept }
    }

    pub fn name(&self) -> &str {
        &self.st.name
    }

    pub fn port(&self) -> u16 {
        self.st.port
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.st.port)
    }

    pub fn set_mode(&self, m: Mode) {
        *lock(&self.st.mode) = m;
        *lock(&self.st.generation) += 1;
        self.st.cv.notify_all();
    }

    pub fn mode(&self) -> Mode {
        *lock(&self.st.mode)
    }

    /// Lets every request currently held (Mode::Hold) answer. New requests still hold while
    /// the mode stays Hold.
    pub fn release_all(&self) {
        *lock(&self.st.generation) += 1;
        self.st.cv.notify_all();
    }

    /// Requests whose head was received (including held and hung ones).
    pub fn requests(&self) -> u64 {
        self.st.requests.load(Ordering::SeqCst)
    }

    /// TCP connections accepted.
    pub fn connections(&self) -> u64 {
        self.st.connections.load(Ordering::SeqCst)
    }

    /// Requests received and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.st.in_flight.load(Ordering::SeqCst)
    }

    /// High-water mark of `in_flight`.
    pub fn max_in_flight(&self) -> usize {
        self.st.max_in_flight.load(Ordering::SeqCst)
    }

    /// Resets requests / max_in_flight / received (not in_flight).
    pub fn reset_counters(&self) {
        self.st.requests.store(0, Ordering::SeqCst);
        self.st
            .max_in_flight
            .store(self.in_flight(), Ordering::SeqCst);
        lock(&self.st.received).clear();
    }

    pub fn received(&self) -> Vec<Received> {
        lock(&self.st.received).clone()
    }

    pub fn received_paths(&self) -> Vec<String> {
        lock(&self.st.received)
            .iter()
            .map(|r| r.path.clone())
            .collect()
    }

    pub fn last_received(&self) -> Option<Received> {
        lock(&self.st.received).last().cloned()
    }

    /// Closes the listener (new connects are refused) and every open connection; held and
    /// hung requests are dropped without an answer.
    pub fn stop(&mut self) {
        if self.st.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        *lock(&self.st.generation) += 1;
        self.st.cv.notify_all();
        // wake the accept loop so it drops the listener
        let _ = TcpStream::connect_timeout(
            &format!("127.0.0.1:{}", self.st.port)
                .parse()
                .expect("sockaddr"),
            Duration::from_secs(1),
        );
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        for (_, s) in lock(&self.st.conns).drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Listens again on the same port after `stop()`.
    pub fn restart(&mut self) {
        assert!(self.accept.is_none(), "backend not stopped");
        let addr = self.addr();
        let mut last = None;
        let ok = wait_until(DEADLINE, || match TcpListener::bind(&addr) {
            Ok(l) => {
                self.st.stopped.store(false, Ordering::SeqCst);
                self.accept = Some(spawn_accept(l, self.st.clone()));
                true
            }
            Err(e) => {
                last = Some(e);
                false
            }
        });
        assert!(ok, "could not rebind {addr}: {last:?}");
    }

    pub fn is_stopped(&self) -> bool {
        self.st.stopped.load(Ordering::SeqCst)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn_accept(l: TcpListener, st: Arc<BackendState>) -> JoinHandle<()> {
    thread::Builder::new()
        .name(format!("backend-{}-accept", st.name))
        .spawn(move || {
            let mut next_id = 0u64;
            for s in l.incoming() {
                if st.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(s) = s else { continue };
                st.connections.fetch_add(1, Ordering::SeqCst);
                next_id += 1;
                let id = next_id;
                if let Ok(c) = s.try_clone() {
                    lock(&st.conns).insert(id, c);
                }
                let st2 = st.clone();
                let _ = thread::Builder::new()
                    .name(format!("backend-{}-conn", st.name))
                    .spawn(move || {
                        let _ = serve_conn(s, &st2);
                        lock(&st2.conns).remove(&id);
                    });
            }
        })
        .expect("spawn backend accept thread")
}

struct InFlight<'a>(&'a BackendState);

impl<'a> InFlight<'a> {
    fn enter(st: &'a BackendState) -> Self {
        let now = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        st.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(st)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits until the generation changes (or the backend stops). Returns false if stopped.
fn wait_for_change(st: &BackendState, hold: bool) -> bool {
    let mut g = lock(&st.generation);
    let start = *g;
    loop {
        if st.stopped.load(Ordering::SeqCst) {
            return false;
        }
        if *g != start {
            if hold {
                return true;
            }
            // Hang: only a mode change away from Hang ends it.
            if *lock(&st.mode) != Mode::Hang {
                return true;
            }
        }
        g = st
            .cv
            .wait_timeout(g, Duration::from_millis(200))
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// A request head as the backend parsed it.
struct Head {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    /// The `x` of `HTTP/1.x`.
    minor: u8,
}

impl Head {
    /// Whether the connection ends after this request's response: `Connection: close`,
    /// or HTTP/1.0 without `Connection: keep-alive`.
    fn closes(&self) -> bool {
        let connection = |token: &str| {
            header_of(&self.headers, "connection")
                .is_some_and(|v| v.to_ascii_lowercase().contains(token))
        };
        connection("close") || (self.minor == 0 && !connection("keep-alive"))
    }
}

/// The next request head on the connection, consumed from `r`; `None` when the client
/// closed between requests or sent a head that does not parse (answered 400 on `w`).
fn read_head(r: &mut Buffered<TcpStream>, w: &mut TcpStream) -> io::Result<Option<Head>> {
    loop {
        let parsed = {
            let mut hs = [httparse::EMPTY_HEADER; 256];
            let mut req = httparse::Request::new(&mut hs);
            match req.parse(&r.buf) {
                Ok(httparse::Status::Complete(n)) => Some((
                    Head {
                        method: req.method.unwrap_or("").to_string(),
                        path: req.path.unwrap_or("").to_string(),
                        headers: req
                            .headers
                            .iter()
                            .map(|h| {
                                let value = String::from_utf8_lossy(h.value).into_owned();
                                (h.name.to_string(), value)
                            })
                            .collect(),
                        minor: req.version.unwrap_or(1),
                    },
                    n,
                )),
                Ok(httparse::Status::Partial) => None,
                Err(_) => {
                    let _ = w.write_all(
                        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    );
                    return Ok(None);
                }
            }
        };
        match parsed {
            Some((head, n)) => {
                r.take(n);
                return Ok(Some(head));
            }
            None => {
                if r.fill()? == 0 {
                    return Ok(None); // clean close between requests
                }
            }
        }
    }
}

/// The request body (chunked, or `Content-Length` bytes, or none). With
/// `Expect: 100-continue` it is read only if the client sends it: fine for these tests.
fn read_body(r: &mut Buffered<TcpStream>, headers: &[(String, String)]) -> io::Result<Vec<u8>> {
    if is_chunked(headers) {
        r.chunked()
    } else if let Some(cl) = header_of(headers, "content-length") {
        r.fixed(cl.trim().parse().unwrap_or(0))
    } else {
        Ok(Vec::new())
    }
}

/// The status the backend's mode answers `rec` with, and `rec` back; `None` when the
/// mode ends the connection without an answer (`rec` is recorded then).
fn status_for(st: &BackendState, w: &TcpStream, rec: Received) -> Option<(u16, Received)> {
    // A copy: the lock is not held while the mode sleeps or waits.
    let mode = *lock(&st.mode);
    let status = match mode {
        Mode::Ok => 200,
        Mode::Fail(s) => s,
        Mode::FailEvery(n, s) => {
            if st.requests.load(Ordering::Relaxed) % n.max(1) == 0 {
                s
            } else {
                200
            }
        }
        Mode::FailFor(name, value, s) => {
            if rec.header(name) == Some(value) {
                s
            } else {
                200
            }
        }
        Mode::Slow(d) => {
            thread::sleep(d);
            200
        }
        Mode::Hang => {
            lock(&st.received).push(rec);
            wait_for_change(st, false);
            return None;
        }
        Mode::Hold => {
            if !wait_for_change(st, true) {
                lock(&st.received).push(rec);
                return None;
            }
            200
        }
        Mode::Close => {
            lock(&st.received).push(rec);
            let _ = w.shutdown(Shutdown::Both);
            return None;
        }
    };
    Some((status, rec))
}

/// The response to `rec`: the `x-echo-*` fields, and as body the backend's name (or the
/// request body, with `x-echo-body: 1`); no body for HEAD.
fn response(st: &BackendState, status: u16, rec: &Received, close: bool) -> Vec<u8> {
    let echo_body = rec.header("x-echo-body").is_some_and(|v| v == "1");
    let body = if echo_body {
        &rec.body[..]
    } else {
        st.name.as_bytes()
    };
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nx-backend: {}\r\nx-echo-path: {}\r\nx-echo-method: {}\r\nx-echo-body-len: {}\r\nx-echo-body-fnv: {}\r\n",
        reason(status),
        st.name,
        rec.path,
        rec.method,
        rec.body.len(),
        fnv1a(&rec.body),
    );
    for (h, echo) in [
        ("host", "x-echo-host"),
        ("x-forwarded-for", "x-echo-xff"),
        ("x-forwarded-proto", "x-echo-proto"),
        ("x-request-id", "x-echo-request-id"),
    ] {
        if let Some(v) = rec.header(h) {
            head.push_str(&format!("{echo}: {v}\r\n"));
        }
    }
    head.push_str(&format!("content-length: {}\r\n", body.len()));
    if close {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if rec.method != "HEAD" {
        out.extend_from_slice(body);
    }
    out
}

fn serve_conn(stream: TcpStream, st: &BackendState) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut w = stream.try_clone()?;
    let mut r = Buffered::new(stream);
    loop {
        let Some(head) = read_head(&mut r, &mut w)? else {
            return Ok(());
        };
        st.requests.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight::enter(st);
        let body = read_body(&mut r, &head.headers)?;
        let close = head.closes();
        let rec = Received {
            method: head.method,
            path: head.path,
            headers: head.headers,
            body,
        };
        let Some((status, rec)) = status_for(st, &w, rec) else {
            return Ok(());
        };
        if st.stopped.load(Ordering::SeqCst) {
            return Ok(());
        }
        let out = response(st, status, &rec, close);
        lock(&st.received).push(rec);
        // Out of flight before the answer leaves: a proxy that starts the next request
        // the moment this answer reaches it must never see this one still counted (the
        // concurrency a cap lets through is measured here).
        drop(guard);
        w.write_all(&out)?;
        if close {
            let _ = w.shutdown(Shutdown::Write);
            return Ok(());
        }
    }
}

/// A backend that answers every request with the same raw bytes (to send
/// headers [`Backend`] never would, such as hop-by-hop fields). Returns its
/// address; the listener thread lives as long as the test process.
pub fn fixed_response_backend(response: &'static [u8]) -> String {
    raw_backend(response, false)
}

/// Like [`fixed_response_backend`], but closes each connection after its first
/// response: for a response whose body ends at the close (no `Content-Length`).
pub fn closing_response_backend(response: &'static [u8]) -> String {
    raw_backend(response, true)
}

fn raw_backend(response: &'static [u8], close_after: bool) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind fixed backend");
    let addr = l.local_addr().expect("local addr").to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        if s.write_all(response).is_err() {
                            return;
                        }
                        if close_after {
                            let _ = s.shutdown(Shutdown::Both);
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// TCP state `ESTABLISHED` as /proc/net/tcp writes it.
pub const TCP_ESTABLISHED: u8 = 0x01;
/// TCP state `CLOSE_WAIT` as /proc/net/tcp writes it.
pub const TCP_CLOSE_WAIT: u8 = 0x08;

/// The TCP states (as in /proc/net/tcp) of this machine's IPv4 sockets whose remote port is
/// `port`: on loopback, the proxy's side of its connections to the backend on `port`.
pub fn tcp_states_to(port: u16) -> Vec<u8> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let want = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.get(2)?.ends_with(&want)).then(|| u8::from_str_radix(f.get(3)?, 16).ok())?
        })
        .collect()
}

/// How many of `states` are `state`.
pub fn count_state(states: &[u8], state: u8) -> usize {
    states.iter().filter(|s| **s == state).count()
}

/// ESTABLISHED IPv4 sockets whose remote port is `port`: on loopback, the proxy's
/// connections to the test's backend on `port`.
pub fn established_to(port: u16) -> usize {
    count_state(&tcp_states_to(port), TCP_ESTABLISHED)
}
