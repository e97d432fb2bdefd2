//! The Redis budget's claims: the whole budget read in one script (tokens, every
//! upstream's cull claims and operations, the groups' last start and end, the version),
//! and a claim committed by one script only if the version is still the one the caller
//! checked its policy on (optimistic concurrency: two instances granting at once cannot
//! pass a limit; the loser reads again). Claims are operations of the upstream's hash
//! (field `backend#c`), so the culls' and drains' scripts count them too.
//!
//! Keys, beside the others (same hash tag, same Cluster slot): `{p}:cull:{{p}}:version`
//! (a counter, bumped by every write that takes a backend out; a day's TTL, renewed by each) and `{p}:cull:{{p}}:groups`
//! (hash `group|s` / `group|e` → Unix ms).

use portcullis_policy::cull::claims::FleetState;
use portcullis_policy::cull::ops::{OpRecord, CLAIM_ASPECT};
use portcullis_policy::cull::{ClaimCommit, ClaimToCommit, CullParams};
use redis::Value;

use super::lua::out_ops_lua;
use super::redis::RedisBudget;
use crate::refill_lua;
use crate::StoreError;

/// Read-only. KEYS: tokens, version, groups, then claims:u and ops:u for each upstream.
/// ARGV: cap, period_ms. Returns {now, tokens_milli, retry_ms, version, groups flat,
/// then per upstream: cull claims flat (active), ops flat (all)}.
const FLEET_LUA: &str = concat!(
    refill_lua!(),
    r#"
local cap, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local tok = refill(KEYS[1], cap, period)
local retry = 0
if tok < 1 then retry = ms_until_one(tok, cap, period) end
local out = {now, math.floor(tok * 1000), retry, tonumber(redis.call('GET', KEYS[2]) or '0'),
  redis.call('HGETALL', KEYS[3])}
for k = 4, #KEYS, 2 do
  local c = redis.call('HGETALL', KEYS[k])
  local live = {}
  for i = 1, #c, 2 do
    if (tonumber(c[i + 1]) or 0) > now then live[#live + 1] = c[i] end
  end
  out[#out + 1] = live
  out[#out + 1] = redis.call('HGETALL', KEYS[k + 1])
end
return out
"#
);

/// KEYS: version, tokens, ops:upstream, groups. ARGV: expected version, field, kind, ttl_ms,
/// by, reason, take_token (0|1), cap, period_ms, then the groups.
/// Returns {0, now, until} committed; {1, 0, 0} conflict; {2, retry_ms, 0} no token.
const COMMIT_LUA: &str = concat!(
    refill_lua!(),
    out_ops_lua!(),
    r#"
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then return {1, 0, 0} end
if ARGV[7] == '1' then
  local cap, period = tonumber(ARGV[8]), tonumber(ARGV[9])
  local tok = refill(KEYS[2], cap, period)
  if tok < 1 then return {2, ms_until_one(tok, cap, period), 0} end
  store_bucket(KEYS[2], tok - 1, period)
end
local until_ms = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[3], ARGV[2], string.format('%d\n%s\n%d\n0\n%s\n%s',
  until_ms, ARGV[3], now, ARGV[5], ARGV[6]))
local _, forever, longest = out_ops(KEYS[3], nil)
if forever then redis.call('PERSIST', KEYS[3])
else redis.call('PEXPIRE', KEYS[3], longest - now + 1000) end
for i = 10, #ARGV do redis.call('HSET', KEYS[4], ARGV[i] .. '|s', string.format('%d', now)) end
redis.call('INCR', KEYS[1]); redis.call('PEXPIRE', KEYS[1], 86400000)
return {0, now, until_ms}
"#
);

/// KEYS: ops:upstream, groups. ARGV: field, kind prefix (`claim:<id>:`), then the groups.
/// Returns 1 released, 0 not there (or another claim, or expired).
const RELEASE_LUA: &str = r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local u, k = string.match(v, '^(%d+)\n([^\n]+)\n')
if not u or string.sub(k, 1, #ARGV[2]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
if tonumber(u) > 0 and tonumber(u) <= now then return 0 end
for i = 3, #ARGV do redis.call('HSET', KEYS[2], ARGV[i] .. '|e', string.format('%d', now)) end
return 1
"#;

fn int(v: Option<&Value>, what: &str) -> Result<u64, StoreError> {
    let v = v.ok_or_else(|| StoreError::Protocol(format!("{what}: missing")))?;
    let n: i64 =
        redis::from_redis_value(v).map_err(|e| StoreError::Protocol(format!("{what}: {e}")))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

fn strings(v: Option<&Value>, what: &str) -> Result<Vec<String>, StoreError> {
    let v = v.ok_or_else(|| StoreError::Protocol(format!("{what}: missing")))?;
    redis::from_redis_value(v).map_err(|e| StoreError::Protocol(format!("{what}: {e}")))
}

impl RedisBudget {
    pub fn version_key(&self) -> String {
        format!("{p}:cull:{{{p}}}:version", p = self.client.prefix())
    }

    pub fn groups_key(&self) -> String {
        format!("{p}:cull:{{{p}}}:groups", p = self.client.prefix())
    }

    /// [`BudgetStore::fleet_state`](portcullis_policy::cull::BudgetStore::fleet_state).
    pub(super) async fn fleet_state_now(
        &self,
        upstreams: &[&str],
        params: &CullParams,
    ) -> Result<FleetState, StoreError> {
        let mut keys = vec![self.tokens_key(), self.version_key(), self.groups_key()];
        for u in upstreams {
            keys.push(self.claims_key(u));
            keys.push(self.ops_key(u));
        }
        let script = redis::Script::new(FLEET_LUA);
        let mut inv = script.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(params.tokens).arg(params.token_period_ms());
        let reply: Vec<Value> = self.client.invoke(&inv).await?;
        let now_ms = int(reply.first(), "now")?;
        let mut st = FleetState {
            now_ms,
            tokens: int(reply.get(1), "tokens")? as f64 / 1000.0,
            token_retry_ms: int(reply.get(2), "retry")?,
            version: int(reply.get(3), "version")?,
            ..FleetState::default()
        };
        let groups = strings(reply.get(4), "groups")?;
        for pair in groups.chunks_exact(2) {
            let at: u64 = pair[1].parse().unwrap_or(0);
            if let Some((g, side)) = pair[0].rsplit_once('|') {
                let e = st.groups.entry(g.to_string()).or_default();
                match side {
                    "s" => e.0 = at,
                    "e" => e.1 = at,
                    _ => {}
                }
            }
        }
        for (i, u) in upstreams.iter().enumerate() {
            for b in strings(reply.get(5 + 2 * i), "claims")? {
                st.culls.push((u.to_string(), b));
            }
            let ops = strings(reply.get(6 + 2 * i), "ops")?;
            let mut live: Vec<OpRecord> = ops
                .chunks_exact(2)
                .filter_map(|p| OpRecord::decode(&p[0], &p[1]))
                .filter(|r| r.active(now_ms))
                .collect();
            live.sort_by_key(OpRecord::field);
            st.ops.extend(live.into_iter().map(|r| (u.to_string(), r)));
        }
        Ok(st)
    }

    /// [`BudgetStore::commit_claim`](portcullis_policy::cull::BudgetStore::commit_claim).
    pub(super) async fn commit_claim_now(
        &self,
        claim: &ClaimToCommit<'_>,
        params: &CullParams,
    ) -> Result<ClaimCommit, StoreError> {
        let ClaimToCommit {
            version,
            upstream,
            backend,
            req,
            groups,
            take_token,
        } = *claim;
        let probe = OpRecord::new(backend, req, 0);
        let keys = [
            self.version_key(),
            self.tokens_key(),
            self.ops_key(upstream),
            self.groups_key(),
        ];
        let script = redis::Script::new(COMMIT_LUA);
        let mut inv = script.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(version)
            .arg(probe.field())
            .arg(req.kind.code())
            .arg(req.ttl_ms.unwrap_or(1).max(1))
            .arg(&probe.by)
            .arg(&probe.reason)
            .arg(if take_token { "1" } else { "0" })
            .arg(params.tokens)
            .arg(params.token_period_ms());
        for g in groups {
            inv.arg(g);
        }
        let reply: Vec<i64> = self.client.invoke(&inv).await?;
        let as_u = |v: i64| u64::try_from(v).unwrap_or(0);
        match reply[..] {
            [0, now, until] => Ok(ClaimCommit::Committed(OpRecord {
                at_ms: as_u(now),
                until_ms: Some(as_u(until)),
                ..probe
            })),
            [1, _, _] => Ok(ClaimCommit::Conflict),
            [2, retry, _] => Ok(ClaimCommit::NoToken {
                retry_ms: as_u(retry),
            }),
            _ => Err(StoreError::Protocol(format!(
                "commit_claim reply {reply:?}"
            ))),
        }
    }

    /// [`BudgetStore::release_claim`](portcullis_policy::cull::BudgetStore::release_claim).
    pub(super) async fn release_claim_now(
        &self,
        upstream: &str,
        backend: &str,
        id: u64,
        groups: &[String],
    ) -> Result<bool, StoreError> {
        let keys = [self.ops_key(upstream), self.groups_key()];
        let field = format!("{backend}{CLAIM_ASPECT}");
        // `claim:<id>:` whatever the emergency flag (as `OpKind::code` writes it).
        let prefix = format!("claim:{id:016x}:");
        let script = redis::Script::new(RELEASE_LUA);
        let mut inv = script.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(&field).arg(&prefix);
        for g in groups {
            inv.arg(g);
        }
        let n: i64 = self.client.invoke(&inv).await?;
        Ok(n == 1)
    }
}
