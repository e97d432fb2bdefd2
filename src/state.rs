//! Shared state: the swappable runtime config (routes, pools, gate settings)
//! and the long-lived parts (shedder, limiter, metrics, lifecycle) that a
//! reload keeps.

use crate::config::{Config, Route};
use crate::lifecycle::Lifecycle;
use crate::metrics::{Metrics, RouteSeries, RouteSeriesBudget};
use crate::ratelimit::{DecisionCounters, FieldParts, Policies, Policy, PolicyKey};
use crate::upstream::{BackendState, Pool};
use arc_swap::ArcSwap;
use portcullis_policy::ratelimit::Limiter;
use portcullis_policy::shed::Shedder;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

pub use portcullis_store::clock::{unix_ms, unix_secs};

pub mod resolve;
mod route_table;
pub use route_table::RouteTable;

/// Everything a reload replaces, swapped atomically as one value.
pub struct Runtime {
    pub config: Config,
    pub pools: Vec<Arc<Pool>>,
    /// Every rate-limit policy (`[rate_limit]` first, on the process's one limiter for it).
    pub rate: Policies,
    /// The metric series and traffic window of each route (same order as
    /// `config.routes`), then of the default route, then of requests refused before
    /// routing: each made by the first request that needs it ([`Runtime::route_series`]),
    /// so a route that sees no traffic costs one empty slot.
    route_series: Box<[OnceLock<Arc<RouteSeries>>]>,
    /// The bound on routes with series of their own (the metrics', shared by every
    /// runtime): past it, routes share the series "other".
    route_budget: Arc<RouteSeriesBudget>,
    /// `config.routes` indexed for lookup ([`Runtime::route_index`]).
    routes: RouteTable,
    /// `shedding.shadow`: the shed gate's shadow-refusal counters by priority class.
    pub shed_shadow: Option<[prometheus::IntCounter; 3]>,
    /// `[tenants]`: the registry of tenants; `None` when keys are not identities.
    pub tenants: Option<Arc<crate::tenants::Registry>>,
}

/// The rate-limit policies of `config`: `[rate_limit]` on `default`, each named policy on
/// the limiter it had in `previous` (same name: counts kept, new parameters) or a new one.
fn build_policies(
    config: &Config,
    previous: Option<&Runtime>,
    default: &Arc<Limiter>,
    metrics: &Metrics,
) -> Policies {
    let rl = &config.rate_limit;
    let vec = &metrics.ratelimit.policy_decisions;
    let mut list = vec![Policy {
        name: Arc::clone(&rl.policy_name),
        key: PolicyKey::Source(rl.source.clone()),
        path_prefix: String::new(),
        window_secs: rl.params.window_secs,
        limiter: Arc::clone(default),
        counters: DecisionCounters::of(vec, &rl.policy_name),
        fields: Arc::new(FieldParts::new(
            &rl.policy_name,
            rl.params.limit,
            rl.params.window_secs,
        )),
        shadow: rl
            .shadow
            .then(|| metrics.shadow.rate_limit(&rl.policy_name)),
    }];
    for p in &rl.policies {
        let kept = previous
            .and_then(|r| r.rate.list.iter().skip(1).find(|o| o.name == p.name))
            .map(|o| Arc::clone(&o.limiter));
        let limiter = match kept {
            Some(l) => {
                l.set_params(p.params.clone());
                l
            }
            None => Arc::new(Limiter::for_policy(p.params.clone(), &p.name)),
        };
        list.push(Policy {
            name: Arc::clone(&p.name),
            key: p.key.clone(),
            path_prefix: p.path_prefix.clone(),
            window_secs: p.params.window_secs,
            limiter,
            counters: DecisionCounters::of(vec, &p.name),
            fields: Arc::new(FieldParts::new(
                &p.name,
                p.params.limit,
                p.params.window_secs,
            )),
            shadow: p.shadow.then(|| metrics.shadow.rate_limit(&p.name)),
        });
    }
    Policies {
        list,
        default_enabled: rl.enabled,
    }
}

