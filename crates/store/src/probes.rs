//! Shared probing's store ([`ProbeStore`]): the instances' leases and the probers'
//! published verdicts.
//!
//! Redis keys (every one starts with `key_prefix` and shares the hash tag `{key_prefix}`,
//! so the one script's keys sit in one Redis Cluster slot, as the budget's do):
//! * `{p}:hc:{{p}}:members` — hash instance id → lease expiry (Unix ms, the server's
//!   `TIME`); expired fields are pruned by the script; the key expires a minute after the
//!   last renewal.
//! * `{p}:hc:{{p}}:v:{upstream}` — hash `backend|instance` → `stamp|payload`
//!   ([`Verdict::payload`], `stamp` the server's `TIME` when published); fields older than
//!   the verdict TTL are pruned when read, the key expires a TTL after the last publish.
//!
//! One exchange ([`ProbeStore::sync`]) is one script: renew, publish, read. Errors and
//! timeouts (the client's `timeout_ms`) come back as [`StoreError`]; the caller then keeps
//! probing for itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use redis::{Script, Value};

use crate::clock::unix_ms;
use crate::redis::reply_field;
use crate::{RedisClient, StoreError};
use portcullis_policy::health::shared::{split_field, ProbeStore, SyncRequest, Verdict, View};

/// KEYS[1] = members, KEYS[2..] = verdict hashes. ARGV: instance, lease_ms, ttl_ms,
/// n publishes, then n × (key index, field, payload), then m reads, then m key indices.
/// Returns {now, {live ids}, {field, value, …} per read}.
const SYNC_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now + lease))
redis.call('PEXPIRE', KEYS[1], lease + 60000)
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    live[#live + 1] = all[i]
  end
end
local j = 4
local n = tonumber(ARGV[j])
j = j + 1
for i = 1, n do
  local k = KEYS[tonumber(ARGV[j])]
  redis.call('HSET', k, ARGV[j + 1], string.format('%d', now) .. '|' .. ARGV[j + 2])
  redis.call('PEXPIRE', k, ttl)
  j = j + 3
end
local out = {now, live}
local m = tonumber(ARGV[j])
j = j + 1
for i = 1, m do
  local k = KEYS[tonumber(ARGV[j])]
  j = j + 1
  local h = redis.call('HGETALL', k)
  local keep = {}
  for x = 1, #h, 2 do
    local stamp = tonumber(string.match(h[x + 1], '^(%d+)|')) or 0
    if stamp + ttl <= now then
      redis.call('HDEL', k, h[x])
    else
      keep[#keep + 1] = h[x]
      keep[#keep + 1] = h[x + 1]
    end
  end
  out[#out + 1] = keep
end
return out
"#;

/// Shared probing in Redis.
pub struct RedisProbes {
    client: Arc<RedisClient>,
    script: Script,
}

impl std::fmt::Debug for RedisProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisProbes").finish_non_exhaustive()
    }
}

impl RedisProbes {
    pub fn new(client: Arc<RedisClient>) -> Self {
        Self {
            client,
            script: Script::new(SYNC_LUA),
        }
    }

    /// The lease hash.
    pub fn members_key(&self) -> String {
        format!("{p}:hc:{{{p}}}:members", p = self.client.prefix())
    }

    /// An upstream's verdict hash.
    pub fn verdicts_key(&self, upstream: &str) -> String {
        format!("{p}:hc:{{{p}}}:v:{upstream}", p = self.client.prefix())
    }
}

/// The verdicts of one hash's `(field, value)` pairs (unreadable ones left out).
fn verdicts_of(pairs: &[(String, String)]) -> Vec<(String, Verdict)> {
    let mut out: Vec<(String, Verdict)> = pairs
        .iter()
        .filter_map(|(f, v)| {
            let (backend, instance) = split_field(f)?;
            Some((backend.to_owned(), Verdict::decode(instance, v)?))
        })
        .collect();
    out.sort_by(|a, b| (&a.0, &a.1.instance).cmp(&(&b.0, &b.1.instance)));
    out
}

#[async_trait]
impl ProbeStore for RedisProbes {
    async fn sync(&self, req: &SyncRequest) -> Result<View, StoreError> {
        // KEYS[1] the members; then one key per upstream named (publish or read).
        let mut keys = vec![self.members_key()];
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut slot = |u: &str, keys: &mut Vec<String>| -> usize {
            *index.entry(u.to_owned()).or_insert_with(|| {
                keys.push(self.verdicts_key(u));
                keys.len()
            })
        };
        let mut args: Vec<String> = vec![
            req.instance.clone(),
            req.lease_ms.max(1).to_string(),
            req.verdict_ttl_ms.max(1).to_string(),
            req.publish.len().to_string(),
        ];
        for p in &req.publish {
            let k = slot(&p.upstream, &mut keys);
            args.push(k.to_string());
            args.push(portcullis_policy::health::shared::field(
                &p.backend,
                &req.instance,
            ));
            args.push(p.payload.clone());
        }
        args.push(req.read.len().to_string());
        for u in &req.read {
            let k = slot(u, &mut keys);
            args.push(k.to_string());
        }
        let mut inv = self.script.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        for a in &args {
            inv.arg(a);
        }
        let reply: Vec<Value> = self.client.invoke(&inv).await?;
        let bad = |what: &str| StoreError::Protocol(format!("probe sync: {what}"));
        let now_ms: u64 = reply_field(&reply, 0, "probe sync: time")?;
        let mut live: Vec<String> = reply_field(&reply, 1, "probe sync: members")?;
        live.sort();
        let verdicts = reply[2..]
            .iter()
            .map(|v| {
                let flat: Vec<String> =
                    redis::from_redis_value(v).map_err(|e| bad(&e.to_string()))?;
                let pairs: Vec<(String, String)> = flat
                    .chunks_exact(2)
                    .map(|c| (c[0].clone(), c[1].clone()))
                    .collect();
                Ok(verdicts_of(&pairs))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        if verdicts.len() != req.read.len() {
            return Err(bad("fewer upstreams than asked"));
        }
        Ok(View {
            now_ms,
            live,
            verdicts,
        })
    }
}

/// Shared probing in this process (no `[redis]`): the same semantics for one instance
/// (the app probes locally without a store; this twin serves the conformance tests).
#[derive(Debug, Default)]
pub struct LocalProbes {
    inner: Mutex<LocalState>,
}

#[derive(Debug, Default)]
struct LocalState {
    /// Instance → lease expiry.
    members: HashMap<String, u64>,
    /// Upstream → field → (stamp, payload).
    verdicts: HashMap<String, HashMap<String, (u64, String)>>,
}

impl LocalProbes {
    /// [`ProbeStore::sync`] at `now_ms`.
    pub fn sync_at(&self, now_ms: u64, req: &SyncRequest) -> View {
        let mut st = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        st.members
            .insert(req.instance.clone(), now_ms + req.lease_ms.max(1));
        st.members.retain(|_, until| *until > now_ms);
        let mut live: Vec<String> = st.members.keys().cloned().collect();
        live.sort();
        for p in &req.publish {
            let field = portcullis_policy::health::shared::field(&p.backend, &req.instance);
            st.verdicts
                .entry(p.upstream.clone())
                .or_default()
                .insert(field, (now_ms, p.payload.clone()));
        }
        let ttl = req.verdict_ttl_ms.max(1);
        let verdicts = req
            .read
            .iter()
            .map(|u| {
                let Some(h) = st.verdicts.get_mut(u) else {
                    return Vec::new();
                };
                h.retain(|_, (stamp, _)| *stamp + ttl > now_ms);
                let pairs: Vec<(String, String)> = h
                    .iter()
                    .map(|(f, (stamp, p))| (f.clone(), format!("{stamp}|{p}")))
                    .collect();
                verdicts_of(&pairs)
            })
            .collect();
        View {
            now_ms,
            live,
            verdicts,
        }
    }
}

#[async_trait]
impl ProbeStore for LocalProbes {
    async fn sync(&self, req: &SyncRequest) -> Result<View, StoreError> {
        Ok(self.sync_at(unix_ms(), req))
    }
}
