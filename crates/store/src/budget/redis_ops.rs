//! The Redis budget's manual operations: one hash per upstream
//! (`{p}:cull:{{p}}:ops:{upstream}`, beside its claims, in the same Cluster slot), field
//! `backend` (drain, maint) or `backend#w` (weight) → the record's text
//! ([`OpRecord::encode`]). A put is one Lua script that counts the backends out (active
//! claims and operations, each once) and writes, so two instances putting at once cannot
//! pass the budget. The key never expires while a record without `seconds` is in it;
//! otherwise it lives as long as its longest lease.

use portcullis_policy::cull::max_out;
use portcullis_policy::cull::ops::{OpRecord, OpRefusal, OpRequest};
use redis::Value;

use super::redis::RedisBudget;
use crate::StoreError;

impl RedisBudget {
    /// [`BudgetStore::put_op`](portcullis_policy::cull::BudgetStore::put_op).
    pub(super) async fn put_op_now(
        &self,
        upstream: &str,
        backend: &str,
        total: u32,
        fraction: f64,
        req: &OpRequest,
    ) -> Result<Result<OpRecord, OpRefusal>, StoreError> {
        let claims = self.claims_key(upstream);
        let ops = self.ops_key(upstream);
        let version = self.version_key();
        // The record as the store will hold it (control characters are spaces).
        let probe = OpRecord::new(backend, req, 0);
        let field = probe.field();
        let (by, reason) = (&probe.by, &probe.reason);
        let reply: Vec<i64> = self
            .client
            .run(|mut c| async move {
                self.put_op
                    .key(&claims)
                    .key(&ops)
                    .key(&version)
                    .arg(&field)
                    .arg(backend)
                    .arg(req.kind.code())
                    .arg(req.ttl_ms.map_or(0, |t| t.max(1)))
                    .arg(if req.force { "1" } else { "0" })
                    .arg(by)
                    .arg(reason)
                    .arg(max_out(total, fraction))
                    .arg(total)
                    .arg(if req.kind.takes_out() { "1" } else { "0" })
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let as_u = |v: i64| u64::try_from(v).unwrap_or(0);
        let as_u32 = |v: i64| u32::try_from(v).unwrap_or(0);
        match reply[..] {
            [0, now, until] => Ok(Ok(OpRecord {
                at_ms: as_u(now),
                until_ms: (until > 0).then(|| as_u(until)),
                ..probe.clone()
            })),
            [1, out, limit] => Ok(Err(OpRefusal::Fraction {
                out: as_u32(out),
                max_out: as_u32(limit),
                total,
            })),
            [2, total, _] => Ok(Err(OpRefusal::LastBackend {
                total: as_u32(total),
            })),
            _ => Err(StoreError::Protocol(format!("put_op reply {reply:?}"))),
        }
    }

    /// [`BudgetStore::clear_ops`](portcullis_policy::cull::BudgetStore::clear_ops).
    pub(super) async fn clear_ops_now(
        &self,
        upstream: &str,
        backend: &str,
    ) -> Result<u32, StoreError> {
        let key = self.ops_key(upstream);
        let weight = format!("{backend}{}", portcullis_policy::cull::ops::WEIGHT_ASPECT);
        let n: i64 = self
            .client
            .run(|mut c| async move {
                redis::cmd("HDEL")
                    .arg(&key)
                    .arg(backend)
                    .arg(&weight)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// [`BudgetStore::ops`](portcullis_policy::cull::BudgetStore::ops): `TIME` and every
    /// upstream's hash in one pipeline; records not in force, or not readable, are left out.
    pub(super) async fn ops_now(
        &self,
        upstreams: &[&str],
    ) -> Result<(u64, Vec<Vec<OpRecord>>), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for u in upstreams {
            pipe.cmd("HGETALL").arg(self.ops_key(u));
        }
        let reply: Vec<Value> = self
            .client
            .run(|mut c| async move { pipe.query_async(&mut c).await })
            .await?;
        let mut it = reply.into_iter();
        let (secs, micros): (u64, u64) = it
            .next()
            .map(|v| redis::from_redis_value(&v))
            .transpose()
            .map_err(|e| StoreError::Protocol(format!("TIME: {e}")))?
            .ok_or_else(|| StoreError::Protocol("TIME: missing".into()))?;
        let now = secs * 1000 + micros / 1000;
        let mut out = Vec::with_capacity(upstreams.len());
        for v in it {
            let pairs: Vec<(String, String)> = redis::from_redis_value(&v)
                .map_err(|e| StoreError::Protocol(format!("ops: {e}")))?;
            let mut records: Vec<OpRecord> = pairs
                .iter()
                .filter_map(|(f, val)| OpRecord::decode(f, val))
                .filter(|r| r.active(now))
                .collect();
            records.sort_by_key(OpRecord::field);
            out.push(records);
        }
        if out.len() != upstreams.len() {
            return Err(StoreError::Protocol(format!(
                "ops: {} upstreams, asked {}",
                out.len(),
                upstreams.len()
            )));
        }
        Ok((now, out))
    }
}
