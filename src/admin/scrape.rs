//! What a scrape of `/metrics` copies into the registry first: gauges that live as atomics
//! elsewhere (the shedder, the limiter, the tenants' quotas, the pools) and counters whose
//! totals are kept by their owners (added by the difference since the last scrape).

use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::HashMap;

use super::Admin;
use crate::metrics::Metrics;
use crate::state::{Runtime, Shared};
use crate::upstream::Pool;

/// Adds to `counter` what the limiter's running `total` gained since the last scrape
/// (`seen` keeps the total already added).
fn add_since(counter: &prometheus::IntCounter, seen: &AtomicU64, total: u64) {
    let prev = seen.swap(total, Ordering::AcqRel);
    counter.inc_by(total.saturating_sub(prev));
}

impl Admin {
    /// Copy gauges that live as atomics elsewhere into the registry.
    pub(super) fn refresh_metrics(&self) {
        let s = &self.shared;
        let rt = s.runtime.load();
        shedding(s, &rt);
        s.metrics
            .lifecycle
            .ready
            .set(i64::from(s.lifecycle.is_ready()));
        self.limiter();
        tenants(s, &rt);
        let mut seen = match self.backend_errors_seen.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        for pool in &rt.pools {
            pool_series(&s.metrics, pool, &mut seen);
        }
    }

    /// The rate limiter's store: its health, the keys tracked, its errors and late answers.
    fn limiter(&self) {
        let s = &self.shared;
        let m = &s.metrics;
        m.ratelimit
            .store_healthy
            .set(i64::from(s.limiter.store_healthy()));
        m.ratelimit
            .tracked_keys
            .set(s.limiter.tracked_keys() as i64);
        add_since(
            &m.ratelimit.store_errors,
            &self.store_errors_seen,
            s.limiter.store_errors_total(),
        );
        add_since(
            &m.ratelimit.store_late_answers,
            &self.store_late_seen,
            s.limiter.late_answers_total(),
        );
    }
}

/// The shedder's figures (in flight, its cap, who waits by class) and each upstream's queue
/// and learned or fleet cap.
fn shedding(s: &Shared, rt: &Runtime) {
    let m = &s.metrics;
    m.shed.inflight.set(s.shedder.inflight() as i64);
    m.shed.concurrency_limit.set(s.shedder.cap() as i64);
    let view = s.shedder.queue_view(std::time::Instant::now());
    for (c, n) in portcullis_policy::shed::Priority::ALL
        .iter()
        .zip(view.waiting)
    {
        m.shed
            .queue_waiting
            .with_label_values(&[c.as_str()])
            .set(n as i64);
    }
    for pool in rt.pools.iter() {
        if !pool.balance.queue_timeout.is_zero() {
            m.shed
                .upstream_queue_waiting
                .with_label_values(&[pool.name.as_str()])
                .set(pool.room().waiting() as i64);
        }
    }
    for pool in rt
        .pools
        .iter()
        .filter(|p| p.balance.fleet_max_inflight > 0 && !p.balance.adaptive)
    {
        m.shed
            .upstream_concurrency_limit
            .with_label_values(&[pool.name.as_str()])
            .set(pool.shared.fleet_cap.cap_or(pool.balance.max_inflight) as i64);
    }
    for pool in rt.pools.iter().filter(|p| p.balance.adaptive) {
        m.shed
            .upstream_concurrency_limit
            .with_label_values(&[pool.name.as_str()])
            .set(pool.shared.limit.cap() as i64);
    }
}

/// Each metered tenant's spending of its period.
fn tenants(s: &Shared, rt: &Runtime) {
    if let Some(registry) = rt.tenants.as_deref() {
        let now = portcullis_store::clock::unix_ms();
        for t in registry.tenants.iter().filter(|t| t.tier.quota > 0) {
            let used = s.tenant_quota.used(t.quota_key, t.tier.period, now);
            s.metrics
                .tenants
                .quota_used
                .with_label_values(&[&t.name])
                .set(i64::try_from(used).unwrap_or(i64::MAX));
        }
    }
}

/// One upstream's series: its backends' errors (`seen`: the totals already added, per
/// upstream and backend) and health checks, its panic mode, the series present from start
/// at 0, and each backend's state.
fn pool_series(m: &Metrics, pool: &Pool, seen: &mut HashMap<(String, String), u64>) {
    for b in &pool.backends {
        let (_, errors) = b.totals();
        let prev = seen
            .entry((pool.name.clone(), b.addr_str.clone()))
            .or_insert(0);
        m.cull
            .backend_errors
            .with_label_values(&[pool.name.as_str(), b.addr_str.as_str()])
            // a re-added backend starts from zero again
            .inc_by(errors.checked_sub(*prev).unwrap_or(errors));
        *prev = errors;
    }
    for (addr, counts) in pool.health_counts() {
        let backend = addr.to_string();
        for (result, n) in counts {
            let c = m.cull.health_checks.with_label_values(&[
                pool.name.as_str(),
                backend.as_str(),
                result,
            ]);
            // the counts only grow (they live as long as the pool's health registry)
            c.inc_by(n.saturating_sub(c.get()));
        }
    }
    m.cull
        .upstream_panic_mode
        .with_label_values(&[pool.name.as_str()])
        .set(i64::from(pool.panic_mode.load(Ordering::Relaxed)));
    // present from start at 0, not only after a first retry, shed or response
    m.proxy.init_upstream(
        &pool.name,
        pool.backends.iter().map(|b| b.addr_str.as_str()),
    );
    m.shed
        .bulkhead_shed
        .with_label_values(&[pool.name.as_str()]);
    if pool.health_thresholds().is_some() {
        for b in &pool.backends {
            m.cull.health_checks.with_label_values(&[
                pool.name.as_str(),
                b.addr_str.as_str(),
                "ok",
            ]);
        }
    }
    for b in &pool.backends {
        let view = crate::fleet::backend_view(pool, b);
        let state = view["state"].as_str().unwrap_or("up");
        m.admin.set_backend_state(&pool.name, &b.addr_str, state);
        m.cull
            .backend_culled
            .with_label_values(&[pool.name.as_str(), b.addr_str.as_str()])
            .set(i64::from(b.is_culled()));
    }
}
