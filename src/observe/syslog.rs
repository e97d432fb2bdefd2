//! `[access_log] syslog`: each access-log line sent as one RFC 5424 syslog message, as
//! HAProxy ships its access logs, to `unix:///dev/log` (a datagram socket), `udp://HOST:PORT`
//! or `tcp://HOST:PORT` (RFC 6587 octet counting: `LEN SP MESSAGE`).
//!
//! ```text
//! <134>1 2026-11-28T21:04:05.123Z web-1 portcullis 4242 access - {"ts":"2026-11-28T21:04:05.123Z",...}
//! ```
//!
//! Facility `local0`, severity `info` (`<134>`), the timestamp the line's own `ts`, the
//! host name, `portcullis`, the process id, message id `access`, no structured data, and
//! the JSON line (without its newline) as the message.
//!
//! It runs on the access log's writer thread, never on the request path: the writer's
//! queue is bounded (`queue_lines`), so a slow or absent receiver makes lines drop and
//! count in `portcullis_access_log_dropped_total`, never requests wait or memory grow. A
//! send waits at most [`SEND_TIMEOUT`]; a line that cannot be sent (receiver down, TCP
//! connection lost) is dropped and counted; a lost connection is tried again at most
//! every [`RETRY_AFTER`], the lines of batches in between dropped and counted.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long one send (or a TCP connect) may wait on the receiver.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long after a failed connection the next is tried.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// `<PRI>` of every message: facility local0 (16) × 8 + severity info (6).
pub const PRI: u8 = 134;

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyslogTarget {
    /// A local datagram socket (`/dev/log`).
    Unix(PathBuf),
    /// `host:port`, one datagram per line.
    Udp(String),
    /// `host:port`, one stream, octet-counted messages.
    Tcp(String),
}

impl SyslogTarget {
    /// `unix:///PATH`, `udp://HOST:PORT` or `tcp://HOST:PORT` (HOST a name, an IPv4 address
    /// or a bracketed IPv6 one); `Err` says why not.
    pub fn parse(s: &str) -> Result<SyslogTarget, String> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "{s:?}: unix:// takes an absolute path (unix:///dev/log)"
                ));
            }
            return Ok(SyslogTarget::Unix(PathBuf::from(path)));
        }
        let (kind, rest): (fn(String) -> SyslogTarget, &str) =
            if let Some(r) = s.strip_prefix("udp://") {
                (SyslogTarget::Udp, r)
            } else if let Some(r) = s.strip_prefix("tcp://") {
                (SyslogTarget::Tcp, r)
            } else {
                return Err(format!(
                    "{s:?}: must be unix:///PATH, udp://HOST:PORT or tcp://HOST:PORT"
                ));
            };
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err(format!(
                "{s:?}: HOST:PORT needs a port (e.g. udp://127.0.0.1:514)"
            ));
        };
        let bracketed = host.starts_with('[') && host.ends_with(']');
        let port_ok = port.parse::<u16>().is_ok_and(|p| p > 0);
        if host.is_empty()
            || !port_ok
            || (host.contains(':') && !bracketed)
            || host.contains(['/', '@', '?', '#'])
        {
            return Err(format!(
                "{s:?}: HOST:PORT must be a host name or address and a port from 1 to 65535"
            ));
        }
        Ok(kind(rest.to_string()))
    }
}

/// The host name RFC 5424 messages carry: the kernel's, `-` when unknown.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .take(255)
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "-".to_string())
}

/// The `ts` an access-log line starts with (`{"ts":"2026-11-28T21:04:05.123Z",`), `-`
/// (RFC 5424's nil value) when it does not.
fn timestamp_of(line: &[u8]) -> &[u8] {
    let Some(rest) = line.strip_prefix(b"{\"ts\":\"") else {
        return b"-";
    };
    match rest.iter().position(|&b| b == b'"') {
        Some(end) if end > 0 && rest[..end].iter().all(|b| b.is_ascii_graphic()) => &rest[..end],
        _ => b"-",
    }
}

