//! The JSON access log: one line per request, written off the request path.
//!
//! The request path encodes its record straight into a reusable per-thread
//! buffer (hand-written JSON: the fields are known, only strings need escaping)
//! and appends it to one shared in-memory batch under a short lock. One writer
//! thread takes the whole batch and writes it with a single `write` call.
//!
//! The writer is woken once per batch, not once per line: it sleeps until the
//! first line of a batch arrives, then lingers up to [`LINGER`] (or until the
//! batch holds [`HIGH_WATER`] bytes) so that later lines join the same write.
//! So a line reaches the file within about [`LINGER`], and under load the log
//! costs one wake-up and one `write(2)` per batch instead of per line.
//! (`tracing-appender`'s non-blocking writer, used before, wakes its thread and
//! flushes per line whenever it keeps up: measured in
//! benches/history/2026-11-passes.md, "Access-log cost", that was most of the log's
//! cost.)
//!
//! Bounded: when `queue_lines` lines wait (a slow disk, a full pipe), further
//! lines are dropped and counted (`portcullis_access_log_dropped_total`)
//! instead of making the request wait.
//!
//! The file is reopened on SIGUSR1 (logrotate's `postrotate`): the signal sets
//! a flag and wakes the writer, which reopens before its next write.
//!
//! A record never carries a query string (only the URI path is logged), an
//! API key, or an `Authorization` or `Cookie` value: no header value other
//! than `Host` is read.

use crate::config::AccessLogSettings;
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long the writer lets a batch fill after its first line.
pub const LINGER: Duration = Duration::from_millis(50);
/// A batch this large is written at once.
pub const HIGH_WATER: usize = 256 * 1024;

/// What a request's access-log line and its trace span both say of it.
#[derive(Debug, Clone, Copy)]
pub struct Exchange<'a> {
    pub request_id: &'a str,
    pub method: &'a str,
    /// `HTTP/1.1`, `HTTP/2.0`, ...
    pub protocol: &'a str,
    /// 0 when no response was sent (the client went away first).
    pub status: u16,
    /// As in `portcullis_requests_total{outcome}`.
    pub outcome: &'a str,
    pub route: &'a str,
    pub upstream: &'a str,
    pub backend: &'a str,
}

/// One request, as written to the log. Field names are the contract's.
#[derive(Debug)]
pub struct AccessRecord<'a> {
    /// Written as `ts`, RFC 3339 with milliseconds, UTC.
    pub unix_ms: u64,
    /// Written as 32 lower-case hex digits.
    pub trace_id: u128,
    pub client_ip: Option<IpAddr>,
    pub host: &'a str,
    /// The URI path only: never the query string.
    pub path: &'a str,
    pub exchange: Exchange<'a>,
    pub bytes_sent: u64,
    /// Written as `duration_ms` with three decimals.
    pub duration_us: u64,
    /// Time from choosing the backend to its response header, written as
    /// `upstream_ms`; `null` when no backend answered.
    pub upstream_us: Option<u64>,
    /// `(gate, policy)` of each gate in shadow mode that would have refused the request,
    /// written as `"shadow":["gate:policy",…]`; the field is left out when there is none.
    pub shadow: Option<&'a dyn ShadowNames>,
    /// The request's tenant (CONTRACT §14), written as `"tenant"`; left out when the key
    /// is no tenant's (or tenants are off). Never the key.
    pub tenant: Option<&'a str>,
}

/// The shadow refusals of a request, named only when its line is encoded (the request
/// path keeps them as bits).
pub trait ShadowNames {
    /// Calls `f(gate, policy)` for each, in order.
    fn each(&self, f: &mut dyn FnMut(&str, &str));
}

impl std::fmt::Debug for dyn ShadowNames + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_list();
        self.each(&mut |gate, policy| {
            list.entry(&format_args!("{gate}:{policy}"));
        });
        list.finish()
    }
}

impl ShadowNames for &[(&str, &str)] {
    fn each(&self, f: &mut dyn FnMut(&str, &str)) {
        for (gate, policy) in self.iter() {
            f(gate, policy);
        }
    }
}

/// Whether a response with `status` is logged at `sample` given a uniform
/// `draw` in `[0, 1)`: every 4xx/5xx (and a request without a response);
/// 1xx-3xx with probability `sample`.
pub fn should_log(status: u16, sample: f64, draw: f64) -> bool {
    if !(100..400).contains(&status) {
        return true;
    }
    sample >= 1.0 || draw < sample
}

