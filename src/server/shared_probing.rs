//! Shared probing's exchanges with the store (`[upstreams.health_check] shared = true`
//! with `[redis]`): before each health-check round, this instance renews its lease,
//! publishes its verdicts and reads the live instances and the verdicts of the upstreams
//! due, and hands every backend its [`Role`] (its probers by rendezvous hashing, whether
//! this instance is one, what the others published); after the round it publishes what
//! the round found, so the rest of the fleet reads it within one interval. A failed
//! exchange changes nothing: the roles age out after three intervals and every instance
//! probes for itself again (`crate::upstream::probe`). Nothing here is on the request
//! path; each call is bounded by the store's timeout.

use std::collections::HashMap;
use std::sync::Arc;

use portcullis_policy::health::shared::{probers, ProbeStore, Publish, SyncRequest, Verdict};

use super::every::Outage;
use crate::upstream::probe::Role;
use crate::upstream::Pool;
use portcullis_store::Store;

/// The shortest lease: a few store round trips and a health-check tick.
const MIN_LEASE_MS: u64 = 750;

pub(super) struct SharedProbing {
    store: Arc<dyn ProbeStore>,
    me: String,
    /// The exchanges' outage (warned once).
    outage: Outage,
}

impl SharedProbing {
    /// `None` without a Redis store: every instance probes for itself.
    pub(super) fn new(store: &Store) -> Option<Self> {
        match store {
            Store::Redis(_) => Some(Self {
                store: store.probes(),
                me: super::every::member_id(),
                outage: Outage::new("health"),
            }),
            Store::Local => None,
        }
    }

    /// One exchange: renews the lease, publishes the outboxes of every pool of `shared`,
    /// and reads the roles of `read`'s backends. With nothing to read or publish, none.
    pub(super) async fn exchange(&self, shared: &[&Pool], read: &[&Pool]) {
        let Some(cadence_ms) = shared
            .iter()
            .filter_map(|p| p.health_check_interval)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .min()
        else {
            return;
        };
        let mut publish = Vec::new();
        for pool in shared {
            if let Some((tracks, _, _)) = pool.shared_probing() {
                publish.extend(
                    tracks
                        .take_outbox()
                        .into_iter()
                        .map(|(addr, payload)| Publish {
                            upstream: pool.name.clone(),
                            backend: addr.to_string(),
                            payload,
                        }),
                );
            }
        }
        if publish.is_empty() && read.is_empty() {
            return;
        }
        let verdict_ttl_ms = shared
            .iter()
            .filter_map(|p| p.shared_probing())
            .map(|(_, _, t)| t.interval_ms.max(t.fast_interval_ms).saturating_mul(3))
            .max()
            .unwrap_or(0);
        let req = SyncRequest {
            instance: self.me.clone(),
            // three missed renewals (rounds) and the instance is gone
            lease_ms: cadence_ms.saturating_mul(3).max(MIN_LEASE_MS),
            verdict_ttl_ms,
            publish,
            read: read.iter().map(|p| p.name.clone()).collect(),
        };
        let view = match self.store.sync(&req).await {
            Ok(v) => v,
            Err(e) => {
                self.outage.failed(
                    &e,
                    "shared probing: the store is unavailable; each instance probes its \
                     backends itself until it is back",
                );
                return;
            }
        };
        self.outage.answered("shared probing: the store is back");
        for (pool, published) in read.iter().zip(&view.verdicts) {
            let Some((tracks, k, _)) = pool.shared_probing() else {
                continue;
            };
            let roles = self.roles(pool, k as usize, &view.live, published);
            tracks.set_roles(&self.me, roles, view.now_ms);
        }
    }

    /// Each of `pool`'s backends' role: its `k` probers among the `live` instances
    /// (rendezvous hashing), whether this instance is one, and what the others of them
    /// published.
    fn roles(
        &self,
        pool: &Pool,
        k: usize,
        live: &[String],
        published: &[(String, Verdict)],
    ) -> HashMap<std::net::SocketAddr, Role> {
        let mut roles = HashMap::with_capacity(pool.backends.len());
        for b in &pool.backends {
            let backend = b.addr.to_string();
            let chosen: Vec<String> = probers(live, &pool.name, &backend, k)
                .into_iter()
                .map(str::to_owned)
                .collect();
            let verdicts = published
                .iter()
                .filter(|(addr, v)| {
                    *addr == backend && v.instance != self.me && chosen.contains(&v.instance)
                })
                .map(|(_, v)| v.clone())
                .collect();
            let me = chosen.contains(&self.me);
            roles.insert(
                b.addr,
                Role {
                    probers: chosen,
                    me,
                    verdicts,
                },
            );
        }
        roles
    }
}
