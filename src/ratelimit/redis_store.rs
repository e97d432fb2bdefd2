//! Redis-backed counter store.
//!
//! Layout: one integer per key and window, `{prefix}:rl:{<hash>}:<window_index>`, where
//! `<hash>` is the 128-bit stable hash of the API key in hex (the raw key never reaches
//! Redis), wrapped in a `{…}` hash tag so both windows of a key live in one Cluster slot.
//! Every key is written by `INCRBY` immediately followed by `EXPIRE` (2 windows + 60 s).
//!
//! One flush = one `EVALSHA` carrying every delta of the batch (batches over
//! [`MAX_KEYS_PER_CALL`] keys are split into several calls). The script adds each delta and
//! returns both windows' totals. Each call also sets a short-lived marker
//! `{prefix}:rl:batch:<batch id>:<chunk>` (`SET NX EX 300`): a call that timed out on our
//! side but was executed by Redis later is retried with the same id and then only reads, so
//! no admission is counted twice.
//!
//! Redis Cluster: this store uses a plain (non-cluster) connection. A multi-key script
//! across slots is refused by a Cluster (`CROSSSLOT`); running against a Cluster would need
//! the batch split per hash slot (CRC16 of the `{…}` tag) and a cluster client. Against a
//! single Redis, a replica set with a proxy, or a Cluster with one slot owner this is moot.
//!
//! Failures: connect and every call are bounded by `timeout_ms`. After a failure the
//! connection is dropped and reconnects are attempted with exponential backoff
//! (100 ms doubling to 5 s); calls during the backoff fail fast with
//! [`StoreError::Backoff`] without touching the network.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use tokio::time::{timeout, Instant};

use super::hash::hash_hex;
use super::store::{CounterStore, Delta, GlobalCounts, StoreError};

/// Largest number of keys sent in one script call.
pub const MAX_KEYS_PER_CALL: usize = 1_000;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Extra TTL beyond the two windows a count is needed for.
const TTL_SLACK_SECS: u64 = 60;

/// How long a batch id is remembered (a timed-out call executed later than this would be
/// counted twice if retried; Redis does not hold a command that long in practice).
const BATCH_ID_TTL_SECS: u64 = 300;

