//! Fleet-wide budget in Redis: each operation is ONE atomic Lua script (or one
//! command), timed with Redis `TIME` so instance clocks do not matter.
//!
//! Keys (every one starts with `key_prefix`, carries a TTL, and shares the hash tag
//! `{key_prefix}` so a script's keys sit in one Redis Cluster slot):
//! * `{p}:cull:{{p}}:tokens` — hash `t` (tokens, float), `ts` (ms of last write);
//!   TTL = token period + 1 s (by then the bucket would be full anyway, and a
//!   missing bucket reads as full).
//! * `{p}:cull:{{p}}:claims:{upstream}` — hash backend → lease expiry (Unix ms);
//!   expired fields are pruned by the claim script; key TTL ≥ the longest lease.
//!
//! Calls go through the process's [`RedisClient`] (timeouts, backoff); on error or
//! timeout the caller gets `Err(StoreError)` and must not cull. Note: a claim that timed out on
//! the client may still have been committed; its lease then simply expires.

use std::sync::Arc;

use async_trait::async_trait;
use redis::{Script, Value};

use super::lua::out_ops_lua;
use crate::refill_lua;
use crate::{RedisClient, StoreError};
use portcullis_policy::cull::claims::FleetState;
use portcullis_policy::cull::ops::{OpRecord, OpRefusal, OpRequest};
use portcullis_policy::cull::ClaimCommit;
use portcullis_policy::cull::{max_out, BudgetStore, CullParams};
use portcullis_policy::cull::{ActiveClaim, BudgetSnapshot, ClaimOutcome, ClaimToCommit};
use portcullis_policy::cull::{Buckets, CullNote, FleetBlame, FleetDelta};

/// KEYS: tokens, claims, ops, version. ARGV: backend, cap, period_ms, max_out, lease_ms, dry(0|1).
/// The backends out are the active claims and the operations that take a backend out
/// (`OUT_OPS_LUA`), each once.
/// Returns {code, tokens_milli, a, b}: 0 granted (a = expiry), 1 renewed (a = expiry),
/// 2 no token (a = retry ms, -1 = never), 3 over budget (a = active, b = max_out).
const CLAIM_LUA: &str = concat!(
    refill_lua!(),
    out_ops_lua!(),
    r#"
local backend = ARGV[1]
local cap = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local max_out = tonumber(ARGV[4])
local lease = tonumber(ARGV[5])
local dry = ARGV[6] == '1'

local claims = redis.call('HGETALL', KEYS[2])
local active = 0
local held = false
local seen = {}
for i = 1, #claims, 2 do
  local exp = tonumber(claims[i + 1]) or 0
  if exp <= now then
    if not dry then redis.call('HDEL', KEYS[2], claims[i]) end
  else
    active = active + 1
    seen[claims[i]] = true
    if claims[i] == backend then held = true end
  end
end
local op_out = false
for _, b in ipairs(out_ops(KEYS[3], nil)) do
  if not seen[b] then
    seen[b] = true
    if b == backend then op_out = true else active = active + 1 end
  end
end

local tok = refill(KEYS[1], cap, period)
local milli = math.floor(tok * 1000)

local function keep_claims_key()
  local pt = redis.call('PTTL', KEYS[2])
  if pt < lease + 1000 then redis.call('PEXPIRE', KEYS[2], lease + 1000) end
end

if held then
  if not dry then
    redis.call('HSET', KEYS[2], backend, string.format('%d', now + lease))
    keep_claims_key()
  end
  return {1, milli, now + lease, 0}
end
if not op_out and active + 1 > max_out then
  return {3, milli, active, max_out}
end
if tok < 1 then return {2, milli, ms_until_one(tok, cap, period), 0} end
if not dry then
  redis.call('INCR', KEYS[4]); redis.call('PEXPIRE', KEYS[4], 86400000)
  store_bucket(KEYS[1], tok - 1, period)
  redis.call('HSET', KEYS[2], backend, string.format('%d', now + lease))
  keep_claims_key()
end
return {0, math.floor((tok - 1) * 1000), now + lease, 0}
"#
);

/// KEYS: claims. ARGV: backend, lease_ms. Returns 1 renewed, 0 no active claim.
const RENEW_LUA: &str = r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local exp = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
if exp <= now then
  if exp > 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now + lease))
local pt = redis.call('PTTL', KEYS[1])
if pt < lease + 1000 then redis.call('PEXPIRE', KEYS[1], lease + 1000) end
return 1
"#;

