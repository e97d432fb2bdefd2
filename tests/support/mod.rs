//! End-to-end test support: real processes, real sockets, no mocks.
//!
//! * [`RedisServer`] — a real `redis-server` on a free port (never 6379) that a test can
//!   kill and restart.
//! * [`Backend`] — a real HTTP/1.1 server whose behaviour ([`Mode`]) can be changed at run
//!   time; it counts requests, tracks concurrency and echoes what it received.
//! * [`Proxy`] — the real `portcullis` binary started on free ports with a generated
//!   `[server]` table, ready once its admin `/readyz` answers 200.
//! * A small blocking HTTP/1.1 client ([`get`], [`post`], [`send_raw`], [`Conn`]).
//! * Polling helpers ([`wait_until`], [`eventually`], `assert_eventually!`) and a
//!   Prometheus text matcher ([`metric_value`]).
//!
//! Everything is std-only (threads, blocking sockets) so tests need no async runtime.
//! Every blocking read has a timeout so a broken proxy fails a test instead of hanging it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_portcullis");

/// Default deadline for "this should happen soon" on a loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Default socket read/write timeout of the test client.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------
// small utilities
// ---------------------------------------------------------------------------------------

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// Polls `f` (every ~10 ms) until it returns true or `timeout` passes. Returns the last result.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Like [`wait_until`] but panics with `what` (evaluated lazily) when the deadline passes.
pub fn eventually(timeout: Duration, what: impl FnOnce() -> String, f: impl FnMut() -> bool) {
    if !wait_until(timeout, f) {
        panic!("condition not reached within {timeout:?}: {}", what());
    }
}

/// `assert_eventually!(cond)` / `assert_eventually!(cond, "fmt", args..)` /
/// `assert_eventually!(timeout = d, cond, ...)`: polls `cond` until true or panics.
#[macro_export]
macro_rules! assert_eventually {
    (timeout = $t:expr, $cond:expr $(,)?) => {
        if !$crate::support::wait_until($t, || $cond) {
            panic!("assert_eventually failed after {:?}: {}", $t, stringify!($cond));
        }
    };
    (timeout = $t:expr, $cond:expr, $($arg:tt)+) => {
        if !$crate::support::wait_until($t, || $cond) {
            panic!("assert_eventually failed after {:?}: {}: {}", $t, stringify!($cond), format!($($arg)+));
        }
    };
    ($cond:expr $(,)?) => {
        $crate::assert_eventually!(timeout = $crate::support::DEADLINE, $cond)
    };
    ($cond:expr, $($arg:tt)+) => {
        $crate::assert_eventually!(timeout = $crate::support::DEADLINE, $cond, $($arg)+)
    };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// 64-bit FNV-1a, used by the backend to prove a body arrived intact without echoing it.
pub fn fnv1a(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

// ---------------------------------------------------------------------------------------
// Prometheus text
// ---------------------------------------------------------------------------------------

fn parse_selector(sel: &str) -> (String, Vec<(String, String)>) {
    match sel.find('{') {
        None => (sel.trim().to_string(), Vec::new()),
        Some(i) => {
            let name = sel[..i].trim().to_string();
            let inner = sel[i + 1..].trim_end().trim_end_matches('}');
            (name, parse_labels(inner))
        }
    }
}

fn parse_labels(inner: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_string();
        let after = rest[eq + 1..].trim_start();
        let Some(after) = after.strip_prefix('"') else {
            break;
        };
        let mut val = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        val.push(match n {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                other => val.push(other),
            }
        }
        out.push((key, val));
        rest = after[end..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    out
}

/// Label pairs of one sample, in exposition order.
pub type Labels = Vec<(String, String)>;

/// All samples of a Prometheus text exposition: (metric name, labels, value).
pub fn metric_samples(text: &str) -> Vec<(String, Labels, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, rest) = match line.find('{') {
            Some(i) => match line[i..].find('}') {
                Some(j) => (&line[..i + j + 1], &line[i + j + 1..]),
                None => continue,
            },
            None => match line.find(char::is_whitespace) {
                Some(i) => (&line[..i], &line[i..]),
                None => continue,
            },
        };
        let Some(value) = rest.split_whitespace().next() else {
            continue;
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        let (name, labels) = parse_selector(series);
        out.push((name, labels, value));
    }
    out
}

/// Value of the series matching `selector` (`name` or `name{label="x",...}`).
/// Labels in the selector must all be present with equal values (others are ignored);
/// when several series match, their values are summed. `None` when nothing matches.
pub fn metric_value(text: &str, selector: &str) -> Option<f64> {
    let (name, want) = parse_selector(selector);
    let mut found = None;
    for (n, labels, v) in metric_samples(text) {
        if n != name {
            continue;
        }
        if want.iter().all(|w| labels.iter().any(|l| l == w)) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// Whether any sample (or `# TYPE`/`# HELP` line) of metric family `name` exists.
pub fn has_metric(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim();
        if let Some(rest) = l
            .strip_prefix("# TYPE ")
            .or_else(|| l.strip_prefix("# HELP "))
        {
            return rest.split_whitespace().next() == Some(name);
        }
        let series = l.split(['{', ' ']).next().unwrap_or("");
        series == name
            || series
                .strip_prefix(name)
                .is_some_and(|s| matches!(s, "_bucket" | "_count" | "_sum"))
    })
}

// ---------------------------------------------------------------------------------------
// HTTP client
// ---------------------------------------------------------------------------------------

/// A parsed HTTP response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All values of header `name` (case-insensitive).
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `Retry-After` as integer seconds, if present and numeric.
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after")?.trim().parse().ok()
    }
}

