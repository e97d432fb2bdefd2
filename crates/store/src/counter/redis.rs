//! Redis-backed counter store.
//!
//! Layout: one integer per key and window, `{prefix}:rl:{<hash>}:<window_index>`, where
//! `<hash>` is the 128-bit stable hash of the API key in hex (the raw key never reaches
//! Redis), wrapped in a `{…}` hash tag so both windows of a key live in one Cluster slot.
//! Every key is written by `INCRBY`; the call that creates it (the result equals the delta)
//! also sets its TTL (2 windows of its policy + 60 s) with `EXPIRE`, in the same script.
//!
//! Several rate-limit policies: their keys differ by hash (a named policy hashes its name
//! with the key, see `Limiter::for_policy` in the policy crate) and every policy's deltas travel in the
//! same batch, each with its own TTL: one flush is one call however many policies there are.
//!
//! One flush = one `EVALSHA` carrying every delta of the batch (batches over
//! [`MAX_KEYS_PER_CALL`] keys are split into several calls). The script adds each delta and
//! returns both windows' totals; the previous window's key is not touched at all for a delta
//! with nothing to add there whose caller already holds that window's final total
//! ([`Delta::need_prev`] false). Each call also sets a short-lived marker
//! `{prefix}:rl:batch:<batch id>:<chunk>` (`SET NX EX 300`): a call that timed out on our
//! side but was executed by Redis later is retried with the same id and then only reads, so
//! no admission is counted twice.
//!
//! Data loss: each delta carries the totals its caller last read ([`Delta::floor_cur`],
//! [`Delta::floor_prev`]). A counter found below its floor (after `FLUSHALL`, a restart
//! without persistence, an eviction by `maxmemory`) is written back (`SET … EX`) to
//! floor + delta instead of trusting the loss. Floors never exceed the true total, so
//! several instances restoring the same loss restore it once. In the normal case this
//! costs no command: the `INCRBY` (or `GET`) result is compared in the script.
//!
//! Fleet size: the first call of every flush (an empty flush, the idle health probe, runs
//! the script with no delta) also records a heartbeat of the calling limiter, identified by
//! the high half of the batch id, in [`HEARTBEAT_BUCKET_MS`] time buckets: a marker
//! `{prefix}:rl:{instances}:b<bucket>:i<id>` (`SET NX EX`) and, when the marker is new, an
//! increment of the bucket's counter `{prefix}:rl:{instances}:b<bucket>` (`INCRBY` +
//! `EXPIRE` when it creates the counter). Once a call registered the instance in a bucket,
//! later calls in the same bucket skip the marker and only read both counters (`GET`).
//! The script returns the larger of the current and the previous bucket's
//! counters: the instances that flushed (or probed, every second when idle) within the last
//! one to two buckets. A stopped instance is forgotten after two buckets at most. Buckets
//! come from the caller's clock (skew well under a bucket is harmless). Only plain string
//! commands are used (no sorted set), and it costs no extra round trip.
//!
//! Redis Cluster ([`RedisClient::is_cluster`]): a script's keys must share one hash slot.
//! A flush is then split: one call carries the heartbeat alone (its batch marker tagged
//! `{instances}`, the heartbeat's slot), and the deltas are grouped by the slot of their
//! `{<hash>}` tag, one call per slot (chunked by [`MAX_KEYS_PER_CALL`]), each with its own
//! batch marker `{prefix}:rl:batch:<batch id>:<n>:{<hash>}` in that slot. The calls of a
//! flush run concurrently on the cluster connection (which routes each to its slot's
//! master), so a flush still costs one round of latency. The grouping depends only on the
//! batch, so a retried batch (same id, same deltas) reuses the same markers and no slot
//! counts it twice when part of a flush succeeded before a failover.
//!
//! Connection: the process's one [`RedisClient`] (shared with culling and the watchdog)
//! owns the connection, the timeouts (connect and every call bounded by `timeout_ms`), the
//! reconnect backoff (calls during it fail fast with [`StoreError::Backoff`] without
//! touching the network) and the key prefix. A new connection ([`RedisClient::generation`])
//! may mean a restarted server that lost the heartbeat markers: the registration cache is
//! cleared and the instance registers again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::{RedisClient, StoreError};
use portcullis_policy::ratelimit::hash::hash_hex;
use portcullis_policy::ratelimit::{Batch, CounterStore, Delta, GlobalCounts, SyncResult};

