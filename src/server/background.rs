//! The background services of the server: active health checks, the rate-limit
//! flusher, readiness, access-log reopening, SIGHUP reload (and DNS
//! re-resolution, a changed tenants file), the store's tenants, the watchdog and culling,
//! all on the one fleet store; and systemd's watchdog pings when it asked for them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::ServiceWithDependents;

use super::every::Ticks;
use crate::config::StoreSettings;
use crate::state::Shared;
use portcullis_policy::ratelimit::{CounterStore, LocalStore};
use portcullis_store::RedisStore;
use portcullis_store::Store;

/// Runs active health checks of every pool of the current runtime, each at
/// its own interval; follows reloads.
struct HealthChecks {
    shared: Arc<Shared>,
    /// Shared probing's exchanges (`None` without a Redis store).
    probing: Option<super::shared_probing::SharedProbing>,
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut last: HashMap<String, Instant> = HashMap::new();
        let mut ticks = Ticks::every(Duration::from_millis(250));
        while ticks.next(&mut shutdown).await {
            let rt = self.shared.runtime.load_full();
            let now_ms = portcullis_store::clock::unix_ms();
            for pool in &rt.pools {
                pool.watch_rotation(now_ms);
            }
            let mut due = Vec::new();
            for pool in &rt.pools {
                let Some(every) = pool.health_check_interval else {
                    continue;
                };
                if last.get(&pool.name).is_none_or(|t| t.elapsed() >= every) {
                    last.insert(pool.name.clone(), Instant::now());
                    due.push(pool.as_ref());
                }
            }
            if due.is_empty() {
                continue;
            }
            let shared: Vec<&crate::upstream::Pool> = rt
                .pools
                .iter()
                .map(AsRef::as_ref)
                .filter(|p| p.shared_probing().is_some())
                .collect();
            let probing = self.probing.as_ref().filter(|_| !shared.is_empty());
            if let Some(probing) = probing {
                // the roles (and the fleet's verdicts) of the pools about to be checked
                let read: Vec<&crate::upstream::Pool> = due
                    .iter()
                    .copied()
                    .filter(|p| p.shared_probing().is_some())
                    .collect();
                probing.exchange(&shared, &read).await;
            }
            for pool in &due {
                pool.run_health_check().await;
            }
            if let Some(probing) = probing {
                // what this round found, for the rest of the fleet
                probing.exchange(&shared, &[]).await;
            }
        }
    }
}

/// Flushes rate-limit counts to the store in batches.
struct Flusher {
    shared: Arc<Shared>,
    store: Arc<dyn CounterStore>,
    interval: Duration,
}

#[async_trait]
impl BackgroundService for Flusher {
    async fn start(&self, shutdown: ShutdownWatch) {
        let shared = Arc::clone(&self.shared);
        let quota: Arc<dyn portcullis_policy::ratelimit::FlushExtra> = shared.tenant_quota.clone();
        let after = Arc::clone(&shared);
        crate::ratelimit::run_flusher(
            move || shared.rate_limiters(),
            Some(quota),
            move || after.refresh_tenants(),
            Arc::clone(&self.store),
            self.interval,
            shutdown,
        )
        .await;
    }
}

/// Readiness waits until every proxy listener accepts a connection, so
/// `/readyz` never says 200 before traffic can be taken.
struct Readiness {
    shared: Arc<Shared>,
    listen: Vec<std::net::SocketAddr>,
}

#[async_trait]
impl BackgroundService for Readiness {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut pending = self.listen.clone();
        let mut ticks = Ticks::every(Duration::from_millis(20));
        while !pending.is_empty() {
            if !ticks.next(&mut shutdown).await {
                return;
            }
            let mut still = Vec::with_capacity(pending.len());
            for addr in pending {
                let connect = tokio::net::TcpStream::connect(addr);
                match tokio::time::timeout(Duration::from_millis(500), connect).await {
                    Ok(Ok(_)) => {}
                    _ => still.push(addr),
                }
            }
            pending = still;
        }
        if self.shared.lifecycle.mark_ready() {
            tracing::info!(event = "ready", "proxy listeners accept; ready");
            self.shared.lifecycle.notifier.ready();
        }
    }
}

/// Reopens the access log on SIGUSR1 (logrotate).
struct AccessLogReopen {
    shared: Arc<Shared>,
}

#[async_trait]
impl BackgroundService for AccessLogReopen {
    async fn start(&self, shutdown: ShutdownWatch) {
        let shared = Arc::clone(&self.shared);
        crate::observe::access_log::reopen_on_sigusr1(
            move || shared.observe.access_log.reopen(),
            shutdown,
        )
        .await;
    }
}

