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
/// `force` when the operation passed the fraction by force, and the last active `check`
/// (an unhealthy backend's `reason` is its result when nothing manual explains it).
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
    let check = check_view(pool, b);
    // Why an unhealthy or culled backend is out, when nothing manual says why.
    let health_reason = match state {
        "unhealthy" => check["result"]
            .as_str()
            .map(|r| format!("health check: {r}")),
        "culled" => {
            let (requests, errors) = b.window.totals(crate::state::unix_secs());
            Some(format!(
                "culled by the culling gate ({errors} errors of {requests} requests in the window)"
            ))
        }
        _ => None,
    };
    json!({
        "upstream": pool.name,
        "name": b.name,
        "address": b.addr_str,
        "state": state,
        "weight": weight,
        "source": source,
        "reason": lead.map(|r| r.reason.clone()).or(health_reason),
        "by": lead.map(|r| r.by.as_str()),
        "until": lead.and_then(|r| r.until_ms),
        "force": lead.is_some_and(|r| r.force),
        "check": check,
        "max_conn": pool.limits_of(b).0,
        "backup": pool.limits_of(b).1,
    })
}

/// The last active check of `b` (HAProxy's LastChk and the time in state): `result`
/// (`ok`, `connect`, `timeout`, `status 500`, `body`, `protocol`), `duration_ms`, `at`
/// (Unix ms), `healthy`, `progress` toward the next flip (`1/3`: one failure of
/// `fall` = 3) and `since` (Unix ms it entered its state); null without a check or
/// before its first probe. With shared probing: `source` (`fleet`: the probers' majority
/// verdict; `local`: this instance's own probes), `probing` (this instance probes it),
/// `probers` (the instances chosen to) and `verdicts_from` (whose fresh verdicts
/// counted); a followed backend's `result` is the newest check its probers published.
pub fn check_view(pool: &Pool, b: &BackendState) -> Value {
    let (Some(track), Some(t)) = (pool.health_track(b), pool.health_thresholds()) else {
        return Value::Null;
    };
    let last = track.last.as_ref();
    let source = pool.health_source(b).unwrap_or_default();
    json!({
        "source": if source.fleet { "fleet" } else { "local" },
        "probing": source.probing,
        "probers": source.probers,
        "verdicts_from": source.from,
        "result": last.map(|l| l.outcome.to_string()),
        "duration_ms": last.map(|l| l.duration_ms),
        "at": last.map(|l| l.at_ms),
        "healthy": track.healthy,
        "progress": track.progress(&t),
        "since": track.since_ms,
    })
}
