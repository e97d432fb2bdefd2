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

use std::fmt;
use std::time::Duration;

use super::fleet::{Buckets, FleetDelta};
use super::local::LocalBudget;
use super::params::CullParams;
use super::redis_store::RedisBudget;

/// The store could not answer (unreachable, slow, protocol error). Map it to the
/// cull result `store_error`; never cull on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The call took longer than the configured timeout.
    Timeout(Duration),
    /// Redis answered with an error, or the connection failed.
    Redis(String),
    /// The reply did not have the expected shape.
    Protocol(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Timeout(d) => write!(f, "cull store timed out after {} ms", d.as_millis()),
            StoreError::Redis(e) => write!(f, "cull store error: {e}"),
            StoreError::Protocol(e) => write!(f, "cull store protocol error: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        StoreError::Redis(e.to_string())
    }
}

/// Result of a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// A token was taken and the claim recorded (or, with `dry_run`, would have been).
    Granted {
        tokens_left: f64,
        expires_ms: u64,
        dry_run: bool,
    },
    /// The backend already held an active claim; its lease was extended for free.
    Renewed { expires_ms: u64 },
    /// The fleet bucket is empty; a token will be available in `retry_after_ms`.
    NoToken { retry_after_ms: u64 },
    /// The upstream already has `active` of at most `max_out` backends out.
    OverBudget { active: u32, max_out: u32 },
}

impl ClaimOutcome {
    /// The `result` label of `portcullis_cull_decisions_total` for this outcome
    /// (`culled`, `dry_run`, `no_token`, `over_budget`), or `None` for a renewal,
    /// which is not a new decision.
    pub fn decision_label(&self) -> Option<&'static str> {
        match self {
            ClaimOutcome::Granted { dry_run: false, .. } => Some("culled"),
            ClaimOutcome::Granted { dry_run: true, .. } => Some("dry_run"),
            ClaimOutcome::Renewed { .. } => None,
            ClaimOutcome::NoToken { .. } => Some("no_token"),
            ClaimOutcome::OverBudget { .. } => Some("over_budget"),
        }
    }

    /// True when the backend may (or, in dry run, would) be ejected.
    pub fn is_held(&self) -> bool {
        matches!(
            self,
            ClaimOutcome::Granted { .. } | ClaimOutcome::Renewed { .. }
        )
    }
}

/// One active (unexpired) claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveClaim {
    pub backend: String,
    /// Expiry on the store's clock (Unix milliseconds).
    pub expires_ms: u64,
    /// Time left, independent of clocks.
    pub remaining_ms: u64,
}

/// Everything the check loop needs each tick, read in one round trip.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSnapshot {
    /// Tokens in the fleet bucket now (fractional while refilling).
    pub tokens_available: f64,
    /// Active claims per upstream, in the order the upstreams were asked for.
    pub claims: Vec<Vec<ActiveClaim>>,
}

/// The budget the proxy holds.
#[derive(Debug)]
pub enum Budget {
    Redis(Box<RedisBudget>),
    Local(LocalBudget),
}

pub(crate) fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Budget {
    /// A fleet-wide budget in Redis (`[redis]` url, key_prefix, timeout_ms).
    /// Connects lazily; never fails for an unreachable server, only for a bad URL.
    pub fn redis(url: &str, key_prefix: &str, timeout: Duration) -> Result<Self, StoreError> {
        Ok(Budget::Redis(Box::new(RedisBudget::new(
            url, key_prefix, timeout,
        )?)))
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
            Budget::Local(l) => Ok(l.claim(unix_now_ms(), upstream, backend, total, params)),
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
            Budget::Local(l) => Ok(l.renew(unix_now_ms(), upstream, backend, lease_ttl_ms)),
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
            Budget::Local(l) => Ok(l.active_claims(unix_now_ms(), upstream)),
        }
    }

    /// Tokens in the fleet bucket now.
    pub async fn tokens_available(&self, params: &CullParams) -> Result<f64, StoreError> {
        match self {
            Budget::Redis(r) => r.tokens_available(params).await,
            Budget::Local(l) => Ok(l.tokens_available(unix_now_ms(), params)),
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
            Budget::Local(l) => Ok(l.snapshot(unix_now_ms(), upstreams, params)),
        }
    }
}
