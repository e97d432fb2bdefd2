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

/// Lua: `out_ops(key, skip)` → the backends out by an active operation of hash `key`
/// (drain, maint, weight 0), each once, leaving out field `skip`; then whether a record
/// without expiry is there and the latest expiry (both over the other fields). Needs `now`.
macro_rules! out_ops_lua {
    () => {
        r#"
local function out_ops(key, skip)
  local o = redis.call('HGETALL', key)
  local list, seen, forever, longest = {}, {}, false, 0
  for i = 1, #o, 2 do
    local u, k = string.match(o[i + 1], '^(%d+)\n([^\n]+)\n')
    u = tonumber(u)
    if u ~= nil and o[i] ~= skip and (u == 0 or u > now) then
      if u == 0 then forever = true elseif u > longest then longest = u end
      if k == 'drain' or k == 'maint' or k == 'w:0' or string.sub(k, 1, 6) == 'claim:' then
        local b = string.gsub((string.gsub(o[i], '#w$', '')), '#c$', '')
        if not seen[b] then seen[b] = true; list[#list + 1] = b end
      end
    end
  end
  return list, forever, longest
end
"#
    };
}
pub(super) use out_ops_lua;

/// KEYS: claims, ops, version. ARGV: field, backend, kind, ttl_ms (0 = none), force (0|1), by,
/// reason, max_out, total, takes_out (0|1).
/// Returns {0, now, until} written; {1, out, max_out} over the fraction; {2, total} last backend.
pub(super) const PUT_OP_LUA: &str = concat!(
    r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"#,
    out_ops_lua!(),
    r#"
local field, backend, kind = ARGV[1], ARGV[2], ARGV[3]
local ttl, force = tonumber(ARGV[4]), ARGV[5] == '1'
local max_out, total, takes = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1'
-- The record replaced counts: a backend it took out is out already.
local list = out_ops(KEYS[2], nil)
local _, forever, longest = out_ops(KEYS[2], field)
if takes then
  local seen, n = {}, 0
  for _, b in ipairs(list) do seen[b] = true; n = n + 1 end
  local c = redis.call('HGETALL', KEYS[1])
  for i = 1, #c, 2 do
    if (tonumber(c[i + 1]) or 0) > now and not seen[c[i]] then seen[c[i]] = true; n = n + 1 end
  end
  if not seen[backend] then
    if n + 1 >= total then return {2, total, 0} end
    if n + 1 > max_out and not force then return {1, n + 1, max_out} end
  end
end
local o = redis.call('HGETALL', KEYS[2])
for i = 1, #o, 2 do
  local u = tonumber(string.match(o[i + 1], '^(%d+)\n') or '')
  if u ~= nil and u > 0 and u <= now then redis.call('HDEL', KEYS[2], o[i]) end
end
local until_ms = 0
if ttl > 0 then until_ms = now + ttl end
if takes then redis.call('INCR', KEYS[3]); redis.call('PEXPIRE', KEYS[3], 86400000) end
redis.call('HSET', KEYS[2], field, string.format('%d\n%s\n%d\n%s\n%s\n%s',
  until_ms, kind, now, force and '1' or '0', ARGV[6], ARGV[7]))
if until_ms == 0 then forever = true elseif until_ms > longest then longest = until_ms end
if forever then redis.call('PERSIST', KEYS[2])
else redis.call('PEXPIRE', KEYS[2], longest - now + 1000) end
return {0, now, until_ms}
"#
);

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
