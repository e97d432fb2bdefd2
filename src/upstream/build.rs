//! Building a [`Pool`] from its configuration: the backends as Pingora sees them,
//! the health registry a reload keeps, the state the upstream's requests share,
//! and the load balancer over the backends.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use pingora::lb::discovery;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, Backends, LoadBalancer};

use super::{BackendState, Pool, PoolHealth, UpstreamShared};
use crate::config::Upstream;

/// Poll a future once; pingora's static discovery never blocks.
fn poll_once<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// The configured backends, in order: their state and their Pingora view.
struct Members {
    /// What Pingora's discovery and the selector see.
    set: BTreeSet<Backend>,
    /// Per-backend state, kept across reloads.
    states: Vec<Arc<BackendState>>,
    /// `set` in configuration order.
    members: Vec<Backend>,
}

impl Members {
    /// Backends already in `known` keep their state; the others start afresh.
    fn new(
        cfg: &Upstream,
        window_secs: u64,
        known: &HashMap<(String, SocketAddr), Arc<BackendState>>,
        reloading: bool,
    ) -> Self {
        let mut set = BTreeSet::new();
        let mut states = Vec::with_capacity(cfg.backends.len());
        let mut members = Vec::with_capacity(cfg.backends.len());
        for (i, addr) in cfg.backends.iter().enumerate() {
            let meta = meta_of(cfg, i);
            let name = meta.name.as_deref();
            let shown = name.map_or_else(|| addr.to_string(), str::to_string);
            let state = known
                .get(&(cfg.name.clone(), *addr))
                .filter(|s| s.name == shown)
                .cloned()
                .unwrap_or_else(|| {
                    let s = BackendState::named(&cfg.name, *addr, name, window_secs);
                    if reloading && !cfg.balance.slow_start.is_zero() {
                        // A new address joining a running upstream ramps like one back.
                        s.came_back(portcullis_store::clock::unix_ms());
                    }
                    Arc::new(s)
                });
            let weight = effective_weight(cfg, i, &state) as usize;
            let mut b = Backend {
                addr: pingora::protocols::l4::socket::SocketAddr::Inet(*addr),
                weight,
                ext: http::Extensions::new(),
            };
            b.ext.insert(Arc::clone(&state));
            b.ext.insert(crate::balance::selector::Slot(i));
            members.push(b.clone());
            set.insert(b);
            states.push(state);
        }
        Self {
            set,
            states,
            members,
        }
    }
}

/// The name, `max_conn` and `backup` of the `i`th backend: its entry's (found by the
/// entry it was written as).
fn meta_of(cfg: &Upstream, i: usize) -> crate::config::BackendMeta {
    let written = cfg.hosts.get(i);
    cfg.entries
        .iter()
        .position(|(e, _)| Some(e) == written)
        .and_then(|j| cfg.meta.get(j))
        .cloned()
        .unwrap_or_default()
}

/// The weight of the `i`th backend: set at runtime (`POST …/weight`), else configured, else 1;
/// at least 1 (weight 0 takes the backend out by its mark, not by the selector).
fn effective_weight(cfg: &Upstream, i: usize, state: &BackendState) -> u32 {
    let configured = cfg.balance.weights.get(i).copied().unwrap_or(1);
    state.manual().weight().unwrap_or(configured).max(1)
}

/// The pool's active health checks, `None` without a check. A reload keeps the
/// registry of `previous` (and with it the backends' health and their tracks), and its
/// probe too unless the check or the transport changed, or the backends did (a probe
/// knows each backend's `Host`); then it swaps in a new one. (A check used to be two
/// OpenSSL connectors loading the system's CA bundle, about 8 MB through libcrypto:
/// built on every reload's fresh blocking-pool thread, they grew the resident memory by
/// a glibc malloc arena, ~2.7 MB, per reload. Keeping an unchanged probe avoids that.)
fn pool_health(cfg: &Upstream, previous: Option<&Pool>) -> Option<PoolHealth> {
    let check = cfg.health.as_ref()?;
    let build = |tracks: Arc<super::probe::Tracks>| {
        super::probe::Probe::new(
            check.clone(),
            cfg.transport.clone(),
            &cfg.backends,
            &cfg.hosts,
            tracks,
        )
    };
    Some(
        match previous.and_then(|p| p.health.as_ref().map(|h| (p, h))) {
            Some((p, h)) if same_check(p, h, cfg) => h.clone(),
            Some((_, h)) => {
                h.check.0.store(Arc::new(build(Arc::clone(&h.tracks))));
                h.clone()
            }
            None => {
                let tracks = Arc::new(super::probe::Tracks::default());
                PoolHealth::new(build(Arc::clone(&tracks)), tracks)
            }
        },
    )
}

