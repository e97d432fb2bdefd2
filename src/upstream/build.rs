//! Building a [`Pool`] from its configuration: the backends as Pingora sees them,
//! the health registry a reload keeps, the state the upstream's requests share,
//! and the load balancer over the backends.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use pingora::http::{RequestHeader, ResponseHeader};
use pingora::lb::discovery;
use pingora::lb::health_check::HttpHealthCheck;
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
    ) -> Self {
        let mut set = BTreeSet::new();
        let mut states = Vec::with_capacity(cfg.backends.len());
        let mut members = Vec::with_capacity(cfg.backends.len());
        for (i, addr) in cfg.backends.iter().enumerate() {
            let state = known
                .get(&(cfg.name.clone(), *addr))
                .cloned()
                .unwrap_or_else(|| Arc::new(BackendState::new(&cfg.name, *addr, window_secs)));
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

/// The weight of the `i`th backend: set at runtime (`POST …/weight`), else configured, else 1;
/// at least 1 (weight 0 takes the backend out by its mark, not by the selector).
fn effective_weight(cfg: &Upstream, i: usize, state: &BackendState) -> u32 {
    let configured = cfg.balance.weights.get(i).copied().unwrap_or(1);
    state.manual().weight().unwrap_or(configured).max(1)
}

/// The pool's active health checks, `None` without `health_check_path`. A reload
/// keeps the registry of `previous` (and with it the backends' health), and its check
/// too unless the check's path, timeout or transport changed; then it swaps in a new
/// one. A new check is two OpenSSL connectors, each loading the system's CA bundle
/// (about 8 MB allocated and freed by libcrypto, through the C allocator): built on the
/// reload's fresh blocking-pool thread on every reload, they grew the resident memory
/// by a glibc malloc arena's worth (~2.7 MB) per reload.
fn pool_health(cfg: &Upstream, previous: Option<&Pool>) -> Option<PoolHealth> {
    (!cfg.health_check_path.is_empty()).then(|| {
        let build =
            || http_health_check(&cfg.health_check_path, cfg.connect_timeout, &cfg.transport);
        match previous.and_then(|p| p.health.as_ref().map(|h| (p, h))) {
            Some((p, h)) if same_check(p, cfg) => h.clone(),
            Some((_, h)) => {
                h.check.0.store(Arc::new(build()));
                h.clone()
            }
            None => PoolHealth::new(build()),
        }
    })
}

/// Whether `cfg` asks for the health check `previous` runs (what [`http_health_check`]
/// is built from).
fn same_check(previous: &Pool, cfg: &Upstream) -> bool {
    previous.health_check_path == cfg.health_check_path
        && previous.connect_timeout == cfg.connect_timeout
        && previous.transport == cfg.transport
}

/// The bulkhead and retry budget of the upstream, carried over from `previous`
/// (in-flight requests keep counting), at the configured retry budget ratio.
fn upstream_shared(cfg: &Upstream, previous: Option<&Pool>) -> Arc<UpstreamShared> {
    let shared = match previous {
        Some(p) => Arc::clone(&p.shared),
        None => Arc::new(UpstreamShared {
            inflight: AtomicU64::new(0),
            budget: crate::balance::retry_budget::RetryBudget::new(cfg.balance.retry_budget_ratio),
            limit: crate::shed::Shedder::new(0),
            blame_ledger: Default::default(),
            blamed: Default::default(),
            blame_names: Default::default(),
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
        } = Members::new(cfg, window_secs, known);
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
        let lb = load_balancer(&cfg.name, set, health.as_ref());
        let health_check_interval =
            (!cfg.health_check_path.is_empty()).then_some(cfg.health_check_interval);
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
            transport: cfg.transport.clone(),
            panic_mode: AtomicBool::new(false),
            health,
        }
    }
}

fn http_health_check(
    path: &str,
    timeout: Duration,
    transport: &crate::config::UpstreamTransport,
) -> HttpHealthCheck {
    let host = if transport.sni.is_empty() {
        "localhost"
    } else {
        transport.sni.as_str()
    };
    let mut hc = HttpHealthCheck::new(host, transport.tls);
    if transport.tls {
        hc.peer_template.options.verify_cert = transport.verify;
        hc.peer_template.options.verify_hostname = transport.verify && !transport.sni.is_empty();
        if let Some(ca) = &transport.ca {
            hc.peer_template.options.ca = Some(ca.0.clone());
        }
    }
    match RequestHeader::build("GET", path.as_bytes(), None) {
        Ok(mut req) => {
            let _ = req.append_header("Host", "localhost");
            let _ = req.append_header("User-Agent", "portcullis-health-check");
            hc.req = req;
        }
        Err(e) => tracing::error!(error = %e, path, "bad health check path; using /"),
    }
    hc.peer_template.options.connection_timeout = Some(timeout);
    hc.peer_template.options.read_timeout = Some(timeout.max(Duration::from_secs(1)));
    hc.validator = Some(Box::new(|resp: &ResponseHeader| {
        if resp.status.is_success() {
            Ok(())
        } else {
            pingora::Error::e_explain(
                pingora::ErrorType::HTTPStatus(resp.status.as_u16()),
                "health check wants 2xx",
            )
        }
    }));
    hc
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

    fn check_of(pool: &Pool) -> Arc<HttpHealthCheck> {
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