// ------------------------------------------------------------------ encoding

/// `s` as a JSON string (quotes included): `"` and `\` escaped, control
/// characters as `\u00XX`; other UTF-8 as is.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    json_escaped(out, s);
    out.push(b'"');
}

/// `s` escaped as inside a JSON string (no quotes).
fn json_escaped(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// `"gate:policy"` as one JSON string (each part escaped as by [`json_str`]).
fn json_str_parts(out: &mut Vec<u8>, gate: &str, policy: &str) {
    out.push(b'"');
    json_escaped(out, gate);
    out.push(b':');
    json_escaped(out, policy);
    out.push(b'"');
}

fn json_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Microseconds as milliseconds with three decimals (`1.234`).
fn json_ms(out: &mut Vec<u8>, us: u64) {
    json_u64(out, us / 1000);
    let frac = us % 1000;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

fn json_hex128(out: &mut Vec<u8>, v: u128) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for i in (0..32).rev() {
        out.push(HEX[((v >> (i * 4)) & 0xf) as usize]);
    }
    out.push(b'"');
}

thread_local! {
    /// The last second formatted on this thread: `"2026-11-22T17:16:23.`.
    static TS_PREFIX: RefCell<(u64, [u8; 20])> = const { RefCell::new((u64::MAX, [0; 20])) };
    /// The line being encoded (reused: no allocation per line).
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// RFC 3339 with milliseconds, UTC, quoted; the date and time part is
/// formatted once per second per thread.
fn json_ts(out: &mut Vec<u8>, unix_ms: u64) {
    let secs = unix_ms / 1000;
    TS_PREFIX.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            let full = super::time::rfc3339_ms(secs * 1000);
            let mut prefix = [0u8; 20];
            prefix.copy_from_slice(&full.as_bytes()[..20]);
            *c = (secs, prefix);
        }
        out.push(b'"');
        out.extend_from_slice(&c.1);
    });
    let ms = unix_ms % 1000;
    out.extend_from_slice(&[
        b'0' + (ms / 100) as u8,
        b'0' + (ms / 10 % 10) as u8,
        b'0' + (ms % 10) as u8,
        b'Z',
        b'"',
    ]);
}

/// `,"name":` before a field's value (names need no escaping).
fn json_key(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

/// `,"name":"value"` for each name and value, in order.
fn json_strs<const N: usize>(out: &mut Vec<u8>, names: [&str; N], values: [&str; N]) {
    for (name, value) in names.into_iter().zip(values) {
        json_key(out, name);
        json_str(out, value);
    }
}

impl AccessRecord<'_> {
    /// Append the record as one JSON object and a newline.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let x = &self.exchange;
        out.extend_from_slice(b"{\"ts\":");
        json_ts(out, self.unix_ms);
        json_strs(out, ["request_id"], [x.request_id]);
        json_key(out, "trace_id");
        json_hex128(out, self.trace_id);
        json_key(out, "client_ip");
        out.push(b'"');
        if let Some(ip) = self.client_ip {
            // digits, dots, colons and hex: nothing to escape
            let _ = write!(out, "{ip}");
        }
        out.push(b'"');
        let request = [x.method, self.host, self.path, x.protocol];
        json_strs(out, ["method", "host", "path", "protocol"], request);
        json_key(out, "status");
        json_u64(out, u64::from(x.status));
        let answer = [x.outcome, x.route, x.upstream, x.backend];
        json_strs(out, ["outcome", "route", "upstream", "backend"], answer);
        json_key(out, "bytes_sent");
        json_u64(out, self.bytes_sent);
        json_key(out, "duration_ms");
        json_ms(out, self.duration_us);
        json_key(out, "upstream_ms");
        match self.upstream_us {
            Some(us) => json_ms(out, us),
            None => out.extend_from_slice(b"null"),
        }
        if let Some(tenant) = self.tenant {
            json_strs(out, ["tenant"], [tenant]);
        }
        if let Some(shadow) = self.shadow {
            let mut first = true;
            shadow.each(&mut |gate, policy| {
                if first {
                    json_key(out, "shadow");
                    out.push(b'[');
                    first = false;
                } else {
                    out.push(b',');
                }
                json_str_parts(out, gate, policy);
            });
            if !first {
                out.push(b']');
            }
        }
        out.extend_from_slice(b"}\n");
    }
}

