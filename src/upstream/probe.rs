//! The active health check's probe (`[upstreams.health_check]`): one request per due
//! backend over a fresh connection, with the configured method, path, `Host` and headers,
//! judged by `expect_status` and `expect_body` within `timeout_ms`. Pingora's health
//! registry calls it at the upstream's fast interval and counts `rise`/`fall` with the
//! thresholds it is given; a settled healthy backend is probed only every `interval_ms`
//! (between, its last pass stands). Each backend's [`Track`] (last result, its duration,
//! progress toward a flip, time in state) is what `/backends` and `/status` show.
//!
//! Shared probing (`shared = true` with a store): the health-check loop exchanges with the
//! store once per round (`crate::server::shared_probing`) and hands each backend's
//! [`Role`] to its upstream's [`Tracks`]: whether this instance is one of its probers,
//! who they are, and the verdicts they published. A prober probes as above and publishes
//! its verdict; every instance, probers included, returns the probers' majority verdict
//! to Pingora's registry. A backend with no fresh verdict (no prober published for three
//! intervals: probers gone, store down), and every backend while the roles are that old,
//! is probed here again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::lb::health_check::HealthCheck as PingoraCheck;
use pingora::lb::Backend;
use portcullis_policy::health::shared::{decide, Fleet, Verdict};
use portcullis_policy::health::{LastCheck, Outcome, Track};

use crate::config::{HealthCheck, UpstreamTransport};

/// The most of a body read for `expect_body`.
const BODY_WINDOW: usize = 64 * 1024;

/// Every backend's track, and its probe counts by result; kept across reloads with the
/// pool's health registry.
#[derive(Default)]
pub struct Tracks {
    inner: Mutex<HashMap<SocketAddr, (Track, Counts)>>,
    fleet: Mutex<FleetRoles>,
}

/// Shared probing's part of an upstream's tracks.
#[derive(Default)]
struct FleetRoles {
    /// This instance's id in the store.
    me: String,
    /// Each backend's role, as the last exchange with the store found it.
    roles: HashMap<SocketAddr, Role>,
    /// When that exchange ran (this clock), and the store's clock then.
    read_at: Option<(Instant, u64)>,
    /// This instance's verdicts not yet published, the latest per backend.
    outbox: HashMap<SocketAddr, String>,
    /// Where each backend's state came from at its last check.
    sources: HashMap<SocketAddr, Source>,
}

/// A backend's probers and what they published.
#[derive(Debug, Clone, Default)]
pub struct Role {
    /// Its probers, highest rendezvous score first.
    pub probers: Vec<String>,
    /// Whether this instance is one of them.
    pub me: bool,
    /// The latest verdicts the other probers published.
    pub verdicts: Vec<Verdict>,
}