/// Whether `cfg` asks for the probe `previous` runs.
fn same_check(previous: &Pool, h: &PoolHealth, cfg: &Upstream) -> bool {
    let same_backends = previous.backends.len() == cfg.backends.len()
        && previous
            .backends
            .iter()
            .zip(&cfg.backends)
            .all(|(b, a)| b.addr == *a);
    same_backends
        && previous.hosts == cfg.hosts
        && cfg
            .health
            .as_ref()
            .is_some_and(|c| h.check.0.load().is(c, &cfg.transport))
}

/// The bulkhead and retry budget of the upstream, carried over from `previous`
/// (in-flight requests keep counting), at the configured retry budget ratio.
fn upstream_shared(cfg: &Upstream, previous: Option<&Pool>) -> Arc<UpstreamShared> {
    let shared = match previous {
        Some(p) => Arc::clone(&p.shared),
        None => Arc::new(UpstreamShared {
            inflight: AtomicU64::new(0),
            budget: crate::balance::retry_budget::RetryBudget::new(cfg.balance.retry_budget_ratio),
            limit: portcullis_policy::shed::Shedder::new(0),
            blame_ledger: Default::default(),
            blamed: Default::default(),
            blame_names: Default::default(),
            slow_ledger: Default::default(),
            slow_line_us: AtomicU64::new(portcullis_policy::cull::slow_line_us(
                &[],
                &Default::default(),
            )),
            key_spread: Default::default(),
            room: Default::default(),
            fleet_cap: Default::default(),
        }),
    };
    shared.budget.set_ratio(cfg.balance.retry_budget_ratio);
    // An adaptive upstream learns its cap between ADAPTIVE_FLOOR and max_inflight; a
    // learned cap survives a reload (clamped to the new bounds).
    let ceiling = cfg.balance.max_inflight;
    shared.limit.configure(
        ceiling,
        cfg.balance.adaptive,
        ceiling.min(crate::upstream::ADAPTIVE_FLOOR),
    );
    shared
}

/// Pingora's load balancer over the static set of backends, registered with the
/// pool's health registry when there is one.
fn load_balancer(
    name: &str,
    set: BTreeSet<Backend>,
    health: Option<&PoolHealth>,
) -> LoadBalancer<RoundRobin> {
    let discovery = discovery::Static::new(set);
    let backends = match health {
        Some(h) => Backends::new_with_health_registry(discovery, Arc::clone(&h.registry)),
        None => Backends::new(discovery),
    };
    let lb = LoadBalancer::<RoundRobin>::from_backends(backends);
    if poll_once(lb.update()).is_none() {
        tracing::error!(upstream = %name, "static discovery did not complete");
    }
    lb
}