// ------------------------------------------------------------------- writing

/// Where the writer thread writes: stdout, a file it reopens on request, or syslog.
enum Target {
    Stdout,
    File { path: PathBuf, file: File },
    Syslog(Box<super::syslog::Syslog>),
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Target {
    fn reopen(&mut self) {
        let Target::File { path, file } = self else {
            return;
        };
        match open_append(path) {
            Ok(f) => *file = f,
            Err(e) => tracing::error!(
                event = "access_log",
                path = %path.display(),
                error = %e,
                "cannot reopen the access log; still writing to the old file"
            ),
        }
    }

    /// Writes `buf` (whole lines); `Ok(n)`: `n` lines were lost (syslog counts each line
    /// it could not send).
    fn write_all(&mut self, buf: &[u8]) -> io::Result<u64> {
        match self {
            Target::Stdout => io::stdout().lock().write_all(buf).map(|()| 0),
            Target::File { file, .. } => file.write_all(buf).map(|()| 0),
            Target::Syslog(s) => Ok(s.send_batch(buf, Instant::now())),
        }
    }
}

/// What the writer is waiting for, so the request path wakes it only when
/// needed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// Writing, or about to look at the batch: no wake-up needed.
    No,
    /// Sleeping until a first line arrives.
    Idle,
    /// Letting a batch fill: woken only when it reaches [`HIGH_WATER`].
    Linger,
}

struct Batch {
    buf: Vec<u8>,
    lines: usize,
    waiting: Waiting,
    reopen: bool,
    closed: bool,
}

