//! The disruption budget: one type the proxy holds, backed by Redis (fleet-wide)
//! or by an in-process store (single instance), with the same semantics.
//!
//! Semantics of [`Budget::claim`] (checked and committed atomically):
//! 1. Expired claims of the upstream are pruned.
//! 2. The backend already holds an active claim → its lease is renewed, no token
//!    is spent: [`ClaimOutcome::Renewed`].
//! 3. Active claims + 1 > [`max_out`](super::max_out)`(total, max_culled_fraction)`
//!    → [`ClaimOutcome::OverBudget`] (never the last backend; `total ≤ 1` is always over).
//! 4. Fewer than one token in the fleet bucket → [`ClaimOutcome::NoToken`]. The bucket
//!    holds at most `tokens` and refills continuously at `tokens / token_period`.
//! 5. Otherwise one token is taken and the claim recorded with expiry
//!    `now + lease_ttl`: [`ClaimOutcome::Granted`].
//!
//! With `dry_run`, steps 1–5 are evaluated but nothing is written.

use std::sync::Arc;
use std::time::Duration;

use super::local::LocalBudget;
use super::redis_store::RedisBudget;
use crate::store::clock::unix_ms;
use crate::store::{RedisClient, StoreError};
use portcullis_policy::cull::CullParams;
use portcullis_policy::cull::{ActiveClaim, BudgetSnapshot, ClaimOutcome};
use portcullis_policy::cull::{Buckets, FleetDelta};

/// The budget the proxy holds.
#[derive(Debug)]
pub enum Budget {
    Redis(Box<RedisBudget>),
    Local(LocalBudget),
}

impl Budget {
    /// A fleet-wide budget in Redis (`[redis]` url, key_prefix, timeout_ms).
    /// Connects lazily; never fails for an unreachable server, only for a bad URL.
    pub fn redis(url: &str, key_prefix: &str, timeout: Duration) -> Result<Self, StoreError> {
        Ok(Self::shared(Arc::new(RedisClient::new(
            url, key_prefix, timeout,
        )?)))
    }

    /// A fleet-wide budget on the process's Redis client.
    pub fn shared(client: Arc<RedisClient>) -> Self {
        Budget::Redis(Box::new(RedisBudget::new(client)))
    }

    /// An in-process budget (no `[redis]` section).
    pub fn local() -> Self {
        Budget::Local(LocalBudget::new())
    }

    /// `"redis"` or `"local"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Budget::Redis(_) => "redis",
            Budget::Local(_) => "local",
        }
    }

    /// Try to cull `backend` of `upstream` (which has `total` backends). See the module doc.
    pub async fn claim(
        &self,
        upstream: &str,
        backend: &str,
        total: u32,
        params: &CullParams,
    ) -> Result<ClaimOutcome, StoreError> {
        match self {
            Budget::Redis(r) => r.claim(upstream, backend, total, params).await,
            Budget::Local(l) => Ok(l.claim(unix_ms(), upstream, backend, total, params)),
        }
    }

    /// Extend an active claim to `now + lease_ttl_ms`. `Ok(false)`: there was no active
    /// claim (it expired or was released) — the backend should be readmitted.
    pub async fn renew(
        &self,
        upstream: &str,
        backend: &str,
        lease_ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        match self {
            Budget::Redis(r) => r.renew(upstream, backend, lease_ttl_ms).await,
            Budget::Local(l) => Ok(l.renew(unix_ms(), upstream, backend, lease_ttl_ms)),
        }
    }

    /// Drop a claim (the backend is readmitted). `Ok(true)` if one was removed.
    /// The token spent on it is not refunded.
    pub async fn release(&self, upstream: &str, backend: &str) -> Result<bool, StoreError> {
        match self {
            Budget::Redis(r) => r.release(upstream, backend).await,
            Budget::Local(l) => Ok(l.release(upstream, backend)),
        }
    }

    /// Active claims of one upstream.
    pub async fn active_claims(&self, upstream: &str) -> Result<Vec<ActiveClaim>, StoreError> {
        match self {
            Budget::Redis(r) => r.active_claims(upstream).await,
            Budget::Local(l) => Ok(l.active_claims(unix_ms(), upstream)),
        }
    }

    /// Tokens in the fleet bucket now.
    pub async fn tokens_available(&self, params: &CullParams) -> Result<f64, StoreError> {
        match self {
            Budget::Redis(r) => r.tokens_available(params).await,
            Budget::Local(l) => Ok(l.tokens_available(unix_ms(), params)),
        }
    }

    /// Fleet-wide `(requests, errors)` per backend over the window, after adding
    /// this instance's deltas. `None` for the in-process budget: the local
    /// window already is the whole fleet.
    pub async fn exchange_errors(
        &self,
        upstream: &str,
        deltas: &[FleetDelta],
        now_secs: u64,
        buckets: Buckets,
    ) -> Option<Result<Vec<(u64, u64)>, StoreError>> {
        match self {
            Budget::Redis(r) => Some(r.exchange_errors(upstream, deltas, now_secs, buckets).await),
            Budget::Local(_) => None,
        }
    }

    /// Tokens and the active claims of every listed upstream, in one round trip.
    pub async fn snapshot(
        &self,
        upstreams: &[&str],
        params: &CullParams,
    ) -> Result<BudgetSnapshot, StoreError> {
        match self {
            Budget::Redis(r) => r.snapshot(upstreams, params).await,
            Budget::Local(l) => Ok(l.snapshot(unix_ms(), upstreams, params)),
        }
    }
}