impl Pool {
    /// Build a pool; backends already in `known` keep their state, and with
    /// `previous` (the pool of the same name before a reload) their health.
    pub fn build(
        cfg: &Upstream,
        window_secs: u64,
        known: &HashMap<(String, SocketAddr), Arc<BackendState>>,
        previous: Option<&Pool>,
    ) -> Self {
        let Members {
            set,
            states,
            members,
        } = Members::new(cfg, window_secs, known, previous.is_some());
        let health = pool_health(cfg, previous);
        let manual_weights: Vec<Option<u32>> = states.iter().map(|s| s.manual().weight()).collect();
        let mut balance = cfg.balance.clone();
        if states.iter().any(|s| s.manual().weight().is_some()) {
            balance.weights = (0..states.len())
                .map(|i| effective_weight(cfg, i, &states[i]))
                .collect();
        }
        let selector = crate::balance::selector::Selector::build(
            balance.policy,
            !balance.weights.is_empty(),
            &set,
        );
        let ids = cfg
            .backends
            .iter()
            .map(|a| crate::balance::stable_hash(&[a.to_string().as_bytes()]))
            .collect();
        let shared = upstream_shared(cfg, previous);
        for s in &states {
            s.join_room(&shared.room);
        }
        let lb = load_balancer(&cfg.name, set, health.as_ref());
        // The registry runs at the fast interval; the probe skips a settled backend
        // until its own interval is up.
        let health_check_interval = cfg.health.as_ref().map(|h| {
            Duration::from_millis(h.thresholds.fast_interval_ms.min(h.thresholds.interval_ms))
        });
        Self {
            name: cfg.name.clone(),
            lb,
            backends: states,
            members,
            ids,
            balance,
            manual_weights,
            configured_weights: cfg.balance.weights.clone(),
            selector,
            shared,
            connect_timeout: cfg.connect_timeout,
            read_timeout: cfg.read_timeout,
            health_check_interval,
            health_check_path: cfg.health_check_path.clone(),
            hosts: cfg.hosts.clone(),
            max_conn: (0..cfg.backends.len())
                .map(|i| meta_of(cfg, i).max_conn)
                .collect(),
            backup: (0..cfg.backends.len())
                .map(|i| meta_of(cfg, i).backup)
                .collect(),
            limited: !cfg.balance.slow_start.is_zero()
                || (0..cfg.backends.len()).any(|i| {
                    let m = meta_of(cfg, i);
                    m.max_conn > 0 || m.backup
                }),
            transport: cfg.transport.clone(),
            panic_mode: AtomicBool::new(false),
            health,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(path: &str, connect_timeout_ms: u64) -> Upstream {
        let text = format!(
            "[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:1\"]\n\
             health_check_path = \"{path}\"\nconnect_timeout_ms = {connect_timeout_ms}\n"
        );
        let mut cfg = crate::config::parse("t.toml", &text).expect("valid config");
        cfg.upstreams.remove(0)
    }

    fn check_of(pool: &Pool) -> Arc<super::super::probe::Probe> {
        pool.health
            .as_ref()
            .expect("health checks")
            .check
            .0
            .load_full()
    }

    #[test]
    fn a_reload_keeps_an_unchanged_health_check_and_replaces_a_changed_one() {
        let known = HashMap::new();
        let first = Pool::build(&upstream("/healthz", 500), 10, &known, None);
        let before = check_of(&first);
        let same = Pool::build(&upstream("/healthz", 500), 10, &known, Some(&first));
        assert!(Arc::ptr_eq(&before, &check_of(&same)), "unchanged: kept");
        let path = Pool::build(&upstream("/ready", 500), 10, &known, Some(&same));
        let after_path = check_of(&path);
        assert!(
            !Arc::ptr_eq(&before, &after_path),
            "a new path: a new check"
        );
        let timeout = Pool::build(&upstream("/ready", 900), 10, &known, Some(&path));
        assert!(
            !Arc::ptr_eq(&after_path, &check_of(&timeout)),
            "a new timeout: a new check"
        );
        // The registry (the backends' health) is the one of the first build throughout.
        let registry = |p: &Pool| Arc::clone(&p.health.as_ref().expect("health checks").registry);
        assert!(Arc::ptr_eq(&registry(&first), &registry(&timeout)));
    }
}

#[cfg(test)]
mod floor_tests {
    use super::*;
    use crate::upstream::Tried;
    use portcullis_policy::cull::ops::{OpKind, OpRecord};

    fn pool() -> Pool {
        let text = "[[upstreams]]\nname = \"a\"\n\
                    backends = [\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]\n";
        let mut cfg = crate::config::parse("t.toml", text).expect("valid config");
        Pool::build(&cfg.upstreams.remove(0), 10, &HashMap::new(), None)
    }

    fn drain(b: &BackendState) {
        b.manual().set(vec![OpRecord {
            backend: b.addr_str.clone(),
            kind: OpKind::Drain,
            by: "t".into(),
            reason: "t".into(),
            at_ms: 1,
            until_ms: None,
            force: false,
        }]);
    }

    #[test]
    fn a_view_with_nothing_in_rotation_keeps_a_culled_backend_in() {
        let p = pool();
        p.backends[0].set_culled(true);
        drain(&p.backends[1]);
        drain(&p.backends[2]);
        let got = p.select(&Tried::default(), b"");
        assert_eq!(
            got.map(|b| b.addr_str.clone()).as_deref(),
            Some("127.0.0.1:1"),
            "the culled one serves rather than none"
        );
        // One in rotation: the culled one stays out.
        p.backends[2].manual().set(Vec::new());
        for _ in 0..6 {
            let got = p.select(&Tried::default(), b"").map(|b| b.addr_str.clone());
            assert_eq!(got.as_deref(), Some("127.0.0.1:3"));
        }
        // Operations alone never make the floor serve a drained backend.
        drain(&p.backends[2]);
        p.backends[0].set_culled(false);
        drain(&p.backends[0]);
        assert!(p.select(&Tried::default(), b"").is_none());
    }

    #[test]
    fn a_fleet_read_older_than_the_loops_own_change_does_not_undo_it() {
        let p = pool();
        let b = &p.backends[0];
        let read = crate::upstream::cull_epoch();
        b.set_culled(true); // the culling loop's grant, after the read started
        assert!(!b.follow_cull(false, read), "the older read is skipped");
        assert!(b.is_culled());
        let newer = crate::upstream::cull_epoch();
        assert!(
            b.follow_cull(false, newer),
            "a read started after it applies"
        );
        assert!(!b.is_culled());
        assert!(b.follow_cull(true, newer));
        assert!(b.is_culled());
    }
}
