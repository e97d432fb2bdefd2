//! The fleet's traffic counts ([`TrafficStore`]) for caps as fleet totals.
//!
//! Redis key (starts with `key_prefix` and carries the hash tag `{key_prefix}`, so it
//! sits in the same Redis Cluster slot as the other fleet keys):
//! * `{p}:fleet:{{p}}:traffic` — hash instance id → `stamp|counts`
//!   ([`encode_counts`], `stamp` the server's `TIME` in ms when published); fields older
//!   than the TTL are pruned by the script; the key expires a minute after the last
//!   publish.
//!
//! One exchange is one script: publish, prune, read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use redis::{Script, Value};

use crate::clock::unix_ms;
use crate::redis::reply_field;
use crate::{RedisClient, StoreError};
use portcullis_policy::fleet_cap::{
    decode_counts, encode_counts, TrafficPublish, TrafficStore, TrafficView,
};

/// KEYS[1] = the hash. ARGV: instance, ttl_ms, payload. Returns {now, {field, value, …}}.
const EXCHANGE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now) .. '|' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl + 60000)
local h = redis.call('HGETALL', KEYS[1])
local keep = {}
for x = 1, #h, 2 do
  local stamp = tonumber(string.match(h[x + 1], '^(%d+)|')) or 0
  if stamp + ttl <= now then
    redis.call('HDEL', KEYS[1], h[x])
  else
    keep[#keep + 1] = h[x]
    keep[#keep + 1] = h[x + 1]
  end
end
return {now, keep}
"#;

/// The fleet's traffic in Redis.
pub struct RedisTraffic {
    client: Arc<RedisClient>,
    script: Script,
}

impl std::fmt::Debug for RedisTraffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTraffic").finish_non_exhaustive()
    }
}

impl RedisTraffic {
    pub fn new(client: Arc<RedisClient>) -> Self {
        Self {
            client,
            script: Script::new(EXCHANGE_LUA),
        }
    }

    /// The traffic hash.
    pub fn key(&self) -> String {
        format!("{p}:fleet:{{{p}}}:traffic", p = self.client.prefix())
    }
}

/// The view of `(instance, stamp|payload)` pairs (unreadable ones left out), sorted.
fn view_of(now_ms: u64, pairs: Vec<(String, String)>) -> TrafficView {
    let mut instances: Vec<(String, Vec<(String, u64)>)> = pairs
        .into_iter()
        .filter_map(|(instance, value)| {
            let (_, payload) = value.split_once('|')?;
            Some((instance, decode_counts(payload)))
        })
        .collect();
    instances.sort();
    TrafficView { now_ms, instances }
}

#[async_trait]
impl TrafficStore for RedisTraffic {
    async fn exchange(&self, req: &TrafficPublish) -> Result<TrafficView, StoreError> {
        let key = self.key();
        let args = [
            req.instance.clone(),
            req.ttl_ms.max(1).to_string(),
            encode_counts(&req.counts),
        ];
        let mut inv = self.script.prepare_invoke();
        inv.key(&key);
        for a in &args {
            inv.arg(a);
        }
        let reply: Vec<Value> = self.client.invoke(&inv).await?;
        let now_ms: u64 = reply_field(&reply, 0, "traffic exchange: time")?;
        let flat: Vec<String> = reply_field(&reply, 1, "traffic exchange: counts")?;
        let pairs = flat
            .chunks_exact(2)
            .map(|c| (c[0].clone(), c[1].clone()))
            .collect();
        Ok(view_of(now_ms, pairs))
    }
}

/// The fleet's traffic in this process (no `[redis]`): the same semantics, for the
/// conformance tests (without a store the app uses the per-instance caps).
#[derive(Debug, Default)]
pub struct LocalTraffic {
    /// Instance → (stamp, payload).
    inner: Mutex<HashMap<String, (u64, String)>>,
}

impl LocalTraffic {
    /// [`TrafficStore::exchange`] at `now_ms`.
    pub fn exchange_at(&self, now_ms: u64, req: &TrafficPublish) -> TrafficView {
        let mut h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        h.insert(req.instance.clone(), (now_ms, encode_counts(&req.counts)));
        let ttl = req.ttl_ms.max(1);
        h.retain(|_, (stamp, _)| *stamp + ttl > now_ms);
        let pairs = h
            .iter()
            .map(|(i, (stamp, p))| (i.clone(), format!("{stamp}|{p}")))
            .collect();
        view_of(now_ms, pairs)
    }
}

#[async_trait]
impl TrafficStore for LocalTraffic {
    async fn exchange(&self, req: &TrafficPublish) -> Result<TrafficView, StoreError> {
        Ok(self.exchange_at(unix_ms(), req))
    }
}
