//! [`EdgeStream`]: a client connection as the edge sees it. It carries the
//! connection's identity ([`Conn`]), replays the bytes read past a PROXY
//! header, and enforces two deadlines with one timer per connection:
//! - `client_header_timeout_ms` across a whole header block (Pingora's own read
//!   timeout restarts on every byte, which a slowloris sending one byte at a time
//!   never trips);
//! - `keepalive_timeout_seconds` / `idle_timeout_ms` between requests, when the proxy
//!   hands it over ([`Conn::header_received`]). Pingora's own keep-alive timeout
//!   registers a timer for every wait (two allocations, a lock and a notifier: ~1.2k
//!   instructions per request, benches/history/2026-11-passes.md, issue 16, twelfth pass); this one resets
//!   the connection's timer, which only moves a deadline.
//!
//! Over HTTP/2 (ALPN `h2` or the h2c preface) it follows the frame headers the client
//! sends (not their payloads, [`H2Frames`]): the first request's header block must be
//! complete within `client_header_timeout_ms` of accept, and a later header block
//! (HEADERS without END_HEADERS, then CONTINUATION) within that long of its first frame,
//! else the connection is closed (issue 40: an idle connection after the preface or a
//! half-sent header block was held forever).
//!
//! On an h2c listener Pingora peeks for the preface ([`Peek`]): the peek reads through
//! the header deadline, into the replay buffer, and stops as soon as the bytes cannot be
//! the preface, so a silent client is timed and a complete HTTP/1.0 request shorter than
//! the preface is answered; bytes replayed after a PROXY header are peeked too.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::task::{ready, Context, Poll};
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

/// What the proxy answers a header block that took too long (unless `[errors]` says
/// otherwise: [`EdgeStream::answer_timeouts_with`]); then the connection closes.
/// Written by the stream itself: no request exists yet.
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
    /// Idle time allowed between requests, in milliseconds; 0: the stream does not
    /// time it (Pingora does, or nothing does).
    keepalive: AtomicU32,
    /// The request became a tunnel (an upgrade): it is closed once no byte has gone
    /// either way for this many milliseconds; 0: not a tunnel.
    tunnel_idle: AtomicU32,
}

impl Conn {
    pub fn new(peer: Option<IpAddr>, proxied: Option<IpAddr>, trusted: bool) -> Self {
        Self {
            peer,
            proxied,
            trusted,
            state: AtomicU8::new(AWAIT_HEADER),
            keepalive: AtomicU32::new(0),
            tunnel_idle: AtomicU32::new(0),
        }
    }

    fn keepalive(&self) -> Option<Duration> {
        match self.keepalive.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(u64::from(ms))),
        }
    }

    /// The connection's source: what `X-Forwarded-For` gets appended.
    pub fn source(&self) -> Option<IpAddr> {
        self.proxied.or(self.peer)
    }

    /// The connection carries HTTP/2 (ALPN `h2` or the h2c preface): its
    /// streams are multiplexed, and the HTTP/1 header-block deadline never
    /// applies (the stream's HTTP/2 frame tracking does, [`EdgeStream::multiplexed`]).
    fn multiplexed(&self) {
        self.state.store(IN_REQUEST, Ordering::Relaxed);
    }

    /// A request header was parsed: the header deadline no longer applies. After this
    /// request the stream ends the connection, quietly (as an end of stream, which
    /// Pingora takes for a client that left), once it has waited `keepalive` for
    /// the next request's first byte; zero: it does not time that wait. The proxy then
    /// tells Pingora not to time it either.
    pub fn header_received(&self, keepalive: Duration) {
        self.state.store(IN_REQUEST, Ordering::Relaxed);
        self.tunnel_idle.store(0, Ordering::Relaxed);
        let ms = u32::try_from(keepalive.as_millis()).unwrap_or(u32::MAX);
        self.keepalive.store(ms, Ordering::Relaxed);
    }

    /// The request is an upgrade: from now on the connection is a tunnel, closed by
    /// the stream once no byte has gone either way (read from the client or written
    /// to it, which are the two directions of the tunnel) for `idle`
    /// (`tunnel_idle_timeout_seconds`). Neither side's reads are timed otherwise: a
    /// side that is quiet while the other talks is not idle.
    pub fn tunnel(&self, idle: Duration) {
        let ms = u32::try_from(idle.as_millis()).unwrap_or(u32::MAX).max(1);
        self.tunnel_idle.store(ms, Ordering::Relaxed);
    }

    fn tunnel_idle(&self) -> Option<Duration> {
        match self.tunnel_idle.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(u64::from(ms))),
        }
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
    /// The whole response to a header timeout.
    timeout_response: bytes::Bytes,
    /// `server.h2c`: the listener serves HTTP/2 with prior knowledge.
    h2c: bool,
    /// The connection is HTTP/2: where its frames begin and end.
    h2: Option<H2Frames>,
    /// A tunnel's last byte either way (`None`: not timing a tunnel yet).
    tunnel_last_io: Option<Instant>,
    /// Bytes of an HTTP/1 request header have been read and the header is not
    /// complete yet (the proxy has not called [`Conn::header_received`]).
    partial_header: bool,
    /// `portcullis_client_aborts_total`, for a client that leaves mid-header
    /// ([`EdgeStream::count_aborts`]); counted at most once per connection.
    aborts: Option<IntCounter>,
}