/// Buffered reader over a stream that keeps unparsed bytes between messages.
struct Buffered<S> {
    stream: S,
    buf: Vec<u8>,
}

impl<S: Read> Buffered<S> {
    fn new(stream: S) -> Self {
        Buffered {
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads more bytes; Ok(0) on EOF.
    fn fill(&mut self) -> io::Result<usize> {
        let mut tmp = [0u8; 16 * 1024];
        let n = loop {
            match self.stream.read(&mut tmp) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(n)
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let rest = self.buf.split_off(n);
        std::mem::replace(&mut self.buf, rest)
    }

    /// Reads until `buf` holds at least `n` bytes.
    fn need(&mut self, n: usize) -> io::Result<()> {
        while self.buf.len() < n {
            if self.fill()? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("eof: wanted {n} bytes, have {}", self.buf.len()),
                ));
            }
        }
        Ok(())
    }

    /// Reads one CRLF-terminated line (without the CRLF).
    fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let mut l = self.take(i + 2);
                l.truncate(i);
                return Ok(l);
            }
            if self.fill()? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "eof in line"));
            }
        }
    }

    /// Decodes a chunked body (including trailers).
    fn chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line = self.line()?;
            let line = String::from_utf8_lossy(&line);
            let size_hex = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad chunk size {line:?}"),
                )
            })?;
            if size == 0 {
                // trailers until an empty line
                while !self.line()?.is_empty() {}
                return Ok(body);
            }
            self.need(size + 2)?;
            let chunk = self.take(size + 2);
            body.extend_from_slice(&chunk[..size]);
        }
    }

    fn fixed(&mut self, n: usize) -> io::Result<Vec<u8>> {
        self.need(n)?;
        Ok(self.take(n))
    }

    fn read_to_eof(&mut self) -> io::Result<Vec<u8>> {
        while self.fill()? > 0 {}
        Ok(std::mem::take(&mut self.buf))
    }
}

fn header_of<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
    })
}

/// Reads one response from `r`. `head_request` = response to HEAD (no body).
fn read_response<S: Read>(r: &mut Buffered<S>, head_request: bool) -> io::Result<Resp> {
    loop {
        let (status, headers, consumed) = {
            let mut hs = [httparse::EMPTY_HEADER; 256];
            let mut resp = httparse::Response::new(&mut hs);
            match resp.parse(&r.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let headers: Vec<(String, String)> = resp
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_string(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    (resp.code.unwrap_or(0), headers, Some(n))
                }
                Ok(httparse::Status::Partial) => (0, Vec::new(), None),
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "unparsable response ({e}): {:?}",
                            String::from_utf8_lossy(&r.buf[..r.buf.len().min(512)])
                        ),
                    ))
                }
            }
        };
        let Some(n) = consumed else {
            if r.fill()? == 0 {
                let kind = if r.buf.is_empty() {
                    io::ErrorKind::ConnectionAborted
                } else {
                    io::ErrorKind::UnexpectedEof
                };
                return Err(io::Error::new(
                    kind,
                    format!(
                        "connection closed before a complete response head; got {:?}",
                        String::from_utf8_lossy(&r.buf[..r.buf.len().min(512)])
                    ),
                ));
            }
            continue;
        };
        r.take(n);
        if (100..200).contains(&status) && status != 101 {
            continue; // interim response
        }
        let body = if head_request || status == 204 || status == 304 {
            Vec::new()
        } else if is_chunked(&headers) {
            r.chunked()?
        } else if let Some(cl) = header_of(&headers, "content-length") {
            let n: usize = cl.trim().parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad content-length {cl}"),
                )
            })?;
            r.fixed(n)?
        } else {
            r.read_to_eof()?
        };
        return Ok(Resp {
            status,
            headers,
            body,
        });
    }
}