/// KEYS[1] = batch marker, then (prev window, current window) per delta.
/// ARGV[1] = TTL of counters, ARGV[2] = TTL of the marker, then (prev delta, cur delta).
/// A batch whose marker exists was already applied (its client timed out): only read.
const SCRIPT: &str = r#"
local ttl = tonumber(ARGV[1])
local fresh = redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[2]))
local out = {}
for i = 2, #KEYS, 2 do
  local pd = fresh and tonumber(ARGV[i + 1]) or 0
  local cd = fresh and tonumber(ARGV[i + 2]) or 0
  local p, c
  if pd > 0 then
    p = redis.call('INCRBY', KEYS[i], pd)
    redis.call('EXPIRE', KEYS[i], ttl)
  else
    p = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  if cd > 0 then
    c = redis.call('INCRBY', KEYS[i + 1], cd)
    redis.call('EXPIRE', KEYS[i + 1], ttl)
  else
    c = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
  end
  out[#out + 1] = p
  out[#out + 1] = c
end
return out
"#;

/// `[redis]` settings the store needs.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// Every key written starts with this.
    pub key_prefix: String,
    /// Bound on connect and on every call.
    pub timeout_ms: u64,
}

struct ConnState {
    conn: Option<MultiplexedConnection>,
    backoff: Duration,
    next_attempt: Option<Instant>,
}

/// Counter store shared by every instance using the same Redis and key prefix.
pub struct RedisStore {
    client: redis::Client,
    settings: RedisSettings,
    script: redis::Script,
    state: tokio::sync::Mutex<ConnState>,
}

impl RedisStore {
    /// Parses the URL; does not connect (the first flush does).
    pub fn new(settings: RedisSettings) -> Result<Self, StoreError> {
        let client = redis::Client::open(settings.url.as_str())
            .map_err(|e| StoreError::Connect(format!("invalid redis url: {e}")))?;
        Ok(Self {
            client,
            settings,
            script: redis::Script::new(SCRIPT),
            state: tokio::sync::Mutex::new(ConnState {
                conn: None,
                backoff: BACKOFF_MIN,
                next_attempt: None,
            }),
        })
    }

    /// The Redis key of one window of one (hashed) API key.
    pub fn redis_key(&self, key_hash: u128, window: u64) -> String {
        format!(
            "{}:rl:{{{}}}:{}",
            self.settings.key_prefix,
            hash_hex(key_hash),
            window
        )
    }

    fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.settings.timeout_ms.max(1))
    }

    async fn connection(&self, st: &mut ConnState) -> Result<MultiplexedConnection, StoreError> {
        if let Some(c) = &st.conn {
            return Ok(c.clone());
        }
        if let Some(t) = st.next_attempt {
            if Instant::now() < t {
                return Err(StoreError::Backoff);
            }
        }
        match timeout(
            self.call_timeout(),
            self.client.get_multiplexed_async_connection(),
        )
        .await
        {
            Ok(Ok(c)) => {
                st.conn = Some(c.clone());
                Ok(c)
            }
            Ok(Err(e)) => {
                fail(st);
                Err(StoreError::Connect(e.to_string()))
            }
            Err(_) => {
                fail(st);
                Err(StoreError::Timeout)
            }
        }
    }

    async fn run(
        &self,
        conn: &mut MultiplexedConnection,
        batch_id: u128,
        batch: &[Delta],
        window_secs: u64,
    ) -> Result<Vec<GlobalCounts>, StoreError> {
        if batch.is_empty() {
            let r: Result<redis::RedisResult<String>, _> =
                timeout(self.call_timeout(), redis::cmd("PING").query_async(conn)).await;
            return match r {
                Ok(Ok(_)) => Ok(Vec::new()),
                Ok(Err(e)) => Err(StoreError::Command(e.to_string())),
                Err(_) => Err(StoreError::Timeout),
            };
        }
        let ttl = window_secs.saturating_mul(2).saturating_add(TTL_SLACK_SECS);
        let mut out = Vec::with_capacity(batch.len());
        for (n, chunk) in batch.chunks(MAX_KEYS_PER_CALL).enumerate() {
            let mut inv = self.script.prepare_invoke();
            inv.key(format!(
                "{}:rl:batch:{batch_id:032x}:{n}",
                self.settings.key_prefix
            ));
            inv.arg(ttl);
            inv.arg(BATCH_ID_TTL_SECS);
            for d in chunk {
                inv.key(self.redis_key(d.key_hash, d.window.saturating_sub(1)));
                inv.key(self.redis_key(d.key_hash, d.window));
                inv.arg(d.prev);
                inv.arg(d.cur);
            }
            let r: Result<redis::RedisResult<Vec<i64>>, _> =
                timeout(self.call_timeout(), inv.invoke_async(conn)).await;
            let v = match r {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => return Err(StoreError::Command(e.to_string())),
                Err(_) => return Err(StoreError::Timeout),
            };
            if v.len() != chunk.len() * 2 {
                return Err(StoreError::Protocol(format!(
                    "script returned {} values for {} keys",
                    v.len(),
                    chunk.len()
                )));
            }
            for pair in v.chunks_exact(2) {
                out.push(GlobalCounts {
                    prev: u64::try_from(pair[0]).unwrap_or(0),
                    cur: u64::try_from(pair[1]).unwrap_or(0),
                });
            }
        }
        Ok(out)
    }
}

fn fail(st: &mut ConnState) {
    st.conn = None;
    st.next_attempt = Some(Instant::now() + st.backoff);
    st.backoff = (st.backoff * 2).min(BACKOFF_MAX);
}

#[async_trait]
impl CounterStore for RedisStore {
    async fn sync(
        &self,
        batch_id: u128,
        batch: &[Delta],
        window_secs: u64,
        _now_ms: u64,
    ) -> Result<Vec<GlobalCounts>, StoreError> {
        let mut st = self.state.lock().await;
        let mut conn = self.connection(&mut st).await?;
        match self.run(&mut conn, batch_id, batch, window_secs).await {
            Ok(v) => {
                st.backoff = BACKOFF_MIN;
                st.next_attempt = None;
                Ok(v)
            }
            Err(e) => {
                // A timed-out multiplexed connection may deliver stale replies: rebuild it.
                fail(&mut st);
                Err(e)
            }
        }
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