impl Runtime {
    /// Build from a validated config. Backends that stay keep their state
    /// (culling window, cull mark) and their active health-check state; rate-limit
    /// policies that stay keep their counts.
    pub fn build(
        config: Config,
        previous: Option<&Runtime>,
        limiter: &Arc<Limiter>,
        metrics: &Metrics,
    ) -> Self {
        if let Some(jwt) = &config.rate_limit.jwt {
            jwt.count_refusals(&metrics.ratelimit.jwt_refusals);
        }
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
        let routes = RouteTable::build(&config.routes);
        let route_series: Box<[OnceLock<Arc<RouteSeries>>]> = (0..config.routes.len() + 2)
            .map(|_| OnceLock::new())
            .collect();
        // A route that stays (same host and prefix, so the same label) keeps its series:
        // its counters, traffic figures and in-flight count. Only routes that saw traffic
        // have one to keep.
        if let Some(prev) = previous {
            for (i, series) in prev.live_series() {
                if let Some(j) = carried(prev, i, &config.routes, &routes) {
                    let _ = route_series[j].set(Arc::clone(series));
                }
            }
        }
        let rate = build_policies(&config, previous, limiter, metrics);
        let shed_shadow = config.shedding.shadow.then(|| metrics.shadow.shed());
        let tenants = config.tenants.enabled().then(|| {
            Arc::new(crate::tenants::Registry::build(
                &config.tenants,
                previous.and_then(|p| p.tenants.as_deref()),
                metrics,
            ))
        });
        Self {
            tenants,
            shed_shadow,
            routes,
            pools,
            config,
            rate,
            route_series,
            route_budget: Arc::clone(&metrics.proxy.route_budget),
        }
    }

    /// The metric series of a request's route: `routed` is false for a
    /// request refused before routing ("none"); `index` as [`Runtime::route_at`].
    /// Made by the first request that needs it; after that, one atomic load.
    #[inline]
    pub fn route_series(&self, routed: bool, index: Option<usize>) -> &RouteSeries {
        let n = self.config.routes.len();
        let i = match (routed, index) {
            (false, _) => n + 1,
            (true, Some(i)) if i < n => i,
            (true, _) => n,
        };
        self.route_series[i].get_or_init(|| self.new_series(i))
    }

    /// The `i`th series, at its first request: a configured route's takes a place in the
    /// budget (or shares "other"); the default route's and "none" always have theirs.
    #[cold]
    fn new_series(&self, i: usize) -> Arc<RouteSeries> {
        if i < self.config.routes.len() {
            self.route_budget.series(self.label_at(i))
        } else {
            Arc::new(RouteSeries::new(self.label_at(i)))
        }
    }

    /// The label of the `i`th series: its route's, "default", then "none".
    #[cold]
    fn label_at(&self, i: usize) -> String {
        match self.config.routes.get(i) {
            Some(r) => crate::observe::route_label(r).into_owned(),
            None if i == self.config.routes.len() => {
                crate::observe::route_label(&DEFAULT_ROUTE).into_owned()
            }
            None => "none".to_string(),
        }
    }

    /// Every route of the config, then the default route, each with its series when a
    /// request has been routed to it and it has one of its own (not the series of
    /// requests refused before routing; routes past the bound count in
    /// [`Runtime::other_series`]).
    pub fn routes_with_series(&self) -> impl Iterator<Item = (&Route, Option<&RouteSeries>)> {
        self.config
            .routes
            .iter()
            .chain(std::iter::once(&DEFAULT_ROUTE))
            .zip(self.route_series.iter().map(|s| {
                s.get()
                    .map(|s| &**s)
                    .filter(|s| !self.route_budget.is_other(s))
            }))
    }

    /// The figures the routes past [`crate::metrics::ROUTE_SERIES_MAX`] share, and the
    /// bound.
    pub fn other_series(&self) -> (&crate::metrics::RouteStats, usize) {
        (self.route_budget.other(), self.route_budget.max())
    }