/// Read-only. KEYS: tokens, claims of upstream 1..n. ARGV: cap, period_ms.
/// Returns {now, tokens_milli, {backend, expiry, ...} per upstream...}.
const SNAPSHOT_LUA: &str = concat!(
    refill_lua!(),
    r#"
local cap, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local tok = refill(KEYS[1], cap, period)
local out = {now, math.floor(tok * 1000)}
for k = 2, #KEYS do
  local c = redis.call('HGETALL', KEYS[k])
  local live = {}
  for i = 1, #c, 2 do
    local exp = tonumber(c[i + 1]) or 0
    if exp > now then
      live[#live + 1] = c[i]
      live[#live + 1] = string.format('%d', exp)
    end
  end
  out[#out + 1] = live
end
return out
"#
);

/// Budget stored in Redis, shared by every instance with the same `key_prefix`.
pub struct RedisBudget {
    pub(super) client: Arc<RedisClient>,
    claim: Script,
    pub(super) put_op: Script,
    renew: Script,
    snapshot: Script,
}

impl std::fmt::Debug for RedisBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBudget")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

fn int(v: Option<&Value>, what: &str) -> Result<i64, StoreError> {
    match v {
        Some(v) => redis::from_redis_value::<i64>(v)
            .map_err(|e| StoreError::Protocol(format!("{what}: {e}"))),
        None => Err(StoreError::Protocol(format!("{what}: missing"))),
    }
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn parse_claims(v: &Value, now: i64) -> Result<Vec<ActiveClaim>, StoreError> {
    let flat: Vec<String> =
        redis::from_redis_value(v).map_err(|e| StoreError::Protocol(format!("claims: {e}")))?;
    let mut out = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks_exact(2) {
        let expires: i64 = pair[1]
            .parse()
            .map_err(|e| StoreError::Protocol(format!("claim expiry {:?}: {e}", pair[1])))?;
        out.push(ActiveClaim {
            backend: pair[0].clone(),
            expires_ms: to_u64(expires),
            remaining_ms: to_u64(expires.saturating_sub(now)),
        });
    }
    out.sort_by(|a, b| a.backend.cmp(&b.backend));
    Ok(out)
}

impl RedisBudget {
    /// A budget on the process's Redis client (which connects lazily).
    pub fn new(client: Arc<RedisClient>) -> Self {
        Self {
            client,
            claim: Script::new(CLAIM_LUA),
            put_op: Script::new(super::lua::PUT_OP_LUA),
            renew: Script::new(RENEW_LUA),
            snapshot: Script::new(SNAPSHOT_LUA),
        }
    }

    /// Key of the fleet token bucket.
    pub fn tokens_key(&self) -> String {
        format!("{p}:cull:{{{p}}}:tokens", p = self.client.prefix())
    }

    /// Key of an upstream's claims hash.
    pub fn claims_key(&self, upstream: &str) -> String {
        format!(
            "{p}:cull:{{{p}}}:claims:{upstream}",
            p = self.client.prefix()
        )
    }

    /// Key of an upstream's manual operations (field `backend` or `backend#w` → record).
    pub fn ops_key(&self, upstream: &str) -> String {
        format!("{p}:cull:{{{p}}}:ops:{upstream}", p = self.client.prefix())
    }

    /// Key of an upstream's blamed keys (field: the key's hash in hex → until, Unix ms).
    pub fn blame_key(&self, upstream: &str) -> String {
        format!(
            "{p}:cull:{{{p}}}:blame:{upstream}",
            p = self.client.prefix()
        )
    }

    /// Key of an upstream's cull notes (field: the backend → `until\nby\nrule`).
    pub fn notes_key(&self, upstream: &str) -> String {
        format!("{p}:cull:{{{p}}}:who:{upstream}", p = self.client.prefix())
    }
}

#[async_trait]
impl BudgetStore for RedisBudget {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn claim(
        &self,
        upstream: &str,
        backend: &str,
        total: u32,
        params: &CullParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let tokens_key = self.tokens_key();
        let claims_key = self.claims_key(upstream);
        let ops_key = self.ops_key(upstream);
        let version_key = self.version_key();
        let limit = max_out(total, params.max_culled_fraction);
        let lease = params.lease_ttl_ms();
        let dry = params.dry_run;
        let reply: Vec<i64> = self
            .client
            .run(|mut c| async move {
                self.claim
                    .key(&tokens_key)
                    .key(&claims_key)
                    .key(&ops_key)
                    .key(&version_key)
                    .arg(backend)
                    .arg(params.tokens)
                    .arg(params.token_period_ms())
                    .arg(limit)
                    .arg(lease)
                    .arg(if dry { "1" } else { "0" })
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let [code, milli, a, b] = reply[..] else {
            return Err(StoreError::Protocol(format!("claim reply {reply:?}")));
        };
        let tokens = milli as f64 / 1000.0;
        Ok(match code {
            0 => ClaimOutcome::Granted {
                tokens_left: tokens,
                expires_ms: to_u64(a),
                dry_run: dry,
            },
            1 => ClaimOutcome::Renewed {
                expires_ms: to_u64(a),
            },
            2 => ClaimOutcome::NoToken {
                retry_after_ms: u64::try_from(a).unwrap_or(u64::MAX),
            },
            3 => ClaimOutcome::OverBudget {
                active: u32::try_from(a).unwrap_or(u32::MAX),
                max_out: u32::try_from(b).unwrap_or(0),
            },
            other => return Err(StoreError::Protocol(format!("claim code {other}"))),
        })
    }

    async fn renew(
        &self,
        upstream: &str,
        backend: &str,
        lease_ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let key = self.claims_key(upstream);
        let r: i64 = self
            .client
            .run(|mut c| async move {
                self.renew
                    .key(&key)
                    .arg(backend)
                    .arg(lease_ttl_ms.max(1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(r == 1)
    }

    async fn release(&self, upstream: &str, backend: &str) -> Result<bool, StoreError> {
        let key = self.claims_key(upstream);
        let n: i64 = self
            .client
            .run(|mut c| async move {
                redis::cmd("HDEL")
                    .arg(&key)
                    .arg(backend)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(n > 0)
    }

    async fn exchange_errors(
        &self,
        upstream: &str,
        deltas: &[FleetDelta],
        now_secs: u64,
        buckets: Buckets,
    ) -> Option<Result<Vec<(u64, u64)>, StoreError>> {
        Some(self.fleet_errors(upstream, deltas, now_secs, buckets).await)
    }

    async fn exchange_blame(
        &self,
        upstream: &str,
        blamed: &[FleetBlame],
        now_ms: u64,
    ) -> Option<Result<Vec<FleetBlame>, StoreError>> {
        Some(self.fleet_blame(upstream, blamed, now_ms).await)
    }

    async fn exchange_cull_notes(
        &self,
        upstream: &str,
        notes: &[CullNote],
        now_ms: u64,
    ) -> Option<Result<Vec<CullNote>, StoreError>> {
        Some(self.fleet_notes(upstream, notes, now_ms).await)
    }

    async fn put_op(
        &self,
        upstream: &str,
        backend: &str,
        total: u32,
        fraction: f64,
        req: &OpRequest,
    ) -> Result<Result<OpRecord, OpRefusal>, StoreError> {
        self.put_op_now(upstream, backend, total, fraction, req)
            .await
    }

    async fn clear_ops(&self, upstream: &str, backend: &str) -> Result<u32, StoreError> {
        self.clear_ops_now(upstream, backend).await
    }

    async fn ops(&self, upstreams: &[&str]) -> Result<(u64, Vec<Vec<OpRecord>>), StoreError> {
        self.ops_now(upstreams).await
    }

    async fn fleet_state(
        &self,
        upstreams: &[&str],
        params: &CullParams,
    ) -> Result<FleetState, StoreError> {
        self.fleet_state_now(upstreams, params).await
    }

    async fn commit_claim(
        &self,
        claim: &ClaimToCommit<'_>,
        params: &CullParams,
    ) -> Result<ClaimCommit, StoreError> {
        self.commit_claim_now(claim, params).await
    }

    async fn release_claim(
        &self,
        upstream: &str,
        backend: &str,
        id: u64,
        groups: &[String],
    ) -> Result<bool, StoreError> {
        self.release_claim_now(upstream, backend, id, groups).await
    }

    async fn snapshot(
        &self,
        upstreams: &[&str],
        params: &CullParams,
    ) -> Result<BudgetSnapshot, StoreError> {
        let mut keys = Vec::with_capacity(upstreams.len() + 1);
        keys.push(self.tokens_key());
        keys.extend(upstreams.iter().map(|u| self.claims_key(u)));
        let mut inv = self.snapshot.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(params.tokens).arg(params.token_period_ms());
        let reply: Vec<Value> = self.client.invoke(&inv).await?;
        let now = int(reply.first(), "now")?;
        let milli = int(reply.get(1), "tokens")?;
        let claims = reply
            .iter()
            .skip(2)
            .map(|v| parse_claims(v, now))
            .collect::<Result<Vec<_>, _>>()?;
        if claims.len() != upstreams.len() {
            return Err(StoreError::Protocol(format!(
                "snapshot has {} upstreams, asked {}",
                claims.len(),
                upstreams.len()
            )));
        }
        Ok(BudgetSnapshot {
            tokens_available: milli as f64 / 1000.0,
            claims,
        })
    }

    async fn active_claims(&self, upstream: &str) -> Result<Vec<ActiveClaim>, StoreError> {
        let mut s = self.snapshot(&[upstream], &CullParams::default()).await?;
        Ok(s.claims.pop().unwrap_or_default())
    }

    async fn tokens_available(&self, params: &CullParams) -> Result<f64, StoreError> {
        Ok(self.snapshot(&[], params).await?.tokens_available)
    }
}
