//! The `[budget]` policy as the runtime API asks it: the ask for a backend (its named
//! groups from the configuration, whether its peers are failing), the check of a
//! voluntary operation on the fleet view, and the view's refresh after a local change.

use std::sync::Arc;

use portcullis_policy::cull::claims::{check_claim, ClaimAsk, ClaimRefusal};
use portcullis_policy::cull::BudgetStore;

use super::sync::FleetView;
use crate::state::Runtime;
use crate::upstream::Pool;

/// The named groups of a backend of an upstream, from the configuration.
pub fn named_groups(rt: &Runtime, upstream: &str, backend: &str) -> Vec<String> {
    let parsed = backend.parse::<std::net::SocketAddr>().ok();
    rt.config
        .upstreams
        .iter()
        .find(|u| u.name == upstream)
        .map(|u| {
            u.groups
                .iter()
                .filter(|(_, members)| {
                    members
                        .iter()
                        .any(|m| m == backend || (parsed.is_some() && m.parse().ok() == parsed))
                })
                .map(|(g, _)| g.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The health policy's input: another backend of `pool` is failing while it stays in
/// rotation (over the error threshold and not culled: the budget or the systemic guard
/// kept it), or down by its health check. A cull within the budget is not a failing
/// upstream: the budget already counts it.
pub fn peers_failing(pool: &Pool, backend: &str) -> bool {
    pool.backends
        .iter()
        .filter(|b| b.addr_str != backend)
        .any(|b| (!b.is_culled() && b.failing().is_some()) || !pool.is_healthy(b))
}

/// Whether another backend of `pool` than `backend` can take traffic now: in rotation
/// (not culled, drained, in maintenance, claimed or at weight 0) and up by its health
/// check. Taking `backend` out when none can is refused, forced or not: the budget's
/// "never the last backend" counts backends that serve, not backends that exist.
pub fn another_serves(pool: &Pool, backend: &str) -> bool {
    pool.backends.iter().any(|b| {
        b.addr_str != backend
            && !b.is_culled()
            && matches!(b.manual().state(), crate::upstream::ManualState::In)
            && pool.is_healthy(b)
    })
}

/// The refusal body when [`another_serves`] is false.
pub fn last_serving_refusal(pool: &Pool) -> serde_json::Value {
    serde_json::json!({
        "granted": false,
        "policy": "last_backend",
        "reason": format!(
            "last_backend: no other backend of upstream {:?} can take traffic (the others are \
             down by their health check, culled, drained, in maintenance, claimed or at \
             weight 0); bring another back first (force does not pass this)",
            pool.name
        ),
    })
}

/// The ask for `backend` of `pool` (`emergency` as given).
pub fn ask<'a>(
    rt: &'a Arc<Runtime>,
    pool: &'a Pool,
    backend: &'a str,
    emergency: bool,
    groups: &'a (dyn Fn(&str, &str) -> Vec<String> + Sync),
) -> ClaimAsk<'a> {
    ClaimAsk {
        upstream: &pool.name,
        backend,
        total: u32::try_from(pool.backends.len()).unwrap_or(u32::MAX),
        fraction: rt.config.culling.params.max_culled_fraction,
        emergency,
        named_groups: groups,
        peers_failing: peers_failing(pool, backend),
    }
}

/// The [`[budget]`](portcullis_policy::cull::claims::BudgetPolicy) policies a drain, a
/// maintenance or a weight 0 answers to besides the fraction: the health policy,
/// `max_concurrent`, the grace periods and one group at a time, checked on the fleet view
/// (`None`: allowed, or no view read yet).
pub fn voluntary_check(
    rt: &Arc<Runtime>,
    pool: &Pool,
    backend: &str,
    view: &FleetView,
) -> Option<ClaimRefusal> {
    let state = view.load()?;
    let groups_rt = Arc::clone(rt);
    let groups = move |u: &str, be: &str| named_groups(&groups_rt, u, be);
    let a = ask(rt, pool, backend, false, &groups);
    match check_claim(&a, &state, &rt.config.budget) {
        Err(
            r @ (ClaimRefusal::Failing
            | ClaimRefusal::MaxConcurrent { .. }
            | ClaimRefusal::GracePeriod { .. }
            | ClaimRefusal::OneGroup { .. }),
        ) => Some(r),
        _ => None,
    }
}

/// After a change made here, the view this instance answers dry runs and audits from is
/// read again at once, and set on the backends (other instances catch up within a sync
/// interval); false when the store did not answer. Setting it matters: the change was
/// granted on the store's operations in force now, and the backends may still hold one
/// that lapsed since the last sync; the new operation on top of it would take more than the
/// budget out of this instance's rotation until the next sync (seen by the chaos harness: 3
/// of 4 backends out for 1.5 s). So a caller sets a granted record itself only when this
/// read fails.
pub async fn refresh(rt: &Runtime, budget: &dyn BudgetStore, view: &FleetView) -> bool {
    super::sync::read_and_apply(rt, budget, view).await.is_ok()
}

pub fn names(rt: &Runtime) -> Vec<&str> {
    rt.pools.iter().map(|p| p.name.as_str()).collect()
}
