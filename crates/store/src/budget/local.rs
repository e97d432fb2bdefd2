//! In-process budget for a single instance (no `[redis]`), with the same semantics
//! as the Redis script. Time is injected (`now_ms`, Unix milliseconds) so the
//! arithmetic is testable; its [`BudgetStore`] implementation feeds it the wall clock.
//! Memory is bounded by the configuration: claims per upstream ≤ its backends.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;

use crate::bucket::{ms_until_one, refill};
use crate::clock::unix_ms;
use crate::StoreError;
use portcullis_policy::cull::claims::FleetState;
use portcullis_policy::cull::ops::{out_backends, OpRecord, OpRefusal, OpRequest};
use portcullis_policy::cull::ClaimCommit;
use portcullis_policy::cull::{max_out, Buckets, BudgetStore, CullParams, FleetDelta};
use portcullis_policy::cull::{ActiveClaim, BudgetSnapshot, ClaimOutcome, ClaimToCommit};

#[derive(Debug, Default)]
pub(super) struct State {
    /// `(tokens, at_ms)` of the last write; `None` = a full bucket.
    bucket: Option<(f64, u64)>,
    /// upstream → backend → expiry ms.
    pub(super) claims: HashMap<String, HashMap<String, u64>>,
    /// upstream → field (`backend`, `backend#w`, `backend#c`) → operation (`local_ops.rs`).
    pub(super) ops: HashMap<String, HashMap<String, OpRecord>>,
    /// Bumped by every write that takes a backend out (claims commit on it).
    pub(super) version: u64,
    /// group → (last claim started, last claim ended), Unix ms.
    pub(super) groups: HashMap<String, (u64, u64)>,
}

/// In-process disruption budget. `Send + Sync`; the lock is never held across an await.
#[derive(Debug, Default)]
pub struct LocalBudget {
    state: Mutex<State>,
}

impl LocalBudget {
    pub fn new() -> Self {
        Self::default()
    }

    /// The bucket's tokens at `now_ms` and the ms until one (for the claims' read).
    pub(super) fn tokens_locked(st: &State, now_ms: u64, params: &CullParams) -> (f64, u64) {
        let cap = f64::from(params.tokens);
        let period = params.token_period_ms();
        let t = refill(st.bucket, cap, period, now_ms);
        (
            t,
            if t >= 1.0 {
                0
            } else {
                ms_until_one(t, cap, period)
            },
        )
    }

