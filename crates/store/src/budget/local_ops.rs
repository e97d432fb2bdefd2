//! The in-process budget's manual operations ([`BudgetStore::put_op`] and the rest, with
//! the semantics the policy crate states), at an injected `now_ms` so they can be tested.
//! Memory is bounded by the configuration: per upstream at most two records per backend
//! (the admin API answers 404 for a backend that is not configured).

use portcullis_policy::cull::ops::{check_out, out_backends, OpRecord, OpRefusal, OpRequest};

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
            let out = out_backends(culled, &all, now_ms);
            let already = out.contains(&backend);
            let n = u32::try_from(out.len()).unwrap_or(u32::MAX);
            check_out(already, n, total, fraction, req.force)?;
        }
        st.ops
            .entry(upstream.to_owned())
            .or_default()
            .insert(field, record.clone());
        Ok(record)
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
