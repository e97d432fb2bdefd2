//! The fleet's slow-start ramp starts ([`RampStore`]): every instance ramps a backend
//! that came back from one start, so the fleet as a whole gives it 10% of its share at
//! first, not 10% from some instances and more from those that saw it earlier.
//!
//! Redis key (starts with `key_prefix` and carries the hash tag `{key_prefix}`, so it
//! sits in the same Redis Cluster slot as the other fleet keys):
//! * `{p}:ramp:{{p}}:UPSTREAM` — hash backend → the ramp's start (the server's `TIME`, ms);
//!   the key expires [`ramp_ttl_ms`](portcullis_policy::balance::slow_start::ramp_ttl_ms)
//!   after the last exchange.
//!
//! One exchange is one script: each sighting (an age) is turned into the server's clock,
//! merged by [`fleet_start`] (the same rule in Lua), written when it moves, and returned
//! as an age.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use redis::Script;

use crate::clock::unix_ms;
use crate::{RedisClient, StoreError};
use portcullis_policy::balance::slow_start::{
    fleet_start, RampPublish, RampStore, SAME_COMEBACK_MS,
};

/// KEYS[1] = the hash. ARGV: same_ms, ttl_ms, then backend, age_ms pairs. Returns the
/// fleet's age of each backend's start, as strings, in order. The merge is
/// `fleet_start`'s.
const EXCHANGE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local same = tonumber(ARGV[1])
local out = {}
for i = 3, #ARGV, 2 do
  local mine = now - tonumber(ARGV[i + 1])
  local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') or 0
  local start = mine
  if stored > 0 then
    if math.abs(stored - mine) <= same then
      start = math.min(stored, mine)
    else
      start = math.max(stored, mine)
    end
  end
  if start ~= stored then
    redis.call('HSET', KEYS[1], ARGV[i], string.format('%d', start))
  end
  out[#out + 1] = string.format('%d', math.max(now - start, 0))
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return out
"#;

/// The fleet's ramp starts in Redis.
pub struct RedisRamp {
    client: Arc<RedisClient>,
    script: Script,
}

impl std::fmt::Debug for RedisRamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRamp").finish_non_exhaustive()
    }
}

impl RedisRamp {
    pub fn new(client: Arc<RedisClient>) -> Self {
        Self {
            client,
            script: Script::new(EXCHANGE_LUA),
        }
    }

    /// The hash of `upstream`'s ramp starts.
    pub fn key(&self, upstream: &str) -> String {
        format!("{p}:ramp:{{{p}}}:{upstream}", p = self.client.prefix())
    }
}

#[async_trait]
impl RampStore for RedisRamp {
    async fn exchange(&self, req: &RampPublish) -> Result<Vec<u64>, StoreError> {
        if req.backends.is_empty() {
            return Ok(Vec::new());
        }
        let key = self.key(&req.upstream);
        let mut args = vec![SAME_COMEBACK_MS.to_string(), req.ttl_ms.max(1).to_string()];
        for (backend, age) in &req.backends {
            args.push(backend.clone());
            args.push(age.to_string());
        }
        let mut inv = self.script.prepare_invoke();
        inv.key(&key);
        for a in &args {
            inv.arg(a);
        }
        let reply: Vec<String> = self.client.invoke(&inv).await?;
        if reply.len() != req.backends.len() {
            return Err(StoreError::Protocol(format!(
                "ramp exchange: {} starts for {} backends",
                reply.len(),
                req.backends.len()
            )));
        }
        reply
            .iter()
            .map(|age| {
                age.parse::<u64>()
                    .map_err(|e| StoreError::Protocol(format!("ramp exchange: {age:?}: {e}")))
            })
            .collect()
    }
}

/// The fleet's ramp starts in this process (no `[redis]`): the same semantics, for the
/// conformance tests (without a store each instance ramps from its own sighting).
#[derive(Debug, Default)]
pub struct LocalRamp {
    /// (upstream, backend) → start (ms) and when it was last exchanged.
    inner: Mutex<HashMap<(String, String), (u64, u64)>>,
}

impl LocalRamp {
    /// [`RampStore::exchange`] at `now_ms`.
    pub fn exchange_at(&self, now_ms: u64, req: &RampPublish) -> Vec<u64> {
        let mut h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        h.retain(|_, (_, seen)| seen.saturating_add(req.ttl_ms.max(1)) > now_ms);
        req.backends
            .iter()
            .map(|(backend, age)| {
                let mine = now_ms.saturating_sub(*age);
                let slot = h
                    .entry((req.upstream.clone(), backend.clone()))
                    .or_insert((0, now_ms));
                slot.0 = fleet_start(slot.0, mine);
                slot.1 = now_ms;
                now_ms.saturating_sub(slot.0)
            })
            .collect()
    }
}

#[async_trait]
impl RampStore for LocalRamp {
    async fn exchange(&self, req: &RampPublish) -> Result<Vec<u64>, StoreError> {
        Ok(self.exchange_at(unix_ms(), req))
    }
}