/// Where a backend's state came from at its last check (`/backends`: `check.source`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// The probers' majority verdict (else this instance's own probes).
    pub fleet: bool,
    /// Whether this instance probed it.
    pub probing: bool,
    /// Its probers (empty without shared probing).
    pub probers: Vec<String>,
    /// The probers whose fresh verdicts made the majority.
    pub from: Vec<String>,
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

    fn fleet(&self) -> MutexGuard<'_, FleetRoles> {
        self.fleet.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The roles the exchange with the store at `store_now_ms` found for `me`.
    pub fn set_roles(&self, me: &str, roles: HashMap<SocketAddr, Role>, store_now_ms: u64) {
        let mut f = self.fleet();
        me.clone_into(&mut f.me);
        f.roles = roles;
        f.read_at = Some((Instant::now(), store_now_ms));
    }

    /// The verdicts to publish (taken: published once).
    pub fn take_outbox(&self) -> Vec<(SocketAddr, String)> {
        self.fleet().outbox.drain().collect()
    }

    /// Where `addr`'s state came from at its last check (`None`: not checked yet).
    pub fn source(&self, addr: &SocketAddr) -> Option<Source> {
        self.fleet().sources.get(addr).cloned()
    }

    /// `addr`'s role, this instance's id and the store's clock now, unless the roles
    /// were read more than `max_age` ago (or never).
    fn role(&self, addr: &SocketAddr, max_age: Duration) -> Option<(Role, String, u64)> {
        let f = self.fleet();
        let (at, store_ms) = f.read_at?;
        let age = at.elapsed();
        if age > max_age {
            return None;
        }
        let now = store_ms + u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        Some((f.roles.get(addr)?.clone(), f.me.clone(), now))
    }

    fn set_source(&self, addr: SocketAddr, source: Source) {
        self.fleet().sources.insert(addr, source);
    }

    fn publish(&self, addr: SocketAddr, payload: String) {
        self.fleet().outbox.insert(addr, payload);
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

    /// `probers` when the check is shared.
    pub fn shared_probers(&self) -> Option<u32> {
        self.check.shared.then_some(self.check.probers)
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

impl Probe {
    /// This instance's own view of `addr`: its last pass while settled healthy and not
    /// due, else a probe (counted toward `rise`/`fall`). The state after `rise`/`fall`,
    /// and the check that led to it.
    async fn local(&self, addr: SocketAddr) -> (bool, Option<LastCheck>) {
        let t = self.check.thresholds;
        // A settled healthy backend between its probes: its last pass stands.
        let cached = self.tracks.lock().get(&addr).and_then(|(track, _)| {
            (!track.due(now_ms(), &t) && track.healthy && !track.unsettled())
                .then(|| track.last.clone())
        });
        if let Some(last) = cached {
            return (true, last);
        }
        let started = Instant::now();
        let started_ms = now_ms();
        let outcome = self.probe(addr).await;
        let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let label = outcome.label();
        let shown = outcome.to_string();
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
        (track.healthy, track.last.clone())
    }

    /// Takes the fleet's verdict on `addr` into its track (for `/backends`).
    fn follow(&self, addr: SocketAddr, healthy: bool, newest: Option<LastCheck>) {
        let now = now_ms();
        let mut all = self.tracks.lock();
        let (track, _) = all
            .entry(addr)
            .or_insert_with(|| (Track::new(now), Counts::new()));
        if track.follow(healthy, now, newest) {
            tracing::warn!(
                event = "health",
                backend = %addr,
                healthy,
                source = "fleet",
                "backend health changed"
            );
        }
    }
}

/// A role's probers as the policy takes them.
fn names(role: &Role) -> Vec<&str> {
    role.probers.iter().map(String::as_str).collect()
}

/// The answer Pingora's registry gets: the backend's state.
fn answer(healthy: bool, why: impl FnOnce() -> String) -> pingora::Result<()> {
    if healthy {
        Ok(())
    } else {
        pingora::Error::e_explain(pingora::ErrorType::ConnectError, why())
    }
}

/// `check` returns a backend's *state*, already past `rise`/`fall` (this instance's
/// [`Track`] counts them for its own probes, each prober counted them before publishing
/// its verdict), and [`PingoraCheck::health_threshold`] is 1: the registry takes the state
/// as it is. A followed verdict therefore applies at the next round (within one interval),
/// not `rise`/`fall` rounds later, and the registry never disagrees with the track
/// `/backends` shows. (For this instance's own probes it is the same as before: the track
/// and the registry counted the same results with the same thresholds.)
#[async_trait]
impl PingoraCheck for Probe {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let Some(addr) = target.addr.as_inet().copied() else {
            return Ok(());
        };
        let t = self.check.thresholds;
        // no prober published for three intervals: probe here again
        let stale_ms = t.interval_ms.max(t.fast_interval_ms).saturating_mul(3);
        let role = if self.check.shared {
            self.tracks.role(&addr, Duration::from_millis(stale_ms))
        } else {
            None
        };
        // A backend this instance does not probe: the probers' verdict, when fresh.
        if let Some((role, _, now)) = role.as_ref().filter(|(r, _, _)| !r.me) {
            if let Fleet::Follow {
                healthy,
                from,
                newest,
            } = decide(&names(role), &role.verdicts, *now, stale_ms)
            {
                self.follow(addr, healthy, newest);
                let source = Source {
                    fleet: true,
                    probing: false,
                    probers: role.probers.clone(),
                    from,
                };
                let n = source.from.len();
                self.tracks.set_source(addr, source);
                return answer(healthy, || format!("down by the fleet's probers ({n})"));
            }
        }
        let (healthy, last) = self.local(addr).await;
        let (role, me, now) = match role {
            Some((r, me, now)) if r.me => (r, me, now),
            other => {
                let probers = other.map(|(r, _, _)| r.probers).unwrap_or_default();
                self.tracks.set_source(
                    addr,
                    Source {
                        probing: true,
                        probers,
                        ..Source::default()
                    },
                );
                let shown = last.map(|l| l.outcome.to_string()).unwrap_or_default();
                return answer(healthy, || shown);
            }
        };
        // A prober: publish, then follow the majority with its own verdict among them.
        self.tracks
            .publish(addr, Verdict::payload(healthy, last.as_ref()));
        let mut verdicts = role.verdicts.clone();
        verdicts.push(Verdict {
            instance: me,
            healthy,
            last,
            stamp_ms: now,
        });
        let (healthy, from) = match decide(&names(&role), &verdicts, now, stale_ms) {
            Fleet::Follow { healthy, from, .. } => (healthy, from),
            Fleet::Local => (healthy, Vec::new()),
        };
        let n = from.len();
        self.tracks.set_source(
            addr,
            Source {
                fleet: true,
                probing: true,
                probers: role.probers,
                from,
            },
        );
        answer(healthy, || format!("down by the fleet's probers ({n})"))
    }

    fn backend_summary(&self, target: &Backend) -> String {
        format!("backend {}", target.addr)
    }

    /// 1: `check` returns the state after `rise`/`fall` (see the impl's comment).
    fn health_threshold(&self, _success: bool) -> usize {
        1
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