    /// The series of their own made so far, by index (`config.routes`, then default,
    /// then "none").
    fn live_series(&self) -> impl Iterator<Item = (usize, &Arc<RouteSeries>)> {
        self.route_series
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.get().map(|s| (i, s)))
            .filter(|(_, s)| !self.route_budget.is_other(s))
    }

    /// After `self` replaced `prev`: drop from the registry the series of `prev`'s routes
    /// that are gone, so that no label set of a removed route outlives its table.
    pub fn forget_removed(&self, prev: &Runtime, metrics: &Metrics) {
        for (i, series) in prev.live_series() {
            if carried(prev, i, &self.config.routes, &self.routes).is_none() {
                metrics.proxy.forget_route(series);
            }
        }
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
        self.routes.lookup(host, path)
    }

    /// Index in `config.routes` of the first route matching the request (host, path,
    /// method and client address); `None`: unmatched (`server.unmatched` says what then).
    #[inline]
    pub fn route_index_for(
        &self,
        host: &str,
        path: &str,
        method: &http::Method,
        client: Option<std::net::IpAddr>,
    ) -> Option<usize> {
        self.routes
            .lookup_request(&self.config.routes, host, path, method, client)
    }

    /// The route at `index` (as [`Runtime::route_index`] gave it).
    #[inline]
    pub fn route_at(&self, index: Option<usize>) -> &Route {
        index
            .and_then(|i| self.config.routes.get(i))
            .unwrap_or(&DEFAULT_ROUTE)
    }
}

/// Where the `i`th series of `prev` goes in a runtime of `routes` (indexed by `table`): the
/// route with the same host and prefix, or the default and "none" series to theirs;
/// `None` when its route is gone.
fn carried(prev: &Runtime, i: usize, routes: &[Route], table: &RouteTable) -> Option<usize> {
    let Some(old) = prev.config.routes.get(i) else {
        // The default route's series, then that of requests refused before routing.
        return Some(routes.len() + (i - prev.config.routes.len()));
    };
    let host = old.host.as_deref().unwrap_or("");
    table
        .lookup(host, &old.path_prefix)
        .filter(|&j| routes[j].host == old.host && routes[j].path_prefix == old.path_prefix)
}

static DEFAULT_ROUTE: Route = Route {
    host: None,
    path_prefix: String::new(),
    upstream: 0,
    priority: portcullis_policy::shed::Priority::Normal,
    headers: crate::edge::HeaderRules::new(),
    methods: Vec::new(),
    client_cidrs: None,
    action: crate::config::RouteAction::Proxy,
    policy_mask: u64::MAX,
};

pub struct Shared {
    pub runtime: ArcSwap<Runtime>,
    pub shedder: Arc<Shedder>,
    pub limiter: Arc<Limiter>,
    /// The tenants' cost quotas (CONTRACT §14): flushed with the rate limit's counts.
    pub tenant_quota: Arc<portcullis_policy::tenant::QuotaBook>,
    pub metrics: Arc<Metrics>,
    /// The tunnel cap's slots (`shedding.max_tunnels`) and open-tunnel gauge.
    pub tunnels: Arc<crate::edge::tunnel::Tunnels>,
    /// PROXY header sources of open connections, for their HTTP/2 streams.
    pub proxied: Arc<crate::edge::proxied::ProxiedSources>,
    /// Access log and the cull journal of the status page.
    pub observe: crate::observe::Observe,
    pub lifecycle: Arc<Lifecycle>,
    /// "redis" or "local".
    pub store_kind: &'static str,
    pub config_path: std::path::PathBuf,
    /// `server.preserve_header_case` as started (both directions; restart to change).
    pub keep_header_case: bool,
    /// The runtime serving proxy traffic, seen by the first request (the
    /// watchdog measures event-loop stalls there).
    proxy_runtime: std::sync::OnceLock<tokio::runtime::Handle>,
    /// Held by the reload under way (`reload::reload_off_thread`): one at a time.
    pub reloading: std::sync::Mutex<()>,
    /// `[tenants] redis_sync`: the store's tenant entries as last read (sorted).
    store_tenants: std::sync::Mutex<Vec<(String, String)>>,
    /// `[shedding] fleet_max_concurrency`: this instance's share of the fleet's cap.
    pub fleet_cap: crate::fleet_caps::FleetSlot,
    /// The fleet's budget as the fleet sync last read it, and the pause detector the
    /// request path asks before it picks a backend.
    pub fleet_view: Arc<crate::fleet::sync::FleetView>,
}

