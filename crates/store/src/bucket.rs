//! A token bucket: capacity `cap`, refilled continuously at `cap` per `period_ms`.
//!
//! The arithmetic exists once in Rust ([`refill`], [`ms_until_one`]) and once in
//! Lua (`refill_lua!`, spliced into every script that reads a bucket), and one
//! conformance table (`conformance_tests.rs`) runs both against the same
//! cases. The bucket is stored as `(tokens, at_ms)`; a missing bucket is full.
//!
//! [`FleetBucket`] (the trait, in the policy crate) is a plain bucket shared by the fleet:
//! the watchdog's restart budget. [`RedisBucket`] holds it in Redis, [`LocalBucket`] in
//! process. Culling's disruption budget uses the same arithmetic inside its claim script
//! ([`crate::budget`]).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::clock::unix_ms;
use super::redis::RedisClient;
use super::StoreError;
use portcullis_policy::bucket::{FleetBucket, Take};

/// Tokens in a bucket of capacity `cap` refilling `cap` per `period_ms`, last
/// holding `last` at `at_ms`, seen at `now_ms` (a clock going back counts as no time).
pub fn refill(last: Option<(f64, u64)>, cap: f64, period_ms: u64, now_ms: u64) -> f64 {
    match last {
        None => cap,
        Some((tokens, at)) => {
            let elapsed = now_ms.saturating_sub(at) as f64;
            (tokens + elapsed * cap / period_ms.max(1) as f64).min(cap)
        }
    }
}

/// Milliseconds until `tokens` reaches 1 (`u64::MAX`: never, the bucket has no capacity).
pub fn ms_until_one(tokens: f64, cap: f64, period_ms: u64) -> u64 {
    if cap <= 0.0 {
        return u64::MAX;
    }
    let ms = ((1.0 - tokens).max(0.0) * period_ms as f64 / cap).ceil();
    if ms >= u64::MAX as f64 {
        u64::MAX
    } else {
        ms as u64
    }
}

/// The Lua twin of [`refill`] and [`ms_until_one`]: defines `now` (the server's
/// clock, ms), `refill(key, cap, period)` returning the tokens in the hash `key`
/// (`t`, `ts`), `ms_until_one(tok, cap, period)` (-1 = never) and
/// `store_bucket(key, tok, period)`.
#[macro_export]
macro_rules! refill_lua {
    () => {
        r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function refill(key, cap, period)
  local tok = cap
  local b = redis.call('HMGET', key, 't', 'ts')
  if b[1] and b[2] then
    local last = tonumber(b[1])
    local ts = tonumber(b[2])
    if last and ts then
      local el = now - ts
      if el < 0 then el = 0 end
      tok = math.min(cap, last + el * cap / period)
    end
  end
  return tok
end
local function ms_until_one(tok, cap, period)
  if cap <= 0 then return -1 end
  return math.ceil((1 - tok) * period / cap)
end
local function store_bucket(key, tok, period)
  redis.call('HSET', key, 't', string.format('%.17g', tok), 'ts', string.format('%d', now))
  redis.call('PEXPIRE', key, period + 1000)
end
"#
    };
}

/// KEYS: bucket. ARGV: cap, period_ms. Returns {1, tokens_left_milli} when a token
/// was taken, {0, retry_ms} (-1 = never) when the bucket is empty.
const TAKE_LUA: &str = concat!(
    refill_lua!(),
    r#"
local cap, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local tok = refill(KEYS[1], cap, period)
if tok < 1 then return {0, ms_until_one(tok, cap, period)} end
store_bucket(KEYS[1], tok - 1, period)
return {1, math.floor((tok - 1) * 1000)}
"#
);

/// An in-process bucket; time is injected so the arithmetic is testable.
#[derive(Debug, Default)]
pub struct LocalBucket {
    last: Mutex<Option<(f64, u64)>>,
}

impl LocalBucket {
    /// Take one token at `now_ms` if there is one.
    pub fn take_at(&self, cap: f64, period_ms: u64, now_ms: u64) -> Take {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let tok = refill(*last, cap, period_ms, now_ms);
        if tok < 1.0 {
            return Take::Empty {
                retry_after_ms: ms_until_one(tok, cap, period_ms),
            };
        }
        *last = Some((tok - 1.0, now_ms));
        Take::Granted {
            tokens_left: tok - 1.0,
        }
    }
}

#[async_trait]
impl FleetBucket for LocalBucket {
    async fn take(&self, cap: u32, period_ms: u64) -> Result<Take, StoreError> {
        Ok(self.take_at(f64::from(cap), period_ms.max(1), unix_ms()))
    }
}

/// A token bucket shared by every instance of the fleet through Redis (one Lua script per
/// take, on the server's clock).
#[derive(Debug)]
pub struct RedisBucket {
    client: Arc<RedisClient>,
    key: String,
    script: redis::Script,
}

impl RedisBucket {
    /// The bucket `name` in Redis, under `<prefix>-<name>:` (its own keyspace).
    pub fn new(client: Arc<RedisClient>, name: &str) -> Self {
        let p = format!("{}-{name}", client.prefix());
        RedisBucket {
            key: format!("{p}:bucket:{{{p}}}:tokens"),
            client,
            script: redis::Script::new(TAKE_LUA),
        }
    }
}

#[async_trait]
impl FleetBucket for RedisBucket {
    async fn take(&self, cap: u32, period_ms: u64) -> Result<Take, StoreError> {
        let period_ms = period_ms.max(1);
        let (key, script) = (&self.key, &self.script);
        let reply: Vec<i64> = self
            .client
            .run(|mut c| async move {
                script
                    .key(key)
                    .arg(cap)
                    .arg(period_ms)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        match reply[..] {
            [1, milli] => Ok(Take::Granted {
                tokens_left: milli as f64 / 1000.0,
            }),
            [0, ms] => Ok(Take::Empty {
                retry_after_ms: u64::try_from(ms).unwrap_or(u64::MAX),
            }),
            _ => Err(StoreError::Protocol(format!("bucket reply {reply:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_bucket_refills_over_its_period() {
        let b = LocalBucket::default();
        let t0 = 1_000_000;
        assert_eq!(b.take_at(2.0, 1000, t0), Take::Granted { tokens_left: 1.0 });
        assert_eq!(b.take_at(2.0, 1000, t0), Take::Granted { tokens_left: 0.0 });
        assert_eq!(
            b.take_at(2.0, 1000, t0),
            Take::Empty {
                retry_after_ms: 500
            }
        );
        assert_eq!(
            b.take_at(2.0, 1000, t0 + 500),
            Take::Granted { tokens_left: 0.0 }
        );
        // A clock going back adds nothing.
        assert!(matches!(b.take_at(2.0, 1000, t0), Take::Empty { .. }));
        // Never above the capacity.
        assert_eq!(
            b.take_at(2.0, 1000, t0 + 100_000),
            Take::Granted { tokens_left: 1.0 }
        );
    }

    #[test]
    fn empty_bucket_never_refills() {
        let b = LocalBucket::default();
        assert_eq!(
            b.take_at(0.0, 1000, 5),
            Take::Empty {
                retry_after_ms: u64::MAX
            }
        );
    }
}
