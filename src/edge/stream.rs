//! [`EdgeStream`]: a client connection as the edge sees it. It carries the
//! connection's identity ([`Conn`]), replays the bytes read past a PROXY
//! header, and enforces two deadlines with one timer per connection:
//! - `client_header_timeout_ms` across a whole header block (Pingora's own read
//!   timeout restarts on every byte, which a slowloris sending one byte at a time
//!   never trips);
//! - `keepalive_timeout_seconds` between requests, when the proxy hands it over
//!   ([`Conn::header_received`]). Pingora's own keep-alive timeout registers a timer
//!   for every wait (two allocations, a lock and a notifier: ~1.2k instructions per
//!   request, benches/history/2026-11-passes.md, issue 16, twelfth pass); this one
//!   resets the connection's timer, which only moves a deadline.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::protocols::{Peek, Stream};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Header state of the connection (see [`Conn`]).
const AWAIT_FIRST_BYTE: u8 = 0;
const AWAIT_HEADER: u8 = 1;
const IN_REQUEST: u8 = 2;

/// What the proxy answers a header block that took too long; then the
/// connection closes. Written by the stream itself: no request exists yet.
const TIMEOUT_RESPONSE: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 37\r\nconnection: close\r\n\r\nportcullis: request header timed out\n";

/// Identity and header state of one client connection.
#[derive(Debug)]
pub struct Conn {
    /// The TCP peer.
    pub peer: Option<IpAddr>,
    /// The source a PROXY header named (from a trusted peer only).
    pub proxied: Option<IpAddr>,
    /// Whether the peer is in `server.trusted_proxies`.
    pub trusted: bool,
    state: AtomicU8,
    /// Idle time allowed between requests, in seconds; 0: the stream does not time
    /// it (Pingora does, or nothing does).
    keepalive: AtomicU32,
}

impl Conn {
    pub fn new(peer: Option<IpAddr>, proxied: Option<IpAddr>, trusted: bool) -> Self {
        Self {
            peer,
            proxied,
            trusted,
            state: AtomicU8::new(AWAIT_HEADER),
            keepalive: AtomicU32::new(0),
        }
    }

    fn keepalive(&self) -> Option<Duration> {
        match self.keepalive.load(Ordering::Relaxed) {
            0 => None,
            secs => Some(Duration::from_secs(u64::from(secs))),
        }
    }

    /// The connection's source: what `X-Forwarded-For` gets appended.
    pub fn source(&self) -> Option<IpAddr> {
        self.proxied.or(self.peer)
    }

    /// The connection carries HTTP/2 (ALPN `h2` or the h2c preface): its
    /// streams are multiplexed, and the HTTP/1 header-block deadline never
    /// applies (nothing would mark a header block done).
    pub fn multiplexed(&self) {
        self.state.store(IN_REQUEST, Ordering::Relaxed);
    }

    /// A request header was parsed: the header deadline no longer applies. After this
    /// request the stream ends the connection, quietly (as an end of stream, which
    /// Pingora takes for a client that left), once it has waited `keepalive_secs` for
    /// the next request's first byte; 0: it does not time that wait. The proxy then
    /// tells Pingora not to time it either.
    pub fn header_received(&self, keepalive_secs: u64) {
        self.state.store(IN_REQUEST, Ordering::Relaxed);
        let secs = u32::try_from(keepalive_secs).unwrap_or(u32::MAX);
        self.keepalive.store(secs, Ordering::Relaxed);
    }

    /// The request is answered: the next header's deadline starts with its
    /// first byte (idle keep-alive time is the keep-alive timeout's business).
    pub fn request_done(&self) {
        self.state.store(AWAIT_FIRST_BYTE, Ordering::Relaxed);
    }
}

/// A client stream with its [`Conn`].
#[derive(Debug)]
pub struct EdgeStream {
    inner: Stream,
    conn: Conn,
    /// Bytes read past the PROXY header, served before the socket's.
    replay: Vec<u8>,
    header_timeout: Duration,
    /// The header block's deadline, or the idle deadline while `idle_armed`.
    deadline: Pin<Box<Sleep>>,
    /// The deadline is the keep-alive wait's, set when this wait began.
    idle_armed: bool,
    timed_out: bool,
    timeouts: IntCounter,
    /// Whether any byte was read yet (the h2c preface check).
    seen_bytes: bool,
    /// `server.h2c`: the listener serves HTTP/2 with prior knowledge.
    h2c: bool,
}

impl EdgeStream {
    /// `deadline`: when the first header block must be complete.
    pub fn new(
        inner: Stream,
        conn: Conn,
        replay: Vec<u8>,
        header_timeout: Duration,
        deadline: Instant,
        timeouts: IntCounter,
        h2c: bool,
    ) -> Self {
        Self {
            inner,
            conn,
            replay,
            header_timeout,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            idle_armed: false,
            timed_out: false,
            timeouts,
            seen_bytes: false,
            h2c,
        }
    }

    pub fn conn(&self) -> &Conn {
        &self.conn
    }

    /// The first bytes of the connection: on an h2c listener, the whole
    /// prior-knowledge preface makes it a multiplexed (HTTP/2) connection. A
    /// client sends the preface in one write and Pingora takes HTTP/2 only on
    /// all 24 bytes, so anything less (a slowloris trickling "PRI * HTTP/2.0"
    /// and then a header) stays HTTP/1 and under the header deadline.
    fn note_first_bytes(&mut self, bytes: &[u8]) {
        if self.seen_bytes {
            return;
        }
        self.seen_bytes = true;
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        if self.h2c && bytes.starts_with(PREFACE) {
            self.conn.multiplexed();
        }
    }

