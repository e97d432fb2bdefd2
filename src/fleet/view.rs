//! One backend as `GET /backends` shows it (CONTRACT §12): its state, weight and the
//! manual operation that set them, with who and why.

use portcullis_policy::cull::ops::{OpKind, OpRecord};
use serde_json::{json, Value};

use crate::upstream::{BackendState, ManualState, Pool};

/// The record that explains the state: the drain or maint record, else the weight's.
fn leading(records: &[OpRecord]) -> Option<&OpRecord> {
    records
        .iter()
        .find(|r| matches!(r.kind, OpKind::Maint))
        .or_else(|| {
            records
                .iter()
                .find(|r| matches!(r.kind, OpKind::Claim { .. }))
        })
        .or_else(|| records.iter().find(|r| matches!(r.kind, OpKind::Drain)))
        .or_else(|| records.first())
}

/// `upstream`, `address`, `state` (`maint`, `claimed`, `draining`, `culled`, `unhealthy`,
/// `up`), `weight`, `source` (`manual`, `claim`, `auto` or null), `reason`, `by`, `until` (Unix ms or null),
/// and `force` when the operation passed the fraction by force.
pub fn backend_view(pool: &Pool, b: &BackendState) -> Value {
    let records = b.manual().records();
    let lead = leading(&records);
    let (state, source) = match b.manual().state() {
        ManualState::Maint => ("maint", Some("manual")),
        ManualState::Claimed => ("claimed", Some("claim")),
        ManualState::Draining | ManualState::WeightZero => ("draining", Some("manual")),
        ManualState::In if b.is_culled() => ("culled", Some("auto")),
        ManualState::In if !pool.is_healthy(b) => ("unhealthy", None),
        ManualState::In => ("up", lead.map(|_| "manual")),
    };
    let i = pool.backends.iter().position(|x| x.addr == b.addr);
    let configured = i.and_then(|i| pool.configured_weight(i)).unwrap_or(1);
    let weight = b.manual().weight().unwrap_or(configured);
    json!({
        "upstream": pool.name,
        "address": b.addr_str,
        "state": state,
        "weight": weight,
        "source": source,
        "reason": lead.map(|r| r.reason.as_str()),
        "by": lead.map(|r| r.by.as_str()),
        "until": lead.and_then(|r| r.until_ms),
        "force": lead.is_some_and(|r| r.force),
    })
}