/// A client connection (keep-alive capable).
pub struct Conn {
    r: Buffered<TcpStream>,
    addr: String,
}

impl Conn {
    pub fn open(addr: &str) -> io::Result<Conn> {
        Self::open_with_timeout(addr, CLIENT_TIMEOUT)
    }

    pub fn open_with_timeout(addr: &str, timeout: Duration) -> io::Result<Conn> {
        let sa: std::net::SocketAddr = addr
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
        let s = TcpStream::connect_timeout(&sa, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            r: Buffered::new(s),
            addr: addr.to_string(),
        })
    }

    /// Sends one request with a Content-Length body (when `body` is non-empty or the method
    /// is POST/PUT) and reads the response. A `Host` header is added unless given.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Resp> {
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        let has_te = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding"));
        let has_cl = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
        if !has_te && !has_cl && (!body.is_empty() || method == "POST" || method == "PUT") {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.r.stream.write_all(&bytes)?;
        read_response(&mut self.r, method == "HEAD")
    }

    /// Sends a request whose body is sent with `Transfer-Encoding: chunked`, in `chunks`.
    pub fn request_chunked(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        chunks: &[&[u8]],
    ) -> io::Result<Resp> {
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("Transfer-Encoding: chunked\r\n\r\n");
        self.r.stream.write_all(req.as_bytes())?;
        for c in chunks {
            if c.is_empty() {
                continue;
            }
            self.r
                .stream
                .write_all(format!("{:x}\r\n", c.len()).as_bytes())?;
            self.r.stream.write_all(c)?;
            self.r.stream.write_all(b"\r\n")?;
        }
        self.r.stream.write_all(b"0\r\n\r\n")?;
        read_response(&mut self.r, false)
    }

    /// Writes raw bytes on this connection.
    pub fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.r.stream.write_all(bytes)
    }

    /// Reads one response from this connection.
    pub fn read_response(&mut self) -> io::Result<Resp> {
        read_response(&mut self.r, false)
    }

    /// True when the peer has closed the connection (reads EOF / error within `timeout`).
    pub fn is_closed_by_peer(&mut self, timeout: Duration) -> bool {
        let _ = self.r.stream.set_read_timeout(Some(timeout));
        let mut b = [0u8; 1];
        let closed = match self.r.stream.read(&mut b) {
            Ok(0) => true,
            Ok(_) => {
                self.r.buf.push(b[0]);
                false
            }
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
        };
        let _ = self.r.stream.set_read_timeout(Some(CLIENT_TIMEOUT));
        closed
    }

    pub fn stream(&self) -> &TcpStream {
        &self.r.stream
    }
}

/// One-shot request on a fresh connection.
pub fn try_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Resp> {
    Conn::open(addr)?.request(method, path, headers, body)
}

/// GET on a fresh connection; panics on transport errors (the message names the request).
pub fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    try_request(addr, "GET", path, headers, b"")
        .unwrap_or_else(|e| panic!("GET http://{addr}{path} failed: {e}"))
}

/// GET that returns transport errors instead of panicking.
pub fn try_get(addr: &str, path: &str, headers: &[(&str, &str)]) -> io::Result<Resp> {
    try_request(addr, "GET", path, headers, b"")
}

/// POST with a Content-Length body on a fresh connection; panics on transport errors.
pub fn post(addr: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    try_request(addr, "POST", path, headers, body)
        .unwrap_or_else(|e| panic!("POST http://{addr}{path} failed: {e}"))
}

/// Result of [`send_raw`].
#[derive(Debug)]
pub enum RawOutcome {
    /// A complete response was read.
    Response(Resp),
    /// The connection ended (EOF, reset or timeout) without a complete response;
    /// carries the bytes received and the error text.
    Closed { received: Vec<u8>, error: String },
}