/// Appends one message: `<134>1 TS HOST portcullis PID access - LINE`, preceded by its
/// length and a space when `octet_counting` (TCP).
pub fn frame(out: &mut Vec<u8>, host: &str, pid: u32, line: &[u8], octet_counting: bool) {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut msg = Vec::with_capacity(line.len() + 96);
    let _ = write!(msg, "<{PRI}>1 ");
    msg.extend_from_slice(timestamp_of(line));
    let _ = write!(msg, " {host} portcullis {pid} access - ");
    msg.extend_from_slice(line);
    if octet_counting {
        let _ = write!(out, "{} ", msg.len());
    }
    out.extend_from_slice(&msg);
}

enum Conn {
    Unix(UnixDatagram),
    Udp(UdpSocket),
    Tcp(TcpStream),
}

/// The sender, owned by the access log's writer thread.
pub struct Syslog {
    target: SyslogTarget,
    host: String,
    pid: u32,
    conn: Option<Conn>,
    /// No connection is tried before this (after a failure).
    retry_at: Option<Instant>,
    /// One message (datagrams) or a batch's (TCP), reused.
    buf: Vec<u8>,
    /// The last failure was logged: the next is not, until a send succeeds.
    quiet: bool,
}

impl Syslog {
    pub fn new(target: SyslogTarget) -> Self {
        Self {
            target,
            host: hostname(),
            pid: std::process::id(),
            conn: None,
            retry_at: None,
            buf: Vec::new(),
            quiet: false,
        }
    }

