//! `GET /status`: the proxy's state as JSON (the HTML status page reads it too): the
//! shedding classes and queue, the rate limiter's store, culling, every upstream with its
//! backends, the routes' traffic and the tenants.

use std::sync::atomic::Ordering;

use serde_json::json;

use super::Admin;
use crate::state::{unix_secs, Shared};
use crate::upstream::{BackendState, Pool};
use portcullis_policy::shed::{Priority, QueueView};

impl Admin {
    /// `query`: `/status`'s query string (which routes to list).
    pub fn status_json(&self, query: Option<&str>) -> serde_json::Value {
        let s = &self.shared;
        let rt = s.runtime.load();
        let now = unix_secs();
        let now_ms = crate::state::unix_ms();
        let traffic_now = crate::observe::traffic::secs(std::time::Instant::now());
        let (routes, routes_summary) = crate::observe::traffic::routes_of(&rt, traffic_now, query);
        let upstreams: Vec<_> = rt
            .pools
            .iter()
            .map(|pool| upstream_json(s, pool, (now, now_ms, traffic_now)))
            .collect();
        let culling = &rt.config.culling;
        let cap = s.shedder.cap();
        let queue = s.shedder.queue_view(std::time::Instant::now());
        let classes = classes_json(cap, &queue);
        let sh = &rt.config.shedding;
        json!({
            "state": s.lifecycle.state_name(),
            "now_ms": crate::state::unix_ms(),
            "inflight": s.shedder.inflight(),
            "max_concurrency": cap,
            "shedding": {
                "fleet_max_concurrency": sh.fleet_max_concurrency,
                "fleet": s.fleet_cap.status(
                    sh.fleet_max_concurrency,
                    sh.max_concurrency,
                    s.store_kind == "redis",
                ),
                "classes": classes,
                "queue": {
                    "timeout_ms": sh.queue_timeout.as_millis() as u64,
                    "max_queue": sh.max_queue,
                    "target_ms": sh.queue_target.as_millis() as u64,
                    "newest_first": queue.lifo,
                },
            },
            "rate_limit": {
                "enabled": rt.config.rate_limit.enabled,
                "store": s.store_kind,
                "store_healthy": s.limiter.store_healthy(),
                "tracked_keys": s.limiter.tracked_keys(),
                // Live instances the store reports sharing the limits (1: not shared, or
                // before the first sync): the divisor of each instance's fleet share.
                "instances": s.limiter.instances(),
            },
            "culling": {
                "enabled": culling.enabled,
                "dry_run": culling.params.dry_run,
                "tokens_available": s.metrics.cull.tokens_available.get(),
                "recent_decisions": s.observe.culls.recent(),
            },
            "upstreams": upstreams,
            "routes": routes,
            "routes_summary": routes_summary,
            "tenants": rt.tenants.as_deref().map(|r| crate::tenants::status_json(r, &s.tenant_quota)),
        })
    }
}

/// One upstream: its panic mode, queue, bulkhead and backends. `now`: Unix seconds, Unix
/// ms and the traffic windows' clock.
fn upstream_json(s: &Shared, pool: &Pool, now: (u64, u64, u64)) -> serde_json::Value {
    let backends: Vec<_> = pool
        .backends
        .iter()
        .map(|b| backend_json(s, pool, b, now))
        .collect();
    json!({
        "name": pool.name,
        "panic_mode": pool.panic_mode.load(Ordering::Relaxed),
        "queue": {
            "timeout_ms": pool.balance.queue_timeout.as_millis() as u64,
            "max_queue": pool.max_queue(),
            "waiting": pool.room().waiting(),
        },
        "fleet_max_inflight": pool.balance.fleet_max_inflight,
        "bulkhead": pool.shared.fleet_cap.status(
            pool.balance.fleet_max_inflight,
            pool.balance.max_inflight,
            s.store_kind == "redis",
        ),
        "backends": backends,
    })
}

/// One backend: its state (with `draining` and `maint`), weight and the manual operation's
/// source, by, reason and until, as `GET /backends`; its window, cull and traffic.
fn backend_json(
    s: &Shared,
    pool: &Pool,
    b: &BackendState,
    (now, now_ms, traffic_now): (u64, u64, u64),
) -> serde_json::Value {
    let manual = crate::fleet::backend_view(pool, b);
    let (requests, errors) = b.window.totals(now);
    let mut v = json!({
        "name": b.name,
        "address": b.addr_str,
        "backup": manual["backup"],
        "max_conn": manual["max_conn"],
        "state": manual["state"],
        "weight": manual["weight"],
        "source": manual["source"],
        "by": manual["by"],
        "reason": manual["reason"],
        "until": manual["until"],
        "check": manual["check"],
        "errors_in_window": errors,
        "requests_in_window": requests,
        "dry_run_culled": b.is_dry_run_culled(),
        "cull_lease": s.observe.culls.lease(&pool.name, &b.addr_str),
        "outlier": s.observe.culls.outlier(&pool.name, &b.addr_str),
        "in_flight": b.inflight(),
        "slow_start": slow_start_json(pool, b, now_ms),
    });
    crate::observe::traffic::add_backend_fields(&mut v, b, traffic_now);
    v
}

/// The shedding classes: each one's share of the cap `cap`, who waits and for how long.
fn classes_json(cap: u64, queue: &QueueView) -> Vec<serde_json::Value> {
    [
        ("critical", Priority::Critical),
        ("normal", Priority::Normal),
        ("low", Priority::Low),
    ]
    .iter()
    .map(|(name, p)| {
        let limit = if cap == 0 {
            0
        } else {
            portcullis_policy::shed::class_limit(cap, *p)
        };
        let i = p.index();
        json!({
            "class": name,
            "limit": limit,
            "waiting": queue.waiting[i],
            "oldest_wait_ms": queue.oldest_wait[i].as_millis() as u64,
        })
    })
    .collect()
}

/// A backend's slow start: `null` without one (or once its ramp is done), else the share
/// of its weight it takes now and the time left.
fn slow_start_json(pool: &Pool, b: &BackendState, now_ms: u64) -> serde_json::Value {
    let window = pool.balance.slow_start;
    if window.is_zero() {
        return serde_json::Value::Null;
    }
    let ramp = b.ramp(now_ms, window);
    if ramp >= 1.0 {
        return serde_json::Value::Null;
    }
    let ends = b.back_at_ms() + window.as_millis() as u64;
    json!({
        "share": (ramp * 100.0).round() / 100.0,
        "remaining_ms": ends.saturating_sub(now_ms),
    })
}
