//! Tenants (CONTRACT §14): API keys as identities. The registry ([`registry`]) maps a
//! key's SHA-256 to its tenant and tier; the tenant gate (`crate::gate`) applies the
//! tier's priority, concurrency, quota and limit. Policy (the quota book, the
//! concurrency share) is `portcullis_policy::tenant`. Re-reading the tenants file and
//! syncing the store's tenants are background services of the server, beside the others
//! that take the shared state.

pub mod registry;

pub use registry::{Live, Registry, TenantRt, TenantSlot};

/// Most tenants `/status` lists one by one (those with requests in flight, a
/// concurrency cap or a quota first come first).
pub const STATUS_MAX_TENANTS: usize = 200;

/// `/status` `tenants`: how many, and for the tenants with a concurrency cap or a quota
/// (at most [`STATUS_MAX_TENANTS`]): in flight here, this instance's share of the
/// concurrency cap, and the quota spent in the period (fleet-wide, as last synced).
pub fn status_json(
    registry: &Registry,
    quota: &portcullis_policy::tenant::QuotaBook,
) -> serde_json::Value {
    let now = crate::store::clock::unix_ms();
    let listed: Vec<serde_json::Value> = registry
        .tenants
        .iter()
        .filter(|t| t.tier.concurrency > 0 || t.tier.quota > 0 || t.live.inflight() > 0)
        .take(STATUS_MAX_TENANTS)
        .map(|t| {
            serde_json::json!({
                "name": &*t.name,
                "tier": &*t.tier.name,
                "inflight": t.live.inflight(),
                "concurrency": t.tier.concurrency,
                "allowance": t.live.allowance(),
                "quota": t.tier.quota,
                "quota_period": t.tier.period.as_str(),
                "quota_used": quota.used(t.quota_key, t.tier.period, now),
            })
        })
        .collect();
    serde_json::json!({
        "count": registry.len(),
        "unknown_key": registry.unknown_key.as_str(),
        "limited": listed,
    })
}

/// A request's cost from the backend's cost header: a whole number of units; absent,
/// negative, fractional or otherwise invalid = 1 (CONTRACT §14). 0 is a free request.
pub fn cost_of(value: Option<&http::HeaderValue>) -> u64 {
    value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::cost_of;
    use http::HeaderValue;

    #[test]
    fn a_cost_is_a_whole_number_else_one() {
        let v = |s: &'static str| Some(HeaderValue::from_static(s));
        assert_eq!(cost_of(v("42").as_ref()), 42);
        assert_eq!(cost_of(v(" 7 ").as_ref()), 7);
        assert_eq!(cost_of(v("0").as_ref()), 0);
        for bad in ["-3", "1.5", "", "abc", "99999999999999999999999"] {
            assert_eq!(cost_of(v(bad).as_ref()), 1, "{bad}");
        }
        assert_eq!(cost_of(None), 1);
    }
}