impl Shared {
    pub fn new(config: Config, config_path: std::path::PathBuf) -> Arc<Self> {
        let shedder = Shedder::new(config.shedding.max_concurrency);
        let sh = &config.shedding;
        shedder.configure(sh.max_concurrency, sh.adaptive, sh.min_concurrency);
        shedder.set_queue_target(sh.queue_target);
        let limiter = Arc::new(Limiter::new(config.rate_limit.params.clone()));
        let store_kind = if config.store.is_some() {
            "redis"
        } else {
            "local"
        };
        let observe = crate::observe::Observe::new(&config.access_log, &config.tracing);
        let metrics = Arc::new(Metrics::new());
        observe.register(&metrics.registry);
        let keep_header_case = config.server.preserve_header_case;
        let runtime = Runtime::build(config, None, &limiter, &metrics);
        Arc::new(Self {
            runtime: ArcSwap::from_pointee(runtime),
            shedder,
            limiter,
            tenant_quota: Arc::default(),
            tunnels: crate::edge::tunnel::Tunnels::new(metrics.edge.tunnels_open.clone()),
            proxied: Arc::default(),
            metrics,
            observe,
            lifecycle: Arc::new(Lifecycle::default()),
            store_kind,
            config_path,
            keep_header_case,
            proxy_runtime: std::sync::OnceLock::new(),
            reloading: std::sync::Mutex::new(()),
            store_tenants: std::sync::Mutex::default(),
            fleet_cap: Default::default(),
            fleet_view: Arc::default(),
        })
    }

    /// A new request id: 128 random bits as 32 lowercase hex digits. Random rather than a
    /// counter, so that ids do not tell anyone the request rate
    /// ([`crate::observe::trace::random_u128`], the generator of trace ids too).
    pub fn next_request_id(&self) -> String {
        String::from_utf8_lossy(&next_request_id_bytes()).into_owned()
    }

    /// [`Shared::next_request_id`] as a header value (hex: always valid), marked unique
    /// (`edge::headers::unique`: HTTP/2 sends it unindexed). Its bytes are owned by one
    /// shared allocation: the request and the response each hold the value, and a clone
    /// counts a reference (a value copied from a slice allocated again on its first clone).
    pub fn next_request_id_value(&self) -> http::HeaderValue {
        crate::edge::headers::unique(
            http::HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(next_request_id_bytes()))
                .unwrap_or_else(|_| http::HeaderValue::from_static("")),
        )
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

    /// The limiters of every rate-limit policy: `[rate_limit]`'s first, then those of the
    /// current `[[rate_limit.policies]]` (flushed together, in one batch).
    pub fn rate_limiters(&self) -> Vec<Arc<Limiter>> {
        self.runtime.load().rate.limiters()
    }

    /// After each rate-limit flush: each tenant's share of its tier's concurrency, from
    /// the fleet's counts just synced. While the store is unreachable the last shares stay
    /// (the last known state).
    pub fn refresh_tenants(&self) {
        let rt = self.runtime.load();
        let Some(registry) = rt.tenants.as_deref() else {
            return;
        };
        if !self.limiter.store_healthy() {
            return;
        }
        let now = unix_ms();
        let window_ms = rt.config.rate_limit.params.window_secs.saturating_mul(1000);
        let mut seed = now ^ 0x9e37_79b9_7f4a_7c15;
        // splitmix64: the shares' remainders are drawn independently on each instance.
        let draw = move || {
            seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 53) as f64
        };
        registry.refresh(
            now,
            window_ms,
            self.limiter.instances(),
            |ident| self.limiter.fleet_estimate(ident, now),
            draw,
        );
    }

    /// Records the store's tenant entries (sorted); whether they changed.
    pub fn set_store_tenants(&self, entries: Vec<(String, String)>) -> bool {
        let mut cur = self.store_tenants.lock().unwrap_or_else(|e| e.into_inner());
        if *cur == entries {
            return false;
        }
        *cur = entries;
        true
    }

    /// Rebuilds the runtime from its own config (the store's tenants changed).
    pub fn reapply(&self) {
        let _one = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let config = self.runtime.load().config.clone();
        self.apply(config);
    }

    /// `config`'s tenants: the file's, then the store's that can join them (each one's
    /// tier limit on its key); the entries left out are logged with the reason.
    fn merge_store_tenants(&self, config: &mut Config) {
        let t = &mut config.tenants;
        t.tenants.retain(|t| !t.from_store);
        if !t.redis_sync {
            return;
        }
        let entries = self
            .store_tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (joined, skipped) = crate::config::tenants::store_tenants(t, &entries);
        for why in skipped {
            tracing::warn!(event = "tenants_sync", "{why}; left out");
        }
        t.tenants.extend(joined);
        crate::config::tenants::tier_limits(t, &mut config.rate_limit.params.overrides);
    }

    /// Swap in a new config: routes, pools, caps and limits. Backends that stay
    /// keep their state; removed backends finish what they have in flight.
    pub fn apply(&self, mut config: Config) {
        self.merge_store_tenants(&mut config);
        let sh = &config.shedding;
        // A fleet share (kept until the next exchange recomputes it) replaces
        // max_concurrency as the cap, or the learned cap's ceiling.
        let ceiling = match sh.fleet_max_concurrency {
            0 => sh.max_concurrency,
            _ => self.fleet_cap.cap_or(sh.max_concurrency),
        };
        self.shedder
            .configure(ceiling, sh.adaptive, sh.min_concurrency.min(ceiling));
        self.shedder.set_queue_target(sh.queue_target);
        self.limiter.set_params(config.rate_limit.params.clone());
        let prev = self.runtime.load();
        let next = Arc::new(Runtime::build(
            config,
            Some(&prev),
            &self.limiter,
            &self.metrics,
        ));
        self.runtime.store(Arc::clone(&next));
        next.forget_removed(&prev, &self.metrics);
    }
}