/// Reloads the config on SIGHUP.
struct Reloader {
    shared: Arc<Shared>,
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // DNS re-resolution and a changed tenants file are applied like a reload, so they
        // run here too.
        let tenants = super::tenants_watch::watch(Arc::clone(&self.shared), shutdown.clone());
        tokio::select! {
            _ = crate::reload::watch_sighup(Arc::clone(&self.shared)) => {}
            _ = crate::state::resolve::run(Arc::clone(&self.shared)) => {}
            _ = tenants => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// The one Redis client of the process, shared by the limiter's flusher, culling and
/// the watchdog (one connection for the whole process).
pub(super) fn fleet_store(redis: Option<&StoreSettings>) -> Store {
    match redis {
        Some(r) => {
            Store::with_endpoint(&r.endpoint, &r.key_prefix, r.timeout).unwrap_or_else(|e| {
                // validated at load; only reachable if the URL became invalid
                tracing::error!(error = %e, "invalid Redis settings; using the in-process store");
                Store::Local
            })
        }
        None => Store::Local,
    }
}

/// Where the rate-limit flusher writes its counts, and how often.
fn counter_store(
    fleet_store: &Store,
    redis: Option<&StoreSettings>,
) -> (Arc<dyn CounterStore>, Duration) {
    match (fleet_store, redis) {
        (Store::Redis(client), Some(r)) => (
            Arc::new(RedisStore::new(Arc::clone(client))),
            r.flush_interval,
        ),
        _ => (Arc::new(LocalStore::new()), Duration::from_millis(50)),
    }
}

/// Every background service, in the order the server adds them. `ready_addrs`: the
/// proxy listeners readiness waits for.
pub(super) fn services(
    shared: &Arc<Shared>,
    fleet_store: &Store,
    budget: Arc<dyn portcullis_policy::cull::BudgetStore>,
    view: Arc<crate::fleet::sync::FleetView>,
    redis: Option<&StoreSettings>,
    ready_addrs: Vec<std::net::SocketAddr>,
) -> Vec<Box<dyn ServiceWithDependents>> {
    let (store, flush_interval) = counter_store(fleet_store, redis);
    // Every background service holds the shared state.
    let sh = || Arc::clone(shared);
    let health = background_service(
        "health checks",
        HealthChecks {
            shared: sh(),
            probing: super::shared_probing::SharedProbing::new(fleet_store),
        },
    );
    let flusher = background_service(
        "rate-limit flusher",
        Flusher {
            shared: sh(),
            store,
            interval: flush_interval,
        },
    );
    let culling = crate::cull::driver::service(sh(), Arc::clone(&budget), Arc::clone(&view));
    let fleet_sync = crate::fleet::sync::service(sh(), budget, view);
    let readiness = background_service(
        "readiness",
        Readiness {
            shared: sh(),
            listen: ready_addrs,
        },
    );
    let reloader = background_service("reload", Reloader { shared: sh() });
    let access_log_reopen =
        background_service("access log reopen", AccessLogReopen { shared: sh() });
    let tenant_sync = background_service(
        "tenants sync",
        super::tenants_sync::TenantSync::new(sh(), fleet_store),
    );
    let fleet_caps = background_service(
        "fleet caps",
        super::fleet_caps::FleetCaps::new(sh(), fleet_store),
    );
    let ramp_sync = background_service(
        "slow-start sync",
        super::ramp_sync::RampSync::new(sh(), fleet_store),
    );
    let watchdog = crate::watchdog::Watchdog::new(sh(), fleet_store);
    let watchdog = background_service("watchdog", watchdog);
    let mut all: Vec<Box<dyn ServiceWithDependents>> = vec![
        Box::new(health),
        Box::new(flusher),
        Box::new(reloader),
        Box::new(access_log_reopen),
        Box::new(readiness),
        Box::new(watchdog),
        Box::new(culling),
        Box::new(fleet_sync),
        Box::new(tenant_sync),
        Box::new(fleet_caps),
        Box::new(ramp_sync),
    ];
    // `WATCHDOG=1` to systemd, when it asked for it.
    if let Some(interval) = shared.lifecycle.notifier.watchdog_interval() {
        let pings = crate::lifecycle::notify::WatchdogPings {
            interval,
            lifecycle: Arc::clone(&shared.lifecycle),
        };
        all.push(Box::new(background_service("systemd watchdog", pings)));
    }
    all
}
