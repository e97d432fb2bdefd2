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
    let now = portcullis_store::clock::unix_ms();
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

/// A request's cost from the backend's cost header, at most the tenant's `quota` (see
/// [`portcullis_policy::tenant::cost_of`]; CONTRACT §14: absent or invalid = 1).
pub fn cost_of(value: Option<&http::HeaderValue>, quota: u64) -> u64 {
    portcullis_policy::tenant::cost_of(value.map(http::HeaderValue::as_bytes), quota)
}