/// Largest number of keys sent in one script call.
pub const MAX_KEYS_PER_CALL: usize = 1_000;
/// Extra TTL beyond the two windows a count is needed for.
const TTL_SLACK_SECS: u64 = 60;

/// Length of a heartbeat bucket (ms). An instance flushes every `flush_interval_ms` and
/// probes at least every second when idle, so it is seen in every bucket.
pub const HEARTBEAT_BUCKET_MS: u64 = 2_000;
/// TTL of heartbeat keys: they are read for two buckets only; much longer, so a marker
/// never expires while its bucket is still read (which would count its instance twice),
/// whatever the clock skew.
const HEARTBEAT_TTL_SECS: u64 = 60;

/// How long a batch id is remembered (a timed-out call executed later than this would be
/// counted twice if retried; Redis does not hold a command that long in practice).
const BATCH_ID_TTL_SECS: u64 = 300;

/// KEYS[1] = batch marker; then ARGV[2] heartbeat keys (0, 2 or 3): with 3 (registration)
/// KEYS[2] = counter of the current bucket, KEYS[3] = this instance's marker in it,
/// KEYS[4] = counter of the previous bucket; with 2 (already registered in this bucket: read
/// only) KEYS[2] = counter of the current bucket, KEYS[3] = counter of the previous bucket;
/// then (prev window, current window) per delta.
/// ARGV[1] = TTL of the marker, ARGV[2] = number of heartbeat keys, ARGV[3] = TTL of
/// heartbeat keys, then (prev delta, cur delta, prev floor, cur floor, TTL of the counters)
/// per delta; a prev delta of -1 means "nothing to add and not needed": the previous
/// window's key is not touched and -1 is returned for it. A counter below its floor (data
/// lost) is set back to floor + delta (with the counters' TTL).
/// Returns the live instance count (0 without heartbeat), then (prev, cur, restored) per
/// delta: the totals, and 1 when a counter was below its floor and was written back.
/// A batch whose marker exists was already applied (its client timed out): only read.
/// Commands are kept to the minimum: a counter gets its TTL only when `INCRBY` created it
/// (the result equals the delta: counters only grow and always get a TTL in the same
/// script). Only `SET`, `GET`, `INCRBY` and `EXPIRE` are used.
const SCRIPT: &str = r#"
local h = tonumber(ARGV[2])
local n = 0
if h > 0 then
  local hb = tonumber(ARGV[3])
  local last = KEYS[1 + h]
  local reg = false
  if h == 3 then
    reg = redis.call('SET', KEYS[3], '1', 'NX', 'EX', hb)
  end
  if reg then
    n = redis.call('INCRBY', KEYS[2], 1)
    if n == 1 then
      redis.call('EXPIRE', KEYS[2], hb)
    end
    local before = tonumber(redis.call('GET', last) or '0')
    if before > n then
      n = before
    end
  else
    n = tonumber(redis.call('GET', KEYS[2]) or '0')
    local before = tonumber(redis.call('GET', last) or '0')
    if before > n then
      n = before
    end
  end
end
local out = {n}
local first = 2 + h
if #KEYS < first then
  return out