    /// Take one token at `now_ms` (the caller checked there is one).
    pub(super) fn take_token_locked(st: &mut State, now_ms: u64, params: &CullParams) {
        let (t, _) = Self::tokens_locked(st, now_ms, params);
        st.bucket = Some((t - 1.0, now_ms));
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state inconsistent in a
        // way that matters more than stopping culling, so recover the guard.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`BudgetStore::claim`] at `now_ms`.
    pub fn claim_at(
        &self,
        now_ms: u64,
        upstream: &str,
        backend: &str,
        total: u32,
        params: &CullParams,
    ) -> ClaimOutcome {
        let lease = params.lease_ttl_ms();
        let cap = f64::from(params.tokens);
        let period = params.token_period_ms();
        let limit = max_out(total, params.max_culled_fraction);
        let dry = params.dry_run;
        let mut st = self.lock();

        let (held, out_by_op, active) = {
            let empty = HashMap::new();
            let claims = st.claims.get(upstream).unwrap_or(&empty);
            let held = claims.get(backend).is_some_and(|&e| e > now_ms);
            let culled = claims
                .iter()
                .filter(|(_, &e)| e > now_ms)
                .map(|(b, _)| b.as_str());
            let ops: Vec<OpRecord> = st
                .ops
                .get(upstream)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default();
            let out = out_backends(culled, &ops, now_ms);
            let out_by_op = !held && out.contains(&backend);
            let active = out.len() - usize::from(out_by_op);
            (held, out_by_op, u32::try_from(active).unwrap_or(u32::MAX))
        };
        if !dry {
            if let Some(c) = st.claims.get_mut(upstream) {
                c.retain(|_, e| *e > now_ms);
            }
        }
        let tokens = refill(st.bucket, cap, period, now_ms);

        if held {
            if !dry {
                st.claims
                    .entry(upstream.to_owned())
                    .or_default()
                    .insert(backend.to_owned(), now_ms + lease);
            }
            return ClaimOutcome::Renewed {
                expires_ms: now_ms + lease,
            };
        }
        if !out_by_op && active.saturating_add(1) > limit {
            return ClaimOutcome::OverBudget {
                active,
                max_out: limit,
            };
        }
        if tokens < 1.0 {
            return ClaimOutcome::NoToken {
                retry_after_ms: ms_until_one(tokens, cap, period),
            };
        }
        if !dry {
            st.version += 1;
            st.bucket = Some((tokens - 1.0, now_ms));
            st.claims
                .entry(upstream.to_owned())
                .or_default()
                .insert(backend.to_owned(), now_ms + lease);
        }
        ClaimOutcome::Granted {
            tokens_left: tokens - 1.0,
            expires_ms: now_ms + lease,
            dry_run: dry,
        }
    }

    /// [`BudgetStore::renew`] at `now_ms`.
    pub fn renew_at(&self, now_ms: u64, upstream: &str, backend: &str, lease_ttl_ms: u64) -> bool {
        let mut st = self.lock();
        let Some(claims) = st.claims.get_mut(upstream) else {
            return false;
        };
        match claims.get_mut(backend) {
            Some(e) if *e > now_ms => {
                *e = now_ms + lease_ttl_ms;
                true
            }
            Some(_) => {
                claims.remove(backend);
                false
            }
            None => false,
        }
    }

    /// [`BudgetStore::release`] (no clock needed).
    pub fn remove(&self, upstream: &str, backend: &str) -> bool {
        let mut st = self.lock();
        let removed = st
            .claims
            .get_mut(upstream)
            .and_then(|c| c.remove(backend))
            .is_some();
        if st.claims.get(upstream).is_some_and(HashMap::is_empty) {
            st.claims.remove(upstream);
        }
        removed
    }

    fn active_locked(st: &State, now_ms: u64, upstream: &str) -> Vec<ActiveClaim> {
        let mut out: Vec<ActiveClaim> = st
            .claims
            .get(upstream)
            .map(|c| {
                c.iter()
                    .filter(|(_, &e)| e > now_ms)
                    .map(|(b, &e)| ActiveClaim {
                        backend: b.clone(),
                        expires_ms: e,
                        remaining_ms: e - now_ms,
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.backend.cmp(&b.backend));
        out
    }

    /// [`BudgetStore::active_claims`] at `now_ms`.
    pub fn active_claims_at(&self, now_ms: u64, upstream: &str) -> Vec<ActiveClaim> {
        Self::active_locked(&self.lock(), now_ms, upstream)
    }

    /// [`BudgetStore::tokens_available`] at `now_ms`.
    pub fn tokens_available_at(&self, now_ms: u64, params: &CullParams) -> f64 {
        let st = self.lock();
        refill(
            st.bucket,
            f64::from(params.tokens),
            params.token_period_ms(),
            now_ms,
        )
    }

    /// [`BudgetStore::snapshot`] at `now_ms`.
    pub fn snapshot_at(
        &self,
        now_ms: u64,
        upstreams: &[&str],
        params: &CullParams,
    ) -> BudgetSnapshot {
        let st = self.lock();
        BudgetSnapshot {
            tokens_available: refill(
                st.bucket,
                f64::from(params.tokens),
                params.token_period_ms(),
                now_ms,
            ),
            claims: upstreams
                .iter()
                .map(|u| Self::active_locked(&st, now_ms, u))
                .collect(),
        }
    }
}

#[async_trait]
impl BudgetStore for LocalBudget {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn claim(
        &self,
        upstream: &str,
        backend: &str,
        total: u32,
        params: &CullParams,
    ) -> Result<ClaimOutcome, StoreError> {
        Ok(self.claim_at(unix_ms(), upstream, backend, total, params))
    }

    async fn renew(
        &self,
        upstream: &str,
        backend: &str,
        lease_ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        Ok(self.renew_at(unix_ms(), upstream, backend, lease_ttl_ms))
    }

    async fn release(&self, upstream: &str, backend: &str) -> Result<bool, StoreError> {
        Ok(self.remove(upstream, backend))
    }

    async fn active_claims(&self, upstream: &str) -> Result<Vec<ActiveClaim>, StoreError> {
        Ok(self.active_claims_at(unix_ms(), upstream))
    }

    async fn tokens_available(&self, params: &CullParams) -> Result<f64, StoreError> {
        Ok(self.tokens_available_at(unix_ms(), params))
    }

    /// `None`: a single instance's own error window already is the whole fleet's.
    async fn exchange_errors(
        &self,
        _upstream: &str,
        _deltas: &[FleetDelta],
        _now_secs: u64,
        _buckets: Buckets,
    ) -> Option<Result<Vec<(u64, u64)>, StoreError>> {
        None
    }

    async fn put_op(
        &self,
        upstream: &str,
        backend: &str,
        total: u32,
        fraction: f64,
        req: &OpRequest,
    ) -> Result<Result<OpRecord, OpRefusal>, StoreError> {
        Ok(self.put_op_at(unix_ms(), upstream, backend, total, fraction, req))
    }

    async fn clear_ops(&self, upstream: &str, backend: &str) -> Result<u32, StoreError> {
        Ok(self.clear_ops_now(upstream, backend))
    }

    async fn ops(&self, upstreams: &[&str]) -> Result<(u64, Vec<Vec<OpRecord>>), StoreError> {
        let now = unix_ms();
        Ok((now, self.ops_at(now, upstreams)))
    }

    async fn fleet_state(
        &self,
        upstreams: &[&str],
        params: &CullParams,
    ) -> Result<FleetState, StoreError> {
        Ok(self.fleet_state_at(unix_ms(), upstreams, params))
    }

    async fn commit_claim(
        &self,
        claim: &ClaimToCommit<'_>,
        params: &CullParams,
    ) -> Result<ClaimCommit, StoreError> {
        Ok(self.commit_claim_at(unix_ms(), claim, params))
    }

    async fn release_claim(
        &self,
        upstream: &str,
        backend: &str,
        id: u64,
        groups: &[String],
    ) -> Result<bool, StoreError> {
        Ok(self.release_claim_at(unix_ms(), upstream, backend, id, groups))
    }

    async fn snapshot(
        &self,
        upstreams: &[&str],
        params: &CullParams,
    ) -> Result<BudgetSnapshot, StoreError> {
        Ok(self.snapshot_at(unix_ms(), upstreams, params))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000;

    fn params(tokens: u32, fraction: f64) -> CullParams {
        CullParams::for_tests(tokens, fraction)
    }

    fn granted(o: &ClaimOutcome) -> bool {
        matches!(o, ClaimOutcome::Granted { .. })
    }

    #[test]
    fn smooth_refill_and_cap() {
        let b = LocalBudget::new();
        let p = params(4, 1.0);
        assert_eq!(b.tokens_available_at(T0, &p), 4.0, "starts full");
        for i in 0..4 {
            assert!(granted(&b.claim_at(T0, "u", &format!("b{i}"), 100, &p)));
        }
        assert_eq!(b.tokens_available_at(T0, &p), 0.0);
        assert!(matches!(
            b.claim_at(T0, "u", "b9", 100, &p),
            ClaimOutcome::NoToken {
                retry_after_ms: 150_000
            }
        ));
        // Half a period refills half the bucket.
        assert_eq!(b.tokens_available_at(T0 + 300_000, &p), 2.0);
        assert_eq!(b.tokens_available_at(T0 + 75_000, &p), 0.5);
        // Capped at `tokens`.
        assert_eq!(b.tokens_available_at(T0 + 10 * 600_000, &p), 4.0);
        // Clock going backwards gives no tokens (and no panic).
        assert_eq!(b.tokens_available_at(T0 - 1000, &p), 0.0);
    }

    #[test]
    fn no_token_claims_do_not_consume() {
        let b = LocalBudget::new();
        let p = params(1, 1.0);
        assert!(granted(&b.claim_at(T0, "u", "a", 10, &p)));
        assert!(matches!(
            b.claim_at(T0 + 1, "u", "b", 10, &p),
            ClaimOutcome::NoToken { .. }
        ));
        // Exactly one period after the grant there is one token again.
        assert!(granted(&b.claim_at(T0 + 600_000, "u", "b", 10, &p)));
    }

    #[test]
    fn fraction_limits_per_upstream() {
        let b = LocalBudget::new();
        let p = params(100, 0.5);
        assert!(granted(&b.claim_at(T0, "u", "a", 4, &p)));
        assert!(granted(&b.claim_at(T0, "u", "b", 4, &p)));
        assert_eq!(
            b.claim_at(T0, "u", "c", 4, &p),
            ClaimOutcome::OverBudget {
                active: 2,
                max_out: 2
            }
        );
        // Another upstream has its own budget.
        assert!(granted(&b.claim_at(T0, "v", "c", 4, &p)));
        // Over-budget claims do not spend tokens.
        assert_eq!(b.tokens_available_at(T0, &p), 97.0);
    }

    #[test]
    fn never_the_last_backend() {
        let b = LocalBudget::new();
        let p = params(100, 1.0);
        assert!(matches!(
            b.claim_at(T0, "one", "a", 1, &p),
            ClaimOutcome::OverBudget { max_out: 0, .. }
        ));
        assert!(granted(&b.claim_at(T0, "two", "a", 2, &p)));
        assert!(matches!(
            b.claim_at(T0, "two", "b", 2, &p),
            ClaimOutcome::OverBudget {
                active: 1,
                max_out: 1
            }
        ));
    }

    #[test]
    fn renew_costs_no_token() {
        let b = LocalBudget::new();
        let p = params(2, 1.0);
        let lease = p.lease_ttl_ms();
        assert!(granted(&b.claim_at(T0, "u", "a", 10, &p)));
        assert_eq!(b.tokens_available_at(T0, &p), 1.0);
        // Claiming again while held renews for free.
        assert_eq!(
            b.claim_at(T0 + 5, "u", "a", 10, &p),
            ClaimOutcome::Renewed {
                expires_ms: T0 + 5 + lease
            }
        );
        assert!(b.renew_at(T0 + 10, "u", "a", lease));
        assert_eq!(b.tokens_available_at(T0 + 10, &p) as u32, 1);
        assert_eq!(
            b.active_claims_at(T0 + 10, "u"),
            vec![ActiveClaim {
                backend: "a".into(),
                expires_ms: T0 + 10 + lease,
                remaining_ms: lease
            }]
        );
        // Renewing something not held fails.
        assert!(!b.renew_at(T0, "u", "zzz", lease));
        assert!(!b.renew_at(T0, "nope", "a", lease));
    }

    #[test]
    fn expired_lease_frees_budget() {
        let b = LocalBudget::new();
        let p = params(100, 0.5);
        let lease = p.lease_ttl_ms();
        assert!(granted(&b.claim_at(T0, "u", "a", 2, &p)));
        assert!(matches!(
            b.claim_at(T0, "u", "b", 2, &p),
            ClaimOutcome::OverBudget { .. }
        ));
        // Still active one ms before expiry.
        assert_eq!(b.active_claims_at(T0 + lease - 1, "u").len(), 1);
        assert!(matches!(
            b.claim_at(T0 + lease - 1, "u", "b", 2, &p),
            ClaimOutcome::OverBudget { .. }
        ));
        // Expired: the slot is free, and renewing the old lease fails.
        assert!(b.active_claims_at(T0 + lease, "u").is_empty());
        assert!(!b.renew_at(T0 + lease, "u", "a", lease));
        assert!(granted(&b.claim_at(T0 + lease, "u", "b", 2, &p)));
    }

    #[test]
    fn release_frees_budget_without_refund() {
        let b = LocalBudget::new();
        let p = params(3, 0.5);
        assert!(granted(&b.claim_at(T0, "u", "a", 2, &p)));
        assert!(b.remove("u", "a"));
        assert!(!b.remove("u", "a"));
        assert!(granted(&b.claim_at(T0, "u", "b", 2, &p)));
        assert_eq!(b.tokens_available_at(T0, &p), 1.0);
    }

    #[test]
    fn dry_run_commits_nothing() {
        let b = LocalBudget::new();
        let mut p = params(1, 0.5);
        p.dry_run = true;
        for _ in 0..3 {
            assert_eq!(
                b.claim_at(T0, "u", "a", 4, &p),
                ClaimOutcome::Granted {
                    tokens_left: 0.0,
                    expires_ms: T0 + p.lease_ttl_ms(),
                    dry_run: true
                }
            );
        }
        assert_eq!(b.tokens_available_at(T0, &p), 1.0);
        assert!(b.active_claims_at(T0, "u").is_empty());
    }

    #[test]
    fn snapshot_reads_everything() {
        let b = LocalBudget::new();
        let p = params(5, 0.5);
        assert!(granted(&b.claim_at(T0, "u", "a", 4, &p)));
        assert!(granted(&b.claim_at(T0, "v", "x", 4, &p)));
        let s = b.snapshot_at(T0, &["u", "w", "v"], &p);
        assert_eq!(s.tokens_available, 3.0);
        assert_eq!(s.claims.len(), 3);
        assert_eq!(s.claims[0][0].backend, "a");
        assert!(s.claims[1].is_empty());
        assert_eq!(s.claims[2][0].backend, "x");
    }
}