/// Length of a generated request id: 128 bits in hex.
pub const REQUEST_ID_LEN: usize = 32;

fn next_request_id_bytes() -> [u8; REQUEST_ID_LEN] {
    let mut b = [0u8; REQUEST_ID_LEN];
    crate::observe::trace::hex_lower(crate::observe::trace::random_u128(), &mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Arc<Shared> {
        let cfg = crate::config::parse(
            "t.toml",
            "[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:1\"]\n",
        )
        .expect("valid config");
        Shared::new(cfg, "t.toml".into())
    }

    fn is_id(id: &str) -> bool {
        id.len() == REQUEST_ID_LEN && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    fn with_routes(prefixes: &[&str]) -> Config {
        let mut text = "[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:1\"]\n".to_string();
        for p in prefixes {
            text.push_str(&format!(
                "[[routes]]\npath_prefix = \"{p}\"\nupstream = \"a\"\n"
            ));
        }
        crate::config::parse("t.toml", &text).expect("valid config")
    }

    fn index_of(rt: &Runtime, prefix: &str) -> Option<usize> {
        rt.config
            .routes
            .iter()
            .position(|r| r.path_prefix == prefix)
    }

    /// A route's series is made by its first request, kept by a reload that keeps the
    /// route (the same one: counters, window, in-flight), and its label set leaves the
    /// registry with a reload that removes the route.
    #[test]
    fn route_series_are_made_on_first_use_kept_while_the_route_stays_and_forgotten_after() {
        let s = Shared::new(with_routes(&["/a", "/b", "/c"]), "t.toml".into());
        let rt = s.runtime.load_full();
        assert_eq!(
            rt.routes_with_series().filter(|(_, s)| s.is_some()).count(),
            0
        );
        let (a, b) = (index_of(&rt, "/a"), index_of(&rt, "/b"));
        let sa = rt.route_series(true, a);
        s.metrics
            .proxy
            .record_route(sa, portcullis_policy::verdict::Outcome::Proxied, 200, 0.01);
        let sb = rt.route_series(true, b);
        s.metrics
            .proxy
            .record_route(sb, portcullis_policy::verdict::Outcome::Proxied, 503, 0.01);
        sa.traffic.enter();
        let live: Vec<&str> = rt
            .routes_with_series()
            .filter_map(|(r, s)| s.map(|_| r.path_prefix.as_str()))
            .collect();
        assert_eq!(live, ["/a", "/b"]);
        let text = || String::from_utf8(s.metrics.render()).expect("utf8");
        assert!(text().contains("route=\"/b\""), "{}", text());

        s.apply(with_routes(&["/c", "/a", "/d"]));
        let next = s.runtime.load_full();
        let kept = next.route_series(true, index_of(&next, "/a"));
        assert!(std::ptr::eq(kept, sa), "the same series");
        assert_eq!(kept.traffic.inflight(), 1);
        let live: Vec<&str> = next
            .routes_with_series()
            .filter_map(|(r, s)| s.map(|_| r.path_prefix.as_str()))
            .collect();
        assert_eq!(live, ["/a"]);
        let t = text();
        assert!(t.contains("route=\"/a\""), "{t}");
        assert!(!t.contains("route=\"/b\""), "a removed route's series: {t}");
        assert!(!t.contains("route=\"/c\""), "no request, no series: {t}");
        // A request of the old table finishing after the reload: counted, not exposed.
        s.metrics
            .proxy
            .record_route(sb, portcullis_policy::verdict::Outcome::Shed, 503, 0.01);
        assert!(!text().contains("route=\"/b\""), "{}", text());
    }

    /// Past the bound, a route's first request gives it the shared series "other": its
    /// traffic counts there, it is listed without a series, and a reload that drops a
    /// route's series gives its place back.
    #[test]
    fn routes_past_the_bound_share_one_series() {
        let mut metrics = Metrics::new();
        metrics.proxy.route_budget = RouteSeriesBudget::new(2);
        let config = with_routes(&["/a", "/b", "/c"]);
        let limiter = Arc::new(Limiter::new(config.rate_limit.params.clone()));
        let rt = Runtime::build(config, None, &limiter, &metrics);
        // (the route's label, whether its figures are the shared ones)
        let at = |rt: &Runtime, p: &str| {
            let s = rt.route_series(true, index_of(rt, p));
            (s.label.clone(), rt.route_budget.is_other(s))
        };
        assert_eq!(at(&rt, "/a"), ("/a".into(), false));
        assert_eq!(at(&rt, "/b"), ("/b".into(), false));
        assert_eq!(at(&rt, "/c"), ("/c".into(), true), "past the bound");
        assert_eq!(
            at(&rt, "/nowhere"),
            ("default".into(), false),
            "always its own"
        );
        let c = rt.route_series(true, index_of(&rt, "/c"));
        metrics
            .proxy
            .record_route(c, portcullis_policy::verdict::Outcome::Proxied, 200, 0.01);
        c.traffic.enter();
        assert_eq!(rt.other_series().0.traffic.inflight(), 1);
        c.traffic.exit();
        let text = String::from_utf8(metrics.render()).expect("utf8");
        assert!(text.contains("route=\"other\""), "{text}");
        assert!(!text.contains("route=\"/c\""), "{text}");
        let own: Vec<&str> = rt
            .routes_with_series()
            .filter_map(|(r, s)| s.map(|_| r.path_prefix.as_str()))
            .collect();
        assert_eq!(own, ["/a", "/b", ""]);
        assert_eq!(rt.other_series().1, 2);
        // /a is removed: its place goes to the next route that asks.
        let next = Runtime::build(with_routes(&["/b", "/c"]), Some(&rt), &limiter, &metrics);
        drop(rt);
        assert_eq!(at(&next, "/b"), ("/b".into(), false), "kept");
        assert_eq!(
            at(&next, "/c"),
            ("/c".into(), false),
            "the place /a gave back"
        );
    }

    #[test]
    fn request_ids_are_32_lowercase_hex_digits_and_differ() {
        let s = shared();
        let (a, b) = (s.next_request_id(), s.next_request_id());
        assert!(is_id(&a) && is_id(&b), "{a} {b}");
        assert_ne!(a, b);
        let v = s.next_request_id_value();
        assert!(v.is_sensitive(), "HTTP/2 must not index a unique value");
        let v = v.to_str().expect("ascii header value");
        assert!(is_id(v), "{v}");
    }

    #[test]
    fn consecutive_request_ids_share_no_prefix() {
        // A counter (the old scheme) shares its first 12 digits across every id of a
        // process. Random ids: two of 100 sharing 8 given hex digits has a chance of
        // about 1e-6.
        let s = shared();
        let ids: Vec<String> = (0..100).map(|_| s.next_request_id()).collect();
        let mut prefixes: Vec<&str> = ids.iter().map(|i| &i[..8]).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        assert_eq!(prefixes.len(), ids.len(), "{ids:?}");
        // ... and neither do their ends (a counter's last digits step by one).
        let mut suffixes: Vec<&str> = ids.iter().map(|i| &i[24..]).collect();
        suffixes.sort_unstable();
        suffixes.dedup();
        assert_eq!(suffixes.len(), ids.len(), "{ids:?}");
    }

    #[test]
    fn threads_draw_different_ids() {
        // Each thread seeds its own generator: two threads must not repeat each other.
        let s = shared();
        let other = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || (0..50).map(|_| s.next_request_id()).collect::<Vec<_>>())
                .join()
                .expect("thread")
        };
        let mine: Vec<String> = (0..50).map(|_| s.next_request_id()).collect();
        for id in &mine {
            assert!(!other.contains(id), "{id} drawn on both threads");
        }
    }
}
