//! The tenant registry of one runtime: each tenant's key hashes, tier and live state
//! (in flight, this instance's share of the fleet's concurrency, its traffic here), kept
//! across reloads by name.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use prometheus::IntCounter;
use sha2::{Digest, Sha256};

use crate::config::tenants::{Tenant, TenantSettings, Tier, UnknownKey};
use crate::metrics::Metrics;
use portcullis_policy::tenant::{concurrency_allowance, QuotaBook};
use portcullis_policy::verdict::Outcome;

/// Keys of the map are SHA-256 outputs: their first 8 bytes are already a good hash.
#[derive(Default)]
struct FirstBytes(u64);

impl Hasher for FirstBytes {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // A `[u8; 32]` hashes as its length (8 bytes) then its bytes (32): keep the latter.
        if bytes.len() >= 8 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[..8]);
            self.0 = u64::from_le_bytes(b);
        }
    }
}

/// A tenant's state that outlives a reload (found again by name).
#[derive(Default)]
pub struct Live {
    /// Its requests in flight here.
    inflight: AtomicU64,
    /// How many may be in flight here: this instance's share of the tier's concurrency
    /// (set by [`Registry::refresh`] after each flush).
    allowance: AtomicU64,
    /// Its admissions here over the rate limit's sliding window: (window, prev, cur).
    own: Mutex<(u64, u64, u64)>,
    /// Its `portcullis_tenant_requests_total` series, by outcome (made at first use).
    counters: OnceLock<Vec<IntCounter>>,
}

impl Live {
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    pub fn allowance(&self) -> u64 {
        self.allowance.load(Ordering::Relaxed)
    }

    fn note_admitted(&self, now_ms: u64, window_ms: u64) {
        let w = now_ms / window_ms.max(1);
        let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
        roll(&mut own, w);
        own.2 += 1;
    }

    /// Its admissions here over the sliding window at `now_ms`.
    fn own_estimate(&self, now_ms: u64, window_ms: u64) -> u64 {
        let wms = window_ms.max(1);
        let w = now_ms / wms;
        let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
        roll(&mut own, w);
        let e = now_ms % wms;
        let prev = u128::from(own.1) * u128::from(wms - e) / u128::from(wms);
        u64::try_from(prev).unwrap_or(u64::MAX) + own.2
    }
}

fn roll(own: &mut (u64, u64, u64), w: u64) {
    if w == own.0 {
        return;
    }
    *own = if w == own.0 + 1 {
        (w, own.2, 0)
    } else {
        (w, 0, 0)
    };
}

/// One request's hold on its tenant's concurrency: released when dropped.
pub struct TenantSlot(Arc<Live>);

impl Drop for TenantSlot {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One tenant as the request path sees it.
pub struct TenantRt {
    pub name: Arc<str>,
    pub tier: Tier,
    /// Its key under the rate limit: apart from any API key (a NUL cannot be sent in a
    /// header or a query), shared by all its keys.
    pub ident: Box<[u8]>,
    /// The store hash of its quota spending.
    pub quota_key: u128,
    pub live: Arc<Live>,
}

impl TenantRt {
    /// Takes a concurrency slot when the tier caps concurrency: `Err(cap)` when this
    /// instance's share is in use.
    pub fn enter(&self) -> Result<Option<TenantSlot>, u64> {
        let cap = self.tier.concurrency;
        if cap == 0 {
            return Ok(None);
        }
        let allowed = self.live.allowance().min(cap);
        let live = &self.live;
        let prev = live.inflight.fetch_add(1, Ordering::Relaxed);
        if prev >= allowed {
            live.inflight.fetch_sub(1, Ordering::Relaxed);
            return Err(cap);
        }
        Ok(Some(TenantSlot(Arc::clone(live))))
    }