/// The HTTP/2 preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_HEADERS: u8 = 0x4;

/// What an HTTP/2 client has sent, as far as header deadlines go: the stream reads its
/// frame headers (9 bytes each) and skips their payloads, so it costs a few
/// comparisons per frame and nothing per payload byte.
#[derive(Debug)]
struct H2Frames {
    /// Bytes still to skip: the preface, then the current frame's payload.
    skip: usize,
    head: [u8; 9],
    head_len: usize,
    /// A header block is open: from the first byte of a HEADERS frame to the last
    /// byte of the frame with END_HEADERS (a HEADERS or CONTINUATION).
    in_block: bool,
    /// The frame whose payload is being skipped ends its header block.
    ends_block: bool,
    /// A whole header block has arrived (the first request's header).
    first_done: bool,
}

impl H2Frames {
    fn new() -> Self {
        Self {
            skip: PREFACE.len(),
            head: [0; 9],
            head_len: 0,
            in_block: false,
            ends_block: false,
            first_done: false,
        }
    }

    /// Whether the header deadline runs: before the first header block is complete,
    /// and while a header block is open.
    fn timed(&self) -> bool {
        !self.first_done || self.in_block
    }

    /// Follows `bytes`, the next bytes the client sent. True: a header block opened
    /// after the first request's (its deadline starts now).
    fn scan(&mut self, mut bytes: &[u8]) -> bool {
        let mut opened = false;
        loop {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
            }
            if self.skip == 0 && self.ends_block {
                // the last byte of the block's last frame
                self.ends_block = false;
                self.in_block = false;
                self.first_done = true;
            }
            if bytes.is_empty() {
                break;
            }
            let n = (9 - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
            self.head_len += n;
            bytes = &bytes[n..];
            if self.head_len < 9 {
                break;
            }
            self.head_len = 0;
            let [l0, l1, l2, kind, flags, ..] = self.head;
            self.skip = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
            if kind == FRAME_HEADERS || kind == FRAME_CONTINUATION {
                // A block is open until its last frame has all its payload (a frame
                // with END_HEADERS whose payload trickles is still a header block).
                opened |= kind == FRAME_HEADERS && self.first_done && !self.in_block;
                self.in_block = true;
                self.ends_block = flags & FLAG_END_HEADERS != 0;
            }
        }
        opened
    }
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
            timeout_response: bytes::Bytes::from_static(TIMEOUT_RESPONSE),
            h2c,
            h2: None,
            tunnel_last_io: None,
            partial_header: false,
            aborts: None,
        }
    }

    /// Count in `aborts` a client that leaves mid-header: an end of stream or a
    /// read error after part of a request header (Pingora's downstream
    /// `ConnectionClosed`/`ReadError` "while reading request headers", which it
    /// hands to no proxy phase), or a failed write before the header is complete
    /// (the 400 Pingora answers a malformed header with, to a client already gone).
    pub fn count_aborts(&mut self, aborts: IntCounter) {
        self.aborts = Some(aborts);
    }

    /// Answer a header timeout with `response`, a whole HTTP/1.1 response rendered at
    /// config load (`[errors]`), instead of the plain-text one.
    pub fn answer_timeouts_with(&mut self, response: bytes::Bytes) {
        self.timeout_response = response;
    }

    /// A failed write before the header was taken: only Pingora's own answer to a
    /// request it refuses before any proxy phase (a malformed header's 400) is
    /// written then (the 408 goes to the inner stream directly), so the client left.
    fn note_write(&mut self, res: &Poll<io::Result<usize>>) {
        if matches!(res, Poll::Ready(Err(_)))
            && self.h2.is_none()
            && self.conn.state.load(Ordering::Relaxed) == AWAIT_HEADER
        {
            self.header_phase_abort();
        }
    }

    /// The client left in the header phase: counted once, logged at debug.
    fn header_phase_abort(&mut self) {
        self.partial_header = false;
        if let Some(aborts) = self.aborts.take() {
            aborts.inc();
            tracing::debug!(event = "client_abort", phase = "header", client = ?self.conn.source());
        }
    }

    /// The connection carries HTTP/2 from its first byte (ALPN `h2`, or the h2c
    /// preface found by the peek): header deadlines follow its frames.
    pub fn multiplexed(&mut self) {
        self.conn.multiplexed();
        self.h2 = Some(H2Frames::new());
    }

    pub fn conn(&self) -> &Conn {
        &self.conn
    }

    /// An HTTP/2 header block took too long: the read fails, which ends the
    /// connection (nothing is written: the HTTP/2 codec owns the writes).
    fn h2_time_out(&mut self) -> Poll<io::Result<()>> {
        if !self.timed_out {
            self.timed_out = true;
            self.timeouts.inc();
            tracing::debug!(event = "client_header_timeout", client = ?self.conn.source(), h2 = true);
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client header timeout",
        )))
    }

    /// Moves replayed bytes into `buf`.
    fn serve_replay(&mut self, buf: &mut ReadBuf<'_>) {
        self.partial_header |= self.conn.state.load(Ordering::Relaxed) != IN_REQUEST;
        let n = self.replay.len().min(buf.remaining());
        buf.put_slice(&self.replay[..n]);
        self.replay.drain(..n);
    }

    /// A read of an HTTP/2 connection: replayed bytes first, then the socket; the
    /// frames read are followed, and the header deadline applies while it runs.
    fn poll_read_h2(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let Some(h2) = self.h2.as_mut() else {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        let res = if !self.replay.is_empty() {
            let n = self.replay.len().min(buf.remaining());
            buf.put_slice(&self.replay[..n]);
            self.replay.drain(..n);
            Poll::Ready(Ok(()))
        } else if self.timed_out || (h2.timed() && self.deadline.is_elapsed()) {
            return self.h2_time_out();
        } else {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        };
        match res {
            // a header block opened: its deadline starts now
            Poll::Ready(Ok(())) if h2.scan(&buf.filled()[before..]) && h2.timed() => {
                let at = Instant::now() + self.header_timeout;
                self.deadline.as_mut().reset(at);
            }
            Poll::Pending if h2.timed() && self.deadline.as_mut().poll(cx).is_ready() => {
                return self.h2_time_out();
            }
            _ => {}
        }
        res
    }

    /// Reads from the socket (not the replay buffer) under the HTTP/1 deadlines.
    fn poll_read_socket(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let state = self.conn.state.load(Ordering::Relaxed);
        if state == IN_REQUEST {
            self.partial_header = false;
            return match self.conn.tunnel_idle() {
                None => Pin::new(&mut self.inner).poll_read(cx, buf),
                Some(idle) => self.poll_read_tunnel(cx, buf, idle),
            };
        }
        // between requests: an upgrade that was refused left no tunnel behind
        self.tunnel_last_io = None;
        if self.timed_out || (state == AWAIT_HEADER && self.deadline.is_elapsed()) {
            return self.time_out(cx);
        }
        if state == AWAIT_FIRST_BYTE {
            self.partial_header = false;
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &res {
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.partial_header = true,
            Poll::Ready(_) if self.partial_header => self.header_phase_abort(),
            _ => {}
        }
        match res {
            Poll::Ready(Ok(())) if state == AWAIT_FIRST_BYTE && buf.filled().len() > before => {
                let at = Instant::now() + self.header_timeout;
                self.deadline.as_mut().reset(at);
                self.idle_armed = false;
                self.conn.state.store(AWAIT_HEADER, Ordering::Relaxed);
            }
            Poll::Pending if state == AWAIT_FIRST_BYTE => {
                if let Some(idle) = self.conn.keepalive() {
                    if !self.idle_armed {
                        self.idle_armed = true;
                        self.deadline.as_mut().reset(Instant::now() + idle);
                    }
                    if self.deadline.as_mut().poll(cx).is_ready() {
                        // Idle too long between requests: an end of stream, on which
                        // Pingora closes the connection without a response.
                        tracing::debug!(event = "client_keepalive_timeout", client = ?self.conn.source());
                        return Poll::Ready(Ok(()));
                    }
                }
            }
            Poll::Pending
                if state == AWAIT_HEADER && self.deadline.as_mut().poll(cx).is_ready() =>
            {
                return self.time_out(cx);
            }
            _ => {}
        }
        res
    }

    /// Reads a tunnel's client side: a read that waits while nothing has gone either
    /// way for `idle` fails (timed out), which ends the tunnel on both sides.
    fn poll_read_tunnel(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        idle: Duration,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        match res {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.tunnel_last_io = Some(Instant::now());
            }
            Poll::Pending => {
                let last = *self.tunnel_last_io.get_or_insert_with(Instant::now);
                let due = last + idle;
                if self.deadline.deadline() != due {
                    self.deadline.as_mut().reset(due);
                }
                if self.deadline.as_mut().poll(cx).is_ready() {
                    tracing::debug!(event = "tunnel_idle_timeout", client = ?self.conn.source());
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "tunnel idle timeout",
                    )));
                }
            }
            _ => {}
        }
        res
    }

    /// A write to the client: a byte of a tunnel's other direction.
    fn wrote(&mut self, res: &Poll<io::Result<usize>>) {
        if matches!(res, Poll::Ready(Ok(n)) if *n > 0) && self.tunnel_last_io.is_some() {
            self.tunnel_last_io = Some(Instant::now());
        }
    }

    /// Reads into the replay buffer until it holds `want` bytes, the client stops
    /// sending (end of stream) or the bytes cannot begin the HTTP/2 preface (the one
    /// peek Pingora makes is the h2c check: an HTTP/1 request, even a whole one shorter
    /// than the preface, is then known for one). Under the header deadline.
    fn poll_fill_replay(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<()>> {
        loop {
            let have = self.replay.len();
            if have >= want || !PREFACE.starts_with(&self.replay[..have.min(PREFACE.len())]) {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 256];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(self.poll_read_socket(cx, &mut rb))?;
            if rb.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            self.replay.extend_from_slice(rb.filled());
        }
    }

    /// The header took too long: answer 408 (best effort: what an idle socket takes
    /// without waiting) and fail the read, which ends the connection.
    fn time_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.timed_out {
            self.timed_out = true;
            self.timeouts.inc();
            tracing::debug!(event = "client_header_timeout", client = ?self.conn.source());
            // As much as the socket takes now: the connection closes either way.
            let mut sent = 0;
            while sent < self.timeout_response.len() {
                let rest = &self.timeout_response[sent..];
                match Pin::new(&mut self.inner).poll_write(cx, rest) {
                    Poll::Ready(Ok(n)) if n > 0 => sent += n,
                    _ => break,
                }
            }
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
        if this.h2.is_some() {
            return this.poll_read_h2(cx, buf);
        }
        if !this.replay.is_empty() {
            this.serve_replay(buf);
            return Poll::Ready(Ok(()));
        }
        this.poll_read_socket(cx, buf)
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
        let res = AsyncWrite::poll_write(Pin::new(&mut *self.inner), cx, buf);
        self.wrote(&res);
        self.note_write(&res);
        res
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
        let res = AsyncWrite::poll_write_vectored(Pin::new(&mut *self.inner), cx, bufs);
        self.wrote(&res);
        self.note_write(&res);
        res
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
    fn get_timing_digest(&self) -> pingora::protocols::TimingDigests {
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
    /// Pingora's h2c check: fills `buf` from the replayed bytes and the socket, under
    /// the header deadline, and stops early on bytes that cannot be the preface (the
    /// rest of `buf` is left as it was). Everything peeked is replayed to the reader.
    /// The whole preface on an h2c listener makes the connection HTTP/2.
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let want = buf.len();
        std::future::poll_fn(|cx| self.poll_fill_replay(cx, want)).await?;
        if self.replay.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let n = self.replay.len().min(want);
        buf[..n].copy_from_slice(&self.replay[..n]);
        if self.h2c && self.h2.is_none() && self.replay.starts_with(PREFACE) {
            self.multiplexed();
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload_len: usize) -> Vec<u8> {
        let mut f = vec![
            (payload_len >> 16) as u8,
            (payload_len >> 8) as u8,
            payload_len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        f.resize(9 + payload_len, 0x55);
        f
    }

    /// Feeds `bytes` in pieces of `step`; the state after each piece.
    fn states(bytes: &[u8], step: usize) -> Vec<(bool, bool)> {
        let mut h2 = H2Frames::new();
        bytes
            .chunks(step)
            .map(|c| {
                h2.scan(c);
                (h2.first_done, h2.in_block)
            })
            .collect()
    }

    #[test]
    fn a_header_block_ends_with_the_last_byte_of_its_end_headers_frame() {
        let settings = frame(0x4, 0, 6);
        let headers = frame(FRAME_HEADERS, 0, 20);
        let cont = frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 10);
        let all = [PREFACE, &settings, &headers, &cont].concat();
        for step in [1, 2, 3, 7, 9, 64, all.len()] {
            let s = states(&all, step);
            assert_eq!(s.last(), Some(&(true, false)), "step {step}");
            // done only once every byte of the CONTINUATION arrived
            let done_at = s.iter().position(|&(d, _)| d).map(|i| (i + 1) * step);
            assert!(done_at.is_some_and(|at| at >= all.len()), "step {step}");
        }
        // END_HEADERS on HEADERS itself, its payload trickled: open until the end.
        let one = [PREFACE, &frame(FRAME_HEADERS, FLAG_END_HEADERS | 0x1, 30)].concat();
        let s = states(&one, 1);
        assert!(s[..one.len() - 1].iter().all(|&(d, _)| !d));
        assert_eq!(s.last(), Some(&(true, false)));
        // An empty END_HEADERS frame ends it; DATA frames never open one.
        let mut h2 = H2Frames::new();
        h2.scan(&[PREFACE, &frame(FRAME_HEADERS, FLAG_END_HEADERS, 0)].concat());
        assert!(!h2.timed());
        assert!(!h2.scan(&frame(0x0, 0, 100)));
        assert!(!h2.timed());
        // A later block opens (its deadline starts) and ends.
        assert!(h2.scan(&frame(FRAME_HEADERS, 0, 5)));
        assert!(h2.timed());
        h2.scan(&frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 5));
        assert!(!h2.timed());
    }
}
