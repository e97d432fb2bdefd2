//! The admin listener's connections: a cap on those open at once (with a reserve for the
//! probes) and the header timeout, through the edge stream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use pingora::apps::{Accepted, ServerApp};
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;

use super::{Admin, PROBE_RESERVE};
use crate::state::Shared;

/// The admin listener's connections (issue 40): at most `admin_max_connections` open at
/// once (beyond, a new one is closed at once), and `client_header_timeout_ms` from
/// accept to the end of each request's header block (408), with the proxy's idle
/// keep-alive wait between requests. A slowloris held the admin listener for minutes,
/// and enough of them took its file descriptors, `/healthz` with them.
pub struct AdminApp {
    inner: Arc<Admin>,
    shared: Arc<Shared>,
    open: Arc<AtomicUsize>,
    /// Header timeouts on the admin listener (not the proxy's refusal metric).
    header_timeouts: prometheus::IntCounter,
}

impl AdminApp {
    pub fn new(admin: Admin) -> Self {
        let shared = Arc::clone(&admin.shared);
        let open = Arc::clone(&admin.open);
        Self {
            inner: Arc::new(admin),
            shared,
            open,
            header_timeouts: prometheus::IntCounter::new(
                "portcullis_admin_header_timeouts",
                "admin header timeouts (not registered)",
            )
            .unwrap_or_else(|_| unreachable!("a valid metric name")),
        }
    }
}

/// One open admin connection, counted while it lives.
struct AdminOpen(Arc<AtomicUsize>);

impl Drop for AdminOpen {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl ServerApp for AdminApp {
    fn accept(&self) -> Option<Accepted> {
        let max = self
            .shared
            .runtime
            .load()
            .config
            .server
            .admin_max_connections;
        let now_open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        let open = AdminOpen(Arc::clone(&self.open));
        // The reserve is for the probes: `Admin::response` sends anything else away.
        if now_open > max.saturating_add(PROBE_RESERVE) {
            tracing::debug!(event = "admin_connection_refused", open = now_open - 1, max);
            return None;
        }
        Some(Accepted {
            hold: Some(Box::new(open)),
            ..Accepted::default()
        })
    }

    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let header_timeout = self
            .shared
            .runtime
            .load()
            .config
            .server
            .client_header_timeout;
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let edge = crate::edge::stream::EdgeStream::new(
            stream,
            crate::edge::Conn::new(peer, None, false),
            Vec::new(),
            header_timeout,
            tokio::time::Instant::now() + header_timeout,
            self.header_timeouts.clone(),
            false,
        );
        self.inner.process_new(Box::new(edge), shutdown).await
    }
}
