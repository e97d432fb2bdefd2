//! Shared state: the swappable runtime config (routes, pools, gate settings)
//! and the long-lived parts (shedder, limiter, metrics, lifecycle) that a
//! reload keeps.

use crate::config::{Config, Route};
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::ratelimit::Limiter;
use crate::shed::Shedder;
use crate::upstream::{BackendState, Pool};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use crate::store::clock::{unix_ms, unix_secs};

/// Everything a reload replaces, swapped atomically as one value.
pub struct Runtime {
    pub config: Config,
    pub pools: Vec<Arc<Pool>>,
}

impl Runtime {
    /// Build from a validated config. Backends that stay keep their state
    /// (culling window, cull mark) and their active health-check state.
    pub fn build(config: Config, previous: Option<&Runtime>) -> Self {
        let mut known: HashMap<(String, SocketAddr), Arc<BackendState>> = HashMap::new();
        if let Some(prev) = previous {
            for pool in &prev.pools {
                for b in &pool.backends {
                    known.insert((pool.name.clone(), b.addr), Arc::clone(b));
                }
            }
        }
        let window = config.culling.params.window_secs;
        let pools = config
            .upstreams
            .iter()
            .map(|u| {
                let same = previous.and_then(|p| p.pools.iter().find(|p| p.name == u.name));
                Arc::new(Pool::build(u, window, &known, same.map(|p| &**p)))
            })
            .collect();
        Self { pools, config }
    }

    /// First matching route (routes are pre-sorted: longest prefix, host-specific first).
    #[inline]
    pub fn route(&self, host: &str, path: &str) -> &Route {
        self.route_at(self.route_index(host, path))
    }

    /// Index in `config.routes` of the first matching route; `None`: the default
    /// route (everything to the first upstream).
    #[inline]
    pub fn route_index(&self, host: &str, path: &str) -> Option<usize> {
        self.config.routes.iter().position(|r| {
            path.starts_with(r.path_prefix.as_str())
                && r.host
                    .as_deref()
                    .is_none_or(|h| h.eq_ignore_ascii_case(host))
        })
    }

    /// The route at `index` (as [`Runtime::route_index`] gave it).
    #[inline]
    pub fn route_at(&self, index: Option<usize>) -> &Route {
        index
            .and_then(|i| self.config.routes.get(i))
            .unwrap_or(&DEFAULT_ROUTE)
    }
}

static DEFAULT_ROUTE: Route = Route {
    host: None,
    path_prefix: String::new(),
    upstream: 0,
    priority: crate::shed::Priority::Normal,
    headers: crate::edge::HeaderRules::new(),
};

pub struct Shared {
    pub runtime: ArcSwap<Runtime>,
    pub shedder: Arc<Shedder>,
    pub limiter: Arc<Limiter>,
    pub metrics: Arc<Metrics>,
    /// Access log and the cull journal of the status page.
    pub observe: crate::observe::Observe,
    pub lifecycle: Arc<Lifecycle>,
    /// "redis" or "local".
    pub store_kind: &'static str,
    pub config_path: std::path::PathBuf,
    id_prefix: u64,
    id_counter: AtomicU64,
    /// The runtime serving proxy traffic, seen by the first request (the
    /// watchdog measures event-loop stalls there).
    proxy_runtime: std::sync::OnceLock<tokio::runtime::Handle>,
}

impl Shared {
    pub fn new(config: Config, config_path: std::path::PathBuf) -> Arc<Self> {
        let shedder = Shedder::new(config.shedding.max_concurrency);
        let sh = &config.shedding;
        shedder.configure(sh.max_concurrency, sh.adaptive, sh.min_concurrency);
        let limiter = Arc::new(Limiter::new(config.rate_limit.params.clone()));
        let store_kind = if config.store.is_some() {
            "redis"
        } else {
            "local"
        };
        let observe = crate::observe::Observe::new(&config.access_log);
        let runtime = Runtime::build(config, None);
        Arc::new(Self {
            runtime: ArcSwap::from_pointee(runtime),
            shedder,
            limiter,
            metrics: Arc::new(Metrics::new()),
            observe,
            lifecycle: Arc::new(Lifecycle::default()),
            store_kind,
            config_path,
            id_prefix: (unix_ms() ^ (u64::from(std::process::id()) << 40)) & 0xffff_ffff_ffff,
            id_counter: AtomicU64::new(0),
            proxy_runtime: std::sync::OnceLock::new(),
        })
    }

    /// A unique request id: per-process prefix plus a counter, 28 hex digits.
    pub fn next_request_id(&self) -> String {
        let n = self.id_counter.fetch_add(1, Ordering::Relaxed);
        format!("{:012x}{:016x}", self.id_prefix, n)
    }

    /// Remember the runtime the calling request runs on (once; then one atomic load).
    #[inline]
    pub fn note_proxy_runtime(&self) {
        if self.proxy_runtime.get().is_none() {
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                let _ = self.proxy_runtime.set(h);
            }
        }
    }

    /// The runtime serving proxy traffic, once a request has been seen.
    pub fn proxy_runtime(&self) -> Option<&tokio::runtime::Handle> {
        self.proxy_runtime.get()
    }

    /// Swap in a new config: routes, pools, caps and limits. Backends that stay
    /// keep their state; removed backends finish what they have in flight.
    pub fn apply(&self, config: Config) {
        let sh = &config.shedding;
        self.shedder
            .configure(sh.max_concurrency, sh.adaptive, sh.min_concurrency);
        self.limiter.set_params(config.rate_limit.params.clone());
        let prev = self.runtime.load();
        let next = Runtime::build(config, Some(&prev));
        self.runtime.store(Arc::new(next));
    }
}