impl RawOutcome {
    pub fn status(&self) -> Option<u16> {
        match self {
            RawOutcome::Response(r) => Some(r.status),
            RawOutcome::Closed { .. } => None,
        }
    }
}

/// Writes `bytes` on a fresh connection (write errors are tolerated: the proxy may answer
/// and close early) and reads one response.
pub fn send_raw(addr: &str, bytes: &[u8]) -> RawOutcome {
    let mut c = match Conn::open(addr) {
        Ok(c) => c,
        Err(e) => {
            return RawOutcome::Closed {
                received: Vec::new(),
                error: format!("connect: {e}"),
            }
        }
    };
    let write_err = c.r.stream.write_all(bytes).err();
    match read_response(&mut c.r, false) {
        Ok(r) => RawOutcome::Response(r),
        Err(e) => RawOutcome::Closed {
            received: std::mem::take(&mut c.r.buf),
            error: match write_err {
                Some(w) => format!("write: {w}; read: {e}"),
                None => e.to_string(),
            },
        },
    }
}

// ---------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------

/// A real `redis-server` on a free port, owned by the test.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = RedisServer {
            port: free_port(),
            child: None,
            dir,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "redis already running");
        assert_ne!(self.port, 6379, "never touch the machine's redis");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("redis.log"))
            .expect("redis log");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &self.dir.path().display().to_string(),
            ])
            .stdout(Stdio::from(log.try_clone().expect("clone log")))
            .stderr(Stdio::from(log))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        self.child = Some(child);
        let port = self.port;
        let ok = wait_until(DEADLINE, || {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("redis-server on {port} exited early: {st}");
                }
            }
            self.try_cmd(&["PING"])
                .map(|s| s == "PONG")
                .unwrap_or(false)
        });
        assert!(ok, "redis-server on port {port} never answered PING");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (SIGKILL to the child PID) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (empty dataset).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `redis-cli -p PORT args...`; returns trimmed stdout.
    pub fn try_cmd(&self, args: &[&str]) -> io::Result<String> {
        let out = Command::new("redis-cli")
            .arg("-p")
            .arg(self.port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    pub fn cmd(&self, args: &[&str]) -> String {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis-cli {args:?}: {e}"))
    }

    /// All keys matching `pattern` (via SCAN-free `KEYS`, fine for tests).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.cmd(&["--raw", "KEYS", pattern])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------
// Backend
// ---------------------------------------------------------------------------------------

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

fn serve_conn(stream: TcpStream, st: &BackendState) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut w = stream.try_clone()?;
    let mut r = Buffered::new(stream);
    loop {
        // ---- head
        let (method, path, headers, version_minor, consumed) = loop {
            let parsed = {
                let mut hs = [httparse::EMPTY_HEADER; 256];
                let mut req = httparse::Request::new(&mut hs);
                match req.parse(&r.buf) {
                    Ok(httparse::Status::Complete(n)) => Some((
                        req.method.unwrap_or("").to_string(),
                        req.path.unwrap_or("").to_string(),
                        req.headers
                            .iter()
                            .map(|h| {
                                (
                                    h.name.to_string(),
                                    String::from_utf8_lossy(h.value).into_owned(),
                                )
                            })
                            .collect::<Vec<_>>(),
                        req.version.unwrap_or(1),
                        n,
                    )),
                    Ok(httparse::Status::Partial) => None,
                    Err(_) => {
                        let _ = w.write_all(
                            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        );
                        return Ok(());
                    }
                }
            };
            match parsed {
                Some(p) => break p,
                None => {
                    if r.fill()? == 0 {
                        return Ok(()); // clean close between requests
                    }
                }
            }
        };
        r.take(consumed);
        st.requests.fetch_add(1, Ordering::SeqCst);
        let _guard = InFlight::enter(st);

        // ---- body
        let body = if is_chunked(&headers) {
            r.chunked()?
        } else if let Some(cl) = header_of(&headers, "content-length") {
            let n: usize = cl.trim().parse().unwrap_or(0);
            r.fixed(n)?
        } else {
            Vec::new()
        };
        if header_of(&headers, "expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
            // body already read above only if the client sent it; fine for our tests
        }

        let rec = Received {
            method: method.clone(),
            path: path.clone(),
            headers: headers.clone(),
            body,
        };

        // ---- behaviour
        let mode = *lock(&st.mode);
        let status = match mode {
            Mode::Ok => 200,
            Mode::Fail(s) => s,
            Mode::Slow(d) => {
                thread::sleep(d);
                200
            }
            Mode::Hang => {
                lock(&st.received).push(rec);
                wait_for_change(st, false);
                return Ok(());
            }
            Mode::Hold => {
                if !wait_for_change(st, true) {
                    lock(&st.received).push(rec);
                    return Ok(());
                }
                200
            }
            Mode::Close => {
                lock(&st.received).push(rec);
                let _ = w.shutdown(Shutdown::Both);
                return Ok(());
            }
        };
        if st.stopped.load(Ordering::SeqCst) {
            return Ok(());
        }

        // ---- response
        let close = header_of(&headers, "connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"))
            || (version_minor == 0
                && !header_of(&headers, "connection")
                    .is_some_and(|v| v.to_ascii_lowercase().contains("keep-alive")));
        let echo_body = header_of(&headers, "x-echo-body").is_some_and(|v| v == "1");
        let resp_body: Vec<u8> = if echo_body {
            rec.body.clone()
        } else {
            st.name.as_bytes().to_vec()
        };
        let mut head = format!(
            "HTTP/1.1 {status} {}\r\nx-backend: {}\r\nx-echo-path: {}\r\nx-echo-method: {}\r\nx-echo-body-len: {}\r\nx-echo-body-fnv: {}\r\n",
            reason(status),
            st.name,
            path,
            method,
            rec.body.len(),
            fnv1a(&rec.body),
        );
        for (h, echo) in [
            ("host", "x-echo-host"),
            ("x-forwarded-for", "x-echo-xff"),
            ("x-forwarded-proto", "x-echo-proto"),
            ("x-request-id", "x-echo-request-id"),
        ] {
            if let Some(v) = header_of(&headers, h) {
                head.push_str(&format!("{echo}: {v}\r\n"));
            }
        }
        head.push_str(&format!("content-length: {}\r\n", resp_body.len()));
        if close {
            head.push_str("connection: close\r\n");
        }
        head.push_str("\r\n");
        lock(&st.received).push(rec);
        let mut out = head.into_bytes();
        if method != "HEAD" {
            out.extend_from_slice(&resp_body);
        }
        w.write_all(&out)?;
        drop(_guard);
        if close {
            let _ = w.shutdown(Shutdown::Write);
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Proxy
// ---------------------------------------------------------------------------------------

/// The `[server]` keys support writes unless the test overrides them.
fn server_table(listen: &str, admin: &str, sock: &Path, extra: &str) -> String {
    let defaults = [
        ("listen", format!("[\"{listen}\"]")),
        ("admin_listen", format!("\"{admin}\"")),
        ("threads", "2".to_string()),
        ("drain_seconds", "1".to_string()),
        ("shutdown_timeout_seconds", "5".to_string()),
        ("upgrade_sock", format!("\"{}\"", sock.display())),
    ];
    let overridden = |key: &str| {
        extra.lines().any(|l| {
            let l = l.trim_start();
            l.strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with('='))
        })
    };
    let mut s = String::from("[server]\n");
    for (k, v) in defaults {
        if !overridden(k) {
            s.push_str(&format!("{k} = {v}\n"));
        }
    }
    s.push_str(extra);
    if !extra.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// A running `portcullis` process on free ports.
pub struct Proxy {
    child: Option<Child>,
    dir: Arc<tempfile::TempDir>,
    config_path: PathBuf,
    log_path: PathBuf,
    listen: String,
    admin: String,
    server_section: String,
}

impl Proxy {
    /// Starts with the default test `[server]` table prepended to `cfg`; waits for /readyz.
    pub fn start(cfg: &str) -> Proxy {
        Self::start_with_server("", cfg)
    }

    /// Like [`Proxy::start`]; `server_extra` lines (`key = value`) override or add `[server]` keys.
    pub fn start_with_server(server_extra: &str, cfg: &str) -> Proxy {
        let mut p = Self::spawn_with_server(server_extra, cfg);
        p.wait_ready();
        p
    }

    /// Spawns without waiting for readiness.
    pub fn spawn_with_server(server_extra: &str, cfg: &str) -> Proxy {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        let listen = format!("127.0.0.1:{}", free_port());
        let admin = format!("127.0.0.1:{}", free_port());
        let server_section = server_table(
            &listen,
            &admin,
            &dir.path().join("upgrade.sock"),
            server_extra,
        );
        let config_path = dir.path().join("portcullis.toml");
        fs::write(&config_path, format!("{server_section}\n{cfg}")).expect("write config");
        let log_path = dir.path().join("proxy-0.log");
        let mut p = Proxy {
            child: None,
            dir,
            config_path,
            log_path,
            listen,
            admin,
            server_section,
        };
        p.child = Some(p.spawn_process(&[], "proxy-0.log"));
        p
    }

    fn spawn_process(&self, extra_args: &[&str], log_name: &str) -> Child {
        let log_path = self.dir.path().join(log_name);
        let log = fs::File::create(&log_path).expect("create proxy log");
        Command::new(BIN)
            .arg("-c")
            .arg(&self.config_path)
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone log")))
            .stderr(Stdio::from(log))
            .env("RUST_BACKTRACE", "1")
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"))
    }

    /// Starts the new process of a zero-downtime upgrade (`-u`) on the same config file and
    /// ports. Does not wait for readiness (the old process still owns /readyz until it
    /// hands over); use [`Proxy::wait_ready`] or poll as the test needs.
    pub fn spawn_upgrade(&self) -> Proxy {
        let n = fs::read_dir(self.dir.path())
            .map(|d| d.count())
            .unwrap_or(0);
        let log_name = format!("proxy-upgrade-{n}.log");
        let child = self.spawn_process(&["-u"], &log_name);
        Proxy {
            child: Some(child),
            dir: self.dir.clone(),
            config_path: self.config_path.clone(),
            log_path: self.dir.path().join(log_name),
            listen: self.listen.clone(),
            admin: self.admin.clone(),
            server_section: self.server_section.clone(),
        }
    }

    /// Waits (20 s) until admin `/readyz` answers 200; panics with the logs if the process
    /// exits or the deadline passes.
    pub fn wait_ready(&mut self) {
        let admin = self.admin.clone();
        let ok = wait_until(DEADLINE, || {
            if let Some(st) = self.try_wait() {
                panic!(
                    "portcullis exited before becoming ready ({st}); logs:\n{}",
                    self.logs()
                );
            }
            matches!(
                Conn::open_with_timeout(&admin, Duration::from_secs(2))
                    .and_then(|mut c| c.request("GET", "/readyz", &[], b"")),
                Ok(r) if r.status == 200
            )
        });
        if !ok {
            panic!(
                "portcullis not ready on admin {admin} within {DEADLINE:?}; logs:\n{}",
                self.logs()
            );
        }
        // Readiness should imply the proxy listener accepts (admin.rs tests that strictly);
        // here we only make sure every other test starts against a listening proxy.
        let listen: std::net::SocketAddr = self.listen.parse().expect("listen addr");
        let ok = wait_until(DEADLINE, || {
            TcpStream::connect_timeout(&listen, Duration::from_secs(2)).is_ok()
        });
        if !ok {
            panic!(
                "portcullis ready but {listen} never accepted; logs:\n{}",
                self.logs()
            );
        }
    }

    /// Proxy listener address ("127.0.0.1:port").
    pub fn addr(&self) -> String {
        self.listen.clone()
    }

    pub fn admin_addr(&self) -> String {
        self.admin.clone()
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Rewrites the config file, keeping the generated `[server]` table (for SIGHUP reload).
    pub fn rewrite_config(&self, cfg: &str) {
        let tmp = self.dir.path().join("portcullis.toml.tmp");
        fs::write(&tmp, format!("{}\n{cfg}", self.server_section)).expect("write config");
        fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    /// Writes the config file verbatim (no `[server]` table added).
    pub fn rewrite_config_raw(&self, text: &str) {
        let tmp = self.dir.path().join("portcullis.toml.tmp");
        fs::write(&tmp, text).expect("write config");
        fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).expect("proxy child")
    }

    /// Sends a signal by name (`TERM`, `QUIT`, `HUP`, `INT`, ...) via `kill -s`.
    pub fn signal(&self, name: &str) {
        let st = Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -s {name} {} failed", self.pid());
    }

    /// Non-blocking exit check.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    /// Polls until the process exits or `timeout` passes.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait_until(timeout, || {
            status = self.try_wait();
            status.is_some()
        });
        status
    }

    /// Stderr+stdout of the process so far.
    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_else(|e| format!("<no log: {e}>"))
    }

    /// GET on the proxy listener.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        get(&self.listen, path, headers)
    }

    /// GET on the admin listener.
    pub fn admin_get(&self, path: &str) -> Resp {
        get(&self.admin, path, &[])
    }

    pub fn metrics(&self) -> String {
        let r = self.admin_get("/metrics");
        assert_eq!(r.status, 200, "/metrics status");
        r.body_str()
    }

    /// `metric_value` on a fresh scrape.
    pub fn metric(&self, selector: &str) -> Option<f64> {
        metric_value(&self.metrics(), selector)
    }

    pub fn status_json(&self) -> serde_json::Value {
        let r = self.admin_get("/status");
        assert_eq!(r.status, 200, "/status status; body {}", r.body_str());
        serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("/status is not JSON ({e}): {}", r.body_str()))
    }

    /// Kills the process now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if thread::panicking() {
            let logs = self.logs();
            let tail: String = {
                let lines: Vec<&str> = logs.lines().collect();
                let from = lines.len().saturating_sub(80);
                lines[from..].join("\n")
            };
            eprintln!(
                "---- portcullis log ({}; last 80 lines) ----\n{tail}\n---- end log ----",
                self.log_path.display()
            );
        }
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------
// --check
// ---------------------------------------------------------------------------------------

