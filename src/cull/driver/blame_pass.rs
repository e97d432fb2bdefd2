//! The `blame_tenants` pass of a check, before any rule judges the backends: the keys
//! that cause the errors are limited instead, shared with the fleet through the store,
//! and their errors taken out of the backends' samples.

use super::Culling;
use crate::observe::journal::CullEntry;
use crate::upstream::Pool;
use portcullis_policy::cull::{self, BackendSample, CullParams};
use portcullis_store::clock::unix_ms;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

/// Errors per key and backend over the window, as this instance saw them.
type Ledger = HashMap<u64, HashMap<SocketAddr, u64>>;

impl Culling {
    /// `blame_tenants`: blame the keys that cause most errors on two or more backends while
    /// other keys succeed there ([`cull::find_blamed`]) and limit them for the cooldown;
    /// share blames and suspects (a key that is the main cause on one backend so far,
    /// [`cull::attributed`]) through the store; and take the errors of every blamed or
    /// suspect key, this instance's or the fleet's, out of `samples`.
    pub(super) async fn blame(
        &self,
        pool: &Pool,
        samples: &mut [BackendSample],
        params: &CullParams,
        now_ms: u64,
    ) {
        pool.shared.blamed.expire(now_ms);
        let ledger = pool
            .shared
            .blame_ledger
            .snapshot(now_ms / 1000, params.window_secs);
        let published = self.find_blames(pool, samples, &ledger, params, now_ms);
        // Fleet-wide through the store, like a cull: publish ours, follow the others'.
        let fleet = match self
            .budget
            .exchange_blame(&pool.name, &published, now_ms)
            .await
        {
            Some(Ok(fleet)) => fleet,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "fleet blame unavailable; this instance's only");
                published.clone()
            }
            None => published.clone(),
        };
        let theirs = self.follow_blames(pool, &fleet, now_ms);
        // A key the fleet blames that this instance has errors of but did not publish yet:
        // publish them now (a second round trip, only then), so no instance mistakes them
        // for the backends' before this one's next check.
        let late: Vec<cull::FleetBlame> = fleet
            .iter()
            .filter(|fb| fb.limit && !published.iter().any(|p| p.key == fb.key))
            .filter_map(|fb| {
                let per = ledger.get(&fb.key)?;
                Some(self.fleet_blame(fb.key, fb.until_ms, true, per))
            })
            .collect();
        if !late.is_empty() {
            if let Some(Err(e)) = self.budget.exchange_blame(&pool.name, &late, now_ms).await {
                tracing::debug!(error = %e, "fleet blame unavailable");
            }
        }
        let keys: HashSet<u64> = fleet.iter().map(|fb| fb.key).collect();
        take_out_blamed(pool, samples, theirs, &keys, &ledger);
    }

    /// What this instance publishes: the keys it finds behind the errors (blamed on
    /// [`cull::BLAME_MIN_BACKENDS`] backends and limited for the cooldown, or suspects for
    /// three checks), and the keys limited already, by it or the fleet.
    fn find_blames(
        &self,
        pool: &Pool,
        samples: &[BackendSample],
        ledger: &Ledger,
        params: &CullParams,
        now_ms: u64,
    ) -> Vec<cull::FleetBlame> {
        let blamed = &pool.shared.blamed;
        let counts: Vec<cull::BackendCounts> = pool
            .backends
            .iter()
            .zip(samples.iter())
            .map(|(b, s)| cull::BackendCounts {
                addr: b.addr,
                requests: s.requests,
                errors: s.errors,
            })
            .collect();
        let suspect_until =
            now_ms.saturating_add(3 * params.check_interval_secs.max(1).saturating_mul(1000));
        let mut published: Vec<cull::FleetBlame> = Vec::new();
        for found in cull::attributed(ledger, &counts, params.error_threshold) {
            let limit = found.backends.len() >= cull::BLAME_MIN_BACKENDS;
            let until = if limit {
                now_ms.saturating_add(params.cooldown_ms())
            } else {
                suspect_until
            };
            let per = ledger.get(&found.key).cloned().unwrap_or_default();
            published.push(self.fleet_blame(found.key, until, limit, &per));
            if !limit || blamed.limited(found.key, now_ms).is_some() {
                continue;
            }
            blamed.blame(found.key, until);
            self.record_blame(pool, &found, params);
        }
        // Keys limited already (by us or the fleet): what this instance saw of them is
        // published too, so the others can take it out of the fleet's counts.
        for (key, per) in ledger {
            if published.iter().any(|p| p.key == *key) {
                continue;
            }
            if let Some(secs) = blamed.limited(*key, now_ms) {
                published.push(self.fleet_blame(*key, now_ms + secs * 1000, true, per));
            }
        }
        published
    }

    /// Follow the fleet's blames (limit what it limits) and sum what the other instances
    /// published of each key, per key and backend (the fleet's counts are sums).
    fn follow_blames(
        &self,
        pool: &Pool,
        fleet: &[cull::FleetBlame],
        now_ms: u64,
    ) -> HashMap<(u64, String), u64> {
        let blamed = &pool.shared.blamed;
        let mut theirs: HashMap<(u64, String), u64> = HashMap::new();
        for fb in fleet {
            if fb.limit {
                if blamed.limited(fb.key, now_ms).is_none() {
                    tracing::info!(event = "cull", result = "blamed", upstream = %pool.name, key = %crate::cull::blame::tag(fb.key), "following the fleet's blame");
                }
                blamed.blame(fb.key, fb.until_ms);
            }
            if fb.from == self.instance {
                continue;
            }
            for (b, n) in &fb.errors {
                *theirs.entry((fb.key, b.clone())).or_insert(0) += *n;
            }
        }
        theirs
    }

    /// This instance's record of `key` for the fleet: its errors per backend.
    fn fleet_blame(
        &self,
        key: u64,
        until_ms: u64,
        limit: bool,
        per: &HashMap<SocketAddr, u64>,
    ) -> cull::FleetBlame {
        cull::FleetBlame {
            key,
            from: self.instance,
            until_ms,
            limit,
            errors: per.iter().map(|(a, n)| (a.to_string(), *n)).collect(),
        }
    }

    /// A key blamed here: the metric, the log line and the journal.
    fn record_blame(&self, pool: &Pool, found: &cull::Blamed, params: &CullParams) {
        let tenant = pool.shared.blame_names.label(found.key);
        self.shared
            .metrics
            .cull
            .blamed
            .with_label_values(&[&*tenant])
            .inc();
        let backends: Vec<String> = found.backends.iter().map(|(a, _)| a.to_string()).collect();
        let figures = format!(
            "key {} caused {} errors on {} backends; limited for {} s",
            crate::cull::blame::tag(found.key),
            found.errors(),
            found.backends.len(),
            params.cooldown_secs
        );
        tracing::warn!(event = "cull", result = "blamed", upstream = %pool.name, tenant = %tenant, backends = %backends.join(","), figures = %figures, "a key causes the errors: limited instead of culling backends");
        self.shared.observe.culls.record(CullEntry {
            at_ms: unix_ms(),
            upstream: pool.name.clone(),
            backend: backends.join(","),
            result: "blamed",
            errors: found.errors(),
            rule: Some("blame_tenants"),
            figures: Some(figures),
            ..Default::default()
        });
    }
}

/// Take the errors of every blamed or suspect key, this instance's or the fleet's, out of
/// each backend's sample.
fn take_out_blamed(
    pool: &Pool,
    samples: &mut [BackendSample],
    mut theirs: HashMap<(u64, String), u64>,
    keys: &HashSet<u64>,
    ledger: &Ledger,
) {
    for key in keys {
        for (addr, n) in ledger.get(key).into_iter().flatten() {
            *theirs.entry((*key, addr.to_string())).or_insert(0) += *n;
        }
    }
    for (s, b) in samples.iter_mut().zip(&pool.backends) {
        let n: u64 = theirs
            .iter()
            .filter(|((_, addr), _)| *addr == b.addr_str)
            .map(|(_, n)| *n)
            .sum();
        s.errors -= n.min(s.errors);
        s.requests -= n.min(s.requests);
    }
}
