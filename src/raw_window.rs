//! The last bytes a client connection delivered, kept so the proxy can tell
//! what the client really sent on its request line.
//!
//! Pingora 0.9.1 "repairs" a request line that `httparse` refuses (a space, a
//! control byte, `<`, `>` or `"` in the target): it percent-encodes the target
//! and parses again, so `GET /a b HTTP/1.1` reaches every hook — and the
//! backend — as `GET /a%20b`. Nothing in the parsed request says that
//! happened. [`RecordingApp`] wraps each plain-TCP client stream in a
//! [`RecordingStream`] that keeps the last [`WINDOW`] bytes read; the proxy
//! looks at them only when a target contains `%`, and refuses (400) a request
//! whose target was rewritten ([`target_was_rewritten`]).
//!
//! TLS streams are passed through unwrapped (the wrapper cannot forward
//! `Ssl::get_ssl` without naming the TLS backend's type): over TLS the check
//! does not run.

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::{Peek, Stream};
use pingora::server::ShutdownWatch;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};

/// The parts of Pingora's stream traits a wrapper only forwards to its
/// `inner` stream: writes, shutdown, id, TLS info and the digests. A wrapper
/// writes its own `AsyncRead` and `Peek`, the parts where it does something.
#[macro_export]
macro_rules! forward_stream_io {
    ($ty:ty) => {
        impl tokio::io::AsyncWrite for $ty {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                tokio::io::AsyncWrite::poll_write(std::pin::Pin::new(&mut *self.inner), cx, buf)
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                tokio::io::AsyncWrite::poll_flush(std::pin::Pin::new(&mut *self.inner), cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                tokio::io::AsyncWrite::poll_shutdown(std::pin::Pin::new(&mut *self.inner), cx)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                tokio::io::AsyncWrite::poll_write_vectored(
                    std::pin::Pin::new(&mut *self.inner),
                    cx,
                    bufs,
                )
            }

            fn is_write_vectored(&self) -> bool {
                tokio::io::AsyncWrite::is_write_vectored(&*self.inner)
            }
        }

        #[async_trait::async_trait]
        impl pingora::protocols::Shutdown for $ty {
            async fn shutdown(&mut self) {
                pingora::protocols::Shutdown::shutdown(&mut *self.inner).await
            }
        }

        impl pingora::protocols::UniqueID for $ty {
            fn id(&self) -> pingora::protocols::UniqueIDType {
                pingora::protocols::UniqueID::id(&*self.inner)
            }
        }

        /// Only plain-TCP streams are wrapped: whatever TLS information the
        /// inner stream has (none) is passed on.
        impl pingora::protocols::Ssl for $ty {
            fn get_ssl_digest(&self) -> Option<std::sync::Arc<pingora::protocols::tls::SslDigest>> {
                pingora::protocols::Ssl::get_ssl_digest(&*self.inner)
            }

            fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
                pingora::protocols::Ssl::selected_alpn_proto(&*self.inner)
            }
        }

        impl pingora::protocols::GetTimingDigest for $ty {
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

        impl pingora::protocols::GetProxyDigest for $ty {
            fn get_proxy_digest(
                &self,
            ) -> Option<std::sync::Arc<pingora::protocols::raw_connect::ProxyDigest>> {
                pingora::protocols::GetProxyDigest::get_proxy_digest(&*self.inner)
            }

            fn set_proxy_digest(&mut self, digest: pingora::protocols::raw_connect::ProxyDigest) {
                pingora::protocols::GetProxyDigest::set_proxy_digest(&mut *self.inner, digest)
            }
        }

        impl pingora::protocols::GetSocketDigest for $ty {
            fn get_socket_digest(
                &self,
            ) -> Option<std::sync::Arc<pingora::protocols::SocketDigest>> {
                pingora::protocols::GetSocketDigest::get_socket_digest(&*self.inner)
            }

            fn set_socket_digest(&mut self, digest: pingora::protocols::SocketDigest) {
                pingora::protocols::GetSocketDigest::set_socket_digest(&mut *self.inner, digest)
            }
        }
    };
}

/// Bytes kept per connection (the buffer holds at most twice this): enough
/// for the request lines of the requests currently buffered. A request line
/// longer than this is not found, and such a request passes unchecked; Pingora
/// itself keeps a header buffer of this order per connection.
pub const WINDOW: usize = 4 * 1024;

/// A client stream that remembers the last [`WINDOW`] bytes read from it.
#[derive(Debug)]
pub struct RecordingStream {
    inner: Stream,
    recent: Vec<u8>,
}

impl RecordingStream {
    pub fn new(inner: Stream) -> Self {
        Self {
            inner,
            recent: Vec::new(),
        }
    }

