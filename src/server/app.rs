//! [`EdgeApp`]: the first thing a client connection meets. It enforces
//! `max_connections` from `accept`, before a TLS handshake (beyond it a connection
//! is closed at once, before a byte is read; the vendored pingora-core's accept hook,
//! `ServerApp::accept`), times the TLS handshake (`tls_handshake_timeout_ms`) and
//! logs failed handshakes once per interval ([`FloodLog`]), reads the PROXY header
//! from trusted peers when
//! `server.proxy_protocol` is on (any other peer is refused), and hands the
//! HTTP application an [`EdgeStream`] that knows the connection's identity.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{Accepted, HandshakeFailure, ServerApp};
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use crate::edge::proxy_protocol::{self, Parsed};
use crate::edge::stream::{Conn, EdgeStream};
use crate::metrics::EdgeRefusal;
use crate::state::Shared;

/// Wraps the HTTP application of the proxy listeners.
pub struct EdgeApp<A> {
    inner: Arc<A>,
    shared: Arc<Shared>,
    open: Arc<AtomicUsize>,
    handshakes: FloodLog,
}

impl<A> EdgeApp<A> {
    pub fn new(inner: A, shared: Arc<Shared>) -> Self {
        Self {
            inner: Arc::new(inner),
            shared,
            open: Arc::new(AtomicUsize::new(0)),
            handshakes: FloodLog::new(FLOOD_LOG_INTERVAL),
        }
    }
}

/// One open client connection, counted while it lives.
struct Open {
    open: Arc<AtomicUsize>,
    gauge: prometheus::IntGauge,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        self.gauge.dec();
    }
}

/// How often a flood of failed TLS handshakes is logged.
const FLOOD_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Logs an event that may come in floods (failed TLS handshakes) at most once per
/// interval: the first at once, then one line per interval with how many there were
/// since the last line. Pingora logged one ERROR per connection (4,036 lines in one
/// study of a handshake flood).
pub struct FloodLog {
    start: Instant,
    interval_ms: u64,
    /// When the last line was written, in ms since `start` (+1: 0 is "never").
    last_ms: AtomicU64,
    /// Events since the last line.
    unlogged: AtomicU64,
}

impl FloodLog {
    pub fn new(interval: Duration) -> Self {
        Self {
            start: Instant::now(),
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            last_ms: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Counts one event; `Some(n)`: write a line for the `n` events since the last.
    pub fn note(&self) -> Option<u64> {
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(self.start.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.last_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < self.interval_ms {
            return None;
        }
        self.last_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        Some(self.unlogged.swap(0, Ordering::Relaxed))
    }
}

fn peer_addr(stream: &Stream) -> Option<std::net::SocketAddr> {
    stream
        .get_socket_digest()
        .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).copied())
}

fn peer_ip(stream: &Stream) -> Option<IpAddr> {
    stream
        .get_socket_digest()
        .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()))
}

/// Read a PROXY header off `stream`: the source it names and the bytes read
/// past it. `None`: not a valid PROXY header, or the peer closed.
async fn read_proxy_header(stream: &mut Stream) -> Option<(Option<IpAddr>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        match proxy_protocol::parse(&buf) {
            Parsed::Incomplete => continue,
            Parsed::Invalid => return None,
            Parsed::Done { source, len } => {
                buf.drain(..len);
                return Some((source, buf));
            }
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for EdgeApp<A> {
    /// Counts the connection from `accept`, before a TLS handshake: one beyond
    /// `max_connections` is closed at once.
    fn accept(&self) -> Option<Accepted> {
        let rt = self.shared.runtime.load();
        let server = &rt.config.server;
        let metrics = &self.shared.metrics;
        let now_open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        metrics.edge.client_connections.inc();
        let open = Open {
            open: Arc::clone(&self.open),
            gauge: metrics.edge.client_connections.clone(),
        };
        if now_open > server.max_connections {
            metrics.edge.refusal(EdgeRefusal::ConnectionLimit);
            return None;
        }
        Some(Accepted {
            handshake_timeout: server.tls_handshake_timeout,
            hold: Some(Box::new(open)),
        })
    }

    fn handshake_failed(
        &self,
        peer: Option<&pingora::protocols::l4::socket::SocketAddr>,
        failure: HandshakeFailure<'_>,
    ) {
        let Some(n) = self.handshakes.note() else {
            return;
        };
        let (reason, error) = match failure {
            HandshakeFailure::Timeout => ("timeout", String::new()),
            HandshakeFailure::Error(e) => ("error", e.to_string()),
        };
        tracing::warn!(
            event = "tls_handshake_failed",
            failed = n,
            last_peer = ?peer.map(ToString::to_string),
            last_reason = reason,
            last_error = %error,
            "TLS handshakes failed or timed out (one line per {}s at most)",
            FLOOD_LOG_INTERVAL.as_secs()
        );
    }

    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let accepted = Instant::now();
        let rt = self.shared.runtime.load_full();
        let server = &rt.config.server;
        let metrics = &self.shared.metrics;

        let peer = peer_ip(&stream);
        let trusted = peer.is_some_and(|ip| server.trusted_proxies.contains(ip));
        let deadline = accepted + server.client_header_timeout;
        let mut replay = Vec::new();
        let mut proxied = None;
        // A TLS listener hands over a stream whose handshake is done: a PROXY
        // header would have come before it, so it applies to plain listeners.
        let over_tls = stream.get_ssl_digest().is_some();
        if server.proxy_protocol && !over_tls {
            if !trusted {
                metrics.edge.refusal(EdgeRefusal::ProxyUntrusted);
                tracing::debug!(event = "proxy_protocol_refused", peer = ?peer, "peer not trusted");
                return None;
            }
            let read = tokio::time::timeout_at(deadline, read_proxy_header(&mut stream)).await;
            let Ok(Some((source, rest))) = read else {
                metrics.edge.refusal(EdgeRefusal::ProxyInvalid);
                tracing::debug!(event = "proxy_protocol_refused", peer = ?peer, "no valid PROXY header");
                return None;
            };
            proxied = source;
            replay = rest;
        }
        // Filed for the HTTP/2 streams of this connection, until it closes.
        let _filed = proxied
            .zip(peer_addr(&stream))
            .map(|(source, addr)| self.shared.proxied.file(addr, source));
        let conn = Conn::new(peer, proxied, trusted);
        let alpn_h2 = stream.selected_alpn_proto() == Some(pingora::protocols::ALPN::H2);
        let mut edge = EdgeStream::new(
            stream,
            conn,
            replay,
            server.client_header_timeout,
            deadline,
            metrics.edge.refusal_counter(EdgeRefusal::HeaderTimeout),
            server.h2c,
        );
        edge.count_aborts(metrics.proxy.client_aborts.clone());
        if let Some(response) = rt.config.errors.header_timeout_response() {
            edge.answer_timeouts_with(response.clone());
        }
        if alpn_h2 {
            // HTTP/2: the header deadlines follow its frames, not HTTP/1's.
            edge.multiplexed();
        }
        drop(rt);
        self.inner.process_new(Box::new(edge), shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await;
    }
}
