//! The disruption budget's store: the trait the culling driver holds (`Arc<dyn BudgetStore>`),
//! implemented in the store crate by the fleet-wide Redis budget and the in-process one, with
//! the same semantics (one conformance table runs both).
//!
//! Semantics of [`BudgetStore::claim`] (checked and committed atomically):
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
//! Step 3 counts every backend out of the upstream: active claims and the manual
//! operations that take a backend out ([`super::ops`]), each backend once; a backend an
//! operation already took out is not counted again when a cull claims it.
//!
//! With `dry_run`, steps 1–5 are evaluated but nothing is written. Every call reads the
//! store's own clock (Redis `TIME`, or the process's wall clock). Any `Err` means the store
//! could not answer: the caller must not cull.

use async_trait::async_trait;

use super::claims::FleetState;
use super::ops::{OpRecord, OpRefusal, OpRequest};
use super::{ActiveClaim, Buckets, BudgetSnapshot, ClaimOutcome, CullParams, FleetDelta};
use crate::StoreError;

/// A disruption budget: a fleet bucket of tokens and per-upstream claims held as leases.
#[async_trait]
pub trait BudgetStore: Send + Sync + std::fmt::Debug {
    /// `"redis"` or `"local"` (for `/status` and logs).
    fn kind(&self) -> &'static str;

    /// Try to cull `backend` of `upstream` (which has `total` backends). See the module doc.
    async fn claim(
        &self,
        upstream: &str,
        backend: &str,
        total: u32,
        params: &CullParams,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Extend an active claim to `now + lease_ttl_ms`. `Ok(false)`: there was no active
    /// claim (it expired or was released) — the backend should be readmitted.
    async fn renew(
        &self,
        upstream: &str,
        backend: &str,
        lease_ttl_ms: u64,
    ) -> Result<bool, StoreError>;

    /// Drop a claim (the backend is readmitted). `Ok(true)` if one was removed.
    /// The token spent on it is not refunded.
    async fn release(&self, upstream: &str, backend: &str) -> Result<bool, StoreError>;

    /// Active claims of one upstream, sorted by backend.
    async fn active_claims(&self, upstream: &str) -> Result<Vec<ActiveClaim>, StoreError>;

    /// Tokens in the fleet bucket now.
    async fn tokens_available(&self, params: &CullParams) -> Result<f64, StoreError>;

    /// Fleet-wide `(requests, errors)` per backend over the window, after adding
    /// this instance's deltas. `None` for a store that is not shared (the in-process
    /// budget): the local window already is the whole fleet.
    async fn exchange_errors(
        &self,
        upstream: &str,
        deltas: &[FleetDelta],
        now_secs: u64,
        buckets: Buckets,
    ) -> Option<Result<Vec<(u64, u64)>, StoreError>>;

    /// Blame the tenant (CONTRACT §15), fleet-wide: publish the keys this instance just
    /// blamed on `upstream` (`(key hash, until Unix ms)`) and read every key the fleet
    /// blames there now. `None` for a store that is not shared (the in-process budget):
    /// this instance's own list already is the whole fleet's.
    async fn exchange_blame(
        &self,
        _upstream: &str,
        _blamed: &[super::FleetBlame],
        _now_ms: u64,
    ) -> Option<Result<Vec<super::FleetBlame>, StoreError>> {
        None
    }

    /// Who culled what on `upstream`: publish this instance's `notes` (the culls whose
    /// lease it holds) and read every note in force at `now_ms`, in one round trip.
    /// `None` for a store that is not shared (the in-process budget): no other instance
    /// culls there.
    async fn exchange_cull_notes(
        &self,
        _upstream: &str,
        _notes: &[super::CullNote],
        _now_ms: u64,
    ) -> Option<Result<Vec<super::CullNote>, StoreError>> {
        None
    }

    /// Tokens and the active claims of every listed upstream, in one round trip.
    async fn snapshot(
        &self,
        upstreams: &[&str],
        params: &CullParams,
    ) -> Result<BudgetSnapshot, StoreError>;

    /// Put the manual operation `req` on `backend` of `upstream` (which has `total`
    /// backends), replacing the backend's record of the same aspect (state or weight).
    /// One budget with the culls, checked and committed atomically: an operation that
    /// takes the backend out is refused when the backends out (claims and operations, each
    /// once) would pass `max_out(total, fraction)` (unless `req.force`) or reach `total`
    /// (always). Expired operations are pruned. `Ok(Ok(record))`: in force, stamped with
    /// the store's clock.
    async fn put_op(
        &self,
        upstream: &str,
        backend: &str,
        total: u32,
        fraction: f64,
        req: &OpRequest,
    ) -> Result<Result<OpRecord, OpRefusal>, StoreError>;

    /// Remove every operation on `backend` (drain, maint and weight: `ready`). `Ok(n)`: the
    /// records removed.
    async fn clear_ops(&self, upstream: &str, backend: &str) -> Result<u32, StoreError>;

    /// The operations in force on each listed upstream, in that order, read in one round
    /// trip (the fleet sync runs it every second), with the store's clock (Unix ms).
    async fn ops(&self, upstreams: &[&str]) -> Result<(u64, Vec<Vec<OpRecord>>), StoreError>;

    /// The whole budget in one read, on the store's clock: tokens, the cull claims and the
    /// operations (claims included) of every listed upstream, the groups' last start and
    /// end, and the version a claim commits on.
    async fn fleet_state(
        &self,
        upstreams: &[&str],
        params: &CullParams,
    ) -> Result<FleetState, StoreError>;

    /// Commit `claim` ([`ClaimToCommit`]): atomically, only if the budget is still at
    /// `claim.version` (else [`ClaimCommit::Conflict`]: read and check again), taking a
    /// token when `claim.take_token` (else [`ClaimCommit::NoToken`]), stamping
    /// `claim.groups`' last start.
    async fn commit_claim(
        &self,
        claim: &ClaimToCommit<'_>,
        params: &CullParams,
    ) -> Result<ClaimCommit, StoreError>;

    /// Release the claim `id` on `backend` of `upstream`, stamping `groups`' last end.
    /// `Ok(false)`: no such claim (released or expired already).
    async fn release_claim(
        &self,
        upstream: &str,
        backend: &str,
        id: u64,
        groups: &[String],
    ) -> Result<bool, StoreError>;
}

/// A claim to commit ([`BudgetStore::commit_claim`]): the claim `req` (its kind a
/// [`Claim`](super::ops::OpKind::Claim), `ttl_ms` set) on `backend` of `upstream`, checked by
/// the caller on the budget's state at `version`.
#[derive(Debug, Clone, Copy)]
pub struct ClaimToCommit<'a> {
    /// The budget's version the claim was checked on.
    pub version: u64,
    pub upstream: &'a str,
    pub backend: &'a str,
    pub req: &'a OpRequest,
    /// The groups whose last start the commit stamps.
    pub groups: &'a [String],
    /// Take a token from the fleet bucket (an emergency claim does not).
    pub take_token: bool,
}

/// What committing a claim did.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimCommit {
    Committed(OpRecord),
    /// The budget changed since it was read: check again on a fresh read.
    Conflict,
    /// The fleet bucket is empty; the next token in `retry_ms`.
    NoToken {
        retry_ms: u64,
    },
}