    /// The most recent bytes read (at most 2 × [`WINDOW`], at least the last
    /// [`WINDOW`] when that many were read).
    pub fn recent(&self) -> &[u8] {
        &self.recent
    }

    /// The wrapped stream.
    pub fn inner(&self) -> &Stream {
        &self.inner
    }

    fn remember(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(WINDOW)..];
        if self.recent.len() + data.len() > 2 * WINDOW {
            let keep = WINDOW.saturating_sub(data.len()).min(self.recent.len());
            let start = self.recent.len() - keep;
            self.recent.drain(..start);
        }
        self.recent.extend_from_slice(data);
    }
}

impl AsyncRead for RecordingStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = res {
            if let Some(new) = buf.filled().get(before..).filter(|n| !n.is_empty()) {
                this.remember(new);
            }
        }
        res
    }
}

crate::forward_stream_io!(RecordingStream);

#[async_trait]
impl Peek for RecordingStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

/// Wraps a server application so that its plain-TCP client streams are
/// [`RecordingStream`]s.
pub struct RecordingApp<A> {
    inner: Arc<A>,
}

impl<A> RecordingApp<A> {
    pub fn new(inner: A) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for RecordingApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let stream: Stream = if stream.get_ssl_digest().is_some() {
            stream
        } else {
            Box::new(RecordingStream::new(stream))
        };
        self.inner.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await;
    }
}

/// The recent bytes of the stream under an HTTP/1 session, when it is a
/// [`RecordingStream`].
pub fn recent_bytes(stream: &Stream) -> Option<&[u8]> {
    let io: &dyn pingora::protocols::IO = stream.as_ref();
    io.as_any()
        .downcast_ref::<RecordingStream>()
        .map(RecordingStream::recent)
}

/// Pingora's repair: control bytes (and DEL), space, `<`, `>`, `"` and every
/// non-ASCII byte become `%XX` (upper-case hex).
fn needs_escape(b: u8) -> bool {
    !(0x20..0x7f).contains(&b) || matches!(b, b' ' | b'<' | b'>' | b'"')
}

fn escape_into(target: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in target {
        if needs_escape(b) {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        } else {
            out.push(b);
        }
    }
}

/// Whether `recent` (raw bytes from the client) holds a request line for
/// `method` whose target Pingora would have rewritten into `target`: the
/// client sent bytes that are not allowed in a request target.
pub fn target_was_rewritten(recent: &[u8], method: &[u8], target: &[u8]) -> bool {
    let mut escaped = Vec::new();
    recent.split(|&b| b == b'\n').any(|line| {
        let Some(rest) = line.strip_prefix(method).and_then(|r| r.strip_prefix(b" ")) else {
            return false;
        };
        // Pingora's pattern: `^\w+ (?P<uri>.+) HTTP/\d(?:\.\d)?`, greedy.
        let Some(end) = rest.windows(6).rposition(|w| w == b" HTTP/") else {
            return false;
        };
        let raw = &rest[..end];
        if !raw.iter().copied().any(needs_escape) {
            return false;
        }
        escaped.clear();
        escape_into(raw, &mut escaped);
        escaped == target
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_space_rewritten_to_percent_20_is_recognised() {
        let recent = b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(target_was_rewritten(recent, b"GET", b"/a%20b"));
        let tab = b"GET /a\tb?q=<1> HTTP/1.1\r\n\r\n";
        assert!(target_was_rewritten(tab, b"GET", b"/a%09b?q=%3C1%3E"));
    }

    #[test]
    fn a_target_sent_encoded_is_not_a_rewrite() {
        let recent = b"GET /a%20b HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(!target_was_rewritten(recent, b"GET", b"/a%20b"));
        // another method's line, or a line for another target, does not count
        let other = b"POST /a b HTTP/1.1\r\n\r\nGET /c d HTTP/1.1\r\n\r\n";
        assert!(!target_was_rewritten(other, b"GET", b"/a%20b"));
        assert!(target_was_rewritten(other, b"GET", b"/c%20d"));
    }

    #[test]
    fn window_keeps_the_latest_bytes() {
        let mut s = RecordingStream::new(Box::new(tokio_test_stream()));
        for i in 0..100u8 {
            s.remember(&[i; 1000]);
        }
        assert!(s.recent().len() >= WINDOW && s.recent().len() <= 2 * WINDOW);
        assert_eq!(s.recent().last(), Some(&99));
        s.remember(&vec![7u8; 3 * WINDOW]);
        assert!(s.recent().len() <= 2 * WINDOW);
        assert!(s.recent().ends_with(&[7u8; WINDOW]));
    }

    fn tokio_test_stream() -> std::io::Cursor<Vec<u8>> {
        std::io::Cursor::new(Vec::new())
    }
}
