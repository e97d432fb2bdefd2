//! Caps as fleet totals: every [`TICK`] this instance publishes its recent traffic (its
//! requests over the last two seconds, overall and per upstream) to the store, reads the
//! fleet's, and takes the fleet cap times its share (`portcullis_policy::fleet_cap`):
//! the shedder's cap for `[shedding] fleet_max_concurrency` (the ceiling of the learned
//! cap when `adaptive`), the bulkhead's for `[[upstreams]] fleet_max_inflight`. Never on
//! the request path: the counts are totals kept anyway (requests finished, requests sent
//! to each backend), and each exchange is bounded by the store's timeout. Without a
//! fresh view (no store, or none answered for `STALE_MS`) the per-instance caps apply.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use portcullis_policy::fleet_cap::{
    effective_cap, RecentCount, TrafficPublish, TrafficStore, TrafficView, SCOPE_ALL, WINDOW_MS,
};

use super::every::{Outage, Ticks};
use crate::state::{Runtime, Shared};
use portcullis_store::Store;

/// How often the counts are exchanged.
pub const TICK: Duration = Duration::from_millis(250);

pub struct FleetCaps {
    shared: Arc<Shared>,
    store: Option<Arc<dyn TrafficStore>>,
    me: String,
}

impl FleetCaps {
    pub fn new(shared: Arc<Shared>, store: &Store) -> Self {
        let store = match store {
            Store::Redis(_) => Some(store.traffic()),
            Store::Local => None,
        };
        Self {
            shared,
            store,
            me: super::every::member_id(),
        }
    }
}

/// What the loop keeps between exchanges.
#[derive(Default)]
struct Exchanged {
    all: RecentCount,
    per_upstream: HashMap<String, RecentCount>,
    /// The last view read and when (this instance's clock, ms).
    last: Option<(u64, TrafficView)>,
    /// The counts this instance published at its previous exchange and at this one (see
    /// `Share::with_own`).
    published_before: Vec<(String, u64)>,
    published_now: Vec<(String, u64)>,
}

impl Exchanged {
    /// This instance's recent requests, overall and sent to each upstream.
    fn counts(&mut self, rt: &Runtime, total: u64, now_ms: u64) -> Vec<(String, u64)> {
        let mut counts = vec![(SCOPE_ALL.to_owned(), self.all.observe(now_ms, total))];
        self.per_upstream
            .retain(|name, _| rt.pools.iter().any(|p| &p.name == name));
        for pool in &rt.pools {
            let sent: u64 = pool.backends.iter().map(|b| b.totals().0).sum();
            let recent = self.per_upstream.entry(pool.name.clone()).or_default();
            counts.push((pool.name.clone(), recent.observe(now_ms, sent)));
        }
        counts
    }

    /// This instance's share of the fleet's traffic in `scope`, as of the last view.
    fn share_of(
        &self,
        me: &str,
        scope: &str,
    ) -> Option<(u64, portcullis_policy::fleet_cap::Share)> {
        let before = self
            .published_before
            .iter()
            .find(|(s, _)| s == scope)
            .map_or(0, |(_, n)| *n);
        self.last
            .as_ref()
            .map(|(at, v)| (*at, v.share(me, scope).with_own(before)))
    }
}

#[async_trait]
impl BackgroundService for FleetCaps {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = Ticks::every(TICK);
        let outage = Outage::new("fleet_caps");
        let mut ex = Exchanged::default();
        while ticks.next(&mut shutdown).await {
            let rt = self.shared.runtime.load();
            let total = self.shared.metrics.proxy.requests_seen();
            let counts = ex.counts(&rt, total, crate::state::unix_ms());
            let sh = &rt.config.shedding;
            let wanted = sh.fleet_max_concurrency > 0
                || rt.pools.iter().any(|p| p.balance.fleet_max_inflight > 0);
            if let (true, Some(store)) = (wanted, &self.store) {
                let req = TrafficPublish {
                    instance: self.me.clone(),
                    ttl_ms: WINDOW_MS,
                    counts,
                };
                ex.published_before = std::mem::replace(&mut ex.published_now, req.counts.clone());
                match store.exchange(&req).await {
                    Ok(view) => {
                        outage.answered("the fleet's traffic is read again; caps are fleet shares");
                        ex.last = Some((crate::state::unix_ms(), view));
                    }
                    Err(e) => {
                        outage.failed(&e, "cannot exchange traffic counts with the store; fleet caps fall back to the per-instance values");
                    }
                }
            }
            self.apply(&rt, &ex, crate::state::unix_ms());
        }
    }
}

impl FleetCaps {
    /// The caps from the last view: the shedder's (`fleet_max_concurrency`) and each
    /// upstream's bulkhead (`fleet_max_inflight`).
    fn apply(&self, rt: &Runtime, ex: &Exchanged, now_ms: u64) {
        let sh = &rt.config.shedding;
        let store = self.store.is_some();
        let eff = effective_cap(
            sh.fleet_max_concurrency,
            sh.max_concurrency,
            sh.min_concurrency,
            store,
            ex.share_of(&self.me, SCOPE_ALL),
            now_ms,
            fastrand::f64(),
        );
        if self.shared.fleet_cap.set(eff) {
            let ceiling = self.shared.fleet_cap.cap_or(sh.max_concurrency);
            self.shared
                .shedder
                .configure(ceiling, sh.adaptive, sh.min_concurrency.min(ceiling));
        }
        for pool in &rt.pools {
            let b = &pool.balance;
            // The floor of an upstream's share: one request in flight.
            let eff = effective_cap(
                b.fleet_max_inflight,
                b.max_inflight,
                1,
                store,
                ex.share_of(&self.me, &pool.name),
                now_ms,
                fastrand::f64(),
            );
            if pool.shared.fleet_cap.set(eff) && b.adaptive {
                let ceiling = pool.shared.fleet_cap.cap_or(b.max_inflight);
                pool.shared.limit.configure(
                    ceiling,
                    true,
                    ceiling.min(crate::upstream::ADAPTIVE_FLOOR),
                );
            }
        }
    }
}