    /// The header took too long: answer 408 (best effort, one write into an
    /// idle socket) and fail the read, which ends the connection.
    fn time_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.timed_out {
            self.timed_out = true;
            self.timeouts.inc();
            tracing::debug!(event = "client_header_timeout", client = ?self.conn.source());
            let _ = Pin::new(&mut self.inner).poll_write(cx, TIMEOUT_RESPONSE);
            let _ = Pin::new(&mut self.inner).poll_flush(cx);
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client header timeout",
        )))
    }
}

impl AsyncRead for EdgeStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.replay.is_empty() {
            let n = this.replay.len().min(buf.remaining());
            buf.put_slice(&this.replay[..n]);
            if !this.seen_bytes {
                let first = this.replay[..n].to_vec();
                this.note_first_bytes(&first);
            }
            this.replay.drain(..n);
            return Poll::Ready(Ok(()));
        }
        let state = this.conn.state.load(Ordering::Relaxed);
        if state == IN_REQUEST {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        if this.timed_out || (state == AWAIT_HEADER && this.deadline.is_elapsed()) {
            return this.time_out(cx);
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        if !this.seen_bytes && buf.filled().len() > before {
            this.note_first_bytes(&buf.filled()[before..]);
            if this.conn.state.load(Ordering::Relaxed) == IN_REQUEST {
                return res;
            }
        }
        match res {
            Poll::Ready(Ok(())) if state == AWAIT_FIRST_BYTE && buf.filled().len() > before => {
                let at = Instant::now() + this.header_timeout;
                this.deadline.as_mut().reset(at);
                this.idle_armed = false;
                this.conn.state.store(AWAIT_HEADER, Ordering::Relaxed);
            }
            Poll::Pending if state == AWAIT_FIRST_BYTE => {
                if let Some(idle) = this.conn.keepalive() {
                    if !this.idle_armed {
                        this.idle_armed = true;
                        this.deadline.as_mut().reset(Instant::now() + idle);
                    }
                    if this.deadline.as_mut().poll(cx).is_ready() {
                        // Idle too long between requests: an end of stream, on which
                        // Pingora closes the connection without a response.
                        tracing::debug!(event = "client_keepalive_timeout", client = ?this.conn.source());
                        return Poll::Ready(Ok(()));
                    }
                }
            }
            Poll::Pending
                if state == AWAIT_HEADER && this.deadline.as_mut().poll(cx).is_ready() =>
            {
                return this.time_out(cx);
            }
            _ => {}
        }
        res
    }
}

// What EdgeStream only forwards to its `inner` stream: writes, shutdown, id, TLS
// info and the digests. Its own `AsyncRead` and `Peek` are above and below.

impl AsyncWrite for EdgeStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        AsyncWrite::poll_write(Pin::new(&mut *self.inner), cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_flush(Pin::new(&mut *self.inner), cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_shutdown(Pin::new(&mut *self.inner), cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        AsyncWrite::poll_write_vectored(Pin::new(&mut *self.inner), cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        AsyncWrite::is_write_vectored(&*self.inner)
    }
}

#[async_trait]
impl pingora::protocols::Shutdown for EdgeStream {
    async fn shutdown(&mut self) {
        pingora::protocols::Shutdown::shutdown(&mut *self.inner).await
    }
}

impl pingora::protocols::UniqueID for EdgeStream {
    fn id(&self) -> pingora::protocols::UniqueIDType {
        pingora::protocols::UniqueID::id(&*self.inner)
    }
}

/// The inner stream's TLS digest and ALPN, if it has them, are passed on.
impl pingora::protocols::Ssl for EdgeStream {
    fn get_ssl_digest(&self) -> Option<std::sync::Arc<pingora::protocols::tls::SslDigest>> {
        pingora::protocols::Ssl::get_ssl_digest(&*self.inner)
    }

    fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
        pingora::protocols::Ssl::selected_alpn_proto(&*self.inner)
    }
}

impl pingora::protocols::GetTimingDigest for EdgeStream {
    fn get_timing_digest(&self) -> Vec<Option<pingora::protocols::TimingDigest>> {
        pingora::protocols::GetTimingDigest::get_timing_digest(&*self.inner)
    }

    fn get_read_pending_time(&self) -> std::time::Duration {
        pingora::protocols::GetTimingDigest::get_read_pending_time(&*self.inner)
    }

    fn get_write_pending_time(&self) -> std::time::Duration {
        pingora::protocols::GetTimingDigest::get_write_pending_time(&*self.inner)
    }
}

impl pingora::protocols::GetProxyDigest for EdgeStream {
    fn get_proxy_digest(
        &self,
    ) -> Option<std::sync::Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        pingora::protocols::GetProxyDigest::get_proxy_digest(&*self.inner)
    }

    fn set_proxy_digest(&mut self, digest: pingora::protocols::raw_connect::ProxyDigest) {
        pingora::protocols::GetProxyDigest::set_proxy_digest(&mut *self.inner, digest)
    }
}

impl pingora::protocols::GetSocketDigest for EdgeStream {
    fn get_socket_digest(&self) -> Option<std::sync::Arc<pingora::protocols::SocketDigest>> {
        pingora::protocols::GetSocketDigest::get_socket_digest(&*self.inner)
    }

    fn set_socket_digest(&mut self, digest: pingora::protocols::SocketDigest) {
        pingora::protocols::GetSocketDigest::set_socket_digest(&mut *self.inner, digest)
    }
}

#[async_trait]
impl Peek for EdgeStream {
    /// Peeking would skip the replayed bytes: unsupported while there are any.
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        if !self.replay.is_empty() {
            return Ok(false);
        }
        self.inner.try_peek(buf).await
    }
}
