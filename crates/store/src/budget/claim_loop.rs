//! A claim from start to end, the same on every store: read the whole budget, check the
//! policy on it, commit on the version read; when another writer got in between, read and
//! check again (a bounded number of times, then the store is called busy).

use portcullis_policy::cull::claims::{
    check_claim, groups_of, BudgetPolicy, ClaimAsk, ClaimRefusal,
};
use portcullis_policy::cull::ops::{OpRecord, OpRequest};
use portcullis_policy::cull::{BudgetStore, ClaimCommit, ClaimToCommit, CullParams};

use crate::StoreError;

/// Reads and commits tried before giving up (each conflict means another operation was
/// committed meanwhile, so the fleet is making progress).
pub const ATTEMPTS: usize = 16;

/// Claim `ask.backend` for `req` (a claim's kind, `ttl_ms` set) under `policy`. `upstreams`
/// are every upstream of the configuration (the budget counts them all). `Ok(Err(_))`: the
/// policy refused.
pub async fn claim(
    budget: &dyn BudgetStore,
    upstreams: &[&str],
    ask: &ClaimAsk<'_>,
    policy: &BudgetPolicy,
    params: &CullParams,
    req: &OpRequest,
) -> Result<Result<OpRecord, ClaimRefusal>, StoreError> {
    let groups = groups_of(ask.upstream, (ask.named_groups)(ask.upstream, ask.backend));
    for attempt in 0..ATTEMPTS {
        let state = budget.fleet_state(upstreams, params).await?;
        if let Err(refusal) = check_claim(ask, &state, policy) {
            return Ok(Err(refusal));
        }
        let claim = ClaimToCommit {
            version: state.version,
            upstream: ask.upstream,
            backend: ask.backend,
            req,
            groups: &groups,
            take_token: !ask.emergency,
        };
        let commit = budget.commit_claim(&claim, params).await?;
        match commit {
            ClaimCommit::Committed(record) => return Ok(Ok(record)),
            ClaimCommit::NoToken { retry_ms } => return Ok(Err(ClaimRefusal::Tokens { retry_ms })),
            ClaimCommit::Conflict => {
                // Spread the retries of instances that collided.
                let jitter = 1 + (attempt as u64 % 4) * 3;
                tokio::time::sleep(std::time::Duration::from_millis(jitter)).await;
            }
        }
    }
    Err(StoreError::Command(format!(
        "budget busy: it changed under {ATTEMPTS} attempts in a row; retry"
    )))
}
