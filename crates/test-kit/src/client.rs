//! A small blocking HTTP/1.1 client: [`get`], [`post`], [`send_raw`], [`Conn`].
//! Every read has a timeout so a broken proxy fails a test instead of hanging it.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::*;

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
        header_of(&self.headers, name)
    }

    /// All values of header `name` (case-insensitive).
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        header_all_of(&self.headers, name)
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
pub(super) struct Buffered<S> {
    stream: S,
    pub(super) buf: Vec<u8>,
}

impl<S: Read> Buffered<S> {
    pub(super) fn new(stream: S) -> Self {
        Buffered {
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads more bytes; Ok(0) on EOF.
    pub(super) fn fill(&mut self) -> io::Result<usize> {
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

    pub(super) fn take(&mut self, n: usize) -> Vec<u8> {
        let rest = self.buf.split_off(n);
        std::mem::replace(&mut self.buf, rest)
    }

    /// Reads until `buf` holds at least `n` bytes.
    pub(super) fn need(&mut self, n: usize) -> io::Result<()> {
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
    pub(super) fn line(&mut self) -> io::Result<Vec<u8>> {
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
    pub(super) fn chunked(&mut self) -> io::Result<Vec<u8>> {
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

    pub(super) fn fixed(&mut self, n: usize) -> io::Result<Vec<u8>> {
        self.need(n)?;
        Ok(self.take(n))
    }

    pub(super) fn read_to_eof(&mut self) -> io::Result<Vec<u8>> {
        while self.fill()? > 0 {}
        Ok(std::mem::take(&mut self.buf))
    }
}

/// Every value of `name` (case-insensitive) in `headers`, in order.
pub(super) fn header_all_of<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

pub(super) fn header_of<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

pub(super) fn is_chunked(headers: &[(String, String)]) -> bool {
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

    /// Like [`Conn::open`], from the local address `source` (e.g. `127.0.0.2`, to
    /// play a load balancer on another loopback address than ordinary clients).
    pub fn open_from(addr: &str, source: &str) -> io::Result<Conn> {
        use socket2::{Domain, Socket, Type};
        let sa: std::net::SocketAddr = addr
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
        let src: std::net::IpAddr = source
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{source}: {e}")))?;
        let sock = Socket::new(Domain::for_address(sa), Type::STREAM, None)?;
        sock.bind(&std::net::SocketAddr::new(src, 0).into())?;
        sock.connect_timeout(&sa.into(), CLIENT_TIMEOUT)?;
        let s: TcpStream = sock.into();
        s.set_read_timeout(Some(CLIENT_TIMEOUT))?;
        s.set_write_timeout(Some(CLIENT_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            r: Buffered::new(s),
            addr: addr.to_string(),
        })
    }

    /// The socket, for a client that speaks something else on it (nothing read yet).
    pub fn into_stream(self) -> TcpStream {
        self.r.stream
    }

    /// Writes `bytes` one at a time, `gap` apart (a slow client; PROXY headers
    /// split at every byte). Stops at the first write error.
    pub fn write_slowly(&mut self, bytes: &[u8], gap: Duration) -> io::Result<()> {
        for b in bytes {
            self.r.stream.write_all(std::slice::from_ref(b))?;
            std::thread::sleep(gap);
        }
        Ok(())
    }

    /// Request line and `headers`, plus `Host` unless given; no blank line yet.
    fn head(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req
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
        let mut req = self.head(method, path, headers);
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
        let mut req = self.head(method, path, headers);
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
