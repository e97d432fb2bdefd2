//! A pool's active health checks: the registry and the check kept across reloads
//! ([`PoolHealth`]), and what the pool says of its backends' probes.

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::lb::health_check::HealthCheck;
use pingora::lb::{Backend, HealthRegistry};

use super::{probe, BackendState, Pool};

/// The active health state of one upstream, kept across reloads: each
/// rebuilt pool registers its backend view with the same registry, so a
/// backend that stays keeps its health (as it keeps its cull state) instead of
/// starting "up" again until its next check.
#[derive(Clone)]
pub struct PoolHealth {
    pub(super) registry: Arc<HealthRegistry>,
    pub(super) check: SwappableCheck,
    /// What each backend's probes found (kept with the registry).
    pub tracks: Arc<probe::Tracks>,
}

impl PoolHealth {
    pub(super) fn new(check: probe::Probe, tracks: Arc<probe::Tracks>) -> Self {
        let check = SwappableCheck(Arc::new(ArcSwap::from_pointee(check)));
        let registry = Arc::new(HealthRegistry::new());
        // A fresh registry has no check yet, so this cannot panic.
        registry.set_health_check(Box::new(check.clone()));
        Self {
            registry,
            check,
            tracks,
        }
    }
}

/// The registry takes its check once; a reload that changes the check swaps what this
/// wrapper delegates to.
#[derive(Clone)]
pub(super) struct SwappableCheck(pub(super) Arc<ArcSwap<probe::Probe>>);

#[async_trait]
impl HealthCheck for SwappableCheck {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let current = self.0.load_full();
        current.check(target).await
    }

    fn backend_summary(&self, target: &Backend) -> String {
        format!("backend {}", target.addr)
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.0.load().health_threshold(success)
    }
}

impl Pool {
    /// What `s`'s probes found (`None`: no active check, or not probed yet).
    pub fn health_track(&self, s: &BackendState) -> Option<portcullis_policy::health::Track> {
        self.health.as_ref()?.tracks.get(&s.addr)
    }

    /// Shared probing of this pool: its tracks, `probers` and thresholds (`None` without
    /// a check with `shared = true`).
    pub fn shared_probing(
        &self,
    ) -> Option<(
        Arc<probe::Tracks>,
        u32,
        portcullis_policy::health::Thresholds,
    )> {
        let h = self.health.as_ref()?;
        let check = h.check.0.load();
        let probers = check.shared_probers()?;
        Some((Arc::clone(&h.tracks), probers, check.thresholds()))
    }

    /// Where `s`'s state came from at its last check (shared probing).
    pub fn health_source(&self, s: &BackendState) -> Option<probe::Source> {
        self.health.as_ref()?.tracks.source(&s.addr)
    }

    /// Each backend's probe counts by result (empty without an active check).
    pub fn health_counts(&self) -> Vec<(SocketAddr, probe::Counts)> {
        self.health
            .as_ref()
            .map(|h| h.tracks.counts())
            .unwrap_or_default()
    }

    /// `rise`, `fall` and the intervals of the active check.
    pub fn health_thresholds(&self) -> Option<portcullis_policy::health::Thresholds> {
        self.health.as_ref().map(|h| h.check.0.load().thresholds())
    }

    /// The `Host` the active check sends to `s` (its address without a check).
    pub fn probe_host(&self, s: &BackendState) -> String {
        match &self.health {
            Some(h) => h.check.0.load().host_of(s.addr),
            None => s.addr_str.clone(),
        }
    }

    /// Whether `status` passes the active check (2xx without one).
    pub fn probe_passes(&self, status: u16) -> bool {
        match &self.health {
            Some(h) => h.check.0.load().passes(status),
            None => (200..300).contains(&status),
        }
    }
}
