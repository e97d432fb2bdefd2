//! The active health check's probe (`[upstreams.health_check]`): one request per due
//! backend over a fresh connection, with the configured method, path, `Host` and headers,
//! judged by `expect_status` and `expect_body` within `timeout_ms`. Pingora's health
//! registry calls it at the upstream's fast interval and counts `rise`/`fall` with the
//! thresholds it is given; a settled healthy backend is probed only every `interval_ms`
//! (between, its last pass stands). Each backend's [`Track`] (last result, its duration,
//! progress toward a flip, time in state) is what `/backends` and `/status` show.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use async_trait::async_trait;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::lb::health_check::HealthCheck as PingoraCheck;
use pingora::lb::Backend;
use portcullis_policy::health::{Outcome, Track};

use crate::config::{HealthCheck, UpstreamTransport};

/// The most of a body read for `expect_body`.
const BODY_WINDOW: usize = 64 * 1024;

/// Every backend's track, and its probe counts by result; kept across reloads with the
/// pool's health registry.
#[derive(Default)]
pub struct Tracks {
    inner: Mutex<HashMap<SocketAddr, (Track, Counts)>>,
}

/// Probes of one backend by result label.
pub type Counts = HashMap<&'static str, u64>;

impl Tracks {
    fn lock(&self) -> MutexGuard<'_, HashMap<SocketAddr, (Track, Counts)>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of `addr`'s track (`None`: never probed).
    pub fn get(&self, addr: &SocketAddr) -> Option<Track> {
        self.lock().get(addr).map(|(t, _)| t.clone())
    }

    /// Each backend's probe counts by result.
    pub fn counts(&self) -> Vec<(SocketAddr, Counts)> {
        self.lock()
            .iter()
            .map(|(a, (_, c))| (*a, c.clone()))
            .collect()
    }
}

/// The check of one upstream.
pub struct Probe {
    check: HealthCheck,
    transport: UpstreamTransport,
    /// The `Host` of each backend when `host` is not set: the `sni`, else the backend
    /// as written.
    hosts: HashMap<SocketAddr, String>,
    tracks: Arc<Tracks>,
    connector: Connector,
}

impl Probe {
    pub fn new(
        check: HealthCheck,
        transport: UpstreamTransport,
        backends: &[SocketAddr],
        written: &[String],
        tracks: Arc<Tracks>,
    ) -> Self {
        let hosts = backends
            .iter()
            .enumerate()
            .map(|(i, a)| (*a, default_host(&check, &transport, *a, written.get(i))))
            .collect();
        Self {
            check,
            transport,
            hosts,
            tracks,
            connector: Connector::new(None),
        }
    }

    /// Whether this probe is the one `check` and `transport` ask for (a reload that
    /// changes neither keeps it).
    pub fn is(&self, check: &HealthCheck, transport: &UpstreamTransport) -> bool {
        self.check == *check && self.transport == *transport
    }

    /// The `Host` a probe of `addr` sends.
    pub fn host_of(&self, addr: SocketAddr) -> String {
        self.hosts
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| addr.to_string())
    }

    /// Whether `status` is one `expect_status` takes.
    pub fn passes(&self, status: u16) -> bool {
        self.check.expect_status.matches(status)
    }

    pub fn thresholds(&self) -> portcullis_policy::health::Thresholds {
        self.check.thresholds
    }

    /// One probe of `addr`: what it found.
    async fn probe(&self, addr: SocketAddr) -> Outcome {
        let mut target = addr;
        if let Some(port) = self.check.port {
            target.set_port(port);
        }
        let mut peer = super::peer::peer(target, &self.transport, false);
        peer.options.connection_timeout = Some(self.check.timeout);
        peer.options.total_connection_timeout = Some(self.check.timeout);
        let host = self
            .hosts
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| addr.to_string());
        let Ok(req) = self.request(&host) else {
            return Outcome::Protocol;
        };
        let work = async {
            let (mut session, _) = match self.connector.get_http_session(&peer).await {
                Ok(s) => s,
                Err(_) => return Outcome::Connect,
            };
            if session.write_request_header(Box::new(req)).await.is_err()
                || session.finish_request_body().await.is_err()
                || session.read_response_header().await.is_err()
            {
                return Outcome::Protocol;
            }
            let status = session.response_header().map_or(0, |r| r.status.as_u16());
            if !self.check.expect_status.matches(status) {
                return Outcome::Status(status);
            }
            if self.check.expect_body.is_empty() {
                return Outcome::Ok;
            }
            let mut body: Vec<u8> = Vec::new();
            loop {
                match session.read_response_body().await {
                    Ok(Some(chunk)) => {
                        let room = BODY_WINDOW.saturating_sub(body.len());
                        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                        if contains(&body, self.check.expect_body.as_bytes()) {
                            return Outcome::Ok;
                        }
                        if body.len() >= BODY_WINDOW {
                            return Outcome::Body;
                        }
                    }
                    Ok(None) => return Outcome::Body,
                    Err(_) => return Outcome::Protocol,
                }
            }
        };
        match tokio::time::timeout(self.check.timeout, work).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Timeout,
        }
    }

    fn request(&self, host: &str) -> pingora::Result<RequestHeader> {
        let mut req =
            RequestHeader::build(self.check.method.as_str(), self.check.path.as_bytes(), None)?;
        req.insert_header("Host", host)?;
        req.insert_header("User-Agent", "portcullis-health-check")?;
        for (name, value) in &self.check.headers {
            req.insert_header(name.clone(), value.as_str())?;
        }
        Ok(req)
    }
}