struct Queue {
    batch: Mutex<Batch>,
    wake: Condvar,
    cap_lines: usize,
    dropped: AtomicU64,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self, b: &mut Batch) {
        b.waiting = Waiting::No;
        self.wake.notify_one();
    }

    /// The writer thread: one `write` per batch.
    fn run(&self, mut target: Target) {
        let mut out: Vec<u8> = Vec::new();
        let mut b = self.lock();
        loop {
            while b.buf.is_empty() && !b.reopen && !b.closed {
                b.waiting = Waiting::Idle;
                b = self.wake.wait(b).unwrap_or_else(|p| p.into_inner());
            }
            let deadline = Instant::now() + LINGER;
            while !b.closed && !b.reopen && b.buf.len() < HIGH_WATER {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                b.waiting = Waiting::Linger;
                b = self
                    .wake
                    .wait_timeout(b, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            b.waiting = Waiting::No;
            std::mem::swap(&mut b.buf, &mut out);
            b.lines = 0;
            let reopen = std::mem::take(&mut b.reopen);
            let closed = b.closed;
            drop(b);
            if reopen {
                target.reopen();
            }
            if !out.is_empty() {
                match target.write_all(&out) {
                    Ok(0) => {}
                    Ok(lost) => {
                        self.dropped.fetch_add(lost, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::error!(event = "access_log", error = %e, "access log write failed")
                    }
                }
                // Keep a batch's worth of capacity, not a burst's.
                out.clear();
                out.shrink_to(HIGH_WATER * 2);
            }
            if closed {
                return;
            }
            b = self.lock();
        }
    }
}

/// The access-log sink: cheap to call from the request path.
pub struct AccessLog {
    queue: Option<Arc<Queue>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl AccessLog {
    /// Opens the target and starts the writer thread. The path and queue size
    /// are fixed for the process's life; `enabled` and `sample` are read per
    /// request from the current config, so a reload can change them.
    pub fn new(settings: &AccessLogSettings) -> Self {
        let target = match (&settings.syslog, &settings.path) {
            (Some(to), _) => Target::Syslog(Box::new(super::syslog::Syslog::new(to.clone()))),
            (None, None) => Target::Stdout,
            (None, Some(path)) => match open_append(path) {
                Ok(file) => Target::File {
                    path: path.clone(),
                    file,
                },
                Err(e) => {
                    tracing::error!(
                        event = "access_log",
                        path = %path.display(),
                        error = %e,
                        "cannot open the access log; access logging is off"
                    );
                    return Self::off();
                }
            },
        };
        let queue = Arc::new(Queue {
            batch: Mutex::new(Batch {
                buf: Vec::new(),
                lines: 0,
                waiting: Waiting::No,
                reopen: false,
                closed: false,
            }),
            wake: Condvar::new(),
            cap_lines: settings.queue_lines.max(1),
            dropped: AtomicU64::new(0),
        });
        let q = Arc::clone(&queue);
        let thread = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || q.run(target));
        match thread {
            Ok(t) => Self {
                queue: Some(queue),
                thread: Mutex::new(Some(t)),
            },
            Err(e) => {
                tracing::error!(event = "access_log", error = %e, "cannot start the access-log writer; access logging is off");
                Self::off()
            }
        }
    }

    fn off() -> Self {
        Self {
            queue: None,
            thread: Mutex::new(None),
        }
    }

    /// Queue one record (never blocks on I/O; drops and counts when
    /// `queue_lines` lines already wait).
    pub fn write(&self, record: &AccessRecord<'_>) {
        let Some(q) = &self.queue else {
            return;
        };
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            record.encode(&mut line);
            let mut b = q.lock();
            if b.closed {
                return;
            }
            if b.lines >= q.cap_lines {
                drop(b);
                q.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            b.buf.extend_from_slice(&line);
            b.lines += 1;
            let wake = match b.waiting {
                Waiting::Idle => true,
                Waiting::Linger => b.buf.len() >= HIGH_WATER,
                Waiting::No => false,
            };
            if wake {
                q.wake(&mut b);
            }
        });
    }

    /// Lines dropped because the writer fell behind, since start.
    pub fn dropped_lines(&self) -> u64 {
        self.queue
            .as_ref()
            .map_or(0, |q| q.dropped.load(Ordering::Relaxed))
    }

    /// Reopen the file before the next write (SIGUSR1), now.
    pub fn reopen(&self) {
        if let Some(q) = &self.queue {
            let mut b = q.lock();
            b.reopen = true;
            q.wake(&mut b);
        }
    }

    /// Write what is queued and stop the writer thread (at exit).
    pub fn close(&self) {
        if let Some(q) = &self.queue {
            let mut b = q.lock();
            b.closed = true;
            q.wake(&mut b);
        }
        let thread = match self.thread.lock() {
            Ok(mut t) => t.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Reopens the access log on every SIGUSR1 until `shutdown` fires.
pub async fn reopen_on_sigusr1(
    log: impl Fn() + Send,
    mut shutdown: pingora::server::ShutdownWatch,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut usr1 = match signal(SignalKind::user_defined1()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(event = "access_log", error = %e, "cannot watch SIGUSR1");
            return;
        }
    };
    loop {
        tokio::select! {
            got = usr1.recv() => {
                if got.is_none() {
                    return;
                }
                tracing::info!(event = "access_log", "SIGUSR1: reopening the access log");
                log();
            }
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_applies_to_1xx_to_3xx_only() {
        for status in [400, 401, 429, 431, 500, 502, 503, 0] {
            assert!(should_log(status, 0.0, 0.99), "{status} always logged");
        }
        for status in [101, 200, 204, 301, 304] {
            assert!(!should_log(status, 0.0, 0.0), "{status} at sample 0");
            assert!(should_log(status, 1.0, 0.999_999));
            assert!(should_log(status, 0.01, 0.005));
            assert!(!should_log(status, 0.01, 0.02));
        }
    }

    fn rec(path: &str) -> AccessRecord<'_> {
        AccessRecord {
            unix_ms: 1_795_367_783_005,
            trace_id: 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736,
            client_ip: Some("127.0.0.1".parse().expect("ip")),
            host: "h\"x",
            path,
            exchange: Exchange {
                request_id: "r1",
                method: "GET",
                protocol: "HTTP/1.1",
                status: 200,
                outcome: "proxied",
                route: "/",
                upstream: "app",
                backend: "127.0.0.1:1",
            },
            bytes_sent: 3,
            duration_us: 1_500,
            upstream_us: None,
            shadow: None,
            tenant: None,
        }
    }

    #[test]
    fn shadow_refusals_are_a_list_of_gate_and_policy_left_out_when_empty() {
        let mut out = Vec::new();
        rec("/").encode(&mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert!(
            v.get("shadow").is_none(),
            "no field without shadow refusals"
        );
        let mut r = rec("/");
        let none: &[(&str, &str)] = &[];
        r.shadow = Some(&none);
        out.clear();
        r.encode(&mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert!(v.get("shadow").is_none(), "no field for an empty list");
        let two: &[(&str, &str)] = &[("shed", "normal"), ("rate_limit", "bu\"rst")];
        r.shadow = Some(&two);
        out.clear();
        r.encode(&mut out);
        assert!(out.ends_with(b",\"shadow\":[\"shed:normal\",\"rate_limit:bu\\\"rst\"]}\n"));
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(
            v["shadow"],
            serde_json::json!(["shed:normal", "rate_limit:bu\"rst"])
        );
    }

    #[test]
    fn encodes_one_valid_json_object_per_line() {
        let mut out = Vec::new();
        let mut r = rec("/a\"b\\c\u{1}d\ne\u{7f}é☃");
        r.client_ip = Some("2001:db8::1".parse().expect("ip"));
        r.upstream_us = Some(12_345);
        r.encode(&mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["ts"], "2026-11-22T17:16:23.005Z");
        assert_eq!(v["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(v["client_ip"], "2001:db8::1");
        assert_eq!(v["host"], "h\"x");
        assert_eq!(v["path"], "/a\"b\\c\u{1}d\ne\u{7f}é☃");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes_sent"], 3);
        assert_eq!(v["duration_ms"].as_f64(), Some(1.5));
        assert_eq!(v["upstream_ms"].as_f64(), Some(12.345));
        // A second line within the same second reuses the cached prefix.
        out.clear();
        let mut r = rec("/");
        r.unix_ms += 994;
        r.client_ip = None;
        r.encode(&mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            concat!(
                r#"{"ts":"2026-11-22T17:16:23.999Z","request_id":"r1","#,
                r#""trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","client_ip":"","#,
                r#""method":"GET","host":"h\"x","path":"/","protocol":"HTTP/1.1","#,
                r#""status":200,"outcome":"proxied","route":"/","upstream":"app","#,
                r#""backend":"127.0.0.1:1","bytes_sent":3,"duration_ms":1.500,"#,
                r#""upstream_ms":null}"#,
                "\n"
            ),
            "the contract's fields, in order"
        );
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["ts"], "2026-11-22T17:16:23.999Z");
        assert_eq!(v["client_ip"], "");
        assert_eq!(v["upstream_ms"], serde_json::Value::Null);
        r.unix_ms += 1;
        out.clear();
        r.encode(&mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["ts"], "2026-11-22T17:16:24.000Z");
    }

    #[test]
    fn writes_json_lines_and_reopens_after_rename() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("access.log");
        let log = AccessLog::new(&AccessLogSettings {
            enabled: true,
            path: Some(path.clone()),
            sample: 1.0,
            queue_lines: 128,
            syslog: None,
        });
        log.write(&rec("/one"));
        let rotated = dir.path().join("access.log.1");
        let ok = wait(|| std::fs::read_to_string(&path).is_ok_and(|t| t.contains("/one")));
        assert!(ok, "first line written");
        std::fs::rename(&path, &rotated).expect("rename");
        log.reopen();
        // the reopen is done once the new file exists
        assert!(wait(|| path.exists()), "reopened");
        log.write(&rec("/two"));
        let ok = wait(|| std::fs::read_to_string(&path).is_ok_and(|t| t.contains("/two")));
        assert!(ok, "line after reopen goes to the new file");
        let old = std::fs::read_to_string(&rotated).expect("rotated");
        assert!(!old.contains("/two"));
        let line: serde_json::Value =
            serde_json::from_str(old.lines().next().expect("a line")).expect("json");
        assert_eq!(line["host"], "h\"x");
        assert_eq!(line["upstream_ms"], serde_json::Value::Null);
        // close writes what is queued
        for _ in 0..100 {
            log.write(&rec("/many"));
        }
        log.close();
        let new = std::fs::read_to_string(&path).expect("log");
        assert_eq!(new.matches("/many").count(), 100);
        assert_eq!(log.dropped_lines(), 0);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = AccessLog::new(&AccessLogSettings {
            enabled: true,
            path: Some(dir.path().join("a.log")),
            sample: 1.0,
            queue_lines: 4,
            syslog: None,
        });
        // Faster than the writer's first wake-up: at most 4 wait, the rest drop.
        for _ in 0..1000 {
            log.write(&rec("/x"));
        }
        assert!(log.dropped_lines() > 0);
        log.close();
        let text = std::fs::read_to_string(dir.path().join("a.log")).expect("log");
        assert_eq!(
            text.lines().count() as u64 + log.dropped_lines(),
            1000,
            "every line is written or counted"
        );
    }

    fn wait(mut f: impl FnMut() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if f() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        false
    }
}