    fn connect(&self) -> io::Result<Conn> {
        match &self.target {
            SyslogTarget::Unix(_) => {
                let s = UnixDatagram::unbound()?;
                s.set_write_timeout(Some(SEND_TIMEOUT))?;
                Ok(Conn::Unix(s))
            }
            SyslogTarget::Udp(addr) => {
                let to = resolve(addr)?;
                let any: std::net::SocketAddr = if to.is_ipv4() {
                    ([0, 0, 0, 0], 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                let s = UdpSocket::bind(any)?;
                s.connect(to)?;
                s.set_write_timeout(Some(SEND_TIMEOUT))?;
                Ok(Conn::Udp(s))
            }
            SyslogTarget::Tcp(addr) => {
                let s = TcpStream::connect_timeout(&resolve(addr)?, SEND_TIMEOUT)?;
                s.set_write_timeout(Some(SEND_TIMEOUT))?;
                s.set_nodelay(true)?;
                Ok(Conn::Tcp(s))
            }
        }
    }

    fn failed(&mut self, e: &io::Error, lost: u64) {
        if !self.quiet {
            tracing::warn!(
                event = "access_log",
                syslog = ?self.target,
                error = %e,
                lost,
                "cannot send access-log lines to syslog; dropping them (counted in \
                 portcullis_access_log_dropped_total) until it answers again"
            );
            self.quiet = true;
        }
    }

    /// Sends every line of `batch` (newline-terminated JSON lines); returns how many
    /// were lost.
    pub fn send_batch(&mut self, batch: &[u8], now: Instant) -> u64 {
        let lines = batch.split_inclusive(|&b| b == b'\n');
        let count = lines.clone().count() as u64;
        if count == 0 {
            return 0;
        }
        if self.conn.is_none() {
            if self.retry_at.is_some_and(|at| now < at) {
                return count;
            }
            match self.connect() {
                Ok(c) => {
                    self.conn = Some(c);
                    self.retry_at = None;
                }
                Err(e) => {
                    self.retry_at = Some(now + RETRY_AFTER);
                    self.failed(&e, count);
                    return count;
                }
            }
        }
        let mut lost = 0;
        let mut last_error = None;
        match &mut self.conn {
            Some(Conn::Tcp(s)) => {
                self.buf.clear();
                for line in lines {
                    frame(&mut self.buf, &self.host, self.pid, line, true);
                }
                if let Err(e) = s.write_all(&self.buf) {
                    // What part of the batch arrived is unknown: all counted lost.
                    lost = count;
                    self.conn = None;
                    self.retry_at = Some(now + RETRY_AFTER);
                    last_error = Some(e);
                }
            }
            Some(conn) => {
                for line in lines {
                    self.buf.clear();
                    frame(&mut self.buf, &self.host, self.pid, line, false);
                    let sent = match (&*conn, &self.target) {
                        (Conn::Unix(s), SyslogTarget::Unix(path)) => s.send_to(&self.buf, path),
                        (Conn::Udp(s), _) => s.send(&self.buf),
                        _ => Err(io::Error::other("syslog socket of the wrong kind")),
                    };
                    if let Err(e) = sent {
                        lost += 1;
                        last_error = Some(e);
                    }
                }
            }
            None => lost = count,
        }
        self.buf.shrink_to(64 * 1024);
        match last_error {
            Some(e) => self.failed(&e, lost),
            None => self.quiet = false,
        }
        lost
    }
}

/// The first address `host:port` resolves to.
fn resolve(addr: &str) -> io::Result<std::net::SocketAddr> {
    addr.to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other(format!("{addr} resolves to no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            SyslogTarget::parse("unix:///dev/log"),
            Ok(SyslogTarget::Unix("/dev/log".into()))
        );
        assert_eq!(
            SyslogTarget::parse("udp://127.0.0.1:514"),
            Ok(SyslogTarget::Udp("127.0.0.1:514".into()))
        );
        assert_eq!(
            SyslogTarget::parse("tcp://logs.example:6514"),
            Ok(SyslogTarget::Tcp("logs.example:6514".into()))
        );
        assert_eq!(
            SyslogTarget::parse("tcp://[::1]:514"),
            Ok(SyslogTarget::Tcp("[::1]:514".into()))
        );
        for bad in [
            "",
            "/dev/log",
            "unix://dev/log",
            "udp://127.0.0.1",
            "udp://:514",
            "udp://h:0",
            "udp://h:65536",
            "tcp://::1:514",
            "tcp://u@h:514",
            "http://h:514",
        ] {
            assert!(SyslogTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn messages_are_rfc5424_with_the_lines_own_timestamp() {
        let line = b"{\"ts\":\"2026-11-28T21:04:05.123Z\",\"status\":200}\n";
        let mut out = Vec::new();
        frame(&mut out, "web-1", 42, line, false);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "<134>1 2026-11-28T21:04:05.123Z web-1 portcullis 42 access - \
             {\"ts\":\"2026-11-28T21:04:05.123Z\",\"status\":200}"
        );
        // octet counting: the length of the message that follows the space
        let mut tcp = Vec::new();
        frame(&mut tcp, "web-1", 42, line, true);
        let (len, rest) = std::str::from_utf8(&tcp)
            .ok()
            .and_then(|s| s.split_once(' '))
            .unwrap_or_default();
        assert_eq!(len.parse::<usize>().ok(), Some(rest.len()));
        assert_eq!(rest.as_bytes(), &out[..]);
        // a line without a leading ts gets the nil value
        let mut out = Vec::new();
        frame(&mut out, "h", 1, b"{\"x\":1}\n", false);
        assert!(out.starts_with(b"<134>1 - h portcullis 1 access - {"));
    }

    #[test]
    fn a_receiver_that_is_down_loses_lines_counted_and_is_retried_later() {
        // a port nobody listens on (bound, then closed)
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let mut s = Syslog::new(SyslogTarget::Tcp(format!("127.0.0.1:{port}")));
        let t0 = Instant::now();
        assert_eq!(s.send_batch(b"{\"a\":1}\n{\"a\":2}\n", t0), 2);
        // within RETRY_AFTER no connection is tried
        assert_eq!(s.send_batch(b"{\"a\":3}\n", t0 + RETRY_AFTER / 2), 1);
        assert!(s.conn.is_none());
        // a listener appears: the next batch after RETRY_AFTER goes through
        let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) else {
            return; // the port was taken meanwhile
        };
        assert_eq!(s.send_batch(b"{\"a\":4}\n", t0 + RETRY_AFTER * 2), 0);
        let (mut c, _) = l.accept().expect("accept");
        drop(s);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut c, &mut got).expect("read");
        let (len, msg) = got.split_once(' ').unwrap_or_default();
        assert_eq!(len.parse::<usize>().ok(), Some(msg.len()), "{got}");
        assert!(msg.ends_with(" access - {\"a\":4}"), "{got}");
    }

    #[test]
    fn an_empty_batch_sends_nothing() {
        let mut s = Syslog::new(SyslogTarget::Udp("127.0.0.1:9".into()));
        assert_eq!(s.send_batch(b"", Instant::now()), 0);
        assert!(s.conn.is_none());
    }
}