/// The `Host` a probe of `addr` sends when `host` is not set: the upstream's `sni`, else
/// the backend as written (`10.0.0.5:8080`, `api.example:8080`): what a client of that
/// backend would send, never `localhost`.
fn default_host(
    check: &HealthCheck,
    transport: &UpstreamTransport,
    addr: SocketAddr,
    written: Option<&String>,
) -> String {
    if !check.host.is_empty() {
        check.host.clone()
    } else if !transport.sni.is_empty() {
        transport.sni.clone()
    } else {
        written.cloned().unwrap_or_else(|| addr.to_string())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

fn now_ms() -> u64 {
    crate::state::unix_ms()
}

#[async_trait]
impl PingoraCheck for Probe {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let Some(addr) = target.addr.as_inet().copied() else {
            return Ok(());
        };
        let t = self.check.thresholds;
        // A settled healthy backend between its probes: its last pass stands.
        let cached = self.tracks.lock().get(&addr).and_then(|(track, _)| {
            (!track.due(now_ms(), &t)).then_some(track.healthy && !track.unsettled())
        });
        if cached == Some(true) {
            return Ok(());
        }
        let started = Instant::now();
        let started_ms = now_ms();
        let outcome = self.probe(addr).await;
        let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let passed = outcome.passed();
        let label = outcome.label();
        let shown = outcome.to_string();
        {
            let mut all = self.tracks.lock();
            let (track, counts) = all
                .entry(addr)
                .or_insert_with(|| (Track::new(started_ms), Counts::new()));
            // `at_ms` is when the probe started: the interval runs from start to start
            if track.observe(outcome, started_ms, took, &t) {
                tracing::warn!(
                    event = "health",
                    backend = %addr,
                    healthy = track.healthy,
                    check = %shown,
                    duration_ms = took,
                    "backend health changed"
                );
            }
            *counts.entry(label).or_insert(0) += 1;
        }
        if passed {
            Ok(())
        } else {
            pingora::Error::e_explain(pingora::ErrorType::ConnectError, shown)
        }
    }

    fn backend_summary(&self, target: &Backend) -> String {
        format!("backend {}", target.addr)
    }

    fn health_threshold(&self, success: bool) -> usize {
        let t = self.check.thresholds;
        (if success { t.rise } else { t.fall }).max(1) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_host_is_never_localhost() {
        let text = "[[upstreams]]\nname = \"app\"\nbackends = [\"127.0.0.1:81\"]\n\
                    [upstreams.health_check]\npath = \"/h\"\n";
        let cfg = crate::config::parse("t.toml", text).unwrap_or_else(|e| panic!("{e}"));
        let u = &cfg.upstreams[0];
        let check = u.health.clone().unwrap_or_else(|| panic!("a check"));
        let addr: SocketAddr = "127.0.0.1:81".parse().unwrap();
        let written = "api.example:81".to_string();
        assert_eq!(
            default_host(&check, &u.transport, addr, Some(&written)),
            "api.example:81"
        );
        assert_eq!(
            default_host(&check, &u.transport, addr, None),
            "127.0.0.1:81"
        );
        let mut tls = u.transport.clone();
        tls.sni = "api.internal".into();
        assert_eq!(
            default_host(&check, &tls, addr, Some(&written)),
            "api.internal"
        );
        let mut named = check.clone();
        named.host = "vhost.test".into();
        assert_eq!(
            default_host(&named, &tls, addr, Some(&written)),
            "vhost.test"
        );
    }

    #[test]
    fn body_search() {
        assert!(contains(b"status: ok\n", b"ok"));
        assert!(!contains(b"status: degraded", b"ok\n"));
        assert!(contains(b"x", b""));
    }
}