    /// Counts an admission here (the share of the fleet's concurrency follows it).
    pub fn note_admitted(&self, now_ms: u64, window_ms: u64) {
        if self.tier.concurrency > 0 {
            self.live.note_admitted(now_ms, window_ms);
        }
    }
}

/// An idle tenant's share is refreshed at every this many refreshes (flushes).
const IDLE_EVERY: u64 = 20;

/// The tenants of one runtime.
pub struct Registry {
    /// Refreshes so far ([`Registry::refresh`]).
    refreshes: AtomicU64,
    by_key: HashMap<[u8; 32], u32, BuildHasherDefault<FirstBytes>>,
    pub tenants: Vec<Arc<TenantRt>>,
    pub unknown_key: UnknownKey,
    /// `tenant="unknown"` series, by outcome.
    unknown: Vec<IntCounter>,
    metrics: prometheus::IntCounterVec,
}

impl Registry {
    /// The registry of `settings`; tenants that `previous` knew keep their live state.
    pub fn build(
        settings: &TenantSettings,
        previous: Option<&Registry>,
        metrics: &Metrics,
    ) -> Self {
        let old: HashMap<&str, &Arc<Live>> = previous
            .map(|p| {
                p.tenants
                    .iter()
                    .map(|t| (&*t.name, &t.live))
                    .collect::<HashMap<_, _>>()
            })
            .unwrap_or_default();
        let mut by_key = HashMap::with_capacity_and_hasher(
            settings.tenants.iter().map(|t| t.keys.len()).sum(),
            BuildHasherDefault::<FirstBytes>::default(),
        );
        let mut tenants = Vec::with_capacity(settings.tenants.len());
        for (i, t) in settings.tenants.iter().enumerate() {
            let Tenant {
                name, tier, keys, ..
            } = t;
            let Some(tier) = settings.tiers.get(*tier).cloned() else {
                continue;
            };
            for k in keys {
                by_key.insert(*k, i as u32);
            }
            let live = old
                .get(&**name)
                .map_or_else(Arc::default, |l| Arc::clone(l));
            if live.allowance() == 0 {
                live.allowance.store(tier.concurrency, Ordering::Relaxed);
            }
            tenants.push(Arc::new(TenantRt {
                ident: crate::config::tenants::ident(name)
                    .into_bytes()
                    .into_boxed_slice(),
                quota_key: QuotaBook::key(name, tier.period),
                name: Arc::clone(name),
                tier,
                live,
            }));
        }
        let vec = metrics.tenants.requests.clone();
        let unknown = Outcome::ALL
            .iter()
            .map(|o| vec.with_label_values(&["unknown", o.as_str()]))
            .collect();
        Self {
            refreshes: AtomicU64::new(0),
            by_key,
            tenants,
            unknown_key: settings.unknown_key,
            unknown,
            metrics: vec,
        }
    }

    /// The tenant holding `key`, by its SHA-256.
    #[inline]
    pub fn lookup(&self, key: &[u8]) -> Option<&Arc<TenantRt>> {
        let hash: [u8; 32] = Sha256::digest(key).into();
        let i = *self.by_key.get(&hash)?;
        self.tenants.get(i as usize)
    }

    /// Counts a request's outcome under its tenant (`None`: `tenant="unknown"`).
    pub fn count(&self, tenant: Option<&TenantRt>, outcome: Outcome) {
        let i = outcome as usize;
        let series = match tenant {
            None => &self.unknown,
            Some(t) => t.live.counters.get_or_init(|| {
                Outcome::ALL
                    .iter()
                    .map(|o| self.metrics.with_label_values(&[&t.name, o.as_str()]))
                    .collect()
            }),
        };
        if let Some(c) = series.get(i) {
            c.inc();
        }
    }

    /// After a flush: each tenant's share of its tier's concurrency, from the fleet's
    /// view of its traffic (`fleet(ident)`: the fleet's admissions over the window, as the
    /// rate limit last synced them) among `instances` instances.
    pub fn refresh(
        &self,
        now_ms: u64,
        window_ms: u64,
        instances: u64,
        fleet: impl Fn(&[u8]) -> Option<u64>,
        mut draw: impl FnMut() -> f64,
    ) {
        // A tenant with no traffic here keeps its share between refreshes but every
        // IDLE_EVERY-th (its share only matters once its requests come): 10,000 capped
        // tenants cost one lookup each per second, not per flush.
        let all = self
            .refreshes
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(IDLE_EVERY);
        for t in &self.tenants {
            let cap = t.tier.concurrency;
            if cap == 0 {
                continue;
            }
            let own = t.live.own_estimate(now_ms, window_ms);
            if own == 0 && t.live.inflight() == 0 && !all {
                continue;
            }
            let share = concurrency_allowance(cap, own, fleet(&t.ident), instances, draw());
            t.live.allowance.store(share, Ordering::Relaxed);
        }
    }

    /// Tenants by name (for `/status` and tests).
    pub fn get(&self, name: &str) -> Option<&Arc<TenantRt>> {
        self.tenants.iter().find(|t| &*t.name == name)
    }

    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}
