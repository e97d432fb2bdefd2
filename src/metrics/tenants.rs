//! The tenants' metrics (CONTRACT §14): `portcullis_tenant_requests_total{tenant,outcome}`
//! and `portcullis_tenant_quota_used{tenant}`. Tenant names come from the registry (so
//! the label set is bounded by it); keys without a tenant are `tenant="unknown"`; a key
//! is never a label.

use prometheus::{IntCounterVec, IntGaugeVec, Registry};

pub struct TenantMetrics {
    pub requests: IntCounterVec,
    /// Cost units spent in the current quota period, as this instance knows the fleet's
    /// total; set at each scrape.
    pub quota_used: IntGaugeVec,
}

impl TenantMetrics {
    pub fn register(registry: &Registry) -> Self {
        Self {
            requests: super::counter_vec(
                registry,
                "portcullis_tenant_requests_total",
                "Requests by tenant (\"unknown\": a key no tenant holds, or none) and outcome",
                &["tenant", "outcome"],
            ),
            quota_used: super::gauge_vec(
                registry,
                "portcullis_tenant_quota_used",
                "Cost units a tenant spent in its current quota period, fleet-wide as last synced",
                &["tenant"],
            ),
        }
    }
}