/// Runs `portcullis -c <tempfile> --check` on `toml_text`.
/// Returns (exit code, stdout, stderr, path of the file).
pub fn check_config(toml_text: &str) -> (i32, String, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("check.toml");
    fs::write(&path, toml_text).expect("write config");
    let (code, out, err) = check_config_file(&path);
    (code, out, err, path.display().to_string())
}

/// Runs `portcullis -c <path> --check`.
pub fn check_config_file(path: &Path) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("-c")
        .arg(path)
        .arg("--check")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {BIN}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `thunk` on `n` threads at once (released together) and collects the results in order.
pub fn concurrently<T: Send + 'static>(
    n: usize,
    thunk: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let thunk = Arc::new(thunk);
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let t = thunk.clone();
            let b = barrier.clone();
            thread::spawn(move || {
                b.wait();
                t(i)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("worker thread panicked"))
        .collect()
}

// ---------------------------------------------------------------------------------------
// additions for the rate-limit tests (appended)
// ---------------------------------------------------------------------------------------

impl Proxy {
    /// Like [`Proxy::start`] but the process gets the extra environment variables `env`
    /// (e.g. `RUST_LOG=debug` to check that even debug logs never carry an API key).
    pub fn start_with_env(cfg: &str, env: &[(&str, &str)]) -> Proxy {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        let listen = format!("127.0.0.1:{}", free_port());
        let admin = format!("127.0.0.1:{}", free_port());
        let server_section = server_table(&listen, &admin, &dir.path().join("upgrade.sock"), "");
        let config_path = dir.path().join("portcullis.toml");
        fs::write(&config_path, format!("{server_section}\n{cfg}")).expect("write config");
        let log_path = dir.path().join("proxy-0.log");
        let log = fs::File::create(&log_path).expect("create proxy log");
        let child = Command::new(BIN)
            .arg("-c")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone log")))
            .stderr(Stdio::from(log))
            .env("RUST_BACKTRACE", "1")
            .envs(env.iter().copied())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
        let mut p = Proxy {
            child: Some(child),
            dir,
            config_path,
            log_path,
            listen,
            admin,
            server_section,
        };
        p.wait_ready();
        p
    }
}

impl RedisServer {
    /// Like [`RedisServer::start`] with extra `redis-server` arguments, e.g.
    /// `["--enable-debug-command", "local"]` so a test can `DEBUG SLEEP`.
    /// Note: [`RedisServer::restart`] starts it again WITHOUT these extra arguments.
    pub fn start_with_args(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        assert_ne!(port, 6379, "never touch the machine's redis");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("redis.log"))
            .expect("redis log");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &dir.path().display().to_string(),
            ])
            .args(extra)
            .stdout(Stdio::from(log.try_clone().expect("clone log")))
            .stderr(Stdio::from(log))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        let mut r = RedisServer {
            port,
            child: Some(child),
            dir,
        };
        let ok = wait_until(DEADLINE, || {
            if let Some(c) = r.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("redis-server on {port} exited early: {st}");
                }
            }
            r.try_cmd(&["PING"]).map(|s| s == "PONG").unwrap_or(false)
        });
        assert!(ok, "redis-server on port {port} never answered PING");
        r
    }
}
