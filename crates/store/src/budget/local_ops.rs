//! The in-process budget's manual operations ([`BudgetStore::put_op`] and the rest, with
//! the semantics the policy crate states), at an injected `now_ms` so they can be tested.
//! Memory is bounded by the configuration: per upstream at most two records per backend
//! (the admin API answers 404 for a backend that is not configured).

use portcullis_policy::cull::claims::FleetState;
use portcullis_policy::cull::ops::{
    budget_for, check_out, out_backends, outside_budget, OpKind, OpRecord, OpRefusal, OpRequest,
    CLAIM_ASPECT,
};
use portcullis_policy::cull::{ClaimCommit, ClaimToCommit, CullParams};

use super::local::LocalBudget;

impl LocalBudget {
    /// [`BudgetStore::put_op`](portcullis_policy::cull::BudgetStore::put_op) at `now_ms`.
    pub fn put_op_at(
        &self,
        now_ms: u64,
        upstream: &str,
        backend: &str,
        total: u32,
        fraction: f64,
        req: &OpRequest,
    ) -> Result<OpRecord, OpRefusal> {
        let record = OpRecord::new(backend, req, now_ms);
        let field = record.field();
        let mut st = self.lock();
        if let Some(m) = st.ops.get_mut(upstream) {
            m.retain(|_, r| r.active(now_ms));
        }
        if req.kind.takes_out() {
            let culled: Vec<&str> = st
                .claims
                .get(upstream)
                .map(|c| {
                    c.iter()
                        .filter(|(_, &e)| e > now_ms)
                        .map(|(b, _)| b.as_str())
                        .collect()
                })
                .unwrap_or_default();
            // The record replaced counts: a backend it took out is out already.
            let all: Vec<OpRecord> = st
                .ops
                .get(upstream)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default();
            let within_ops: Vec<OpRecord> =
                all.iter().filter(|r| !outside_budget(r)).cloned().collect();
            let within = out_backends(culled.iter().copied(), &within_ops, now_ms);
            let out = out_backends(culled, &all, now_ms);
            let (already, n) = budget_for(backend, &out, &within);
            check_out(already, n, total, fraction, req.force)?;
        }
        if req.kind.takes_out() {
            st.version += 1;
        }
        st.ops
            .entry(upstream.to_owned())
            .or_default()
            .insert(field, record.clone());
        Ok(record)
    }

    /// [`BudgetStore::fleet_state`](portcullis_policy::cull::BudgetStore::fleet_state) at `now_ms`.
    pub fn fleet_state_at(
        &self,
        now_ms: u64,
        upstreams: &[&str],
        params: &CullParams,
    ) -> FleetState {
        let st = self.lock();
        let (tokens, token_retry_ms) = Self::tokens_locked(&st, now_ms, params);
        let mut culls = Vec::new();
        let mut ops = Vec::new();
        for u in upstreams {
            if let Some(c) = st.claims.get(*u) {
                let mut live: Vec<&String> = c
                    .iter()
                    .filter(|(_, &e)| e > now_ms)
                    .map(|(b, _)| b)
                    .collect();
                live.sort();
                culls.extend(live.into_iter().map(|b| (u.to_string(), b.clone())));
            }
            if let Some(m) = st.ops.get(*u) {
                let mut live: Vec<&OpRecord> = m.values().filter(|r| r.active(now_ms)).collect();
                live.sort_by_key(|r| r.field());
                ops.extend(live.into_iter().map(|r| (u.to_string(), r.clone())));
            }
        }
        FleetState {
            now_ms,
            version: st.version,
            tokens,
            token_retry_ms,
            culls,
            ops,
            groups: st.groups.clone(),
        }
    }

    /// [`BudgetStore::commit_claim`](portcullis_policy::cull::BudgetStore::commit_claim) at `now_ms`.
    pub fn commit_claim_at(
        &self,
        now_ms: u64,
        claim: &ClaimToCommit<'_>,
        params: &CullParams,
    ) -> ClaimCommit {
        let mut st = self.lock();
        if st.version != claim.version {
            return ClaimCommit::Conflict;
        }
        if claim.take_token {
            let (tokens, retry_ms) = Self::tokens_locked(&st, now_ms, params);
            if tokens < 1.0 {
                return ClaimCommit::NoToken { retry_ms };
            }
            Self::take_token_locked(&mut st, now_ms, params);
        }
        let record = OpRecord::new(claim.backend, claim.req, now_ms);
        st.ops
            .entry(claim.upstream.to_owned())
            .or_default()
            .insert(record.field(), record.clone());
        for g in claim.groups {
            st.groups.entry(g.clone()).or_default().0 = now_ms;
        }
        st.version += 1;
        ClaimCommit::Committed(record)
    }

    /// [`BudgetStore::release_claim`](portcullis_policy::cull::BudgetStore::release_claim) at `now_ms`.
    pub fn release_claim_at(
        &self,
        now_ms: u64,
        upstream: &str,
        backend: &str,
        id: u64,
        groups: &[String],
    ) -> bool {
        let mut st = self.lock();
        let field = format!("{backend}{CLAIM_ASPECT}");
        let Some(m) = st.ops.get_mut(upstream) else {
            return false;
        };
        let ours = m.get(&field).is_some_and(|r| {
            r.active(now_ms) && matches!(r.kind, OpKind::Claim { id: i, .. } if i == id)
        });
        if !ours {
            return false;
        }
        m.remove(&field);
        for g in groups {
            st.groups.entry(g.clone()).or_default().1 = now_ms;
        }
        true
    }

    /// [`BudgetStore::clear_ops`](portcullis_policy::cull::BudgetStore::clear_ops).
    pub fn clear_ops_now(&self, upstream: &str, backend: &str) -> u32 {
        let mut st = self.lock();
        let Some(m) = st.ops.get_mut(upstream) else {
            return 0;
        };
        let before = m.len();
        m.retain(|_, r| r.backend != backend);
        let removed = before - m.len();
        if m.is_empty() {
            st.ops.remove(upstream);
        }
        u32::try_from(removed).unwrap_or(u32::MAX)
    }

    /// [`BudgetStore::ops`](portcullis_policy::cull::BudgetStore::ops) at `now_ms`: sorted by
    /// backend, then aspect.
    pub fn ops_at(&self, now_ms: u64, upstreams: &[&str]) -> Vec<Vec<OpRecord>> {
        let st = self.lock();
        upstreams
            .iter()
            .map(|u| {
                let mut v: Vec<OpRecord> = st
                    .ops
                    .get(*u)
                    .map(|m| m.values().filter(|r| r.active(now_ms)).cloned().collect())
                    .unwrap_or_default();
                v.sort_by_key(OpRecord::field);
                v
            })
            .collect()
    }
}