end
local fresh = redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[1]))
local j = -1
for i = first, #KEYS, 2 do
  j = j + 5
  local pd = tonumber(ARGV[j])
  local cd = tonumber(ARGV[j + 1])
  local pf = tonumber(ARGV[j + 2])
  local cf = tonumber(ARGV[j + 3])
  local ttl = tonumber(ARGV[j + 4])
  if not fresh then
    if pd > 0 then pd = 0 end
    if cd > 0 then cd = 0 end
  end
  local p, c, lost = -1, 0, 0
  if pd > 0 then
    p = redis.call('INCRBY', KEYS[i], pd)
    if p == pd then
      redis.call('EXPIRE', KEYS[i], ttl)
    end
  elseif pd == 0 then
    p = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  if pd >= 0 and p < pf + pd then
    p = pf + pd
    lost = 1
    redis.call('SET', KEYS[i], p, 'EX', ttl)
  end
  if cd > 0 then
    c = redis.call('INCRBY', KEYS[i + 1], cd)
    if c == cd then
      redis.call('EXPIRE', KEYS[i + 1], ttl)
    end
  else
    c = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
  end
  if c < cf + cd then
    c = cf + cd
    lost = 1
    redis.call('SET', KEYS[i + 1], c, 'EX', ttl)
  end
  out[#out + 1] = p
  out[#out + 1] = c
  out[#out + 1] = lost
end
return out
"#;

/// (instance, heartbeat bucket) pairs whose registration a successful call confirmed,
/// valid for the connection generation they were made on.
#[derive(Default)]
struct Registered {
    generation: u64,
    pairs: Vec<(u64, u64)>,
}

/// One script call of a flush: its batch marker key and the indexes of its deltas.
struct PlannedCall {
    marker: String,
    deltas: Vec<usize>,
}

/// Counter store shared by every instance using the same Redis and key prefix.
pub struct RedisStore {
    client: Arc<RedisClient>,
    script: redis::Script,
    /// Later calls in a bucket where the instance is registered only read the counters.
    registered: Mutex<Registered>,
    /// Live instances reported by the last heartbeat (0 = none yet).
    instances: AtomicU64,
}

impl RedisStore {
    /// A store on the process's Redis client (which connects lazily).
    pub fn new(client: Arc<RedisClient>) -> Self {
        Self {
            client,
            script: redis::Script::new(SCRIPT),
            registered: Mutex::new(Registered::default()),
            instances: AtomicU64::new(0),
        }
    }

    /// The Redis key of one window of one (hashed) API key.
    pub fn redis_key(&self, key_hash: u128, window: u64) -> String {
        format!(
            "{}:rl:{{{}}}:{}",
            self.client.prefix(),
            hash_hex(key_hash),
            window
        )
    }

    /// Heartbeat keys at `now_ms` for the limiter `instance`: (current bucket's counter,
    /// the instance's marker in it, previous bucket's counter).
    pub fn heartbeat_keys(&self, instance: u64, now_ms: u64) -> [String; 3] {
        let b = now_ms / HEARTBEAT_BUCKET_MS;
        let base = format!("{}:rl:{{instances}}", self.client.prefix());
        [
            format!("{base}:b{b}"),
            format!("{base}:b{b}:i{instance:016x}"),
            format!("{base}:b{}", b.saturating_sub(1)),
        ]
    }

    /// The script calls of one flush: the first carries the heartbeat (an empty batch, the
    /// health probe, still makes that one). Standalone: chunks in batch order. Cluster:
    /// the heartbeat alone, then the deltas grouped by hash slot (see the module doc).
    fn plan(&self, batch_id: u128, batch: &[Delta]) -> Vec<PlannedCall> {
        let p = self.client.prefix();
        if !self.client.is_cluster() {
            let mut calls: Vec<PlannedCall> = (0..batch.len())
                .collect::<Vec<_>>()
                .chunks(MAX_KEYS_PER_CALL)
                .enumerate()
                .map(|(n, idx)| PlannedCall {
                    marker: format!("{p}:rl:batch:{batch_id:032x}:{n}"),
                    deltas: idx.to_vec(),
                })
                .collect();
            if calls.is_empty() {
                calls.push(PlannedCall {
                    marker: format!("{p}:rl:batch:{batch_id:032x}:0"),
                    deltas: Vec::new(),
                });
            }
            return calls;
        }
        let mut calls = vec![PlannedCall {
            marker: format!("{p}:rl:batch:{batch_id:032x}:0:{{instances}}"),
            deltas: Vec::new(),
        }];
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, d) in batch.iter().enumerate() {
            let tag = format!("{{{}}}", hash_hex(d.key_hash));
            by_slot
                .entry(RedisClient::slot(tag.as_bytes()))
                .or_default()
                .push(i);
        }
        for idx in by_slot.values() {
            for chunk in idx.chunks(MAX_KEYS_PER_CALL) {
                let n = calls.len();
                let tag = hash_hex(batch[chunk[0]].key_hash);
                calls.push(PlannedCall {
                    marker: format!("{p}:rl:batch:{batch_id:032x}:{n}:{{{tag}}}"),
                    deltas: chunk.to_vec(),
                });
            }
        }
        calls
    }

    fn registered(&self) -> std::sync::MutexGuard<'_, Registered> {
        self.registered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One script call for `chunk`; `heartbeat`: the heartbeat keys of the first call of
    /// a sync, the marker left empty when the instance is registered in this bucket already.
    async fn call(
        &self,
        marker: &str,
        chunk: &[&Delta],
        heartbeat: Option<[String; 3]>,
    ) -> Result<Vec<i64>, StoreError> {
        let mut inv = self.script.prepare_invoke();
        inv.key(marker);
        let hb_keys = match heartbeat {
            // Already registered in this bucket: read only.
            Some([cur, marker, prev]) if marker.is_empty() => {
                inv.key(cur);
                inv.key(prev);
                2
            }
            Some([cur, marker, prev]) => {
                inv.key(cur);
                inv.key(marker);
                inv.key(prev);
                3
            }
            None => 0,
        };
        inv.arg(BATCH_ID_TTL_SECS);
        inv.arg(hb_keys);
        inv.arg(HEARTBEAT_TTL_SECS);
        for &d in chunk {
            inv.key(self.redis_key(d.key_hash, d.window.saturating_sub(1)));
            inv.key(self.redis_key(d.key_hash, d.window));
            if d.prev == 0 && !d.need_prev {
                inv.arg(-1i64);
            } else {
                inv.arg(d.prev);
            }
            inv.arg(d.cur);
            inv.arg(d.floor_prev);
            inv.arg(d.floor_cur);
            inv.arg(
                d.window_secs
                    .max(1)
                    .saturating_mul(2)
                    .saturating_add(TTL_SLACK_SECS),
            );
        }
        let v: Vec<i64> = self.client.invoke(&inv).await?;
        if v.len() != chunk.len() * 3 + 1 {
            return Err(StoreError::Protocol(format!(
                "script returned {} values for {} keys",
                v.len(),
                chunk.len()
            )));
        }
        Ok(v)
    }
}

#[async_trait]
impl CounterStore for RedisStore {
    async fn sync(&self, b: Batch<'_>) -> SyncResult {
        let (batch_id, batch, now_ms) = (b.id, b.deltas, b.now_ms);
        let mut out: Vec<Option<GlobalCounts>> = vec![None; batch.len()];
        let calls = self.plan(batch_id, batch);
        // The high half of the batch id identifies the limiter.
        let me = (batch_id >> 64) as u64;
        let bucket = now_ms / HEARTBEAT_BUCKET_MS;
        let generation = self.client.generation();
        let known = {
            let r = self.registered();
            r.generation == generation && r.pairs.contains(&(me, bucket))
        };
        // The first call carries the heartbeat; in a cluster the calls run concurrently.
        let results = futures_util::future::join_all(calls.iter().enumerate().map(|(n, c)| {
            let heartbeat = (n == 0).then(|| {
                let mut keys = self.heartbeat_keys(me, now_ms);
                if known {
                    keys[1].clear();
                }
                keys
            });
            let deltas: Vec<&Delta> = c.deltas.iter().map(|&i| &batch[i]).collect();
            async move { self.call(&c.marker, &deltas, heartbeat).await }
        }))
        .await;
        for (n, (c, v)) in calls.iter().zip(results).enumerate() {
            let v = v?;
            if n == 0 {
                let live = u64::try_from(v[0]).unwrap_or(0);
                if live > 0 {
                    self.instances.store(live, Ordering::Relaxed);
                }
                let mut r = self.registered();
                let now_gen = self.client.generation();
                if r.generation != now_gen {
                    // A new connection: the server may have restarted and lost the
                    // markers. Registered again by the next call unless this one did.
                    r.generation = now_gen;
                    r.pairs.clear();
                }
                if !known {
                    // Registered (or found registered) in this bucket: forget older ones.
                    r.pairs.retain(|&(_, b)| b >= bucket);
                    r.pairs.push((me, bucket));
                }
            }
            for (&i, r) in c.deltas.iter().zip(v[1..].chunks_exact(3)) {
                out[i] = Some(GlobalCounts {
                    prev: u64::try_from(r[0]).unwrap_or(0),
                    cur: u64::try_from(r[1]).unwrap_or(0),
                    restored: r[2] != 0,
                });
            }
        }
        out.into_iter()
            .map(|c| c.ok_or_else(|| StoreError::Protocol("a delta got no total".into())))
            .collect()
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn instances(&self) -> Option<u64> {
        match self.instances.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}
